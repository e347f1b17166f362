#!/usr/bin/env python3
"""bench/cluster_warm_resume: what a cluster resume gains by keeping what
the nodes' pools hold (issue 36), planned, and with ``--run`` measured on
the real loader.

A cluster loader resumed in new processes plans the rest of the timeline
again with new, empty pools (loader/elastic.py), so its first reads are
misses. A live loader resumed in its own processes keeps what its pools
hold (distributed/warm.py). This plans the rest three ways over the same
nodes and counts hits and storage reads of the rest only:

* uninterrupted: the first plan's own positions after the cut (on fewer
  nodes: a fresh plan of the new world's, its positions after the cut);
* cold: the rest planned alone (a relaunched job's resume);
* warm: the rest planned after a warm prefix of what each node's pool
  holds at the cut (its pool plan's residents with a read to come,
  ``Plan.resident_reads_at``): ``cluster_plan(warm=)``, which the resumed
  live loader plans; OPT decides which of them to keep, and keeps each at
  the node that holds it. Prefix positions are not counted: they are copies
  from the old pool, not reads.

``--run``: the same job under torchrun (4 ranks, each a node, a record
file of the same items, 2 fork workers a rank that are not persistent,
prefetch on), cut at each of the first two rows' places; each cut's state
resumed cold by a loader built afresh and warm by ``load_state_dict`` on
the live loader, each reading the rest; measured storage bytes (the record
file's counters, the warm copy's loads included) and hits (local and peer)
beside the plans'.

Defaults: bench/cluster.py's preemption row (2,000 items of 4-16 KiB, a
quarter of the dataset as a pool stores it a node, pages of 1,024 bytes,
windows of 8 steps, batches of 16, 3 epochs over 4 nodes), cut at the end
of epoch 0, resumed on the same 4 nodes (a resume in the same processes
keeps its world), and mid-epoch; and, as if pools outlived their
processes (they do not: docs/cluster.md), at the end of epoch 0 on the
first half of the nodes, each with what its pool held.

    python bench/cluster_warm_resume.py [--items 2000] [--nodes 4] [--epochs 3] [--run] [--out JSON]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
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


#: The cuts ``--run`` measures: (label, epoch, samples of its global order consumed).
RUN_CUTS = (("end of epoch 0", 1, 0), ("mid-epoch 1", 1, 960))


def _loader(ds: Any, args: argparse.Namespace, cap: int) -> Any:
    import torch.distributed as dist

    import opt4torch

    sampler = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True, seed=0)
    return opt4torch.DataLoader(ds, cluster=True, sampler=sampler, epochs=args.epochs, cache_bytes=cap,
                                page_size=args.page, prefetch=True, cluster_window=args.window,
                                batch_size=args.batch, num_workers=2, persistent_workers=False,
                                multiprocessing_context="fork", collate_fn=list)


def _read_rest(loader: Any, ds: Any) -> dict[str, Any]:
    """Every batch left in the loader's plan; this node's measured hits and
    storage bytes beside its plan's (the node's first rank: each rank a
    node here)."""
    import torch.distributed as dist

    before = ds.info()
    t0 = time.perf_counter()
    samples = 0
    while loader._positions._next_epoch < len(loader._positions.batches):
        for batch in loader:
            samples += len(batch)
    seconds = time.perf_counter() - t0
    dist.barrier()  # every rank read its last batch before any node closes (docs/cluster.md, "The last turn")
    loader.cache.transfers.finish()
    after = ds.info()
    st = loader.cache.stats()
    plan = loader.cluster_plan.node_stats()[loader.node]
    return {"samples": samples, "seconds": seconds, "storage_reads": after["reads"] - before["reads"],
            "storage_bytes": after["bytes_read"] - before["bytes_read"], "hits": st["local_hits"] + st["peer_hits"],
            "peer_hits": st["peer_hits"], "fallbacks": st["fallbacks"], "cluster_errors": st["cluster_errors"],
            "plan_hits": plan["local_hits"] + plan["peer_hits"], "plan_peer_hits": plan["peer_hits"],
            "plan_storage_bytes": st["plan_storage_bytes"], "plan_warm": st["plan_warm"], "kept": st["kept"],
            "kept_loaded": st["kept_loaded"]}


def rank_main(args: argparse.Namespace) -> None:
    """One rank (a node) of ``--run``, under torchrun."""
    import torch.distributed as dist

    import opt4torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cluster import node_capacity

    dist.init_process_group("gloo")
    ds = opt4torch.RecordFile(args.path)
    cap = node_capacity(ds.item_sizes(), args.capacity, "stored")
    world = dist.get_world_size()
    out = []
    for label, epoch, consumed in RUN_CUTS:
        clock = {"start": time.perf_counter()}
        live = _loader(ds, args, cap)
        for _ in range(epoch):  # the epochs before the cut, whole
            for _batch in live:
                pass
        if consumed:
            for b, _batch in enumerate(live):
                if b + 1 == consumed // (world * args.batch):
                    break
        state = live.state_dict()
        clock["cut"] = time.perf_counter()
        cold = _loader(ds, args, cap)  # a relaunched job: a loader built afresh resumes the state
        cold.load_state_dict(state)
        clock["cold_resumed"] = time.perf_counter()
        row = {"cut": label, "consumed": state["distributed"]["consumed"], "cold": _read_rest(cold, ds)}
        clock["cold_read"] = time.perf_counter()
        cold.cache.close()
        clock["cold_closed"] = time.perf_counter()
        before = ds.info()
        live.load_state_dict(state)  # the live loader, in these processes: keeps what its pool holds
        clock["warm_resumed"] = time.perf_counter()
        loaded = ds.info()
        row["warm"] = _read_rest(live, ds)
        clock["warm_read"] = time.perf_counter()
        row["warm"]["resume_storage_bytes"] = loaded["bytes_read"] - before["bytes_read"]
        live.cache.close()
        clock["warm_closed"] = time.perf_counter()
        names = list(clock)
        row["seconds"] = {b: round(clock[b] - clock[a], 3) for a, b in zip(names, names[1:])}
        out.append(row)
    with open(f"{args.rank_out}.{dist.get_rank()}.json", "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def run(args: argparse.Namespace, raw: np.ndarray) -> list[dict[str, Any]]:
    """``--run``: the job under torchrun over a record file of the items;
    per cut, cold and warm summed over the nodes."""
    import tempfile

    import opt4torch
    from opt4torch.lab.launch import rank_errors, torchrun

    rng = np.random.default_rng(0)  # bench/cluster.py's items: these sizes, these bytes
    sizes = rng.integers(4096, 16384, size=args.items)
    assert np.array_equal(sizes, raw)
    bodies = [rng.bytes(int(s)) for s in sizes]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "items.rec")
        opt4torch.write_records(path, bodies, labels=[i % 10 for i in range(args.items)])
        prefix = os.path.join(tmp, "run")
        t0 = time.perf_counter()
        r = torchrun(os.path.abspath(__file__), args.nodes, "--rank-run", "--path", path, "--rank-out", prefix,
                     "--items", str(args.items), "--epochs", str(args.epochs), "--batch", str(args.batch),
                     "--window", str(args.window), "--capacity", str(args.capacity), "--page", str(args.page),
                     node_env="rank", timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"torchrun failed\n{r.stdout[-2000:]}\n{rank_errors(r.stderr)}")
        ranks = [json.load(open(f"{prefix}.{k}.json")) for k in range(args.nodes)]
    print(f"--run: {time.perf_counter() - t0:.0f} s under torchrun, {args.nodes} nodes")
    rows = []
    for c, (label, _, _) in enumerate(RUN_CUTS):
        row: dict[str, Any] = {"cut": label, "per_node": [rk[c] for rk in ranks]}
        for how in ("cold", "warm"):
            nodes = [rk[c][how] for rk in ranks]
            row[how] = {k: sum(n[k] for n in nodes) for k in nodes[0] if isinstance(nodes[0][k], int)}
            row[how]["seconds"] = max(n["seconds"] for n in nodes)
            row[how]["cluster_errors"] = sum(len(n["cluster_errors"] or []) for n in nodes)
            m = row[how]
            print(f"  {label}, {how:4s}: hits {m['hits']:5d} (plan {m['plan_hits']:5d}, peer {m['peer_hits']}), "
                  f"storage {m['storage_bytes'] / 1e6:6.2f} MB (plan {m['plan_storage_bytes'] / 1e6:6.2f} MB"
                  + (f", and {m['resume_storage_bytes'] / 1e6:.2f} MB loaded while warming" if how == "warm" else "")
                  + f"), fallbacks {m['fallbacks']}, errors {m['cluster_errors']}, kept {m['kept']} "
                  f"(loaded {m['kept_loaded']}), rest read in {m['seconds']:.2f} s")
        rows.append(row)
    return rows


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
    ap.add_argument("--run", action="store_true", help="also measure cold and warm resumes on the real loader")
    ap.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--rank-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_run:
        rank_main(args)
        return
    rng = np.random.default_rng(0)  # bench/cluster.py's items
    raw = rng.integers(4096, 16384, size=args.items).astype(np.int64)
    stored = raw + CODEC_MARGIN
    cap = int(args.capacity * int((-(-stored // args.page) * args.page).sum())) + args.page
    data = range(args.items)
    world = args.nodes

    def plan(seqs: list[list[np.ndarray]], warm: list[np.ndarray] | None = None) -> ClusterPlan:
        return cluster_plan(seqs, None, cache_bytes=cap, item_sizes=stored, page_size=args.page,
                            batch_size=args.batch, window=args.window, warm=warm)

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
        warm = plan(rest, held)
        prefix = warm.prefix
        uninterrupted = first
        if new_world != world:  # the reference: a fresh run on the new world, its positions from the cut on
            uninterrupted = plan(capture_ranks(DistributedSampler(data, num_replicas=new_world, rank=0,
                                                                  shuffle=True, seed=0), args.epochs))
            t = epoch * (-(-args.items // new_world) * new_world) + consumed
        row = {"cut": label, "position": t, "held": [int(h.size) for h in held],
               "uninterrupted": counts(uninterrupted, t, raw), "cold": counts(cold, 0, raw),
               "warm": counts(warm, prefix, raw),
               "warm_prefix_kept": int((warm.kinds[:prefix] == ADMIT).sum())}
        results.append(row)
        print(f"{label} (position {t}): the pools hold {sum(row['held'])} items with a read to come; the warm "
              f"plan keeps {row['warm_prefix_kept']}, each where it is")
        for how in ("uninterrupted", "cold", "warm"):
            c = row[how]
            print(f"  {how:13s} hits {c['hits']:5d} (peer {c['peer_hits']:4d}), storage reads "
                  f"{c['storage_reads']:5d}, {c['storage_bytes'] / 1e6:6.2f} MB")
    measured = run(args, raw) if args.run else None
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results, "measured": measured}, f, indent=1)


if __name__ == "__main__":
    main()
