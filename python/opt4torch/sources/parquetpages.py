"""Page ranges of Parquet row groups as read units, through the offset index.

A row group of the Hub's shards is hundreds of images; a miss that reads it
whole reads hundreds of times its row. Where a file has an offset index
(the page index: each column chunk's pages, their offsets, sizes and first
rows), a smaller read serves a row: the pages that hold it. Here:

- :func:`page_units` cuts a row group into units at the page boundaries of
  its largest column (the images), and gives each unit what it reads: for
  every leaf column, its dictionary page (everything before the first data
  page) and the run of data pages covering the unit's rows. The leaves of a
  top-level field that is not a plain struct (a list, a map) are read over
  one row range, the smallest that every one of their page runs covers.
- :class:`PagesDecoder` decodes a unit's bytes with pyarrow: it reads them
  as a small Parquet file (the pages as they are, a footer naming them:
  :class:`parquetmeta.PagesFooter`; a whole row group likewise), one row
  group for each row range its leaves cover, reads each row group's leaves,
  cuts them to the unit's rows and puts the struct fields split across row
  groups together again.

Decoding reads nothing but the unit's bytes and the footer kept at indexing.
May touch: nothing but its arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import parquetmeta as pm

__all__ = ["Chunk", "PagesDecoder", "check_pages", "chunk_start", "leaf_fields", "leaf_levels", "page_units",
           "read_chunks"]


@dataclass(frozen=True)
class Chunk:
    """One leaf column's chunk in one row group: its first byte (its
    dictionary page, else its first data page), its pages, and its value
    count (an upper bound for any run of its pages)."""

    lo: int
    pages: pm.PageLocations
    values: int
    #: How many data pages, from the first, may be dictionary-encoded (the
    #: chunk's encoding stats; all of them where it has none). Writers
    #: encode with the dictionary until it grows too large, then fall back
    #: to plain pages: a run past those needs no dictionary page. (A
    #: dictionary-encoded page decoded without it is an error, never a
    #: wrong row.)
    dict_pages: int

    def cover(self, r0: int, r1: int, rows: int) -> tuple[int, int, int, int]:
        """The pages holding rows ``[r0, r1)``: first and last page, and the
        rows they hold, ``[a0, a1)``."""
        fr = np.asarray(self.pages.first_rows)
        p0 = int(np.searchsorted(fr, r0, side="right")) - 1
        p1 = int(np.searchsorted(fr, r1 - 1, side="right")) - 1
        a1 = int(fr[p1 + 1]) if p1 + 1 < len(fr) else rows
        return p0, p1, int(fr[p0]), a1

    def dict_bytes(self, p0: int) -> int:
        """The dictionary page's bytes (with any index page before the data),
        where a run from page ``p0`` needs it; else 0."""
        return self.pages.offsets[0] - self.lo if p0 < self.dict_pages else 0

    def run(self, p0: int, p1: int) -> tuple[int, int]:
        """The byte range of pages ``p0..p1``: offset and length."""
        return self.pages.offsets[p0], self.pages.offsets[p1] + self.pages.sizes[p1] - self.pages.offsets[p0]


def leaf_fields(meta: pm.Struct) -> list[int]:
    """Each leaf column's top-level field (an index into the schema's
    top-level fields), from the footer's schema, checked to be a tree."""
    return [f for f, _ in leaf_levels(meta)]


def leaf_levels(meta: pm.Struct) -> list[tuple[int, bool]]:
    """Each leaf column's top-level field, and whether it is repeated (it
    or a field above it is ``REPEATED``: a list's values, whose count is
    not its rows'), from the footer's schema, checked to be a tree."""
    nodes = pm.items(meta, 2, pm.STRUCT)
    if not nodes:
        raise pm.ThriftError("a footer without a schema")
    out: list[tuple[int, bool]] = []
    pos = 1
    top = pm.field(nodes[0], 5, 0, pm.I32)
    if not isinstance(top, int) or not 0 <= top <= len(nodes):
        raise pm.ThriftError("a schema root with a bad child count")

    def walk(top_field: int, depth: int, repeated: bool) -> None:
        nonlocal pos
        if pos >= len(nodes) or depth > pm.MAX_DEPTH:
            raise pm.ThriftError("a schema whose child counts do not match its elements")
        n = pm.field(nodes[pos], 5, 0, pm.I32)
        repeated = repeated or pm.field(nodes[pos], 3, 0, pm.I32) == 2
        pos += 1
        if not isinstance(n, int) or n < 0 or n > len(nodes):
            raise pm.ThriftError("a schema element with a bad child count")
        if n == 0:
            out.append((top_field, repeated))
        for _ in range(n):
            walk(top_field, depth + 1, repeated)

    for k in range(top):
        walk(k, 1, False)
    if pos != len(nodes):
        raise pm.ThriftError("a schema with elements outside its tree")
    return out


