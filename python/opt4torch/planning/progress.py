"""An engine build on a thread of its own while the calling thread draws a
progress bar from the engine's counter (the planner releases the GIL; the
bar shows only for long builds, on a terminal).

May touch: one thread it starts and joins, the progress bar on stderr.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np

from .._progress import progress_bar

__all__ = ["run_with_progress"]

# Builds below this many accesses finish in a few seconds: no bar.
_PROGRESS_THRESHOLD = 16_000_000
# The engine's progress counter goes over the sequence this many times (the
# next-use pass, the decisions, the slots: src/plan/belady.c).
_PLAN_PASSES = 3


def run_with_progress(fn: Any, total: int, desc: str, show: bool | None) -> Any:
    """Run ``fn(progress_buffer)`` (which releases the GIL) on a worker thread
    while this thread draws a bar of ``total`` accesses from the engine's
    progress counter, which counts _PLAN_PASSES passes over them."""
    if show is None:  # a long build, and someone to see it (not a log or a pipe)
        show = total >= _PROGRESS_THRESHOLD and sys.stderr.isatty()
    if not show or total == 0:
        return fn(None)
    counter = np.zeros(1, dtype=np.uint64)  # 8-byte aligned
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["value"] = fn(counter)
        except BaseException as exc:  # re-raised on the calling thread
            result["error"] = exc

    thread = threading.Thread(target=work, name="opt4-plan", daemon=True)
    with progress_bar(total=total, desc=desc, unit="acc", show=True) as bar:
        thread.start()
        done = 0
        while thread.is_alive():
            thread.join(0.1)
            now = int(counter[0]) // _PLAN_PASSES
            bar.update(now - done)
            done = now
        bar.update(total - done)
    if "error" in result:
        error = result.pop("error")
        try:
            raise error
        finally:
            del error  # no cycle: frame -> error -> traceback -> frame
    return result["value"]
