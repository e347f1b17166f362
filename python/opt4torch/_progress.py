"""Progress bars for long work (capturing a sampler, building a plan, a sweep).

A thin wrapper over tqdm: bars go to stderr, and ``show=None`` means "only
when stderr is a terminal", so logs and pipes stay clean.

May touch: standard error, and tqdm without its monitor thread.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

__all__ = ["progress_bar"]


class _Bar(tqdm):  # type: ignore[misc]  # tqdm is untyped
    # No monitor thread: our loops update their bars themselves, and a
    # thread of ours must not be running (holding who knows what lock) when
    # a DataLoader forks its workers. A subclass, so users' own bars keep
    # tqdm's default.
    monitor_interval = 0


def progress_bar(*, total: int | None, desc: str, unit: str = "it", show: bool | None = None) -> Any:
    """A tqdm bar, or a silent stand-in with the same methods when not shown."""
    if show is None:
        show = sys.stderr.isatty()
    return _Bar(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=True,
        disable=not show,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=False,
    )
