"""Parquet's footer and offset index as hostile bytes, and the footer of a
file made of chosen pages.

pyarrow parses a footer but does not say where each column chunk's offset
index lies (ColumnChunk fields 4 and 5), and decodes whole column chunks,
never a chosen run of their pages. Both need the footer's thrift (the
compact protocol) read and written here: :func:`parse` reads a struct into
a tree of ``(field id, type, value)`` with every length, count and depth
checked against the bytes that are there (a count larger than the bytes
left, a varint longer than 10 bytes, nesting deeper than :data:`MAX_DEPTH`
are a :class:`ThriftError`), and :func:`write` writes such a tree back. The
Parquet side: :func:`offset_index` (the page locations of one column chunk,
checked to lie in it, in order, and to start at row 0) and
:class:`PagesFooter` (footers whose row groups name only the pages a read
unit holds, at their places in a small file of those pages; the original
footer's fixed parts written once, :class:`Template`).

Fed random and mutated bytes by hypothesis in tests/python/test_parquet_pages.py.
May touch: nothing but its arguments.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DATA_PAGE", "DATA_PAGE_V2", "DICTIONARY_PAGE", "INDEX_PAGE", "MAX_DEPTH", "Hole", "PageHead",
           "PageLocations", "PagesFooter", "Template", "ThriftError", "field", "items", "offset_index", "page_header",
           "parse", "write"]

#: The deepest nesting of structs and containers read (Parquet's footer
#: nests about 8 deep: FileMetaData, row groups, ColumnChunk, ColumnMetaData,
#: statistics, ...).
MAX_DEPTH = 24

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)
_INTS = (BYTE, I16, I32, I64)


class ThriftError(ValueError):
    """Bytes that are not the thrift the caller expected; says what and where."""


# A struct is a list of (field id, type, value); a list or set is (element
# type, [values]); a map is (key type, value type, [(key, value)]); a bool
# field's type is TRUE and its value a bool.
Struct = list[tuple[int, int, Any]]


class _Reader:
    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.pos = 0

    def fail(self, what: str) -> ThriftError:
        return ThriftError(f"{what} at byte {self.pos} of {len(self.data)}")

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise self.fail("the bytes end inside a value")
        b = self.data[self.pos]
        self.pos += 1
        return int(b)

    def varint(self) -> int:
        out = shift = 0
        for _ in range(10):
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
        raise self.fail("a varint longer than 10 bytes")

    def zigzag(self, bits: int) -> int:
        u = self.varint()
        v = (u >> 1) ^ -(u & 1)
        if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
            raise self.fail(f"an integer {v} beyond {bits} bits")
        return v

    def count(self, n: int, each: int) -> int:
        """A container's count, refused where its elements (at least
        ``each`` bytes apiece) cannot fit in the bytes left."""
        if n < 0 or n * each > len(self.data) - self.pos:
            raise self.fail(f"a count of {n} that the {len(self.data) - self.pos} bytes left cannot hold")
        return n

    def value(self, ttype: int, depth: int) -> Any:
        if ttype in (TRUE, FALSE):
            return ttype == TRUE
        if ttype == BYTE:
            b = self.byte()
            return b - 256 if b > 127 else b
        if ttype == I16:
            return self.zigzag(16)
        if ttype == I32:
            return self.zigzag(32)
        if ttype == I64:
            return self.zigzag(64)
        if ttype == DOUBLE:
            if self.pos + 8 > len(self.data):
                raise self.fail("the bytes end inside a double")
            self.pos += 8
            return struct.unpack("<d", bytes(self.data[self.pos - 8:self.pos]))[0]
        if ttype == BINARY:
            n = self.count(self.varint(), 1)
            self.pos += n
            return bytes(self.data[self.pos - n:self.pos])
        if depth >= MAX_DEPTH:
            raise self.fail(f"nesting deeper than {MAX_DEPTH}")
        if ttype in (LIST, SET):
            head = self.byte()
            n, etype = head >> 4, head & 0x0F
            if n == 15:
                n = self.varint()
            self._check_type(etype)
            self.count(n, 1)
            etype = TRUE if etype == FALSE else etype
            return (etype, [self.element(etype, depth + 1) for _ in range(n)])
        if ttype == MAP:
            n = self.count(self.varint(), 2)
            if n == 0:
                return (STOP, STOP, [])
            kv = self.byte()
            kt, vt = kv >> 4, kv & 0x0F
            self._check_type(kt)
            self._check_type(vt)
            kt, vt = (TRUE if t == FALSE else t for t in (kt, vt))
            return (kt, vt, [(self.element(kt, depth + 1), self.element(vt, depth + 1)) for _ in range(n)])
        if ttype == STRUCT:
            return self.struct(depth + 1)
        raise self.fail(f"an unknown type {ttype}")

    def element(self, ttype: int, depth: int) -> Any:
        """A list's, set's or map's element: as a field's value, but a bool
        is one byte of its own (1 true, 2 or 0 false)."""
        if ttype == TRUE:
            return self.byte() == 1
        return self.value(ttype, depth)

    def _check_type(self, t: int) -> None:
        if not TRUE <= t <= STRUCT:
            raise self.fail(f"an unknown element type {t}")

    def struct(self, depth: int) -> Struct:
        out: Struct = []
        last = 0
        while True:
            head = self.byte()
            if head == STOP:
                return out
            delta, ttype = head >> 4, head & 0x0F
            fid = last + delta if delta else self.zigzag(16)
            self._check_type(ttype)
            out.append((fid, TRUE if ttype in (TRUE, FALSE) else ttype, self.value(ttype, depth)))
            last = fid


def parse(data: bytes | memoryview) -> tuple[Struct, int]:
    """The struct at the start of ``data`` and the bytes it took."""
    r = _Reader(data)
    return r.struct(0), r.pos


#: What a value of each type is, for :func:`field`'s check (a map is a
#: tuple too, but of three: never taken for a list).
_KINDS = {BYTE: int, I16: int, I32: int, I64: int, TRUE: bool, DOUBLE: float, BINARY: bytes, LIST: tuple,
          SET: tuple, MAP: dict, STRUCT: list}


def field(s: Any, fid: int, default: Any = None, ttype: int | None = None) -> Any:
    """Field ``fid``'s value in struct ``s`` (the last one, as readers do),
    or ``default``. With ``ttype``, a value of another kind (an integer where
    a list belongs) is a ThriftError: bytes from outside may put any type
    under any field id. A list's elements are checked by the caller
    (:func:`items`)."""
    if not isinstance(s, list):
        raise ThriftError(f"a {type(s).__name__} where a struct belongs")
    got = default
    for f, t, v in s:
        if f == fid:
            if ttype is not None and _KINDS[t] is not _KINDS[ttype]:
                raise ThriftError(f"field {fid} holds thrift type {t} where type {ttype} belongs")
            got = v
    return got


def items(s: Any, fid: int, etype: int) -> list[Any]:
    """The elements of list field ``fid`` of ``s``, checked to be of type
    ``etype``; [] where the field is missing."""
    got = field(s, fid, None, LIST)
    if got is None:
        return []
    if _KINDS[got[0]] is not _KINDS[etype]:
        raise ThriftError(f"field {fid} is a list of type {got[0]} where type {etype} belongs")
    return list(got[1])


def _varint(n: int, out: bytearray) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(v: int, out: bytearray) -> None:
    _varint((v << 1) ^ (v >> 63), out)


def _write_value(ttype: int, v: Any, out: bytearray) -> None:
    if isinstance(v, Hole):
        if not isinstance(out, _Segments):
            raise ValueError("a Hole outside a Template")
        out.hole(v)
    elif ttype == BYTE:
        out.append(v & 0xFF)
    elif ttype in (I16, I32, I64):
        _zigzag(int(v), out)
    elif ttype == DOUBLE:
        out += struct.pack("<d", v)
    elif ttype == BINARY:
        _varint(len(v), out)
        out += v
    elif ttype in (LIST, SET):
        etype, items = v
        if len(items) < 15:
            out.append((len(items) << 4) | etype)
        else:
            out.append(0xF0 | etype)
            _varint(len(items), out)
        for item in items:
            _write_element(etype, item, out)
    elif ttype == MAP:
        kt, vt, pairs = v
        _varint(len(pairs), out)
        if pairs:
            out.append((kt << 4) | vt)
            for k, val in pairs:
                _write_element(kt, k, out)
                _write_element(vt, val, out)
    elif ttype == STRUCT:
        _write_struct(v, out)
    else:
        raise ValueError(f"cannot write thrift type {ttype}")


def _write_element(ttype: int, v: Any, out: bytearray) -> None:
    if ttype in (TRUE, FALSE):
        out.append(1 if v else 2)
    else:
        _write_value(ttype, v, out)


def _write_struct(s: Struct, out: bytearray, last: int = 0) -> None:
    for fid, ttype, v in s:
        wire = (TRUE if v else FALSE) if ttype in (TRUE, FALSE) else ttype
        if 0 < fid - last <= 15:
            out.append(((fid - last) << 4) | wire)
        else:
            out.append(wire)
            _zigzag(fid, out)
        if ttype not in (TRUE, FALSE):
            _write_value(ttype, v, out)
        last = fid
    out.append(STOP)


def write(s: Struct) -> bytes:
    """Struct ``s`` in the compact protocol."""
    out = bytearray()
    _write_struct(s, out)
    return bytes(out)


# ---- Parquet ----


@dataclass(frozen=True)
class PageLocations:
    """One column chunk's data pages (its offset index): each page's offset
    in the file, its bytes (header included) and its first row."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    first_rows: tuple[int, ...]


