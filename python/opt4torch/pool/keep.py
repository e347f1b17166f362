"""Warming a new pool with what an old one holds: a re-plan of one node
(loader/replan.py) and a cluster loader resumed in its own processes
(distributed/warm.py) both plan the rest after a prefix of the items the old
pool holds, and then copy the ones the new plan keeps. May touch: both pools
(the old one read, and its floor raised; the new one warmed), the loader's
dataset through ``load`` (an item the old pool no longer holds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _engine
from .cache import OPTCache

__all__ = ["keep_from"]


def keep_from(old: OPTCache, new: OPTCache, stop: int, read_at: dict[int, int],
              load: Callable[[int], Any]) -> tuple[int, int]:
    """Warm ``new`` with the items its plan keeps from its prefix (the
    generations live at ``new._prefix`` and admitted before it): each copied
    from ``old``, read at its next read there (``read_at``, at or after
    ``stop``), as bytes; one the old pool no longer holds (a failed store,
    pages a worker took after a ``break``, a transfer that never came) is
    loaded instead (``load(item)``: the item's encoded buffers), so the new
    plan's hits stay exact. Returns how many were copied, and how many
    loaded. Runs while no worker serves a batch of either pool."""
    # Nothing below stop runs in the old pool any more: a read of an item
    # it never stored gives up at once instead of waiting.
    old.set_floor(stop)
    src, dst = _engine.pool_attach(old.name), _engine.pool_attach(new.name)
    copied = loaded = 0
    try:
        live = [g for g in dst.live_at(new._prefix) if g[0] < new._prefix]
        for i in range(0, len(live), 256):
            chunk = live[i:i + 256]
            data, entries = src.read_batch([read_at[item] for _, item, _ in chunk])
            with memoryview(data) as view:
                for j, (admit, item, before) in enumerate(chunk):
                    status, _, a, b = entries[j] if j < len(entries) else (_engine.ENTRY_LOAD, 0, 0, 0)
                    if status == _engine.ENTRY_HIT:
                        copied += dst.warm(admit, [view[a:a + b]], before) == _engine.STORE_STORED
                    else:
                        dst.warm(admit, load(item), before)
                        loaded += 1
    finally:
        src.close()
        dst.close()
    return copied, loaded
