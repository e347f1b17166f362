"""Progress bars for long work (capturing a sampler, building a plan, a sweep).

A thin wrapper over tqdm: bars go to stderr, and ``show=None`` means "only
when stderr is a terminal", so logs and pipes stay clean.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

__all__ = ["progress_bar"]


def progress_bar(*, total: int | None, desc: str, unit: str = "it", show: bool | None = None) -> Any:
    """A tqdm bar, or a silent stand-in with the same methods when not shown."""
    if show is None:
        show = sys.stderr.isatty()
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=True,
        disable=not show,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=False,
    )
