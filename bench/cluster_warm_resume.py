#!/usr/bin/env python3
"""bench/cluster_warm_resume: what a cluster resume would gain by keeping
what the nodes' pools hold (issue 36), planned, not run.

A resumed cluster run plans the rest of the timeline again with new, empty
pools (loader/elastic.py), so its first reads are misses even where the
old pools, still live in the same processes, hold the items. This plans the
rest three ways over the same nodes and counts hits and storage reads of
the rest only:

* uninterrupted: the first plan's own positions after the cut (on fewer
  nodes: a fresh plan of the new world's, its positions after the cut);
* cold: the rest planned alone (what a resume does today);
* warm: the rest planned after a prefix in which each node reads what its
  pool holds at the cut (its pool plan's residents with a read to come,
  ``Plan.resident_reads_at``), so that OPT decides which of them to keep,
  as the single-node re-plan does (loader/replan.py). Prefix positions are
  not counted: at run time they would be copies from the old pool, not
  reads.

Defaults: bench/cluster.py's preemption row (2,000 items of 4-16 KiB, a
quarter of the dataset as a pool stores it a node, pages of 1,024 bytes,
windows of 8 steps, batches of 16, 3 epochs over 4 nodes), cut at the end
of epoch 0, resumed on the same 4 nodes (a resume in the same processes
keeps its world), and mid-epoch; and, as if pools outlived their
processes (they do not: docs/cluster.md), at the end of epoch 0 on the
first half of the nodes, each with what its pool held.

    python bench/cluster_warm_resume.py [--items 2000] [--nodes 4] [--epochs 3] [--out JSON]
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np
from torch.utils.data.distributed import DistributedSampler

from opt4torch.cluster import ADMIT, BYPASS, LATE, LOCAL_HIT, PEER_HIT, WORKER, ClusterPlan, cluster_plan
from opt4torch.loader.elastic import ResumedSampler
from opt4torch.planning.capture import capture_ranks
from opt4torch.planning.sizing import CODEC_MARGIN


def counts(cp: ClusterPlan, start: int, sizes: np.ndarray) -> dict[str, int]:
    """Hits (and peer hits) and storage reads and bytes of positions
    ``start`` on."""
    k, seq = cp.kinds[start:], cp.seq[start:]
    storage = np.isin(k, (ADMIT, BYPASS, LATE))
    return {"hits": int(np.isin(k, (LOCAL_HIT, PEER_HIT)).sum()), "peer_hits": int((k == PEER_HIT).sum()),
            "storage_reads": int(storage.sum()), "storage_bytes": int(sizes[seq[storage]].sum())}


def held_at(cp: ClusterPlan, node: int, t: int) -> np.ndarray:
    """What node ``node``'s pool holds, with a read to come, once the run
    reached global position ``t``: its pool plan's residents before its
    first read at or after ``t`` (that window's RECEIVEs and SENDs done)."""
    np_ = cp.node_plan(node)
    later = np.flatnonzero((np_.role == WORKER) & (np_.position >= t))
    k = int(later[0]) if later.size else len(np_)
    return cp.pool_plan(node, np_).resident_reads_at(k)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--capacity", type=float, default=0.25, help="a node's share of the dataset as stored")
    ap.add_argument("--page", type=int, default=1024)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)  # bench/cluster.py's items
    raw = rng.integers(4096, 16384, size=args.items).astype(np.int64)
    stored = raw + CODEC_MARGIN
    cap = int(args.capacity * int((-(-stored // args.page) * args.page).sum())) + args.page
    data = range(args.items)
    world = args.nodes

    def plan(seqs: list[list[np.ndarray]]) -> ClusterPlan:
        return cluster_plan(seqs, None, cache_bytes=cap, item_sizes=stored, page_size=args.page,
                            batch_size=args.batch, window=args.window)

    first = plan(capture_ranks(DistributedSampler(data, num_replicas=world, rank=0, shuffle=True, seed=0),
                               args.epochs))
    per_epoch = -(-args.items // world) * world
    results: list[dict[str, Any]] = []
    for label, epoch, consumed, new_world in (("end of epoch 0", 1, 0, world), ("mid-epoch 1", 1, 960, world),
                                              (f"end of epoch 0, on {world // 2} of the nodes", 1, 0, world // 2)):
        t = epoch * per_epoch + consumed
        rs = ResumedSampler(data, num_replicas=new_world, rank=0, shuffle=True, seed=0, drop_last=False,
                            cut_epoch=epoch, consumed=consumed)
        rest = capture_ranks(rs, args.epochs)
        cold = plan(rest)
        # On fewer nodes, the first ones come back with what their pools hold.
        held = [held_at(first, n, t) for n in range(new_world)]
        prefix = sum(int(h.size) for h in held)
        # The prefix as an epoch of its own before the rest: node n's rank
        # reads what node n holds (each rank a node).
        warm = plan([[held[r].astype(np.int64)] + rest[r] for r in range(new_world)])
        uninterrupted = first
        if new_world != world:  # the reference: a fresh run on the new world, its positions from the cut on
            uninterrupted = plan(capture_ranks(DistributedSampler(data, num_replicas=new_world, rank=0,
                                                                  shuffle=True, seed=0), args.epochs))
            t = epoch * (-(-args.items // new_world) * new_world) + consumed
        row = {"cut": label, "position": t, "held": [int(h.size) for h in held],
               "uninterrupted": counts(uninterrupted, t, raw), "cold": counts(cold, 0, raw),
               "warm": counts(warm, prefix, raw),
               "warm_prefix_kept": int((warm.kinds[:prefix] == ADMIT).sum()),
               # kept at another node than the one that holds it: a transfer the runtime would make
               "warm_prefix_moved": int(((warm.kinds[:prefix] == ADMIT)
                                         & (warm.nodes[:prefix] != warm.reader[:prefix])).sum())}
        results.append(row)
        print(f"{label} (position {t}): the pools hold {sum(row['held'])} items with a read to come; the warm "
              f"plan keeps {row['warm_prefix_kept']}, {row['warm_prefix_moved']} of them at another node")
        for how in ("uninterrupted", "cold", "warm"):
            c = row[how]
            print(f"  {how:13s} hits {c['hits']:5d} (peer {c['peer_hits']:4d}), storage reads "
                  f"{c['storage_reads']:5d}, {c['storage_bytes'] / 1e6:6.2f} MB")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
