#!/usr/bin/env python3
"""bench/cluster_plan_scale: what planning a ``cluster=True`` job costs at
ImageNet-1k, 90 epochs, 64 nodes of 8 ranks (issue 36, "Scale"), on the rank
of a node that plans and on the ranks that do not.

Each node's first rank plans (distributed/setup.py, ``plan_once_per_node``):
it captures every rank's order from a ``DistributedSampler``
(:func:`capture_ranks`), plans the cluster over the global timeline
(:func:`cluster_plan`, the loader's default window of 8 steps, a cache of
``--capacity`` of the dataset over all nodes), takes its node's part
(``share_of``: the node plan, each position's rank, the pool's plan) and
writes it to /dev/shm (distributed/handoff.py). The node's other ranks map
that part (``read_share``) and find their batches in it. The collectives
around this are left out (there is one job, not 512 ranks, on this machine).

Each size runs in fresh processes, one after the other: the planning rank,
then one rank that does not plan, reading the planner's files. Each reports
its wall times and its peak resident memory (``VmHWM``) above what the
process held before (torch and opt4torch imported), and what it still holds
after. A rank that does not plan maps the node's files: its resident pages
of them are shared by the node's ranks, so its own cost is its anonymous
memory (``/proc/self/smaps_rollup``), and the files count once a node. Time
and memory are linear in the accesses (items x epochs); a least-squares
line through the measured points models the sizes past what fits.

    python bench/cluster_plan_scale.py [--epochs 1,8,16] [--items 1281167]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

COMMON = r"""
import gc, json, os, sys, time
import numpy as np

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no " + key)

def anon():
    # Anonymous memory: the process's own, not the node's files it maps
    # (tmpfs pages, shared by every rank that maps them).
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Anonymous in smaps_rollup")

