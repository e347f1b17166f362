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

With ``--store s3`` the items are objects on the loopback S3 server
(bench/s3server.py, one object an item, read by ``opt4torch.S3ImageFolder``
through the engine's GETs) that every node shares, and ``--link`` gives the
bytes a second of the one link all its answers share (comma-separated: one
round of every configuration per speed; 0 is no link): the storage a
cluster's nodes split. ``--latency`` is then the server's, per request. The
server's own counters of GET bytes are reported beside the ranks'. With
several link speeds, ``--plot`` draws the run's time (all epochs) against
the link speed. "vs no cache" compares the runs' times over all epochs.
``--step-ms`` adds to each batch's step a wait that takes no CPU (an
accelerator's step), and ``--slow-rank R`` makes node R's step, CPU and wait,
``--slow-factor`` times as long (a slow node); every rank's epoch times are
kept in the results.

``--nodes N`` runs N nodes instead of 4, and ``--pin`` keeps each node
(its process, workers and threads) on CPU ``rank % cores``: with 2 nodes on
this 2-core machine each node has a core of its own, as nodes on machines
of their own do; with 4 on 2 cores, two nodes share each core.

``--preempt`` runs issue 36's preemption instead of the table: cluster OPT
on 4 nodes stopped after its first epoch (every rank saves ``state_dict()``),
a 2-node job resuming those states (``load_state_dict``) for the other
epochs, and a fresh 2-node run; their hits and storage bytes as planned and
as measured, at the first ``--capacity``.

    python bench/cluster.py [--items 2000] [--latency 0.010] [--epochs 3]
        [--capacity 0.25,0.5] [--of dataset|stored] [--batch 16] [--workers 2] [--window 8] [--repeats 2]
        [--store records|s3] [--link 0,4e6,16e6] [--plot PNG] [--preempt] [--out bench/results/cluster.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_peers  # noqa: E402
from _machine import machine  # noqa: E402

CONFIGS = ("no cache", "per-node OPT", "cluster OPT")
#: Run by name only: ``cluster=True`` with ``cluster_alone=False``, the
#: cluster's plan even where it saves under ``MIN_SAVING`` of the storage
#: bytes (plain "cluster OPT" then plans alone, as users get it).
ALWAYS = "cluster OPT always"


#: Pages of the runs with ``--of stored``.
STORED_PAGE = 1024


def node_capacity(sizes: np.ndarray, capacity: float, of: str) -> int:
    """A node's cache in bytes: ``capacity`` of the dataset's bytes, or with
    ``of="stored"`` of the dataset as a pool stores it (the codec's margin,
    whole pages of :data:`STORED_PAGE`, and a page more)."""
    if of != "stored":
        return int(capacity * int(sizes.sum()))
    from opt4torch.data import CODEC_MARGIN

    stored = -(-(sizes.astype(np.int64) + CODEC_MARGIN) // STORED_PAGE) * STORED_PAGE
    return int(capacity * int(stored.sum())) + STORED_PAGE


def rank_main(args: argparse.Namespace) -> None:
    """One rank (a node) of one configuration, under torchrun."""
    import torch
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    import opt4torch

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.pin:  # before any worker or thread of the loader: they inherit it
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    if args.store == "s3":  # the endpoint and the keys are in the environment main() gave torchrun
        ds = opt4torch.S3ImageFolder(args.path, client="c")
    else:
        ds = opt4torch.RecordFile(args.path, latency=args.latency)
    sampler = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=rank, shuffle=True, seed=0)
    common = dict(batch_size=args.batch, num_workers=args.workers, persistent_workers=args.workers > 0,
                  multiprocessing_context="fork", collate_fn=list)
    page: dict[str, Any] = {"page_size": STORED_PAGE} if args.of == "stored" else {}
    cap = node_capacity(ds.item_sizes(), args.capacity, args.of)
    if args.config == "no cache":
        loader: Any = torch.utils.data.DataLoader(ds, sampler=sampler, **common)
    elif args.config == "per-node OPT":
        loader = opt4torch.DataLoader(ds, sampler=sampler, epochs=args.epochs, cache_bytes=cap, prefetch=True,
                                      **page, **common)
    else:
        loader = opt4torch.DataLoader(ds, cluster=True, sampler=sampler, epochs=args.epochs, cache_bytes=cap,
                                      prefetch=True, cluster_window=args.window,
                                      cluster_alone=False if args.config == ALWAYS else None, **page, **common)
    first = resume_states(loader, args.resume_from, rank) if args.resume_from else 0
    a = torch.randn(96, 96)
    before = ds.info()
    dist.barrier()
    times: list[float] = []
    marks: list[dict[str, int]] = []
    for e in range(first, args.epochs):
        sampler.set_epoch(e)  # torch's loader needs it; opt4torch's replays what it captured
        t0 = time.perf_counter()
        for batch in loader:
            slow = args.slow_factor if rank == args.slow_rank else 1
            for _ in range(len(batch) * slow):
                a = torch.tanh(a @ a)
            if args.step_ms:  # an accelerator's step: time that takes no CPU of ours
                time.sleep(args.step_ms * slow / 1000)
        times.append(time.perf_counter() - t0)
        if args.marks:  # the preemption row: each epoch's counters
            marks.append(epoch_marks(loader, ds, before))
        if e + 1 == args.stop_after:  # preempted: every rank saves where it stopped
            with open(f"{args.out}.state.{rank}.json", "w") as f:
                json.dump(loader.state_dict(), f)
            break
    after = ds.info()
    out: dict[str, Any] = {"rank": rank, "epoch_seconds": times, "accesses": len(times) * len(sampler),
                           "storage_reads": after["reads"] - before["reads"],
                           "storage_bytes": after["bytes_read"] - before["bytes_read"]}
    if marks:
        out.update(first_epoch=first, epoch_marks=marks, plan_epochs=plan_epochs(loader, ds, first))
    closing = time.perf_counter()
    if isinstance(loader, opt4torch.DataLoader):
        rt = loader.cache.transfers
        if rt is not None:
            rt.finish()  # its last windows, before the figures
        st = loader.cache.stats()
        out.update({k: st.get(k) for k in ("hits", "plan_hits", "stall_rate", "fallbacks", "local_hits", "peer_hits",
                                           "plan_local_hits", "plan_peer_hits", "peer_bytes_sent",
                                           "peer_bytes_received", "plan_storage_bytes", "cluster_errors",
                                           "plan_alone", "exchange_thread_cpu_seconds")})
        if rt is None:  # a node planning alone: its plan's miss bytes
            plan = loader.cache.plan
            sizes = ds.item_sizes()
            out["plan_storage_bytes"] = int(sizes[plan.seq[plan.kinds != opt4torch.HIT]].sum())
        loader.cache.close()
    out["close_seconds"] = time.perf_counter() - closing  # the transfer thread's last turns, and close()
    # The CPU the rank's process took (every thread: training, transfers,
    # prefetchers, gloo) and its workers' (reaped: not persistent).
    import resource

    out["process_cpu_seconds"] = time.process_time()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["workers_cpu_seconds"] = kids.ru_utime + kids.ru_stime
    with open(f"{args.out}.{rank}.json", "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def run_config(args: argparse.Namespace, path: str, config: str, capacity: float, tmp: str, *extra: str,
               world: int = 0, name: str = "") -> list[dict]:
    from opt4torch.lab.launch import rank_errors, torchrun

    out = os.path.join(tmp, name or f"{config}-{capacity}")
    world = world or args.nodes
    store = ["--store", args.store, "--slow-rank", str(args.slow_rank), "--slow-factor", str(args.slow_factor),
             "--step-ms", str(args.step_ms), *(["--pin"] if args.pin else []), *extra]
    r = torchrun(os.path.abspath(__file__), world, "--rank-run", "--path", path, "--config", config,
                 "--capacity", str(capacity), "--latency", str(args.latency), "--epochs", str(args.epochs),
                 "--batch", str(args.batch), "--workers", str(args.workers), "--window", str(args.window),
                 "--of", args.of, "--out", out, *store, node_env="rank", timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{config} at {capacity}: torchrun failed\n{r.stdout[-2000:]}\n{rank_errors(r.stderr)}")
    return [json.load(open(f"{out}.{k}.json")) for k in range(world)]


def summary(ranks: list[dict]) -> dict[str, Any]:
    per_epoch = [max(r["epoch_seconds"][e] for r in ranks) for e in range(len(ranks[0]["epoch_seconds"]))]
    acc = sum(r["accesses"] for r in ranks)
    out: dict[str, Any] = {"epoch_seconds": per_epoch, "storage_bytes": sum(r["storage_bytes"] for r in ranks),
                           "storage_reads": sum(r["storage_reads"] for r in ranks), "accesses": acc,
                           # each rank's epochs: with --slow-rank, what the other nodes took
                           "rank_epoch_seconds": [r["epoch_seconds"] for r in ranks]}
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
        out["plan_alone"] = ranks[0]["plan_alone"]
        out["exchange_thread_cpu_seconds"] = [r.get("exchange_thread_cpu_seconds") for r in ranks]
    out["process_cpu_seconds"] = [r.get("process_cpu_seconds") for r in ranks]
    out["workers_cpu_seconds"] = [r.get("workers_cpu_seconds") for r in ranks]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=4, help="nodes (torchrun ranks, one a node; default 4)")
    ap.add_argument("--pin", action="store_true", help="each node on CPU rank %% cores (its workers and threads too)")
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
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help=f"of {', '.join(CONFIGS)}, {ALWAYS}; with --store s3 also Streaming and LitData "
                         "(bench/cluster_peers.py, run by --peer-python)")
    ap.add_argument("--peer-python", default=sys.executable,
                    help="the Python that runs Streaming's and LitData's ranks (one with them: .venv-bench)")
    ap.add_argument("--store", choices=["records", "s3"], default="records",
                    help="a record file with emulated latency, or objects on the loopback S3 server")
    ap.add_argument("--link", default="0",
                    help="with --store s3: bytes a second of the server's one shared link, comma-separated "
                         "(0: no link)")
    ap.add_argument("--slow-rank", type=int, default=-1,
                    help="a rank (node) whose training step takes --slow-factor times as long (-1: none)")
    ap.add_argument("--slow-factor", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="milliseconds a batch's step waits beside its CPU work, as for a GPU (default 0)")
    ap.add_argument("--plot", default=None, help="with several --link speeds: a PNG of epoch time against them")
    ap.add_argument("--out", default="bench/results/cluster.json")
    ap.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--preempt", action="store_true",
                    help="the preemption row instead: cluster OPT on 4 nodes stopped after epoch 1, resumed on 2, "
                         "against a fresh 2-node run")
    ap.add_argument("--stop-after", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--marks", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--resume-from", default=None, help=argparse.SUPPRESS)
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
    links = [float(x) for x in args.link.split(",")] if args.store == "s3" else [0.0]
    with tempfile.TemporaryDirectory(prefix="opt4-bench-cluster-") as tmp, contextlib.ExitStack() as stack:
        rng = np.random.default_rng(0)
        sizes = rng.integers(4096, 16384, size=args.items)
        bodies = [rng.bytes(int(s)) for s in sizes]
        server = None
        if args.store == "s3":
            server = stack.enter_context(_s3_store(bodies, args.latency))
            path = f"s3://{S3_BUCKET}/images/"
        else:
            path = os.path.join(tmp, "items.rec")
            opt4torch.write_records(path, bodies, labels=[i % 10 for i in range(args.items)])
        where = f"on the S3 server, {args.latency * 1000:.0f} ms a request" if server else \
            f"{args.latency * 1000:.0f} ms a read"
        print(f"{args.items} items, {int(sizes.sum()):,} bytes, {where}; {args.nodes} nodes"
              + (", each pinned to a core" if args.pin else ""))
        peers = [c for c in configs if c in cluster_peers.PEERS]
        if peers and args.nodes != 4:
            raise SystemExit("Streaming and LitData run as 4 ranks: leave --nodes at 4")
        if peers:
            if server is None:
                raise SystemExit("Streaming and LitData run over the S3 server: give --store s3")
            budget = 4 * node_capacity(sizes, caps[0], args.of)
            urls = _peer_shards(args, bodies, server, budget, tmp)
        if args.preempt:
            results["preemption"] = preemption(args, path, caps[0], tmp)
        for rep in range(0 if args.preempt else args.repeats):
            for link in links:
                if server is not None:
                    server.call("set", link=link)
                for cap in caps:
                    for config in configs:
                        t0 = time.perf_counter()
                        served = server.stats()["get_bytes"] if server is not None else 0
                        if config in cluster_peers.PEERS:
                            ranks = run_peer(args, config, urls[config], 4 * node_capacity(sizes, cap, args.of), tmp)
                        else:
                            ranks = run_config(args, path, config, cap, tmp)
                        s = summary(ranks)
                        if server is not None:
                            s["server_get_bytes"] = server.stats()["get_bytes"] - served
                            if config in cluster_peers.PEERS:  # theirs is the server's count only
                                s["storage_bytes"] = s["server_get_bytes"]
                        results["runs"].setdefault(_key(cap, link, server is not None), {}).setdefault(
                            config, []).append(s)
                        print(f"  repeat {rep + 1}, {_key(cap, link, server is not None)}, {config}: epochs "
                              f"{', '.join(f'{x:.2f}' for x in s['epoch_seconds'])} s, storage "
                              f"{s['storage_bytes'] / 1e6:.1f} MB, {time.perf_counter() - t0:.0f} s", flush=True)
    print()
    print(preemption_table(results["preemption"]) if args.preempt else table(results))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nraw results: {args.out}")
    if args.plot:
        print("plot:", plot(results, args.plot))


