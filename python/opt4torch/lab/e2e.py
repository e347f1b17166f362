"""End to end: a real training loop, the caches users would otherwise write,
side by side. ``opt4torch demo`` ends with a small run of it, ``bench/e2e.py``
(``make bench-e2e``) is its command line for the full comparison.

The data: a generated image-classification dataset of JPEG files in the
``ImageFolder`` layout (classes of unequal sizes), packed into one record file
(:func:`opt4torch.records.image_folder_to_records`). Every configuration reads
it through the same reader, :class:`opt4torch.records.RecordFile` with
``O_DIRECT`` (no page cache) and an emulated latency per read applied in C,
whoever reads (a worker, or a prefetch thread). Bandwidth is folded into that
latency: ``latency + mean record size / bandwidth`` for every read, the same for
every configuration (the C prefetcher reads without Python, so a Python-side
bandwidth sleep would not apply to it).

What is cached is the record (the encoded JPEG and its label). Decoding with
PIL and a random crop and flip run after the cache, in the DataLoader workers;
a small CNN trains on the batches in the main process (one thread, CPU).

With ``Setup.store = "s3"`` (``bench/e2e.py --store s3``), every
configuration reads the same images from an S3-compatible server instead
(``bench/s3server.py`` on the loopback address, which adds the latency and
bandwidth at the server, so every client pays them the same way): the record
file's images as objects in the ImageFolder layout under
``s3://opt4-e2e/images/``, read by :class:`opt4torch.S3ImageFolder` (one
ranged GET an image); Streaming's and LitData's shards as objects, read by
their own S3 clients. The server's counters give every configuration's
requests and bytes.

Configurations (see :data:`CONFIGS`): no cache; per-worker ``cachetools``
LRU, LFU, FIFO and RR caches of C items each (as users write them: W workers
hold W x C items in all); one LRU shared by the workers through a
``multiprocessing`` manager; a static cache of the first C distinct items,
shared by the workers; opt4torch's OPT, without and with prefetch; and
everything in memory (the limit). Each configuration runs in its own process,
so its CPU time and peak memory are its own.
"""

from __future__ import annotations

import io
import json
import math
import mmap
import multiprocessing as mp
import os
import resource
import statistics
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Setup", "CONFIGS", "PEERS", "ALL_CONFIGS", "SAMPLERS", "Judged", "Target", "implausible_runs", "judge",
           "judge_targets", "prepare_data", "run", "markdown", "plot", "targets", "write_outputs"]

#: The configurations, in the order the tables list them.
CONFIGS = (
    "no cache",
    "LRU (cachetools)",
    "LFU (cachetools)",
    "FIFO (cachetools)",
    "RR (cachetools)",
    "shared LRU",
    "static",
    "OPT",
    "OPT + prefetch",
    "in memory",
)
CACHETOOLS = {"LRU (cachetools)": "LRUCache", "LFU (cachetools)": "LFUCache",
              "FIFO (cachetools)": "FIFOCache", "RR (cachetools)": "RRCache"}
#: The real alternatives (:mod:`.peers`: MosaicML Streaming, LitData,
#: OPT4TorchDataSet v1.1.0 and this package's compat layer for its API); not
#: in the default list: they need packages the demo does not install.
PEERS = ("Streaming", "Streaming (tuned)", "LitData", "OPT4TorchDataSet v1.1.0", "OPT4TorchDataSet API (compat)")
#: Over the object store only: OPT + prefetch with the GETs made by
#: s3torchconnector through the prefetcher's Python callback, beside the
#: default (the engine's own GETs in C), for what the client costs.
S3_ONLY = ("OPT + prefetch (s3torchconnector)",)
ALL_CONFIGS = CONFIGS + PEERS + S3_ONLY
#: The configurations that are opt4torch.DataLoader.
OPT_CONFIGS = ("OPT", "OPT + prefetch", "OPT + prefetch (s3torchconnector)")
#: Sampling: epoch shuffle, uniform with replacement, class-balanced weighted.
SAMPLERS = ("shuffle", "replacement", "balanced")


@dataclass
class Setup:
    """One run's parameters (bench/e2e.py's options)."""

    images: int = 1000
    classes: int = 10
    image_size: int = 80          # generated images are image_size x image_size JPEGs
    image_size_max: int = 0       # > image_size: each image's side is drawn from [image_size, image_size_max]
    crop: int = 64                # random crop the model sees
    epochs: int = 3
    batch: int = 64
    workers: int = 2
    capacity: float = 0.5         # cache size as a share of the images (items)
    latency: float = 0.005        # seconds per read, before bandwidth
    bandwidth: float = 100e6      # bytes/s of one read, folded into the latency
    direct: bool = True
    threads: int = 32             # prefetch threads
    lookahead: int = 4096
    repeats: int = 3
    seed: int = 0
    configs: list[str] = field(default_factory=lambda: list(CONFIGS))
    samplers: list[str] = field(default_factory=lambda: list(SAMPLERS))
    v11_src: str = ""             # a checkout of OPT4TorchDataSet v1.1.0 (the "OPT4TorchDataSet v1.1.0" peer)
    shard_bytes: int = 0          # Streaming's and LitData's shard size (0: theirs, smaller for a small budget)
    progress: bool = False        # a tqdm bar per configuration run (batches)
    store: str = "file"           # "file": the record file, costs emulated in C; "s3": the S3 server's objects
    s3_endpoint: str = ""         # with store="s3": the server's URL (bench/e2e.py starts it)
    s3_server_pid: int = 0        # ... and its process, for its CPU time
    link: float = 0.0             # with store="s3": bytes/s of the server's one shared link (0: none)
    train_cpus: str = ""          # the CPUs the training process (and all it starts) ran on ("": all)
    server_cpus: str = ""         # with store="s3": the CPUs the server ran on ("": all)
    format: str = "records"       # "parquet": the same JPEGs as Hub-style Parquet shards (.e2e_parquet)
    parquet_shards: int = 4       # with format="parquet": the shards datasets writes
    small_row_group: int = 8      # ... and the rows a row group of their rewrite by pyarrow

    @property
    def capacity_items(self) -> int:
        return max(1, int(round(self.capacity * self.images)))


# ---- the data ----


def _class_sizes(n: int, classes: int) -> list[int]:
    """Unequal classes (sizes proportional to 1/(k+1)), so class-balanced
    sampling draws the small classes' images more often."""
    w = np.array([1.0 / (k + 1) for k in range(classes)])
    sizes = np.floor(w / w.sum() * n).astype(int)
    sizes = np.maximum(sizes, 1)
    sizes[0] += n - int(sizes.sum())
    return [int(s) for s in sizes]


