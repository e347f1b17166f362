"""Epochs cut short: planning again what remains, from what the pool holds.

When an epoch ends otherwise than the plan expects (cut after k batches by
a ``break`` or Lightning's ``limit_train_batches``, or run whole where the
plan expected a cut), the loader plans the remaining epochs again before
their workers start. No cold start: the items the old pool holds come first
in the new sequence, OPT decides which to keep, and the new pool is warmed
with those, copied from the old one. May touch: the loader's sampler and
dataset (retargeted to the new pool), both pools (read, warm, floor), the
planner; runs in the main process while no worker serves a batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..planning.plan import Plan
from ..planning.sizing import spare_pages
from ..pool.cache import OPTCache
from ..pool.codec import encode
from ..pool.keep import keep_from

if TYPE_CHECKING:
    from .sampler import PositionBatchSampler
    from .worker import PlannedDataset

__all__ = ["ReplanContext", "Replans"]


@dataclass
class ReplanContext:
    """What a re-plan needs, kept from the loader's build: the sequence as
    built and its batches, how to plan and size a pool, and what the
    re-plans so far decided (``cut``: batches per epoch the plan expects,
    None for whole epochs; ``seen``: how the epochs ended; ``said``: the
    one warning given)."""

    seq: np.ndarray
    starts: list[np.ndarray]
    lengths: list[np.ndarray]
    make_plan: Callable[[np.ndarray], Plan]
    pool_page: int
    wait_timeout: float
    staging_slots: int
    spare_pages: int
    spare_window: int
    prefetch: tuple[Any, dict[str, Any]] | None
    cut: int | None = None
    seen: list[int | None] = field(default_factory=list)
    said: bool = False


class Replans:
    """The DataLoader's re-planning (a base of :class:`DataLoader`)."""

    cache: OPTCache
    dataset: Any
    _positions: PositionBatchSampler
    _replan_from: ReplanContext | None
    replans: list[tuple[int, int | None]]

    def _maybe_replan(self) -> None:
        """Before an epoch's workers start: if the last epoch ended otherwise
        than the plan expects (cut after k batches by a break or Lightning's
        limit_train_batches, or run whole where the plan expected a cut),
        plan again what remains, from what the pool holds (:meth:`_replan`).

        What the new plan expects of the later epochs: whole epochs, unless
        the last two epochs were both cut after the same k batches (a limit
        on every epoch, not a one-off look at the data); then that cut. One
        cut epoch proves nothing about the next, and a wrong guess costs
        only another re-plan, which keeps the pool too."""
        ctx, pos = self._replan_from, self._positions
        if ctx is None or pos.observed is None or pos._resume is not None:
            return
        epoch, k = pos.observed
        pos.observed = None
        planned = len(pos.batches[epoch]) + len(pos.tails[epoch])
        if k is not None and k >= planned:
            k = None  # every batch was taken, only the iterator was dropped before its end: a whole epoch
        seen = ctx.seen
        seen.append(k)
        if pos._next_epoch >= len(pos.batches):
            return
        cut = k if k is not None and seen[-2:] == [k, k] else None
        if cut is not None and cut >= max(len(x) for x in ctx.lengths[pos._next_epoch:]):
            cut = None  # a cut no later epoch reaches is no cut
        if k == ctx.cut and cut == ctx.cut:
            return  # as planned
        # Where the run stopped in the current plan: the first batch not
        # run, or the end of the epoch's planned positions.
        if k is not None and k < len(pos.starts[epoch]):
            stop = int(pos.starts[epoch][k])
        else:
            stop = pos.floors[epoch + 1] if epoch + 1 < len(pos.floors) else self.cache.plan.accesses
        how = (f"epoch {epoch} ended after {k} of {planned} batches" if k is not None
               else f"epoch {epoch} ran all {planned} batches where the plan expected {ctx.cut}")
        self._replan(pos._next_epoch, cut, stop, how)

    def _replan(self, first_epoch: int, cut: int | None, stop: int, how: str) -> None:
        """A new plan and pool for epochs ``first_epoch`` on, each cut to its
        first ``cut`` batches (None: whole). Batches past the cut, if an epoch
        runs on, are loaded and not cached (counted in stats()' ``unplanned``).

        No cold start: the items the old pool holds for reads after ``stop``
        (where the run left the old plan) come first in the new sequence, as
        a prefix nobody reads, so OPT decides which of them to keep as it
        decides everything else; the new pool is warmed with those it keeps,
        copied from the old pool, and the old one is removed. Runs in the
        main process while no worker serves a batch."""
        ctx, pos = self._replan_from, self._positions
        assert ctx is not None
        old = self.cache
        held, reads = old.plan.resident_reads_at(min(max(stop, old._prefix), old.plan.accesses))
        seq, full_starts, full_lengths = ctx.seq, ctx.starts, ctx.lengths
        pieces: list[np.ndarray] = [held.astype(seq.dtype)]
        starts, lengths, floors, tails = [], [], [], []
        offset = prefix = int(held.size)
        for e in range(first_epoch, len(full_lengths)):
            lens = full_lengths[e]
            n = len(lens) if cut is None else min(cut, len(lens))
            begin = int(full_starts[e][0]) if len(lens) else 0
            end = begin + int(lens[:n].sum())
            pieces.append(seq[begin:end])
            floors.append(offset)
            starts.append(offset + np.concatenate(([0], np.cumsum(lens[:n])[:-1])).astype(np.int64)
                          if n else np.empty(0, np.int64))
            lengths.append(lens[:n])
            tails.append([seq[int(a):int(a) + int(b)] for a, b in zip(full_starts[e][n:], lens[n:])])
            offset += end - begin
        new_seq = np.concatenate(pieces)
        kept = loaded = 0
        if new_seq.size > prefix:
            plan = ctx.make_plan(new_seq)
            cache = OPTCache(plan, ctx.pool_page, wait_timeout=ctx.wait_timeout, staging_slots=ctx.staging_slots,
                             spare_pages=spare_pages(plan, ctx.spare_window, ctx.spare_pages))
            cache.storage = old.storage
            old.stop_prefetch()
            old.hand_over(cache, stop, prefix)
            kept, loaded = self._keep(old, cache, stop, dict(zip(held.tolist(), reads.tolist())))
            cache._earlier["kept"] = cache._earlier.get("kept", 0) + kept
            cache._earlier["kept_loaded"] = cache._earlier.get("kept_loaded", 0) + loaded
            if ctx.prefetch is not None:
                ds, opts = ctx.prefetch
                cache.configure_prefetch(ds, **opts)
            self.cache = cache
            pos.cache = cache
            pos.pool = (cache.name, plan.accesses)
            self.dataset.retarget(cache.name, plan.accesses)
            old.close()
        for i, e in enumerate(range(first_epoch, len(full_lengths))):
            pos.starts[e], pos.batches[e], pos.floors[e], pos.tails[e] = starts[i], lengths[i], floors[i], tails[i]
        ctx.cut = cut
        self.replans.append((first_epoch, cut))
        if not ctx.said:  # once per loader: the main process plans, so never once per worker
            ctx.said = True
            expect = "whole epochs" if cut is None else f"epochs cut after {cut} batches"
            warnings.warn(f"opt4torch: {how}, so the cache planned epochs {first_epoch}-{len(full_lengths) - 1} "
                          f"again for {expect}, keeping the {kept + loaded} items of the pool that the new plan "
                          "reads (said once; loader.replans lists every re-plan)", RuntimeWarning, stacklevel=4)

    def _keep(self, old: OPTCache, new: OPTCache, stop: int, read_at: dict[int, int]) -> tuple[int, int]:
        """Warm ``new`` with the items its plan keeps from the prefix, from
        ``old`` (pool/keep.py); one the old pool no longer holds is loaded
        from the dataset. Returns how many were copied, and how many loaded."""
        ds: PlannedDataset = self.dataset
        return keep_from(old, new, stop, read_at, lambda item: encode(ds.dataset[item], ds.allow_pickle))
