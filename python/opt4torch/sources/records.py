"""Record files: a dataset of byte records (encoded images, serialized
samples) packed in one file, read by index with ``pread``, optionally with
``O_DIRECT`` (no page cache), by the C engine.

A :class:`RecordFile` is a map-style dataset: ``ds[i]`` is record ``i`` as
``bytes``, or ``(bytes, label)`` when the file was made from an image folder
(the labels live in a JSON sidecar, ``<path>.json``). Given to
:class:`opt4torch.DataLoader`, its misses are prefetched by C threads that
read the file and write the records straight into the shared cache, with no
Python and no GIL on the path (``prefetch=True``, the default for record
files). Decoding belongs in ``transform``, after the cache.

Make one with :func:`write_records` (any iterable of bytes) or
:func:`image_folder_to_records` (the ``ImageFolder`` layout: one folder per
class). The format is in docs/records.md.

May touch: the record file and its sidecar (written atomically by
write_records, read only otherwise); the binding's record reader and writer.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import _engine
from ..io.files import abort_on_sigterm, check_output, file_kind, output_path
from .base import IMAGE_EXTENSIONS, EngineSource, checked_index
from .local import LayoutError, find_classes, make_dataset

__all__ = ["RecordFile", "write_records", "image_folder_to_records", "IMAGE_EXTENSIONS"]


def _sidecar(path: str | os.PathLike[str]) -> Path:
    return Path(os.fspath(path) + ".json")


class RecordFile:
    """A record file as a map-style dataset: ``ds[i]`` is record ``i``.

    ``direct=True`` reads with ``O_DIRECT`` where the filesystem allows it
    (``info()["note"]`` says how reads are done and why). ``latency`` (seconds)
    sleeps before every read: an emulated slow store, for benchmarks and
    tests. ``with_labels`` returns ``(bytes, label)`` from the sidecar's labels
    (default: when the sidecar has them).

    The counters in :meth:`info` (``reads``, ``bytes_read``) are shared with
    the processes forked after the file was opened, such as DataLoader
    workers under the fork start method; a spawned worker reopens the file
    and counts on its own.
    """

    def __init__(self, path: str | os.PathLike[str], *, direct: bool = False, latency: float = 0.0,
                 with_labels: bool | None = None) -> None:
        self.path = os.fspath(path)
        self.direct = bool(direct)
        self.latency = float(latency)
        self.classes: list[str] | None = None
        self.labels: np.ndarray | None = None
        self._checksum: int | None = None
        self._open()
        side = _sidecar(self.path)
        try:
            meta = _read_sidecar(side, self.path, int(self._r.info()["checksum"]))
        except BaseException:
            self._r.close()
            raise
        if meta is not None:
            self.classes = meta.get("classes")
            if "labels" in meta:
                self.labels = np.asarray(meta["labels"], dtype=np.int64)
        if with_labels and self.labels is None:
            self._r.close()
            raise ValueError(f"{self.path} has no labels (no {side.name} sidecar with labels)")
        self.with_labels = self.labels is not None if with_labels is None else bool(with_labels)
        if self.labels is not None and self.labels.shape != (len(self),):
            self._r.close()
            raise ValueError(f"{side} has {self.labels.shape[0]} labels for {len(self)} records: "
                             "the sidecar does not belong to this file; rewrite both")

    def _open(self) -> None:
        self._r = _engine.Records(self.path, direct=self.direct)
        checksum = int(self._r.info()["checksum"])
        if self._checksum is not None and checksum != self._checksum:
            self._r.close()
            raise ValueError(f"{self.path} was replaced by another version of the file after it was opened "
                             "(its header checksum changed): the labels and sizes known here belong to the "
                             "earlier one; open the file again")
        self._checksum = checksum
        if self.latency:
            self._r.set_latency(self.latency)
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_r"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return len(self._r)

    def __getitem__(self, index: int) -> Any:
        i = checked_index(index, len(self._r))
        data = self._r.read(i)
        if self.with_labels:
            return data, int(self.labels[i])  # type: ignore[index]
        return data

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return [self[i] for i in indices]

    def opt4_item_bytes(self, index: int) -> int:
        """Bytes record ``index`` takes (opt4torch.DataLoader plans in bytes with these)."""
        return int(self._r.len_of(int(index)))

    def item_sizes(self) -> np.ndarray:
        """Every record's length, as an int64 array."""
        return np.fromiter((self._r.len_of(i) for i in range(len(self))), dtype=np.int64, count=len(self))

    def info(self) -> dict[str, Any]:
        """Count, sizes, how reads are done (``note``), and the read counters."""
        return self._r.info()

    def set_latency(self, seconds: float) -> None:
        """Sleep this long before every read from now on (0 for none)."""
        self.latency = float(seconds)
        self._r.set_latency(self.latency)

    def engine_source(self) -> EngineSource:
        """What the C prefetcher needs to store records exactly as
        ``self[i]`` returns them: the engine's reader, the frame and the
        labels."""
        return EngineSource(self._r, frame="bytes", labels=self.labels if self.with_labels else None)

    def close(self) -> None:
        self._r.close()

    def __repr__(self) -> str:
        return f"RecordFile({self.path!r}, {len(self)} records, direct={self.direct})"


