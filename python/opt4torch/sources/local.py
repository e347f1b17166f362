"""Datasets read in place, as users keep them: an ``ImageFolder`` tree and
WebDataset tar shards. Both read through the C engine's byte-range source
(``opt4_ranges`` in include/opt4.h): ``pread``, optionally ``O_DIRECT``, with
reads and bytes counted across DataLoader workers forked after the dataset
was made, so ``opt4torch.DataLoader(...).cache.stats()["storage_bytes"]``
reports what was read from storage.

* :class:`ImageFolder`: classes, labels and order exactly as torchvision's
  ``ImageFolder`` assigns them, by the one rule ``opt4torch pack`` numbers
  with too (:func:`find_classes`, :func:`make_dataset`); ``ds[i]`` is
  ``(bytes, label)``, the file as stored (decode in the loader's
  ``transform``, after the cache). Given to
  :class:`opt4torch.DataLoader`, its misses are prefetched by C threads (as a
  record file's are).
* :class:`TarShards`: shards named as WebDataset names them (a list, or a
  brace pattern such as ``"shard-{000000..000003}.tar"``, or a glob), each
  indexed once by the C indexer (WebDataset's grouping into samples), the
  index cached beside the shard; ``ds[i]`` is WebDataset's raw sample,
  ``{"__key__": key, "jpg": bytes, ...}``, read in one ``pread`` (a sample
  is one byte range of its shard). Given to :class:`opt4torch.DataLoader`,
  its misses are prefetched by the same C threads: the binding's tar source
  (binding/tarframe.c) reads a sample's range and lays it out as the codec
  stores ``ds[i]``, with no Python on the way.

docs/sources.md has the details.

May touch: the files and shards it is given (read only), the index cache
beside a shard or in cache_dir; the binding's byte-range reader.
"""

from __future__ import annotations

import glob
import hashlib
import os
import stat
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _engine
from .base import IMG_EXTENSIONS, EngineSource, checked_index
from .folders import FolderLoopError, LayoutError, find_classes, make_dataset
from .formats import decompress_command, decompressed_name, sniff
from .shardnames import expand_shards
from .tarindex import INDEX_SUFFIX, load_index, write_index

__all__ = ["IMG_EXTENSIONS", "FolderLoopError", "ImageFolder", "LayoutError", "TarShards", "find_classes",
           "make_dataset", "shard_index"]


class RangeDataset:
    """What both datasets share: the engine's reader over (file, offset,
    length) rows, reopened after pickling (a spawned worker), the counters
    and the latency. A :class:`~opt4torch.sources.base.Source`: the engine
    reads it, and counts its reads."""

    _files: list[str]
    _rows: np.ndarray
    _r: Any
    direct: bool
    latency: float
    #: Each item's XXH3-64 as indexed (``checksum=True``), or None.
    _sums: np.ndarray | None = None

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError

    def _checksum_items(self) -> None:
        """Record each item's XXH3-64, read from storage now (the files as
        sized or indexed: a file already changed fails here, naming it), and
        reopen the reader to check every read against them."""
        self._sums = np.frombuffer(self._r.checksums(), dtype=np.uint64).copy()
        self._r.close()
        self._open_ranges()

    @property
    def checksum(self) -> bool:
        """Whether every read from storage is checked against the item's
        XXH3-64 recorded at indexing (``checksum=True``)."""
        return self._sums is not None

    def _open_ranges(self) -> None:
        # Each file's (size, inode, mtime, ctime) as indexed: every read checks
        # its file is still that one (a rewrite in place is refused, naming it).
        # With checksum=True, each item's XXH3-64 as indexed too: every read
        # from storage hashes what it read (a change the identity misses).
        self._r = _engine.Ranges(self._files, self._rows, direct=self.direct,
                                 ident=getattr(self, "_idents", None), sums=self._sums)
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
        sizes: np.ndarray = self._rows[:, 2].copy()
        return sizes

    def info(self) -> dict[str, Any]:
        """Count, sizes, how reads are done (``note``), and the read counters
        (``reads``, ``bytes_read``: shared with forked workers)."""
        info: dict[str, Any] = self._r.info()
        return info

    def set_latency(self, seconds: float) -> None:
        """Sleep this long before every read from now on (0 for none): an emulated slow store."""
        self.latency = float(seconds)
        self._r.set_latency(self.latency)

    def close(self) -> None:
        self._r.close()


