"""Live figures of a running cache: what ``stats()`` reports, what
``opt4torch.DataLoader(log_every=N)`` reports while it trains, and what
``opt4torch top`` shows from another terminal.

All three start from the pool's counters (``Pool.stats()``, or a view:
``Pool.view()`` from the job itself, ``_engine.pool_peek(name)`` from any
process of the same user, which maps the pool read-only and takes nothing in
it). One function turns counters into rates, so the three never disagree.

May touch: nothing: pure arithmetic over counters it is given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["rates", "figures", "format_line", "SCALARS"]

#: The figures written to TensorBoard (``opt4torch/<name>``), and plotted by
#: anything that takes scalars.
SCALARS: tuple[str, ...] = ("hit_rate", "stall_rate", "occupancy", "progress", "accesses_per_s",
                            "storage_mb_per_s", "exchange_mb_per_s", "prefetch_threads")


def rates(st: Mapping[str, int]) -> dict[str, Any]:
    """Hits, misses and the two rates from a pool's counters.

    ``hits`` counts accesses served without loading (from the pool, or from
    a copy loaded earlier in the same batch); ``misses`` every other access.
    ``stall_rate`` is the share of accesses that waited for their data:
    loaded by the worker that needed it, or waiting for a prefetch still in
    flight. ``unplanned`` (a DataLoader's samples past a re-plan's cut,
    when given) are misses its workers loaded.
    """
    hits = st["hits"] + st["deferred"]
    loaded_here = st["admits"] + st["bypasses"] + st["fallbacks"] + st.get("unplanned", 0)
    misses = loaded_here + st["prefetched"]
    served = hits + misses
    return {
        "served": served,
        "hits": hits,
        "misses": misses,
        "hit_rate": hits / served if served else 0.0,
        "stall_rate": (loaded_here + st["stalls"]) / served if served else 0.0,
    }


def figures(view: Mapping[str, Any], previous: Mapping[str, Any] | None = None,
            seconds: float | None = None) -> dict[str, Any]:
    """The figures of one view (``Pool.view()`` or ``pool_peek``), with
    ``accesses_per_s`` over the ``seconds`` since ``previous`` (another
    view of the same pool) when both are given."""
    fig = rates(view)
    accesses = int(view["accesses"])
    position = min(int(view["head"]), accesses)
    pages = int(view["pages"])
    fig.update({
        "name": view["name"],
        "owner_pid": int(view["owner_pid"]),
        "position": position,
        "accesses": accesses,
        "progress": position / accesses if accesses else 0.0,
        "fallbacks": int(view["fallbacks"]),
        "timeouts": int(view["timeouts"]),
        "prefetched": int(view["prefetched"]),
        "stalls": int(view["stalls"]),
        "occupancy": int(view["pages_ready"]) / pages if pages else 0.0,
        "pool_bytes": int(view["pages_ready"]) * int(view["page_size"]),
        "attached": int(view["attached"]),
    })
    if previous is not None and seconds is not None and seconds > 0:
        fig["accesses_per_s"] = (fig["served"] - rates(previous)["served"]) / seconds
    return fig


def _pct(x: float) -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else f"{100 * x:.1f}%"


def format_line(fig: Mapping[str, Any]) -> str:
    """One line for a log: where the job is and how the cache does."""
    parts = [f"opt4torch: {fig['position']:,}/{fig['accesses']:,} accesses ({_pct(fig['progress'])})",
             f"hit rate {_pct(fig['hit_rate'])}", f"stalls {_pct(fig['stall_rate'])}",
             f"pool {_pct(fig['occupancy'])} full"]
    if "accesses_per_s" in fig:
        parts.append(f"{fig['accesses_per_s']:,.0f} accesses/s")
    if "storage_mb_per_s" in fig:
        parts.append(f"storage {fig['storage_mb_per_s']:,.1f} MB/s")
    if "exchange_mb_per_s" in fig:
        parts.append(f"exchange {fig['exchange_mb_per_s']:,.1f} MB/s")
    if fig.get("fallbacks"):
        parts.append(f"fallbacks {fig['fallbacks']:,}")
    return ", ".join(parts)
