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

from .sim import CLAIRVOYANT, POLICIES

__all__ = ["PlotDependencyError", "gain_heatmaps", "hit_rate_curves", "require_matplotlib"]

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


def _style(policy: str) -> dict[str, Any]:
    """One look per policy in every figure; OPT in black, drawn on top."""
    if policy == "opt":
        return {"color": "black", "linewidth": 2.4, "marker": "o", "zorder": 5}
    if policy == "opt-nobypass":
        return {"color": "#888888", "linewidth": 1.4, "linestyle": "--", "marker": "o", "markersize": 3,
                "zorder": 6}
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
               "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
    online = [p for p in POLICIES if p not in ("opt", "opt-nobypass")]
    i = online.index(policy) if policy in online else len(online)
    style: dict[str, Any] = {"color": palette[i % len(palette)], "linewidth": 1.4, "marker": ".", "zorder": 3}
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


def _capacity_axis(ax: Any, fractions: Sequence[float]) -> None:
    """Capacities as percentages of items, ticked where they were simulated;
    a log scale when they span more than a factor of 20."""
    from matplotlib.ticker import NullLocator

    if fractions and max(fractions) / min(fractions) > 20:
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(list(fractions))
    ax.xaxis.set_major_formatter(_percent_formatter())
    ax.set_xlabel("cache capacity (% of items)")


def _percent_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _pos: f"{100 * x:.3g}%")


def hit_rate_curves(rows: Sequence[dict[str, Any]], out_dir: str | os.PathLike[str]) -> list[str]:
    """One PNG per pattern, ``hit_rate_<pattern>.png``: hit rate against
    capacity, one line per policy, one panel per value of the swept
    parameter. Returns the paths written."""
    plt = require_matplotlib()
    out_dir = os.fspath(out_dir)
    paths = []
    for pattern, by_value in _groups(rows).items():
        n = len(by_value)
        cols = min(n, 3)
        nrows = -(-n // cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.6 * nrows), squeeze=False,
                                 sharey=True, layout="constrained")
        for k, (value, group) in enumerate(by_value.items()):
            ax = axes[k // cols][k % cols]
            param, items = group[0].get("param", ""), group[0]["items"]
            policies = list(dict.fromkeys(r["policy"] for r in group))
            fractions = sorted({r["capacity"] / items for r in group})
            for policy in policies:
                pts = sorted((r["capacity"] / items, r["hit_rate"]) for r in group if r["policy"] == policy)
                ax.plot([x for x, _ in pts], [y for _, y in pts], label=policy, **_style(policy))
            _capacity_axis(ax, fractions)
            ax.yaxis.set_major_formatter(_percent_formatter())
            ax.set_ylim(0, 1.02)
            ax.grid(True, alpha=0.3)
            if param:
                ax.set_title(f"{param} = {value}", fontsize=10)
            if k % cols == 0:
                ax.set_ylabel("hit rate")
        for k in range(n, nrows * cols):
            axes[k // cols][k % cols].set_visible(False)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside right center", fontsize=9)
        fig.suptitle(f"{pattern}: hit rate against cache size\n"
                     f"{group[0]['items']:,} items, {group[0]['accesses']:,} accesses", fontsize=11)
        path = os.path.join(out_dir, f"hit_rate_{_slug(pattern)}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def _gain_table(group_rows: Sequence[dict[str, Any]]) -> tuple[str, dict[int, tuple[float, str]]] | None:
    """For one trace: OPT's policy name, and per capacity (OPT's hit rate
    minus the best online one's, the best online policy's name)."""
    policies = {r["policy"] for r in group_rows}
    opt = "opt" if "opt" in policies else "opt-nobypass" if "opt-nobypass" in policies else None
    online = policies - CLAIRVOYANT
    if opt is None or not online:
        return None
    table = {}
    for c in sorted({r["capacity"] for r in group_rows}):
        at = {r["policy"]: r["hit_rate"] for r in group_rows if r["capacity"] == c}
        best = max(sorted(online), key=lambda p: at[p])
        table[c] = (at[opt] - at[best], best)
    return opt, table


def gain_heatmaps(rows: Sequence[dict[str, Any]], out_dir: str | os.PathLike[str]) -> list[str]:
    """For each pattern swept over two or more values of a parameter:
    ``gain_<pattern>.png``, a heatmap of OPT's hit rate minus the best online
    policy's (percentage points) over parameter value and capacity; each
    cell names the best online policy. Needs OPT (or opt-nobypass) and at
    least one online policy among the rows. Returns the paths written."""
    plt = require_matplotlib()
    import numpy as np

    out_dir = os.fspath(out_dir)
    paths = []
    for pattern, by_value in _groups(rows).items():
        if len(by_value) < 2:
            continue
        tables = {v: _gain_table(g) for v, g in by_value.items()}
        if any(t is None for t in tables.values()):
            continue
        first = next(iter(by_value.values()))[0]
        items, param = first["items"], first.get("param", "")
        values = list(by_value)
        caps = sorted({c for t in tables.values() for c in t[1]})  # type: ignore[index]
        grid = np.full((len(values), len(caps)), np.nan)
        names = [["" for _ in caps] for _ in values]
        for i, v in enumerate(values):
            opt, table = tables[v]  # type: ignore[misc]
            for j, c in enumerate(caps):
                if c in table:
                    grid[i, j] = 100 * table[c][0]
                    names[i][j] = table[c][1]
        fig, ax = plt.subplots(figsize=(1.1 * len(caps) + 2.8, 0.62 * len(values) + 1.9),
                               layout="constrained")
        im = ax.imshow(grid, cmap="Greens", aspect="auto", origin="lower", vmin=0,
                       vmax=max(1.0, float(np.nanmax(grid))))
        top = np.nanmax(grid)
        for i in range(len(values)):
            for j in range(len(caps)):
                if np.isnan(grid[i, j]):
                    continue
                color = "white" if grid[i, j] > 0.6 * top else "black"
                ax.text(j, i, f"+{grid[i, j]:.1f}\n{names[i][j]}", ha="center", va="center",
                        fontsize=7.5, color=color)
        ax.set_xticks(range(len(caps)), [f"{100 * c / items:.3g}%" for c in caps])
        ax.set_yticks(range(len(values)), [str(v) for v in values])
        ax.set_xlabel("cache capacity (% of items)")
        ax.set_ylabel(param or "value")
        opt_name = tables[values[0]][0]  # type: ignore[index]
        ax.set_title(f"{pattern}: {opt_name} hit rate minus the best online policy's\n"
                     f"(percentage points; cell: gain and the best online policy)", fontsize=10)
        fig.colorbar(im, ax=ax, label="gain (points)")
        path = os.path.join(out_dir, f"gain_{_slug(pattern)}.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths
