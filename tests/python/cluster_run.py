"""Run under torchrun by test_cluster_job.py: every rank plans the job's
cluster plan (opt4torch.cluster.job_plan) and writes what it got, or the
error it raised, to <out>.<rank>.json."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(__file__))
from datasets_for_tests import Checked  # noqa: E402

from opt4torch.cluster import job_plan  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--capacity", type=int, default=25)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--odd-seed-rank", type=int, default=-1, help="this rank's sampler gets another seed")
    ap.add_argument("--odd-sizes-rank", type=int, default=-1,
                    help="plan in bytes, and this rank sees other item sizes (the same count): only the "
                         "checksums can tell")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = Checked(args.items)
    seed = 12 if rank == args.odd_seed_rank else 11
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, seed=seed)
    sizes = np.full(args.items, 1000, dtype=np.int64)
    capacity: dict = {"capacity_per_node": args.capacity}
    if args.odd_sizes_rank >= 0:
        sizes = 500 + (np.arange(args.items) * 37) % 1000
        if rank == args.odd_sizes_rank:
            sizes = sizes[::-1].copy()
        capacity = {"cache_bytes": args.capacity * 1000, "page_size": 256}
    result: dict = {"rank": rank}
    try:
        plan, node = job_plan(sampler, args.epochs, batch_size=args.batch, item_sizes=sizes, **capacity)
        result.update(node=node, nodes=plan.n_nodes, checksum=plan.checksum, node_stats=plan.node_stats(),
                      hits=plan.hits, accesses=plan.accesses)
    except (ValueError, RuntimeError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    with open(f"{args.out}.{rank}.json", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
