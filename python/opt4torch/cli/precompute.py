"""``opt4torch precompute`` (and ``opt4torch-precompute``, its earlier name):
capture a seeded sampler, or read a trace, and write a plan file.

May touch: the trace file (read), the sampler it imports and calls, the plan
file it writes (opt4_outfile, through Plan.save).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import secrets
import time
from collections.abc import Mapping
from typing import Any

from .. import __version__
from ..io.files import abort_on_sigterm
from ..planning.plan import plan as build_plan, sequence_plan
from .common import UsageError, check_output, parse_capacities, plan_summary, trace_arg


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
        params: Mapping[str, inspect.Parameter] = inspect.signature(factory).parameters
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``precompute``, on its subparser or on the parser of
    ``opt4torch-precompute``, and the function that runs it."""
    parser.set_defaults(func=_cmd_precompute)
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
    check_output(args.output)
    progress = False if args.quiet else None
    started = time.perf_counter()
    if args.trace is not None:
        if args.total_iter is not None or args.dataset_size is not None:
            raise UsageError("give either --trace or the sampler flags (--total-iter, --dataset-size), not both")
        seq = trace_arg(args.trace)
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
        from ..compat.cachelib import sampler_description
        from ..planning.capture import capture

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
        capacity = parse_capacities(args.capacity, n_items)
        if len(capacity) != 1:
            raise UsageError("precompute takes one --capacity")
        result = build_plan(seq, capacity[0], not args.no_bypass, items=items, description=desc,
                            progress=progress)
    parent = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(parent, exist_ok=True)
    with abort_on_sigterm():
        result.save(args.output)  # opt4_outfile: a temporary file renamed over the path
    if not args.quiet:
        print(f"wrote {args.output}: {plan_summary(result)} in {time.perf_counter() - started:.2f} s")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("precompute", help="capture a sampler or read a trace, and write a plan file",
                       description="Write a plan file from a trace (--trace) or from a seeded sampler.")
    add_arguments(p)
