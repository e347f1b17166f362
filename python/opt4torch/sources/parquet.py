"""Parquet read in place: ``opt4torch.Parquet(paths)``, rows as dicts.

Local paths and ``s3://`` URLs (the object store's client, as
``S3TarShards`` uses it). A Parquet file is read by row group: a row group's column chunks lie one
after another in the file, so the row group is one byte range, and a row
cannot be decoded without its column chunks' pages. A miss therefore reads
the row group that holds its row, through the engine's byte-range reader
(``_engine.Ranges``, src/source/ranges.c: ``pread`` from C, and from the
prefetcher's C threads straight into the pool), and pyarrow decodes it.

Rows are smaller than that read, so the plan is made over what a read
fetches: given to :class:`opt4torch.DataLoader`, the sampler's rows are
captured as usual, each access is mapped to its row group (the read unit),
and OPT plans over the row groups, in bytes. A hit is a cached row group;
the row is decoded from it after the cache, at the position that asked for
it (the position says which row). Storage bytes then equal the plan's miss
bytes, as for every other source; docs/algorithm.md, "Read units", has the
rule and what it costs against OPT over rows.

Decoding a cached row group: pyarrow's ``ParquetFile`` is given a file-like
view that serves the file's footer (read once, here) and the row group's
bytes at their original offsets, and refuses anything else, so a row is
decoded from what was read and cached, or not at all.

Bad input is refused naming the file: a file that is not Parquet, a corrupt
footer, a row group that reaches past the end of the file (cut short), a
schema that differs between files, and a file changed after it was indexed
(its size, mtime or inode, checked before a row group is decoded).
"""

from __future__ import annotations

import functools
import glob
import os
import stat
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .base import EngineSource, checked_index
from .local import RangeDataset
from .s3 import ObjectDataset, folder_of, one_bucket, split_object_url
from .shardnames import expand_shards

__all__ = ["Parquet", "ParquetError"]

_MAGIC = b"PAR1"
_INSTALL = "pip install 'opt4torchdataset[hf]' (or pip install pyarrow)"


def _pq() -> Any:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"opt4torch.Parquet needs pyarrow, which is not installed: {_INSTALL}",
                                  name=e.name) from e
    return pq


class ParquetError(ValueError):
    """A Parquet file that cannot be read as indexed; the message names it."""


class _RowGroups(RangeDataset):
    """The read units: item ``u`` is row group ``u``'s bytes, one range of
    its file, read by the engine (and by the prefetcher's C threads, framed
    as these bytes)."""

    def __init__(self, files: list[str], rows: np.ndarray, direct: bool, latency: float,
                 idents: np.ndarray) -> None:
        self._files = files
        self._rows = rows
        self.direct = direct
        self.latency = latency
        # Each file's (size, inode, mtime, ctime) when its footer was read:
        # the engine checks every read against it, so a file changed since
        # is refused naming it, never read as the old row groups.
        self._idents = idents
        self._open_ranges()

    def __getitem__(self, index: int) -> bytes:
        data: bytes = self._r.read(checked_index(index, len(self)))
        return data

    def engine_source(self) -> EngineSource:
        return EngineSource(self._r, frame="bytes")

    def __repr__(self) -> str:
        return f"Parquet row groups ({len(self)} in {len(self._files)} files)"


