"""``opt4torch inspect``: describe a plan file, a record file, a tar shard or
an image folder, known by its first bytes, not its name.

May touch: the file or folder it is given, read only (a tar shard's cached
index is read, never written).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
from typing import Any

from ..planning.plan import load_plan
from .common import UsageError, misses_text


_INSPECTS = "inspect describes a plan file (.opt4), a record file (opt4torch pack), a tar shard or an image folder"


def _cmd_inspect(args: argparse.Namespace) -> int:
    from ..sources.formats import decompress_command, sniff

    path = args.plan
    if os.path.isdir(path):
        return _inspect_image_folder(path, args.json)
    if os.path.exists(path):
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            from ..io.files import file_kind

            raise UsageError(f"{path!r} is {file_kind(st.st_mode)}, not a regular file; {_INSPECTS}")
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
        print(f"misses      {misses_text(p)}")
    else:
        print("cache       none (sequence only; plan it with a capacity to get decisions)")
        print(f"distinct    {p.compulsory_misses:,} items")
    if p.description:
        print(f"sampler     {p.description}")
    return 0


def _inspect_records(path: str, as_json: bool) -> int:
    """A record file (docs/records.md): what it holds, and its sidecar."""
    from ..sources.records import RecordFile

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
    from ..sources.local import shard_index

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
    from ..sources.local import ImageFolder, LayoutError

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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
