"""Datasets read in place, as users keep them: an ``ImageFolder`` tree and
WebDataset tar shards. Both read through the C engine's byte-range source
(``opt4_ranges`` in include/opt4.h): ``pread``, optionally ``O_DIRECT``, with
reads and bytes counted across DataLoader workers forked after the dataset
was made, so ``opt4torch.DataLoader(...).cache.stats()["storage_bytes"]``
reports what was read from storage.

* :class:`ImageFolder`: classes, labels and order exactly as torchvision's
  ``ImageFolder`` assigns them; ``ds[i]`` is ``(bytes, label)``, the file as
  stored (decode in ``transform``, after the cache). Given to
  :class:`opt4torch.DataLoader`, its misses are prefetched by C threads (as a
  record file's are).
* :class:`TarShards`: each shard indexed once by the C indexer (WebDataset's
  grouping into samples), the index cached beside the shard; ``ds[i]`` is
  WebDataset's raw sample, ``{"__key__": key, "jpg": bytes, ...}``, read in
  one ``pread`` (a sample is one byte range of its shard). Given to
  :class:`opt4torch.DataLoader`, its misses are prefetched by the same C
  threads: the binding's tar source (binding/tarframe.c) reads a sample's
  range and lays it out as the codec stores ``ds[i]``, with no Python on
  the way.

docs/sources.md has the details.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import _engine
from ._files import atomic_write

__all__ = ["ImageFolder", "TarShards", "IMG_EXTENSIONS"]

#: torchvision.datasets.folder.IMG_EXTENSIONS.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def checked_index(index: int, n: int) -> int:
    """``index`` as a map-style dataset takes it (negative from the end), or
    IndexError: the one check every dataset here makes."""
    i = int(index)
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"index {index} is out of range for {n} items")
    return i


class _RangeDataset:
    """What both datasets share: the engine's reader over (file, offset,
    length) rows, reopened after pickling (a spawned worker), the counters
    and the latency."""

    #: opt4torch.DataLoader reports info()["reads"] and ["bytes_read"] as storage reads.
    _counts_storage = True

    def _open_ranges(self) -> None:
        self._r = _engine.Ranges(self._files, self._rows, direct=self.direct)
        if self.latency:
            self._r.set_latency(self.latency)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_r"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_ranges()

    def __len__(self) -> int:
        return int(self._rows.shape[0])

    def _index(self, index: int) -> int:
        return checked_index(index, len(self))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return [self[i] for i in indices]

    def opt4_item_bytes(self, index: int) -> int:
        """Bytes item ``index`` takes as read (opt4torch.DataLoader plans in bytes with these)."""
        return int(self._rows[int(index), 2])

    def item_sizes(self) -> np.ndarray:
        """Every item's length in bytes, as an int64 array."""
        return self._rows[:, 2].copy()

    def info(self) -> dict[str, Any]:
        """Count, sizes, how reads are done (``note``), and the read counters
        (``reads``, ``bytes_read``: shared with forked workers)."""
        return self._r.info()

    def set_latency(self, seconds: float) -> None:
        """Sleep this long before every read from now on (0 for none): an emulated slow store."""
        self.latency = float(seconds)
        self._r.set_latency(self.latency)

    def close(self) -> None:
        self._r.close()


class ImageFolder(_RangeDataset):
    """An image folder (``root/<class>/**/<file>``) read in place.

    ``classes``, ``class_to_idx``, ``samples`` (``(path, label)`` pairs),
    ``targets`` and the order of items are torchvision's
    (``torchvision.datasets.ImageFolder``: class folders sorted, files found by
    ``os.walk`` with links followed, sorted, kept when their name ends with one
    of :data:`IMG_EXTENSIONS`, case-insensitively; a class folder with no
    image is refused). ``ds[i]`` is ``(bytes, label)``: the file's bytes as
    stored. Files are sized once here; a file changed afterwards is read at
    its old length (shorter: the read fails, naming it).

    ``direct=True`` reads with ``O_DIRECT`` where the filesystem allows it
    (``info()["note"]`` says how reads are done). ``latency`` (seconds) sleeps
    before every read: an emulated slow store.
    """

    def __init__(self, root: str | os.PathLike[str], *, direct: bool = False, latency: float = 0.0) -> None:
        self.root = os.fspath(root)
        self.direct = bool(direct)
        self.latency = float(latency)
        self.classes, self.class_to_idx = _find_classes(self.root)
        self.samples = _make_dataset(self.root, self.class_to_idx)
        self.imgs = self.samples
        self.targets = [label for _, label in self.samples]
        self._labels = np.asarray(self.targets, dtype=np.int64)
        rows = np.zeros((len(self.samples), 3), dtype=np.int64)
        for k, (path, _) in enumerate(self.samples):
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path} is not a regular file: an image folder read in place holds files only; "
                                 "move it out of the folder")
            rows[k] = (k, 0, st.st_size)
        self._files = [path for path, _ in self.samples]
        self._rows = rows
        self._open_ranges()

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        i = self._index(index)
        return self._r.read(i), int(self._labels[i])

    def _prefetch_source(self) -> dict[str, Any]:
        """What the C prefetcher needs to store items exactly as ``self[i]``
        returns them (``_engine.Prefetcher``'s arguments)."""
        return {"records": self._r, "frame": "bytes", "labels": self._labels}

    def __repr__(self) -> str:
        return f"ImageFolder({self.root!r}, {len(self)} images, {len(self.classes)} classes, direct={self.direct})"


