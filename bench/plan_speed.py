#!/usr/bin/env python3
"""bench/plan_speed: how fast the OPT plan is built, beside its peers.

For two traces of 10 M accesses over 1 M items (epoch shuffle, 10 epochs; and
uniform with replacement) at 50 % capacity, measure in the same run:

  engine      opt4torch.plan(): the full plan (next-use pass, decisions, slots,
              the plan's copy of the ids, its fingerprint), C, one core
  reference   opt4torch.reference.belady(): the pure-Python oracle (heapq)
  libcachesim PyPI libcachesim's Belady.process_trace() on the same trace as an
              oracleGeneral file whose next-access times we precompute for it
              (so its time covers the decisions only, not the next-use pass)

Each measurement runs in its own child process so that its peak RSS is its
own. The engine also reports its own peak allocation (bytes per access).
Reports medians; prints a markdown table and writes bench/results/plan_speed.json.

    python bench/plan_speed.py                 # the full benchmark
    python bench/plan_speed.py --quick         # 1 M accesses, fewer repeats
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
from _machine import machine

HERE = os.path.dirname(os.path.abspath(__file__))


def make_trace(kind: str, items: int, accesses: int, seed: int = 0) -> np.ndarray:
    from opt4torch import traces

    if kind == "shuffle":
        return traces.epoch_shuffle(items, accesses // items, seed=seed)
    return traces.uniform(items, accesses, seed=seed)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024



def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One method on one trace, in this (child) process."""
    seq = make_trace(args.trace, args.items, args.accesses)
    capacity = args.items // 2
    base_rss = rss_mb()
    times: list[float] = []
    out: dict[str, Any] = {}
    if args.worker == "engine":
        import opt4torch
        from opt4torch import _engine

        for _ in range(args.repeats):
            _engine.mem_peak_reset()
            t0 = time.perf_counter()
            p = opt4torch.plan(seq, capacity, items=args.items, progress=False)
            times.append(time.perf_counter() - t0)
            out["engine_peak_bytes_per_access"] = _engine.mem_stats()["peak_bytes"] / seq.size
            out["hits"] = p.hits
            p.close()
            del p
        nb = opt4torch.plan(seq, capacity, bypass=False, items=args.items, progress=False)
        out["hits_nobypass"] = nb.hits
    elif args.worker == "reference":
        from opt4torch import reference

        lst = seq.tolist()
        base_rss = rss_mb()
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            r = reference.belady(lst, capacity, items=args.items)
            times.append(time.perf_counter() - t0)
            out["hits"] = r.hits
            del r
    elif args.worker == "libcachesim":
        import libcachesim as lcs

        from opt4torch.lab.traces import save_oracle_general

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.oracleGeneral")
            save_oracle_general(path, seq)
            base_rss = rss_mb()
            for _ in range(args.repeats):
                reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
                cache = lcs.Belady(capacity)
                t0 = time.perf_counter()
                miss_ratio, _ = cache.process_trace(reader)
                times.append(time.perf_counter() - t0)
                out["hits_nobypass"] = round((1 - miss_ratio) * seq.size)
                del cache, reader
    out["times"] = times
    out["median_s"] = statistics.median(times)
    out["peak_rss_over_base_mb"] = max(0.0, peak_rss_mb() - base_rss)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 M accesses over 100 k items")
    parser.add_argument("--repeats", type=int, default=7, help="engine repeats (default 7)")
    parser.add_argument("--skip", default="", help="comma-separated methods to skip")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    parser.add_argument("--items", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--accesses", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=os.path.join(HERE, "results", "plan_speed.json"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    items, accesses = (100_000, 1_000_000) if args.quick else (1_000_000, 10_000_000)
    repeats = {"engine": args.repeats, "libcachesim": 3, "reference": 1}
    skip = set(filter(None, args.skip.split(",")))
    results: dict[str, dict[str, Any]] = {}
    for trace in ("shuffle", "uniform"):
        results[trace] = {}
        for method in ("engine", "libcachesim", "reference"):
            if method in skip:
                continue
            cmd = [sys.executable, __file__, "--worker", method, "--trace", trace, "--items", str(items),
                   "--accesses", str(accesses), "--repeats", str(repeats[method])]
            print(f"{trace:8} {method:12}", end=" ", flush=True, file=sys.stderr)
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            results[trace][method] = r
            print(f"median {r['median_s']:.3f} s over {len(r['times'])}", file=sys.stderr)
        eng = results[trace].get("engine", {})
        lcs = results[trace].get("libcachesim", {})
        ref = results[trace].get("reference", {})
        if eng and lcs:
            assert eng["hits_nobypass"] == lcs["hits_nobypass"], "libcachesim's Belady disagrees"
        if eng and ref:
            assert eng["hits"] == ref["hits"], "the reference disagrees"

    report = {
        "command": "python bench/plan_speed.py" + (" --quick" if args.quick else ""),
        "machine": machine(),
        "items": items,
        "accesses": accesses,
        "capacity": items // 2,
        "results": results,
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)

    print(f"\n{accesses:,} accesses over {items:,} items, capacity {items // 2:,} (50 %); medians\n")
    print("| trace | method | median | accesses/s | vs engine | peak RSS over base | engine peak | hits |")
    print("|---|---|---|---|---|---|---|---|")
    for trace, by in results.items():
        eng_t = by.get("engine", {}).get("median_s")
        for method, r in by.items():
            rate = accesses / r["median_s"] / 1e6
            ratio = f"{r['median_s'] / eng_t:.1f}x" if eng_t else "-"
            peak = r.get("engine_peak_bytes_per_access")
            hits = r.get("hits", r.get("hits_nobypass"))
            label = "opt" if "hits" in r else "opt-nobypass"
            print(f"| {trace} | {method} (n={len(r['times'])}) | {r['median_s']:.3f} s | {rate:.1f} M | {ratio} | "
                  f"{r['peak_rss_over_base_mb']:.0f} MB | {f'{peak:.2f} B/access' if peak else '-'} | "
                  f"{hits:,} ({label}) |")


if __name__ == "__main__":
    main()
