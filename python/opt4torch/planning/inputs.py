"""What a plan is built from, checked: a sequence of item ids (any array,
tensor or iterable of ints) made into one contiguous integer array, the
number of items, a capacity in items; and the sequence's fingerprint, which
plans record.

May touch: the sequence it is given (read, converted), the binding's
fingerprint; nothing else.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _engine
from .._engine import InvalidInputError

__all__ = ["as_sequence", "check_capacity", "fingerprint"]


def as_sequence(seq: Any, items: int | None = None) -> tuple[np.ndarray, int]:
    """Turn ``seq`` into a 1-D integer numpy array and the number of items.

    Accepts numpy arrays, torch tensors, lists and any iterable of ints.
    ``items`` defaults to ``max(seq) + 1``. Raises :class:`InvalidInputError`
    naming the first bad position for negative or out-of-range ids.
    """
    arr = np.asarray(seq)
    if arr.dtype == object or arr.ndim != 1:
        arr = np.asarray(list(seq) if arr.ndim == 0 else seq, dtype=np.int64)
        if arr.ndim != 1:
            raise InvalidInputError(f"a sequence must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        arr = arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and arr.size and np.all(np.mod(arr, 1) == 0):
            arr = arr.astype(np.int64)
        else:
            raise InvalidInputError(
                f"a sequence must hold integer item ids, got dtype {arr.dtype}"
            )
    if arr.dtype.itemsize not in (4, 8):
        arr = arr.astype(np.int64)
    arr = np.ascontiguousarray(arr)
    if items is None:
        if arr.size == 0:
            raise InvalidInputError("cannot infer the number of items of an empty sequence: pass items=")
        low = int(arr.min())
        if low < 0:
            bad = int(np.argmax(arr < 0))
            raise InvalidInputError(f"id {int(arr[bad])} at position {bad} is negative")
        items = int(arr.max()) + 1
    items = int(items)
    if items < 1:
        raise InvalidInputError(f"items must be at least 1, got {items}")
    return arr, items


def fingerprint(seq: Any, items: int | None = None) -> int:
    """The 64-bit fingerprint that plans record for their sequence."""
    arr, items = as_sequence(seq, items)
    return int(_engine.fingerprint(arr, items))


def check_capacity(capacity: Any) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
        raise InvalidInputError(f"capacity must be an integer number of items, got {capacity!r}")
    capacity = int(capacity)
    if capacity < 1:
        raise InvalidInputError(
            f"capacity is {capacity}: a cache must hold at least one item"
        )
    return int(capacity)
