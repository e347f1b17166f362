"""Run under torchrun by test_cluster_resume.py: a run saved mid-epoch and
resumed, on the same world or another one, each rank a node of its own
(OPT4TORCH_NODE=rank).

--phase save: opt4torch.DataLoader(..., cluster=True) over a
DistributedSampler's shuffle, one fork worker a rank, and beside it a
loader of the rank's own pool (no cluster) over a DistributedSampler given
as sampler=; each runs --cut batches of epoch 0, saves state_dict() and
what it read to <dir>/save.<rank>.json, and is closed.

--phase resume: the same two loaders built on this world, each given the
state old rank (rank % saved world) saved; with --refusals, first the
refusals (another seed, another dataset: each a cluster loader built and
refused; then a cluster loader built with the last rank's OPT4TORCH_NODE
unset, then unreadable, refused on every rank). Then the rest of the run: every sample checked against the
source, what each epoch read, and stats() to <dir>/resume.<rank>.json.

--warm (with --phase resume): then a resume in the same processes that
keeps what the pools hold (distributed/warm.py): a cluster loader of 3
epochs whose workers are not persistent reads epoch 0 and --cut batches of
epoch 1, saves, and load_state_dict's its own state (timed); it reads the
rest of epoch 1 and epoch 2.
Beside it, a loader built afresh resumes the same state cold (what a
relaunched job plans). To <dir>/resume.<rank>.json's "warm"."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

import opt4torch
from cluster_loader_run import Items, content, size_of  # the dataset test_cluster_loader.py reads


def cluster_loader(ds: Items, seed: int, args: argparse.Namespace) -> opt4torch.DataLoader:
    total = sum(size_of(x) for x in range(ds.n))
    return opt4torch.DataLoader(
        ds, cluster=True, cluster_alone=False, cluster_window=2, cluster_timeout=30, shuffle=True, seed=seed, epochs=args.epochs,
        batch_size=args.batch, cache_bytes=int(0.25 * total) + 4096, num_workers=1, persistent_workers=True,
        multiprocessing_context="fork", collate_fn=list, wait_timeout=30)


def own_loader(ds: Items, seed: int, args: argparse.Namespace) -> opt4torch.DataLoader:
    sampler = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True,
                                 seed=seed)
    return opt4torch.DataLoader(ds, sampler=sampler, batch_size=args.batch, cache_items=40, epochs=args.epochs,
                                collate_fn=list)


def warm_loader(ds: Items, args: argparse.Namespace) -> opt4torch.DataLoader:
    total = sum(size_of(x) for x in range(ds.n))
    return opt4torch.DataLoader(
        ds, cluster=True, cluster_alone=False, cluster_window=2, cluster_timeout=30, shuffle=True, seed=11, epochs=3,
        batch_size=args.batch, cache_bytes=int(0.25 * total) + 4096, num_workers=1, persistent_workers=False,
        multiprocessing_context="fork", collate_fn=list, wait_timeout=30)


def warm_resume(args: argparse.Namespace) -> dict[str, Any]:
    """Epoch 0 and --cut batches of epoch 1 read, saved, resumed in these
    processes (the pools kept), the rest of epoch 1 read; and the same
    state resumed cold by a loader built afresh."""
    ds = Items(args.items)
    wl = warm_loader(ds, args)
    out: dict[str, Any] = {}
    out["epoch0"], wrong = read(wl)
    out["epoch1_before"], w = read(wl, args.cut)
    wrong += w
    state = wl.state_dict()
    cold = warm_loader(ds, args)
    cold.load_state_dict(state)
    out["cold_plan"] = {"hits": cold.cluster_plan.hits, "storage_bytes": cold.cluster_plan.storage_bytes,
                        "storage_reads": cold.cluster_plan.storage_reads, "warm": cold.cluster_plan.stats()["warm"]}
    cold.cache.close()
    reads, nbytes = ds.counts[0], ds.counts[1]
    # The old transfer thread runs on into load_state_dict, which ends it;
    # until then it may read items from storage for its last windows (its
    # storage_reads: forwards, RECEIVEs that came empty), which then sit in
    # the old pool to be copied. Those reads are the old plan's, not the
    # warming's loads that kept_loaded counts.
    old = wl.cache.transfers
    old_loads = old.storage_reads
    began = time.perf_counter()
    wl.load_state_dict(state)
    out["resume_seconds"] = time.perf_counter() - began
    out["old_thread_loads"] = old.storage_reads - old_loads
    out["loaded_in_resume"] = ds.counts[0] - reads - out["old_thread_loads"]
    reads, nbytes = ds.counts[0], ds.counts[1]
    out["warm_plan"] = {"hits": wl.cluster_plan.hits, "storage_bytes": wl.cluster_plan.storage_bytes,
                        "storage_reads": wl.cluster_plan.storage_reads, "warm": wl.cluster_plan.stats()["warm"]}
    out["epoch1_after"], w = read(wl)
    out["epoch2"], w2 = read(wl)
    out["wrong"] = wrong + w + w2
    rt = wl.cache.transfers
    dist.barrier()  # every rank read its last batch before any node closes (see main)
    rt.finish()
    dist.barrier()
    out["reads"], out["bytes"] = ds.counts[0] - reads, ds.counts[1] - nbytes
    st = wl.cache.stats()
    out["stats"] = {k: v for k, v in st.items() if isinstance(v, (int, float, str, list, type(None)))}
    out["node_stats"] = wl.cluster_plan.node_stats()[wl.node]
    out["thread_error"] = repr(rt.error) if rt.error else None
    dist.barrier()
    wl.cache.close()
    return out


def read(loader: opt4torch.DataLoader, batches: int | None = None) -> tuple[list[int], int]:
    """Samples of one epoch (its first ``batches`` only, if given), and how
    many differed from the source's."""
    seen, wrong = [], 0
    for b, batch in enumerate(loader):
        for x, got in batch:
            seen.append(int(x))
            wrong += not np.array_equal(got, content(int(x)))
        if batches is not None and b + 1 == batches:
            break
    return seen, wrong