def make_image_folder(root: str, n: int, classes: int, size: int, seed: int, size_max: int = 0,
                      progress: bool = False) -> None:
    """``root/class_k/img_i.jpg``: each class a colour and a stripe direction,
    with noise, so the CNN has something to learn. With ``size_max > size``
    each image is square with a side drawn uniformly from ``[size, size_max]``
    (160 to 400 pixels give JPEGs of 15 to 97 KB, mean 51 KB: within the
    10-100 KiB of ImageNet's typical files)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    big = max(size, size_max)
    y, x = np.mgrid[0:big, 0:big].astype(np.float32)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc="generating JPEGs", unit="img")
    i = 0
    for k, count in enumerate(_class_sizes(n, classes)):
        d = os.path.join(root, f"class_{k:02d}")
        os.makedirs(d, exist_ok=True)
        colour = rng.uniform(40, 215, size=3).astype(np.float32)
        angle = math.pi * k / classes
        stripes_all = np.sin((x * math.cos(angle) + y * math.sin(angle)) / 3.0)[..., None]
        for _ in range(count):
            side = int(rng.integers(size, size_max + 1)) if size_max > size else size
            stripes = stripes_all[:side, :side]
            noise = rng.normal(0, 25, size=(side, side, 3)).astype(np.float32)
            shift = rng.uniform(-30, 30, size=3).astype(np.float32)
            img = np.clip(colour + shift + 40 * stripes + noise, 0, 255).astype(np.uint8)
            Image.fromarray(img).save(os.path.join(d, f"img_{i:06d}.jpg"), quality=90)
            i += 1
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()


def prepare_data(data_dir: str, setup: Setup, log: Callable[[str], None] = print) -> str:
    """The record file for ``setup`` in ``data_dir`` (made once: reused when
    its description matches)."""
    from ..sources.records import image_folder_to_records

    os.makedirs(data_dir, exist_ok=True)
    desc = {"images": setup.images, "classes": setup.classes, "image_size": setup.image_size,
            "seed": setup.seed, "version": 1}
    px = f"{setup.image_size}px"
    if setup.image_size_max > setup.image_size:
        desc["image_size_max"] = setup.image_size_max
        px = f"{setup.image_size}-{setup.image_size_max}px"
    path = os.path.join(data_dir, f"images-{setup.images}-{px}.rec")
    stamp = path + ".made"
    if os.path.exists(path) and os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == desc:
                return path
    t0 = time.perf_counter()
    root = os.path.join(data_dir, f"images-{setup.images}-{px}")
    if os.path.isdir(root):
        import shutil

        shutil.rmtree(root)
    make_image_folder(root, setup.images, setup.classes, setup.image_size, setup.seed, setup.image_size_max,
                      progress=setup.progress)
    image_folder_to_records(root, path, progress=setup.progress)
    with open(stamp, "w") as f:
        json.dump(desc, f)
    log(f"generated {setup.images:,} JPEGs of {px} in {setup.classes} classes "
        f"under {root}/ and packed them into {path} ({time.perf_counter() - t0:.1f} s)")
    return path


# ---- the object store (store="s3") ----

#: The bucket on the S3 server; the images are under ``images/``.
S3_BUCKET = "opt4-e2e"


def _s3_client(setup: Setup) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=setup.s3_endpoint)


def _s3_stats(setup: Setup, what: str = "stats") -> dict[str, Any]:
    """The server's counters (bench/s3server.py's ``/_opt4/`` paths)."""
    import urllib.request

    req = urllib.request.Request(f"{setup.s3_endpoint}/_opt4/{what}", method="GET" if what == "stats" else "POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _image_key(i: int, label: int) -> str:
    # Classes sorted by name, files by name within: S3ImageFolder's order is
    # the record file's (which is ImageFolder's: labels never decrease).
    return f"images/c{label:04d}/{i:08d}.jpg"


def upload_s3(path: str, setup: Setup, prepared: dict[str, dict[str, Any]],
              log: Callable[[str], None] = print) -> None:
    """Put the record file's images, and the peers' converted shards, on the
    S3 server (not timed with training): ``prepared[peer]["s3_url"]`` is where
    a peer's shards went."""
    from concurrent.futures import ThreadPoolExecutor

    from ..sources.records import RecordFile

    t0 = time.perf_counter()
    client = _s3_client(setup)
    client.create_bucket(Bucket=S3_BUCKET)
    rf = RecordFile(path)
    labels = rf.labels
    if np.any(np.diff(labels) < 0):
        raise ValueError(f"{path}: labels decrease along the records; the S3 layout would reorder the items")
    puts: list[tuple[str, Any]] = [(_image_key(i, int(labels[i])), i) for i in range(len(rf))]
    for name, p in prepared.items():
        if "dir" in p and name in _sharded():
            prefix = os.path.basename(p["dir"])
            for root, _, files in os.walk(p["dir"]):
                for f in files:
                    full = os.path.join(root, f)
                    puts.append((f"{prefix}/{os.path.relpath(full, p['dir'])}", full))
            p["s3_url"] = f"s3://{S3_BUCKET}/{prefix}"

    def put(job: tuple[str, Any]) -> int:
        key, what = job
        if isinstance(what, str):
            with open(what, "rb") as f:
                body = f.read()
        else:
            body = rf[int(what)][0]
        client.put_object(Bucket=S3_BUCKET, Key=key, Body=body)
        return len(body)

    with ThreadPoolExecutor(8) as ex:
        total = sum(ex.map(put, puts))
    rf.close()
    log(f"put {len(puts):,} objects ({total / 1e6:,.1f} MB) on the S3 server at {setup.s3_endpoint} "
        f"({time.perf_counter() - t0:.1f} s)")


def _sharded() -> tuple[str, ...]:
    from .peers import SHARDED

    return tuple(SHARDED)


class _S3Images:
    """The harness's view of the images on the S3 server: an
    :class:`opt4torch.S3ImageFolder` (``.dataset``, what the loaders read),
    checked against the record file (the same items, sizes and labels)."""

    def __init__(self, path: str, setup: Setup) -> None:
        from ..sources.s3 import S3ImageFolder
        from ..sources.records import RecordFile

        self.dataset = S3ImageFolder(f"s3://{S3_BUCKET}/images/", endpoint_url=setup.s3_endpoint)
        self._by_client = {"auto": self.dataset}
        plain = RecordFile(path)
        sizes, self.labels = plain.item_sizes(), plain.labels
        plain.close()
        if not (np.array_equal(sizes, self.dataset.item_sizes())
                and np.array_equal(self.labels, np.asarray(self.dataset.targets))):
            raise RuntimeError(f"the objects under s3://{S3_BUCKET}/images/ are not {path}'s records "
                               "(sizes or labels differ): upload them again (upload_s3)")
        self.endpoint = setup.s3_endpoint

    def __len__(self) -> int:
        return len(self.dataset)

    def dataset_for(self, client: str) -> Any:
        """The images through another client (``client=`` of S3ImageFolder)."""
        if client not in self._by_client:
            from ..sources.s3 import S3ImageFolder

            self._by_client[client] = S3ImageFolder(f"s3://{S3_BUCKET}/images/", endpoint_url=self.endpoint,
                                                    client=client)
        return self._by_client[client]

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]

    def item_sizes(self) -> np.ndarray:
        return self.dataset.item_sizes()

    def info(self) -> dict[str, Any]:
        out = {**self.dataset.info(), "note": f"opt4torch.S3ImageFolder, one GET an image from {self.endpoint}"}
        for ds in self._by_client.values():  # reads through every client's dataset
            if ds is not self.dataset:
                more = ds.info()
                out.update(reads=out["reads"] + more["reads"], bytes_read=out["bytes_read"] + more["bytes_read"])
        return out

    def close(self) -> None:
        pass


# ---- after the cache: decode, random crop, random flip ----


class DecodeCropFlip:
    """``(jpeg bytes, label) -> (float tensor 3 x crop x crop, label)``: PIL
    decodes, then a random crop and a random horizontal flip (torch's RNG,
    which the DataLoader seeds per worker)."""

    def __init__(self, crop: int) -> None:
        self.crop = int(crop)

    def __call__(self, sample: Any) -> Any:
        from PIL import Image

        data, label = sample
        return crop_flip(Image.open(io.BytesIO(data)), self.crop), int(label)


