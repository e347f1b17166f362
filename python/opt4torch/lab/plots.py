"""Plots of simulation sweeps (``opt4torch simulate --out DIR``).

matplotlib is an optional extra (``pip install 'opt4torchdataset[plot]'``),
imported only when a plot is drawn, with the Agg backend: plots are files,
never windows.

Rows are the dicts ``opt4torch simulate`` writes to results.json: ``policy``,
``capacity``, ``hit_rate``, ``pattern``, ``param``, ``value`` and ``items``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from .sim import CLAIRVOYANT, POLICIES, compare

__all__ = ["PlotDependencyError", "capacity_label", "gain_figure", "gain_heatmaps", "hit_rate_curves",
           "hit_rate_figure", "require_matplotlib"]

INSTALL_HINT = "pip install 'opt4torchdataset[plot]'"


class PlotDependencyError(ImportError):
    """matplotlib is missing; the message says how to install it."""


def require_matplotlib() -> Any:
    """matplotlib.pyplot on the Agg backend, or PlotDependencyError."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotDependencyError(f"plots need matplotlib, which is not installed: {INSTALL_HINT}") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


#: One marker per online policy (beside its colour), so that lines that run
#: close together, or cross, can still be told apart, in print as well.
_MARKERS = ("s", "^", "v", "D", "X", "P", "<", ">", "*", "h")
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
            "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _style(policy: str) -> dict[str, Any]:
    """One look per policy in every figure; OPT in black, drawn on top."""
    if policy == "opt":
        # Hollow too: a policy that matches OPT (a static cache under epoch
        # shuffle) shows its marker inside OPT's.
        return {"color": "black", "linewidth": 2.4, "marker": "o", "markersize": 9, "fillstyle": "none",
                "markeredgewidth": 1.6, "zorder": 5}
    if policy == "opt-nobypass":
        return {"color": "#888888", "linewidth": 1.4, "linestyle": "--", "marker": "o", "markersize": 3,
                "zorder": 6}
    online = [p for p in POLICIES if p not in ("opt", "opt-nobypass")]
    i = online.index(policy) if policy in online else len(online)
    # Hollow markers: where two policies have the same hit rate, both shapes
    # still show, one over the other.
    style: dict[str, Any] = {"color": _PALETTE[i % len(_PALETTE)], "linewidth": 1.3,
                             "marker": _MARKERS[i % len(_MARKERS)], "markersize": 6, "fillstyle": "none",
                             "markeredgewidth": 1.2, "zorder": 3}
    if policy in CLAIRVOYANT:
        style["linestyle"] = ":"
    return style


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def _groups(rows: Iterable[dict[str, Any]]) -> dict[str, dict[Any, list[dict[str, Any]]]]:
    """pattern -> param value -> rows, in first-seen order."""
    out: dict[str, dict[Any, list[dict[str, Any]]]] = {}
    for row in rows:
        out.setdefault(row["pattern"], {}).setdefault(row.get("value", ""), []).append(row)
    return out


def capacity_label(row: dict[str, Any]) -> str:
    """A row's capacity as the user asked for it ("1%", even when 1 % of the
    items rounded to a whole number of items is 0.98 %), or, given in items,
    as a share of the items."""
    requested = str(row.get("requested") or "").strip()
    if requested.endswith("%"):
        try:
            return f"{float(requested[:-1]):g}%"
        except ValueError:
            pass
    return f"{100 * row['capacity'] / row['items']:.3g}%"


def _capacity_ticks(rows: Sequence[dict[str, Any]]) -> dict[int, tuple[float, str]]:
    """capacity in items -> (share of the items, label), for every capacity
    among ``rows`` (of one trace), ascending: points sit where they were
    simulated, labels say what was asked for."""
    out: dict[int, tuple[float, str]] = {}
    for r in sorted(rows, key=lambda r: r["capacity"]):
        out.setdefault(int(r["capacity"]), (r["capacity"] / r["items"], capacity_label(r)))
    return out


