"""``cluster=True``: the set-up of one plan over every node's memory
(docs/cluster.md). Every rank builds the same cluster plan from the job's
DistributedSampler; this rank's node keeps a pool that runs its part, its
first rank (the leader) runs the transfers to and from the other nodes
(distributed/runtime.py, distributed/exchange.py), the node's other ranks follow. May touch:
torch.distributed (groups, collectives), the planner, pools it creates or
attaches; never a DataLoader (the loader hands in what it needs).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..planning.cluster import ClusterPlan, NodePlan, job_plan
from ..planning.plan import Plan
from ..planning.sizing import CODEC_MARGIN, STAGING_MIN_CLUSTER, item_sizes, parse_bytes, staging_slots
from ..pool.cache import OPTCache
from .runtime import ClusterFollower, ClusterRuntime
from .node import release_group

__all__ = ["ClusterSetup", "cluster_pool", "cluster_setup"]


@dataclass(frozen=True)
class ClusterSetup:
    """What :func:`cluster_setup` decided for this rank."""

    #: The cluster plan every rank made, and this rank's node in it.
    cp: ClusterPlan
    node: int
    #: The node's part of the plan, and the plan its pool runs.
    node_plan: NodePlan
    plan: Plan
    #: The pool's page (0: the plan's own, a plan in bytes).
    pool_page: int
    #: The group of every rank (the plan's), the group of the nodes' leaders
    #: that exchanges items, and each node's rank in the latter.
    group: Any
    exchange_group: Any
    peers: list[int]
    #: The global rank of this node's leader (its first rank).
    leader: int
    #: This rank's batches per epoch, as node-plan positions: their starts,
    #: lengths, and each epoch's floor.
    starts: list[np.ndarray]
    own: list[np.ndarray]
    floors: list[int]
    #: The items' sizes as stored in the source (None: one size for all).
    storage_sizes: np.ndarray | None
    #: This rank's DistributedSampler (given, or made from shuffle= and seed=).
    sampler: Any = None


def cluster_setup(dataset: Any, *, batch_size: int, shuffle: bool | None, sampler: Any, seed: int | None,
                   epochs: int, cache_bytes: Any, cache_items: int | None, item_bytes: Any, page_size: int | None,
                   allow_pickle: bool, window: int, timeout: float, progress: bool | None,
                   probe: Callable[[Any, np.ndarray, bool], tuple[int, int]]) -> ClusterSetup:
    """``cluster=True``: the job's cluster plan over every node's memory
    (:func:`opt4torch.cluster.job_plan`, windows of ``window`` steps), this
    node's part of it as the pool's plan, this rank's batches as node-plan
    positions, and a gloo group of the loader's own for the transfers.
    ``probe(dataset, indices, allow_pickle)`` measures items' (smallest,
    largest) stored size when no size is given."""
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler


    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("cluster=True runs under torch.distributed (torchrun): call "
                           "torch.distributed.init_process_group before building the loader")
    world, rank = dist.get_world_size(), dist.get_rank()
    n_items = len(dataset)
    if sampler is None:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=bool(shuffle),
                                     seed=0 if seed is None else int(seed))
    elif not isinstance(sampler, DistributedSampler):
        raise ValueError("cluster=True plans every rank's order, which it knows from a DistributedSampler: "
                         f"give one as sampler= (or none, with shuffle= and seed=), not {type(sampler).__name__}")
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=float(timeout)))
    sizes = item_sizes(dataset, item_bytes, n_items, progress)
    if sizes is not None and cache_items is not None:
        raise ValueError("per-item sizes plan the cache in bytes: give cache_bytes= (a node's), not cache_items=")
    capacity: dict[str, Any]
    pool_page = 0
    if sizes is None:
        if item_bytes is None:
            lo, hi = probe(dataset, np.arange(n_items), allow_pickle)
            item_bytes = hi
        pool_page = int(item_bytes)
        per_node = int(cache_items) if cache_items is not None else parse_bytes(cache_bytes) // pool_page
        if per_node < 1:
            raise ValueError(f"cache_bytes={cache_bytes!r} holds no item of {pool_page} bytes")
        capacity = dict(capacity_per_node=min(per_node, n_items), item_bytes=pool_page)
    else:
        capacity = dict(cache_bytes=parse_bytes(cache_bytes), item_sizes=sizes, page_size=page_size)
    cp, node = job_plan(sampler, epochs, batch_size=int(batch_size), window=int(window), group=group,
                        progress=progress, **capacity)
    # The ranks of each node: its first one (the leader) owns the node's pool
    # and runs its transfers, on a group of the leaders (the plan's group
    # when every rank is a node).
    node_of_rank = np.full(world, -1, dtype=np.int64)
    node_of_rank[cp.timeline.rank] = cp.reader
    if (node_of_rank < 0).any():
        raise ValueError(f"ranks {np.flatnonzero(node_of_rank < 0).tolist()} read nothing in the cluster "
                         "plan: every rank needs at least one sample")
    leaders = [int(np.flatnonzero(node_of_rank == n)[0]) for n in range(cp.n_nodes)]
    exchange_group, peers = group, list(range(cp.n_nodes))
    if cp.n_nodes != world:
        ordered = sorted(leaders)
        exchange_group = dist.new_group(ordered, backend="gloo", timeout=datetime.timedelta(seconds=float(timeout)))
        peers = [ordered.index(r) for r in leaders]
    node_plan = cp.node_plan(node)
    plan = cp.pool_plan(node, node_plan)
    # This rank's batches, as positions of its node's plan: each batch is a
    # step of one rank, so its reads are one run of the plan (a window's
    # RECEIVEs and SENDs come before its reads).
    reads = node_plan.reads
    reads = reads[cp.timeline.rank[node_plan.position[reads]] == rank]
    starts, own, floors = [], [], []
    done = 0
    for per_epoch in _epoch_lengths(sampler, epochs):
        if per_epoch == 0:  # an epoch a resumed run has done already (loader/elastic.py)
            starts.append(np.empty(0, np.int64))
            own.append(np.empty(0, np.int64))
            floors.append(0)
            continue
        lengths = np.full(per_epoch // int(batch_size), int(batch_size), dtype=np.int64)
        if per_epoch % int(batch_size):
            lengths = np.append(lengths, per_epoch % int(batch_size))
        first = done + np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        starts.append(reads[first].astype(np.int64))
        own.append(lengths)
        floors.append(0)  # the transfer thread's positions of a window come before its reads
        for f, n in zip(first.tolist(), lengths.tolist()):
            assert reads[f + n - 1] - reads[f] == n - 1, "a batch split by the node plan"
        done += per_epoch
    raw = None if sizes is None else sizes.astype(np.int64) - CODEC_MARGIN
    return ClusterSetup(cp=cp, node=node, node_plan=node_plan, plan=plan, pool_page=pool_page, group=group,
                        exchange_group=exchange_group, peers=peers, leader=leaders[node], starts=starts, own=own,
                        floors=floors, storage_sizes=raw, sampler=sampler)


def _epoch_lengths(sampler: Any, epochs: int) -> list[int]:
    """This rank's samples in each epoch (a resumed run's differ by epoch)."""
    kept = sampler.epoch
    try:
        out = []
        for e in range(epochs):
            sampler.set_epoch(e)
            out.append(len(sampler))
        return out
    finally:
        sampler.set_epoch(kept)


def cluster_pool(c: ClusterSetup, dataset: Any, *, reader: Any, allow_pickle: bool, wait_timeout: float,
                 staging: int | None, timeout: float) -> OPTCache:
    """This node's pool: made by the node's leader, with its transfers
    (claimed before any prefetcher's), attached by the node's other ranks,
    which follow the leader's transfers. ``reader(pool_name, accesses)``
    gives the dataset as a worker reads it (the transfers read RECEIVEs as a
    worker would)."""
    import torch.distributed as dist

    plan = c.plan
    if staging is None:  # peer reads and forwards wait in the staging ring
        staging = staging_slots(plan, c.pool_page, minimum=STAGING_MIN_CLUSTER)
    leader = c.leader == dist.get_rank()
    name: list[Any] = [None] * dist.get_world_size()
    cache: OPTCache | None = None
    if leader:
        cache = OPTCache(plan, c.pool_page, wait_timeout=wait_timeout, staging_slots=int(staging))
        cache.transfers = ClusterRuntime(
            c.cp, c.node_plan, cache.name, dataset, reader=reader(cache.name, len(c.node_plan)),
            allow_pickle=allow_pickle, group=c.exchange_group, peers=c.peers, storage_sizes=c.storage_sizes,
            timeout=timeout)
    dist.all_gather_object(name, cache.name if cache is not None else None, group=c.group)
    if c.group is not c.exchange_group:
        release_group(c.group)  # planned and shared: the exchange has a group of its own
    if cache is None:
        cache = OPTCache.attach(name[c.leader], plan, c.pool_page or plan.page_size)
        cache.transfers = ClusterFollower(c.cp, c.node_plan, c.storage_sizes, c.leader)
    return cache
