"""Run under torchrun by test_cluster_loader.py: opt4torch.DataLoader(...,
cluster=True), each rank a node of its own (OPT4TORCH_NODE=rank) or several
ranks a node (rank//K, or unset: one node), with fork workers, for E epochs of DistributedSampler shuffle. Every sample is checked
against the source; the dataset counts its reads in shared memory (workers
and the transfer thread). Writes stats() and the counts to <out>.<rank>.json.

--vanish-rank R --vanish-batch B: rank R leaves without a word
(os._exit(0)) after B batches of its first epoch; --kill instead kills it
(SIGKILL), which torchrun answers by stopping every rank.

--stall-node N --stall-window K --stall-seconds S: node N's transfer
thread sleeps S seconds before the collective of window K (the first
window with a transfer from K on), as a node late in the exchange would;
--lockstep: the ranks step together (a barrier after every batch, as DDP's
all-reduce makes them); --step-seconds S: each step computes S seconds
(slept); --log-every B: live figures every B batches
(log_every), kept in the output."""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import multiprocessing
import os
import signal
import time
from typing import Any

import numpy as np
import torch.distributed as dist

import opt4torch
from opt4torch.planning.cluster import ClusterPlan, plans_made


def size_of(x: int) -> int:
    return 64 + (x * 7919) % 2000


def content(x: int) -> np.ndarray:
    return np.random.default_rng(x).integers(0, 256, size=size_of(x), dtype=np.uint8)


