"""``opt4torch demo``: the main job on a generated default. Seeded samplers
captured and planned, OPT against LRU and FIFO; then a small CNN trained end
to end against no cache, a per-worker LRU, OPT, OPT + prefetch and in
memory (lab/e2e.py).

May touch: the --out directory (plans, tables, plots, generated JPEGs),
torch, the lab's simulator and end-to-end comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .. import __version__
from ..planning.plan import plan as build_plan
from .common import UsageError, have_matplotlib, parse_capacities


def _cmd_demo(args: argparse.Namespace) -> int:
    import torch
    from torch.utils.data import RandomSampler

    from ..planning.capture import capture
    from ..lab.sim import simulate

    n, epochs, seed = args.items, args.epochs, args.seed
    if args.repeats < 1:  # before any work
        raise UsageError(f"--repeats must be at least 1, got {args.repeats}")
    os.makedirs(args.out, exist_ok=True)
    print(f"opt4torch {__version__} demo: a dataset of {n:,} items, {epochs} epochs, seed {seed}\n")
    capacities = parse_capacities(args.capacities, n)
    setups = [
        ("shuffle", "RandomSampler(shuffle): a new permutation every epoch",
         RandomSampler(range(n), generator=torch.Generator().manual_seed(seed))),
        ("replacement", "RandomSampler(replacement=True): independent uniform draws",
         RandomSampler(range(n), replacement=True, num_samples=n,
                       generator=torch.Generator().manual_seed(seed))),
    ]
    for name, title, sampler in setups:
        t0 = time.perf_counter()
        seq = capture(sampler, epochs)
        t_capture = time.perf_counter() - t0
        print(f"{title}")
        print(f"  captured {seq.size:,} indices in {t_capture * 1e3:.1f} ms")
        header = f"  {'cache':>12}  {'OPT':>8}  {'OPT-nobypass':>12}  {'LRU':>8}  {'FIFO':>8}  {'plan time':>10}"
        print(header)
        for c in capacities:
            t0 = time.perf_counter()
            p = build_plan(seq, c, items=n)
            t_plan = time.perf_counter() - t0
            rates = [p.hit_rate] + [simulate(pol, seq, c, items=n)["hits"] / seq.size
                                    for pol in ("opt-nobypass", "lru", "fifo")]
            print(f"  {c:>7,} ({c / n:>4.0%})  {rates[0]:>8.2%}  {rates[1]:>12.2%}  {rates[2]:>8.2%}  "
                  f"{rates[3]:>8.2%}  {t_plan * 1e3:>7.1f} ms")
            if c == capacities[len(capacities) // 2]:
                path = os.path.join(args.out, f"demo-{name}.opt4")
                p.save(path, description=json.dumps({"demo": name, "items": n, "epochs": epochs,
                                                     "seed": seed}))
        print()
    print(f"plans written to {os.path.abspath(args.out)}/ (see: opt4torch inspect {args.out}/demo-shuffle.opt4)")
    print("Hit rates are of all accesses, compulsory first accesses included.\n")
    if args.loader_items > 0:
        return _demo_loader(args)
    return 0


#: The demo's end-to-end configurations (bench/e2e.py runs all of them).
DEMO_CONFIGS = ("no cache", "LRU (cachetools)", "OPT", "OPT + prefetch", "in memory")


def _demo_loader(args: argparse.Namespace) -> int:
    """The product end to end, small: generated JPEGs in a record file on an
    emulated slow store, a CNN trained for a few epochs with two workers,
    against no cache, a per-worker LRU and everything in memory, each
    ``--repeats`` times. Returns the exit status: 1 when OPT read other bytes
    than its plan said (a fault), 0 otherwise; timing targets that are not
    met do not fail the demo (they depend on the machine and its load)."""
    from ..lab import e2e

    configs = list(DEMO_CONFIGS)
    try:
        import cachetools  # noqa: F401
    except ImportError:
        configs.remove("LRU (cachetools)")
        print("(cachetools is not installed: the per-worker LRU row is left out; pip install cachetools)")
    setup = e2e.Setup(images=args.loader_items, epochs=3, repeats=args.repeats, latency=args.latency,
                      seed=args.seed, configs=configs, samplers=["shuffle"])
    runs = (f"Each configuration runs {setup.repeats} times, interleaved: the table gives medians and ranges, "
            f"and a target gets a verdict only when at least {e2e.MIN_RUNS} plausible runs agree."
            if setup.repeats > 1 else "One run each: single numbers, and no verdicts on timings.")
    print(f"End to end: a small CNN trained {setup.epochs} epochs on {setup.images:,} generated JPEGs, "
          f"{setup.workers} workers, cache of {setup.capacity:.0%}; every configuration reads one record file "
          f"with O_DIRECT and {setup.latency * 1e3:g} ms + size/{setup.bandwidth / 1e6:g} MB/s per read "
          f"(an emulated remote store). {runs}")
    t0 = time.perf_counter()
    path = e2e.prepare_data(os.path.join(args.out, "e2e-data"), setup, log=lambda m: print("  " + m))
    result = e2e.run(setup, path, log=lambda m: print(m, flush=True))
    result["command"] = ["opt4torch", "demo"]
    print()
    print(e2e.markdown(result))
    pf = result["runs"]["shuffle"].get("OPT + prefetch", [None])[0]
    if pf is not None:
        print(f"\nOPT + prefetch, exactly as planned (its first run):\n"
              f"  samples served             {pf['samples']:,}\n"
              f"  hits observed              {pf['hits']:,}\n"
              f"  hits the plan promised     {pf['plan_hits']:,}   fallbacks {pf['fallbacks']}, "
              f"timeouts {pf['timeouts']}\n"
              f"  bytes read from storage    {pf['storage_bytes']:,} (the plan's misses: {pf['plan_miss_bytes']:,})")
    written = e2e.write_outputs(result, args.out, plots=have_matplotlib())
    print(f"\nTable and plots written to {os.path.abspath(args.out)}/: "
          + ", ".join(os.path.basename(p) for p in written)
          + f" ({time.perf_counter() - t0:.0f} s). The full comparison (cachetools LFU/FIFO/RR, a shared "
          "LRU, a static cache; sampling with replacement and class-balanced): make bench-e2e")
    summary = result["summary"]["shuffle"]
    if not all(summary[c]["exact"] for c in e2e.OPT_CONFIGS if c in summary):
        print("\nerror: OPT read other bytes, or served other hits, than its plan said: a fault; please "
              f"report it, with {os.path.join(args.out, 'e2e.json')}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="capture, plan and compare with LRU/FIFO on a generated default, "
                                    "then train a small CNN end to end against no cache, LRU and in memory",
                       description="The whole job on generated data, in a few minutes. First, seeded samplers "
                                   "(epoch shuffle, and uniform draws with replacement) are captured and "
                                   "planned, and OPT's hit rate is compared with LRU's and FIFO's at several "
                                   "cache sizes; the plans go to --out. Then a small CNN trains on generated "
                                   "JPEGs read from an emulated slow store with no cache, a per-worker LRU "
                                   "(cachetools), OPT, OPT + prefetch and everything in memory, each "
                                   "configuration --repeats times; a table, plots and the figures against "
                                   "the targets go to --out. A target gets a verdict only when enough "
                                   "plausible runs agree. The exit status is 1 when OPT read other bytes "
                                   "than its plan said; slow timings alone do not fail it.")
    p.add_argument("--items", type=int, default=50_000, help="dataset size (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=5, help="epochs (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the samplers, the generated images and the model (default: %(default)s)")
    p.add_argument("--capacities", default="10%,25%,50%,75%", help="cache sizes (default: %(default)s)")
    p.add_argument("--out", default="out",
                   help="directory for the plans, the tables and the plots (default: %(default)s)")
    p.add_argument("--loader-items", type=int, default=1000,
                   help="JPEGs in the end-to-end training part (0 skips it; default: %(default)s)")
    p.add_argument("--latency", type=float, default=0.005,
                   help="seconds of emulated latency per read in the training part (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of each configuration in the training part, interleaved; medians and ranges "
                        "are reported, and verdicts need at least 3 (default: %(default)s)")
    p.set_defaults(func=_cmd_demo)
