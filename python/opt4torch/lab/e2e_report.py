"""The end-to-end comparison's results: each configuration's summary over
its repeats, the targets judged (a verdict only where every repeat agrees
and the machine held still), the markdown table and the plots.
May touch: the output folder it is given.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .e2e_setup import ALL_CONFIGS, CACHETOOLS, PEERS, Setup

__all__ = ["summarize", "MIN_RUNS", "PLAUSIBLE_MARGIN", "Target", "Judged", "judge", "implausible_runs",
           "judge_targets", "targets", "markdown", "plot", "write_outputs"]


def summarize(rs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in rs))

    def med_or_none(key: str) -> float | None:
        vals = [r[key] for r in rs if r.get(key) is not None]
        return float(statistics.median(vals)) if vals else None

    x = rs[0]
    epochs = len(x["epoch_s"])
    out = {"seconds": med("seconds"), "epoch_s": med("seconds") / epochs,
           "epoch_s_min": min(r["seconds"] for r in rs) / epochs, "epoch_s_max": max(r["seconds"] for r in rs) / epochs,
           "samples": x["samples"], "hit_rate": med("hit_rate"), "storage_bytes": med("storage_bytes"),
           "storage_reads": med("storage_reads"),
           "stall_rate": med_or_none("stall_rate"), "cpu_s": med("cpu_s"),
           "peak_memory_bytes": med("peak_memory_bytes"), "final_loss": med("final_loss"), "repeats": len(rs)}
    if x.get("hit_rate_note"):
        out["hit_rate_note"] = x["hit_rate_note"]
    for key in ("store_requests", "store_get_bytes", "server_cpu_s"):
        if x.get(key) is not None:
            out[key] = med(key)
    if "wrong_samples" in x:
        out["wrong_samples"] = max(r["wrong_samples"] for r in rs)
        out["undecodable_samples"] = max(r["undecodable_samples"] for r in rs)
    out["samples_per_s"] = out["samples"] / out["seconds"]
    if "plan_miss_bytes" in x:
        out["plan_miss_bytes"] = x["plan_miss_bytes"]
        out["plan_hits"] = x["plan_hits"]
        out["exact"] = all(r["storage_bytes"] == r["plan_miss_bytes"] and r["hits"] == r["plan_hits"] for r in rs)
    return out


def px(s: Setup) -> str:
    if s.image_size_max > s.image_size:
        return f"square, {s.image_size} to {s.image_size_max} px a side"
    return f"{s.image_size}x{s.image_size}"


def _mb(b: float) -> str:
    return f"{b / 1e6:,.1f} MB"


#: Fewer plausible runs of a configuration than this give figures (medians
#: and ranges) but no verdict: one run on a shared machine can land anywhere.
MIN_RUNS = 3
#: A configuration timed faster than everything in memory by more than this
#: share did not measure what it seems to (each configuration does at least
#: the in-memory one's work), so that run is left out of every verdict.
PLAUSIBLE_MARGIN = 0.10


class Target(NamedTuple):
    """One target: what it asks, the figure measured (median and range),
    and ``met``: True or False when every plausible run agrees (and there
    are at least :data:`MIN_RUNS`), None otherwise, with ``why``."""

    what: str
    measured: str
    met: bool | None
    why: str = ""


@dataclass(frozen=True)
class Judged:
    """A figure over the runs (one value each) against a goal."""

    median: float
    low: float
    high: float
    runs: int
    met: bool | None
    why: str = ""


def judge(values: list[float], goal: float, *, at_least: bool, min_runs: int = MIN_RUNS) -> Judged:
    """Met when every run meets ``goal`` (``value >= goal`` if ``at_least``,
    else ``value <= goal``), not met when none does; otherwise, or with
    fewer than ``min_runs`` runs, no verdict (``met`` None) and the reason."""
    if not values:
        return Judged(math.nan, math.nan, math.nan, 0, None, "no plausible run")
    med, lo, hi, n = float(statistics.median(values)), min(values), max(values), len(values)
    if n < min_runs:
        return Judged(med, lo, hi, n, None, f"{n} plausible run{'s' if n > 1 else ''}, too few "
                                            f"({min_runs} needed)")
    ok = [v >= goal if at_least else v <= goal for v in values]
    if all(ok):
        return Judged(med, lo, hi, n, True)
    if not any(ok):
        return Judged(med, lo, hi, n, False)
    missed = n - sum(ok)
    return Judged(med, lo, hi, n, None,
                  f"{sum(ok)} of {n} runs meet it, {missed} {'does' if missed == 1 else 'do'} not")


def _timed(runs: dict[str, list[dict[str, Any]]]) -> tuple[list[str], int]:
    """The configurations that ran, and how many runs each has in common."""
    timed = [c for c in runs if runs[c]]
    return timed, min((len(runs[c]) for c in timed), default=0)


def implausible_runs(runs: dict[str, list[dict[str, Any]]]) -> dict[int, str]:
    """Run index -> why, for the runs (repeats) in which a configuration was
    timed faster than everything in memory by more than
    :data:`PLAUSIBLE_MARGIN`: every configuration does at least the in-memory
    one's work, so such a run measured the machine's load, not the cache."""
    timed, n = _timed(runs)
    out: dict[int, str] = {}
    if "in memory" not in timed:
        return out
    for i in range(n):
        mem = runs["in memory"][i]["seconds"]
        fast = [(c, runs[c][i]["seconds"] / mem - 1) for c in timed
                if c != "in memory" and runs[c][i]["seconds"] < (1 - PLAUSIBLE_MARGIN) * mem]
        if fast:
            out[i] = ", ".join(f"{c} {d:+.1%}" for c, d in fast) + " against everything in memory"
    return out


def judge_targets(runs: dict[str, list[dict[str, Any]]], min_runs: int = MIN_RUNS) -> list[Target]:
    """The targets of OPT + prefetch on one sampler's runs (configuration ->
    one result per repeat, in repeat order: the configurations ran
    interleaved, so run i of each was measured side by side). Each timing
    figure is computed per run; ``measured`` gives its median and range over
    all runs, the verdict (:func:`judge`) considers the plausible runs only
    (:func:`implausible_runs`)."""
    rows: list[Target] = []
    if "OPT + prefetch" not in runs:
        return rows
    timed, n = _timed(runs)
    bad = implausible_runs(runs)

    def secs(c: str) -> list[float]:
        return [float(runs[c][i]["seconds"]) for i in range(n)]

    def times(x: float) -> str:
        return f"{x:.2f}x"

    def share(x: float) -> str:
        return f"{x:+.1%}"

    def target(what: str, values: list[float], goal: float, at_least: bool, show: Callable[[float], str]) -> Target:
        every = judge(values, goal, at_least=at_least, min_runs=1)
        if every.runs == 1:
            measured = f"{show(every.median)} (one run)"
        else:
            measured = f"{show(every.median)} (median of {every.runs} runs; {show(every.low)} to {show(every.high)})"
        j = judge([v for i, v in enumerate(values) if i not in bad], goal, at_least=at_least, min_runs=min_runs)
        why = j.why
        if bad and j.met is None:
            why += f"; {len(bad)} of {n} runs implausible, left out"
        return Target(what, measured, j.met, why)

    pf = secs("OPT + prefetch")
    if "no cache" in timed:
        rows.append(target("OPT + prefetch at least 3x faster than no cache",
                           [a / b for a, b in zip(secs("no cache"), pf)], 3.0, True, times))
    ct = [c for c in CACHETOOLS if c in timed]
    if ct:
        best = min(ct, key=lambda c: statistics.median(secs(c)))
        rows.append(target(f"at least 1.5x faster than the best cachetools policy ({best})",
                           [a / b for a, b in zip(secs(best), pf)], 1.5, True, times))
    sharded = [c for c in ("Streaming", "Streaming (tuned)", "LitData") if c in timed]
    if sharded:
        best = min(sharded, key=lambda c: statistics.median(secs(c)))
        rows.append(target(f"at least 1.5x faster than the best of Streaming and LitData ({best})",
                           [a / b for a, b in zip(secs(best), pf)], 1.5, True, times))
    if "in memory" in timed:
        rows.append(target("within 10 % of everything in memory",
                           [a / b - 1 for a, b in zip(pf, secs("in memory"))], 0.10, False, share))
    exact = [r["storage_bytes"] == r["plan_miss_bytes"] and r["hits"] == r["plan_hits"]
             for c in ("OPT", "OPT + prefetch") for r in runs.get(c, [])]
    rows.append(Target("bytes read equal the plan's predicted miss bytes (and hits the plan's)",
                       "equal in every run" if all(exact) else "NOT equal", all(exact)))
    return rows


def targets(result: dict[str, Any], sampler: str = "shuffle") -> list[Target]:
    """The issue's targets on one sampler's runs (see :func:`judge_targets`)."""
    return judge_targets(result["runs"].get(sampler, {}))


def _busy(result: dict[str, Any]) -> str:
    """A sentence when other work took at least the machine's cores during
    the runs, else "". The load average counts this run's own processes
    too; their share is about its CPU time over its wall time."""
    def other(r: dict[str, Any]) -> float:
        return float(r["load_average"]) - float(r["cpu_s"]) / max(1e-9, float(r["seconds"]))

    runs = [r for rows in result["runs"].values() for rs in rows.values() for r in rs if "load_average" in r]
    if not runs:
        return ""
    top = max(runs, key=other)
    if other(top) < top["cores"]:
        return ""
    return (f"The machine was busy during these runs (load average up to {top['load_average']:.1f} on "
            f"{top['cores']} cores, about {other(top):.1f} of it other work than this run's): the runs' times "
            "vary with it.")


def markdown(result: dict[str, Any]) -> str:
    s = Setup(**result["setup"])
    moto = result["setup"].get("moto_gets", True)  # a run before the server's object copies: moto answered
    summ = result["summary"]
    lat = next(iter(next(iter(result["runs"].values())).values()))[0]
    s3 = s.store == "s3"
    if s3:
        storage = (f"Storage: an S3-compatible server on the loopback address (bench/s3server.py: moto), "
                   f"which adds {s.latency * 1e3:g} ms to every request and bytes / {s.bandwidth / 1e6:g} MB/s "
                   "to every response" + (f", whose bodies share one link of {s.link / 1e6:g} MB/s" if s.link else
                                         " (no shared link)")
                   + ("; every GET answered by moto" if moto else "; GETs answered from a copy of each object")
                   + "; images as objects in the ImageFolder layout "
                   f"({lat['read_note']}), the peers' shards as objects read by their own clients. ")
    else:
        storage = (f"Storage: one record file read with "
                   f"{'O_DIRECT' if s.direct else 'buffered reads'} ({lat['read_note']}) and "
                   f"{s.latency * 1e3:g} ms + mean record / {s.bandwidth / 1e6:g} MB/s = "
                   f"{lat['latency_s'] * 1e3:.2f} ms per read, emulated in C for every reader. ")
    if s.train_cpus or s.server_cpus:
        storage += (f"The training process, its workers and helpers ran on CPU {s.train_cpus or 'all'}"
                    + (f", the S3 server on CPU {s.server_cpus} (its CPU off the training cores, as a store "
                       "runs on machines of its own). " if s.server_cpus else ". "))
    lines = [
        f"{s.images:,} JPEGs ({px(s)}, {s.classes} classes), {s.epochs} epochs, batch {s.batch}, "
        f"{s.workers} workers, capacity {s.capacity:.0%} ({s.capacity_items:,} items), a small CNN on "
        f"{s.crop}x{s.crop} random crops (CPU, 1 thread). " + storage
        + f"OPT + prefetch: {s.threads} C threads. "
        + (f"Each configuration ran {s.repeats} times, interleaved: medians, and the range of the runs "
           "where it matters." if s.repeats > 1 else "One run each: single numbers, not medians."),
        "",
    ]
    for sampler, rows in summ.items():
        base = rows.get("no cache", {}).get("seconds")
        mem = rows.get("in memory", {}).get("seconds")
        lines += [f"**{sampler}**" + {"shuffle": " (epoch shuffle: RandomSampler)",
                                      "replacement": " (RandomSampler(replacement=True))",
                                      "balanced": " (class-balanced WeightedRandomSampler)"}.get(sampler, ""), "",
                  f"| configuration | time per epoch (mean of {s.epochs}"
                  + (f"; median of {s.repeats} runs, and their range" if s.repeats > 1 else "")
                  + ") | samples/s | vs no cache | vs in memory "
                  f"| hit rate ({s.epochs} epochs) | read from storage ({s.epochs} epochs) | requests to storage "
                  f"| stall rate | CPU time ({s.epochs} epochs) | peak memory |"
                  + (" all requests to the server | the server's CPU |" if s3 else ""),
                  "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if s3 else "")]
        for c, v in rows.items():
            read = _mb(v["storage_bytes"])
            if "plan_miss_bytes" in v:
                read += " (plan: " + ("equal" if v.get("exact") else _mb(v["plan_miss_bytes"])) + ")"
            spread = (f" ({v['epoch_s_min']:.2f} to {v['epoch_s_max']:.2f})"
                      if v.get("repeats", 1) > 1 and "epoch_s_min" in v else "")
            lines.append(
                f"| {c} | {v['epoch_s']:.2f} s{spread} | {v['samples_per_s']:,.0f} | "
                f"{format(base / v['seconds'], '.2f') + 'x' if base else '–'} | "
                f"{format(v['seconds'] / mem, '.2f') + 'x' if mem else '–'} | {v['hit_rate']:.1%}"
                f"{' (of bytes)' if v.get('hit_rate_note') == 'bytes' else ''} | {read} | "
                f"{'–' if v.get('storage_reads') is None else format(int(v['storage_reads']), ',')} | "
                f"{'–' if v.get('stall_rate') is None else format(v['stall_rate'], '.1%')} | {v['cpu_s']:.1f} s | "
                f"{v['peak_memory_bytes'] / 2**20:,.0f} MiB |"
                + (f" {int(v.get('store_requests', 0)):,} | {v.get('server_cpu_s') or 0:.1f} s |" if s3 else ""))
        lines.append("")
    tg = targets(result)
    if tg:
        lines += [(f"Targets (epoch shuffle; each figure computed per run from configurations measured side by "
                   f"side, then its median and range; a verdict only when at least {MIN_RUNS} plausible runs "
                   "all agree):"), ""]
        bad = implausible_runs(result["runs"].get("shuffle", {}))
        if bad:
            lines += ["Implausible, so left out of the verdicts: "
                      + "; ".join(f"run {i + 1} ({why})" for i, why in sorted(bad.items()))
                      + ". No configuration can be faster than everything in memory: the machine's load "
                      "changed during the runs.", ""]
        busy = _busy(result)
        if busy:
            lines += [busy, ""]
        for t in tg:
            verdict = "met" if t.met else "NOT met" if t.met is False else "no verdict"
            lines.append(f"- {t.what}: {t.measured} ({verdict}{': ' + t.why if t.why else ''})")
        lines.append("")
    for c, why in result.get("skipped", {}).items():
        lines.append(f"- {c} was not run: {why}.")
    for sampler, cs in result.get("failed", {}).items():
        for c, why in cs.items():
            lines.append(f"- {c} failed under {sampler}: {why}")
    for sampler, rows in summ.items():
        for c, v in rows.items():
            if v.get("wrong_samples"):
                lines.append(f"- {c} returned {v['wrong_samples']:,} wrong sample(s) under {sampler} (of "
                             f"{v['samples']:,}: bytes or label differ from the record's), "
                             f"{v['undecodable_samples']:,} of them not even a JPEG; those were read again "
                             "from storage so that the run could finish (a user's run stops at the first).")
    prep = result.get("prepared", {})
    if any("what" in p for p in prep.values()):
        lines += ["", "Prepared before training, not in the times above:", ""]
        for c, p in prep.items():
            if "what" not in p:
                continue
            extra = f", {p['shards']} shards, {p['bytes'] / 1e6:,.1f} MB" if "shards" in p else ""
            lines.append(f"- {c}: {p['what']}: {p['seconds']:.1f} s{extra}")
    if s3 and any(c in PEERS for rows in summ.values() for c in rows):
        lines += ["", "Peers: Streaming and LitData read their shards from the same S3 server with their own "
                  "S3 clients, paying its latency and bandwidth per request; their cache limit is the same byte "
                  "budget (capacity x the images' bytes), kept as shard files on local disk; they shuffle with "
                  "their own algorithms; their hit rate is the share of the accessed bytes not fetched, and a "
                  "stall rate is not defined for them. OPT4TorchDataSet v1.1.0 and the compat layer run their "
                  "users' code over opt4torch.S3ImageFolder. Requests and bytes are the server's counts (GETs); "
                  "'all requests' adds LIST pages and HEADs. docs/e2e.md says what the server models.", ""]
    elif any(c in PEERS for rows in summ.values() for c in rows):
        lines += ["", "Peers: Streaming and LitData fetch whole shards from a local directory as their remote, "
                  f"each fetch paying {s.latency * 1e3:g} ms + bytes / {s.bandwidth / 1e6:g} MB/s (one request); "
                  "their cache limit is the same byte budget (capacity x the records' bytes), kept as shard "
                  "files on local disk; they shuffle with their own algorithms, so they see other orders than "
                  "the sampler's; their hit rate is the share of the accessed bytes not fetched, and a stall "
                  "rate is not defined for them. OPT4TorchDataSet v1.1.0 and the compat layer run the same "
                  "user code (its README's steps: a plan for the sampler's sequence, get_opt_cache, the loading "
                  "function decorated) over the record file; their hit rate and stall rate count the accesses "
                  "that read storage. docs/e2e.md says what each pays and what not.", ""]
    lines += [
        "Notes: per-worker cachetools caches hold C items in each of the workers (W x C in all); the shared "
        "LRU lives in a multiprocessing manager process (each lookup a round trip); the static cache keeps "
        "the first C distinct items read, shared by the workers; the in-memory configuration reads the "
        "records once before timing. Hit rate counts every access, first reads included. The stall rate "
        "is the share of accesses that waited for storage (a synchronous miss, or a prefetch still in "
        "flight). CPU time: the training process, its workers and helpers; peak memory: their summed PSS, "
        "sampled every 0.2 s.",
    ]
    return "\n".join(lines)


def plot(result: dict[str, Any], out_dir: str, prefix: str = "e2e") -> list[str]:
    """Epoch time per configuration and sampler, and hit rate with bytes
    read (two rows, one unit each); PNGs in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = result["summary"]
    samplers = list(summ)
    # Every configuration that ran under any sampler (the sharded peers run
    # under epoch shuffle only): a missing one is drawn as "not run".
    failed = result.get("failed", {})
    order = [c for c in ALL_CONFIGS if any(c in rows for rows in summ.values())
             or any(c in f for f in failed.values())]
    configs = order + [c for rows in summ.values() for c in rows if c not in order]
    configs = list(dict.fromkeys(configs))
    epochs = result["setup"].get("epochs", 1)
    median = ", median" if result["setup"].get("repeats", 1) > 1 else ""
    ours = ("OPT", "OPT + prefetch", "OPT + prefetch (s3torchconnector)", "OPT4TorchDataSet API (compat)")
    colour = {c: ("#c0392b" if c in ours else "#27ae60" if c in PEERS
                  else "#7f8c8d" if c in ("no cache", "in memory") else "#2980b9") for c in configs}

    def value(s: str, c: str, key: str, scale: float = 1.0) -> float:
        v = summ[s].get(c, {}).get(key)
        return float("nan") if v is None else v * scale
    # Wide enough for the titles with a single sampler (the demo's case).
    width = max(7.0, 4.2 * len(samplers) + 1)
    height = 0.42 * len(configs) + 1.6

    def bars(ax: Any, vals: list[float], label: Callable[[float], str], xmax: float, sampler: str,
             ranges: list[tuple[float, float] | None] | None = None) -> None:
        # A bar past the axis (Streaming's thrashing) is cut at its end,
        # with its value written on it. ``ranges``: (low, high) per bar, drawn
        # as whiskers (cut at the axis too); the values are then written at
        # the bar's base, or past the whisker, so that no line crosses them.
        ax.barh(range(len(configs)), [0.0 if math.isnan(v) else min(v, xmax) for v in vals],
                color=[colour[c] for c in configs])
        for i, v in enumerate(vals):
            if math.isnan(v):
                ax.text(0, i, " failed" if configs[i] in failed.get(sampler, {}) else " not run", va="center",
                        fontsize=8, color="#7f8c8d")
                continue
            span = ranges[i] if ranges else None
            cut = " (axis cut) " if v > xmax else " "
            if span is not None:
                lo, hi = min(span[0], xmax), min(span[1], xmax)
                ax.errorbar(min(v, xmax), i, xerr=[[min(v, xmax) - lo], [hi - min(v, xmax)]], fmt="none",
                            ecolor="black", elinewidth=0.9, capsize=3, zorder=4)
                if min(v, xmax) > 0.3 * xmax:
                    ax.text(0, i, f" {label(v)}{cut}", va="center", fontsize=8, ha="left", color="white")
                else:
                    ax.text(max(hi, min(v, xmax)), i, f" {label(v)}", va="center", fontsize=8, ha="left")
                continue
            # Inside the bar's end when it is long, past it otherwise.
            inside = min(v, xmax) > 0.7 * xmax
            ax.text(min(v, xmax), i, (f"{label(v)} " + ("(axis cut) " if v > xmax else "")) if inside
                    else f" {label(v)}", va="center", fontsize=8,
                    ha="right" if inside else "left", color="white" if inside else "black")
        ax.set_xlim(0, xmax)

    written = []
    fig, axes = plt.subplots(1, len(samplers), figsize=(width, height), sharey=True, squeeze=False,
                             layout="constrained")
    for ax, s in zip(axes[0], samplers):
        vals = [value(s, c, "epoch_s") for c in configs]
        highs = [h for h in (value(s, c, "epoch_s_max") for c in configs) if not math.isnan(h)]
        xmax = max([np.nanmax(vals) * 1.2] + [1.05 * h for h in highs])
        if "no cache" in summ[s]:  # the axis cut as for the bytes below
            xmax = min(xmax, 2.4 * summ[s]["no cache"]["epoch_s"])
        ranges: list[tuple[float, float] | None] | None = None
        if median:  # the range of the runs, as whiskers
            ranges = [(summ[s][c]["epoch_s_min"], summ[s][c]["epoch_s_max"])
                      if "epoch_s_min" in summ[s].get(c, {}) else None for c in configs]
        bars(ax, vals, lambda v: f"{v:.1f} s", xmax, s, ranges)
        if "in memory" in summ[s]:
            ax.axvline(summ[s]["in memory"]["epoch_s"], color="k", ls="--", lw=0.8)
        ax.set_title(s)
        ax.set_xlabel(f"time per epoch, s (mean of {epochs} epochs{median}"
                      + (f";\nwhiskers: the range of {result['setup']['repeats']} runs)" if median else ")"))
    axes[0][0].invert_yaxis()  # shared by all panels: the first configuration on top
    axes[0][0].set_yticks(range(len(configs)), configs)
    fig.suptitle("Time per epoch (lower is better; dashed line: in memory)")
    p = os.path.join(out_dir, f"{prefix}-epoch-time.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    fig, axes = plt.subplots(2, len(samplers), figsize=(width, 2 * height), sharey=True, squeeze=False,
                             layout="constrained")
    mb_max = max(v["storage_bytes"] for rows in summ.values() for v in rows.values()) / 1e6
    # The axis ends at twice what no cache reads, when something reads more
    # (a thrashing cache would flatten every other bar).
    nocache = [rows["no cache"]["storage_bytes"] / 1e6 for rows in summ.values() if "no cache" in rows]
    if nocache and mb_max > 2 * max(nocache):
        mb_max = 2 * max(nocache)
    for k, s in enumerate(samplers):
        rates = [value(s, c, "hit_rate", 100) for c in configs]
        bars(axes[0][k], rates, lambda v: f"{v:.0f} %", 100, s)
        axes[0][k].set_title(s)
        by_bytes = any(v.get("hit_rate_note") == "bytes" for v in summ[s].values())
        axes[0][k].set_xlabel(f"hit rate, % of all accesses ({epochs} epochs)"
                              + ("\nStreaming, LitData: % of the bytes read" if by_bytes else ""))
        mbs = [value(s, c, "storage_bytes", 1e-6) for c in configs]
        bars(axes[1][k], mbs, lambda v: f"{v:.1f} MB", max(mb_max * 1.2, 1e-3), s)
        axes[1][k].set_xlabel(f"read from storage, MB ({epochs} epochs)")
    axes[0][0].invert_yaxis()  # once: every panel shares it
    for row in axes:
        row[0].set_yticks(range(len(configs)), configs)
    fig.suptitle("Hit rate (higher is better) and bytes read from storage (lower is better)")
    p = os.path.join(out_dir, f"{prefix}-hits.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written


def write_outputs(result: dict[str, Any], out_dir: str, machine: dict[str, Any] | None = None,
                  prefix: str = "e2e", plots: bool = True) -> list[str]:
    """``<prefix>.md``, ``<prefix>.json`` and the plots in ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    md = os.path.join(out_dir, f"{prefix}.md")
    with open(md, "w") as f:
        f.write(f"# End to end: `{' '.join(result.get('command', []))}`\n\n" if result.get("command") else "")
        f.write(markdown(result) + "\n")
        if machine:
            f.write("\nMachine: " + ", ".join(f"{k} {v}" for k, v in machine.items()) + "\n")
    written.append(md)
    js = os.path.join(out_dir, f"{prefix}.json")
    with open(js, "w") as f:
        json.dump({**result, "machine": machine}, f, indent=1)
    written.append(js)
    if plots:
        written += plot(result, out_dir, prefix)
    return written