def crop_flip(image: Any, crop: int) -> Any:
    """A PIL image -> a float tensor 3 x crop x crop: a random crop and a
    random horizontal flip (torch's RNG)."""
    import torch

    img = np.asarray(image.convert("RGB"))
    h, w = img.shape[:2]
    top = int(torch.randint(0, h - crop + 1, ()).item())
    left = int(torch.randint(0, w - crop + 1, ()).item())
    img = img[top:top + crop, left:left + crop]
    if torch.rand(()).item() < 0.5:
        img = img[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float().div_(255.0)


def make_model(classes: int) -> Any:
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes),
    )


def make_sampler(kind: str, labels: np.ndarray, seed: int) -> Any:
    """A fresh seeded sampler: every configuration gets the same order."""
    import torch
    from torch.utils.data import RandomSampler, WeightedRandomSampler

    n = len(labels)
    g = torch.Generator().manual_seed(seed)
    if kind == "shuffle":
        return RandomSampler(range(n), generator=g)
    if kind == "replacement":
        return RandomSampler(range(n), replacement=True, num_samples=n, generator=g)
    if kind == "balanced":
        counts = np.bincount(labels)
        weights = torch.as_tensor(1.0 / counts[labels], dtype=torch.double)
        return WeightedRandomSampler(weights, num_samples=n, replacement=True, generator=g)
    raise ValueError(f"unknown sampler {kind!r} (one of {', '.join(SAMPLERS)})")


# ---- the datasets of the baselines, as users would write them ----


def _shared_int64(n: int) -> np.ndarray:
    """Zeros in an anonymous shared mapping: forked workers write to it."""
    return np.frombuffer(mmap.mmap(-1, max(8, 8 * n)), dtype=np.int64)[:n]


def _worker_id() -> int:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return info.id if info is not None else 0


class _NoCache:
    def __init__(self, rf: Any, transform: Callable[[Any], Any]) -> None:
        self.rf, self.transform = rf, transform

    def __len__(self) -> int:
        return len(self.rf)

    def __getitem__(self, i: int) -> Any:
        return self.transform(self.rf[i])


class _InMemory(_NoCache):
    """The records already in a list: the same path as no cache, minus storage."""


class _PerWorkerCache(_NoCache):
    """``cachetools.<Policy>(maxsize=C)`` in each worker process (made lazily,
    so each worker has its own, kept across epochs by persistent workers)."""

    def __init__(self, rf: Any, policy: str, capacity: int, workers: int,
                 transform: Callable[[Any], Any]) -> None:
        super().__init__(rf, transform)
        self.policy, self.capacity = policy, capacity
        self.counts = _shared_int64(2 * max(1, workers))  # hits, misses per worker
        self._cache: Any = None
        self._pid = -1

    def __getitem__(self, i: int) -> Any:
        if self._pid != os.getpid():
            import cachetools

            self._cache = getattr(cachetools, self.policy)(maxsize=self.capacity)
            self._pid = os.getpid()
        w = _worker_id()
        sample = self._cache.get(i)
        if sample is None:
            self.counts[2 * w + 1] += 1
            sample = self.rf[i]
            self._cache[i] = sample
        else:
            self.counts[2 * w] += 1
        return self.transform(sample)


class _LRUStore:
    """The shared LRU, living in a manager process; every get and put is a
    round trip to it from the workers."""

    def __init__(self, capacity: int) -> None:
        import cachetools

        self._cache = cachetools.LRUCache(maxsize=capacity)
        self._lock = threading.Lock()  # the manager serves each connection on a thread
        self.hits = self.misses = 0

    def get(self, key: int) -> Any:
        with self._lock:
            value = self._cache.get(key)
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
            return value

    def put(self, key: int, value: Any) -> None:
        with self._lock:
            self._cache[key] = value

    def counts(self) -> tuple[int, int]:
        return self.hits, self.misses


def _lru_manager() -> Any:
    from multiprocessing.managers import BaseManager

    class LRUManager(BaseManager):
        pass

    LRUManager.register("LRUStore", _LRUStore)
    return LRUManager(ctx=mp.get_context("fork"))


class _SharedLRU(_NoCache):
    def __init__(self, rf: Any, store: Any, transform: Callable[[Any], Any]) -> None:
        super().__init__(rf, transform)
        self.store = store

    def __getitem__(self, i: int) -> Any:
        sample = self.store.get(i)
        if sample is None:
            sample = self.rf[i]
            self.store.put(i, sample)
        return self.transform(sample)


class _StaticShared(_NoCache):
    """A static cache (CoorDL's and MinIO's): the first C distinct items the
    run reads are kept for good, in one shared mapping all workers use."""

    def __init__(self, rf: Any, keep: np.ndarray, workers: int, transform: Callable[[Any], Any]) -> None:
        super().__init__(rf, transform)
        self.slot_of = {int(item): s for s, item in enumerate(keep.tolist())}
        sizes = rf.item_sizes()
        self.slot_bytes = int(sizes.max())
        self.buf = mmap.mmap(-1, max(1, len(keep)) * self.slot_bytes)
        self.lens = _shared_int64(len(keep))  # 0: not loaded yet
        self.labels = rf.labels
        self.counts = _shared_int64(2 * max(1, workers))

    def __getitem__(self, i: int) -> Any:
        w = _worker_id()
        s = self.slot_of.get(int(i))
        if s is not None and self.lens[s] > 0:
            self.counts[2 * w] += 1
            at = s * self.slot_bytes
            sample = (self.buf[at:at + int(self.lens[s])], int(self.labels[i]))
        else:
            self.counts[2 * w + 1] += 1
            sample = self.rf[i]
            if s is not None:
                at = s * self.slot_bytes
                self.buf[at:at + len(sample[0])] = sample[0]
                self.lens[s] = len(sample[0])  # after the bytes: readers check it first
        return self.transform(sample)


# ---- measuring one configuration (in its own process) ----


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(c) for c in f.read().split()]
                out.extend(kids)
                todo.extend(kids)
        except OSError:
            pass
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _PeakMemory(threading.Thread):
    """Samples the PSS of this process and its descendants (workers, the
    manager) every 0.2 s: shared pages count once in all, split among their users."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self._stop_event = threading.Event()

    def sample(self) -> None:
        me = os.getpid()
        self.peak = max(self.peak, sum(_pss(p) for p in [me, *_descendants(me)]))

    def run(self) -> None:
        while not self._stop_event.wait(0.2):
            self.sample()

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        self.sample()
        return self.peak


def _cpu_seconds() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _shutdown(loader: Any) -> None:
    """Join the persistent workers now, so their CPU time is counted."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


