"""What a Parquet file holds, read at indexing: its footer (checked), its
row groups' byte ranges, and its read units (page ranges through the offset
index, parquetpages.py, else row groups), with the pieces each unit reads.
Also ParquetError and pyarrow's import, which every Parquet module shares.
May touch: the files it is given (their footers and offset indexes).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from . import parquetmeta as pm
from .parquetpages import Chunk, PageHeads, chunk_start, leaf_fields, page_units, read_chunks
from .parquetvalues import RowValues, read_kept, value_column, walk_values

__all__ = ["FILES_AT_ONCE", "PageInfo", "ParquetError", "footer_of", "index_units", "parse_footer", "pread_exact",
           "pyarrow_parquet", "read_footer"]

_MAGIC = b"PAR1"
_INSTALL = "pip install 'opt4torchdataset[hf]' (or pip install pyarrow)"


def pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"opt4torch.Parquet needs pyarrow, which is not installed: {_INSTALL}",
                                  name=e.name) from e
    return pq


class ParquetError(ValueError):
    """A Parquet file that cannot be read as indexed; the message names it."""


class PageInfo:
    """What decoding page units needs, per file and row group: each leaf's
    top-level field, the chunks' page locations, the row count; per page
    unit, each leaf's page run (one flat array, ``at[u]`` where unit ``u``'s
    begin)."""

    def __init__(self) -> None:
        self.fields: dict[int, list[int]] = {}
        self.chunks: dict[tuple[int, int], list[Chunk]] = {}
        self.rows: dict[tuple[int, int], int] = {}
        self._runs: list[np.ndarray] = []
        self.runs = np.empty((0, 2), np.int32)
        self.at: np.ndarray = np.empty(0, np.int64)
        self.width: np.ndarray = np.empty(0, np.int64)

    def add(self, runs: np.ndarray) -> None:
        self._runs.append(runs)

    def finish(self, paged: np.ndarray, leaves_of_unit: np.ndarray) -> None:
        self.runs = np.concatenate([r.reshape(-1, 2) for r in self._runs]) if self._runs else self.runs
        self._runs = []
        self.width = np.where(paged, leaves_of_unit, 0).astype(np.int64)
        self.at = np.concatenate([[0], np.cumsum(self.width)[:-1]]).astype(np.int64)

    def runs_of(self, unit: int) -> np.ndarray:
        a = int(self.at[unit])
        return self.runs[a:a + int(self.width[unit])]


#: Files indexed at once: over a store, a file's indexing is a chain of
#: GETs (footer, offset index, page headers, a row group's walk), so files
#: overlap their waits; locally it costs a few threads.
FILES_AT_ONCE = 8


class _FileUnits:
    """One file's read units, as :func:`index_units` puts them together:
    per unit (file, row group, first row in it, rows, kind), its pieces
    (file, offset, length), its rows before it in the file, its leaves, and
    the page runs and chunks of its page units."""

    def __init__(self) -> None:
        self.units: list[tuple[int, int, int, int, int]] = []
        self.pieces: list[list[tuple[int, int, int]]] = []
        self.first_row: list[int] = []
        self.leaves: list[int] = []
        self.runs: list[np.ndarray] = []
        self.fields: list[int] | None = None
        self.chunks: dict[tuple[int, int], list[Chunk]] = {}
        self.rows: dict[tuple[int, int], int] = {}
        self.count = 0

    def add(self, unit: tuple[int, int, int, int, int], pieces: list[tuple[int, int, int]], first_row: int,
            leaves: int) -> None:
        self.units.append(unit)
        self.pieces.append(pieces)
        self.first_row.append(first_row)
        self.leaves.append(leaves)


def index_units(paths: list[str], sizes: list[int], footers: list[tuple[bytes, Any]],
                reads: list[Callable[[int, int], bytes]] | None, values: RowValues | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any, PageInfo]:
    """Every file's read units: the page ranges of each row group whose
    columns all have an offset index (``reads`` given: read with
    ``reads[f](offset, length)``), else the row group; with ``values``,
    each row alone where the row group allows it (parquetvalues.py: what
    puts those rows together is added to ``values``). Files are indexed
    :data:`FILES_AT_ONCE` at a time; an error is the first file's in order.
    Returns the units, int64 rows (file, row group, first row in it, rows,
    kind: 0 a row group, 1 a page range, 2 a row's value); the pieces
    the reader reads, int64 rows (file, offset, length); each unit's first
    piece (and the count after the last); each unit's first row (and the
    count after the last); the schema, which every file must share; and
    what decoding the page units needs."""
    schema: Any = None
    for path, (_, meta) in zip(paths, footers):
        this = meta.schema.to_arrow_schema()
        if schema is None:
            schema = this
        elif not this.equals(schema):
            raise ParquetError(f"Parquet file {path} has another schema than {paths[0]}: every file of one "
                               f"dataset must have the same columns and types.\n{paths[0]}:\n{schema}\n"
                               f"{path}:\n{this}")

    def one(f: int) -> _FileUnits:
        return _file_units(f, paths[f], sizes[f], footers[f], None if reads is None else reads[f], schema, values)

    if len(paths) > 1:
        with ThreadPoolExecutor(max_workers=min(FILES_AT_ONCE, len(paths))) as pool:
            made = list(pool.map(one, range(len(paths))))
    else:
        made = [one(f) for f in range(len(paths))]
    info = PageInfo()
    units: list[tuple[int, int, int, int, int]] = []
    pieces: list[tuple[int, int, int]] = []
    first_piece: list[int] = [0]
    first_row: list[int] = []
    leaves_of_unit: list[int] = []
    rows = 0
    for f, m in enumerate(made):
        if m.fields is not None:
            info.fields[f] = m.fields
        info.chunks.update(m.chunks)
        info.rows.update(m.rows)
        for runs in m.runs:
            info.add(runs)
        units.extend(m.units)
        for ps in m.pieces:
            pieces.extend(ps)
            first_piece.append(len(pieces))
        first_row.extend(rows + r for r in m.first_row)
        leaves_of_unit.extend(m.leaves)
        rows += m.count
    unit_arr = np.asarray(units, dtype=np.int64).reshape(-1, 5)
    info.finish(unit_arr[:, 4] == 1, np.asarray(leaves_of_unit, dtype=np.int64))
    return (unit_arr, np.asarray(pieces, dtype=np.int64).reshape(-1, 3), np.asarray(first_piece, dtype=np.int64),
            np.asarray(first_row + [rows], dtype=np.int64), schema, info)


def _file_units(f: int, path: str, size: int, footer_meta: tuple[bytes, Any],
                read: Callable[[int, int], bytes] | None, schema: Any, values: RowValues | None) -> _FileUnits:
    """File ``f``'s read units (:func:`index_units`), its rows counted from 0."""
    footer, meta = footer_meta
    out = _FileUnits()
    if read is not None:
        read = PageHeads(read)  # a page's start read once, for the header check and the walk
    data_end = size - len(footer)
    tree: Any = None
    fields: list[int] = []
    if read is not None and any(meta.row_group(rg).column(c).has_offset_index
                                for rg in range(meta.num_row_groups)
                                for c in range(meta.row_group(rg).num_columns)):
        try:
            tree = pm.parse(footer)[0]
            fields = out.fields = leaf_fields(tree)
        except pm.ThriftError as e:
            raise ParquetError(f"Parquet file {path}: its footer is corrupt ({e}); write it again") from None
    rows = 0
    for rg in range(meta.num_row_groups):
        g = meta.row_group(rg)
        lo, hi = _row_group_range(g)
        if not 4 <= lo <= hi <= data_end:
            raise ParquetError(f"Parquet file {path}: row group {rg} lies at bytes {lo}-{hi}, outside the "
                               f"file's data (4-{data_end}): the file is cut short or its footer is damaged; "
                               "write it again")
        chunks = None
        if tree is not None and read is not None and g.num_rows > 0:
            try:
                chunks = read_chunks(tree, rg, read, data_end)
                if chunks is not None and len(chunks) != len(fields):
                    raise pm.ThriftError(f"{len(chunks)} column chunks for {len(fields)} leaf columns")
            except pm.ThriftError as e:
                raise ParquetError(f"Parquet file {path}: row group {rg}'s offset index is damaged ({e}); read "
                                   "the file by row groups (Parquet(..., pages=False)) or write it again"
                                   ) from None
        alone = None
        if chunks is not None and read is not None:
            alone = _values_of(f, path, size, read, meta, schema, rg, chunks, values)
        if chunks is None:
            out.add((f, rg, 0, g.num_rows, 0), [(f, lo, hi - lo)], rows, 0)
        elif alone is not None:
            for r, (off, n) in enumerate(alone.tolist()):
                out.add((f, rg, r, 1, 2), [(f, off, n)], rows + r, 0)
        else:
            out.chunks[(f, rg)] = chunks
            out.rows[(f, rg)] = g.num_rows
            unit_rows, unit_pieces, runs = page_units(chunks, g.num_rows, fields, list(schema.types))
            out.runs.append(runs)
            for (r0, r1), ps in zip(unit_rows, unit_pieces):
                out.add((f, rg, r0, r1 - r0, 1), [(f, off, n) for off, n in ps], rows + r0, len(chunks))
        rows += g.num_rows
    if rows != meta.num_rows:
        raise ParquetError(f"Parquet file {path}: its row groups' rows do not add up to its row count; the "
                           "footer is damaged")
    out.count = rows
    return out


