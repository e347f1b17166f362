"""Datasets kept in an S3-compatible object store, read in place by
byte-range GETs: an image folder (:class:`S3ImageFolder`) and WebDataset
tar shards (:class:`S3TarShards`).

:class:`S3ImageFolder` is :class:`opt4torch.ImageFolder` for objects: the
objects under ``s3://bucket/prefix/`` laid out as an image folder
(``prefix/<class>/**/<file>``), classes, labels and order as torchvision
numbers a folder, ``ds[i] == (bytes, label)``. The objects are listed once,
at construction (one LIST, paged, never a HEAD per object), which gives
every item's size, so the cache plans in bytes. Each read is one ranged GET
of the whole object.

Two clients, one protocol. The listing (and a tar shard's one-time fetch
for its index) is ``s3torchconnector``'s (AWS's connector for PyTorch, on the
AWS Common Runtime), an optional dependency (``pip install
opt4torchdataset[s3]``). The items' GETs are the engine's own where it can
(``client="auto"``, the default): ranged GETs made in C with libcurl, signed
there (``_engine.S3Ranges``, src/source/s3.c), so the C prefetch threads load
misses with no Python and no GIL on the path, at a fraction of the CPU a GET
costs through a Python client (docs/dependencies.md has the measurements).
It signs with static credentials, found as boto3 finds them: the
environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``), then the profile's in the shared credentials file,
or none (``unsigned=True``). Where those are not there (an instance role,
SSO), or the engine was built without libcurl, or ``latency`` is set, the
GETs are s3torchconnector's too, through the prefetcher's Python callback;
``client="s3torchconnector"`` asks for that, ``client="c"`` refuses to fall
back. ``info()["client"]`` says which one reads.

:class:`S3TarShards` is :class:`opt4torch.TarShards` for shards kept as
objects: each shard is indexed once by the same C indexer (one GET of the
whole shard into a temporary file), the index cached in the same JSON format
(checked against the object's size and ETag), and each sample is then one
ranged GET.

docs/sources.md, "The object store", has the details.

May touch: the object store it is pointed at (GET, LIST; never a write), its
client, the shard index cache on local disk.
"""

from __future__ import annotations

import fnmatch
import hashlib
import multiprocessing
import multiprocessing.context
import os
import posixpath
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from .shardnames import expand_shards, has_glob
from .base import IMG_EXTENSIONS, EngineSource, checked_index
from .local import bool_arg, check_tar, record_size, sample_sums
from .tarindex import load_index, write_index

__all__ = ["S3ImageFolder", "S3TarShards", "ObjectStoreError"]

#: What to install when the client is missing.
_INSTALL = "pip install 's3torchconnector>=1.5,<1.6'  (or: pip install 'opt4torchdataset[s3]')"


class ObjectStoreError(OSError):
    """A request to the object store failed: the message names the request,
    the object, the endpoint and what the store or the client said."""


_fork_hook_lock = threading.Lock()
_fork_hook_installed = False


def _client_module() -> Any:
    """s3torchconnector's client, imported on first use, with the fork order
    fixed (see below)."""
    global _fork_hook_installed
    try:
        from s3torchconnector._s3client import S3Client, S3ClientConfig
        from s3torchconnectorclient import S3Exception
    except ImportError as exc:
        raise ImportError(f"opt4torch.S3ImageFolder needs the S3 client s3torchconnector: {_INSTALL}") from exc
    with _fork_hook_lock:
        if not _fork_hook_installed:
            # s3torchconnector, before every fork, drops its native clients
            # and joins the runtime's threads. Its hook was registered at its
            # import, after opt4torch's (io/forksafe.py), and before-fork hooks
            # run newest first: so it would run while our C prefetch threads
            # may still be inside a GET. This hook, registered after it, runs
            # before it and parks those threads first (each finishes the call
            # it is in); opt4torch's own hook then finds them parked.
            from .. import _engine

            os.register_at_fork(before=_engine.prefetchers_park, after_in_parent=_engine.prefetchers_resume)
            _fork_hook_installed = True
    return S3Client, S3ClientConfig, S3Exception


#: The environment the client's credential chain reads, in the process that
#: makes the client. A worker process gets these as the process that pickled
#: the dataset had them (see ObjectDataset.__getstate__).
_CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                   "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED",
                   "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
                   "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                   "AWS_CONTAINER_AUTHORIZATION_TOKEN")


def _endpoint(explicit: str | None) -> str | None:
    """As boto3 finds it: the argument, else AWS_ENDPOINT_URL_S3, else
    AWS_ENDPOINT_URL, else AWS's own."""
    for value in (explicit, os.environ.get("AWS_ENDPOINT_URL_S3"), os.environ.get("AWS_ENDPOINT_URL")):
        if value:
            return value.rstrip("/")
    return None


def _region(explicit: str | None) -> str:
    for value in (explicit, os.environ.get("AWS_REGION"), os.environ.get("AWS_DEFAULT_REGION")):
        if value:
            return value
    return "us-east-1"


def _profile_credentials(profile: str | None) -> tuple[str, str, str | None] | None:
    """The profile's static keys in the shared credentials file (and the
    config file, where boto3 also looks), or None."""
    import configparser

    name = profile or os.environ.get("AWS_PROFILE") or "default"
    places = [(os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join("~", ".aws", "credentials"), name),
              (os.environ.get("AWS_CONFIG_FILE") or os.path.join("~", ".aws", "config"),
               name if name == "default" else f"profile {name}")]
    for path, section in places:
        parser = configparser.RawConfigParser()
        try:
            if not parser.read(os.path.expanduser(path)):
                continue
        except configparser.Error:
            continue
        if parser.has_section(section):
            def get(key: str, p: configparser.RawConfigParser = parser, s: str = section) -> str | None:
                return p.get(s, key, fallback=None) or None

            key, secret = get("aws_access_key_id"), get("aws_secret_access_key")
            if key and secret:
                return key, secret, get("aws_session_token")
    return None