def read_chunks(meta: pm.Struct, rg: int, read: Callable[[int, int], bytes], data_end: int) -> list[Chunk] | None:
    """Row group ``rg``'s leaf chunks with their page locations, read with
    ``read(offset, length)`` from each chunk's offset index; None if a
    chunk has none (the row group is then read whole). A location outside
    the file's data or an index that disagrees with its chunk is a
    ThriftError."""
    groups = pm.items(meta, 4, pm.STRUCT)
    if rg >= len(groups):
        raise pm.ThriftError(f"no row group {rg}")
    group = groups[rg]
    rows = pm.field(group, 3, None, pm.I64)
    cols = pm.items(group, 1, pm.STRUCT)
    if not isinstance(rows, int) or rows <= 0 or not cols:
        return None
    spans = []
    for k, cc in enumerate(cols):
        md = pm.field(cc, 3, None, pm.STRUCT)
        oi, ol = pm.field(cc, 4, None, pm.I64), pm.field(cc, 5, None, pm.I32)
        if md is None or oi is None or ol is None or pm.field(cc, 1, None, pm.BINARY) is not None:
            return None  # no offset index, or a chunk in another file
        data, dic = pm.field(md, 9, None, pm.I64), pm.field(md, 11, None, pm.I64)
        size, values = pm.field(md, 7, None, pm.I64), pm.field(md, 5, None, pm.I64)
        if not isinstance(data, int) or not isinstance(dic, (int, type(None))):
            raise pm.ThriftError(f"column chunk {k} has no data page offset")
        lo = data if dic is None or dic <= 0 else min(data, dic)
        if not all(isinstance(x, int) for x in (lo, size, values, oi, ol)) or not (
                4 <= lo and size > 0 and lo + size <= data_end and 0 < ol <= 1 << 26 and 4 <= oi
                and oi + ol <= data_end):
            raise pm.ThriftError(f"column chunk {k}'s location or its offset index's is outside the file")
        spans.append((lo, size, values, oi, ol, _dict_pages(md)))
    lo_i = min(s[3] for s in spans)
    hi_i = max(s[3] + s[4] for s in spans)
    if hi_i - lo_i > 1 << 28:
        raise pm.ThriftError(f"offset indexes spread over {hi_i - lo_i} bytes")
    blob = read(lo_i, hi_i - lo_i)  # one read: a row group's offset indexes lie together
    levels = leaf_levels(meta)
    if len(levels) != len(spans):
        raise pm.ThriftError(f"{len(spans)} column chunks for {len(levels)} leaf columns")
    out = []
    for k, (lo, size, values, oi, ol, dict_pages) in enumerate(spans):
        pages = pm.offset_index(blob[oi - lo_i:oi - lo_i + ol], lo, lo + size, rows)
        check_pages(pages, rows, levels[k][1], read, _column_name(cols[k], k))
        out.append(Chunk(lo, pages, values, min(dict_pages, len(pages.offsets))))
    return out


#: Bytes read at a page's offset for its header, at first (more where it
#: is longer: statistics of long values); pages closer than
#: :data:`_HEADS_TOGETHER` are read in one.
_HEAD_BYTES = 256
_HEADS_TOGETHER = 1 << 16
#: What a page read alone reads at its offset: its header, and where its
#: values begin (rows alone's walk reads the same, parquetvalues.py, and
#: takes it from :class:`PageHeads` instead of asking again).
PAGE_START_BYTES = 1 << 10


class PageHeads:
    """A file's ``read(offset, length)`` at indexing that keeps what it read
    at a page's offset (:data:`PAGE_START_BYTES` at most) and answers a
    later read of no more bytes at the same offset from it: the header check
    and rows alone's walk both read a page's start."""

    def __init__(self, read: Callable[[int, int], bytes]) -> None:
        self._read = read
        self._kept: dict[int, bytes] = {}

    def __call__(self, offset: int, length: int) -> bytes:
        got = self._kept.get(offset)
        if got is not None and length <= len(got):
            return got[:length]
        data = self._read(offset, length)
        if length <= PAGE_START_BYTES:
            self._kept[offset] = data
        return data


