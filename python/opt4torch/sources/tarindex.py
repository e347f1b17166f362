"""The cached index of a tar shard, ``<shard>.opt4idx.json``: written
atomically, and read as a hostile file.

Anyone who can write a shared dataset folder (or the user's cache folder)
can plant an index there, so :func:`read_index` trusts nothing in it: the
file is opened non-blocking and must be a regular file (a FIFO, a device or
a link to ``/dev/zero`` is refused before any read), it is read up to a cap
derived from the shard's size, its JSON nesting is bounded before it is
parsed (no ``RecursionError``), only integers in [0, 2**63) are accepted (no
``Infinity``, ``NaN``, floats or 5,000-digit numbers), and the samples'
ranges are checked against the shard's real size and against each other:
in shard order, not overlapping, each sample's fields in order inside it.
Anything wrong means "index the shard again", with a warning, never a hang,
a crash or another sample's bytes. An index may hold each sample's XXH3-64
(``"xxh3"``, written when the dataset asks for ``checksum=True``): those are
checked for form here, and against the bytes on every read from storage.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from typing import Any

import numpy as np

from ..io.files import FileRefused, atomic_write, read_capped

INDEX_FORMAT = "opt4torch-tar-index"
INDEX_VERSION = 1
INDEX_SUFFIX = ".opt4idx.json"

#: JSON nesting of a well-formed index: body {, "samples" [, a sample [,
#: its fields [, a field [. Anything deeper is not an index.
MAX_DEPTH = 5
#: An index is ASCII JSON of the shard's names and numbers; a name costs at
#: most 6 characters a byte (\\udcXX) and sits in a 512-byte header (or in
#: blocks of its own, a long name), so an index is never 8 times its shard.
SIZE_FACTOR = 8
SIZE_SLACK = 1 << 20
_MAX_INT = (1 << 63) - 1
_BLOCK = 512  # a tar header, and the unit member data is padded to
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
#: +1 for a byte that opens an array or object, -1 for one that closes it.
_NESTING = np.zeros(256, dtype=np.int8)
_NESTING[[ord("["), ord("{")]] = 1
_NESTING[[ord("]"), ord("}")]] = -1


class IndexRefused(ValueError):
    """What was wrong with a cached index (the reader warns and rebuilds)."""


def index_cap(shard_size: int) -> int:
    """The most bytes an index of a shard of ``shard_size`` bytes may take."""
    return SIZE_FACTOR * max(int(shard_size), 0) + SIZE_SLACK


def read_index(where: str, shard: str, ident: dict[str, Any]) -> list[Any] | None:
    """The samples of a cached index, ``[(key, offset, length, [(field,
    offset in the sample, size)])]``, if the index is there, well formed,
    made from this version of the shard (``ident``, whose ``"size"`` is the
    shard's real size) and consistent with it; None otherwise (an index that
    is not: with a warning naming what was wrong)."""
    got = load_index(where, shard, ident)
    return None if got is None else got[0]


def load_index(where: str, shard: str, ident: dict[str, Any]) -> tuple[list[Any], np.ndarray | None] | None:
    """:func:`read_index`'s samples, and the samples' checksums when the
    index holds them (``"xxh3"``: each sample's XXH3-64, 16 lower-case hex
    digits a sample, in order; a uint64 array), else None beside them. An
    ``"xxh3"`` that is not exactly that makes the index corrupt (rebuilt)."""
    try:
        raw = read_capped(where, index_cap(ident["size"]), "an index of this shard")
    except FileNotFoundError:
        return None
    except (OSError, FileRefused) as exc:
        warnings.warn(f"cannot use the cached index {where} of tar shard {shard} ({exc}): indexing the shard "
                      "again", RuntimeWarning, stacklevel=4)
        return None
    try:
        body = parse_index(raw)
        if body.get("version") != INDEX_VERSION:
            return None  # another version's cache: rebuilt, no warning
        if body.get("shard") != ident:
            return None  # stale: the shard changed since
        samples = check_samples(body.get("samples"), int(ident["size"]))
        return samples, check_sums(body.get("xxh3"), len(samples))
    except IndexRefused as exc:
        warnings.warn(f"the cached index {where} of tar shard {shard} is corrupt ({exc}): rebuilding it",
                      RuntimeWarning, stacklevel=4)
        return None


def _refuse_constant(name: str) -> Any:
    raise IndexRefused(f"{name} is not a number an index holds")


def _refuse_float(text: str) -> Any:
    raise IndexRefused(f"{text[:40]} is not an integer")


def parse_index(raw: bytes) -> dict[str, Any]:
    """The index's JSON object, parsed with limits: ASCII only (the writer
    escapes everything else), nesting at most MAX_DEPTH (checked before the
    parser recurses), no floats, Infinity or NaN, and the format's name.
    IndexRefused otherwise."""
    if not raw.isascii():
        raise IndexRefused("it holds bytes that are not ASCII (the index is written with \\u escapes)")
    step = _NESTING[np.frombuffer(_STRINGS.sub(b'""', raw), dtype=np.uint8)]
    if step.size and int(np.cumsum(step, dtype=np.int64).max()) > MAX_DEPTH:
        raise IndexRefused(f"it nests deeper than an index does ({MAX_DEPTH} levels)")
    try:
        # Integers are checked after parsing (type and range, check_samples);
        # a number of over 4,300 digits is refused by int() itself.
        body = json.loads(raw.decode("ascii"), parse_constant=_refuse_constant, parse_float=_refuse_float)
    except ValueError as exc:  # json.JSONDecodeError, and IndexRefused from the hooks
        raise IndexRefused(str(exc)) from None
    if not isinstance(body, dict) or body.get("format") != INDEX_FORMAT:
        raise IndexRefused("not an opt4torch tar index")
    return body


def _int(v: Any, what: str) -> int:
    if type(v) is not int or not 0 <= v <= _MAX_INT:
        raise IndexRefused(f"{what} is {str(v)[:40]}, not an integer in [0, 2**63)")
    return v


def _str(v: Any, what: str) -> str:
    if type(v) is not str:
        raise IndexRefused(f"{what} is a {type(v).__name__}, not a string")
    return v


def check_samples(rows: Any, shard_size: int) -> list[Any]:
    """The samples of an index body, checked as the indexer makes them: each
    ``[key, offset, length, [[field, offset, size], ...]]`` with at least one
    field; samples in shard order, not overlapping, inside ``shard_size``
    bytes; a sample's fields distinct, in order, the first at its start and
    the last ending at its end; and every field's data where tar puts data:
    at a 512-byte block, after a header of its own, past the block-padded
    end of the field before it (so a range shifted into its neighbour's
    bytes or onto a header is refused). IndexRefused otherwise.

    One pass, each test written inline (a function call a value doubled the
    time of loading an index); a failed test is explained by the slower
    checks it falls back to."""
    if type(rows) is not list:
        raise IndexRefused("its samples are not a list")
    samples: list[Any] = []
    end, data_floor = 0, _BLOCK
    for k, row in enumerate(rows):
        if not (type(row) is list and len(row) == 4 and type(row[0]) is str and type(row[1]) is int
                and type(row[2]) is int and type(row[3]) is list and row[3]
                and 0 <= row[1] <= _MAX_INT and 0 <= row[2] <= _MAX_INT):
            _explain_row(k, row)
        key, off, length, fields = row
        if off < end:
            raise IndexRefused(f"sample {key!r} at {off} overlaps or precedes the sample before it (which ends "
                               f"at {end}): samples lie in shard order")
        end = off + length
        if end > shard_size:
            raise IndexRefused(f"sample {key!r} ({length} bytes at {off}) lies outside the shard "
                               f"({shard_size} bytes)")
        members: list[tuple[Any, Any, Any]] = []
        at = 0
        for m in fields:
            if not (type(m) is list and len(m) == 3 and type(m[0]) is str and type(m[1]) is int
                    and type(m[2]) is int and 0 <= m[1] <= _MAX_INT and 0 <= m[2] <= _MAX_INT):
                _explain_field(key, m)
            field, mo, ms = m
            if (mo != 0 if not members else mo < at) or mo + ms > length:
                raise IndexRefused(f"field {field!r} of sample {key!r} ({ms} bytes at {mo}) lies outside the "
                                   "sample or overlaps the field before it")
            data = off + mo
            if data % _BLOCK or data < data_floor:
                raise IndexRefused(f"field {field!r} of sample {key!r} would start at byte {data} of the shard, "
                                   f"where tar holds no member's data (it starts at a {_BLOCK}-byte block after "
                                   f"a header, at {data_floor} or later)")
            data_floor = data + ms + -(data + ms) % _BLOCK + _BLOCK
            at = mo + ms
            members.append((field, mo, ms))
        if at != length:
            raise IndexRefused(f"sample {key!r} is {length} bytes but its last field ends at {at}")
        if len(members) > 1 and len({f for f, _, _ in members}) != len(members):
            raise IndexRefused(f"sample {key!r} has a field twice")
        samples.append((key, off, length, members))
    return samples


_HEX = re.compile(r"[0-9a-f]*")


def check_sums(text: Any, count: int) -> np.ndarray | None:
    """The samples' checksums of an index's ``"xxh3"`` (None: the index has
    none): a string of exactly 16 lower-case hex digits a sample, as the
    writer makes it. IndexRefused otherwise."""
    if text is None:
        return None
    if type(text) is not str:
        raise IndexRefused(f"its checksums are a {type(text).__name__}, not a string of hex digits")
    if len(text) != 16 * count or not _HEX.fullmatch(text):
        raise IndexRefused(f"its checksums are not 16 lower-case hex digits for each of its {count} samples "
                           f"({len(text)} characters)")
    return np.frombuffer(bytes.fromhex(text), dtype=">u8").astype(np.uint64)


def _explain_row(k: int, row: Any) -> None:
    if type(row) is not list or len(row) != 4 or type(row[3]) is not list or not row[3]:
        raise IndexRefused(f"sample {k} is not [key, offset, length, [fields]]")
    key = _str(row[0], f"the key of sample {k}")
    _int(row[1], f"the offset of sample {key!r}")
    _int(row[2], f"the length of sample {key!r}")
    raise AssertionError("unreachable: a sample row failed a check it passes")


def _explain_field(key: str, m: Any) -> None:
    if type(m) is not list or len(m) != 3:
        raise IndexRefused(f"a field of sample {key!r} is not [field, offset, size]")
    field = _str(m[0], f"a field name of sample {key!r}")
    _int(m[1], f"the offset of field {field!r} of sample {key!r}")
    _int(m[2], f"the size of field {field!r} of sample {key!r}")
    raise AssertionError("unreachable: a field failed a check it passes")


def write_index(where: str, shard: str, ident: dict[str, Any], samples: list[Any],
                sums: np.ndarray | None = None) -> None:
    """Cache an index at ``where`` (atomically; a place that cannot be
    written is warned about). ``ident`` names the shard's version: a later
    read uses the index only while the shard still has it. ``sums``, each
    sample's XXH3-64, is kept as ``"xxh3"`` (hex: JSON numbers here stop at
    2**63)."""
    body: dict[str, Any] = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "shard": ident,
                            "samples": [[k, o, n, [list(m) for m in ms]] for k, o, n, ms in samples]}
    if sums is not None:
        body["xxh3"] = np.asarray(sums, dtype=">u8").tobytes().hex()
    try:
        os.makedirs(os.path.dirname(where) or ".", exist_ok=True)
        with atomic_write(where, "w", no_symlink=True) as f:
            # ASCII, with \u escapes: names that are not UTF-8 (decoded with
            # surrogateescape) round-trip, where UTF-8 text could not hold them.
            json.dump(body, f, separators=(",", ":"), ensure_ascii=True)
    except (OSError, ValueError) as exc:  # a read-only place: index again next time
        warnings.warn(f"could not cache the index of tar shard {shard} at {where}: {exc}; it will be "
                      "indexed again next time", RuntimeWarning, stacklevel=4)