def _find_classes(root: str) -> tuple[list[str], dict[str, int]]:
    """torchvision.datasets.folder.find_classes."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root} is not a folder (expected root/<class>/<image files>)")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
    return classes, {name: i for i, name in enumerate(classes)}


def _make_dataset(root: str, class_to_idx: dict[str, int]) -> list[tuple[str, int]]:
    """torchvision.datasets.folder.make_dataset with its default extensions."""
    instances: list[tuple[str, int]] = []
    available: set[str] = set()
    for target_class in sorted(class_to_idx):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(root, target_class)
        if not os.path.isdir(target_dir):
            continue
        for dirpath, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(dirpath, fname)
                if path.lower().endswith(IMG_EXTENSIONS):
                    instances.append((path, class_index))
                    available.add(target_class)
    empty = set(class_to_idx) - available
    if empty:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty))}. "
                                f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}")
    return instances


# ---- tar shards ----

_INDEX_FORMAT = "opt4torch-tar-index"
_INDEX_VERSION = 1


class TarShards(_RangeDataset):
    """WebDataset tar shards read in place: ``ds[i]`` is sample ``i``,
    ``{"__key__": key, "<field>": bytes, ...}``, as WebDataset's raw samples
    (fields lower-cased, e.g. ``"jpg"``, ``"cls"``, ``"seg.png"``), samples
    numbered shard after shard in the order of ``paths``.

    Each shard is indexed once by the C indexer (regular members only; ustar,
    GNU long names and pax headers; members grouped into samples by key as
    WebDataset does); a malformed shard is refused, naming it and the offset.
    The index is cached beside the shard as ``<shard>.opt4idx.json`` (in
    ``cache_dir``, default ``~/.cache/opt4torch``, when the shard's folder is
    not writable), written atomically, and used only while the shard's size,
    mtime and inode are those it was made from: a stale index is rebuilt, a
    corrupt one rebuilt with a warning.
    """

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, direct: bool = False,
                 latency: float = 0.0, cache_dir: str | os.PathLike[str] | None = None) -> None:
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise ValueError("TarShards needs at least one shard")
        self.direct = bool(direct)
        self.latency = float(latency)
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else os.path.join(
            os.path.expanduser("~"), ".cache", "opt4torch")
        self.keys: list[str] = []
        self._members: list[tuple[tuple[str, int, int], ...]] = []
        rows: list[tuple[int, int, int]] = []
        for k, shard in enumerate(self.paths):
            for key, off, length, members in _shard_index(shard, self.cache_dir):
                self.keys.append(key)
                self._members.append(tuple((f, o, s) for f, o, s in members))
                rows.append((k, off, length))
        self._files = list(self.paths)
        self._rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
        self._open_ranges()

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = self._index(index)
        raw = self._r.read(i)
        sample: dict[str, Any] = {"__key__": self.keys[i]}
        for field, off, size in self._members[i]:
            sample[field] = raw[off:off + size]
        return sample

    def opt4_item_bytes(self, index: int) -> int:
        """Bytes sample ``index`` takes in the cache: its record, as the
        codec stores the dict ``self[index]`` (the key and field names, and
        the fields' bytes, without the tar headers between them)."""
        i = self._index(index)
        return _record_size(self.keys[i], self._members[i])

    def _prefetch_source(self) -> dict[str, Any]:
        """The C prefetcher lays each sample out as the codec stores the
        dict ``self[i]`` (frame ``"tar"``: binding/tarframe.c), from one
        read of its range."""
        return {"records": self._r, "frame": "tar", "samples": (self.keys, self._members)}

    def __repr__(self) -> str:
        return f"TarShards({len(self.paths)} shards, {len(self)} samples, direct={self.direct})"


def _record_size(key: str, members: Sequence[tuple[str, int, int]]) -> int:
    """The length of the codec's record of the dict ``TarShards`` returns,
    {"__key__": key, field: bytes, ...} (python/opt4torch/_codec.py): magic,
    format and dict header, then per entry a str node for its name (tag, u64
    length, UTF-8) and its value: a str node for the key, a bytes node (tag,
    u64 length, u64 pad, pad, payload at a multiple of 16) for a field. A
    field named "__key__" replaces the key's value in its place, as in the
    dict."""
    entries: dict[str, int | str] = {"__key__": key}
    for field, _off, size in members:
        entries[field] = size
    pos = 8
    for name, value in entries.items():
        pos += 9 + len(name.encode("utf-8", "surrogatepass"))
        if isinstance(value, str):
            pos += 9 + len(value.encode("utf-8", "surrogatepass"))
        else:
            pos += 17
            pos += -pos % 16 + value
    return pos


def _index_path(shard: str, cache_dir: str) -> str:
    """Beside the shard when its folder is writable, else in cache_dir under
    a name made from the shard's absolute path."""
    folder = os.path.dirname(os.path.abspath(shard))
    if os.access(folder, os.W_OK | os.X_OK):
        return shard + ".opt4idx.json"
    tag = hashlib.sha256(os.fsencode(os.path.abspath(shard))).hexdigest()[:16]
    return os.path.join(cache_dir, f"{os.path.basename(shard)}-{tag}.opt4idx.json")


def _shard_id(st: os.stat_result) -> dict[str, int]:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _shard_index(shard: str, cache_dir: str) -> list[Any]:
    """The shard's samples, [(key, offset, length, [(field, offset, size)])],
    from its cached index when that is current, else from the C indexer
    (then cached)."""
    st = os.stat(shard)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"tar shard {shard} is not a regular file")
    where = _index_path(shard, cache_dir)
    ident = _shard_id(st)
    samples = _read_index(where, shard, ident)
    if samples is not None:
        return samples
    samples = _engine.tar_index(shard)
    if _shard_id(os.stat(shard)) != ident:
        raise ValueError(f"tar shard {shard} changed while it was being indexed; try again once it is written")
    _write_index(where, shard, ident, samples)
    return samples


