"""The earlier design's API names, kept for its users.

* ``generate_precomputed_file`` captures a seeded ``RandomSampler`` and writes
  the result as an opt4 plan file (the documented binary format, never a
  pickle, whatever the file's extension).
* ``OPTCacheDecorator`` caches a loading function ``fn(obj, index)`` in one
  process, following the plan; ``mode="python"`` runs the pure-Python
  reference (the debug path), ``mode="c"`` the C pool.
* ``SharedOPTCacheDecorator`` does the same for every DataLoader worker
  through one shared-memory pool.
* ``get_opt_cache(mode=...)`` picks one: ``"c"`` (alias ``"cpp"``) or
  ``"python"``.

These see plain indices, not positions, so they must work out which access of
the plan each call is. ``position="clock"`` (the earlier design's way) takes
the next position of a counter shared by all processes: exact in one process,
but with several workers the arrival order is not the sampler's order. The
alternative ``position="occurrence"`` maps the k-th request for an item to its
k-th planned position, which survives workers interleaving. docs/runtime.md
has the hit rates of both, measured. A call whose index is not the one the
plan expects is never served from the cache; when such mismatches pass
``divergence_limit`` (a forgotten ``set_epoch``, an unseeded sampler), the
cache falls back to an online LRU with a warning.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import secrets
import tempfile
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from . import _engine
from ._codec import decode, encode
from ._plan import ADMIT, HIT, Plan, load_plan, plan as build_plan, sequence_plan
from .capture import capture

__all__ = [
    "generate_precomputed_file",
    "sampler_description",
    "OPTCacheDecorator",
    "SharedOPTCacheDecorator",
    "get_opt_cache",
    "DivergenceWarning",
]


def sampler_description(**fields: Any) -> str:
    """The JSON description stored in a plan file: how to rebuild its sequence."""
    from . import __version__

    try:
        import torch

        fields.setdefault("torch", torch.__version__)
    except ImportError:  # pragma: no cover
        pass
    fields.setdefault("opt4torch", __version__)
    return json.dumps(fields, sort_keys=True)


def generate_precomputed_file(
    dataset_size: int,
    total_iterations: int,
    persist_path: str | os.PathLike[str],
    random_seed: int | None = 0,
    replacement: bool = True,
    *,
    capacity: int | None = None,
    bypass: bool = True,
    progress: bool | None = None,
) -> Plan:
    """Capture ``RandomSampler(range(dataset_size), replacement=replacement,
    num_samples=total_iterations, generator=torch.Generator().manual_seed(
    random_seed))`` and save it to ``persist_path``.

    Without ``capacity`` the file holds the sequence only, and the cache plans
    it at the size it is given (as the earlier design's decorator did with
    ``maxsize``). With ``capacity`` it also holds the OPT decisions. A
    ``random_seed`` of None draws a fresh seed and records it in the file.
    Parent directories are created. Returns the plan.
    """
    import torch
    from torch.utils.data import RandomSampler

    if int(dataset_size) < 1:
        raise ValueError(f"dataset_size must be at least 1, got {dataset_size}")
    if int(total_iterations) < 1:
        raise ValueError(f"total_iterations must be at least 1, got {total_iterations}")
    if random_seed is None:
        random_seed = secrets.randbits(63)
    gen = torch.Generator().manual_seed(int(random_seed))
    sampler = RandomSampler(
        range(int(dataset_size)),
        replacement=bool(replacement),
        num_samples=int(total_iterations),
        generator=gen,
    )
    seq = capture(sampler, 1, progress=progress)
    desc = sampler_description(
        sampler="torch.utils.data:RandomSampler",
        dataset_size=int(dataset_size),
        num_samples=int(total_iterations),
        replacement=bool(replacement),
        seed=int(random_seed),
        epochs=1,
    )
    if capacity is None:
        result = sequence_plan(seq, items=int(dataset_size), description=desc)
    else:
        result = build_plan(seq, capacity, bypass, items=int(dataset_size), description=desc, progress=progress)
    parent = os.path.dirname(os.fspath(persist_path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    result.save(persist_path)
    result.path = os.fspath(persist_path)
    return result


# ---- the decorators ----


class DivergenceWarning(RuntimeWarning):
    """The accesses do not follow the plan; the cache fell back to LRU."""


def _fit_plan(precomputed_path: Any, maxsize: int, total_iter: int | None, bypass: bool) -> Plan:
    if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
        raise ValueError(f"maxsize must be a positive number of items, got {maxsize!r}")
    p = load_plan(precomputed_path)
    if total_iter is not None and int(total_iter) != p.accesses:
        raise ValueError(
            f"total_iter={total_iter} but {os.fspath(precomputed_path)} was precomputed for "
            f"{p.accesses} accesses: they must match (regenerate the file, or pass its total)"
        )
    if not p.has_decisions or p.capacity != maxsize or p.bypass != bypass:
        p = p.with_capacity(maxsize, bypass)
    return p


class _LRU:
    """The online fallback once the accesses diverge from the plan."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = max(1, maxsize)
        self.data: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any, load: Callable[[], Any]) -> tuple[Any, bool]:
        if key in self.data:
            self.data.move_to_end(key)
            return self.data[key], True
        value = load()
        self.data[key] = value
        if len(self.data) > self.maxsize:
            self.data.popitem(last=False)
        return value, False


