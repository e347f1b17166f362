"""The worker side: where a batch HITs, where a MISS loads, where a worker
waits. Runs in every DataLoader worker (and in the main process without
workers).

:class:`PlannedDataset` maps a position to its item and follows the plan
there. One call into C (``pool.get_batch``) reads the batch: HITs are copied
out of the pool and decoded; a position whose item another process is still
loading waits in C, on a futex, up to ``wait_timeout``; everything else
comes back as LOAD (an ADMIT or a BYPASS, or a fallback after a timed-out
wait) and is loaded from the user's dataset here, then ADMITs are stored
with one more call (``pool.store_batch``). May touch: the pool through its
own attached handle (one per thread), the user's dataset, the codec; never
the owner's :class:`~opt4torch.pool.cache.OPTCache`.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch.utils.data as tud

from .. import _engine, _messages
from ..pool.codec import decode, decode_at, encode, encoded_size, make_arrays

__all__ = ["PlannedDataset"]


class PlannedDataset(tud.Dataset[Any]):
    """``dataset`` seen through the plan: item ``t`` is the t-th access.

    Picklable (for spawn and forkserver workers): a worker attaches to the
    pool by name on first use, one handle per thread.
    """

    def __init__(self, dataset: Any, pool_name: str, accesses: int, items: int, *,
                 transform: Callable[[Any], Any] | None = None, allow_pickle: bool = False) -> None:
        self.dataset = dataset
        self.pool_name = pool_name
        self.accesses = int(accesses)
        self.items = int(items)
        self.transform = transform
        self.allow_pickle = allow_pickle
        #: Whether a batch wholly below the pool's floor is dropped unloaded
        #: (the DataLoader's own pool: then only a left epoch's batches lie
        #: there). Off where other processes move the floor: ranks sharing a
        #: pool, where one rank's next epoch starts while another still
        #: serves its last batches.
        self.drop_below_floor = False
        self._local = threading.local()
        self._warned_size = False

    def __len__(self) -> int:
        return self.accesses

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_local"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def _pool(self) -> Any:
        pool = getattr(self._local, "pool", None)
        if pool is None:
            n = len(self.dataset)
            if n != self.items:
                raise RuntimeError(
                    f"the dataset has {n} items but the cache was planned for {self.items}: a "
                    "dataset whose length changed needs a new loader (and a new plan)"
                )
            pool = _engine.pool_attach(self.pool_name)
            self._local.pool = pool
        return pool

    def _load(self, indices: list[int]) -> list[Any]:
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None and len(indices) > 1:
            return list(getitems(indices))
        return [self.dataset[i] for i in indices]

    def __getitem__(self, position: int) -> Any:
        return self.__getitems__([position])[0]

    def retarget(self, pool_name: str, accesses: int) -> None:
        """Serve another plan's pool (a re-plan, see DataLoader): workers
        started from now on attach it; this process's handle goes. Workers
        already running (persistent ones) move on the first batch that names
        it (:class:`_OnPool`)."""
        self.pool_name = pool_name
        self.accesses = int(accesses)
        self._local = threading.local()

    def __getitems__(self, positions: Sequence[int]) -> list[Any]:
        if isinstance(positions, _Unplanned):
            # A batch past what the plan covers (an epoch that ran longer
            # than the cut the plan expected): item indices, loaded, not cached.
            loaded = self._load(list(positions))
            return [self.transform(x) for x in loaded] if self.transform is not None else loaded
        moved = getattr(positions, "pool", None)
        if moved is not None and moved[0] != self.pool_name:
            self.retarget(*moved)
        pool = self._pool()
        if self.drop_below_floor and positions and self._below_floor(pool, positions):
            # The loop left the epoch (a break) after this batch was handed
            # out: nobody takes it. Not loaded, and not counted as served.
            raise _Dropped(f"opt4torch: positions {min(positions)}-{max(positions)} lie below the floor "
                           f"({pool.floor()}): their epoch was left early, so this batch is dropped unserved")
        out: list[Any] = []
        start = 0
        # A transform that reads bytes in place (a Parquet unit, decoded by
        # pyarrow for one row) takes the HITs' bytes as read-only views of
        # the batch's copy of the pool's bytes, not as copies of them.
        views = bool(getattr(self.transform, "takes_views", False))
        while start < len(positions):
            part = positions[start:] if start else positions
            # One call into C reads the batch and decodes its HITs (arrays
            # and tensors through make_arrays, as views of data); rest holds
            # (i, status, item, a, b) for everything else. It stops early
            # (AGAIN) where a prefetcher holds a miss whose store may wait
            # for one of ours: we commit what came before, then go on there.
            try:
                got, data, rest = pool.get_batch(part, make_arrays, views)
            except (_engine.InvalidInputError, OverflowError, TypeError) as exc:
                if all(0 <= int(t) < self.accesses for t in positions):
                    raise
                raise _messages.bad_positions(positions, self.accesses) from exc
            served = len(part)
            if rest and rest[-1][1] == _engine.ENTRY_AGAIN:
                served = rest.pop()[0]
                del got[served:]
                if served == 0:  # it owes nothing at its first position
                    raise RuntimeError(f"opt4torch: the pool served none of positions {part}")
            if rest:
                self._finish_batch(pool, part, got, data, rest)
            out.extend(got)
            start += served
        if self.transform is not None:
            # A transform that needs the position (a row taken from its read unit) says so.
            at = getattr(self.transform, "at_positions", None)
            out = at(out, positions) if at is not None else [self.transform(x) for x in out]
        return out

    @staticmethod
    def _below_floor(pool: Any, positions: Sequence[int]) -> bool:
        """Whether every position is a real one below the floor. A position
        out of range (negative, or not an int) is never dropped: the read
        below refuses it with the message that says what was wrong."""
        try:
            lo, hi = int(min(positions)), int(max(positions))
        except (TypeError, ValueError):
            return False
        return 0 <= lo and hi < pool.floor()

    def _finish_batch(self, pool: Any, positions: Sequence[int], out: list[Any], data: bytearray,
                      rest: list[tuple[int, int, int, int, int]]) -> None:
        """Load, store and decode the positions the C side left in ``rest``."""
        load_at = [e for e in rest if e[1] == _engine.ENTRY_LOAD]
        loaded = self._load([e[2] for e in load_at]) if load_at else []
        for e, obj in zip(load_at, loaded):
            out[e[0]] = obj
        # Commit in position order: stores of ADMITs, notes of deferred reads
        # (a generation admitted and read in this batch may be evicted later
        # in it, and the eviction waits for those reads).
        commits: list[tuple[int, Any]] = []
        encoded: dict[int, list[Any]] = {}
        for i, status, _, a, _ in rest:
            if status == _engine.ENTRY_LOAD and a == _engine.REASON_ADMIT:
                parts = encode(out[i], self.allow_pickle)
                encoded[int(positions[i])] = parts
                commits.append((int(positions[i]), parts))
            elif status == _engine.ENTRY_DEFER:  # the same item, loaded earlier in this batch
                commits.append((int(positions[i]), None))
        if commits:
            results = pool.store_batch(commits)
            if _engine.STORE_TOO_LARGE in results and not self._warned_size:
                self._warned_size = True
                sizes = [encoded_size(c[1]) for c, r in zip(commits, results) if r == _engine.STORE_TOO_LARGE]
                warnings.warn(
                    f"an item of {max(sizes)} bytes does not fit its space in the cache "
                    f"({pool.info()['page_size']} bytes): it is loaded, not cached. Give the loader "
                    "item_bytes= at least the largest item's size", RuntimeWarning, stacklevel=3)
        for i, status, _, a, b in rest:
            if status == _engine.ENTRY_HIT:  # one the C decoder left to the codec (PIL images, pickles, ...)
                out[i] = decode_at(data, a, b)
            elif status == _engine.ENTRY_DEFER:
                # Decode its record again so each sample is its own object.
                out[i] = decode(bytearray().join(encoded[a]))


class _Dropped(RuntimeError):
    """A worker's answer to a batch that nobody will take (all its positions
    below the floor: handed out before a ``break``). Torch drops it with the
    rest of the left epoch's batches; it is never raised in the loop."""


class _Unplanned(list[int]):
    """A batch of item indices (not positions) past what the plan covers: an
    epoch that runs on past the cut a re-plan expected. Loaded, not cached.
    A type of its own, so that no position, in range or not, is ever taken
    for one; it pickles to spawned workers by name."""


class _OnPool(list[int]):
    """A batch of positions of the pool named ``pool`` (name, accesses): a
    re-plan's. Workers that outlive a re-plan (``persistent_workers``) keep
    the dataset they were started with, so the batch tells them where its
    positions are; they move there before serving it."""

    pool: tuple[str, int]
