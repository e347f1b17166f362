#!/usr/bin/env python3
"""bench/preload_speed: AsyncPrefetchDataset against the plain dataset, with
an emulated latency per item (time.sleep, which releases the GIL as a file or
network read does), in one process, over a shuffled order: without prefetch,
prefetching the next indices (the earlier design), and prefetching the
captured order. Medians of repeats; prints a markdown table.

    python bench/preload_speed.py [--items 400] [--latency-ms 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch
from torch.utils.data import RandomSampler

import opt4torch
from _machine import machine
from opt4torch.preload import AsyncPrefetchDataset


class Latency:
    """Item i is a 4 KiB tensor, after ``latency`` seconds of waiting."""

    def __init__(self, n: int, latency: float) -> None:
        self.n = n
        self.latency = latency

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.latency)
        return torch.full((1024,), float(i))


def run(make: Any, order: list[int], repeats: int) -> tuple[float, dict[str, Any] | None]:
    times, stats = [], None
    for _ in range(repeats):
        ds = make()
        t0 = time.perf_counter()
        for i in order:
            ds[i]
        times.append(time.perf_counter() - t0)
        if isinstance(ds, AsyncPrefetchDataset):
            stats = ds.stats()
            ds.close()
    return statistics.median(times), stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--latency-ms", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--queue-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "preload_speed.json"))
    args = ap.parse_args()
    lat = args.latency_ms / 1000
    sampler = RandomSampler(range(args.items), generator=torch.Generator().manual_seed(0))
    order = opt4torch.capture(sampler, 1, progress=False).tolist()
    base = Latency(args.items, lat)
    cases = {
        "plain dataset": lambda: base,
        "AsyncPrefetchDataset, next indices (no order)":
            lambda: AsyncPrefetchDataset(base, args.queue_size, args.threads),
        "AsyncPrefetchDataset, captured order":
            lambda: AsyncPrefetchDataset(base, args.queue_size, args.threads, order=order),
    }
    rows = []
    plain = None
    print(f"{args.items} accesses in a shuffled order, {args.latency_ms} ms latency per item, "
          f"{args.threads} threads, queue_size {args.queue_size}, median of {args.repeats}\n")
    print("| case | seconds | ms per item | speedup | prefetched hits | sync loads |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, make in cases.items():
        sec, stats = run(make, order, args.repeats)
        plain = plain or sec
        hits = stats["hits"] if stats else 0
        sync = stats["sync_loads"] if stats else len(order)
        rows.append({"case": name, "seconds": sec, "hits": hits, "sync_loads": sync})
        print(f"| {name} | {sec:.3f} | {1000 * sec / len(order):.2f} | {plain / sec:.2f}x | {hits} | {sync} |")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"command": "python bench/preload_speed.py", "args": {k: v for k, v in vars(args).items() if k != "json"}, "machine": machine(),
                   "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