def refused(build: Any, state: dict[str, Any]) -> str:
    loader = build()
    try:
        loader.load_state_dict(state)
        return ""
    except ValueError as e:
        return str(e)
    finally:
        loader.cache.close()


def refused_to_build(build: Any, node_env: str | None) -> str:
    """The error building a loader raises with this rank's OPT4TORCH_NODE
    set to ``node_env`` (None: unset), or "" if it builds."""
    kept = os.environ.get("OPT4TORCH_NODE")
    os.environ.pop("OPT4TORCH_NODE", None)
    if node_env is not None:
        os.environ["OPT4TORCH_NODE"] = node_env
    try:
        build().cache.close()
        return ""
    except ValueError as e:
        return str(e)
    finally:
        os.environ.pop("OPT4TORCH_NODE", None)
        if kept is not None:
            os.environ["OPT4TORCH_NODE"] = kept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["save", "resume"], required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--items", type=int, default=242)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--cut", type=int, default=5)
    ap.add_argument("--saved-world", type=int, default=4)
    ap.add_argument("--refusals", action="store_true")
    ap.add_argument("--warm", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = Items(args.items)
    cl = cluster_loader(ds, 3, args)
    own = own_loader(Items(args.items), 5, args)
    out: dict[str, Any] = {"rank": rank}
    if args.phase == "save":
        out["cluster_seen"], out["cluster_wrong"] = read(cl, args.cut)
        out["own_seen"], out["own_wrong"] = read(own, args.cut)
        out["cluster_state"], out["own_state"] = cl.state_dict(), own.state_dict()
    else:
        with open(f"{args.dir}/save.{rank % args.saved_world}.json") as f:
            saved = json.load(f)
        if args.refusals:
            out["refused_seed"] = refused(lambda: cluster_loader(ds, 4, args), saved["cluster_state"])
            out["refused_dataset"] = refused(lambda: cluster_loader(Items(args.items + 1), 3, args),
                                             saved["cluster_state"])
            out["own_refused_seed"] = refused(lambda: own_loader(ds, 6, args), saved["own_state"])
            # Ranks that disagree on their node ids: the last one numbers
            # nodes otherwise (unset: torchrun's GROUP_RANK), then cannot
            # read its setting at all; refused on every rank.
            last = rank == dist.get_world_size() - 1
            out["refused_numbering"] = refused_to_build(lambda: cluster_loader(ds, 3, args),
                                                        None if last else "rank")
            out["refused_unreadable"] = refused_to_build(lambda: cluster_loader(ds, 3, args),
                                                         "node1" if last else "rank")
        # What a fresh run on this world plans, beside the resumed one.
        out["fresh_plan"] = {"hits": cl.cluster_plan.hits, "accesses": cl.cluster_plan.accesses}
        reads_before = ds.counts[0]
        cl.load_state_dict(saved["cluster_state"])
        own.load_state_dict(saved["own_state"])
        out["resumed_at"] = cl.resumed_at
        out["resumed_plan"] = {"hits": cl.cluster_plan.hits, "accesses": cl.cluster_plan.accesses}
        out["cluster_seen"], out["own_seen"], wrong = [], [], 0
        for _ in range(args.epochs):
            seen, w = read(cl)
            out["cluster_seen"].append(seen)
            wrong += w
            seen, w = read(own)
            out["own_seen"].append(seen)
            wrong += w
        out["wrong"] = wrong
        rt = cl.cache.transfers
        # Every rank read its last batch before any node closes, as ranks
        # in lockstep would: a node that closes first sends its last SENDs
        # empty, and a peer still reading loads those from storage
        # (docs/cluster.md, "The last turn, agreed"), a hit short of the plan.
        dist.barrier()
        rt.finish()
        dist.barrier()
        st = cl.cache.stats()
        out["stats"] = {k: v for k, v in st.items() if isinstance(v, (int, float, str, list, type(None)))}
        out["node_stats"] = cl.cluster_plan.node_stats()[cl.node]
        out["reads"] = ds.counts[0] - reads_before
        out["thread_error"] = repr(rt.error) if rt.error else None
        out["state_after"] = cl.state_dict()
        if args.warm:
            out["warm"] = warm_resume(args)
    with open(f"{args.dir}/{args.phase}.{rank}.json", "w") as f:
        json.dump(out, f)
    dist.barrier()
    cl.cache.close()
    own.cache.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
