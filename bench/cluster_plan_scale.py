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
what its transfer thread keeps (``NodeTransfers.of``: its node's transfer
rows and the windows with a transfer anywhere, found without the cluster's
whole transfer table; then ``routes``, the Exchange's tables of them), writes
the node's part to /dev/shm (distributed/handoff.py) and lets the plan go.
The node's other ranks map
that part (``read_share``) and find their batches in it. The collectives
around this are left out (there is one job, not 512 ranks, on this machine).

Each size runs in fresh processes, one after the other: the planning rank,
then one rank that does not plan, reading the planner's files. Each reports
its wall times and its peak resident memory (``VmHWM``) above what the
process held before (torch and opt4torch imported), and what it still holds
after, with the plan (``kept_bytes``) and once it let the plan go
(``after_bytes``: the node's part and the transfer thread's tables, what
the loader holds while it trains). A rank that does not plan maps the node's files: its resident pages
of them are shared by the node's ranks, so its own cost is its anonymous
memory (``/proc/self/smaps_rollup``), and the files count once a node. Time
and memory are linear in the accesses (items x epochs); a least-squares
line through the measured points models the sizes past what fits.

``--baseline N`` then plans the largest size once more, in a process of its
own, and times the planning rank's step from the plan to what its transfer
thread keeps both ways, N times each, alternating: the way before (commit
31b1f49: the cluster's whole transfer table, ``transfers()``, sorted, its
node's rows picked, and a Python loop over them) and the way now
(``NodeTransfers.of`` and ``routes``), with each one's peak resident memory
above what the process held before it (``VmHWM``, reset through
``/proc/self/clear_refs``).

    python bench/cluster_plan_scale.py [--epochs 1,8,16] [--items 1281167] [--baseline 3]
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
from opt4torch.distributed.exchange import NodeTransfers, routes
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
mine = NodeTransfers.of(cp, 0)  # the leader's transfer thread's part (distributed/setup.py)
t4 = time.perf_counter()
# What its Exchange makes of them (no rooms: a plan in items; group ranks = nodes).
tables = routes(mine, share.node_plan, list(range(nodes)), np.zeros(mine.item.size, np.int64))
t5 = time.perf_counter()
write_share(path, share)
t6 = time.perf_counter()
gc.collect()
accesses, transfers = cp.accesses, cp.peer_hits + cp.remote_admits
kept = status("VmRSS") - base  # with the global plan, its node's part and its transfers
mine_rows, mine_windows, mine_bytes = int(mine.position.size), int(mine.windows.size), mine.nbytes
del cp, mine  # the loader keeps the node's part and its Exchange's tables, not the rows they came from
gc.collect()
import ctypes
ctypes.CDLL("libc.so.6").malloc_trim(0)  # the heap's freed pages back, as a long run's would go in time
after = status("VmRSS") - base  # the plan let go: what the loader holds while it trains
print(json.dumps({"accesses": accesses, "transfers": int(transfers), "node_positions": len(share.node_plan),
                  "node_transfers": mine_rows, "windows": mine_windows,
                  "capture_s": t1 - t0, "plan_s": t2 - t1, "share_s": t3 - t2, "transfers_s": t4 - t3,
                  "routes_s": t5 - t4, "write_s": t6 - t5,
                  "peak_bytes": status("VmHWM") - base, "kept_bytes": kept, "after_bytes": after,
                  "transfers_bytes": mine_bytes, "routes_bytes": tables[0].nbytes + tables[1].nbytes,
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


BASELINE = COMMON + r"""
import ctypes
from opt4torch.planning.cluster import PEER_HIT, RECEIVE, SEND, WORKER
items, epochs, nodes, per_node, batch, capacity, window, repeats = (int(a) for a in sys.argv[1:9])
world = nodes * per_node
sampler = DistributedSampler(range(items), num_replicas=world, rank=0, shuffle=True, seed=0)
seqs = capture_ranks(sampler, epochs, progress=False)
cp = cluster_plan(seqs, [r // per_node for r in range(world)], capacity // nodes, batch_size=batch, window=window,
                  progress=False)
del seqs
node_plan = share_of(cp, 0).node_plan
node, peers = 0, list(range(nodes))

def whole_table():
    # Exchange.__init__ at 31b1f49, line for line (rooms None).
    tr = cp.transfers()
    order = np.lexsort((tr["position"], tr["window"]))
    win, pos, src, dst, kind, item = (tr[k][order] for k in ("window", "position", "src", "dst", "kind", "item"))
    room = np.zeros(item.size, np.int64)
    windows = np.unique(win).tolist()
    ours = np.flatnonzero((src == node) | (dst == node))
    win, pos, src, dst, kind, room = (a[ours] for a in (win, pos, src, dst, kind, room))
    del tr, order, item
    out, into = {}, {}
    p = node_plan
    where = {(int(r), int(t)): i for i, (r, t) in enumerate(zip(p.role, p.position)) if r != WORKER}
    reads = {int(t): i for i, t in zip(p.reads.tolist(), p.position[p.reads].tolist())}
    for k, t, s, d, kd, r in zip(win.tolist(), pos.tolist(), src.tolist(), dst.tolist(), kind.tolist(),
                                 room.tolist()):
        if s == node:
            out.setdefault(k, []).append((peers[d], t, kd, r))
        if d == node:
            at = reads[t] if kd == PEER_HIT else where[(RECEIVE, t)]
            into.setdefault(k, []).append((peers[s], t, at, r))
    for got in into.values():
        got.sort()
    send_at = {t: i for (r, t), i in where.items() if r == SEND}
    return (len(windows), sum(map(len, out.values())) + sum(map(len, into.values())))

def node_part():
    t = NodeTransfers.of(cp, node)
    sent, received, send_at = routes(t, node_plan, peers, np.zeros(t.item.size, np.int64))
    rows = sum(len(sent.get(k)) + len(received.get(k)) for k in t.windows.tolist())
    return (int(t.windows.size), rows)

times = {"before_s": [], "now_s": []}
grew = {"before_bytes": [], "now_bytes": []}
got = {}
for _ in range(repeats):
    for key, fn in (("before", whole_table), ("now", node_part)):
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        base = status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:  # VmHWM from here: this step's peak
            f.write("5")
        t0 = time.perf_counter()
        got[key] = fn()
        times[key + "_s"].append(time.perf_counter() - t0)
        grew[key + "_bytes"].append(status("VmHWM") - base)
assert got["before"] == got["now"], got  # the same windows, the same rows
print(json.dumps({"accesses": cp.accesses, "transfers": int(cp.peer_hits + cp.remote_admits),
                  "windows": got["now"][0], "node_rows": got["now"][1], **times, **grew}))
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
    ap.add_argument("--baseline", type=int, default=0, metavar="N",
                    help="time the step from the plan to the transfer thread's part both ways, N times each, at "
                         "the largest size (0: not)")
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
              f"{lead['plan_s']:.1f} s, node part {lead['share_s']:.1f} s, its transfers {lead['transfers_s']:.2f} s "
              f"({lead['node_transfers']:,} of {lead['transfers']:,}, {lead['windows']} windows) and their "
              f"routes {lead['routes_s']:.2f} s, write {lead['write_s']:.2f} s; peak "
              f"{lead['peak_bytes'] / gib:.2f} GiB ({lead['peak_bytes'] / lead['accesses']:.0f} B an access), "
              f"{lead['kept_bytes'] / gib:.2f} GiB with the plan, {lead['after_bytes'] / gib:.2f} GiB once it let "
              f"it go (transfers {lead['transfers_bytes'] / 2**20:.0f} MiB, routes "
              f"{lead['routes_bytes'] / 2**20:.0f} MiB); node part {lead['share_file_bytes'] / 2**20:.0f} MiB "
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

    for key in ("capture_s", "plan_s", "share_s", "transfers_s", "routes_s", "write_s", "peak_bytes", "kept_bytes",
                "after_bytes", "share_file_bytes"):
        model[f"leader_{key}"] = fit([r["leader"][key] for r in rows])
    for key in ("map_s", "peak_bytes", "own_bytes"):
        model[f"follower_{key}"] = max(0.0, fit([r["follower"][key] for r in rows]))
    model["node_peak_bytes"] = fit([r["node_peak_bytes"] for r in rows])
    model["every_rank_plans_bytes"] = ranks * model["leader_peak_bytes"]
    gib = 2**30
    print(f"modelled, {args.model_epochs} epochs ({model['accesses']:,} accesses): planning rank "
          f"{model['leader_capture_s'] + model['leader_plan_s'] + model['leader_share_s']:.0f} s, peak "
          f"{model['leader_peak_bytes'] / gib:.1f} GiB, {model['leader_after_bytes'] / gib:.2f} GiB held while "
          f"training; a rank that does not plan {model['follower_map_s']:.1f} s, "
          f"{model['follower_own_bytes'] / 2**20:.0f} MiB of its own; node of {ranks}: "
          f"{model['node_peak_bytes'] / gib:.1f} GiB (every rank planning: "
          f"{model['every_rank_plans_bytes'] / gib:.1f} GiB)")
    baseline = None
    if args.baseline > 0:
        e = max(r["epochs"] for r in rows)
        print(f"the step to the transfer thread's part at {e} epochs, {args.baseline} times each way", flush=True)
        baseline = _child(BASELINE, args.items, e, args.nodes, ranks, args.batch, int(args.capacity * args.items),
                          args.window, args.baseline)
        baseline["epochs"] = e
        med = {k: float(np.median(baseline[k])) for k in ("before_s", "now_s", "before_bytes", "now_bytes")}
        baseline["median"] = med
        print(f"  {baseline['node_rows']:,} rows of node 0 of {baseline['transfers']:,}, {baseline['windows']} "
              f"windows: before (the whole table) {med['before_s']:.2f} s, +{med['before_bytes'] / gib:.2f} GiB; "
              f"now {med['now_s']:.2f} s, +{med['now_bytes'] / 2**20:.0f} MiB (medians of {args.baseline})")
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "args": vars(args), "rows": rows, "model": model, "baseline": baseline}, f,
                  indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
