"""The transfers between nodes, one window's collective (issue 18;
docs/cluster.md, "The run time"): at the start of window k a node sends each
other node what the plan says it sends in window k, in one ``all_to_all`` on
a gloo group of the project's own. Nothing is asked for: both sides know
from the plan which transfers a window holds, and in which order (timeline
order), so only the lengths of the encoded items travel beside them. When
the plan has the items' sizes, each item has a room of its planned bytes
(the pool's bound on its record), so the receiver knows every pair's bytes
beforehand and a window is one collective; without them, a collective of
the lengths comes first.

What a node sends in window k: copies of generations its pool holds, for
peers that read them in window k + 1 (read from its pool at its SEND
positions), and the items read from storage in window k - 1 for another
node to keep (forwards, kept meanwhile in :attr:`Exchange.outbox`). Items
travel as their cached records (the codec's bytes, as the pool stores
them). What a node receives is kept by the position of its node plan that
uses it (a WORKER's peer read in window k + 1, or a RECEIVE at the start of
window k + 1) until :meth:`Exchange.take` hands it over.

A collective that fails (a peer died or is late, the group's timeout
passed) loses that window's items: :meth:`take` then returns nothing and
the reader loads from storage instead, which costs speed, never a wrong
sample. The window is counted (:attr:`Exchange.failed`, the first errors in
:attr:`Exchange.errors`), and the nodes form their group again
(distributed/regroup.py): the windows after it carry items again.

Every window's collective also carries each node's closing flag (an int64
in front of each pair's part, or of its lengths): the nodes agree on the
last window a loader that is ending runs (docs/cluster.md, "The last turn,
agreed"). :attr:`Exchange.all_closing` says whether every node had set it in
the window just run.

The group holds one rank a node (the node's first rank, which owns its
pool and runs its transfer thread); ``peers[n]`` is node n's rank in it.

May touch: the gloo group it is given and the ones it makes again, the
job's rendezvous store; never a pool, never the loader.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..planning.cluster import ADMIT, PEER_HIT, RECEIVE, SEND, WORKER, ClusterPlan, NodePlan
from ..planning.clusterfigures import ClusterFigures
from ..pool.codec import encode
from .regroup import ExchangeGroup

__all__ = ["Exchange", "NodeTransfers", "Record", "Window", "record_of", "routes"]

#: An item's record as it travels: bytes, or a view of the buffer it was read
#: or received in (never copied out of it).
Record = bytes | bytearray | memoryview

#: Errors kept with their window (every failed window is counted in
#: Exchange.failed; a node that left for good fails every window after).
_KEEP_ERRORS = 20


def record_of(obj: Any, allow_pickle: bool = False) -> bytes:
    """``obj`` as the pool stores it (the codec's record)."""
    return b"".join(bytes(memoryview(p).cast("B")) for p in encode(obj, allow_pickle))


def _flags(k: int, heads: np.ndarray) -> list[bool]:
    """The closing flags the nodes sent in window k (by group rank)."""
    bad = np.flatnonzero((heads != 0) & (heads != 1))
    if bad.size:
        raise ValueError(f"window {k}: group rank {int(bad[0])} sent a closing flag of {int(heads[bad[0]])} "
                         "(0 or 1 expected): its part is corrupt")
    return [bool(h) for h in heads.tolist()]


@dataclass(frozen=True)
class NodeTransfers:
    """What a node's transfer thread needs of the cluster plan, taken from
    it once, on the rank that planned (distributed/setup.py, beside the
    node's share), so that the plan itself can go (docs/cluster.md, "After
    planning"): this node's rows of :meth:`ClusterPlan.transfers` (those it
    sends or receives), by window, then timeline position; the windows in
    which any node sends something (every node runs a collective in those,
    and only those); and the plan's figures (its checksum, the number of
    nodes, each node's counts for ``stats()``)."""

    node: int
    figures: ClusterFigures
    #: Sorted: the windows with a transfer anywhere in the cluster.
    windows: npt.NDArray[np.int64]
    window: npt.NDArray[np.int64]
    position: npt.NDArray[np.int64]
    src: npt.NDArray[np.int64]
    dst: npt.NDArray[np.int64]
    kind: npt.NDArray[np.uint8]
    item: npt.NDArray[np.int64]

    @classmethod
    def of(cls, cp: ClusterPlan, node: int) -> NodeTransfers:
        """Node ``node``'s transfers, without making the whole cluster's
        table (:meth:`ClusterPlan.transfers_of`,
        :meth:`ClusterPlan.transfer_windows`); nothing of ``cp`` is kept."""
        tr = cp.transfers_of(node)
        order = np.lexsort((tr["position"], tr["window"]))
        return cls(int(node), cp.figures(), cp.transfer_windows(),
                   *(np.ascontiguousarray(tr[k][order]) for k in ("window", "position", "src", "dst", "kind",
                                                                  "item")))

    @property
    def n_nodes(self) -> int:
        return self.figures.n_nodes

    @property
    def checksum(self) -> int:
        return self.figures.checksum

    @property
    def nbytes(self) -> int:
        """The bytes of its arrays."""
        return sum(a.nbytes for a in (self.windows, self.window, self.position, self.src, self.dst, self.kind,
                                      self.item))


def _index_of(node_plan: NodePlan, role: int, positions: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The node plan's index of the position of this role serving each
    timeline position (each is served once by a role)."""
    at = np.flatnonzero(node_plan.role == role)
    served = node_plan.position[at]
    order = np.argsort(served, kind="stable")
    at, served = at[order], served[order]
    j = np.minimum(np.searchsorted(served, positions), max(served.size - 1, 0))
    if positions.size and (served.size == 0 or not np.array_equal(served[j], positions)):
        missing = positions[served[j] != positions] if served.size else positions
        raise ValueError(f"node {node_plan.node}'s plan has no position of role {role} for timeline position "
                         f"{int(missing[0])}: the transfers are not this node plan's")
    return at[j]


class Window:
    """One window's exchange from :meth:`Exchange.begin` to
    :meth:`Exchange.complete`: ``ok`` is None while its collective is in
    flight, then whether its items came."""

    __slots__ = ("k", "ok", "items", "moved", "t0", "received")

    def __init__(self, k: int) -> None:
        self.k = k
        self.ok: bool | None = None
        self.items = self.moved = 0
        self.t0 = 0.0
        #: Waits for the collective's end; gives the records received and each node's closing flag.
        self.received: Callable[[], tuple[list[Record], list[bool]]] | None = None


class _ByWindow:
    """A node's transfer rows (int64 columns), by window: each window's rows
    are handed out as tuples when asked for (a window has a few thousand,
    the node's run has millions: at ImageNet-1k, 90 epochs, 64 nodes 1.7 M,
    55 MB as arrays against about 250 MB as tuples)."""

    __slots__ = ("_rows", "_at")

    def __init__(self, window: npt.NDArray[np.int64], *cols: npt.NDArray[Any]) -> None:
        """``window`` sorted; ``cols`` the rows' fields, in that order."""
        self._rows = np.stack([np.asarray(c, dtype=np.int64) for c in cols], axis=1) if cols else np.empty((0, 0))
        bounds = [0, *(np.flatnonzero(np.diff(window)) + 1).tolist(), window.size]
        self._at = {int(window[a]): (a, b) for a, b in zip(bounds[:-1], bounds[1:])} if window.size else {}

    def get(self, k: int) -> list[tuple[int, ...]]:
        """Window k's rows (none: an empty list)."""
        a, b = self._at.get(k, (0, 0))
        return [tuple(r) for r in self._rows[a:b].tolist()]

    @property
    def nbytes(self) -> int:
        """The bytes of its rows."""
        return int(self._rows.nbytes)


def routes(t: NodeTransfers, node_plan: NodePlan, peers: list[int], room: npt.NDArray[np.int64]
           ) -> tuple[_ByWindow, _ByWindow, dict[int, int]]:
    """What an :class:`Exchange` keeps of its node's transfers, by window,
    with the peers as group ranks (``peers[n]``, node n's) and each row's
    room (``room``): what this node sends, (dst, position, kind, room), by
    position (the rows come by window, then position); what it receives,
    (src, position, node-plan index, room), by sender, then position (the
    bytes arrive grouped by sender); and the node-plan index of each SEND
    by the timeline position it serves."""
    group_rank = np.asarray(peers, dtype=np.int64)
    node = t.node
    out = np.flatnonzero(t.src == node)
    sent = _ByWindow(t.window[out], group_rank[t.dst[out]], t.position[out], t.kind[out], room[out])
    got = np.flatnonzero(t.dst == node)
    got = got[np.lexsort((t.position[got], group_rank[t.src[got]], t.window[got]))]
    peer = t.kind[got] == PEER_HIT
    at = np.empty(got.size, dtype=np.int64)  # where in this node's plan each received item goes
    at[peer] = _index_of(node_plan, WORKER, t.position[got[peer]])
    at[~peer] = _index_of(node_plan, RECEIVE, t.position[got[~peer]])
    received = _ByWindow(t.window[got], group_rank[t.src[got]], t.position[got], at, room[got])
    sends = np.flatnonzero(node_plan.role == SEND)
    return sent, received, dict(zip(node_plan.position[sends].tolist(), sends.tolist()))


class Exchange:
    """One node's side of the windowed transfers of a cluster plan."""

    def __init__(self, transfers: NodeTransfers, node_plan: NodePlan, group: Any = None,
                 peers: list[int] | None = None, timeout: float = 60.0, rooms: np.ndarray | None = None) -> None:
        import torch.distributed as dist

        t = transfers
        if t.node != node_plan.node:
            raise ValueError(f"the transfers are node {t.node}'s, the node plan node {node_plan.node}'s")
        self.plan, self.node = node_plan, node_plan.node
        if group is None:
            group = dist.group.WORLD
        self.world = dist.get_world_size(group)
        #: Each node's rank in the group.
        self.peers = list(range(t.n_nodes)) if peers is None else [int(r) for r in peers]
        if (self.world != t.n_nodes or sorted(self.peers) != list(range(self.world))
                or dist.get_rank(group) != self.peers[self.node]):
            raise ValueError(f"one rank a node: this group has {self.world} ranks for {t.n_nodes} nodes "
                             f"(group ranks {self.peers}), and this is rank {dist.get_rank(group)} for node "
                             f"{self.node}")
        #: The group, made again after a failed window.
        self.groups = ExchangeGroup(group, self.peers[self.node], self.world, timeout,
                                    f"{t.checksum:x}/{'.'.join(map(str, self.peers))}")
        #: Each item's room in the one collective of a window (its record's
        #: bound: the bytes the plan gives it, the codec's margin included),
        #: or None: a collective of the lengths first, then one of the bytes.
        self.rooms = None if rooms is None else np.asarray(rooms, dtype=np.int64)
        room = np.zeros(t.item.size, np.int64) if self.rooms is None else self.rooms[t.item]
        #: Windows with a transfer anywhere in the cluster: every rank runs
        #: a collective in those, and only those.
        self.windows = t.windows.tolist()
        self._out, self._in, self._send_at = routes(t, node_plan, self.peers, room)
        self._windows = set(self.windows)
        #: Forwards read by this node's ranks, by timeline position, until sent.
        self.outbox: dict[int, Any] = {}
        self.inbox: dict[int, Any] = {}
        #: Every window whose items were lost (read from storage), and the
        #: first errors, with their window.
        self.failed: list[int] = []
        self.errors: list[tuple[int, BaseException]] = []
        self.bytes_sent = self.bytes_received = self.items_sent = self.items_received = 0
        #: Items larger than their room (sent empty: read from storage by their reader).
        self.oversize = 0
        #: Seconds inside the collectives of the windows that worked.
        self.seconds = 0.0
        self._last_end = time.monotonic()
        self.closed = False
        #: Whether every node sent its closing flag in the last window whose
        #: collective ran (all nodes read the same flags: they stop together).
        self.all_closing = False

    def close(self) -> None:
        """No more collectives: the loader's group is destroyed here (a
        group kept alive would keep gloo's threads into the interpreter's
        finalization, or under the user's destroy_process_group(); docs/
        testing.md). Called once no collective of it is in flight."""
        self.closed = True
        self.groups.close()

    @property
    def group(self) -> Any:
        """The group of the current generation (None while the nodes form
        it again, or once closed)."""
        return self.groups.group

    def keep_forward(self, node_index: int, record: Record) -> None:
        """The item at this node-plan position was read from storage for
        another node to keep (its record): hold it until the window that
        sends it."""
        if self.plan.forward[node_index]:
            self.outbox[int(self.plan.position[node_index])] = record

    def incoming(self, k: int) -> list[int]:
        """The node-plan positions window k's collective brings items for."""
        return [at for _, _, at, _ in self._in.get(k)]

    def run(self, k: int, read_pool: Callable[[int], Record], closing: bool = False) -> bool:
        """Window k's exchange, a collective of every rank: ``read_pool(i)``
        gives the record this node's pool holds for node-plan position i
        (its SENDs; ``b""`` sends it empty). ``closing``: this node's flag,
        sent to every node; :attr:`all_closing` then says whether every
        node's was set. False when the window's items are lost (counted, and
        the error kept): its collective failed, or the nodes are forming
        their group again after an earlier one did."""
        return self.complete(self.begin(k, read_pool, closing))

    def begin(self, k: int, read_pool: Callable[[int], Record], closing: bool = False) -> Window:
        """Window k's exchange issued: what this node sends packed, and the
        collective started (gloo runs it in a thread of its own), so that
        the caller can store what the window before brought meanwhile
        (docs/cluster.md, "Speed where storage is fast"). :meth:`complete`
        waits for it. Without the items' sizes (two collectives) it runs
        to its end here."""
        w = Window(k)
        if k not in self._windows:
            w.ok = True
            return w
        parts: list[list[Record]] = [[] for _ in range(self.world)]
        for d, t, kd, _ in self._out.get(k):
            assert kd in (PEER_HIT, ADMIT)
            parts[d].append(read_pool(self._send_at[t]) if kd == PEER_HIT else self.outbox.pop(t, b""))
        w.items = sum(len(bs) for bs in parts)
        # Only a node that comes late (a timeout or more after its last
        # collective ended, when the others may have given up on it) looks in
        # the store whether a node left its group: in step, no one can have.
        late = time.monotonic() - self._last_end >= self.groups.timeout.total_seconds() / 2
        group = None if self.closed else self.groups.current(k, look=late)
        if group is None:
            why = "the exchange is closed" if self.closed else (
                f"a node left the exchange's group; the nodes form it again (generation {self.groups.generation})")
            self._lose(k, RuntimeError(why))
            w.ok = False
            return w
        w.t0 = time.monotonic()
        try:
            if self.rooms is None:
                w.moved, got, flags = self._two_collectives(k, group, parts, closing)
                w.received = lambda: (got, flags)
            else:
                w.moved, w.received = self._one_collective(k, group, parts, closing)
        except (RuntimeError, ValueError) as e:  # a dead or late peer, a timeout: this window's items are lost
            self._lose(k, e)
            self.groups.lost()
            w.ok = False
        return w

    def complete(self, w: Window) -> bool:
        """Wait for the collective :meth:`begin` issued, and keep what came
        (:meth:`take`); :attr:`all_closing` says whether every node's
        closing flag was set in it. False when the window's items are lost."""
        self.all_closing = False
        if w.ok is not None:
            return w.ok
        k, received = w.k, w.received
        assert received is not None  # set by begin() whenever ok is not
        try:
            got, flags = received()
        except (RuntimeError, ValueError) as e:  # a dead or late peer, a timeout: this window's items are lost
            self._lose(k, e)
            self.groups.lost()
            w.ok = False
            return False
        finally:
            w.received = None  # the buffers, and a failed wait's frame
        self._last_end = time.monotonic()
        self.all_closing = all(flags)
        self.seconds += self._last_end - w.t0
        self.items_sent += w.items
        self.bytes_sent += w.moved
        incoming = self._in.get(k)
        for (_, _, at, _), record in zip(incoming, got):
            self.inbox[at] = record
        self.items_received += len(incoming)
        self.bytes_received += sum(len(r) for r in got)
        w.ok = True
        return True

    def _two_collectives(self, k: int, group: Any, parts: list[list[Record]],
                         closing: bool) -> tuple[int, list[Record], list[bool]]:
        """Window k's items without bounds on their sizes: each pair's
        closing flag and its items' lengths first, then the bytes. Returns
        the bytes sent, the records received, in the order of
        ``self._in.get(k)``, and each node's closing flag."""
        import torch

        lengths = [np.array([int(closing)] + [len(b) for b in bs], dtype=np.int64) for bs in parts]
        expect = [1] * self.world
        for s, _, _, _ in self._in.get(k):
            expect[s] += 1
        got_sizes = torch.empty(sum(expect), dtype=torch.int64)
        self.groups.all_to_all(group, got_sizes, torch.from_numpy(np.concatenate(lengths)), expect,
                               [x.size for x in lengths])
        heads = np.cumsum([0] + expect[:-1])
        flags = _flags(k, got_sizes.numpy()[heads])
        got_sizes = torch.from_numpy(np.delete(got_sizes.numpy(), heads))
        expect = [e - 1 for e in expect]
        lengths = [x[1:] for x in lengths]
        blob = b"".join(b for bs in parts for b in bs)
        send = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)
        per_src = np.split(got_sizes.numpy(), np.cumsum(expect)[:-1])
        recv = torch.empty(int(got_sizes.sum()), dtype=torch.uint8)
        self.groups.all_to_all(group, recv, send, [int(x.sum()) for x in per_src],
                               [int(x.sum()) for x in lengths])
        data = memoryview(recv.numpy())
        offsets = np.concatenate([[0], np.cumsum(got_sizes.numpy())]).tolist()
        return len(blob), [data[offsets[j]:offsets[j + 1]] for j in range(len(offsets) - 1)], flags

    def _one_collective(self, k: int, group: Any, parts: list[list[Record]],
                        closing: bool) -> tuple[int, Callable[[], tuple[list[Record], list[bool]]]]:
        """Window k's items in one collective: every item has its room (its
        record's bound, which both sides know from the plan), so each pair's
        bytes are known before anything is sent. A pair's part is the
        sender's closing flag (int64), its items' lengths (int64), the items
        one after another, then zeros up to the sum of their rooms. A record
        larger than its room (one the pool would not keep either) goes as
        length 0: lost, read from storage by its reader, as a failed
        window's. The part is packed by one join (a copy of each record),
        and what came stays views of the one buffer received. Returns the
        bytes sent at once, with the collective issued, and what waits for
        its end and gives the records received (in the order of
        ``self._in.get(k)``) and each node's closing flag."""
        import torch

        out: list[list[int]] = [[] for _ in range(self.world)]
        for d, _, _, r in self._out.get(k):
            out[d].append(r)
        counts = [8 + 8 * len(rs) + sum(rs) for rs in out]
        pieces: list[Record] = []
        moved = 0
        for bs, rs in zip(parts, out):
            lens = [len(b) if len(b) <= r else 0 for b, r in zip(bs, rs)]
            pieces.append(np.array([int(closing), *lens], dtype=np.int64).tobytes())
            pieces.extend(b for b, n in zip(bs, lens) if n)
            pieces.append(bytes(sum(rs) - sum(lens)))
            moved += sum(lens)
            self.oversize += sum(1 for b, n in zip(bs, lens) if b and not n)
        send = bytearray().join(pieces)
        incoming = self._in.get(k)
        expect = [8] * self.world
        rooms: list[list[int]] = [[] for _ in range(self.world)]
        for s, _, _, r in incoming:  # by sender, as they arrive
            expect[s] += 8 + r
            rooms[s].append(r)
        recv = torch.empty(sum(expect), dtype=torch.uint8)
        buffers = (torch.frombuffer(send, dtype=torch.uint8) if send else torch.empty(0, dtype=torch.uint8),
                   recv)  # both kept until the collective ends
        work = self.groups.all_to_all(group, recv, buffers[0], expect, counts, wait=False)

        def received() -> tuple[list[Record], list[bool]]:
            work.wait()
            data = buffers[1].numpy()
            view = memoryview(data)
            got: list[Record] = []
            heads: list[int] = []
            at = 0
            for s in range(self.world):
                heads.append(int(data[at:at + 8].view(np.int64)[0]))
                rs = np.asarray(rooms[s], dtype=np.int64)
                lens = data[at + 8:at + 8 + 8 * rs.size].view(np.int64)
                at += 8 + 8 * rs.size
                bad = np.flatnonzero((lens < 0) | (lens > rs))
                if bad.size:
                    j = int(bad[0])
                    raise ValueError(f"window {k}: group rank {s} sent an item of {int(lens[j])} bytes for a room "
                                     f"of {int(rs[j])}")
                starts = (at + np.cumsum(lens) - lens).tolist()
                got.extend(view[a:a + n] for a, n in zip(starts, lens.tolist()))
                at += int(rs.sum())
            return got, _flags(k, np.array(heads, dtype=np.int64))

        return moved, received

    def _lose(self, k: int, e: BaseException) -> None:
        self.failed.append(k)
        if len(self.errors) < _KEEP_ERRORS:
            # Kept without its traceback, whose frame holds self: a cycle that
            # would keep the group alive past destroy_process_group.
            self.errors.append((k, e.with_traceback(None)))

    @property
    def bytes_per_s(self) -> float | None:
        """Bytes sent and received a second inside the collectives that
        worked (None before the first): what the group delivers, the wait
        for the slowest node included."""
        moved = self.bytes_sent + self.bytes_received
        return moved / self.seconds if self.seconds > 0 else None

    def take(self, node_index: int) -> Record | None:
        """The record received for this node-plan position, or None when its
        window's collective failed (or an empty one came: a forward lost)."""
        got = self.inbox.pop(node_index, None)
        return got if got else None
