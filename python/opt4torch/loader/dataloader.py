"""The DataLoader: a ``torch.utils.data.DataLoader`` with a Belady-optimal
shared cache, wired from the pieces of this folder.

Where things happen, from the outside in: the arguments are checked
(checks.py) and the plan and pool built (build.py; a cluster's in
distributed/setup.py); :class:`~opt4torch.loader.sampler.PositionBatchSampler`
hands out batches of positions; in every worker
:class:`~opt4torch.loader.worker.PlannedDataset` serves them (HITs from the
pool, MISSes loaded from the dataset, waits in C); the iterator counts what
came out (iterator.py), ``log_every`` reports (report.py), epochs cut short
re-plan (replan.py), and state_dict / load_state_dict resume by position
(checkpoint.py). What is cached is what your dataset returns; ``transform``
runs after the cache, so random augmentation stays random. May touch
everything below it; nothing imports it but the package's front.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch.utils.data as tud

from .. import _engine, _messages
from ..sources.base import counts_storage
from ..sources.hfdatasets import adapt_for_loader
from .build import Built, build_cluster, build_local, layout_digest
from .checkpoint import Checkpoints
from .checks import check_options
from .iterator import CountingIter
from .replan import Replans
from .report import Reporter
from .sampler import PositionBatchSampler, _Unbatched
from .worker import PlannedDataset

__all__ = ["DataLoader"]

_DEFAULT_WAIT_TIMEOUT = _engine.DEFAULT_WAIT_TIMEOUT_MS / 1000
_DEFAULT_PREFETCH_THREADS = _engine.DEFAULT_PREFETCH_THREADS
_DEFAULT_LOOKAHEAD = _engine.DEFAULT_LOOKAHEAD


class DataLoader(Checkpoints, Replans, tud.DataLoader[Any]):
    """A ``torch.utils.data.DataLoader`` with a Belady-optimal shared cache.

    Use it as a drop-in: every DataLoader argument works as usual, plus

    ``cache_bytes`` (``"8GiB"``) or ``cache_items``
        the cache's size (give one);
    ``epochs``
        how many epochs the run will iterate (the plan covers exactly these);
    ``seed``
        seeds ``shuffle=True`` (default: a drawn seed, recorded in the plan
        and in :meth:`state_dict`, and read as :attr:`seed`; a state saved
        under another drawn seed resumes, see :meth:`load_state_dict`);
    ``transform``
        applied to every sample after the cache (random augmentation belongs
        here, not in the dataset);
    ``item_bytes``
        how many bytes an item takes: one number for all (default: measured
        on a few items; larger items are loaded, not cached, with a warning),
        or a size per item, as a sequence or a callable ``f(index)`` (such as
        each file's size), which plans the cache in bytes over pages of
        ``page_size`` (default: chosen from the sizes) with size-aware Belady.
        A dataset method ``opt4_item_bytes(index)`` is used when present;
    ``allow_pickle``
        cache objects other than tensors, arrays, bytes, numbers, str and
        containers of them, through pickle;
    ``bypass``
        plan ``opt`` (True, default) or ``opt-nobypass``;
    ``wait_timeout``
        seconds any wait may take before loading from the source instead;
    ``progress``
        progress bars on standard error while the loader is built (capturing
        the sampler, reading per-item sizes, planning): ``True`` always,
        ``False`` never, ``None`` (default) only when standard error is a
        terminal (and, for planning and sizes, the work is long: 16 M
        accesses or more, more than 100,000 items);
    ``prefetch``
        load the plan's misses ahead of the workers (default: on for a
        :class:`opt4torch.records.RecordFile`, whose records C threads read
        straight into the cache, as they do an :class:`opt4torch.ImageFolder`'s
        files and :class:`opt4torch.TarShards`' samples; ``True`` for any other
        dataset has the same C threads call it, taking the GIL for the call
        only, worth it when loading waits on I/O; on by default for the
        object store's :class:`opt4torch.S3ImageFolder` and
        :class:`opt4torch.S3TarShards`). ``prefetch_threads`` read
        at the start (more, up to the most, when the batches handed out
        first hold more misses); then the depth follows what the workers take (misses
        a second times a read's time, twice over), grows by half again
        whenever they load misses themselves, and goes down when they need
        a quarter of it or less; at most ``prefetch_max_threads`` (default 64; equal to
        ``prefetch_threads`` for a fixed count; with ``cluster=True`` also the
        threads the transfer thread reads forwards with). ``lookahead`` bounds how far
        ahead, in positions, and
        ``staging_slots`` how many items that bypass the cache may wait in
        its staging ring (each takes one cached item's space). ``spare_pages``
        (default with prefetch: about two batches per worker of admitted
        items' pages; 0 without) are pool pages beyond the plan's, so that a
        prefetched item is never stored into pages read just before it,
        where its reader would wait for the handover (docs/prefetch.md).
    ``log_every``
        every this many batches, live figures of the cache: position in the
        plan, hit rate, stall rate, how full the pool is, accesses and
        storage MB per second since the last report, prefetch threads
        reading. They go to ``on_stats(figures)`` (a callable taking a dict)
        if given, and as scalars ``opt4torch/<name>`` to ``tensorboard`` (a
        ``torch.utils.tensorboard.SummaryWriter``, or anything with
        ``add_scalar``) if given; with neither, one line to standard error.
        ``opt4torch top`` shows the same figures from another terminal.
    ``cluster``
        under torchrun, one OPT plan over the memory of every node
        (docs/cluster.md): ``cache_bytes`` is a node's, the ranks of a node
        share its pool, and items move between nodes in windows of
        ``cluster_window`` steps on a gloo group of the loader's own, whose
        collectives give up after ``cluster_timeout`` seconds (the items of
        a failed window are read from storage). Nodes are torchrun's
        (``GROUP_RANK``), or as ``OPT4TORCH_NODE`` says (``rank``: each rank
        a node; ``rank//K``: K ranks a node). Needs a ``DistributedSampler``
        (or ``shuffle=`` and ``seed=``, which make one) and ``batch_size``.
        ``cluster_alone``: ``None`` (the default) has every node plan alone,
        with no transfers at all, where one plan over the cluster would read
        less than ``opt4torch.cluster.MIN_SAVING`` (5 %) fewer bytes from
        storage; ``False`` always plans over the cluster, ``True`` always
        alone. ``stats()['plan_alone']`` says which.

    The order is captured from ``sampler`` (or ``batch_sampler``, or
    ``shuffle``) once, for all epochs, and then replayed: each ``iter(loader)``
    is the next epoch, one iterator at a time (a second ``iter()`` while one is
    live raises). ``loader.cache.stats()`` gives the counters.
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Any = None, batch_sampler: Any = None, num_workers: int = 0,
                 collate_fn: Any = None, pin_memory: bool = False, drop_last: bool = False,
                 timeout: float = 0, worker_init_fn: Any = None, multiprocessing_context: Any = None,
                 generator: Any = None, *, prefetch_factor: int | None = None,
                 persistent_workers: bool = False, pin_memory_device: str = "",
                 cache_bytes: int | str | None = None, cache_items: int | None = None, epochs: int = 1,
                 seed: int | None = None, transform: Callable[[Any], Any] | None = None,
                 item_bytes: int | None = None, allow_pickle: bool = False, bypass: bool = True,
                 wait_timeout: float = _DEFAULT_WAIT_TIMEOUT, progress: bool | None = None,
                 share_across_ranks: bool = False, page_size: int | None = None,
                 prefetch: bool | None = None, prefetch_threads: int = _DEFAULT_PREFETCH_THREADS,
                 prefetch_max_threads: int | None = None, lookahead: int = _DEFAULT_LOOKAHEAD,
                 staging_slots: int | None = None, spare_pages: int | None = None,
                 log_every: int | None = None,
                 on_stats: Callable[[dict[str, Any]], Any] | None = None, tensorboard: Any = None,
                 cluster: bool = False, cluster_window: int = 8, cluster_timeout: float = 60.0,
                 cluster_alone: bool | None = None, **kwargs: Any) -> None:
        # The arguments as given: load_state_dict rebuilds the loader from
        # them with the seed of a state saved under a drawn one.
        self._init_args: dict[str, Any] = {
            k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")} | kwargs
        # A Hugging Face datasets.Dataset is cached as its encoded rows and
        # formatted after the cache (sources/hfdatasets.py).
        dataset, transform = adapt_for_loader(dataset, transform)
        o = check_options(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            num_workers=num_workers, drop_last=drop_last, generator=generator, prefetch_factor=prefetch_factor,
            epochs=epochs, cache_bytes=cache_bytes, cache_items=cache_items, seed=seed, item_bytes=item_bytes,
            allow_pickle=allow_pickle, bypass=bypass, wait_timeout=wait_timeout, progress=progress,
            share_across_ranks=share_across_ranks, page_size=page_size, prefetch=prefetch,
            prefetch_threads=prefetch_threads, prefetch_max_threads=prefetch_max_threads, lookahead=lookahead,
            staging_slots=staging_slots, spare_pages=spare_pages, cluster_window=cluster_window,
            cluster_timeout=cluster_timeout, cluster_alone=cluster_alone)
        self._reporter = Reporter.make(log_every, on_stats, tensorboard)

        built = build_cluster(dataset, o) if cluster else build_local(dataset, o, transform)
        if built.units is not None:
            dataset, transform = built.units
        self._wire(dataset, built, batched=o.batched or cluster,
                   prefetch_opts=o.prefetch_opts if o.prefetch else None)
        cached = PlannedDataset(dataset, self.cache.name, self.cache.plan.accesses, len(dataset),
                                transform=transform, allow_pickle=allow_pickle)
        cached.drop_below_floor = built.group is None and built.cluster_plan is None
        if o.prefetch:
            # What the DataLoader hands out before the first batch comes back:
            # prefetch_factor batches per worker (one batch without workers).
            # A cluster's too: without it the prefetcher started with
            # prefetch_threads readers and grew, and a first epoch of misses
            # took 15 % longer than a node's alone (bench/RESULTS.md, "When
            # the nodes plan alone"). Its wait ends once nothing moves for
            # 50 ms, so positions the transfer thread claims cannot hold it.
            per_batch = int(batch_size or 1) if batch_sampler is None else int(built.own[0][:1].sum() or 1)
            ahead = (prefetch_factor or 2) * num_workers if num_workers > 0 else 1
            self._positions.head_start = min(per_batch * ahead, int(lookahead))
        self._batch_size = batch_size if batch_sampler is None else None
        self._drop_last = bool(drop_last)
        loader_kwargs = dict(num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory,
                             timeout=timeout, worker_init_fn=worker_init_fn,
                             multiprocessing_context=multiprocessing_context, generator=generator,
                             prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                             pin_memory_device=pin_memory_device, **kwargs)
        if o.batched:
            super().__init__(cached, batch_sampler=self._positions, **loader_kwargs)
        else:
            super().__init__(cached, batch_size=None, sampler=_Unbatched(self._positions), **loader_kwargs)

    def _wire(self, dataset: Any, built: Built, *, batched: bool, prefetch_opts: dict[str, Any] | None) -> None:
        """Take what the build made: the cache, the sampler of positions and
        what a state names. The one place a loader's fields are set,
        whichever way it was built."""
        self.cache = built.cache
        if counts_storage(dataset):
            self.cache.storage = dataset  # stats() reports what was read from it
        if prefetch_opts is not None:
            # Every rank of a shared pool prefetches: claims keep each miss to one loader.
            self.cache.configure_prefetch(dataset, **prefetch_opts)
        plan = self.cache.plan
        if built.cluster_plan is not None:
            #: The cluster plan's figures (a ClusterFigures, the same on every rank;
            #: each node's first rank planned it), and this rank's node in it.
            self.cluster_plan, self.node = built.cluster_plan, built.node
            #: This node's part of the plan (a NodePlan: its positions, their
            #: ops, roles and sources), the same on every rank of the node.
            self.node_plan = built.node_plan
        self.shared_across_ranks = built.group is not None
        self._group = built.group
        #: The global position the last load_state_dict() resumed at.
        self.resumed_at: int | None = None
        self._positions = PositionBatchSampler(built.starts, built.own, built.floors, self.cache, batched=batched)
        self._batches_done = 0
        #: The plan's fingerprint as built here: a state_dict() names the run
        #: by it, whatever re-plans happened since.
        self._fingerprint = plan.fingerprint
        # The seed that shuffled the order, and whether it was drawn here:
        # then a state saved under another drawn seed rebuilds the loader.
        self._seed, self._seed_drawn = built.seed, built.seed_drawn
        # A DistributedSampler's order: states name where its epoch's global
        # order stopped, and resume on another world (elastic.py).
        self._dist_sampler = built.dist_sampler
        # Where a state_dict() is: the epoch iterated last (or next, once
        # iter() has been called), the samples of it done when that iteration
        # started, and the batches done then (this loader's batches).
        self._iter_epoch = self._samples_at_iter = self._batches_at_iter = 0
        # What a state names besides the fingerprint (see load_state_dict):
        # the original plan's layout, kept through re-plans.
        self._items = len(dataset)
        self._rank = built.rank
        self._orig = (list(built.starts), list(built.own), list(built.floors), plan.accesses)
        self._layout = layout_digest(built.starts, built.own, built.floors, shared=built.group is not None)
        self._replan_from = built.replan
        #: Re-plans so far: (epoch, batches per epoch the new plan expects, or None for whole epochs).
        self.replans: list[tuple[int, int | None]] = []
        #: The live iterator (weakly: a dropped one no longer counts), under its lock.
        self._live: weakref.ref[CountingIter] | None = None
        self._live_lock = threading.Lock()

    def _rebuilt(self, **changes: Any) -> DataLoader:
        """This loader built again with some arguments changed."""
        fresh = DataLoader.__new__(type(self))
        DataLoader.__init__(fresh, **{**self._init_args, **changes})
        return fresh

    # ---- epochs ----

    def __iter__(self) -> Any:
        # One live iterator at a time: the plan fixes one order of positions,
        # and a second iterator (zip(iter(L), iter(L)), or two threads) would
        # be the next epoch, whose positions wait on the first one's, so both
        # would wait out every wait_timeout. Refuse it at once instead. An
        # iterator that finished, failed or was dropped no longer counts.
        with self._live_lock:
            live = self._live() if self._live is not None else None
            if live is not None:
                raise RuntimeError(
                    "this opt4torch.DataLoader already has a live iterator (another iter() not yet "
                    "exhausted, in this thread or another): the cache's plan fixes one order of "
                    "positions, so two iterators cannot run at once. Finish or drop the first one, "
                    "or build a second loader for a second stream")
            if self.cache._pool.closed:
                raise RuntimeError(
                    f"the cache of this loader ({self.cache.name}) was closed by cache.close(): its "
                    "shared memory is gone, so it cannot serve another epoch. Build a new "
                    "opt4torch.DataLoader to go on, and call cache.close() only when done with this one")
            self._maybe_replan()
            pos = self._positions
            if pos._next_epoch < len(pos.batches):  # else the first next() says they are all used
                resume = pos._resume
                b, samples = (resume[1], resume[4]) if resume is not None else (0, 0)
                self._iter_epoch, self._samples_at_iter = pos._next_epoch, samples
                self._batches_done = self._batches_at_iter = b
            try:
                it = super().__iter__()
            except (TypeError, AttributeError) as exc:  # pickling for spawn/forkserver workers
                if not _messages.is_pickling_error(exc):
                    raise
                raise _messages.unpicklable_dataset(exc, self.multiprocessing_context) from exc
            counting = CountingIter(self, it)
            self._live = weakref.ref(counting)
        return counting

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (default: the next one)."""
        self._positions.set_epoch(epoch)

    @property
    def seed(self) -> int | None:
        """The seed that shuffled this loader's order: ``seed=`` as given,
        or the one drawn for ``shuffle=True`` without it (None when the
        order is a sampler's or a generator's). :meth:`state_dict` records
        it; ``seed=loader.seed`` builds a loader over the same order."""
        return self._seed
