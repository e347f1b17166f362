"""The transfers between nodes at run time (issue 18; docs/cluster.md, "The
run time"): at the start of window k a node sends each other node what the
plan says it sends in window k, in one ``all_to_all`` on a gloo group of the
project's own. Nothing is asked for: both sides know from the plan which
transfers a window holds, and in which order (timeline order), so only the
lengths of the encoded items travel beside them.

What a node sends in window k: copies of generations its pool holds, for
peers that read them in window k + 1 (read from its pool at its SEND
positions), and the items its ranks read from storage in window k - 1 for
another node to keep (forwards, kept meanwhile in :attr:`Exchange.outbox`).
What it receives is kept by the position of its node plan that uses it (a
WORKER's peer read in window k + 1, or a RECEIVE at the start of window
k + 1) until :meth:`Exchange.take` hands it over.

A collective that fails (a peer died, the group's timeout passed) loses
that window's items: :meth:`take` then returns nothing and the reader loads
from storage instead, which costs speed, never a wrong sample. The error is
kept (:attr:`Exchange.errors`) and the next window tries again.

One rank per node for now: the group's rank r is node r.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._codec import decode, encode
from .cluster import ADMIT, PEER_HIT, RECEIVE, SEND, WORKER, ClusterPlan, NodePlan

__all__ = ["Exchange"]


def _payload(obj: Any) -> bytes:
    return b"".join(bytes(memoryview(p).cast("B")) for p in encode(obj))


class Exchange:
    """One node's side of the windowed transfers of a cluster plan."""

    def __init__(self, cp: ClusterPlan, node_plan: NodePlan, group: Any = None) -> None:
        import torch.distributed as dist

        self.cp, self.plan, self.node = cp, node_plan, node_plan.node
        self.group = group
        self.world = dist.get_world_size(group)
        if self.world != cp.n_nodes or dist.get_rank(group) != self.node:
            raise ValueError(f"one rank a node: this group has {self.world} ranks for {cp.n_nodes} nodes, and "
                             f"this is rank {dist.get_rank(group)} for node {self.node}")
        tr = cp.transfers()
        order = np.lexsort((tr["position"], tr["window"]))
        win, pos, src, dst, kind = (tr[k][order] for k in ("window", "position", "src", "dst", "kind"))
        #: Windows with a transfer anywhere in the cluster: every rank runs
        #: a collective in those, and only those.
        self.windows = np.unique(win).tolist()
        self._out: dict[int, list[tuple[int, int, int]]] = {}  # window: (dst, position, kind)
        self._in: dict[int, list[tuple[int, int, int]]] = {}  # window: (src, position, node-plan index)
        # Where in this node's plan each received item goes.
        p = node_plan
        where = {(int(r), int(t)): i for i, (r, t) in enumerate(zip(p.role, p.position)) if r != WORKER}
        reads = {int(t): i for i, t in zip(p.reads.tolist(), p.position[p.reads].tolist())}
        for k, t, s, d, kd in zip(win.tolist(), pos.tolist(), src.tolist(), dst.tolist(), kind.tolist()):
            if s == self.node:
                self._out.setdefault(k, []).append((d, t, kd))
            if d == self.node:
                at = reads[t] if kd == PEER_HIT else where[(RECEIVE, t)]
                self._in.setdefault(k, []).append((s, t, at))
        for got in self._in.values():  # the bytes arrive grouped by sender
            got.sort()
        self._send_at = {t: i for (r, t), i in where.items() if r == SEND}
        self._windows = set(self.windows)
        #: Forwards read by this node's ranks, by timeline position, until sent.
        self.outbox: dict[int, Any] = {}
        self.inbox: dict[int, Any] = {}
        self.errors: list[tuple[int, BaseException]] = []
        self.bytes_sent = self.bytes_received = self.items_sent = self.items_received = 0

    def keep_forward(self, node_index: int, obj: Any) -> None:
        """A rank read the item at this node-plan position from storage for
        another node to keep: hold it until the window that sends it."""
        if self.plan.forward[node_index]:
            self.outbox[int(self.plan.position[node_index])] = obj

    def run(self, k: int, read_pool: Callable[[int], Any]) -> None:
        """Window k's exchange, a collective of every rank: ``read_pool(i)``
        reads this node's pool at node-plan position i (its SENDs)."""
        import torch
        import torch.distributed as dist

        if k not in self._windows:
            return
        parts: list[list[bytes]] = [[] for _ in range(self.world)]
        for d, t, kd in self._out.get(k, []):
            obj = read_pool(self._send_at[t]) if kd == PEER_HIT else self.outbox.pop(t)
            assert kd in (PEER_HIT, ADMIT)
            parts[d].append(_payload(obj))
        lengths = [np.array([len(b) for b in bs], dtype=np.int64) for bs in parts]
        expect = [0] * self.world
        for s, _, _ in self._in.get(k, []):
            expect[s] += 1
        try:
            # First each item's length, then the bytes; the counts are the plan's.
            sizes = torch.from_numpy(np.concatenate(lengths)) if any(x.size for x in lengths) else \
                torch.empty(0, dtype=torch.int64)
            got_sizes = torch.empty(sum(expect), dtype=torch.int64)
            dist.all_to_all_single(got_sizes, sizes, output_split_sizes=expect,
                                   input_split_sizes=[x.size for x in lengths], group=self.group)
            blob = b"".join(b for bs in parts for b in bs)
            send = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)
            per_src = np.split(got_sizes.numpy(), np.cumsum(expect)[:-1])
            recv = torch.empty(int(got_sizes.sum()), dtype=torch.uint8)
            dist.all_to_all_single(recv, send, output_split_sizes=[int(x.sum()) for x in per_src],
                                   input_split_sizes=[int(x.sum()) for x in lengths], group=self.group)
        except (RuntimeError, ValueError) as e:  # a dead peer, a timeout: this window's items are lost
            self.errors.append((k, e))
            return
        self.items_sent += sum(x.size for x in lengths)
        self.bytes_sent += len(blob)
        data = recv.numpy().tobytes()
        offsets = np.concatenate([[0], np.cumsum(got_sizes.numpy())])
        for j, (_, _, at) in enumerate(self._in.get(k, [])):
            self.inbox[at] = decode(memoryview(data)[offsets[j]:offsets[j + 1]])
        self.items_received += len(self._in.get(k, []))
        self.bytes_received += len(data)

    def take(self, node_index: int) -> tuple[bool, Any]:
        """The item received for this node-plan position: (True, it), or
        (False, None) when its window's collective failed."""
        if node_index in self.inbox:
            return True, self.inbox.pop(node_index)
        return False, None
