"""The cache in a training loop: torch.utils.data integration.

The pieces, from the outside in:

* :class:`DataLoader` is a ``torch.utils.data.DataLoader`` that captures the
  sampler you give it (or ``shuffle=True`` with a seed) for all epochs, plans
  OPT over the captured order, creates the shared-memory pool, and then
  replays exactly that order. ``loader.cache.stats()`` reports the counters.
* :class:`PositionBatchSampler` yields batches of *positions* (plain ints):
  position ``t`` is the t-th access of the whole run, so the cache knows which
  access each request is.
* :class:`PlannedDataset` maps a position to its index and follows the plan
  there: HITs are copied out of the pool, ADMITs and BYPASSes are loaded from
  your dataset (ADMITs are then stored). ``__getitems__`` serves a batch with
  one call into C to read and one to store.
* :class:`OPTCache` is the owner's side: the plan, the pool, cleanup, stats.

What is cached is what your dataset returns; ``transform`` runs after the
cache, so random augmentation stays random.
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from . import _engine, _live, _messages
from ._codec import decode, decode_at, encode, encoded_size, make_arrays
from ._plan import ADMIT, HIT, Plan, choose_page, plan as build_plan
from .capture import capture_epochs
from .hfdatasets import adapt_for_loader

__all__ = [
    "DataLoader",
    "PlannedDataset",
    "PositionBatchSampler",
    "OPTCache",
    "parse_bytes",
    "remove_stale_pools",
]

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(value: int | float | str) -> int:
    """``8 << 30``, ``"8GiB"``, ``"512 MB"``, ``"1.5G"`` -> bytes."""
    if isinstance(value, bool):
        raise ValueError(f"not a size in bytes: {value!r}")
    if isinstance(value, (int, np.integer)):
        return int(value)
    hint = "(try 8GiB, 512MB or a number of bytes)"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a finite size in bytes: {value!r} {hint}")
        return int(value)
    text = str(value).strip().lower().replace(" ", "")
    num = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(num):]
    try:
        number = float(num)
    except ValueError:
        number = math.nan
    if unit not in _UNITS or not math.isfinite(number):
        raise ValueError(f"not a size in bytes: {value!r} {hint}")
    return int(number * _UNITS[unit])


# ---- cleanup of pools: this run's on exit and signals, dead runs' on start ----

_live_caches: "weakref.WeakSet[OPTCache]" = weakref.WeakSet()
_handlers_installed = False
_previous_handlers: dict[int, Any] = {}


def _unlink_all(finish: bool = True) -> None:
    for cache in list(_live_caches):
        cache._unlink(finish)


def _on_signal(signum: int, frame: Any) -> None:
    _unlink_all(finish=False)  # a cluster's transfer thread stops at once: no waiting in a handler
    # And any pool made but not yet handed to an OPTCache (the signal came
    # during a constructor): the engine lists them from their creation on.
    _engine.remove_owned_pools()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    else:  # re-deliver with the default action
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    """atexit, plus SIGTERM and SIGHUP (SIGINT becomes KeyboardInterrupt,
    which unwinds to atexit). Only from the main thread, chaining to any
    handler already there."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_unlink_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        current = signal.getsignal(sig)
        if current in (signal.SIG_IGN,) or current is None:
            continue
        _previous_handlers[sig] = current
        signal.signal(sig, _on_signal)


def remove_stale_pools() -> list[dict[str, Any]]:
    """Remove this user's pools whose owner process is gone; never a live
    job's, in this PID namespace or another (a container sharing /dev/shm):
    an owner holds a lock on its pool that the kernel drops when it dies,
    and a pool whose owner is in another namespace without such a lock is
    kept (``opt4torch cleanup --force`` removes those). Returns what was
    removed."""
    removed = []
    for entry in _engine.pool_list():
        if entry["owner_alive"]:
            continue
        try:
            _engine.pool_remove(entry["name"])
            removed.append(entry)
        except _engine.Opt4Error:
            pass  # someone else removed it first, or it came alive
    return removed


# ---- the owner ----


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

    def __init__(self, plan: Plan, page_size: int, *, wait_timeout: float = 10.0,
                 max_procs: int = 0, staging_slots: int = 0, spare_pages: int = 0) -> None:
        if not plan.has_decisions:
            raise ValueError("the cache needs a plan with a capacity")
        remove_stale_pools()
        self.plan = plan
        self.page_size = int(page_size) or plan.page_size
        # Before the pool exists: a SIGTERM from here on removes it (the
        # engine lists the pool as this process's before pool_create returns).
        _install_handlers()
        self._pool = _engine.pool_create(plan._h, self.page_size, int(wait_timeout * 1000), max_procs,
                                         staging_slots=int(staging_slots), spare_pages=int(spare_pages))
        self.spare_pages = int(spare_pages)
        self.name: str = self._pool.name
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()
        # The prefetcher, once started, and a cluster's transfer thread (a
        # box, so the finalizer sees them).
        self._prefetch_box: list[Any] = [None, None]
        self._prefetch_spec: tuple[Any, ...] | None = None
        self._storage: Any = None
        self._init_counts()
        _live_caches.add(self)
        _install_handlers()
        self._finalizer = weakref.finalize(self, OPTCache._finalize, self._pool, self._owner_pid,
                                           self._prefetch_box)

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
        self._prefetch_box = [None, None]
        self._prefetch_spec = None
        self._storage = None
        self._init_counts()
        self._finalizer = weakref.finalize(self, OPTCache._close_attached, self._pool, self._prefetch_box)
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

    @staticmethod
    def _close_attached(pool: Any, box: list[Any]) -> None:
        OPTCache._stop_prefetch(box)
        pool.close()

    @staticmethod
    def _stop_prefetch(box: list[Any], cluster: bool = True, finish: bool = True) -> None:
        pf, box[0] = box[0], None
        if pf is not None:
            pf.stop()
        rt = box[1] if cluster else None
        if rt is not None:
            box[1] = None
            if finish:
                rt.finish()  # its last windows: the other nodes take part in them
            else:
                rt.stop(timeout=0)

    @staticmethod
    def _finalize(pool: Any, owner_pid: int, box: list[Any]) -> None:
        OPTCache._stop_prefetch(box)
        if os.getpid() == owner_pid and not pool.closed:
            pool.unlink()
            pool.close()

    def _unlink(self, finish: bool = True) -> None:
        OPTCache._stop_prefetch(self._prefetch_box, finish=finish)
        if os.getpid() == self._owner_pid and not self._pool.closed:
            self._pool.unlink()

    # ---- prefetching ----

    def configure_prefetch(self, dataset: Any, *, threads: int = 8, max_threads: int | None = None,
                           lookahead: int = 4096, allow_pickle: bool = False) -> None:
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
        if self._prefetch_box[1] is not None and os.getpid() == self._owner_pid:
            self._prefetch_box[1].start()
        if self._prefetch_spec is None or self._prefetch_box[0] is not None:
            return
        if os.getpid() != self._owner_pid and self._owner_pid != -1:
            return
        from ._prefetch import CallbackPrefetcher, RecordPrefetcher

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
            if self._prefetch_box[0] is not None or self._pool.closed:
                return
            try:
                # The engine reads it itself (records, files, objects with the
                # C client), or None: through the Python callback.
                source = dataset._prefetch_source() if hasattr(dataset, "_prefetch_source") else None
                if source is not None:
                    self._prefetch_box[0] = RecordPrefetcher(self.name, dataset, source=source, **depth)
                else:
                    # The most bytes a miss may take once stored: its pages (a
                    # sized plan), else a page of the pool.
                    sizes = self.plan.item_sizes
                    largest = max(int(sizes.max()) if sizes is not None and len(sizes) else 0, self.page_size)
                    self._prefetch_box[0] = CallbackPrefetcher(self.name, dataset, largest, allow_pickle, **depth)
            except (_engine.Opt4Error, OSError) as e:
                # Prefetch costs speed, never correctness: without it the
                # workers load every miss. Said, and shown in stats().
                warnings.warn(f"opt4torch prefetch threads could not start: {type(e).__name__}: {e}. Iteration "
                              "goes on without them (the DataLoader's workers load every miss)", RuntimeWarning,
                              stacklevel=3)
                self._prefetch_box[0] = _NoPrefetcher(depth["threads"], e)
                return
        if head_start is not None:
            import time

            # Wait while the prefetchers make progress, sleeping on their
            # progress counter (woken by every claim they settle). The rest
            # of the head start may wait on reads only the workers make (an
            # ADMIT whose slot still holds an item to be read, a full staging
            # ring: a small cache against a large head start), so once
            # nothing has been settled for 50 ms, stop waiting rather than
            # wait out the timeout.
            pf = self._prefetch_box[0]
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
        OPTCache._stop_prefetch(self._prefetch_box, cluster=False)

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
            pf = self._prefetch_box[0]
        earlier = self._earlier
        st = {key: int(value) + earlier.get(key, 0) for key, value in st.items()}
        st["unplanned"] = self._unplanned + earlier.get("unplanned", 0)
        r = _live.rates(st)
        extra: dict[str, Any] = {}
        if pf is not None:
            extra["prefetcher"] = {"kind": pf.kind, **pf.stats()}
        rt = self._prefetch_box[1]
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


# ---- the dataset side (runs in every worker) ----