def _check_output(path: str | os.PathLike[str]) -> str:
    """The record file and its sidecar, both checked as outputs."""
    out = output_path(path, no_symlink=True)
    side = _sidecar(out)
    if os.path.lexists(side):
        check_output(side, no_symlink=True)  # replaced or removed below: it must be a regular file
    return out


def _read_sidecar(side: Path, path: str, checksum: int) -> dict[str, Any] | None:
    """The sidecar's contents, checked: JSON of the expected shape, labels
    that are integers, and (sidecars written since the checksum was added)
    the checksum of the record file it was written with. None if there is
    no sidecar."""
    if not os.path.lexists(side):
        return None
    try:
        raw = _read_regular(side)
    except ValueError as exc:
        raise ValueError(f"{exc}; it is where the labels of {path} are read from") from None
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{side}: the sidecar of {path} is not valid JSON ({exc}); rewrite the record file "
                         f"with its labels, or remove {side.name} to read the records without labels") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{side}: the sidecar of {path} holds {type(meta).__name__}, not a JSON object")
    if "labels" in meta:
        meta["labels"] = _check_labels(meta["labels"], f"{side}: ")
    classes = meta.get("classes")
    if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
        raise ValueError(f"{side}: 'classes' must be a list of strings")
    want = meta.get("checksum")
    if want is not None and want != f"{checksum:016x}":
        raise ValueError(f"{side} belongs to another version of {path}: it was written with a record file whose "
                         f"checksum is {want}, and this one's is {checksum:016x} (a write of the two was "
                         "interrupted between their renames, or one was replaced alone). Rewrite the record "
                         f"file with its labels, or remove {side.name} to read the records without labels")
    return meta


def _check_labels(labels: Any, where: str = "") -> list[int]:
    """Labels as a list of ints; a float, a bool or anything else is refused
    (never truncated), naming its position."""
    if isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__"):
        raise ValueError(f"{where}labels must be a sequence of integers, not {type(labels).__name__}")
    if not isinstance(labels, (list, tuple)) and hasattr(labels, "__array__"):
        arr = np.asarray(labels)  # numpy or torch arrays: their dtype says it all
        if arr.ndim == 1 and np.issubdtype(arr.dtype, np.integer):
            return [int(x) for x in arr.astype(np.int64).tolist()]
    out = []
    for i, x in enumerate(labels):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise ValueError(f"{where}label {i} is {x!r}, not an integer: labels must be whole numbers "
                             "(class indices); refusing to truncate it")
        x = int(x)
        if not -(2**63) <= x < 2**63:
            raise ValueError(f"{where}label {i} is {x}, outside the 64-bit range")
        out.append(x)
    return out


def write_records(path: str | os.PathLike[str], items: Iterable[Any], *,
                  labels: Sequence[int] | None = None, classes: Sequence[str] | None = None,
                  progress: bool | None = None, total: int | None = None) -> RecordFile:
    """Write ``items`` (bytes-like objects) as a record file at ``path``.

    The file is written next to ``path`` and renamed over it only when
    complete (a symbolic link, a directory or a device at ``path`` is
    refused before anything is written). ``labels`` (one int per item) and
    ``classes`` go to the JSON sidecar ``<path>.json``, written with the
    file's checksum; everything is checked before either file is put in
    place, so a failure leaves both as they were. Returns the file opened.
    """
    return _write_records(path, items, labels=labels, classes=classes, progress=progress, total=total)


def _write_records(path: str | os.PathLike[str], items: Iterable[Any], *, labels: Sequence[int] | None,
                   classes: Sequence[str] | None, progress: bool | None, total: int | None,
                   extra: dict[str, Any] | None = None) -> RecordFile:
    from .._progress import progress_bar

    out = _check_output(path)
    label_list = None if labels is None else _check_labels(labels)
    class_list = None if classes is None else [str(c) for c in classes]
    side = _sidecar(out)
    with abort_on_sigterm():
        writer = _engine.RecordWriter(out)
        side_out = None
        try:
            n = 0
            with progress_bar(total=total, desc="records", unit="rec", show=progress) as bar:
                for item in items:
                    writer.add(item)
                    n += 1
                    bar.update(1)
            if label_list is not None and len(label_list) != n:
                raise ValueError(f"{len(label_list)} labels for {n} records: nothing was written "
                                 f"({out} and its sidecar are as they were)")
            checksum = writer.prepare()
            if label_list is not None or class_list is not None:
                meta: dict[str, Any] = {"records": n, "checksum": f"{checksum:016x}"}
                if class_list is not None:
                    meta["classes"] = class_list
                if label_list is not None:
                    meta["labels"] = label_list
                meta.update(extra or {})
                # The sidecar first, then the file: a crash between the two
                # renames leaves a new sidecar beside the old file, which
                # the checksum tells apart (RecordFile refuses the pair).
                side_out = _engine.OutFile(os.fspath(side), no_symlink=True)
                side_out.write(json.dumps(meta).encode())
                side_out.commit()
                side_out = None
                writer.finish()
            else:
                # No labels: the file first, then the old sidecar goes; a
                # crash between leaves the old sidecar, whose checksum (or
                # count) does not match the new file.
                writer.finish()
                if os.path.lexists(side):
                    side.unlink()
        except BaseException:
            writer.abort()
            if side_out is not None:
                side_out.abort()
            raise
    return RecordFile(out)


