"""Run under torchrun by test_cluster_exit.py (issue 39): a cluster=True
loader over a RecordFile, each rank a node of its own, a DistributedSampler
and one worker, that ends the way training scripts end, with an epoch cut.

Epoch 0 runs whole; epoch ``--cut-epoch`` stops after ``--cut-batch``
batches (``first``: after one, ``middle``, ``last``: before the last one, or
a number), ``state_dict()`` is taken on every rank, and then ``--end``:

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
took, the loader's closing note) just before it ends."""

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


def size_of(x: int) -> int:
    return 64 + (x * 7919) % 700


def write(path: str, n: int) -> None:
    opt4torch.write_records(path, (bytes([x % 256]) * size_of(x) for x in range(n)), progress=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", required=True, help="the record file (written by rank 0 when missing)")
    ap.add_argument("--items", type=int, default=240)
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
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0 and not os.path.exists(args.records):
        write(args.records, args.items)
    dist.barrier()
    ds = opt4torch.RecordFile(args.records)
    # The process groups registered before the loader (torch's own table):
    # a closed loader leaves none of its own behind (issue 39).
    groups_before = len(dist.distributed_c10d._world.pg_map)
    groups_after_close = None
    loader = opt4torch.DataLoader(
        ds, cluster=True, cluster_window=args.window, cluster_timeout=args.timeout, wait_timeout=args.timeout, shuffle=True, seed=5,
        epochs=args.epochs, batch_size=args.batch, cache_bytes=sum(size_of(x) for x in range(len(ds))) // 4,
        num_workers=args.workers, persistent_workers=args.persistent and args.workers > 0,
        multiprocessing_context=args.context if args.workers > 0 else None, collate_fn=list)
    per_epoch = len(loader)
    cut = {"first": 1, "middle": per_epoch // 2, "last": per_epoch - 1}.get(args.cut_batch)
    cut = int(args.cut_batch) if cut is None else cut
    batches = 0
    for epoch in range(args.epochs):
        for b, _ in enumerate(loader):
            batches += 1
            if epoch == args.cut_epoch and b + 1 == cut:
                break
        if epoch == args.cut_epoch:
            break
    state = loader.state_dict()
    t0 = time.monotonic()
    thread_ended = destroyed = None
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        if args.end == "close+destroy":
            loader.cache.close()
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
            if not thread_ended:  # where it is, for the test's failure message
                faulthandler.dump_traceback(all_threads=True)
        elif args.end == "drop":
            del loader
            gc.collect()
            dist.destroy_process_group()
    if args.out:
        with open(f"{args.out}.{rank}.json", "w") as f:
            json.dump({"rank": rank, "batches": batches, "per_epoch": per_epoch, "state": state,
                       "end_seconds": time.monotonic() - t0,
                       "thread_ended": thread_ended, "destroy_seconds": destroyed,
                       "groups_before": groups_before, "groups_after_close": groups_after_close,
                       "warnings": [str(w.message) for w in said]}, f)


if __name__ == "__main__":
    main()
