"""Replaying sequences through cache policies (the C simulator)."""

from __future__ import annotations

from typing import Any

from . import _engine
from ._plan import _check_capacity, as_sequence

__all__ = ["POLICIES", "simulate"]

#: The policies the C simulator knows, in a stable order.
POLICIES: tuple[str, ...] = tuple(_engine.policy_names())


def simulate(policy: str, seq: Any, capacity: int, *, items: int | None = None, seed: int = 0) -> dict[str, int]:
    """Replay ``seq`` through ``policy`` with a cache of ``capacity`` items.

    Returns ``{"accesses", "hits", "misses"}``. ``seed`` drives randomised
    policies; ``items`` is the dataset size (default ``max(seq) + 1``).
    """
    capacity = _check_capacity(capacity)
    arr, items = as_sequence(seq, items)
    result: dict[str, int] = _engine.simulate(policy, arr, items, capacity, seed)
    return result
