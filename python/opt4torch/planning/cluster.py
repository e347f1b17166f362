"""One OPT cache over several nodes, as ``opt4torch.cluster`` names it:
the plan (clusterplan.py: :class:`ClusterPlan`, :func:`cluster_plan`), the
timeline it is planned over (timeline.py), and here the side of a job under
torch.distributed (torchrun): which node a rank is on (``OPT4TORCH_NODE``),
what every rank must agree on, and :func:`job_plan`, the same cluster plan
on every rank. May touch: torch.distributed in job_plan (collectives on the
group it is given), the sampler (captured with its state restored), the
planner; never a pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _engine
from .._engine import InvalidInputError
from .alone import MIN_SAVING, choose
from .clusterplan import (ADMIT, BYPASS, FROM_PEER, FROM_POOL, FROM_STORAGE, LATE, LOCAL_HIT, NODE_KEYS, PEER_HIT,
                          RECEIVE, SEND, WARM, WORKER, ClusterFigures, ClusterPlan, NodePlan)
from .plan import Plan, as_sequence
from .sizing import choose_page
from .plan import plan as build_plan
from .timeline import Timeline, global_timeline, interleave, with_warm_prefix

__all__ = ["LOCAL_HIT", "PEER_HIT", "ADMIT", "BYPASS", "LATE", "NODE_ENV", "NODE_KEYS", "ClusterFigures",
           "ClusterPlan", "NodePlan",
           "Timeline", "WORKER", "RECEIVE", "SEND", "WARM", "FROM_POOL", "FROM_STORAGE", "FROM_PEER",
           "JobAgreement", "MIN_SAVING", "agree", "check_checksums", "check_nodes", "check_numbering", "cluster_plan",
           "global_timeline", "interleave", "job_plan", "node_of_this_rank", "plan_agreed", "plans_made", "this_host"]

def _capacities(capacity_per_node: Any, n_nodes: int) -> np.ndarray:
    if isinstance(capacity_per_node, (int, np.integer)) and not isinstance(capacity_per_node, bool):
        caps = np.full(n_nodes, int(capacity_per_node), dtype=np.int64)
    else:
        try:
            caps = np.asarray(capacity_per_node)
        except (TypeError, ValueError):
            caps = np.asarray([None])
        if caps.ndim != 1 or caps.size == 0 or not np.issubdtype(caps.dtype, np.integer):
            raise InvalidInputError("a node's capacity must be an integer (items, or bytes for cache_bytes), "
                                    f"or one per node, got {capacity_per_node!r}")
    if (caps < 0).any():
        raise InvalidInputError(f"a node's capacity cannot be negative: {caps.tolist()}")
    if caps.sum() < 1:
        raise InvalidInputError("the nodes' capacities add up to 0: a cluster cache must hold at least one item")
    return caps.astype(np.uint64)


def _nodes_of_ranks(node_of_rank: Sequence[int] | None, world: int) -> np.ndarray:
    """Each rank's node, checked (``None``: each rank a node of its own)."""
    if node_of_rank is None:
        return np.arange(world, dtype=np.int64)
    node_of = np.asarray(node_of_rank)
    if node_of.shape != (world,) or (node_of.size and not np.issubdtype(node_of.dtype, np.integer)):
        raise InvalidInputError(f"node_of_rank needs one integer node per rank ({world}), got {node_of_rank!r}")
    if (node_of < 0).any():
        raise InvalidInputError(f"node ids cannot be negative: {node_of.tolist()}")
    return node_of


def _node_count(given: Any, what: str, node_of: np.ndarray) -> int:
    """How many nodes: one capacity for all makes the ranks' nodes; one per
    node names them (and must name every rank's)."""
    if isinstance(given, (int, np.integer)) and not isinstance(given, bool):
        return int(node_of.max()) + 1
    try:
        n_nodes = len(given)
    except TypeError:
        raise InvalidInputError(f"{what} must be a number, or one per node, got {given!r}") from None
    if int(node_of.max()) >= n_nodes:
        raise InvalidInputError(f"rank {int(np.argmax(node_of >= n_nodes))} is on node "
                                f"{int(node_of.max())}, but {what} names {n_nodes} nodes")
    return n_nodes


