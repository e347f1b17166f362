"""Clairvoyant prefetch for opt4torch.DataLoader: loading the plan's misses
before their positions are reached.

Two kinds of prefetcher follow the same claim protocol in the pool (each miss
is loaded once, by a prefetcher or by the worker that needs it, whichever
claims it first; docs/prefetch.md):

* :class:`RecordPrefetcher`: C threads reading a record file
  (:class:`opt4torch.records.RecordFile`) straight into the pool. No Python
  and no GIL on the path.
* :class:`ThreadPrefetcher`: Python threads calling your dataset. Worth it
  when loading waits on I/O that releases the GIL (files, network, object
  stores); a loader that spends its time decoding in Python holds the GIL
  and is better served by more DataLoader workers.

Both run in the process that owns the pool (the training process), start
lazily when the first epoch starts (after the DataLoader has forked its
workers), and stop when the loader's cache is closed or the process exits.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any

from . import _engine
from ._codec import encode
from ._forksafe import ForkGate

__all__ = ["RecordPrefetcher", "ThreadPrefetcher"]

class RecordPrefetcher:
    """C threads loading a dataset's items into the pool: records of a
    record file, images of an image folder, samples of tar shards, each laid
    out as the codec stores what ``dataset[i]`` returns."""

    kind = "records"

    def __init__(self, pool_name: str, dataset: Any, threads: int, lookahead: int) -> None:
        source = dataset._prefetch_source()
        self._pf = _engine.Prefetcher(pool_name, threads=threads, lookahead=lookahead, **source)
        self._records = source["records"]

    def stats(self) -> dict[str, Any]:
        return self._pf.stats() if self._pf.running else {}

    def stop(self) -> None:
        self._pf.stop()


class ThreadPrefetcher:
    """Python threads loading ``dataset[item]`` for the pool's misses."""

    kind = "threads"
    #: Loaded items a thread may hold while they wait for their place.
    PENDING = 4

    def __init__(self, pool_name: str, dataset: Any, threads: int, lookahead: int,
                 allow_pickle: bool = False) -> None:
        self._dataset = dataset
        self._lookahead = int(lookahead)
        self._allow_pickle = allow_pickle
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._counts = {"loaded": 0, "stored": 0, "errors": 0, "idle_seconds": 0.0, "died": 0}
        self._first_error: BaseException | None = None
        self._death: BaseException | None = None
        self._pid = os.getpid()
        # Calling the dataset may take any lock: no fork while a thread does.
        self._gate = ForkGate()
        self._threads = [threading.Thread(target=self._run, args=(pool_name,), daemon=True,
                                          name=f"opt4-prefetch-{i}") for i in range(threads)]
        for th in self._threads:
            th.start()

    def _run(self, pool_name: str) -> None:
        """One thread's life. A thread that stops on an error other than the
        dataset's (which are counted, and left to the worker that needs the
        item) is reported, never silent: a RuntimeWarning naming the error,
        and ``died``/``death`` in the prefetcher's stats. The epoch goes on,
        with the workers loading what it would have."""
        try:
            self._serve(pool_name)
        except BaseException as e:
            with self._lock:
                self._counts["died"] += 1
                if self._death is None:
                    self._death = e
            warnings.warn(f"opt4torch prefetch thread {threading.current_thread().name} stopped: "
                          f"{type(e).__name__}: {e}. Iteration goes on without it (the DataLoader's "
                          "workers load what it would have prefetched)", RuntimeWarning, stacklevel=1)

    def _serve(self, pool_name: str) -> None:
        """Claim, load, hand over; keep up to PENDING loaded items that must
        wait for their place (the items they replace still have reads to
        come), retried earliest first and never past one that must wait (a
        later one could wait on workers who need the earlier one first)."""
        pool = _engine.pool_attach(pool_name)
        with self._lock:
            self._handles.append(pool)
        loaded = stored = errors = 0
        idle = 0.0
        backoff = 5e-5
        held: list[tuple[int, list[Any]]] = []
        end = False
        try:
            while not self._stop.is_set():
                progressed = False
                while held:
                    r = pool.prefetch_store(held[0][0], held[0][1], True)
                    if r == _engine.STORE_NOT_YET:
                        break
                    stored += r == _engine.STORE_DONE
                    held.pop(0)
                    progressed = True
                if not end and len(held) < self.PENDING:
                    status, t, item, _kind, _space = pool.prefetch_claim(self._lookahead)
                    if status == _engine.PREFETCH_END:
                        end = True
                    elif status == _engine.PREFETCH_CLAIMED:
                        progressed = True
                        try:
                            with self._gate.busy():
                                parts = encode(self._dataset[item], self._allow_pickle)
                        except Exception as e:  # the worker that needs it loads it, and sees the error
                            errors += 1
                            if self._first_error is None:
                                self._first_error = e
                            pool.prefetch_release(t)
                        else:
                            loaded += 1
                            held.append((t, parts))
                if end and not held:
                    break
                if not progressed:
                    t0 = time.perf_counter()
                    self._stop.wait(backoff)
                    idle += time.perf_counter() - t0
                    backoff = min(backoff * 2, 1e-3)
                else:
                    backoff = 5e-5
        finally:
            for t, _ in held:  # stopped: their workers load them
                pool.prefetch_release(t)
            with self._lock:
                self._counts["loaded"] += loaded
                self._counts["stored"] += stored
                self._counts["errors"] += errors
                self._counts["idle_seconds"] += idle
                self._handles.remove(pool)
            pool.close()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out = dict(self._counts)
        out["threads"] = len(self._threads)
        out["parks"] = self._gate.parks
        out["park_timeouts"] = self._gate.park_timeouts
        out["finished"] = sum(not th.is_alive() for th in self._threads)
        if self._death is not None:
            out["death"] = f"{type(self._death).__name__}: {self._death}"
        return out

    def stop(self) -> None:
        if os.getpid() != self._pid:
            return  # a forked child's copy: the threads are not here
        self._stop.set()
        with self._lock:
            for h in self._handles:
                h.interrupt()  # a thread waiting to store gives up at once
        for th in self._threads:
            th.join()
