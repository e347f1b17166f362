"""What a file is, from its first bytes: the one place that tells a plan
file, a record file, a tar shard and the files people hand over instead
(a compressed shard, a zip, a pickle) apart. ``opt4torch inspect`` picks
its description by it, and :class:`opt4torch.TarShards` refuses what is not
a tar with the reason (a ``.tar.gz`` says so, whatever its name).

The name is never trusted: a ``shard.tar`` that is gzip inside is gzip, a
``shard.tar.gz`` that is a plain tar is a tar.

May touch: the first bytes of the files it is given (read only).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

__all__ = ["FileFormat", "decompress_command", "decompressed_name", "is_tar_header", "sniff", "sniff_bytes"]

_BLOCK = 512


@dataclass(frozen=True)
class FileFormat:
    """``kind`` is one of ``"plan"``, ``"records"``, ``"tar"``, ``"pickle"``,
    ``"gzip"``, ``"bzip2"``, ``"xz"``, ``"zstd"``, ``"lz4"``, ``"zip"``,
    ``"empty"`` or ``"unknown"``; ``what`` says it in words, for messages;
    ``decompress`` is the tool that undoes a compression (``None`` for what
    is not compressed)."""

    kind: str
    what: str
    decompress: str | None = None

    @property
    def compressed(self) -> bool:
        return self.decompress is not None


# (magic at offset 0, format), longest first where one magic starts another.
_MAGICS: tuple[tuple[bytes, FileFormat], ...] = (
    (b"OPT4PLAN", FileFormat("plan", "an opt4 plan file")),
    (b"OPT4REC\0", FileFormat("records", "an opt4 record file")),
    (b"\x1f\x8b", FileFormat("gzip", "a gzip-compressed file", "gzip")),
    (b"BZh", FileFormat("bzip2", "a bzip2-compressed file", "bzip2")),
    (b"\xfd7zXZ\x00", FileFormat("xz", "an xz-compressed file", "xz")),
    (b"\x28\xb5\x2f\xfd", FileFormat("zstd", "a zstd-compressed file", "zstd")),
    (b"\x04\x22\x4d\x18", FileFormat("lz4", "an lz4-compressed file", "lz4")),
    (b"PK\x03\x04", FileFormat("zip", "a zip archive")),
    (b"PK\x05\x06", FileFormat("zip", "a zip archive (empty)")),
)

_TAR = FileFormat("tar", "a tar archive")
_PICKLE = FileFormat("pickle", "a Python pickle")
_EMPTY = FileFormat("empty", "an empty file")
_UNKNOWN = FileFormat("unknown", "a file of no format known here")

# Suffixes of compressed tar shards and what they are called decompressed.
_SUFFIXES = ((".tar.gz", ".tar"), (".tgz", ".tar"), (".tar.bz2", ".tar"), (".tbz2", ".tar"), (".tar.xz", ".tar"),
             (".txz", ".tar"), (".tar.zst", ".tar"), (".tar.zstd", ".tar"), (".tar.lz4", ".tar"),
             (".gz", ""), (".bz2", ""), (".xz", ""), (".zst", ""), (".zstd", ""), (".lz4", ""))


def sniff(path: str | os.PathLike[str]) -> FileFormat:
    """The format of the file at ``path`` by its first 512 bytes (an
    ``OSError`` if it cannot be read)."""
    with open(path, "rb") as f:
        head = f.read(_BLOCK)
    return sniff_bytes(head)


def sniff_bytes(head: bytes) -> FileFormat:
    """The format of a file that starts with ``head`` (its first 512 bytes,
    or all of it when shorter)."""
    if not head:
        return _EMPTY
    if len(head) >= _BLOCK and is_tar_header(head[:_BLOCK]):
        return _TAR
    for magic, fmt in _MAGICS:
        if head.startswith(magic):
            return fmt
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return _PICKLE
    return _UNKNOWN


def is_tar_header(block: bytes) -> bool:
    """Whether a 512-byte block is what the engine's tar indexer
    (``src/source/tar.c``) takes as a first block: the end-of-archive marker
    (all zeros: an empty archive), or a header whose checksum field, read as
    the indexer reads numbers, equals the unsigned or the signed sum of the
    header with that field counted as spaces."""
    if len(block) != _BLOCK:
        return False
    if not any(block):
        return True
    want = _tar_number(block[148:156])
    if want is None:
        return False
    body = block[:148] + b" " * 8 + block[156:]
    unsigned = sum(body)
    signed = sum(b - 256 if b >= 128 else b for b in body)
    return want in (unsigned, signed)


def _tar_number(field: bytes) -> int | None:
    if field[:1] == b"\x80":  # GNU base-256
        return int.from_bytes(field[1:], "big")
    text = field.lstrip(b" ")
    digits = len(text) - len(text.lstrip(b"01234567"))
    if text[digits:].strip(b" \0"):
        return None
    return int(text[:digits], 8) if digits else 0


def decompressed_name(path: str) -> str:
    """The name for ``path`` decompressed: ``a.tar.gz`` and ``a.tgz`` ->
    ``a.tar``; a name with no compression suffix (``a.tar`` that is gzip
    inside) -> ``a.plain.tar``."""
    low = path.lower()
    for suffix, replacement in _SUFFIXES:
        if low.endswith(suffix) and len(path) > len(suffix) and not path[:-len(suffix)].endswith("/"):
            return path[:len(path) - len(suffix)] + replacement
    return (path[:-4] if low.endswith(".tar") else path) + ".plain.tar"


def decompress_command(path: str, fmt: FileFormat) -> tuple[str, str]:
    """The shell command that writes ``path`` decompressed, and the name it
    writes (:func:`decompressed_name`): ``gzip -dc a.tar.gz > a.tar``.
    Nothing is removed."""
    if fmt.decompress is None:
        raise ValueError(f"{path} is not compressed ({fmt.what})")
    out = decompressed_name(path)
    return f"{fmt.decompress} -dc {shlex.quote(path)} > {shlex.quote(out)}", out