def _aggregate(seq: np.ndarray, items: int, n_nodes: int, capacity_per_node: Any, cache_bytes: Any,
               sizes: np.ndarray | None, page_size: int | None, progress: bool | None
               ) -> tuple[Plan, np.ndarray, int]:
    """The aggregate plan (Belady at the nodes' total capacity), each node's
    capacity (items, or pages) and the page (0: a plan in items)."""
    if cache_bytes is None:
        caps = _capacities(capacity_per_node, n_nodes)
        return build_plan(seq, int(caps.sum()), items=items, progress=progress), caps, 0
    if sizes is None:
        raise InvalidInputError("cache_bytes needs item_sizes (the bytes each item takes)")
    page = int(page_size) if page_size is not None else choose_page(sizes[np.unique(seq)])
    if page < 1:
        raise InvalidInputError(f"page_size must be positive, got {page_size!r}")
    in_bytes = _capacities(cache_bytes, n_nodes)
    caps = in_bytes // np.uint64(page)
    if caps.sum() < 1:
        raise InvalidInputError(f"cache_bytes {in_bytes.tolist()} hold no page of {page} bytes")
    aggregate = build_plan(seq, items=items, capacity_bytes=int(caps.sum()) * page, item_sizes=sizes,
                           page_size=page, progress=progress)
    return aggregate, caps, page


#: Cluster plans made in this process (:func:`plans_made`).
_plans_made = 0


def plans_made() -> int:
    """How many cluster plans this process has made (:func:`cluster_plan`
    calls that planned): a ``cluster=True`` rank that is not its node's
    first plans none; it receives its node's part (distributed/handoff.py)."""
    return _plans_made


