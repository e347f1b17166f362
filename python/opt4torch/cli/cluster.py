"""``opt4torch cluster``: the simulator's cluster mode (docs/cluster.md), N
nodes reading DistributedSampler shards under no cache, per-node OPT and one
OPT plan over all of them.

May touch: the lab's cluster simulator and its plot, the --out directory
(written through atomic_write).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

from ..io.files import atomic_write
from .common import UsageError, have_matplotlib


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--{what} {text!r}: give integers separated by commas") from None
    if not values or min(values) < 1:
        raise UsageError(f"--{what} {text!r}: give positive integers separated by commas")
    return values


def _cmd_cluster(args: argparse.Namespace) -> int:
    from ..lab.cluster import FIELDS, per_node_capacity, plot_cluster, sweep_cluster

    nodes = _int_list(args.nodes, "nodes")
    for name in ("items", "epochs", "ranks_per_node", "batch_size", "window"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.item_bytes < 0:
        raise UsageError("--item-bytes cannot be negative")
    if not 0 <= args.size_sigma <= 5:
        raise UsageError("--size-sigma must be between 0 and 5")
    if args.size_sigma > 0 and args.item_bytes < 1:
        raise UsageError("--size-sigma needs --item-bytes of at least 1 (the mean size)")
    capacities = [c.strip() for c in args.capacity.split(",") if c.strip()]
    if not capacities:
        raise UsageError("no capacity given")
    for c in capacities:
        try:
            per_node_capacity(c, args.items, max(nodes))
        except ValueError:
            raise UsageError(f"capacity {c!r}: give 25% (of the dataset, per node), agg50% (of the dataset, "
                             "for the whole cluster) or a number of items per node") from None
    if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"--out {args.out!r} is a file; give a directory")
    plots = args.out is not None and not args.no_plots and have_matplotlib()
    rows = sweep_cluster(nodes, capacities, items=args.items, epochs=args.epochs,
                         ranks_per_node=args.ranks_per_node, batch_size=args.batch_size,
                         item_bytes=args.item_bytes, seed=args.seed, window=args.window,
                         size_sigma=args.size_sigma, progress=False if args.quiet else None)
    if args.format == "json":
        json.dump([{k: r[k] for k in FIELDS} for r in rows], sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.format == "csv":
        w = csv.DictWriter(sys.stdout, fieldnames=list(FIELDS), lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    else:
        print(f"{'nodes':>5}  {'cache a node':<34}{'policy':<14}{'storage GB':>11}{'peer GB':>9}"
              f"{'local':>8}{'peer':>8}{'hits':>8}{'in/node/step MB':>17}")
        for r in rows:
            amount = format(r["capacity"], ",") if not r["size_sigma"] else f"{r['capacity'] / 1e9:.2f} GB"
            print(f"{r['nodes']:>5}  {r['config'] + ' (' + amount + ')':<34}{r['policy']:<14}"
                  f"{r['storage_bytes'] / 1e9:>11.2f}{r['peer_bytes'] / 1e9:>9.2f}{r['local_hit_rate']:>8.1%}"
                  f"{r['peer_hit_rate']:>8.1%}{r['hit_rate']:>8.1%}{r['ingress_mean_per_step'] / 1e6:>17.2f}")
    if args.out is not None:
        os.makedirs(args.out, exist_ok=True)
        written = []
        path = os.path.join(args.out, "cluster.csv")
        with atomic_write(path) as f:
            w = csv.DictWriter(f, fieldnames=list(FIELDS), lineterminator="\n", extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        written.append(path)
        path = os.path.join(args.out, "cluster.json")
        with atomic_write(path) as f:
            json.dump([{k: r[k] for k in FIELDS} for r in rows], f, indent=2)
            f.write("\n")
        written.append(path)
        if plots:
            written.append(plot_cluster(rows, os.path.join(args.out, "cluster.png")))
        if not args.quiet:
            print(f"wrote {', '.join(os.path.relpath(p) for p in written)}", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "cluster", help="simulate N nodes reading DistributedSampler shards: no cache, per-node OPT, cluster OPT",
        description="The simulator's cluster mode (docs/cluster.md): for each node count, every rank's "
                    "DistributedSampler order is generated, the ranks interleaved step by step, and the reads "
                    "replayed under no cache, per-node OPT (each node plans its own ranks alone) and one OPT "
                    "plan over the memory of all nodes. Prints storage bytes, peer bytes and hit rates.")
    p.add_argument("--nodes", default="4,16,64", metavar="LIST", help="node counts (default: %(default)s)")
    p.add_argument("--items", type=int, default=131_072, help="dataset size (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=3, help="epochs (default: %(default)s)")
    p.add_argument("--capacity", default="25%,agg50%", metavar="LIST",
                   help="cache per node: 25%% (of the dataset, per node), agg50%% (of the dataset for the whole "
                        "cluster, split over its nodes) or items per node (default: %(default)s)")
    p.add_argument("--ranks-per-node", type=int, default=1, help="ranks on each node (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default: %(default)s)")
    p.add_argument("--item-bytes", type=int, default=110_000,
                   help="bytes per item, for the byte counts (default: %(default)s, an ImageNet JPEG)")
    p.add_argument("--size-sigma", type=float, default=0.0, metavar="S",
                   help="items of lognormal sizes (mean --item-bytes, S the sigma of the log), caches in "
                        "bytes (default: %(default)s: one size, caches in items)")
    p.add_argument("--window", type=int, default=8, metavar="STEPS",
                   help="steps per all_to_all window: the busiest-link column, and late_hit_rate, the "
                        "hits a plan for such windows reads from storage (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="what to print (default: %(default)s)")
    p.add_argument("--out", metavar="DIR", help="also write cluster.csv, cluster.json and cluster.png here")
    p.add_argument("--no-plots", action="store_true", help="with --out, write the tables only")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary on stderr")
    p.set_defaults(func=_cmd_cluster)