import torch
from torch.utils.data import DistributedSampler
from opt4torch.distributed.handoff import read_share, write_share
from opt4torch.distributed.setup import _batches, share_of
from opt4torch.planning.capture import capture_ranks
from opt4torch.planning.cluster import cluster_plan
"""

LEADER = COMMON + r"""
items, epochs, nodes, per_node, batch, capacity, window = (int(a) for a in sys.argv[1:8])
path = sys.argv[8]
world = nodes * per_node
base = status("VmRSS")
sampler = DistributedSampler(range(items), num_replicas=world, rank=0, shuffle=True, seed=0)
t0 = time.perf_counter()
seqs = capture_ranks(sampler, epochs, progress=False)
t1 = time.perf_counter()
node_of_rank = [r // per_node for r in range(world)]
cp = cluster_plan(seqs, node_of_rank, capacity // nodes, batch_size=batch, window=window, progress=False)
del seqs
t2 = time.perf_counter()
share = share_of(cp, 0)
t3 = time.perf_counter()
write_share(path, share)
t4 = time.perf_counter()
gc.collect()
accesses, transfers = cp.accesses, cp.peer_hits + cp.remote_admits
kept = status("VmRSS") - base  # what the leader holds after planning: the global plan and its node's part
del cp
gc.collect()
import ctypes
ctypes.CDLL("libc.so.6").malloc_trim(0)  # the heap's freed pages back, as a long run's would go in time
without = status("VmRSS") - base  # had it dropped the global plan, keeping its node's part
print(json.dumps({"accesses": accesses, "transfers": int(transfers), "node_positions": len(share.node_plan),
                  "capture_s": t1 - t0, "plan_s": t2 - t1, "share_s": t3 - t2, "write_s": t4 - t3,
                  "peak_bytes": status("VmHWM") - base, "kept_bytes": kept, "kept_without_plan_bytes": without,
                  "share_file_bytes": os.path.getsize(path) + os.path.getsize(path + ".plan")}))
"""

FOLLOWER = COMMON + r"""
items, epochs, nodes, per_node, batch = (int(a) for a in sys.argv[1:6])
path = sys.argv[6]
world = nodes * per_node
base, base_own = status("VmRSS"), anon()
sampler = DistributedSampler(range(items), num_replicas=world, rank=1, shuffle=True, seed=0)
t0 = time.perf_counter()
share = read_share(path)
starts, own, floors = _batches(share.node_plan, share.ranks, 1, sampler, epochs, batch)
t1 = time.perf_counter()
print(json.dumps({"positions": len(share.node_plan), "batches": int(sum(s.size for s in starts)),
                  "map_s": t1 - t0, "peak_bytes": status("VmHWM") - base, "own_bytes": anon() - base_own}))
"""


def _child(script: str, *args: Any) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"a measuring process failed ({out.returncode}): {out.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=1_281_167, help="dataset items (ImageNet-1k's train split)")
    ap.add_argument("--epochs", default="1,8,16", help="comma-separated epoch counts to measure")
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32, help="samples a rank reads per step")
    ap.add_argument("--capacity", type=float, default=0.5, help="the cluster's cache, a fraction of the items")
    ap.add_argument("--window", type=int, default=8, help="steps a transfer window (the loader's default)")
    ap.add_argument("--model-epochs", type=int, default=90)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cluster_plan_scale.json"))
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    from _machine import machine  # type: ignore[import-not-found]
    from opt4torch.distributed.handoff import remove_share, share_path

    ranks = args.ranks_per_node
    rows: list[dict[str, Any]] = []
    for e in (int(x) for x in args.epochs.split(",")):
        print(f"planning {args.items:,} items x {e} epochs over {args.nodes} nodes of {ranks} ranks", flush=True)
        path = share_path(f"bench{e}", 0)
        try:
            lead = _child(LEADER, args.items, e, args.nodes, ranks, args.batch, int(args.capacity * args.items),
                          args.window, path)
            follow = _child(FOLLOWER, args.items, e, args.nodes, ranks, args.batch, path)
        finally:
            remove_share(path)
        node = lead["peak_bytes"] + (ranks - 1) * follow["own_bytes"] + lead["share_file_bytes"]
        row = {"epochs": e, "accesses": lead["accesses"], "leader": lead, "follower": follow,
               "node_peak_bytes": node, "every_rank_plans_bytes": ranks * lead["peak_bytes"]}
        rows.append(row)
        gib = 2**30
        print(f"  {lead['accesses']:,} accesses. Planning rank: capture {lead['capture_s']:.1f} s, plan "
              f"{lead['plan_s']:.1f} s, node part {lead['share_s']:.1f} s, write {lead['write_s']:.2f} s; peak "
              f"{lead['peak_bytes'] / gib:.2f} GiB ({lead['peak_bytes'] / lead['accesses']:.0f} B an access), "
              f"{lead['kept_bytes'] / gib:.2f} GiB kept after ({lead['kept_without_plan_bytes'] / gib:.2f} GiB "
              f"without the global plan); node part {lead['share_file_bytes'] / 2**20:.0f} MiB "
              f"({follow['positions']:,} positions)", flush=True)
        print(f"  Rank that does not plan: {follow['map_s']:.2f} s, peak {follow['peak_bytes'] / 2**20:.0f} MiB "
              f"(mapped files included), its own {follow['own_bytes'] / 2**20:.0f} MiB. A node of {ranks}: "
              f"{node / gib:.2f} GiB (every rank planning: {row['every_rank_plans_bytes'] / gib:.1f} GiB)",
              flush=True)

    import numpy as np

    acc = np.array([r["accesses"] for r in rows], dtype=float)
    model: dict[str, Any] = {"accesses": args.items * args.model_epochs}

    def fit(values: list[float]) -> float:
        y = np.array(values, dtype=float)
        slope, icpt = np.polyfit(acc, y, 1) if len(rows) > 1 else (y[0] / acc[0], 0.0)
        return float(slope * model["accesses"] + icpt)

    for key in ("capture_s", "plan_s", "share_s", "write_s", "peak_bytes", "kept_bytes", "share_file_bytes"):
        model[f"leader_{key}"] = fit([r["leader"][key] for r in rows])
    for key in ("map_s", "peak_bytes", "own_bytes"):
        model[f"follower_{key}"] = max(0.0, fit([r["follower"][key] for r in rows]))
    model["node_peak_bytes"] = fit([r["node_peak_bytes"] for r in rows])
    model["every_rank_plans_bytes"] = ranks * model["leader_peak_bytes"]
    gib = 2**30
    print(f"modelled, {args.model_epochs} epochs ({model['accesses']:,} accesses): planning rank "
          f"{model['leader_capture_s'] + model['leader_plan_s'] + model['leader_share_s']:.0f} s, peak "
          f"{model['leader_peak_bytes'] / gib:.1f} GiB; a rank that does not plan {model['follower_map_s']:.1f} s, "
          f"{model['follower_own_bytes'] / 2**20:.0f} MiB of its own; node of {ranks}: "
          f"{model['node_peak_bytes'] / gib:.1f} GiB (every rank planning: "
          f"{model['every_rank_plans_bytes'] / gib:.1f} GiB)")
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "args": vars(args), "rows": rows, "model": model}, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
