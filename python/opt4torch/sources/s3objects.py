"""What the object-store datasets share (:class:`ObjectDataset`): one
client per process, the shared counters, errors that name the request,
ranged GETs (the engine's in C, or s3torchconnector's), listing and the
expansion of shard patterns, pickling to worker processes.

May touch: the object store it is pointed at (GET, LIST; never a write) and
its client.
"""

from __future__ import annotations

import fnmatch
import multiprocessing
import multiprocessing.context
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from .base import checked_index
from .s3access import (CREDENTIAL_ENV, ObjectStoreError, client_module, counts_add, counts_get,
                       endpoint_of, folder_of, new_counts, region_of, split_object_url, static_credentials)
from .shardnames import expand_shards, has_glob

__all__ = ["ObjectDataset"]


class ObjectDataset:
    """What the object-store datasets share: where the store is, one client
    per process, the shared counters, errors that name the request, ranged
    GETs, pickling to worker processes."""

    # A Source (sources/base.py): it counts its reads, and the DataLoader
    # prefetches it by default, through the engine's GETs or the callback.

    #: Each object's ETag as listed, in the order of ``_objects()``' keys:
    #: every GET of the engine's sends it as If-Match.
    _etags: list[str]

    def _setup(self, bucket: str, endpoint_url: str | None, region: str | None, profile: str | None,
               unsigned: bool, path_style: bool | None, max_attempts: int, latency: float,
               client: str = "auto") -> None:
        if client not in ("auto", "c", "s3torchconnector"):
            raise ValueError(f"client must be 'auto', 'c' or 's3torchconnector', got {client!r}")
        self.client = client
        self.bucket = bucket
        self.endpoint_url = endpoint_of(endpoint_url)
        self.region = region_of(region)
        self.profile = profile
        self.unsigned = bool(unsigned)
        self.path_style = bool(self.endpoint_url is not None if path_style is None else path_style)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be a positive integer, got {max_attempts!r}")
        self.max_attempts = max_attempts
        self.latency = float(latency)
        if not self.latency >= 0:
            raise ValueError(f"latency must be a number of seconds >= 0, got {latency!r}")
        self._counts = new_counts()
        self._client: Any = None
        self._client_pid = -1
        self._client_lock = threading.Lock()
        self._reader: Any = None  # this process's C reader (_engine.S3Ranges), made on first use
        self._reader_pid = -1
        self._prefetch_reader: Any = None  # the C prefetcher's, counted in info()
        self._c_choice: tuple[int, bool] | None = None
        if client == "c":
            why = self._why_not_c()
            if why:
                raise ValueError(f"client='c' cannot read {self._where()}: {why}")

    # ---- the C reader (ranged GETs in the engine) ----

    def _why_not_c(self) -> str:
        """Why the items' GETs cannot be the engine's here ('' when they can)."""
        from .. import _engine

        if not getattr(_engine, "HAVE_S3", 0):
            return ("this build of the engine has no S3 reader (it needs libcurl and libcrypto when it is built: "
                    "apt install libcurl4-openssl-dev libssl-dev, then reinstall)")
        if self.latency:
            return "latency= is emulated by the Python client only"
        if not self.unsigned and static_credentials(self.profile) is None:
            return ("no static credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or the profile's keys in "
                    "~/.aws/credentials); an instance role or SSO is read by s3torchconnector only")
        return ""

    def _uses_c(self) -> bool:
        """Whether the items' GETs are the engine's (decided once a process)."""
        pid = os.getpid()
        if self._c_choice is None or self._c_choice[0] != pid:
            self._c_choice = (pid, self.client != "s3torchconnector" and not self._why_not_c())
        return self._c_choice[1]

    def _objects(self) -> tuple[list[str], np.ndarray]:
        """The objects' keys, and the items as int64 (object, offset, length) rows."""
        raise NotImplementedError

    def _new_reader(self) -> Any:
        """A C reader of every item, signed with the credentials found now."""
        from .. import _engine

        keys, rows = self._objects()
        creds = None if self.unsigned else static_credentials(self.profile)
        key, secret, token = creds if creds is not None else (None, None, None)
        # Each object's ETag and size as listed: every GET sends If-Match, and
        # an answer for another version, range, size or length is refused.
        return _engine.S3Ranges(self.endpoint_url, self.bucket, keys, np.ascontiguousarray(rows, dtype=np.int64),
                                region=self.region, access_key=key, secret_key=secret, session_token=token,
                                path_style=self.path_style, max_attempts=self.max_attempts, timeout=self.timeout,
                                deadline=self.deadline, min_rate=self.min_rate, etags=self._etags,
                                sizes=self._object_sizes(), ca_bundle=self.ca_bundle,
                                sums=getattr(self, "_sums", None))

    def _set_waits(self, timeout: float, deadline: float, min_rate: int,
                   ca_bundle: str | os.PathLike[str] | None = None) -> None:
        """The ends of the engine's GETs: a try slower than ``min_rate`` bytes
        a second over ``timeout`` seconds fails (and is tried again), and a
        GET, its tries included, ends after ``deadline`` seconds; and the CA
        certificates its https is verified against (None: the system's)."""
        if ca_bundle is not None and not os.path.isfile(ca_bundle):
            raise FileNotFoundError(f"ca_bundle {os.fspath(ca_bundle)!r} is not a file: give the PEM file of the "
                                    "CA certificates the store's certificate is verified against")
        self.ca_bundle = None if ca_bundle is None else os.path.abspath(os.fspath(ca_bundle))
        for name, value, top in (("timeout", timeout, 86400.0), ("deadline", deadline, 604800.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= top:
                raise ValueError(f"{name} must be a number of seconds in (0, {top:g}], got {value!r}")
        if isinstance(min_rate, bool) or not isinstance(min_rate, int) or not 1 <= min_rate <= 1 << 40:
            raise ValueError(f"min_rate must be an int of bytes a second in [1, 2**40], got {min_rate!r}")
        self.timeout, self.deadline, self.min_rate = float(timeout), float(deadline), min_rate

    def _object_sizes(self) -> list[int]:
        """Each object's size as listed."""
        raise NotImplementedError

    def _read_item(self, i: int) -> bytes:
        """Item i's bytes through this process's C reader (one ranged GET)."""
        pid = os.getpid()
        if self._reader is None or self._reader_pid != pid:
            with self._client_lock:
                if self._reader is None or self._reader_pid != pid:
                    self._reader = self._new_reader()
                    self._reader_pid = pid
        try:
            data = self._reader.read(i)
        except (OSError, ValueError) as exc:  # the engine's errors (its message names the GET and the store)
            counts_add(self._counts, 0, 0, 1)
            raise ObjectStoreError(str(exc).removeprefix("read item: ")) from None
        # A GET a read, as the Python client's are counted (a try again
        # inside the client is not another); none for an empty item.
        counts_add(self._counts, 1, len(data), 1 if data else 0)
        return cast(bytes, data)

    def _engine_reader(self) -> Any:
        """What the C prefetcher reads through when the GETs are the
        engine's (a reader of its own, counted in info()); None: through the
        Python callback."""
        if not self._uses_c():
            return None
        if self._prefetch_reader is None:
            self._prefetch_reader = self._new_reader()
        return self._prefetch_reader

    # ---- the client, one per process ----

    def _s3(self) -> tuple[Any, Any]:
        """This process's client (made on first use here, never inherited
        across fork) and the client's exception type."""
        S3Client, S3ClientConfig, S3Exception = client_module()
        pid = os.getpid()
        if self._client is None or self._client_pid != pid:
            with self._client_lock:
                if self._client is None or self._client_pid != pid:
                    config = S3ClientConfig(force_path_style=self.path_style, max_attempts=self.max_attempts,
                                            unsigned=self.unsigned, profile=self.profile)
                    self._client = S3Client(self.region, endpoint=self.endpoint_url, s3client_config=config)
                    self._client_pid = pid
        return self._client, S3Exception

    def _where(self) -> str:
        return f"at {self.endpoint_url or 'AWS S3'} (region {self.region})"

    def _error(self, what: str, exc: BaseException) -> ObjectStoreError:
        text = str(exc)
        hint = ""
        low = text.lower()
        if "bucket does not exist" in low:
            hint = f": the bucket {self.bucket!r} does not exist"
        elif "forbidden" in low or "access denied" in low or "accessdenied" in low or "signature" in low:
            hint = (": the store refused the credentials (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                    "AWS_PROFILE or profile=, or unsigned=True for a public bucket)")
        elif "connection refused" in low or "socket" in low or "timed out" in low or "throughput" in low:
            hint = ": the store did not answer (is the endpoint right, and the server up?)"
        elif "key does not exist" in low:
            hint = ": the object is gone (deleted since the listing?)"
        return ObjectStoreError(f"{what} {self._where()} failed{hint} [{type(exc).__name__}: {text}]")

    def _list(self, prefix: str) -> dict[str, tuple[int, str]]:
        """Every object under ``prefix``, key -> (size, ETag): one LIST (its pages)."""
        client, S3Exception = self._s3()
        out: dict[str, tuple[int, str]] = {}
        pages = 0
        try:
            for page in client.list_objects(self.bucket, prefix):
                pages += 1
                for obj in page.object_info:
                    out[obj.key] = (int(obj.size), str(obj.etag))
        except S3Exception as exc:
            raise self._error(f"listing s3://{self.bucket}/{prefix}", exc) from None
        finally:
            counts_add(self._counts, 0, 0, max(pages, 1))
        return out

    def _get(self, key: str, start: int, length: int, *, count: bool = True) -> bytes:
        """Bytes [start, start + length) of an object: one ranged GET."""
        if self.latency:
            time.sleep(self.latency)
        if length == 0:  # a range of nothing is not a request S3 answers (416)
            if count:
                counts_add(self._counts, 1, 0, 0)
            return b""
        client, S3Exception = self._s3()
        try:
            # S3Client._client is the native client of this process (made
            # anew after a fork); its get_object is the plain ranged GET,
            # where S3Client.get_object wraps it in a reader object (which
            # may HEAD the object for its size). A private name: the extra
            # pins the minor version (pyproject.toml).
            data = b"".join(client._client.get_object(self.bucket, key, start, start + length))
        except S3Exception as exc:
            counts_add(self._counts, 0, 0, 1)
            raise self._error(f"GET s3://{self.bucket}/{key} bytes {start}-{start + length - 1}", exc) from None
        counts_add(self._counts, 1 if count else 0, len(data) if count else 0, 1)
        if len(data) != length:
            raise ObjectStoreError(f"s3://{self.bucket}/{key} {self._where()} returned {len(data)} bytes where the "
                                   f"listing said {length} (from byte {start}): the object changed since the "
                                   "dataset was made")
        return data

    def _expand_urls(self, urls: str | Sequence[str], who: str, what: str,
                     ext: str) -> tuple[list[str], Callable[[str], dict[str, tuple[int, str]]]]:
        """Object URLs spelled as WebDataset spells shards (a list, ``::``,
        braces, a glob in the last part of a name), each folder listed once;
        the URLs, and the listing of a folder (key -> (size, ETag))."""
        listings: dict[str, dict[str, tuple[int, str]]] = {}

        def listing(folder: str) -> dict[str, tuple[int, str]]:
            if folder not in listings:
                listings[folder] = self._list(folder)
            return listings[folder]

        def exists(url: str) -> bool:
            bucket, key = split_object_url(url)
            return bucket == self.bucket and key in listing(folder_of(key))

        def match(url: str) -> list[str]:
            bucket, pattern = split_object_url(url)
            folder = folder_of(pattern)
            if bucket != self.bucket:
                return []
            if has_glob(folder):
                raise ValueError(f"{url!r}: a glob is matched against the objects of one folder of the {what}' "
                                 f"bucket, in the last part of the name only (s3://bucket/{what}/*{ext}); name "
                                 "other folders with braces ({a,b}) or list them")
            return [f"s3://{self.bucket}/{key}" for key in sorted(listing(folder))
                    if "/" not in key[len(folder):] and fnmatch.fnmatchcase(key, pattern)]

        expanded = expand_shards(urls, exists=exists, match=match)
        buckets = {split_object_url(u)[0] for u in expanded}
        if buckets != {self.bucket}:
            raise ValueError(f"{who} reads {what} of one bucket, got {', '.join(sorted(buckets))}")
        return expanded, listing

    def __len__(self) -> int:
        raise NotImplementedError

    def _index(self, index: int) -> int:
        return checked_index(index, len(self))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return [self[i] for i in indices]  # type: ignore[index]  # each dataset's own __getitem__

    def _info(self) -> dict[str, Any]:
        reads, bytes_read, requests = counts_get(self._counts)
        pf = self._prefetch_reader
        if pf is not None:  # the C prefetcher's GETs (its own reader, this process)
            c = pf.info()
            reads, bytes_read = reads + c["reads"], bytes_read + c["bytes_read"]
            requests += c["requests"] - c["retries"]
        return {"bucket": self.bucket, "endpoint": self.endpoint_url, "region": self.region,
                "client": "c (libcurl)" if self._uses_c() else "s3torchconnector", "latency": self.latency,
                "reads": reads, "bytes_read": bytes_read, "requests": requests}

    def set_latency(self, seconds: float) -> None:
        """Sleep this long before every GET from now on (0 for none), in this
        process and in workers started after."""
        self.latency = float(seconds)
        self._c_choice = None  # latency is the Python client's: the choice of client is made again

    # ---- pickling (spawned and forkserver workers) ----

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        state["_client_pid"] = -1
        state["_reader"] = None
        state["_reader_pid"] = -1
        state["_prefetch_reader"] = None
        state["_c_choice"] = None
        del state["_client_lock"]
        if multiprocessing.context.get_spawning_popen() is None:
            # Pickled for anything but a worker process (a file, a queue):
            # shared counters cannot go there; the copy counts on its own,
            # and no credentials go with it.
            state["_counts"] = None
        else:
            # Pickled for a worker process being started. A forkserver
            # child has the environment of the fork server, which may have
            # started before the credentials were set (os.environ changed
            # after the first forkserver DataLoader): its GETs would fail
            # with "No signing credentials". It gets the credential chain's
            # environment as this process has it now, as a spawned child
            # does by itself.
            state["_spawn_env"] = {name: os.environ.get(name) for name in CREDENTIAL_ENV}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in (state.pop("_spawn_env", None) or {}).items():
            if value is None:
                os.environ.pop(name, None)
            elif os.environ.get(name) != value:
                os.environ[name] = value
        self.__dict__.update(state)
        self._client_lock = threading.Lock()
        if self._counts is None:
            self._counts = new_counts()


