"""The OPT4TorchDataSet API, both generations, from one implementation.

Users of the public OPT4TorchDataSet project call the names below; they work
here unchanged (docs/migrating.md has the before and after):

* ``generate_precomputed_file(dataset_size, total_iterations, persist_path,
  random_seed=0, replacement=True, maxsize=1, distribution_seq=None)``
  captures a seeded ``RandomSampler`` (or takes ``distribution_seq``) and
  writes an opt4 plan file (the documented binary format, never a pickle,
  whatever the file's extension).
* ``OPTCacheDecorator(precomputed_path, maxsize, total_iter)`` caches a
  loading function in one process, following the plan.
* ``SharedOPTCacheDecorator(precomputed_path, maxsize, dataset_size,
  item_shape, item_dtype=torch.float32)`` does the same for every DataLoader
  worker through one shared-memory pool; with ``item_shape`` it is a pool of
  fixed-shape tensors.
* ``get_opt_cache(mode=None, num_workers=0, **kwargs)`` picks one.
* ``CachetoolsDecorator(cache)`` caches by index in any cachetools cache (the
  LRU/LFU/FIFO/RR baselines).

Both decorators also read the precomputed files that OPT4TorchDataSet 1.x
writes (safetensors: ``future_index``, ``decision_table``, ``config``), with
the ``safetensors`` package, never by unpickling. Their decision table is not
used: the sequence is planned again with Belady's rule, and a warning gives
both hit counts when the table was worse.

The older spellings of the design this project grew from (``capacity=``,
``prediction_window=``, ``mode="c"``) still work and warn with
``DeprecationWarning`` naming the current one.

The decorators see plain indices, not positions, so they must work out which
access of the plan each call is. ``position="occurrence"`` (the default) maps
the k-th request for an item to its k-th planned position: that survives
DataLoader workers interleaving their calls, so the hits equal the plan's.
``position="clock"`` (OPT4TorchDataSet's way) takes the next position of a
counter shared by all processes: exact in one process, but with several
workers the arrival order is not the sampler's order and it loses most hits
(docs/runtime.md has both, measured). A call whose index is not the one the
plan expects is never served from the cache; when such mismatches pass
``divergence_limit`` (a forgotten ``set_epoch``, an unseeded sampler, the
clock with several workers), the cache falls back to an online LRU with a
warning that names the cause it sees, said once over all processes.
"""

from __future__ import annotations

import fcntl
import functools
import json
import math
import operator
import os
import secrets
import struct
import tempfile
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _engine
from ..pool.codec import decode, encode
from ..planning.plan import ADMIT, HIT, Plan, load_plan, plan as build_plan, sequence_plan
from ..planning.capture import capture
from ..planning.sizing import refuse_plan_past_memory

__all__ = [
    "generate_precomputed_file",
    "sampler_description",
    "read_precomputed_safetensors",
    "OPTCacheDecorator",
    "SharedOPTCacheDecorator",
    "CachetoolsDecorator",
    "get_opt_cache",
    "DivergenceWarning",
    "SuboptimalPlanWarning",
]


def sampler_description(**fields: Any) -> str:
    """The JSON description stored in a plan file: how to rebuild its sequence."""
    from .. import __version__

    try:
        import torch

        fields.setdefault("torch", torch.__version__)
    except ImportError:  # pragma: no cover
        pass
    fields.setdefault("opt4torch", __version__)
    return json.dumps(fields, sort_keys=True)


def _renamed(old: str, new: str, stacklevel: int = 2) -> None:
    warnings.warn(f"{old} is the earlier spelling: use {new} (it means the same)",
                  DeprecationWarning, stacklevel=stacklevel + 1)


