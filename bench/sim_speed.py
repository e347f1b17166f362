#!/usr/bin/env python3
"""bench/sim_speed: how fast the simulator replays a trace, beside libcachesim.

For traces of 10 M accesses over 1 M items (uniform with replacement; epoch
shuffle, 10 epochs; Zipf(0.8)) at a capacity of 10 % of the items, time in the
same run, on the same trace:

  opt4torch    opt4torch.simulate(policy, seq, capacity): the C engine, one
               core, from an int64 numpy array (the conversion included)
  libcachesim  PyPI libcachesim's <Policy>(capacity).process_trace(reader) on
               the same trace as an oracleGeneral file (its reader parses the
               file as it goes; that is part of its replay). For Belady the
               file carries next-access times that we precompute for it, so
               its time covers the decisions only, while ours includes our
               own next-use pass.

Pairs: lru/LRU, fifo/FIFO, opt-nobypass/Belady (libcachesim's Belady always
admits; our "opt" with bypass is timed beside it), then clock/Clock,
sieve/Sieve, lfu/LFU, arc/ARC, s3fifo/S3FIFO, random/Random. Where the rules
are the same (docs/policies.md) the hit counts must be equal and the run
stops if not: LRU, FIFO, Belady, CLOCK, SIEVE, LFU. ARC (libcachesim keeps p
as a float), S3FIFO (libcachesim departs from the paper) and Random (another
generator) are compared on speed only, their hits shown side by side.

Each measurement runs in its own child process, one at a time, and reports
the median of its repeats. Prints a markdown table and writes
bench/results/sim_speed.json.

    python bench/sim_speed.py            # the full benchmark (about 10 minutes)
    python bench/sim_speed.py --quick    # 1 M accesses over 100 k items
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
from _machine import machine

HERE = os.path.dirname(os.path.abspath(__file__))

#: (ours, libcachesim's, same rule: hits must be equal)
PAIRS = [
    ("lru", "LRU", True),
    ("fifo", "FIFO", True),
    ("opt-nobypass", "Belady", True),
    ("opt", None, False),
    ("clock", "Clock", True),
    ("sieve", "Sieve", True),
    ("lfu", "LFU", True),
    ("arc", "ARC", False),
    ("s3fifo", "S3FIFO", False),
    ("random", "Random", False),
]

TRACES = ("uniform", "shuffle", "zipf")


def make_trace(kind: str, items: int, accesses: int, seed: int = 0) -> np.ndarray:
    from opt4torch import traces

    if kind == "shuffle":
        return traces.epoch_shuffle(items, accesses // items, seed=seed)
    if kind == "zipf":
        return traces.zipf(items, accesses, alpha=0.8, seed=seed)
    return traces.uniform(items, accesses, seed=seed)



def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One policy of one library on one trace, in this (child) process."""
    times: list[float] = []
    out: dict[str, Any] = {}
    if args.worker == "opt4torch":
        import opt4torch

        seq = np.load(args.npy)
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            r = opt4torch.simulate(args.policy, seq, args.capacity, items=args.items)
            times.append(time.perf_counter() - t0)
            out["hits"] = r["hits"]
    else:
        import libcachesim as lcs

        for _ in range(args.repeats):
            reader = lcs.TraceReader(args.oracle, lcs.TraceType.ORACLE_GENERAL_TRACE)
            cache = getattr(lcs, args.policy)(args.capacity)
            t0 = time.perf_counter()
            miss_ratio, _ = cache.process_trace(reader)
            times.append(time.perf_counter() - t0)
            out["hits"] = round((1 - miss_ratio) * args.accesses)
            del cache, reader
    out["times"] = times
    out["median_s"] = statistics.median(times)
    return out


