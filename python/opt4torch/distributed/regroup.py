"""The exchange's gloo group, and how the nodes form it again after a
window fails (issue 36; docs/cluster.md, "Faults"). May touch: the job's
rendezvous store (keys under ``opt4torch/exchange/``) and the groups it
makes; never a pool.

A collective that times out leaves gloo's connections to the late node
closed for good: on that group every later collective fails at once
("Connection closed by peer"). So a node whose window failed leaves the
group (drops it) and asks for the next *generation*: it adds itself to the
generation's count in the store. A node that comes to a collective late
(half a timeout after its last one) first looks whether another node has
left, and if so leaves too, at once: the group the others dropped would
otherwise keep it waiting out its own timeout. While the count is short,
each window a node comes to is read from storage, without waiting (a node
that has left for good, never counted, costs the others nothing more). The
node that completes the count marks the generation ready. A thread of the
node's own (started when it left) looks for that mark four times a second
(the store tells no one; its blocking wait would log a warning at every
timeout) and then makes the new group: a gloo rendezvous under the
generation's prefix, bounded by the timeout. It runs beside the transfer
thread, never in it: the transfer thread may be waiting for its workers,
they for its claims, and through training's all-reduce every node for
them, so a rendezvous in it could wait for nodes that wait for it. Once
the group is made, the node writes the first window it has not decided
yet, and all start at the latest of those: a window is run by every node
on the same group, or read from storage by all. A build or an agreement
that fails is one more loss: the next generation. Each node leaves a
generation at most once, so all of them count generations alike.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

import torch

from .node import release_group

__all__ = ["ExchangeGroup"]

#: Exchanges made in this process, by plan checksum and rank: the store
#: prefix of each (every node makes its loaders' exchanges in the same order).
_made: dict[str, int] = {}


class ExchangeGroup:
    """The group a node's exchange runs its collectives on, one generation
    after another; ``rank`` and ``size`` are the node's in it."""

    def __init__(self, group: Any, rank: int, size: int, timeout: float, key: str, store: Any = None) -> None:
        import torch.distributed as dist

        self.group = group
        self.rank, self.size = int(rank), int(size)
        self.timeout = datetime.timedelta(seconds=float(timeout))
        #: The generation of the group (0: the one it was given), and the
        #: first window the current one runs.
        self.generation = 0
        self.start = 0
        #: Groups made again after a loss.
        self.regroups = 0
        self._lock = threading.Lock()
        self._waiting = False  # left the generation; the next one not made yet
        self._closed = threading.Event()
        self._decided = -1  # the last window current() answered for
        self._builder: threading.Thread | None = None
        self._posted: int | None = None  # the first window this node left to the agreement
        self._agreed = threading.Event()
        counted = f"{key}@{self.rank}"
        n = _made[counted] = _made.get(counted, -1) + 1
        self._prefix = f"opt4torch/exchange/{key}/{n}"
        self._store: Any = store
        if store is None:
            try:
                self._store = dist.distributed_c10d._get_default_store()
            except (RuntimeError, ValueError, AttributeError):  # no default group's store: no new generations
                self._store = None

    @property
    def waiting(self) -> bool:
        """This node left its group and waits for the next generation."""
        return self._waiting

    def current(self, k: int, look: bool = True) -> Any:
        """The group window k runs on, or None: the window is read from
        storage (this node waits for the others to come back, or the group
        is closed). Windows are asked for in order. ``look``: first look
        whether another node has left the group (a node that may be late)."""
        with self._lock:
            if not self._waiting and look and self.generation_left():
                self._leave()
            agreed, posted = self._agreed, self._posted
            if not self._waiting or posted is None or k < posted:
                self._decided = max(self._decided, k)
                return self.group if not self._waiting and k >= self.start else None
        # The nodes are agreeing on the window they start at, which is this
        # one or a later one: wait for them (bounded: the agreement is).
        agreed.wait(2 * self.timeout.total_seconds())
        with self._lock:
            if self._waiting and self._agreed is agreed:  # no agreement in time: give the generation up
                self._leave()
            self._decided = max(self._decided, k)
            return self.group if not self._waiting and k >= self.start else None

    def generation_left(self) -> bool:
        """Whether another node has left this generation (one look at the
        store): its group is then broken, and a collective on it would wait
        out the timeout (gloo keeps the connections of a group the others
        have left open until they drop it) instead of failing at once."""
        if self._store is None or self._closed.is_set():
            return False
        try:
            return bool(self._store.check([self._key("arrived", self.generation + 1)]))
        except Exception:  # noqa: BLE001 - the store is gone: the collective will say
            return False

    def lost(self) -> None:
        """A collective of the current group failed: leave it, and count
        this node in for the next generation."""
        with self._lock:
            self._leave()

    def _leave(self) -> None:
        group, self.group = self.group, None
        self.release(group)
        self.generation += 1
        self._waiting = True
        self._posted = None
        self._agreed.set()  # a wait on the generation left ends
        self._agreed = threading.Event()
        if self._store is None or self._closed.is_set():
            return
        try:
            if self._store.add(self._key("arrived"), 1) == self.size:
                self._store.set(self._key("ready"), b"1")
        except Exception:  # noqa: BLE001 - the store is gone: no generation comes
            self._store = None
            return
        if self._builder is None:  # else the running one goes on with this generation
            self._builder = threading.Thread(target=self._regroup, name="opt4-regroup", daemon=True)
            self._builder.start()

    def _regroup(self) -> None:
        """The node's regroup thread: it makes each generation's group as
        it becomes ready, until the node has a group again or is closed."""
        while True:
            with self._lock:
                if not self._waiting or self._closed.is_set():
                    self._builder = None  # under the lock: a loss after this starts another
                    return
                generation, agreed = self.generation, self._agreed
            try:
                ready = self._store.check([self._key("ready", generation)])
            except Exception:  # noqa: BLE001 - the store is gone: no generation comes
                with self._lock:
                    self._builder = None
                return
            if not ready:
                self._closed.wait(0.25)
                continue
            self._build(generation, agreed)

    def _build(self, generation: int, agreed: threading.Event) -> None:
        """Make the generation's group, then agree on its first window."""
        import torch.distributed as dist

        try:
            store = dist.distributed_c10d.PrefixStore(f"{self._prefix}/{generation}/pg", self._store)
            group = dist.ProcessGroupGloo(store, self.rank, self.size, self.timeout)
            with self._lock:
                if self.generation != generation or self._closed.is_set():
                    return
                self._posted = at = self._decided + 1
            self._store.set(self._key(f"at/{self.rank}", generation), str(at).encode())
            keys = [self._key(f"at/{r}", generation) for r in range(self.size)]
            self._store.wait(keys, self.timeout)
            start = max(int(self._store.get(key)) for key in keys)
        except Exception:  # noqa: BLE001 - a node did not come: the next generation
            with self._lock:
                if self.generation == generation and not self._closed.is_set():
                    self._leave()
            return
        with self._lock:
            if self.generation != generation or self._closed.is_set():
                return
            self.group, self.start = group, start
            self._waiting, self._posted = False, None
            self.regroups += 1
            agreed.set()

    def _key(self, what: str, generation: int | None = None) -> str:
        return f"{self._prefix}/{self.generation if generation is None else generation}/{what}"

    def all_to_all(self, group: Any, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                   in_splits: list[int], wait: bool = True) -> Any:
        """One ``all_to_all_single`` on ``group`` (a group of the default
        one's, or a generation's gloo group of its own). With ``wait=False``
        it is only issued (gloo runs it in a thread of its own): the work is
        returned, whose ``wait()`` ends it (and raises what failed)."""
        import torch.distributed as dist

        if isinstance(group, dist.ProcessGroupGloo):
            # The backend's own call (ProcessGroup.all_to_all_single's), absent from torch's stubs.
            work = group.alltoall_base(out, inp, out_splits, in_splits, dist.AllToAllOptions())  # type: ignore[attr-defined]
        else:
            work = dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits,
                                          group=group, async_op=True)
        if wait:
            work.wait()
        return work

    @staticmethod
    def release(group: Any) -> None:
        """Let go of a group: a generation's is ended by dropping it (its
        gloo threads are joined then); the one given is destroyed as the
        loader destroys its groups (node.release_group)."""
        import torch.distributed as dist

        if group is not None and not isinstance(group, dist.ProcessGroupGloo):
            release_group(group)

    def close(self) -> None:
        """No more collectives. The regroup thread is joined (a rendezvous
        under way ends by the timeout), so no thread of it is left inside
        gloo or the store when the interpreter ends (docs/cluster.md,
        "Ending a run")."""
        with self._lock:
            self._closed.set()
            group, self.group = self.group, None
            self._waiting = False
            builder = self._builder
            self._agreed.set()
        if builder is not None and builder is not threading.current_thread():
            builder.join(2 * self.timeout.total_seconds() + 1)
        self.release(group)
