"""The ``opt4torch`` command (and ``opt4torch-precompute``, its earlier name).

    opt4torch precompute   capture a sampler (or read a trace) and write a plan
    opt4torch inspect      describe a plan file, a record file, a tar shard or an image folder
    opt4torch simulate     replay a trace, or sweep generated patterns, through policies
    opt4torch cluster      simulate N nodes: no cache, per-node OPT and one OPT plan over all of them
    opt4torch cleanup      list this user's shared-memory pools, remove stale ones
    opt4torch demo         the whole job end to end on a generated default

May touch: everything a command names: plan files, record files, folders,
pools (top, cleanup); the lab for simulate and demo.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import inspect
import json
import os
import secrets
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import __version__
from ._engine import Opt4Error
from .io.files import abort_on_sigterm, atomic_write, output_path
from .planning.plan import Plan, load_plan, plan as build_plan, sequence_plan
from .lab.traces import load_trace

__all__ = ["main", "precompute_main"]


class UsageError(Exception):
    """A command line that cannot be run as given; the message says why."""


def _check_output(path: str, what: str = "output") -> str:
    """A path from the user for a file to write: refused early, with the
    reason, if it cannot be one."""
    if path and os.path.isdir(path):
        raise UsageError(f"--{what} {path!r} is a directory; give a file name")
    try:
        # A device, a FIFO, a link to one, a file on the way: refused before any work.
        return output_path(path, parent_must_exist=False)
    except Opt4Error as exc:
        raise UsageError(f"--{what}: {getattr(exc, 'detail', '') or exc}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--{what}: {exc}") from None


# ---- shared output helpers ----


def _text_table(rows: Sequence[Sequence[str]], align: str = "l") -> str:
    """Rows of cells (the first row the header) as aligned text: each column
    as wide as its widest cell, two spaces between columns whatever the
    content. ``align`` gives each column's alignment in turn ("l" or "r");
    the columns past its end are right-aligned (numbers)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if align[i:i + 1] == "l" else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows)


# ---- shared parsing helpers ----


def _percent(part: str) -> float | None:
    """A capacity written as a percentage of the items ('25%'), checked to be
    above 0 and at most 100; None when it does not parse as one (the caller
    says what is wrong with it)."""
    try:
        percent = float(part[:-1])
    except ValueError:
        return None
    if not 0 < percent <= 100:
        raise UsageError(f"capacity {part!r}: a percentage of the items must be above 0 % and "
                         "at most 100 % (a cache larger than the data holds all of it)")
    return percent


def _trace_arg(path: str) -> np.ndarray:
    """--trace PATH loaded, or a usage error naming what PATH is instead of a
    trace file (a folder, a file that cannot be read)."""
    if os.path.isdir(path):
        raise UsageError(f"--trace {path!r} is a folder; give a trace file (text, one id per line, or .npy)")
    try:
        return load_trace(path)
    except OSError as exc:
        raise UsageError(f"--trace {path!r}: {exc.strerror or exc}") from None


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
                percent = _percent(part)
                if percent is None:
                    raise ValueError(part)
                value = max(1, round(percent / 100.0 * items))
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


def _misses(p: Plan) -> str:
    """The misses, split two ways, each into parts that add up to them:
    why (an item's first read, which no cache avoids, or a later read of an
    item the plan did not keep) and what the cache did (stored the item or
    let it pass). A compulsory miss is admitted or bypassed like any other,
    so the two splits overlap; within each, the parts do not."""
    first = p.compulsory_misses
    return (f"{p.misses:,} = {first:,} compulsory (an item's first read) + {p.misses - first:,} capacity "
            f"(read before, not kept) = {p.admits:,} admitted (stored) + {p.bypasses:,} bypassed (not stored)")


