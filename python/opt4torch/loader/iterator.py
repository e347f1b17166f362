"""The iterator a DataLoader hands out: counts the batches that came out (for
state_dict(), the served counter and log_every), and, dropped before its
epoch's end, declares the rest of the epoch skipped before torch shuts its
workers down. May touch: the loader's counters and its sampler.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dataloader import DataLoader

__all__ = ["CountingIter"]


class CountingIter:
    """The DataLoader iterator, counting batches for state_dict(); dropped
    before the end of its epoch, it declares the rest of the epoch skipped
    (:meth:`PositionBatchSampler.abandon`) before torch shuts its workers down."""

    def __init__(self, loader: DataLoader, it: Any) -> None:
        self._loader = loader
        self._it = it
        self._started = self._done = False

    def __iter__(self) -> CountingIter:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            self._done = True
            self._release()
            if self._started:
                self._loader._positions.observed = (self._loader._positions.epoch, None)
            raise
        except BaseException as exc:
            self._release()  # failed: a new iter() may start
            # torch's frames under this one hold its iterator (their self)
            # and are kept by the exception's traceback, so without this the
            # iterator lives on to a garbage collection, where its __del__
            # waited its join timeout, 5 s, for every worker (10.1 s with 2
            # fork workers after a worker's error; plain torch the same).
            # Their locals cleared, it goes with the exception and joins
            # its workers at once (0.2 s). The worker's traceback is in the
            # message.
            if exc.__traceback__ is not None:
                traceback.clear_frames(exc.__traceback__.tb_next)
            raise
        self._started = True
        loader = self._loader
        pos, b, e = loader._positions, loader._batches_done, loader._positions.epoch
        planned = len(pos.starts[e])
        if b == loader._batches_at_iter:  # the first batch may start inside one (a resume)
            n = pos.samples_after(e, loader._samples_at_iter, 1) - loader._samples_at_iter
        else:
            n = int(pos.batches[e][b]) if b < planned else len(pos.tails[e][b - planned])
        loader.cache.count_served(n, planned=b < planned)
        loader._batches_done = b + 1
        reporter = self._loader._reporter
        if reporter is not None:
            reporter.batch(self._loader)
        return batch

    def _release(self) -> None:
        loader = self._loader
        with loader._live_lock:
            if loader._live is not None and loader._live() is self:
                loader._live = None

    def __del__(self) -> None:
        # Before self._it goes (torch's iterator joins its workers then).
        # Not with ranks sharing a pool: the others may still run this epoch.
        loader = self.__dict__.get("_loader")
        if (loader is not None and self.__dict__.get("_started") and not self.__dict__.get("_done")
                and not loader.shared_across_ranks):
            loader._positions.abandon(loader._batches_done)

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)
