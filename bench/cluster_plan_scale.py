#!/usr/bin/env python3
"""bench/cluster_plan_scale: what one cluster plan costs to build, and what it
would cost at ImageNet-1k, 90 epochs, 64 nodes of 8 ranks (issue 36, "Scale").

A cluster plan is made the way a ``cluster=True`` job makes it
(:func:`opt4torch.planning.cluster.job_plan` without the collectives): capture
every rank's order from a ``DistributedSampler`` (:func:`capture_ranks`),
then :func:`cluster_plan` over the global timeline, with the loader's default
window (8 steps) and a cache of ``--capacity`` of the dataset over all nodes.

Each size runs in a fresh process, which reports the wall time of the capture
and of the plan, and the peak resident memory (``VmHWM``) above what the
process held before the capture. The sizes are ImageNet-1k's 1,281,167 items
and 512 ranks in 64 nodes, at 1, 2 and 4 epochs (what fits this machine);
time and memory are linear in the accesses (items x epochs), so a
least-squares line through the measured points gives 90 epochs.

    python bench/cluster_plan_scale.py [--epochs 1,2,4] [--items 1281167]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, sys, time
import numpy as np

def hwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")

import torch
from torch.utils.data import DistributedSampler
from opt4torch import capture_ranks
from opt4torch.cluster import cluster_plan

items, epochs, nodes, per_node, batch, capacity, window = (int(a) for a in sys.argv[1:8])
world = nodes * per_node
base = rss()
sampler = DistributedSampler(range(items), num_replicas=world, rank=0, shuffle=True, seed=0)
t0 = time.perf_counter()
seqs = capture_ranks(sampler, epochs, progress=False)
t1 = time.perf_counter()
node_of_rank = [r // per_node for r in range(world)]
plan = cluster_plan(seqs, node_of_rank, capacity // nodes, batch_size=batch, window=window, progress=False)
t2 = time.perf_counter()
print(json.dumps({"accesses": int(plan.accesses), "capture_s": t1 - t0, "plan_s": t2 - t1,
                  "peak_bytes": hwm() - base, "hits": int(plan.hits), "peer_hits": int(plan.peer_hits),
                  "local_hits": int(plan.local_hits), "late": int(plan.late)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=1_281_167, help="dataset items (ImageNet-1k's train split)")
    ap.add_argument("--epochs", default="1,2,4", help="comma-separated epoch counts to measure")
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

    rows: list[dict[str, Any]] = []
    for e in (int(x) for x in args.epochs.split(",")):
        cmd = [sys.executable, "-c", CHILD, str(args.items), str(e), str(args.nodes), str(args.ranks_per_node),
               str(args.batch), str(int(args.capacity * args.items)), str(args.window)]
        print(f"planning {args.items:,} items x {e} epochs over {args.nodes} nodes of {args.ranks_per_node} ranks",
              flush=True)
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        row = {"epochs": e, **json.loads(out.stdout.strip().splitlines()[-1])}
        rows.append(row)
        print(f"  {row['accesses']:,} accesses: capture {row['capture_s']:.1f} s, plan {row['plan_s']:.1f} s, "
              f"peak {row['peak_bytes'] / 2**30:.2f} GiB ({row['peak_bytes'] / row['accesses']:.0f} B an access)",
              flush=True)

    import numpy as np
    acc = np.array([r["accesses"] for r in rows], dtype=float)
    model: dict[str, Any] = {"accesses": args.items * args.model_epochs}
    for key in ("capture_s", "plan_s", "peak_bytes"):
        y = np.array([r[key] for r in rows], dtype=float)
        slope, icpt = np.polyfit(acc, y, 1) if len(rows) > 1 else (y[0] / acc[0], 0.0)
        model[key] = float(slope * model["accesses"] + icpt)
    ranks = args.ranks_per_node
    print(f"modelled, {args.model_epochs} epochs ({model['accesses']:,} accesses): capture "
          f"{model['capture_s']:.0f} s, plan {model['plan_s']:.0f} s, peak {model['peak_bytes'] / 2**30:.1f} GiB "
          f"a planner; a node whose {ranks} ranks each plan: {ranks * model['peak_bytes'] / 2**30:.1f} GiB")
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "args": vars(args), "rows": rows, "model": model}, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
