"""Run under torchrun by test_distributed.py: each rank trains over a
DistributedSampler with opt4torch.DataLoader, in lockstep like DDP (an
all_reduce per step), checks every sample, and rank 0 writes what it saw."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(__file__))
from datasets_for_tests import Checked, expected_tensor  # noqa: E402

import opt4torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", action="store_true")
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--capacity", type=int, default=120, help="total across the node's ranks")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = Checked(args.items)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, seed=11)
    per_rank = args.capacity if args.shared else args.capacity // world
    loader = opt4torch.DataLoader(ds, batch_size=16, sampler=sampler, num_workers=args.workers,
                                  cache_items=per_rank, epochs=args.epochs, share_across_ranks=args.shared,
                                  multiprocessing_context="fork" if args.workers else None, wait_timeout=60)
    bad = 0
    steps = 0
    for _ in range(args.epochs):
        for x, y in loader:
            bad += sum(not torch.equal(row, expected_tensor(i)) for row, i in zip(x, y.tolist()))
            dist.all_reduce(torch.ones(1))  # lockstep, as gradient synchronisation would
            steps += 1
    st = loader.cache.stats()
    mine = {"rank": rank, "bad": bad, "steps": steps, "stats": st, "plan_hits": loader.cache.plan.hits,
            "plan_accesses": loader.cache.plan.accesses}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    dist.barrier()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(everyone, f)
    loader.cache.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