def _check_size(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        bound = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be a {bound} number, got {value}")
    return int(value)


def generate_precomputed_file(
    dataset_size: int,
    total_iterations: int,
    persist_path: str | os.PathLike[str],
    random_seed: int | None = 0,
    replacement: bool = True,
    maxsize: int = 1,
    distribution_seq: Any = None,
    *,
    bypass: bool = True,
    progress: bool | None = None,
    **deprecated: Any,
) -> Plan:
    """Capture ``RandomSampler(list(range(dataset_size)), replacement=
    replacement, num_samples=total_iterations, generator=torch.Generator().
    manual_seed(random_seed))`` and save it, planned for ``maxsize`` items, to
    ``persist_path``.

    ``distribution_seq`` (a tensor or array), if given, is the sequence
    instead: its first ``total_iterations`` entries. ``maxsize=0`` stores the
    sequence only. The decorators plan again at their own ``maxsize`` when it
    differs from the file's, so the file is never wrong, only slower to open.
    A ``random_seed`` of None draws a fresh seed and records it in the file.
    Parent directories are created. Returns the plan (OPT4TorchDataSet
    returned None).

    Raises ValueError when ``dataset_size`` or ``total_iterations`` is not
    positive, ``maxsize`` is negative, ``replacement=False`` asks for more
    samples than items, or ``distribution_seq`` is shorter than
    ``total_iterations`` or holds an id outside ``[0, dataset_size)``.
    ``capacity=`` is the earlier spelling of ``maxsize=``.
    """
    if "capacity" in deprecated:
        _renamed("generate_precomputed_file(capacity=...)", "maxsize=...")
        cap = deprecated.pop("capacity")
        maxsize = 0 if cap is None else cap
    if deprecated:
        raise TypeError(f"generate_precomputed_file() got unexpected keyword arguments: "
                        f"{', '.join(sorted(deprecated))}")
    dataset_size = _check_size("dataset_size", dataset_size, 1)
    total_iterations = _check_size("total_iterations", total_iterations, 1)
    if not replacement and distribution_seq is None and total_iterations > dataset_size:
        raise ValueError(f"without replacement, total_iterations ({total_iterations}) cannot exceed "
                         f"dataset_size ({dataset_size}): sample with replacement=True, or lower "
                         "total_iterations")
    maxsize = _check_size("maxsize", maxsize, 0)
    # Before anything is drawn or allocated: a plan past this machine's
    # memory is refused naming its size (was: the allocator's traceback).
    refuse_plan_past_memory(total_iterations, dataset_size, False,
                            f"a plan of {total_iterations:,} accesses (total_iterations, opt4 -t) over "
                            f"{dataset_size:,} items",
                            "lower total_iterations (opt4 -t): plan as many accesses as the run draws, an "
                            "epoch or a few, and make a new file for the next ones")

    if distribution_seq is not None:
        arr = np.asarray(distribution_seq.cpu() if hasattr(distribution_seq, "cpu") else distribution_seq)
        arr = arr.reshape(-1)
        if len(arr) < total_iterations:
            raise ValueError(f"distribution_seq holds {len(arr)} entries, fewer than total_iterations "
                             f"({total_iterations})")
        seq = arr[:total_iterations].astype(np.int64)
        if len(seq) and (int(seq.min()) < 0 or int(seq.max()) >= dataset_size):
            bad = int(seq.min()) if int(seq.min()) < 0 else int(seq.max())
            raise ValueError(f"distribution_seq holds the id {bad}, outside [0, dataset_size={dataset_size})")
        desc = sampler_description(sampler="distribution_seq", dataset_size=dataset_size,
                                   num_samples=total_iterations)
    else:
        import torch
        from torch.utils.data import RandomSampler

        if random_seed is None:
            random_seed = secrets.randbits(63)
        gen = torch.Generator().manual_seed(int(random_seed))
        sampler = RandomSampler(range(dataset_size), replacement=bool(replacement),
                                num_samples=total_iterations, generator=gen)
        seq = capture(sampler, 1, progress=progress)
        desc = sampler_description(sampler="torch.utils.data:RandomSampler", dataset_size=dataset_size,
                                   num_samples=total_iterations, replacement=bool(replacement),
                                   seed=int(random_seed), epochs=1)
    if maxsize == 0:
        result = sequence_plan(seq, items=dataset_size, description=desc)
    else:
        result = build_plan(seq, maxsize, bypass, items=dataset_size, description=desc, progress=progress)
    parent = os.path.dirname(os.fspath(persist_path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    result.save(persist_path)
    result.path = os.fspath(persist_path)
    return result


# ---- OPT4TorchDataSet 1.x files (safetensors) ----


class SuboptimalPlanWarning(UserWarning):
    """A precomputed file's own decisions get fewer hits than the optimal plan."""


def _is_safetensors(path: str) -> bool:
    """A safetensors file: an 8-byte little-endian header length, then JSON."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    if len(head) < 9 or head[8:9] != b"{":
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 0 < n <= size - 8


def read_precomputed_safetensors(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The tensors of an OPT4TorchDataSet 1.x precomputed file, as numpy
    arrays, checked: ``future_index`` (int64 [T]), ``decision_table`` (int64
    [T, 3], optional), ``config`` (int64 [maxsize, dataset_size,
    total_iterations, seed], optional). Read with the ``safetensors``
    package, which never runs code from the file."""
    path = os.fspath(path)
    try:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError(f"{path} is a safetensors file (from OPT4TorchDataSet 1.x); reading it needs "
                          "the safetensors package: pip install 'opt4torchdataset[compat]' "
                          "(or pip install safetensors)") from None
    try:
        tensors = load_file(path)
    except (SafetensorError, ValueError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from None
    if "future_index" not in tensors:
        raise ValueError(f"{path}: a safetensors file without 'future_index' (it has "
                         f"{sorted(tensors)}): not an OPT4TorchDataSet precomputed file")
    seq = tensors["future_index"]
    if seq.ndim != 1 or seq.dtype.kind not in "iu":
        raise ValueError(f"{path}: 'future_index' must be a 1-D integer tensor, got {seq.dtype} "
                         f"of shape {list(seq.shape)}")
    seq = seq.astype(np.int64, copy=False)
    if len(seq) == 0:
        raise ValueError(f"{path}: 'future_index' is empty")
    if int(seq.min()) < 0:
        raise ValueError(f"{path}: 'future_index' holds the negative id {int(seq.min())}")
    out: dict[str, Any] = {"future_index": seq}
    config = tensors.get("config")
    if config is not None:
        config = config.reshape(-1).astype(np.int64)
        if len(config) != 4:
            raise ValueError(f"{path}: 'config' must hold [maxsize, dataset_size, total_iterations, "
                             f"seed], got {len(config)} values")
        maxsize, dataset_size, total, seed = (int(v) for v in config)
        if dataset_size <= int(seq.max()):
            raise ValueError(f"{path}: 'future_index' holds the id {int(seq.max())} but 'config' says "
                             f"dataset_size={dataset_size}")
        if total != len(seq):
            raise ValueError(f"{path}: 'config' says total_iterations={total} but 'future_index' "
                             f"holds {len(seq)} positions")
        out["config"] = {"maxsize": maxsize, "dataset_size": dataset_size,
                         "total_iterations": total, "seed": seed}
    table = tensors.get("decision_table")
    if table is not None:
        if table.ndim != 2 or table.shape != (len(seq), 3) or table.dtype.kind not in "iu":
            raise ValueError(f"{path}: 'decision_table' must be an integer tensor of shape "
                             f"[{len(seq)}, 3], got {table.dtype} {list(table.shape)}")
        out["decision_table"] = table.astype(np.int64, copy=False)
    return out


def decision_table_hits(seq: Any, table: Any) -> int:
    """Hits of an OPT4TorchDataSet 1.x decision table, run as its
    single-process decorator runs it: a hit if the item is held; on a miss,
    column 0 == 1 admits it after dropping column 1's item; column 2's item
    is dropped after the access."""
    held: set[int] = set()
    hits = 0
    for key, (cache, victim, release) in zip(np.asarray(seq).tolist(), np.asarray(table).tolist()):
        if key in held:
            hits += 1
        elif cache == 1:
            if victim != -1:
                held.discard(victim)
            held.add(key)
        if release != -1:
            held.discard(release)
    return hits


_warned_tables: set[tuple[str, int, int]] = set()


def _load_safetensors_plan(path: str, quiet: bool) -> Plan:
    content = read_precomputed_safetensors(path)
    seq = content["future_index"]
    config = content.get("config")
    items = config["dataset_size"] if config else int(seq.max()) + 1
    desc = sampler_description(source="OPT4TorchDataSet safetensors", path=os.path.abspath(path),
                               **({k: config[k] for k in ("dataset_size", "seed")} if config else {}))
    result = sequence_plan(seq, items=items, description=desc)
    table = content.get("decision_table")
    if table is not None and config and config["maxsize"] > 0 and not quiet:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
        if key not in _warned_tables:
            _warned_tables.add(key)
            theirs = decision_table_hits(seq, table)
            ours = result.with_capacity(config["maxsize"], True).hits
            if theirs < ours:
                warnings.warn(
                    f"{path}: its decision_table (OPT4TorchDataSet 1.x, maxsize={config['maxsize']}) "
                    f"gets {theirs} hits on its {len(seq)} accesses; the optimal plan gets {ours} at "
                    "the same size. The table is not used: the sequence is planned again.",
                    SuboptimalPlanWarning, stacklevel=5)
    result.path = path
    return result


def _open_plan(path: Any, quiet: bool = False) -> Plan:
    """An opt4 plan file, or an OPT4TorchDataSet 1.x safetensors file."""
    p = os.fspath(path)
    if os.path.isfile(p) and _is_safetensors(p):
        return _load_safetensors_plan(p, quiet)
    return load_plan(p)


def _fit_plan(precomputed_path: Any, maxsize: int, total_iter: int | None, bypass: bool, *,
              exact_total: bool = False, quiet: bool = False) -> Plan:
    """The file's plan at ``maxsize`` items over its first ``total_iter``
    positions. ``exact_total`` is the earlier design's rule (the totals must
    match); OPT4TorchDataSet 1.x only needs the file to hold enough."""
    p = _open_plan(precomputed_path, quiet)
    if total_iter is not None:
        total_iter = _check_size("total_iter", total_iter, 1)
        if total_iter > p.accesses or (exact_total and total_iter != p.accesses):
            raise ValueError(
                f"total_iter={total_iter} but {os.fspath(precomputed_path)} was precomputed for "
                f"{p.accesses} accesses: they must match (regenerate the file, or pass its total)"
                if exact_total else
                f"total_iter={total_iter} but {os.fspath(precomputed_path)} was precomputed for "
                f"{p.accesses} accesses, fewer than total_iter: regenerate it with "
                f"total_iterations={total_iter} or more")
        if total_iter < p.accesses:
            p = sequence_plan(p.seq[:total_iter], items=p.items, description=p.description)
    if not p.has_decisions or p.capacity != maxsize or p.bypass != bypass:
        p = p.with_capacity(maxsize, bypass)
    return p


# ---- the decorators ----


class DivergenceWarning(RuntimeWarning):
    """The accesses do not follow the plan; the cache fell back to LRU."""


class _Once:
    """Each kind of warning said once for a cache, over every process that
    holds a copy of it: DataLoader workers each get one (forked or
    pickled), and each would otherwise say the same thing. The first
    process to create the kind's marker file says it. Markers are named
    after the process that built the cache and go when it drops the cache
    (or exits); they are only made when a warning is due."""

    def __init__(self) -> None:
        self.prefix = os.path.join(tempfile.gettempdir(),
                                   f"opt4-{os.getuid()}-{os.getpid()}-{secrets.token_hex(8)}.said-")
        self._said: set[str] = set()
        import weakref

        weakref.finalize(self, _Once._remove, self.prefix, os.getpid())

    def __getstate__(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "_said": set(self._said)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # no finalizer: the markers are the builder's to remove

    def first(self, kind: str) -> bool:
        """True in the one process that is the first to ask for ``kind``."""
        if kind in self._said:
            return False
        self._said.add(kind)
        try:
            fd = os.open(self.prefix + kind, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return False
        except OSError:
            return True  # cannot tell: better said twice than never
        os.close(fd)
        return True

    def rearm(self) -> None:
        """Say each kind again (a reset between runs; the builder only)."""
        self._said.clear()
        _Once._remove(self.prefix, os.getpid())

    @staticmethod
    def _remove(prefix: str, owner: int) -> None:
        if os.getpid() != owner:
            return
        import glob

        for path in glob.glob(glob.escape(prefix) + "*"):
            try:
                os.unlink(path)
            except OSError:
                pass


def _worker_count() -> int:
    """How many DataLoader workers share the calls (0: not in a worker)."""
    import torch.utils.data as tud

    info = tud.get_worker_info()
    return 0 if info is None else int(info.num_workers)


def _index_of(args: tuple[Any, ...]) -> int:
    """The dataset index of a call: the first positional argument that is not
    ``self``, so ``fn(index)`` and ``fn(obj, index)`` both work."""
    if not args:
        raise ValueError("the cached function must take the dataset index as a positional argument "
                         "(fn(index) or fn(self, index))")
    arg = args[1] if len(args) >= 2 else args[0]
    try:
        return operator.index(arg)
    except TypeError:
        raise TypeError(f"the dataset index must be an int, got {type(arg).__name__} {arg!r} "
                        "(the cache reads it from fn(index) or fn(self, index))") from None


def _warn_instance_getitem(fn: Callable[..., Any]) -> None:
    if getattr(fn, "__name__", "") == "__getitem__" and getattr(fn, "__self__", None) is not None:
        warnings.warn(
            "wrapping a bound __getitem__: if the result is assigned to dataset.__getitem__, Python "
            "(and so DataLoader) never calls it, because dataset[i] looks __getitem__ up on the "
            "class, and the cache gets no hits. Call the wrapped function from your class's "
            "__getitem__ instead (docs/migrating.md shows how)", RuntimeWarning, stacklevel=3)


class _Cached:
    """What the decorators return: ``fn`` through the cache. An object, not
    a closure, so that a dataset holding it pickles for spawn workers when
    ``fn`` does (the earlier README keeps ``self._cached_getitem`` on the
    dataset); a descriptor, so that it also decorates a method in a class
    body."""

    def __init__(self, cache: Any, fn: Callable[..., Any]) -> None:
        functools.update_wrapper(self, fn)
        self.cache = cache

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self.__wrapped__  # type: ignore[attr-defined]
        return self.cache._access(lambda: fn(*args, **kwargs), _index_of(args))

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self, obj)


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

    def __init__(self, plan: Plan | None, maxsize: int, divergence_limit: float) -> None:
        self.plan = plan
        self._plan_hits = plan.hits if plan is not None else 0
        self._plan_accesses = plan.accesses if plan is not None else 0
        self._plan_items = plan.items if plan is not None else 0
        self.maxsize = maxsize
        self.divergence_limit = divergence_limit
        self.calls = 0
        self.hits = 0
        self.mismatches = 0
        self.beyond = 0
        self.lru: _LRU | None = None
        self._lock = threading.Lock()
        self._once = _Once()

    def __getstate__(self) -> dict[str, Any]:
        # Picklable, so that spawn workers receive it (a lock and the
        # engine's plan handle are not; what a worker needs is copied out).
        state = self.__dict__.copy()
        state.pop("_lock", None)
        state.pop("plan", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self.plan = None

    def _diverged(self) -> bool:
        """After a mismatch: has the sequence left the plan for good?"""
        limit = max(16, self.divergence_limit * self.calls)
        if self.lru is None and self.mismatches > limit:
            self._fall_back(f"{self.mismatches} of {self.calls} accesses did not match the plan")
            return True
        return False

    def _fall_back(self, what: str, why: str | None = None) -> None:
        """Leave the plan for an online LRU (lock held), saying so once over
        every process: ``what`` was seen, ``why`` it happens (by default
        :meth:`_divergence_cause`)."""
        if self._once.first("divergence"):
            warnings.warn(f"{what}: {why or self._divergence_cause()}. Falling back to an online LRU cache "
                          f"of {self._lru_size()} items{self._where()}", DivergenceWarning, stacklevel=5)
        self.lru = _LRU(self._lru_size())

    def _divergence_cause(self) -> str:
        """Why the calls left the plan, as far as this process can tell."""
        return ("the calls do not come in the planned order: the sampler is not the one planned (another "
                "seed, an unseeded sampler, a forgotten set_epoch, or another sampler)")

    @staticmethod
    def _where() -> str:
        n = _worker_count()
        return f" (in each of the DataLoader's {n} workers; said once)" if n > 1 else ""

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate ``fn(index)`` or ``fn(obj, index)``; ``wrapped.cache`` is
        this object. Cheap enough to call per access (``cache(fn)(i)``)."""
        _warn_instance_getitem(fn)
        return _Cached(self, fn)

    def _access(self, load: Callable[[], Any], index: int) -> Any:
        raise NotImplementedError

    def _lru_size(self) -> int:
        return self.maxsize

    def _plan_fields(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "mismatches": self.mismatches,
            "beyond_plan": self.beyond,
            "degraded_to_lru": self.lru is not None,
            "plan_hits": self._plan_hits,
            "plan_accesses": self._plan_accesses,
        }


class OPTCacheDecorator(_Follower):
    """Cache ``fn(index)`` or ``fn(obj, index)`` by the OPT plan, in one process.

    ``OPTCacheDecorator(precomputed_path, maxsize, total_iter)``, as in
    OPT4TorchDataSet 1.x: ``maxsize`` items (the plan is built again at that
    size if the file was made for another or for none; ``maxsize=0`` passes
    every call straight through); ``total_iter`` calls, at most the file's
    positions (ValueError if the file holds fewer). Call ``total_iter + 1``
    raises IndexError; ``reset()`` starts over. ``precomputed_path`` is an
    opt4 plan file or an OPT4TorchDataSet safetensors file.

    The earlier design's form ``OPTCacheDecorator(path, maxsize,
    prediction_window, total_iter)`` (``prediction_window`` positional or by
    keyword) still works, with its rule that ``total_iter`` equals the file's
    accesses; ``prediction_window`` has no effect (the plan sees the whole
    run) and warns. ``dataset_size``, ``item_shape`` and ``item_dtype`` (which
    ``get_opt_cache`` passes to both decorators) are accepted and unused.

    Cached objects stay in this process as they are (no copy, any type).
    ``mode="c"`` takes the decisions from the C planner, ``mode="python"``
    from the pure-Python reference (the debug path); both follow the same
    plan. In DataLoader workers each process would get its own copy with its
    own position, which cannot match the plan: it warns there and names the
    :class:`SharedOPTCacheDecorator` call to use instead.
    """

    _UNUSED = ("dataset_size", "item_shape", "item_dtype")

    def __init__(self, precomputed_path: Any, maxsize: int, total_iter: int | None = None,
                 *earlier: Any, mode: str = "c", bypass: bool = True, divergence_limit: float = 0.05,
                 **kwargs: Any) -> None:
        exact_total = False
        if len(earlier) > 1:
            raise TypeError("OPTCacheDecorator takes (precomputed_path, maxsize, total_iter), or the "
                            "earlier (precomputed_path, maxsize, prediction_window, total_iter)")
        if earlier:  # the earlier positional form
            kwargs["prediction_window"], total_iter = total_iter, earlier[0]
        if "prediction_window" in kwargs:
            kwargs.pop("prediction_window")
            warnings.warn("prediction_window has no effect (the plan sees the whole run): remove it; "
                          "OPTCacheDecorator(precomputed_path, maxsize, total_iter) is the current form",
                          DeprecationWarning, stacklevel=2)
            exact_total = True
        unknown = sorted(set(kwargs) - set(self._UNUSED))
        if unknown:
            raise TypeError(f"OPTCacheDecorator() got unexpected keyword arguments: {', '.join(unknown)}")
        if mode not in ("c", "cpp", "python"):
            raise ValueError(f"mode must be 'c' (or 'cpp') or 'python', got {mode!r}")
        maxsize = _check_size("maxsize", maxsize, 0)
        self.precomputed_path = os.fspath(precomputed_path)
        self.mode = "python" if mode == "python" else "c"
        self.bypass = bypass
        self._pid = os.getpid()
        self._warned_worker = False
        self._store: dict[int, tuple[int, Any]] = {}
        self._evicts = 0
        if maxsize == 0:  # OPT4TorchDataSet 1.x: no cache, every call goes to fn
            super().__init__(None, 0, divergence_limit)
            self.total_iter = total_iter
            self._seq: list[int] = []
            return
        plan = _fit_plan(precomputed_path, maxsize, total_iter, bypass, exact_total=exact_total)
        super().__init__(plan, maxsize, divergence_limit)
        self.total_iter = plan.accesses
        if self.mode == "python":
            from ..lab import reference

            ops = reference.belady(plan.seq.tolist(), maxsize, bypass=bypass, items=plan.items).ops
            self._kinds = [k for k, _ in ops]
            self._slots = [s for _, s in ops]
        else:
            self._kinds = plan.kinds.tolist()
            self._slots = plan.slots.tolist()
        self._seq = plan.seq.tolist()

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if self.maxsize == 0:
            _warn_instance_getitem(fn)
            return fn
        return super().__call__(fn)

    def _shared_call(self) -> str:
        return (f"SharedOPTCacheDecorator({self.precomputed_path!r}, maxsize={self.maxsize}, "
                f"dataset_size={self._plan_items}) (or get_opt_cache(num_workers=..., ...) with the same "
                "arguments): one pool for all workers, with the plan's hits")

    def _warn_in_worker(self) -> None:
        """In another process (lock held). In one of several DataLoader
        workers the plan cannot be followed at all: each worker's copy sees
        only its own batches, so its call count is not the position. Straight
        to an LRU then, said once for all workers."""
        self._warned_worker = True
        n = _worker_count()
        if n > 1:
            self.lru = _LRU(self._lru_size())
            if self._once.first("divergence"):
                warnings.warn(
                    f"OPTCacheDecorator keeps its cache and its position in one process: each of the "
                    f"DataLoader's {n} workers has a copy that sees only that worker's batches, so its "
                    "count of calls is not the plan's position (not a forgotten set_epoch: the sampler "
                    f"is fine). Each worker caches in an online LRU of {self._lru_size()} items instead "
                    f"(said once for all workers). With num_workers > 0 use {self._shared_call()}",
                    DivergenceWarning, stacklevel=4)
        elif n == 0 and self._once.first("worker"):
            warnings.warn(
                "OPTCacheDecorator keeps its cache and its position in one process: in another process "
                f"it sees only some of the calls and cannot follow the plan. Use {self._shared_call()}",
                RuntimeWarning, stacklevel=4)

    def _divergence_cause(self) -> str:
        if _worker_count() == 1:
            return ("the DataLoader's one worker holds a copy of the cache made when the worker started, "
                    "so a worker that is not persistent starts each epoch from the position the main "
                    "process had (persistent_workers=True keeps one copy for the run), or the sampler is "
                    "not the one planned (another seed, an unseeded sampler, a forgotten set_epoch)")
        return super()._divergence_cause()

    def _access(self, load: Callable[[], Any], index: int) -> Any:
        with self._lock:
            if os.getpid() != self._pid and not self._warned_worker:
                self._warn_in_worker()
            t = self.calls
            if t >= len(self._seq):
                raise IndexError(f"call {t + 1} is past total_iter={len(self._seq)}, the accesses "
                                 f"{self.precomputed_path} was planned for: call reset() before the "
                                 "next run, or regenerate the file with more total_iterations")
            self.calls += 1
            if self.lru is not None:
                value, hit = self.lru.get(index, load)
                self.hits += hit
                return value
            kind, slot = self._kinds[t], self._slots[t]
            if self._seq[t] != index:
                # Never serve another item: load, and let what this position
                # would have stored be missing (its hits then load too).
                self.mismatches += 1
                if kind == ADMIT and self._store.pop(slot, None) is not None:
                    self._evicts += 1
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
                if slot in self._store:
                    self._evicts += 1
                self._store[slot] = (index, value)
            return value

    def stats(self) -> dict[str, Any]:
        """OPT4TorchDataSet's keys (``current``, ``size``, ``capacity``,
        ``hits``, ``miss``, ``evict``, ``hit_rate``) and this project's
        (``calls``, ``misses``, ``mismatches``, ``beyond_plan``,
        ``degraded_to_lru``, ``plan_hits``, ``plan_accesses``). ``evict``
        counts stored items replaced by another; ``size`` the items held."""
        miss = self.calls - self.hits
        size = len(self.lru.data) if self.lru is not None else len(self._store)
        return {
            "current": self.calls,
            "size": size,
            "capacity": self.maxsize,
            "hits": self.hits,
            "miss": miss,
            "evict": self._evicts,
            "hit_rate": self.hits / self.calls if self.calls else 0.0,
            "misses": miss,
            **self._plan_fields(),
        }

    def reset(self) -> None:
        """Start over: position 0, counters zero, the cache empty."""
        with self._lock:
            self.calls = self.hits = self.mismatches = self.beyond = self._evicts = 0
            self.lru = None
            self._store.clear()
            self._warned_worker = False
            if os.getpid() == self._pid:
                self._once.rearm()


# The rendezvous file: the pool's name, then counters that every process adds
# to (under the file's lock) for the calls the pool does not count itself.
_NAME_BYTES = 256
_OFF_PLAN, _LRU_HITS, _LRU_MISSES, _BEYOND = range(4)
_N_COUNTERS = 4


class SharedOPTCacheDecorator(_Follower):
    """Cache ``fn(index)`` or ``fn(obj, index)`` by the OPT plan across
    DataLoader workers, in one shared-memory pool.

    ``SharedOPTCacheDecorator(precomputed_path, maxsize, dataset_size,
    item_shape, item_dtype=torch.float32)``, as in OPT4TorchDataSet 1.x:
    ``maxsize`` items (> 0); with ``item_shape`` the pool holds tensors of
    that shape and dtype, every call returns one (``torch.as_tensor(value,
    dtype=item_dtype)``), and the pool is created here, in the main process.
    A HIT is copied once, out of the pool into a fresh tensor that owns its
    memory: the pool's slots are reused by later positions, so a view of one
    could change under the caller (docs/migrating.md). Without ``item_shape``
    any value the codec handles is cached (``allow_pickle=True`` for the
    rest), and the pool is created by the first process that loads an item.

    Build it in the main process (in your dataset's ``__init__``); the main
    process removes the pool when it exits. ``position="occurrence"`` (the
    default) is exact under worker interleaving; ``position="clock"`` is
    OPT4TorchDataSet's global counter (see the module docs). ``stats()``
    counts every process's calls. ``total_iter`` (at most the file's
    positions) limits the plan to its first ``total_iter`` positions.

    The earlier design's form ``SharedOPTCacheDecorator(path, maxsize,
    prediction_window, total_iter)`` still works and warns.
    """

    def __init__(self, precomputed_path: Any, maxsize: int, dataset_size: int | None = None,
                 item_shape: Any = None, item_dtype: Any = None, *, position: str = "occurrence",
                 total_iter: int | None = None, item_bytes: int | None = None,
                 allow_pickle: bool = False, bypass: bool = True, divergence_limit: float = 0.05,
                 wait_timeout: float = 10.0, divergence_window: int = 1 << 16, **kwargs: Any) -> None:
        exact_total = False
        if isinstance(item_shape, (int, np.integer)) and not isinstance(item_shape, bool):
            # The earlier positional form (path, maxsize, prediction_window, total_iter).
            kwargs["prediction_window"], total_iter = dataset_size, int(item_shape)
            dataset_size = item_shape = None
        if "prediction_window" in kwargs:
            kwargs.pop("prediction_window")
            warnings.warn("prediction_window has no effect (the plan sees the whole run): remove it; "
                          "SharedOPTCacheDecorator(precomputed_path, maxsize, dataset_size, item_shape) "
                          "is the current form", DeprecationWarning, stacklevel=2)
            exact_total = True
        if kwargs:
            raise TypeError(f"SharedOPTCacheDecorator() got unexpected keyword arguments: "
                            f"{', '.join(sorted(kwargs))}")
        if position not in ("clock", "occurrence"):
            raise ValueError(f"position must be 'occurrence' (exact with workers) or 'clock', got {position!r}")
        if isinstance(maxsize, (int, np.integer)) and not isinstance(maxsize, bool) and maxsize <= 0:
            raise ValueError(f"SharedOPTCacheDecorator requires maxsize > 0, got {maxsize} (for no "
                             "cache, call the function directly)")
        maxsize = _check_size("maxsize", maxsize, 1)
        plan = _fit_plan(precomputed_path, maxsize, total_iter, bypass, exact_total=exact_total)
        if dataset_size is not None:
            dataset_size = _check_size("dataset_size", dataset_size, 1)
            top = int(plan.seq.max())
            if top >= dataset_size:
                raise ValueError(f"{os.fspath(precomputed_path)} holds the index {top}, outside "
                                 f"dataset_size={dataset_size}: the file was made for another dataset")
        self.dataset_size = dataset_size
        super().__init__(plan, maxsize, divergence_limit)
        self.position = position
        self.bypass = bypass
        self.total_iter = plan.accesses
        self.allow_pickle = allow_pickle
        self.wait_timeout = wait_timeout
        self.divergence_window = int(divergence_window)
        self._timeouts_here = self._timeouts_seen = 0
        self.item_shape: tuple[int, ...] | None = None
        self.item_dtype = None
        if item_shape is not None:
            import torch

            try:
                self.item_shape = tuple(int(d) for d in item_shape)
            except TypeError:
                raise TypeError(f"item_shape must be a tuple of ints, got {item_shape!r}") from None
            if any(d < 0 for d in self.item_shape):
                raise ValueError(f"item_shape must not have negative sizes, got {self.item_shape}")
            self.item_dtype = torch.float32 if item_dtype is None else item_dtype
            if not isinstance(self.item_dtype, torch.dtype):
                raise TypeError(f"item_dtype must be a torch.dtype, got {item_dtype!r}")
            itemsize = torch.empty((), dtype=self.item_dtype).element_size()
            item_bytes = max(1, math.prod(self.item_shape) * itemsize)
        elif item_dtype is not None:
            raise ValueError("item_dtype needs item_shape (the pool's tensors have one shape)")
        self.item_bytes = item_bytes
        self._owner_pid = os.getpid()
        self._plan_path = os.fspath(precomputed_path)
        self._total_iter_arg = total_iter
        self._rendezvous = os.path.join(tempfile.gettempdir(),
                                        f"opt4-{os.getuid()}-{os.getpid()}-{secrets.token_hex(8)}.pool")
        # In a shared temporary directory: created new (never an existing file
        # or a symlink someone placed there), readable by this user only.
        fd = os.open(self._rendezvous, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        try:
            os.pwrite(fd, bytes(_NAME_BYTES + 8 * _N_COUNTERS), 0)
        finally:
            os.close(fd)
        self._local = threading.local()
        self._finalizer = _shared_finalizer(self, self._rendezvous, self._owner_pid)
        if self.item_shape is not None:
            self._create_pool(plan, self.item_bytes)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_local", "_lock", "_finalizer", "plan"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()
        self._lock = threading.Lock()
        # Workers need no plan: the pool holds the sequence and decisions. The
        # one that creates the pool rebuilds it from the file.
        self.plan = None

    def _lru_size(self) -> int:
        import torch.utils.data as tud

        info = tud.get_worker_info()
        return max(1, self.maxsize // (info.num_workers if info is not None else 1))

    # ---- the rendezvous file ----

    def _open_rendezvous(self) -> Any:
        f = os.fdopen(os.open(self._rendezvous, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC), "r+b")
        if os.fstat(f.fileno()).st_uid != os.getuid():
            f.close()
            raise PermissionError(f"{self._rendezvous} is not this user's file: refused")
        fcntl.flock(f, fcntl.LOCK_EX)
        return f

    def _bump(self, counter: int, n: int = 1) -> None:
        with self._open_rendezvous() as f:
            off = _NAME_BYTES + 8 * counter
            (value,) = struct.unpack("<q", os.pread(f.fileno(), 8, off))
            os.pwrite(f.fileno(), struct.pack("<q", value + n), off)

    def _counters(self) -> list[int]:
        with self._open_rendezvous() as f:
            return list(struct.unpack(f"<{_N_COUNTERS}q", os.pread(f.fileno(), 8 * _N_COUNTERS, _NAME_BYTES)))

    def _create_pool(self, plan: Plan, size: int) -> str:
        """Create the pool and publish its name (the caller holds the lock or
        is the constructor)."""
        created = _engine.pool_create(plan._h, size, int(self.wait_timeout * 1000),
                                      occurrences=self.position == "occurrence",
                                      owner_pid=self._owner_pid)
        name = created.name
        created.close()
        with self._open_rendezvous() as f:
            os.pwrite(f.fileno(), name.encode().ljust(_NAME_BYTES, b"\0"), 0)
        return name

    def _pool_for(self, first_parts: Any = None) -> Any:
        held = getattr(self._local, "pool", None)
        if held is not None and held[0] == os.getpid():
            return held[1]
        with self._open_rendezvous() as f:
            name = os.pread(f.fileno(), _NAME_BYTES, 0).rstrip(b"\0").decode()
            if not name:
                if first_parts is None:
                    return None
                size = self.item_bytes or sum(memoryview(p).nbytes for p in first_parts)
                plan = self.plan if self.plan is not None else _fit_plan(
                    self._plan_path, self.maxsize, self._total_iter_arg, self.bypass, quiet=True)
                created = _engine.pool_create(plan._h, size, int(self.wait_timeout * 1000),
                                              occurrences=self.position == "occurrence",
                                              owner_pid=self._owner_pid)
                name = created.name
                created.close()
                os.pwrite(f.fileno(), name.encode().ljust(_NAME_BYTES, b"\0"), 0)
        pool = _engine.pool_attach(name)
        info = pool.info()
        self._local.pool = (os.getpid(), pool)
        self._local.shape = (int(info["accesses"]), int(info["items"]))
        return pool

    # ---- one access ----

    def _encode(self, value: Any) -> tuple[Any, list[Any]]:
        """What the caller gets and what the pool stores for ``value``."""
        if self.item_shape is None:
            return value, encode(value, self.allow_pickle)
        import torch

        try:
            tensor = torch.as_tensor(value, dtype=self.item_dtype)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"the pool holds one tensor of item_shape={self.item_shape} per item, but "
                            f"the function returned {type(value).__name__} ({exc}); leave item_shape "
                            "out to cache other values") from None
        if tuple(tensor.shape) != self.item_shape:
            raise ValueError(f"the function returned a tensor of shape {tuple(tensor.shape)}; the pool "
                             f"holds item_shape={self.item_shape}")
        flat = tensor.detach().cpu().contiguous()
        return tensor, [memoryview(flat.reshape(-1).view(torch.uint8).numpy()) if flat.numel() else b""]

    def _decode(self, data: bytearray, offset: int, length: int) -> Any:
        if self.item_shape is None:
            return decode(memoryview(data)[offset:offset + length])
        import torch

        if length == 0:
            return torch.empty(self.item_shape, dtype=self.item_dtype)
        # One copy, out of the pool into `data` (read_batch): the tensor owns
        # that buffer, so nothing later written to the pool changes it.
        return torch.frombuffer(data, dtype=self.item_dtype, count=math.prod(self.item_shape),
                                offset=offset).view(self.item_shape)

    def _load(self, load: Callable[[], Any]) -> Any:
        value = load()
        return value if self.item_shape is None else self._encode(value)[0]

    def _off_plan(self, load: Callable[[], Any], index: int) -> Any:
        """A call the plan cannot serve: the LRU fallback once diverged, else load."""
        with self._lock:
            lru = self.lru
            if lru is not None:
                value, hit = lru.get(index, lambda: self._load(load))
                self.hits += hit
        if lru is not None:
            self._bump(_LRU_HITS if hit else _LRU_MISSES)
            return value
        self._bump(_OFF_PLAN)
        return self._load(load)

    def _access(self, load: Callable[[], Any], index: int) -> Any:
        with self._lock:
            self.calls += 1
            degraded = self.lru is not None
        if degraded:
            return self._off_plan(load, index)
        pool = self._pool_for()
        if pool is None:  # nobody has created it yet: load this item and create it
            value = load()
            shown, parts = self._encode(value)
            pool = self._pool_for(parts)
            t = self._next_position(pool, index)
            if t is None:
                self._bump(_OFF_PLAN)
                return shown
            item, kind = pool.item(t)
            if item != index:
                self._mismatch(pool, t)
                self._bump(_OFF_PLAN)
            else:
                data, entries = pool.read_batch([t])
                if entries[0][0] == _engine.ENTRY_LOAD and entries[0][2] == _engine.REASON_ADMIT:
                    pool.store_batch([(t, parts)])
            return shown
        t = self._next_position(pool, index)
        if t is None:
            return self._off_plan(load, index)
        item, kind = pool.item(t)
        if item != index:
            self._mismatch(pool, t)
            return self._off_plan(load, index)
        data, entries = pool.read_batch([t])
        status, _, a, b = entries[0]
        if status == _engine.ENTRY_HIT:
            with self._lock:
                self.hits += 1
            return self._decode(data, a, b)
        if status == _engine.ENTRY_LOAD and a == _engine.REASON_FALLBACK:  # did its wait run out?
            self._timed_out(pool)
        if status == _engine.ENTRY_LOAD and a == _engine.REASON_ADMIT:
            try:
                shown, parts = self._encode(load())
            except BaseException:
                # Nothing to store: mark the admission failed, so that its
                # readers load at once instead of waiting for it.
                pool.skip(t)
                raise
            if pool.store_batch([(t, parts)])[0] != _engine.STORE_STORED:  # not stored: did its wait run out?
                self._timed_out(pool)
            return shown
        return self._load(load)

    def _timed_out(self, pool: Any) -> None:
        """A wait of this process ran out (``wait_timeout``): the positions it
        waited for were not reached. With the planned sampler that takes a
        stalled process; under another order (which workers cannot tell from
        the positions alone on a small dataset) it happens at every few
        admissions. Twice in a process: fall back to LRU, so that a wrong
        order costs two waits per process, not one per admission."""
        seen = pool.stats()["timeouts"]  # every process's: a load or a size is not a timeout
        with self._lock:
            if seen <= self._timeouts_seen:
                return
            self._timeouts_seen = seen
            self._timeouts_here += 1
            if self.lru is None and self._timeouts_here >= 2:
                self._fall_back(f"{self._timeouts_here} waits of this process for the plan's earlier "
                                f"positions ran out (wait_timeout={self.wait_timeout} s)",
                                "the positions waited for were not reached in time: the calls come in "
                                "another order than the plan's (on a small dataset the workers cannot "
                                "tell from the positions alone: another seed, an unseeded sampler, a "
                                "forgotten set_epoch), or a process stalled for longer than wait_timeout")

    def _next_position(self, pool: Any, index: int) -> int | None:
        accesses, items = self._local.shape
        if self.position == "clock":
            t = pool.clock_next()
        else:
            clock = pool.clock_next()  # every process's calls so far
            t = pool.occurrence_next(index) if 0 <= index < items else None
            if t is not None and t < accesses and self._off_order(t, clock):
                self._mismatch(pool, t)
                return None
        if t is None or t >= accesses:
            with self._lock:
                self.beyond += 1
            self._bump(_BEYOND)
            return None
        return int(t)

    def _off_order(self, t: int, clock: int) -> bool:
        """Does the occurrence mapping's position ``t`` show that the calls
        do not follow the plan (an unseeded sampler, another seed, a
        forgotten set_epoch)? Then it must not be waited on: an admission
        there may wait for reads that never come.

        With the planned sampler, one process alone makes every call in the
        plan's order, so ``t`` is the global call count: anything else is
        off order. With workers, positions are only known to lie within the
        batches in flight of the call count; further than
        ``divergence_window`` is off order. Closer than that, another order
        goes undetected and can cost timed-out waits (bounded by
        ``wait_timeout``, counted in ``stats()["timeouts"]``)."""
        import torch.utils.data as tud

        if tud.get_worker_info() is None:
            return t != clock
        return abs(t - clock) > self.divergence_window

    def _divergence_cause(self) -> str:
        n = _worker_count()
        if self.position == "clock" and n > 1:
            return (f"with position='clock' every call takes the next value of one counter shared by the "
                    f"{n} workers, in the order the workers run, which is not the sampler's order (the "
                    "sampler is fine). position='occurrence' (the default) follows the plan with workers")
        return super()._divergence_cause()

    def _mismatch(self, pool: Any, t: int) -> bool:
        pool.skip(t)
        with self._lock:
            self.mismatches += 1
            return self._diverged()

    # ---- counters ----

    def pool_stats(self) -> dict[str, Any] | None:
        """The pool's counters over every process (None before it exists)."""
        pool = self._pool_for()
        return None if pool is None else pool.stats()

    def stats(self) -> dict[str, Any]:
        """Counted across all processes: OPT4TorchDataSet's keys
        (``current``: calls so far, ``hits``, ``miss``, ``evict``,
        ``hit_rate``, ``pool_free``, ``pool_utilized``) and this project's
        (``misses``, ``off_plan``: calls that loaded without consulting the
        plan, ``timeouts``, ``plan_hits``, ``plan_accesses``, and this
        process's ``mismatches`` and ``degraded_to_lru``). ``evict`` counts
        stored items beyond ``maxsize`` (each replaced one); ``pool_utilized``
        the slots that have held an item."""
        off_plan, lru_hits, lru_misses, beyond = self._counters()
        ps = self.pool_stats() or {}
        pool_hits = ps.get("hits", 0)
        pool_loads = ps.get("admits", 0) + ps.get("bypasses", 0) + ps.get("fallbacks", 0)
        hits = pool_hits + lru_hits
        miss = pool_loads + off_plan + lru_misses
        stored = ps.get("stored", 0)
        used = min(stored, self.maxsize)
        return {
            "current": hits + miss,
            "hits": hits,
            "miss": miss,
            "evict": max(0, stored - self.maxsize),
            "hit_rate": hits / (hits + miss) if hits + miss else 0.0,
            "pool_free": self.maxsize - used,
            "pool_utilized": used,
            "misses": miss,
            "off_plan": off_plan + lru_hits + lru_misses,
            "beyond_plan": beyond,
            "timeouts": ps.get("timeouts", 0),
            "mismatches": self.mismatches,
            "degraded_to_lru": self.lru is not None,
            "plan_hits": self._plan_hits,
            "plan_accesses": self.total_iter,
        }

    def reset(self) -> None:
        """Start over (main process, between runs): a fresh pool, position 0,
        every counter zero. Persistent workers of an earlier loader keep the
        old pool; make a new DataLoader after reset()."""
        if os.getpid() != self._owner_pid:
            raise RuntimeError("reset() belongs to the main process that built the cache")
        with self._lock:
            self.calls = self.hits = self.mismatches = self.beyond = self._timeouts_here = 0
            self._timeouts_seen = 0
            self.lru = None
            self._once.rearm()
        with self._open_rendezvous() as f:
            name = os.pread(f.fileno(), _NAME_BYTES, 0).rstrip(b"\0").decode()
            os.pwrite(f.fileno(), bytes(_NAME_BYTES + 8 * _N_COUNTERS), 0)
        held = getattr(self._local, "pool", None)
        self._local.pool = None
        if held is not None:
            held[1].close()
        if name:
            try:
                _engine.pool_remove(name, force=True)
            except _engine.Opt4Error:
                pass
        if self.item_shape is not None and self.plan is not None:
            self._create_pool(self.plan, self.item_bytes)  # type: ignore[arg-type]

    def close(self) -> None:
        """Remove the pool now (main process)."""
        self._finalizer()


def _shared_finalizer(owner: Any, rendezvous: str, owner_pid: int) -> Any:
    import weakref

    def done() -> None:
        if os.getpid() != owner_pid:
            return
        try:
            with open(rendezvous, "rb") as f:
                name = f.read(_NAME_BYTES).rstrip(b"\0").decode()
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


class CachetoolsDecorator:
    """Cache ``fn(index)`` or ``fn(obj, index)`` by index in any cachetools
    cache (``LRUCache``, ``LFUCache``, ``FIFOCache``, ``RRCache``, ...), as
    OPT4TorchDataSet's baselines do. Picklable, so it works under spawn; each
    worker process then has its own copy. A ``ValueError`` from the cache (an
    item too large for it) is ignored: the value is returned uncached."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        _warn_instance_getitem(func)
        return _Cached(self, func)

    def _access(self, load: Callable[[], Any], idx: int) -> Any:
        try:
            return self.cache[idx]
        except KeyError:
            pass
        result = load()
        try:
            self.cache[idx] = result
        except ValueError:
            pass
        return result


def get_opt_cache(mode: str | None = None, num_workers: int = 0, **kwargs: Any) -> Any:
    """OPT4TorchDataSet's factory. ``mode=None`` picks ``"cpp"`` (a
    :class:`SharedOPTCacheDecorator`, one pool for all workers) when
    ``num_workers > 0``, else ``"python"`` (an :class:`OPTCacheDecorator`,
    one process). ``"c"`` is the earlier spelling of ``"cpp"``. Keyword
    arguments go to the chosen class; those the other class needs
    (``total_iter`` for one, ``dataset_size``/``item_shape`` for the other)
    may be passed to both."""
    if mode is None:
        mode = "cpp" if num_workers > 0 else "python"
    if mode == "c":
        _renamed("get_opt_cache(mode='c')", "mode='cpp'")
        mode = "cpp"
    if mode == "cpp":
        return SharedOPTCacheDecorator(**kwargs)
    if mode == "python":
        if num_workers > 0:
            warnings.warn(
                f"get_opt_cache(mode='python', num_workers={num_workers}): OPTCacheDecorator keeps its "
                "cache in one process, so each worker gets its own copy that cannot follow the plan. "
                "Use get_opt_cache(num_workers=..., ...) without mode (or mode='cpp') and pass "
                "dataset_size=: one shared pool, with the plan's hits", RuntimeWarning, stacklevel=2)
        return OPTCacheDecorator(**kwargs)
    raise ValueError(f"Unknown mode: {mode!r}: mode must be None, 'cpp' or 'python'")
