#!/usr/bin/env python3
"""bench/parquet: Hub-style Parquet shards read four ways, side by side (issue 37).

The JPEGs of the end-to-end runs (opt4torch.lab.e2e.make_image_folder: each
class a colour and a stripe direction, with noise), written as the Hugging
Face Hub keeps them: a ``datasets.Dataset`` with an ``Image`` and a
``ClassLabel`` column, ``to_parquet`` into shards (datasets writes image
datasets in row groups of 100 rows), then read by:

  hf-torch      datasets.load_dataset("parquet") with torch's DataLoader (no cache)
  hf-opt        the same dataset given to opt4torch.DataLoader as it is (OPT, prefetch)
  parquet-opt   opt4torch.Parquet over the shards (OPT over page ranges, found
                through the offset index datasets writes; C prefetch)
  parquet-opt-rowgroups  the same with pages=False (OPT over whole row groups)
  parquet-opt-small  the same rows rewritten by pyarrow in row groups of --small-row-group rows
  litdata       LitData's StreamingDataset over the same shards (index_parquet_dataset,
                ParquetLoader), its StreamingDataLoader, max_cache_size the same budget
  memory        every (jpeg, label) held in a list, torch's DataLoader

``--store s3``: the shards are objects on the loopback S3 server
(bench/s3server.py: ``--s3-latency`` a request, ``--s3-bandwidth`` a response,
one ``--link`` every response shares), read by parquet-opt* as ``s3://``
URLs (the engine's ranged GETs) and by litdata through its own S3 client;
hf-torch, hf-opt and memory read local copies (datasets downloads a Hub
dataset whole before it trains), as the reference. Storage bytes and GETs
are then also the server's counts.

Every configuration decodes the JPEG, takes a random crop and flip after the
cache (or the dataset), with the same batch size, workers and epochs of a
seeded shuffle; no model is trained (this measures the input pipeline).
Reports per configuration the median over repeats of the epoch time, CPU
seconds (this process and its workers), hits against the plan, and storage
bytes against the plan's. ``--latency`` adds seconds per read to
opt4torch.Parquet's reads (the datasets configurations read a memory-mapped
Arrow file and have no such knob).

    python bench/parquet.py [--images 1000] [--epochs 3] [--capacity 0.5] [--repeats 3] [--latency 0]
        [--store file|s3] [--s3-latency 0.005] [--s3-bandwidth 100e6] [--link 30e6]
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

CONFIGS = ("hf-torch", "hf-opt", "parquet-opt", "parquet-opt-rowgroups", "parquet-opt-small", "litdata", "memory")


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
    elif name in ("parquet-opt", "parquet-opt-rowgroups", "parquet-opt-small"):
        if name == "parquet-opt-small":
            paths = _rewritten(paths, args.small_row_group)
        where: Any = paths
        store: dict[str, Any] = {}
        if args.store == "s3":
            where = [f"s3://{_BUCKET}/{os.path.basename(p)}" for p in paths]
            store = {"endpoint_url": args.endpoint}
        pq = opt4torch.Parquet(where, latency=args.latency, pages=name != "parquet-opt-rowgroups", **store)
        # The budget is a share of the data (the shards' bytes), the same for
        # every configuration; a unit's bytes may exceed its rows' share.
        total_bytes = int(sum(os.path.getsize(p) for p in paths))
        loader = opt4torch.DataLoader(pq, shuffle=True, seed=args.seed, epochs=args.epochs, transform=tf,
                                      cache_bytes=int(args.capacity * total_bytes), prefetch_threads=4, **common)
    elif name == "litdata":
        loader, total_bytes = _litdata(paths, args, cache_dir, tf, common)
    else:
        raise ValueError(name)
    server0 = _server_counts(args)
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
    server1 = _server_counts(args)
    if server0 is not None and server1 is not None:
        out.update(server_gets=server1["gets"] - server0["gets"],
                   server_bytes=server1["get_bytes"] - server0["get_bytes"],
                   server_cpu=server1["cpu"] - server0["cpu"])
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


_BUCKET = "hub"
_SERVER: Any = None


def _server_counts(args: Any) -> dict[str, Any] | None:
    """The S3 server's counters and CPU seconds (None with local files)."""
    if _SERVER is None:
        return None
    got: dict[str, Any] = _SERVER.stats()
    got["cpu"] = _SERVER.cpu_seconds()
    return got


class _AllowHttp:
    """LitData's transform, made in each spawned worker with LitData's
    obstore client options allowing plain http (the loopback server; the
    parent's allowance does not reach a spawned process)."""

    def __init__(self, then: Any) -> None:
        self.then = then

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        from litdata.streaming import downloader as dl

        if hasattr(dl, "_OBSTORE_CLIENT_OPTIONS"):
            dl._OBSTORE_CLIENT_OPTIONS["allow_http"] = True

    def __call__(self, sample: Any) -> Any:
        return self.then(sample)


