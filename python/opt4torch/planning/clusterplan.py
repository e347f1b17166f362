"""What a cluster plan is: one OPT cache over the memory of several nodes
(:class:`ClusterPlan`, and each node's part, :class:`NodePlan`). cluster.py
makes one (:func:`~opt4torch.planning.cluster.cluster_plan`, and
``job_plan`` under torchrun), and is what ``opt4torch.cluster`` names.

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
(:meth:`ClusterPlan.node_plan`, :meth:`ClusterPlan.pool_plan`), over
timeline.py's timeline; the same plan on every rank of a torchrun job is
cluster.py's ``job_plan``. The transfers between nodes at run time are
:mod:`opt4torch.distributed.exchange`: windowed ``all_to_all`` collectives
on a gloo group of their own, run by a transfer thread on each node's first
rank, under ``opt4torch.DataLoader(..., cluster=True)`` (docs/cluster.md,
"The run time, written down before the code", says what is built).

May touch: the binding's planner (given plans); never a pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _engine
from .._engine import InvalidInputError
from .clusterfigures import NODE_KEYS, ClusterFigures
from .plan import Plan
from .timeline import Timeline

__all__ = ["LOCAL_HIT", "PEER_HIT", "ADMIT", "BYPASS", "LATE", "NODE_KEYS", "ClusterFigures", "ClusterPlan", "NodePlan",
           "WORKER", "RECEIVE", "SEND", "WARM", "FROM_POOL", "FROM_STORAGE", "FROM_PEER"]

LOCAL_HIT: int = _engine.CLUSTER_LOCAL_HIT
PEER_HIT: int = _engine.CLUSTER_PEER_HIT
ADMIT: int = _engine.CLUSTER_ADMIT
BYPASS: int = _engine.CLUSTER_BYPASS
LATE: int = _engine.CLUSTER_LATE
_NONE = _engine.CLUSTER_NONE
#: Positions a pass over a plan's kinds and nodes takes at a time
#: (:meth:`ClusterPlan.transfers_of`): its masks stay a few tens of MB at
#: ImageNet-1k, 90 epochs (115 M positions).
_CHUNK = 1 << 23

#: A node plan's roles (:meth:`ClusterPlan.node_plan`): a read by one of the
#: node's ranks, an item from a peer stored in the node's pool, a read of the
#: node's pool to send an item to a peer, and an item of a warm prefix the
#: node's pool holds from the start (a resumed run's: nobody reads it; the
#: pool is warmed with it before any worker starts).
WORKER, RECEIVE, SEND, WARM = 0, 1, 2, 3
#: Where the bytes of a node plan's ADMIT or BYPASS come from.
FROM_POOL, FROM_STORAGE, FROM_PEER = 0, 1, 2


@dataclass(frozen=True)
class NodePlan:
    """One node's part of a windowed cluster plan, as its pool will run it
    (docs/cluster.md, "The run time"): the node's own positions in order,
    a warm prefix's items it keeps first (WARM, ADMITs nobody reads: the
    pool is warmed with them), then per window first the RECEIVEs (items sent to be kept here, stored in
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



class ClusterPlan(ClusterFigures):
    """One OPT plan over several nodes: per position of the global timeline
    its kind (:data:`LOCAL_HIT`, :data:`PEER_HIT`, :data:`ADMIT`,
    :data:`BYPASS`) and its node (an ADMIT's home, the node a hit reads), per
    node its counts, and a checksum that every rank planning the same cluster
    gets. Build one with :func:`cluster_plan`."""

    __slots__ = ("plan", "timeline", "reader", "kinds", "_nodes", "_sizes", "_item_bytes", "prefix")

    def __init__(self, plan: Plan, timeline: Timeline, reader: np.ndarray, capacities: np.ndarray,
                 kinds: np.ndarray, nodes: np.ndarray, info: dict[str, int], per_node: list[dict[str, int]],
                 sizes: np.ndarray | None, item_bytes: int, page_size: int = 0, window: int | None = None,
                 prefix: int = 0) -> None:
        super().__init__(capacities, info, per_node, page_size, window)
        #: The warm prefix: the timeline's first positions, what each node
        #: holds at the start (``cluster_plan(warm=)``), not reads.
        self.prefix = int(prefix)
        #: The aggregate plan (Belady over the timeline at the total capacity).
        self.plan = plan
        self.timeline = timeline
        #: The node that reads each position.
        self.reader = reader
        #: LOCAL_HIT, PEER_HIT, ADMIT, BYPASS or LATE per position (uint8).
        self.kinds = kinds
        self._nodes = nodes
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

    def windows(self) -> npt.NDArray[np.int64]:
        """Each position's transfer window (its step // :attr:`window`)."""
        if self.window is None:
            raise InvalidInputError("this plan has no windows: plan with window= (steps a window)")
        return self.timeline.step // self.window

    def item_size(self, items: Any) -> npt.NDArray[np.int64]:
        """The bytes counted for these item ids."""
        items = np.asarray(items, dtype=np.int64)
        if self._sizes is not None:
            sizes: npt.NDArray[np.int64] = self._sizes[items].astype(np.int64)
            return sizes
        return np.full(items.shape, self._item_bytes, dtype=np.int64)

    def transfers(self) -> dict[str, np.ndarray]:
        """Every transfer between nodes, in timeline order: ``position``,
        ``step``, ``src``, ``dst``, ``item``, ``bytes`` and ``kind`` (PEER_HIT:
        the holder sends a copy to the reader; ADMIT: the reader sends what
        it read from storage to the item's home). A plan with windows adds
        ``window``, the window the transfer is sent in: the one before the
        peer hit's, the one after the ADMIT's."""
        return self._transfer_rows(self._transfer_positions(None, _CHUNK))

    def transfers_of(self, node: int, chunk: int = 0) -> dict[str, np.ndarray]:
        """Node ``node``'s rows of :meth:`transfers` (those it sends or
        receives), the same keys, in timeline order, found without making
        the whole cluster's table: one pass over the plan's kinds and nodes,
        ``chunk`` positions at a time (0: the module's), whose masks are all
        it allocates beside the node's rows."""
        node = int(node)
        if not 0 <= node < self.n_nodes:
            raise InvalidInputError(f"node {node} is outside [0, {self.n_nodes})")
        return self._transfer_rows(self._transfer_positions(node, chunk or _CHUNK))

    def transfer_windows(self, chunk: int = 0) -> npt.NDArray[np.int64]:
        """The windows in which some node sends something (sorted): the
        distinct ``window`` values of :meth:`transfers`, found without making
        its table (``chunk`` as in :meth:`transfers_of`)."""
        if self.window is None:
            raise InvalidInputError("this plan has no windows: plan with window= (steps a window)")
        chunk = chunk or _CHUNK
        win, step = int(self.window), self.timeline.step
        # A transfer goes one window before (a peer hit) or after (an admit)
        # the read's: index w + 1 holds window w.
        seen = np.zeros(self.timeline.steps // win + 3, dtype=bool)
        for a in range(0, self.kinds.size, chunk):
            peer, away = self._transfer_masks(a, a + chunk)
            w = step[a:a + chunk] // win
            seen[w[peer]] = True
            seen[w[away] + 2] = True
        return np.flatnonzero(seen).astype(np.int64) - 1

    def _transfer_masks(self, a: int, b: int) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """Positions [a, b) that are a transfer: peer hits (the holder
        sends), and admits kept away from their reader (the reader sends)."""
        kinds, raw = self.kinds[a:b], self._nodes[a:b]
        return kinds == PEER_HIT, (kinds == ADMIT) & (raw != self.reader[a:b])

    def _transfer_positions(self, node: int | None, chunk: int) -> npt.NDArray[np.int64]:
        """The timeline positions of the transfers (``node``'s only, when
        given), a chunk of positions at a time."""
        parts = []
        for a in range(0, self.kinds.size, chunk):
            peer, away = self._transfer_masks(a, a + chunk)
            mask = peer | away
            if node is not None:
                mask &= (self._nodes[a:a + chunk] == node) | (self.reader[a:a + chunk] == node)
            parts.append(np.flatnonzero(mask) + a)
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def _transfer_rows(self, pos: npt.NDArray[np.int64]) -> dict[str, np.ndarray]:
        """:meth:`transfers`' rows of these transfer positions."""
        kinds, raw, reader = self.kinds[pos], self._nodes[pos], self.reader[pos]
        is_peer = kinds == PEER_HIT
        src = np.where(is_peer, raw, reader).astype(np.int64)
        dst = np.where(is_peer, reader, raw).astype(np.int64)
        item = self.seq[pos]
        step = self.timeline.step[pos]
        out = {"position": pos, "step": step, "src": src, "dst": dst, "item": item,
               "bytes": self.item_size(item), "kind": kinds}
        if self.window is not None:
            out["window"] = step // self.window + np.where(is_peer, -1, 1)
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
        raw, kinds, step, win = self._nodes, self.kinds, self.timeline.step, int(self.window)
        mine = np.flatnonzero(self.reader == node)
        # A warm prefix's positions here: the kept ones (homed here) only;
        # one not kept is nothing to this node's pool.
        held = mine[mine < self.prefix]
        held = held[kinds[held] == ADMIT]
        mine = mine[mine >= self.prefix]
        k = kinds[mine]
        op = np.full(mine.size, bypass, dtype=np.uint8)
        op[k == LOCAL_HIT] = hit
        op[(k == ADMIT) & (raw[mine] == node)] = admit
        source = np.where(k == LOCAL_HIT, FROM_POOL, np.where(k == PEER_HIT, FROM_PEER, FROM_STORAGE))
        forward = (k == ADMIT) & (raw[mine] != node)
        # This node's rows of transfers(), found without building the whole
        # cluster's (a node's part is all a node's plan needs): what it
        # receives to keep (another node's ADMIT homed here, sent in the
        # window after the read) and what it sends (its generations' peer
        # hits, sent in the window before).
        recv = np.flatnonzero((kinds == ADMIT) & (raw == node) & (self.reader != node))
        send = np.flatnonzero((kinds == PEER_HIT) & (raw == node))
        n_r, n_s, n_w = recv.size, send.size, held.size
        window = np.concatenate([step[mine] // win, step[recv] // win + 2, step[send] // win - 1, step[held] // win])
        role = np.concatenate([np.full(mine.size, WORKER), np.full(n_r, RECEIVE), np.full(n_s, SEND),
                               np.full(n_w, WARM)])
        position = np.concatenate([mine, recv, send, held])
        # By window, then WARM, RECEIVE, SEND, WORKER, then position (lexsort's last key is its first).
        rank_of_role = np.array([3, 1, 2, 0])[role]
        order = np.lexsort((position, rank_of_role, window))
        return NodePlan(
            node=node,
            seq=self.seq[position[order]].astype(np.int64),
            op=np.concatenate([op, np.full(n_r, admit), np.full(n_s, hit), np.full(n_w, admit)]
                              ).astype(np.uint8)[order],
            role=role.astype(np.uint8)[order],
            source=np.concatenate([source, np.full(n_r, FROM_PEER), np.full(n_s + n_w, FROM_POOL)]
                                  ).astype(np.uint8)[order],
            forward=np.concatenate([forward, np.zeros(n_r + n_s + n_w, dtype=bool)])[order],
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
        tr = self.transfers_of(node)
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