def offset_index(data: bytes, chunk_lo: int, chunk_hi: int, rows: int) -> PageLocations:
    """A column chunk's OffsetIndex, checked: at least one page; pages in
    file order, apart, inside the chunk's bytes ``[chunk_lo, chunk_hi)``; the
    first at row 0, rows increasing and below ``rows`` (the row group's)."""
    s, _ = parse(data)
    locs = items(s, 1, STRUCT)
    if not locs:
        raise ThriftError("an offset index without page locations")
    offsets, sizes, first_rows = [], [], []
    end, row = chunk_lo, -1
    for k, loc in enumerate(locs):
        off, size, first = field(loc, 1, None, I64), field(loc, 2, None, I32), field(loc, 3, None, I64)
        if not all(isinstance(x, int) for x in (off, size, first)):
            raise ThriftError(f"page {k}'s location lacks its offset, size or first row")
        if off < end or size <= 0 or off + size > chunk_hi:
            raise ThriftError(f"page {k} at bytes {off}-{off + size} is not after the page before it (which ends "
                              f"at {end}) inside its column chunk ({chunk_lo}-{chunk_hi})")
        if (k == 0) != (first == 0) or first <= row or first >= rows:
            raise ThriftError(f"page {k} starts at row {first}: pages start at row 0 and go up, below {rows}")
        offsets.append(off)
        sizes.append(size)
        first_rows.append(first)
        end, row = off + size, first
    return PageLocations(tuple(offsets), tuple(sizes), tuple(first_rows))


