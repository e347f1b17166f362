"""The global timeline of data-parallel training: every rank's batches
interleaved, epoch by epoch, step by step, rank 0's batch first (the order
cluster plans and ``share_across_ranks`` both read), and a resumed
cluster's warm prefix before it. May touch: nothing but the arrays it is
given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .._engine import InvalidInputError

__all__ = ["Timeline", "global_timeline", "interleave", "with_warm_prefix"]

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


def with_warm_prefix(timeline: Timeline, warm: Sequence[Any], node_of: np.ndarray, n_nodes: int,
                      shift: int) -> tuple[Timeline, int]:
    """``timeline`` after a warm prefix (``cluster_plan``'s ``warm``: what
    each node's pool holds at the start, a resumed run's):
    node n's items read by its first rank at step 0, the timeline's steps
    ``shift`` later (a window of their own). Returns it and the prefix's
    length."""
    if isinstance(warm, (str, bytes)) or len(warm) != n_nodes:
        raise InvalidInputError(f"warm needs one array of item ids per node ({n_nodes}), got "
                                f"{len(warm) if hasattr(warm, '__len__') else type(warm).__name__}")
    parts, ranks, seen = [], [], np.empty(0, np.int64)
    for n, held in enumerate(warm):
        a = np.asarray(held)
        if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)) or (a.size and int(a.min()) < 0):
            raise InvalidInputError(f"warm[{n}] must be a 1-D array of item ids, got {held!r:.80}")
        a = a.astype(np.int64)
        a = a[~np.isin(a, seen)]  # another node named it first
        a = a[np.sort(np.unique(a, return_index=True)[1])]
        if a.size == 0:
            continue
        on_n = np.flatnonzero(node_of == n)
        if on_n.size == 0:
            raise InvalidInputError(f"warm[{n}] names {a.size} items, but no rank is on node {n}")
        parts.append(a)
        ranks.append(np.full(a.size, int(on_n[0]), dtype=np.int32))
        seen = np.concatenate([seen, a])
    if not parts:
        return timeline, 0
    pre = np.concatenate(parts)
    return Timeline(np.concatenate([pre, timeline.seq]), np.concatenate([*ranks, timeline.rank]),
                    np.concatenate([np.zeros(pre.size, np.int64), timeline.step + shift])), int(pre.size)