def _read_regular(path: Path) -> bytes:
    """A regular file's bytes. Anything else (a FIFO, a device, a socket, a
    link to one) is refused by what it is once opened, so nothing can block
    on it or read forever (a link to /dev/urandom named x.jpg)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file ({file_kind(st.st_mode)}): "
                             "remove it from the image folder, or move it out of the way")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def _scan_image_folder(base: Path, extensions: Sequence[str] | None, is_valid_file: Callable[[str], bool] | None,
                       follow_links: bool, allow_empty: bool) -> tuple[list[str], list[Path], list[int]]:
    """Classes, files and labels of an ImageFolder layout, numbered by the
    one rule :class:`opt4torch.ImageFolder` uses (torchvision's:
    :func:`opt4torch.sources.find_classes` and ``make_dataset``), with one
    refusal of our own: a file or folder that a symbolic link takes outside
    ``base`` is refused unless ``follow_links``, so that packing a folder
    never packs files from elsewhere."""
    classes, class_to_idx = find_classes(base)
    samples = make_dataset(base, class_to_idx, extensions=extensions, is_valid_file=is_valid_file,
                           allow_empty=allow_empty)
    if not samples:
        raise LayoutError(f"no image files under {base}: a record file of no records is not written")
    real_base = os.path.realpath(base)
    if not follow_links:
        for path, _ in samples:
            real = os.path.realpath(path)
            if os.path.commonpath([real, real_base]) != real_base:
                raise ValueError(f"{path} leads outside {base} (to {real}) through a symbolic link: "
                                 "refused, so that packing a folder never packs files from elsewhere; "
                                 "pass follow_links=True (opt4torch pack --follow-links) to pack it")
    return classes, [Path(p) for p, _ in samples], [label for _, label in samples]


def image_folder_to_records(root: str | os.PathLike[str], path: str | os.PathLike[str], *,
                            extensions: str | Sequence[str] | None = None,
                            progress: bool | None = None, follow_links: bool = False,
                            allow_empty: bool = False,
                            is_valid_file: Callable[[str], bool] | None = None) -> RecordFile:
    """Pack an image folder in the ``ImageFolder`` layout (``root/<class>/<file>``)
    into a record file: record ``i`` is the ``i``-th file's bytes as stored
    (still encoded), in class order then file name order, numbered as
    :class:`opt4torch.ImageFolder` and torchvision number the same tree (one
    rule: class folders whose names start with a dot are classes too;
    ``extensions``, default :data:`IMAGE_EXTENSIONS`, or ``is_valid_file``
    choose the files, as ``ImageFolder``'s do); the sidecar keeps the
    classes, each record's label and its source file. ``RecordFile(path)[i]`` is then ``(bytes, label)``.

    Unlike torchvision, which reads whatever the folder holds: a symbolic
    link that leads outside ``root`` is refused unless ``follow_links``;
    anything that is not a regular file (a FIFO, a device) is refused, naming
    it; empty (0-byte) files are packed, as torchvision lists them, with a
    warning naming them (they cannot be decoded). A class folder with no
    image is refused unless ``allow_empty``, as torchvision does."""
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"{base} is not a folder (expected root/<class>/<image files>)")
    classes, files, labels = _scan_image_folder(base, extensions, is_valid_file, follow_links, allow_empty)
    empty_files: list[Path] = []

    def contents() -> Iterable[bytes]:
        for f in files:
            data = _read_regular(f)
            if not data:
                empty_files.append(f)
            yield data

    rf = _write_records(path, contents(), labels=labels, classes=classes, progress=progress, total=len(files),
                        extra={"files": [os.fspath(f.relative_to(base)) for f in files]})
    if empty_files:
        shown = ", ".join(os.fspath(f) for f in empty_files[:5]) + (" ..." if len(empty_files) > 5 else "")
        warnings.warn(f"{len(empty_files)} empty (0-byte) image file(s) packed as empty records, as "
                      f"torchvision's ImageFolder lists them; decoding them will fail: {shown}",
                      stacklevel=2)
    return rf
