#!/usr/bin/env python3
"""bench/prefetch: clairvoyant prefetch on a slow store, through the public API.

A record file of N records on local disk, read with O_DIRECT (no page cache)
and an emulated latency per read (default 2 ms, applied by the reader to every
read, whoever makes it). A training loop iterates E epochs of epoch shuffle
through a DataLoader with W workers and, per batch, a training step emulated
by sleeping (an accelerator-bound step: the CPU is free meanwhile). Side by
side, in one run, repeated and reported as medians:

* in memory: the same records from a list in RAM, plain torch DataLoader (the
  limit: no storage at all);
* no cache: plain torch DataLoader reading the record file;
* OPT: opt4torch.DataLoader at capacity C (default 50 %), prefetch off;
* OPT + prefetch: the same with the C prefetcher.

Reported: iteration time, samples/s, its ratio to in memory, the CPU time
of the process and its workers (user + system, from getrusage: the main
process, with its prefetch threads, and the workers once joined), hits, the
stall rate (accesses that waited for their data), how late the late prefetches
were, and bytes read from storage beside the plan's predicted miss bytes.

    python bench/prefetch.py [--items 2000] [--record-bytes 16384] [--latency 0.002]
        [--epochs 5] [--capacity 0.5] [--batch 64] [--workers 2] [--step 0.016]
        [--threads 16] [--repeats 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
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

import opt4torch  # noqa: E402
from opt4torch.records import RecordFile, write_records  # noqa: E402


class InMemory(Dataset):
    def __init__(self, items: list[tuple[bytes, int]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        return self.items[i]


def train(loader: Any, epochs: int, step: float) -> tuple[float, int]:
    """The training loop: every batch, touch the samples, then the step."""
    n = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            n += sum(len(data) > 0 for data, _ in batch)
            if step:
                time.sleep(step)
    return time.perf_counter() - t0, n


def cpu_seconds() -> float:
    """User + system time of this process and of its children that were waited for."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def run_config(name: str, args: argparse.Namespace, path: str, items: list[tuple[bytes, int]]) -> dict[str, Any]:
    common = dict(batch_size=args.batch, num_workers=args.workers, collate_fn=list,
                  persistent_workers=args.workers > 0, multiprocessing_context="fork" if args.workers else None)
    out: dict[str, Any] = {"config": name}
    cpu0 = cpu_seconds()
    rf = RecordFile(path, direct=True, latency=args.latency)
    before = rf.info()
    if name == "in memory":
        ds: Any = InMemory(items)
        g = torch.Generator().manual_seed(args.seed)
        loader: Any = DataLoader(ds, sampler=RandomSampler(ds, generator=g), **common)
    elif name == "no cache":
        g = torch.Generator().manual_seed(args.seed)
        loader = DataLoader(rf, sampler=RandomSampler(rf, generator=g), **common)
    else:
        t0 = time.perf_counter()
        loader = opt4torch.DataLoader(rf, shuffle=True, seed=args.seed, epochs=args.epochs,
                                      cache_items=int(args.capacity * args.items),
                                      prefetch=name == "OPT + prefetch", prefetch_threads=args.threads,
                                      lookahead=args.lookahead, **common)
        out["setup_s"] = time.perf_counter() - t0
    seconds, n = train(loader, args.epochs, args.step)
    out.update(seconds=seconds, samples=n, samples_per_s=n / seconds)
    after = rf.info()
    out["storage_reads"] = after["reads"] - before["reads"]
    out["storage_bytes"] = after["bytes_read"] - before["bytes_read"]
    out["read_note"] = after["note"]
    if isinstance(loader, opt4torch.DataLoader):
        st = loader.cache.stats()
        plan = loader.cache.plan
        sizes = rf.item_sizes()
        out.update(hits=st["hits"], plan_hits=st["plan_hits"], misses=st["misses"],
                   prefetched=st["prefetched"], stalls=st["stalls"], stall_rate=st["stall_rate"],
                   stall_seconds=st["stall_seconds"], fallbacks=st["fallbacks"],
                   prefetch_dropped=st["prefetch_dropped"],
                   plan_miss_bytes=int(sizes[plan.seq[plan.kinds != opt4torch.HIT]].sum()))
        loader.cache.close()
    del loader
    gc.collect()  # the workers are joined here, so RUSAGE_CHILDREN has them
    out["cpu_s"] = cpu_seconds() - cpu0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--record-bytes", type=int, default=16384)
    ap.add_argument("--latency", type=float, default=0.002, help="seconds per read (emulated)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--capacity", type=float, default=0.5, help="cache size as a share of the items")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--step", type=float, default=0.016, help="seconds of training step per batch (slept)")
    ap.add_argument("--threads", type=int, default=16, help="prefetch threads")
    ap.add_argument("--lookahead", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="where the record file goes (a disk, not tmpfs, for O_DIRECT)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "prefetch.json"))
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="opt4-bench-", dir=args.dir or os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(work, "data.rec")
    rng = np.random.default_rng(args.seed)
    payloads = [rng.integers(0, 256, size=args.record_bytes, dtype=np.uint8).tobytes() for _ in range(args.items)]
    labels = [i % 10 for i in range(args.items)]
    write_records(path, payloads, labels=labels)
    items = list(zip(payloads, labels))
    configs = ["in memory", "no cache", "OPT", "OPT + prefetch"]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    try:
        for r in range(args.repeats):
            for c in configs:  # side by side, interleaved, so load drifts hit all alike
                res = run_config(c, args, path, items)
                runs[c].append(res)
                print(f"  repeat {r}: {c}: {res['seconds']:.2f} s", file=sys.stderr)
    finally:
        for f in os.listdir(work):
            os.unlink(os.path.join(work, f))
        os.rmdir(work)

    med = {c: statistics.median(x["seconds"] for x in runs[c]) for c in configs}
    cpu = {c: statistics.median(x["cpu_s"] for x in runs[c]) for c in configs}
    print(f"\n{args.items} records of {args.record_bytes} B, {args.latency * 1e3:g} ms a read, "
          f"{args.epochs} epochs of epoch shuffle, capacity {args.capacity:.0%}, batch {args.batch}, "
          f"{args.workers} workers, {args.step * 1e3:g} ms step, {args.threads} prefetch threads; "
          f"medians of {args.repeats}; reads: {runs['no cache'][0]['read_note']}\n")
    print("| configuration | time | samples/s | vs in memory | CPU | CPU vs in memory | hits | stall rate "
          "| late prefetches (mean wait) | bytes read | plan's miss bytes |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in configs:
        x = runs[c][-1]
        s = med[c]
        row = [c, f"{s:.2f} s", f"{x['samples'] / s:,.0f}", f"{s / med['in memory']:.2f}x",
               f"{cpu[c]:.2f} s", f"{cpu[c] / cpu['in memory']:.2f}x"]
        if "hits" in x:
            stall = statistics.median(y["stall_rate"] for y in runs[c])
            late = (f"{x['stalls']} ({x['stall_seconds'] / x['stalls'] * 1e3:.1f} ms)" if x["stalls"] else "0")
            row += [f"{x['hits']:,} (plan {x['plan_hits']:,})", f"{stall:.2%}", late,
                    f"{x['storage_bytes']:,}", f"{x['plan_miss_bytes']:,}"]
        else:
            row += ["–", "100%" if c == "no cache" else "0%", "–", f"{x['storage_bytes']:,}", "–"]
        print("| " + " | ".join(row) + " |")
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "args": vars(args), "medians_s": med, "cpu_medians_s": cpu,
                   "runs": runs}, f, indent=1)
    print(f"\nraw results: {args.out}")


if __name__ == "__main__":
    main()