def _litdata(paths: list[str], args: Any, cache_dir: str, tf: Any, common: dict[str, Any]) -> tuple[Any, int]:
    """LitData reading the same shards: its Parquet index (index.json, made
    once by index_parquet_dataset), its ParquetLoader, its StreamingDataset
    (shuffle, max_cache_size: the budget) and StreamingDataLoader."""
    import shutil

    import litdata
    from litdata.streaming.item_loader import ParquetLoader

    total_bytes = int(sum(os.path.getsize(p) for p in paths))
    folder = os.path.join(os.path.dirname(paths[0]), "litdata-src")  # the shards alone (links), for its index
    if not os.path.isdir(folder):
        os.makedirs(folder)
        for p in paths:
            os.link(p, os.path.join(folder, os.path.basename(p)))
    options: dict[str, Any] = {}
    if args.store == "s3":
        from litdata.streaming import downloader as dl

        if hasattr(dl, "_OBSTORE_CLIENT_OPTIONS"):  # the loopback server is plain http
            dl._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
        tf = _AllowHttp(tf)  # the same allowance in its spawned workers
        url = f"s3://{_BUCKET}/"
        options = {"storage_options": {"endpoint_url": args.endpoint}}
    else:
        url = folder
    if not os.path.exists(os.path.join(folder, "index.json")):
        litdata.index_parquet_dataset(folder)  # counted once, outside the timed epochs
        if args.store == "s3":
            import boto3

            boto3.client("s3", endpoint_url=args.endpoint).upload_file(os.path.join(folder, "index.json"), _BUCKET,
                                                                        "index.json")
    local = os.path.join(cache_dir, "litdata")
    shutil.rmtree(local, ignore_errors=True)
    os.makedirs(local)
    from litdata.streaming.resolver import Dir

    ds = litdata.StreamingDataset(input_dir=Dir(path=local if args.store == "s3" else None, url=url)
                                  if args.store == "s3" else url, item_loader=ParquetLoader(), shuffle=True,
                                  seed=args.seed, max_cache_size=int(args.capacity * total_bytes), transform=tf,
                                  **options)
    # Its ParquetLoader (Polars) refuses fork workers (LitData issue 823): spawn.
    return litdata.StreamingDataLoader(ds, batch_size=common["batch_size"], num_workers=common["num_workers"],
                                       multiprocessing_context="spawn", persistent_workers=True), total_bytes


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


def _start_server(args: Any, paths: list[str]) -> Any:
    """The loopback S3 server with the shards (and their row-group
    rewrites) as objects; the clients take its endpoint and any key."""
    import boto3
    from s3server import Server

    for k, v in (("AWS_ACCESS_KEY_ID", "opt4-bench"), ("AWS_SECRET_ACCESS_KEY", "opt4-bench"),
                 ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_REGION", "us-east-1"),
                 ("AWS_EC2_METADATA_DISABLED", "true")):
        os.environ[k] = v
    server = Server(args.s3_latency, bandwidth=args.s3_bandwidth, link=0.0)
    args.endpoint = os.environ["AWS_ENDPOINT_URL"] = os.environ["S3_ENDPOINT_URL"] = server.endpoint
    client = boto3.client("s3", endpoint_url=server.endpoint)
    client.create_bucket(Bucket=_BUCKET)
    uploads = list(paths)
    if "parquet-opt-small" in args.configs:
        uploads += _rewritten(paths, args.small_row_group)
    for p in uploads:
        client.upload_file(p, _BUCKET, os.path.basename(p))
    server.call("set", link=args.link)  # the link from here on: uploads are not the runs'
    print(f"S3 server at {server.endpoint}: {args.s3_latency * 1e3:g} ms a request, "
          f"{args.s3_bandwidth / 1e6:g} MB/s a response, one {args.link / 1e6:g} MB/s link", flush=True)
    return server


def _cpu() -> float:
    """CPU seconds of this process, its reaped children, and its live
    descendants (LitData's persistent spawn workers), not the S3 server's."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + _live_descendants_cpu()


def _live_descendants_cpu() -> float:
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(name)] = int(fields[1])
        ticks[int(name)] = int(fields[11]) + int(fields[12])
    skip = _SERVER.proc.pid if _SERVER is not None else -1
    me, total = os.getpid(), 0
    for pid in parent:
        p = pid
        while p not in (0, 1, me, skip) and p in parent:
            p = parent[p]
        if p == me and pid != me:
            total += ticks[pid]
    return total / os.sysconf("SC_CLK_TCK")


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
    ap.add_argument("--store", choices=("file", "s3"), default="file")
    ap.add_argument("--s3-latency", type=float, default=0.005, help="with --store s3: seconds a request")
    ap.add_argument("--s3-bandwidth", type=float, default=100e6, help="with --store s3: bytes/s a response")
    ap.add_argument("--link", type=float, default=30e6, help="with --store s3: bytes/s of the one shared link")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "parquet.json"))
    args = ap.parse_args()
    global _SERVER
    with tempfile.TemporaryDirectory(prefix="opt4-parquet-bench-") as folder:
        paths, _ = prepare(folder, args.images, args.shards, args.image_size, args.image_size_max)
        size = sum(os.path.getsize(p) for p in paths)
        print(f"{args.images} images in {len(paths)} shards, {size / 1e6:.1f} MB", flush=True)
        if args.store == "s3":
            _SERVER = _start_server(args, paths)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in args.configs.split(",")}
        try:
            for r in range(args.repeats):
                for name in runs:
                    res = run_one(name, paths, args, os.path.join(folder, "hf-cache"))
                    runs[name].append(res)
                    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()
                                      if k != "epochs"}), flush=True)
        finally:  # a configuration that fails (LitData over S3) leaves no server behind
            if _SERVER is not None:
                _SERVER.stop()
    table = []
    for name, rs in runs.items():
        row = {"config": name,
               "epoch_s": statistics.median(statistics.median(r["epochs"]) for r in rs),
               "first_epoch_s": statistics.median(r["epochs"][0] for r in rs),
               "cpu_s": statistics.median(r["cpu"] for r in rs)}
        for key in ("hits", "plan_hits", "accesses", "storage_bytes", "plan_miss_bytes", "total_bytes", "units",
                    "timeouts", "fallbacks", "server_gets", "server_bytes", "server_cpu"):
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