#: PageHeader's page types (Parquet's PageType).
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = range(4)


@dataclass(frozen=True)
class PageHead:
    """A page's header: its type, the bytes of the header and of the body
    after it (compressed), its values and, for a data page v2, its rows
    (None for v1, whose header does not say)."""

    kind: int
    head: int
    body: int
    values: int
    rows: int | None


def page_header(data: bytes) -> PageHead:
    """The PageHeader at the start of ``data``, checked: its type, sizes
    and, for a data page, its counts present and not negative."""
    s, used = parse(data)
    kind, body = field(s, 1, None, I32), field(s, 3, None, I32)
    if not isinstance(kind, int) or not isinstance(body, int) or body < 0:
        raise ThriftError("a page header without its type or compressed size")
    values: Any = 0
    rows: Any = None
    if kind in (DATA_PAGE, DATA_PAGE_V2):
        sub = field(s, 5 if kind == DATA_PAGE else 8, None, STRUCT)
        values = field(sub, 1, None, I32) if sub is not None else None
        if kind == DATA_PAGE_V2:
            rows = field(sub, 3, None, I32) if sub is not None else None
    if not isinstance(values, int) or values < 0 or (kind == DATA_PAGE_V2 and (not isinstance(rows, int) or rows < 0)):
        raise ThriftError(f"a page header of type {kind} without its value or row count")
    return PageHead(kind, used, body, values, rows)