def check_pages(pages: pm.PageLocations, rows: int, repeated: bool, read: Callable[[int, int], bytes],
                column: str) -> None:
    """Each page's header, read at the offset index's location, checked
    against it: a data page, its header and body filling the location's
    bytes, and its rows those the index gives it (the rows between its first
    row and the next page's): a data page v2 says its rows, a v1 page of a
    column that is not repeated its values, one a row; a repeated column's
    v1 page has at least a value a row. An index whose pages are shifted by
    some rows (every one alike, so the index itself is in order) would
    otherwise have rows decoded under other rows' numbers. ThriftError
    naming the column and page where they disagree."""
    n = len(pages.offsets)
    k = 0
    while k < n:
        # Pages close together (small columns' pages) in one read.
        j = k + 1
        while j < n and pages.offsets[j] + _HEAD_BYTES - pages.offsets[k] <= _HEADS_TOGETHER:
            j += 1
        start = pages.offsets[k]
        head_bytes = _HEAD_BYTES if j > k + 1 else PAGE_START_BYTES  # a page alone: as rows alone's walk reads it
        end = pages.offsets[j - 1] + min(pages.sizes[j - 1], head_bytes)
        blob = read(start, end - start)
        for p in range(k, j):
            at, size = pages.offsets[p] - start, pages.sizes[p]
            want = (pages.first_rows[p + 1] if p + 1 < n else rows) - pages.first_rows[p]
            try:
                try:
                    head = pm.page_header(blob[at:at + min(size, head_bytes)])
                except pm.ThriftError:
                    if size <= head_bytes:
                        raise
                    head = pm.page_header(read(pages.offsets[p], min(size, 1 << 20)))  # a long header
            except pm.ThriftError as e:
                raise pm.ThriftError(f"column {column} page {p}: no page header at byte {pages.offsets[p]} ({e})"
                                     ) from None
            what = f"column {column} page {p} (at byte {pages.offsets[p]}, rows {pages.first_rows[p]}-" \
                   f"{pages.first_rows[p] + want} by the offset index)"
            if head.kind not in (pm.DATA_PAGE, pm.DATA_PAGE_V2):
                raise pm.ThriftError(f"{what} is a page of type {head.kind}, not a data page")
            if head.head + head.body != size:
                raise pm.ThriftError(f"{what}: its header and body take {head.head + head.body} bytes where the "
                                     f"offset index says {size}")
            if head.rows is not None and head.rows != want:
                raise pm.ThriftError(f"{what} holds {head.rows} rows")
            if head.rows is None and (head.values < want if repeated else head.values != want):
                raise pm.ThriftError(f"{what} holds {head.values} values")
        k = j


def _column_name(cc: pm.Struct, k: int) -> str:
    """A column chunk's path in the schema (``image.bytes``), else its number."""
    md = pm.field(cc, 3)
    path = pm.field(md, 3) if isinstance(md, list) else None
    if isinstance(path, tuple) and path[0] == pm.BINARY and all(isinstance(x, bytes) for x in path[1]):
        return ".".join(x.decode("utf-8", "replace") for x in path[1])
    return f"#{k}"


def _dict_pages(md: pm.Struct) -> int:
    """How many data pages of a chunk its encoding stats (ColumnMetaData
    field 13) count as dictionary-encoded; 2^62 where it has none."""
    stats = pm.field(md, 13, None, pm.LIST)
    if stats is None or stats[0] != pm.STRUCT:
        return 1 << 62
    n = 0
    for st in stats[1]:
        page_type, encoding, count = pm.field(st, 1, None, pm.I32), pm.field(st, 2, None, pm.I32), \
            pm.field(st, 3, None, pm.I32)
        if not all(isinstance(x, int) for x in (page_type, encoding, count)) or count < 0:
            return 1 << 62
        if page_type in (0, 3) and encoding in (2, 8):  # data pages v1, v2; PLAIN_ / RLE_DICTIONARY
            n += count
    return n


def _splittable(t: Any) -> bool:
    """Whether a field's leaves may be read over different row ranges and
    put together after: a struct of structs and plain columns."""
    import pyarrow as pa

    if not pa.types.is_struct(t) or isinstance(t, pa.ExtensionType):
        return False
    return all(_splittable(f.type) if pa.types.is_nested(f.type) else not isinstance(f.type, pa.ExtensionType)
               for f in t)