def _capacity_axis(ax: Any, ticks: Sequence[tuple[float, str]]) -> None:
    """Capacities as percentages of items, ticked where they were simulated;
    a log scale when they span more than a factor of 3 (sizes are usually
    asked for in steps like 1, 2, 5, 10 %, which a linear axis crowds into
    its left end)."""
    from matplotlib.ticker import NullLocator

    xs = [x for x, _ in ticks]
    if xs and max(xs) / min(xs) > 3:
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(xs, [label for _, label in ticks])
    ax.set_xlabel("cache capacity (% of items)")


def _thin_tick_labels(fig: Any, axes: Iterable[Any], gap_px: float = 6.0) -> None:
    """Blank the x tick labels that would touch the one before them (from the
    left), after the layout has run: labels never overlap, whatever the
    capacities and the figure's width."""
    fig.canvas.draw()  # runs the layout engine: the extents below are final
    renderer = fig.canvas.get_renderer()
    for ax in axes:
        if not ax.get_visible():
            continue
        positions = list(ax.get_xticks())
        labels = [t.get_text() for t in ax.get_xticklabels()]
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
        keep, right = list(labels), float("-inf")
        for i in sorted(range(len(labels)), key=lambda i: boxes[i].x0):
            if not labels[i]:
                continue
            if boxes[i].x0 < right + gap_px:
                keep[i] = ""
            else:
                right = boxes[i].x1
        if keep != labels:
            ax.set_xticks(positions, keep)


def _hit_rate_limits(rates: Sequence[float]) -> tuple[float, float]:
    """The y range for these hit rates: from the data, not 0-100 %, so that
    policies a few points apart are drawn apart; a margin of 6 % of the span
    (at least one point), never below 0."""
    lo, hi = min(rates), max(rates)
    pad = max(0.01, 0.06 * (hi - lo))
    return max(0.0, lo - pad), hi + pad


def _percent_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _pos: f"{100 * x:.3g}%")