class Hole:
    """A value left open in a :class:`Template`: an integer (written as an
    I64 is), or with ``raw`` the bytes of a whole value (a list written by
    the caller)."""

    __slots__ = ("key", "raw")

    def __init__(self, key: str, raw: bool = False) -> None:
        self.key = key
        self.raw = raw


class _Segments(bytearray):
    """A writer's output that stops at each :class:`Hole`."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[bytes | Hole] = []

    def hole(self, h: Hole) -> None:
        self.parts += [bytes(self), h]
        del self[:]


class Template:
    """A struct written once with some values left open (:class:`Hole`):
    :meth:`fill` writes only those. What a footer per read unit costs is
    then its integers, not the original footer's schema and metadata."""

    def __init__(self, s: Struct) -> None:
        out = _Segments()
        _write_struct(s, out)
        self.parts = [*out.parts, bytes(out)]

    def fill(self, values: dict[str, Any]) -> bytearray:
        out = bytearray()
        for p in self.parts:
            if isinstance(p, bytes):
                out += p
            elif p.raw:
                out += values[p.key]
            else:
                _zigzag(int(values[p.key]), out)
        return out


def list_head(n: int, etype: int) -> bytearray:
    """The compact protocol's header of a list of ``n`` elements of type ``etype``."""
    out = bytearray()
    if n < 15:
        out.append((n << 4) | etype)
    else:
        out.append(0xF0 | etype)
        _varint(n, out)
    return out


class PagesFooter:
    """Footers (thrift, its length, ``PAR1``) of small files of pages, for
    one original file whose FileMetaData is ``meta``: :meth:`footer` takes
    ``groups``, each one row group of the small file, ``(row group in the
    original, rows, chunks)``, ``chunks`` one per leaf column, ``(first
    byte, bytes, values upper bound)`` in the small file, the first byte
    that of its dictionary page where it has one (named as the first data
    page: a reader takes a dictionary page first in a chunk as its
    dictionary); a leaf that a group does not hold has bytes 0 and is never
    read (the reader selects the group's leaves). Everything else (schema,
    key-value metadata, the writer, column orders) is the original's:
    written once here, in :class:`Template` s, so that a footer costs its
    integers only."""

    def __init__(self, meta: Struct) -> None:
        self.meta = meta
        rgs = field(meta, 4)
        self._rgs = rgs[1] if rgs is not None else []
        out: Struct = []
        for fid, t, v in meta:
            if fid == 3:
                out.append((3, I64, Hole("rows")))
            elif fid == 4:
                out.append((4, LIST, Hole("groups", raw=True)))
            elif fid not in (8, 9):
                out.append((fid, t, v))
        self._file = Template(out)
        self._group = Template([(1, LIST, Hole("cols", raw=True)), (2, I64, 0), (3, I64, Hole("rows"))])
        self._chunks: dict[tuple[int, int], Template] = {}

    def _chunk(self, rg: int, k: int) -> Template:
        got = self._chunks.get((rg, k))
        if got is None:
            md = field(field(self._rgs[rg], 1)[1][k], 3)
            new_md: Struct = []
            for fid, t, v in md:
                if fid in (1, 2, 3, 4, 6, 8):
                    new_md.append((fid, t, v))
                elif fid == 5:
                    new_md.append((5, I64, Hole("values")))
                elif fid == 7:
                    new_md.append((7, I64, Hole("length")))
                elif fid == 9:
                    new_md.append((9, I64, Hole("at")))
            got = self._chunks[(rg, k)] = Template([(2, I64, Hole("at")), (3, STRUCT, new_md)])
        return got

    def footer(self, groups: Sequence[tuple[int, int, Sequence[tuple[int, int, int]]]]) -> bytes:
        new_rgs = list_head(len(groups), STRUCT)
        total = 0
        for rg, rows, chunks in groups:
            cols = list_head(len(chunks), STRUCT)
            for k, (at, length, values) in enumerate(chunks):
                cols += self._chunk(rg, k).fill({"at": at, "values": values, "length": length})
            new_rgs += self._group.fill({"cols": cols, "rows": rows})
            total += rows
        body = self._file.fill({"rows": total, "groups": new_rgs})
        return bytes(body + len(body).to_bytes(4, "little") + b"PAR1")