# ---- Streaming and LitData (bench/cluster_peers.py) ----


def _peer_shards(args: argparse.Namespace, bodies: list[bytes], server: Any, budget: int,
                 tmp: str) -> dict[str, str]:
    """The items in Streaming's and LitData's shard formats (converted by
    ``--peer-python``), put on the S3 server beside the images; each
    peer's prefix URL. Shards as bench/e2e.py sizes them: 64 MiB, or an
    eighth of the cache when that is smaller."""
    import subprocess

    import boto3

    import opt4torch

    records = os.path.join(tmp, "peers.rec")
    opt4torch.write_records(records, bodies, labels=[i % 10 for i in range(len(bodies))])
    shard = max(1 << 16, min(1 << 26, budget // 8))
    r = subprocess.run([args.peer_python, cluster_peers.__file__, "--prepare", records, os.path.join(tmp, "shards"),
                        "--shard-bytes", str(shard)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"converting to the peers' shards failed:\n{r.stderr[-3000:]}")
    made = json.loads(r.stdout.strip().splitlines()[-1])
    client = boto3.client("s3", endpoint_url=server.endpoint)
    urls = {}
    for name, d in made.items():
        prefix = os.path.basename(d)
        for root, _, files in os.walk(d):
            for f in files:
                with open(os.path.join(root, f), "rb") as fh:
                    client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/{os.path.relpath(os.path.join(root, f), d)}",
                                      Body=fh.read())
        urls[name] = f"s3://{S3_BUCKET}/{prefix}"
    return urls


def run_peer(args: argparse.Namespace, config: str, url: str, budget: int, tmp: str) -> list[dict[str, Any]]:
    """Streaming or LitData as the 4 ranks of one node, their cache the four
    nodes' capacities together; each rank's epochs (the bytes are the
    server's, counted around the job)."""
    import shutil

    from opt4torch.lab.launch import rank_errors, torchrun

    out, cache = os.path.join(tmp, config), os.path.join(tmp, f"{config}-cache")
    shutil.rmtree(cache, ignore_errors=True)  # each run starts cold, as the others do
    os.makedirs(cache)
    r = torchrun(cluster_peers.__file__, 4, "--rank-run", "--config", config, "--url", url, "--cache", cache,
                 "--budget", str(budget), "--epochs", str(args.epochs), "--batch", str(args.batch),
                 "--workers", str(args.workers), "--out", out, timeout=900, python=args.peer_python)
    if r.returncode != 0:
        raise RuntimeError(f"{config}: torchrun failed\n{r.stdout[-2000:]}\n{rank_errors(r.stderr)}")
    ranks = [json.load(open(f"{out}.{k}.json")) for k in range(4)]
    for rk in ranks:
        rk.update(accesses=sum(rk["samples"]), storage_reads=0, storage_bytes=0)
    return ranks


# ---- the preemption row (--preempt) ----


def resume_states(loader: Any, prefix: str, rank: int) -> int:
    """Every rank of the relaunched job loads the state an old rank saved
    (rank r old rank r % the old world's: on fewer ranks, the first ones),
    as the collective ``load_state_dict`` wants; returns the epoch it resumes
    at (the next one: the first run stopped at an epoch's end)."""
    with open(f"{prefix}.state.0.json") as f:
        old = int(json.load(f)["distributed"]["world"])
    with open(f"{prefix}.state.{rank % old}.json") as f:
        state = json.load(f)
    loader.load_state_dict(state)
    return int(state["epoch"]) + int(state["distributed"]["consumed"] >= state["items"])


def epoch_marks(loader: Any, ds: Any, before: dict[str, int]) -> dict[str, Any]:
    """This rank's counters at an epoch's end, since the loop began: storage
    (reads counted as they are made, so a prefetch of the next epoch's items
    counts in this one), and the node pool's hits and transfers."""
    now = ds.info()
    out: dict[str, Any] = {"storage_reads": now["reads"] - before["reads"],
                           "storage_bytes": now["bytes_read"] - before["bytes_read"]}
    st = loader.cache.stats()
    out.update({k: st.get(k) for k in ("hits", "peer_hits", "peer_bytes_received")})
    return out


def plan_epochs(loader: Any, ds: Any, first: int) -> list[dict[str, int]]:
    """This node's part of the cluster plan, counted epoch by epoch from
    epoch ``first`` (whole epochs only: the preemption row resumes at an
    epoch's start): its ranks' hits (local and peer), storage reads and
    their bytes (the source's sizes). The report sums the nodes (one rank
    a node here: no rank plans the whole cluster but each node's first)."""
    from opt4torch.cluster import FROM_PEER, FROM_STORAGE, WORKER

    import torch.distributed as dist

    np_ = loader.node_plan
    world = dist.get_world_size()
    per = -(-len(ds) // world) * world  # a DistributedSampler's epoch over this world, padded
    sizes = ds.item_sizes().astype(np.int64)
    reads = np_.role == WORKER
    epoch = np_.position // per
    out = []
    for e in range(int(loader.cluster_plan.accesses) // per):
        mine = reads & (epoch == e)
        storage = mine & (np_.source == FROM_STORAGE)
        out.append({"epoch": first + e, "hits": int((mine & ~storage).sum()),
                    "peer_hits": int((mine & (np_.source == FROM_PEER)).sum()), "storage_reads": int(storage.sum()),
                    "storage_bytes": int(sizes[np_.seq[storage]].sum())})
    return out


def preemption(args: argparse.Namespace, path: str, capacity: float, tmp: str) -> list[dict[str, Any]]:
    """Issue 36's preemption: cluster OPT on 4 nodes stopped after its first
    epoch (every rank saves ``state_dict()``), the job relaunched on 2 nodes
    resuming those states for the remaining epochs, and beside it a fresh
    2-node run of every epoch; each rank a node, ``capacity`` of the dataset a
    node in every run. Per repeat, each run's ranks."""
    out = []
    for rep in range(args.repeats):
        first = os.path.join(tmp, f"preempt-{rep}-first")
        runs = {}
        for name, world, extra in (("first", 4, ("--stop-after", "1")), ("resumed", 2, ("--resume-from", first)),
                                   ("fresh", 2, ())):
            t0 = time.perf_counter()
            runs[name] = run_config(args, path, "cluster OPT", capacity, tmp, "--marks", *extra, world=world,
                                    name=f"preempt-{rep}-{name}")
            slowest = [max(r["epoch_seconds"][e] for r in runs[name])
                       for e in range(len(runs[name][0]["epoch_seconds"]))]
            print(f"  repeat {rep + 1}, preemption, {name} on {world} nodes: epochs "
                  f"{', '.join(f'{t:.2f}' for t in slowest)} s, close "
                  f"{max(r['close_seconds'] for r in runs[name]):.1f} s, {time.perf_counter() - t0:.0f} s", flush=True)
        out.append(runs)
    return out


def preemption_table(repeats: list[dict[str, Any]]) -> str:
    """Per repeat: the first run's epoch, the resumed run's epochs, and the
    fresh 2-node run's same epochs and all of it; as planned (the cluster
    plan's positions of those epochs, summed over the nodes) and, for runs
    that ran their plan to its end, as measured (the pools' hits, the
    storage's reads). A cut run's or an epoch's own counters are not
    shown: storage reads run ahead of the epoch (prefetch), and so do the
    transfer thread's reads of what it sends, which a node's pool counts as
    hits (``stats()``' ``local_hits`` takes them out)."""
    rows = ["| repeat | run | epochs | plan: hits (peer) | plan: storage reads | plan: storage bytes | measured: "
            "hits (peer) | measured: storage reads, bytes | received from peers | time (slowest rank, each epoch) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for rep, runs in enumerate(repeats):
        for name, label, epochs in (("first", "4 nodes, stopped", slice(0, 1)), ("resumed", "2 nodes, resumed", None),
                                    ("fresh", "2 nodes, fresh: the same epochs", slice(1, None)),
                                    ("fresh", "2 nodes, fresh: all", None)):
            ranks = runs[name]
            plan = [{k: (e["epoch"] if k == "epoch" else sum(r["plan_epochs"][i][k] for r in ranks)) for k in e}
                    for i, e in enumerate(ranks[0]["plan_epochs"])][epochs or slice(None)]
            times = [max(r["epoch_seconds"][e] for r in ranks) for e in range(len(ranks[0]["epoch_seconds"]))]
            times = times[epochs or slice(None)]
            if epochs is None:  # the whole plan ran: the counters are the run's
                ends = [r["epoch_marks"][-1] for r in ranks]
                measured = (f"{sum(m['hits'] for m in ends):,} ({sum(m['peer_hits'] for m in ends):,}) | "
                            f"{sum(m['storage_reads'] for m in ends):,}, "
                            f"{sum(m['storage_bytes'] for m in ends) / 1e6:.2f} MB | "
                            f"{sum(m['peer_bytes_received'] for m in ends) / 1e6:.2f} MB")
            else:
                measured = "– | – | –"
            rows.append(
                f"| {rep + 1} | {label} | {plan[0]['epoch']}-{plan[-1]['epoch']} | "
                f"{sum(p['hits'] for p in plan):,} ({sum(p['peer_hits'] for p in plan):,}) | "
                f"{sum(p['storage_reads'] for p in plan):,} | {sum(p['storage_bytes'] for p in plan) / 1e6:.2f} MB | "
                f"{measured} | {', '.join(f'{t:.2f}' for t in times)} s |")
    return "\n".join(rows)


#: The bucket of ``--store s3``.
S3_BUCKET = "opt4-cluster"


def _key(capacity: float, link: float, s3: bool) -> str:
    """A row's name: the capacity, and with S3 the link speed."""
    if not s3:
        return f"{capacity}"
    return f"{capacity} @ " + ("no link" if not link else f"{link / 1e6:g} MB/s")


@contextlib.contextmanager
def _s3_store(bodies: list[bytes], latency: float) -> Any:
    """The loopback S3 server with the items as an image folder's objects
    (``images/c<label>/<i>.jpg``, random bytes: nothing decodes them), and the
    environment torchrun's ranks find it and their keys in."""
    import boto3
    from s3server import Server  # type: ignore[import-not-found]

    env = {"AWS_ACCESS_KEY_ID": "opt4-bench", "AWS_SECRET_ACCESS_KEY": "opt4-bench", "AWS_REGION": "us-east-1",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    os.environ.update(env)
    with Server(latency=0.0) as server:  # latency once the objects are up
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket=S3_BUCKET)
        for i, body in enumerate(bodies):
            client.put_object(Bucket=S3_BUCKET, Key=f"images/c{i % 10}/{i:06d}.jpg", Body=body)
        server.call("set", latency=latency)
        yield server


def plot(results: dict[str, Any], out: str) -> str:
    """The run's time over all its epochs (median of the repeats) against the
    link's speed, a line per capacity and configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for key, by in results["runs"].items():
        cap, _, link = key.partition(" @ ")
        speed = float("inf") if link == "no link" else float(link.split()[0])
        for config, runs in by.items():
            t = statistics.median(sum(s["epoch_seconds"]) for s in runs)
            lines.setdefault((cap, config), []).append((speed, t))
    finite = [x for pts in lines.values() for x, _ in pts if x != float("inf")]
    nolink = 2 * max(finite) if finite else 1.0  # "no link" drawn right of the fastest link
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (cap, config), pts in sorted(lines.items()):
        pts = sorted((nolink if x == float("inf") else x, t) for x, t in pts)
        ax.plot([x for x, _ in pts], [t for _, t in pts], marker="o", label=f"{config}, {float(cap):.0%} a node")
    ax.set_xscale("log")
    ticks = sorted(set(finite)) + ([nolink] if finite else [])
    from matplotlib.ticker import NullFormatter, NullLocator

    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(ticks, [f"{x:g}" for x in sorted(set(finite))] + ["no link"])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("the shared link's speed (MB/s)")
    ax.set_ylabel("all epochs, slowest rank each (s, median)")
    ax.set_title("4 nodes over one S3 server: the run's time against its link")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _pretty(key: str) -> str:
    cap, at, link = key.partition(" @ ")
    return f"{float(cap):.0%}" + (f", {link}" if at else "")


def table(results: dict[str, Any]) -> str:
    rows = ["| a node holds | configuration | epoch time (median) | all epochs (median) | vs no cache | "
            "read from storage (all nodes) | plan's storage bytes | between nodes | hit rate (local + peer) | "
            "stall rate |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for cap, by in results["runs"].items():
        base = statistics.median(sum(s["epoch_seconds"]) for s in by["no cache"]) if "no cache" in by else None
        for config, runs in by.items():
            t = statistics.median(x for s in runs for x in s["epoch_seconds"])
            run = statistics.median(sum(s["epoch_seconds"]) for s in runs)
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
                hr = "–" if config in cluster_peers.PEERS else "0.0%"
            stall = f"{statistics.median(s['stall_rate'] for s in runs):.2%}" if "stall_rate" in runs[0] else "–"
            rel = f"{base / run:.2f}x" if base else "–"
            if "server_get_bytes" in runs[0]:  # the store's own count beside the ranks'
                sb_server = statistics.median(s["server_get_bytes"] for s in runs)
                plan = f"{plan} (server: {sb_server / 1e6:.1f} MB)"
            alone = " (planned alone)" if runs[0].get("plan_alone") else ""
            rows.append(f"| {_pretty(cap)} | {config}{alone} | {t:.2f} s | {run:.2f} s | {rel} | {sb / 1e6:.1f} MB | {plan} | {peer} | "
                        f"{hr} | {stall} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