def child(method: str, policy: str, paths: dict[str, str], items: int, accesses: int, capacity: int,
          repeats: int) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", method, "--policy", policy,
           "--npy", paths["npy"], "--oracle", paths["oracle"], "--items", str(items),
           "--accesses", str(accesses), "--capacity", str(capacity), "--repeats", str(repeats)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{method} {policy} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 M accesses over 100 k items")
    parser.add_argument("--repeats", type=int, default=5, help="opt4torch repeats per measurement (default 5)")
    parser.add_argument("--lcs-repeats", type=int, default=3, help="libcachesim repeats (default 3)")
    parser.add_argument("--traces", default=",".join(TRACES), help=f"comma-separated subset of {','.join(TRACES)}")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "sim_speed.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--policy", help=argparse.SUPPRESS)
    parser.add_argument("--npy", help=argparse.SUPPRESS)
    parser.add_argument("--oracle", help=argparse.SUPPRESS)
    parser.add_argument("--items", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--accesses", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--capacity", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    items, accesses = (100_000, 1_000_000) if args.quick else (1_000_000, 10_000_000)
    capacity = items // 10
    kinds = [k for k in args.traces.split(",") if k]
    unknown = set(kinds) - set(TRACES)
    if unknown:
        parser.error(f"unknown trace {', '.join(sorted(unknown))}")
    info = machine()
    results: dict[str, dict[str, Any]] = {}
    mismatches = []
    started = time.perf_counter()
    from opt4torch.lab.traces import save_oracle_general

    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            seq = make_trace(kind, items, accesses)
            paths = {"npy": os.path.join(tmp, f"{kind}.npy"), "oracle": os.path.join(tmp, f"{kind}.oracleGeneral")}
            np.save(paths["npy"], seq)
            save_oracle_general(paths["oracle"], seq)
            del seq
            results[kind] = {}
            for ours, theirs, same in PAIRS:
                row: dict[str, Any] = {"libcachesim_policy": theirs, "same_rule": same}
                print(f"{kind:8} {ours:13}", end=" ", flush=True, file=sys.stderr)
                row["opt4torch"] = child("opt4torch", ours, paths, items, accesses, capacity, args.repeats)
                print(f"{row['opt4torch']['median_s']:.3f} s", end="", flush=True, file=sys.stderr)
                if theirs is not None:
                    row["libcachesim"] = child("libcachesim", theirs, paths, items, accesses, capacity,
                                               args.lcs_repeats)
                    print(f"   {theirs:7} {row['libcachesim']['median_s']:.3f} s", end="", file=sys.stderr)
                    if same and row["opt4torch"]["hits"] != row["libcachesim"]["hits"]:
                        mismatches.append((kind, ours, row["opt4torch"]["hits"], row["libcachesim"]["hits"]))
                print(file=sys.stderr)
                results[kind][ours] = row
    info["load_average_at_end"] = os.getloadavg()

    report = {
        "command": "python bench/sim_speed.py" + (" --quick" if args.quick else ""),
        "machine": info,
        "items": items,
        "accesses": accesses,
        "capacity": capacity,
        "wall_s": round(time.perf_counter() - started, 1),
        "results": results,
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)

    print(f"\n{accesses:,} accesses over {items:,} items, capacity {capacity:,} (10 %); "
          f"medians of {args.repeats} (opt4torch) and {args.lcs_repeats} (libcachesim) runs, "
          f"each in its own process\n")
    print("| trace | policy | opt4torch | libcachesim | libcachesim / opt4torch | hits (opt4torch) | "
          "hits (libcachesim) |")
    print("|---|---|---|---|---|---|---|")
    slower = []
    for kind, by in results.items():
        for ours, row in by.items():
            o = row["opt4torch"]
            lcs = row.get("libcachesim")
            name = f"{ours} / {row['libcachesim_policy']}" if lcs else ours
            if lcs:
                ratio = lcs["median_s"] / o["median_s"]
                if ratio < 1:
                    slower.append((kind, ours, ratio))
                hits_lcs = f"{lcs['hits']:,}" + ("" if row["same_rule"] else " (other rule)")
                print(f"| {kind} | {name} | {o['median_s']:.3f} s | {lcs['median_s']:.3f} s | {ratio:.1f}x | "
                      f"{o['hits']:,} | {hits_lcs} |")
            else:
                print(f"| {kind} | {name} | {o['median_s']:.3f} s | - | - | {o['hits']:,} | - |")
    print(f"\nresults in {os.path.relpath(args.json)}")
    if slower:
        print("slower than libcachesim: " + ", ".join(f"{k} {p} ({r:.2f}x)" for k, p, r in slower))
    if mismatches:
        for kind, policy, a, b in mismatches:
            print(f"HIT COUNTS DIFFER on {kind} {policy}: opt4torch {a:,}, libcachesim {b:,}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
