"""Reading and decoding Parquet read units: the readers of their pieces
(local files through ``_engine.Ranges``, objects through the store's
client), the units the loader plans over (a unit's pieces one after
another), and a unit's bytes decoded by pyarrow into rows, from those bytes
and the footer kept at indexing only.
May touch: the files and objects it was given, through the engine's readers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import parquetmeta as pm
from .base import EngineSource, checked_index
from .local import RangeDataset
from .parquetindex import PageInfo, ParquetError, parse_footer, pyarrow_parquet
from .parquetpages import PagesDecoder
from .parquetvalues import RowValues
from .s3 import ObjectDataset, folder_of, one_bucket, split_object_url

__all__ = ["PieceReader", "S3PieceReader", "UnitDecoder", "UnitReader"]


class PieceReader(RangeDataset):
    """The pieces of the read units: item ``p`` is one byte range of a
    file (a row group, or a column's run of pages), read by the engine (and
    by the prefetcher's C threads, gathered into units)."""

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
        return f"Parquet pieces ({len(self)} in {len(self._files)} files)"


class S3PieceReader(ObjectDataset):
    """The pieces of the read units of Parquet files kept as objects: item
    ``p`` is one byte range of an object, one ranged GET (the engine's, where
    it can, and the C prefetcher's; else s3torchconnector's), as
    ``S3TarShards`` reads a sample. Where the store is and who asks: as
    :class:`opt4torch.S3TarShards`."""

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


class UnitReader:
    """The read units the loader plans over: unit ``u`` is the reader's
    pieces ``first[u]`` to ``first[u+1] - 1``, one after another (a row
    group is one piece; a page range one piece for each column's pages,
    fewer where they touch). The engine gathers them (``EngineSource.units``,
    ``opt4_source_gather``); a worker's miss joins them here. The reader
    counts every piece it reads."""

    def __init__(self, reader: Any, first: np.ndarray) -> None:
        self.reader = reader
        self.first = first
        counts = np.diff(first)
        self.single = bool((counts == 1).all())
        piece_sizes = reader.item_sizes()
        self.sizes = np.add.reduceat(piece_sizes, first[:-1]) if len(first) > 1 else np.empty(0, np.int64)

    def __len__(self) -> int:
        return len(self.first) - 1

    def __getitem__(self, index: int) -> bytes:
        u = checked_index(index, len(self))
        lo, hi = int(self.first[u]), int(self.first[u + 1])
        if hi - lo == 1:
            one: bytes = self.reader[lo]
            return one
        return b"".join(self.reader[p] for p in range(lo, hi))

    def __getitems__(self, indices: Sequence[int]) -> list[bytes]:
        return [self[i] for i in indices]

    def pieces_of(self, unit: int) -> int:
        """How many reads unit ``unit`` takes."""
        return int(self.first[unit + 1] - self.first[unit])

    def engine_source(self) -> EngineSource | None:
        src: EngineSource | None = self.reader.engine_source()
        if src is None or self.single:
            return src
        return EngineSource(src.records, frame=src.frame, units=self.first)

    def opt4_item_bytes(self, index: int) -> int:
        return int(self.sizes[int(index)])

    def item_sizes(self) -> np.ndarray:
        out: np.ndarray = self.sizes.astype(np.int64, copy=True)
        return out

    def info(self) -> dict[str, Any]:
        got: dict[str, Any] = self.reader.info()
        return got

    def __repr__(self) -> str:
        return f"Parquet read units ({len(self)}, {len(self.reader)} reads)"


class UnitDecoder:
    """A unit's bytes -> its rows, with pyarrow, from the footer kept here
    and the cached bytes only, a whole row group or a page range, through
    :class:`~opt4torch.sources.parquetpages.PagesDecoder`. Picklable; keeps
    the last unit it decoded (rows of one unit often come together)."""

    def __init__(self, files: list[str], idents: list[Any], footers: list[bytes], units: np.ndarray,
                 pieces: np.ndarray, first_piece: np.ndarray, pages: PageInfo, values: RowValues) -> None:
        self.files = files
        self.idents = idents  # a local file's (size, mtime_ns, inode); None for an object
        self.footers = footers
        self.units = units  # per unit: file, row group, first row in it, rows, kind (parquetindex.index_units)
        self.pieces = pieces
        self.first_piece = first_piece
        self.pages = pages
        self.values = values
        self._last: tuple[int, Any] | None = None
        self._pages_dec: dict[int, Any] = {}  # per file, per process

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_last"] = None
        state["_pages_dec"] = {}
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

    def row(self, unit: int, blob: Any, row: int, first_row: int) -> dict[str, Any]:
        """Row ``row`` (numbered in the dataset; its unit's first is
        ``first_row``) from its unit's bytes."""
        f, rg, r0, _, kind = (int(x) for x in self.units[unit])
        if kind != 2:
            got: dict[str, Any] = self.table(unit, blob).slice(row - first_row, 1).to_pylist()[0]
            return got
        path = self.files[f]
        if self.idents[f] is not None:
            self._check_unchanged(path, self.idents[f])
        try:
            return self.values.row(f, rg, r0, blob, int(self.pieces[int(self.first_piece[unit]), 2]),
                                   lambda: f"row {r0} of row group {rg} of Parquet file {path}")
        except ValueError as e:
            raise ParquetError(str(e)) from None

    def table(self, unit: int, blob: Any) -> Any:
        if self._last is not None and self._last[0] == unit:
            return self._last[1]
        f, rg, r0, n, paged = (int(x) for x in self.units[unit])
        path = self.files[f]
        if self.idents[f] is not None:
            self._check_unchanged(path, self.idents[f])
        lo, hi = int(self.first_piece[unit]), int(self.first_piece[unit + 1])
        length = int(self.pieces[lo:hi, 2].sum())
        what = f"rows {r0}-{r0 + n} of row group {rg}" if paged else f"row group {rg}"
        if len(blob) != length:
            raise ParquetError(f"{what} of Parquet file {path}: {len(blob)} bytes read where the index "
                               f"says {length}; the file changed or was cut short")
        try:
            dec = self._pages_dec.get(f)
            if dec is None:
                meta = parse_footer(pyarrow_parquet(), self.footers[f])
                dec = self._pages_dec[f] = PagesDecoder(pm.parse(self.footers[f])[0], meta.schema.to_arrow_schema(),
                                                        self.pages.fields.get(f), meta)
            if paged:
                table = dec.table(self.pages.chunks[(f, rg)], rg, self.pages.rows[(f, rg)], r0, r0 + n,
                                  self.pages.runs_of(unit), blob)
            else:
                table = dec.row_group(rg, blob)
        except ParquetError:
            raise
        except Exception as e:  # pyarrow's errors on damaged pages
            raise ParquetError(f"{what} of Parquet file {path} cannot be decoded: {type(e).__name__}: {e}"
                               ) from e
        self._last = (unit, table)
        return table

