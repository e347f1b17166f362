"""Traces: access sequences on disk and seeded generators of them.

On disk a trace is either a text file with one id per line (blank lines and
``#`` comments allowed) or a ``.npy`` file holding a 1-D integer array. Both
load into an int64 numpy array. :func:`save_oracle_general` also exports a
trace in libCacheSim's binary oracleGeneral format, to replay it there.

The generators model the access patterns of training loops. Each returns an
int64 array of ids in ``[0, items)`` and is a pure function of its arguments
(numpy's PCG64 seeded with ``seed``): the same call gives the same trace on
every machine. A real sampler is captured with :func:`captured`.

=========================  =============================================  =========
generator                  what it models                                 length
=========================  =============================================  =========
``uniform``                RandomSampler(replacement=True)                accesses
``epoch_shuffle``          RandomSampler(): a new permutation per epoch   epochs
``zipf``                   skewed popularity, P(rank r) ~ r^-alpha        accesses
``markov``                 sequential runs (id + 1) with random jumps     accesses
``weighted``               WeightedRandomSampler rebalancing classes      accesses
``repeated_augmentation``  each index k times per epoch (RepeatAug)       epochs
``distributed``            DistributedSampler: rank r of w                epochs
=========================  =============================================  =========
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._engine import InvalidInputError

__all__ = [
    "GENERATORS",
    "Pattern",
    "captured",
    "distributed",
    "epoch_shuffle",
    "generate",
    "load_trace",
    "markov",
    "repeated_augmentation",
    "save_oracle_general",
    "save_trace",
    "uniform",
    "weighted",
    "zipf",
]


def load_trace(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a trace: ``.npy`` (a 1-D integer array) or text, one id per line."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no trace file at {path!r}")
    if path.endswith(".npy"):
        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise InvalidInputError(f"{path}: not a readable .npy array ({exc})") from None
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise InvalidInputError(
                f"{path}: a trace must be a 1-D integer array, got shape {arr.shape} "
                f"and dtype {arr.dtype}"
            )
        return arr.astype(np.int64, copy=False)
    try:
        arr = np.loadtxt(path, dtype=np.int64, comments="#", ndmin=1)
    except ValueError as exc:
        raise InvalidInputError(
            f"{path}: a text trace holds one integer id per line ({exc})"
        ) from None
    if arr.ndim != 1:
        raise InvalidInputError(f"{path}: one id per line, got {arr.shape[1]} columns")
    return arr


def save_trace(path: str | os.PathLike[str], seq: Any) -> None:
    """Write a trace: ``.npy`` by extension, else text with one id per line."""
    arr = np.asarray(seq, dtype=np.int64)
    path = os.fspath(path)
    if path.endswith(".npy"):
        np.save(path, arr, allow_pickle=False)
    else:
        np.savetxt(path, arr, fmt="%d")


def save_oracle_general(path: str | os.PathLike[str], seq: Any) -> None:
    """Write a trace in libCacheSim's oracleGeneral binary format, so that
    libCacheSim (and its PyPI package) can replay it, Belady included.

    Each request is 24 packed little-endian bytes: ``u4`` time (1, 2, ...),
    ``u8`` object id (our id + 1, as libCacheSim's own traces count from 1),
    ``u4`` size (1) and ``i8`` the time of the id's next request (-1: never).
    """
    seq = np.asarray(seq, dtype=np.int64)
    if seq.ndim != 1:
        raise InvalidInputError(f"a trace is one-dimensional, got shape {seq.shape}")
    if seq.size and int(seq.min()) < 0:
        raise InvalidInputError("trace ids must be non-negative")
    if seq.size >= 2**32:
        raise InvalidInputError("oracleGeneral holds at most 2**32 - 1 requests (its times are 32-bit)")
    T = seq.size
    order = np.argsort(seq, kind="stable")
    s = seq[order]
    same = np.r_[s[1:] == s[:-1], False]
    nxt = np.full(T, -1, np.int64)
    nxt[order] = np.where(same, np.r_[order[1:], 0] + 1, -1)
    rec = np.zeros(T, dtype=np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")]))
    rec["t"] = np.arange(T) + 1
    rec["id"] = seq + 1
    rec["size"] = 1
    rec["next"] = nxt
    rec.tofile(os.fspath(path))


def _check(name: str, value: int, low: int = 1) -> int:
    value = int(value)
    if value < low:
        raise InvalidInputError(f"{name} must be at least {low}, got {value}")
    return value


def uniform(items: int, accesses: int, seed: int = 0) -> np.ndarray:
    """Independent uniform draws with replacement (RandomSampler(replacement=True))."""
    items, accesses = _check("items", items), _check("accesses", accesses, 0)
    return np.random.default_rng(seed).integers(0, items, size=accesses, dtype=np.int64)


def epoch_shuffle(items: int, epochs: int, seed: int = 0) -> np.ndarray:
    """A fresh permutation of all items per epoch (RandomSampler, shuffle=True)."""
    items, epochs = _check("items", items), _check("epochs", epochs)
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(items) for _ in range(epochs)]).astype(np.int64)


def zipf(items: int, accesses: int, alpha: float = 1.0, seed: int = 0) -> np.ndarray:
    """Independent draws where the item of popularity rank r (1-based) has
    probability proportional to r ** -alpha (a Zipf law bounded to ``items``;
    alpha = 0 is uniform). Ranks are mapped to ids by a seeded permutation, so
    the popular ids are spread over the id range."""
    items, accesses = _check("items", items), _check("accesses", accesses, 0)
    alpha = float(alpha)
    if not alpha >= 0.0 or math.isinf(alpha):
        raise InvalidInputError(f"alpha must be a finite number >= 0, got {alpha}")
    rng = np.random.default_rng(seed)
    weights = np.arange(1, items + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(accesses), side="right")
    np.minimum(ranks, items - 1, out=ranks)  # guards the last float rounding
    return rng.permutation(items).astype(np.int64)[ranks]


def markov(items: int, accesses: int, jump: float = 0.01, seed: int = 0) -> np.ndarray:
    """A Markov chain over ids: from id x the next access is x + 1 (mod
    items) with probability 1 - jump, else a uniform random id (a jump). The
    first access is uniform. Sequential runs have mean length 1 / jump, as in
    a reader that streams shards and seeks now and then."""
    items, accesses = _check("items", items), _check("accesses", accesses, 0)
    jump = float(jump)
    if not 0.0 <= jump <= 1.0:
        raise InvalidInputError(f"jump must be a probability in [0, 1], got {jump}")
    rng = np.random.default_rng(seed)
    if accesses == 0:
        return np.zeros(0, dtype=np.int64)
    starts_mask = rng.random(accesses) < jump
    starts_mask[0] = True
    starts = np.flatnonzero(starts_mask)
    first_ids = rng.integers(0, items, size=starts.size, dtype=np.int64)
    run = np.cumsum(starts_mask) - 1  # which run each position is in
    offset = np.arange(accesses, dtype=np.int64) - starts[run]
    return (first_ids[run] + offset) % items


def class_sizes(items: int, classes: int, imbalance: float) -> np.ndarray:
    """Class sizes with an exponential profile (Cao et al., LDAM, NeurIPS
    2019): class c has about n_max * imbalance ** (-c / (classes - 1)) items,
    scaled so that the sizes sum to ``items``; the largest holds
    ``imbalance`` times as many as the smallest, up to rounding. Every class
    holds at least one item."""
    items, classes = _check("items", items), _check("classes", classes)
    if classes > items:
        raise InvalidInputError(f"{classes} classes cannot share {items} items")
    imbalance = float(imbalance)
    if not imbalance >= 1.0 or math.isinf(imbalance):
        raise InvalidInputError(f"imbalance must be a finite number >= 1, got {imbalance}")
    if classes == 1:
        return np.array([items], dtype=np.int64)
    shape = imbalance ** (-np.arange(classes) / (classes - 1))
    sizes = np.maximum(1, np.floor(shape / shape.sum() * items)).astype(np.int64)
    sizes[0] += items - sizes.sum()  # the rounding remainder goes to the largest
    if sizes[0] < 1:
        raise InvalidInputError(f"{items} items are too few for {classes} classes at imbalance {imbalance}")
    return sizes


def weighted(items: int, accesses: int, imbalance: float = 10.0, classes: int = 10,
             seed: int = 0) -> np.ndarray:
    """WeightedRandomSampler as used to rebalance an imbalanced dataset: the
    items fall into ``classes`` classes of sizes :func:`class_sizes` (ids
    0.. in class order), each item has weight 1 / (size of its class), and
    ``accesses`` draws are made with replacement. Every class is then drawn
    equally often, so an item of a small class is drawn ``imbalance`` times
    as often as one of the largest."""
    items, accesses = _check("items", items), _check("accesses", accesses, 0)
    sizes = class_sizes(items, classes, imbalance)
    w = np.repeat(1.0 / sizes, sizes)
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    rng = np.random.default_rng(seed)
    ids = np.searchsorted(cdf, rng.random(accesses), side="right")
    return np.minimum(ids, items - 1).astype(np.int64)


def repeated_augmentation(items: int, epochs: int, repeats: int = 3, seed: int = 0,
                          spread: bool = True) -> np.ndarray:
    """Repeated augmentation (Hoffer et al. 2020; DeiT's RepeatAugSampler):
    every index appears exactly ``repeats`` times per epoch, so an epoch is
    ``items * repeats`` accesses. With ``spread`` (the default) the copies
    sit at random positions of the epoch, as when the repeats of a batch are
    split across ranks and merged; without it, the copies are adjacent, as
    timm's RepeatAugSampler yields them to a single process."""
    items, epochs = _check("items", items), _check("epochs", epochs)
    repeats = _check("repeats", repeats)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(epochs):
        if spread:
            out.append(rng.permutation(np.repeat(np.arange(items, dtype=np.int64), repeats)))
        else:
            out.append(np.repeat(rng.permutation(items).astype(np.int64), repeats))
    return np.concatenate(out)


def distributed(items: int, epochs: int, world: int = 2, rank: int = 0, seed: int = 0,
                shuffle: bool = True, drop_last: bool = False) -> np.ndarray:
    """The shard that DistributedSampler gives rank ``rank`` of ``world``:
    per epoch a permutation of the items (or 0..items-1 without shuffle) is
    padded by repeating its start to a multiple of ``world`` (or, with
    ``drop_last``, cut to one), and the rank takes every ``world``-th index
    from position ``rank``. This is torch's rule, applied to numpy's
    permutations; capture a real DistributedSampler for torch's own order."""
    items, epochs, world = _check("items", items), _check("epochs", epochs), _check("world", world)
    rank = int(rank)
    if not 0 <= rank < world:
        raise InvalidInputError(f"rank must be in [0, {world}), got {rank}")
    if drop_last and items < world:
        raise InvalidInputError(f"drop_last with {items} items leaves nothing for {world} ranks")
    if drop_last and items % world != 0:
        per_rank = math.ceil((items - world) / world)
    else:
        per_rank = math.ceil(items / world)
    total = per_rank * world
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(epochs):
        order = rng.permutation(items) if shuffle else np.arange(items)
        if total > items:
            order = np.resize(order, total)  # repeats the start, as torch pads
        out.append(order[rank:total:world])
    return np.concatenate(out).astype(np.int64)


def captured(sampler: Any, epochs: int = 1, progress: bool | None = None) -> np.ndarray:
    """Any sampler, run for ``epochs`` epochs (``set_epoch`` before each):
    :func:`opt4torch.capture` under the generators' name."""
    from ..planning.capture import capture

    return capture(sampler, epochs, progress=progress)


# ---- the generators by name, for sweeps and the command line ----


@dataclass(frozen=True)
class Pattern:
    """A generator as the command line sees it: its length is in accesses or
    in epochs, and ``params`` are its tunable keyword arguments with their
    defaults (the ones a sweep may vary)."""

    name: str
    fn: Callable[..., np.ndarray]
    length: str  # "accesses" or "epochs"
    params: dict[str, float | int | bool] = field(default_factory=dict)
    summary: str = ""


GENERATORS: dict[str, Pattern] = {
    p.name: p
    for p in (
        Pattern("uniform", uniform, "accesses", {}, "independent uniform draws"),
        Pattern("epoch_shuffle", epoch_shuffle, "epochs", {}, "a new permutation per epoch"),
        Pattern("zipf", zipf, "accesses", {"alpha": 1.0}, "Zipf(alpha) popularity"),
        Pattern("markov", markov, "accesses", {"jump": 0.01}, "sequential runs with random jumps"),
        Pattern("weighted", weighted, "accesses", {"imbalance": 10.0, "classes": 10},
                "WeightedRandomSampler over imbalanced classes"),
        Pattern("repeated_augmentation", repeated_augmentation, "epochs", {"repeats": 3, "spread": True},
                "each index k times per epoch"),
        Pattern("distributed", distributed, "epochs", {"world": 2, "rank": 0, "shuffle": True,
                                                      "drop_last": False},
                "DistributedSampler shard of one rank"),
    )
}


def generate(pattern: str, items: int, *, epochs: int = 1, accesses: int | None = None, seed: int = 0,
             **params: Any) -> np.ndarray:
    """A trace of the named generator. Access-based generators draw
    ``accesses`` ids (default: ``epochs * items``, the length of ``epochs``
    passes over the data); epoch-based ones run ``epochs`` epochs. ``params``
    override the generator's own (see :data:`GENERATORS`)."""
    try:
        pat = GENERATORS[pattern]
    except KeyError:
        raise InvalidInputError(f"unknown pattern {pattern!r}; known: {', '.join(GENERATORS)}") from None
    unknown = set(params) - set(pat.params)
    if unknown:
        raise InvalidInputError(
            f"pattern {pattern} has no parameter {', '.join(sorted(unknown))}; "
            f"its parameters: {', '.join(pat.params) or 'none'}"
        )
    kwargs = {**pat.params, **params}
    if pat.length == "accesses":
        length = accesses if accesses is not None else epochs * items
        return pat.fn(items, length, seed=seed, **kwargs)
    return pat.fn(items, epochs, seed=seed, **kwargs)
