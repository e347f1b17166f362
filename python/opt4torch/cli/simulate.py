"""``opt4torch simulate``: replay a trace, or sweep generated access
patterns, through cache policies at several capacities; a table, a summary
of OPT's gains, and with --out the tables and plots as files.

May touch: the trace file (read), the lab's simulator, generators and plots,
the --out directory (written through atomic_write).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._engine import Opt4Error
from ..io.files import atomic_write
from .common import UsageError, parse_capacities, capacity_percent, text_table, trace_arg


#: Result columns: the first six are the contract of `simulate --trace`; a
#: pattern sweep (and every --out file) adds the rest.
_BASE_FIELDS = ["policy", "capacity", "accesses", "hits", "misses", "hit_rate"]
_SWEEP_FIELDS = _BASE_FIELDS + ["pattern", "param", "value", "items", "seed"]
#: The --out files add the capacity as it was asked for ("1%", "500"), which
#: the plots label their axes with.
_OUT_FIELDS = _SWEEP_FIELDS + ["requested"]
_DEFAULT_SWEEP_CAPACITIES = "1%,2%,5%,10%,20%,50%"
# Sweeps that replay fewer accesses than this in total finish in about a
# second: no progress bar.
_PROGRESS_MIN_ACCESSES = 20_000_000


def _parse_policies(text: str) -> list[str]:
    from ..lab.sim import POLICIES

    policies = [p.strip() for p in text.split(",") if p.strip()]
    if policies == ["all"]:
        return list(POLICIES)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise UsageError(f"unknown policy {', '.join(unknown)}; known: {', '.join(POLICIES)} (or all)")
    if not policies:
        raise UsageError("no policy given")
    return list(dict.fromkeys(policies))


def _parse_value(name: str, text: str, default: Any) -> Any:
    """A --param value, typed like the generator's default."""
    try:
        if isinstance(default, bool):
            low = text.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return low in ("true", "1", "yes")
        if isinstance(default, int):
            return int(text)
        return float(text)
    except ValueError:
        kind = "true or false" if isinstance(default, bool) else type(default).__name__
        raise UsageError(f"--param {name}: {text!r} is not a valid {kind}") from None


def _sweep_plan(args: argparse.Namespace) -> list[tuple[str, str, Any, dict[str, Any]]]:
    """(pattern, swept parameter or "", its value, generator keywords) for
    every trace the sweep replays."""
    from ..lab.traces import GENERATORS

    names = [n.strip() for n in args.pattern.split(",") if n.strip()]
    if names == ["all"]:
        names = list(GENERATORS)
    unknown = [n for n in names if n not in GENERATORS]
    if unknown or not names:
        raise UsageError(f"unknown pattern {', '.join(unknown) or '(none)'}; known: {', '.join(GENERATORS)} (or all)")
    swept: dict[str, list[str]] = {}
    for spec in args.param or []:
        name, sep, values = spec.partition("=")
        name = name.strip()
        if not sep or not name or not values.strip():
            raise UsageError(f"--param {spec!r}: expected NAME=V1,V2,... e.g. alpha=0.6,0.8,1.0")
        if not any(name in GENERATORS[n].params for n in names):
            known = sorted({k for n in names for k in GENERATORS[n].params})
            raise UsageError(f"--param {name}: none of the patterns {', '.join(names)} has it; "
                             f"their parameters: {', '.join(known) or 'none'}")
        swept[name] = [v.strip() for v in values.split(",") if v.strip()]
    plan: list[Any] = []
    for n in names:
        pat = GENERATORS[n]
        mine = [k for k in swept if k in pat.params]
        if len(mine) > 1:
            raise UsageError(f"pattern {n}: sweep one parameter at a time (got {', '.join(mine)})")
        if not mine:
            plan.append((n, "", "", {}))
            continue
        k = mine[0]
        for text in swept[k]:
            value = _parse_value(k, text, pat.params[k])
            plan.append((n, k, value, {k: value}))
    return plan


def _rows_for(seq: np.ndarray, items: int, label: tuple[str, str, Any], policies: Sequence[str],
              capacities: Sequence[tuple[int, str]], seed: int, workers: int | None,
              bar: Any) -> list[dict[str, Any]]:
    """The sweep's rows for one trace; ``capacities`` are (items, as asked for)."""
    from ..lab.sim import sweep

    rows = sweep(seq, policies, [c for c, _ in capacities], items=items, seed=seed, workers=workers,
                 on_done=lambda _job: bar.update(1))
    pattern, param, value = label
    asked = [text for _ in policies for _, text in capacities]  # sweep's rows: policy-major
    for row, requested in zip(rows, asked):
        row.update(pattern=pattern, param=param, value=value, items=items, seed=seed, requested=requested)
    return rows


