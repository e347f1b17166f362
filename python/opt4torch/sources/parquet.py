"""Parquet read in place: ``opt4torch.Parquet(paths)``, rows as dicts.

Local paths and ``s3://`` URLs (the object store's client, as
``S3TarShards`` uses it). A row cannot in general be decoded without
its column chunks' pages, so a miss reads a *read unit* that holds its row:

- where a row group's largest column keeps each value as a byte range of
  its own (PLAIN, uncompressed pages: the Hub's images), the row alone:
  its value's bytes, the other columns read at indexing and kept
  (parquetvalues.py);
- where a row group's columns all have an offset index (the page index;
  ``datasets`` writes one), a page range: the rows between two page
  boundaries of its largest column, read as each column's dictionary page
  (where the pages need it) and the data pages covering those rows
  (parquetpages.py; the footer's thrift and the offset index are read in
  parquetmeta.py). Its pieces lie apart in the file; the engine reads them
  one after another into one buffer (``opt4_source_gather``).
- else the row group: its column chunks lie one after another, one range.

Reads go through the engine's byte-range readers (``_engine.Ranges``:
``pread`` from C; ``_engine.S3Ranges``: ranged GETs), from the prefetcher's
C threads straight into the pool.

Rows are smaller than a unit, so the plan is made over what a read
fetches: given to :class:`opt4torch.DataLoader`, the sampler's rows are
captured as usual, each access is mapped to its unit, and OPT plans over
the units, in bytes. A hit is a cached unit; the row is decoded from it
after the cache, at the position that asked for it (the position says
which row). Storage bytes then equal the plan's miss bytes, as for every
other source; docs/algorithm.md, "Read units", has the rule and what it
costs against OPT over rows.

Decoding a cached unit: pyarrow reads its bytes in place as a small Parquet
file, with a footer naming its column chunks or pages, made from the file's
footer (read once, here; parquetpages.py). A row is decoded from what was
read and cached, or not at all.

Bad input is refused naming the file: a file that is not Parquet, a corrupt
footer or offset index, a row group that reaches past the end of the file
(cut short), a schema that differs between files, and a file changed after
it was indexed (its size, mtime or inode, checked before a unit is
decoded).
"""

from __future__ import annotations

import functools
import glob
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .base import EngineSource, checked_index
from .parquetindex import FILES_AT_ONCE, ParquetError, footer_of, index_units, pread_exact, pyarrow_parquet, read_footer
from .parquetread import PieceReader, S3PieceReader, UnitDecoder, UnitReader
from .parquetvalues import RowValues, load_walks, save_walks
from .shardnames import expand_shards

__all__ = ["Parquet", "ParquetError"]


