"""A row alone as the read unit, where its value lies alone in the file.

The Hub's image shards, as ``datasets`` writes them, keep each image's bytes
in a column chunk of PLAIN, uncompressed pages. In such a page a value is its
length (4 bytes, little-endian) and its bytes, one after another, so one
row's image is one byte range of the file: a read of 50 KB, where the page
range holding it is 0.8 MB (bench/RESULTS.md). Where a row group allows it,
each row is then its own read unit: OPT plans over rows, as for an
ImageFolder, a hit is the row's bytes, and nothing is decoded by pyarrow
after the cache (docs/algorithm.md, "Read units").

A row group allows it when (each checked here; else its page ranges are the
units, as before):

- every column chunk has an offset index (the page locations);
- its largest chunk (the *value column*) is BYTE_ARRAY, uncompressed, with
  no dictionary page, not repeated (maximum repetition level 0), an Arrow
  type of binary or string, and values of 4 KiB or more on average (smaller
  rows are better read a page at a time);
- every data page of it is PLAIN, and every value is present: its
  definition levels all at the maximum (a v1 page's RLE levels are read; a
  v2 page says its nulls);
- the other columns together take at most an eighth of its bytes: they are
  read here, with pyarrow, and kept with the dataset (a label, a path: a few
  bytes a row).

Indexing walks each page of the value column: its header, its levels, then
each value's length, hop by hop (4 bytes read a value, pages in parallel).
The walk must end exactly at the page's end with the page's value count;
else the file is damaged, and the error names it. A unit's read is the
value's length and bytes: decoding checks that length against the index
(with the file's identity, as for every unit), then puts the row together:
the kept columns' row, with the value at its place.

May touch: the files it is given (through ``read``), nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import parquetmeta as pm
from .parquetpages import PAGE_START_BYTES, Chunk

__all__ = ["RowValues", "ValueColumn", "load_walks", "read_kept", "save_walks", "value_column", "walk_values"]

#: Smallest mean value (bytes) worth a read of its own.
MIN_VALUE_BYTES = 4096
#: The other columns' bytes, at most, against the value column's (they are kept in memory).
REST_SHARE = 1 / 8
#: Pages walked at once (a hop is a read: a ranged GET for an object).
WALKERS = 16
_PLAIN, _RLE = 0, 3
_UNCOMPRESSED = "UNCOMPRESSED"


@dataclass(frozen=True)
class ValueColumn:
    """The value column of a row group whose rows are their own units: its
    leaf number, its path (names from the top field) and whether it is text."""

    leaf: int
    path: tuple[str, ...]
    text: bool
    max_def: int


def value_column(meta: Any, schema: Any, rg: int, chunks: Sequence[Chunk]) -> ValueColumn | None:
    """Row group ``rg``'s value column (``meta``: pyarrow's FileMetaData,
    ``schema``: the Arrow schema, ``chunks``: its leaves' page locations),
    or None where its rows are not read alone (the module's conditions that
    the footer can tell; the pages' own are checked by :func:`walk_values`)."""
    import pyarrow as pa

    g = meta.row_group(rg)
    sizes = [g.column(k).total_compressed_size for k in range(g.num_columns)]
    if not sizes or g.num_rows <= 0 or len(chunks) != g.num_columns:
        return None
    k = int(np.argmax(sizes))
    col, leaf = g.column(k), meta.schema.column(k)
    if (col.physical_type != "BYTE_ARRAY" or col.compression != _UNCOMPRESSED or col.has_dictionary_page
            or chunks[k].dict_bytes(0) > 0 or leaf.max_repetition_level != 0
            or sizes[k] < MIN_VALUE_BYTES * g.num_rows or sum(sizes) - sizes[k] > sizes[k] * REST_SHARE):
        return None
    path = tuple(leaf.path.split("."))
    t: Any = schema
    for name in path:
        fields = list(t) if isinstance(t, pa.Schema) else (list(t) if pa.types.is_struct(t) else [])
        hit = [f for f in fields if f.name == name]
        if len(hit) != 1 or isinstance(hit[0].type, pa.ExtensionType):
            return None
        t = hit[0].type
    if not (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t)):
        return None
    return ValueColumn(k, path, pa.types.is_string(t) or pa.types.is_large_string(t), int(leaf.max_definition_level))


