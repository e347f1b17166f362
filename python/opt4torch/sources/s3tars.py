"""WebDataset tar shards kept as objects, read in place
(:class:`S3TarShards`): each shard indexed once (one GET into a temporary
file, the C indexer, the index cached on local disk), each sample then one
ranged GET.

May touch: the object store it is pointed at (GET, LIST; never a write), the
shard index cache on local disk.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import EngineSource
from .local import bool_arg, check_tar, record_size, sample_sums
from .s3access import ObjectStoreError, folder_of, one_bucket, split_object_url
from .s3objects import ObjectDataset
from .tarindex import load_index, write_index

__all__ = ["S3TarShards"]


class S3TarShards(ObjectDataset):
    """WebDataset tar shards kept as objects (``s3://bucket/.../shard-000.tar``),
    read in place: ``ds[i]`` is sample ``i``, ``{"__key__": key, "<field>":
    bytes, ...}``, exactly as :class:`opt4torch.TarShards` gives for the same
    shards on disk (samples numbered shard after shard in the order of
    ``urls``; all in one bucket).

    Each shard is indexed once by the same C indexer as ``TarShards`` (the
    shard is fetched whole, once, into a temporary file in ``cache_dir``, and
    deleted after), and the index cached in ``cache_dir`` (default
    ``~/.cache/opt4torch``) in the same format, used only while the object
    has the size and ETag it was made from. The shards' sizes and ETags come
    from one LIST per folder of shards. Each sample is then one ranged GET
    (its members' data and the headers between them), cut into its fields.
    ``info()["index_bytes"]`` counts what indexing fetched; it is not counted
    as reads.

    ``checksum=True`` records each sample's XXH3-64 in the index, from the
    fetched copy it is made from (a cached index without them is made again),
    and checks every GET's bytes against it: with the engine's GETs in C,
    after the ``If-Match``, range and length checks; with s3torchconnector's,
    whose GETs can send no ``If-Match``, in Python after the length check.
    A sample whose bytes differ raises :class:`ObjectStoreError` naming it.

    Where the store is and who asks, ``latency``, ``client`` and the counters: as
    :class:`S3ImageFolder`.
    """

    def __init__(self, urls: str | Sequence[str], *, cache_dir: str | os.PathLike[str] | None = None,
                 endpoint_url: str | None = None, region: str | None = None, profile: str | None = None,
                 unsigned: bool = False, path_style: bool | None = None, max_attempts: int = 3,
                 latency: float = 0.0, client: str = "auto", timeout: float = 60.0, deadline: float = 300.0,
                 min_rate: int = 1024, ca_bundle: str | os.PathLike[str] | None = None,
                 checksum: bool = False) -> None:
        self._set_waits(timeout, deadline, min_rate, ca_bundle)
        self.checksum = bool_arg(checksum, "checksum")
        sums: list[np.ndarray] = []
        if not isinstance(urls, str) and not urls:
            raise ValueError("S3TarShards needs at least one shard")
        self._setup(one_bucket(urls, "S3TarShards", "shards"), endpoint_url, region, profile, unsigned, path_style,
                    max_attempts, latency, client)
        self.urls, listing = self._expand_urls(urls, "S3TarShards", "shards", ".tar")
        places = [split_object_url(u) for u in self.urls]
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else os.path.join(
            os.path.expanduser("~"), ".cache", "opt4torch")
        self._shard_keys = [k for _, k in places]
        self._etags: list[str] = []
        self._shard_sizes: list[int] = []
        self.index_bytes = 0
        self.keys: list[str] = []
        self._members: list[tuple[tuple[str, int, int], ...]] = []
        rows: list[tuple[int, int, int]] = []
        for k, key in enumerate(self._shard_keys):
            if key not in listing(folder_of(key)):
                raise FileNotFoundError(f"no object s3://{self.bucket}/{key} {self._where()} (a tar shard)")
            size, etag = listing(folder_of(key))[key]
            self._etags.append(etag)
            self._shard_sizes.append(size)
            for skey, off, length, members in self._shard_index(key, size, etag, sums):
                self.keys.append(skey)
                self._members.append(tuple((f, o, n) for f, o, n in members))
                rows.append((k, off, length))
        self._rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
        #: Each sample's XXH3-64 as indexed (checksum=True), or None.
        self._sums = (np.concatenate(sums) if sums else np.zeros(0, np.uint64)) if self.checksum else None

    def _shard_index(self, key: str, size: int, etag: str, sums: list[np.ndarray]) -> list[Any]:
        """The shard's samples from its cached index when that is current
        (and holds checksums, with checksum=True), else from the C indexer
        over the shard fetched once (then cached); with checksum=True, their
        XXH3-64 appended to ``sums``."""
        from .. import _engine

        url = f"s3://{self.bucket}/{key}"
        ident = {"url": url, "endpoint": self.endpoint_url or "", "size": size, "etag": etag}
        tag = hashlib.sha256(f"{self.endpoint_url}|{self.bucket}|{key}".encode("utf-8", "surrogatepass")).hexdigest()
        where = os.path.join(self.cache_dir, f"{posixpath.basename(key)}-{tag[:16]}.opt4idx.json")
        got = load_index(where, url, ident)
        if got is not None and (got[1] is not None or not self.checksum):
            samples, have = got
            if self.checksum and have is not None:
                sums.append(have)
            return samples
        os.makedirs(self.cache_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.cache_dir, prefix=".opt4-shard-", suffix=".tar") as tmp:
            step = 64 << 20
            for start in range(0, size, step):
                tmp.write(self._get(key, start, min(step, size - start), count=False))
            tmp.flush()
            self.index_bytes += size
            check_tar(tmp.name, url, in_store=True)
            try:
                samples = _engine.tar_index(tmp.name)
                have = sample_sums(tmp.name, samples, None) if self.checksum else None
            except Exception as exc:  # the indexer names the temporary file: name the object
                raise ValueError(f"tar shard {url}: {exc}".replace(tmp.name, url)) from None
        write_index(where, url, ident, samples, have)
        if have is not None:
            sums.append(have)
        return samples

    def __len__(self) -> int:
        return int(self._rows.shape[0])

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = self._index(index)
        if self._uses_c():
            raw = self._read_item(i)
        else:
            shard, off, length = (int(x) for x in self._rows[i])
            raw = self._get(self._shard_keys[shard], off, length)
            # s3torchconnector's GET sends no If-Match: the checksum is what
            # tells a same-length replacement (checked in C on the engine's).
            from .. import _engine

            if self._sums is not None and _engine.checksum(raw) != int(self._sums[i]):
                raise ObjectStoreError(f"sample {i} ({self.keys[i]!r}, {length} bytes at {off} of "
                                       f"s3://{self.bucket}/{self._shard_keys[shard]}) {self._where()} does not "
                                       "match the checksum recorded when it was indexed: the object changed since "
                                       "(its GET could send no If-Match); nothing was returned; make the dataset "
                                       "again")
        sample: dict[str, Any] = {"__key__": self.keys[i]}
        for field, moff, msize in self._members[i]:
            sample[field] = raw[moff:moff + msize]
        return sample

    def _objects(self) -> tuple[list[str], np.ndarray]:
        return self._shard_keys, self._rows

    def _object_sizes(self) -> list[int]:
        return list(self._shard_sizes)

    def engine_source(self) -> EngineSource | None:
        """As TarShards': each sample laid out as the codec stores the dict
        ``self[i]`` (frame ``"tar"``), from one GET of its range; None: the
        Python callback."""
        reader = self._engine_reader()
        return None if reader is None else EngineSource(reader, frame="tar", samples=(self.keys, self._members))

    def opt4_item_bytes(self, index: int) -> int:
        """Bytes sample ``index`` takes in the cache: its record, as the
        codec stores the dict ``self[index]`` (as TarShards')."""
        i = self._index(index)
        return record_size(self.keys[i], self._members[i])

    def item_sizes(self) -> np.ndarray:
        """Every sample's read length in bytes (its range of the shard), as an int64 array."""
        return self._rows[:, 2].copy()

    def info(self) -> dict[str, Any]:
        """Samples, shards, where they are, what indexing fetched
        (``index_bytes``, this process), and the counters shared with the
        workers (as :meth:`S3ImageFolder.info`)."""
        return {"count": len(self), "shards": len(self.urls), "total_bytes": int(self._rows[:, 2].sum()),
                "index_bytes": self.index_bytes, **self._info()}

    def __repr__(self) -> str:
        return f"S3TarShards({len(self.urls)} shards, {len(self)} samples, {self._where()})"