def _summary(p: Plan) -> str:
    if not p.has_decisions:
        return f"{p.accesses:,} accesses over {p.items:,} items (sequence only: no capacity given)"
    return (
        f"{p.accesses:,} accesses over {p.items:,} items, capacity {p.capacity:,} ({p.policy}): "
        f"hits {p.hits:,} ({p.hit_rate:.2%}), misses {_misses(p)}"
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
    _check_output(args.output)
    progress = False if args.quiet else None
    started = time.perf_counter()
    if args.trace is not None:
        if args.total_iter is not None or args.dataset_size is not None:
            raise UsageError("give either --trace or the sampler flags (--total-iter, --dataset-size), not both")
        seq = _trace_arg(args.trace)
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
        from .compat.cachelib import sampler_description
        from .planning.capture import capture

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
    with abort_on_sigterm():
        result.save(args.output)  # opt4_outfile: a temporary file renamed over the path
    if not args.quiet:
        print(f"wrote {args.output}: {_summary(result)} in {time.perf_counter() - started:.2f} s")
    return 0


# ---- inspect ----


_INSPECTS = "inspect describes a plan file (.opt4), a record file (opt4torch pack), a tar shard or an image folder"


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .sources.formats import decompress_command, sniff

    path = args.plan
    if os.path.isdir(path):
        return _inspect_image_folder(path, args.json)
    if os.path.exists(path):
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            from .sources.records import _file_kind

            raise UsageError(f"{path!r} is {_file_kind(st.st_mode)}, not a regular file; {_INSPECTS}")
        fmt = sniff(path)
        if fmt.kind == "records":
            return _inspect_records(path, args.json)
        if fmt.kind == "tar":
            return _inspect_tar(path, args.json)
        if fmt.compressed:
            raise ValueError(f"{path} is {fmt.what}: {_INSPECTS}, as stored, uncompressed (a compressed tar shard "
                             f"is not read in place either); decompress it first, "
                             f"`{decompress_command(path, fmt)[0]}`, and inspect that")
        if fmt.kind not in ("plan", "pickle"):
            with open(path, "rb") as fh:
                head = fh.read(16)
            raise ValueError(f"{path} is {fmt.what} (it starts with {head!r}), not an opt4 plan file, a record "
                             f"file or a tar shard; {_INSPECTS}")
    p = load_plan(path)
    info = p.stats()
    info["kind"] = "plan"
    info["path"] = os.path.abspath(path)
    info["file_bytes"] = os.path.getsize(path)
    info["format_version"] = 1
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    print(f"plan file   {info['path']} ({info['file_bytes']:,} bytes, format {info['format_version']})")
    print(f"sequence    {p.accesses:,} accesses over {p.items:,} items, fingerprint {info['fingerprint']}")
    if p.has_decisions:
        print(f"cache       {p.capacity:,} items, policy {p.policy}")
        print(f"hits        {p.hits:,} ({p.hit_rate:.2%})")
        print(f"misses      {_misses(p)}")
    else:
        print("cache       none (sequence only; plan it with a capacity to get decisions)")
        print(f"distinct    {p.compulsory_misses:,} items")
    if p.description:
        print(f"sampler     {p.description}")
    return 0


def _inspect_records(path: str, as_json: bool) -> int:
    """A record file (docs/records.md): what it holds, and its sidecar."""
    from .sources.records import RecordFile

    rf = RecordFile(path, with_labels=False)  # validates the header, the index and the sidecar
    try:
        raw = rf.info()
        sizes = rf.item_sizes()
    finally:
        rf.close()
    side = path + ".json"
    info: dict[str, Any] = {
        "kind": "records",
        "path": os.path.abspath(path),
        "file_bytes": int(raw["file_size"]),
        "format_version": int(raw["version"]),
        "records": int(raw["count"]),
        "data_bytes": int(raw["total_bytes"]),
        "min_record_bytes": int(sizes.min()) if sizes.size else 0,
        "max_record_bytes": int(raw["max_len"]),
        "checksum": f"{int(raw['checksum']):016x}",
        "labels": None if rf.labels is None else int(rf.labels.size),
        "classes": rf.classes,
        "sidecar": os.path.abspath(side) if os.path.exists(side) else None,
    }
    if as_json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    print(f"record file {info['path']} ({info['file_bytes']:,} bytes, format version {info['format_version']})")
    print(f"records     {info['records']:,}, {info['data_bytes']:,} bytes of data "
          f"({info['min_record_bytes']:,} to {info['max_record_bytes']:,} bytes each), checksum {info['checksum']}")
    if info["labels"] is not None:
        n_classes = f" in {len(rf.classes)} classes" if rf.classes is not None else ""
        print(f"labels      {info['labels']:,}{n_classes}, from {side}")
    else:
        print("labels      none" + (f" ({side} has no labels)" if info["sidecar"] else " (no sidecar)"))
    print("read it     opt4torch.records.RecordFile(path); a dataset, not a plan")
    return 0


def _inspect_tar(path: str, as_json: bool) -> int:
    """A WebDataset tar shard: its samples as opt4torch.TarShards indexes
    them (the cached index when current; nothing is written)."""
    from .sources.local import shard_index

    samples = shard_index(path, write=False)
    fields: dict[str, int] = {}
    for _key, _off, _length, members in samples:
        for field, _moff, _size in members:
            fields[field] = fields.get(field, 0) + 1
    lengths = [length for _k, _o, length, _m in samples]
    info: dict[str, Any] = {
        "kind": "tar",
        "path": os.path.abspath(path),
        "file_bytes": os.path.getsize(path),
        "samples": len(samples),
        "fields": fields,
        "data_bytes": sum(size for *_, members in samples for _f, _o, size in members),
        "min_sample_bytes": min(lengths, default=0),
        "max_sample_bytes": max(lengths, default=0),
        "first_key": samples[0][0] if samples else None,
        "last_key": samples[-1][0] if samples else None,
    }
    if as_json:
        print(json.dumps(info, indent=2, sort_keys=True, ensure_ascii=False))
        return 0
    print(f"tar shard   {info['path']} ({info['file_bytes']:,} bytes)")
    if not samples:
        print("samples     none (no member named <key>.<field>, as WebDataset groups them)")
    else:
        keys = f"{info['first_key']!r}" + (f" ... {info['last_key']!r}" if len(samples) > 1 else "")
        print(f"samples     {len(samples):,}, keys {keys}")
        shown = sorted(fields.items(), key=lambda kv: (-kv[1], kv[0]))
        more = f", and {len(shown) - 12} more" if len(shown) > 12 else ""
        print("fields      " + ", ".join(f"{name} {count:,}" for name, count in shown[:12]) + more)
        print(f"data        {info['data_bytes']:,} bytes in fields; a sample is one read of "
              f"{info['min_sample_bytes']:,} to {info['max_sample_bytes']:,} bytes")
    print("read it     opt4torch.TarShards(path): ds[i] == {'__key__': key, field: bytes, ...}; a dataset, not a plan")
    return 0


def _inspect_image_folder(path: str, as_json: bool) -> int:
    """An image folder as opt4torch.ImageFolder (and pack) number it, empty
    classes shown rather than refused."""
    from .sources.local import ImageFolder, LayoutError

    try:
        ds = ImageFolder(path, allow_empty=True)
    except LayoutError:
        raise UsageError(f"{path!r} is a directory with no class folders; {_INSPECTS} "
                         "(root/<class>/<image files>)") from None
    try:
        sizes = ds.item_sizes()
    finally:
        ds.close()
    counts = [0] * len(ds.classes)
    for label in ds.targets:
        counts[label] += 1
    info: dict[str, Any] = {
        "kind": "image_folder",
        "path": os.path.abspath(path),
        "classes": len(ds.classes),
        "images": len(ds),
        "data_bytes": int(sizes.sum()),
        "min_image_bytes": int(sizes.min()) if sizes.size else 0,
        "max_image_bytes": int(sizes.max()) if sizes.size else 0,
        "class_counts": dict(zip(ds.classes, counts)),
        "dot_classes": [c for c in ds.classes if c.startswith(".")],
        "empty_classes": [c for c, n in zip(ds.classes, counts) if n == 0],
    }
    if as_json:
        print(json.dumps(info, indent=2, sort_keys=True, ensure_ascii=False))
        return 0
    print(f"image folder {info['path']} ({info['images']:,} images, {info['data_bytes']:,} bytes, "
          f"{info['min_image_bytes']:,} to {info['max_image_bytes']:,} each)")
    listed = ", ".join(f"{i} {c!r} {n:,}" for i, (c, n) in enumerate(zip(ds.classes, counts)) if i < 12)
    more = f", and {len(ds.classes) - 12} more" if len(ds.classes) > 12 else ""
    print(f"classes     {len(ds.classes):,}, label name images: {listed}{more}")
    if info["dot_classes"]:
        print(f"note        {', '.join(map(repr, info['dot_classes']))}: names that start with a dot are "
              "classes, as torchvision counts them (move such folders out if they are not classes)")
    if info["empty_classes"]:
        print(f"empty       {', '.join(map(repr, info['empty_classes']))}: no image; ImageFolder and pack refuse "
              "these unless allow_empty=True (--allow-empty)")
    print("read it     opt4torch.ImageFolder(path), or `opt4torch pack path out.rec`; ds[i] == (bytes, label)")
    return 0


# ---- simulate ----

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
    from .lab.sim import POLICIES

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
    from .lab.traces import GENERATORS

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
    from .lab.sim import sweep

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
    return list(zip(_parse_capacities(text, items), asked))


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
    from .lab.plots import capacity_label

    head = (["pattern", "param"] if sweep else []) + ["policy", "capacity", "of items", "hits", "misses", "hit rate"]
    cells = [head]
    for row in rows:
        param = f"{row['param']}={row['value']}" if row.get("param") else ""
        cells.append(([str(row["pattern"]), param] if sweep else [])
                     + [row["policy"], f"{row['capacity']:,}", capacity_label(row), f"{row['hits']:,}",
                        f"{row['misses']:,}", f"{row['hit_rate']:.2%}"])
    return _text_table(cells, "lll" if sweep else "l")


def _sweep_summary(rows: list[dict[str, Any]]) -> str | None:
    """What a sweep's reader wants first, per trace and capacity: OPT's hit
    rate, the best online policy and its hit rate, LRU's, and OPT's gains
    over both in percentage points. None when there is nothing to compare
    (fewer than two policies, or neither OPT nor an online policy)."""
    from .lab.plots import capacity_label
    from .lab.sim import compare

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
    return title + "\n" + _text_table(cells, align)


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
        from .lab.plots import gain_heatmaps, hit_rate_curves

        written += hit_rate_curves(rows, out_dir)
        written += gain_heatmaps(rows, out_dir)
    return written


def _cmd_simulate(args: argparse.Namespace) -> int:
    from ._progress import progress_bar
    from .lab.traces import GENERATORS, generate

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
            _percent(part)  # refused before the sweep; one that does not parse: _parse_capacities says why
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
        from .lab.plots import PlotDependencyError, require_matplotlib

        try:
            require_matplotlib()  # fail before the sweep, not after it
        except PlotDependencyError as exc:
            raise UsageError(f"{exc} (or add --no-plots)") from None

    if args.trace is not None:
        seq = _trace_arg(args.trace)
        items = args.items
        if items is None:
            if seq.size == 0:
                raise UsageError(f"{args.trace} is empty: give --items to simulate it")
            items = int(seq.max()) + 1
        capacities = _capacities_asked(args.capacity or _DEFAULT_SWEEP_CAPACITIES, items)
        def loaded(trace: np.ndarray = seq) -> np.ndarray:
            return trace

        traces: list[tuple[tuple[str, str, str], Callable[[], np.ndarray]]] = [
            ((os.path.basename(args.trace), "", ""), loaded)]
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


# ---- cluster: the simulator's cluster mode ----


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--{what} {text!r}: give integers separated by commas") from None
    if not values or min(values) < 1:
        raise UsageError(f"--{what} {text!r}: give positive integers separated by commas")
    return values


def _cmd_cluster(args: argparse.Namespace) -> int:
    from .lab.cluster import FIELDS, per_node_capacity, plot_cluster, sweep_cluster

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
    plots = args.out is not None and not args.no_plots and _have_matplotlib()
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


# ---- demo: the main job on a generated default ----


def _cmd_demo(args: argparse.Namespace) -> int:
    import torch
    from torch.utils.data import RandomSampler

    from .planning.capture import capture
    from .lab.sim import simulate

    n, epochs, seed = args.items, args.epochs, args.seed
    if args.repeats < 1:  # before any work
        raise UsageError(f"--repeats must be at least 1, got {args.repeats}")
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
    from .lab import e2e

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
    written = e2e.write_outputs(result, args.out, plots=_have_matplotlib())
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


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


# ---- record files ----


def _cmd_pack(args: argparse.Namespace) -> int:
    from .sources.records import image_folder_to_records

    rf = image_folder_to_records(args.root, args.output, progress=None if not args.quiet else False,
                                 follow_links=args.follow_links, allow_empty=args.allow_empty)
    info = rf.info()
    print(f"{args.output}: {info['count']} records in {len(rf.classes or [])} classes, "
          f"{info['total_bytes'] / 2**20:.1f} MiB of data ({info['file_size'] / 2**20:.1f} MiB file); "
          f"labels and source files in {args.output}.json")
    return 0


# ---- cleanup ----


def _cmd_cleanup(args: argparse.Namespace) -> int:
    from . import _engine

    pools = _engine.pool_list()
    if args.names:
        wanted = {n if n.startswith("/") else "/" + n for n in args.names}
        unknown = sorted(wanted - {p["name"] for p in pools})
        if unknown:
            raise UsageError(f"no such pool of this user in /dev/shm: {', '.join(unknown)} "
                             "(`opt4torch cleanup --dry-run` lists them)")
        pools = [p for p in pools if p["name"] in wanted]
    ns = os.environ.get("OPT4TORCH_POOL_NAMESPACE", "")
    where = f" in namespace {ns!r} (OPT4TORCH_POOL_NAMESPACE)" if ns else ""
    if not pools:
        print(f"no opt4 pools in /dev/shm for this user{where}")
        return 0
    removed = 0
    for p in pools:
        if not p["owner_alive"]:
            state, remove = "stale", True
        elif p["unchecked"]:
            # Another PID namespace and no lock to test: nothing proves the
            # owner dead. Only --force takes these (or a named pool).
            state = "in another PID namespace, liveness unknown"
            remove = args.force
        else:
            state = "live, in another PID namespace" if p["other_namespace"] else "live"
            remove = args.force and bool(args.names)  # a live pool goes only when named
        action = ""
        if remove and not args.dry_run:
            try:
                _engine.pool_remove(p["name"], force=bool(p["owner_alive"]))
                action = " -> removed"
                removed += 1
            except Opt4Error as exc:
                action = f" -> not removed: {exc}"
        elif remove:
            action = " -> would be removed"
        elif p["unchecked"]:
            action = f" -> kept (once its job has ended: opt4torch cleanup --force {p['name']})"
        print(f"{p['name']}  owner pid {p['owner_pid']} ({state})  {p['bytes'] / 2**20:.1f} MiB{action}")
    if args.dry_run:
        print("dry run: nothing removed")
    elif args.force:
        print(f"removed {removed} pool(s)")
    else:
        print(f"removed {removed} stale pool(s); live pools, and pools whose owner is in another PID "
              "namespace and cannot be checked, are kept (--force removes the latter)")
    return 0


def _top_table(figs: list[dict[str, Any]]) -> str:
    head = ("pool", "pid", "position", "progress", "hit rate", "stalls", "prefetched", "fallbacks",
            "pool full", "accesses/s")
    rows = [head]
    for f in figs:
        rows.append((f["name"], str(f["owner_pid"]), f"{f['position']:,}/{f['accesses']:,}",
                     f"{100 * f['progress']:.1f}%", f"{100 * f['hit_rate']:.1f}%",
                     f"{100 * f['stall_rate']:.1f}%", f"{f['prefetched']:,}", f"{f['fallbacks']:,}",
                     f"{100 * f['occupancy']:.1f}%",
                     f"{f['accesses_per_s']:,.0f}" if "accesses_per_s" in f else "-"))
    return _text_table(rows)


def _cmd_top(args: argparse.Namespace) -> int:
    from . import _engine
    from .pool.live import figures

    if not args.interval > 0:
        raise UsageError(f"--interval must be a positive number of seconds, got {args.interval}")
    wanted = {n if n.startswith("/") else "/" + n for n in args.names}
    ns = os.environ.get("OPT4TORCH_POOL_NAMESPACE", "")
    where = f" in namespace {ns!r} (OPT4TORCH_POOL_NAMESPACE)" if ns else ""
    last: dict[str, tuple[float, dict[str, Any]]] = {}
    tty = sys.stdout.isatty() and not args.once
    while True:
        figs = []
        for entry in _engine.pool_list():
            name = entry["name"]
            if (wanted and name not in wanted) or not entry["owner_alive"]:
                continue
            try:
                view = _engine.pool_peek(name)
            except Opt4Error:
                continue  # ended between the listing and the look
            now = time.monotonic()
            prev = last.get(name)
            figs.append(figures(view, prev[1] if prev else None, now - prev[0] if prev else None))
            last[name] = (now, view)
        missing = sorted(wanted - {f["name"] for f in figs})
        if args.once and missing:
            raise UsageError(f"no running pool of this user named {', '.join(missing)}{where} "
                             "(`opt4torch top --once` lists the running ones)")
        if args.json:
            print(json.dumps(figs), flush=True)
        else:
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J")
            print(_top_table(figs) if figs else f"no running opt4 pools of this user{where}", flush=True)
            if not args.once and not tty:
                print(flush=True)
        if args.once:
            return 0
        time.sleep(args.interval)


# ---- entry points ----


def _simulate_epilog() -> str:
    from .lab.sim import POLICIES
    from .lab.traces import GENERATORS

    lines = ["policies:", "  " + ", ".join(POLICIES), "", "patterns (parameters and defaults):"]
    for pat in GENERATORS.values():
        params = ", ".join(f"{k}={v}" for k, v in pat.params.items())
        lines.append(f"  {pat.name:<23}{pat.summary}" + (f" [{params}]" if params else ""))
    lines += ["", "examples:",
              "  opt4torch simulate --trace t.txt --policy lru,opt --capacity 100,500 --format csv",
              "  opt4torch simulate --pattern zipf --param alpha=0.6,0.8,1.0,1.2 --policy all --out out/zipf",
              "  opt4torch simulate --pattern all --items 100000 --epochs 3 --out out/all"]
    return "\n".join(lines)



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

    p = sub.add_parser("inspect", help="describe a plan file, a record file, a tar shard or an image folder",
                       description="Print what FILE holds: a plan file's header (format version, sequence "
                                   "fingerprint, capacity, policy) and its totals (hits, misses, bypasses); a "
                                   "record file's items, sizes and labels; a WebDataset tar shard's samples, "
                                   "fields and sizes; an image folder's classes (numbered as ImageFolder and "
                                   "pack number them) and images. What it is comes from its first bytes, not "
                                   "its name. Nothing is changed.")
    p.add_argument("plan", metavar="FILE", help="a plan file, a record file (opt4torch pack), a WebDataset tar "
                                               "shard, or an image folder")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_inspect)

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

    p = sub.add_parser("pack", help="pack an image folder (ImageFolder layout) into a record file",
                       description="Pack ROOT/<class>/<image files> into one record file that "
                                   "opt4torch.records.RecordFile reads (with O_DIRECT if asked) and "
                                   "opt4torch.DataLoader prefetches with C threads. Images are kept "
                                   "encoded; labels go to OUTPUT.json.")
    p.add_argument("root", metavar="ROOT", help="the image folder: one subfolder per class")
    p.add_argument("output", metavar="OUTPUT", help="the record file to write")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--follow-links", action="store_true",
                   help="pack files that symbolic links take outside ROOT (refused by default)")
    p.add_argument("--allow-empty", action="store_true",
                   help="keep class folders with no image as classes (refused by default, as torchvision "
                        "does); anything that is not a regular file is always refused, and empty "
                        "(0-byte) files are packed with a warning")
    p.set_defaults(func=_cmd_pack)

    p = sub.add_parser("cleanup", help="list this user's shared-memory pools and remove stale ones",
                       description="Remove pools in /dev/shm whose owner process is gone (a run "
                                   "killed by SIGKILL or a crash). Pools of live runs are kept, in "
                                   "this PID namespace or another (a container or an `unshare -p` job "
                                   "sharing /dev/shm): an owner holds a lock on its pool that the kernel "
                                   "drops when it dies. A pool whose owner is in another PID namespace "
                                   "and holds no lock (made by an older opt4torch, or on behalf of "
                                   "another process) cannot be checked from here and is kept unless "
                                   "--force is given. With OPT4TORCH_POOL_NAMESPACE set, only the pools "
                                   "of that namespace are seen (as by every sweep of that job).")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="only these pools (as listed, e.g. /opt4-1000-4242-0123456789abcdef)")
    p.add_argument("--dry-run", action="store_true", help="only list")
    p.add_argument("--force", action="store_true",
                   help="also remove pools whose owner is in another PID namespace and cannot be "
                        "checked; with NAMEs, remove those pools whatever their owner's state (a "
                        "live job using one fails)")
    p.set_defaults(func=_cmd_cleanup)

    p = sub.add_parser("top", help="live figures of this user's running jobs, read from their pools",
                       description="Where each running job is and how its cache does: position in the "
                                   "plan, hit rate, stall rate, prefetched and fallen-back accesses, how "
                                   "full the pool is and accesses per second, refreshed every --interval "
                                   "seconds until Ctrl-C. Each pool is mapped read-only for the look: a "
                                   "job is never changed by being watched. With OPT4TORCH_POOL_NAMESPACE "
                                   "set, only that namespace's pools are seen.")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="only these pools (as `opt4torch cleanup --dry-run` lists them)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default: %(default)s)")
    p.add_argument("--once", action="store_true", help="print once and exit")
    p.add_argument("--json", action="store_true", help="one JSON list of figures per refresh")
    p.set_defaults(func=_cmd_top)

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
    return parser


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    except (Opt4Error, FileNotFoundError, ValueError) as exc:
        parser.exit(1, f"{parser.prog}: error: {exc}\n")
    except KeyboardInterrupt:
        parser.exit(130, "interrupted\n")
    except BrokenPipeError:
        # The reader went away (`opt4torch simulate ... | head`): stop quietly,
        # as a pipeline expects, without a traceback from the interpreter's
        # final flush of stdout either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
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
