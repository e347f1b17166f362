"""The owner's side of a pool: :class:`OPTCache`, in the process that made it.

It holds the plan and the shared-memory pool, the pool's helpers (the
prefetcher, and a cluster's transfers between nodes, as named attributes),
removes the pool when the run ends (exit, SIGTERM, SIGINT or :meth:`close`),
and sums the counters of every process that used it, across re-plans too.
May touch: the binding's Pool (create, attach, stats, floor, unlink), the
prefetcher it starts (pool/prefetch.py), pool/cleanup.py's registry; never
a DataLoader or a worker's handle.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
import weakref
from typing import Any

from .. import _engine
from ..planning.plan import HIT, Plan
from ..sources.base import engine_source
from . import live as _live
from .cleanup import install_handlers, remove_stale_pools, track

__all__ = ["OPTCache"]


class Helpers:
    """The threads a pool's owner runs beside it, by name: ``prefetcher``
    (loads the plan's misses ahead, pool/prefetch.py) and ``transfers`` (a
    cluster node's exchange with the others, distributed/exchange.py, or
    its follower on the node's other ranks). One object, shared with the
    finalizer, which stops them without keeping the cache alive."""

    __slots__ = ("prefetcher", "transfers")

    def __init__(self) -> None:
        self.prefetcher: Any = None
        self.transfers: Any = None

    def stop(self, transfers: bool = True, finish: bool = True) -> None:
        pf, self.prefetcher = self.prefetcher, None
        if pf is not None:
            pf.stop()
        rt = self.transfers if transfers else None
        if rt is not None:
            self.transfers = None
            if finish:
                rt.finish()  # its last windows: the other nodes take part in them
            else:
                rt.stop(timeout=0)


class _NoPrefetcher:
    """Stands for a prefetcher that could not start: its threads count as
    died, with the error, in stats()["prefetcher"]."""

    kind = "none"

    def __init__(self, threads: int, error: BaseException) -> None:
        self._threads = threads
        self._death = f"{type(error).__name__}: {error}"

    def stats(self) -> dict[str, Any]:
        return {"threads": self._threads, "finished": self._threads, "died": self._threads, "death": self._death}

    def stop(self) -> None:
        pass


class OPTCache:
    """A run's cache, on the side that created it (the main process).

    Holds the plan and the shared-memory pool, removes the pool when the run
    ends (normal exit, SIGTERM, SIGINT, or :meth:`close`), and reports the
    counters of every process that used it.
    """

    def __init__(self, plan: Plan, page_size: int, *, wait_timeout: float = _engine.DEFAULT_WAIT_TIMEOUT_MS / 1000,
                 max_procs: int = 0, staging_slots: int = 0, spare_pages: int = 0) -> None:
        if not plan.has_decisions:
            raise ValueError("the cache needs a plan with a capacity")
        remove_stale_pools()
        self.plan = plan
        self.page_size = int(page_size) or plan.page_size
        # Before the pool exists: a SIGTERM from here on removes it (the
        # engine lists the pool as this process's before pool_create returns).
        install_handlers()
        self._pool = _engine.pool_create(plan._h, self.page_size, int(wait_timeout * 1000), max_procs,
                                         staging_slots=int(staging_slots), spare_pages=int(spare_pages))
        self.spare_pages = int(spare_pages)
        self.name: str = self._pool.name
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()
        #: The prefetcher, once started, and a cluster's transfers (shared
        #: with the finalizer, which stops them).
        self.helpers = Helpers()
        self._prefetch_spec: tuple[Any, ...] | None = None
        self._storage: Any = None
        self._init_counts()
        track(self)
        self._finalizer: weakref.finalize[..., Any] = weakref.finalize(
            self, OPTCache._finalize, self._pool, self._owner_pid, self.helpers)

    @classmethod
    def attach(cls, name: str, plan: Plan, page_size: int) -> OPTCache:
        """The cache of another process (another rank's pool), attached: it
        reports the counters but is never removed from here."""
        self = cls.__new__(cls)
        self.plan = plan
        self.page_size = int(page_size)
        self.spare_pages = 0  # the creator's; info()["pages"] counts them
        self._pool = _engine.pool_attach(name)
        self.name = name
        self._owner_pid = -1  # never the owner
        self._lock = threading.Lock()
        self.helpers = Helpers()
        self._prefetch_spec = None
        self._storage = None
        self._init_counts()
        self._finalizer = weakref.finalize(self, OPTCache._close_attached, self._pool, self.helpers)
        return self

    def _init_counts(self) -> None:
        # What stats() adds to this pool's counters: those of the pools this
        # one replaced (a DataLoader's re-plans) with their plans' figures
        # over the positions that ran there, and the samples loaded past a
        # plan's cut. The plan's first _prefix positions only warm the pool
        # with what the pool before held: nobody reads them.
        self._earlier: dict[str, int] = {}
        self._served = self._unplanned = 0
        self._prefix = 0

    def count_served(self, samples: int, planned: bool = True) -> None:
        """Samples a DataLoader handed to the loop; ``planned=False``: from
        past what the plan covers (loaded, not cached: misses in stats())."""
        self._served += int(samples)
        if not planned:
            self._unplanned += int(samples)

    def hand_over(self, successor: OPTCache, ran_until: int, prefix: int) -> None:
        """``successor`` replaces this cache (a re-plan) after positions up to
        ``ran_until`` of this plan ran; its plan's first ``prefix`` positions
        warm it. Its stats() go on from this one's: the counters summed, and
        the plan figures of what ran here added to its own."""
        with self._lock:
            st = self._pool.stats()
        done = dict(self._earlier)
        for key, value in st.items():
            done[key] = done.get(key, 0) + int(value)
        ran = self.plan.kinds[self._prefix:max(int(ran_until), self._prefix)]
        hits = int((ran == HIT).sum())
        done["plan_hits"] = done.get("plan_hits", 0) + hits
        done["plan_misses"] = done.get("plan_misses", 0) + ran.size - hits + self._unplanned
        done["plan_accesses"] = done.get("plan_accesses", 0) + ran.size + self._unplanned
        done["unplanned"] = done.get("unplanned", 0) + self._unplanned
        done["served"] = done.get("served", 0) + self._served
        successor._earlier = done
        successor._prefix = int(prefix)

    @property
    def prefetcher(self) -> Any:
        """The prefetcher, once started (None before, and without one)."""
        return self.helpers.prefetcher

    @property
    def transfers(self) -> Any:
        """A cluster node's transfers between nodes (None outside a cluster)."""
        return self.helpers.transfers

    @transfers.setter
    def transfers(self, runtime: Any) -> None:
        self.helpers.transfers = runtime

    @property
    def pool(self) -> Any:
        """This process's handle on the pool (the binding's Pool)."""
        return self._pool

    @property
    def storage(self) -> Any:
        """The source whose reads stats() reports as storage reads, or None."""
        return self._storage

    @storage.setter
    def storage(self, source: Any) -> None:
        self._storage = source

    @staticmethod
    def _close_attached(pool: Any, helpers: Helpers) -> None:
        helpers.stop()
        pool.close()

    @staticmethod
    def _finalize(pool: Any, owner_pid: int, helpers: Helpers) -> None:
        helpers.stop()
        if os.getpid() == owner_pid and not pool.closed:
            pool.unlink()
            pool.close()

    def _unlink(self, finish: bool = True) -> None:
        self.helpers.stop(finish=finish)
        if os.getpid() == self._owner_pid and not self._pool.closed:
            self._pool.unlink()

    # ---- prefetching ----

    def configure_prefetch(self, dataset: Any, *, threads: int = _engine.DEFAULT_PREFETCH_THREADS,
                           max_threads: int | None = None, lookahead: int = _engine.DEFAULT_LOOKAHEAD,
                           allow_pickle: bool = False) -> None:
        """Prefetch this cache's misses from ``dataset`` once iteration starts:
        with C threads, reading a record file, an image folder or tar shards
        themselves, or calling the dataset (with the GIL) otherwise.
        ``threads`` read at the start; up to ``max_threads`` (default: the
        same, a fixed count) while the workers load misses themselves."""
        self._prefetch_spec = (dataset, dict(threads=int(threads), max_threads=int(max_threads or threads),
                                             lookahead=int(lookahead)), allow_pickle)

    def start_prefetch(self, head_start: tuple[int, int] | None = None) -> None:
        """Start the configured prefetcher (once; a no-op without one, in a
        process other than the owner, or when it already runs). With
        ``head_start=(first, last)``, return only once the misses in those
        positions are loaded (bounded by the wait timeout): the batches the
        DataLoader hands its workers first then find them ready. A cluster's
        transfer thread starts here too."""
        if self.helpers.transfers is not None and os.getpid() == self._owner_pid:
            self.helpers.transfers.start()
        if self._prefetch_spec is None or self.helpers.prefetcher is not None:
            return
        if os.getpid() != self._owner_pid and self._owner_pid != -1:
            return
        from .prefetch import CallbackPrefetcher, RecordPrefetcher

        dataset, depth, allow_pickle = self._prefetch_spec
        if depth["max_threads"] == depth["threads"]:
            depth = dict(depth, max_threads=0)  # a fixed depth (the engine's max_threads 0)
        elif head_start is not None:
            # The head start's misses are all wanted at once: as many
            # readers as it has (up to the most), rather than rounds of
            # prefetch_threads reads; the depth follows the workers after.
            first, last = head_start
            misses = int((self.plan.kinds[first:last] != HIT).sum())
            depth = dict(depth, threads=min(depth["max_threads"], max(depth["threads"], misses)))
        with self._lock:
            if self.helpers.prefetcher is not None or self._pool.closed:
                return
            try:
                # The engine reads it itself (records, files, objects with the
                # C client), or None: through the Python callback.
                source = engine_source(dataset)
                if source is not None:
                    self.helpers.prefetcher = RecordPrefetcher(self.name, source, **depth)
                else:
                    # The most bytes a miss may take once stored: its pages (a
                    # sized plan), else a page of the pool.
                    sizes = self.plan.item_sizes
                    largest = max(int(sizes.max()) if sizes is not None and len(sizes) else 0, self.page_size)
                    self.helpers.prefetcher = CallbackPrefetcher(self.name, dataset, largest, allow_pickle, **depth)
            except (_engine.Opt4Error, OSError) as e:
                # Prefetch costs speed, never correctness: without it the
                # workers load every miss. Said, and shown in stats().
                warnings.warn(f"opt4torch prefetch threads could not start: {type(e).__name__}: {e}. Iteration "
                              "goes on without them (the DataLoader's workers load every miss)", RuntimeWarning,
                              stacklevel=3)
                self.helpers.prefetcher = _NoPrefetcher(depth["threads"], e)
                return
        if head_start is not None:
            # Wait while the prefetchers make progress, sleeping on their
            # progress counter (woken by every claim they settle). The rest
            # of the head start may wait on reads only the workers make (an
            # ADMIT whose slot still holds an item to be read, a full staging
            # ring: a small cache against a large head start), so once
            # nothing has been settled for 50 ms, stop waiting rather than
            # wait out the timeout.
            pf = self.helpers.prefetcher
            deadline = time.monotonic() + self._pool.info()["wait_timeout_ms"] / 1000
            seen = pf.wait(None, 0.0)[0]
            while self._pool.prefetch_pending(*head_start) and time.monotonic() < deadline:
                seen, moved = pf.wait(seen, 0.05)
                if not moved:
                    break

    def stop_prefetch(self) -> None:
        """Stop the prefetcher's threads (their items in hand go back to the
        workers); iteration goes on without prefetching."""
        self._prefetch_spec = None
        self.helpers.stop(transfers=False)

    def set_floor(self, position: int) -> None:
        """Positions below this that have not run never will."""
        with self._lock:
            if not self._pool.closed:
                self._pool.set_floor(int(position))

    def info(self) -> dict[str, Any]:
        return self._pool.info()

    def stats(self) -> dict[str, Any]:
        """Counters of every process, and the plan's numbers to compare with.

        ``hits`` counts accesses served without loading: from the pool, or
        from a copy loaded earlier in the same batch (``deferred``); with all
        positions run it equals ``plan_hits``. ``fallbacks`` are planned hits
        that had to load (a timed-out wait, a failed store); never silent.

        After a DataLoader's re-plans (epochs cut short) the counters are
        the run's: every pool's, summed, and ``plan_*`` add up the plans'
        figures over the positions that ran under each (the current plan's
        in full). ``unplanned`` counts samples handed out past a plan's cut
        (loaded, not cached): in ``misses``, ``plan_misses`` and
        ``plan_accesses`` both. ``kept`` counts the items re-plans carried
        from one pool to the next (``kept_loaded``: those the old pool no
        longer held, loaded from the source to warm the new one). ``served`` counts the samples the loop
        received (a DataLoader's; 0 for a cache used otherwise): with every
        planned position run it equals ``plan_accesses``, and without workers
        ``hits + misses`` too. Workers also count the batches they loaded
        ahead that a ``break`` then dropped; one still unserved when the
        loop leaves is dropped unloaded.
        """
        with self._lock:
            st = self._pool.stats()
            pf = self.helpers.prefetcher
        earlier = self._earlier
        st = {key: int(value) + earlier.get(key, 0) for key, value in st.items()}
        st["unplanned"] = self._unplanned + earlier.get("unplanned", 0)
        r = _live.rates(st)
        extra: dict[str, Any] = {}
        if pf is not None:
            extra["prefetcher"] = {"kind": pf.kind, **pf.stats()}
        rt = self.helpers.transfers
        if rt is not None:
            extra.update(rt.stats(r["hits"]))
        if self._storage is not None:
            info = self._storage.info()
            extra["storage_reads"] = info["reads"]
            extra["storage_bytes"] = info["bytes_read"]
            if "requests" in info:  # an object store: GETs and LIST pages
                extra["storage_requests"] = info["requests"]
        return {
            "hits": r["hits"],
            "misses": r["misses"],
            "hit_rate": r["hit_rate"],
            "pool_hits": st["hits"],
            "deferred": st["deferred"],
            "admits": st["admits"],
            "bypasses": st["bypasses"],
            "fallbacks": st["fallbacks"],
            "stored": st["stored"],
            "store_failed": st["store_failed"],
            "timeouts": st["timeouts"],
            "waits": st["waits"],
            "wait_seconds": st["wait_ns"] / 1e9,
            "prefetched": st["prefetched"],
            "prefetch_stored": st["prefetch_stored"],
            "prefetch_dropped": st["prefetch_dropped"],
            "stalls": st["stalls"],
            "stall_seconds": st["stall_ns"] / 1e9,
            "stall_rate": r["stall_rate"],
            "served": self._served + earlier.get("served", 0),
            "unplanned": st["unplanned"],
            "kept": earlier.get("kept", 0),
            "kept_loaded": earlier.get("kept_loaded", 0),
            "plan_hits": self.plan.hits + earlier.get("plan_hits", 0),
            "plan_misses": self.plan.misses - self._prefix + earlier.get("plan_misses", 0) + self._unplanned,
            "plan_accesses": self.plan.accesses - self._prefix + earlier.get("plan_accesses", 0) + self._unplanned,
            "capacity_items": None if self.plan.sized else self.plan.capacity,
            "capacity_bytes": self.plan.capacity_bytes if self.plan.sized else self.plan.capacity * self.page_size,
            "page_size": self.page_size,
            "spare_pages": self.spare_pages,
            "shm_bytes": self._pool.info()["shm_bytes"],
            **extra,
        }

    def view(self) -> dict[str, Any]:
        """Where the job is: :meth:`info`'s and the pool's counters, the
        consumers' furthest position (``head``) and the pages that hold
        bytes (``pages_ready``). Looks at every page once: for live figures
        now and then (``log_every``), not per batch."""
        with self._lock:
            return self._pool.view()

    def close(self) -> None:
        """Remove the pool now (workers still attached keep their mapping)."""
        with self._lock:
            self._finalizer()

    def __repr__(self) -> str:
        return f"<OPTCache {self.name} {self.plan!r}>"
