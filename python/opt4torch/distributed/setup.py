"""``cluster=True``: the set-up of one plan over every node's memory
(docs/cluster.md). Each node's first rank (the leader) builds the cluster
plan from the job's DistributedSampler, once a node, and hands its node's
part to the node's other ranks through shared memory (distributed/handoff.py);
the leaders compare their plans' checksums. This rank's node keeps a pool
that runs its part, the leader runs the transfers to and from the other
nodes (distributed/runtime.py, distributed/exchange.py), the node's other
ranks follow. May touch: torch.distributed (groups, collectives), the
planner, pools it creates or attaches, the handoff's files; never a
DataLoader (the loader hands in what it needs).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..planning.cluster import JobAgreement, agree, check_checksums, plan_agreed
from ..planning.clusterplan import ClusterFigures, ClusterPlan, NodePlan
from ..planning.plan import Plan
from ..planning.sizing import CODEC_MARGIN, STAGING_MIN_CLUSTER, item_sizes, parse_bytes, staging_slots
from ..pool.cache import OPTCache
from .exchange import NodeTransfers
from .handoff import NodeShare, read_share, remove_share, share_path, write_share
from .node import release_group
from .follower import ClusterFollower
from .runtime import ClusterRuntime
from .warm import Held, held_now, warm_count, warm_pool

__all__ = ["ClusterSetup", "cluster_pool", "cluster_setup"]


@dataclass(frozen=True)
class ClusterSetup:
    """What :func:`cluster_setup` decided for this rank."""

    #: The cluster plan's figures (totals, each node's counts, checksum),
    #: the same on every rank, and this rank's node in it.
    cp: ClusterFigures
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
    #: The shared files of this node's part, on its leader until its ranks
    #: have mapped them (cluster_pool removes them).
    share: str | None = None
    #: What the node's transfer thread needs of the plan, on the rank that
    #: made it (the node's first), which keeps nothing else of the plan;
    #: None on the node's other ranks.
    transfers: NodeTransfers | None = None
    #: What the node's old pool holds, on the rank that owns it, when a
    #: live loader resumed (distributed/warm.py): the plan starts with it,
    #: and the new pool is warmed from it.
    held: Held | None = None


def cluster_setup(dataset: Any, *, batch_size: int, shuffle: bool | None, sampler: Any, seed: int | None,
                   epochs: int, cache_bytes: Any, cache_items: int | None, item_bytes: Any, page_size: int | None,
                   allow_pickle: bool, window: int, timeout: float, alone: bool | None, progress: bool | None,
                   probe: Callable[[Any, np.ndarray, bool], tuple[int, int]]) -> ClusterSetup:
    """``cluster=True``: the job's cluster plan over every node's memory
    (windows of ``window`` steps), planned once a node by its first rank
    (:func:`plan_once_per_node`), this node's part of it as the pool's plan,
    this rank's batches as node-plan positions, and a gloo group of the
    loader's own for the transfers.
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
    opts = dict(batch_size=int(batch_size), window=int(window), alone=alone, **capacity)
    held = held_now()
    agreed = agree(sampler, epochs, group=group, check_sizes=True, warm=None if held is None else held.items,
                   **opts)
    node, leaders = agreed.node_of_rank[rank], agreed.leaders
    # The ranks of each node: its first one (the leader) plans for the node,
    # owns its pool and runs its transfers, on a group of the leaders (the
    # plan's group when every rank is a node).
    exchange_group, peers = group, list(range(agreed.n_nodes))
    if agreed.n_nodes != world:
        ordered = sorted(leaders)
        exchange_group = dist.new_group(ordered, backend="gloo", timeout=datetime.timedelta(seconds=float(timeout)))
        peers = [ordered.index(r) for r in leaders]
    wait = float(timeout) + PLAN_WAIT_PER_ACCESS * epochs * len(sampler) * world
    share, path, transfers = plan_once_per_node(sampler, epochs, agreed, group=group, opts=opts, progress=progress,
                                                wait=wait)
    node_plan, plan = share.node_plan, share.plan
    try:
        starts, own, floors = _batches(node_plan, share.ranks, rank, sampler, epochs, int(batch_size))
    except BaseException:
        remove_share(path)
        raise
    raw = None if sizes is None else sizes.astype(np.int64) - CODEC_MARGIN
    return ClusterSetup(cp=share.figures, node=node, node_plan=node_plan, plan=plan, pool_page=pool_page,
                        group=group, exchange_group=exchange_group, peers=peers, leader=leaders[node],
                        starts=starts, own=own, floors=floors, storage_sizes=raw, sampler=sampler, share=path,
                        transfers=transfers, held=held)