def _values_of(f: int, path: str, size: int, read: Callable[[int, int], bytes], meta: Any, schema: Any, rg: int,
               chunks: list[Chunk], values: RowValues | None) -> np.ndarray | None:
    """Row group ``rg`` of file ``f``'s rows as units of their own (parquetvalues.py):
    each row's value (offset, bytes), its kept columns added to ``values``;
    None where the row group does not allow it."""
    column = value_column(meta, schema, rg, chunks) if values is not None else None
    if column is None or values is None:
        return None
    try:
        spans = walk_values(chunks[column.leaf], meta.row_group(rg).num_rows, read, column.max_def,
                            values.known.get((f, rg)))
    except pm.ThriftError as e:
        raise ParquetError(f"Parquet file {path}: row group {rg}, column {'.'.join(column.path)}: {e}; the file "
                           "is damaged: write it again") from None
    if spans is None:
        return None
    try:
        kept = read_kept(size, read, meta, rg, column)
    except (OSError, ValueError) as e:
        raise ParquetError(f"Parquet file {path}: row group {rg}'s other columns cannot be read ({type(e).__name__}: "
                           f"{e}); write the file again") from None
    if kept is not None and kept.num_rows != meta.row_group(rg).num_rows:
        raise ParquetError(f"Parquet file {path}: row group {rg}'s other columns hold {kept.num_rows} rows where the "
                           f"footer says {meta.row_group(rg).num_rows}; the file is damaged")
    values.schema = schema
    values.add(f, rg, column, kept, spans)
    return spans


