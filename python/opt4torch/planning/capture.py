"""Capturing a sampler: run it for all epochs into one int64 array.

The order a seeded sampler gives is fixed in advance; capturing it is what
makes the future known. Common samplers are captured with vectorised torch
calls that reproduce their ``__iter__`` exactly (about 10x faster than
iterating); anything else is iterated in chunks. Each fast path is checked at
run time against the first indices the real sampler yields, and falls back to
plain iteration if they differ, so a change in torch can cost speed but never
correctness.

Capturing never disturbs the sampler: its generator state, the global torch
RNG (used by an unseeded RandomSampler) and its epoch are restored afterwards.

May touch: the sampler it is given (run for every epoch, its RNG states and
set_epoch restored); nothing else.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import operator
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from .._progress import progress_bar

__all__ = ["capture", "capture_epochs", "capture_ranks", "CaptureWarning"]

# Indices compared with the real sampler before a fast path is trusted.
_CHECK = 64
# Chunk size for iterating a sampler that has no fast path.
_CHUNK = 1 << 16


class CaptureWarning(UserWarning):
    """A capture that works but cannot be trusted to match training."""


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised without torch only
        raise ImportError(
            "capturing a sampler needs PyTorch: pip install 'opt4torchdataset[torch]'"
        ) from exc
    return torch


@contextlib.contextmanager
def preserved(sampler: Any) -> Iterator[None]:
    """Restore the sampler's generator, the global torch RNG and its epoch."""
    torch = _torch()
    gen = getattr(sampler, "generator", None)
    gen_state = gen.get_state() if isinstance(gen, torch.Generator) else None
    global_state = torch.get_rng_state()
    had_epoch = hasattr(sampler, "epoch")
    epoch = getattr(sampler, "epoch", None)
    try:
        yield
    finally:
        if gen is not None and gen_state is not None:
            gen.set_state(gen_state)
        torch.set_rng_state(global_state)
        if had_epoch:
            sampler.epoch = epoch


def as_index(value: Any) -> int:
    """An index the sampler yielded, as an int; a float (2.7) or anything
    else that is not an integer is refused, never truncated."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()  # a 0-d tensor or array
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"the sampler yielded {value!r} ({type(value).__name__}), not an integer index: "
                         "a sampler must yield integer indices into the dataset") from None


def _flatten(batches: Iterable[Any]) -> Iterator[int]:
    for item in batches:
        if isinstance(item, (list, tuple)):
            yield from (as_index(i) for i in item)
        elif hasattr(item, "tolist") and getattr(item, "ndim", 0) > 0:
            yield from (as_index(i) for i in item.tolist())
        else:
            yield as_index(item)


def _iterate(sampler: Any, bar: Any) -> np.ndarray:
    """Plain iteration in chunks (any sampler, batch samplers flattened)."""
    parts = []
    it = _flatten(iter(sampler))
    while True:
        chunk = np.fromiter(itertools.islice(it, _CHUNK), dtype=np.int64)
        if chunk.size == 0:
            break
        parts.append(chunk)
        bar.update(chunk.size)
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


# ---- fast paths: each returns one epoch, consuming RNG exactly as __iter__ ----


def _random_sampler(sampler: Any) -> np.ndarray:
    torch = _torch()
    n = len(sampler.data_source)
    gen = sampler.generator
    if gen is None:  # what RandomSampler.__iter__ does without a generator
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        gen = torch.Generator()
        gen.manual_seed(seed)
    total = sampler.num_samples
    if sampler.replacement:
        # __iter__ draws 32 at a time, then the remainder; for the CPU
        # generator that is the same stream as one draw of the total.
        return np.asarray(torch.randint(high=n, size=(total,), dtype=torch.int64, generator=gen).numpy())
    parts = [torch.randperm(n, generator=gen) for _ in range(total // n)]
    parts.append(torch.randperm(n, generator=gen)[: total % n])  # always drawn
    return np.asarray(torch.cat(parts).numpy())


def _sequential_sampler(sampler: Any) -> np.ndarray:
    return np.arange(len(sampler.data_source), dtype=np.int64)


def _weighted_sampler(sampler: Any) -> np.ndarray:
    torch = _torch()
    return np.asarray(torch.multinomial(
        sampler.weights, sampler.num_samples, sampler.replacement, generator=sampler.generator
    ).numpy(), dtype=np.int64)


def _distributed_sampler(sampler: Any) -> np.ndarray:
    total = sampler.total_size
    return np.asarray(_distributed_order(sampler)[sampler.rank : total : sampler.num_replicas].numpy(),
                      dtype=np.int64)


def _distributed_order(sampler: Any) -> Any:
    """The epoch's order over every rank, padded or cut to ``total_size``, as
    DistributedSampler.__iter__ makes it before it takes its rank's share."""
    torch = _torch()
    n = len(sampler.dataset)
    if sampler.shuffle:
        g = torch.Generator()
        g.manual_seed(sampler.seed + sampler.epoch)
        indices = torch.randperm(n, generator=g)
    else:
        indices = torch.arange(n)
    total = sampler.total_size
    if not sampler.drop_last:
        pad = total - n
        if pad > 0:
            reps = math.ceil(pad / n) if pad > n else 1
            indices = torch.cat([indices, indices.repeat(reps)[:pad]])
    else:
        indices = indices[:total]
    return indices


