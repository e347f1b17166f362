"""Counting the threads this project starts (every one is named opt4...).

Tests count these, never ``threading.active_count()``: a thread left by an
earlier test (a DataLoader's queue feeder, say) may end at any time and would
change the count under the test. A module of its own, without side effects,
because test modules that import it are imported again by spawned workers
(conftest's are not for them)."""

from __future__ import annotations

import gc
import threading
import time


def our_threads() -> list[threading.Thread]:
    """The live threads this project started."""
    return [t for t in threading.enumerate() if t.name.startswith("opt4")]


def our_c_threads() -> list[str]:
    """The names of the live C threads this project started in this process
    (the prefetcher's, named opt4-pf-<k>), from /proc/self/task."""
    import os

    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # ended meanwhile
            continue
        if name.startswith("opt4-pf-"):
            names.append(name)
    return sorted(names)


def wait_for_no_threads_of_ours(timeout: float = 60.0) -> list[threading.Thread]:
    """Waits (collecting garbage, whose finalizers stop threads) until none
    of our threads is alive, or timeout; returns those still alive. The
    bound is generous: a thread of ours may be shutting a DataLoader's
    workers down, which torch allows 5 s a worker before it terminates them,
    and a loaded machine takes that long (test_cuda_path_with_dataloader_workers
    under load: still alive after 5 s). It returns as soon as they are gone."""
    deadline = time.monotonic() + timeout
    while our_threads() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    return our_threads()
