"""The real alternatives in the end-to-end comparison (issue 19): MosaicML
Streaming, LitData, the earlier OPT4TorchDataSet v1.1.0, and this package's
compat layer for that API, each driven through its own documented API over
the same images that :mod:`opt4torch.lab.e2e` trains on.

Nothing here is imported by ``import opt4torch`` or by :mod:`.e2e` until a
peer configuration runs, and every peer package is imported inside the
function that needs it: the runtime never depends on them. A configuration
whose package (or, for v1.1.0, whose source checkout) is missing is skipped
with a line that says why (:func:`unavailable`).

The store. The record-file configurations pay ``latency + mean record /
bandwidth`` per read, emulated in C (:mod:`.e2e`). Streaming and LitData read
their own shard formats, fetched from a "remote" that is a local directory
through their own local-filesystem downloaders; :class:`_Store` makes every
such fetch pay ``latency + bytes / bandwidth`` (one request: a whole shard, its
index file, or, for LitData, a byte range) and counts requests and bytes in
memory shared with the forked workers. The peers' local caches are theirs:
shard files on the local disk, read through the page cache, as their
documentation sets them up.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["PEERS", "SHARDED", "STREAMING", "STREAMING_TUNED", "LITDATA", "V11", "COMPAT", "unavailable",
           "prepare", "make_loader"]

STREAMING = "Streaming"
STREAMING_TUNED = "Streaming (tuned)"
LITDATA = "LitData"
V11 = "OPT4TorchDataSet v1.1.0"
COMPAT = "OPT4TorchDataSet API (compat)"
#: The peer configurations, in the order the tables list them.
PEERS = (STREAMING, STREAMING_TUNED, LITDATA, V11, COMPAT)
#: Peers that read their own shard formats, in their own order (their shuffle).
SHARDED = (STREAMING, STREAMING_TUNED, LITDATA)
#: The peers' default shard size (Streaming's ``MDSWriter(size_limit=1 << 26)``;
#: LitData's documentation uses ``chunk_bytes="64MB"``).
DEFAULT_SHARD_BYTES = 1 << 26
#: What the v1.1.0 checkout must hold.
_V11_PACKAGE = os.path.join("src", "OPT4TorchDataSet")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def unavailable(name: str, setup: Any, sampler: str | None = None) -> str | None:
    """Why configuration ``name`` cannot run here (None: it can)."""
    if name in (STREAMING, STREAMING_TUNED) and not _has("streaming"):
        return "mosaicml-streaming is not installed (make bench-env makes .venv-bench with it)"
    if name == LITDATA and not _has("litdata"):
        return "litdata is not installed (make bench-env makes .venv-bench with it)"
    if name in (V11, COMPAT) and not _has("safetensors"):
        return "safetensors is not installed (pip install 'opt4torchdataset[compat]')"
    if name == V11:
        src = getattr(setup, "v11_src", "") or ""
        if not src:
            return "no OPT4TorchDataSet v1.1.0 checkout given (--v11-src PATH; docs/e2e.md says how)"
        if not os.path.isfile(os.path.join(src, _V11_PACKAGE, "__init__.py")):
            return f"{src} holds no {_V11_PACKAGE}/__init__.py: not an OPT4TorchDataSet checkout"
    if name in SHARDED and sampler is not None and sampler != "shuffle":
        return (f"{name} shuffles with its own algorithm and has no per-sample weighted sampler; "
                f"it runs under epoch shuffle only")
    return None


# ---- the store the sharded peers fetch from ----


class _Store:
    """Counters (requests, bytes) in memory shared with forked workers, and
    the cost of one request: ``latency + nbytes / bandwidth``."""

    def __init__(self, latency: float, bandwidth: float) -> None:
        self.latency, self.bandwidth = float(latency), float(bandwidth)
        self._counts = np.frombuffer(mmap.mmap(-1, 16), dtype=np.int64)

    def cost(self, nbytes: int) -> float:
        return self.latency + (nbytes / self.bandwidth if self.bandwidth > 0 else 0.0)

    def count(self, nbytes: int) -> None:
        # Two words, each added to by one process at a time in practice;
        # a rare lost update would only undercount, never add.
        self._counts[0] += 1
        self._counts[1] += int(nbytes)

    def pay(self, nbytes: int) -> None:
        self.count(nbytes)
        time.sleep(self.cost(nbytes))

    def counts(self) -> tuple[int, int]:
        return int(self._counts[0]), int(self._counts[1])


_STORE: _Store | None = None


def _install_streaming_store(store: _Store) -> None:
    """Streaming picks its downloader by the remote's URL scheme from
    ``DOWNLOADER_MAPPINGS``; a plain path (scheme ``''``) gets its
    ``LocalDownloader``. This subclass copies the same way after paying."""
    from streaming.base.storage import download

    class SlowLocalDownloader(download.LocalDownloader):
        def _download_file_impl(self, remote: str, local: str, timeout: float) -> None:
            store.pay(os.path.getsize(remote))
            super()._download_file_impl(remote, local, timeout)

    download.DOWNLOADER_MAPPINGS[""] = SlowLocalDownloader


def _install_litdata_store(store: _Store) -> None:
    """LitData picks its downloader by prefix (``register_downloader``); a
    ``local:`` input directory gets ``LocalDownloaderWithCache``, which copies
    chunks into the cache directory. Registered over it: the same, after paying."""
    import asyncio

    from litdata.streaming import downloader as dl

    class SlowLocalDownloader(dl.LocalDownloaderWithCache):
        def download_file(self, remote_filepath: str, local_filepath: str) -> None:
            path = remote_filepath.replace("local:", "")
            if os.path.exists(path) and not os.path.exists(local_filepath):
                store.pay(os.path.getsize(path))
            super().download_file(remote_filepath, local_filepath)

        async def adownload_bytes(self, remote_filepath: str, offset: int, length: int,
                                  local_chunkpath: str) -> bytes:
            store.count(length)
            await asyncio.sleep(store.cost(length))
            return await super().adownload_bytes(remote_filepath.replace("local:", ""), offset, length,
                                                 local_chunkpath)

        async def adownload_fileobj(self, remote_filepath: str) -> bytes:
            path = remote_filepath.replace("local:", "")
            n = os.path.getsize(path)
            store.count(n)
            await asyncio.sleep(store.cost(n))
            return await super().adownload_fileobj(path)

    dl.register_downloader("local:", SlowLocalDownloader, overwrite=True)


# ---- conversion to the peers' formats (once per data set, timed) ----


def shard_bytes(setup: Any, total_bytes: int) -> int:
    """The peers' default shard size, made smaller when the cache budget
    would hold fewer than 8 shards (a small run): a shard larger than the
    budget cannot be cached at all."""
    if getattr(setup, "shard_bytes", 0):
        return int(setup.shard_bytes)
    budget = int(setup.capacity * total_bytes)
    return int(max(1 << 16, min(DEFAULT_SHARD_BYTES, budget // 8)))


def _records(path: str) -> tuple[list[bytes], np.ndarray]:
    from ..sources.records import RecordFile

    rf = RecordFile(path)
    try:
        data = [rf[i][0] for i in range(len(rf))]
        labels = np.asarray(rf.labels)
    finally:
        rf.close()
    return data, labels


def _converted(out: str, desc: dict[str, Any]) -> bool:
    stamp = out + ".made"
    if os.path.isdir(out) and os.path.exists(stamp):
        with open(stamp) as f:
            return json.load(f).get("desc") == desc
    return False


def _stamp(out: str, desc: dict[str, Any], seconds: float) -> None:
    with open(out + ".made", "w") as f:
        json.dump({"desc": desc, "seconds": seconds}, f)


def _convert_streaming(path: str, out: str, size_limit: int) -> None:
    from streaming import MDSWriter

    data, labels = _records(path)
    with MDSWriter(out=out, columns={"jpeg": "bytes", "label": "int"}, size_limit=size_limit) as w:
        for b, y in zip(data, labels.tolist()):
            w.write({"jpeg": b, "label": int(y)})


class _RecordItem:
    """``litdata.optimize``'s ``fn``: input ``i`` -> record ``i`` as a
    sample dict. Picklable (its workers are spawned): the record file is
    opened in the worker, on first use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._rf: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_rf": None}

    def __call__(self, i: int) -> dict[str, Any]:
        if self._rf is None:
            from ..sources.records import RecordFile

            self._rf = RecordFile(self.path)
        data, label = self._rf[i]
        return {"jpeg": data, "label": int(label)}


