"""The Parquet configuration's summary, targets, table and plot
(:mod:`.e2e_parquet` runs it; ``bench/e2e.py --format parquet``)."""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

from . import e2e
from .e2e import Setup

__all__ = ["summarize", "targets", "markdown", "plot", "write_outputs"]


def summarize(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats (an epoch: the run's seconds over its epochs)."""
    epochs = len(rs[0]["epoch_s"])
    per = [r["seconds"] / epochs for r in rs]
    out: dict[str, Any] = {"label": rs[0]["label"], "reads": rs[0]["reads"], "repeats": len(rs),
                           "epoch_s": statistics.median(per), "epoch_s_min": min(per), "epoch_s_max": max(per),
                           "samples": rs[0]["samples"]}
    for key in ("cpu_s", "peak_memory_bytes", "hit_rate", "hits", "plan_hits", "storage_bytes", "plan_miss_bytes",
                "store_gets", "store_get_bytes", "server_cpu_s", "cache_bytes", "units", "load_average"):
        vals = [r[key] for r in rs if r.get(key) is not None]
        if vals:
            out[key] = statistics.median(vals)
    for key in ("hit_rate_note", "litdata_budget_note"):
        if rs[0].get(key):
            out[key] = rs[0][key]
    if "plan_hits" in rs[0]:
        out["exact"] = all(r["hits"] == r["plan_hits"] and r.get("storage_bytes") == r.get("plan_miss_bytes")
                           for r in rs)
    return out


def implausible(runs: dict[str, list[dict[str, Any]]]) -> dict[int, str]:
    """Repeat index -> why, where a configuration was timed more than 10 %
    faster than everything in memory (:func:`.e2e.implausible_runs`)."""
    return e2e.implausible_runs({"in memory" if c == "memory" else c: rs for c, rs in runs.items()})


def targets(runs: dict[str, list[dict[str, Any]]], store: str) -> list[e2e.Target]:
    """The issue's targets on one sampler's runs, each figure computed per
    repeat from configurations measured side by side (:func:`.e2e.judge`):
    opt4torch.Parquet within 10 % of in memory, at least 1.5x the best peer
    reading the same store, storage bytes equal to the plan's."""
    n = min((len(rs) for rs in runs.values() if rs), default=0)
    bad = implausible(runs)

    def secs(c: str) -> list[float]:
        return [float(runs[c][i]["seconds"]) for i in range(n)]

    def target(what: str, values: list[float], goal: float, at_least: bool, fmt: str) -> e2e.Target:
        every = e2e.judge(values, goal, at_least=at_least, min_runs=1)
        shown = f"{every.median:{fmt}} (median of {every.runs}; {every.low:{fmt}} to {every.high:{fmt}})"
        j = e2e.judge([v for i, v in enumerate(values) if i not in bad], goal, at_least=at_least)
        why = j.why + (f"; {len(bad)} of {n} repeats implausible, left out" if bad and j.met is None else "")
        return e2e.Target(what, shown, j.met, why)

    rows: list[e2e.Target] = []
    for ours in ("parquet-opt", "hf-opt"):
        if ours in runs and "memory" in runs:
            rows.append(target(f"{ours} within 10 % of in memory", [a / b - 1 for a, b in zip(secs(ours),
                        secs("memory"))], 0.10, False, "+.1%"))
    peers = [c for c in ("litdata", "hf-torch") if c in runs and (store != "s3" or c == "litdata")]
    if "parquet-opt" in runs and peers:
        for c in peers:
            rows.append(target(f"parquet-opt at least 1.5x faster than {c}",
                               [a / b for a, b in zip(secs(c), secs("parquet-opt"))], 1.5, True, ".2f"))
    ours = ("parquet-opt", "parquet-opt-pages", "parquet-opt-rowgroups", "parquet-opt-small")
    exact = [r["hits"] == r["plan_hits"] and r.get("storage_bytes") == r.get("plan_miss_bytes")
             for c in ours for r in runs.get(c, [])]
    if exact:
        rows.append(e2e.Target("opt4torch.Parquet's storage bytes and hits equal the plan's",
                               "equal in every run" if all(exact) else "NOT equal in every run", all(exact)))
    return rows


def _mb(v: Any) -> str:
    return "–" if v is None else f"{v / 1e6:,.1f} MB"


def markdown(result: dict[str, Any]) -> str:
    """The table of every configuration, per sampler, and the targets."""
    s = Setup(**result["setup"])
    moto = result["setup"].get("moto_gets", True)  # a run before the server's object copies: moto answered
    s3 = s.store == "s3"
    where = ("the loopback S3 server (bench/s3server.py: "
             f"{s.latency * 1e3:g} ms a request, {s.bandwidth / 1e6:g} MB/s a response"
             + (f", one {s.link / 1e6:g} MB/s link every response shares" if s.link else ", no shared link")
             + ("; every GET answered by moto, which reads the whole object for each range" if moto
                else "; GETs answered from a copy of each object")
             + "); the configurations marked local read the local copy, as references" if s3 else
             "local files through the page cache, no emulated latency")
    lines = [f"{s.images:,} JPEGs ({e2e.px(s)}, {s.classes} classes; the record-file runs' images) as "
             f"{s.parquet_shards} Hub-style Parquet shards (`datasets` `to_parquet`), read from {where}. "
             f"{s.epochs} epochs, batch {s.batch}, {s.workers} workers, a small CNN on {s.crop}x{s.crop} random "
             f"crops (CPU, 1 thread), cache {s.capacity:.0%} of the shards' bytes; {s.repeats} repeat(s), "
             "configurations interleaved, each in a process of its own: medians and the range of the repeats.", ""]
    for sampler, rows in result["summary"].items():
        mem = rows.get("memory", {}).get("epoch_s")
        lines += [f"**{sampler}**", "",
                  "| configuration | reads | epoch (run / epochs, setup included: median; range) | vs in memory "
                  "| hit rate (plan's) | storage "
                  f"bytes, {s.epochs} epochs (plan's) | GETs | CPU (of the server) | peak memory | load |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for v in rows.values():
            hits = "–" if v.get("hit_rate") is None else f"{v['hit_rate']:.1%}"
            if v.get("hit_rate_note") == "bytes":
                hits += " of bytes"
            if v.get("plan_hits") is not None:
                hits += f" ({'=' if v['hits'] == v['plan_hits'] else int(v['plan_hits'])})"
            read = _mb(v.get("storage_bytes"))
            if v.get("plan_miss_bytes") is not None:
                read += " (" + ("=" if v.get("exact") else _mb(v["plan_miss_bytes"])) + ")"
            remote = v["reads"] == "s3"
            server = f" ({v['server_cpu_s']:.1f} s)" if v.get("server_cpu_s") is not None and remote else ""
            gets = int(v["store_gets"]) if v.get("store_gets") is not None and remote else "–"
            lines.append(f"| {v['label']} | {v['reads']} | {v['epoch_s']:.2f} s ({v['epoch_s_min']:.2f} to "
                         f"{v['epoch_s_max']:.2f}) | {format(v['epoch_s'] / mem, '.2f') + 'x' if mem else '–'} | "
                         f"{hits} | {read} | {gets} | {v['cpu_s']:.1f} s{server} | "
                         f"{v['peak_memory_bytes'] / 2**20:,.0f} MiB | "
                         f"{v.get('load_average', float('nan')):.1f} |")
        lines.append("")
        notes = [v["litdata_budget_note"] for v in rows.values() if v.get("litdata_budget_note")]
        lines += [f"LitData: {n}." for n in notes] + ([""] if notes else [])
    tg = targets(result["runs"].get("shuffle", {}), s.store)
    if tg:
        lines += ["Targets (epoch shuffle; per repeat, then median and range; a verdict when every one of at "
                  f"least {e2e.MIN_RUNS} repeats agrees):", ""]
        bad = implausible(result["runs"].get("shuffle", {}))
        if bad:
            lines += ["Implausible, so left out of the verdicts: " + "; ".join(
                f"repeat {i + 1} ({why})" for i, why in sorted(bad.items())) + ": the machine's load changed.", ""]
        for t in tg:
            verdict = "met" if t.met else "NOT met" if t.met is False else "no verdict"
            lines.append(f"- {t.what}: {t.measured} ({verdict}{': ' + t.why if t.why else ''})")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], path: str, sampler: str = "shuffle") -> str:
    """Epoch time per configuration, one panel per result (``{"local files":
    result, "S3, 30 MB/s link": result}``), whiskers the repeats' range,
    the dashed line in memory; a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # In the order the runs list them (the configurations' order), all runs' together.
    labels = {c: v["label"] for r in results.values() for c, v in r["summary"].get(sampler, {}).items()}
    configs = list(labels)
    colour = {c: "#c0392b" if c in ("hf-opt", "parquet-opt", "parquet-opt-pages", "parquet-opt-rowgroups",
                                    "parquet-opt-small")
              else "#27ae60" if c in ("litdata", "hf-torch") else "#7f8c8d" for c in configs}
    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results) + 2.6, 0.5 * len(configs) + 1.8),
                             sharey=True, squeeze=False, layout="constrained")
    for ax, (title, r) in zip(axes[0], results.items()):
        rows = r["summary"].get(sampler, {})
        tops = [rows[c]["epoch_s_max"] for c in configs if c in rows]
        xmax = 1.15 * max(tops) if tops else 1.0
        if "memory" in rows:  # a bar far past in memory's (whole row groups) is cut, its value written
            xmax = min(xmax, 5 * rows["memory"]["epoch_s_max"])
        vals = [min(rows[c]["epoch_s"], xmax) if c in rows else 0.0 for c in configs]
        ax.barh(range(len(configs)), vals, color=[colour[c] for c in configs])
        for i, c in enumerate(configs):
            if c not in rows:
                ax.text(0, i, " not run", va="center", fontsize=8, color="#7f8c8d")
                continue
            v = rows[c]
            lo, mid, hi = (min(v[k], xmax) for k in ("epoch_s_min", "epoch_s", "epoch_s_max"))
            if v["epoch_s_max"] <= xmax:
                ax.errorbar(mid, i, xerr=[[mid - lo], [hi - mid]], fmt="none", ecolor="black", elinewidth=0.9,
                            capsize=3)
            text = f" {v['epoch_s']:.2f} s" + (" (axis cut)" if v["epoch_s"] > xmax else "")
            if v["reads"] == "local" and r["setup"]["store"] == "s3":
                text += " (local copy)"
            ax.text(hi, i, text, va="center", fontsize=8)
        if "memory" in rows:
            ax.axvline(rows["memory"]["epoch_s"], color="k", ls="--", lw=0.8)
        ax.set_xlim(0, xmax * 1.4)
        ax.set_title(title)
        ax.set_xlabel(f"s per epoch (median of {r['setup']['repeats']} repeats; whiskers: their range)")
    axes[0][0].invert_yaxis()
    axes[0][0].set_yticks(range(len(configs)), [labels[c] for c in configs])
    fig.suptitle("Parquet shards, epoch time (lower is better; dashed: in memory)\n"
                 "red: opt4torch, green: the peers, grey: in memory")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def panel_title(result: dict[str, Any]) -> str:
    s = result["setup"]
    if s["store"] != "s3":
        return "local files (page cache)"
    return "S3 server" + (f", one {s['link'] / 1e6:g} MB/s link" if s.get("link") else "")


def write_outputs(result: dict[str, Any], out_dir: str, machine: dict[str, Any] | None = None,
                  prefix: str = "e2e-parquet", plots: bool = True) -> list[str]:
    """``<prefix>.md``, ``<prefix>.json`` and ``<prefix>-epoch-time.png`` in ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    md, js = os.path.join(out_dir, f"{prefix}.md"), os.path.join(out_dir, f"{prefix}.json")
    with open(md, "w") as f:
        f.write(f"# End to end, Parquet: `{' '.join(result.get('command', []))}`\n\n" if result.get("command") else "")
        f.write(markdown(result) + "\n")
        if machine:
            f.write("\nMachine: " + ", ".join(f"{k} {v}" for k, v in machine.items()) + "\n")
    with open(js, "w") as f:
        json.dump({**result, "machine": machine}, f, indent=1)
    written = [md, js]
    if plots:
        written.append(plot({panel_title(result): result}, os.path.join(out_dir, f"{prefix}-epoch-time.png")))
    return written