class PlannedDataset(tud.Dataset):
    """``dataset`` seen through the plan: item ``t`` is the t-th access.

    Picklable (for spawn and forkserver workers): a worker attaches to the
    pool by name on first use, one handle per thread.
    """

    def __init__(self, dataset: Any, pool_name: str, accesses: int, items: int, *,
                 transform: Callable[[Any], Any] | None = None, allow_pickle: bool = False) -> None:
        self.dataset = dataset
        self.pool_name = pool_name
        self.accesses = int(accesses)
        self.items = int(items)
        self.transform = transform
        self.allow_pickle = allow_pickle
        #: Whether a batch wholly below the pool's floor is dropped unloaded
        #: (the DataLoader's own pool: then only a left epoch's batches lie
        #: there). Off where other processes move the floor: ranks sharing a
        #: pool, where one rank's next epoch starts while another still
        #: serves its last batches.
        self.drop_below_floor = False
        self._local = threading.local()
        self._warned_size = False

    def __len__(self) -> int:
        return self.accesses

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_local"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def _pool(self) -> Any:
        pool = getattr(self._local, "pool", None)
        if pool is None:
            n = len(self.dataset)
            if n != self.items:
                raise RuntimeError(
                    f"the dataset has {n} items but the cache was planned for {self.items}: a "
                    "dataset whose length changed needs a new loader (and a new plan)"
                )
            pool = _engine.pool_attach(self.pool_name)
            self._local.pool = pool
        return pool

    def _load(self, indices: list[int]) -> list[Any]:
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None and len(indices) > 1:
            return list(getitems(indices))
        return [self.dataset[i] for i in indices]

    def __getitem__(self, position: int) -> Any:
        return self.__getitems__([position])[0]

    def retarget(self, pool_name: str, accesses: int) -> None:
        """Serve another plan's pool (a re-plan, see DataLoader): workers
        started from now on attach it; this process's handle goes. Workers
        already running (persistent ones) move on the first batch that names
        it (:class:`_OnPool`)."""
        self.pool_name = pool_name
        self.accesses = int(accesses)
        self._local = threading.local()

    def __getitems__(self, positions: Sequence[int]) -> list[Any]:
        if isinstance(positions, _Unplanned):
            # A batch past what the plan covers (an epoch that ran longer
            # than the cut the plan expected): item indices, loaded, not cached.
            out = self._load(list(positions))
            return [self.transform(x) for x in out] if self.transform is not None else out
        moved = getattr(positions, "pool", None)
        if moved is not None and moved[0] != self.pool_name:
            self.retarget(*moved)
        pool = self._pool()
        if self.drop_below_floor and positions and self._below_floor(pool, positions):
            # The loop left the epoch (a break) after this batch was handed
            # out: nobody takes it. Not loaded, and not counted as served.
            raise _Dropped(f"opt4torch: positions {min(positions)}-{max(positions)} lie below the floor "
                           f"({pool.floor()}): their epoch was left early, so this batch is dropped unserved")
        out: list[Any] = []
        start = 0
        while start < len(positions):
            part = positions[start:] if start else positions
            # One call into C reads the batch and decodes its HITs (arrays
            # and tensors through make_arrays, as views of data); rest holds
            # (i, status, item, a, b) for everything else. It stops early
            # (AGAIN) where a prefetcher holds a miss whose store may wait
            # for one of ours: we commit what came before, then go on there.
            try:
                got, data, rest = pool.get_batch(part, make_arrays)
            except (_engine.InvalidInputError, OverflowError, TypeError) as exc:
                if all(0 <= int(t) < self.accesses for t in positions):
                    raise
                raise _messages.bad_positions(positions, self.accesses) from exc
            served = len(part)
            if rest and rest[-1][1] == _engine.ENTRY_AGAIN:
                served = rest.pop()[0]
                del got[served:]
                if served == 0:  # it owes nothing at its first position
                    raise RuntimeError(f"opt4torch: the pool served none of positions {part}")
            if rest:
                self._finish_batch(pool, part, got, data, rest)
            out.extend(got)
            start += served
        if self.transform is not None:
            # A transform that needs the position (a row taken from its read unit) says so.
            at = getattr(self.transform, "at_positions", None)
            out = at(out, positions) if at is not None else [self.transform(x) for x in out]
        return out

    @staticmethod
    def _below_floor(pool: Any, positions: Sequence[int]) -> bool:
        """Whether every position is a real one below the floor. A position
        out of range (negative, or not an int) is never dropped: the read
        below refuses it with the message that says what was wrong."""
        try:
            lo, hi = int(min(positions)), int(max(positions))
        except (TypeError, ValueError):
            return False
        return 0 <= lo and hi < pool.floor()

    def _finish_batch(self, pool: Any, positions: Sequence[int], out: list[Any], data: bytearray,
                      rest: list[tuple[int, int, int, int, int]]) -> None:
        """Load, store and decode the positions the C side left in ``rest``."""
        load_at = [e for e in rest if e[1] == _engine.ENTRY_LOAD]
        loaded = self._load([e[2] for e in load_at]) if load_at else []
        for e, obj in zip(load_at, loaded):
            out[e[0]] = obj
        # Commit in position order: stores of ADMITs, notes of deferred reads
        # (a generation admitted and read in this batch may be evicted later
        # in it, and the eviction waits for those reads).
        commits: list[tuple[int, Any]] = []
        encoded: dict[int, list[Any]] = {}
        for i, status, _, a, _ in rest:
            if status == _engine.ENTRY_LOAD and a == _engine.REASON_ADMIT:
                parts = encode(out[i], self.allow_pickle)
                encoded[int(positions[i])] = parts
                commits.append((int(positions[i]), parts))
            elif status == _engine.ENTRY_DEFER:  # the same item, loaded earlier in this batch
                commits.append((int(positions[i]), None))
        if commits:
            results = pool.store_batch(commits)
            if _engine.STORE_TOO_LARGE in results and not self._warned_size:
                self._warned_size = True
                sizes = [encoded_size(c[1]) for c, r in zip(commits, results) if r == _engine.STORE_TOO_LARGE]
                warnings.warn(
                    f"an item of {max(sizes)} bytes does not fit its space in the cache "
                    f"({pool.info()['page_size']} bytes): it is loaded, not cached. Give the loader "
                    "item_bytes= at least the largest item's size", RuntimeWarning, stacklevel=3)
        for i, status, _, a, b in rest:
            if status == _engine.ENTRY_HIT:  # one the C decoder left to the codec (PIL images, pickles, ...)
                out[i] = decode_at(data, a, b)
            elif status == _engine.ENTRY_DEFER:
                # Decode its record again so each sample is its own object.
                out[i] = decode(bytearray().join(encoded[a]))


# ---- the sampler side (runs in the main process) ----


class _Dropped(RuntimeError):
    """A worker's answer to a batch that nobody will take (all its positions
    below the floor: handed out before a ``break``). Torch drops it with the
    rest of the left epoch's batches; it is never raised in the loop."""


class _Unplanned(list):
    """A batch of item indices (not positions) past what the plan covers: an
    epoch that runs on past the cut a re-plan expected. Loaded, not cached.
    A type of its own, so that no position, in range or not, is ever taken
    for one; it pickles to spawned workers by name."""


class _OnPool(list):
    """A batch of positions of the pool named ``pool`` (name, accesses): a
    re-plan's. Workers that outlive a re-plan (``persistent_workers``) keep
    the dataset they were started with, so the batch tells them where its
    positions are; they move there before serving it."""

    pool: tuple[str, int]


