"""Plans: Belady's OPT decisions for a known access sequence.

A plan holds, for every position ``t`` of the sequence, one of

* ``HIT``: the item is in the cache, in ``slot``;
* ``ADMIT``: load the item and store it in ``slot`` (evicting what was there);
* ``BYPASS``: load the item and do not store it,

plus the totals. Plans are built by the C engine and saved in a versioned,
checksummed binary file (docs/plan-format.md), read into memory when loaded.

Here: the Plan object, plan() and sequence_plan() (the C planner), load_plan
(a plan file, opened by plan_file.py). The page a sized plan's pool takes
is chosen in sizing.py (choose_page). What a plan is built from is checked in inputs.py
(as_sequence, fingerprint); a long build draws its bar in progress.py.

May touch: the binding's planner and plan files; never a pool, a dataset or
torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _engine
from .._engine import InvalidInputError
from .inputs import as_sequence as as_sequence, check_capacity as _check_capacity, fingerprint as fingerprint
from .plan_file import open_plan_file
from .progress import run_with_progress as _run_with_progress

__all__ = ["HIT", "ADMIT", "BYPASS", "Plan", "plan", "load_plan", "fingerprint", "as_sequence"]

HIT: int = _engine.OP_HIT
ADMIT: int = _engine.OP_ADMIT
BYPASS: int = _engine.OP_BYPASS

_SLOT_MASK = 0x3FFFFFFF


class Plan:
    """An OPT cache plan held by the C engine.

    Build one with :func:`plan` or load one with :func:`load_plan`. The arrays
    (:attr:`seq`, :attr:`ops`, ...) are zero-copy, read-only numpy views that
    keep the plan alive.
    """

    __slots__ = ("_h", "_info", "path")

    def __init__(self, handle: _engine.Plan, path: str | None = None) -> None:
        self._h = handle
        self._info: dict[str, Any] = dict(handle.info())
        self.path = path

    # ---- header and totals ----
    @property
    def items(self) -> int:
        """N: item ids are in ``[0, items)``."""
        return int(self._info["items"])

    @property
    def accesses(self) -> int:
        """T: the length of the sequence."""
        return int(self._info["accesses"])

    def __len__(self) -> int:
        return self.accesses

    @property
    def capacity(self) -> int:
        """Cache capacity in items (0 for a sequence-only plan)."""
        return int(self._info["capacity"])

    @property
    def has_decisions(self) -> bool:
        """False for a sequence-only plan (made before a capacity was known)."""
        return bool(self._info["has_ops"])

    @property
    def bypass(self) -> bool:
        """Whether the plan may decline to cache a miss (policy ``opt``)."""
        return bool(self._info["bypass"])

    @property
    def policy(self) -> str:
        """``"opt"`` (with bypass) or ``"opt-nobypass"`` (classic Belady MIN)."""
        return "opt" if self.bypass else "opt-nobypass"

    @property
    def sized(self) -> bool:
        """Whether the capacity is in bytes (pages) rather than items."""
        return bool(self._info["sized"])

    @property
    def capacity_bytes(self) -> int:
        """Sized plans: the capacity in bytes (0 otherwise)."""
        return int(self._info["capacity_bytes"])

    @property
    def pool_slots(self) -> int:
        """Pages (a sized plan) or items (an item plan) the pool keeps for the
        plan's decisions: its size in the pool's units."""
        return int(self._info["slots"])

    @property
    def page_size(self) -> int:
        """Sized plans: bytes per page (0 otherwise)."""
        return int(self._info["page_size"])

    @property
    def generations(self) -> int:
        """Sized plans: the number of ADMITs, each owning a list of pages."""
        return int(self._info["generations"])

    def gen_pages(self, g: int) -> npt.NDArray[np.uint32]:
        """Sized plans: the pages of generation ``g``."""
        return np.frombuffer(self._h.gen_pages(int(g)), dtype=np.uint32)

    @property
    def item_sizes(self) -> npt.NDArray[np.uint32] | None:
        """Sized plans: each item's size in bytes."""
        raw = self._h.item_sizes()
        return None if raw is None else np.frombuffer(raw, dtype=np.uint32)

    @property
    def hits(self) -> int:
        return int(self._info["hits"])

    @property
    def misses(self) -> int:
        """Admits plus bypasses."""
        return int(self._info["misses"])

    @property
    def admits(self) -> int:
        return int(self._info["admits"])

    @property
    def bypasses(self) -> int:
        return int(self._info["bypasses"])

    @property
    def compulsory_misses(self) -> int:
        """First accesses: the number of distinct ids in the sequence."""
        return int(self._info["compulsory"])

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    @property
    def fingerprint(self) -> int:
        """64-bit XXH3 fingerprint of the sequence (see :func:`fingerprint`)."""
        return int(self._info["fingerprint"])

    @property
    def description(self) -> str:
        """The sampler description stored with the plan (often JSON)."""
        return str(self._info["description"])

    @description.setter
    def description(self, text: str) -> None:
        self._h.set_description(text)
        self._info = dict(self._h.info())

    # ---- arrays ----
    @property
    def seq(self) -> npt.NDArray[np.uint32]:
        """The item id at each position (read-only, zero-copy)."""
        return np.frombuffer(self._h.seq_buffer(), dtype=np.uint32)

    @property
    def ops(self) -> npt.NDArray[np.uint32]:
        """The raw op per position: kind in the top 2 bits, slot in the low 30."""
        return np.frombuffer(self._h.ops_buffer(), dtype=np.uint32)

    @property
    def kinds(self) -> npt.NDArray[np.uint8]:
        """HIT (0), ADMIT (1) or BYPASS (2) per position."""
        return (self.ops >> 30).astype(np.uint8)

    @property
    def slots(self) -> npt.NDArray[np.int64]:
        """The slot per position; -1 for BYPASS."""
        ops = self.ops
        out = (ops & _SLOT_MASK).astype(np.int64)
        out[(ops >> 30) == BYPASS] = -1
        return out

    def victims(self) -> npt.NDArray[np.int64]:
        """The id each position evicts (-1 where nothing is evicted)."""
        return np.frombuffer(self._h.victims(), dtype=np.int64)

    def slots_at(self, t: int) -> npt.NDArray[np.int64]:
        """What each slot (page, for a sized plan) holds just before position
        ``t``: the id last written there (-1: never written). In a sized plan
        an evicted item's pages keep its id until another item takes them; the
        live set is :meth:`resident_at`."""
        return np.frombuffer(self._h.slots_at(int(t)), dtype=np.int64)

    def resident_at(self, t: int) -> npt.NDArray[np.int64]:
        """The live resident set just before position ``t``, sorted: the ids
        stored before ``t`` that the plan reads from the cache again, which are
        exactly the ids whose next access at or after ``t`` is a HIT. This is
        what resuming at ``t`` warms a fresh pool with."""
        return self.resident_reads_at(t)[0]

    def resident_reads_at(self, t: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """:meth:`resident_at` and, for each id, the position of its next
        read (a HIT at or after ``t``): where a pool that ran this plan up to
        ``t`` can still be read for it (a re-plan keeps those items)."""
        t = int(t)
        if not 0 <= t <= self.accesses:
            raise InvalidInputError(f"position {t} is outside [0, {self.accesses}]")
        ids, first = np.unique(self.seq[t:], return_index=True)
        hit = self.kinds[t + first] == HIT
        return ids[hit].astype(np.int64), (t + first[hit]).astype(np.int64)

    # ---- derived plans and files ----
    def with_capacity(self, capacity: int, bypass: bool = True, *, progress: bool | None = None) -> Plan:
        """A new plan over the same sequence at another capacity."""
        capacity = _check_capacity(capacity)
        handle = _run_with_progress(
            lambda counter: _engine.replan(self._h, capacity, bypass, progress=counter),
            self.accesses, "planning", progress,
        )
        return Plan(handle)

    def save(self, path: str | os.PathLike[str], description: str | None = None) -> None:
        """Write the plan file atomically (a temporary file renamed into place).

        A path that is not a regular file (a directory, a device node such
        as /dev/null, a FIFO, a link to one) is refused before anything is
        written (:class:`opt4torch.Opt4IOError`)."""
        if description is not None:
            self.description = description
        self._h.save(os.fspath(path))

    def stats(self) -> dict[str, Any]:
        """Header and totals as plain JSON-ready values."""
        desc: Any = self.description
        try:
            desc = json.loads(desc) if desc else None
        except ValueError:
            pass
        return {
            "items": self.items,
            "accesses": self.accesses,
            "capacity": self.capacity if self.has_decisions else None,
            "capacity_bytes": self.capacity_bytes if self.sized else None,
            "page_size": self.page_size if self.sized else None,
            "policy": self.policy if self.has_decisions else None,
            "hits": self.hits if self.has_decisions else None,
            "misses": self.misses if self.has_decisions else None,
            "bypasses": self.bypasses if self.has_decisions else None,
            "admits": self.admits if self.has_decisions else None,
            "compulsory_misses": self.compulsory_misses,
            "hit_rate": self.hit_rate if self.has_decisions else None,
            "fingerprint": f"{self.fingerprint:016x}",
            "description": desc,
        }

    def close(self) -> None:
        """Release the plan's memory (or mapping) now."""
        self._h.close()

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        """(id, kind, slot) per position; slot is -1 for BYPASS."""
        seq, kinds, slots = self.seq, self.kinds, self.slots
        for t in range(self.accesses):
            yield int(seq[t]), int(kinds[t]), int(slots[t])

    def __repr__(self) -> str:
        if not self.has_decisions:
            return f"<Plan sequence-only: {self.accesses} accesses over {self.items} items>"
        cap = (f"{self.capacity_bytes} bytes in {self.capacity} pages of {self.page_size}" if self.sized
               else f"capacity {self.capacity}")
        return (
            f"<Plan {self.policy}: {self.accesses} accesses over {self.items} items, "
            f"{cap}, hit rate {self.hit_rate:.4f}>"
        )


def plan(
    seq: Any,
    capacity: int | None = None,
    bypass: bool = True,
    *,
    items: int | None = None,
    capacity_bytes: int | None = None,
    item_sizes: Any = None,
    page_size: int | None = None,
    description: str | None = None,
    progress: bool | None = None,
) -> Plan:
    """Build Belady's OPT plan of ``seq`` for a cache of ``capacity`` items.

    ``bypass=True`` (policy ``opt``) may decline to cache a miss that is needed
    later than everything cached; ``bypass=False`` (``opt-nobypass``) always
    admits, evicting the item needed farthest in the future. ``items`` is the
    dataset size (default ``max(seq) + 1``).

    For a capacity in bytes give ``capacity_bytes``, ``item_sizes`` (bytes per
    item) and ``page_size`` instead of ``capacity``: the pool is
    ``capacity_bytes // page_size`` pages and an item takes
    ``ceil(size / page_size)`` of them. The decisions are then size-aware
    Belady (exactly Belady when all sizes are equal; a heuristic otherwise).
    """
    arr, items = as_sequence(seq, items)
    if capacity_bytes is not None or item_sizes is not None or page_size is not None:
        if capacity is not None:
            raise InvalidInputError("give the capacity in items or in bytes, not both")
        if capacity_bytes is None or item_sizes is None or page_size is None:
            raise InvalidInputError("a capacity in bytes needs capacity_bytes, item_sizes and page_size")
        sizes = np.ascontiguousarray(item_sizes, dtype=np.uint64)
        if sizes.shape != (items,):
            raise InvalidInputError(f"item_sizes has {sizes.size} entries; the dataset has {items} items")
        cap_b, page = int(capacity_bytes), int(page_size)
        if cap_b < 1 or page < 1:
            raise InvalidInputError("capacity_bytes and page_size must be positive")
        handle = _run_with_progress(
            lambda counter: _engine.build_plan(arr, items, 0, bypass, progress=counter, item_sizes=sizes,
                                               capacity_bytes=cap_b, page_size=page),
            arr.size, "planning", progress,
        )
        result = Plan(handle)
        if description is not None:
            result.description = description
        return result
    if capacity is None:
        raise InvalidInputError("give a capacity (in items), or capacity_bytes with item_sizes and page_size")
    capacity = _check_capacity(capacity)
    handle = _run_with_progress(
        lambda counter: _engine.build_plan(arr, items, capacity, bypass, progress=counter),
        arr.size, "planning", progress,
    )
    result = Plan(handle)
    if description is not None:
        result.description = description
    return result


def sequence_plan(seq: Any, *, items: int | None = None, description: str | None = None) -> Plan:
    """A plan that holds only the sequence (no capacity, no decisions)."""
    arr, items = as_sequence(seq, items)
    result = Plan(_engine.plan_from_seq(arr, items))
    if description is not None:
        result.description = description
    return result


def load_plan(path: str | os.PathLike[str], *, allow_pickle: bool = False) -> Plan:
    """Open a plan file: read into memory of its own (so a later overwrite
    of the file cannot change the plan or crash the reader) and validated
    completely before use.

    ``allow_pickle=True`` also reads the earlier OPT4TorchDataSet's pickled
    precomputed files (as a sequence-only plan: save it to convert it). Off by
    default, because unpickling a file runs code chosen by whoever wrote it.
    """
    path = os.fspath(path)
    opened = open_plan_file(path, allow_pickle=allow_pickle)
    if isinstance(opened, np.ndarray):  # an earlier design's pickle: its sequence
        result = sequence_plan(opened)
        result.path = path
        return result
    return Plan(opened, path=path)
