#!/usr/bin/env python3
"""bench/parquet: Hub-style Parquet shards read four ways, side by side (issue 37).

The JPEGs of the end-to-end runs (opt4torch.lab.e2e.make_image_folder: each
class a colour and a stripe direction, with noise), written as the Hugging
Face Hub keeps them: a ``datasets.Dataset`` with an ``Image`` and a
``ClassLabel`` column, ``to_parquet`` into shards (datasets writes image
datasets in row groups of 100 rows), then read by:

  hf-torch      datasets.load_dataset("parquet") with torch's DataLoader (no cache)
  hf-opt        the same dataset given to opt4torch.DataLoader as it is (OPT, prefetch)
  parquet-opt   opt4torch.Parquet over the shards (OPT over row groups, C prefetch)
  parquet-opt-small  the same rows rewritten by pyarrow in row groups of --small-row-group rows
  memory        every (jpeg, label) held in a list, torch's DataLoader

Every configuration decodes the JPEG, takes a random crop and flip after the
cache (or the dataset), with the same batch size, workers and epochs of a
seeded shuffle; no model is trained (this measures the input pipeline).
Reports per configuration the median over repeats of the epoch time, CPU
seconds (this process and its workers), hits against the plan, and storage
bytes against the plan's. ``--latency`` adds seconds per read to
opt4torch.Parquet's reads (the datasets configurations read a memory-mapped
Arrow file and have no such knob).

    python bench/parquet.py [--images 1000] [--epochs 3] [--capacity 0.5] [--repeats 3] [--latency 0]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import machine  # noqa: E402

CONFIGS = ("hf-torch", "hf-opt", "parquet-opt", "parquet-opt-small", "memory")


class CropFlip:
    """A decoded PIL image (datasets) or a Hub image struct / JPEG bytes ->
    (float tensor 3 x crop x crop, label)."""

    def __init__(self, crop: int) -> None:
        self.crop = crop

    def __call__(self, sample: Any) -> Any:
        from PIL import Image

        from opt4torch.lab.e2e import crop_flip

        if isinstance(sample, tuple):
            image, label = sample
        else:
            image, label = sample["image"], sample["label"]
        if isinstance(image, dict):
            image = image["bytes"]
        if isinstance(image, (bytes, bytearray, memoryview)):
            image = Image.open(io.BytesIO(image))
        return crop_flip(image, self.crop), int(label)


class _Mapped:
    """A dataset with a transform applied on access (torch's DataLoader configurations)."""

    def __init__(self, data: Any, transform: Any) -> None:
        self.data = data
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        return self.transform(self.data[i])


def prepare(folder: str, images: int, shards: int, size: int, size_max: int) -> tuple[list[str], Any]:
    import datasets

    from opt4torch.lab.e2e import make_image_folder

    tree = os.path.join(folder, "tree")
    make_image_folder(tree, images, 10, size, 0, size_max)
    classes = sorted(os.listdir(tree))
    rows = [(os.path.join(tree, c, f), k) for k, c in enumerate(classes) for f in sorted(os.listdir(os.path.join(tree, c)))]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": open(p, "rb").read(), "path": None} for p, _ in rows],
                                     "label": [k for _, k in rows]}, features=features)
    paths = []
    for s in range(shards):
        path = os.path.join(folder, f"train-{s:05d}-of-{shards:05d}.parquet")
        ds.shard(shards, s, contiguous=True).to_parquet(path)
        paths.append(path)
    return paths, ds


