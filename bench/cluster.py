#!/usr/bin/env python3
"""bench/cluster: one OPT plan over every node's memory, against each node
planning alone and against no cache, through the public API under torchrun.

Four virtual nodes on this machine (``torchrun --nproc-per-node 4`` with
OPT4TORCH_NODE=rank: each rank a node with its own pool), each with W fork
workers, read a record file of N records (4-16 KiB) with an emulated
latency per read (default 10 ms, paid by every reader), for E epochs of
DistributedSampler shuffle, with a small CPU training step per batch. Per
node capacity C of the dataset's bytes (default 25 % and 50 %). Side by
side, configuration by configuration, repeated:

* no cache: torch's DataLoader over the record file;
* per-node OPT: ``opt4torch.DataLoader(sampler=DistributedSampler, ...)``, each
  node planning its own ranks' reads alone (what it does without cluster);
* cluster OPT: ``opt4torch.DataLoader(..., cluster=True)``.

Both OPT configurations prefetch (the C threads). Reported per configuration,
summed over the nodes: bytes read from storage (the record file's counters)
beside the plan's, bytes between nodes, hit rate (local and peer), and the
epoch time (each epoch's slowest rank; median over epochs and repeats).

    python bench/cluster.py [--items 2000] [--latency 0.010] [--epochs 3]
        [--capacity 0.25,0.5] [--of dataset|stored] [--batch 16] [--workers 2] [--window 8] [--repeats 2]
        [--out bench/results/cluster.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import machine  # noqa: E402

CONFIGS = ("no cache", "per-node OPT", "cluster OPT")


#: Pages of the runs with ``--of stored``.
STORED_PAGE = 1024


def rank_main(args: argparse.Namespace) -> None:
    """One rank (a node) of one configuration, under torchrun."""
    import torch
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    import opt4torch

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    ds = opt4torch.RecordFile(args.path, latency=args.latency)
    total = int(ds.item_sizes().sum())
    sampler = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=rank, shuffle=True, seed=0)
    common = dict(batch_size=args.batch, num_workers=args.workers, persistent_workers=args.workers > 0,
                  multiprocessing_context="fork", collate_fn=list)
    page: dict[str, Any] = {}
    if args.of == "stored":  # the dataset as a pool stores it: the codec's margin, whole pages
        from opt4torch.data import CODEC_MARGIN

        page = {"page_size": STORED_PAGE}
        stored = -(-(ds.item_sizes().astype(np.int64) + CODEC_MARGIN) // STORED_PAGE) * STORED_PAGE
        total = int(stored.sum())
    cap = int(args.capacity * total) + (STORED_PAGE if args.of == "stored" else 0)
    if args.config == "no cache":
        loader: Any = torch.utils.data.DataLoader(ds, sampler=sampler, **common)
    elif args.config == "per-node OPT":
        loader = opt4torch.DataLoader(ds, sampler=sampler, epochs=args.epochs, cache_bytes=cap, prefetch=True,
                                      **page, **common)
    else:
        loader = opt4torch.DataLoader(ds, cluster=True, sampler=sampler, epochs=args.epochs, cache_bytes=cap,
                                      prefetch=True, cluster_window=args.window, **page, **common)
    a = torch.randn(96, 96)
    before = ds.info()
    dist.barrier()
    times = []
    for e in range(args.epochs):
        sampler.set_epoch(e)  # torch's loader needs it; opt4torch's replays what it captured
        t0 = time.perf_counter()
        for batch in loader:
            for _ in range(len(batch)):
                a = torch.tanh(a @ a)
        times.append(time.perf_counter() - t0)
    after = ds.info()
    out: dict[str, Any] = {"rank": rank, "epoch_seconds": times, "accesses": args.epochs * len(sampler),
                           "storage_reads": after["reads"] - before["reads"],
                           "storage_bytes": after["bytes_read"] - before["bytes_read"]}
    if isinstance(loader, opt4torch.DataLoader):
        rt = loader.cache.transfers
        if rt is not None:
            rt.finish()  # its last windows, before the figures
        st = loader.cache.stats()
        out.update({k: st.get(k) for k in ("hits", "plan_hits", "stall_rate", "fallbacks", "local_hits", "peer_hits",
                                           "plan_local_hits", "plan_peer_hits", "peer_bytes_sent",
                                           "peer_bytes_received", "plan_storage_bytes", "cluster_errors")})
        if rt is None:  # a node planning alone: its plan's miss bytes
            plan = loader.cache.plan
            sizes = ds.item_sizes()
            out["plan_storage_bytes"] = int(sizes[plan.seq[plan.kinds != opt4torch.HIT]].sum())
        loader.cache.close()
    with open(f"{args.out}.{rank}.json", "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def run_config(args: argparse.Namespace, path: str, config: str, capacity: float, tmp: str) -> list[dict]:
    from opt4torch.lab.launch import rank_errors, torchrun

    out = os.path.join(tmp, f"{config}-{capacity}")
    r = torchrun(os.path.abspath(__file__), 4, "--rank-run", "--path", path, "--config", config,
                 "--capacity", str(capacity), "--latency", str(args.latency), "--epochs", str(args.epochs),
                 "--batch", str(args.batch), "--workers", str(args.workers), "--window", str(args.window),
                 "--of", args.of, "--out", out, node_env="rank", timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{config} at {capacity}: torchrun failed\n{r.stdout[-2000:]}\n{rank_errors(r.stderr)}")
    return [json.load(open(f"{out}.{k}.json")) for k in range(4)]


def summary(ranks: list[dict]) -> dict[str, Any]:
    per_epoch = [max(r["epoch_seconds"][e] for r in ranks) for e in range(len(ranks[0]["epoch_seconds"]))]
    acc = sum(r["accesses"] for r in ranks)
    out: dict[str, Any] = {"epoch_seconds": per_epoch, "storage_bytes": sum(r["storage_bytes"] for r in ranks),
                           "storage_reads": sum(r["storage_reads"] for r in ranks), "accesses": acc}
    if "hits" in ranks[0]:
        out["hit_rate"] = sum(r["hits"] for r in ranks) / acc
        out["plan_hits"] = sum(r["plan_hits"] for r in ranks)
        out["hits"] = sum(r["hits"] for r in ranks)
        out["plan_storage_bytes"] = sum(r["plan_storage_bytes"] for r in ranks)
        out["stall_rate"] = statistics.mean(r["stall_rate"] for r in ranks)
        out["fallbacks"] = sum(r["fallbacks"] for r in ranks)
    if ranks[0].get("peer_hits") is not None:
        out["local_hit_rate"] = sum(r["local_hits"] for r in ranks) / acc
        out["peer_hit_rate"] = sum(r["peer_hits"] for r in ranks) / acc
        out["peer_bytes"] = sum(r["peer_bytes_sent"] for r in ranks)
        out["plan_peer_hits"] = sum(r["plan_peer_hits"] for r in ranks)
        out["peer_hits"] = sum(r["peer_hits"] for r in ranks)
        out["cluster_errors"] = sum(len(r["cluster_errors"] or []) for r in ranks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--latency", type=float, default=0.010)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--capacity", default="0.25,0.5")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--of", choices=["dataset", "stored"], default="dataset",
                    help="capacity as a share of the dataset's bytes, or of the dataset as a pool stores it "
                         f"(each item with the codec's margin, in whole pages of {STORED_PAGE} bytes)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default="bench/results/cluster.json")
    ap.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_run:
        args.capacity = float(args.capacity)
        rank_main(args)
        return
    import opt4torch

    info = machine()
    configs = [c.strip() for c in args.configs.split(",")]
    caps = [float(c) for c in args.capacity.split(",")]
    results: dict[str, Any] = {"machine": info, "args": vars(args), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="opt4-bench-cluster-") as tmp:
        rng = np.random.default_rng(0)
        sizes = rng.integers(4096, 16384, size=args.items)
        path = os.path.join(tmp, "items.rec")
        opt4torch.write_records(path, [rng.bytes(int(s)) for s in sizes], labels=[i % 10 for i in range(args.items)])
        print(f"{args.items} records, {int(sizes.sum()):,} bytes; {args.latency * 1000:.0f} ms a read; 4 nodes")
        for rep in range(args.repeats):
            for cap in caps:
                for config in configs:
                    t0 = time.perf_counter()
                    s = summary(run_config(args, path, config, cap, tmp))
                    results["runs"].setdefault(f"{cap}", {}).setdefault(config, []).append(s)
                    print(f"  repeat {rep + 1}, {cap:.0%} a node, {config}: epochs "
                          f"{', '.join(f'{x:.2f}' for x in s['epoch_seconds'])} s, storage "
                          f"{s['storage_bytes'] / 1e6:.1f} MB, {time.perf_counter() - t0:.0f} s", flush=True)
    print()
    print(table(results))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nraw results: {args.out}")


def table(results: dict[str, Any]) -> str:
    rows = ["| a node holds | configuration | epoch time (median) | vs no cache | read from storage (all nodes) | "
            "plan's storage bytes | between nodes | hit rate (local + peer) | stall rate |",
            "|---|---|---|---|---|---|---|---|---|"]
    for cap, by in results["runs"].items():
        base = statistics.median(x for s in by.get("no cache", []) for x in s["epoch_seconds"]) if "no cache" in by \
            else None
        for config, runs in by.items():
            t = statistics.median(x for s in runs for x in s["epoch_seconds"])
            sb = statistics.median(s["storage_bytes"] for s in runs)
            plan = (f"{statistics.median(s['plan_storage_bytes'] for s in runs) / 1e6:.1f} MB"
                    if "plan_storage_bytes" in runs[0] else "–")
            peer = f"{statistics.median(s['peer_bytes'] for s in runs) / 1e6:.1f} MB" if "peer_bytes" in runs[0] else "–"
            if "local_hit_rate" in runs[0]:
                hr = (f"{statistics.median(s['hit_rate'] for s in runs):.1%} ("
                      f"{statistics.median(s['local_hit_rate'] for s in runs):.1%} + "
                      f"{statistics.median(s['peer_hit_rate'] for s in runs):.1%})")
            elif "hit_rate" in runs[0]:
                hr = f"{statistics.median(s['hit_rate'] for s in runs):.1%}"
            else:
                hr = "0.0%"
            stall = f"{statistics.median(s['stall_rate'] for s in runs):.2%}" if "stall_rate" in runs[0] else "–"
            rel = f"{base / t:.2f}x" if base else "–"
            rows.append(f"| {float(cap):.0%} | {config} | {t:.2f} s | {rel} | {sb / 1e6:.1f} MB | {plan} | {peer} | "
                        f"{hr} | {stall} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
