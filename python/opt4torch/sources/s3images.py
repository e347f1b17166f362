"""An image folder kept as objects, read in place (:class:`S3ImageFolder`):
listed once, each item one ranged GET of its object, optionally checked
against checksums recorded at construction.

May touch: the object store it is pointed at (GET, LIST; never a write).
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

import numpy as np

from .base import IMG_EXTENSIONS, EngineSource
from .local import bool_arg
from .s3access import ObjectStoreError, new_counts, refuse_items_past_memory, split_url
from .s3objects import ObjectDataset

__all__ = ["S3ImageFolder"]


class S3ImageFolder(ObjectDataset):
    """An image folder kept as objects: ``s3://bucket/prefix/<class>/**/<file>``.

    ``classes``, ``class_to_idx``, ``samples`` (``(key, label)`` pairs),
    ``targets`` and the order of items are what ``torchvision.datasets.ImageFolder``
    gives for the same tree on disk: classes are the first path component
    below the prefix, sorted; files sorted by folder, then name; kept when
    their name ends with one of :data:`opt4torch.sources.IMG_EXTENSIONS`,
    case-insensitively; objects directly under the prefix are not items; a
    class with no image is refused. ``ds[i]`` is ``(bytes, label)``, the
    object's bytes. The objects are listed and sized once, here; an object
    that is shorter when read fails that read, naming it.

    Where the store is, and who asks, as boto3 finds them, each overridable
    here: ``endpoint_url`` (else ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``,
    else AWS), ``region`` (else ``AWS_REGION``, ``AWS_DEFAULT_REGION``, else
    ``us-east-1``), credentials from the client's chain (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``; then the shared
    credentials and config files, with ``profile`` or ``AWS_PROFILE``; then
    the instance's role), or none with ``unsigned=True`` (a public bucket).
    ``path_style`` addresses the bucket in the path (default: with an
    ``endpoint_url``, as MinIO, Ceph or moto expect). ``max_attempts`` bounds
    the tries of a request (connection errors and 5xx are retried).

    Every GET of the engine's ends: a try slower than ``min_rate`` bytes a
    second (default 1024) over ``timeout`` seconds (default 60) fails and is
    tried again, and a GET, its tries included, fails after ``deadline``
    seconds (default 300), naming the object. Each GET sends the listed
    ETag as ``If-Match``, and its answer must carry exactly the bytes asked
    for (``Content-Range``, ``Content-Length``, the body) of an object of the
    listed size and ETag: an object changed since the listing raises
    :class:`ObjectStoreError` naming it, never returning other bytes.
    s3torchconnector's GETs (``client="s3torchconnector"``) are checked for
    their length only: its ``get_object`` takes no ``If-Match`` and shows no
    headers (1.5), and its waits are its own. ``ca_bundle`` (a PEM file)
    is what the engine's https GETs verify the store's certificate against
    (default: the system's CAs); the LIST is s3torchconnector's, which
    verifies against the system's.

    ``checksum=True`` fetches every object once, here, and records its
    XXH3-64 (as ``ImageFolder(checksum=True)`` does for files); every later
    read is checked against it, in C on the engine's GETs and in Python on
    s3torchconnector's, and one that differs raises :class:`ObjectStoreError`
    naming the item and the object. It is what verifies s3torchconnector's
    path, which can send no ``If-Match``; it costs a read of the dataset at
    construction (``info()["index_bytes"]``, not counted with the reads).

    ``latency`` (seconds) sleeps before every GET: an emulated slower store.
    ``info()`` counts ``reads``, ``bytes_read`` and ``requests`` (GETs and
    LIST pages) in shared memory, so DataLoader workers and the prefetch
    threads count into one place (``stats()["storage_bytes"]``).

    ``client`` says who makes the items' GETs: ``"auto"`` (the default) the
    engine's own, in C (libcurl, signed there), where the engine has them and
    the credentials are static ones (the environment's, a profile's keys in
    the shared files, or ``unsigned=True``) and no ``latency`` is set, else
    s3torchconnector; ``"c"`` the engine's or an error saying why not;
    ``"s3torchconnector"`` that client's. ``info()["client"]`` says which.

    Given to :class:`opt4torch.DataLoader`, its misses are prefetched by the
    C threads (``prefetch`` is on by default for it): with the engine's GETs
    they read the objects themselves, with no Python on the path; with
    s3torchconnector's, through the callback source, a thread calling
    ``ds[i]``, whose wait for the GET releases the GIL. It pickles to spawned
    and forkserver workers; each process makes its own client and
    connections on first use, never a forked one.
    """

    def __init__(self, url: str, *, endpoint_url: str | None = None, region: str | None = None,
                 profile: str | None = None, unsigned: bool = False, path_style: bool | None = None,
                 max_attempts: int = 3, latency: float = 0.0, client: str = "auto", timeout: float = 60.0,
                 deadline: float = 300.0, min_rate: int = 1024,
                 ca_bundle: str | os.PathLike[str] | None = None, checksum: bool = False) -> None:
        self.url = url
        self.checksum = bool_arg(checksum, "checksum")
        self._set_waits(timeout, deadline, min_rate, ca_bundle)
        bucket, self.prefix = split_url(url)
        self._setup(bucket, endpoint_url, region, profile, unsigned, path_style, max_attempts, latency, client)
        listed = self._list(self.prefix)
        listing = {k: size for k, (size, _) in listed.items()}
        if not listing:
            raise FileNotFoundError(f"no object under s3://{self.bucket}/{self.prefix} {self._where()}: "
                                    "expected s3://bucket/prefix/<class>/<image files>")
        self.classes, self.class_to_idx, self.samples = _image_folder(listing, self.prefix, self.url)
        self.imgs = self.samples
        self.targets = [label for _, label in self.samples]
        self._labels = np.asarray(self.targets, dtype=np.int64)
        self._sizes = np.asarray([listing[key] for key, _ in self.samples], dtype=np.int64)
        self._keys = [key for key, _ in self.samples]
        refuse_items_past_memory(self._sizes, self._keys, self.bucket)
        self._etags = [listed[key][1] for key in self._keys]
        #: Each object's XXH3-64 as fetched here (checksum=True), or None.
        self._sums: np.ndarray | None = None
        self.index_bytes = 0
        if self.checksum:
            self._record_sums()

    def _record_sums(self) -> None:
        """Fetch every object once and keep its XXH3-64. The fetches are not
        the run's reads: the counters and the readers start afresh after."""
        from .. import _engine

        sums = np.empty(len(self._keys), dtype=np.uint64)
        for i in range(len(self._keys)):
            sums[i] = _engine.checksum(self.read(i))
        self.index_bytes = int(self._sizes.sum())
        self._sums = sums
        self._counts = new_counts()
        self._reader, self._reader_pid, self._prefetch_reader = None, -1, None  # remade with the sums

    def __len__(self) -> int:
        return len(self._keys)

    def read(self, index: int) -> bytes:
        """Item ``index``'s bytes: one ranged GET of its object."""
        i = self._index(index)
        if self._uses_c():
            return self._read_item(i)
        raw = self._get(self._keys[i], 0, int(self._sizes[i]))
        # s3torchconnector's GET sends no If-Match: the checksum is what tells a
        # same-length replacement (checked in C on the engine's).
        if self._sums is not None:
            from .. import _engine

            if _engine.checksum(raw) != int(self._sums[i]):
                raise ObjectStoreError(f"item {i} (s3://{self.bucket}/{self._keys[i]}, {len(raw)} bytes) "
                                       f"{self._where()} does not match the checksum recorded when it was "
                                       "indexed: the object changed since (its GET could send no If-Match); "
                                       "nothing was returned; make the dataset again")
        return raw

    def _object_sizes(self) -> list[int]:
        return [int(n) for n in self._sizes]

    def _objects(self) -> tuple[list[str], np.ndarray]:
        n = len(self._keys)
        rows = np.zeros((n, 3), dtype=np.int64)
        rows[:, 0] = np.arange(n)
        rows[:, 2] = self._sizes
        return self._keys, rows

    def engine_source(self) -> EngineSource | None:
        """The C prefetcher's source when the GETs are the engine's: items
        stored as ``self[i]`` returns them; None: the Python callback."""
        reader = self._engine_reader()
        return None if reader is None else EngineSource(reader, frame="bytes", labels=self._labels)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        i = self._index(index)
        return self.read(i), int(self._labels[i])

    def opt4_item_bytes(self, index: int) -> int:
        """Bytes item ``index`` takes as read (opt4torch.DataLoader plans in bytes with these)."""
        return int(self._sizes[int(index)])

    def item_sizes(self) -> np.ndarray:
        """Every item's length in bytes, as an int64 array (from the listing)."""
        return self._sizes.copy()

    def info(self) -> dict[str, Any]:
        """Items, the bytes they hold, where they are, and the counters shared
        with the workers: ``reads`` and ``bytes_read`` (items read), and
        ``requests`` (GETs, failed ones too, and LIST pages)."""
        return {"count": len(self), "total_bytes": int(self._sizes.sum()), "prefix": self.prefix,
                "index_bytes": self.index_bytes, **self._info()}

    def __repr__(self) -> str:
        return (f"S3ImageFolder('s3://{self.bucket}/{self.prefix}', {len(self)} images, {len(self.classes)} classes, "
                f"{self._where()})")




def _image_folder(listing: dict[str, int], prefix: str, url: str) -> tuple[list[str], dict[str, int],
                                                                           list[tuple[str, int]]]:
    """torchvision's find_classes and make_dataset over keys: classes are the
    first components below the prefix of keys that have one; within a class,
    files in the order os.walk sorted would give (folder path, then name)."""
    by_class: dict[str, list[tuple[str, str, str]]] = {}
    for key in listing:
        rel = key[len(prefix):]
        if "/" not in rel or rel.endswith("/"):
            continue  # an object beside the classes, or a folder marker
        cls = rel.split("/", 1)[0]
        folder, name = posixpath.split(rel)
        entries = by_class.setdefault(cls, [])
        if name.lower().endswith(IMG_EXTENSIONS):
            entries.append((folder, name, key))
    if not by_class:
        raise FileNotFoundError(f"Couldn't find any class folder in {url} (expected <prefix>/<class>/<image files>)")
    classes = sorted(by_class)
    empty = [c for c in classes if not by_class[c]]
    if empty:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(empty)} in {url}. "
                                f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}")
    class_to_idx = {c: i for i, c in enumerate(classes)}
    samples: list[tuple[str, int]] = []
    for cls in classes:
        # os.walk yields a folder before its subfolders and torchvision sorts
        # the walk by path: so folders in path order, names sorted within.
        for _, _, key in sorted(by_class[cls], key=lambda e: (e[0], e[1])):
            samples.append((key, class_to_idx[cls]))
    return classes, class_to_idx, samples