def _all_defined(levels: bytes, count: int, max_def: int) -> bool:
    """Whether an RLE/bit-packed hybrid run of ``count`` definition levels
    is all ``max_def`` (every value present). ThriftError where the levels
    end before ``count``."""
    width = max_def.bit_length()
    mask = (1 << width) - 1
    at = seen = 0
    while seen < count:
        head = shift = 0
        while True:  # the run's header, a ULEB128 varint
            if at >= len(levels) or shift > 35:
                raise pm.ThriftError(f"definition levels end after {seen} of {count}")
            b = levels[at]
            at += 1
            head |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        n, size = ((head >> 1) * 8, (head >> 1) * width) if head & 1 else (head >> 1, (width + 7) // 8)
        if at + size > len(levels) or n == 0:
            raise pm.ThriftError(f"definition levels end after {seen} of {count}")
        if head & 1:  # bit-packed, in groups of 8
            bits = int.from_bytes(levels[at:at + size], "little")
            if any((bits >> (j * width)) & mask != max_def for j in range(min(n, count - seen))):
                return False
        elif int.from_bytes(levels[at:at + size], "little") != max_def:  # one value, repeated
            return False
        at += size
        seen += n
    return True


def _page_start(read: Callable[[int, int], bytes], offset: int, size: int, rows: int,
                max_def: int) -> tuple[int, int] | None:
    """Where a data page's first value begins, and its values; None where
    the page is not PLAIN with every value present. ThriftError where the
    page is not as its header says."""
    head = read(offset, min(size, PAGE_START_BYTES))

    def take(at: int, n: int) -> bytes:  # from the header's read where it holds them (a GET fewer)
        lo = at - offset
        return head[lo:lo + n] if lo + n <= len(head) else read(at, n)

    s, used = pm.parse(head)
    kind = pm.field(s, 1, None, pm.I32)
    body, plain = pm.field(s, 3, None, pm.I32), pm.field(s, 2, None, pm.I32)
    if kind not in (pm.DATA_PAGE, pm.DATA_PAGE_V2) or not isinstance(body, int) or used + body != size:
        raise pm.ThriftError(f"the page at byte {offset} is not a data page of {size} bytes")
    if plain != body:  # an uncompressed page's two sizes agree
        raise pm.ThriftError(f"the page at byte {offset} says {plain} bytes uncompressed and {body} stored, in a "
                             "column that is not compressed")
    sub = pm.field(s, 5 if kind == pm.DATA_PAGE else 8, None, pm.STRUCT)
    values = pm.field(sub, 1, None, pm.I32) if sub is not None else None
    if not isinstance(values, int) or values != rows:
        raise pm.ThriftError(f"the page at byte {offset} holds {values} values for {rows} rows")
    at = offset + used
    if kind == pm.DATA_PAGE:
        if pm.field(sub, 2, None, pm.I32) != _PLAIN:
            return None
        if max_def > 0:
            if pm.field(sub, 3, None, pm.I32) != _RLE:
                return None
            n = int.from_bytes(take(at, 4), "little")
            if n > body:
                raise pm.ThriftError(f"the page at byte {offset} has {n} bytes of levels in a body of {body}")
            if not _all_defined(take(at + 4, n), values, max_def):
                return None
            at += 4 + n
    else:
        nulls, enc = pm.field(sub, 2, None, pm.I32), pm.field(sub, 4, None, pm.I32)
        dl, rl = pm.field(sub, 5, None, pm.I32), pm.field(sub, 6, None, pm.I32)
        if nulls != 0 or enc != _PLAIN or rl != 0 or not isinstance(dl, int) or not 0 <= dl <= body:
            return None
        at += dl
    return at, values


def _walk_page(read: Callable[[int, int], bytes], offset: int, size: int, rows: int, max_def: int,
               known: np.ndarray | None) -> np.ndarray | None:
    """One data page's values: (offset, length) of each, the length's 4
    bytes first; None where the page is not PLAIN with every value present.
    ``known`` (its values as an earlier walk found them, from a cache) is
    taken where it tiles the page's values exactly, from its first value's
    byte to the page's end: each read then checks its value's length, so
    every one of them is checked where it is used. ThriftError where the
    page is not as its header says."""
    start = _page_start(read, offset, size, rows, max_def)
    if start is None:
        return None
    at, values = start
    end = offset + size
    if known is not None and known.shape == (values, 2) and values > 0:
        ends = known[:, 0] + known[:, 1]
        if (int(known[0, 0]) == at and int(ends[-1]) == end and bool((known[:, 1] >= 4).all())
                and bool((known[1:, 0] == ends[:-1]).all())):
            return known
    out = np.empty((values, 2), dtype=np.int64)
    for j in range(values):
        if at + 4 > end:
            raise pm.ThriftError(f"value {j} of the page at byte {offset} begins past the page's end")
        n = int.from_bytes(read(at, 4), "little")
        out[j] = (at, 4 + n)
        at += 4 + n
    if at != end:
        raise pm.ThriftError(f"the values of the page at byte {offset} end at byte {at}, not at the page's end "
                             f"({end})")
    return out


def walk_values(chunk: Chunk, rows: int, read: Callable[[int, int], bytes], max_def: int,
                known: np.ndarray | None = None) -> np.ndarray | None:
    """Every row's value in a value column's chunk: (offset, bytes) as int64
    rows, each the value's length and bytes; None where a page is not PLAIN
    with every value present (the row group keeps its page ranges).
    ``known``: what an earlier walk found (a cache), taken page by page
    where it fits (:func:`_walk_page`)."""
    pages = chunk.pages
    bounds = list(pages.first_rows) + [rows]
    known_ok = known is not None and known.shape == (rows, 2)
    jobs = [(pages.offsets[p], pages.sizes[p], bounds[p + 1] - bounds[p],
             known[bounds[p]:bounds[p + 1]] if known_ok and known is not None else None)
            for p in range(len(pages.offsets))]
    with ThreadPoolExecutor(max_workers=min(WALKERS, len(jobs))) as pool:
        got = list(pool.map(lambda j: _walk_page(read, j[0], j[1], j[2], max_def, j[3]), jobs))
    if any(g is None for g in got):
        return None
    return np.concatenate(got)  # type: ignore[arg-type]


class _Ranged:
    """A file as pyarrow reads it (``pa.PythonFile``), through ``read(offset,
    length)``: the reads the dataset's own checks go through."""

    def __init__(self, size: int, read: Callable[[int, int], bytes]) -> None:
        self.size, self._read, self.pos, self.closed = size, read, 0, False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.size + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else min(n, self.size - self.pos)
        data = self._read(self.pos, n) if n > 0 else b""
        self.pos += len(data)
        return data

    def close(self) -> None:
        self.closed = True


def read_kept(size: int, read: Callable[[int, int], bytes], meta: Any, rg: int, column: ValueColumn) -> Any:
    """Row group ``rg``'s other leaves, read with pyarrow (their column
    chunks only, through ``read``), as a Table; None where there are none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = [meta.schema.column(k).path for k in range(meta.num_columns) if k != column.leaf]
    if not paths:
        return None
    f = pq.ParquetFile(pa.PythonFile(_Ranged(size, read), mode="r"), metadata=meta, pre_buffer=False)
    return f.read_row_group(rg, columns=paths, use_threads=False)


class RowValues:
    """What puts a value unit's row together: per row group, the kept
    columns (an Arrow table of the other leaves, read at indexing) and the
    value column; per unit, its row group and the value's length. At
    indexing also each row group's walk (``walks``), and what a cache of
    earlier walks holds (``known``: taken where it fits, :func:`walk_values`)."""

    def __init__(self) -> None:
        self.kept: dict[tuple[int, int], Any] = {}  # (file, row group) -> Table of the other leaves (or None)
        self.columns: dict[tuple[int, int], ValueColumn] = {}
        self.schema: Any = None
        self.known: dict[tuple[int, int], np.ndarray] = {}
        self.walks: dict[tuple[int, int], np.ndarray] = {}
        self._local()

    def _local(self) -> None:
        # A process's own: the kept rows as Python values, made at a row
        # group's first row; each value column's fields' names, level by level.
        self._rows: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self._names: dict[tuple[str, ...], list[list[str]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["known"], state["walks"] = {}, {}  # indexing's, not the workers'
        del state["_rows"], state["_names"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local()

    def add(self, f: int, rg: int, column: ValueColumn, kept: Any, walk: np.ndarray) -> None:
        self.columns[(f, rg)] = column
        self.kept[(f, rg)] = kept
        self.walks[(f, rg)] = walk

    def row(self, f: int, rg: int, r: int, blob: Any, length: int, where: Callable[[], str]) -> dict[str, Any]:
        """Row ``r`` of row group ``rg`` of file ``f`` from its unit's bytes
        (the value's length, then the value), checked against the index."""
        import copy

        mv = memoryview(blob).cast("B")
        if len(mv) != length or int.from_bytes(mv[:4], "little") != length - 4:
            raise ValueError(f"{where()}: {len(mv)} bytes read, saying a value of "
                             f"{int.from_bytes(mv[:4], 'little') if len(mv) >= 4 else None} bytes, where the "
                             f"index says {length - 4}; the file changed or was cut short")
        column = self.columns[(f, rg)]
        value: Any = bytes(mv[4:])
        if column.text:
            value = value.decode("utf-8")
        rows = self._rows.get((f, rg))
        if rows is None:
            kept = self.kept[(f, rg)]
            rows = self._rows[(f, rg)] = kept.to_pylist() if kept is not None else []
        names = self._names.get(column.path)
        if names is None:
            names = self._names[column.path] = _names(self.schema, column.path)
        # A copy: the sample is the caller's to change, the kept row is not.
        return _put(names, copy.deepcopy(rows[r]) if rows else {}, column.path, value)


#: A cached walk's format and version (a file of another is walked again).
_CACHE_FORMAT, _CACHE_VERSION = "opt4torch Parquet values", 1


def load_walks(where: str, ident: dict[str, Any], rows: int) -> dict[int, np.ndarray]:
    """The walks cached at ``where`` for the object ``ident`` names (its
    URL, endpoint, size and ETag), by row group; empty where there is none,
    it is of another version of the object, or it is not what a cache is
    (warned about). Each is checked again where it is used (:func:`_walk_page`)."""
    import json
    import warnings

    from ..io.files import FileRefused, read_capped

    try:
        body = json.loads(read_capped(where, 64 * rows + (1 << 16), "a walk of this object").decode("ascii"))
        if not isinstance(body, dict) or body.get("format") != _CACHE_FORMAT or body.get("version") != _CACHE_VERSION \
                or body.get("object") != ident:
            return {}
        out = {}
        for key, flat in dict(body["row_groups"]).items():
            spans = np.asarray(flat, dtype=np.int64)
            if not str(key).isdigit() or spans.ndim != 1 or spans.size % 2:
                raise ValueError(f"row group {str(key)[:20]!r} holds no list of (offset, bytes)")
            out[int(key)] = spans.reshape(-1, 2)
        return out
    except FileNotFoundError:
        return {}
    except (OSError, FileRefused, ValueError, TypeError, KeyError, OverflowError) as exc:
        warnings.warn(f"cannot use the cached walk {where} of Parquet file {ident.get('url')} ({exc}): walking its "
                      "values again", RuntimeWarning, stacklevel=3)
        return {}


def save_walks(where: str, ident: dict[str, Any], walks: dict[int, np.ndarray]) -> None:
    """Cache an object's walks at ``where`` (atomically; a place that
    cannot be written is warned about: it is walked again next time)."""
    import json
    import warnings

    from ..io.files import atomic_write

    body = {"format": _CACHE_FORMAT, "version": _CACHE_VERSION, "object": ident,
            "row_groups": {str(rg): w.ravel().tolist() for rg, w in sorted(walks.items())}}
    try:
        os.makedirs(os.path.dirname(where) or ".", exist_ok=True)
        with atomic_write(where, "w", no_symlink=True) as f:
            json.dump(body, f, separators=(",", ":"), ensure_ascii=True)
    except (OSError, ValueError) as exc:
        warnings.warn(f"could not cache the walk of Parquet file {ident.get('url')} at {where}: {exc}; it will be "
                      "walked again next time", RuntimeWarning, stacklevel=3)


def _names(schema: Any, path: tuple[str, ...]) -> list[list[str]]:
    """The fields' names at each level of ``path`` (the top level's, then
    each struct's on the way to the value)."""
    out, t = [], schema
    for name in path:
        out.append([f.name for f in t])
        t = (schema.field(name) if t is schema else t.field(name)).type
    return out


def _put(names: list[list[str]], have: dict[str, Any] | None, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """``have`` (a struct's fields read without the value column; the
    caller's own) with ``value`` at ``path``, in the order of the fields'
    ``names`` level by level: every struct on the way is present, since
    every value is."""
    have = have or {}
    inner = value if len(path) == 1 else _put(names[1:], have.get(path[0]), path[1:], value)
    return {n: inner if n == path[0] else have.get(n) for n in names[0]}