class _S3RowGroups(ObjectDataset):
    """The read units of Parquet files kept as objects: item ``u`` is row
    group ``u``'s bytes, one ranged GET (the engine's, where it can, and the
    C prefetcher's; else s3torchconnector's), as ``S3TarShards`` reads a
    sample. Where the store is and who asks: as :class:`opt4torch.S3TarShards`."""

    def __init__(self, urls: str | Sequence[str], *, endpoint_url: str | None = None, region: str | None = None,
                 profile: str | None = None, unsigned: bool = False, path_style: bool | None = None,
                 max_attempts: int = 3, latency: float = 0.0, client: str = "auto", timeout: float = 60.0,
                 deadline: float = 300.0, min_rate: int = 1024, ca_bundle: str | os.PathLike[str] | None = None
                 ) -> None:
        self._set_waits(timeout, deadline, min_rate, ca_bundle)
        self._setup(one_bucket(urls, "Parquet", "files"), endpoint_url, region, profile, unsigned, path_style,
                    max_attempts, latency, client)
        self.urls, listing = self._expand_urls(urls, "Parquet", "files", ".parquet")
        self.keys = [split_object_url(u)[1] for u in self.urls]
        self.listing: dict[str, tuple[int, str]] = {}
        for url, key in zip(self.urls, self.keys):
            if key not in listing(folder_of(key)):
                raise FileNotFoundError(f"no object {url} {self._where()} (a Parquet file)")
            self.listing[key] = listing(folder_of(key))[key]
        # Every GET sends the listed ETag (If-Match) and checks the size.
        self._etags = [self.listing[k][1] for k in self.keys]
        self._rows = np.empty((0, 3), dtype=np.int64)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of object ``key`` from ``offset`` (a footer's
        read, not counted as a row group's)."""
        data: bytes = self._get(key, offset, length, count=False)
        return data

    def set_rows(self, rows: np.ndarray) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return int(self._rows.shape[0])

    def __getitem__(self, index: int) -> bytes:
        u = self._index(index)
        if self._uses_c():
            return self._read_item(u)
        f, off, length = (int(x) for x in self._rows[u])
        return self._get(self.keys[f], off, length)

    def _objects(self) -> tuple[list[str], np.ndarray]:
        return self.keys, self._rows

    def _object_sizes(self) -> list[int]:
        return [self.listing[k][0] for k in self.keys]

    def engine_source(self) -> EngineSource | None:
        reader = self._engine_reader()
        return None if reader is None else EngineSource(reader, frame="bytes")

    def opt4_item_bytes(self, index: int) -> int:
        return int(self._rows[int(index), 2])

    def item_sizes(self) -> np.ndarray:
        return self._rows[:, 2].copy()

    def info(self) -> dict[str, Any]:
        return {"count": len(self), "files": len(self.urls), **self._info()}


class _Decoder:
    """Row group bytes -> rows, with pyarrow, from the footer kept here and
    the cached bytes only. Picklable; keeps the last row group it decoded
    (rows of one row group often come together)."""

    def __init__(self, files: list[str], sizes: list[int], idents: list[Any], footers: list[bytes],
                 units: np.ndarray) -> None:
        self.files = files
        self.sizes = sizes
        self.idents = idents  # a local file's (size, mtime_ns, inode); None for an object
        self.footers = footers
        self.units = units  # per unit: file, offset, length, row group in its file
        self._last: tuple[int, Any] | None = None
        self._meta: dict[int, Any] = {}  # parsed footers, per process

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_last"] = None
        state["_meta"] = {}
        return state

    @staticmethod
    def _check_unchanged(path: str, ident: tuple[int, int, int]) -> None:
        """A local file still as indexed (size, mtime, inode), or ParquetError."""
        try:
            st = os.stat(path)
        except OSError as e:
            raise ParquetError(f"Parquet file {path} can no longer be read ({e}); it was indexed when "
                               "this dataset was made: make it again") from None
        if (st.st_size, st.st_mtime_ns, st.st_ino) != ident:
            raise ParquetError(f"Parquet file {path} changed after it was indexed (size, mtime or inode differ): "
                               "its row groups may no longer be where the index says; make the dataset again")

    def table(self, unit: int, blob: Any) -> Any:
        if self._last is not None and self._last[0] == unit:
            return self._last[1]
        f, off, length, rg = (int(x) for x in self.units[unit])
        path = self.files[f]
        if self.idents[f] is not None:
            self._check_unchanged(path, self.idents[f])
        if len(blob) != length:
            raise ParquetError(f"row group {rg} of Parquet file {path}: {len(blob)} bytes read where the index "
                               f"says {length}; the file changed or was cut short")
        view = _CachedView(path, self.sizes[f], self.footers[f], off, blob)
        try:
            meta = self._meta.get(f)
            if meta is None:
                meta = self._meta[f] = _parse_footer(_pq(), self.footers[f])
            table = _pq().ParquetFile(view, metadata=meta).read_row_group(rg)
        except ParquetError:
            raise
        except Exception as e:  # pyarrow's errors on damaged pages
            raise ParquetError(f"row group {rg} of Parquet file {path} cannot be decoded: {type(e).__name__}: {e}"
                               ) from e
        self._last = (unit, table)
        return table


class _CachedView:
    """A read-only file that holds only a footer and one cached byte range,
    at their offsets in the original file; a read anywhere else is refused
    (pyarrow must decode from what was read and cached)."""

    def __init__(self, name: str, size: int, footer: bytes, offset: int, blob: Any) -> None:
        self.name = name
        self.size = size
        self.footer = footer
        self.footer_at = size - len(footer)
        self.offset = offset
        self.blob = memoryview(blob)
        self.pos = 0
        self.closed = False

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.size + pos
        return self.pos

    def read(self, n: int = -1) -> bytes:
        lo = self.pos
        hi = self.size if n is None or n < 0 else min(self.size, lo + n)
        if self.footer_at <= lo and hi <= self.size:
            out = self.footer[lo - self.footer_at:hi - self.footer_at]
        elif self.offset <= lo and hi <= self.offset + len(self.blob):
            out = bytes(self.blob[lo - self.offset:hi - self.offset])
        else:
            raise ParquetError(f"Parquet file {self.name}: the reader asked for bytes {lo}-{hi}, outside the "
                               f"cached row group ({self.offset}-{self.offset + len(self.blob)}) and the footer")
        self.pos = hi
        return out

    def close(self) -> None:
        self.closed = True


class Parquet:
    """Parquet files read in place: ``ds[i]`` is row ``i`` as a dict (column
    name -> value, as ``pyarrow`` reads it: ``table.slice(i, 1).to_pylist()[0]``),
    rows numbered file after file in the order of ``paths``.

    ``paths``: a file, a list of files, or a pattern as for
    :class:`opt4torch.TarShards`: ``::``-separated, brace-expanded
    (``"train-{00000..00003}.parquet"``), globs (``"data/*.parquet"``,
    sorted). Every file's footer is read here and checked; all files must
    have the same schema.

    Given to :class:`opt4torch.DataLoader`, OPT plans over row groups (what a
    read fetches: docs/algorithm.md, "Read units"), the cache holds row
    groups' bytes as stored (compressed), and the prefetcher's C threads
    read them. ``direct`` and ``latency`` are as for ``ImageFolder``.

    ``s3://bucket/...`` URLs read the files as objects in an S3-compatible
    store (one bucket; braces, and globs in the last part of a name): each
    footer by ranged GETs here, each row group by one ranged GET, the
    engine's own where it can; ``store`` takes ``endpoint_url``, ``region``,
    ``profile``, ``unsigned``, ``path_style``, ``max_attempts`` and
    ``client``, as :class:`opt4torch.S3TarShards` does.
    """

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, direct: bool = False,
                 latency: float = 0.0, **store: Any) -> None:
        pq = _pq()
        if not isinstance(paths, (str, os.PathLike)) and not paths:
            raise ValueError("Parquet needs at least one file")
        first = os.fspath(paths if isinstance(paths, (str, os.PathLike)) else paths[0])
        self.direct = bool(direct)
        self.latency = float(latency)
        footers: list[tuple[bytes, Any]] = []
        idents: list[Any] = []
        if str(first).startswith("s3://"):
            if direct:
                raise ValueError("direct=True reads local files with O_DIRECT; objects in a store have no such read")
            urls = [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
            groups = _S3RowGroups(urls if len(urls) > 1 else urls[0], latency=self.latency, **store)
            self.paths = list(groups.urls)
            for key in groups.keys:
                size, etag = groups.listing[key]
                url = f"s3://{groups.bucket}/{key}"
                footers.append(_footer(pq, url, size, functools.partial(groups.get_range, key)))
                idents.append(None)  # an object is checked by its length on every GET
            sizes = [groups.listing[k][0] for k in groups.keys]
        else:
            if store:
                raise TypeError(f"Parquet got {', '.join(sorted(store))}: these are for s3:// URLs only")
            self.paths = expand_shards(paths, exists=os.path.exists,
                                       match=lambda p: sorted(glob.glob(p, recursive=True)))
            for path in self.paths:
                ident, footer, meta = _read_footer(pq, path)
                idents.append(ident)
                footers.append((footer, meta))
            sizes = [ident[0] for ident in idents]
        units, first_row, self.schema = _row_groups(self.paths, sizes, footers)
        self._n = int(first_row[-1])
        self._first_row = first_row
        #: The row group (read unit) of every row.
        self.unit_of = np.repeat(np.arange(len(units), dtype=np.int64), np.diff(first_row))
        rows = np.ascontiguousarray(units[:, :3])
        if str(first).startswith("s3://"):
            groups.set_rows(rows)
            self._groups: Any = groups
        else:
            files = np.asarray([(st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
                                for st in map(os.stat, self.paths)], dtype=np.int64).reshape(-1, 4)
            if not np.array_equal(files[:, 0], np.asarray(sizes, dtype=np.int64)):
                changed = self.paths[int(np.flatnonzero(files[:, 0] != np.asarray(sizes))[0])]
                raise ParquetError(f"{changed}: the file changed while it was being indexed; try again")
            self._groups = _RowGroups(list(self.paths), rows, self.direct, self.latency, files)
        self._decoder = _Decoder(list(self.paths), sizes, idents, [f for f, _ in footers], units)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = checked_index(index, self._n)
        unit = int(self.unit_of[i])
        return self._row(unit, self._groups[unit], i)

    def _row(self, unit: int, blob: Any, row: int) -> dict[str, Any]:
        table = self._decoder.table(unit, blob)
        got: dict[str, Any] = table.slice(row - int(self._first_row[unit]), 1).to_pylist()[0]
        return got

    def engine_source(self) -> EngineSource | None:
        """Prefetch is on by default: the loader's C threads read the row groups."""
        result: EngineSource | None = self._groups.engine_source()
        return result

    def unit_sizes(self) -> np.ndarray:
        """Every row group's bytes as read (int64)."""
        sizes: np.ndarray = self._groups.item_sizes()
        return sizes

    def info(self) -> dict[str, Any]:
        """The reader's counters (reads, bytes_read) and what it is."""
        got: dict[str, Any] = self._groups.info()
        return got

    def opt4_read_units(self, per_epoch: list[np.ndarray], transform: Callable[[Any], Any] | None,
                        shared: bool) -> tuple[Any, Any, list[np.ndarray]]:
        """The DataLoader's step after capturing the rows (``per_epoch``: each
        epoch's row indices): the dataset it plans over (row groups), the
        transform that decodes a position's row from its row group, and each
        epoch's row groups."""
        if shared:
            raise ValueError("opt4torch.Parquet plans over row groups, which share_across_ranks does not take "
                             "yet: give each rank its own loader (share_across_ranks=False)")
        rows = np.concatenate(per_epoch) if per_epoch else np.empty(0, np.int64)
        return self._groups, _RowAt(self, rows, transform), [self.unit_of[e] for e in per_epoch]

    def __repr__(self) -> str:
        return f"Parquet({len(self.paths)} files, {self._n} rows, {len(self._groups)} row groups)"


class _RowAt:
    """After the cache: the row group a position got -> the row that position
    asked for (``rows[position]``), then the loader's ``transform``."""

    def __init__(self, ds: Parquet, rows: np.ndarray, then: Callable[[Any], Any] | None) -> None:
        self.ds = ds
        self.rows = rows
        self.then = then

    def at_positions(self, blobs: list[Any], positions: Sequence[int]) -> list[Any]:
        out = []
        for blob, t in zip(blobs, positions):
            row = int(self.rows[int(t)])
            sample = self.ds._row(int(self.ds.unit_of[row]), blob, row)
            out.append(self.then(sample) if self.then is not None else sample)
        return out

    def __call__(self, blob: Any) -> Any:
        raise TypeError("a Parquet row is decoded at its position: PlannedDataset calls at_positions")


def _row_groups(paths: list[str], sizes: list[int], footers: list[tuple[bytes, Any]]) -> tuple[np.ndarray,
                                                                                             np.ndarray, Any]:
    """Every file's row groups as read units, int64 rows (file, offset,
    length, row group in its file); the first row of each unit (and the
    count after the last); the schema, which every file must share."""
    units: list[tuple[int, int, int, int]] = []
    first_row: list[int] = []
    schema: Any = None
    rows = 0
    for f, (path, size, (footer, meta)) in enumerate(zip(paths, sizes, footers)):
        this = meta.schema.to_arrow_schema()
        if schema is None:
            schema = this
        elif not this.equals(schema):
            raise ParquetError(f"Parquet file {path} has another schema than {paths[0]}: every file of one "
                               f"dataset must have the same columns and types.\n{paths[0]}:\n{schema}\n"
                               f"{path}:\n{this}")
        data_end = size - len(footer)
        for rg in range(meta.num_row_groups):
            g = meta.row_group(rg)
            lo, hi = _row_group_range(g)
            if not 4 <= lo <= hi <= data_end:
                raise ParquetError(f"Parquet file {path}: row group {rg} lies at bytes {lo}-{hi}, outside the "
                                   f"file's data (4-{data_end}): the file is cut short or its footer is damaged; "
                                   "write it again")
            units.append((f, lo, hi - lo, rg))
            first_row.append(rows)
            rows += g.num_rows
        if sum(meta.row_group(k).num_rows for k in range(meta.num_row_groups)) != meta.num_rows:
            raise ParquetError(f"Parquet file {path}: its row groups' rows do not add up to its row count; the "
                               "footer is damaged")
    return (np.asarray(units, dtype=np.int64).reshape(-1, 4), np.asarray(first_row + [rows], dtype=np.int64),
            schema)


def _row_group_range(g: Any) -> tuple[int, int]:
    """The byte range of a row group's column chunks (each from its
    dictionary page, where it has one, to its last data page)."""
    lo, hi = None, 0
    for c in range(g.num_columns):
        col = g.column(c)
        start = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset is not None and col.dictionary_page_offset > 0:
            start = min(start, col.dictionary_page_offset)
        lo = start if lo is None else min(lo, start)
        hi = max(hi, start + col.total_compressed_size)
    return (lo if lo is not None else 4), hi


def _read_footer(pq: Any, path: str) -> tuple[tuple[int, int, int], bytes, Any]:
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
        footer, meta = _footer(pq, path, st.st_size, lambda off, n: os.pread(fd, n, off))
        if os.fstat(fd).st_mtime_ns != st.st_mtime_ns:
            raise ParquetError(f"Parquet file {path} changed while its footer was read; try again once it is "
                               "written")
    finally:
        os.close(fd)
    return (st.st_size, st.st_mtime_ns, st.st_ino), footer, meta


def _footer(pq: Any, name: str, size: int, read: Callable[[int, int], bytes]) -> tuple[bytes, Any]:
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
        meta = _parse_footer(pq, footer)
    except Exception as e:
        raise ParquetError(f"Parquet file {name}: its footer is corrupt ({type(e).__name__}: {e}); write it "
                           "again") from e
    return footer, meta


def _parse_footer(pq: Any, footer: bytes) -> Any:
    """A file's metadata from its footer alone (the thrift metadata, its
    length and the magic): pyarrow reads it as a file of just the magic and
    the footer, since parsing looks at nothing else."""
    import pyarrow as pa

    return pq.read_metadata(pa.BufferReader(_MAGIC + footer))