def _covers(chunks: Sequence[Chunk], r0: int, r1: int, rows: int,
            together: list[list[int]]) -> list[tuple[int, int, int, int]]:
    """Each leaf's page run for rows ``[r0, r1)``: (p0, p1, a0, a1); the
    leaves of each list in ``together`` over one common row range."""
    got = [c.cover(r0, r1, rows) for c in chunks]
    for leaves in together:
        lo, hi = r0, r1
        while True:
            runs = [chunks[k].cover(lo, hi, rows) for k in leaves]
            nlo, nhi = min(r[2] for r in runs), max(r[3] for r in runs)
            if (nlo, nhi) == (lo, hi):
                break
            lo, hi = nlo, nhi
        for k, r in zip(leaves, runs):
            got[k] = r
    return got


def page_units(chunks: Sequence[Chunk], rows: int, fields: Sequence[int], types: Sequence[Any]
               ) -> tuple[list[tuple[int, int]], list[list[tuple[int, int]]], np.ndarray]:
    """A row group's units: each unit's rows ``(r0, r1)``, its pieces (byte
    ranges, adjacent ones merged) and each leaf's page run, an int32 array
    ``(units, leaves, 2)``."""
    big = max(range(len(chunks)), key=lambda k: chunks[k].pages.offsets[-1] + chunks[k].pages.sizes[-1]
              - chunks[k].lo)
    bounds = list(chunks[big].pages.first_rows) + [rows]
    together: list[list[int]] = []
    for f in sorted(set(fields)):
        leaves = [k for k, g in enumerate(fields) if g == f]
        if len(leaves) > 1 and not _splittable(types[f]):
            together.append(leaves)
    unit_rows, unit_pieces, runs = [], [], []
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        cover = _covers(chunks, r0, r1, rows, together)
        pieces: list[tuple[int, int]] = []
        for c, (p0, p1, _, _) in zip(chunks, cover):
            if c.dict_bytes(p0) > 0:
                pieces.append((c.lo, c.dict_bytes(p0)))
            pieces.append(c.run(p0, p1))
        merged: list[tuple[int, int]] = []
        for off, n in pieces:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((off, n))
        unit_rows.append((r0, r1))
        unit_pieces.append(merged)
        runs.append([(p0, p1) for p0, p1, _, _ in cover])
    return unit_rows, unit_pieces, np.asarray(runs, dtype=np.int32).reshape(len(unit_rows), len(chunks), 2)