def hit_rate_figure(rows: Sequence[dict[str, Any]]) -> Any:
    """The figure of one pattern's rows: hit rate against capacity, one line
    per policy, one panel per value of the swept parameter, each panel's y
    range from its own data. The legend lists the policies from the highest
    mean hit rate down, the order in which their lines mostly run. The
    caller saves and closes it (:func:`hit_rate_curves` does)."""
    plt = require_matplotlib()
    by_value = next(iter(_groups(rows).values()))
    pattern = rows[0]["pattern"]
    n = len(by_value)
    cols = min(n, 3)
    nrows = -(-n // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.8 * cols, 3.8 * nrows), squeeze=False,
                             layout="constrained")
    for k, (value, group) in enumerate(by_value.items()):
        ax = axes[k // cols][k % cols]
        param = group[0].get("param", "")
        policies = list(dict.fromkeys(r["policy"] for r in group))
        for policy in policies:
            pts = sorted((r["capacity"] / r["items"], r["hit_rate"]) for r in group if r["policy"] == policy)
            ax.plot([x for x, _ in pts], [y for _, y in pts], label=policy, **_style(policy))
        _capacity_axis(ax, list(_capacity_ticks(group).values()))
        ax.yaxis.set_major_formatter(_percent_formatter())
        ax.set_ylim(*_hit_rate_limits([r["hit_rate"] for r in group]))
        ax.grid(True, alpha=0.3)
        if param:
            ax.set_title(f"{param} = {value}", fontsize=10)
        if k % cols == 0:
            ax.set_ylabel("hit rate")
    for k in range(n, nrows * cols):
        axes[k // cols][k % cols].set_visible(False)
    mean = {p: sum(r["hit_rate"] for r in rows if r["policy"] == p) / sum(1 for r in rows if r["policy"] == p)
            for p in dict.fromkeys(r["policy"] for r in rows)}
    handles = dict(zip(*reversed(axes[0][0].get_legend_handles_labels())))
    order = sorted(handles, key=lambda p: -mean[p])
    fig.legend([handles[p] for p in order], order, loc="outside right center", fontsize=9,
               title="policy (best first)", title_fontsize=9)
    fig.suptitle(f"{pattern}: hit rate against cache size\n"
                 f"{rows[0]['items']:,} items, {rows[0]['accesses']:,} accesses", fontsize=11)
    _thin_tick_labels(fig, [ax for row in axes for ax in row])
    return fig


def hit_rate_curves(rows: Sequence[dict[str, Any]], out_dir: str | os.PathLike[str]) -> list[str]:
    """One PNG per pattern, ``hit_rate_<pattern>.png`` (see
    :func:`hit_rate_figure`). Returns the paths written."""
    plt = require_matplotlib()
    out_dir = os.fspath(out_dir)
    paths = []
    for pattern, by_value in _groups(rows).items():
        fig = hit_rate_figure([r for group in by_value.values() for r in group])
        path = os.path.join(out_dir, f"hit_rate_{_slug(pattern)}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def gain_heatmaps(rows: Sequence[dict[str, Any]], out_dir: str | os.PathLike[str]) -> list[str]:
    """For each pattern swept over two or more values of a parameter:
    ``gain_<pattern>.png``, a heatmap of OPT's hit rate minus the best online
    policy's (percentage points) over parameter value and capacity; each
    cell names the best online policy. Needs OPT (or opt-nobypass) and at
    least one online policy among the rows. Returns the paths written."""
    plt = require_matplotlib()
    out_dir = os.fspath(out_dir)
    paths = []
    for pattern, by_value in _groups(rows).items():
        if len(by_value) < 2:
            continue
        fig = gain_figure([r for group in by_value.values() for r in group])
        if fig is None:
            continue
        path = os.path.join(out_dir, f"gain_{_slug(pattern)}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def gain_figure(rows: Sequence[dict[str, Any]]) -> Any | None:
    """The heatmap of :func:`gain_heatmaps` for one pattern's rows, or None
    when a value's rows lack OPT or every online policy. The caller saves
    and closes it."""
    plt = require_matplotlib()
    import numpy as np

    by_value = next(iter(_groups(rows).values()))
    pattern = rows[0]["pattern"]
    tables = {v: {c.capacity: c for c in compare(g)} for v, g in by_value.items()}
    if any(c.gain_over_best_online is None for t in tables.values() for c in t.values()):
        return None
    param = rows[0].get("param", "")
    values = list(by_value)
    ticks = {c: label for c, (_, label) in _capacity_ticks(rows).items()}
    caps = sorted(ticks)
    grid = np.full((len(values), len(caps)), np.nan)
    names = [["" for _ in caps] for _ in values]
    for i, v in enumerate(values):
        for j, cap in enumerate(caps):
            if cap in tables[v]:
                grid[i, j] = 100 * (tables[v][cap].gain_over_best_online or 0.0)
                names[i][j] = tables[v][cap].best_online or ""
    fig, ax = plt.subplots(figsize=(1.1 * len(caps) + 2.8, 0.62 * len(values) + 1.9), layout="constrained")
    top = float(np.nanmax(grid))
    im = ax.imshow(grid, cmap="Greens", aspect="auto", origin="lower", vmin=0, vmax=max(1.0, top))
    for i in range(len(values)):
        for j in range(len(caps)):
            if np.isnan(grid[i, j]):
                continue
            color = "white" if grid[i, j] > 0.6 * top else "black"
            ax.text(j, i, f"{grid[i, j]:+.1f}\n{names[i][j]}", ha="center", va="center", fontsize=7.5,
                    color=color)
    ax.set_xticks(range(len(caps)), [ticks[c] for c in caps])
    ax.set_yticks(range(len(values)), [str(v) for v in values])
    ax.set_xlabel("cache capacity (% of items)")
    ax.set_ylabel(param or "value")
    opt_name = next(iter(next(iter(tables.values())).values())).opt
    ax.set_title(f"{pattern}: {opt_name} hit rate minus the best online policy's\n"
                 f"(percentage points; cell: gain and the best online policy)", fontsize=10)
    fig.colorbar(im, ax=ax, label="gain (points)")
    _thin_tick_labels(fig, [ax])
    return fig

