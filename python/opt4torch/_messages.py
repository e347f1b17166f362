"""Clear errors for bad input that the engine or torch would report in their
own terms: what was wrong, and what to do. Kept apart from loader/worker.py so that
the hot path there only calls in here once something has already failed.

May touch: nothing: it builds exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def bad_positions(positions: Sequence[Any], accesses: int) -> IndexError:
    """The error for a batch holding a position outside the plan."""
    bad = next((t for t in positions if not 0 <= int(t) < accesses), None)
    return IndexError(
        f"position {bad} is outside this cache's plan, which has positions 0 to {accesses - 1}: "
        "a PlannedDataset is indexed by positions from its loader's PositionBatchSampler (the "
        "t-th access of the run), not by dataset indices; read the wrapped dataset (.dataset) "
        "for anything else"
    )


def is_pickling_error(exc: BaseException) -> bool:
    return "pickl" in str(exc).lower() or type(exc).__name__ == "PicklingError"


def unpicklable_dataset(exc: BaseException, context: Any) -> TypeError:
    """The error for a dataset that spawn or forkserver workers cannot receive."""
    method = getattr(context, "_name", None) or getattr(context, "get_start_method", lambda: None)() or str(context)
    return TypeError(
        f"the dataset (or its transform) cannot be pickled: {exc}. Workers started with "
        f"{method!r} receive it pickled. Make it picklable (open files, locks, lambdas and "
        "connections in the worker instead: lazily in __getitem__ or in worker_init_fn), or use "
        "multiprocessing_context='fork' (Linux), or num_workers=0"
    )
