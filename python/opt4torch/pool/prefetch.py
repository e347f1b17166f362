"""Clairvoyant prefetch for opt4torch.DataLoader: loading the plan's misses
before their positions are reached.

One prefetcher, C threads (src/io/prefetcher.c), loads through a source
and follows the claim protocol in the pool (each miss is loaded once, by a
prefetcher or by the worker that needs it, whichever claims it first;
docs/prefetch.md). Two ways to make one:

* :class:`RecordPrefetcher`: from a dataset the engine reads itself (a
  record file, an image folder, tar shards) straight into the pool. No
  Python and no GIL on the path.
* :class:`CallbackPrefetcher`: the same C threads calling your dataset
  through a Python callback, taking the GIL for the call only. Worth it
  when loading waits on I/O that releases the GIL (files, network, object
  stores); a loader that spends its time decoding in Python holds the GIL
  and is better served by more DataLoader workers.

Both run in the process that owns the pool (the training process), start
lazily when the first epoch starts (after the DataLoader has forked its
workers), and stop when the loader's cache is closed or the process exits.

May touch: the binding's Prefetcher (C threads on a pool it attaches by
name), the dataset it is given (called with the GIL, through the callback),
the codec.
"""

from __future__ import annotations

from typing import Any

from .. import _engine
from ..io import forksafe  # noqa: F401  (parks the threads around os.fork)
from ..sources.base import EngineSource
from .codec import encode

__all__ = ["CallbackPrefetcher", "RecordPrefetcher"]


def _wait(pf: Any, seen: int | None, timeout: float) -> tuple[int, bool]:
    """Sleep until the prefetcher settles another claim after ``seen`` (its
    progress counter; None: now), at most ``timeout`` seconds: (the counter,
    whether it moved). On the counter itself, in C, with the GIL released."""
    if not pf.running:
        return 0, False
    if seen is None:
        seen = pf.progress()
    moved = pf.wait(seen, timeout)
    return pf.progress(), moved

class RecordPrefetcher:
    """C threads loading a dataset's items into the pool: records of a
    record file, images of an image folder, samples of tar shards, each laid
    out as the codec stores what ``dataset[i]`` returns."""

    kind = "records"

    def __init__(self, pool_name: str, source: EngineSource, *, threads: int, max_threads: int,
                 lookahead: int) -> None:
        self._pf = _engine.Prefetcher(pool_name, threads=threads, max_threads=max_threads, lookahead=lookahead,
                                      **source.prefetcher_args())
        self._records = source.records

    def stats(self) -> dict[str, Any]:
        return self._pf.stats() if self._pf.running else {}

    def wait(self, seen: int | None, timeout: float) -> tuple[int, bool]:
        return _wait(self._pf, seen, timeout)

    def stop(self) -> None:
        self._pf.stop()


class CallbackPrefetcher:
    """The same C threads loading ``dataset[item]`` through a Python
    callback (binding/pysource.c): a thread takes the GIL for the call and
    the codec, and for nothing else; between loads it waits in C, on the
    pool's words, like the record prefetcher's threads."""

    kind = "callback"

    def __init__(self, pool_name: str, dataset: Any, max_size: int, allow_pickle: bool = False, *, threads: int,
                 max_threads: int, lookahead: int) -> None:
        errors: list[BaseException] = []

        def load(item: int) -> list[Any] | None:
            # The dataset's errors are the worker's to raise, when it loads
            # the item itself: counted (the prefetcher's "errors"), first kept.
            try:
                return encode(dataset[item], allow_pickle)
            except Exception as e:
                if not errors:
                    errors.append(e)
                return None

        self._errors = errors
        self._pf = _engine.Prefetcher(pool_name, None, threads=threads, max_threads=max_threads, lookahead=lookahead,
                                      frame="raw",
                                      load=load, items=len(dataset), max_size=max_size)

    def wait(self, seen: int | None, timeout: float) -> tuple[int, bool]:
        return _wait(self._pf, seen, timeout)

    def stats(self) -> dict[str, Any]:
        out = self._pf.stats() if self._pf.running else {}
        if self._errors:
            out["first_error"] = f"{type(self._errors[0]).__name__}: {self._errors[0]}"
        return out

    def stop(self) -> None:
        self._pf.stop()
