"""The DataLoader's arguments: refused up front with the argument named,
rather than as a raw error (or a silent coercion) from the middle of
planning, and then carried as one frozen :class:`Options`. Pure checks:
they touch nothing but the arguments (and ``len(dataset)`` for the cost
of a plan).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
import torch.utils.data as tud

from .. import _engine
from ..planning.sizing import PREFETCH_MAX_THREADS, check_plan_cost, parse_bytes
from ..sources.base import prefetch_by_default

__all__ = ["Options", "check_arguments", "check_options", "is_int", "refuse_one_shot"]


@dataclass(frozen=True)
class Options:
    """A DataLoader's arguments that decide its plan and pool, checked."""

    batch_size: int | None
    shuffle: bool | None
    sampler: Any
    batch_sampler: Any
    num_workers: int
    drop_last: bool
    generator: Any
    prefetch_factor: int | None
    epochs: int
    cache_bytes: int | str | None
    cache_items: int | None
    seed: int | None
    item_bytes: Any
    allow_pickle: bool
    bypass: bool
    wait_timeout: float
    progress: bool | None
    share_across_ranks: bool
    page_size: int | None
    prefetch: bool
    prefetch_threads: int
    prefetch_max_threads: int
    lookahead: int
    staging_slots: int | None
    spare_pages: int | None
    cluster_window: int
    cluster_timeout: float
    cluster_alone: bool | None

    @property
    def batched(self) -> bool:
        return self.batch_size is not None or self.batch_sampler is not None

    @property
    def prefetch_opts(self) -> dict[str, Any]:
        """OPTCache.configure_prefetch's keywords."""
        return dict(threads=int(self.prefetch_threads), max_threads=int(self.prefetch_max_threads),
                    lookahead=int(self.lookahead), allow_pickle=self.allow_pickle)


def check_options(dataset: Any, **given: Any) -> Options:
    """The loader's arguments checked, with the defaults that depend on the
    dataset chosen (``prefetch``, ``prefetch_max_threads``)."""
    if isinstance(dataset, tud.IterableDataset):
        raise TypeError("the OPT cache needs a map-style dataset (with __getitem__ and __len__): "
                        "an IterableDataset has no indices to plan over")
    if (given["cache_bytes"] is None) == (given["cache_items"] is None):
        raise ValueError("give the cache size as cache_bytes= (e.g. '8GiB') or cache_items=, "
                         "not both and not neither")
    epochs = given["epochs"]
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    seed = given["seed"]
    if seed is not None and not is_int(seed):
        raise ValueError(f"seed must be an integer (or None to draw one), got {seed!r} ({type(seed).__name__})")
    check_arguments(given["batch_size"], given["cache_bytes"], given["cache_items"], given["wait_timeout"],
                    given["lookahead"])
    if given["prefetch"] is None:  # on for a Source (the engine reads it, or an object store); opt-in otherwise
        given["prefetch"] = prefetch_by_default(dataset)
    check_prefetch(given)
    staging = given["staging_slots"]
    if staging is not None and (isinstance(staging, bool) or not 0 <= int(staging) <= 1 << 20):
        raise ValueError(f"staging_slots must be between 0 and 1048576, got {staging!r}")
    # Planned in bytes when sizes per item come (given, or the dataset's
    # opt4_item_bytes) and the cache is in bytes.
    per_item = given["item_bytes"] if given["item_bytes"] is not None else getattr(dataset, "opt4_item_bytes", None)
    sized = given["cache_items"] is None and per_item is not None and not isinstance(per_item, (int, np.integer))
    sampler = given["sampler"]
    check_plan_cost(dataset if sampler is None else sampler, given["batch_sampler"], epochs, len(dataset), sized)
    return Options(**given)


def check_prefetch(given: dict[str, Any]) -> None:
    """The prefetch depth's arguments (checked only with prefetch on);
    fills in ``prefetch_max_threads``."""
    prefetch, threads, most = given["prefetch"], given["prefetch_threads"], given["prefetch_max_threads"]
    limit = _engine.MAX_PREFETCH_THREADS
    if prefetch and (not is_int(threads) or not 1 <= int(threads) <= limit):
        raise ValueError(f"prefetch_threads must be between 1 and {limit}, got {threads!r}")
    if most is None:
        most = given["prefetch_max_threads"] = max(int(threads), PREFETCH_MAX_THREADS)
    if prefetch and (not is_int(most) or not int(threads) <= int(most) <= limit):
        raise ValueError(f"prefetch_max_threads must be between prefetch_threads ({threads}) and {limit}, "
                         f"got {most!r}")
    lookahead = given["lookahead"]
    if prefetch and (isinstance(lookahead, bool) or int(lookahead) < 1):
        raise ValueError(f"lookahead must be a positive number of positions, got {lookahead!r}")

#: The largest position count the engine takes (an unsigned 64-bit word, kept
#: clear of its top bit).
_MAX_POSITIONS = (1 << 63) - 1


def is_int(value: Any) -> TypeGuard[int | np.integer[Any]]:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_arguments(batch_size: Any, cache_bytes: Any, cache_items: Any, wait_timeout: Any,
                     lookahead: Any) -> None:
    """Refuse odd arguments up front, naming the argument, rather than let a
    raw error (or a silent coercion) come out of the middle of planning."""
    if batch_size is not None and (not is_int(batch_size) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive integer (or None for unbatched samples), "
                         f"got {batch_size!r}")
    if cache_items is not None and not is_int(cache_items):
        raise ValueError(f"cache_items must be an integer number of items, got {cache_items!r} "
                         f"({type(cache_items).__name__}); give cache_bytes= for a size in bytes")
    if cache_bytes is not None:
        try:
            parse_bytes(cache_bytes)
        except ValueError as exc:
            raise ValueError(f"cache_bytes: {exc}") from None
    # The engine counts it in whole milliseconds (0 would mean its default),
    # then in 64-bit nanoseconds (which 1e9 s keeps clear of overflow).
    if (isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float, np.integer, np.floating))
            or not 0.001 <= wait_timeout <= 1e9):
        raise ValueError(f"wait_timeout must be a number of seconds from 0.001 to 1e9, got {wait_timeout!r}")
    if not is_int(lookahead) or not 1 <= lookahead <= _MAX_POSITIONS:
        raise ValueError(f"lookahead must be a positive integer number of positions up to 2**63 - 1, "
                         f"got {lookahead!r}")


def refuse_one_shot(sampler: Any, argument: str) -> None:
    """A sampler is iterated once per epoch, at capture: an iterator (a
    generator) is used up by the first and would leave every later epoch,
    and the loader's length, empty."""
    if isinstance(sampler, Iterator):
        raise TypeError(
            f"{argument}={type(sampler).__name__!r} is a one-shot iterator: it cannot be replayed for "
            f"each epoch. Pass something iterable again and again: a list of indices, or a "
            f"torch.utils.data.Sampler whose __iter__ returns a fresh iterator")