def _fast_path(sampler: Any) -> Any:
    """The vectorised capture for this exact sampler class, or None. Only exact
    classes qualify: a subclass may override __iter__."""
    try:
        import torch.utils.data as tud
        from torch.utils.data.distributed import DistributedSampler
    except ImportError:  # pragma: no cover
        return None
    table = {
        tud.RandomSampler: _random_sampler,
        tud.SequentialSampler: _sequential_sampler,
        tud.WeightedRandomSampler: _weighted_sampler,
        DistributedSampler: _distributed_sampler,
    }
    return table.get(type(sampler))


def _fast_path_agrees(sampler: Any, fast: Any, epoch: int | None) -> bool:
    """Compare the fast path's first indices with the real sampler's, from the
    same RNG state, leaving every state as it was."""
    with preserved(sampler):
        if epoch is not None:
            sampler.set_epoch(epoch)
        expect = np.fromiter(itertools.islice(_flatten(iter(sampler)), _CHECK), dtype=np.int64)
    with preserved(sampler):
        if epoch is not None:
            sampler.set_epoch(epoch)
        got = fast(sampler)[:_CHECK]
    return bool(np.array_equal(expect, got))


def capture(
    sampler: Any,
    epochs: int = 1,
    *,
    start_epoch: int = 0,
    progress: bool | None = None,
    fast: bool = True,
) -> np.ndarray:
    """Run ``sampler`` for ``epochs`` epochs and return every index, in order.

    ``sampler`` is any iterable of indices: a torch ``Sampler``
    (``RandomSampler`` with or without replacement, ``WeightedRandomSampler``,
    ``DistributedSampler``, a ``BatchSampler``, your own) or a plain list.
    Samplers with ``set_epoch`` get ``set_epoch(start_epoch + e)`` before epoch
    ``e``, as a training loop would call it. Returns an int64 array.

    The sampler's state is left as it was: capturing then training sees the
    same order that was captured, provided the sampler is seeded. An unseeded
    ``RandomSampler`` draws its seed from the global torch RNG each epoch;
    that is captured faithfully too, with a :class:`CaptureWarning`, because a
    training loop that iterates it later will not see the same order unless
    the global RNG is in the same state (opt4torch's own DataLoader replays the
    captured order, so it is unaffected).
    """
    parts = capture_epochs(sampler, epochs, start_epoch=start_epoch, progress=progress, fast=fast)
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def capture_epochs(
    sampler: Any,
    epochs: int = 1,
    *,
    start_epoch: int = 0,
    progress: bool | None = None,
    fast: bool = True,
) -> list[np.ndarray]:
    """:func:`capture`, one int64 array per epoch."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    has_epoch = callable(getattr(sampler, "set_epoch", None))
    if getattr(sampler, "generator", "absent") is None and type(sampler).__name__ == "RandomSampler":
        warnings.warn(
            "the RandomSampler has no generator: its order depends on the global torch RNG "
            "at iteration time; pass generator=torch.Generator().manual_seed(SEED) so that "
            "training replays the captured order",
            CaptureWarning,
            stacklevel=2,
        )
    fast_fn = _fast_path(sampler) if fast else None
    if fast_fn is not None and not _fast_path_agrees(
        sampler, fast_fn, start_epoch if has_epoch else None
    ):
        warnings.warn(
            f"the vectorised capture of {type(sampler).__name__} disagrees with iterating it "
            "(a different torch version?); capturing by iteration instead",
            CaptureWarning,
            stacklevel=2,
        )
        fast_fn = None
    try:
        per_epoch = len(sampler)
        total: int | None = per_epoch * epochs
        if hasattr(sampler, "batch_size") and hasattr(sampler, "sampler"):
            total = None  # a batch sampler: len() counts batches
    except TypeError:
        total = None

    parts = []
    with preserved(sampler), progress_bar(total=total, desc="capturing sampler", unit="idx", show=progress) as bar:
        for e in range(epochs):
            if has_epoch:
                sampler.set_epoch(start_epoch + e)
            if fast_fn is not None:
                chunk = np.ascontiguousarray(fast_fn(sampler), dtype=np.int64)
                bar.update(chunk.size)
            else:
                chunk = _iterate(sampler, bar)
            parts.append(chunk)
    return parts


def capture_ranks(
    sampler: Any,
    epochs: int = 1,
    *,
    start_epoch: int = 0,
    progress: bool | None = None,
    fast: bool = True,
) -> list[list[np.ndarray]]:
    """:func:`capture_epochs` for every rank of a distributed sampler: one
    list of per-epoch int64 arrays per rank, ``0 .. num_replicas - 1``.

    ``sampler`` is any sampler with ``num_replicas`` and ``rank`` (a
    ``DistributedSampler``): each rank's order is captured from a shallow copy
    with its ``rank`` set, so the sampler itself is left as it was. Given the
    seed and the world size, every process computes the same orders, which
    is what a cluster plan (:func:`opt4torch.cluster_plan`) is made from.
    A sampler with ``opt4_capture_ranks(epochs, start_epoch=, progress=,
    fast=)`` captures itself (a resumed run's sampler, whose later epochs
    are a DistributedSampler's and take its shared path).
    """
    world = getattr(sampler, "num_replicas", None)
    if isinstance(world, bool) or not isinstance(world, int) or world < 1 or not hasattr(sampler, "rank"):
        raise ValueError(f"capture_ranks needs a distributed sampler (with num_replicas and rank), "
                         f"got {type(sampler).__name__}")
    own = getattr(sampler, "opt4_capture_ranks", None)
    if callable(own):
        ranks: list[list[np.ndarray]] = own(epochs, start_epoch=start_epoch, progress=progress, fast=fast)
        return ranks
    if fast and _fast_path(sampler) is _distributed_sampler:
        shared = _ranks_of_one_order(sampler, world, epochs, start_epoch, progress)
        if shared is not None:
            return shared
    out = []
    for r in range(world):
        twin = copy.copy(sampler)
        twin.rank = r
        out.append(capture_epochs(twin, epochs, start_epoch=start_epoch, progress=progress, fast=fast))
    return out


def _ranks_of_one_order(sampler: Any, world: int, epochs: int, start_epoch: int,
                        progress: bool | None) -> list[list[np.ndarray]] | None:
    """Every rank's epochs of a torch DistributedSampler from one order an
    epoch: the ranks' shares are slices of the same padded permutation, so
    it is drawn once, not once a rank (512 ranks: 512x fewer ``randperm``
    calls). Checked against iterating the first and the last rank, as every
    fast path is; None (capture rank by rank) if either disagrees."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    twin = copy.copy(sampler)
    for r in {0, world - 1}:
        twin.rank = r
        if not _fast_path_agrees(twin, _distributed_sampler, start_epoch):
            return None
    out: list[list[np.ndarray]] = [[] for _ in range(world)]
    total = twin.total_size
    with progress_bar(total=total * epochs, desc="capturing sampler", unit="idx", show=progress) as bar:
        for e in range(epochs):
            twin.set_epoch(start_epoch + e)
            order = np.asarray(_distributed_order(twin).numpy(), dtype=np.int64)
            for r in range(world):
                out[r].append(np.ascontiguousarray(order[r:total:world]))
            bar.update(total)
    return out
