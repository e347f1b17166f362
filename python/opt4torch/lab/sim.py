"""Replaying sequences through cache policies (the C simulator).

Each policy's exact rule is in docs/policies.md; :mod:`opt4torch.lab.reference`
implements the same rules in plain Python, and the tests hold the two to the
same hit count on every trace.

Sweeps (many policies, capacities or traces) run on a thread pool: the engine
releases the GIL while it simulates, so the runs use every core.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _engine
from ..planning.plan import _check_capacity, as_sequence

__all__ = ["CLAIRVOYANT", "POLICIES", "Comparison", "SimJob", "compare", "simulate", "simulate_many", "sweep"]

#: The policies the C simulator knows, in a stable order.
POLICIES: tuple[str, ...] = tuple(_engine.policy_names())

#: Policies that read the future (the whole sequence) to decide; the rest are
#: online. OPT's gain is measured against the best online policy.
CLAIRVOYANT: frozenset[str] = frozenset({"opt", "opt-nobypass", "freq"})


def simulate(policy: str, seq: Any, capacity: int, *, items: int | None = None, seed: int = 0) -> dict[str, int]:
    """Replay ``seq`` through ``policy`` with a cache of ``capacity`` items.

    Returns ``{"accesses", "hits", "misses"}``. ``seed`` drives randomised
    policies; ``items`` is the dataset size (default ``max(seq) + 1``).
    The GIL is released while the engine runs.
    """
    capacity = _check_capacity(capacity)
    arr, items = as_sequence(seq, items)
    result: dict[str, int] = _engine.simulate(policy, arr, items, capacity, seed)
    return result


@dataclass(frozen=True)
class SimJob:
    """One run of a sweep: ``policy`` over ``seq`` (ids in ``[0, items)``) at
    ``capacity`` items. ``seq`` should already be a contiguous integer numpy
    array (see :func:`opt4torch.as_sequence`) so that no thread copies it."""

    policy: str
    seq: np.ndarray
    items: int
    capacity: int
    seed: int = 0


def _run(job: SimJob) -> dict[str, int]:
    result: dict[str, int] = _engine.simulate(job.policy, job.seq, job.items, job.capacity, job.seed)
    return result


def simulate_many(jobs: Sequence[SimJob], *, workers: int | None = None,
                  on_done: Callable[[SimJob], None] | None = None) -> list[dict[str, int]]:
    """Run every job on ``workers`` threads (default: one per core) and
    return their results in the order of ``jobs``. ``on_done`` is called in
    the calling thread as each job finishes (for a progress bar). The first
    error is raised once the running jobs have finished."""
    if workers is None:
        workers = os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    for job in jobs:
        _check_capacity(job.capacity)
    if workers == 1 or len(jobs) <= 1:
        out = []
        for job in jobs:
            out.append(_run(job))
            if on_done is not None:
                on_done(job)
        return out
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opt4sim") as pool:
        futures = [pool.submit(_run, job) for job in jobs]
        results = []
        try:
            for job, fut in zip(jobs, futures):
                results.append(fut.result())
                if on_done is not None:
                    on_done(job)
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    return results


def sweep(seq: Any, policies: Sequence[str], capacities: Sequence[int], *, items: int | None = None,
          seed: int = 0, workers: int | None = None,
          on_done: Callable[[SimJob], None] | None = None) -> list[dict[str, Any]]:
    """Every policy at every capacity over one sequence, on all cores.

    Rows (policy-major, then capacity in the order given) hold ``policy``,
    ``capacity``, ``accesses``, ``hits``, ``misses`` and ``hit_rate``.
    ``on_done(job)`` is called as each replay finishes (a progress bar).
    """
    arr, items = as_sequence(seq, items)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; known: {', '.join(POLICIES)}")
    jobs = [SimJob(p, arr, items, int(c), seed) for p in policies for c in capacities]
    rows = []
    for job, r in zip(jobs, simulate_many(jobs, workers=workers, on_done=on_done)):
        rows.append({
            "policy": job.policy,
            "capacity": job.capacity,
            "accesses": r["accesses"],
            "hits": r["hits"],
            "misses": r["misses"],
            "hit_rate": r["hits"] / r["accesses"] if r["accesses"] else 0.0,
        })
    return rows


@dataclass(frozen=True)
class Comparison:
    """One trace at one capacity, as a sweep's reader wants it first: OPT's
    hit rate, the best online policy's and LRU's. A field is ``None`` when
    the sweep did not run that policy (``best_online`` when it ran no online
    policy)."""

    capacity: int
    opt: str | None
    opt_hit_rate: float | None
    best_online: str | None
    best_online_hit_rate: float | None
    lru_hit_rate: float | None

    @property
    def gain_over_lru(self) -> float | None:
        """OPT's hit rate minus LRU's (a share: 0.183 is 18.3 points)."""
        if self.opt_hit_rate is None or self.lru_hit_rate is None:
            return None
        return self.opt_hit_rate - self.lru_hit_rate

    @property
    def gain_over_best_online(self) -> float | None:
        """OPT's hit rate minus the best online policy's: what knowing the
        future is worth over the best cache that does not."""
        if self.opt_hit_rate is None or self.best_online_hit_rate is None:
            return None
        return self.opt_hit_rate - self.best_online_hit_rate


def compare(rows: Sequence[Mapping[str, Any]]) -> list[Comparison]:
    """Per capacity (ascending) of one trace's rows (``policy``, ``capacity``,
    ``hit_rate``, as :func:`sweep` returns them): see :class:`Comparison`.

    OPT is ``opt``, else ``opt-nobypass``; online policies are those not in
    :data:`CLAIRVOYANT`, and of two with the same hit rate the first by name
    is named best, so the choice does not depend on the rows' order."""
    policies = {str(r["policy"]) for r in rows}
    opt = "opt" if "opt" in policies else "opt-nobypass" if "opt-nobypass" in policies else None
    online = sorted(policies - CLAIRVOYANT)
    out = []
    for c in sorted({int(r["capacity"]) for r in rows}):
        at = {str(r["policy"]): float(r["hit_rate"]) for r in rows if int(r["capacity"]) == c}
        best = max((p for p in online if p in at), key=lambda p: at[p], default=None)
        out.append(Comparison(
            capacity=c, opt=opt if opt in at else None, opt_hit_rate=at.get(opt) if opt else None,
            best_online=best, best_online_hit_rate=at[best] if best is not None else None,
            lru_hit_rate=at.get("lru")))
    return out