class Parquet:
    """Parquet files read in place: ``ds[i]`` is row ``i`` as a dict (column
    name -> value, as ``pyarrow`` reads it: ``table.slice(i, 1).to_pylist()[0]``),
    rows numbered file after file in the order of ``paths``.

    ``paths``: a file, a list of files, or a pattern as for
    :class:`opt4torch.TarShards`: ``::``-separated, brace-expanded
    (``"train-{00000..00003}.parquet"``), globs (``"data/*.parquet"``,
    sorted). Every file's footer is read here and checked; all files must
    have the same schema.

    Given to :class:`opt4torch.DataLoader`, OPT plans over the read units
    (what a read fetches: docs/algorithm.md, "Read units"): each row alone
    where its row group keeps the largest column's values as byte ranges of
    their own (PLAIN, uncompressed: ``datasets`` writes images so) and
    ``values`` is true (the default); else page ranges where the file has
    an offset index and ``pages`` is true (the default); else row groups. The cache holds the units' bytes as stored
    (compressed), and the prefetcher's C threads read them. ``direct`` and
    ``latency`` are as for ``ImageFolder``.

    ``s3://bucket/...`` URLs read the files as objects in an S3-compatible
    store (one bucket; braces, and globs in the last part of a name): each
    footer and offset index by ranged GETs here, each unit by one ranged GET
    a piece (a row group is one piece), the
    engine's own where it can; ``store`` takes ``endpoint_url``, ``region``,
    ``profile``, ``unsigned``, ``path_style``, ``max_attempts`` and
    ``client``, as :class:`opt4torch.S3TarShards` does. Where rows are read
    alone, the walk of their values (a small ranged GET a row) is cached in
    ``cache_dir`` (default ``~/.cache/opt4torch``, as for ``S3TarShards``)
    for each version (ETag) of an object, and checked again where it is
    used: a later dataset over the same objects reads a page header a page.
    """

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, direct: bool = False,
                 latency: float = 0.0, pages: bool = True, values: bool = True,
                 cache_dir: str | os.PathLike[str] | None = None, **store: Any) -> None:
        pq = pyarrow_parquet()
        if not isinstance(paths, (str, os.PathLike)) and not paths:
            raise ValueError("Parquet needs at least one file")
        first = os.fspath(paths if isinstance(paths, (str, os.PathLike)) else paths[0])
        self.direct = bool(direct)
        self.latency = float(latency)
        footers: list[tuple[bytes, Any]] = []
        idents: list[Any] = []
        reads: list[Callable[[int, int], bytes]] = []
        row_values = RowValues()
        walk_caches: list[tuple[str, dict[str, Any]]] = []  # per object: where its walk is cached, and its version
        if str(first).startswith("s3://"):
            if direct:
                raise ValueError("direct=True reads local files with O_DIRECT; objects in a store have no such read")
            urls = [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
            groups = S3PieceReader(urls if len(urls) > 1 else urls[0], latency=self.latency, **store)
            self.paths = list(groups.urls)
            reads = [functools.partial(groups.get_range, key) for key in groups.keys]
            urls = [f"s3://{groups.bucket}/{key}" for key in groups.keys]
            with ThreadPoolExecutor(max_workers=min(FILES_AT_ONCE, len(urls))) as pool:  # each a GET or two
                footers = list(pool.map(lambda k: footer_of(pq, urls[k], groups.listing[groups.keys[k]][0], reads[k]),
                                        range(len(urls))))
            idents = [None] * len(urls)  # an object is checked by its length on every GET
            for f, (key, url) in enumerate(zip(groups.keys, urls)):
                walk_caches.append(_walk_cache(cache_dir, groups, key, url))
                for rg, walk in load_walks(*walk_caches[-1], footers[f][1].num_rows).items():
                    row_values.known[(f, rg)] = walk
            sizes = [groups.listing[k][0] for k in groups.keys]
        else:
            if store or cache_dir is not None:
                given = sorted(store) + (["cache_dir"] if cache_dir is not None else [])
                raise TypeError(f"Parquet got {', '.join(given)}: these are for s3:// URLs only")
            self.paths = expand_shards(paths, exists=os.path.exists,
                                       match=lambda p: sorted(glob.glob(p, recursive=True)))
            for path in self.paths:
                ident, footer, meta = read_footer(pq, path)
                idents.append(ident)
                footers.append((footer, meta))
                reads.append(functools.partial(pread_exact, path))
            sizes = [ident[0] for ident in idents]
        self.pages = bool(pages)
        self.values = bool(values) and self.pages
        made = index_units(self.paths, sizes, footers, reads if self.pages else None,
                           row_values if self.values else None)
        for f, (where, version) in enumerate(walk_caches):
            walks = {rg: w for (g, rg), w in row_values.walks.items() if g == f}
            if walks and any(row_values.known.get((f, rg)) is not w for rg, w in walks.items()):
                save_walks(where, version, walks)
        units, pieces, first_piece, first_row, self.schema, page_info = made
        self._n = int(first_row[-1])
        self._first_row = first_row
        #: The read unit of every row.
        self.unit_of = np.repeat(np.arange(len(units), dtype=np.int64), np.diff(first_row))
        if str(first).startswith("s3://"):
            groups.set_rows(pieces)
            reader: Any = groups
        else:
            files = np.asarray([(st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
                                for st in map(os.stat, self.paths)], dtype=np.int64).reshape(-1, 4)
            if not np.array_equal(files[:, 0], np.asarray(sizes, dtype=np.int64)):
                changed = self.paths[int(np.flatnonzero(files[:, 0] != np.asarray(sizes))[0])]
                raise ParquetError(f"{changed}: the file changed while it was being indexed; try again")
            reader = PieceReader(list(self.paths), pieces, self.direct, self.latency, files)
        self._groups = UnitReader(reader, first_piece)
        self._decoder = UnitDecoder(list(self.paths), idents, [f for f, _ in footers], units, pieces, first_piece,
                                    page_info, row_values)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = checked_index(index, self._n)
        unit = int(self.unit_of[i])
        return self._row(unit, self._groups[unit], i)

    def _row(self, unit: int, blob: Any, row: int) -> dict[str, Any]:
        return self._decoder.row(unit, blob, row, int(self._first_row[unit]))

    def engine_source(self) -> EngineSource | None:
        """Prefetch is on by default: the loader's C threads read the row groups."""
        result: EngineSource | None = self._groups.engine_source()
        return result

    def unit_sizes(self) -> np.ndarray:
        """Every read unit's bytes as read (int64)."""
        sizes: np.ndarray = self._groups.item_sizes()
        return sizes

    def info(self) -> dict[str, Any]:
        """The reader's counters (reads, bytes_read) and what it is."""
        got: dict[str, Any] = self._groups.info()
        return got

    def opt4_read_units(self, rows: np.ndarray, transform: Callable[[Any], Any] | None
                        ) -> tuple[Any, Any, np.ndarray]:
        """The DataLoader's step after capturing the rows (``rows``: the row
        at each position of its sequence, the node's ranks' merged with
        ``share_across_ranks``): the dataset it plans over (the read units),
        the transform that decodes a position's row from its unit, and the
        unit at each position."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        # Rows taken ahead only where a unit holds several (none of rows alone)
        ahead = _RowAt.LOOKAHEAD if len(self._groups) < self._n else 0
        return self._groups, _RowAt(self, rows, transform, ahead), self.unit_of[rows]

    def __repr__(self) -> str:
        return f"Parquet({len(self.paths)} files, {self._n} rows, {len(self._groups)} read units)"


def _walk_cache(cache_dir: str | os.PathLike[str] | None, groups: S3PieceReader, key: str,
                url: str) -> tuple[str, dict[str, Any]]:
    """Where an object's walk is cached, and the version of it the cache must
    name: its URL, endpoint, size and ETag."""
    import hashlib
    import posixpath

    folder = os.fspath(cache_dir) if cache_dir is not None else os.path.join(os.path.expanduser("~"), ".cache",
                                                                             "opt4torch")
    size, etag = groups.listing[key]
    tag = hashlib.sha256(f"{groups.endpoint_url}|{groups.bucket}|{key}".encode("utf-8", "surrogatepass")).hexdigest()
    ident = {"url": url, "endpoint": groups.endpoint_url or "", "size": int(size), "etag": etag}
    return os.path.join(folder, f"{posixpath.basename(key)}-{tag[:16]}.opt4pq.json"), ident


class _RowAt:
    """After the cache: the unit a position got -> the row that position
    asked for (``rows[position]``), then the loader's ``transform``.

    A unit's rows are spread over the epoch, so a worker that decodes a
    unit for one batch takes from it, at once, the rows of the same unit
    at its next ``lookahead`` batches' positions, and holds them (decoded
    rows, not units: about ``lookahead`` batches of rows at most) until
    those positions come. Its next batches are guessed from the stride
    between the batches it was given (torch hands batches to workers in
    turn; the first guess is the workers' count times the batch). A wrong
    guess costs a row taken for nothing, dropped once its position is
    passed; a row is only ever served at the position it was taken for,
    and every position still reads its unit through the pool (hits and
    bytes as planned).

    A unit that HITs comes as a read-only view of the worker's copy of the
    pool's bytes (``takes_views``), which pyarrow reads in place."""

    #: PlannedDataset hands HITs' bytes over as memoryviews, not copies.
    takes_views = True

    #: Batches ahead a decoded unit gives its rows to.
    LOOKAHEAD = 4

    def __init__(self, ds: Parquet, rows: np.ndarray, then: Callable[[Any], Any] | None,
                 lookahead: int = LOOKAHEAD) -> None:
        self.ds = ds
        self.rows = rows
        self.then = then
        self.lookahead = int(lookahead)
        self._state()

    def _state(self) -> None:
        self._held: dict[int, tuple[int, Any]] = {}  # position -> (row, the row decoded)
        self._prev = -1  # the first position of the last batch served here
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_held", "_prev", "_lock"):
            del state[k]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._state()

    def _ahead(self, first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """This process's guessed next positions and their units: the
        ``lookahead`` batches of ``n`` a stride apart after the batch at
        ``first``."""
        if 0 <= self._prev < first:
            stride = first - self._prev
        else:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            stride = n * (info.num_workers if info is not None else 1)
        self._prev = first
        steps = np.arange(1, self.lookahead + 1, dtype=np.int64)[:, None] * stride
        at = (first + steps + np.arange(n, dtype=np.int64)[None, :]).ravel()
        at = at[at < len(self.rows)]
        return at, self.ds.unit_of[self.rows[at]]

    def at_positions(self, blobs: list[Any], positions: Sequence[int]) -> list[Any]:
        where = [int(t) for t in positions]
        rows = [int(self.rows[t]) for t in where]
        out: list[Any] = [None] * len(rows)
        with self._lock:
            first = min(where, default=0)
            todo = []
            for k, (t, r) in enumerate(zip(where, rows)):
                got = self._held.pop(t, None)
                if got is not None and got[0] == r:
                    out[k] = got[1]
                else:
                    todo.append(k)
            for t in [t for t in self._held if t < first]:  # guessed wrong: passed, never asked for
                del self._held[t]
            ahead, ahead_units = self._ahead(first, len(where)) if self.lookahead > 0 else (None, None)
            units = {k: int(self.ds.unit_of[rows[k]]) for k in todo}
            # A batch's rows decoded unit by unit: a unit is decoded once for
            # all its rows in the batch (the decoder keeps the last one), and
            # gives the rows it holds for the next batches here. The
            # transform then runs in the batch's order, as its randomness expects.
            done: set[int] = set()
            for k in sorted(todo, key=units.__getitem__):
                u = units[k]
                out[k] = self.ds._row(u, blobs[k], rows[k])
                if ahead is None or u in done:
                    continue
                done.add(u)
                for q in ahead[ahead_units == u].tolist():
                    if q not in self._held:
                        r = int(self.rows[q])
                        self._held[q] = (r, self.ds._row(u, blobs[k], r))
        return out if self.then is None else [self.then(sample) for sample in out]

    def __call__(self, blob: Any) -> Any:
        raise TypeError("a Parquet row is decoded at its position: PlannedDataset calls at_positions")
