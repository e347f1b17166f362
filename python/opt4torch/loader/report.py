"""``log_every``: live figures every N batches, in the main process, to a
callback, TensorBoard, or one line on standard error. May touch: the
cache's view and stats (read only), the source's read counters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..pool import live as _live

if TYPE_CHECKING:
    from .dataloader import DataLoader

__all__ = ["Reporter"]


class Reporter:
    """``log_every``: live figures every N batches (in the main process,
    as batches come out of the loader), to a callback, TensorBoard, or a
    line on standard error."""

    def __init__(self, every: int, on_stats: Callable[[dict[str, Any]], Any] | None,
                 tensorboard: Any) -> None:
        self.every = every
        self.on_stats = on_stats
        self.tensorboard = tensorboard
        self.step = 0  # batches over all epochs: TensorBoard's global step
        # The last report's time, view, storage bytes and bytes exchanged.
        self._last: tuple[float, dict[str, Any], int, int | None] | None = None

    @classmethod
    def make(cls, every: Any, on_stats: Any, tensorboard: Any) -> Reporter | None:
        if every is None:
            if on_stats is not None or tensorboard is not None:
                raise ValueError("on_stats= and tensorboard= receive the figures of log_every=N: "
                                 "give log_every (batches between reports) too")
            return None
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"log_every must be a positive number of batches, got {every!r}")
        if on_stats is not None and not callable(on_stats):
            raise TypeError(f"on_stats must be callable (it gets a dict of figures), got {on_stats!r}")
        if tensorboard is not None and not callable(getattr(tensorboard, "add_scalar", None)):
            raise TypeError("tensorboard must be a torch.utils.tensorboard.SummaryWriter (or have "
                            f"add_scalar(tag, value, step)), got {tensorboard!r}")
        return cls(every, on_stats, tensorboard)

    def batch(self, loader: DataLoader) -> None:
        self.step += 1
        if self.step % self.every == 0:
            self.report(loader)

    def report(self, loader: DataLoader) -> dict[str, Any]:
        import time

        cache = loader.cache
        now = time.monotonic()
        view = cache.view()
        storage = cache._storage.info()["bytes_read"] if cache._storage is not None else None
        last = self._last
        if last is not None and last[1]["name"] != view["name"]:
            last = None  # a new pool (the loader planned again): its counters start at 0
        fig = _live.figures(view, last[1] if last else None, now - last[0] if last else None)
        fig["batches"] = self.step
        fig["epoch"] = loader._iter_epoch
        if storage is not None:
            fig["storage_bytes"] = int(storage)
            if last is not None and now > last[0]:
                fig["storage_mb_per_s"] = (storage - last[2]) / (now - last[0]) / 1e6
        pf = cache.prefetcher
        if pf is not None:
            fig["prefetch_threads"] = int(pf.stats().get("active", 0))
        # A cluster node's exchange with the others (its first rank's thread counts it).
        moved = getattr(cache.transfers, "bytes_moved", None)
        if moved is not None:
            fig["peer_bytes"] = int(moved)
            if last is not None and last[3] is not None and now > last[0]:
                fig["exchange_mb_per_s"] = (moved - last[3]) / (now - last[0]) / 1e6
        self._last = (now, view, int(storage or 0), moved)
        if self.on_stats is not None:
            self.on_stats(fig)
        if self.tensorboard is not None:
            for key in _live.SCALARS:
                if key in fig:
                    self.tensorboard.add_scalar(f"opt4torch/{key}", fig[key], self.step)
        if self.on_stats is None and self.tensorboard is None:
            import sys

            print(_live.format_line(fig), file=sys.stderr, flush=True)
        return fig