class PositionBatchSampler(tud.Sampler[list[int]]):
    """Batches of positions, epoch by epoch, exactly as captured.

    ``starts[e]`` and ``lengths[e]`` give epoch e's batches: batch b is
    positions ``starts[e][b] .. starts[e][b] + lengths[e][b] - 1``. (One rank
    of a pool shared across ranks owns every W-th batch of the run.) Each
    ``iter()`` is the next epoch (or the one given by :meth:`set_epoch`).
    When an epoch starts, positions before ``floors[e]`` that never ran (a
    loop that broke out early) are declared skipped so nothing waits for them.
    """

    def __init__(self, starts: list[np.ndarray], lengths: list[np.ndarray], floors: list[int],
                 cache: OPTCache, batched: bool = True) -> None:
        self.starts = list(starts)
        self.batches = list(lengths)  # per epoch: int64 array of batch lengths
        self.floors = list(floors)
        self.cache = cache
        self.batched = batched
        self._next_epoch = 0
        # (epoch, batches to skip, the floor to set, samples of the first
        # remaining batch already done, samples of the epoch done)
        self._resume: tuple[int, int, int, int, int] | None = None
        self.epoch = 0
        #: Positions the prefetcher loads before the first batch is handed out.
        self.head_start = 0
        #: Per epoch, batches of item indices past what the plan covers
        #: (handed out as _Unplanned batches: loaded, not cached). Empty
        #: unless a re-plan expects epochs cut short (DataLoader._replan).
        self.tails: list[list[np.ndarray]] = [[] for _ in lengths]
        #: How the last epoch ended: (epoch, batches run) if the loop left it
        #: early, (epoch, None) if it ran to its end.
        self.observed: tuple[int, int | None] | None = None
        #: The pool batches name (:class:`_OnPool`), once a re-plan made one.
        self.pool: tuple[str, int] | None = None

    def __len__(self) -> int:
        e = min(self._next_epoch, len(self.batches) - 1)
        tail = self.tails[e]
        if self.batched:
            return int(len(self.batches[e])) + len(tail)
        return int(self.batches[e].sum()) + sum(len(b) for b in tail)

    def set_epoch(self, epoch: int) -> None:
        if not 0 <= epoch < len(self.batches):
            raise ValueError(f"this loader was planned for {len(self.batches)} epochs; epoch {epoch} "
                             "is outside them")
        self._next_epoch = int(epoch)

    def grid(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s samples done after each of its batches (planned,
        then past a re-plan's cut): the same whatever re-plans happened."""
        lens = self.batches[epoch]
        tail = self.tails[epoch]
        if tail:
            lens = np.concatenate((lens, np.array([len(t) for t in tail], dtype=np.int64)))
        return np.cumsum(lens, dtype=np.int64)

    def samples_after(self, epoch: int, first: int, yielded: int) -> int:
        """Samples of ``epoch`` done once ``yielded`` batches have come out of
        an iteration that started ``first`` samples into it."""
        if yielded <= 0:
            return int(first)
        grid = self.grid(epoch)
        b = int(np.searchsorted(grid, first, side="right"))  # the batch the first one ends
        return int(grid[min(b + yielded - 1, grid.size - 1)]) if grid.size else 0

    def resume(self, epoch: int, samples_done: int) -> tuple[int, int]:
        """Make the next iteration start ``samples_done`` samples into epoch
        ``epoch``, whatever batch size saved that count: the batch holding the
        next sample comes first, cut to start at it (a short batch), then the
        epoch's batches as they are. Returns (the first position, which
        becomes the floor, see :meth:`resume_floor`; the batches of this
        loader wholly done before it)."""
        self.set_epoch(epoch)
        grid = self.grid(epoch)
        b = int(np.searchsorted(grid, samples_done, side="right"))
        offset = int(samples_done) - (int(grid[b - 1]) if b else 0)
        if b < len(self.starts[epoch]):
            start = int(self.starts[epoch][b]) + offset
        else:  # done, or past the plan's cut: nothing planned runs before the next epoch
            start = self.floors[epoch + 1] if epoch + 1 < len(self.floors) else self.cache.plan.accesses
        if b >= grid.size:
            offset = 0
        self._resume = (int(epoch), b, start, offset, int(samples_done))
        return start, b

    def abandon(self, batches_run: int) -> None:
        """The loop left this epoch early (a ``break``): none of its positions
        that have not run will. Declared at once, not when the next epoch
        starts, so that a worker still loading a batch nobody will take (or a
        prefetcher holding one of its items) gives up instead of waiting for
        reads that will not come. Positions already handed to workers fall
        back to the source if they run now; their batches are dropped."""
        e = self.epoch
        self.observed = (e, int(batches_run))
        self.cache.set_floor(self.floors[e + 1] if e + 1 < len(self.floors) else self.cache.plan.accesses)

    def resume_floor(self, floor: int) -> None:
        """Resume with this floor instead: a node's ranks sharing one pool
        resume at the earliest next batch among them."""
        assert self._resume is not None
        e, b, _, offset, samples = self._resume
        self._resume = (e, b, int(floor), offset, samples)

    def __iter__(self) -> Iterator[Any]:
        # torch may create an iterator and drop it unused (its multi-process
        # iterator calls iter() twice), so the epoch is taken at the first
        # next(), not here.
        return self._generate()

    def _generate(self) -> Iterator[Any]:
        e = self._next_epoch
        if e >= len(self.batches):
            raise RuntimeError(
                f"this loader was planned for {len(self.batches)} epochs and they are all used; "
                "build it with a larger epochs= to train longer"
            )
        self._next_epoch = e + 1
        skip, floor, cut = 0, self.floors[e], 0
        if self._resume is not None and self._resume[0] == e:
            _, skip, floor, cut, _ = self._resume
        self._resume = None
        self.epoch = e
        # This runs at the first next(): by then torch has finished the
        # previous epoch's outstanding batches, so positions before the floor
        # that never ran never will.
        # (Resuming: nothing below the resumed position will run.)
        self.cache.set_floor(floor)
        # The workers exist by now (torch forks them before asking for the
        # first batch): start prefetching, once, in this process, and give it
        # a head start on the batches the workers get first.
        planned = len(self.starts[e])
        first = int(self.starts[e][skip]) + cut if skip < planned else floor
        self.cache.start_prefetch((first, first + self.head_start))
        for start, n in zip(self.starts[e][skip:].tolist(), self.batches[e][skip:].tolist()):
            # A resume mid-batch (saved with another batch size) starts at
            # its sample: the first batch is short.
            start, n, cut = start + cut, n - cut, 0
            if not self.batched:
                yield from range(start, start + n)
            elif self.pool is None:
                yield list(range(start, start + n))
            else:
                batch = _OnPool(range(start, start + n))
                batch.pool = self.pool
                yield batch
        for items in self.tails[e][max(0, skip - planned):]:
            yield _Unplanned(items[cut:].tolist())  # re-plans happen only for batched loaders
            cut = 0


class _CountingIter:
    """The DataLoader iterator, counting batches for state_dict(); dropped
    before the end of its epoch, it declares the rest of the epoch skipped
    (:meth:`PositionBatchSampler.abandon`) before torch shuts its workers down."""

    def __init__(self, loader: DataLoader, it: Any) -> None:
        self._loader = loader
        self._it = it
        self._started = self._done = False

    def __iter__(self) -> _CountingIter:
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
        except BaseException:
            self._release()  # failed: a new iter() may start
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


class _Reporter:
    """``log_every``: live figures every N batches (in the main process,
    as batches come out of the loader), to a callback, TensorBoard, or a
    line on standard error."""

    def __init__(self, every: int, on_stats: Callable[[dict[str, Any]], Any] | None,
                 tensorboard: Any) -> None:
        self.every = every
        self.on_stats = on_stats
        self.tensorboard = tensorboard
        self.step = 0  # batches over all epochs: TensorBoard's global step
        self._last: tuple[float, dict[str, Any], int] | None = None

    @classmethod
    def make(cls, every: Any, on_stats: Any, tensorboard: Any) -> _Reporter | None:
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
        pf = cache._prefetch_box[0]
        if pf is not None:
            fig["prefetch_threads"] = int(pf.stats().get("active", 0))
        self._last = (now, view, int(storage or 0))
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


def handover_spare(plan: Plan, window: int) -> int:
    """Spare pages for a prefetching pool (``opt4_pool_opts.spare_pages``):
    enough that an ADMIT's pages were last read about ``window`` positions
    before it, twice over. Each ADMIT takes the pages freed longest ago, so
    the distance is the spare pages over the pages admitted per position
    (docs/prefetch.md, "Handover"). It depends on how fast the plan admits,
    not on the cache's size: about ``2 * window`` admitted items' pages,
    and never more than an eighth of the plan's pages (a small cache pays at
    most 12.5 % more memory; a large one a few items' worth)."""
    if plan.accesses == 0 or plan.admits == 0:
        return 0
    kinds = plan.kinds
    if plan.sized:
        sizes = plan.item_sizes
        assert sizes is not None
        page = max(int(plan.page_size), 1)
        admitted = np.maximum(1, -(-sizes[plan.seq[kinds == ADMIT]].astype(np.int64) // page)).sum()
    else:
        admitted = int(plan.admits)
    spare = math.ceil(2 * window * int(admitted) / plan.accesses)
    return int(min(spare, int(plan._info["slots"]) // 8))


#: Bytes the staging ring takes by default (64 slots at most, 8 at least):
#: memory beyond the cache that prefetching needs for the items it loads
#: ahead that the cache does not keep (BYPASSes).
STAGING_BUDGET = 4 << 20

#: The most prefetch threads reading at once, by default: the depth follows
#: what the workers need, up to this (src/io/prefetcher.c, "Depth").
PREFETCH_MAX_THREADS = 64

#: Bytes added to each given item size for the record header (type, shape).
CODEC_MARGIN = 128


def _item_sizes(dataset: Any, item_bytes: Any, n_items: int, progress: bool | None) -> np.ndarray | None:
    """Per-item stored sizes, if the caller gave them (or the dataset has
    opt4_item_bytes); None for one size for all."""
    if item_bytes is None:
        item_bytes = getattr(dataset, "opt4_item_bytes", None)
        if item_bytes is None:
            return None
    if isinstance(item_bytes, (int, np.integer)) and not isinstance(item_bytes, bool):
        return None
    if callable(item_bytes):
        from ._progress import progress_bar

        sizes = np.empty(n_items, dtype=np.uint64)
        with progress_bar(total=n_items, desc="item sizes", unit="item",
                          show=progress if progress is not None else (None if n_items > 100_000 else False)) as bar:
            for i in range(n_items):
                sizes[i] = int(item_bytes(i))
                if i % 4096 == 4095:
                    bar.update(4096)
    else:
        sizes = np.asarray(item_bytes, dtype=np.int64)
        if sizes.shape != (n_items,) or (sizes < 0).any():
            raise ValueError(f"item_bytes as a sequence needs {n_items} non-negative sizes, one per item")
        sizes = sizes.astype(np.uint64)
    return sizes + np.uint64(CODEC_MARGIN)


def _node_group() -> tuple[Any, int, int]:
    """The process group of this node's ranks (torchrun numbers them
    contiguously per node), this rank in it, and its size."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("share_across_ranks needs torch.distributed initialised "
                           "(torch.distributed.init_process_group) before the loader is built")
    world, rank = dist.get_world_size(), dist.get_rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world == local:
        return dist.group.WORLD, rank, world
    groups = [dist.new_group(list(range(n * local, (n + 1) * local))) for n in range(world // local)]
    return groups[rank // local], rank % local, local


def _interleave_ranks(per_epoch_idx: list[np.ndarray], per_epoch_lengths: list[np.ndarray], group: Any,
                      rank: int, world: int) -> tuple[np.ndarray, list[np.ndarray], list[int], list[np.ndarray]]:
    """One sequence for a node's ranks, as data-parallel training reads it:
    epoch by epoch, step by step, rank 0's batch, then rank 1's, ...
    (:func:`opt4torch.cluster.interleave`, the order cluster plans use too).
    Returns the sequence, this rank's batch starts per epoch (global
    positions), the epochs' first positions, and this rank's batch lengths."""
    import torch.distributed as dist

    from .cluster import interleave

    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, (per_epoch_idx, per_epoch_lengths), group=group)
    timeline, starts, floors = interleave([e[0] for e in everyone], [e[1] for e in everyone])
    return timeline.seq, starts[rank], floors, per_epoch_lengths


def _cluster_setup(dataset: Any, *, batch_size: int, shuffle: bool | None, sampler: Any, seed: int | None,
                   epochs: int, cache_bytes: Any, cache_items: int | None, item_bytes: Any, page_size: int | None,
                   allow_pickle: bool, window: int, timeout: float, progress: bool | None) -> dict[str, Any]:
    """``cluster=True``: the job's cluster plan over every node's memory
    (:func:`opt4torch.cluster.job_plan`, windows of ``window`` steps), this
    node's part of it as the pool's plan, this rank's batches as node-plan
    positions, and a gloo group of the loader's own for the transfers."""
    import datetime

    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    from .cluster import job_plan

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("cluster=True runs under torch.distributed (torchrun): call "
                           "torch.distributed.init_process_group before building the loader")
    world, rank = dist.get_world_size(), dist.get_rank()
    n_items = len(dataset)
    if sampler is None:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=bool(shuffle),
                                     seed=0 if seed is None else int(seed))
    elif not isinstance(sampler, DistributedSampler):
        raise ValueError("cluster=True plans every rank's order, which it knows from a DistributedSampler: "
                         f"give one as sampler= (or none, with shuffle= and seed=), not {type(sampler).__name__}")
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=float(timeout)))
    sizes = _item_sizes(dataset, item_bytes, n_items, progress)
    if sizes is not None and cache_items is not None:
        raise ValueError("per-item sizes plan the cache in bytes: give cache_bytes= (a node's), not cache_items=")
    capacity: dict[str, Any]
    pool_page = 0
    if sizes is None:
        if item_bytes is None:
            lo, hi = _probe_item_bytes(dataset, np.arange(n_items), allow_pickle)
            item_bytes = hi
        pool_page = int(item_bytes)
        per_node = int(cache_items) if cache_items is not None else parse_bytes(cache_bytes) // pool_page
        if per_node < 1:
            raise ValueError(f"cache_bytes={cache_bytes!r} holds no item of {pool_page} bytes")
        capacity = dict(capacity_per_node=min(per_node, n_items), item_bytes=pool_page)
    else:
        capacity = dict(cache_bytes=parse_bytes(cache_bytes), item_sizes=sizes, page_size=page_size)
    cp, node = job_plan(sampler, epochs, batch_size=int(batch_size), window=int(window), group=group,
                        progress=progress, **capacity)
    # The ranks of each node: its first one (the leader) owns the node's pool
    # and runs its transfers, on a group of the leaders (the plan's group
    # when every rank is a node).
    node_of_rank = np.full(world, -1, dtype=np.int64)
    node_of_rank[cp.timeline.rank] = cp.reader
    if (node_of_rank < 0).any():
        raise ValueError(f"ranks {np.flatnonzero(node_of_rank < 0).tolist()} read nothing in the cluster "
                         "plan: every rank needs at least one sample")
    leaders = [int(np.flatnonzero(node_of_rank == n)[0]) for n in range(cp.n_nodes)]
    exchange_group, peers = group, list(range(cp.n_nodes))
    if cp.n_nodes != world:
        ordered = sorted(leaders)
        exchange_group = dist.new_group(ordered, backend="gloo", timeout=datetime.timedelta(seconds=float(timeout)))
        peers = [ordered.index(r) for r in leaders]
    node_plan = cp.node_plan(node)
    plan = cp.pool_plan(node, node_plan)
    # This rank's batches, as positions of its node's plan: each batch is a
    # step of one rank, so its reads are one run of the plan (a window's
    # RECEIVEs and SENDs come before its reads).
    reads = node_plan.reads
    reads = reads[cp.timeline.rank[node_plan.position[reads]] == rank]
    per_epoch = len(sampler)
    starts, own, floors = [], [], []
    done = 0
    for _ in range(epochs):
        lengths = np.full(per_epoch // int(batch_size), int(batch_size), dtype=np.int64)
        if per_epoch % int(batch_size):
            lengths = np.append(lengths, per_epoch % int(batch_size))
        first = done + np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        starts.append(reads[first].astype(np.int64))
        own.append(lengths)
        floors.append(0)  # the transfer thread's positions of a window come before its reads
        for f, n in zip(first.tolist(), lengths.tolist()):
            assert reads[f + n - 1] - reads[f] == n - 1, "a batch split by the node plan"
        done += per_epoch
    raw = None if sizes is None else sizes.astype(np.int64) - CODEC_MARGIN
    return dict(cp=cp, node=node, node_plan=node_plan, plan=plan, pool_page=pool_page, group=group,
                exchange_group=exchange_group, peers=peers, leader=leaders[node], starts=starts, own=own,
                floors=floors, seq=node_plan.seq, storage_sizes=raw)


def _probe_item_bytes(dataset: Any, seq: np.ndarray, allow_pickle: bool, probes: int = 16) -> tuple[int, int]:
    """Encoded sizes of a few items spread over the sequence: (min, max)."""
    picks = np.unique(seq[np.linspace(0, seq.size - 1, num=min(probes, seq.size)).astype(np.int64)])
    sizes = [encoded_size(encode(dataset[int(i)], allow_pickle)) for i in picks]
    return min(sizes), max(sizes)


def _layout_digest(starts: list[np.ndarray], lengths: list[np.ndarray], floors: list[int], *,
                   shared: bool) -> int:
    """64 bits naming how the sequence splits into epochs (each one's first
    position and sample count) and, for ranks sharing one sequence, which
    runs of positions are this rank's. Batch sizes do not enter, except
    through those runs: a state resumes across batch sizes by position."""
    import hashlib

    h = hashlib.blake2b(digest_size=8)
    h.update(np.array(floors, dtype=np.int64).tobytes())
    h.update(np.array([int(lens.sum()) for lens in lengths], dtype=np.int64).tobytes())
    for e, lens in enumerate(lengths if shared else ()):
        if lens.size:
            s = np.asarray(starts[e], dtype=np.int64)
            ends = s + lens
            cut = np.flatnonzero(s[1:] != ends[:-1]) + 1  # where a run of this rank's positions breaks
            h.update(s[np.r_[0, cut]].tobytes())
            h.update(ends[np.r_[cut - 1, ends.size - 1]].tobytes())
    return int.from_bytes(h.digest(), "little")


#: The largest position count the engine takes (an unsigned 64-bit word, kept
#: clear of its top bit).
_MAX_POSITIONS = (1 << 63) - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_arguments(batch_size: Any, cache_bytes: Any, cache_items: Any, wait_timeout: Any,
                     lookahead: Any) -> None:
    """Refuse odd arguments up front, naming the argument, rather than let a
    raw error (or a silent coercion) come out of the middle of planning."""
    if batch_size is not None and (not _is_int(batch_size) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive integer (or None for unbatched samples), "
                         f"got {batch_size!r}")
    if cache_items is not None and not _is_int(cache_items):
        raise ValueError(f"cache_items must be an integer number of items, got {cache_items!r} "
                         f"({type(cache_items).__name__}); give cache_bytes= for a size in bytes")
    if cache_bytes is not None:
        try:
            parse_bytes(cache_bytes)
        except ValueError as exc:
            raise ValueError(f"cache_bytes: {exc}") from None
    # The engine counts it in whole milliseconds (0 would mean its default),
    # then in 64-bit nanoseconds (which 1e9 s keeps clear of overflow).
    if (isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float, np.integer, np.floating))
            or not 0.001 <= wait_timeout <= 1e9):
        raise ValueError(f"wait_timeout must be a number of seconds from 0.001 to 1e9, got {wait_timeout!r}")
    if not _is_int(lookahead) or not 1 <= lookahead <= _MAX_POSITIONS:
        raise ValueError(f"lookahead must be a positive integer number of positions up to 2**63 - 1, "
                         f"got {lookahead!r}")


#: What building a loader's plan costs in memory, beyond what the process
#: held before, measured by peak RSS (tests/python/test_memory.py checks
#: these within 25 %). A plan in items: the captured int64s, the next-use
#: arrays and decisions at the peak (54-56 bytes per access at 20 to 40 M
#: accesses), of which the plan and the sequence a re-plan starts from stay
#: (38-40). A plan in bytes (per-item sizes) keeps its page lists too:
#: 106-108 bytes per access at 4 and 20 M accesses, all of it kept, plus
#: about 140 bytes per item (the sizes).
PLAN_PEAK_BYTES_PER_ACCESS = 56
PLAN_KEPT_BYTES_PER_ACCESS = 40
SIZED_PLAN_BYTES_PER_ACCESS = 110
SIZED_PLAN_BYTES_PER_ITEM = 140
#: Above this estimate of the peak, building a plan warns with its cost first.
PLAN_WARN_BYTES = 1 << 30


def plan_cost(accesses: int, items: int, sized: bool) -> tuple[int, int]:
    """Bytes of memory a loader's plan takes beyond what the process held
    before building it: (at the peak of building it, kept while training)."""
    if sized:
        cost = accesses * SIZED_PLAN_BYTES_PER_ACCESS + items * SIZED_PLAN_BYTES_PER_ITEM
        return cost, cost
    return accesses * PLAN_PEAK_BYTES_PER_ACCESS, accesses * PLAN_KEPT_BYTES_PER_ACCESS


def _resident_bytes() -> int:
    """This process's resident memory now (0 where /proc does not say)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _check_plan_cost(sampler: Any, batch_sampler: Any, epochs: int, items: int, sized: bool) -> None:
    """Say what a plan will cost before building a large one: a warning above
    PLAN_WARN_BYTES, an error above the machine's memory. The figures are
    the plan's own (:func:`plan_cost`) and, next to them, the process's
    whole at the peak, which is what a memory monitor shows."""
    try:
        if batch_sampler is not None:
            inner = getattr(batch_sampler, "sampler", None)
            per_epoch = len(inner) if inner is not None else len(batch_sampler) * int(
                getattr(batch_sampler, "batch_size", 1) or 1)
        else:
            per_epoch = len(sampler)
    except TypeError:
        return  # no length: the capture finds out
    accesses = per_epoch * epochs
    peak, kept = plan_cost(accesses, items, sized)
    if peak <= PLAN_WARN_BYTES:
        return
    now = _resident_bytes()
    gib = float(1 << 30)
    what = (f"a plan of {accesses:,} accesses ({epochs:,} epochs of {per_epoch:,}) takes about "
            f"{peak / gib:,.1f} GiB of memory to capture and build"
            + (f" on top of the {now / gib:,.1f} GiB this process holds ({(now + peak) / gib:,.1f} GiB "
               f"at the peak)" if now else ""))
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        memory = 0
    if memory and now + peak > memory:
        raise ValueError(f"{what}, more than this machine's {memory / gib:,.1f} GiB: give fewer "
                         "epochs= (build a new loader for the next run of epochs)")
    warnings.warn(f"{what}, and keeps {kept / gib:,.1f} GiB while training; give fewer epochs= if that is "
                  "too much", RuntimeWarning, stacklevel=3)


def _refuse_one_shot(sampler: Any, argument: str) -> None:
    """A sampler is iterated once per epoch, at capture: an iterator (a
    generator) is used up by the first and would leave every later epoch,
    and the loader's length, empty."""
    if isinstance(sampler, Iterator):
        raise TypeError(
            f"{argument}={type(sampler).__name__!r} is a one-shot iterator: it cannot be replayed for "
            f"each epoch. Pass something iterable again and again: a list of indices, or a "
            f"torch.utils.data.Sampler whose __iter__ returns a fresh iterator")


class DataLoader(tud.DataLoader):
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
        ``prefetch_threads`` for a fixed count). ``lookahead`` bounds how far
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
                 wait_timeout: float = 10.0, progress: bool | None = None,
                 share_across_ranks: bool = False, page_size: int | None = None,
                 prefetch: bool | None = None, prefetch_threads: int = 8,
                 prefetch_max_threads: int | None = None, lookahead: int = 4096,
                 staging_slots: int | None = None, spare_pages: int | None = None,
                 log_every: int | None = None,
                 on_stats: Callable[[dict[str, Any]], Any] | None = None, tensorboard: Any = None,
                 cluster: bool = False, cluster_window: int = 8, cluster_timeout: float = 60.0,
                 **kwargs: Any) -> None:
        # The arguments as given: load_state_dict rebuilds the loader from
        # them with the seed of a state saved under a drawn one.
        self._init_args: dict[str, Any] = {
            k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")} | kwargs
        # A Hugging Face datasets.Dataset is cached as its encoded rows and
        # formatted after the cache (opt4torch.hfdatasets).
        dataset, transform = adapt_for_loader(dataset, transform)
        if isinstance(dataset, tud.IterableDataset):
            raise TypeError("the OPT cache needs a map-style dataset (with __getitem__ and __len__): "
                            "an IterableDataset has no indices to plan over")
        if (cache_bytes is None) == (cache_items is None):
            raise ValueError("give the cache size as cache_bytes= (e.g. '8GiB') or cache_items=, "
                             "not both and not neither")
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
        _check_arguments(batch_size, cache_bytes, cache_items, wait_timeout, lookahead)
        self._reporter = _Reporter.make(log_every, on_stats, tensorboard)
        if prefetch is None:  # on for record files (C threads); opt-in for other datasets
            # (on for those that ask for it: an object store, whose reads wait without the GIL)
            prefetch = hasattr(dataset, "_prefetch_source") or bool(getattr(dataset, "_prefetch_by_callback", False))
        if prefetch and (isinstance(prefetch_threads, bool) or not 1 <= int(prefetch_threads) <= 256):
            raise ValueError(f"prefetch_threads must be between 1 and 256, got {prefetch_threads!r}")
        if prefetch_max_threads is None:
            prefetch_max_threads = max(int(prefetch_threads), PREFETCH_MAX_THREADS)
        if prefetch and (isinstance(prefetch_max_threads, bool)
                         or not int(prefetch_threads) <= int(prefetch_max_threads) <= 256):
            raise ValueError(f"prefetch_max_threads must be between prefetch_threads ({prefetch_threads}) and 256, "
                             f"got {prefetch_max_threads!r}")
        prefetch_opts = dict(threads=int(prefetch_threads), max_threads=int(prefetch_max_threads),
                             lookahead=int(lookahead), allow_pickle=allow_pickle)
        if prefetch and (isinstance(lookahead, bool) or int(lookahead) < 1):
            raise ValueError(f"lookahead must be a positive number of positions, got {lookahead!r}")
        if staging_slots is None:
            pass  # chosen once the slot size is known (see STAGING_BUDGET)
        elif isinstance(staging_slots, bool) or not 0 <= int(staging_slots) <= 1 << 20:
            raise ValueError(f"staging_slots must be between 0 and 1048576, got {staging_slots!r}")
        n_items = len(dataset)
        # Planned in bytes when sizes per item come (given, or the dataset's
        # opt4_item_bytes) and the cache is in bytes (see step 2 below).
        per_item = item_bytes if item_bytes is not None else getattr(dataset, "opt4_item_bytes", None)
        sized = cache_items is None and per_item is not None and not isinstance(per_item, (int, np.integer))
        _check_plan_cost(dataset if sampler is None else sampler, batch_sampler, epochs, n_items, sized)
        if cluster:
            return self._init_cluster(
                dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
                num_workers=num_workers, drop_last=drop_last, persistent_workers=persistent_workers, seed=seed,
                epochs=epochs, cache_bytes=cache_bytes, cache_items=cache_items, item_bytes=item_bytes,
                page_size=page_size, allow_pickle=allow_pickle, transform=transform, wait_timeout=wait_timeout,
                progress=progress, share_across_ranks=share_across_ranks, prefetch=prefetch,
                prefetch_opts=prefetch_opts, staging_slots=staging_slots, window=cluster_window,
                timeout=cluster_timeout,
                loader_kwargs=dict(collate_fn=collate_fn, pin_memory=pin_memory, timeout=timeout,
                                   worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
                                   generator=generator, prefetch_factor=prefetch_factor,
                                   pin_memory_device=pin_memory_device, **kwargs))

        # 1. The index order, batch by batch, for every epoch.
        batched = batch_size is not None or batch_sampler is not None
        per_epoch_idx, per_epoch_lengths, desc_sampler, used_seed = self._capture(
            dataset, batch_size, shuffle, sampler, batch_sampler, drop_last, generator, epochs, seed,
            progress)
        read_units = getattr(dataset, "opt4_read_units", None)
        if read_units is not None:
            # Rows smaller than a read (opt4torch.Parquet): the plan is over
            # what a read fetches, and the row is taken from it after the
            # cache, at its position (docs/algorithm.md, "Read units").
            dataset, transform, per_epoch_idx = read_units(per_epoch_idx, transform, share_across_ranks)
            n_items = len(dataset)
        group = None
        if share_across_ranks:
            group, rank, world = _node_group()
            seq, starts, floors, own = _interleave_ranks(per_epoch_idx, per_epoch_lengths, group, rank, world)
        else:
            seq = np.concatenate(per_epoch_idx) if per_epoch_idx else np.empty(0, np.int64)
            starts, floors = [], []
            offset = 0
            for lengths in per_epoch_lengths:
                floors.append(offset)
                starts.append(offset + np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
                              if lengths.size else np.empty(0, np.int64))
                offset += int(lengths.sum())
            own = per_epoch_lengths
        if seq.size == 0:
            raise ValueError("the sampler yields no indices: nothing to cache")

        # 2. How large an item is: one size for all (every item gets that many
        # bytes), or a size per item (a plan in bytes over pages).
        import json

        sizes = _item_sizes(dataset, item_bytes, n_items, progress)
        if sizes is not None and cache_items is not None and item_bytes is None:
            # The dataset knows its items' sizes, but the cache was given in
            # items: every item gets the largest one's space.
            item_bytes = int(sizes.max()) if sizes.size else 1
            sizes = None
        desc = json.dumps({"sampler": desc_sampler, "epochs": epochs, "seed": used_seed,
                           "shared_ranks": share_across_ranks})
        if sizes is not None:
            if cache_bytes is None:
                raise ValueError("per-item sizes need the cache size in bytes: give cache_bytes=")
            total = parse_bytes(cache_bytes)
            page = int(page_size) if page_size else choose_page(sizes[np.unique(seq)])
            def make_plan(s: np.ndarray) -> Plan:
                return build_plan(s, items=n_items, capacity_bytes=total, item_sizes=sizes, page_size=page,
                                  bypass=bypass, progress=progress, description=desc)

            plan = make_plan(seq)
            pool_page = 0  # the plan's
        else:
            if item_bytes is None:
                lo, hi = _probe_item_bytes(dataset, seq, allow_pickle)
                if group is not None:  # every rank must agree on the pool's layout
                    probe: list[Any] = [None] * world
                    torch.distributed.all_gather_object(probe, (lo, hi), group=group)
                    lo, hi = min(x[0] for x in probe), max(x[1] for x in probe)
                if lo != hi:
                    warnings.warn(
                        f"items differ in size (between {lo} and {hi} bytes in a sample): every cached "
                        f"item is given {hi} bytes, and larger ones are loaded instead of cached; give "
                        "item_bytes= a size per item (a sequence or a callable) to plan in bytes",
                        RuntimeWarning, stacklevel=2)
                item_bytes = hi
            page = int(item_bytes)  # type: ignore[arg-type]
            if page < 1:
                raise ValueError(f"item_bytes must be positive, got {item_bytes}")
            if cache_items is not None:
                capacity = int(cache_items)
            else:
                capacity = parse_bytes(cache_bytes) // page  # type: ignore[arg-type]
                if capacity < 1:
                    raise ValueError(f"cache_bytes={cache_bytes!r} holds no item of {page} bytes: an "
                                     "item needs at least that much")
            if capacity < 1:
                raise ValueError(f"cache_items must be at least 1, got {cache_items}")
            capacity = min(capacity, n_items)  # a cache larger than the data holds all of it

            def make_plan(s: np.ndarray) -> Plan:
                return build_plan(s, capacity, bypass, items=n_items, progress=progress, description=desc)

            plan = make_plan(seq)
            pool_page = page

        if staging_slots is None:
            # A slot holds the largest item (sized plans) or one page.
            sizes = plan.item_sizes
            slot = int(sizes.max()) if sizes is not None and len(sizes) else int(pool_page or plan.page_size or 1)
            staging_slots = max(8, min(64, STAGING_BUDGET // max(slot, 1))) if prefetch else 0

        # Spare pages keep a prefetched ADMIT's pages read long before it
        # (handover_spare); without prefetch nobody hands over.
        spare_window = 0  # > 0: spare pages follow the plan (a re-plan computes them again)
        if spare_pages is None:
            per_batch = int(batch_size or 1) if batch_sampler is None else int(own[0][:1].sum() or 1)
            spare_window = (max(num_workers, 1) + 1) * per_batch if prefetch else 0
            spare_pages = handover_spare(plan, spare_window) if spare_window else 0
        elif isinstance(spare_pages, bool) or not isinstance(spare_pages, int) or spare_pages < 0:
            raise ValueError(f"spare_pages must be a non-negative integer, got {spare_pages!r}")

        # 3. The plan and the pool (one per node when shared across ranks:
        # local rank 0 creates it, the others attach by name).
        if group is None:
            self.cache = OPTCache(plan, pool_page, wait_timeout=wait_timeout, staging_slots=staging_slots,
                                  spare_pages=spare_pages)
        else:
            name = [None]
            if rank == 0:
                self.cache = OPTCache(plan, pool_page, wait_timeout=wait_timeout,
                                      staging_slots=staging_slots, spare_pages=spare_pages)
                name = [self.cache.name]
            torch.distributed.broadcast_object_list(name, src=torch.distributed.get_global_rank(group, 0),
                                                    group=group)
            if rank != 0:
                self.cache = OPTCache.attach(name[0], plan, pool_page or plan.page_size)
        if hasattr(dataset, "_prefetch_source") or getattr(dataset, "_counts_storage", False):
            self.cache._storage = dataset  # stats() reports what was read from it
        if prefetch:
            # Every rank of a shared pool prefetches: claims keep each miss to one loader.
            self.cache.configure_prefetch(dataset, **prefetch_opts)
        self.shared_across_ranks = share_across_ranks
        # The node's process group, held weakly: a loader that kept it would
        # keep gloo's threads alive past destroy_process_group, to be torn
        # down in the interpreter's finalization, where a thread that drops a
        # collective's tensors dies taking the GIL and aborts the process
        # (std::terminate; seen as rank 1 of a torchrun test dying of SIGABRT).
        self._group = (weakref.ref(group), rank, world) if group is not None else None
        #: The global position the last load_state_dict() resumed at.
        self.resumed_at: int | None = None
        cached = PlannedDataset(dataset, self.cache.name, plan.accesses, n_items, transform=transform,
                               allow_pickle=allow_pickle)
        cached.drop_below_floor = group is None
        self._positions = PositionBatchSampler(starts, own, floors, self.cache, batched=batched)
        if prefetch:
            # What the DataLoader hands out before the first batch comes back:
            # prefetch_factor batches per worker (one batch without workers).
            per_batch = int(batch_size or 1) if batch_sampler is None else int(own[0][:1].sum() or 1)
            ahead = (prefetch_factor or 2) * num_workers if num_workers > 0 else 1
            self._positions.head_start = min(per_batch * ahead, int(lookahead))
        self._batches_done = 0
        #: The plan's fingerprint as built here: a state_dict() names the run
        #: by it, whatever re-plans happened since.
        self._fingerprint = plan.fingerprint
        # The seed that shuffled the order (given or drawn; None for a
        # sampler's or a generator's order), and whether it was drawn here:
        # then a state saved under another drawn seed rebuilds the loader.
        self._seed = used_seed
        self._seed_drawn = seed is None and used_seed is not None
        # Where a state_dict() is: the epoch iterated last (or next, once
        # iter() has been called), the samples of it done when that iteration
        # started, and the batches done then (this loader's batches).
        self._iter_epoch = self._samples_at_iter = self._batches_at_iter = 0
        # What a state names besides the fingerprint (see load_state_dict):
        # the original plan's layout, kept through re-plans.
        self._items = n_items
        self._batch_size = batch_size if batch_sampler is None else None
        self._drop_last = bool(drop_last)
        self._rank = rank if group is not None else 0
        self._orig = (list(starts), list(own), list(floors), plan.accesses)
        self._layout = _layout_digest(starts, own, floors, shared=group is not None)
        # What a re-plan needs (epochs cut short, see _replan). Not for ranks
        # sharing a pool (they would have to agree), or an unbatched loader
        # (its positions go to workers one by one, with nothing to say which
        # pool they are in). ``seen``: how the epochs ended; ``said``: the
        # one warning given.
        self._replan_from: dict[str, Any] | None = None
        if group is None and batched and read_units is None:
            self._replan_from = dict(seq=seq, starts=list(starts), lengths=list(own), make_plan=make_plan,
                                     pool_page=pool_page, wait_timeout=wait_timeout,
                                     staging_slots=staging_slots, spare_pages=spare_pages,
                                     spare_window=spare_window, cut=None, seen=[], said=False,
                                     prefetch=(dataset, prefetch_opts) if prefetch else None)
        #: Re-plans so far: (epoch, batches per epoch the new plan expects, or None for whole epochs).
        self.replans: list[tuple[int, int | None]] = []
        #: The live iterator (weakly: a dropped one no longer counts), under its lock.
        self._live: weakref.ref[_CountingIter] | None = None
        self._live_lock = threading.Lock()
        loader_kwargs = dict(num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory,
                             timeout=timeout, worker_init_fn=worker_init_fn,
                             multiprocessing_context=multiprocessing_context, generator=generator,
                             prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                             pin_memory_device=pin_memory_device, **kwargs)
        if batched:
            super().__init__(cached, batch_sampler=self._positions, **loader_kwargs)
        else:
            super().__init__(cached, batch_size=None, sampler=_Unbatched(self._positions),
                             **loader_kwargs)

    def _init_cluster(self, dataset: Any, *, batch_size: int | None, shuffle: bool | None, sampler: Any,
                      batch_sampler: Any, num_workers: int, drop_last: bool, persistent_workers: bool,
                      seed: int | None, epochs: int, cache_bytes: Any, cache_items: int | None, item_bytes: Any,
                      page_size: int | None, allow_pickle: bool, transform: Any, wait_timeout: float,
                      progress: bool | None, share_across_ranks: bool, prefetch: bool,
                      prefetch_opts: dict[str, Any], staging_slots: int | None, window: int, timeout: float,
                      loader_kwargs: dict[str, Any]) -> None:
        """``cluster=True`` (issue 18; docs/cluster.md): one plan over every
        node's memory. This rank's node keeps a pool that runs its part of
        the plan, and a transfer thread of the loader's own exchanges items
        with the other nodes, window by window of ``cluster_window`` steps,
        on a gloo group of its own with ``cluster_timeout`` seconds a
        collective. The node's ranks share its pool: its first rank makes
        it and runs the transfers, the others attach."""
        from ._exchange import ClusterFollower, ClusterRuntime

        if share_across_ranks:
            raise ValueError("cluster=True plans every node's pool itself: leave share_across_ranks off")
        if batch_sampler is not None or batch_size is None or drop_last:
            raise ValueError("cluster=True needs batch_size= (a DistributedSampler's batches, the last one "
                             "short): batch_sampler, batch_size=None and drop_last are not supported with it")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"cluster_window must be a positive number of steps, got {window!r}")
        if not timeout > 0:
            raise ValueError(f"cluster_timeout must be positive seconds, got {timeout!r}")
        c = _cluster_setup(dataset, batch_size=int(batch_size), shuffle=shuffle, sampler=sampler, seed=seed,
                           epochs=epochs, cache_bytes=cache_bytes, cache_items=cache_items, item_bytes=item_bytes,
                           page_size=page_size, allow_pickle=allow_pickle, window=window, timeout=timeout,
                           progress=progress)
        plan = c["plan"]
        #: The cluster plan every rank made, and this rank's node in it.
        self.cluster_plan, self.node = c["cp"], c["node"]
        sizes = plan.item_sizes
        slot = int(sizes.max()) if sizes is not None and len(sizes) else int(c["pool_page"] or plan.page_size or 1)
        if staging_slots is None:  # peer reads and forwards wait in the staging ring
            staging_slots = max(16, min(64, STAGING_BUDGET // max(slot, 1)))
        # The node's first rank makes its pool and the transfer thread, whose
        # claims come before any prefetcher's; the node's other ranks attach.
        import torch.distributed as dist

        leader = c["leader"] == dist.get_rank()
        name: list[Any] = [None] * dist.get_world_size()
        if leader:
            self.cache = OPTCache(plan, c["pool_page"], wait_timeout=wait_timeout,
                                  staging_slots=int(staging_slots))
            self.cache._prefetch_box[1] = ClusterRuntime(
                c["cp"], c["node_plan"], self.cache.name, dataset, allow_pickle=allow_pickle,
                group=c["exchange_group"], peers=c["peers"], storage_sizes=c["storage_sizes"], timeout=timeout)
        dist.all_gather_object(name, self.cache.name if leader else None, group=c["group"])
        if not leader:
            self.cache = OPTCache.attach(name[c["leader"]], plan, c["pool_page"] or plan.page_size)
            self.cache._prefetch_box[1] = ClusterFollower(c["cp"], c["node_plan"], c["storage_sizes"], c["leader"])
        if hasattr(dataset, "_prefetch_source") or getattr(dataset, "_counts_storage", False):
            self.cache._storage = dataset
        if prefetch:
            self.cache.configure_prefetch(dataset, **prefetch_opts)
        self.shared_across_ranks = False
        self._group = None
        self.resumed_at = None
        starts, own, floors = c["starts"], c["own"], c["floors"]
        cached = PlannedDataset(dataset, self.cache.name, plan.accesses, len(dataset), transform=transform,
                                allow_pickle=allow_pickle)
        self._positions = PositionBatchSampler(starts, own, floors, self.cache, batched=True)
        self._batches_done = 0
        self._fingerprint = plan.fingerprint
        self._seed = None if sampler is not None else (0 if seed is None else int(seed))  # _cluster_setup's
        self._seed_drawn = False
        self._iter_epoch = self._samples_at_iter = self._batches_at_iter = 0
        self._items = len(dataset)
        self._batch_size = batch_size
        self._drop_last = False
        self._rank = 0
        self._orig = (list(starts), list(own), list(floors), plan.accesses)
        self._layout = _layout_digest(starts, own, floors, shared=False)
        self._replan_from = None
        self.replans = []
        self._live = None
        self._live_lock = threading.Lock()
        super().__init__(cached, batch_sampler=self._positions, num_workers=num_workers,
                         persistent_workers=persistent_workers, **loader_kwargs)

    @staticmethod
    def _capture(dataset: Any, batch_size: int | None, shuffle: bool | None, sampler: Any,
                 batch_sampler: Any, drop_last: bool, generator: Any, epochs: int, seed: int | None,
                 progress: bool | None) -> tuple[list[np.ndarray], list[np.ndarray], str, int | None]:
        """Every epoch's indices and batch lengths, the sampler's name, and
        the seed that shuffled them: ``seed``, or the one drawn here for
        ``shuffle=True`` without one (None when the order is a sampler's or
        a generator's)."""
        if batch_sampler is not None:
            if batch_size not in (1, None) or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            from .capture import _as_index, _preserved

            _refuse_one_shot(batch_sampler, "batch_sampler")
            idx, lengths = [], []
            inner = getattr(batch_sampler, "sampler", batch_sampler)
            with _preserved(inner), _preserved(batch_sampler):
                for e in range(epochs):
                    for s in {id(batch_sampler): batch_sampler, id(inner): inner}.values():
                        if callable(getattr(s, "set_epoch", None)):
                            s.set_epoch(e)
                    batches = [list(map(_as_index, b)) for b in batch_sampler]
                    lengths.append(np.array([len(b) for b in batches], dtype=np.int64))
                    idx.append(np.array([i for b in batches for i in b], dtype=np.int64))
            return idx, lengths, type(batch_sampler).__name__, None
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if sampler is not None:
            _refuse_one_shot(sampler, "sampler")
        used: int | None = None
        if sampler is None:
            if shuffle:
                if generator is None:
                    if seed is None:
                        seed = int(torch.empty((), dtype=torch.int64).random_().item())
                    used = int(seed)
                    generator = torch.Generator().manual_seed(used)
                sampler = tud.RandomSampler(dataset, generator=generator)
            else:
                sampler = tud.SequentialSampler(dataset)
        idx, lengths = [], []
        with warnings.catch_warnings():
            # An unseeded sampler is fine here: this loader replays what it
            # captured, whatever the global RNG does later.
            warnings.filterwarnings("ignore", message="the RandomSampler has no generator")
            parts = capture_epochs(sampler, epochs, progress=progress)
        for part in parts:
            if batch_size is None:
                lengths.append(np.ones(part.size, dtype=np.int64))
            else:
                full, rest = divmod(part.size, batch_size)
                if drop_last:
                    part = part[: full * batch_size]
                    rest = 0
                lens = np.full(full, batch_size, dtype=np.int64)
                lengths.append(np.append(lens, rest) if rest else lens)
            idx.append(part)
        return idx, lengths, type(sampler).__name__, used

    # ---- epochs and resuming ----

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
            counting = _CountingIter(self, it)
            self._live = weakref.ref(counting)
        return counting

    # ---- epochs cut short: re-planning ----

    def _maybe_replan(self) -> None:
        """Before an epoch's workers start: if the last epoch ended otherwise
        than the plan expects (cut after k batches by a break or Lightning's
        limit_train_batches, or run whole where the plan expected a cut),
        plan again what remains, from what the pool holds (:meth:`_replan`).

        What the new plan expects of the later epochs: whole epochs, unless
        the last two epochs were both cut after the same k batches (a limit
        on every epoch, not a one-off look at the data); then that cut. One
        cut epoch proves nothing about the next, and a wrong guess costs
        only another re-plan, which keeps the pool too."""
        ctx, pos = self._replan_from, self._positions
        if ctx is None or pos.observed is None or pos._resume is not None:
            return
        epoch, k = pos.observed
        pos.observed = None
        planned = len(pos.batches[epoch]) + len(pos.tails[epoch])
        if k is not None and k >= planned:
            k = None  # every batch was taken, only the iterator was dropped before its end: a whole epoch
        seen = ctx["seen"]
        seen.append(k)
        if pos._next_epoch >= len(pos.batches):
            return
        cut = k if k is not None and seen[-2:] == [k, k] else None
        if cut is not None and cut >= max(len(x) for x in ctx["lengths"][pos._next_epoch:]):
            cut = None  # a cut no later epoch reaches is no cut
        if k == ctx["cut"] and cut == ctx["cut"]:
            return  # as planned
        # Where the run stopped in the current plan: the first batch not
        # run, or the end of the epoch's planned positions.
        if k is not None and k < len(pos.starts[epoch]):
            stop = int(pos.starts[epoch][k])
        else:
            stop = pos.floors[epoch + 1] if epoch + 1 < len(pos.floors) else self.cache.plan.accesses
        how = (f"epoch {epoch} ended after {k} of {planned} batches" if k is not None
               else f"epoch {epoch} ran all {planned} batches where the plan expected {ctx['cut']}")
        self._replan(pos._next_epoch, cut, stop, how)

    def _replan(self, first_epoch: int, cut: int | None, stop: int, how: str) -> None:
        """A new plan and pool for epochs ``first_epoch`` on, each cut to its
        first ``cut`` batches (None: whole). Batches past the cut, if an epoch
        runs on, are loaded and not cached (counted in stats()' ``unplanned``).

        No cold start: the items the old pool holds for reads after ``stop``
        (where the run left the old plan) come first in the new sequence, as
        a prefix nobody reads, so OPT decides which of them to keep as it
        decides everything else; the new pool is warmed with those it keeps,
        copied from the old pool, and the old one is removed. Runs in the
        main process while no worker serves a batch."""
        ctx, pos = self._replan_from, self._positions
        assert ctx is not None
        old = self.cache
        held, reads = old.plan.resident_reads_at(min(max(stop, old._prefix), old.plan.accesses))
        seq, full_starts, full_lengths = ctx["seq"], ctx["starts"], ctx["lengths"]
        pieces: list[np.ndarray] = [held.astype(seq.dtype)]
        starts, lengths, floors, tails = [], [], [], []
        offset = prefix = int(held.size)
        for e in range(first_epoch, len(full_lengths)):
            lens = full_lengths[e]
            n = len(lens) if cut is None else min(cut, len(lens))
            begin = int(full_starts[e][0]) if len(lens) else 0
            end = begin + int(lens[:n].sum())
            pieces.append(seq[begin:end])
            floors.append(offset)
            starts.append(offset + np.concatenate(([0], np.cumsum(lens[:n])[:-1])).astype(np.int64)
                          if n else np.empty(0, np.int64))
            lengths.append(lens[:n])
            tails.append([seq[int(a):int(a) + int(b)] for a, b in zip(full_starts[e][n:], lens[n:])])
            offset += end - begin
        new_seq = np.concatenate(pieces)
        kept = loaded = 0
        if new_seq.size > prefix:
            plan = ctx["make_plan"](new_seq)
            cache = OPTCache(plan, ctx["pool_page"], wait_timeout=ctx["wait_timeout"],
                             staging_slots=ctx["staging_slots"],
                             spare_pages=(handover_spare(plan, ctx["spare_window"]) if ctx["spare_window"]
                                          else min(ctx["spare_pages"], max(int(plan._info["slots"]), 1024))))
            cache._storage = old._storage
            old.stop_prefetch()
            old.hand_over(cache, stop, prefix)
            kept, loaded = self._keep(old, cache, stop, dict(zip(held.tolist(), reads.tolist())))
            cache._earlier["kept"] = cache._earlier.get("kept", 0) + kept
            cache._earlier["kept_loaded"] = cache._earlier.get("kept_loaded", 0) + loaded
            if ctx["prefetch"] is not None:
                ds, opts = ctx["prefetch"]
                cache.configure_prefetch(ds, **opts)
            self.cache = cache
            pos.cache = cache
            pos.pool = (cache.name, plan.accesses)
            self.dataset.retarget(cache.name, plan.accesses)
            old.close()
        for i, e in enumerate(range(first_epoch, len(full_lengths))):
            pos.starts[e], pos.batches[e], pos.floors[e], pos.tails[e] = starts[i], lengths[i], floors[i], tails[i]
        ctx["cut"] = cut
        self.replans.append((first_epoch, cut))
        if not ctx["said"]:  # once per loader: the main process plans, so never once per worker
            ctx["said"] = True
            expect = "whole epochs" if cut is None else f"epochs cut after {cut} batches"
            warnings.warn(f"opt4torch: {how}, so the cache planned epochs {first_epoch}-{len(full_lengths) - 1} "
                          f"again for {expect}, keeping the {kept + loaded} items of the pool that the new plan "
                          "reads (said once; loader.replans lists every re-plan)", RuntimeWarning, stacklevel=4)

    def _keep(self, old: OPTCache, new: OPTCache, stop: int, read_at: dict[int, int]) -> tuple[int, int]:
        """Warm ``new`` with the items its plan keeps from the prefix: each
        copied from ``old``, read at its next read there (``read_at``, at or
        after ``stop``), as bytes; one the old pool no longer holds (a failed
        store, pages a worker took after a ``break``) is loaded from the
        source instead, so the new plan's hits stay exact. Returns how many
        were copied, and how many loaded."""
        # Nothing below stop runs in the old pool any more: a read of an item
        # it never stored gives up at once instead of waiting.
        old.set_floor(stop)
        src, dst = _engine.pool_attach(old.name), _engine.pool_attach(new.name)
        ds: PlannedDataset = self.dataset  # type: ignore[assignment]
        copied = loaded = 0
        try:
            live = [g for g in dst.live_at(new._prefix) if g[0] < new._prefix]
            for i in range(0, len(live), 256):
                chunk = live[i:i + 256]
                data, entries = src.read_batch([read_at[item] for _, item, _ in chunk])
                with memoryview(data) as view:
                    for j, (admit, item, before) in enumerate(chunk):
                        status, _, a, b = entries[j] if j < len(entries) else (_engine.ENTRY_LOAD, 0, 0, 0)
                        if status == _engine.ENTRY_HIT:
                            copied += dst.warm(admit, [view[a:a + b]], before) == 1
                        else:
                            dst.warm(admit, encode(ds.dataset[item], ds.allow_pickle), before)
                            loaded += 1
        finally:
            src.close()
            dst.close()
        return copied, loaded

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

    def state_dict(self) -> dict[str, Any]:
        """Where the run is, by position in the sequence (not by batch):

        ``epoch``
            the epoch iterated (or about to be, once ``iter()`` was called);
        ``samples_done``
            its samples already yielded (of this rank, with
            ``share_across_ranks``);
        ``position``
            the position of the next sample in the plan's sequence, as the
            loader was built (re-plans do not renumber it);
        ``batches_done``
            this loader's batches of the epoch already yielded (kept for
            reading; resuming goes by ``samples_done``);
        ``fingerprint``, ``layout``, ``epochs``, ``items``, ``rank``
            what the state can only resume: the same sequence, split the same
            way into epochs (and ranks), over a dataset of as many items;
        ``batch_size``
            the batch size that saved it, to explain a refusal;
        ``seed``
            the seed that shuffled the order (:attr:`seed`): a loader that
            drew its own seed (``shuffle=True``, no ``seed=``) resumes a
            state saved under another drawn one by planning again with it.

        A state resumes in a loader with another batch size: the next sample
        is the same one; and in a loader planned for more epochs than the
        state's (a run extended), whose first epochs are the state's.
        """
        e = self._iter_epoch
        samples = self._positions.samples_after(e, self._samples_at_iter,
                                                self._batches_done - self._batches_at_iter)
        return {
            "epoch": e,
            "batches_done": self._batches_done,
            "fingerprint": self._fingerprint,
            "epochs": len(self._positions.batches),
            "samples_done": samples,
            "position": self._orig_position(e, samples),
            "items": self._items,
            "layout": self._layout,
            "rank": self._rank,
            "batch_size": self._batch_size,
            "seed": self._seed,
        }

    def _orig_position(self, epoch: int, samples: int) -> int:
        """The position, in the plan as built, of epoch ``epoch``'s sample
        after ``samples`` done (past its last: the next epoch's first)."""
        starts, lengths, floors, accesses = self._orig
        ends = np.cumsum(lengths[epoch], dtype=np.int64)
        if samples >= (int(ends[-1]) if ends.size else 0):
            return int(floors[epoch + 1]) if epoch + 1 < len(floors) else int(accesses)
        b = int(np.searchsorted(ends, samples, side="right"))
        return int(starts[epoch][b]) + samples - (int(ends[b - 1]) if b else 0)

    def _check_state(self, state: Any) -> tuple[int, int]:
        """The (epoch, samples done) a state resumes at, or a refusal that
        names the key at fault. Changes nothing."""
        from collections.abc import Mapping

        if not isinstance(state, Mapping):
            raise TypeError(f"load_state_dict takes the dict state_dict() returned, got "
                            f"{type(state).__name__}")
        old_keys = ("epoch", "batches_done", "fingerprint", "epochs")
        new_keys = ("samples_done", "position", "items", "layout", "rank", "batch_size")
        legacy = all(k in state for k in old_keys) and not any(k in state for k in new_keys)
        for key in old_keys + (() if legacy else new_keys):
            if key not in state:
                raise ValueError(
                    f"the state has no {key!r}: it is not (all of) a state_dict() of an "
                    "opt4torch.DataLoader. Pass the dict state_dict() returned, whole")
        for key in old_keys + (() if legacy else new_keys):
            value = state[key]
            if not _is_int(value) and not (key == "batch_size" and value is None):
                raise TypeError(f"state[{key!r}] must be an integer, got {value!r} ({type(value).__name__})")
        seed = state.get("seed")  # absent in states of an earlier opt4torch
        if seed is not None and not _is_int(seed):
            raise TypeError(f"state['seed'] must be an integer or None, got {seed!r} ({type(seed).__name__})")
        pos = self._positions
        epochs = len(pos.batches)
        if not legacy and int(state["items"]) != self._items:
            raise ValueError(
                f"state['items'] is {int(state['items'])}: the state was saved by a loader over a dataset "
                f"of {int(state['items'])} items, and this loader's dataset has {self._items}. Resume with "
                "the dataset the state was saved with")
        # A loader planned for more epochs resumes a state of fewer (a run
        # extended): the state names the first ones, which must be the same.
        saved_epochs = int(state["epochs"])
        if not 1 <= saved_epochs <= epochs:
            raise ValueError(
                f"state['epochs'] is {saved_epochs} but this loader was planned for {epochs} "
                f"epochs: build it with epochs={saved_epochs} (or more) to resume this state")
        if int(state["fingerprint"]) != self._fingerprint_of(saved_epochs):
            why = ("sampler, seed, epochs or dataset differ"
                   + ("" if self.shared_across_ranks else ", or drop_last dropped another tail"))
            if seed is not None and self._seed is not None and int(seed) != self._seed:
                why = (f"state['seed'] is {int(seed)} and this loader's seed is {self._seed}: build it with "
                       f"seed={int(seed)} (or without seed=, to plan again with the state's)")
            saved = None if legacy else state["batch_size"]
            if saved is not None and self._batch_size is not None and int(saved) != self._batch_size:
                if self.shared_across_ranks:
                    why = (f"with share_across_ranks the node's sequence interleaves the ranks batch by "
                           f"batch, so batch_size={int(saved)} (saved) and {self._batch_size} (here) are two "
                           f"sequences: resume with batch_size={int(saved)}")
                elif self._drop_last:
                    why = (f"drop_last=True drops another tail of each epoch with batch_size={int(saved)} "
                           f"(saved) than with {self._batch_size} (here), so another sequence: resume with "
                           f"batch_size={int(saved)}, or build both loaders with drop_last=False")
            raise ValueError("this state was saved by a loader with another plan (state['fingerprint'] "
                             f"differs: {why}): it cannot resume here")
        if not legacy:
            if self.shared_across_ranks and int(state["rank"]) != self._rank:
                raise ValueError(f"state['rank'] is {int(state['rank'])} but this is rank {self._rank} of "
                                 "the node's shared pool: each rank resumes the state it saved")
            if int(state["layout"]) != self._layout_of(saved_epochs):
                raise ValueError(
                    "state['layout'] differs: the same sequence was split otherwise into epochs (or, with "
                    "share_across_ranks, into the ranks' batches), so the samples that come next are not "
                    "the same here; resume with the sampler and batching the state was saved with")
        epoch = int(state["epoch"])
        if not 0 <= epoch < saved_epochs:
            whose = "this loader's" if saved_epochs == epochs else f"the state's (a run of {saved_epochs})"
            raise ValueError(f"state['epoch'] is {epoch}: {whose} epochs are 0 to {saved_epochs - 1}")
        batches = int(state["batches_done"])
        if batches < 0:
            raise ValueError(f"state['batches_done'] is {batches}: a count of batches cannot be negative")
        grid = pos.grid(epoch)
        total = int(grid[-1]) if grid.size else 0
        if legacy:
            # Saved before states recorded positions: its batches are taken
            # for this loader's, which is right only with the same batching.
            if batches > grid.size:
                raise ValueError(f"state['batches_done'] is {batches}, past the end of epoch {epoch} "
                                 f"({grid.size} batches)")
            warnings.warn("this state has no 'samples_done' (saved by an earlier opt4torch): it resumes "
                          f"after {batches} batches of this loader, which is the saved position only if the "
                          "batch size is the one it was saved with", RuntimeWarning, stacklevel=3)
            return epoch, int(grid[batches - 1]) if batches else 0
        samples = int(state["samples_done"])
        if not 0 <= samples <= total:
            raise ValueError(f"state['samples_done'] is {samples}, outside epoch {epoch}, which has {total} "
                             "samples: the state is not one this loader saved (edited, or another run's)")
        expected = self._orig_position(epoch, samples)
        if int(state["position"]) != expected:
            raise ValueError(
                f"state['position'] is {int(state['position'])}, but {samples} samples into epoch {epoch} is "
                f"position {expected} (of {self._orig[3]}): the state's keys disagree (edited, or mixed "
                "from two states)")
        return epoch, samples

    def _fingerprint_of(self, epochs: int) -> int:
        """The fingerprint of this loader's first ``epochs`` epochs, as
        built (a state of a run planned for that many)."""
        if epochs == len(self._orig[2]):
            return self._fingerprint
        from ._plan import fingerprint

        # The sequence as built: re-plans cut the pool's; their context keeps it whole.
        seq = self._replan_from["seq"] if self.replans and self._replan_from is not None else self.cache.plan.seq
        return fingerprint(seq[:int(self._orig[2][epochs])], self._items)

    def _layout_of(self, epochs: int) -> int:
        """The layout digest of this loader's first ``epochs`` epochs."""
        if epochs == len(self._orig[2]):
            return self._layout
        starts, lengths, floors, _ = self._orig
        return _layout_digest(starts[:epochs], lengths[:epochs], floors[:epochs], shared=self._group is not None)

    def _reseeded(self, state: Any) -> DataLoader | None:
        """This loader built again with the seed of ``state``, when this
        one drew its seed and the state was saved under another (a new
        process draws a new one); None when the order stays."""
        from collections.abc import Mapping

        seed = state.get("seed") if isinstance(state, Mapping) else None
        if not self._seed_drawn or not _is_int(seed) or int(seed) == self._seed:
            return None
        seed = int(seed)
        if self._group is not None:
            raise ValueError(f"state['seed'] is {seed} (drawn by the loader that saved it) and this loader drew "
                             f"{self._seed}: ranks sharing a pool plan together only when built, so build this "
                             f"loader with seed=state['seed'] ({seed}) to resume the state")
        live = self._live() if self._live is not None else None
        if live is not None or self._iterator is not None:
            raise RuntimeError(f"state['seed'] is {seed} and this loader drew {self._seed}: resuming it means "
                               "planning again with the state's seed, which cannot happen under an iterator "
                               "or persistent workers that serve this plan. Call load_state_dict before "
                               f"iterating, or build the loader with seed={seed}")
        fresh = DataLoader.__new__(type(self))
        DataLoader.__init__(fresh, **{**self._init_args, "seed": seed})
        return fresh

    def _adopt(self, fresh: DataLoader) -> None:
        """Become ``fresh``, this loader built again with another seed: its
        plan, pool, positions and torch's state over them. This loader's
        pool goes. Its seed still counts as drawn (a later state may name
        another)."""
        old, reporter = self.cache, self._reporter
        self.__dict__.update(fresh.__dict__)  # past torch's guard on dataset and batch_sampler
        self._reporter = reporter
        self._seed_drawn = True
        self._init_args = {**self._init_args, "seed": None}
        old.close()

    def load_state_dict(self, state: dict[str, Any], *, warm: bool = True) -> None:
        """Resume at the saved position: the next sample is the one that
        would have come next, whatever the batch size (a batch that the saved
        position cuts comes first, short). Warm the pool with the items the
        plan holds there (loaded now, so the first batches hit). A state that
        cannot resume here is refused, naming the key at fault.

        With ``share_across_ranks=True`` every rank of the node must call it
        (it is collective, like the constructor), with the state it saved at
        the same training step: the node resumes at its earliest next batch,
        and local rank 0 warms the one pool for all of them. A state one rank
        refuses is refused on every rank (none waits for the others).

        A loader that drew its seed (``shuffle=True`` without ``seed=``)
        resumes a state saved under another drawn seed (``state['seed']``)
        by planning again with that one, before anything else: building
        the loader with ``seed=state['seed']`` saves that second plan."""
        if getattr(self, "cluster_plan", None) is not None:
            raise RuntimeError("resuming a cluster=True loader from a state is not built yet: every node would "
                               "have to resume its transfers at the same window (docs/cluster.md)")
        fresh = self._reseeded(state)
        if fresh is not None:
            try:
                fresh._check_state(state)
            except BaseException:
                fresh.cache.close()
                raise
            self._adopt(fresh)
        if self._group is None:
            epoch, samples = self._check_state(state)
            start, batches = self._positions.resume(epoch, samples)
            self.cache.set_floor(start)
            if warm:
                self._warm(start)
        else:
            # Ranks sharing the pool: a collective call. The node resumes at
            # its earliest next batch (in lockstep, rank 0's); local rank 0
            # warms the pool for everyone, and nobody reads before it has.
            # Every rank checks its state first and all hear of a refusal.
            import torch.distributed as dist

            group_ref, rank, world = self._group
            group = group_ref()
            if group is None:
                raise RuntimeError("load_state_dict with share_across_ranks=True is a collective call on the "
                                   "process group the loader was built on, which is gone "
                                   "(torch.distributed.destroy_process_group was called): resume in a loader "
                                   "built after init_process_group")
            try:
                epoch, samples = self._check_state(state)
                error: BaseException | None = None
            except (TypeError, ValueError) as exc:
                error = exc
            outcomes: list[Any] = [None] * world
            dist.all_gather_object(outcomes, None if error is None else str(error), group=group)
            if error is not None:
                # Raised with no local left naming it: a frame holding its own
                # exception is a cycle (frame -> error -> traceback -> frame)
                # that keeps ``group`` alive until the collector runs, after
                # destroy_process_group; then gloo's threads outlive the group
                # into the interpreter's finalization, and the rank aborts
                # (std::terminate; rank 1 of a torchrun test died of SIGABRT).
                try:
                    raise error
                finally:
                    del error, group
            refused = [(r, msg) for r, msg in enumerate(outcomes) if msg is not None]
            if refused:
                r, msg = refused[0]
                raise ValueError(f"rank {r} of the node refused its state, so no rank resumes: {msg}")
            start, batches = self._positions.resume(epoch, samples)
            starts: list[Any] = [None] * world
            dist.all_gather_object(starts, start, group=group)
            start = min(starts)
            self._positions.resume_floor(start)
            self.cache.set_floor(start)
            if warm and rank == 0:
                self._warm(start)
            dist.barrier(group=group)
        self._iter_epoch, self._samples_at_iter = epoch, samples
        self._batches_done = self._batches_at_iter = batches
        self.resumed_at = start

    def _warm(self, position: int) -> int:
        owner = _engine.pool_attach(self.cache.name)
        try:
            live = owner.live_at(position)
            ds: PlannedDataset = self.dataset  # type: ignore[assignment]
            stored = 0
            for admit, item, before in live:
                stored += owner.warm(admit, encode(ds.dataset[item], ds.allow_pickle), before) == 1
            return stored
        finally:
            owner.close()


class _Unbatched(tud.Sampler[int]):
    """Positions one by one (batch_size=None)."""

    def __init__(self, positions: PositionBatchSampler) -> None:
        self.positions = positions

    def __len__(self) -> int:
        return len(self.positions)

    def __iter__(self) -> Iterator[int]:
        return iter(self.positions)