def _convert_litdata(path: str, out: str, chunk_bytes: int) -> None:
    import litdata

    from ..sources.records import RecordFile

    rf = RecordFile(path)
    n = len(rf)
    rf.close()
    litdata.optimize(fn=_RecordItem(path), inputs=list(range(n)), output_dir=out, chunk_bytes=chunk_bytes,
                     num_workers=1, mode="overwrite")


def _build_v11(src: str, data_dir: str) -> None:
    """v1.1.0 builds its C++ extension on first use with
    ``torch.utils.cpp_extension.load`` (g++, ninja); done here in a process of
    its own, into ``data_dir/v11-build`` (TORCH_EXTENSIONS_DIR), so that
    training processes only load it, and so that the two OPT4TorchDataSet
    packages (v1.1.0's and the compat layer) never meet in one process."""
    code = ("import sys; from opt4torch.lab.peers import _import_v11; "
            "_import_v11(sys.argv[1], sys.argv[2]).atomic_extension._load_ext()")
    r = subprocess.run([sys.executable, "-c", code, src, data_dir], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building OPT4TorchDataSet v1.1.0's extension from {src} failed:\n{r.stderr[-4000:]}")


def prepare(name: str, path: str, setup: Any, data_dir: str,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Convert the record file at ``path`` to ``name``'s format (or build
    v1.1.0's extension), once per data set; the time it took, reported apart
    from training."""
    from ..sources.records import RecordFile

    rf = RecordFile(path)
    total = int(rf.item_sizes().sum())
    rf.close()
    base = os.path.join(data_dir, os.path.splitext(os.path.basename(path))[0])
    if name in SHARDED:
        sb = shard_bytes(setup, total)
        mds = name in (STREAMING, STREAMING_TUNED)
        out = f"{base}.{'mds' if mds else 'litdata'}-{sb}"
        desc = {"records": os.path.abspath(path), "mtime": os.path.getmtime(path), "shard_bytes": sb}
        if not _converted(out, desc):
            if os.path.isdir(out):
                shutil.rmtree(out)
            t0 = time.perf_counter()
            (_convert_streaming if mds else _convert_litdata)(path, out, sb)
            _stamp(out, desc, time.perf_counter() - t0)
            log(f"converted {path} to {name}'s format in {out}/ ({time.perf_counter() - t0:.1f} s)")
        with open(out + ".made") as f:
            seconds = json.load(f)["seconds"]
        files = [os.path.join(out, f) for f in os.listdir(out)]
        return {"what": f"{'MDSWriter' if mds else 'litdata.optimize'} "
                        f"(shards of at most {sb / 2**20:.1f} MiB)",
                "dir": out, "seconds": seconds, "shard_bytes": sb,
                "shards": sum(1 for f in files if not f.endswith(".json")),
                "bytes": sum(os.path.getsize(f) for f in files)}
    if name == V11:
        build = os.path.join(data_dir, "v11-build")
        os.makedirs(build, exist_ok=True)
        t0 = time.perf_counter()
        _build_v11(os.path.abspath(setup.v11_src), data_dir)
        seconds = time.perf_counter() - t0
        log(f"built OPT4TorchDataSet v1.1.0's C++ extension from {setup.v11_src} into {build}/ ({seconds:.1f} s)")
        return {"what": "its C++ extension, built by torch.utils.cpp_extension.load with -std=c++20 in place "
                        "of its -std=c++17, which torch 2.14's headers refuse (a no-op when already built)",
                "dir": build, "seconds": seconds, "crc": _checksums(path, base)}
    if name == COMPAT:
        return {"crc": _checksums(path, base)}
    return {}


def _checksums(path: str, base: str) -> str:
    """Each record's CRC-32 (``base.crc32.npy``, made once): v1.1.0 and the
    compat layer hand back what their pools hold, and every sample they
    return is checked against it."""
    out = base + ".crc32.npy"
    if not (os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(path)):
        data, _ = _records(path)
        np.save(out, np.fromiter((zlib.crc32(b) for b in data), dtype=np.uint32, count=len(data)))
    return out


# ---- the loaders ----


class _Peer:
    """What a peer configuration reports after training."""

    def __init__(self, name: str, store: _Store | None = None, cleanup: Callable[[], None] | None = None) -> None:
        self.name, self.store, self.cleanup = name, store, cleanup
        self.cache: Any = None
        self.dataset: Any = None

    def counters(self, samples: int, accessed_bytes: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.store is not None:
            requests, nbytes = self.store.counts()
            # A shard brings many samples: the hit rate is the share of the
            # accessed bytes that were not fetched from the store.
            out.update(storage_reads=requests, storage_bytes=nbytes, stall_rate=None,
                       hits=None, hit_rate=max(0.0, 1.0 - nbytes / max(1, accessed_bytes)),
                       hit_rate_note="bytes")
        elif self.cache is not None:
            st = self.cache.stats()
            out.update(peer_stats={k: v for k, v in st.items() if isinstance(v, (int, float, str))})
            if self.dataset is not None:
                out.update(wrong_samples=int(self.dataset.wrong[0]), undecodable_samples=int(self.dataset.wrong[1]))
        if self.cleanup is not None:
            self.cleanup()
        return out


class _V11Records:
    """A map-style dataset as a v1.1.0 user writes it for a shared pool of
    fixed-shape tensors: ``load(i)`` returns record ``i`` as a uint8 tensor of
    ``slot`` bytes (8 bytes of length, 8 of label, the JPEG, zero padding),
    decorated by the cache; ``__getitem__`` unpacks it and applies the
    transform after the cache."""

    def __init__(self, rf: Any, slot: int, transform: Callable[[Any], Any], crc: np.ndarray | None = None) -> None:
        self.rf, self.slot, self.transform = rf, slot, transform
        self.load: Callable[[int], Any] = self._load
        self.crc = crc
        # Wrong samples returned (checksum or label differ from the record),
        # and of those, the ones that did not even decode: shared with workers.
        self.wrong = np.frombuffer(mmap.mmap(-1, 16), dtype=np.int64)

    def _load(self, i: int) -> Any:
        import torch

        data, label = self.rf[i]
        buf = np.zeros(self.slot, dtype=np.uint8)
        buf[:16].view(np.int64)[:] = (len(data), label)
        buf[16:16 + len(data)] = np.frombuffer(data, dtype=np.uint8)
        return torch.from_numpy(buf)

    def __len__(self) -> int:
        return len(self.rf)

    def __getitem__(self, i: int) -> Any:
        t = self.load(i)
        head = t[:16].numpy().view(np.int64)
        n, label = int(head[0]), int(head[1])
        sample = (t[16:16 + max(0, n)].numpy().tobytes(), label)
        if self.crc is not None and (zlib.crc32(sample[0]) != int(self.crc[i])
                                     or label != int(self.rf.labels[i])):
            self.wrong[0] += 1
            try:
                return self.transform(sample)  # what the user's training gets
            except Exception:
                # It does not decode: the user's run would stop here. Counted,
                # and the record is read again so that the benchmark can finish.
                self.wrong[1] += 1
                sample = self.rf[i]
        return self.transform(sample)


def _import_v11(src: str, data_dir: str) -> Any:
    """The OPT4TorchDataSet package of the v1.1.0 checkout, ahead of the
    compat package of the same name installed with opt4torch.

    One change to how it is built, none to its code: its ``_load_ext``
    compiles ``cpp/atomic_ext.cpp`` with ``-std=c++17``, and torch 2.14's
    headers stop with "C++20 or later compatible compiler is required". The
    same source is compiled here with ``-std=c++20`` under the same
    extension name, and its module's ``_load_ext`` returns that."""
    if "OPT4TorchDataSet" in sys.modules:
        raise RuntimeError("OPT4TorchDataSet is already imported in this process; v1.1.0 runs in a fresh one")
    from functools import lru_cache

    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(os.path.abspath(data_dir), "v11-build")
    root = os.path.join(os.path.abspath(src), "src")
    sys.path.insert(0, root)
    import OPT4TorchDataSet.atomic_extension as ax

    source = os.path.join(root, "OPT4TorchDataSet", "cpp", "atomic_ext.cpp")

    @lru_cache(maxsize=1)
    def load_ext() -> Any:
        from torch.utils.cpp_extension import load

        return load(name="opt4_atomic_ext", sources=[source], extra_cflags=["-std=c++20"], verbose=False)

    ax._load_ext = load_ext
    import OPT4TorchDataSet

    if getattr(OPT4TorchDataSet, "__version__", "") != "1.1.0" or "opt4torch" in OPT4TorchDataSet.__file__:
        raise RuntimeError(f"{src} did not give OPT4TorchDataSet 1.1.0 (got {OPT4TorchDataSet.__file__})")
    return OPT4TorchDataSet


def make_loader(name: str, sampler: Any, seq: np.ndarray, rf: Any, setup: Any, data_dir: str,
                transform: Callable[[Any], Any], common: dict[str, Any], prepared: dict[str, Any],
                budget_bytes: int) -> tuple[Any, _Peer]:
    """The DataLoader of peer configuration ``name``, built as its
    documentation shows, and the object that reports its counters."""
    import tempfile

    global _STORE
    s3 = setup.store == "s3"
    if name in SHARDED:
        # Over S3 the server charges and counts every fetch; over a local
        # remote, the downloaders installed here do.
        store = None if s3 else _Store(setup.latency, setup.bandwidth)
        _STORE = store
        cache_dir = tempfile.mkdtemp(prefix=f"{name.lower()}-cache-", dir=data_dir)
        if name in (STREAMING, STREAMING_TUNED):
            from streaming import StreamingDataset
            from streaming.base.util import clean_stale_shared_memory

            clean_stale_shared_memory()
            if store is not None:
                _install_streaming_store(store)

            class Images(StreamingDataset):  # the subclassing Streaming's docs show for transforms
                def __getitem__(self, idx: int) -> Any:
                    obj = super().__getitem__(idx)
                    return transform((obj["jpeg"], obj["label"]))

            extra: dict[str, int] = {}
            if name == STREAMING_TUNED:
                # A cache smaller than the data: Streaming's default shuffle block
                # (at least 262,144 samples) spreads every window over all shards,
                # which then cannot stay cached. A block of half the budget's
                # samples, and a prefetch window within it, let a block's shards fit.
                items = int(budget_bytes / float(rf.item_sizes().mean()))
                block = max(setup.batch, items // 2)
                extra = {"shuffle_block_size": block,
                         "predownload": max(setup.batch, min(8 * setup.batch, block // (2 * max(1, setup.workers))))}
            # Over S3: its S3 downloader (boto3), which takes the endpoint from
            # S3_ENDPOINT_URL (bench/e2e.py sets it to the server's).
            ds = Images(remote=prepared["s3_url"] if s3 else prepared["dir"], local=cache_dir, shuffle=True,
                        shuffle_seed=setup.seed,
                        cache_limit=budget_bytes, batch_size=setup.batch, **extra)
            from torch.utils.data import DataLoader

            loader = DataLoader(ds, **common)
        else:
            from litdata import StreamingDataLoader, StreamingDataset
            from litdata.streaming.resolver import Dir

            options: dict[str, Any] = {}
            if store is not None:
                _install_litdata_store(store)
                url = "local:" + prepared["dir"]
            else:
                # Its S3 downloader: boto3 for the index, obstore for chunks
                # (as installed), both given the endpoint by storage_options.
                # obstore refuses a plain-http endpoint unless told, and
                # LitData passes it fixed client options: the loopback
                # server's one allowance, made before the workers fork.
                from litdata.streaming import downloader as dl

                if hasattr(dl, "_OBSTORE_CLIENT_OPTIONS"):
                    dl._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
                url, options = prepared["s3_url"], {"storage_options": {"endpoint_url": setup.s3_endpoint}}
            ds = StreamingDataset(input_dir=Dir(path=cache_dir, url=url),
                                  max_cache_size=budget_bytes, shuffle=True, seed=setup.seed,
                                  transform=lambda obj: transform((obj["jpeg"], obj["label"])), **options)
            loader = StreamingDataLoader(ds, **common)

        def cleanup() -> None:
            shutil.rmtree(cache_dir, ignore_errors=True)

        return loader, _Peer(name, store, cleanup)

    import torch
    from torch.utils.data import DataLoader

    if name == V11:
        pkg = _import_v11(setup.v11_src, data_dir)
    else:
        import OPT4TorchDataSet as pkg  # the compat layer, installed with opt4torch under that name

        if "opt4torch" not in getattr(pkg, "__doc__", ""):
            raise RuntimeError(f"OPT4TorchDataSet here is not opt4torch's compat layer ({pkg.__file__})")
    c = setup.capacity_items
    plan_dir = tempfile.mkdtemp(prefix="v11-plan-", dir=data_dir)
    plan = os.path.join(plan_dir, "plan.safetensors")
    # The user's steps (its README): plan offline for the sampler's sequence,
    # make the cache with get_opt_cache, decorate the loading function.
    pkg.generate_precomputed_file(dataset_size=len(rf), total_iterations=len(seq), persist_path=plan,
                                  maxsize=c, distribution_seq=torch.as_tensor(seq, dtype=torch.int64))
    slot = 16 + int(rf.item_sizes().max())
    cache = pkg.get_opt_cache(num_workers=setup.workers, precomputed_path=plan, maxsize=c,
                              total_iter=len(seq), dataset_size=len(rf), item_shape=(slot,),
                              item_dtype=torch.uint8)
    ds = _V11Records(rf, slot, transform, np.load(prepared["crc"]) if prepared.get("crc") else None)
    ds.load = cache(ds._load)
    peer = _Peer(name, None, lambda: shutil.rmtree(plan_dir, ignore_errors=True))
    peer.cache, peer.dataset = cache, ds
    return DataLoader(ds, sampler=sampler, **common), peer