def cluster_plan(seqs_by_rank: Sequence[Any], node_of_rank: Sequence[int] | None, capacity_per_node: Any = None,
                 *, cache_bytes: Any = None, page_size: int | None = None, items: int | None = None,
                 batch_size: int = 1, item_bytes: int = 1, item_sizes: Any = None,
                 window: int | None = None, warm: Sequence[Any] | None = None,
                 alone: bool | None = False, progress: bool | None = None) -> ClusterPlan:
    """Plan one OPT cache over several nodes.

    ``seqs_by_rank[r]`` is rank r's order (an array, or a list of arrays, one
    per epoch: see :func:`global_timeline`, and :func:`opt4torch.capture_ranks`
    for a DistributedSampler); ``node_of_rank[r]`` the node rank r runs on
    (``None``: each rank a node of its own); ``capacity_per_node`` the items
    each node holds (one number for all, or one per node; the nodes are
    ``0 .. len(capacity_per_node) - 1`` then, and a node may have no rank).
    ``batch_size`` is how many samples a rank reads per step.

    The capacity is in items: every item takes one place. ``item_bytes``
    (equal sizes) or ``item_sizes`` (one per item) only count bytes: storage
    bytes, peer bytes (by default 1 a item, so bytes count items).

    Or give ``cache_bytes`` (bytes a node, one number or one per node) with
    ``item_sizes`` instead of ``capacity_per_node``: the plan is then in
    pages of ``page_size`` bytes (default: the one that wastes least on the
    sizes, :func:`opt4torch.planning.sizing.choose_page`), the aggregate
    plan size-aware Belady (a heuristic with unequal sizes), and a
    generation needs its pages on one node; one that finds no such node is
    read from storage instead (:attr:`ClusterPlan.unplaced`).

    ``window`` (steps): plan for the run time's transfers, which go a
    window ahead. In window k each node sends each other node what it reads
    from it in window k + 1, and only what it holds when window k starts.
    A generation kept by the node that read it from storage serves its
    peers from two windows after its ADMIT's; one kept elsewhere reaches
    its home then, and its peers a window later. Earlier reads are
    :data:`LATE` (from storage, counted in ``plan_storage_bytes``), and a
    generation goes to its next reader's node only when it can get there in
    time (docs/cluster.md). ``None``: transfers are assumed always in time.

    ``warm`` (one array of item ids per node): what each node's pool holds
    at the start, a resumed run's (docs/cluster.md, "The cache after a
    resume"). The timeline then starts with a prefix, a step of its own (a
    window of its own with ``window``): each node's first rank "reads" its
    node's items, and OPT decides which of them to keep, as for any access;
    a kept one stays where it is (never sent: nobody reads the prefix) and
    serves its node at once and its peers from the next window. An item two
    nodes name is taken from the lower node. The prefix is
    :attr:`ClusterPlan.prefix` positions long and counts in no figure but
    ``warm`` (the kept ones) and ``homed``.

    ``alone``: ``False`` (the default) places the aggregate plan as above,
    ``True`` gives each node its own OPT plan (no transfer), ``None`` plans
    alone unless one over the cluster reads :data:`MIN_SAVING` fewer bytes.
    """
    if alone is not None and not isinstance(alone, bool):
        raise InvalidInputError(f"alone must be True, False or None (whichever reads less), got {alone!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, np.integer))
                               or window < 1):
        raise InvalidInputError(f"window must be a positive number of steps, or None, got {window!r}")
    timeline = global_timeline(seqs_by_rank, batch_size)
    node_of = _nodes_of_ranks(node_of_rank, len(seqs_by_rank))
    prefix = 0
    if (capacity_per_node is None) == (cache_bytes is None):
        raise InvalidInputError("give the capacity a node as capacity_per_node= (items) or cache_bytes= "
                                "(bytes, with item_sizes), not both and not neither")
    n_nodes = _node_count(capacity_per_node if cache_bytes is None else cache_bytes,
                          "capacity_per_node" if cache_bytes is None else "cache_bytes", node_of)
    if warm is not None:
        timeline, prefix = with_warm_prefix(timeline, warm, node_of, n_nodes, 1 if window is None else int(window))
    seq, items = as_sequence(timeline.seq, items)
    sizes = None
    if item_sizes is not None:
        sizes = np.ascontiguousarray(item_sizes, dtype=np.uint64)
        if sizes.shape != (items,):
            raise InvalidInputError(f"item_sizes has {sizes.size} entries; the dataset has {items} items")
    if isinstance(item_bytes, bool) or not isinstance(item_bytes, (int, np.integer)) or item_bytes < 0:
        raise InvalidInputError(f"item_bytes must be a non-negative integer, got {item_bytes!r}")
    aggregate, caps, page = _aggregate(seq, items, n_nodes, capacity_per_node, cache_bytes, sizes, page_size,
                                       progress)
    reader = np.ascontiguousarray(node_of[timeline.rank], dtype=np.uint32)
    kinds = np.empty(seq.size, dtype=np.uint8)
    nodes = np.empty(seq.size, dtype=np.uint32)
    window_of = None
    if window is not None:
        w = timeline.step // int(window)
        if w.size and int(w[-1]) > 0xFFFF_FFFF:
            raise InvalidInputError(f"window={window} makes {int(w[-1]) + 1} windows; the limit is 2**32")
        window_of = np.ascontiguousarray(w, dtype=np.uint32)
    info, per_node = _engine.cluster_place(aggregate._h, reader, caps, kinds, nodes, sizes, int(item_bytes),
                                           window_of, prefix)
    kinds, nodes, info, per_node = choose(alone, (kinds, nodes, info, per_node), seq, items, reader, caps, page,
                                          sizes, int(item_bytes), window_of, prefix)
    global _plans_made
    _plans_made += 1
    return ClusterPlan(aggregate, timeline, reader, caps.astype(np.int64), kinds, nodes, info, per_node,
                       None if sizes is None else sizes.astype(np.int64), int(item_bytes), page,
                       None if window is None else int(window), prefix)


# ---- a job under torch.distributed (torchrun) ----

#: The environment variable that says which node a rank belongs to: a node
#: id (a non-negative integer); ``rank`` (each rank a node of its own, so
#: that several ranks on one machine act as separate nodes, each with its own
#: pool); or ``rank//K`` (every K consecutive ranks a node, as torchrun numbers
#: the ranks of a node with K processes). Unset: torchrun's ``GROUP_RANK``
#: (the node's rank), else 0.
NODE_ENV = "OPT4TORCH_NODE"


def node_of_this_rank(rank: int, environ: Any = None) -> int:
    """The node this rank belongs to (see :data:`NODE_ENV`)."""
    import os

    env = os.environ if environ is None else environ
    raw = env.get(NODE_ENV)
    if raw is not None:
        text = raw.strip().lower()
        if text == "rank":
            return int(rank)
        if text.isdigit():
            return int(text)
        per = text.replace(" ", "").removeprefix("rank//")
        if text.replace(" ", "").startswith("rank//") and per.isdigit() and int(per) > 0:
            return int(rank) // int(per)
        raise InvalidInputError(f"{NODE_ENV}={raw!r}: give a node id (a non-negative integer), 'rank' for "
                                "each rank a node of its own, or 'rank//K' for every K consecutive ranks a node")
    group_rank = env.get("GROUP_RANK")
    return int(group_rank) if group_rank is not None and group_rank.isdigit() else 0