def pread_exact(path: str, offset: int, length: int) -> bytes:
    """``length`` bytes of a local file from ``offset`` (an offset index's
    read at indexing, as the footer's), all of them or ParquetError."""
    with open(path, "rb") as fh:
        data = os.pread(fh.fileno(), length, offset)
    if len(data) != length:
        raise ParquetError(f"Parquet file {path}: bytes {offset}-{offset + length} are past its end; it was cut "
                           "short or changed while it was indexed")
    return data


def _row_group_range(g: Any) -> tuple[int, int]:
    """The byte range of a row group's column chunks (each from its
    dictionary page, where it has one, to its last data page)."""
    starts = [(chunk_start(g.column(c)), g.column(c).total_compressed_size) for c in range(g.num_columns)]
    if not starts:
        return 4, 0
    return min(a for a, _ in starts), max(a + n for a, n in starts)


def read_footer(pq: Any, path: str) -> tuple[tuple[int, int, int], bytes, Any]:
    """A local file's identity (size, mtime_ns, inode), its footer and the
    parsed metadata (:func:`_footer`)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(f"no Parquet file at {path!r}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ParquetError(f"{path} is not a regular file: Parquet files are read in place")
        footer, meta = footer_of(pq, path, st.st_size, lambda off, n: os.pread(fd, n, off))
        if os.fstat(fd).st_mtime_ns != st.st_mtime_ns:
            raise ParquetError(f"Parquet file {path} changed while its footer was read; try again once it is "
                               "written")
    finally:
        os.close(fd)
    return (st.st_size, st.st_mtime_ns, st.st_ino), footer, meta


def footer_of(pq: Any, name: str, size: int, read: Callable[[int, int], bytes]) -> tuple[bytes, Any]:
    """A file's footer (metadata, its length and the magic) read with
    ``read(offset, length)``, and the parsed metadata; every way it can be
    wrong is a ParquetError naming the file."""
    head = read(0, 4) if size >= 12 else b""
    tail = read(size - 8, 8) if size >= 12 else b""
    if head != _MAGIC or tail[4:] != _MAGIC:
        raise ParquetError(f"{name} is not a Parquet file (it does not begin and end with PAR1, {size} bytes): "
                           "give Parquet files only")
    flen = int.from_bytes(tail[:4], "little")
    if flen + 12 > size:
        raise ParquetError(f"Parquet file {name}: its footer claims {flen} bytes, more than the file holds "
                           f"({size}): the footer is corrupt or the file cut short; write it again")
    footer = read(size - flen - 8, flen + 8)
    try:
        meta = parse_footer(pq, footer)
    except Exception as e:
        raise ParquetError(f"Parquet file {name}: its footer is corrupt ({type(e).__name__}: {e}); write it "
                           "again") from e
    return footer, meta


def parse_footer(pq: Any, footer: bytes) -> Any:
    """A file's metadata from its footer alone (the thrift metadata, its
    length and the magic): pyarrow reads it as a file of just the magic and
    the footer, since parsing looks at nothing else."""
    import pyarrow as pa

    return pq.read_metadata(pa.BufferReader(_MAGIC + footer))
