#!/usr/bin/env python3
"""bench/capture_speed: capturing 10 M indices from torch samplers, the
vectorised fast path beside plain iteration (what a loop over the sampler
costs), medians of repeats.

    python bench/capture_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from torch.utils.data import RandomSampler

import opt4torch


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "capture_speed.json"))
    args = ap.parse_args()
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    cases = {
        "RandomSampler(replacement=True, num_samples=10M) over 1M": (
            lambda: RandomSampler(range(1_000_000), replacement=True, num_samples=10_000_000, generator=g()), 1),
        "RandomSampler (shuffle) over 1M, 10 epochs": (
            lambda: RandomSampler(range(1_000_000), generator=g()), 10),
    }
    rows = []
    for name, (make, epochs) in cases.items():
        fast = timed(lambda: opt4torch.capture(make(), epochs, progress=False), args.repeats)
        slow = timed(lambda: opt4torch.capture(make(), epochs, progress=False, fast=False), 1)
        rows.append({"case": name, "fast_s": fast, "iterate_s": slow, "repeats": args.repeats})
        print(f"{name}: {fast:.3f} s vectorised (median of {args.repeats}), {slow:.2f} s by iteration")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"command": "python bench/capture_speed.py", "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
