"""The end-to-end comparison's Parquet configuration (issue 37): the same JPEGs
as the record-file runs (:func:`.e2e.prepare_data`, the ImageFolder it packs),
written as the Hugging Face Hub keeps them, and read seven ways with the same
training loop (:func:`.e2e.train`). ``bench/e2e.py --format parquet`` runs it.

The shards: a ``datasets.Dataset`` with an ``Image`` and a ``ClassLabel``
column, ``to_parquet`` into ``Setup.parquet_shards`` shards (``datasets``
writes an image dataset in row groups of up to 100 MB, with an offset index
and content-defined pages). Configurations (:data:`CONFIGS`):

  hf-torch      ``datasets.load_dataset("parquet")`` with torch's DataLoader, no cache
  hf-opt        that dataset given to opt4torch.DataLoader as it is (OPT + prefetch)
  parquet-opt   ``opt4torch.Parquet`` over the shards, as it reads them by default (each row
                alone where its image is a byte range of its own: OPT over rows; C prefetch)
  parquet-opt-pages  the same with ``values=False`` (OPT over page ranges)
  parquet-opt-rowgroups  the same with ``pages=False`` (OPT over whole row groups)
  parquet-opt-small  the same rows written again by pyarrow in row groups of
                ``Setup.small_row_group`` rows
  litdata       LitData's StreamingDataset over the same shards (index_parquet_dataset,
                ParquetLoader), its StreamingDataLoader, max_cache_size the same budget
  memory        every (JPEG, label) in a list, torch's DataLoader

With ``Setup.store == "s3"`` the shards are objects on the loopback S3 server
(bench/s3server.py) and parquet-opt* and litdata read them there (``s3://``
URLs; LitData through its own client); hf-torch, hf-opt and memory read the
local copy (``datasets`` downloads a Hub dataset whole before training), as
references. Locally every configuration reads the files through the page
cache, with no emulated latency: the store keeps up.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from . import e2e
from .e2e import Setup

__all__ = ["CONFIGS", "LABELS", "label", "litdata_budget", "prepare_shards", "run", "run_config", "upload"]

CONFIGS = ("hf-torch", "hf-opt", "parquet-opt", "parquet-opt-pages", "parquet-opt-rowgroups", "parquet-opt-small",
           "litdata", "memory")
#: What the tables and the plot call them.
LABELS = {"hf-torch": "datasets + torch DataLoader (no cache)",
          "hf-opt": "datasets in opt4torch.DataLoader (OPT + prefetch)",
          "parquet-opt": "opt4torch.Parquet (rows alone)", "parquet-opt-pages": "opt4torch.Parquet (page ranges)",
          "parquet-opt-rowgroups": "opt4torch.Parquet (row groups)",
          "parquet-opt-small": "opt4torch.Parquet (row groups of {k})", "litdata": "LitData (ParquetLoader)",
          "memory": "in memory"}
#: The bucket on the S3 server.
BUCKET = "opt4-hub"
_OPT = ("hf-opt", "parquet-opt", "parquet-opt-pages", "parquet-opt-rowgroups", "parquet-opt-small")


def label(name: str, setup: Setup) -> str:
    return LABELS[name].format(k=setup.small_row_group)


# ---- the data ----


def prepare_shards(record_path: str, setup: Setup, log: Callable[[str], None] = print) -> list[str]:
    """The Hub-style shards of the JPEGs :func:`.e2e.prepare_data` made
    (``record_path``'s image folder), and their rewrite in small row groups
    (made once beside the record file: reused while the description matches)."""
    import datasets
    import pyarrow.parquet as papq

    root = record_path[:-len(".rec")]
    n = setup.parquet_shards
    out = f"{root}-parquet-{n}"
    with open(record_path + ".made") as f:
        desc = {"images": json.load(f), "shards": n, "small_row_group": setup.small_row_group,
                "datasets": datasets.__version__, "version": 1}
    paths = [os.path.join(out, f"train-{s:05d}-of-{n:05d}.parquet") for s in range(n)]
    small = [os.path.join(out, "small", os.path.basename(p)) for p in paths]
    stamp = os.path.join(out, "made.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == desc:
                return paths
    t0 = time.perf_counter()
    os.makedirs(os.path.join(out, "small"), exist_ok=True)
    classes = sorted(os.listdir(root))
    files = [(os.path.join(root, c, f), k) for k, c in enumerate(classes)
             for f in sorted(os.listdir(os.path.join(root, c)))]
    images = []
    for p, _ in files:
        with open(p, "rb") as f:
            images.append({"bytes": f.read(), "path": None})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    ds = datasets.Dataset.from_dict({"image": images, "label": [k for _, k in files]}, features=features)
    for s, (p, q) in enumerate(zip(paths, small)):
        ds.shard(n, s, contiguous=True).to_parquet(p)
        papq.write_table(papq.read_table(p), q, row_group_size=setup.small_row_group)
    with open(stamp, "w") as f:
        json.dump(desc, f)
    size = sum(os.path.getsize(p) for p in paths)
    log(f"wrote {len(files):,} JPEGs as {n} Hub-style Parquet shards ({size / 1e6:.1f} MB) under {out}/ "
        f"({time.perf_counter() - t0:.1f} s)")
    return paths


def _small(paths: list[str]) -> list[str]:
    return [os.path.join(os.path.dirname(p), "small", os.path.basename(p)) for p in paths]


def upload(paths: list[str], setup: Setup, log: Callable[[str], None] = print) -> None:
    """The shards, their rewrites and LitData's index as objects on the S3
    server (not timed): ``s3://BUCKET/<name>``, ``s3://BUCKET/small/<name>``."""
    client = e2e.s3_client(setup)
    client.create_bucket(Bucket=BUCKET)
    lit = _litdata_folder(paths)
    puts = [(p, os.path.basename(p)) for p in paths] + [(p, "small/" + os.path.basename(p)) for p in _small(paths)]
    for p, key in puts + [(os.path.join(lit, "index.json"), "index.json")]:
        client.upload_file(p, BUCKET, key)
    log(f"put the {len(paths)} shards, their rewrites and LitData's index on the S3 server at {setup.s3_endpoint}")


def _litdata_folder(paths: list[str]) -> str:
    """The shards alone in a folder (hard links) with LitData's index.json
    (index_parquet_dataset, made once, outside the timed epochs)."""
    folder = os.path.join(os.path.dirname(paths[0]), "litdata-src")
    os.makedirs(folder, exist_ok=True)
    for p in paths:
        if not os.path.exists(os.path.join(folder, os.path.basename(p))):
            os.link(p, os.path.join(folder, os.path.basename(p)))
    if not os.path.exists(os.path.join(folder, "index.json")):
        import litdata

        litdata.index_parquet_dataset(folder)
    return folder


# ---- one configuration ----


class CropFlip:
    """A Hub row (``{"image": PIL or {bytes, path}, "label"}``) or a
    ``(jpeg, label)`` pair -> (float tensor 3 x crop x crop, label): the
    record-file runs' :class:`.e2e.DecodeCropFlip` after the cache."""

    def __init__(self, crop: int) -> None:
        self.then = e2e.DecodeCropFlip(crop)

    def __call__(self, sample: Any) -> Any:
        if isinstance(sample, tuple):
            return self.then(sample)
        image, lab = sample["image"], int(sample["label"])
        if isinstance(image, dict):
            return self.then((image["bytes"], lab))
        return e2e.crop_flip(image, self.then.crop), lab


class _AllowHttp:
    """LitData's transform, made again in each spawned worker with its obstore
    client allowed plain http (the loopback server; the parent's allowance
    does not reach a spawned process)."""

    def __init__(self, then: Any) -> None:
        self.then = then

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _allow_http()

    def __call__(self, sample: Any) -> Any:
        return self.then(sample)


def _allow_http() -> None:
    from litdata.streaming import downloader

    if hasattr(downloader, "_OBSTORE_CLIENT_OPTIONS"):
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True


def litdata_budget(total_bytes: int, shards: int, capacity: float) -> int:
    """LitData's max_cache_size for ``capacity`` of the data: the same budget,
    kept under the size where LitData 0.2.76 turns on its node-wide slot gate
    (``PrepareChunksThread._slot_budget_enabled``, reader.py: a budget of at
    least two mean chunks and 10 MiB). Over the S3 server that gate deadlocks
    on Parquet shards: ``_acquire_cache_slot`` waits for a slot that no worker
    frees (the shards' reference counts stay above zero, or a reservation is
    never released: the counter's correction counts only ``chunk-*.bin``
    files), and a worker raises ChunkWaitTimeoutError after 120 s
    (bench/RESULTS.md, issue 37). Under the gate LitData deletes a chunk once
    it is read, as at any small budget."""
    budget = int(capacity * total_bytes)
    gate = max(2 * (total_bytes // max(1, shards)), 10 * 2**20)
    return min(budget, gate - 1)


def _litdata_loader(paths: list[str], setup: Setup, cache_dir: str, tf: Any, common: dict[str, Any],
                    total: int) -> tuple[Any, int]:
    import shutil

    import litdata
    from litdata.streaming.item_loader import ParquetLoader
    from litdata.streaming.resolver import Dir

    folder = _litdata_folder(paths)
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.makedirs(cache_dir)
    budget = litdata_budget(total, len(paths), setup.capacity)
    where: Any = folder
    options: dict[str, Any] = {}
    if setup.store == "s3":
        _allow_http()
        tf = _AllowHttp(tf)
        where = Dir(path=cache_dir, url=f"s3://{BUCKET}/")
        options = {"storage_options": {"endpoint_url": setup.s3_endpoint}}
    ds = litdata.StreamingDataset(input_dir=where, item_loader=ParquetLoader(), shuffle=True, seed=setup.seed,
                                  max_cache_size=budget, transform=tf, **options)
    # Its ParquetLoader (Polars) refuses fork workers (LitData issue 823): spawn.
    return litdata.StreamingDataLoader(ds, batch_size=common["batch_size"], num_workers=common["num_workers"],
                                       multiprocessing_context="spawn", persistent_workers=True), budget


def _loader(name: str, sampler_kind: str, paths: list[str], setup: Setup, out: dict[str, Any]) -> Any:
    """The configuration's loader; fills ``out`` with its budget and sizes."""
    import datasets
    import torch

    from ..loader.dataloader import DataLoader
    from ..sources.hfdatasets import HFDataset
    from ..sources.parquet import Parquet

    tf = CropFlip(setup.crop)
    common: dict[str, Any] = dict(batch_size=setup.batch, num_workers=setup.workers,
                                  persistent_workers=setup.workers > 0,
                                  multiprocessing_context="fork" if setup.workers > 0 else None)
    scratch = os.path.join(os.path.dirname(paths[0]), "scratch")
    hf = datasets.load_dataset("parquet", data_files=paths, split="train", cache_dir=os.path.join(scratch, "hf"))
    labels = np.asarray(hf.data.column("label").to_numpy())
    total = sum(os.path.getsize(p) for p in paths)
    out["cache_bytes"] = int(setup.capacity * total)  # a share of the shards' bytes, the same for all
    if name == "litdata":
        loader, out["cache_bytes"] = _litdata_loader(paths, setup, os.path.join(scratch, "litdata"), tf, common, total)
        if out["cache_bytes"] != int(setup.capacity * total):
            out["litdata_budget_note"] = (f"max_cache_size {out['cache_bytes']:,} B, under LitData 0.2.76's slot "
                                          "gate, which deadlocks on these shards")
        return loader
    sampler = e2e.make_sampler(sampler_kind, labels, setup.seed)
    if name in ("hf-torch", "memory"):
        data: Any = hf
        if name == "memory":
            col = hf.data.column("image").to_pylist()
            data = [(c["bytes"], int(k)) for c, k in zip(col, labels.tolist())]
        return torch.utils.data.DataLoader(e2e.NoCache(data, tf), sampler=sampler, **common)
    if name == "hf-opt":
        out["cache_bytes"] = int(setup.capacity * HFDataset(hf).item_sizes().sum())
        source: Any = hf
    else:
        files = _small(paths) if name == "parquet-opt-small" else paths
        store: dict[str, Any] = {}
        if setup.store == "s3":
            prefix = f"s3://{BUCKET}/" + ("small/" if name == "parquet-opt-small" else "")
            files = [prefix + os.path.basename(p) for p in files]
            store = {"endpoint_url": setup.s3_endpoint}
        source = Parquet(files, pages=name != "parquet-opt-rowgroups", values=name == "parquet-opt", **store)
    return DataLoader(source, sampler=sampler, epochs=setup.epochs, transform=tf, cache_bytes=out["cache_bytes"],
                      prefetch=True, prefetch_threads=setup.threads, lookahead=setup.lookahead, progress=False,
                      **common)


def run_config(name: str, sampler_kind: str, paths: list[str], setup: Setup) -> dict[str, Any]:
    """Train ``setup.epochs`` epochs under configuration ``name`` (in a
    process of its own: :func:`.e2e.run_isolated`); the counters."""
    import torch

    torch.set_num_threads(1)
    cpu0 = e2e.cpu_seconds()
    mem = e2e.PeakMemory()
    mem.start()
    s3 = setup.store == "s3" and name in ("litdata",) + _OPT[1:]
    out: dict[str, Any] = {"config": name, "label": label(name, setup), "sampler": sampler_kind,
                           "reads": "s3" if s3 else "local"}
    if setup.store == "s3":
        e2e.s3_stats(setup, "reset")
        server_cpu0 = e2e.proc_cpu_seconds(setup.s3_server_pid) if setup.s3_server_pid else 0.0
    t0 = time.perf_counter()
    loader = _loader(name, sampler_kind, paths, setup, out)
    out["setup_s"] = time.perf_counter() - t0
    out.update(e2e.train(loader, setup, f"{name} / {sampler_kind}"))
    out["seconds"] = time.perf_counter() - t0
    e2e.shutdown_loader(loader)
    n = out["samples"]
    if setup.store == "s3":
        srv = e2e.s3_stats(setup)
        out.update(store_gets=srv["gets"], store_get_bytes=srv["get_bytes"], store_requests=srv["requests"],
                   server_cpu_s=(e2e.proc_cpu_seconds(setup.s3_server_pid) - server_cpu0
                                 if setup.s3_server_pid else None))
    if name in _OPT:
        st, plan = loader.cache.stats(), loader.cache.plan
        sizes = loader.dataset.dataset.item_sizes()
        out.update(hits=st["hits"], plan_hits=plan.hits, units=plan.items, timeouts=st["timeouts"],
                   fallbacks=st["fallbacks"], stall_rate=st["stall_rate"], hit_rate=st["hits"] / max(1, n))
        if st.get("storage_bytes") is not None:  # the sources that read storage themselves
            out.update(storage_bytes=st["storage_bytes"],
                       plan_miss_bytes=int(sizes[plan.seq[plan.kinds != 0]].sum()))
        loader.cache.close()
    elif name == "litdata":
        # What its cache did not fetch, of the bytes the epochs went through.
        if s3:
            out.update(storage_bytes=out["store_get_bytes"],
                       hit_rate=max(0.0, 1 - out["store_get_bytes"] / max(1, setup.epochs * sum(
                           os.path.getsize(p) for p in paths))), hit_rate_note="bytes")
    else:
        out["hit_rate"] = 1.0 if name == "memory" else 0.0
    del loader
    out["cpu_s"] = e2e.cpu_seconds() - cpu0
    out["load_average"], out["cores"] = os.getloadavg()[0], os.cpu_count() or 1
    out["peak_memory_bytes"] = mem.stop()
    return out


# ---- the run, its summary, targets, table and plot ----


def run(setup: Setup, record_path: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every sampler x configuration x repeat, each in a process of its own,
    configurations interleaved and rotated from one repeat to the next (as
    :func:`.e2e.run`). LitData shuffles its own way: under "shuffle" only."""
    for name in setup.configs:
        if name not in CONFIGS:
            raise ValueError(f"unknown Parquet configuration {name!r} (one of {', '.join(CONFIGS)})")
    if "litdata" in setup.configs and importlib.util.find_spec("litdata") is None:
        raise ValueError("the configuration 'litdata' needs LitData (pip install litdata; docs/e2e.md)")
    paths = prepare_shards(record_path, setup, log=log)
    if setup.store == "s3":
        if not setup.s3_endpoint:
            raise ValueError("store='s3' needs the server's URL in Setup.s3_endpoint (bench/e2e.py --store s3 "
                             "starts one)")
        upload(paths, setup, log=log)
    e2e.import_once()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    t_start = time.perf_counter()
    for s in setup.samplers:
        configs = [c for c in setup.configs if c != "litdata" or s == "shuffle"]
        runs[s] = {c: [] for c in configs}
        for r in range(setup.repeats):
            for c in e2e.rotated(configs, r):
                res = e2e.run_isolated(c, s, paths, setup, target=run_config)
                runs[s][c].append(res)
                log(f"  {s:<11} repeat {r + 1}/{setup.repeats}  {c:<22} {res['seconds']:6.2f} s  "
                    f"hit rate {res.get('hit_rate', float('nan')):6.1%}  load {res['load_average']:.1f}")
    from .e2e_parquet_report import summarize

    return {"setup": asdict(setup), "summary": {s: {c: summarize(rs) for c, rs in runs[s].items()} for s in runs},
            "runs": runs, "shards": paths, "wall_s": time.perf_counter() - t_start}
