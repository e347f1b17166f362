"""Cluster plans: one OPT cache over the memory of several nodes.

Every rank's order is known in advance, so the cluster's reads form one
global timeline: at step ``s`` each rank reads its batch ``s``, rank 0's
first, then rank 1's, ... (the order ``share_across_ranks`` uses for the
ranks of one node). :func:`cluster_plan` plans Belady's OPT over that timeline
at the nodes' total capacity (which accesses hit, exactly OPT for the
aggregate cache when items are the same size), then places each admitted
generation on a node (``opt4_cluster_place`` in the C engine; the rule and
why no node ever holds more than its capacity: docs/cluster.md). Each access
is then

* ``LOCAL_HIT``: the reader's node holds the item;
* ``PEER_HIT``: another node holds it and sends a copy (the item stays);
* ``ADMIT``: read from storage by the reader and kept at its home node;
* ``BYPASS``: read from storage and not kept;
* ``LATE`` (with ``window=``, see :func:`cluster_plan`): a read of a
  generation another node holds, or its home receives, that cannot arrive in
  time at run time, where nodes exchange items a window ahead: read from
  storage and not kept.

This module is the planning side, down to each node's own plan
(:meth:`ClusterPlan.node_plan`, :meth:`ClusterPlan.pool_plan`) and
:func:`job_plan` under torchrun. The transfers between nodes at run time
are :mod:`opt4torch.distributed.exchange`: windowed ``all_to_all`` collectives on a
gloo group of their own, run by a transfer thread on each node's first
rank, under ``opt4torch.DataLoader(..., cluster=True)`` (docs/cluster.md,
"The run time, written down before the code", says what is built).

May touch: the binding's planners (cluster_place, given plans),
torch.distributed in job_plan (collectives on the group it is given); never
a pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _engine
from .._engine import InvalidInputError
from .plan import Plan, as_sequence, choose_page
from .plan import plan as build_plan

__all__ = ["LOCAL_HIT", "PEER_HIT", "ADMIT", "BYPASS", "LATE", "NODE_ENV", "NODE_KEYS", "ClusterPlan", "NodePlan",
           "Timeline", "WORKER", "RECEIVE", "SEND", "FROM_POOL", "FROM_STORAGE", "FROM_PEER",
           "check_nodes", "cluster_plan", "global_timeline", "interleave", "job_plan", "node_of_this_rank", "this_host"]

LOCAL_HIT: int = _engine.CLUSTER_LOCAL_HIT
PEER_HIT: int = _engine.CLUSTER_PEER_HIT
ADMIT: int = _engine.CLUSTER_ADMIT
BYPASS: int = _engine.CLUSTER_BYPASS
LATE: int = _engine.CLUSTER_LATE
_NONE = _engine.CLUSTER_NONE

#: The per-node counts :meth:`ClusterPlan.node_stats` gives. ``local_hits``,
#: ``peer_hits``, ``peer_bytes_sent``, ``peer_bytes_received`` and
#: ``plan_storage_bytes`` are also keys of the DataLoader's ``stats()`` with
#: ``cluster=True`` (there the first four are measured).
NODE_KEYS: tuple[str, ...] = (
    "capacity", "accesses", "local_hits", "peer_hits", "storage_reads", "admits", "bypasses",
    "plan_storage_bytes", "homed", "peer_items_sent", "peer_items_received", "peer_bytes_sent",
    "peer_bytes_received", "peak_resident", "late",
)


@dataclass(frozen=True)
class Timeline:
    """The global timeline: per position, the item, the rank that reads it
    and the step (global over epochs)."""

    seq: npt.NDArray[np.int64]
    rank: npt.NDArray[np.int32]
    step: npt.NDArray[np.int64]

    @property
    def steps(self) -> int:
        return int(self.step[-1]) + 1 if self.step.size else 0


#: A node plan's roles (:meth:`ClusterPlan.node_plan`): a read by one of the
#: node's ranks, an item from a peer stored in the node's pool, a read of the
#: node's pool to send an item to a peer.
WORKER, RECEIVE, SEND = 0, 1, 2
#: Where the bytes of a node plan's ADMIT or BYPASS come from.
FROM_POOL, FROM_STORAGE, FROM_PEER = 0, 1, 2


@dataclass(frozen=True)
class NodePlan:
    """One node's part of a windowed cluster plan, as its pool will run it
    (docs/cluster.md, "The run time"): the node's own positions in order,
    per window first the RECEIVEs (items sent to be kept here, stored in
    the pool), then the SENDs (this node's pool read for a peer), then the
    reads of the node's ranks (WORKER), in timeline order.

    Per position: ``seq`` the item, ``op`` the pool's decision
    (:data:`opt4torch.HIT`, ``ADMIT``, ``BYPASS``), ``role``, ``source`` (a
    HIT's bytes are the pool's; an ADMIT's or BYPASS's come from storage or
    from a peer), ``forward`` (a WORKER read whose bytes this node sends to
    the item's home, in the next window), ``window`` and ``position``: the
    global timeline position it serves (the read itself; a RECEIVE's ADMIT
    at its reader; a SEND's peer hit).
    """

    node: int
    seq: npt.NDArray[np.int64]
    op: npt.NDArray[np.uint8]
    role: npt.NDArray[np.uint8]
    source: npt.NDArray[np.uint8]
    forward: npt.NDArray[np.bool_]
    window: npt.NDArray[np.int64]
    position: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.seq.size)

    @property
    def reads(self) -> npt.NDArray[np.int64]:
        """The node plan's positions of its ranks' reads, in timeline order."""
        return np.flatnonzero(self.role == WORKER)


def _epochs_of(obj: Any, r: int) -> list[np.ndarray]:
    """A rank's order: one 1-D array (one epoch), or a list of them."""
    if isinstance(obj, (list, tuple)) and obj and all(np.ndim(e) == 1 and not isinstance(e, (int, np.integer))
                                                       for e in obj):
        parts = [np.asarray(e) for e in obj]
    elif isinstance(obj, np.ndarray) and obj.ndim == 2:
        parts = list(obj)
    else:
        parts = [np.asarray(obj)]
    out = []
    for e, a in enumerate(parts):
        if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
            raise InvalidInputError(f"rank {r}, epoch {e}: a rank's order must be 1-D integer ids "
                                    f"(got shape {a.shape}, dtype {a.dtype})")
        out.append(a.astype(np.int64, copy=False))
    return out


def interleave(orders: Sequence[Sequence[Any]], lengths: Sequence[Sequence[Any]]
               ) -> tuple[Timeline, list[list[npt.NDArray[np.int64]]], list[int]]:
    """The global timeline of data-parallel training, from every rank's
    batches: epoch by epoch, step by step, rank 0's batch, then rank 1's, ...
    ``orders[r][e]`` is rank r's order in epoch e and ``lengths[r][e]`` its
    batch lengths (summing to that order's length); a rank with fewer batches
    in an epoch has none at the later steps.

    Returns the timeline, each rank's batch starts per epoch (positions in
    the timeline), and each epoch's first position. The one place this order
    is made: :func:`global_timeline` and the DataLoader's
    ``share_across_ranks`` both use it.
    """
    world = len(orders)
    n_epochs = max((len(o) for o in orders), default=0)
    seq_parts, rank_parts, step_parts = [], [], []
    starts: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(world)]
    floors: list[int] = []
    pos = step0 = 0
    for e in range(n_epochs):
        floors.append(pos)
        arrays, batch_lens = [], []
        for r in range(world):
            a = np.asarray(orders[r][e] if e < len(orders[r]) else np.empty(0), dtype=np.int64)
            lens = np.asarray(lengths[r][e] if e < len(lengths[r]) else np.empty(0), dtype=np.int64)
            if int(lens.sum()) != a.size or (lens < 0).any():
                raise InvalidInputError(f"rank {r}, epoch {e}: batch lengths {lens.tolist()[:8]} do not "
                                        f"add up to its {a.size} samples")
            arrays.append(a)
            batch_lens.append(lens)
        # Batches in timeline order: by step, then rank. Each batch's first
        # position follows from the lengths of the batches before it (an
        # empty batch starts where the next one does).
        keys = np.concatenate([np.arange(l.size, dtype=np.int64) * world + r for r, l in enumerate(batch_lens)])
        lens_all = np.concatenate(batch_lens) if batch_lens else np.empty(0, dtype=np.int64)
        order_b = np.argsort(keys, kind="stable")
        begin = np.empty(keys.size, dtype=np.int64)
        begin[order_b] = np.cumsum(lens_all[order_b]) - lens_all[order_b]
        k = 0
        for r in range(world):
            starts[r].append(pos + begin[k:k + batch_lens[r].size])
            k += batch_lens[r].size
        idx = np.concatenate(arrays)
        if idx.size == 0:
            continue
        rank = np.repeat(np.arange(world, dtype=np.int32), [a.size for a in arrays])
        step = np.concatenate([np.repeat(np.arange(l.size, dtype=np.int64), l) for l in batch_lens])
        order = np.argsort(step * world + rank, kind="stable")
        seq_parts.append(idx[order])
        rank_parts.append(rank[order])
        step_parts.append(step[order] + step0)
        pos += idx.size
        step0 += int(step.max()) + 1
    if not seq_parts:
        raise InvalidInputError("every rank's order is empty: nothing to plan")
    timeline = Timeline(np.concatenate(seq_parts), np.concatenate(rank_parts), np.concatenate(step_parts))
    return timeline, starts, floors


def global_timeline(seqs_by_rank: Sequence[Any], batch_size: int = 1) -> Timeline:
    """Interleave every rank's order as data-parallel training reads it:
    epoch by epoch, step by step, rank 0's batch, then rank 1's, ...

    ``seqs_by_rank[r]`` is rank r's order: one array, or a list of arrays,
    one per epoch (batches restart at each epoch, as a DataLoader's do). A
    rank with fewer batches in an epoch simply has none at the later steps.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InvalidInputError(f"batch_size must be a positive integer, got {batch_size!r}")
    if len(seqs_by_rank) == 0:
        raise InvalidInputError("seqs_by_rank is empty: give one order per rank")
    orders = [_epochs_of(s, r) for r, s in enumerate(seqs_by_rank)]
    lengths = [[np.minimum(batch_size, a.size - np.arange(0, a.size, batch_size)) for a in rank]
               for rank in orders]
    return interleave(orders, lengths)[0]


class ClusterPlan:
    """One OPT plan over several nodes: per position of the global timeline
    its kind (:data:`LOCAL_HIT`, :data:`PEER_HIT`, :data:`ADMIT`,
    :data:`BYPASS`) and its node (an ADMIT's home, the node a hit reads), per
    node its counts, and a checksum that every rank planning the same cluster
    gets. Build one with :func:`cluster_plan`."""

    __slots__ = ("plan", "timeline", "reader", "capacities", "kinds", "page_size", "window", "_nodes", "_info",
                 "_per_node", "_sizes", "_item_bytes")

    def __init__(self, plan: Plan, timeline: Timeline, reader: np.ndarray, capacities: np.ndarray,
                 kinds: np.ndarray, nodes: np.ndarray, info: dict[str, int], per_node: list[dict[str, int]],
                 sizes: np.ndarray | None, item_bytes: int, page_size: int = 0, window: int | None = None) -> None:
        #: The aggregate plan (Belady over the timeline at the total capacity).
        self.plan = plan
        self.timeline = timeline
        #: The node that reads each position.
        self.reader = reader
        #: What each node holds: items, or pages of ``page_size`` bytes
        #: for a plan in bytes.
        self.capacities = capacities
        #: 0 for a plan in items.
        self.page_size = page_size
        #: Steps a transfer window (``None``: transfers assumed in time).
        self.window = window
        #: LOCAL_HIT, PEER_HIT, ADMIT, BYPASS or LATE per position (uint8).
        self.kinds = kinds
        self._nodes = nodes
        self._info = info
        self._per_node = per_node
        self._sizes = sizes
        self._item_bytes = item_bytes

    @property
    def seq(self) -> npt.NDArray[np.int64]:
        return self.timeline.seq

    @property
    def nodes(self) -> npt.NDArray[np.int64]:
        """Per position: an ADMIT's home, the node a hit reads (for a LATE
        read, the node that holds it), -1 for a BYPASS."""
        out = self._nodes.astype(np.int64)
        out[self._nodes == _NONE] = -1
        return out

    @property
    def sized(self) -> bool:
        """Whether capacities are in bytes (pages) rather than items."""
        return self.page_size > 0

    @property
    def unplaced(self) -> int:
        """Plans in bytes: generations no node had enough free pages for
        (read from storage at each of their accesses instead)."""
        return int(self._info["unplaced"])

    @property
    def unplaced_hits(self) -> int:
        """The aggregate plan's hits lost to :attr:`unplaced` generations."""
        return int(self._info["unplaced_hits"])

    @property
    def late(self) -> int:
        """With windows: the aggregate plan's hits that cannot arrive in
        time, read from storage instead (:data:`LATE`)."""
        return int(self._info["late"])

    def windows(self) -> npt.NDArray[np.int64]:
        """Each position's transfer window (its step // :attr:`window`)."""
        if self.window is None:
            raise InvalidInputError("this plan has no windows: plan with window= (steps a window)")
        return self.timeline.step // self.window

    @property
    def n_nodes(self) -> int:
        return int(self.capacities.size)

    @property
    def accesses(self) -> int:
        return int(self._info["accesses"])

    def __len__(self) -> int:
        return self.accesses

    @property
    def hits(self) -> int:
        """Local and peer hits: the aggregate plan's hits."""
        return int(self._info["hits"])

    @property
    def local_hits(self) -> int:
        return int(self._info["local_hits"])

    @property
    def peer_hits(self) -> int:
        return int(self._info["peer_hits"])

    @property
    def admits(self) -> int:
        return int(self._info["admits"])

    @property
    def bypasses(self) -> int:
        return int(self._info["bypasses"])

    @property
    def storage_reads(self) -> int:
        """Admits and bypasses (LATE reads included)."""
        return self.admits + self.bypasses

    @property
    def remote_admits(self) -> int:
        """Admits kept at a node other than the one that read them (one
        transfer each)."""
        return int(self._info["remote_admits"])

    @property
    def storage_bytes(self) -> int:
        return int(self._info["storage_bytes"])

    @property
    def peer_bytes(self) -> int:
        """Every transfer between nodes, counted once (peer hits and admits
        kept away from their reader)."""
        return int(self._info["peer_bytes"])

    @property
    def checksum(self) -> int:
        """XXH3-64 of the plan's fingerprint, the capacities and every
        position's reader, kind and node."""
        return int(self._info["checksum"])

    def item_size(self, items: Any) -> npt.NDArray[np.int64]:
        """The bytes counted for these item ids."""
        items = np.asarray(items, dtype=np.int64)
        if self._sizes is not None:
            sizes: npt.NDArray[np.int64] = self._sizes[items].astype(np.int64)
            return sizes
        return np.full(items.shape, self._item_bytes, dtype=np.int64)

    def node_stats(self) -> list[dict[str, int]]:
        """Per node, the counts of :data:`NODE_KEYS`."""
        out = []
        for n, d in enumerate(self._per_node):
            out.append({
                "capacity": int(self.capacities[n]),
                "accesses": d["accesses"],
                "local_hits": d["local_hits"],
                "peer_hits": d["peer_hits"],
                "storage_reads": d["admits"] + d["bypasses"],
                "admits": d["admits"],
                "bypasses": d["bypasses"],
                "plan_storage_bytes": d["storage_bytes"],
                "homed": d["homed"],
                "peer_items_sent": d["peer_items_sent"],
                "peer_items_received": d["peer_items_received"],
                "peer_bytes_sent": d["peer_bytes_sent"],
                "peer_bytes_received": d["peer_bytes_received"],
                "peak_resident": d["peak_resident"],
                "late": d["late"],
            })
        return out

    def transfers(self) -> dict[str, np.ndarray]:
        """Every transfer between nodes, in timeline order: ``position``,
        ``step``, ``src``, ``dst``, ``item``, ``bytes`` and ``kind`` (PEER_HIT:
        the holder sends a copy to the reader; ADMIT: the reader sends what
        it read from storage to the item's home). A plan with windows adds
        ``window``, the window the transfer is sent in: the one before the
        peer hit's, the one after the ADMIT's."""
        kinds, raw, reader = self.kinds, self._nodes, self.reader
        peer = kinds == PEER_HIT
        away = (kinds == ADMIT) & (raw != reader)
        pos = np.flatnonzero(peer | away)
        is_peer = peer[pos]
        src = np.where(is_peer, raw[pos], reader[pos]).astype(np.int64)
        dst = np.where(is_peer, reader[pos], raw[pos]).astype(np.int64)
        item = self.seq[pos]
        out = {"position": pos, "step": self.timeline.step[pos], "src": src, "dst": dst, "item": item,
               "bytes": self.item_size(item), "kind": kinds[pos]}
        if self.window is not None:
            out["window"] = self.windows()[pos] + np.where(is_peer, -1, 1)
        return out

    def node_plan(self, node: int) -> NodePlan:
        """Node ``node``'s plan for its pool (:class:`NodePlan`), from a plan
        with windows. Every generation the node keeps lives in its pool from
        its ADMIT (a read from storage here, or a RECEIVE) to its last read
        here (its ranks' or a SEND), which is inside the span the cluster
        plan charges to the node, so the pool never holds more than the
        node's capacity."""
        if self.window is None:
            raise InvalidInputError("a node plan needs a plan with windows: plan with window= (steps a window)")
        node = int(node)
        if not 0 <= node < self.n_nodes:
            raise InvalidInputError(f"node {node} is outside [0, {self.n_nodes})")
        hit, admit, bypass = _engine.OP_HIT, _engine.OP_ADMIT, _engine.OP_BYPASS
        w = self.windows()
        raw = self._nodes
        mine = np.flatnonzero(self.reader == node)
        k = self.kinds[mine]
        op = np.full(mine.size, bypass, dtype=np.uint8)
        op[k == LOCAL_HIT] = hit
        op[(k == ADMIT) & (raw[mine] == node)] = admit
        source = np.where(k == LOCAL_HIT, FROM_POOL, np.where(k == PEER_HIT, FROM_PEER, FROM_STORAGE))
        forward = (k == ADMIT) & (raw[mine] != node)
        tr = self.transfers()
        recv = np.flatnonzero((tr["kind"] == ADMIT) & (tr["dst"] == node))
        send = np.flatnonzero((tr["kind"] == PEER_HIT) & (tr["src"] == node))
        n_r, n_s = recv.size, send.size
        window = np.concatenate([w[mine], tr["window"][recv] + 1, tr["window"][send]])
        role = np.concatenate([np.full(mine.size, WORKER), np.full(n_r, RECEIVE), np.full(n_s, SEND)])
        position = np.concatenate([mine, tr["position"][recv], tr["position"][send]])
        # By window, then RECEIVE, SEND, WORKER, then position (lexsort's last key is its first).
        order = np.lexsort((position, np.where(role == WORKER, 2, role - 1), window))
        return NodePlan(
            node=node,
            seq=self.seq[position[order]].astype(np.int64),
            op=np.concatenate([op, np.full(n_r, admit), np.full(n_s, hit)]).astype(np.uint8)[order],
            role=role.astype(np.uint8)[order],
            source=np.concatenate([source, np.full(n_r, FROM_PEER), np.full(n_s, FROM_POOL)]).astype(np.uint8)[order],
            forward=np.concatenate([forward, np.zeros(n_r + n_s, dtype=bool)])[order],
            window=window.astype(np.int64)[order],
            position=position.astype(np.int64)[order],
        )

    def pool_plan(self, node: int, node_plan: NodePlan | None = None) -> Plan:
        """The engine plan of ``node``'s pool: its :meth:`node_plan`'s
        decisions, given (``opt4_plan_from_kinds``), at the node's capacity
        (its pages of :attr:`page_size` bytes, for a plan in bytes). The
        engine hands out the slots or pages and checks that the node plan
        fits its capacity, as a pool needs. A node that holds nothing gets
        one place, which it never uses."""
        np_ = self.node_plan(node) if node_plan is None else node_plan
        seq = np.ascontiguousarray(np_.seq, dtype=np.uint32)
        items = self.plan.items
        kinds = np.ascontiguousarray(np_.op, dtype=np.uint8)
        cap = max(int(self.capacities[np_.node]), 1)
        if self.sized:
            assert self._sizes is not None
            sizes = np.ascontiguousarray(self._sizes, dtype=np.uint64)
            handle = _engine.build_plan(seq, items, 0, item_sizes=sizes, capacity_bytes=cap * self.page_size,
                                        page_size=self.page_size, kinds=kinds)
        else:
            handle = _engine.build_plan(seq, items, cap, kinds=kinds)
        return Plan(handle)

    def for_node(self, node: int) -> dict[str, Any]:
        """The part of the plan that concerns one node: the positions it
        reads with their kinds and nodes (``reads``), what it sends and what
        it receives (``sends``, ``receives``: :meth:`transfers` rows), the
        positions whose generation it keeps (``homes``), and its counts."""
        node = int(node)
        if not 0 <= node < self.n_nodes:
            raise InvalidInputError(f"node {node} is outside [0, {self.n_nodes})")
        mine = np.flatnonzero(self.reader == node)
        tr = self.transfers()
        sends, receives = tr["src"] == node, tr["dst"] == node
        return {
            "node": node,
            "reads": {"position": mine, "item": self.seq[mine], "kind": self.kinds[mine],
                      "node": self.nodes[mine]},
            "homes": np.flatnonzero((self.kinds == ADMIT) & (self._nodes == node)),
            "sends": {k: v[sends] for k, v in tr.items()},
            "receives": {k: v[receives] for k, v in tr.items()},
            "stats": self.node_stats()[node],
        }

    def stats(self) -> dict[str, Any]:
        """Totals and per-node counts as plain JSON-ready values."""
        T = self.accesses
        return {
            "accesses": T,
            "nodes": self.n_nodes,
            "capacity": int(self._info["capacity"]),
            "hits": self.hits,
            "local_hits": self.local_hits,
            "peer_hits": self.peer_hits,
            "admits": self.admits,
            "bypasses": self.bypasses,
            "remote_admits": self.remote_admits,
            "page_size": self.page_size,
            "unplaced": self.unplaced,
            "unplaced_hits": self.unplaced_hits,
            "window": self.window,
            "late": self.late,
            "hit_rate": self.hits / T if T else 0.0,
            "local_hit_rate": self.local_hits / T if T else 0.0,
            "peer_hit_rate": self.peer_hits / T if T else 0.0,
            "storage_bytes": self.storage_bytes,
            "peer_bytes": self.peer_bytes,
            "checksum": f"{self.checksum:016x}",
            "per_node": self.node_stats(),
        }

    def __repr__(self) -> str:
        T = max(self.accesses, 1)
        return (f"<ClusterPlan {self.accesses} accesses over {self.n_nodes} nodes, capacity "
                f"{int(self._info['capacity'])}: local {self.local_hits / T:.4f}, peer {self.peer_hits / T:.4f}, "
                f"storage {self.storage_reads / T:.4f}>")


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


def cluster_plan(seqs_by_rank: Sequence[Any], node_of_rank: Sequence[int] | None, capacity_per_node: Any = None,
                 *, cache_bytes: Any = None, page_size: int | None = None, items: int | None = None,
                 batch_size: int = 1, item_bytes: int = 1, item_sizes: Any = None,
                 window: int | None = None, progress: bool | None = None) -> ClusterPlan:
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
    sizes, :func:`opt4torch.planning.plan.choose_page`), the aggregate plan size-aware Belady (a heuristic with unequal
    sizes), and a generation needs its pages on one node; one that finds no
    such node is read from storage instead (:attr:`ClusterPlan.unplaced`).

    ``window`` (steps): plan for the run time's transfers, which go a
    window ahead. In window k each node sends each other node what it reads
    from it in window k + 1, and only what it holds when window k starts.
    A generation kept by the node that read it from storage serves its
    peers from two windows after its ADMIT's; one kept elsewhere reaches
    its home then, and its peers a window later. Earlier reads are
    :data:`LATE` (from storage, counted in ``plan_storage_bytes``), and a
    generation goes to its next reader's node only when it can get there in
    time (docs/cluster.md). ``None``: transfers are assumed always in time.
    """
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, np.integer))
                               or window < 1):
        raise InvalidInputError(f"window must be a positive number of steps, or None, got {window!r}")
    timeline = global_timeline(seqs_by_rank, batch_size)
    world = len(seqs_by_rank)
    if node_of_rank is None:
        node_of = np.arange(world, dtype=np.int64)
    else:
        node_of = np.asarray(node_of_rank)
        if node_of.shape != (world,) or (node_of.size and not np.issubdtype(node_of.dtype, np.integer)):
            raise InvalidInputError(f"node_of_rank needs one integer node per rank ({world}), got {node_of_rank!r}")
        if (node_of < 0).any():
            raise InvalidInputError(f"node ids cannot be negative: {node_of.tolist()}")
    if (capacity_per_node is None) == (cache_bytes is None):
        raise InvalidInputError("give the capacity a node as capacity_per_node= (items) or cache_bytes= "
                                "(bytes, with item_sizes), not both and not neither")
    given = capacity_per_node if cache_bytes is None else cache_bytes
    what = "capacity_per_node" if cache_bytes is None else "cache_bytes"
    if isinstance(given, (int, np.integer)) and not isinstance(given, bool):
        n_nodes = int(node_of.max()) + 1
    else:
        try:
            n_nodes = len(given)
        except TypeError:
            raise InvalidInputError(f"{what} must be a number, or one per node, got {given!r}") from None
        if int(node_of.max()) >= n_nodes:
            raise InvalidInputError(f"rank {int(np.argmax(node_of >= n_nodes))} is on node "
                                    f"{int(node_of.max())}, but {what} names {n_nodes} nodes")
    seq, items = as_sequence(timeline.seq, items)
    sizes = None
    if item_sizes is not None:
        sizes = np.ascontiguousarray(item_sizes, dtype=np.uint64)
        if sizes.shape != (items,):
            raise InvalidInputError(f"item_sizes has {sizes.size} entries; the dataset has {items} items")
    if isinstance(item_bytes, bool) or not isinstance(item_bytes, (int, np.integer)) or item_bytes < 0:
        raise InvalidInputError(f"item_bytes must be a non-negative integer, got {item_bytes!r}")
    page = 0
    if cache_bytes is None:
        caps = _capacities(capacity_per_node, n_nodes)
        aggregate = build_plan(seq, int(caps.sum()), items=items, progress=progress)
    else:
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
                                           window_of)
    return ClusterPlan(aggregate, timeline, reader, caps.astype(np.int64), kinds, nodes, info, per_node,
                       None if sizes is None else sizes.astype(np.int64), int(item_bytes), page,
                       None if window is None else int(window))


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


def job_plan(sampler: Any, epochs: int, *, batch_size: int, capacity_per_node: Any = None,
             cache_bytes: Any = None, item_sizes: Any = None, item_bytes: int = 1,
             page_size: int | None = None, window: int | None = None, progress: bool | None = None,
             group: Any = None) -> tuple[ClusterPlan, int]:
    """The cluster plan of a job under torch.distributed, the same on every
    rank, and this rank's node (an index into the plan's nodes).

    Every rank calls it with its own ``sampler`` (a ``DistributedSampler``
    with this rank's ``rank``): each captures every rank's order (given the
    seed and the world size they are known everywhere) and plans the whole
    cluster, so no plan is sent anywhere. Before planning, the ranks compare
    what must agree (the sampler's class, seed, shuffle, drop_last and
    replica count, the dataset's length, ``epochs``, ``batch_size``, the
    capacity, the window, how many item sizes): a difference raises ``ValueError`` on
    every rank, naming the fact and each rank's value. After, they compare
    the plans' checksums, which catches what the facts cannot see (item sizes
    that differ between nodes, a sampler whose order depends on the rank's
    own state). ``window``: as in :func:`cluster_plan`. Node ids (:func:`node_of_this_rank`) are numbered densely in
    the plan, in increasing order. The exchanges run on ``group`` (default: a
    gloo group of its own, made here: a collective, as is every call).
    """
    import torch.distributed as dist

    from .capture import capture_ranks

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("job_plan runs under torch.distributed (torchrun): call "
                           "torch.distributed.init_process_group first")
    rank, world = dist.get_rank(), dist.get_world_size()
    if getattr(sampler, "num_replicas", None) != world or getattr(sampler, "rank", None) != rank:
        raise InvalidInputError(
            f"job_plan needs this rank's DistributedSampler (num_replicas={world}, rank={rank}); got "
            f"{type(sampler).__name__} with num_replicas={getattr(sampler, 'num_replicas', None)!r}, "
            f"rank={getattr(sampler, 'rank', None)!r}")
    if group is None:
        group = dist.new_group(backend="gloo")
    node = node_of_this_rank(rank)
    sizes = None if item_sizes is None else np.asarray(item_sizes)
    facts = {**_sampler_facts(sampler), "epochs": epochs, "batch_size": batch_size,
             "capacity_per_node": None if capacity_per_node is None else np.asarray(capacity_per_node).tolist(),
             "cache_bytes": None if cache_bytes is None else np.asarray(cache_bytes).tolist(),
             "page_size": page_size, "item_bytes": item_bytes, "window": window,
             "item_sizes": None if sizes is None else int(sizes.size)}
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, {"node": node, "host": this_host(), "facts": facts}, group=group)
    differs = _disagreement([e["facts"] for e in everyone])
    if differs is not None:
        raise ValueError(
            f"the ranks of this job disagree on {differs}: one cluster plan needs the same sampler, "
            "seed, dataset, epochs, batch size and cache on every rank (a rank started with other "
            "arguments, or another version of the data?)")
    check_nodes([int(e["node"]) for e in everyone], [str(e["host"]) for e in everyone])
    node_ids = sorted({int(e["node"]) for e in everyone})
    node_of_rank = [node_ids.index(int(e["node"])) for e in everyone]
    seqs = capture_ranks(sampler, epochs, progress=progress)
    plan = cluster_plan(seqs, node_of_rank, capacity_per_node, cache_bytes=cache_bytes, page_size=page_size,
                        batch_size=batch_size, item_bytes=item_bytes, item_sizes=sizes, window=window,
                        progress=progress)
    sums: list[Any] = [None] * world
    dist.all_gather_object(sums, plan.checksum, group=group)
    if any(s != sums[0] for s in sums):
        groups: dict[int, list[int]] = {}
        for r, s in enumerate(sums):
            groups.setdefault(int(s), []).append(r)
        said = "; ".join(f"ranks {rs} planned {s:016x}" for s, rs in groups.items())
        raise ValueError(
            f"the ranks of this job planned different clusters ({said}) from the same arguments: "
            "their orders or item sizes differ (files that differ between nodes, or a sampler whose "
            "order depends on more than its seed and epoch)")
    return plan, node_of_rank[rank]
