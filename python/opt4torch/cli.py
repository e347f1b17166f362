"""The ``opt4torch`` command (and ``opt4torch-precompute``, its earlier name).

    opt4torch precompute   capture a sampler (or read a trace) and write a plan
    opt4torch inspect      print a plan file's header and totals
    opt4torch simulate     replay a trace through policies at several capacities
    opt4torch cleanup      list this user's shared-memory pools, remove stale ones
    opt4torch demo         the whole job end to end on a generated default
"""

from __future__ import annotations

import argparse
import csv
import importlib
import inspect
import io
import json
import os
import secrets
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import __version__
from ._engine import Opt4Error
from ._plan import Plan, load_plan, plan as build_plan, sequence_plan
from .traces import load_trace

__all__ = ["main", "precompute_main"]


class UsageError(Exception):
    """A command line that cannot be run as given; the message says why."""


# ---- shared parsing helpers ----


def _parse_capacities(text: str, items: int | None) -> list[int]:
    """'100,500' or '10%,50%' (of items) -> capacities in items."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if part.endswith("%"):
                if items is None:
                    raise UsageError(f"capacity {part!r} is a percentage but the item count is unknown")
                value = max(1, round(float(part[:-1]) / 100.0 * items))
            else:
                value = int(part)
        except ValueError:
            raise UsageError(f"capacity {part!r} is not an integer or a percentage like 25%") from None
        if value < 1:
            raise UsageError(f"capacity {part!r}: a cache must hold at least one item")
        out.append(value)
    if not out:
        raise UsageError("no capacity given")
    return out


def _load_callable(spec: str) -> Any:
    """'package.module:Name' -> the object."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--sampler {spec!r}: expected module:callable, e.g. torch.utils.data:RandomSampler")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"--sampler {spec!r}: cannot import {module_name!r} ({exc})") from None
    for name in attr.split("."):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            raise UsageError(f"--sampler {spec!r}: {module_name!r} has no {attr!r}") from None
    if not callable(obj):
        raise UsageError(f"--sampler {spec!r} is not callable")
    return obj


def _make_sampler(factory: Any, dataset_size: int, args: argparse.Namespace, seed: int) -> tuple[Any, dict[str, Any]]:
    """Call the sampler factory with the keyword arguments it accepts."""
    import torch

    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    offered: dict[str, Any] = {
        "replacement": not args.no_replacement,
        "generator": torch.Generator().manual_seed(seed),
        "seed": seed,
        "shuffle": True,
    }
    if args.total_iter is not None:
        if args.total_iter % args.epochs != 0:
            raise UsageError(f"--total-iter {args.total_iter} is not a multiple of --epochs {args.epochs}")
        offered["num_samples"] = args.total_iter // args.epochs
    if args.num_replicas is not None:
        offered["num_replicas"] = args.num_replicas
        offered["rank"] = args.rank
    kwargs = {k: v for k, v in offered.items() if k in params}
    sampler = factory(range(dataset_size), **kwargs)
    recorded = {k: v for k, v in kwargs.items() if k != "generator"}
    return sampler, recorded


def _summary(p: Plan) -> str:
    if not p.has_decisions:
        return f"{p.accesses:,} accesses over {p.items:,} items (sequence only: no capacity given)"
    return (
        f"{p.accesses:,} accesses over {p.items:,} items, capacity {p.capacity:,} ({p.policy}): "
        f"hits {p.hits:,} ({p.hit_rate:.2%}), misses {p.misses:,} "
        f"({p.bypasses:,} bypassed, {p.compulsory_misses:,} compulsory)"
    )


# ---- precompute ----