class _Follower:
    """Shared logic: count calls, detect divergence, fall back to LRU."""

    def __init__(self, plan: Plan, maxsize: int, divergence_limit: float) -> None:
        self.plan = plan
        self.maxsize = maxsize
        self.divergence_limit = divergence_limit
        self.calls = 0
        self.hits = 0
        self.mismatches = 0
        self.beyond = 0
        self.lru: _LRU | None = None
        self._lock = threading.Lock()

    def _diverged(self) -> bool:
        """After a mismatch: has the sequence left the plan for good?"""
        limit = max(16, self.divergence_limit * self.calls)
        if self.lru is None and self.mismatches > limit:
            warnings.warn(
                f"{self.mismatches} of {self.calls} accesses did not match the plan (a forgotten "
                "set_epoch, an unseeded sampler, or a different sampler?): falling back to an "
                f"online LRU cache of {self._lru_size()} items", DivergenceWarning, stacklevel=4)
            self.lru = _LRU(self._lru_size())
            return True
        return False

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate ``fn(..., index)``: the last positional argument is the
        dataset index; ``wrapped.cache`` is this object."""
        @functools.wraps(fn)
        def cached(*args: Any, **kwargs: Any) -> Any:
            return self._access(lambda: fn(*args, **kwargs), int(args[-1]))

        cached.cache = self  # type: ignore[attr-defined]
        return cached

    def _access(self, load: Callable[[], Any], index: int) -> Any:
        raise NotImplementedError

    def _lru_size(self) -> int:
        return self.maxsize

    def stats(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "hits": self.hits,
            "misses": self.calls - self.hits,
            "mismatches": self.mismatches,
            "beyond_plan": self.beyond,
            "degraded_to_lru": self.lru is not None,
            "plan_hits": self.plan.hits,
            "plan_accesses": self.plan.accesses,
        }


class OPTCacheDecorator(_Follower):
    """Cache ``fn(obj, index)`` by the precomputed OPT plan, in one process.

    ``OPTCacheDecorator(precomputed_path, maxsize, prediction_window,
    total_iter)`` keeps the earlier design's signature: ``maxsize`` items
    (the plan is rebuilt at that size if the file was made for another or for
    none); ``total_iter`` must equal the file's accesses; ``prediction_window``
    is accepted and has no effect (the plan sees the whole run). The index is
    the wrapped function's last positional argument.

    Cached objects stay in this process as they are (no copy, any type).
    ``mode="c"`` takes the decisions from the C planner, ``mode="python"``
    from the pure-Python reference (the debug path); both follow the same
    plan. Each DataLoader worker process gets its own copy with its own call
    counter, which cannot match the plan: use
    :class:`SharedOPTCacheDecorator` with workers.
    """

    def __init__(self, precomputed_path: Any, maxsize: int, prediction_window: int | None = None,
                 total_iter: int | None = None, *, mode: str = "c", bypass: bool = True,
                 divergence_limit: float = 0.05) -> None:
        if mode not in ("c", "cpp", "python"):
            raise ValueError(f"mode must be 'c' (or 'cpp') or 'python', got {mode!r}")
        super().__init__(_fit_plan(precomputed_path, maxsize, total_iter, bypass), maxsize, divergence_limit)
        self.mode = "python" if mode == "python" else "c"
        self.prediction_window = prediction_window
        seq = self.plan.seq
        if self.mode == "python":
            from . import reference

            ops = reference.belady(seq.tolist(), maxsize, bypass=bypass, items=self.plan.items).ops
            self._kinds = [k for k, _ in ops]
            self._slots = [s for _, s in ops]
        else:
            self._kinds = self.plan.kinds.tolist()
            self._slots = self.plan.slots.tolist()
        self._seq = seq.tolist()
        self._store: dict[int, Any] = {}
        self._pid = os.getpid()

    def _access(self, load: Callable[[], Any], index: int) -> Any:
        with self._lock:
            if os.getpid() != self._pid and self.calls == 0:
                warnings.warn("OPTCacheDecorator is per process: in a DataLoader worker its call "
                              "counter cannot match the plan; use SharedOPTCacheDecorator with "
                              "num_workers > 0", RuntimeWarning, stacklevel=3)
            t = self.calls
            self.calls += 1
            if self.lru is not None:
                value, hit = self.lru.get(index, load)
                self.hits += hit
                return value
            if t >= len(self._seq):
                self.beyond += 1
                if self.beyond == 1:
                    warnings.warn(f"more calls than the plan's {len(self._seq)} accesses: loading "
                                  "without the cache from here", RuntimeWarning, stacklevel=3)
                return load()
            kind, slot = self._kinds[t], self._slots[t]
            if self._seq[t] != index:
                # Never serve another item: load, and let what this position
                # would have stored be missing (its hits then load too).
                self.mismatches += 1
                if kind == ADMIT:
                    self._store.pop(slot, None)
                if self._diverged():
                    value, hit = self.lru.get(index, load)  # type: ignore[union-attr]
                    self.hits += hit
                    return value
                return load()
            held = self._store.get(slot)
            if kind == HIT and held is not None and held[0] == index:  # never another item
                self.hits += 1
                return held[1]
            value = load()
            if kind == ADMIT:
                self._store[slot] = (index, value)
            return value


class SharedOPTCacheDecorator(_Follower):
    """Cache ``fn(obj, index)`` by the OPT plan across DataLoader workers,
    in one shared-memory pool.

    Build it in the main process (in your dataset's ``__init__``, as the
    earlier design did); the pool is created by the first process that loads
    an item (so that the item's size is known) on behalf of the main process,
    which removes it when it exits. ``position="clock"`` is the earlier
    design's global counter; ``position="occurrence"`` is exact under worker
    interleaving (see the module docs).
    """

    def __init__(self, precomputed_path: Any, maxsize: int, prediction_window: int | None = None,
                 total_iter: int | None = None, *, position: str = "clock", item_bytes: int | None = None,
                 allow_pickle: bool = False, bypass: bool = True, divergence_limit: float = 0.05,
                 wait_timeout: float = 10.0) -> None:
        if position not in ("clock", "occurrence"):
            raise ValueError(f"position must be 'clock' or 'occurrence', got {position!r}")
        super().__init__(_fit_plan(precomputed_path, maxsize, total_iter, bypass), maxsize, divergence_limit)
        self.position = position
        self.bypass = bypass
        self.prediction_window = prediction_window
        self.item_bytes = item_bytes
        self.allow_pickle = allow_pickle
        self.wait_timeout = wait_timeout
        self._owner_pid = os.getpid()
        self._plan_path = os.fspath(precomputed_path)
        self._rendezvous = os.path.join(tempfile.gettempdir(),
                                        f"opt4-{os.getuid()}-{os.getpid()}-{secrets.token_hex(8)}.pool")
        # In a shared temporary directory: created new (never an existing file
        # or a symlink someone placed there), readable by this user only.
        os.close(os.open(self._rendezvous, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600))
        self._local = threading.local()
        self._seq = self.plan.seq
        self._finalizer = _shared_finalizer(self, self._rendezvous, self._owner_pid)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_local", "_lock", "_finalizer", "plan", "_seq"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()
        self._lock = threading.Lock()
        # Workers need no plan: the pool holds the sequence and decisions. The
        # one that creates the pool rebuilds it from the file.
        self.plan = None  # type: ignore[assignment]
        self._seq = None

    def _lru_size(self) -> int:
        import torch.utils.data as tud

        info = tud.get_worker_info()
        return max(1, self.maxsize // (info.num_workers if info is not None else 1))

    def _pool_for(self, first_value: Any = None, first_parts: Any = None) -> Any:
        pool = getattr(self._local, "pool", None)
        if pool is not None:
            return pool
        with os.fdopen(os.open(self._rendezvous, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC), "r+") as f:
            if os.fstat(f.fileno()).st_uid != os.getuid():
                raise PermissionError(f"{self._rendezvous} is not this user's file: refused")
            fcntl.flock(f, fcntl.LOCK_EX)
            name = f.read().strip()
            if not name:
                if first_parts is None:
                    return None
                size = self.item_bytes or sum(memoryview(p).nbytes for p in first_parts)
                plan = self.plan if self.plan is not None else _fit_plan(
                    self._plan_path, self.maxsize, None, self.bypass)
                created = _engine.pool_create(plan._h, size, int(self.wait_timeout * 1000),
                                              occurrences=self.position == "occurrence",
                                              owner_pid=self._owner_pid)
                name = created.name
                f.seek(0)
                f.write(name)
                f.flush()
                created.close()
        pool = _engine.pool_attach(name)
        self._local.pool = pool
        return pool

    def _access(self, load: Callable[[], Any], index: int) -> Any:
        with self._lock:
            self.calls += 1
            if self.lru is not None:
                value, hit = self.lru.get(index, load)
                self.hits += hit
                return value
        pool = self._pool_for()
        if pool is None:  # nobody has created it yet: load this item and create it
            value = load()
            parts = encode(value, self.allow_pickle)
            pool = self._pool_for(value, parts)
            t = self._next_position(pool, index)
            if t is not None:
                item, kind = pool.item(t)
                if item != index:
                    self._mismatch(pool, t)
                else:
                    data, entries = pool.read_batch([t])
                    if entries[0][0] == 2 and entries[0][2] == 1:
                        pool.store_batch([(t, parts)])
            return value
        t = self._next_position(pool, index)
        if t is None:
            return load()
        item, kind = pool.item(t)
        if item != index:
            if self._mismatch(pool, t):
                with self._lock:
                    value, hit = self.lru.get(index, load)  # type: ignore[union-attr]
                    self.hits += hit
                    return value
            return load()
        data, entries = pool.read_batch([t])
        status, _, a, b = entries[0]
        if status == 0:
            with self._lock:
                self.hits += 1
            return decode(memoryview(data)[a:a + b])
        value = load()
        if status == 2 and a == 1:
            pool.store_batch([(t, encode(value, self.allow_pickle))])
        return value

    def _next_position(self, pool: Any, index: int) -> int | None:
        t = pool.clock_next() if self.position == "clock" else pool.occurrence_next(index)
        if t is None or t >= pool.info()["accesses"]:
            with self._lock:
                self.beyond += 1
            return None
        return int(t)

    def _mismatch(self, pool: Any, t: int) -> bool:
        pool.skip(t)
        with self._lock:
            self.mismatches += 1
            return self._diverged()

    def pool_stats(self) -> dict[str, Any] | None:
        """The pool's counters over every process (None before it exists)."""
        pool = self._pool_for()
        return None if pool is None else pool.stats()

    def close(self) -> None:
        """Remove the pool now (main process)."""
        self._finalizer()


def _shared_finalizer(owner: Any, rendezvous: str, owner_pid: int) -> Any:
    import weakref

    def done() -> None:
        if os.getpid() != owner_pid:
            return
        try:
            with open(rendezvous) as f:
                name = f.read().strip()
            if name:
                try:
                    _engine.pool_remove(name, force=True)
                except _engine.Opt4Error:
                    pass
            os.unlink(rendezvous)
        except FileNotFoundError:
            pass

    import atexit

    fin = weakref.finalize(owner, done)
    atexit.register(fin)
    return fin


def get_opt_cache(mode: str = "c", **kwargs: Any) -> Any:
    """The earlier design's factory: ``mode="c"`` (or ``"cpp"``) gives a
    :class:`SharedOPTCacheDecorator` (the shared-memory cache),
    ``mode="python"`` an :class:`OPTCacheDecorator` on the pure-Python
    reference. Keyword arguments go to the class."""
    if mode in ("c", "cpp"):
        return SharedOPTCacheDecorator(**kwargs)
    if mode == "python":
        return OPTCacheDecorator(mode="python", **kwargs)
    raise ValueError(f"mode must be 'c', 'cpp' or 'python', got {mode!r}")