def run_config(name: str, sampler_kind: str, path: str, setup: Setup,
               prepared: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train ``setup.epochs`` epochs under configuration ``name``; the counters.
    ``prepared``: what :func:`.peers.prepare` made for the peer configurations."""
    import torch
    from torch.utils.data import DataLoader as TorchLoader

    from ..sources.records import RecordFile

    torch.set_num_threads(1)
    cpu0 = _cpu_seconds()
    mem = _PeakMemory()
    mem.start()
    latency = setup.latency
    s3 = setup.store == "s3"
    rf: Any
    if s3:  # the costs are the server's
        rf = _S3Images(path, setup)
        sizes = rf.item_sizes()
    else:
        rf = RecordFile(path, direct=setup.direct, latency=0.0)
        sizes = rf.item_sizes()
        latency += float(sizes.mean()) / setup.bandwidth if setup.bandwidth > 0 else 0.0
        rf.set_latency(latency)
    labels = rf.labels
    n, c, w = len(rf), setup.capacity_items, setup.workers
    transform = DecodeCropFlip(setup.crop)
    common = dict(batch_size=setup.batch, num_workers=w, persistent_workers=w > 0,
                  multiprocessing_context="fork" if w > 0 else None)
    out: dict[str, Any] = {"config": name, "sampler": sampler_kind, "latency_s": latency,
                           "read_note": rf.info()["note"]}
    items: list[Any] | None = None
    if name == "in memory":
        plain = RecordFile(path)
        items = [plain[i] for i in range(n)]
        plain.close()
    before = rf.info()
    if s3:
        _s3_stats(setup, "reset")
        server_cpu0 = _proc_cpu_seconds(setup.s3_server_pid) if setup.s3_server_pid else 0.0
    manager = None
    t0 = time.perf_counter()
    ds: Any = None
    peer: Any = None
    if name in PEERS:
        from . import peers

        seq = None
        if name not in peers.SHARDED:  # a plan for the sampler's order: captured, as OPT's is
            from ..planning.capture import capture

            seq = capture(make_sampler(sampler_kind, labels, setup.seed), setup.epochs)
        budget = int(round(setup.capacity * float(sizes.sum())))
        loader, peer = peers.make_loader(name, make_sampler(sampler_kind, labels, setup.seed), seq, rf, setup,
                                         os.path.dirname(os.path.abspath(path)), transform, common,
                                         (prepared or {}).get(name, {}), budget)
        out["cache_bytes"] = budget
    elif name in OPT_CONFIGS:
        from ..loader.dataloader import DataLoader

        prefetch = name != "OPT"
        source = rf.dataset_for("s3torchconnector" if name in S3_ONLY else "auto") if s3 else rf
        out["s3_client"] = source.info()["client"] if s3 else None
        loader: Any = DataLoader(source, sampler=make_sampler(sampler_kind, labels, setup.seed), cache_items=c,
                                 epochs=setup.epochs, transform=transform, prefetch=prefetch,
                                 prefetch_threads=setup.threads, lookahead=setup.lookahead,
                                 progress=False, **common)
    else:
        if name == "no cache":
            ds = _NoCache(rf, transform)
        elif name == "in memory":
            ds = _InMemory(items, transform)
        elif name in CACHETOOLS:
            ds = _PerWorkerCache(rf, CACHETOOLS[name], c, w, transform)
        elif name == "shared LRU":
            manager = _lru_manager()
            manager.start()
            ds = _SharedLRU(rf, manager.LRUStore(c), transform)
        elif name == "static":
            from ..planning.capture import capture

            seq = capture(make_sampler(sampler_kind, labels, setup.seed), setup.epochs)
            _, first = np.unique(seq, return_index=True)
            keep = seq[np.sort(first)][:c]
            ds = _StaticShared(rf, keep, w, transform)
        else:
            raise ValueError(f"unknown configuration {name!r} (one of {', '.join(CONFIGS)})")
        loader = TorchLoader(ds, sampler=make_sampler(sampler_kind, labels, setup.seed), **common)
    setup_s = time.perf_counter() - t0
    trained = train(loader, setup, f"{name} / {sampler_kind}", n)
    samples = trained["samples"]
    seconds = time.perf_counter() - t0
    _shutdown(loader)
    after = rf.info()
    out.update(trained, seconds=seconds, setup_s=setup_s, storage_reads=after["reads"] - before["reads"],
               storage_bytes=after["bytes_read"] - before["bytes_read"], accesses=samples)
    if s3:
        # What the server served, whoever asked (the peers' own clients too):
        # GETs and their bytes, every request (LIST pages, HEADs), its CPU.
        srv = _s3_stats(setup)
        if name in PEERS:
            out.update(storage_reads=srv["gets"], storage_bytes=srv["get_bytes"])
        out.update(store_gets=srv["gets"], store_get_bytes=srv["get_bytes"], store_requests=srv["requests"],
                   server_cpu_s=(_proc_cpu_seconds(setup.s3_server_pid) - server_cpu0
                                 if setup.s3_server_pid else None))
    if peer is not None:
        from . import peers

        out.update(peer.counters(samples, int(round(samples * float(sizes.mean())))))
        if s3 and name in peers.SHARDED:  # counted at the server; of bytes, as with the local remote
            accessed = int(round(samples * float(sizes.mean())))
            out.update(stall_rate=None, hits=None, hit_rate_note="bytes",
                       hit_rate=max(0.0, 1.0 - out["storage_bytes"] / max(1, accessed)))
        if name not in peers.SHARDED:
            # Measured the same way for v1.1.0 and the compat layer: an access
            # that read the record file missed, and waited for it (a sample
            # that came back undecodable was read again: counted as a miss).
            out.update(hits=samples - out["storage_reads"], stall_rate=out["storage_reads"] / max(1, samples))
    elif name in OPT_CONFIGS:
        st = loader.cache.stats()
        plan = loader.cache.plan
        out.update(hits=st["hits"], plan_hits=plan.hits, stall_rate=st["stall_rate"],
                   prefetched=st["prefetched"], stalls=st["stalls"], fallbacks=st["fallbacks"], timeouts=st["timeouts"],
                   prefetch_dropped=st["prefetch_dropped"],
                   plan_miss_bytes=int(sizes[plan.seq[plan.kinds != 0]].sum()),
                   plan_label_sum=int(labels[plan.seq].sum()))
        loader.cache.close()
    elif name == "shared LRU":
        hits, misses = ds.store.counts()
        out.update(hits=hits, stall_rate=misses / max(1, samples))
        manager.shutdown()  # type: ignore[union-attr]
    elif name in CACHETOOLS or name == "static":
        out.update(hits=int(ds.counts[0::2].sum()), stall_rate=int(ds.counts[1::2].sum()) / max(1, samples))
    elif name == "no cache":
        out.update(hits=0, stall_rate=1.0)
    else:
        out.update(hits=samples, stall_rate=0.0)
    if out.get("hit_rate") is None:
        out["hit_rate"] = out["hits"] / max(1, samples)
    del loader
    out["cpu_s"] = _cpu_seconds() - cpu0
    # The machine's load over the last minute, against its cores: what the
    # timings of a run on a shared machine depend on (see implausible_runs).
    out["load_average"], out["cores"] = os.getloadavg()[0], os.cpu_count() or 1
    out["peak_memory_bytes"] = mem.stop()
    rf.close()
    return out


def train(loader: Any, setup: Setup, desc: str, n: int | None = None) -> dict[str, Any]:
    """``setup.epochs`` epochs of the small CNN (seeded) on ``loader``'s
    batches: every epoch's seconds, the samples, their labels' sum, the last
    loss. ``n``: the items an epoch has, for the progress bar."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(setup.seed)
    model = make_model(setup.classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    epoch_s, samples, label_sum, loss = [], 0, 0, float("nan")
    bar = None
    if setup.progress:
        from tqdm import tqdm

        bar = tqdm(total=setup.epochs * math.ceil((n or setup.images) / setup.batch), desc=desc, unit="batch",
                   leave=False)
    for _ in range(setup.epochs):
        e0 = time.perf_counter()
        for x, y in loader:
            logits = model(x)
            l = F.cross_entropy(logits, y)
            opt.zero_grad()
            l.backward()
            opt.step()
            samples += len(y)
            label_sum += int(y.sum())
            loss = float(l.detach())
            if bar is not None:
                bar.update(1)
        epoch_s.append(time.perf_counter() - e0)
    if bar is not None:
        bar.close()
    return {"epoch_s": epoch_s, "samples": samples, "label_sum": label_sum, "final_loss": loss}


def _child(conn: Any, target: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> None:
    try:
        conn.send(("ok", target(*args)))
    except BaseException:  # report any failure to the parent, then exit
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_isolated(name: str, sampler_kind: str, path: Any, setup: Setup, timeout: float = 1800,
                 prepared: dict[str, Any] | None = None,
                 target: Callable[..., dict[str, Any]] | None = None) -> dict[str, Any]:
    """:func:`run_config` (or ``target``, given the same arguments but
    ``prepared``) in a forked child process of its own."""
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe(duplex=False)
    args = (name, sampler_kind, path, setup) + ((prepared,) if target is None else ())
    p = ctx.Process(target=_child, args=(there, target or run_config, args))
    p.start()
    there.close()
    try:
        if not here.poll(timeout):
            raise TimeoutError(f"{name} / {sampler_kind} did not finish in {timeout:.0f} s")
        status, value = here.recv()
    except EOFError:
        raise RuntimeError(f"{name} / {sampler_kind}: the process died (exit code {p.exitcode})") from None
    finally:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
            p.join()
    if status != "ok":
        raise RuntimeError(f"{name} / {sampler_kind} failed:\n{value}")
    return value


# ---- the run, its summary, table and plots ----


def _import_once() -> None:
    """Import here what every configuration's process needs, so the forked
    children start with it (torch.optim imports torch._dynamo: seconds)."""
    import torch
    import torch.nn.functional  # noqa: F401
    from PIL import Image  # noqa: F401

    from ..pool import prefetch  # noqa: F401
    from ..loader import dataloader  # noqa: F401
    from ..sources import records  # noqa: F401

    torch.optim.SGD(make_model(2).parameters(), lr=0.1)
    try:
        import cachetools  # noqa: F401
    except ImportError:
        pass


def run(setup: Setup, path: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every sampler x configuration x repeat (configurations interleaved in
    each repeat, in an order rotated from one repeat to the next, so drifts
    in the machine's load hit all alike)."""
    for name in setup.configs:
        if name not in ALL_CONFIGS:
            raise ValueError(f"unknown configuration {name!r} (one of {', '.join(ALL_CONFIGS)})")
        if name in S3_ONLY and setup.store != "s3":
            raise ValueError(f"the configuration {name!r} reads the object store: give --store s3")
    skipped: dict[str, str] = {}
    prepared: dict[str, dict[str, Any]] = {}
    from . import peers  # imports no peer package itself

    for c in [c for c in setup.configs if c in PEERS]:
        why = peers.unavailable(c, setup)
        if why is not None:
            skipped[c] = why
            log(f"skipped {c}: {why}")
        else:
            prepared[c] = peers.prepare(c, path, setup, os.path.dirname(os.path.abspath(path)), log=log)
    configs = [c for c in setup.configs if c not in skipped]
    if setup.store == "s3":
        if not setup.s3_endpoint:
            raise ValueError("store='s3' needs the server's URL in Setup.s3_endpoint (bench/e2e.py --store s3 "
                             "starts one)")
        upload_s3(path, setup, prepared, log=log)
    _import_once()
    plan = {s: [c for c in configs if c not in PEERS or peers.unavailable(c, setup, s) is None]
            for s in setup.samplers}
    for s in setup.samplers:
        for c in configs:
            if c not in plan[s]:
                log(f"skipped {c} under {s}: {peers.unavailable(c, setup, s)}")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s: {c: [] for c in plan[s]} for s in setup.samplers}
    failed: dict[str, dict[str, str]] = {}
    t_start = time.perf_counter()
    for s in setup.samplers:
        for r in range(setup.repeats):
            for c in rotated(plan[s], r):
                if c in failed.get(s, {}):
                    continue
                try:
                    res = run_isolated(c, s, path, setup, prepared=prepared)
                except (RuntimeError, TimeoutError) as exc:
                    if c not in PEERS:
                        raise
                    # A peer that fails is a result, reported in the table's notes.
                    last = [line for line in str(exc).strip().splitlines() if line.strip()][-1]
                    failed.setdefault(s, {})[c] = last.strip()
                    log(f"  {s:<11} repeat {r + 1}/{setup.repeats}  {c:<18} FAILED: {last.strip()}")
                    continue
                runs[s][c].append(res)
                log(f"  {s:<11} repeat {r + 1}/{setup.repeats}  {c:<18} {res['seconds']:6.2f} s  "
                    f"hit rate {res['hit_rate']:6.1%}")
    for s, cs in failed.items():
        for c in cs:
            runs[s].pop(c, None)
    summary = {s: {c: summarize(runs[s][c]) for c in runs[s]} for s in setup.samplers}
    return {"setup": asdict(setup), "summary": summary, "runs": runs, "skipped": skipped,
            "failed": failed, "prepared": prepared, "wall_s": time.perf_counter() - t_start}


def rotated(configs: list[str], r: int) -> list[str]:
    """The order of repeat ``r``: each repeat starts one configuration later,
    so none always runs first (after the imports) or after the same neighbour."""
    k = r % max(1, len(configs))
    return configs[k:] + configs[:k]


def summarize(rs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in rs))

    def med_or_none(key: str) -> float | None:
        vals = [r[key] for r in rs if r.get(key) is not None]
        return float(statistics.median(vals)) if vals else None

    x = rs[0]
    epochs = len(x["epoch_s"])
    out = {"seconds": med("seconds"), "epoch_s": med("seconds") / epochs,
           "epoch_s_min": min(r["seconds"] for r in rs) / epochs, "epoch_s_max": max(r["seconds"] for r in rs) / epochs,
           "samples": x["samples"], "hit_rate": med("hit_rate"), "storage_bytes": med("storage_bytes"),
           "storage_reads": med("storage_reads"),
           "stall_rate": med_or_none("stall_rate"), "cpu_s": med("cpu_s"),
           "peak_memory_bytes": med("peak_memory_bytes"), "final_loss": med("final_loss"), "repeats": len(rs)}
    if x.get("hit_rate_note"):
        out["hit_rate_note"] = x["hit_rate_note"]
    for key in ("store_requests", "store_get_bytes", "server_cpu_s"):
        if x.get(key) is not None:
            out[key] = med(key)
    if "wrong_samples" in x:
        out["wrong_samples"] = max(r["wrong_samples"] for r in rs)
        out["undecodable_samples"] = max(r["undecodable_samples"] for r in rs)
    out["samples_per_s"] = out["samples"] / out["seconds"]
    if "plan_miss_bytes" in x:
        out["plan_miss_bytes"] = x["plan_miss_bytes"]
        out["plan_hits"] = x["plan_hits"]
        out["exact"] = all(r["storage_bytes"] == r["plan_miss_bytes"] and r["hits"] == r["plan_hits"] for r in rs)
    return out


def _px(s: Setup) -> str:
    if s.image_size_max > s.image_size:
        return f"square, {s.image_size} to {s.image_size_max} px a side"
    return f"{s.image_size}x{s.image_size}"


def _mb(b: float) -> str:
    return f"{b / 1e6:,.1f} MB"


#: Fewer plausible runs of a configuration than this give figures (medians
#: and ranges) but no verdict: one run on a shared machine can land anywhere.
MIN_RUNS = 3
#: A configuration timed faster than everything in memory by more than this
#: share did not measure what it seems to (each configuration does at least
#: the in-memory one's work), so that run is left out of every verdict.
PLAUSIBLE_MARGIN = 0.10


class Target(NamedTuple):
    """One target: what it asks, the figure measured (median and range),
    and ``met``: True or False when every plausible run agrees (and there
    are at least :data:`MIN_RUNS`), None otherwise, with ``why``."""

    what: str
    measured: str
    met: bool | None
    why: str = ""


@dataclass(frozen=True)
class Judged:
    """A figure over the runs (one value each) against a goal."""

    median: float
    low: float
    high: float
    runs: int
    met: bool | None
    why: str = ""


def judge(values: list[float], goal: float, *, at_least: bool, min_runs: int = MIN_RUNS) -> Judged:
    """Met when every run meets ``goal`` (``value >= goal`` if ``at_least``,
    else ``value <= goal``), not met when none does; otherwise, or with
    fewer than ``min_runs`` runs, no verdict (``met`` None) and the reason."""
    if not values:
        return Judged(math.nan, math.nan, math.nan, 0, None, "no plausible run")
    med, lo, hi, n = float(statistics.median(values)), min(values), max(values), len(values)
    if n < min_runs:
        return Judged(med, lo, hi, n, None, f"{n} plausible run{'s' if n > 1 else ''}, too few "
                                            f"({min_runs} needed)")
    ok = [v >= goal if at_least else v <= goal for v in values]
    if all(ok):
        return Judged(med, lo, hi, n, True)
    if not any(ok):
        return Judged(med, lo, hi, n, False)
    missed = n - sum(ok)
    return Judged(med, lo, hi, n, None,
                  f"{sum(ok)} of {n} runs meet it, {missed} {'does' if missed == 1 else 'do'} not")


def _timed(runs: dict[str, list[dict[str, Any]]]) -> tuple[list[str], int]:
    """The configurations that ran, and how many runs each has in common."""
    timed = [c for c in runs if runs[c]]
    return timed, min((len(runs[c]) for c in timed), default=0)


def implausible_runs(runs: dict[str, list[dict[str, Any]]]) -> dict[int, str]:
    """Run index -> why, for the runs (repeats) in which a configuration was
    timed faster than everything in memory by more than
    :data:`PLAUSIBLE_MARGIN`: every configuration does at least the in-memory
    one's work, so such a run measured the machine's load, not the cache."""
    timed, n = _timed(runs)
    out: dict[int, str] = {}
    if "in memory" not in timed:
        return out
    for i in range(n):
        mem = runs["in memory"][i]["seconds"]
        fast = [(c, runs[c][i]["seconds"] / mem - 1) for c in timed
                if c != "in memory" and runs[c][i]["seconds"] < (1 - PLAUSIBLE_MARGIN) * mem]
        if fast:
            out[i] = ", ".join(f"{c} {d:+.1%}" for c, d in fast) + " against everything in memory"
    return out


def judge_targets(runs: dict[str, list[dict[str, Any]]], min_runs: int = MIN_RUNS) -> list[Target]:
    """The targets of OPT + prefetch on one sampler's runs (configuration ->
    one result per repeat, in repeat order: the configurations ran
    interleaved, so run i of each was measured side by side). Each timing
    figure is computed per run; ``measured`` gives its median and range over
    all runs, the verdict (:func:`judge`) considers the plausible runs only
    (:func:`implausible_runs`)."""
    rows: list[Target] = []
    if "OPT + prefetch" not in runs:
        return rows
    timed, n = _timed(runs)
    bad = implausible_runs(runs)

    def secs(c: str) -> list[float]:
        return [float(runs[c][i]["seconds"]) for i in range(n)]

    def times(x: float) -> str:
        return f"{x:.2f}x"

    def share(x: float) -> str:
        return f"{x:+.1%}"

    def target(what: str, values: list[float], goal: float, at_least: bool, show: Callable[[float], str]) -> Target:
        every = judge(values, goal, at_least=at_least, min_runs=1)
        if every.runs == 1:
            measured = f"{show(every.median)} (one run)"
        else:
            measured = f"{show(every.median)} (median of {every.runs} runs; {show(every.low)} to {show(every.high)})"
        j = judge([v for i, v in enumerate(values) if i not in bad], goal, at_least=at_least, min_runs=min_runs)
        why = j.why
        if bad and j.met is None:
            why += f"; {len(bad)} of {n} runs implausible, left out"
        return Target(what, measured, j.met, why)

    pf = secs("OPT + prefetch")
    if "no cache" in timed:
        rows.append(target("OPT + prefetch at least 3x faster than no cache",
                           [a / b for a, b in zip(secs("no cache"), pf)], 3.0, True, times))
    ct = [c for c in CACHETOOLS if c in timed]
    if ct:
        best = min(ct, key=lambda c: statistics.median(secs(c)))
        rows.append(target(f"at least 1.5x faster than the best cachetools policy ({best})",
                           [a / b for a, b in zip(secs(best), pf)], 1.5, True, times))
    sharded = [c for c in ("Streaming", "Streaming (tuned)", "LitData") if c in timed]
    if sharded:
        best = min(sharded, key=lambda c: statistics.median(secs(c)))
        rows.append(target(f"at least 1.5x faster than the best of Streaming and LitData ({best})",
                           [a / b for a, b in zip(secs(best), pf)], 1.5, True, times))
    if "in memory" in timed:
        rows.append(target("within 10 % of everything in memory",
                           [a / b - 1 for a, b in zip(pf, secs("in memory"))], 0.10, False, share))
    exact = [r["storage_bytes"] == r["plan_miss_bytes"] and r["hits"] == r["plan_hits"]
             for c in ("OPT", "OPT + prefetch") for r in runs.get(c, [])]
    rows.append(Target("bytes read equal the plan's predicted miss bytes (and hits the plan's)",
                       "equal in every run" if all(exact) else "NOT equal", all(exact)))
    return rows


def targets(result: dict[str, Any], sampler: str = "shuffle") -> list[Target]:
    """The issue's targets on one sampler's runs (see :func:`judge_targets`)."""
    return judge_targets(result["runs"].get(sampler, {}))


def _busy(result: dict[str, Any]) -> str:
    """A sentence when other work took at least the machine's cores during
    the runs, else "". The load average counts this run's own processes
    too; their share is about its CPU time over its wall time."""
    def other(r: dict[str, Any]) -> float:
        return float(r["load_average"]) - float(r["cpu_s"]) / max(1e-9, float(r["seconds"]))

    runs = [r for rows in result["runs"].values() for rs in rows.values() for r in rs if "load_average" in r]
    if not runs:
        return ""
    top = max(runs, key=other)
    if other(top) < top["cores"]:
        return ""
    return (f"The machine was busy during these runs (load average up to {top['load_average']:.1f} on "
            f"{top['cores']} cores, about {other(top):.1f} of it other work than this run's): the runs' times "
            "vary with it.")


def markdown(result: dict[str, Any]) -> str:
    s = Setup(**result["setup"])
    summ = result["summary"]
    lat = next(iter(next(iter(result["runs"].values())).values()))[0]
    s3 = s.store == "s3"
    if s3:
        storage = (f"Storage: an S3-compatible server on the loopback address (bench/s3server.py: moto), "
                   f"which adds {s.latency * 1e3:g} ms to every request and bytes / {s.bandwidth / 1e6:g} MB/s "
                   "to every response" + (f", whose bodies share one link of {s.link / 1e6:g} MB/s" if s.link else
                                         " (no shared link)") + "; images as objects in the ImageFolder layout "
                   f"({lat['read_note']}), the peers' shards as objects read by their own clients. ")
    else:
        storage = (f"Storage: one record file read with "
                   f"{'O_DIRECT' if s.direct else 'buffered reads'} ({lat['read_note']}) and "
                   f"{s.latency * 1e3:g} ms + mean record / {s.bandwidth / 1e6:g} MB/s = "
                   f"{lat['latency_s'] * 1e3:.2f} ms per read, emulated in C for every reader. ")
    if s.train_cpus or s.server_cpus:
        storage += (f"The training process, its workers and helpers ran on CPU {s.train_cpus or 'all'}"
                    + (f", the S3 server on CPU {s.server_cpus} (its CPU off the training cores, as a store "
                       "runs on machines of its own). " if s.server_cpus else ". "))
    lines = [
        f"{s.images:,} JPEGs ({_px(s)}, {s.classes} classes), {s.epochs} epochs, batch {s.batch}, "
        f"{s.workers} workers, capacity {s.capacity:.0%} ({s.capacity_items:,} items), a small CNN on "
        f"{s.crop}x{s.crop} random crops (CPU, 1 thread). " + storage
        + f"OPT + prefetch: {s.threads} C threads. "
        + (f"Each configuration ran {s.repeats} times, interleaved: medians, and the range of the runs "
           "where it matters." if s.repeats > 1 else "One run each: single numbers, not medians."),
        "",
    ]
    for sampler, rows in summ.items():
        base = rows.get("no cache", {}).get("seconds")
        mem = rows.get("in memory", {}).get("seconds")
        lines += [f"**{sampler}**" + {"shuffle": " (epoch shuffle: RandomSampler)",
                                      "replacement": " (RandomSampler(replacement=True))",
                                      "balanced": " (class-balanced WeightedRandomSampler)"}.get(sampler, ""), "",
                  f"| configuration | time per epoch (mean of {s.epochs}"
                  + (f"; median of {s.repeats} runs, and their range" if s.repeats > 1 else "")
                  + ") | samples/s | vs no cache | vs in memory "
                  f"| hit rate ({s.epochs} epochs) | read from storage ({s.epochs} epochs) | requests to storage "
                  f"| stall rate | CPU time ({s.epochs} epochs) | peak memory |"
                  + (" all requests to the server | the server's CPU |" if s3 else ""),
                  "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if s3 else "")]
        for c, v in rows.items():
            read = _mb(v["storage_bytes"])
            if "plan_miss_bytes" in v:
                read += " (plan: " + ("equal" if v.get("exact") else _mb(v["plan_miss_bytes"])) + ")"
            spread = (f" ({v['epoch_s_min']:.2f} to {v['epoch_s_max']:.2f})"
                      if v.get("repeats", 1) > 1 and "epoch_s_min" in v else "")
            lines.append(
                f"| {c} | {v['epoch_s']:.2f} s{spread} | {v['samples_per_s']:,.0f} | "
                f"{format(base / v['seconds'], '.2f') + 'x' if base else '–'} | "
                f"{format(v['seconds'] / mem, '.2f') + 'x' if mem else '–'} | {v['hit_rate']:.1%}"
                f"{' (of bytes)' if v.get('hit_rate_note') == 'bytes' else ''} | {read} | "
                f"{'–' if v.get('storage_reads') is None else format(int(v['storage_reads']), ',')} | "
                f"{'–' if v.get('stall_rate') is None else format(v['stall_rate'], '.1%')} | {v['cpu_s']:.1f} s | "
                f"{v['peak_memory_bytes'] / 2**20:,.0f} MiB |"
                + (f" {int(v.get('store_requests', 0)):,} | {v.get('server_cpu_s') or 0:.1f} s |" if s3 else ""))
        lines.append("")
    tg = targets(result)
    if tg:
        lines += [(f"Targets (epoch shuffle; each figure computed per run from configurations measured side by "
                   f"side, then its median and range; a verdict only when at least {MIN_RUNS} plausible runs "
                   "all agree):"), ""]
        bad = implausible_runs(result["runs"].get("shuffle", {}))
        if bad:
            lines += ["Implausible, so left out of the verdicts: "
                      + "; ".join(f"run {i + 1} ({why})" for i, why in sorted(bad.items()))
                      + ". No configuration can be faster than everything in memory: the machine's load "
                      "changed during the runs.", ""]
        busy = _busy(result)
        if busy:
            lines += [busy, ""]
        for t in tg:
            verdict = "met" if t.met else "NOT met" if t.met is False else "no verdict"
            lines.append(f"- {t.what}: {t.measured} ({verdict}{': ' + t.why if t.why else ''})")
        lines.append("")
    for c, why in result.get("skipped", {}).items():
        lines.append(f"- {c} was not run: {why}.")
    for sampler, cs in result.get("failed", {}).items():
        for c, why in cs.items():
            lines.append(f"- {c} failed under {sampler}: {why}")
    for sampler, rows in summ.items():
        for c, v in rows.items():
            if v.get("wrong_samples"):
                lines.append(f"- {c} returned {v['wrong_samples']:,} wrong sample(s) under {sampler} (of "
                             f"{v['samples']:,}: bytes or label differ from the record's), "
                             f"{v['undecodable_samples']:,} of them not even a JPEG; those were read again "
                             "from storage so that the run could finish (a user's run stops at the first).")
    prep = result.get("prepared", {})
    if any("what" in p for p in prep.values()):
        lines += ["", "Prepared before training, not in the times above:", ""]
        for c, p in prep.items():
            if "what" not in p:
                continue
            extra = f", {p['shards']} shards, {p['bytes'] / 1e6:,.1f} MB" if "shards" in p else ""
            lines.append(f"- {c}: {p['what']}: {p['seconds']:.1f} s{extra}")
    if s3 and any(c in PEERS for rows in summ.values() for c in rows):
        lines += ["", "Peers: Streaming and LitData read their shards from the same S3 server with their own "
                  "S3 clients, paying its latency and bandwidth per request; their cache limit is the same byte "
                  "budget (capacity x the images' bytes), kept as shard files on local disk; they shuffle with "
                  "their own algorithms; their hit rate is the share of the accessed bytes not fetched, and a "
                  "stall rate is not defined for them. OPT4TorchDataSet v1.1.0 and the compat layer run their "
                  "users' code over opt4torch.S3ImageFolder. Requests and bytes are the server's counts (GETs); "
                  "'all requests' adds LIST pages and HEADs. docs/e2e.md says what the server models.", ""]
    elif any(c in PEERS for rows in summ.values() for c in rows):
        lines += ["", "Peers: Streaming and LitData fetch whole shards from a local directory as their remote, "
                  f"each fetch paying {s.latency * 1e3:g} ms + bytes / {s.bandwidth / 1e6:g} MB/s (one request); "
                  "their cache limit is the same byte budget (capacity x the records' bytes), kept as shard "
                  "files on local disk; they shuffle with their own algorithms, so they see other orders than "
                  "the sampler's; their hit rate is the share of the accessed bytes not fetched, and a stall "
                  "rate is not defined for them. OPT4TorchDataSet v1.1.0 and the compat layer run the same "
                  "user code (its README's steps: a plan for the sampler's sequence, get_opt_cache, the loading "
                  "function decorated) over the record file; their hit rate and stall rate count the accesses "
                  "that read storage. docs/e2e.md says what each pays and what not.", ""]
    lines += [
        "Notes: per-worker cachetools caches hold C items in each of the workers (W x C in all); the shared "
        "LRU lives in a multiprocessing manager process (each lookup a round trip); the static cache keeps "
        "the first C distinct items read, shared by the workers; the in-memory configuration reads the "
        "records once before timing. Hit rate counts every access, first reads included. The stall rate "
        "is the share of accesses that waited for storage (a synchronous miss, or a prefetch still in "
        "flight). CPU time: the training process, its workers and helpers; peak memory: their summed PSS, "
        "sampled every 0.2 s.",
    ]
    return "\n".join(lines)


def plot(result: dict[str, Any], out_dir: str, prefix: str = "e2e") -> list[str]:
    """Epoch time per configuration and sampler, and hit rate with bytes
    read (two rows, one unit each); PNGs in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = result["summary"]
    samplers = list(summ)
    # Every configuration that ran under any sampler (the sharded peers run
    # under epoch shuffle only): a missing one is drawn as "not run".
    failed = result.get("failed", {})
    order = [c for c in ALL_CONFIGS if any(c in rows for rows in summ.values())
             or any(c in f for f in failed.values())]
    configs = order + [c for rows in summ.values() for c in rows if c not in order]
    configs = list(dict.fromkeys(configs))
    epochs = result["setup"].get("epochs", 1)
    median = ", median" if result["setup"].get("repeats", 1) > 1 else ""
    ours = ("OPT", "OPT + prefetch", "OPT + prefetch (s3torchconnector)", "OPT4TorchDataSet API (compat)")
    colour = {c: ("#c0392b" if c in ours else "#27ae60" if c in PEERS
                  else "#7f8c8d" if c in ("no cache", "in memory") else "#2980b9") for c in configs}

    def value(s: str, c: str, key: str, scale: float = 1.0) -> float:
        v = summ[s].get(c, {}).get(key)
        return float("nan") if v is None else v * scale
    # Wide enough for the titles with a single sampler (the demo's case).
    width = max(7.0, 4.2 * len(samplers) + 1)
    height = 0.42 * len(configs) + 1.6

    def bars(ax: Any, vals: list[float], label: Callable[[float], str], xmax: float, sampler: str,
             ranges: list[tuple[float, float] | None] | None = None) -> None:
        # A bar past the axis (Streaming's thrashing) is cut at its end,
        # with its value written on it. ``ranges``: (low, high) per bar, drawn
        # as whiskers (cut at the axis too); the values are then written at
        # the bar's base, or past the whisker, so that no line crosses them.
        ax.barh(range(len(configs)), [0.0 if math.isnan(v) else min(v, xmax) for v in vals],
                color=[colour[c] for c in configs])
        for i, v in enumerate(vals):
            if math.isnan(v):
                ax.text(0, i, " failed" if configs[i] in failed.get(sampler, {}) else " not run", va="center",
                        fontsize=8, color="#7f8c8d")
                continue
            span = ranges[i] if ranges else None
            cut = " (axis cut) " if v > xmax else " "
            if span is not None:
                lo, hi = min(span[0], xmax), min(span[1], xmax)
                ax.errorbar(min(v, xmax), i, xerr=[[min(v, xmax) - lo], [hi - min(v, xmax)]], fmt="none",
                            ecolor="black", elinewidth=0.9, capsize=3, zorder=4)
                if min(v, xmax) > 0.3 * xmax:
                    ax.text(0, i, f" {label(v)}{cut}", va="center", fontsize=8, ha="left", color="white")
                else:
                    ax.text(max(hi, min(v, xmax)), i, f" {label(v)}", va="center", fontsize=8, ha="left")
                continue
            # Inside the bar's end when it is long, past it otherwise.
            inside = min(v, xmax) > 0.7 * xmax
            ax.text(min(v, xmax), i, (f"{label(v)} " + ("(axis cut) " if v > xmax else "")) if inside
                    else f" {label(v)}", va="center", fontsize=8,
                    ha="right" if inside else "left", color="white" if inside else "black")
        ax.set_xlim(0, xmax)

    written = []
    fig, axes = plt.subplots(1, len(samplers), figsize=(width, height), sharey=True, squeeze=False,
                             layout="constrained")
    for ax, s in zip(axes[0], samplers):
        vals = [value(s, c, "epoch_s") for c in configs]
        highs = [h for h in (value(s, c, "epoch_s_max") for c in configs) if not math.isnan(h)]
        xmax = max([np.nanmax(vals) * 1.2] + [1.05 * h for h in highs])
        if "no cache" in summ[s]:  # the axis cut as for the bytes below
            xmax = min(xmax, 2.4 * summ[s]["no cache"]["epoch_s"])
        ranges: list[tuple[float, float] | None] | None = None
        if median:  # the range of the runs, as whiskers
            ranges = [(summ[s][c]["epoch_s_min"], summ[s][c]["epoch_s_max"])
                      if "epoch_s_min" in summ[s].get(c, {}) else None for c in configs]
        bars(ax, vals, lambda v: f"{v:.1f} s", xmax, s, ranges)
        if "in memory" in summ[s]:
            ax.axvline(summ[s]["in memory"]["epoch_s"], color="k", ls="--", lw=0.8)
        ax.set_title(s)
        ax.set_xlabel(f"time per epoch, s (mean of {epochs} epochs{median}"
                      + (f";\nwhiskers: the range of {result['setup']['repeats']} runs)" if median else ")"))
    axes[0][0].invert_yaxis()  # shared by all panels: the first configuration on top
    axes[0][0].set_yticks(range(len(configs)), configs)
    fig.suptitle("Time per epoch (lower is better; dashed line: in memory)")
    p = os.path.join(out_dir, f"{prefix}-epoch-time.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    fig, axes = plt.subplots(2, len(samplers), figsize=(width, 2 * height), sharey=True, squeeze=False,
                             layout="constrained")
    mb_max = max(v["storage_bytes"] for rows in summ.values() for v in rows.values()) / 1e6
    # The axis ends at twice what no cache reads, when something reads more
    # (a thrashing cache would flatten every other bar).
    nocache = [rows["no cache"]["storage_bytes"] / 1e6 for rows in summ.values() if "no cache" in rows]
    if nocache and mb_max > 2 * max(nocache):
        mb_max = 2 * max(nocache)
    for k, s in enumerate(samplers):
        rates = [value(s, c, "hit_rate", 100) for c in configs]
        bars(axes[0][k], rates, lambda v: f"{v:.0f} %", 100, s)
        axes[0][k].set_title(s)
        by_bytes = any(v.get("hit_rate_note") == "bytes" for v in summ[s].values())
        axes[0][k].set_xlabel(f"hit rate, % of all accesses ({epochs} epochs)"
                              + ("\nStreaming, LitData: % of the bytes read" if by_bytes else ""))
        mbs = [value(s, c, "storage_bytes", 1e-6) for c in configs]
        bars(axes[1][k], mbs, lambda v: f"{v:.1f} MB", max(mb_max * 1.2, 1e-3), s)
        axes[1][k].set_xlabel(f"read from storage, MB ({epochs} epochs)")
    axes[0][0].invert_yaxis()  # once: every panel shares it
    for row in axes:
        row[0].set_yticks(range(len(configs)), configs)
    fig.suptitle("Hit rate (higher is better) and bytes read from storage (lower is better)")
    p = os.path.join(out_dir, f"{prefix}-hits.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written


def write_outputs(result: dict[str, Any], out_dir: str, machine: dict[str, Any] | None = None,
                  prefix: str = "e2e", plots: bool = True) -> list[str]:
    """``<prefix>.md``, ``<prefix>.json`` and the plots in ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    md = os.path.join(out_dir, f"{prefix}.md")
    with open(md, "w") as f:
        f.write(f"# End to end: `{' '.join(result.get('command', []))}`\n\n" if result.get("command") else "")
        f.write(markdown(result) + "\n")
        if machine:
            f.write("\nMachine: " + ", ".join(f"{k} {v}" for k, v in machine.items()) + "\n")
    written.append(md)
    js = os.path.join(out_dir, f"{prefix}.json")
    with open(js, "w") as f:
        json.dump({**result, "machine": machine}, f, indent=1)
    written.append(js)
    if plots:
        written += plot(result, out_dir, prefix)
    return written