class ImageFolder(RangeDataset):
    """An image folder (``root/<class>/**/<file>``) read in place.

    ``classes``, ``class_to_idx``, ``samples`` (``(path, label)`` pairs),
    ``targets`` and the order of items are torchvision's
    (``torchvision.datasets.ImageFolder``: every folder under ``root`` is a
    class, those whose names start with a dot too, sorted; files found by
    ``os.walk`` with links followed, sorted, kept when their name ends with
    one of ``extensions`` (default :data:`IMG_EXTENSIONS`),
    case-insensitively, or when ``is_valid_file(path)`` says so; a class
    folder with no file kept is refused unless ``allow_empty``). The same
    rule numbers ``opt4torch pack`` (:func:`find_classes`,
    :func:`make_dataset`). ``ds[i]`` is ``(bytes, label)``: the file's bytes
    as stored. Files are sized once here, and each read checks its file is
    still the one sized (size, inode, mtime, ctime) and a regular file: a
    file changed, replaced or turned into a FIFO fails the read, naming it.

    torchvision's ``transform``, ``target_transform`` and ``loader`` are
    refused, saying where they go: what is cached is the file's bytes, and
    decoding and augmentation run after the cache, in
    ``opt4torch.DataLoader(..., transform=...)``.

    ``checksum=True`` also reads every file once here and records its
    XXH3-64 (the record file's checksum); every read from storage after
    (``ds[i]``, the prefetch threads, workers) hashes what it read and
    raises ``Opt4IOError`` naming the item unless it matches: a change the
    identity cannot show (a filesystem whose ctime means nothing, an
    identity put back) is never served. A hit from the cache is not read
    again, so not checked again. Off by default: it costs a read of the
    whole folder here and a hash at memory speed per read (bench/RESULTS.md).

    ``direct=True`` reads with ``O_DIRECT`` where the filesystem allows it
    (``info()["note"]`` says how reads are done). ``latency`` (seconds) sleeps
    before every read: an emulated slow store.
    """

    def __init__(self, root: str | os.PathLike[str], transform: None = None, target_transform: None = None,
                 loader: None = None, is_valid_file: Callable[[str], bool] | None = None,
                 allow_empty: bool = False, *, extensions: str | Sequence[str] | None = None,
                 direct: bool = False, latency: float = 0.0, checksum: bool = False) -> None:
        for name, value in (("transform", transform), ("target_transform", target_transform), ("loader", loader)):
            if value is not None:
                raise TypeError(_REFUSED[name])
        # torchvision's VisionDataset expands a leading ~ of a str root.
        self.root = os.path.expanduser(root) if isinstance(root, str) else os.fspath(root)
        self.direct = bool(direct)
        self.latency = float(latency)
        self.classes, self.class_to_idx = find_classes(self.root)
        self.samples = make_dataset(self.root, self.class_to_idx, extensions=extensions,
                                    is_valid_file=is_valid_file, allow_empty=allow_empty)
        self.imgs = self.samples
        self.targets = [label for _, label in self.samples]
        self._labels = np.asarray(self.targets, dtype=np.int64)
        rows = np.zeros((len(self.samples), 3), dtype=np.int64)
        self._idents = np.zeros((len(self.samples), 4), dtype=np.int64)
        for k, (path, _) in enumerate(self.samples):
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path} is not a regular file: an image folder read in place holds files only; "
                                 "move it out of the folder")
            rows[k] = (k, 0, st.st_size)
            self._idents[k] = _ident_row(st)
        self._files = [path for path, _ in self.samples]
        self._rows = rows
        self._open_ranges()
        if bool_arg(checksum, "checksum"):
            self._checksum_items()

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        i = self._index(index)
        return self._r.read(i), int(self._labels[i])

    def engine_source(self) -> EngineSource:
        """What the C prefetcher needs to store items exactly as ``self[i]``
        returns them: ``(bytes, label)``."""
        return EngineSource(self._r, frame="bytes", labels=self._labels)

    def __repr__(self) -> str:
        return (f"ImageFolder({self.root!r}, {len(self)} images, {len(self.classes)} classes, direct={self.direct}, "
                f"checksum={self.checksum})")


_AFTER_THE_CACHE = ("opt4torch.ImageFolder returns each file as stored, ds[i] == (bytes, label), so that the "
                    "cache holds the bytes and not one random augmentation of them; decoding and augmentation "
                    "run after the cache: give them to the loader, opt4torch.DataLoader(ds, ..., transform=f), "
                    "where f takes (bytes, label), e.g. lambda s: (tfm(PIL.Image.open(io.BytesIO(s[0]))"
                    ".convert('RGB')), s[1])")
_REFUSED = {
    "transform": f"ImageFolder takes no transform: {_AFTER_THE_CACHE}",
    "target_transform": f"ImageFolder takes no target_transform: {_AFTER_THE_CACHE}; map the label there too",
    "loader": (f"ImageFolder takes no loader: it reads the files' bytes itself (in C, and prefetched); "
               f"{_AFTER_THE_CACHE}, decoding there as your loader would"),
}


# ---- tar shards ----

