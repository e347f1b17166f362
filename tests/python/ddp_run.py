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
    ap.add_argument("--resume-after", type=int, default=-1,
                    help="stop after this many batches of epoch 1, save the state, and resume in a new loader")
    ap.add_argument("--bad-state", choices=["negative", "swapped"],
                    help="with --resume-after: rank 1 loads a state with batches_done=-1 (negative), or the "
                         "ranks load each other's states (swapped); every rank records its refusal")
    ap.add_argument("--parquet", help="then, with --shared: opt4torch.Parquet over this folder's files, one "
                                      "pool for the node's ranks, planned over page ranges (rank 0 writes it)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = Checked(args.items)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, seed=11)
    per_rank = args.capacity if args.shared else args.capacity // world

    def make() -> opt4torch.DataLoader:
        return opt4torch.DataLoader(ds, batch_size=16, sampler=sampler, num_workers=args.workers,
                                    cache_items=per_rank, epochs=args.epochs, share_across_ranks=args.shared,
                                    multiprocessing_context="fork" if args.workers else None, wait_timeout=60)

    loader = make()
    bad = 0
    steps = 0
    seen: list[int] = []

    def run(batches) -> None:
        nonlocal bad, steps
        for x, y in batches:
            bad += sum(not torch.equal(row, expected_tensor(i)) for row, i in zip(x, y.tolist()))
            seen.extend(y.tolist())
            dist.all_reduce(torch.ones(1))  # lockstep, as gradient synchronisation would
            steps += 1

    mine: dict = {"rank": rank}
    if args.resume_after >= 0:
        # Epoch 0, then part of epoch 1; save, drop the loader (and its pool),
        # and go on in a new one from the saved state.
        run(loader)
        it = iter(loader)
        run(next(it) for _ in range(args.resume_after))
        state = loader.state_dict()
        del it
        dist.barrier()
        loader.cache.close()
        dist.barrier()
        loader = make()
        if args.bad_state is not None:
            if args.bad_state == "negative" and rank == 1:
                state = {**state, "batches_done": -1}
            elif args.bad_state == "swapped":
                states: list = [None] * world
                dist.all_gather_object(states, state)
                state = states[(rank + 1) % world]
            try:
                loader.load_state_dict(state)
                mine["refused"] = None
            except ValueError as exc:
                mine["refused"] = str(exc)
            mine["resumed_at"] = loader.resumed_at
            everyone: list = [None] * world
            dist.all_gather_object(everyone, mine)
            if rank == 0:
                with open(args.out, "w") as f:
                    json.dump(everyone, f)
            dist.barrier()
            loader.cache.close()
            dist.destroy_process_group()
            return
        loader.load_state_dict(state)
        seen.clear()
        for _ in range(1, args.epochs):
            run(loader)
        # What the uninterrupted run reads from there on, by the sampler itself.
        want = []
        for e in range(1, args.epochs):
            sampler.set_epoch(e)
            want.extend(list(sampler)[16 * args.resume_after if e == 1 else 0:])
        kinds = loader.cache.plan.kinds
        mine.update({"resumed_at": loader.resumed_at, "order_ok": seen == want,
                     "plan_hits_after": int((kinds[loader.resumed_at:] == opt4torch.HIT).sum())})
    else:
        for _ in range(args.epochs):
            run(loader)
    dist.barrier()  # every rank done: the shared pool's counters are final
    st = loader.cache.stats()
    mine.update({"bad": bad, "steps": steps, "stats": st, "plan_hits": loader.cache.plan.hits,
                 "plan_accesses": loader.cache.plan.accesses})
    if args.parquet:
        mine["parquet"] = parquet_shared(args, rank, world)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    dist.barrier()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(everyone, f)
    loader.cache.close()
    dist.destroy_process_group()


def parquet_shared(args: argparse.Namespace, rank: int, world: int) -> dict:
    """Rows of Parquet files through one pool for the node's ranks: the plan
    is over the read units of the ranks' merged rows; every row is checked
    against pyarrow's reading (by its id) and every epoch's ids against the
    sampler's."""
    import glob

    import numpy as np
    import pyarrow.parquet as pq

    paths = sorted(glob.glob(os.path.join(args.parquet, "*.parquet")))
    ds = opt4torch.Parquet(paths)
    want = [row for p in paths for row in pq.read_table(p).to_pylist()]
    sampler = DistributedSampler(range(len(ds)), num_replicas=world, rank=rank, seed=5)
    loader = opt4torch.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=args.workers, epochs=2,
                                  collate_fn=list, share_across_ranks=True, cache_bytes=int(ds.unit_sizes().sum()) // 3,
                                  multiprocessing_context="fork" if args.workers else None, wait_timeout=60)
    bad = order_bad = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        expected = list(sampler)
        got = []
        for batch in loader:
            for row in batch:
                bad += row != want[row["id"]]
                got.append(row["id"])
            dist.all_reduce(torch.ones(1))
        order_bad += got != expected
    dist.barrier()
    st = loader.cache.stats()
    plan = loader.cache.plan
    out = {"bad": bad, "order_bad": order_bad, "hits": st["hits"], "plan_hits": plan.hits,
           "fallbacks": st["fallbacks"], "timeouts": st["timeouts"], "storage_bytes": st["storage_bytes"],
           "plan_miss_bytes": int(ds.unit_sizes()[plan.seq[plan.kinds != opt4torch.HIT]].sum()),
           "accesses": plan.accesses, "units": len(ds.unit_sizes())}
    dist.barrier()
    loader.cache.close()
    return out


if __name__ == "__main__":
    main()