def _capacities_asked(text: str, items: int) -> list[tuple[int, str]]:
    """(capacity in items, as the user wrote it) for each capacity in ``text``."""
    asked = [part.strip().replace(" ", "") for part in text.split(",") if part.strip()]
    return list(zip(parse_capacities(text, items), asked))


def _write_rows(rows: list[dict[str, Any]], fmt: str, out: Any, fields: Sequence[str] = tuple(_BASE_FIELDS)) -> None:
    if fmt == "json":
        json.dump([{k: row[k] for k in fields} for row in rows], out, indent=2)
        out.write("\n")
    elif fmt == "csv":
        w = csv.DictWriter(out, fieldnames=list(fields), lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({**row, "hit_rate": f"{row['hit_rate']:.6f}"})
    else:
        out.write(_results_table(rows, sweep="pattern" in fields) + "\n")


def _trace_name(row: dict[str, Any]) -> str:
    """A row's trace as a reader names it: "zipf alpha=0.8", or the file's name."""
    return f"{row['pattern']} {row['param']}={row['value']}" if row.get("param") else str(row["pattern"])


def _results_table(rows: list[dict[str, Any]], sweep: bool) -> str:
    """Every row, one line each, columns as wide as their content."""
    from ..lab.plots import capacity_label

    head = (["pattern", "param"] if sweep else []) + ["policy", "capacity", "of items", "hits", "misses", "hit rate"]
    cells = [head]
    for row in rows:
        param = f"{row['param']}={row['value']}" if row.get("param") else ""
        cells.append(([str(row["pattern"]), param] if sweep else [])
                     + [row["policy"], f"{row['capacity']:,}", capacity_label(row), f"{row['hits']:,}",
                        f"{row['misses']:,}", f"{row['hit_rate']:.2%}"])
    return text_table(cells, "lll" if sweep else "l")


def _sweep_summary(rows: list[dict[str, Any]]) -> str | None:
    """What a sweep's reader wants first, per trace and capacity: OPT's hit
    rate, the best online policy and its hit rate, LRU's, and OPT's gains
    over both in percentage points. None when there is nothing to compare
    (fewer than two policies, or neither OPT nor an online policy)."""
    from ..lab.plots import capacity_label
    from ..lab.sim import compare

    traces: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        traces.setdefault(_trace_name(row), []).append(row)
    comparisons = {name: compare(group) for name, group in traces.items()}
    flat = [c for cs in comparisons.values() for c in cs]
    has_opt = any(c.opt is not None for c in flat)
    has_online = any(c.best_online is not None for c in flat)
    has_lru = has_opt and any(c.lru_hit_rate is not None for c in flat)
    if len({r["policy"] for r in rows}) < 2 or not (has_opt and (has_online or has_lru)):
        return None
    opt = next(c.opt for c in flat if c.opt is not None)

    def rate(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    def gain(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:+.1f}"

    head, align = ["trace", "capacity", opt], "lrr"
    if has_online:
        head += ["best online", "its hit rate"]
        align += "lr"
    if has_lru:
        head += ["lru", f"{opt} - lru"]
        align += "rr"
    if has_online:
        head.append(f"{opt} - best online")
    cells = [head]
    for name, cs in comparisons.items():
        label = {int(r["capacity"]): capacity_label(r) for r in traces[name]}
        for k, c in enumerate(cs):
            line = [name if k == 0 else "", f"{c.capacity:,} ({label[c.capacity]})", rate(c.opt_hit_rate)]
            if has_online:
                line += [c.best_online or "-", rate(c.best_online_hit_rate)]
            if has_lru:
                line += [rate(c.lru_hit_rate), gain(c.gain_over_lru)]
            if has_online:
                line.append(gain(c.gain_over_best_online))
            cells.append(line)
    title = (f"Summary: {opt}'s hit rate by trace and capacity" + (", LRU's" if has_lru else "")
             + (", and the best online policy's (the best of those that do not know the future)"
                if has_online else "") + "; gains in percentage points.")
    return title + "\n" + text_table(cells, align)


def _write_outputs(rows: list[dict[str, Any]], out_dir: str, plots: bool) -> list[str]:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out {out_dir!r} is a file; give a directory")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, fmt in (("results.csv", "csv"), ("results.json", "json")):
        path = os.path.join(out_dir, name)
        with atomic_write(path) as f:
            _write_rows(rows, fmt, f, _OUT_FIELDS)
        written.append(path)
    if plots:
        from ..lab.plots import gain_heatmaps, hit_rate_curves

        written += hit_rate_curves(rows, out_dir)
        written += gain_heatmaps(rows, out_dir)
    return written


def _check_args(args: argparse.Namespace) -> tuple[list[str], bool]:
    """The policies, and whether to plot: every flag refused before the
    sweep, not after it."""
    if (args.trace is None) == (args.pattern is None):
        raise UsageError("give either --trace PATH or --pattern NAME[,NAME...]")
    if args.trace is not None and (args.param or args.epochs is not None or args.accesses is not None):
        raise UsageError("--param, --epochs and --accesses shape generated patterns; they do not apply to --trace")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    policies = _parse_policies(args.policy)
    for part in (args.capacity or "").split(","):
        part = part.strip()
        if part.endswith("%"):
            capacity_percent(part)  # refused before the sweep; one that does not parse: parse_capacities says why
    if args.out is not None:
        # Fail before the sweep, not after it.
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise UsageError(f"--out {args.out!r} exists and is not a directory; give a directory")
        existing = args.out
        while not os.path.exists(existing):
            existing = os.path.dirname(os.path.abspath(existing))
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UsageError(f"--out {args.out!r}: cannot write in {existing!r} (permission denied)")
    plots = args.out is not None and not args.no_plots
    if plots:
        from ..lab.plots import PlotDependencyError, require_matplotlib

        try:
            require_matplotlib()  # fail before the sweep, not after it
        except PlotDependencyError as exc:
            raise UsageError(f"{exc} (or add --no-plots)") from None
    return policies, plots


_Traces = list[tuple[tuple[str, str, Any], Callable[[], np.ndarray]]]


def _traces(args: argparse.Namespace) -> tuple[int, list[tuple[int, str]], _Traces, list[int]]:
    """The items, the capacities (in items, as asked for), each trace to
    replay (its label and how to make it) and about how long each is."""
    from ..lab.traces import GENERATORS, generate

    if args.trace is not None:
        seq = trace_arg(args.trace)
        items = args.items
        if items is None:
            if seq.size == 0:
                raise UsageError(f"{args.trace} is empty: give --items to simulate it")
            items = int(seq.max()) + 1
        capacities = _capacities_asked(args.capacity or _DEFAULT_SWEEP_CAPACITIES, items)

        def loaded(trace: np.ndarray = seq) -> np.ndarray:
            return trace

        traces: _Traces = [((os.path.basename(args.trace), "", ""), loaded)]
        lengths = [seq.size]
    else:
        items = args.items if args.items is not None else 10_000
        if items < 1:
            raise UsageError(f"--items must be at least 1, got {items}")
        epochs = args.epochs if args.epochs is not None else 5
        if epochs < 1:
            raise UsageError(f"--epochs must be at least 1, got {epochs}")
        if args.accesses is not None and args.accesses < 1:
            raise UsageError(f"--accesses must be at least 1, got {args.accesses}")
        capacities = _capacities_asked(args.capacity or _DEFAULT_SWEEP_CAPACITIES, items)
        traces, lengths = [], []
        for pattern, param, value, kw in _sweep_plan(args):
            def make(pattern: str = pattern, kw: dict[str, Any] = kw) -> np.ndarray:
                return generate(pattern, items, epochs=epochs, accesses=args.accesses, seed=args.seed, **kw)

            traces.append(((pattern, param, value), make))
            # About the trace's length (repeats aside), to decide on a progress bar.
            lengths.append(args.accesses if args.accesses is not None and GENERATORS[pattern].length == "accesses"
                           else epochs * items)
    return items, capacities, traces, lengths


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .._progress import progress_bar

    policies, plots = _check_args(args)
    items, capacities, traces, lengths = _traces(args)
    n_jobs = len(traces) * len(policies) * len(capacities)
    work = sum(lengths) * len(policies) * len(capacities)
    show = False if args.quiet or work < _PROGRESS_MIN_ACCESSES else None
    rows: list[dict[str, Any]] = []
    with progress_bar(total=n_jobs, desc="simulate", unit="run", show=show) as bar:
        for label, make_trace in traces:
            try:
                seq = make_trace()
            except Opt4Error as exc:
                raise UsageError(f"pattern {label[0]}: {exc}") from None
            rows += _rows_for(seq, items, label, policies, capacities, args.seed, args.workers, bar)

    fields = _BASE_FIELDS if args.trace is not None else _SWEEP_FIELDS
    _write_rows(rows, args.format, sys.stdout, fields)
    if args.format == "table":
        # After the full table, so that it is what a terminal shows at the end.
        summary = _sweep_summary(rows)
        if summary is not None:
            print(f"\n{summary}")
    if args.out is not None:
        written = _write_outputs(rows, args.out, plots)
        if not args.quiet:
            print(f"wrote {', '.join(os.path.relpath(p) for p in written)}", file=sys.stderr)
    return 0


def _simulate_epilog() -> str:
    from ..lab.sim import POLICIES
    from ..lab.traces import GENERATORS

    lines = ["policies:", "  " + ", ".join(POLICIES), "", "patterns (parameters and defaults):"]
    for pat in GENERATORS.values():
        params = ", ".join(f"{k}={v}" for k, v in pat.params.items())
        lines.append(f"  {pat.name:<23}{pat.summary}" + (f" [{params}]" if params else ""))
    lines += ["", "examples:",
              "  opt4torch simulate --trace t.txt --policy lru,opt --capacity 100,500 --format csv",
              "  opt4torch simulate --pattern zipf --param alpha=0.6,0.8,1.0,1.2 --policy all --out out/zipf",
              "  opt4torch simulate --pattern all --items 100000 --epochs 3 --out out/all"]
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate", help="replay traces or generated access patterns through cache policies",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Replay a trace (--trace), or sweep generated access patterns (--pattern), through "
                    "cache policies at several capacities, and print a table of hits, then a summary: per "
                    "trace and capacity, OPT's hit rate, LRU's and the best online policy's, and OPT's gains "
                    "over both in percentage points.",
        epilog=_simulate_epilog())
    src = p.add_argument_group("what to replay (one of)")
    src.add_argument("--trace", metavar="PATH", help="text (one id per line) or .npy trace")
    src.add_argument("--pattern", metavar="NAMES",
                     help="comma-separated generated patterns, or all (see the list below)")
    gen = p.add_argument_group("generated patterns")
    gen.add_argument("--param", action="append", metavar="NAME=V1,V2",
                     help="sweep a pattern parameter over values, e.g. alpha=0.6,0.8,1.0,1.2 "
                          "(repeatable; each applies to the patterns that have it)")
    gen.add_argument("--epochs", type=int, metavar="E",
                     help="epochs (passes over the items) per trace (default: 5)")
    gen.add_argument("--accesses", type=int, metavar="T",
                     help="length of the draw-based patterns (default: epochs x items)")
    p.add_argument("--items", type=int, metavar="N",
                   help="number of items (default: the trace's largest id + 1; 10000 for patterns)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the generators and of randomised policies (default: %(default)s)")
    pol = p.add_argument_group("policies and capacities")
    pol.add_argument("--policy", default="opt,lru,fifo", metavar="LIST",
                     help="comma-separated policies, or all (default: %(default)s)")
    pol.add_argument("--capacity", metavar="LIST",
                     help="comma-separated capacities in items or percentages of items, e.g. 100,500 "
                          f"or 10%%,25%% (default: {_DEFAULT_SWEEP_CAPACITIES.replace('%', '%%')})")
    pol.add_argument("--workers", type=int, metavar="K", help="threads for the sweep (default: one per core)")
    out = p.add_argument_group("output")
    out.add_argument("--format", choices=("table", "csv", "json"), default="table",
                     help="what to print on stdout (default: %(default)s); the CSV header starts "
                          "policy,capacity,accesses,hits,misses,hit_rate")
    out.add_argument("--out", metavar="DIR",
                     help="also write DIR/results.csv, DIR/results.json and PNG plots: hit rate against "
                          "capacity per pattern, and heatmaps of OPT's gain over the best online policy "
                          "for swept parameters (plots need: pip install 'opt4torchdataset[plot]')")
    out.add_argument("--no-plots", action="store_true", help="with --out, write the tables only")
    out.add_argument("--quiet", action="store_true", help="no progress bar or summary on stderr")
    p.set_defaults(func=_cmd_simulate)