def _footer_parser(parsed: Any) -> Any:
    """What parses a thrift footer alone into pyarrow's FileMetaData: the
    function pyarrow's pickling of ``parsed`` names (a footer parsed with
    no reader opened), if it gives back ``parsed`` from ``parsed``'s own
    bytes; else the public way, a reader over the footer laid out as a file
    (slower: 20-95 us more a unit, bench/RESULTS.md). Pickling's function is
    pyarrow's own and not a documented API, so it is checked, not trusted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def public(footer: Any) -> Any:
        body = bytes(footer)
        return pq.read_metadata(pa.BufferReader(b"PAR1" + body + len(body).to_bytes(4, "little") + b"PAR1"))

    try:
        fn, args = parsed.__reduce__()[:2]
        if callable(fn) and len(args) == 1 and fn(*args).equals(parsed):
            return fn
    except Exception:  # noqa: BLE001 - another pyarrow: the public way below
        pass
    return public


class PagesDecoder:
    """A unit's bytes -> its rows as a pyarrow Table (the file's schema).

    The small file is the unit's bytes as they are (a view, not a copy).
    Its footer (:class:`parquetmeta.PagesFooter`) is parsed alone and given
    to pyarrow with the bytes; it names each leaf's bytes from their first
    page, a dictionary page where they begin with one, which pyarrow reads
    as the first page of the chunk (a dictionary page offset would be 0 for
    the first leaf, which pyarrow takes for none). ``parsed`` is pyarrow's
    metadata of the original file: its pickling (``__reduce__``) names
    pyarrow's parser of thrift footers, which parses the small footers here.
    ``fields`` (each leaf's top-level field) is needed for page ranges only.
    """

    def __init__(self, meta: pm.Struct, schema: Any, fields: Sequence[int] | None, parsed: Any) -> None:
        self.footers = pm.PagesFooter(meta)
        self.schema = schema
        self.fields = list(fields or ())
        self.parsed = parsed
        self._parse = _footer_parser(parsed)

    def _reader(self, groups: list[tuple[int, int, list[tuple[int, int, int]]]], blob: Any) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        meta = self._parse(pa.py_buffer(self.footers.footer(groups)[:-8]))
        return pq.ParquetFile(pa.BufferReader(blob), metadata=meta, pre_buffer=False).reader

    def row_group(self, rg: int, blob: Any) -> Any:
        """Row group ``rg`` whole, from its bytes (its column chunks)."""
        g = self.parsed.row_group(rg)
        starts = [chunk_start(g.column(k)) for k in range(g.num_columns)]
        lo = min(starts)
        cols = [(a - lo, g.column(k).total_compressed_size, g.column(k).num_values) for k, a in enumerate(starts)]
        got = self._reader([(rg, g.num_rows, cols)], blob).read_row_group(0, use_threads=False)
        if got.num_rows != g.num_rows:
            raise ValueError(f"row group {rg} decoded to {got.num_rows} rows where the footer says {g.num_rows}")
        return got

    def table(self, chunks: Sequence[Chunk], rg: int, rows: int, r0: int, r1: int, runs: np.ndarray,
              blob: Any) -> Any:
        """Rows ``[r0, r1)`` of row group ``rg`` (of ``rows``) from the unit's
        bytes: each leaf's page run ``runs[k]``, one after another."""
        import pyarrow as pa

        pairs = runs.tolist()
        at = 0
        layout = []  # per leaf: (first byte, bytes) in the small file
        for c, (p0, p1) in zip(chunks, pairs):
            n = c.dict_bytes(p0) + c.run(p0, p1)[1]
            layout.append((at, n))
            at += n
        if at != len(blob):
            raise ValueError(f"{len(blob)} bytes where the unit's pages take {at}")
        spans: dict[tuple[int, int], list[int]] = {}
        for k, (c, (p0, p1)) in enumerate(zip(chunks, pairs)):
            fr = c.pages.first_rows
            spans.setdefault((fr[p0], fr[p1 + 1] if p1 + 1 < len(fr) else rows), []).append(k)
        groups = []
        for (a0, a1), leaves in spans.items():
            cols = [(layout[k][0], layout[k][1], chunks[k].values) if k in leaves else (0, 0, 0)
                    for k in range(len(chunks))]
            groups.append((rg, a1 - a0, cols))
        reader = self._reader(groups, blob)
        parts: dict[int, list[Any]] = {}
        for j, ((a0, a1), leaves) in enumerate(spans.items()):
            got = reader.read_row_group(j, column_indices=leaves, use_threads=False)
            if got.num_rows != a1 - a0:
                raise ValueError(f"pages of rows {a0}-{a1} decoded to {got.num_rows} rows")
            got = got.slice(r0 - a0, r1 - r0)
            for f, col in zip(sorted({self.fields[k] for k in leaves}), got.columns):
                # One chunk: its slice as it is (concatenating would copy it).
                parts.setdefault(f, []).append(col.chunk(0) if col.num_chunks == 1 else col.combine_chunks())
        columns = [_merge(self.schema.field(f).type, parts[f]) for f in range(len(self.schema))]
        return pa.Table.from_arrays(columns, schema=self.schema)


def chunk_start(col: Any) -> int:
    """A column chunk's first byte (pyarrow's metadata): its dictionary
    page where it has one, else its first data page."""
    start = int(col.data_page_offset)
    if col.has_dictionary_page and col.dictionary_page_offset is not None and col.dictionary_page_offset > 0:
        start = min(start, int(col.dictionary_page_offset))
    return start


def _merge(t: Any, arrays: list[Any]) -> Any:
    """One field's array from reads that each hold some of its leaves (a
    struct's children split across row ranges), typed ``t``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(arrays) == 1 and arrays[0].type == t:
        return arrays[0]
    if not pa.types.is_struct(t):
        raise ValueError(f"a field of type {t} was read in parts")
    children = []
    for f in t:
        got = [a.field(f.name) for a in arrays if a.type.get_field_index(f.name) >= 0]
        children.append(_merge(f.type, got))
    mask = pc.invert(arrays[0].is_valid()) if arrays[0].null_count else None
    return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