def run_one(name: str, paths: list[str], args: Any, cache_dir: str) -> dict[str, Any]:
    import datasets
    import torch

    import opt4torch

    tf = CropFlip(args.crop)
    common = dict(batch_size=args.batch, num_workers=args.workers, multiprocessing_context="fork")
    hf = datasets.load_dataset("parquet", data_files=paths, split="train", cache_dir=cache_dir)
    loader: Any
    total_bytes = 0
    if name == "hf-torch":
        g = torch.Generator().manual_seed(args.seed)
        loader = torch.utils.data.DataLoader(_Mapped(hf, tf), shuffle=True, generator=g, **common)
    elif name == "memory":
        col = hf.data.column("image").to_pylist()
        data = [(c["bytes"], int(lab)) for c, lab in zip(col, hf.data.column("label").to_pylist())]
        g = torch.Generator().manual_seed(args.seed)
        loader = torch.utils.data.DataLoader(_Mapped(data, tf), shuffle=True, generator=g, **common)
    elif name == "hf-opt":
        total_bytes = int(opt4torch.HFDataset(hf).item_sizes().sum())
        loader = opt4torch.DataLoader(hf, shuffle=True, seed=args.seed, epochs=args.epochs, transform=tf,
                                      cache_bytes=int(args.capacity * total_bytes), prefetch=True,
                                      prefetch_threads=4, **common)
    elif name in ("parquet-opt", "parquet-opt-small"):
        if name == "parquet-opt-small":
            paths = _rewritten(paths, args.small_row_group)
        pq = opt4torch.Parquet(paths, latency=args.latency)
        total_bytes = int(pq.unit_sizes().sum())
        loader = opt4torch.DataLoader(pq, shuffle=True, seed=args.seed, epochs=args.epochs, transform=tf,
                                      cache_bytes=int(args.capacity * total_bytes), prefetch_threads=4, **common)
    else:
        raise ValueError(name)
    t0, c0 = time.perf_counter(), _cpu()
    epochs = []
    n = 0
    for _ in range(args.epochs):
        e0 = time.perf_counter()
        for x, _y in loader:
            n += x.shape[0]
        epochs.append(time.perf_counter() - e0)
    out: dict[str, Any] = {"config": name, "seconds": time.perf_counter() - t0, "cpu": _cpu() - c0,
                           "epochs": epochs, "samples": n}
    cache = getattr(loader, "cache", None)
    if cache is not None:
        st = cache.stats()
        plan = cache.plan
        out.update(hits=st["hits"], plan_hits=st["plan_hits"], accesses=plan.accesses,
                   total_bytes=total_bytes, units=plan.items, timeouts=st["timeouts"], fallbacks=st["fallbacks"])
        if st.get("storage_bytes") is not None:
            # The plan's sizes carry the codec's margin; the reader's are the ranges as read.
            ranges = loader.dataset.dataset.item_sizes()
            out.update(storage_bytes=st["storage_bytes"],
                       plan_miss_bytes=int(ranges[plan.seq[plan.kinds != opt4torch.HIT]].sum()))
        cache.close()
    return out


def _rewritten(paths: list[str], rows: int) -> list[str]:
    """The shards written again by pyarrow with row groups of ``rows`` rows (once)."""
    import pyarrow.parquet as papq

    out = []
    for p in paths:
        q = p.replace(".parquet", f".rg{rows}.parquet")
        if not os.path.exists(q):
            papq.write_table(papq.read_table(p), q, row_group_size=rows)
        out.append(q)
    return out


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--image-size", type=int, default=160)
    ap.add_argument("--image-size-max", type=int, default=400)
    ap.add_argument("--crop", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--capacity", type=float, default=0.5, help="cache size, a share of the encoded bytes")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds per read of opt4torch.Parquet")
    ap.add_argument("--small-row-group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "parquet.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="opt4-parquet-bench-") as folder:
        paths, _ = prepare(folder, args.images, args.shards, args.image_size, args.image_size_max)
        size = sum(os.path.getsize(p) for p in paths)
        print(f"{args.images} images in {len(paths)} shards, {size / 1e6:.1f} MB", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in args.configs.split(",")}
        for r in range(args.repeats):
            for name in runs:
                res = run_one(name, paths, args, os.path.join(folder, "hf-cache"))
                runs[name].append(res)
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()
                                  if k != "epochs"}), flush=True)
    table = []
    for name, rs in runs.items():
        row = {"config": name,
               "epoch_s": statistics.median(statistics.median(r["epochs"]) for r in rs),
               "first_epoch_s": statistics.median(r["epochs"][0] for r in rs),
               "cpu_s": statistics.median(r["cpu"] for r in rs)}
        for key in ("hits", "plan_hits", "accesses", "storage_bytes", "plan_miss_bytes", "total_bytes", "units",
                    "timeouts", "fallbacks"):
            if key in rs[0]:
                row[key] = statistics.median(r[key] for r in rs)
        table.append(row)
    result = {"machine": machine(), "args": vars(args), "table": table, "runs": runs}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for row in table:
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