class Items:
    """x -> (x, its bytes); counts reads and bytes in shared memory."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.counts = multiprocessing.Array("q", 2)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, x: int) -> tuple[int, np.ndarray]:
        with self.counts.get_lock():
            self.counts[0] += 1
            self.counts[1] += size_of(x)
        return x, content(x)

    def opt4_item_bytes(self, x: int) -> int:
        return size_of(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=600)
    ap.add_argument("--fraction", type=float, default=0.25, help="a node's cache, of the dataset's bytes")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--prefetch", action="store_true")
    ap.add_argument("--no-persistent", action="store_true", help="fork the workers anew every epoch")
    ap.add_argument("--vanish-rank", type=int, default=-1)
    ap.add_argument("--vanish-batch", type=int, default=-1)
    ap.add_argument("--kill", action="store_true")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--wait-timeout", type=float, default=None, help="a worker's wait (default: --timeout)")
    ap.add_argument("--stall-node", type=int, default=-1)
    ap.add_argument("--stall-window", type=int, default=-1)
    ap.add_argument("--stall-seconds", type=float, default=0.0)
    ap.add_argument("--lockstep", action="store_true")
    ap.add_argument("--step-seconds", type=float, default=0.0, help="a training step's compute, slept")
    ap.add_argument("--log-every", type=int, default=None)
    ap.add_argument("--alone", choices=["auto", "yes", "no"], default="no",
                    help="cluster_alone= None, True or False (no: the exchange under test runs)")
    ap.add_argument("--fail-planning-rank", type=int, default=-1,
                    help="this rank's planning raises MemoryError; every rank writes the error it got")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stalled: list[int] = []
    if args.stall_node >= 0:
        from opt4torch.distributed.exchange import Exchange

        # Where a window's collective is issued (Exchange.run is begin, then complete).
        begin_window = Exchange.begin

        def late_begin(self: Any, k: int, *a: Any, **kw: Any) -> Any:
            if self.node == args.stall_node and k >= args.stall_window and not stalled and k in self.windows:
                stalled.append(k)
                time.sleep(args.stall_seconds)
            return begin_window(self, k, *a, **kw)

        Exchange.begin = late_begin  # type: ignore[method-assign]
    if args.fail_planning_rank >= 0:
        from opt4torch.distributed import setup

        def failing_plan(*a: Any, **kw: Any) -> Any:
            if rank == args.fail_planning_rank:
                raise MemoryError("injected: no memory to plan")
            return plan_agreed(*a, **kw)

        plan_agreed, setup.plan_agreed = setup.plan_agreed, failing_plan  # type: ignore[assignment]
    figures: list[dict[str, Any]] = []
    ds = Items(args.items)
    total = sum(size_of(x) for x in range(args.items))
    t0 = time.monotonic()
    try:
        loader = make_loader(args, ds, total, figures)
    except Exception as exc:
        if args.fail_planning_rank < 0:
            raise
        with open(f"{args.out}.{rank}.json", "w") as f:
            json.dump({"rank": rank, "error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - t0,
                       "plans_made": plans_made()}, f)
        dist.destroy_process_group()
        return
    run_loader(args, rank, ds, loader, figures, stalled, plans_alive())


def plans_alive() -> int:
    """Cluster plans alive in this process (after a collection): a leader
    lets its plan go once it took its node's part and transfers
    (distributed/setup.py), so a built loader holds none."""
    gc.collect()
    return sum(isinstance(o, ClusterPlan) for o in gc.get_objects())


def make_loader(args: Any, ds: Items, total: int, figures: list[dict[str, Any]]) -> Any:
    return opt4torch.DataLoader(
        ds, cluster=True, cluster_window=args.window, cluster_timeout=args.timeout, shuffle=True, seed=3,
        epochs=args.epochs, batch_size=args.batch, cache_bytes=int(args.fraction * total) + 4096,
        num_workers=args.workers, persistent_workers=args.workers > 0 and not args.no_persistent, multiprocessing_context="fork",
        collate_fn=list, prefetch=args.prefetch,
        wait_timeout=args.timeout if args.wait_timeout is None else args.wait_timeout,
        log_every=args.log_every, on_stats=figures.append if args.log_every else None,
        cluster_alone={"auto": None, "yes": True, "no": False}[args.alone])


def run_loader(args: Any, rank: int, ds: Items, loader: Any, figures: list[dict[str, Any]],
               stalled: list[int], alive: int) -> None:
    wrong = samples = 0
    seen: list[int] = []
    for epoch in range(args.epochs):
        for b, batch in enumerate(loader):
            if rank == args.vanish_rank and epoch == 0 and b == args.vanish_batch:
                # A node that leaves takes its DataLoader workers with it. Left
                # here they could block for good on the dataset's counter lock,
                # if this process's transfer thread held it at the exit, and keep
                # torchrun's output open after the job ended.
                from opt4torch.lab.launch import descendants

                for pid in descendants(os.getpid()):
                    os.kill(pid, signal.SIGKILL)
                if args.kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(0)
            for x, got in batch:
                samples += 1
                wrong += not np.array_equal(got, content(int(x)))
                seen.append(int(x))
            if args.step_seconds:
                time.sleep(args.step_seconds)
            if args.lockstep:
                dist.barrier()
    rt = loader.cache.transfers
    rt.finish()  # its last windows, after the last batch here (the node's first rank's)
    if args.vanish_rank < 0:
        dist.barrier()  # every rank of the node done: the pool's counters are the node's
    st = loader.cache.stats()
    cp = loader.cluster_plan
    out: dict[str, Any] = {
        "rank": rank, "node": loader.node, "wrong": wrong, "samples": samples,
        "storage_reads": ds.counts[0], "storage_bytes": ds.counts[1],
        "stats": {k: v for k, v in st.items() if isinstance(v, (int, float, str, list, type(None)))},
        "node_stats": cp.node_stats()[loader.node], "plan_storage_bytes_all": cp.storage_bytes,
        "accesses": cp.accesses, "late": cp.late, "thread_error": repr(rt.error) if rt.error else None,
        "parks": getattr(getattr(rt, "_gate", None), "parks", None),
        "park_timeouts": getattr(getattr(rt, "_gate", None), "park_timeouts", None),
        "stalled": stalled, "figures": figures,
        # Turns whose collective went out while the turn before stored (runtime.py, _begin_early).
        "begun_early": getattr(rt, "begun_early", None),
        # The leader's windows: those lost, and what each brings this node.
        "failed": list(rt.exchange.failed) if hasattr(rt, "exchange") else None,
        "incoming": {str(k): len(rt.exchange.incoming(k)) for k in rt.exchange.windows}
        if hasattr(rt, "exchange") else None,
        # Each node's first rank plans; the others map its node plan.
        "plans_made": plans_made(), "plan_type": type(cp).__name__, "plans_alive": alive,
        "node_plan_digest": hashlib.sha256(b"".join(np.ascontiguousarray(getattr(rt.plan, k)).tobytes() for k in (
            "seq", "op", "role", "source", "forward", "window", "position"))).hexdigest(),
        "pool_plan_fingerprint": loader.cache.plan.fingerprint,
        "seen_digest": int(np.bitwise_xor.reduce(np.array(seen, dtype=np.int64) * 2654435761 % (1 << 31)))
        if seen else 0,
    }
    with open(f"{args.out}.{rank}.json", "w") as f:
        json.dump(out, f)
    if args.vanish_rank < 0:
        dist.barrier()  # the node's other ranks are done with its pool
    loader.cache.close()
    if args.vanish_rank < 0:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
