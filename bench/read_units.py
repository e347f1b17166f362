#!/usr/bin/env python3
"""bench/read_units: OPT over read units against OPT over rows (docs/algorithm.md, "Read units").

N rows, k rows to a read unit (a Parquet row group), E epochs of a seeded
shuffle of the rows; a cache of a share f of the data. Prints, for each k
and f, the hits and bytes read (in multiples of the data) of OPT planned
over rows (what its plan counts, and what it really reads when every miss
reads the whole unit) and of OPT planned over the units.

    python bench/read_units.py [--rows 4096] [--epochs 3]
"""

from __future__ import annotations

import argparse

import numpy as np

import opt4torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n = args.rows
    rng = np.random.default_rng(args.seed)
    seq = np.concatenate([rng.permutation(n) for _ in range(args.epochs)]).astype(np.int64)
    print("| rows per read k | cache | OPT over rows: hits, bytes its plan counts | the same plan's real bytes "
          "| OPT over units: hits, bytes |")
    print("|---|---|---|---|---|")
    for f in (0.25, 0.5):
        for k in (1, 4, 16, 64):
            rows = opt4torch.plan(seq, capacity=int(f * n))
            units = opt4torch.plan(seq // k, capacity=max(1, int(f * n / k)))
            counted = (len(seq) - rows.hits) / n
            print(f"| {k} | {f:.0%} | {rows.hits / len(seq):.1%}, {counted:.2f} | {counted * k:.2f} "
                  f"| {units.hits / len(seq):.1%}, {(len(seq) - units.hits) * k / n:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
