#!/usr/bin/env python3
"""bench/callback_prefetch: prefetching a plain map-style Dataset (not one the
engine reads itself), through the public API.

The dataset is the kind users write: ``__getitem__`` reads its item from a
file with ``os.pread`` after an emulated latency (``time.sleep``, which
releases the GIL, as waiting on storage does) and returns ``(bytes, label)``.
Items are 1 to 40 KiB. A training loop iterates E epochs of epoch shuffle
with W fork workers and, per batch, a CPU-bound step (a fixed number of
single-threaded torch matrix products: on a 2-core machine the CPU our
threads take comes out of it). Side by side, repeated, medians reported:

* in memory: the items from a list in RAM, plain torch DataLoader;
* OPT: opt4torch.DataLoader at capacity C (default 50 %), prefetch off;
* OPT + prefetch: the same with ``prefetch=True``.

Reported: time, its ratio to in memory, CPU time (user + system of the
process with its threads, plus its workers once joined), the stall rate and
which prefetcher ran (``kind``: "threads" for the Python thread prefetcher of
earlier versions, "callback" for the C threads calling the dataset).

Run it with two installs of the package to compare them (PYTHONPATH first):

    python bench/callback_prefetch.py [--items 3000] [--latency 0.002] [--epochs 3]
        [--capacity 0.5] [--batch 32] [--workers 2] [--step-reps 12] [--threads 8]
        [--repeats 3] [--label NAME] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import machine  # noqa: E402
from prefetch import InMemory, cpu_seconds  # noqa: E402  (bench/prefetch.py: the same in-memory baseline)

import opt4torch  # noqa: E402


class FileItems(Dataset):
    """Items as byte ranges of one file, read with pread after a latency."""

    def __init__(self, path: str, offsets: np.ndarray, sizes: np.ndarray, latency: float) -> None:
        self.path, self.offsets, self.sizes, self.latency = path, offsets, sizes, latency
        self._fd: int | None = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        if self._pid != os.getpid():  # a worker forked after the first read opens its own
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        if self.latency:
            time.sleep(self.latency)
        return os.pread(self._fd, int(self.sizes[i]), int(self.offsets[i])), i % 10


def step_work(reps: int) -> tuple[torch.Tensor, int, float]:
    """The training step: reps single-threaded products of 160x160 matrices
    (a fixed amount of work, so runs of two installs do the same), and how
    long it takes here, measured once."""
    a = torch.randn(160, 160)
    a = torch.tanh(a @ a)  # the first product pays torch's one-time set-up: not timed
    t0 = time.perf_counter()
    for _ in range(20):
        a = torch.tanh(a @ a)
    return a, reps, (time.perf_counter() - t0) / 20 * reps


def train(loader: Any, epochs: int, a: torch.Tensor, reps: int) -> tuple[float, int]:
    n = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            n += len(batch)
            for _ in range(reps):
                a = torch.tanh(a @ a)
    return time.perf_counter() - t0, n


def run_config(name: str, args: argparse.Namespace, ds: FileItems, items: list[tuple[bytes, int]],
               work: tuple[torch.Tensor, int, float]) -> dict[str, Any]:
    common = dict(batch_size=args.batch, num_workers=args.workers, collate_fn=list,
                  persistent_workers=True, multiprocessing_context="fork")
    out: dict[str, Any] = {"config": name}
    cpu0 = cpu_seconds()
    if name == "in memory":
        mem = InMemory(items)
        loader: Any = DataLoader(mem, sampler=RandomSampler(mem, generator=torch.Generator().manual_seed(0)),
                                 **common)
    else:
        loader = opt4torch.DataLoader(ds, shuffle=True, seed=0, epochs=args.epochs,
                                      cache_items=int(args.capacity * len(ds)), item_bytes=int(ds.sizes.max()) + 64,
                                      prefetch=name == "OPT + prefetch", prefetch_threads=args.threads, **common)
    seconds, n = train(loader, args.epochs, work[0], work[1])
    out.update(seconds=seconds, samples=n)
    if isinstance(loader, opt4torch.DataLoader):
        st = loader.cache.stats()
        out.update(hits=st["hits"], plan_hits=st["plan_hits"], stall_rate=st["stall_rate"],
                   fallbacks=st["fallbacks"], kind=st.get("prefetcher", {}).get("kind"))
        loader.cache.close()
    del loader
    gc.collect()
    out["cpu_s"] = cpu_seconds() - cpu0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=3000)
    ap.add_argument("--latency", type=float, default=0.002, help="seconds per read (emulated)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--capacity", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--step-reps", type=int, default=12,
                    help="matrix products per batch: the CPU-bound training step (its time here is printed)")
    ap.add_argument("--threads", type=int, default=8, help="prefetch threads")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--label", default=opt4torch.__file__)
    ap.add_argument("--out", default=None, help="JSON file to write")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    sizes = rng.integers(1024, 40 * 1024, size=args.items)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        path = os.path.join(d, "items.bin")
        with open(path, "wb") as f:
            f.write(rng.integers(0, 256, size=int(sizes.sum()), dtype=np.uint8).tobytes())
        ds = FileItems(path, offsets, sizes, args.latency)
        items = [FileItems(path, offsets, sizes, 0.0)[i] for i in range(args.items)]
        work = step_work(args.step_reps)
        print(f"  training step: {args.step_reps} products, {work[2] * 1000:.1f} ms a batch here", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {}
        for r in range(args.repeats):
            for name in ("in memory", "OPT", "OPT + prefetch"):
                res = run_config(name, args, ds, items, work)
                runs.setdefault(name, []).append(res)
                print(f"  repeat {r + 1} {name}: {res['seconds']:.2f} s, cpu {res['cpu_s']:.2f} s, "
                      f"stalls {res.get('stall_rate', 0):.2%} {res.get('kind') or ''}", flush=True)
    mem = statistics.median(x["seconds"] for x in runs["in memory"])
    mem_cpu = statistics.median(x["cpu_s"] for x in runs["in memory"])
    print(f"\n{args.label}: medians of {args.repeats}")
    print("| configuration | time | vs in memory | CPU | CPU vs in memory | stall rate | prefetcher |")
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for name, rs in runs.items():
        t = statistics.median(x["seconds"] for x in rs)
        c = statistics.median(x["cpu_s"] for x in rs)
        s = statistics.median(x.get("stall_rate", 0.0) for x in rs)
        kind = rs[0].get("kind") or "–"
        summary[name] = {"seconds": t, "cpu_s": c, "stall_rate": s, "kind": kind}
        print(f"| {name} | {t:.2f} s | {t / mem:.2f}x | {c:.2f} s | {c / mem_cpu:.2f}x | {s:.2%} | {kind} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine(), "args": vars(args), "summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
