"""Run under torchrun by test_cluster_exit.py (issue 39): a cluster=True
loader over a RecordFile, each rank a node of its own, a DistributedSampler
and one worker, that ends the way training scripts end, with an epoch cut.

Epoch 0 runs whole; epoch ``--cut-epoch`` stops after ``--cut-batch``
batches (``first``: after one, ``middle``, ``last``: before the last one,
``end``: the epoch runs to its end, as a job stopped between epochs, or a
number), the same step on every rank; ``state_dict()`` is taken on every
rank, and then ``--end``:

``close+destroy``
    ``loader.cache.close()``, then ``dist.destroy_process_group()``;
``destroy``
    ``dist.destroy_process_group()`` alone, the loader still alive (closed at
    exit);
``exit``
    nothing: the interpreter exits with the loader and the group alive;
``drop``
    ``del loader`` (collected at once), then ``dist.destroy_process_group()``.

Each rank writes ``<out>.<rank>.json`` (its state, how long the ending
took, the loader's closing note, the samples that were not the plan's item
or not its bytes, the transfer thread's errors) just before it ends."""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import time
import warnings

import torch.distributed as dist

import opt4torch


def size_of(x: int, big: bool = False) -> int:
    return 4096 + (x * 7919) % 12288 if big else 64 + (x * 7919) % 700


def write(path: str, n: int, big: bool = False) -> None:
    opt4torch.write_records(path, (bytes([x % 256]) * size_of(x, big) for x in range(n)), progress=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", required=True, help="the record file (written by rank 0 when missing)")
    ap.add_argument("--items", type=int, default=240)
    ap.add_argument("--big", action="store_true", help="items of 4-16 KB, as bench/cluster.py's (else 64-763 bytes)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--context", default="fork")
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--cut-epoch", type=int, default=1)
    ap.add_argument("--cut-batch", default="7")
    ap.add_argument("--end", default="close+destroy", choices=["close+destroy", "destroy", "exit", "drop"])
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds a storage read takes (RecordFile's)")
    ap.add_argument("--step", type=float, default=0.0, help="seconds a training step takes (a sleep a batch)")
    ap.add_argument("--late-rank", type=int, default=-1, help="a rank that ends --late seconds after the others")
    ap.add_argument("--late", type=float, default=0.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0 and not os.path.exists(args.records):
        write(args.records, args.items, args.big)
    dist.barrier()
    ds = opt4torch.RecordFile(args.records, latency=args.latency)
    # The process groups registered before the loader (torch's own table):
    # a closed loader leaves none of its own behind (issue 39).
    groups_before = len(dist.distributed_c10d._world.pg_map)
    groups_after_close = None
    loader = opt4torch.DataLoader(
        ds, cluster=True, cluster_alone=False, cluster_window=args.window, cluster_timeout=args.timeout, wait_timeout=args.timeout, shuffle=True, seed=5,
        epochs=args.epochs, batch_size=args.batch, cache_bytes=sum(size_of(x, args.big) for x in range(len(ds))) // 4,
        num_workers=args.workers, persistent_workers=args.persistent and args.workers > 0,
        multiprocessing_context=args.context if args.workers > 0 else None, collate_fn=list)
    per_epoch = len(loader)
    cut = {"first": 1, "middle": per_epoch // 2, "last": per_epoch - 1, "end": per_epoch + 1}.get(args.cut_batch)
    cut = int(args.cut_batch) if cut is None else cut
    # What each read must be: the node plan's reads, in order (one rank a node).
    plan = loader.node_plan
    want = plan.seq[plan.reads].tolist()
    batches = samples = wrong = 0
    for epoch in range(args.epochs):
        for b, batch in enumerate(loader):
            batches += 1
            for got in batch:
                x = want[samples] if samples < len(want) else -1
                wrong += x < 0 or bytes(got) != bytes([x % 256]) * size_of(x, args.big)
                samples += 1
            if args.step:
                time.sleep(args.step)
            if epoch == args.cut_epoch and b + 1 == cut:
                break
        if epoch == args.cut_epoch:
            break
    state = loader.state_dict()
    if rank == args.late_rank:  # a rank slower to end (saving a checkpoint): the others' close waits for it
        time.sleep(args.late)
    t0 = time.monotonic()
    errors = None  # the transfer thread's (stats()'s cluster_errors) once it has ended
    thread_ended = destroyed = None
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        if args.end == "close+destroy":
            rt = loader.cache.transfers
            loader.cache.close()
            errors = rt.stats(0)["cluster_errors"]
            groups_after_close = len(dist.distributed_c10d._world.pg_map)
            dist.destroy_process_group()
        elif args.end == "destroy":
            dist.destroy_process_group()
            destroyed = time.monotonic() - t0
            # The loader notices: its transfer thread (the node's) ends by itself,
            # once out of the store or read it was in (its waits for the workers'
            # reads, each bounded by wait_timeout: the loader is not closed, so
            # the workers may still read, and nothing interrupts them).
            rt = loader.cache.transfers
            while not rt.done and time.monotonic() - t0 < 3 * args.timeout + 10:
                time.sleep(0.05)
            thread_ended = rt.done
            errors = rt.stats(0)["cluster_errors"]
            if not thread_ended:  # where it is, for the test's failure message
                faulthandler.dump_traceback(all_threads=True)
        elif args.end == "drop":
            del loader
            gc.collect()
            dist.destroy_process_group()
    if args.out:
        with open(f"{args.out}.{rank}.json", "w") as f:
            json.dump({"rank": rank, "batches": batches, "per_epoch": per_epoch, "state": state,
                       "samples": samples, "wrong": wrong, "cluster_errors": errors,
                       "end_seconds": time.monotonic() - t0,
                       "thread_ended": thread_ended, "destroy_seconds": destroyed,
                       "groups_before": groups_before, "groups_after_close": groups_after_close,
                       "warnings": [str(w.message) for w in said]}, f)


if __name__ == "__main__":
    main()
