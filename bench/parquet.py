#!/usr/bin/env python3
"""bench/parquet: the earlier command line of the Parquet comparison (issue 37),
now ``bench/e2e.py --format parquet`` (opt4torch.lab.e2e_parquet): the same
JPEGs as the end-to-end runs as Hub-style Parquet shards, read by datasets with
torch's DataLoader, datasets in opt4torch.DataLoader, opt4torch.Parquet (page
ranges, row groups, a rewrite in small row groups), LitData and from memory.

This file maps its earlier options onto e2e.py's and runs it, with this
script's earlier defaults (batch 32, crop 128). Unlike the earlier script,
every configuration now trains e2e's small CNN on the batches, and
``--latency`` (an emulated delay for opt4torch.Parquet alone) is gone.

    python bench/parquet.py [--images 1000] [--epochs 3] [--capacity 0.5] [--repeats 3]
        [--store file|s3] [--s3-latency 0.005] [--s3-bandwidth 100e6] [--link 30e6] [--out DIR] [--name NAME]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for opt, default in (("--images", 1000), ("--shards", 4), ("--image-size", 160), ("--image-size-max", 400),
                         ("--crop", 128), ("--epochs", 3), ("--batch", 32), ("--workers", 2), ("--repeats", 3),
                         ("--seed", 0), ("--small-row-group", 8)):
        ap.add_argument(opt, type=int, default=default)
    ap.add_argument("--capacity", type=float, default=0.5)
    ap.add_argument("--configs", default="all")
    ap.add_argument("--store", choices=("file", "s3"), default="file")
    ap.add_argument("--s3-latency", type=float, default=0.005)
    ap.add_argument("--s3-bandwidth", type=float, default=100e6)
    ap.add_argument("--link", type=float, default=30e6)
    ap.add_argument("--data", default="out/e2e-data")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--name", default="e2e-parquet")
    a = ap.parse_args(argv)
    args = ["--format", "parquet", "--latency", str(a.s3_latency), "--bandwidth", str(a.s3_bandwidth)]
    for k, v in vars(a).items():
        if k not in ("s3_latency", "s3_bandwidth", "link"):
            args += [f"--{k.replace('_', '-')}", str(v)]
    if a.store == "s3":
        args += ["--link", str(a.link)]
    return e2e.main(args)


if __name__ == "__main__":
    raise SystemExit(main())
