"""The main process's side of the plan: which positions each batch is.

:class:`PositionBatchSampler` yields batches of positions (position ``t`` is
the t-th access of the whole run), epoch by epoch, exactly as captured, and
declares positions that will never run (a ``break``, a resume) by moving the
pool's floor, so that no worker waits for them. It starts the prefetcher at
an epoch's first batch. May touch: the owner's cache (its floor and its
prefetcher); never the pool's bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch.utils.data as tud

from ..pool.cache import OPTCache
from .worker import _OnPool, _Unplanned

__all__ = ["PositionBatchSampler"]


class PositionBatchSampler(tud.Sampler[list[int]]):
    """Batches of positions, epoch by epoch, exactly as captured.

    ``starts[e]`` and ``lengths[e]`` give epoch e's batches: batch b is
    positions ``starts[e][b] .. starts[e][b] + lengths[e][b] - 1``. (One rank
    of a pool shared across ranks owns every W-th batch of the run.) Each
    ``iter()`` is the next epoch (or the one given by :meth:`set_epoch`).
    When an epoch starts, positions before ``floors[e]`` that never ran (a
    loop that broke out early) are declared skipped so nothing waits for them.
    """

    def __init__(self, starts: list[np.ndarray], lengths: list[np.ndarray], floors: list[int],
                 cache: OPTCache, batched: bool = True) -> None:
        self.starts = list(starts)
        self.batches = list(lengths)  # per epoch: int64 array of batch lengths
        self.floors = list(floors)
        self.cache = cache
        self.batched = batched
        self._next_epoch = 0
        # (epoch, batches to skip, the floor to set, samples of the first
        # remaining batch already done, samples of the epoch done)
        self._resume: tuple[int, int, int, int, int] | None = None
        self.epoch = 0
        #: Positions the prefetcher loads before the first batch is handed out.
        self.head_start = 0
        #: Per epoch, batches of item indices past what the plan covers
        #: (handed out as _Unplanned batches: loaded, not cached). Empty
        #: unless a re-plan expects epochs cut short (DataLoader._replan).
        self.tails: list[list[np.ndarray]] = [[] for _ in lengths]
        #: How the last epoch ended: (epoch, batches run) if the loop left it
        #: early, (epoch, None) if it ran to its end.
        self.observed: tuple[int, int | None] | None = None
        #: The pool batches name (:class:`_OnPool`), once a re-plan made one.
        self.pool: tuple[str, int] | None = None

    def __len__(self) -> int:
        e = min(self._next_epoch, len(self.batches) - 1)
        tail = self.tails[e]
        if self.batched:
            return int(len(self.batches[e])) + len(tail)
        return int(self.batches[e].sum()) + sum(len(b) for b in tail)

    def set_epoch(self, epoch: int) -> None:
        if not 0 <= epoch < len(self.batches):
            raise ValueError(f"this loader was planned for {len(self.batches)} epochs; epoch {epoch} "
                             "is outside them")
        self._next_epoch = int(epoch)

    def grid(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s samples done after each of its batches (planned,
        then past a re-plan's cut): the same whatever re-plans happened."""
        lens = self.batches[epoch]
        tail = self.tails[epoch]
        if tail:
            lens = np.concatenate((lens, np.array([len(t) for t in tail], dtype=np.int64)))
        return np.cumsum(lens, dtype=np.int64)

    def samples_after(self, epoch: int, first: int, yielded: int) -> int:
        """Samples of ``epoch`` done once ``yielded`` batches have come out of
        an iteration that started ``first`` samples into it."""
        if yielded <= 0:
            return int(first)
        grid = self.grid(epoch)
        b = int(np.searchsorted(grid, first, side="right"))  # the batch the first one ends
        return int(grid[min(b + yielded - 1, grid.size - 1)]) if grid.size else 0

    def resume(self, epoch: int, samples_done: int) -> tuple[int, int]:
        """Make the next iteration start ``samples_done`` samples into epoch
        ``epoch``, whatever batch size saved that count: the batch holding the
        next sample comes first, cut to start at it (a short batch), then the
        epoch's batches as they are. Returns (the first position, which
        becomes the floor, see :meth:`resume_floor`; the batches of this
        loader wholly done before it)."""
        self.set_epoch(epoch)
        grid = self.grid(epoch)
        b = int(np.searchsorted(grid, samples_done, side="right"))
        offset = int(samples_done) - (int(grid[b - 1]) if b else 0)
        if b < len(self.starts[epoch]):
            start = int(self.starts[epoch][b]) + offset
        else:  # done, or past the plan's cut: nothing planned runs before the next epoch
            start = self.floors[epoch + 1] if epoch + 1 < len(self.floors) else self.cache.plan.accesses
        if b >= grid.size:
            offset = 0
        self._resume = (int(epoch), b, start, offset, int(samples_done))
        return start, b

    def abandon(self, batches_run: int) -> None:
        """The loop left this epoch early (a ``break``): none of its positions
        that have not run will. Declared at once, not when the next epoch
        starts, so that a worker still loading a batch nobody will take (or a
        prefetcher holding one of its items) gives up instead of waiting for
        reads that will not come. Positions already handed to workers fall
        back to the source if they run now; their batches are dropped."""
        e = self.epoch
        self.observed = (e, int(batches_run))
        self.cache.set_floor(self.floors[e + 1] if e + 1 < len(self.floors) else self.cache.plan.accesses)

    def resume_floor(self, floor: int) -> None:
        """Resume with this floor instead: a node's ranks sharing one pool
        resume at the earliest next batch among them."""
        assert self._resume is not None
        e, b, _, offset, samples = self._resume
        self._resume = (e, b, int(floor), offset, samples)

    def __iter__(self) -> Iterator[Any]:
        # torch may create an iterator and drop it unused (its multi-process
        # iterator calls iter() twice), so the epoch is taken at the first
        # next(), not here.
        return self._generate()

    def _generate(self) -> Iterator[Any]:
        e = self._next_epoch
        if e >= len(self.batches):
            raise RuntimeError(
                f"this loader was planned for {len(self.batches)} epochs and they are all used; "
                "build it with a larger epochs= to train longer"
            )
        self._next_epoch = e + 1
        skip, floor, cut = 0, self.floors[e], 0
        if self._resume is not None and self._resume[0] == e:
            _, skip, floor, cut, _ = self._resume
        self._resume = None
        self.epoch = e
        # This runs at the first next(): by then torch has finished the
        # previous epoch's outstanding batches, so positions before the floor
        # that never ran never will.
        # (Resuming: nothing below the resumed position will run.)
        self.cache.set_floor(floor)
        # The workers exist by now (torch forks them before asking for the
        # first batch): start prefetching, once, in this process, and give it
        # a head start on the batches the workers get first.
        planned = len(self.starts[e])
        first = int(self.starts[e][skip]) + cut if skip < planned else floor
        self.cache.start_prefetch((first, first + self.head_start))
        for start, n in zip(self.starts[e][skip:].tolist(), self.batches[e][skip:].tolist()):
            # A resume mid-batch (saved with another batch size) starts at
            # its sample: the first batch is short.
            start, n, cut = start + cut, n - cut, 0
            if not self.batched:
                yield from range(start, start + n)
            elif self.pool is None:
                yield list(range(start, start + n))
            else:
                batch = _OnPool(range(start, start + n))
                batch.pool = self.pool
                yield batch
        for items in self.tails[e][max(0, skip - planned):]:
            yield _Unplanned(items[cut:].tolist())  # re-plans happen only for batched loaders
            cut = 0


class _Unbatched(tud.Sampler[int]):
    """Positions one by one (batch_size=None)."""

    def __init__(self, positions: PositionBatchSampler) -> None:
        self.positions = positions

    def __len__(self) -> int:
        return len(self.positions)

    def __iter__(self) -> Iterator[int]:
        return iter(self.positions)