def _precompute_parser(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("from a trace")
    src.add_argument("--trace", metavar="PATH", help="text (one id per line) or .npy trace")
    src.add_argument("--items", type=int, help="number of items (default: largest id + 1)")
    smp = parser.add_argument_group("from a sampler (the earlier design's flags)")
    smp.add_argument("--total-iter", type=int, metavar="T", help="total accesses (samples drawn) to capture")
    smp.add_argument("--sampler", default="torch.utils.data:RandomSampler", metavar="MODULE:CALLABLE",
                     help="sampler class, called with range(dataset_size) and the keywords it accepts "
                          "(replacement, num_samples, generator, seed, shuffle, num_replicas, rank); "
                          "default: %(default)s")
    smp.add_argument("--seed", type=int, help="random seed (default: drawn and recorded in the plan)")
    smp.add_argument("--dataset-size", type=int, metavar="N", help="items the sampler draws from")
    smp.add_argument("--epochs", type=int, default=1, help="epochs to capture (set_epoch before each)")
    smp.add_argument("--no-replacement", action="store_true", help="sample without replacement")
    smp.add_argument("--num-replicas", type=int, help="for DistributedSampler: world size")
    smp.add_argument("--rank", type=int, default=0, help="for DistributedSampler: this rank")
    out = parser.add_argument_group("the plan")
    out.add_argument("--output", required=True, metavar="PLAN", help="plan file to write")
    out.add_argument("--capacity", type=str, metavar="C",
                     help="cache capacity in items (or a percentage of items, e.g. 25%%); "
                          "without it only the sequence is stored")
    out.add_argument("--no-bypass", action="store_true", help="plan opt-nobypass (always admit)")
    out.add_argument("--quiet", action="store_true", help="no progress bars or summary")


def _cmd_precompute(args: argparse.Namespace) -> int:
    progress = False if args.quiet else None
    started = time.perf_counter()
    if args.trace is not None:
        if args.total_iter is not None or args.dataset_size is not None:
            raise UsageError("give either --trace or the sampler flags (--total-iter, --dataset-size), not both")
        seq = load_trace(args.trace)
        items = args.items
        desc = json.dumps({"trace": os.path.abspath(args.trace), "opt4torch": __version__})
    else:
        if args.dataset_size is None:
            raise UsageError("--dataset-size N is required to plan from a sampler "
                             "(or give --trace PATH to plan from a trace file)")
        if args.dataset_size < 1:
            raise UsageError(f"--dataset-size must be at least 1, got {args.dataset_size}")
        if args.epochs < 1:
            raise UsageError(f"--epochs must be at least 1, got {args.epochs}")
        if args.total_iter is not None and args.total_iter < 1:
            raise UsageError(f"--total-iter must be at least 1, got {args.total_iter}")
        from .cachelib import sampler_description
        from .capture import capture

        seed = args.seed if args.seed is not None else secrets.randbits(31)
        factory = _load_callable(args.sampler)
        sampler, kwargs = _make_sampler(factory, args.dataset_size, args, seed)
        seq = capture(sampler, args.epochs, progress=progress)
        if args.total_iter is not None and seq.size != args.total_iter:
            if seq.size < args.total_iter:
                raise UsageError(f"the sampler gave {seq.size:,} indices in {args.epochs} epoch(s), "
                                 f"fewer than --total-iter {args.total_iter:,}")
            seq = seq[: args.total_iter]
        items = args.dataset_size
        desc = sampler_description(sampler=args.sampler, dataset_size=args.dataset_size, seed=seed,
                                   epochs=args.epochs, total_iter=int(seq.size), kwargs=kwargs)
    if args.capacity is None:
        result = sequence_plan(seq, items=items, description=desc)
    else:
        n_items = items if items is not None else (int(seq.max()) + 1 if seq.size else None)
        capacity = _parse_capacities(args.capacity, n_items)
        if len(capacity) != 1:
            raise UsageError("precompute takes one --capacity")
        result = build_plan(seq, capacity[0], not args.no_bypass, items=items, description=desc,
                            progress=progress)
    parent = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(parent, exist_ok=True)
    result.save(args.output)
    if not args.quiet:
        print(f"wrote {args.output}: {_summary(result)} in {time.perf_counter() - started:.2f} s")
    return 0


# ---- inspect ----


def _cmd_inspect(args: argparse.Namespace) -> int:
    p = load_plan(args.plan)
    info = p.stats()
    info["path"] = os.path.abspath(args.plan)
    info["file_bytes"] = os.path.getsize(args.plan)
    info["format_version"] = 1
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    print(f"plan file   {info['path']} ({info['file_bytes']:,} bytes, format {info['format_version']})")
    print(f"sequence    {p.accesses:,} accesses over {p.items:,} items, fingerprint {info['fingerprint']}")
    if p.has_decisions:
        print(f"cache       {p.capacity:,} items, policy {p.policy}")
        print(f"hits        {p.hits:,} ({p.hit_rate:.2%})")
        print(f"misses      {p.misses:,}: {p.admits:,} admitted, {p.bypasses:,} bypassed, "
              f"{p.compulsory_misses:,} compulsory")
    else:
        print("cache       none (sequence only; plan it with a capacity to get decisions)")
        print(f"distinct    {p.compulsory_misses:,} items")
    if p.description:
        print(f"sampler     {p.description}")
    return 0


# ---- simulate ----


def _simulate_rows(seq: np.ndarray, items: int | None, policies: Sequence[str], capacities: Sequence[int],
                   seed: int) -> list[dict[str, Any]]:
    from .sim import simulate

    rows = []
    for policy in policies:
        for capacity in capacities:
            r = simulate(policy, seq, capacity, items=items, seed=seed)
            rows.append({
                "policy": policy,
                "capacity": capacity,
                "accesses": r["accesses"],
                "hits": r["hits"],
                "misses": r["misses"],
                "hit_rate": r["hits"] / r["accesses"] if r["accesses"] else 0.0,
            })
    return rows


def _write_rows(rows: list[dict[str, Any]], fmt: str, out: Any) -> None:
    if fmt == "json":
        json.dump(rows, out, indent=2)
        out.write("\n")
    elif fmt == "csv":
        fields = ["policy", "capacity", "accesses", "hits", "misses", "hit_rate"]
        w = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow({**row, "hit_rate": f"{row['hit_rate']:.6f}"})
    else:
        out.write(f"{'policy':<14}{'capacity':>10}{'hits':>12}{'misses':>12}{'hit rate':>10}\n")
        for row in rows:
            out.write(f"{row['policy']:<14}{row['capacity']:>10,}{row['hits']:>12,}{row['misses']:>12,}"
                      f"{row['hit_rate']:>10.2%}\n")


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .sim import POLICIES

    seq = load_trace(args.trace)
    items = args.items
    n_items = items if items is not None else (int(seq.max()) + 1 if seq.size else None)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise UsageError(f"unknown policy {', '.join(unknown)}; known: {', '.join(POLICIES)}")
    capacities = _parse_capacities(args.capacity, n_items)
    rows = _simulate_rows(seq, items, policies, capacities, args.seed)
    _write_rows(rows, args.format, sys.stdout)
    return 0


# ---- demo: the main job on a generated default ----


def _cmd_demo(args: argparse.Namespace) -> int:
    import torch
    from torch.utils.data import RandomSampler

    from .capture import capture
    from .sim import simulate

    n, epochs, seed = args.items, args.epochs, args.seed
    os.makedirs(args.out, exist_ok=True)
    print(f"opt4torch {__version__} demo: a dataset of {n:,} items, {epochs} epochs, seed {seed}\n")
    capacities = _parse_capacities(args.capacities, n)
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
        _demo_loader(args)
    return 0


class _FileImages:
    """The demo's dataset: images stored one per file, zlib-compressed (the
    core of PNG), read and decompressed on every load, so a load costs about
    what decoding a small image does (~0.3 ms here for 3x128x128)."""

    def __init__(self, root: str, n: int, shape: tuple[int, int, int]) -> None:
        self.root, self.n, self.shape = root, n, shape

    @staticmethod
    def make(root: str, n: int, shape: tuple[int, int, int], seed: int) -> _FileImages:
        import zlib

        rng = np.random.default_rng(seed)
        h, w, c = shape
        y, x = np.mgrid[0:h, 0:w]
        noise = rng.integers(0, 8, size=shape)
        os.makedirs(root, exist_ok=True)
        for i in range(n):
            # Smooth gradients with a little noise: compressible, like a photo.
            a, b = rng.integers(1, 9, size=2)
            img = ((x * a + y * b + i)[..., None] + noise) % 256
            with open(os.path.join(root, f"{i:06d}.z"), "wb") as f:
                f.write(zlib.compress(img.astype(np.uint8).tobytes(), 1))
        return _FileImages(root, n, shape)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import zlib

        import torch

        with open(os.path.join(self.root, f"{i:06d}.z"), "rb") as f:
            data = np.frombuffer(zlib.decompress(f.read()), dtype=np.uint8).reshape(self.shape)
        return torch.from_numpy(data.transpose(2, 0, 1).copy()), i


def _demo_loader(args: argparse.Namespace) -> None:
    """The product end to end: a generated image dataset on disk, trained for
    a few epochs through opt4torch.DataLoader with worker processes."""
    import tempfile

    import torch
    from torch.utils.data import DataLoader as TorchLoader, RandomSampler

    from . import DataLoader
    from .sim import simulate

    n, epochs, workers = args.loader_items, 3, 2
    with tempfile.TemporaryDirectory(prefix="opt4-demo-") as root:
        t0 = time.perf_counter()
        ds = _FileImages.make(root, n, (128, 128, 3), args.seed)
        print(f"opt4torch.DataLoader: {n:,} generated images on disk (3x128x128, zlib), {epochs} epochs, "
              f"{workers} workers, cache of half the decoded data ({time.perf_counter() - t0:.1f} s to write)")
        timings = {}
        for name in ("torch DataLoader", "opt4torch.DataLoader"):
            if name.startswith("torch"):
                loader: Any = TorchLoader(ds, batch_size=64, num_workers=workers,
                                          sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(args.seed)))
            else:
                loader = DataLoader(ds, batch_size=64, shuffle=True, seed=args.seed, num_workers=workers,
                                    cache_items=n // 2, epochs=epochs, multiprocessing_context="fork")
            t0 = time.perf_counter()
            checked = 0
            for _ in range(epochs):
                for x, idx in loader:
                    checked += len(idx)
            timings[name] = time.perf_counter() - t0
            if name.startswith("opt4torch"):
                st = loader.cache.stats()
                plan = loader.cache.plan
                lru = simulate("lru", plan.seq, n // 2, items=n)["hits"]
                loader.cache.close()
        print(f"  samples served             {checked:,}")
        print(f"  hits observed              {st['hits']:,} ({st['hit_rate']:.2%})")
        print(f"  hits the plan promised     {st['plan_hits']:,}   fallbacks {st['fallbacks']}, timeouts {st['timeouts']}")
        print(f"  LRU at the same size       {lru:,} hits (simulated on the same order)")
        for name, sec in timings.items():
            print(f"  {name:<26} {sec:.2f} s for {epochs} epochs")
        print("  (wall times on a shared 2-core machine are noisy; the hit counts are exact)")



# ---- cleanup ----


def _cmd_cleanup(args: argparse.Namespace) -> int:
    from . import _engine

    pools = _engine.pool_list()
    if not pools:
        print("no opt4 pools in /dev/shm for this user")
        return 0
    removed = 0
    for p in pools:
        state = "live" if p["owner_alive"] else "stale"
        action = ""
        if not p["owner_alive"] and not args.dry_run:
            try:
                _engine.pool_remove(p["name"])
                action = " -> removed"
                removed += 1
            except Opt4Error as exc:
                action = f" -> not removed: {exc}"
        print(f"{p['name']}  owner pid {p['owner_pid']} ({state})  {p['bytes'] / 2**20:.1f} MiB{action}")
    if args.dry_run:
        print("dry run: nothing removed")
    else:
        print(f"removed {removed} stale pool(s); live pools are never removed")
    return 0


# ---- entry points ----


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opt4torch",
        description="Belady-optimal (OPT) caching for PyTorch datasets.",
    )
    parser.add_argument("--version", action="version", version=f"opt4torch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("precompute", help="capture a sampler or read a trace, and write a plan file",
                       description="Write a plan file from a trace (--trace) or from a seeded sampler.")
    _precompute_parser(p)
    p.set_defaults(func=_cmd_precompute)

    p = sub.add_parser("inspect", help="print a plan file's header and totals")
    p.add_argument("plan", metavar="PLAN")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("simulate", help="replay a trace through cache policies")
    p.add_argument("--trace", required=True, metavar="PATH", help="text (one id per line) or .npy trace")
    p.add_argument("--policy", default="opt,lru,fifo", help="comma-separated policies (default: %(default)s)")
    p.add_argument("--capacity", required=True, help="comma-separated capacities, in items or like 25%%")
    p.add_argument("--items", type=int, help="number of items (default: largest id + 1)")
    p.add_argument("--seed", type=int, default=0, help="seed for randomised policies")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("cleanup", help="list this user's shared-memory pools and remove stale ones",
                       description="Remove pools in /dev/shm whose owner process is gone (a run "
                                   "killed by SIGKILL or a crash). Pools of live runs are kept.")
    p.add_argument("--dry-run", action="store_true", help="only list")
    p.set_defaults(func=_cmd_cleanup)

    p = sub.add_parser("demo", help="capture, plan and compare with LRU/FIFO on a generated default")
    p.add_argument("--items", type=int, default=50_000, help="dataset size (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=5, help="epochs (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--capacities", default="10%,25%,50%,75%", help="cache sizes (default: %(default)s)")
    p.add_argument("--out", default="out", help="directory for the plans (default: %(default)s)")
    p.add_argument("--loader-items", type=int, default=2000,
                   help="images in the DataLoader part (0 skips it; default: %(default)s)")
    p.set_defaults(func=_cmd_demo)
    return parser


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    except (Opt4Error, FileNotFoundError) as exc:
        parser.exit(1, f"{parser.prog}: error: {exc}\n")
    except KeyboardInterrupt:
        parser.exit(130, "interrupted\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``opt4torch COMMAND ...``"""
    return _run(_parser(), argv)


def precompute_main(argv: Sequence[str] | None = None) -> int:
    """``opt4torch-precompute ...``: the earlier name of ``opt4torch precompute``."""
    parser = argparse.ArgumentParser(
        prog="opt4torch-precompute",
        description="Write a plan file (same as `opt4torch precompute`).",
    )
    _precompute_parser(parser)
    parser.set_defaults(func=_cmd_precompute)
    return _run(parser, argv)


if __name__ == "__main__":  # python -m opt4torch.cli
    sys.exit(main())
