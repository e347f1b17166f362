"""The earlier design's CachedDataset and AsyncPrefetchDataset, plan-aware.

* :class:`CachedDataset` preloads a dataset into memory (optionally pinned)
  and returns zero-copy views. Given the order the sampler will follow and a
  memory budget smaller than the data, it preloads the items that order uses
  most, and loads the others on demand.
* :class:`AsyncPrefetchDataset` loads items on background threads ahead of the
  consumer. Given the order, the threads load exactly the items that will be
  asked for next; without it, the indices after the last one asked for.

Users import them as before: ``from opt4torch.preload import CachedDataset,
AsyncPrefetchDataset`` (that module is this one), or as ``opt4torch.CachedDataset``
and ``opt4torch.AsyncPrefetchDataset``. The position-mapped dataset that
``opt4torch.DataLoader`` builds is another thing, :class:`opt4torch.loader.worker.PlannedDataset`.

Threads help when a load waits without holding the GIL (file and network
reads, ``time.sleep``-like latency, decoders that release it); a CPU-bound
load in Python needs processes: DataLoader workers. The two combine: each
worker process starts its own threads on first use. See
docs/python-prefetch.md.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from ..io.forksafe import ForkGate
from ..planning.plan import Plan, as_sequence
from ..loader.device import map_tensors

__all__ = ["CachedDataset", "AsyncPrefetchDataset", "freq_ranking", "item_nbytes"]

# How long a thread or consumer waits on the condition before looking at the
# stop flag again (a notify wakes them at once; this only bounds a lost wake).
_POLL = 0.1
_JOIN_TIMEOUT = 5.0


def _order_array(order: Any, n: int) -> np.ndarray:
    """``order`` (ints, an array, a tensor or a Plan) as int64, checked against n."""
    if isinstance(order, Plan):
        seq = np.asarray(order.seq, dtype=np.int64)
    else:
        if isinstance(order, torch.Tensor):
            order = order.detach().cpu().numpy()
        if len(order) == 0:
            return np.empty(0, dtype=np.int64)
        seq, _ = as_sequence(order, None)
        seq = np.asarray(seq, dtype=np.int64)
    if seq.size:
        low, high = int(seq.min()), int(seq.max())
        if low < 0 or high >= n:
            bad = int(np.argmax((seq < 0) | (seq >= n)))
            raise IndexError(
                f"order[{bad}] = {int(seq[bad])} is not an index of the dataset (it has {n} items): "
                "pass the order of this dataset's sampler, e.g. opt4torch.capture(sampler, epochs)"
            )
    return seq


def freq_ranking(order: Any, n: int) -> np.ndarray:
    """The indices ``order`` uses, most used first, ties to the lower index.

    This is the "freq" placement: for a cache that holds a fixed set of ``k``
    items, its first ``k`` get the most hits over ``order``. Unused indices
    are left out.
    """
    seq = _order_array(order, n)
    counts = np.bincount(seq, minlength=n)
    used = np.flatnonzero(counts)
    # lexsort sorts by the last key first: count descending, then index.
    return used[np.lexsort((used, -counts[used]))].astype(np.int64)


def item_nbytes(obj: Any) -> int:
    """The bytes an item holds: tensors and arrays by their data, bytes-like by
    length, containers by their contents, anything else by ``sys.getsizeof``
    (an estimate)."""
    if isinstance(obj, torch.Tensor):
        return obj.element_size() * obj.nelement()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, dict):
        return sum(item_nbytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(item_nbytes(v) for v in obj)
    return sys.getsizeof(obj)


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _index(i: Any, n: int) -> int:
    try:
        k = i.__index__()
    except AttributeError:
        if isinstance(i, torch.Tensor) and i.numel() == 1 and not i.is_floating_point():
            k = int(i.item())
        else:
            raise TypeError(f"dataset indices must be integers, got {type(i).__name__}") from None
    if k < 0:
        k += n
    if not 0 <= k < n:
        raise IndexError(f"index {i} is out of range for a dataset of {n} items")
    return k


# ---------------------------------------------------------------- CachedDataset


class CachedDataset(tud.Dataset):
    """``data`` preloaded into memory; items are zero-copy views.

    ``data`` is a tensor (item ``i`` is ``data[i]``), a numpy array (rows become
    tensors), or any sequence or map-style dataset (items are kept as the
    dataset returns them).

    * Without ``budget_bytes``, everything is preloaded (the earlier design).
      An in-memory tensor is used as it is, without a copy, unless it must be
      pinned.
    * With ``budget_bytes`` and ``order`` (the indices the sampler will ask
      for, in order: an int sequence, a numpy array, a tensor, or an opt4torch
      :class:`~opt4torch.Plan`), only the items ``order`` uses most are
      preloaded (:func:`freq_ranking`), as many as fit in the budget: the
      ranking is followed until the next item does not fit. The others are
      loaded from ``data`` when asked for.
    * ``budget_bytes`` without ``order`` preloads the lowest indices that fit.

    ``pin_memory=True`` pins the preloaded tensors (page-locked, for faster
    and asynchronous copies to a GPU) when CUDA is available; without CUDA
    there is nothing to pin for, and it does nothing (no warning;
    ``.pinned`` says whether pinning happened).

    Items are views of the preloaded memory: writing into one writes into the
    cache. ``stats()`` counts hits (served from memory) and misses (loaded on
    demand) in this process; DataLoader workers each count their own.
    """

    def __init__(self, data: Any, pin_memory: bool = False, order: Any = None,
                 budget_bytes: int | None = None) -> None:
        if isinstance(data, (torch.Tensor, np.ndarray)) and data.ndim == 0:
            raise ValueError("data is a 0-dimensional tensor or array: it has no items to index")
        try:
            n = len(data)
        except TypeError:
            raise TypeError(
                f"data must have a length (a tensor, an array, a sequence or a map-style dataset), "
                f"got {type(data).__name__}"
            ) from None
        if budget_bytes is not None:
            if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, np.integer)) \
                    or budget_bytes < 0:
                raise ValueError(f"budget_bytes must be a non-negative integer or None, got {budget_bytes!r}")
            budget_bytes = int(budget_bytes)
        self.data = data
        self.n = n
        self.budget_bytes = budget_bytes
        self.pinned = bool(pin_memory) and _cuda_available()
        ranking = freq_ranking(order, n) if order is not None else None
        self.planned_hits: int | None = None
        self._hits = 0
        self._misses = 0
        self._lock = threading.Lock()

        self._kind = "tensor" if isinstance(data, torch.Tensor) else \
            "array" if isinstance(data, np.ndarray) else "items"
        if budget_bytes is not None and ranking is not None:
            candidates = ranking
        else:
            candidates = np.arange(n, dtype=np.int64)
        if self._kind == "items":
            chosen, self._items, self.preloaded_bytes = self._preload_items(candidates)
            self._store: torch.Tensor | None = None
        else:
            chosen, self._store, self.preloaded_bytes = self._preload_rows(candidates)
            self._items = []
        # row_of[i] is where item i lives in the preloaded memory, -1 if not there.
        self._row_of = np.full(n, -1, dtype=np.int64)
        self._row_of[chosen] = np.arange(len(chosen), dtype=np.int64)
        self.preloaded = int(len(chosen))
        if order is not None:
            counts = np.bincount(_order_array(order, n), minlength=n)
            self.planned_hits = int(counts[chosen].sum())

    def _preload_rows(self, candidates: np.ndarray) -> tuple[np.ndarray, torch.Tensor, int]:
        data = self.data
        row_bytes = data.dtype.itemsize * int(np.prod(data.shape[1:], dtype=np.int64))
        if self.budget_bytes is None:
            k = len(candidates)
        else:
            k = len(candidates) if row_bytes == 0 else min(len(candidates), self.budget_bytes // row_bytes)
        if self.budget_bytes is None and len(candidates) == self.n and np.array_equal(
                candidates, np.arange(self.n)):
            chosen = candidates
            if self._kind == "tensor":
                store = data
            elif data.flags.c_contiguous and data.flags.writeable:
                store = torch.from_numpy(data)
            else:
                store = torch.from_numpy(np.array(data))
        else:
            # Rows in index order keep the copy (and later reads) sequential.
            chosen = np.sort(candidates[:k])
            if self._kind == "tensor":
                store = data.index_select(0, torch.from_numpy(chosen).to(data.device))
            else:
                store = torch.from_numpy(np.array(data[chosen]))
        if self.pinned and store.device.type == "cpu":
            store = store.pin_memory()
        return chosen, store, row_bytes * len(chosen)

    def _preload_items(self, candidates: np.ndarray) -> tuple[np.ndarray, list[Any], int]:
        items: list[Any] = []
        taken: list[int] = []
        total = 0
        for i in candidates.tolist():
            item = self.data[i]
            size = item_nbytes(item)
            if self.budget_bytes is not None and total + size > self.budget_bytes:
                break
            if self.pinned:
                item = map_tensors(lambda t: t.pin_memory() if t.device.type == "cpu" else t, item)
            items.append(item)
            taken.append(i)
            total += size
        chosen = np.asarray(taken, dtype=np.int64)
        # Stored in index order, like the rows.
        perm = np.argsort(chosen, kind="stable")
        return chosen[perm], [items[j] for j in perm.tolist()], total

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        k = _index(i, self.n)
        row = int(self._row_of[k])
        if row >= 0:
            with self._lock:
                self._hits += 1
            return self._store[row] if self._store is not None else self._items[row]
        with self._lock:
            self._misses += 1
        item = self.data[k]
        if self._kind == "array":
            item = torch.from_numpy(np.array(item))
        return item

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def is_preloaded(self, i: int) -> bool:
        """Whether item ``i`` is served from memory."""
        return bool(self._row_of[_index(i, self.n)] >= 0)

    def stats(self) -> dict[str, Any]:
        """Counters of this process: ``hits``, ``misses``, and what was
        preloaded (``preloaded`` items, ``preloaded_bytes``, ``planned_hits``:
        the hits ``order`` would get, None without an order)."""
        with self._lock:
            return {
                "hits": self._hits,
                "misses": self._misses,
                "items": self.n,
                "preloaded": self.preloaded,
                "preloaded_bytes": self.preloaded_bytes,
                "planned_hits": self.planned_hits,
                "pinned": self.pinned,
            }

    def __repr__(self) -> str:
        return (f"CachedDataset({self.preloaded} of {self.n} items preloaded, "
                f"{self.preloaded_bytes} bytes, pinned={self.pinned})")


# ------------------------------------------------------- AsyncPrefetchDataset


class _Runtime:
    """One process's prefetch state: the window, the results, the threads.

    Threads hold this and the base dataset, never the AsyncPrefetchDataset,
    so the dataset can be collected and its finalizer stop them.

    Keys are positions in ``order`` (order mode) or dataset indices
    (sequential mode). ``jobs`` are keys to load, ``inflight`` keys being
    loaded, ``ready`` keys loaded (value or exception). A key is in at most
    one of the three; together they hold at most ``queue_size`` keys ahead of
    the consumer, plus the one it is asking for.
    """

    def __init__(self, dataset: Any, order: np.ndarray | None, queue_size: int, num_workers: int) -> None:
        self.pid = os.getpid()
        self.dataset = dataset
        self.order = order
        self.queue_size = queue_size
        # Reentrant: close() may run in a thread that already holds it (from
        # a __del__ that the garbage collector calls there).
        self.cond = threading.Condition(threading.RLock())
        # Loads call the dataset, which may take any lock: no fork meanwhile.
        self.gate = ForkGate()
        self.stop = False
        self.jobs: deque[int] = deque()
        self.inflight: set[int] = set()
        self.ready: dict[int, tuple[bool, Any]] = {}
        self.pos = 0  # order mode: the next expected position
        self.counters = dict(hits=0, waits=0, wait_seconds=0.0, sync_loads=0, prefetched=0,
                             discarded=0, errors=0, resyncs=0, off_order=0)
        if order is not None:
            # Where each index occurs in order, for finding the next
            # occurrence of a request in O(log): positions grouped by index.
            self.by_index = np.argsort(order, kind="stable")
            counts = np.bincount(order, minlength=len(dataset))
            self.starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self.threads = [
            threading.Thread(target=_prefetch_loop, args=(self,), name=f"opt4torch-prefetch-{k}",
                             daemon=True)
            for k in range(num_workers)
        ]
        for t in self.threads:
            t.start()
        _live.add(self)

    def index_of(self, key: int) -> int:
        return int(self.order[key]) if self.order is not None else key

    def next_occurrence(self, i: int, at_least: int) -> int:
        """The first position >= at_least where order asks for i, or -1."""
        lo, hi = int(self.starts[i]), int(self.starts[i + 1])
        occ = self.by_index[lo:hi]
        j = int(np.searchsorted(occ, at_least))
        return int(occ[j]) if j < len(occ) else -1

    def window(self, keys: range, current: int) -> None:
        """Make ``keys`` (in order) the prefetch window and drop everything
        outside it. ``current``, the key being asked for now, is kept if it is
        loaded or loading, but not queued: the caller loads it otherwise.
        Called with the lock held."""
        wanted = set(keys)
        wanted.add(current)
        for k in [k for k in self.ready if k not in wanted]:
            del self.ready[k]
            self.counters["discarded"] += 1
        self.jobs = deque(k for k in self.jobs if k in wanted and k != current)
        have = set(self.jobs) | self.inflight | set(self.ready)
        added = False
        for k in keys:
            if k not in have and k != current:
                self.jobs.append(k)
                added = True
        if added:
            self.cond.notify_all()

    def shutdown(self, join: float) -> None:
        with self.cond:
            self.stop = True
            self.jobs.clear()
            self.ready.clear()
            self.cond.notify_all()
        me = threading.current_thread()
        deadline = time.monotonic() + join
        for t in self.threads:
            if t is not me and join > 0:
                t.join(max(0.0, deadline - time.monotonic()))


def _prefetch_loop(rt: _Runtime) -> None:
    cond = rt.cond
    while True:
        with cond:
            while not rt.stop and not rt.jobs:
                cond.wait(_POLL)
            if rt.stop:
                return
            key = rt.jobs.popleft()
            rt.inflight.add(key)
        try:
            with rt.gate.busy():
                result: tuple[bool, Any] = (True, rt.dataset[rt.index_of(key)])
        except BaseException as exc:  # the consumer loads it again and sees the error itself
            result = (False, exc)
        with cond:
            rt.inflight.discard(key)
            if rt.stop:
                return
            rt.ready[key] = result
            rt.counters["prefetched"] += 1
            cond.notify_all()


def _stop_runtime(rt: _Runtime) -> None:
    # Run by the garbage collector, in whatever thread it runs in: a plain
    # store and no lock. The threads see the flag within _POLL seconds.
    rt.stop = True


_live: weakref.WeakSet[_Runtime] = weakref.WeakSet()


@atexit.register
def _join_at_exit() -> None:
    # Python finalizes with daemon threads frozen wherever they are; one
    # frozen inside a C++ extension (torch) can abort the exit ("terminate
    # called without an active exception"), which a spawn DataLoader worker
    # reports as a crash. So at exit, stop the threads and let each finish
    # the load it is in.
    for rt in list(_live):
        if rt.pid == os.getpid():
            rt.shutdown(_JOIN_TIMEOUT)


_instances: weakref.WeakSet[AsyncPrefetchDataset] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The parent's threads do not exist here, and its lock may have been held
    # by one of them at the fork: forget that state without touching it.
    for ds in list(_instances):
        ds._forget_runtime()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class AsyncPrefetchDataset(tud.Dataset):
    """``dataset`` with its next items loaded ahead on background threads.

    ``num_workers`` threads (0 turns prefetching off) keep up to
    ``queue_size`` items loaded or loading ahead of the consumer.

    * With ``order`` (the indices the sampler will ask for, in order: a
      sequence, array, tensor or :class:`~opt4torch.Plan`, e.g.
      ``opt4torch.capture(sampler, epochs)``), the threads load ``order[p]``,
      ``order[p+1]``, ... where ``p`` is the next expected position. A request
      for ``order[p]`` takes the prefetched copy (waiting for it if it is being
      loaded). A request for another index is served by loading it here and
      now: if it occurs later in ``order`` the position jumps there (a
      *resync*: DataLoader workers see only their own batches, and a loop that
      restarted skips ahead), otherwise the position stays (*off order*).
    * Without ``order``, the threads load the ``queue_size`` indices after the
      one last asked for (the earlier design's behaviour; it helps sequential
      reads only).

    Either way, the item returned is always ``dataset[i]``: a prefetched copy
    is used only for the index it was loaded for, and a load that failed on a
    thread is repeated here, so its exception reaches the caller.

    Threads start on the first ``__getitem__`` in each process (after a fork,
    a DataLoader worker starts its own) and stop on :meth:`close`, at the end
    of a ``with`` block, or when the dataset is garbage-collected. Pickling
    (spawn workers) leaves them behind. ``dataset[i]`` must be safe to call
    from several threads at once. ``stats()`` counts for this process.
    """

    def __init__(self, dataset: Any, queue_size: int = 10, num_workers: int = 2, order: Any = None) -> None:
        try:
            n = len(dataset)
        except TypeError:
            raise TypeError(
                f"dataset must be a map-style dataset with a length, got {type(dataset).__name__}"
            ) from None
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size must be a positive integer (items kept ahead), got {queue_size!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(
                f"num_workers must be a non-negative integer (prefetch threads; 0 turns them off), "
                f"got {num_workers!r}"
            )
        self.dataset = dataset
        self.n = n
        self.queue_size = queue_size
        self.num_workers = num_workers
        self.order = _order_array(order, n) if order is not None else None
        # Where a new process's runtime starts in order (see seek()).
        self.start_position = 0
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._rt: _Runtime | None = None
        self._finalizer: weakref.finalize | None = None
        self._start_lock = threading.Lock()
        self._sync_loads = 0  # num_workers=0: every load is synchronous
        _instances.add(self)

    def _forget_runtime(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        self._rt = None
        self._finalizer = None
        self._start_lock = threading.Lock()

    def _runtime(self) -> _Runtime | None:
        if self.num_workers == 0:
            return None
        rt = self._rt
        # The pid check, before any lock: a forked child must not use the
        # parent's runtime (its threads are gone and its lock may be held).
        if rt is not None and rt.pid == os.getpid() and not rt.stop:
            return rt
        with self._start_lock:
            rt = self._rt
            if rt is None or rt.pid != os.getpid() or rt.stop:
                old = rt
                rt = _Runtime(self.dataset, self.order, self.queue_size, self.num_workers)
                rt.pos = self.start_position
                if old is not None and old.pid == rt.pid:
                    # Restarted after close(): the position and counters go on.
                    rt.pos = old.pos
                    rt.counters = dict(old.counters)
                self._rt = rt
                self._finalizer = weakref.finalize(self, _stop_runtime, rt)
            return rt

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        k = _index(i, self.n)
        rt = self._runtime()
        if rt is None:
            self._sync_loads += 1
            return self.dataset[k]
        c = rt.counters
        with rt.cond:
            key = self._claim(rt, k)
            if key is not None:
                start = None
                while key in rt.inflight and not rt.stop and any(t.is_alive() for t in rt.threads):
                    if start is None:
                        start = time.perf_counter()
                        c["waits"] += 1
                    rt.cond.wait(_POLL)
                if start is not None:
                    c["wait_seconds"] += time.perf_counter() - start
                result = rt.ready.pop(key, None)
                if result is not None:
                    ok, value = result
                    if ok:
                        c["hits"] += 1
                        return value
                    c["errors"] += 1
            c["sync_loads"] += 1
        return self.dataset[k]

    def _claim(self, rt: _Runtime, k: int) -> int | None:
        """Match request ``k`` to a key, move the window; the lock is held.
        Returns the key that may hold a prefetched copy of ``k``, or None."""
        q = rt.queue_size
        if rt.order is None:
            rt.window(range(k + 1, min(self.n, k + 1 + q)), current=k)
            return k
        p = rt.pos
        if p < len(rt.order) and rt.order[p] == k:
            key = p
        else:
            key = rt.next_occurrence(k, p)
            if key < 0:
                rt.counters["off_order"] += 1
                return None
            rt.counters["resyncs"] += 1
        rt.pos = key + 1
        rt.window(range(key + 1, min(len(rt.order), key + 1 + q)), current=key)
        return key

    def seek(self, position: int) -> None:
        """Expect ``order[position]`` next (order mode).

        Workers that are not persistent start from a copy of this dataset
        every epoch, at ``start_position``: call ``seek(epoch * epoch_length)``
        in the main process before each epoch's ``iter(loader)``, so they
        start where that epoch begins in ``order`` rather than resyncing from
        the beginning. In the calling process the window moves at once.
        """
        if self.order is None:
            raise ValueError("seek() needs an order: this dataset prefetches the next indices instead")
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)) \
                or not 0 <= position <= len(self.order):
            raise ValueError(f"position must be an int in [0, {len(self.order)}] (a position in order), "
                             f"got {position!r}")
        self.start_position = int(position)
        rt = self._rt
        if rt is not None and rt.pid == os.getpid() and not rt.stop:
            with rt.cond:
                rt.pos = int(position)
                end = min(len(rt.order), rt.pos + rt.queue_size)
                rt.window(range(rt.pos, end), current=-1)

    def close(self) -> None:
        """Stop this process's threads and drop what they loaded. Using the
        dataset again starts them again (from the current position)."""
        rt, fin = self._rt, self._finalizer
        if fin is not None:
            fin.detach()
        self._finalizer = None
        if rt is not None and rt.pid == os.getpid():
            rt.shutdown(_JOIN_TIMEOUT)

    def __enter__(self) -> AsyncPrefetchDataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_rt", "_finalizer", "_start_lock", "_sync_loads"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def stats(self) -> dict[str, Any]:
        """This process's counters: ``hits`` (served by a prefetched copy),
        ``waits`` and ``wait_seconds`` (hits that waited for their copy),
        ``sync_loads`` (loaded by the caller), ``prefetched`` (loads done by
        threads), ``discarded`` (prefetched, never used), ``errors`` (thread
        loads that raised; repeated by the caller), ``resyncs`` and
        ``off_order`` (order mode: requests that were not the next expected
        position), and ``position`` (order mode: the next expected one)."""
        rt = self._rt
        if rt is None or rt.pid != os.getpid():
            out: dict[str, Any] = dict(hits=0, waits=0, wait_seconds=0.0, sync_loads=0, prefetched=0,
                                       discarded=0, errors=0, resyncs=0, off_order=0)
            out["sync_loads"] = self._sync_loads
            out["position"] = self.start_position if self.order is not None else None
            return out
        with rt.cond:
            out = dict(rt.counters)
            out["position"] = rt.pos if self.order is not None else None
        return out

    @property
    def threads(self) -> list[threading.Thread]:
        """This process's prefetch threads (empty before the first access)."""
        rt = self._rt
        return list(rt.threads) if rt is not None and rt.pid == os.getpid() and not rt.stop else []

    def __repr__(self) -> str:
        mode = "order" if self.order is not None else "sequential"
        return (f"AsyncPrefetchDataset({type(self.dataset).__name__}, queue_size={self.queue_size}, "
                f"num_workers={self.num_workers}, {mode})")
