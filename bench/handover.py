#!/usr/bin/env python3
"""bench/handover: how close, in a plan, each ADMIT follows the last planned
read of what its slot or pages held before.

The prefetcher may store an ADMIT only once the generations whose pages it
takes have had their planned reads (docs/prefetch.md, "Handover"). When that
read is a few positions before the ADMIT, the ADMIT's reader usually arrives
while the prefetcher is still handing the item over, and waits (a short
stall). This script counts such ADMITs in the plans that opt4torch.DataLoader
would build for the same trace, in bytes (over pages) and in items:

    python bench/handover.py [--items 3000] [--epochs 3] [--capacity 0.5]
        [--min-kib 1] [--max-kib 40] [--window 32] [--seed 0]

It reads the plan through the public API only (``Plan.kinds``, ``ops``,
``slots``, ``gen_pages``), so it measures what the engine planned.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.utils.data import RandomSampler

import opt4torch
from opt4torch.data import _choose_page


def handover_gaps(p: opt4torch.Plan) -> np.ndarray:
    """For every ADMIT that replaces something: its position minus the
    latest planned read (ADMIT or HIT) of the generations it replaces."""
    kinds, slots = p.kinds, p.slots
    gen = (p.ops & 0x3FFFFFFF).astype(np.int64)
    last: dict[int, int] = {}  # generation (sized) or ADMIT position (items) -> last read
    owner: dict[int, int] = {}  # page or slot -> its current generation's tag
    out: list[int] = []
    for t in range(len(p)):
        k = int(kinds[t])
        if k == opt4torch.BYPASS:
            continue
        if k == opt4torch.ADMIT:
            tag = int(gen[t]) if p.sized else t
            places = p.gen_pages(int(gen[t])).tolist() if p.sized else [int(slots[t])]
            before = [last[owner[q]] for q in places if q in owner]
            if before:
                out.append(t - max(before))
            for q in places:
                owner[q] = tag
        else:
            tag = int(gen[t]) if p.sized else owner[int(slots[t])]
        last[tag] = t
    return np.asarray(out, dtype=np.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=3000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--capacity", type=float, default=0.5, help="fraction of the bytes (and of the items)")
    ap.add_argument("--min-kib", type=int, default=1)
    ap.add_argument("--max-kib", type=int, default=40)
    ap.add_argument("--window", type=int, default=32, help="positions counted as 'just before'")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    rng = np.random.default_rng(a.seed)
    sizes = rng.integers(a.min_kib * 1024, a.max_kib * 1024, a.items).astype(np.uint64)
    sampler = RandomSampler(range(a.items), generator=torch.Generator().manual_seed(a.seed))
    seq = opt4torch.capture(sampler, epochs=a.epochs)
    plans = {
        "bytes": opt4torch.plan(seq, capacity_bytes=int(sizes.sum() * a.capacity), item_sizes=sizes,
                                page_size=_choose_page(sizes), progress=False),
        "items": opt4torch.plan(seq, capacity=max(1, int(a.items * a.capacity)), progress=False),
    }
    print(f"{a.items} items of {a.min_kib}-{a.max_kib} KiB, {a.epochs} epochs of shuffle, "
          f"capacity {a.capacity:.0%}")
    print("| plan | accesses | hits | ADMITs | ADMITs replacing something | "
          f"within {a.window} positions | within {2 * a.window} | median gap |")
    print("|---|---|---|---|---|---|---|---|")
    for name, p in plans.items():
        g = handover_gaps(p)
        print(f"| {name} | {len(p):,} | {p.hits:,} | {p.admits:,} | {g.size:,} | "
              f"{int((g <= a.window).sum()):,} | {int((g <= 2 * a.window).sum()):,} | "
              f"{float(np.median(g)) if g.size else 0:.0f} |")
        p.close()


if __name__ == "__main__":
    main()