class TarShards(RangeDataset):
    """WebDataset tar shards read in place: ``ds[i]`` is sample ``i``,
    ``{"__key__": key, "<field>": bytes, ...}``, as WebDataset's raw samples
    (fields lower-cased, e.g. ``"jpg"``, ``"cls"``, ``"seg.png"``), samples
    numbered shard after shard in the order of ``paths``.

    ``paths`` is spelled as for WebDataset: a list of shards, or a string
    split at ``::`` with each part brace-expanded
    (``"shards/train-{000000..000147}.tar"``, ``"{a,b}.tar"``), and here
    also globs (``"shards/*.tar"``, sorted); a name that exists as written
    is taken as written, and a pattern that matches nothing is refused
    naming it (``opt4torch.sources.shardnames``). ``self.paths`` is the list.

    Each shard is indexed once by the C indexer (regular members only; ustar,
    GNU long names and pax headers; members grouped into samples by key as
    WebDataset does); a malformed shard is refused, naming it and the offset.
    A compressed shard (``.tar.gz``, known by its first bytes, not its name)
    is refused with the command that decompresses it: samples are read as
    byte ranges, which a compressed stream does not have.
    The index is cached beside the shard as ``<shard>.opt4idx.json`` (in
    ``cache_dir``, default ``~/.cache/opt4torch``, when the shard's folder is
    not writable), written atomically, and used only while the shard's size,
    mtime, ctime and inode are those it was made from: a stale index is
    rebuilt. An index is read as a hostile file (``sources.tarindex``: a regular
    file only, size-capped, parsed with limits, every range checked against
    the shard and the others); one that fails is rebuilt with a warning.

    ``checksum=True`` records each sample's XXH3-64 in the index when it is
    made (a current index without them has them added: the shard is read
    once), and every read from storage hashes the sample it read and raises
    ``Opt4IOError`` naming it unless it matches: bytes changed in a way the
    shard's identity does not show are never served. Hits are not read
    again. Off by default (bench/RESULTS.md has the cost).
    """

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, direct: bool = False,
                 latency: float = 0.0, cache_dir: str | os.PathLike[str] | None = None,
                 checksum: bool = False) -> None:
        if not isinstance(paths, (str, os.PathLike)) and not paths:
            raise ValueError("TarShards needs at least one shard")
        self.paths = expand_shards(paths, exists=os.path.exists, match=_glob_shards)
        self.direct = bool(direct)
        self.latency = float(latency)
        self.cache_dir = _cache_dir(cache_dir)
        self.keys: list[str] = []
        self._members: list[tuple[tuple[str, int, int], ...]] = []
        rows: list[tuple[int, int, int]] = []
        idents: list[dict[str, int]] = []
        sums: list[np.ndarray] | None = [] if bool_arg(checksum, "checksum") else None
        for k, shard in enumerate(self.paths):
            for key, off, length, members in _shard_index(shard, self.cache_dir, idents=idents, sums=sums):
                self.keys.append(key)
                self._members.append(tuple((f, o, s) for f, o, s in members))
                rows.append((k, off, length))
        self._files = list(self.paths)
        self._rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
        self._idents = np.asarray([[d["size"], d["ino"], d["mtime_ns"], d["ctime_ns"]] for d in idents],
                                  dtype=np.int64).reshape(-1, 4)
        if sums is not None:
            self._sums = np.concatenate(sums).astype(np.uint64) if sums else np.zeros(0, np.uint64)
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
        return record_size(self.keys[i], self._members[i])

    def engine_source(self) -> EngineSource:
        """The C prefetcher lays each sample out as the codec stores the
        dict ``self[i]`` (frame ``"tar"``: binding/tarframe.c), from one
        read of its range."""
        return EngineSource(self._r, frame="tar", samples=(self.keys, self._members))

    def __repr__(self) -> str:
        return (f"TarShards({len(self.paths)} shards, {len(self)} samples, direct={self.direct}, "
                f"checksum={self.checksum})")


