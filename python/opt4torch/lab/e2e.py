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

import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from .e2e_baselines import (  # noqa: F401 - re-exported: the names e2e.py had
    DecodeCropFlip,
    InMemory,
    lru_manager,
    _LRUStore,
    NoCache,
    PerWorkerCache,
    _shared_int64,
    SharedLRU,
    StaticShared,
    _worker_id,
    crop_flip,
    make_model,
    make_sampler,
)
from .e2e_data import (  # noqa: F401 - re-exported: the names e2e.py had
    S3_BUCKET,
    _class_sizes,
    _image_key,
    proc_cpu_seconds,
    s3_client,
    s3_stats,
    S3Images,
    _sharded,
    make_image_folder,
    prepare_data,
    upload_s3,
)
from .e2e_measure import (  # noqa: F401 - re-exported: the names e2e.py had
    _child,
    cpu_seconds,
    _descendants,
    PeakMemory,
    _pss,
    shutdown_loader,
    run_config,
    run_isolated,
    train,
)
from .e2e_report import (  # noqa: F401 - re-exported: the names e2e.py had
    MIN_RUNS,
    PLAUSIBLE_MARGIN,
    Judged,
    Target,
    _busy,
    _mb,
    px,
    _timed,
    implausible_runs,
    judge,
    judge_targets,
    markdown,
    plot,
    summarize,
    targets,
    write_outputs,
)
from .e2e_setup import (  # noqa: F401 - re-exported: the names e2e.py had
    ALL_CONFIGS,
    CACHETOOLS,
    CONFIGS,
    OPT_CONFIGS,
    PEERS,
    S3_ONLY,
    SAMPLERS,
    Setup,
)

__all__ = ["ALL_CONFIGS", "CACHETOOLS", "CONFIGS", "DecodeCropFlip", "InMemory", "Judged", "MIN_RUNS", "NoCache",
           "OPT_CONFIGS", "PEERS", "PLAUSIBLE_MARGIN", "PeakMemory", "PerWorkerCache", "S3Images", "S3_BUCKET",
           "S3_ONLY", "SAMPLERS", "Setup", "SharedLRU", "StaticShared", "Target", "_LRUStore", "_busy", "_child",
           "_class_sizes", "_descendants", "_image_key", "_mb", "_pss", "_sharded", "_shared_int64", "_timed",
           "_worker_id", "cpu_seconds", "crop_flip", "implausible_runs", "import_once", "judge", "judge_targets",
           "lru_manager", "make_image_folder", "make_model", "make_sampler", "markdown", "plot", "prepare_data",
           "proc_cpu_seconds", "px", "rotated", "run", "run_config", "run_isolated", "s3_client", "s3_stats",
           "shutdown_loader", "summarize", "targets", "train", "upload_s3", "write_outputs"]


# ---- the run, its summary, table and plots ----


def import_once() -> None:
    """Import here what every configuration's process needs, so the forked
    children start with it (torch.optim imports torch._dynamo: seconds)."""
    import torch
    import torch.nn.functional  # noqa: F401 - re-exported: the names e2e.py had
    from PIL import Image  # noqa: F401 - re-exported: the names e2e.py had

    from ..loader import dataloader  # noqa: F401 - re-exported: the names e2e.py had
    from ..pool import prefetch  # noqa: F401 - re-exported: the names e2e.py had
    from ..sources import records  # noqa: F401 - re-exported: the names e2e.py had

    torch.optim.SGD(make_model(2).parameters(), lr=0.1)
    try:
        import cachetools  # noqa: F401 - re-exported: the names e2e.py had
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
    import_once()
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