def _static_credentials(profile: str | None) -> tuple[str, str, str | None] | None:
    """Static credentials as boto3 finds them first: the environment (unless
    a profile is named), then the profile's in the shared files. None where
    only a provider the C reader lacks would find them (instance role, SSO,
    a process or web-identity provider)."""
    if profile is None:
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if key and secret:
            return key, secret, os.environ.get("AWS_SESSION_TOKEN") or None
    return _profile_credentials(profile)


def _split_url(url: str) -> tuple[str, str]:
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ValueError(f"S3ImageFolder takes an s3://bucket/prefix URL, got {url!r}")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket (expected s3://bucket/prefix)")
    prefix = prefix.strip("/")
    return bucket, prefix + "/" if prefix else ""


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
        self.endpoint_url = _endpoint(endpoint_url)
        self.region = _region(region)
        self.profile = profile
        self.unsigned = bool(unsigned)
        self.path_style = bool(self.endpoint_url is not None if path_style is None else path_style)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be a positive integer, got {max_attempts!r}")
        self.max_attempts = max_attempts
        self.latency = float(latency)
        if not self.latency >= 0:
            raise ValueError(f"latency must be a number of seconds >= 0, got {latency!r}")
        self._counts = _new_counts()
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
        if not self.unsigned and _static_credentials(self.profile) is None:
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
        creds = None if self.unsigned else _static_credentials(self.profile)
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
            _counts_add(self._counts, 0, 0, 1)
            raise ObjectStoreError(str(exc).removeprefix("read item: ")) from None
        # A GET a read, as the Python client's are counted (a try again
        # inside the client is not another); none for an empty item.
        _counts_add(self._counts, 1, len(data), 1 if data else 0)
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
        S3Client, S3ClientConfig, S3Exception = _client_module()
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
            _counts_add(self._counts, 0, 0, max(pages, 1))
        return out

    def _get(self, key: str, start: int, length: int, *, count: bool = True) -> bytes:
        """Bytes [start, start + length) of an object: one ranged GET."""
        if self.latency:
            time.sleep(self.latency)
        if length == 0:  # a range of nothing is not a request S3 answers (416)
            if count:
                _counts_add(self._counts, 1, 0, 0)
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
            _counts_add(self._counts, 0, 0, 1)
            raise self._error(f"GET s3://{self.bucket}/{key} bytes {start}-{start + length - 1}", exc) from None
        _counts_add(self._counts, 1 if count else 0, len(data) if count else 0, 1)
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
        reads, bytes_read, requests = _counts_get(self._counts)
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
            state["_spawn_env"] = {name: os.environ.get(name) for name in _CREDENTIAL_ENV}
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
            self._counts = _new_counts()


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
        bucket, self.prefix = _split_url(url)
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
        _refuse_items_past_memory(self._sizes, self._keys, self.bucket)
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
        self._counts = _new_counts()
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


def one_bucket(urls: str | Sequence[str], who: str, what: str) -> str:
    """The one bucket of ``urls``, checked before anything is listed: the
    parts as written (a pattern's bucket is not expanded)."""
    buckets = {_split_url(u)[0] for u in (urls.split("::") if isinstance(urls, str) else urls)}
    if len(buckets) != 1:
        raise ValueError(f"{who} reads {what} of one bucket, got {', '.join(sorted(buckets))}")
    return buckets.pop()


def folder_of(key: str) -> str:
    """The folder part of a key, with its slash ("" at the top): what is listed."""
    return key.rsplit("/", 1)[0] + "/" if "/" in key else ""


def split_object_url(url: str) -> tuple[str, str]:
    bucket, prefix = _split_url(url)
    key = url[len("s3://") + len(bucket) + 1:]
    if not key or key.endswith("/"):
        raise ValueError(f"{url!r} names no object (expected s3://bucket/path/shard-000.tar)")
    return bucket, key


# ---- counters shared by the processes (fork: inherited; spawn: sent) ----

def _new_counts() -> Any:
    # Made in the spawn context: a lock made in the fork context refuses to
    # be sent to spawned or forkserver workers; this one is sent to those
    # and inherited by forked ones.
    return multiprocessing.get_context("spawn").Array("q", 3)


def _counts_add(counts: Any, reads: int, nbytes: int, requests: int) -> None:
    with counts.get_lock():
        counts[0] += reads
        counts[1] += nbytes
        counts[2] += requests


def _counts_get(counts: Any) -> tuple[int, int, int]:
    with counts.get_lock():
        return int(counts[0]), int(counts[1]), int(counts[2])


def _refuse_items_past_memory(sizes: np.ndarray, keys: Sequence[str], bucket: str) -> None:
    """Refuse, naming it, an object listed larger than this machine's memory:
    an item is read whole into memory, so the first read of it would end in
    a bare MemoryError (a listing that lies, or the wrong prefix)."""
    if not len(sizes):
        return
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    k = int(np.argmax(sizes))
    if int(sizes[k]) > memory:
        raise ValueError(f"s3://{bucket}/{keys[k]} is listed as {int(sizes[k]):,} bytes, more than this machine's "
                         f"memory ({memory:,} bytes): an item is read whole into memory, so it cannot be one; "
                         "check the prefix, or the store's listing")


# ---- the image-folder layout, from a listing ----

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