def record_size(key: str, members: Sequence[tuple[str, int, int]]) -> int:
    """The length of the codec's record of the dict ``TarShards`` returns,
    {"__key__": key, field: bytes, ...} (python/opt4torch/pool/codec.py): magic,
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
        return shard + INDEX_SUFFIX
    tag = hashlib.sha256(os.fsencode(os.path.abspath(shard))).hexdigest()[:16]
    return os.path.join(cache_dir, f"{os.path.basename(shard)}-{tag}.opt4idx.json")


def _ident_row(st: os.stat_result) -> tuple[int, int, int, int]:
    """A file's identity as the C reader checks it (opt4_file_ident)."""
    return (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _shard_id(st: os.stat_result) -> dict[str, int]:
    # ctime too: a rewrite in place with the same size, its mtime put back
    # (touch -d, rsync -t), still moves ctime, which no user call can set.
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def shard_index(shard: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None, *,
                write: bool = True) -> list[Any]:
    """A tar shard's samples as :class:`TarShards` indexes them, ``[(key,
    offset, length, [(field, offset in the sample, size)])]``: from its
    cached index when that is current, else from the C indexer (then cached,
    unless ``write`` is false: ``opt4torch inspect`` writes nothing)."""
    return _shard_index(os.fspath(shard), _cache_dir(cache_dir), write=write)


def _cache_dir(cache_dir: str | os.PathLike[str] | None) -> str:
    """Where indexes go when a shard's folder cannot hold them: ``cache_dir``,
    else ``~/.cache/opt4torch``."""
    if cache_dir is not None:
        return os.fspath(cache_dir)
    return os.path.join(os.path.expanduser("~"), ".cache", "opt4torch")


def _shard_index(shard: str, cache_dir: str, *, write: bool = True,
                 idents: list[dict[str, int]] | None = None, sums: list[np.ndarray] | None = None) -> list[Any]:
    """The shard's samples, [(key, offset, length, [(field, offset, size)])],
    from its cached index when that is current, else from the C indexer
    (then cached). The shard's identity they hold for is appended to
    ``idents``; with ``sums`` (a list), the samples' XXH3-64 too, from the
    index, or read from the shard now and added to the index."""
    try:
        st = os.stat(shard)
    except FileNotFoundError:
        raise FileNotFoundError(f"no tar shard at {shard!r}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"tar shard {shard} is not a regular file")
    where = _index_path(shard, cache_dir)
    ident = _shard_id(st)
    if idents is not None:
        idents.append(ident)
    got = load_index(where, shard, ident)
    samples, have = got if got is not None else (None, None)
    if samples is None:
        check_tar(shard)
        samples = _engine.tar_index(shard)
        if _shard_id(os.stat(shard)) != ident:
            raise ValueError(f"tar shard {shard} changed while it was being indexed; try again once it is written")
    if sums is not None:
        if have is None:
            have = sample_sums(shard, samples, ident)
        sums.append(have)
    if write and (got is None or have is not got[1]):  # new, or its checksums added
        write_index(where, shard, ident, samples, have)
    return samples


def sample_sums(path: str, samples: list[Any], ident: dict[str, int] | None) -> np.ndarray:
    """Each sample's XXH3-64, read from the shard at ``path`` now by the
    engine's range reader (checked against ``ident`` when given, so a shard
    changed since it was indexed fails here): what ``checksum=True``
    records."""
    rows = np.asarray([(0, off, length) for _, off, length, _ in samples], dtype=np.int64).reshape(-1, 3)
    idrow = None if ident is None else np.asarray(
        [[ident["size"], ident["ino"], ident["mtime_ns"], ident["ctime_ns"]]], dtype=np.int64)
    r = _engine.Ranges([path], rows, ident=idrow)
    try:
        return np.frombuffer(r.checksums(), dtype=np.uint64).copy()
    finally:
        r.close()


def bool_arg(value: Any, name: str) -> bool:
    """A bool argument, refused when it is anything else (a string "False" is true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return bool(value)


def _glob_shards(pattern: str) -> list[str]:
    """The files a glob matches, sorted (``**`` spans folders), without the
    index caches written beside shards (``shards/*`` must not take them)."""
    return sorted(p for p in glob.glob(pattern, recursive=True) if not p.endswith(INDEX_SUFFIX))


def check_tar(path: str, name: str | None = None, *, in_store: bool = False) -> None:
    """Refuse, with what it is and what to do, a shard that is not a tar by
    its first bytes: compressed (``.tar.gz``, whatever its name says), a
    zip, an opt4 record or plan file. ``name`` is how the shard is named in
    the message (an ``s3://`` URL for a fetched copy, with ``in_store``).
    Anything else is left to the C indexer, which checks every header."""
    fmt = sniff(path)
    name = name or path
    if fmt.kind in ("tar", "empty", "unknown"):
        return
    if fmt.compressed:
        out = decompressed_name(name)
        if in_store:
            todo = f"`aws s3 cp {name} - | {fmt.decompress} -dc | aws s3 cp - {out}`"
        else:
            todo = f"`{decompress_command(name, fmt)[0]}`"
        raise ValueError(f"tar shard {name} is {fmt.what}: compressed shards are not read in place (a sample is "
                         "read as one byte range of the shard, in any order, and a compressed stream can only be "
                         "read from its start, which is how WebDataset streams it); decompress it once, "
                         f"{todo}, and give {out} instead")
    hint = {"records": "read it with opt4torch.RecordFile", "plan": "open it with opt4torch.load_plan"}.get(
        fmt.kind, "WebDataset shards are tar files (tar cf shard.tar ..., or webdataset.ShardWriter)")
    raise ValueError(f"tar shard {name} is {fmt.what}, not a tar archive: {hint}")