def this_host() -> str:
    """What names this machine among a job's: its host name and the
    kernel's boot id (two containers may share a host name, never a boot
    id and a /dev/shm)."""
    import socket

    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def check_nodes(nodes: Sequence[int], hosts: Sequence[str]) -> None:
    """Every rank's node id (``nodes[r]``) against the machine it runs on
    (``hosts[r]``): a node's ranks share one pool in shared memory, so a
    node id on two machines means the ranks disagree on how nodes are
    numbered (``OPT4TORCH_NODE`` set on some ranks and not others, or set
    differently), and is refused naming the ranks. Several nodes on one
    machine are fine (each its own pool)."""
    first: dict[int, int] = {}
    for r, (n, h) in enumerate(zip(nodes, hosts)):
        r0 = first.setdefault(int(n), r)
        if hosts[r0] != h:
            raise ValueError(
                f"ranks {r0} and {r} both say they are node {n}, but run on different machines "
                f"({hosts[r0].split('/')[0]} and {h.split('/')[0]}): a node's ranks share one pool in shared "
                f"memory. The ranks disagree on how nodes are numbered: set {NODE_ENV} the same way on every "
                "rank ('rank', 'rank//K', or unset to take torchrun's GROUP_RANK), or give each machine its "
                "own node ids")


def _numbering(setting: str | None) -> str:
    """How one rank's ``OPT4TORCH_NODE`` numbers the nodes, as said in an
    error: unset, ``'rank'``, ``'rank//K'``, or an id given per machine."""
    if setting is None:
        return "unset (torchrun's GROUP_RANK)"
    text = setting.strip().lower().replace(" ", "")
    if text.isdigit():
        return "a node id given per machine"
    return repr(text)


def check_numbering(settings: Sequence[str | None], unreadable: Sequence[str | None]) -> None:
    """Every rank's ``OPT4TORCH_NODE`` (``settings[r]``, None where unset)
    and the error its value raised on that rank (``unreadable[r]``, None if
    none). A value one rank cannot read is refused on every rank, naming it
    (refused on its rank alone, it would leave the others waiting in the
    job's next collective). Ranks that number nodes in different ways
    (``'rank'`` on some, unset or ``'rank//4'`` on others) disagree on
    their node ids even where no node spans two machines, and are refused
    naming the ways and their ranks: the setting is the job's, the same on
    every rank, except an explicit id, which each machine gives its own."""
    bad = [(r, e) for r, e in enumerate(unreadable) if e]
    if bad:
        r, e = bad[0]
        others = f" (nor can ranks {_some([r for r, _ in bad[1:]])})" if len(bad) > 1 else ""
        raise InvalidInputError(f"rank {r} cannot tell its node: {e}{others}")
    ways: dict[str, list[int]] = {}
    for r, s in enumerate(settings):
        ways.setdefault(_numbering(s), []).append(r)
    if len(ways) > 1:
        said = "; ".join(f"{way} on ranks {_some(rs)}" for way, rs in ways.items())
        raise ValueError(
            f"the ranks of this job disagree on their node ids: {NODE_ENV} is {said}. Set {NODE_ENV} the "
            "same way on every rank ('rank', 'rank//K', or unset to take torchrun's GROUP_RANK; an explicit id "
            "on every machine), or the nodes' pools and transfers would not be the ones each rank plans")


def _some(ranks: Sequence[int], shown: int = 8) -> str:
    """Ranks as said in an error: every one of a few, the first of many."""
    if len(ranks) <= shown:
        return str(list(ranks))
    return "[" + ", ".join(str(r) for r in ranks[:shown]) + f", ...] ({len(ranks)} ranks)"


def _sampler_facts(sampler: Any) -> dict[str, Any]:
    """What every rank's copy of the sampler must agree on."""
    facts: dict[str, Any] = {"sampler": f"{type(sampler).__module__}.{type(sampler).__qualname__}"}
    for key in ("num_replicas", "seed", "shuffle", "drop_last"):
        if hasattr(sampler, key):
            facts[key] = getattr(sampler, key)
    dataset = getattr(sampler, "dataset", None)
    if dataset is not None and hasattr(dataset, "__len__"):
        facts["dataset_len"] = len(dataset)
    return facts