def _write_index(where: str, shard: str, ident: dict[str, Any], samples: list[Any]) -> None:
    """Cache an index at ``where`` (atomically; a place that cannot be
    written is warned about). ``ident`` names the shard's version: a later
    read uses the index only while the shard still has it."""
    body = {"format": _INDEX_FORMAT, "version": _INDEX_VERSION, "shard": ident,
            "samples": [[k, o, n, [list(m) for m in ms]] for k, o, n, ms in samples]}
    try:
        os.makedirs(os.path.dirname(where) or ".", exist_ok=True)
        with atomic_write(where, "w", no_symlink=True) as f:
            # ASCII, with \u escapes: names that are not UTF-8 (decoded with
            # surrogateescape) round-trip, where UTF-8 text could not hold them.
            json.dump(body, f, separators=(",", ":"), ensure_ascii=True)
    except (OSError, ValueError) as exc:  # a read-only place: index again next time
        warnings.warn(f"could not cache the index of tar shard {shard} at {where}: {exc}; it will be "
                      "indexed again next time", RuntimeWarning, stacklevel=4)


def _read_index(where: str, shard: str, ident: dict[str, Any]) -> list[Any] | None:
    """A cached index if it is there, well formed and made from this version
    of the shard; None otherwise (a corrupt one with a warning)."""
    try:
        with open(where, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.warn(f"cannot read the cached index {where} of tar shard {shard} ({exc}): indexing the shard "
                      "again", RuntimeWarning, stacklevel=4)
        return None
    try:
        body = json.loads(raw.decode("utf-8"))
        if not isinstance(body, dict) or body.get("format") != _INDEX_FORMAT:
            raise ValueError("not an opt4torch tar index")
        if body.get("version") != _INDEX_VERSION:
            return None  # another version's cache: rebuilt, no warning
        if body.get("shard") != ident:
            return None  # stale: the shard changed since
        samples = [(str(k), int(o), int(n), [(str(f), int(mo), int(ms)) for f, mo, ms in members])
                   for k, o, n, members in body["samples"]]
        for k, o, n, members in samples:
            if o < 0 or n < 0 or o + n > ident["size"] or any(mo < 0 or ms < 0 or mo + ms > n
                                                              for _, mo, ms in members):
                raise ValueError(f"sample {k!r} lies outside the shard")
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        warnings.warn(f"the cached index {where} of tar shard {shard} is corrupt ({exc}): rebuilding it",
                      RuntimeWarning, stacklevel=4)
        return None
    return samples