def _batches(node_plan: NodePlan, ranks: np.ndarray, rank: int, sampler: Any, epochs: int, batch_size: int
             ) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """This rank's batches, as positions of its node's plan: their starts,
    lengths, and each epoch's floor. Each batch is a step of one rank, so
    its reads are one run of the plan (a window's RECEIVEs and SENDs come
    before its reads)."""
    reads = node_plan.reads
    reads = reads[ranks[reads] == rank]
    starts, own, floors = [], [], []
    done = 0
    for per_epoch in _epoch_lengths(sampler, epochs):
        if per_epoch == 0:  # an epoch a resumed run has done already (loader/elastic.py)
            starts.append(np.empty(0, np.int64))
            own.append(np.empty(0, np.int64))
            floors.append(0)
            continue
        lengths = np.full(per_epoch // batch_size, batch_size, dtype=np.int64)
        if per_epoch % batch_size:
            lengths = np.append(lengths, per_epoch % batch_size)
        first = done + np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        starts.append(reads[first].astype(np.int64))
        own.append(lengths)
        floors.append(0)  # the transfer thread's positions of a window come before its reads
        for f, n in zip(first.tolist(), lengths.tolist()):
            assert reads[f + n - 1] - reads[f] == n - 1, "a batch split by the node plan"
        done += per_epoch
    return starts, own, floors


#: How long a rank that does not plan waits for its node's leader to plan,
#: beyond ``cluster_timeout``: 10 us an access of the global timeline. The
#: capture, the plan and the node's part took 0.55 us an access at
#: ImageNet-1k, 90 epochs, 64 nodes of 8 ranks (115 M accesses, 64 s) on a
#: loaded 2-core machine (bench/RESULTS.md), so this is 18 times that. A leader that dies is
#: seen at once (gloo's connections close), one that fails says why.
PLAN_WAIT_PER_ACCESS = 10e-6


def share_of(full: ClusterPlan, node: int) -> NodeShare:
    """What node ``node``'s ranks need of the plan its leader made: the node
    plan, the global rank reading each of its positions, the pool's plan."""
    node_plan = full.node_plan(node)
    return NodeShare(node_plan=node_plan, ranks=full.timeline.rank[node_plan.position].astype(np.int32),
                     plan=full.pool_plan(node, node_plan), figures=full.figures())


def plan_once_per_node(sampler: Any, epochs: int, agreed: JobAgreement, *, group: Any, opts: dict[str, Any],
                       progress: bool | None, wait: float) -> tuple[NodeShare, str | None, NodeTransfers | None]:
    """The cluster plan, made once a node: on each node's first rank (its
    leader), which writes its node's part to shared memory when the node
    has other ranks; they map it. One collective on every rank after the
    leaders planned (bounded by ``wait`` seconds on a group of its own when
    some rank waits for its leader, else on ``group``) hands over where
    each node's part is, compares the leaders' checksums, and carries a
    leader's failure to every rank as an error that names it. Returns this
    rank's share (the plan's figures in it), the shared files' path on a
    leader that wrote them, and on a leader what its transfer thread needs
    of the plan (:class:`NodeTransfers`): the plan itself is let go before
    the gather, so that the leader holds only its node's part from then on
    (docs/cluster.md, "After planning")."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    node = agreed.node_of_rank[rank]
    leader = agreed.leaders[node] == rank
    followers = agreed.n_nodes != world
    handoff = group
    if followers:  # a rank that does not plan waits as long as planning takes
        handoff = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=wait))
    share: NodeShare | None = None
    transfers: NodeTransfers | None = None
    path: str | None = None
    failure: BaseException | None = None
    said: dict[str, Any] | None = None
    if leader:
        try:
            full = plan_agreed(sampler, epochs, agreed, progress=progress, **opts)
            reading = np.zeros(world, dtype=bool)
            reading[np.unique(full.timeline.rank)] = True
            if not reading.all():
                raise ValueError(f"ranks {np.flatnonzero(~reading).tolist()} read nothing in the cluster plan: "
                                 "every rank needs at least one sample")
            share = share_of(full, node)
            transfers = NodeTransfers.of(full, node)
            said = {"checksum": full.checksum, "path": None}
            del full  # nothing else holds it: the node's part and its transfers are copies
            if agreed.node_of_rank.count(node) > 1:
                path = share_path(agreed.token, node)
                write_share(path, share)
                said["path"] = path
        except Exception as exc:  # every rank hears of it: none waits for a plan that will not come
            failure = exc
            said = {"error": f"{type(exc).__name__}: {exc}"}
    everyone: list[Any] = [None] * world
    try:
        try:
            dist.all_gather_object(everyone, said, group=handoff)
        except RuntimeError as exc:  # gloo's: a connection closed, or the timeout
            if failure is not None:
                raise failure from exc
            raise RuntimeError(
                f"the cluster plan was not made: rank {rank} waited for the planning ranks (each node's first, "
                f"{agreed.leaders}), and the gather failed (its bound: {wait:.0f} s): a planning rank died (out "
                f"of memory? see its log) or did not answer ({exc})") from exc
        finally:
            if handoff is not group:
                release_group(handoff)
        failed = [(r, e["error"]) for r, e in enumerate(everyone) if e is not None and "error" in e]
        if failure is not None:
            raise failure
        if failed:
            r, text = failed[0]
            whose = "this node's" if agreed.node_of_rank[r] == node else f"node {agreed.node_of_rank[r]}'s"
            raise RuntimeError(f"the cluster plan was not made: rank {r}, {whose} planning rank, failed "
                               f"with {text}")
        check_checksums([None if e is None else e["checksum"] for e in everyone])
        if share is None:
            got = everyone[agreed.leaders[node]]
            share = read_share(str(got["path"]))
    except BaseException:
        remove_share(path)
        raise
    return share, path, transfers


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


def cluster_pool(c: ClusterSetup, dataset: Any, *, allow_pickle: bool, wait_timeout: float,
                 staging: int | None, timeout: float, readers: int) -> OPTCache:
    """This node's pool: made by the node's leader, with its transfers
    (claimed before any prefetcher's), attached by the node's other ranks,
    which follow the leader's transfers. ``readers``: the threads the
    leader's transfer thread reads forwards from storage with."""
    import torch.distributed as dist

    plan = c.plan
    if staging is None:  # peer reads and forwards wait in the staging ring
        staging = staging_slots(plan, c.pool_page, minimum=STAGING_MIN_CLUSTER)
    leader = c.leader == dist.get_rank()
    name: list[Any] = [None] * dist.get_world_size()
    cache: OPTCache | None = None
    try:
        if leader:
            assert c.transfers is not None, "a node's first rank made the plan"
            cache = OPTCache(plan, c.pool_page, wait_timeout=wait_timeout, staging_slots=int(staging))
            # A warm prefix (a live loader resumed): the plan's first positions
            # are the items the old pool holds that the new plan keeps, copied
            # now, before any worker or transfer reads the pool.
            cache._prefix = warm_count(c.node_plan)
            if c.held is not None:  # on every node's owner alike: it ends the old transfer thread
                kept, loaded = warm_pool(c.held, cache, dataset, allow_pickle)
                cache._earlier.update(kept=kept, kept_loaded=loaded)
            cache.transfers = ClusterRuntime(
                c.transfers, c.node_plan, cache.name, dataset, allow_pickle=allow_pickle, group=c.exchange_group,
                peers=c.peers, storage_sizes=c.storage_sizes, timeout=timeout,
                epoch_starts=[int(s[0]) for s in c.starts if s.size], readers=readers)
        dist.all_gather_object(name, cache.name if cache is not None else None, group=c.group)
    finally:  # the node's ranks mapped its share before this gather
        remove_share(c.share)
    if c.group is not c.exchange_group:
        release_group(c.group)  # planned and shared: the exchange has a group of its own
    if cache is None:
        cache = OPTCache.attach(name[c.leader], plan, c.pool_page or plan.page_size)
        cache._prefix = warm_count(c.node_plan)
        cache.transfers = ClusterFollower(c.cp, c.node_plan, c.storage_sizes, c.leader)
    return cache