def _disagreement(everyone: Sequence[dict[str, Any]]) -> str | None:
    """The first fact the ranks do not agree on, said with each rank's value."""
    for key in everyone[0]:
        values = [f.get(key) for f in everyone]
        if any(v != values[0] for v in values[1:]):
            shown = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values[:16]))
            more = f", ... ({len(values)} ranks)" if len(values) > 16 else ""
            return f"{key} ({shown}{more})"
    return None


@dataclass(frozen=True)
class JobAgreement:
    """What the ranks of a job agreed on before planning (:func:`agree`)."""

    #: Each global rank's node, numbered densely in increasing node id.
    node_of_rank: list[int]
    #: Each node's first (lowest) global rank: the rank that plans for it.
    leaders: list[int]
    #: A token every rank got from rank 0: names what this build shares.
    token: str
    #: What each node's pool holds, to keep (a resumed loader's: ``agree``'s
    #: ``warm``; one array of item ids per node), or None: a cold start.
    warm: list[np.ndarray] | None = None

    @property
    def n_nodes(self) -> int:
        return len(self.leaders)


def _digest(a: np.ndarray | None) -> str | None:
    """A short digest of an array's bytes (item sizes every rank must share)."""
    if a is None:
        return None
    import hashlib

    return hashlib.blake2b(np.ascontiguousarray(a, dtype=np.int64).tobytes(), digest_size=8).hexdigest()


def agree(sampler: Any, epochs: int, *, batch_size: int, capacity_per_node: Any = None, cache_bytes: Any = None,
          item_sizes: Any = None, item_bytes: int = 1, page_size: int | None = None, window: int | None = None,
          alone: bool | None = False, group: Any = None, check_sizes: bool = False, warm: Any = None
          ) -> JobAgreement:
    """The first half of :func:`job_plan`, a collective of every rank on
    ``group``: the ranks compare what must agree (the sampler's class, seed,
    shuffle, drop_last and replica count, the dataset's length, ``epochs``,
    ``batch_size``, the capacity, the window, ``alone``, how many item
    sizes) and
    their node ids against their machines (:func:`check_nodes`); a
    difference raises ``ValueError`` on every rank, naming the fact and each
    rank's value. ``check_sizes``: the item sizes too, by a digest (ranks
    that do not plan have no checksum of their own to compare). ``warm``:
    the item ids this rank's node's pool holds, to keep, on the rank that
    owns it (distributed/warm.py); gathered in the same collective, each
    node's from its first rank, into :attr:`JobAgreement.warm`."""
    import os
    import secrets

    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if getattr(sampler, "num_replicas", None) != world or getattr(sampler, "rank", None) != rank:
        raise InvalidInputError(
            f"job_plan needs this rank's DistributedSampler (num_replicas={world}, rank={rank}); got "
            f"{type(sampler).__name__} with num_replicas={getattr(sampler, 'num_replicas', None)!r}, "
            f"rank={getattr(sampler, 'rank', None)!r}")
    setting = os.environ.get(NODE_ENV)
    try:
        node, unreadable = node_of_this_rank(rank), None
    except InvalidInputError as exc:  # said on every rank, after the gather
        node, unreadable = -1, str(exc)
    sizes = None if item_sizes is None else np.asarray(item_sizes)
    facts = {**_sampler_facts(sampler), "epochs": epochs, "batch_size": batch_size,
             "capacity_per_node": None if capacity_per_node is None else np.asarray(capacity_per_node).tolist(),
             "cache_bytes": None if cache_bytes is None else np.asarray(cache_bytes).tolist(),
             "page_size": page_size, "item_bytes": item_bytes, "window": window, "alone": alone,
             "item_sizes": None if sizes is None else int(sizes.size)}
    if check_sizes:
        facts["item_sizes_digest"] = _digest(sizes)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, {"node": node, "setting": setting, "unreadable": unreadable,
                                      "host": this_host(), "facts": facts, "token": secrets.token_hex(6),
                                      "warm": None if warm is None else np.asarray(warm, dtype=np.int64)},
                           group=group)
    differs = _disagreement([e["facts"] for e in everyone])
    if differs is not None:
        raise ValueError(
            f"the ranks of this job disagree on {differs}: one cluster plan needs the same sampler, "
            "seed, dataset, epochs, batch size and cache on every rank (a rank started with other "
            "arguments, or another version of the data?)")
    check_numbering([e["setting"] for e in everyone], [e["unreadable"] for e in everyone])
    check_nodes([int(e["node"]) for e in everyone], [str(e["host"]) for e in everyone])
    node_ids = sorted({int(e["node"]) for e in everyone})
    node_of_rank = [node_ids.index(int(e["node"])) for e in everyone]
    leaders = [node_of_rank.index(n) for n in range(len(node_ids))]
    held = [everyone[r].get("warm") for r in leaders]
    kept = None
    if any(h is not None and len(h) for h in held):
        kept = [np.empty(0, np.int64) if h is None else np.asarray(h, dtype=np.int64) for h in held]
    return JobAgreement(node_of_rank=node_of_rank, leaders=leaders, token=str(everyone[0]["token"]), warm=kept)


