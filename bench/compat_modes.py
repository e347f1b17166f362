#!/usr/bin/env python3
"""bench/compat_modes: the hit rate of the earlier design's decorators against
the plan, with real DataLoader workers.

SharedOPTCacheDecorator sees indices, not positions. position="clock" (the
earlier design's global counter) hands out positions in arrival order;
position="occurrence" maps the k-th request for an item to its k-th planned
position. This measures, for 0, 1, 2 and 4 workers, the hits each gets as a
share of the plan's hits, and the mismatches (calls whose index was not the
one planned at their position; never served from the cache).

    python bench/compat_modes.py [--items 2000] [--capacity 0.3] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

import opt4torch
from opt4torch.cachelib import SharedOPTCacheDecorator


class Source(Dataset):
    def __init__(self, n: int, cache: SharedOPTCacheDecorator) -> None:
        self.n = n
        self.get = cache(self.load)

    def load(self, obj: object, index: int) -> torch.Tensor:
        return torch.full((16,), index, dtype=torch.int64)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.get(self, i)


def measure(items: int, capacity: int, epochs: int, workers: int, position: str, batch: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.opt4")
        total = items * epochs
        opt4torch.generate_precomputed_file(items, total, path, random_seed=0)
        cache = SharedOPTCacheDecorator(path, capacity, 10000, total, position=position,
                                        divergence_limit=1.0)  # never give up: measure the mode itself
        ds = Source(items, cache)
        sampler = RandomSampler(range(items), replacement=True, num_samples=total,
                                generator=torch.Generator().manual_seed(0))
        loader = DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers,
                            multiprocessing_context="fork" if workers else None)
        seen = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for b in loader:
                seen += len(b)
        st = cache.pool_stats()
        plan_hits = cache.plan.hits
        mismatched = st["store_failed"]
        cache.close()
    return {"workers": workers, "position": position, "accesses": seen, "plan_hits": plan_hits,
            "hits": st["hits"], "share_of_plan": st["hits"] / plan_hits if plan_hits else 0.0,
            "fallbacks": st["fallbacks"], "skipped_admits": mismatched}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--capacity", type=float, default=0.3, help="fraction of items")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "compat_modes.json"))
    args = ap.parse_args()
    cap = max(1, int(args.capacity * args.items))
    rows = []
    for position in ("clock", "occurrence"):
        for workers in (0, 1, 2, 4):
            r = measure(args.items, cap, args.epochs, workers, position, args.batch)
            rows.append(r)
            print(f"{position:10} {workers} workers: hits {r['hits']:6} of plan {r['plan_hits']:6} "
                  f"({r['share_of_plan']:.1%}), fallbacks {r['fallbacks']}", file=sys.stderr)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"command": "python bench/compat_modes.py", "items": args.items, "capacity": cap,
                   "epochs": args.epochs, "batch": args.batch, "rows": rows}, f, indent=2)
    print("| position | workers | hits | plan hits | share of plan | fallbacks |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['position']} | {r['workers']} | {r['hits']} | {r['plan_hits']} | "
              f"{r['share_of_plan']:.1%} | {r['fallbacks']} |")


if __name__ == "__main__":
    main()
