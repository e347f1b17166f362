"""Theory beside simulation: the figures and tables of docs/why-opt.md.

    python -m opt4torch.lab.science --out docs/figures --seed 0

regenerates every figure (PNG), the numbers behind each (CSV, one per
figure) and ``tables.md`` (theory against simulation, with the tolerance and
the seed of every row). Everything is seeded: the same seed gives the same
files, byte for byte (timings go to the terminal only). ``--quick``
shrinks the sizes for a smoke run.

The module also holds the small tools the tests share: seeded trace
generators for the patterns the C trace generators do not have yet (Zipf,
repeated augmentation, sharded epochs), a DataLoader-style split of a
sequence among workers, and hit counting for policies the C simulator does
not have yet (static caches computed directly; Random through the pure-Python
reference). See :func:`hits` for which backend serves which policy.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from . import reference, theory
from ..planning.plan import plan as build_plan
from .sim import POLICIES as C_POLICIES
from .sim import simulate as c_simulate
from .traces import epoch_shuffle, markov, uniform

__all__ = [
    "zipf_trace",
    "repeated_aug_trace",
    "sharded_epoch_traces",
    "worker_streams",
    "static_first_hits",
    "static_top_hits",
    "hits",
    "window_hits",
    "main",
]

# ---------------------------------------------------------------------------
# traces
# ---------------------------------------------------------------------------


def zipf_trace(items: int, alpha: float, accesses: int, seed: int = 0) -> npt.NDArray[np.int64]:
    """Independent draws with Zipf(alpha) popularity (id 0 the most popular),
    as a WeightedRandomSampler with weights ``(i + 1) ** -alpha`` draws."""
    cdf = np.cumsum(theory.zipf_popularity(items, alpha))
    u = np.random.default_rng(seed).random(accesses) * cdf[-1]
    return np.minimum(np.searchsorted(cdf, u, side="right"), items - 1).astype(np.int64)


def repeated_aug_trace(items: int, epochs: int, repeats: int, seed: int = 0) -> npt.NDArray[np.int64]:
    """Repeated augmentation in one process: a fresh permutation per epoch,
    each id repeated ``repeats`` times in a row."""
    rng = np.random.default_rng(seed)
    return np.concatenate([np.repeat(rng.permutation(items), repeats) for _ in range(epochs)]).astype(np.int64)


def sharded_epoch_traces(items: int, epochs: int, ranks: int, seed: int = 0) -> list[npt.NDArray[np.int64]]:
    """What each of ``ranks`` ranks reads under DistributedSampler with
    set_epoch: a fresh permutation per epoch, rank r taking every R-th id
    starting at r (``items`` divisible by ``ranks`` for equal shares)."""
    rng = np.random.default_rng(seed)
    perms = [rng.permutation(items) for _ in range(epochs)]
    return [np.concatenate([p[r::ranks] for p in perms]).astype(np.int64) for r in range(ranks)]


def worker_streams(seq: Any, workers: int, batch_size: int) -> list[npt.NDArray[np.int64]]:
    """Split a sequence the way a DataLoader deals it to its worker processes:
    batch j (``batch_size`` consecutive indices) goes to worker ``j % workers``."""
    arr = np.asarray(seq, dtype=np.int64)
    starts = np.arange(0, arr.size, batch_size)
    out: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(workers)]
    for j, s in enumerate(starts):
        out[j % workers].append(arr[s : s + batch_size])
    return [np.concatenate(parts) if parts else np.empty(0, dtype=np.int64) for parts in out]


# ---------------------------------------------------------------------------
# hit counting
# ---------------------------------------------------------------------------


def static_first_hits(seq: Any, capacity: int) -> int:
    """Hits of the static cache that admits the first ``capacity`` distinct
    ids it sees and never evicts (misses of other ids are not cached)."""
    arr = np.asarray(seq, dtype=np.int64)
    if arr.size == 0 or capacity <= 0:
        return 0
    ids, first = np.unique(arr, return_index=True)
    chosen = ids[np.argsort(first, kind="stable")[:capacity]]
    counts = np.bincount(arr, minlength=int(arr.max()) + 1)
    return int(np.sum(counts[chosen] - 1))


def static_top_hits(seq: Any, capacity: int, popularity: Any | None = None) -> int:
    """Hits of the static cache of the ``capacity`` most popular ids, each
    admitted at its first access and never evicted. Popular by
    ``popularity`` if given (the model's truth), else by the counts in
    ``seq`` (an oracle "freq" placement)."""
    arr = np.asarray(seq, dtype=np.int64)
    if arr.size == 0 or capacity <= 0:
        return 0
    counts = np.bincount(arr, minlength=int(arr.max()) + 1 if popularity is None else len(popularity))
    score = counts if popularity is None else np.asarray(popularity)
    chosen = np.argsort(-score, kind="stable")[:capacity]
    return int(np.sum(np.maximum(counts[chosen] - 1, 0)))


#: Policies served by :func:`hits`, and by what: the C simulator for what it
#: has, static caches computed here, the pure-Python reference for the rest.
POLICIES: tuple[str, ...] = ("opt", "opt-nobypass", "lru", "fifo", "random", "static-first", "static-top")


def hits(policy: str, seq: Any, capacity: int, items: int, seed: int = 0) -> int:
    """Hits of ``policy`` on ``seq``. The C simulator serves every policy it
    knows (``opt4torch.POLICIES``); ``static-first`` and ``static-top`` are
    computed directly; anything else (``random``, ``lfu``) goes through the
    pure-Python reference (slow: about a second per million accesses)."""
    if policy == "static-first":
        return static_first_hits(seq, capacity)
    if policy == "static-top":
        return static_top_hits(seq, capacity)
    if policy in C_POLICIES:
        return int(c_simulate(policy, seq, capacity, items=items, seed=seed)["hits"])
    return int(reference.simulate(policy, np.asarray(seq, dtype=np.int64).tolist(), capacity, seed=seed))


def window_hits(policy: str, seq: Any, capacity: int, items: int, start: int, stop: int, seed: int = 0,
                popularity: Any | None = None) -> int:
    """Hits among positions ``start .. stop-1`` (a steady-state window).

    OPT is read from the plan of the whole sequence (its decisions depend on
    the future). Online policies do not look ahead, so their hits in the
    window are hits(prefix up to stop) - hits(prefix up to start); static
    caches are counted directly in the window with the set they chose
    (``static-top``: the top ids by ``popularity`` if given, else by their
    counts in the whole sequence, which peeks at the future).
    """
    arr = np.asarray(seq, dtype=np.int64)
    if policy in ("opt", "opt-nobypass"):
        p = build_plan(arr, capacity, bypass=(policy == "opt"), items=items)
        return int(np.count_nonzero(p.kinds[start:stop] == 0))
    if policy in ("static-first", "static-top"):
        if policy == "static-first":
            ids, first = np.unique(arr, return_index=True)
            chosen = ids[np.argsort(first, kind="stable")[:capacity]]
            admitted_at = np.full(items, np.iinfo(np.int64).max)
            admitted_at[chosen] = first[np.argsort(first, kind="stable")[:capacity]]
        else:
            score = np.bincount(arr, minlength=items) if popularity is None else np.asarray(popularity)
            chosen = np.argsort(-score, kind="stable")[:capacity]
            ids, first = np.unique(arr, return_index=True)
            first_of = np.full(items, np.iinfo(np.int64).max)
            first_of[ids] = first
            admitted_at = np.full(items, np.iinfo(np.int64).max)
            admitted_at[chosen] = first_of[chosen]
        pos = np.arange(start, stop)
        w = arr[start:stop]
        return int(np.count_nonzero(admitted_at[w] < pos))
    return hits(policy, arr[:stop], capacity, items, seed) - hits(policy, arr[:start], capacity, items, seed)


# ---------------------------------------------------------------------------
# the report: rows of theory against simulation
# ---------------------------------------------------------------------------


@dataclass
class Check:
    """One comparison of a theory value with a simulated one."""

    pattern: str
    setting: str
    policy: str
    quantity: str
    kind: str  # exact | bound (upper/lower) | approximation | limit
    theory: float
    simulated: float
    tolerance: float
    seed: int
    #: "abs": |sim - theory| <= tol; "upper": sim <= theory + tol;
    #: "lower": sim >= theory - tol; "band": theory <= sim <= theory_hi (+-tol)
    mode: str = "abs"
    theory_hi: float = math.nan

    @property
    def ok(self) -> bool:
        t, s, tol = self.theory, self.simulated, self.tolerance
        if self.mode == "upper":
            return s <= t + tol
        if self.mode == "lower":
            return s >= t - tol
        if self.mode == "band":
            return t - tol <= s <= self.theory_hi + tol
        return abs(s - t) <= tol

    def row(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "setting": self.setting,
            "policy": self.policy,
            "quantity": self.quantity,
            "kind": self.kind,
            "theory": _fmt(self.theory) if self.mode != "band" else f"[{_fmt(self.theory)}, {_fmt(self.theory_hi)}]",
            "simulated": _fmt(self.simulated),
            "tolerance": _fmt(self.tolerance),
            "agrees": "yes" if self.ok else "NO",
            "seed": self.seed,
        }


def _fmt(x: float) -> str:
    if isinstance(x, (int, np.integer)) or (float(x).is_integer() and abs(x) >= 100):
        return f"{int(x):d}"
    return f"{x:.4f}"


@dataclass
class Report:
    out: str
    seed: int
    quick: bool
    checks: list[Check] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)

    def add(self, check: Check) -> None:
        self.checks.append(check)

    def seed_for(self, k: int) -> int:
        """The seed of experiment k, derived from the global seed."""
        return self.seed * 1000 + k


def _write_csv(path: str, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    fields: list[str] = []
    for r in rows:
        for k in r:
            if k not in fields:
                fields.append(k)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in r.items()})


# ---------------------------------------------------------------------------
# plotting helpers
# ---------------------------------------------------------------------------

STYLE = {
    "opt": dict(color="#d62728", marker="o", label="OPT (Belady, bypass)"),
    "opt-nobypass": dict(color="#ff9896", marker="v", label="OPT without bypass"),
    "lru": dict(color="#1f77b4", marker="s", label="LRU"),
    "fifo": dict(color="#2ca02c", marker="^", label="FIFO"),
    "random": dict(color="#9467bd", marker="D", label="Random"),
    "static-first": dict(color="#7f7f7f", marker="x", label="static first-C"),
    "static-top": dict(color="#8c564b", marker="P", label="static top-C by popularity"),
    # Modern online policies, for context (simulated only; no closed forms here).
    "lfu": dict(color="#17becf", marker="<", label="LFU"),
    "sieve": dict(color="#bcbd22", marker=">", label="SIEVE"),
    "s3fifo": dict(color="#e377c2", marker="h", label="S3-FIFO"),
    "arc": dict(color="#393b79", marker="*", label="ARC"),
}

#: Online policies shown beside the ones with closed forms, for context.
MODERN: tuple[str, ...] = ("lfu", "sieve", "s3fifo", "arc")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _points(ax: Any, policy: str, x: Sequence[float], y: Sequence[float], **kw: Any) -> None:
    st = dict(STYLE[policy])
    label = kw.pop("label", st.pop("label") + " (sim)")
    st.pop("label", None)
    ax.plot(x, y, linestyle="none", markersize=5, markerfacecolor="none", label=label, **st, **kw)


def _save(fig: Any, report: Report, name: str) -> None:
    fig.tight_layout()
    fig.savefig(os.path.join(report.out, name), dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)


# ---------------------------------------------------------------------------
# figure 1: uniform independent access, steady state
# ---------------------------------------------------------------------------


def fig_uniform(report: Report) -> None:
    plt = _plt()
    n = 2000 if report.quick else 10000
    t_total = 40 * n
    start, stop = 10 * n, 30 * n
    seed = report.seed_for(1)
    seq = uniform(n, t_total, seed=seed)
    fractions = [0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    pols = ["opt", "opt-nobypass", "lru", "fifo", "random", "static-first"]
    rows = []
    sim: dict[str, list[float]] = {p: [] for p in pols}
    for c in fractions:
        cap = int(round(c * n))
        row: dict[str, Any] = {"fraction": c, "capacity": cap, "items": n, "accesses": t_total,
                               "window": f"{start}-{stop}", "seed": seed,
                               "theory_online": theory.online_uniform_hit_rate(n, cap),
                               "theory_opt_upper_N": theory.opt_uniform_hit_rate(n, cap),
                               "theory_opt_limit": theory.opt_uniform_hit_rate_limit(cap / n)}
        for p in pols:
            if p == "random" and (not report.quick) and c not in (0.1, 0.5, 0.9):
                continue  # the pure-Python reference is slow; three points suffice
            h = window_hits(p, seq, cap, n, start, stop, seed=seed) / (stop - start)
            sim[p].append(h)
            row[f"sim_{p}"] = h
        rows.append(row)
        w = stop - start
        binom = 4 * math.sqrt(c * (1 - c) / w)
        for p in ("lru", "fifo", "random", "static-first"):
            if f"sim_{p}" in row:
                report.add(Check("uniform IRM", f"N={n}, c={c}, steady window", p, "hit rate", "exact",
                                 row["theory_online"], row[f"sim_{p}"], binom, seed))
        gap = theory.opt_gap_tolerance(cap)
        # OPT: at most the bound (plus noise), at least the bound minus the
        # finite-C gap measured in docs/why-opt.md.
        ub = row["theory_opt_upper_N"]
        report.add(Check("uniform IRM", f"N={n}, c={c}, steady window", "opt", "hit rate",
                         "upper bound; gap allowed below", ub - gap, row["sim_opt"], binom, seed, mode="band",
                         theory_hi=ub))
    _write_csv(os.path.join(report.out, "uniform.csv"), rows)

    grid = np.linspace(0.0, 1.0, 201)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax.plot(grid, grid, color="#1f77b4", lw=1.5, label="every online policy: C/N (exact)")
    ax.plot(grid, [theory.opt_uniform_hit_rate_limit(x) for x in grid], color="#d62728", lw=1.5,
            label="OPT: $1-e^{-a}$, $1-(1+a)e^{-a}=c$ (N$\\to\\infty$)")
    for p in pols:
        xs = [c for c, r in zip(fractions, rows) if f"sim_{p}" in r]
        _points(ax, p, xs, sim[p])
    ax.set_xlabel("cache size C / N")
    ax.set_ylabel("steady-state hit rate")
    ax.set_title(f"Uniform with replacement (N={n:,}, window {start // n}N..{stop // n}N of {t_total // n}N)")
    ax.legend(fontsize=7, loc="lower right")
    # the gain: OPT's misses relative to any online policy
    ratio = [(1 - theory.opt_uniform_hit_rate_limit(x)) / (1 - x) if x < 1 else np.nan for x in grid]
    ax2.plot(grid, ratio, color="#d62728", lw=1.5, label="theory: $(1-h_{OPT})/(1-c)$")
    ax2.plot(fractions, [(1 - o) / (1 - l) for o, l in zip(sim["opt"], sim["lru"])], "o", color="#d62728",
             markerfacecolor="none", label="simulated OPT misses / LRU misses")
    ax2.set_xlabel("cache size C / N")
    ax2.set_ylabel("OPT misses / online misses")
    ax2.set_ylim(0, 1)
    ax2.set_title("How many of the online policy's misses OPT still pays")
    ax2.legend(fontsize=8)
    _save(fig, report, "uniform.png")


# ---------------------------------------------------------------------------
# figure 2: uniform, finite horizon (warm-up and end of trace)
# ---------------------------------------------------------------------------


def fig_uniform_horizon(report: Report) -> None:
    plt = _plt()
    n = 4000 if report.quick else 20000
    horizons = [0.5, 1, 2, 3, 5, 10, 20, 30]
    fractions = [0.1, 0.5]
    rows = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, (c, ax) in enumerate(zip(fractions, axes)):
        cap = int(round(c * n))
        sims = {"opt": [], "lru": []}
        for j, r in enumerate(horizons):
            t_total = int(r * n)
            seed = report.seed_for(20 + 10 * k + j)
            seq = uniform(n, t_total, seed=seed)
            o = build_plan(seq, cap, items=n).hits
            l_ = hits("lru", seq, cap, n)
            on = theory.online_uniform_expected_hits(n, cap, t_total)
            lo, hi = theory.opt_uniform_expected_hits(n, cap, t_total)
            sims["opt"].append(o / t_total)
            sims["lru"].append(l_ / t_total)
            rows.append({"fraction": c, "items": n, "horizon_T_over_N": r, "accesses": t_total, "seed": seed,
                         "theory_online": on / t_total, "theory_opt_lower": lo / t_total,
                         "theory_opt_upper": hi / t_total, "sim_opt": o / t_total, "sim_lru": l_ / t_total})
            report.add(Check("uniform IRM, finite T", f"N={n}, c={c}, T={r}N", "lru", "hits / T",
                             "exact expectation", on / t_total, l_ / t_total,
                             4 * math.sqrt(c * (1 - c) / t_total), seed))
            report.add(Check("uniform IRM, finite T", f"N={n}, c={c}, T={r}N", "opt", "hits / T",
                             "fluid band", lo / t_total, o / t_total,
                             theory.opt_gap_tolerance(cap) + 4 * math.sqrt(0.25 / t_total),
                             seed, mode="band",
                             theory_hi=hi / t_total))
        fine = np.geomspace(0.25, 30, 60)
        ax.plot(fine, [theory.online_uniform_expected_hits(n, cap, int(r * n)) / int(r * n) for r in fine],
                color="#1f77b4", lw=1.5, label="online, exact expectation (warm-up included)")
        band = np.array([theory.opt_uniform_expected_hits(n, cap, int(r * n)) for r in fine]) / (fine * n)[:, None]
        ax.fill_between(fine, band[:, 0], band[:, 1], color="#d62728", alpha=0.25, label="OPT, fluid band")
        _points(ax, "opt", horizons, sims["opt"])
        _points(ax, "lru", horizons, sims["lru"])
        ax.axhline(theory.opt_uniform_hit_rate_limit(c), color="#d62728", ls=":", lw=1,
                   label="OPT steady state $h^*(c)$")
        ax.axhline(c, color="#1f77b4", ls=":", lw=1, label="online steady state c")
        for r in (3, 10):
            ax.axvline(r, color="k", lw=0.6, ls="--")
        label_y = 0.02 if c < 0.3 else 0.95
        ax.text(3, label_y, " 3N", fontsize=7)
        ax.text(10, label_y, " 10N", fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("accesses T / N (log scale)")
        ax.set_ylabel("hits / T (whole trace)")
        ax.set_ylim(0, 1)
        ax.set_title(f"Uniform with replacement, C/N = {c} (N={n:,})")
        ax.legend(fontsize=7, loc="upper right" if c < 0.3 else "lower right")
    _write_csv(os.path.join(report.out, "uniform_horizon.csv"), rows)
    _save(fig, report, "uniform_horizon.png")


# ---------------------------------------------------------------------------
# figure 3: epoch shuffle
# ---------------------------------------------------------------------------


def fig_epoch_shuffle(report: Report) -> None:
    plt = _plt()
    n = 4000 if report.quick else 20000
    epochs = 6
    seed = report.seed_for(3)
    seq = epoch_shuffle(n, epochs, seed=seed)
    fractions = [0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    pols = ["opt", "opt-nobypass", "static-first", "lru", "fifo", "random", *MODERN]
    rows = []
    sim: dict[str, list[float]] = {p: [] for p in pols}
    later = n * (epochs - 1)
    for c in fractions:
        cap = int(round(c * n))
        row: dict[str, Any] = {"fraction": c, "capacity": cap, "items": n, "epochs": epochs, "seed": seed}
        for p in pols:
            h = hits(p, seq, cap, n, seed=seed)
            sim[p].append(h / later)
            row[f"sim_{p}"] = h / later
        lru_exact = theory.lru_epoch_shuffle_expected_hits(n, cap, epochs) / later
        row.update({"theory_opt_static": cap / n, "theory_lru_exact": lru_exact,
                    "theory_lru_limit": theory.lru_epoch_shuffle_hit_rate_limit(c),
                    "theory_fifo_limit": theory.fifo_epoch_shuffle_hit_rate_limit(c),
                    "theory_random_limit": theory.random_epoch_shuffle_hit_rate_limit(c)})
        rows.append(row)
        setting = f"N={n}, E={epochs}, c={c}"
        exact_hits = theory.opt_epoch_shuffle_hits(n, cap, epochs)
        for p in ("opt", "static-first"):
            report.add(Check("epoch shuffle", setting, p, "hits (all epochs)", "exact", exact_hits,
                             row[f"sim_{p}"] * later, 0, seed))
        lo, hi = theory.opt_nobypass_epoch_shuffle_hits_bounds(n, cap, epochs)
        report.add(Check("epoch shuffle", setting, "opt-nobypass", "hits (all epochs)", "bounds", lo,
                         row["sim_opt-nobypass"] * later, 0, seed, mode="band", theory_hi=hi))
        # LRU: per-epoch hits are a sum of N weakly dependent indicators;
        # 4 sqrt(h / later) is a generous noise allowance.
        report.add(Check("epoch shuffle", setting, "lru", "hit rate, epochs >= 2", "exact expectation",
                         lru_exact, row["sim_lru"], 4 * math.sqrt(max(lru_exact, 1e-4) / later), seed))
        if not math.isnan(row["theory_fifo_limit"]):
            report.add(Check("epoch shuffle", setting, "fifo", "hit rate, epochs >= 2", "fluid limit",
                             row["theory_fifo_limit"], row["sim_fifo"], 0.005 if n >= 20000 else 0.015, seed))
        report.add(Check("epoch shuffle", setting, "random", "hit rate, epochs >= 2", "fluid limit",
                         row["theory_random_limit"], row["sim_random"], 0.006, seed))
    _write_csv(os.path.join(report.out, "epoch_shuffle.csv"), rows)

    grid = np.linspace(0.0, 1.0, 201)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax.plot(grid, grid, color="#d62728", lw=1.5, label="OPT = static = bound for all: c (exact)")
    ax.plot(grid, [theory.lru_epoch_shuffle_hit_rate_limit(x) for x in grid], color="#1f77b4", lw=1.5,
            label="LRU: $c+(1-c)\\ln(1-c)$")
    fg = grid[grid <= 1 - math.exp(-1)]
    ax.plot(fg, [theory.fifo_epoch_shuffle_hit_rate_limit(x) for x in fg], color="#2ca02c", lw=1.5,
            label="FIFO: $-\\ln(1-c)-c$ ($c\\leq 1-1/e$)")
    ax.plot(grid, [theory.random_epoch_shuffle_hit_rate_limit(x) for x in grid], color="#9467bd", lw=1.5,
            label="Random: $1-c\\ln(c+(1-c)e^{1/c})$")
    for p in pols:
        _points(ax, p, fractions, sim[p])
    ax.set_xlabel("cache size C / N")
    ax.set_ylabel("hit rate in each epoch after the first")
    ax.set_title(f"Epoch shuffle (N={n:,}, {epochs} epochs; epoch 1 has no hits)")
    ax.legend(fontsize=6.5, loc="upper left")

    # per-epoch hits at c = 0.5 over 10 epochs
    e10 = 10
    seed2 = report.seed_for(4)
    cap = n // 2
    seq10 = epoch_shuffle(n, e10, seed=seed2)
    per: dict[str, list[float]] = {}
    p_opt = build_plan(seq10, cap, items=n)
    k = p_opt.kinds
    per["opt"] = [float(np.count_nonzero(k[e * n : (e + 1) * n] == 0)) / n for e in range(e10)]
    for p in ("lru", "fifo"):
        cum = [hits(p, seq10[: (e + 1) * n], cap, n) for e in range(e10)]
        per[p] = [(cum[e] - (cum[e - 1] if e else 0)) / n for e in range(e10)]
    xs = np.arange(1, e10 + 1)
    for p in ("opt", "lru", "fifo"):
        ax2.plot(xs, per[p], marker=STYLE[p]["marker"], color=STYLE[p]["color"], markerfacecolor="none",
                 label=STYLE[p]["label"] + " (sim)")
    ax2.plot(xs, [0.0] + [0.5] * (e10 - 1), color="#d62728", lw=1, ls=":", label="OPT theory: 0, then C")
    ax2.plot(xs, [0.0] + [theory.lru_epoch_shuffle_hit_rate_limit(0.5)] * (e10 - 1), color="#1f77b4", lw=1,
             ls=":", label="LRU theory")
    ax2.plot(xs, [0.0] + [theory.fifo_epoch_shuffle_hit_rate_limit(0.5)] * (e10 - 1), color="#2ca02c", lw=1,
             ls=":", label="FIFO theory")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("hits / N in that epoch")
    ax2.set_title(f"Per epoch, C/N = 0.5 (seed {seed2})")
    ax2.set_ylim(-0.02, 0.6)
    ax2.legend(fontsize=7)
    _write_csv(os.path.join(report.out, "epoch_per_epoch.csv"),
               [{"epoch": int(e), "seed": seed2, **{f"sim_{p}": per[p][e - 1] for p in per}} for e in xs])
    _save(fig, report, "epoch_shuffle.png")


# ---------------------------------------------------------------------------
# figure 4: Zipf (skewed independent access)
# ---------------------------------------------------------------------------


def fig_zipf(report: Report) -> None:
    plt = _plt()
    n = 2000 if report.quick else 10000
    t_total = 100 * n
    start, stop = t_total // 4, 3 * t_total // 4
    alphas = [0.6, 0.8, 1.0, 1.2]
    fractions = [0.01, 0.03, 0.1, 0.2, 0.3, 0.5]
    pols = ["opt", "lru", "fifo", "static-top", *MODERN]
    rows = []
    fig, axes = plt.subplots(1, 4, figsize=(15, 4.0), sharey=True)
    for ai, (alpha, ax) in enumerate(zip(alphas, axes)):
        seed = report.seed_for(50 + ai)
        seq = zipf_trace(n, alpha, t_total, seed=seed)
        pop = theory.zipf_popularity(n, alpha)
        sim: dict[str, list[float]] = {p: [] for p in pols}
        for c in fractions:
            cap = int(round(c * n))
            row: dict[str, Any] = {"alpha": alpha, "fraction": c, "capacity": cap, "items": n,
                                   "accesses": t_total, "window": f"{start}-{stop}", "seed": seed,
                                   "theory_opt": theory.opt_irm_hit_rate(pop, cap),
                                   "theory_lru_che": theory.lru_che_hit_rate(pop, cap),
                                   "theory_fifo_approx": theory.fifo_random_irm_hit_rate(pop, cap),
                                   "theory_static_top": theory.static_top_hit_rate(pop, cap)}
            for p in pols:
                if p == "static-top":
                    h = window_hits("static-top", seq, cap, n, start, stop, popularity=pop)
                else:
                    h = window_hits(p, seq, cap, n, start, stop, seed=seed)
                sim[p].append(h / (stop - start))
                row[f"sim_{p}"] = h / (stop - start)
            rows.append(row)
            setting = f"N={n}, alpha={alpha}, c={c}"
            gap = theory.opt_gap_tolerance(cap)
            ub = row["theory_opt"]
            report.add(Check("Zipf IRM", setting, "opt", "hit rate", "upper bound; gap allowed below",
                             ub - gap, row["sim_opt"], 0.002, seed, mode="band", theory_hi=ub))
            noise = 4 * math.sqrt(0.25 / (stop - start))
            report.add(Check("Zipf IRM", setting, "lru", "hit rate", "Che approximation",
                             row["theory_lru_che"], row["sim_lru"], 0.002 + noise, seed))
            row["theory_fifo_exact"] = theory.fifo_random_irm_hit_rate_exact(pop, cap)
            report.add(Check("Zipf IRM", setting, "fifo", "hit rate", "exact (King product form)",
                             row["theory_fifo_exact"], row["sim_fifo"], 4 * math.sqrt(0.25 / (stop - start)) * 3,
                             seed))
            if cap >= 100:
                report.add(Check("Zipf IRM", setting, "fifo", "hit rate", "characteristic-time approx.",
                                 row["theory_fifo_approx"], row["sim_fifo"], 0.002 + noise, seed))
            report.add(Check("Zipf IRM", setting, "static-top", "hit rate", "exact expectation",
                             row["theory_static_top"], row["sim_static-top"], 4 * math.sqrt(0.25 / (stop - start)),
                             seed))
        grid = np.unique(np.round(np.geomspace(0.005, 0.9, 60) * n).astype(int))
        gx = grid / n
        ax.plot(gx, [theory.opt_irm_hit_rate(pop, int(g)) for g in grid], color="#d62728", lw=1.5,
                label="OPT (interval threshold)")
        ax.plot(gx, [theory.static_top_hit_rate(pop, int(g)) for g in grid], color="#8c564b", lw=1.5,
                label="best online = static top-C")
        ax.plot(gx, [theory.lru_che_hit_rate(pop, int(g)) for g in grid], color="#1f77b4", lw=1.5,
                label="LRU (Che)")
        ax.plot(gx, [theory.fifo_random_irm_hit_rate(pop, int(g)) for g in grid], color="#2ca02c", lw=1.5,
                label="FIFO = Random (char. time)")
        for p in pols:
            _points(ax, p, fractions, sim[p])
        ax.set_xscale("log")
        ax.set_xlabel("cache size C / N (log scale)")
        ax.set_title(f"Zipf $\\alpha$={alpha} (N={n:,})")
        if ai == 0:
            ax.set_ylabel("steady-state hit rate")
            ax.legend(fontsize=6.5, loc="upper left")
    _write_csv(os.path.join(report.out, "zipf.csv"), rows)
    _save(fig, report, "zipf.png")


# ---------------------------------------------------------------------------
# figure 5: where OPT pays, as a heatmap over skew x cache size
# ---------------------------------------------------------------------------


def fig_gain_heatmap(report: Report) -> None:
    plt = _plt()
    n_theory = 5000
    alphas_f = np.linspace(0.0, 1.4, 15)
    fracs_f = np.geomspace(0.01, 0.9, 16)
    ratio_lru = np.zeros((alphas_f.size, fracs_f.size))
    ratio_best = np.zeros_like(ratio_lru)
    for i, a in enumerate(alphas_f):
        pop = theory.zipf_popularity(n_theory, float(a))
        for j, c in enumerate(fracs_f):
            cap = max(1, int(round(c * n_theory)))
            o = theory.opt_irm_hit_rate(pop, cap)
            ratio_lru[i, j] = (1 - o) / (1 - theory.lru_che_hit_rate(pop, cap))
            ratio_best[i, j] = (1 - o) / (1 - theory.static_top_hit_rate(pop, cap))
    # simulation on a coarse grid
    n = 2000 if report.quick else 5000
    t_total = 100 * n
    start, stop = t_total // 4, 3 * t_total // 4
    alphas_s = [0.0, 0.4, 0.8, 1.2]
    fracs_s = [0.02, 0.1, 0.3, 0.6]
    rows = []
    for i, a in enumerate(alphas_s):
        seed = report.seed_for(60 + i)
        seq = zipf_trace(n, a, t_total, seed=seed)
        pop = theory.zipf_popularity(n, a)
        for c in fracs_s:
            cap = int(round(c * n))
            o = window_hits("opt", seq, cap, n, start, stop) / (stop - start)
            l_ = window_hits("lru", seq, cap, n, start, stop) / (stop - start)
            rows.append({"alpha": a, "fraction": c, "items": n, "seed": seed, "sim_opt": o, "sim_lru": l_,
                         "sim_ratio": (1 - o) / (1 - l_),
                         "theory_ratio": (1 - theory.opt_irm_hit_rate(pop, cap))
                         / (1 - theory.lru_che_hit_rate(pop, cap))})
    _write_csv(os.path.join(report.out, "gain_heatmap.csv"), rows)
    _write_csv(os.path.join(report.out, "gain_heatmap_theory.csv"),
               [{"alpha": float(a), "fraction": float(c), "opt_over_lru_misses": float(ratio_lru[i, j]),
                 "opt_over_best_online_misses": float(ratio_best[i, j])}
                for i, a in enumerate(alphas_f) for j, c in enumerate(fracs_f)])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    for ax, data, title in ((axes[0], ratio_lru, "OPT misses / LRU misses"),
                            (axes[1], ratio_best, "OPT misses / best online (static top-C) misses")):
        im = ax.pcolormesh(fracs_f, alphas_f, data, shading="nearest", cmap="viridis", vmin=0, vmax=1)
        cs = ax.contour(fracs_f, alphas_f, data, levels=[0.3, 0.5, 0.7, 0.9], colors="white", linewidths=0.7)
        ax.clabel(cs, fontsize=7, fmt="%.1f")
        ax.set_xscale("log")
        ax.set_xlabel("cache size C / N (log scale)")
        ax.set_ylabel("Zipf skew $\\alpha$ (0 = uniform)")
        ax.set_title(title + " (theory, IRM)")
        fig.colorbar(im, ax=ax, label="ratio (lower = OPT saves more)")
    for r in rows:
        axes[0].annotate(f"{r['sim_ratio']:.2f}", (r["fraction"], r["alpha"]), color="red", fontsize=7,
                         ha="center", va="center",
                         bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
    axes[0].text(0.011, 1.36, f"red: simulated (N={n})", color="red", fontsize=7, va="top")
    for r in rows:
        report.add(Check("Zipf IRM", f"N={n}, alpha={r['alpha']}, c={r['fraction']}", "opt/lru",
                         "miss ratio", "theory (bound / Che)", r["theory_ratio"], r["sim_ratio"], 0.03,
                         r["seed"]))
    _save(fig, report, "gain_heatmap.png")


# ---------------------------------------------------------------------------
# figure 6: the earlier design's setup; workers with private caches
# ---------------------------------------------------------------------------


def _captured_replacement_sequence(n: int, total: int, seed: int) -> npt.NDArray[np.int64]:
    """RandomSampler(replacement=True, num_samples=total) captured from torch,
    as the earlier design's experiment built it; numpy if torch is absent."""
    try:
        import torch
        from torch.utils.data import RandomSampler

        from ..planning.capture import capture

        sampler = RandomSampler(range(n), replacement=True, num_samples=total,
                                generator=torch.Generator().manual_seed(seed))
        return capture(sampler, 1)
    except ImportError:  # pragma: no cover - torch is a dev dependency
        return uniform(n, total, seed=seed)


def fig_workers(report: Report) -> None:
    plt = _plt()
    n = 5000 if report.quick else 50000
    epochs, workers, batch = 10, 16, 512
    if report.quick:
        batch = 64
    t_total = n * epochs
    cap = n // 2
    cw = cap // workers
    shared = "one shared cache of C"
    full = "16 private caches of C each"
    small = "16 private caches of C/16 each"
    setups = [shared, full, small]
    pols = ["opt", "static-first", "lru", "fifo"]
    noise = 4 * math.sqrt(0.25 / t_total)
    rows: list[dict[str, Any]] = []

    def record(sampler: str, seed: int, setup: str, policy: str, sim_hits: float, th: float, kind: str,
               tol: float | None, th_hi: float | None = None) -> None:
        """tol None: the theory value is shown for reference, not checked."""
        rows.append({"sampler": sampler, "setup": setup, "policy": policy, "items": n, "accesses": t_total,
                     "workers": workers, "batch": batch, "seed": seed, "sim_hit_rate": sim_hits / t_total,
                     "theory_hit_rate": th / t_total,
                     "theory_hit_rate_hi": (th_hi if th_hi is not None else th) / t_total,
                     "theory_kind": kind, "checked": tol is not None})
        if tol is None or math.isnan(th):
            return
        pattern = f"earlier design ({sampler})"
        length = 'T=' + str(epochs) + 'N' if sampler == 'replacement' else 'E=' + str(epochs)
        setting = f"N={n}, {length}, c=0.5, {setup}"
        if th_hi is None:
            report.add(Check(pattern, setting, policy, "hits / T", kind, th / t_total, sim_hits / t_total, tol, seed))
        else:
            report.add(Check(pattern, setting, policy, "hits / T", kind, th / t_total, sim_hits / t_total, tol, seed,
                             mode="band", theory_hi=th_hi / t_total))

    # --- RandomSampler(replacement=True), as the earlier design ran it ---
    seed = report.seed_for(7)
    seq = _captured_replacement_sequence(n, t_total, seed)
    streams = worker_streams(seq, workers, batch)
    online = theory.online_uniform_expected_hits(n, cap, t_total)
    lo, hi = theory.opt_uniform_expected_hits(n, cap, t_total)
    record("replacement", seed, shared, "opt", build_plan(seq, cap, items=n).hits, lo, "fluid band",
           theory.opt_gap_tolerance(cap) + noise, hi)
    for p in ("static-first", "lru", "fifo"):
        record("replacement", seed, shared, p, hits(p, seq, cap, n), online, "exact expectation", noise)
    priv_full = theory.private_uniform_expected_hits(n, cap, t_total, workers)
    for p in pols:  # the caches never fill: every policy, OPT included, is the same
        record("replacement", seed, full, p, sum(hits(p, s, cap, n) for s in streams), priv_full,
               "exact expectation", noise)
    priv_small = theory.private_uniform_expected_hits(n, cw, t_total, workers)
    lo = hi = 0.0
    for s in streams:
        a, b = theory.opt_uniform_expected_hits(n, cw, s.size)
        lo, hi = lo + a, hi + b
    record("replacement", seed, small, "opt", sum(build_plan(s, cw, items=n).hits for s in streams), lo,
           "fluid band", theory.opt_gap_tolerance(cw) + noise, hi)
    for p in ("static-first", "lru", "fifo"):
        record("replacement", seed, small, p, sum(hits(p, s, cw, n) for s in streams), priv_small,
               "exact expectation", noise)
    with open(os.path.join(report.out, "workers_distinct.csv"), "w") as f:
        f.write("worker,accesses,distinct_ids,capacity_each,seed\n")
        for w, s in enumerate(streams):
            f.write(f"{w},{s.size},{np.unique(s).size},{cap},{seed}\n")

    # --- the same machine with shuffling instead (replacement=False) ---
    seed2 = report.seed_for(8)
    seq_s = epoch_shuffle(n, epochs, seed=seed2)
    streams_s = worker_streams(seq_s, workers, batch)
    exact = theory.opt_epoch_shuffle_hits(n, cap, epochs)
    record("shuffle", seed2, shared, "opt", build_plan(seq_s, cap, items=n).hits, exact, "exact", 0.0)
    record("shuffle", seed2, shared, "static-first", hits("static-first", seq_s, cap, n), exact, "exact", 0.0)
    record("shuffle", seed2, shared, "lru", hits("lru", seq_s, cap, n),
           theory.lru_epoch_shuffle_expected_hits(n, cap, epochs), "exact expectation", 0.005)
    record("shuffle", seed2, shared, "fifo", hits("fifo", seq_s, cap, n),
           theory.fifo_epoch_shuffle_hit_rate_limit(0.5) * n * (epochs - 1), "fluid limit", 0.005)
    no_evict = theory.private_epoch_no_eviction_hits(n, cap, workers, epochs)
    for p in pols:  # again the caches never fill: every policy is the same
        record("shuffle", seed2, full, p, sum(hits(p, s, cap, n) for s in streams_s), no_evict,
               "exact expectation (no eviction)", 0.005)
    # Private OPT: the steady-state fluid value (distributed.png checks it on
    # epochs 11-40). Ten epochs are not steady: the caches hold ids across
    # several epochs only after a few of them. Shown, not checked.
    record("shuffle", seed2, small, "opt", sum(build_plan(s, cw, items=n).hits for s in streams_s),
           theory.private_epoch_opt_hits_limit(n, cap, workers) * (epochs - 1),
           "steady-state fluid value (not reached in 10 epochs)", None)
    record("shuffle", seed2, small, "static-first", sum(hits("static-first", s, cw, n) for s in streams_s),
           theory.private_epoch_static_hits(n, cap, workers, epochs), "exact expectation", 0.005)
    for p in ("lru", "fifo"):
        record("shuffle", seed2, small, p, sum(hits(p, s, cw, n) for s in streams_s), math.nan, "simulation only",
               None)
    _write_csv(os.path.join(report.out, "workers.csv"), rows)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, sampler, title in ((axes[0], "replacement", f"RandomSampler(replacement=True), T = {epochs}N"),
                               (axes[1], "shuffle", f"shuffle (replacement=False), {epochs} epochs")):
        width = 0.2
        for k, p in enumerate(pols):
            rr = [next(r for r in rows if r["sampler"] == sampler and r["setup"] == s and r["policy"] == p)
                  for s in setups]
            xs = [j + (k - 1.5) * width for j in range(len(setups))]
            st = STYLE[p]
            ax.bar(xs, [r["sim_hit_rate"] for r in rr], width=width, color=st["color"], alpha=0.75,
                   label=st["label"] + " (sim)")
            for x, r in zip(xs, rr):
                if math.isnan(r["theory_hit_rate"]):
                    continue
                if r["checked"]:
                    ax.plot([x - width / 2, x + width / 2], [r["theory_hit_rate"]] * 2, color="k", lw=1.5)
                    if r["theory_hit_rate_hi"] != r["theory_hit_rate"]:
                        ax.plot([x - width / 2, x + width / 2], [r["theory_hit_rate_hi"]] * 2, color="k", lw=1.5)
                else:
                    ax.plot([x], [r["theory_hit_rate"]], marker="x", color="k", markersize=6)
        ax.plot([], [], color="k", lw=1.5, label="theory (checked)")
        if sampler == "shuffle":
            ax.plot([], [], marker="x", color="k", linestyle="none", label="steady-state value (not reached)")
        ax.set_xticks(range(3))
        ax.set_xticklabels(["one shared cache\nof C = N/2", "16 private caches\nof C each (16x memory)",
                            "16 private caches\nof C/16 each"], fontsize=8)
        ax.set_ylabel("hits / all accesses")
        ax.set_ylim(0, 0.85)
        ax.set_title(f"{title}, N={n:,}, batch {batch}, 16 workers", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    _save(fig, report, "workers.png")


# ---------------------------------------------------------------------------
# figure 7: ranks (or workers) with private caches under epoch shuffling
# ---------------------------------------------------------------------------


def fig_distributed(report: Report) -> None:
    plt = _plt()
    n = 4800 if report.quick else 19200
    epochs = 40
    first = 10  # epochs 11..E are averaged; the first ten are a warm-up
    rank_counts = [1, 2, 4, 8, 16]
    fractions = [0.1, 0.5]
    rows = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for fi, (c, ax) in enumerate(zip(fractions, axes)):
        total = int(round(c * n))
        sim: dict[str, list[float]] = {"opt": [], "static-first": [], "lru": []}
        n_epochs = epochs - first
        for ri, r in enumerate(rank_counts):
            seed = report.seed_for(100 + 10 * fi + ri)
            traces = sharded_epoch_traces(n, epochs, r, seed=seed)
            share = n // r
            cap = total // r
            per = {k: 0.0 for k in sim}
            for tr in traces:
                kinds = build_plan(tr, cap, items=n).kinds
                per["opt"] += int(np.count_nonzero(kinds[first * share :] == 0))
                for p in ("static-first", "lru"):
                    per[p] += hits(p, tr, cap, n) - hits(p, tr[: first * share], cap, n)
            for k in sim:
                sim[k].append(per[k] / (n_epochs * n))
            th_lo = theory.private_epoch_opt_hits_limit(n, total, r) / n
            th_hi = theory.private_epoch_opt_hits_upper(n, total, r) / n
            th_static = total / r / n
            rows.append({"fraction": c, "ranks": r, "items": n, "epochs": epochs,
                         "averaged_epochs": f"{first + 1}-{epochs}", "seed": seed, "theory_shared_opt": total / n,
                         "theory_private_opt_fluid": th_lo, "theory_private_opt_upper": th_hi,
                         "theory_private_static": th_static,
                         **{f"sim_private_{k}": v[-1] for k, v in sim.items()}})
            setting = f"N={n}, c={c}, R={r}, epochs {first + 1}-{epochs}"
            report.add(Check("sharded epochs", setting, "opt (private)", "hits / N per epoch",
                             "fluid value .. upper bound", th_lo * (1 - 3 * theory.opt_gap_tolerance(cap)),
                             sim["opt"][-1], 0.001, seed, mode="band", theory_hi=th_hi))
            report.add(Check("sharded epochs", setting, "static-first (private)", "hits / N per epoch",
                             "exact expectation", th_static, sim["static-first"][-1],
                             4 * math.sqrt(th_static / (n_epochs * n)) + 1e-9, seed))
        fine = np.unique(np.round(np.geomspace(1, 16, 40)).astype(int))
        ax.plot(rank_counts, [c] * len(rank_counts), color="#d62728", ls="--", lw=1.2,
                label="one shared cache: OPT = static = c")
        lo_curve = [theory.private_epoch_opt_hits_limit(n, total, int(r)) / n for r in fine]
        hi_curve = [theory.private_epoch_opt_hits_upper(n, total, int(r)) / n for r in fine]
        ax.fill_between(fine, lo_curve, hi_curve, color="#d62728", alpha=0.3, lw=0,
                        label="private caches of C/R, OPT: fluid value .. upper bound")
        ax.plot(fine, lo_curve, color="#d62728", lw=1.0)
        ax.plot(fine, [c / r for r in fine], color="#7f7f7f", lw=1.5, label="private caches of C/R, static: c/R")
        _points(ax, "opt", rank_counts, sim["opt"], label="private OPT (sim)")
        _points(ax, "static-first", rank_counts, sim["static-first"], label="private static first-C (sim)")
        _points(ax, "lru", rank_counts, sim["lru"], label="private LRU (sim)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks (or loader workers) R, each with a private cache of C/R")
        ax.set_ylabel(f"hits / N per epoch (mean of epochs {first + 1}-{epochs})")
        ax.set_title(f"Epoch shuffle dealt to R ranks, total cache C/N = {c} (N={n:,})")
        ax.set_ylim(-0.02 * c, 1.45 * c)
        ax.legend(fontsize=6.5, loc="upper right", ncol=2)
    _write_csv(os.path.join(report.out, "distributed.csv"), rows)
    _save(fig, report, "distributed.png")


# ---------------------------------------------------------------------------
# tables only: repeated augmentation
# ---------------------------------------------------------------------------


def table_repeated_aug(report: Report) -> None:
    n = 2000 if report.quick else 10000
    epochs, k = 5, 3
    seed = report.seed_for(9)
    seq = repeated_aug_trace(n, epochs, k, seed=seed)
    plain = seq[::k]
    rows = []
    for c in (0.1, 0.5):
        cap = int(round(c * n))
        o = build_plan(seq, cap, items=n).hits
        l_ = hits("lru", seq, cap, n)
        l_plain = hits("lru", plain, cap, n)
        lo, hi = theory.opt_repeated_aug_hits_bounds(n, cap, epochs, k)
        lru_e = theory.lru_repeated_aug_expected_hits(n, cap, epochs, k)
        rows.append({"fraction": c, "items": n, "epochs": epochs, "repeats": k, "seed": seed, "sim_opt": o,
                     "theory_opt_lower": lo, "theory_opt_upper": hi, "sim_lru": l_, "theory_lru": lru_e,
                     "lru_identity_rhs": (k - 1) * n * epochs + l_plain,
                     "misses_opt": seq.size - o, "misses_lru": seq.size - l_})
        setting = f"N={n}, E={epochs}, k={k}, c={c}"
        report.add(Check("repeated augmentation", setting, "opt", "hits", "bounds", lo, o, 0, seed, mode="band",
                         theory_hi=hi))
        report.add(Check("repeated augmentation", setting, "lru", "hits", "identity per trace",
                         (k - 1) * n * epochs + l_plain, l_, 0, seed))
        report.add(Check("repeated augmentation", setting, "lru", "hits", "exact expectation", lru_e, l_,
                         4 * math.sqrt(n * (epochs - 1)) + 1, seed))
    _write_csv(os.path.join(report.out, "repeated_aug.csv"), rows)


# ---------------------------------------------------------------------------
# table: how far below the IRM bound OPT falls at finite C
# ---------------------------------------------------------------------------


def table_opt_gap(report: Report) -> None:
    """The measurement behind theory.opt_gap_tolerance: bound minus the
    simulated steady-state OPT hit rate over skews, sizes and caches."""
    rows = []
    sizes = [1000] if report.quick else [1000, 10000]
    for ai, alpha in enumerate([0.0, 0.6, 1.0, 1.2]):
        for n in sizes:
            t_total = 100 * n
            start, stop = t_total // 4, 3 * t_total // 4
            seed = report.seed_for(200 + 10 * ai + sizes.index(n))
            seq = zipf_trace(n, alpha, t_total, seed=seed)
            pop = theory.zipf_popularity(n, alpha)
            for c in (0.005, 0.01, 0.03, 0.1, 0.3, 0.5, 0.9):
                cap = int(round(c * n))
                if cap < 5:
                    continue
                bound = theory.opt_uniform_hit_rate(n, cap) if alpha == 0.0 else theory.opt_irm_hit_rate(pop, cap)
                sim = window_hits("opt", seq, cap, n, start, stop) / (stop - start)
                gap = bound - sim
                rows.append({"alpha": alpha, "items": n, "fraction": c, "capacity": cap, "seed": seed,
                             "bound": bound, "sim_opt": sim, "gap": gap, "gap_times_C^0.6": gap * cap**0.6,
                             "envelope": theory.opt_gap_tolerance(cap)})
                steady = not (alpha >= 1.2 and c >= 0.9)  # rarest ids still first seen in the window
                if steady:
                    report.add(Check("OPT gap below the IRM bound", f"N={n}, alpha={alpha}, c={c}", "opt",
                                     "hit rate", "upper bound; empirical envelope below",
                                     bound - theory.opt_gap_tolerance(cap),
                                     sim, 4 * math.sqrt(0.25 / (stop - start)), seed, mode="band", theory_hi=bound))
    _write_csv(os.path.join(report.out, "opt_gap.csv"), rows)


# ---------------------------------------------------------------------------
# figure 8: what a lower miss rate can buy
# ---------------------------------------------------------------------------


def fig_speedup(report: Report) -> None:
    plt = _plt()
    u = np.linspace(0.0, 2.0, 201)
    c = 0.5
    cases = [
        ("uniform w/ repl., OPT vs LRU", 1 - c, 1 - theory.opt_uniform_hit_rate_limit(c), "#d62728", "-"),
        ("epoch shuffle, OPT (=static) vs LRU", 1 - theory.lru_epoch_shuffle_hit_rate_limit(c), 1 - c, "#1f77b4",
         "-"),
        ("epoch shuffle, OPT vs static", 1 - c, 1 - c, "#7f7f7f", "--"),
    ]
    pop = theory.zipf_popularity(10000, 1.0)
    cap = 1000
    cases.append(("Zipf 1.0, C/N=0.1, OPT vs static top-C", 1 - theory.static_top_hit_rate(pop, cap),
                  1 - theory.opt_irm_hit_rate(pop, cap), "#8c564b", "-"))
    cases.append(("Zipf 1.0, C/N=0.1, OPT vs LRU", 1 - theory.lru_che_hit_rate(pop, cap),
                  1 - theory.opt_irm_hit_rate(pop, cap), "#2ca02c", "-"))
    rows = []
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, mb, ma, color, ls in cases:
        ys = [theory.loader_speedup_bound(mb, ma, float(x)) for x in u]
        ax.plot(u, ys, color=color, ls=ls, lw=1.5, label=f"{name} (m: {mb:.2f} -> {ma:.2f})")
        rows += [{"case": name, "uncached_share": float(x), "miss_before": mb, "miss_after": ma, "speedup_bound": y}
                 for x, y in zip(u[::20], ys[::20])]
    ax.set_xlabel("u = per-sample work a cache cannot remove / cost of a miss")
    ax.set_ylabel("largest possible speed-up of a loader-bound run")
    ax.set_title(f"What the hit-rate gain can buy (C/N = {c} unless noted)")
    ax.set_ylim(0.9, 2.8)
    ax.legend(fontsize=7)
    _write_csv(os.path.join(report.out, "speedup.csv"), rows)
    _save(fig, report, "speedup.png")


# ---------------------------------------------------------------------------
# figure 9: sequential runs with random jumps (the Markov trace)
# ---------------------------------------------------------------------------


def fig_markov(report: Report) -> None:
    """Hit rate against the mean run length 1/p of the Markov trace, from
    uniform access (p = 1, section 2) to a cyclic scan (p = 0, an epoch
    shuffle with a fixed order, section 3.1), at C/N = 0.2."""
    plt = _plt()
    n = 1000 if report.quick else 4000
    c = 0.2
    cap = int(round(c * n))
    epochs = 40
    accesses = epochs * n
    seed = report.seed_for(9)
    runs = [1, 3, 10, 30, 100, 300, 1000, 3000, 10000, 30000, 100000]
    runs = [r for r in runs if r <= 25 * n]
    pols = ["opt", "static-first", "lru", "fifo", "random", "lfu", "sieve"]
    sim: dict[str, list[float]] = {q: [] for q in pols}
    rows = []
    for k, run in enumerate(runs):
        jump = 1.0 / run
        s = seed + k
        seq = markov(n, accesses, jump=jump, seed=s)
        row: dict[str, Any] = {"mean_run": run, "jump": jump, "items": n, "capacity": cap,
                               "accesses": accesses, "seed": s}
        for q in pols:
            row[f"sim_{q}"] = hits(q, seq, cap, n, seed=s) / accesses
            sim[q].append(row[f"sim_{q}"])
        rows.append(row)
        # Every access is uniform on its own (P^t = (1-p)^t S^t + (1-(1-p)^t) U),
        # so a fixed set of C ids is hit C/N of the time; the static cache's
        # set is fixed after its fill. Its hits come in runs, so the noise
        # allowance counts blocks of min(1/p, N) accesses.
        # Checked where runs are short enough for that to be tight; longer
        # runs are a few dozen runs per trace (and p = 0 is checked exactly).
        if run <= n // 100:
            block = min(run, n)
            tol = 4 * math.sqrt(c * (1 - c) * block / accesses) + 2 * block / accesses
            report.add(Check("markov", f"N={n}, C/N={c}, mean run {run}", "static-first", "hit rate",
                             "exact expectation", c, row["sim_static-first"], tol, s))
    # The two ends, exactly: p = 1 is uniform access (section 2.1); p = 0 is
    # a cyclic scan, an epoch shuffle with a fixed order (section 3.1).
    s_irm, s_scan = seed + 100, seed + 101
    irm = markov(n, accesses, jump=1.0, seed=s_irm)
    scan = markov(n, accesses, jump=0.0, seed=s_scan)
    online = theory.online_uniform_expected_hits(n, cap, accesses)
    for q in ("lru", "fifo"):
        h = hits(q, irm, cap, n)
        report.add(Check("markov", f"N={n}, C/N={c}, p=1 (uniform)", q, "hits", "exact expectation", online,
                         h, 4 * math.sqrt(online), s_irm))
    exact = theory.opt_epoch_shuffle_hits(n, cap, epochs)
    for q in ("opt", "static-first"):
        report.add(Check("markov", f"N={n}, C/N={c}, p=0 (cyclic scan)", q, "hits", "exact", exact,
                         hits(q, scan, cap, n), 0, s_scan))
    for q in ("lru", "fifo"):
        report.add(Check("markov", f"N={n}, C/N={c}, p=0 (cyclic scan)", q, "hits", "exact", 0,
                         hits(q, scan, cap, n), 0, s_scan))
    _write_csv(os.path.join(report.out, "markov.csv"), rows)

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    opt_irm = theory.opt_uniform_hit_rate(n, cap)
    ax.axhline(c, color="#7f7f7f", lw=1, ls="--", label="every online policy at p = 1, static at all p: C/N")
    ax.axhline(opt_irm, color="#d62728", lw=1, ls="--", label="OPT at p = 1 (uniform, section 2.2)")
    ax.axhline(0, color="#1f77b4", lw=1, ls=":", label="LRU, FIFO at p = 0 (scan): 0")
    ax.axvline(cap, color="black", lw=0.6, ls="-.")
    ax.axvline(n, color="black", lw=0.6, ls="-.")
    ax.text(cap, 0.3, " 1/p = C", fontsize=7)
    ax.text(n, 0.3, " 1/p = N", fontsize=7)
    for q in pols:
        st = dict(STYLE[q])
        label = st.pop("label") + " (sim)"
        ax.plot(runs, sim[q], markerfacecolor="none", markersize=5, lw=0.8, label=label, **st)
    ax.set_xscale("log")
    ax.set_xlabel("mean run length 1/p (accesses between random jumps)")
    ax.set_ylabel("hit rate")
    ax.set_title(f"Markov trace: runs with random jumps (N={n:,}, C/N={c})")
    ax.set_ylim(-0.02, 0.9)
    ax.legend(fontsize=6.5, loc="upper center", ncol=2)
    best_online = [max(sim[q][i] for q in pols if q != "opt") for i in range(len(runs))]
    gain = [sim["opt"][i] / best_online[i] if best_online[i] > 0 else math.nan for i in range(len(runs))]
    ax2.plot(runs, gain, color="#d62728", marker="o", markerfacecolor="none", label="OPT / best other policy")
    ax2.plot(runs, [sim["opt"][i] / sim["lru"][i] if sim["lru"][i] > 0 else math.nan for i in range(len(runs))],
             color="#1f77b4", marker="s", markerfacecolor="none", label="OPT / LRU (none where LRU has no hits)")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("mean run length 1/p")
    ax2.set_ylabel("hit-rate ratio")
    ax2.set_title("OPT's edge over LRU, and over the best other policy")
    ax2.legend(fontsize=7)
    for row, g in zip(rows, gain):
        row["opt_over_best_other"] = g
    _write_csv(os.path.join(report.out, "markov.csv"), rows)
    _save(fig, report, "markov.png")


# ---------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------


FIGURES: list[tuple[str, Callable[[Report], None]]] = [
    ("uniform", fig_uniform),
    ("uniform_horizon", fig_uniform_horizon),
    ("epoch_shuffle", fig_epoch_shuffle),
    ("zipf", fig_zipf),
    ("gain_heatmap", fig_gain_heatmap),
    ("workers", fig_workers),
    ("distributed", fig_distributed),
    ("repeated_aug", table_repeated_aug),
    ("opt_gap", table_opt_gap),
    ("speedup", fig_speedup),
    ("markov", fig_markov),
]


def _write_tables(report: Report) -> None:
    rows = [c.row() for c in report.checks]
    _write_csv(os.path.join(report.out, "checks.csv"), rows)
    cols = ["setting", "policy", "quantity", "kind", "theory", "simulated", "tolerance", "agrees", "seed"]
    lines = ["<!-- generated by python -m opt4torch.lab.science; do not edit -->", ""]
    for pattern in dict.fromkeys(c.pattern for c in report.checks):
        lines.append(f"### {pattern}")
        lines.append("")
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---|" * len(cols))
        for c in report.checks:
            if c.pattern == pattern:
                r = c.row()
                lines.append("| " + " | ".join(str(r[k]) for k in cols) + " |")
        lines.append("")
    n_bad = sum(not c.ok for c in report.checks)
    lines.append(f"{len(report.checks)} comparisons, {n_bad} outside tolerance. "
                 f"Seed {report.seed}{' (quick sizes)' if report.quick else ''}.")
    lines.append("")
    with open(os.path.join(report.out, "tables.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m opt4torch.lab.science", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/figures", help="output folder (default docs/figures)")
    ap.add_argument("--seed", type=int, default=0, help="global seed (default 0)")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--only", default="", help="comma-separated figure names to make (default: all)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    report = Report(out=args.out, seed=args.seed, quick=args.quick)
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    t_all = time.perf_counter()
    for name, fn in FIGURES:
        if wanted and name not in wanted:
            continue
        t0 = time.perf_counter()
        fn(report)
        dt = time.perf_counter() - t0
        report.timings.append((name, dt))
        print(f"{name:>16}: {dt:6.1f} s", flush=True)
    report.timings.append(("total", time.perf_counter() - t_all))
    _write_tables(report)
    bad = [c for c in report.checks if not c.ok]
    print(f"{len(report.checks)} comparisons, {len(bad)} outside tolerance; "
          f"total {report.timings[-1][1]:.1f} s; wrote {os.path.abspath(args.out)}")
    for c in bad:
        print("  outside tolerance:", c.row())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
