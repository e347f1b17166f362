"""Every size the loader chooses: bytes from a string, pages, per-item sizes,
the staging ring, spare pages, and what a plan costs in memory.

One module, so that a size is decided in one place (issue 35): the pool's
page, its staging slots and spare pages are chosen here, for a plain loader,
ranks sharing a pool, a re-plan and a cluster alike. May touch: a
:class:`~opt4torch.planning.plan.Plan`'s figures, numpy, /proc/self/statm;
never a pool, a dataset's items or torch.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import numpy as np

from .plan import ADMIT, Plan

__all__ = ["CODEC_MARGIN", "PAGE_ALIGN", "PAGE_MAX", "PAGE_SLACK", "PAGE_SPLIT", "PREFETCH_MAX_THREADS",
           "STAGING_BUDGET", "check_plan_cost", "choose_page",
           "handover_spare", "item_sizes", "parse_bytes", "plan_cost", "refuse_plan_past_memory", "spare_pages",
           "staging_slots"]

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


#: Pages are multiples of this many bytes: every page starts as aligned as
#: the widest scalar an array may hold (complex128).
PAGE_ALIGN = 16
#: The most pages the median item may take: the runtime's work per item
#: grows with its pages, the waste per item shrinks with them.
PAGE_SPLIT = 16
#: Page sizes whose waste is within this share of the sizes' total of the
#: least waste count as equal; the largest of them is taken (fewer pages).
PAGE_SLACK = 0.01
#: The largest page chosen.
PAGE_MAX = 1 << 20


def choose_page(sizes: Any) -> int:
    """The page size for items of these sizes in bytes: the one that wastes
    the least of the pool. An item takes ``ceil(size / page)`` pages (at
    least one), so what its last page leaves empty is lost; a page a
    quarter of the median, rounded down to a power of two as before, lost
    up to a quarter of every item. Candidates are multiples of PAGE_ALIGN
    that fit one quantile of the sizes in 1 to PAGE_SPLIT pages exactly
    (all of them when the sizes are equal: no waste), and powers of two;
    those that keep the median item within PAGE_SPLIT pages are measured
    on (a sample of) the sizes, and of those within PAGE_SLACK of the
    least waste the largest is taken."""
    s = np.asarray(sizes, dtype=np.int64).reshape(-1)
    if s.size == 0:
        return 4096
    if s.size > 65536:  # a sample spread over the sorted sizes keeps their shape
        s = np.sort(s)[np.linspace(0, s.size - 1, 65536).astype(np.int64)]
    values, counts = np.unique(s, return_counts=True)
    median = float(np.median(s))
    low = max(PAGE_ALIGN, -(-int(math.ceil(median / PAGE_SPLIT)) // PAGE_ALIGN) * PAGE_ALIGN)
    high = max(low, min(PAGE_MAX, -(-int(values[-1]) // PAGE_ALIGN) * PAGE_ALIGN))
    quantiles = np.quantile(s, [0.5, 0.75, 0.9, 0.95, 0.99, 1.0], method="higher")
    candidates = {1 << k for k in range(3, 21)}
    for q in quantiles.tolist():
        for parts in range(1, PAGE_SPLIT + 1):
            candidates.add(-(-int(math.ceil(q / parts)) // PAGE_ALIGN) * PAGE_ALIGN)
    pages = np.array(sorted(c for c in candidates if low <= c <= high), dtype=np.int64)
    if pages.size == 0:
        return int(low)
    taken = np.maximum(1, -(-values[None, :] // pages[:, None])) * pages[:, None]
    waste = ((taken - values[None, :]) * counts[None, :]).sum(axis=1)
    good = waste <= waste.min() + PAGE_SLACK * max(int((values * counts).sum()), 1)
    return int(pages[good].max())


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


#: Bytes the staging ring takes by default (64 slots at most, 8 at least):
#: memory beyond the cache that prefetching needs for the items it loads
#: ahead that the cache does not keep (BYPASSes).
STAGING_BUDGET = 4 << 20

#: The most prefetch threads reading at once, by default: the depth follows
#: what the workers need, up to this (src/io/prefetcher.c, "Depth").
PREFETCH_MAX_THREADS = 64

#: Bytes added to each given item size for the record header (type, shape).
CODEC_MARGIN = 128


#: The fewest staging slots a prefetching pool gets, and the most (by
#: default; ``staging_slots=`` sets any count). A cluster's pool needs more:
#: peer reads and forwards wait there too.
STAGING_MIN = 8
STAGING_MIN_CLUSTER = 16
STAGING_MAX = 64


def slot_bytes(plan: Plan, pool_page: int) -> int:
    """The bytes one staging slot (or one stored miss) may take: the
    largest item of a sized plan, else a page of the pool."""
    sizes = plan.item_sizes
    if sizes is not None and len(sizes):
        return int(sizes.max())
    return int(pool_page or plan.page_size or 1)


def staging_slots(plan: Plan, pool_page: int, *, minimum: int = STAGING_MIN) -> int:
    """Staging slots for a prefetching pool: STAGING_BUDGET bytes of them,
    between ``minimum`` and STAGING_MAX slots."""
    return max(minimum, min(STAGING_MAX, STAGING_BUDGET // max(slot_bytes(plan, pool_page), 1)))


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
    return int(min(spare, plan.pool_slots // 8))



def spare_pages(plan: Plan, window: int, given: int | None = None) -> int:
    """Spare pages of a re-plan's pool: :func:`handover_spare` over
    ``window`` when the loader chose them, else the count given, kept
    within what a plan of this size may use."""
    if window:
        return handover_spare(plan, window)
    return min(int(given or 0), max(plan.pool_slots, 1024))


def item_sizes(dataset: Any, item_bytes: Any, n_items: int, progress: bool | None) -> np.ndarray | None:
    """Per-item stored sizes, if the caller gave them (or the dataset has
    opt4_item_bytes); None for one size for all."""
    if item_bytes is None:
        item_bytes = getattr(dataset, "opt4_item_bytes", None)
        if item_bytes is None:
            return None
    if isinstance(item_bytes, (int, np.integer)) and not isinstance(item_bytes, bool):
        return None
    if callable(item_bytes):
        from .._progress import progress_bar

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


def resident_bytes() -> int:
    """This process's resident memory now (0 where /proc does not say)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def check_plan_cost(sampler: Any, batch_sampler: Any, epochs: int, items: int, sized: bool) -> None:
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
    warn = refuse_plan_past_memory(accesses, items, sized,
                                   f"a plan of {accesses:,} accesses ({epochs:,} epochs of {per_epoch:,})",
                                   "give fewer epochs= (build a new loader for the next run of epochs)")
    if warn:
        warnings.warn(f"{warn}; give fewer epochs= if that is too much", RuntimeWarning, stacklevel=4)


def refuse_plan_past_memory(accesses: int, items: int, sized: bool, what: str, todo: str) -> str:
    """The cost check before a plan is built, so that one too large for
    this machine is refused naming its size and ``todo`` (what to give
    instead), never an allocator's traceback half-way: ValueError when the
    plan (:func:`plan_cost`) and what the process holds exceed the
    machine's memory; else '' for a small plan, or, above PLAN_WARN_BYTES,
    the sentence to warn with. ``what`` names the plan ("a plan of N
    accesses ...")."""
    peak, kept = plan_cost(accesses, items, sized)
    if peak <= PLAN_WARN_BYTES:
        return ""
    now = resident_bytes()
    gib = float(1 << 30)
    what = (f"{what} takes about {peak / gib:,.1f} GiB of memory to capture and build"
            + (f" on top of the {now / gib:,.1f} GiB this process holds ({(now + peak) / gib:,.1f} GiB "
               f"at the peak)" if now else ""))
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        memory = 0
    if memory and now + peak > memory:
        raise ValueError(f"{what}, more than this machine's {memory / gib:,.1f} GiB: {todo}")
    return f"{what}, and keeps {kept / gib:,.1f} GiB while training"