def plan_agreed(sampler: Any, epochs: int, agreement: JobAgreement, *, batch_size: int,
                capacity_per_node: Any = None, cache_bytes: Any = None, item_sizes: Any = None,
                item_bytes: int = 1, page_size: int | None = None, window: int | None = None,
                alone: bool | None = False, progress: bool | None = None) -> ClusterPlan:
    """The second half of :func:`job_plan`, on one rank, without a
    collective: capture every rank's order and plan the whole cluster
    (after the agreement's warm prefix, if any)."""
    from .capture import capture_ranks

    seqs = capture_ranks(sampler, epochs, progress=progress)
    return cluster_plan(seqs, agreement.node_of_rank, capacity_per_node, cache_bytes=cache_bytes,
                        page_size=page_size, batch_size=batch_size, item_bytes=item_bytes,
                        item_sizes=None if item_sizes is None else np.asarray(item_sizes), window=window,
                        warm=agreement.warm, alone=alone, progress=progress)


def check_checksums(sums: Sequence[int | None]) -> None:
    """The plans' checksums, one per rank that planned (``None`` for a rank
    that did not): they must be equal, else ``ValueError`` naming the ranks
    of each plan. Catches what the facts cannot see (item sizes that differ
    between nodes, a sampler whose order depends on the rank's own state)."""
    planned = {r: int(s) for r, s in enumerate(sums) if s is not None}
    if len(set(planned.values())) > 1:
        groups: dict[int, list[int]] = {}
        for r, s in planned.items():
            groups.setdefault(s, []).append(r)
        said = "; ".join(f"ranks {rs} planned {s:016x}" for s, rs in groups.items())
        raise ValueError(
            f"the ranks of this job planned different clusters ({said}) from the same arguments: "
            "their orders or item sizes differ (files that differ between nodes, or a sampler whose "
            "order depends on more than its seed and epoch)")


def job_plan(sampler: Any, epochs: int, *, batch_size: int, capacity_per_node: Any = None,
             cache_bytes: Any = None, item_sizes: Any = None, item_bytes: int = 1,
             page_size: int | None = None, window: int | None = None, alone: bool | None = False,
             progress: bool | None = None, group: Any = None) -> tuple[ClusterPlan, int]:
    """The cluster plan of a job under torch.distributed, the same on every
    rank, and this rank's node (an index into the plan's nodes).

    Every rank calls it with its own ``sampler`` (a ``DistributedSampler``
    with this rank's ``rank``): each captures every rank's order (given the
    seed and the world size they are known everywhere) and plans the whole
    cluster, so no plan is sent anywhere. Before planning, the ranks compare
    what must agree (:func:`agree`): a difference raises ``ValueError`` on
    every rank, naming the fact and each rank's value. After, they compare
    the plans' checksums (:func:`check_checksums`). ``window`` and
    ``alone``: as in :func:`cluster_plan`. Node ids (:func:`node_of_this_rank`) are numbered
    densely in the plan, in increasing order. The exchanges run on ``group``
    (default: a gloo group of its own, made here: a collective, as is every
    call). ``opt4torch.DataLoader(..., cluster=True)`` plans once a node
    instead (distributed/setup.py): only each node's first rank plans.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("job_plan runs under torch.distributed (torchrun): call "
                           "torch.distributed.init_process_group first")
    if group is None:
        group = dist.new_group(backend="gloo")
    opts = dict(batch_size=batch_size, capacity_per_node=capacity_per_node, cache_bytes=cache_bytes,
                item_sizes=item_sizes, item_bytes=item_bytes, page_size=page_size, window=window, alone=alone)
    agreement = agree(sampler, epochs, group=group, **opts)
    plan = plan_agreed(sampler, epochs, agreement, progress=progress, **opts)
    sums: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(sums, plan.checksum, group=group)
    check_checksums(sums)
    return plan, agreement.node_of_rank[dist.get_rank()]
