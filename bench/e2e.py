#!/usr/bin/env python3
"""bench/e2e: a real training loop on an emulated slow store, every cache side by side.

A generated JPEG dataset (ImageFolder layout, packed into one record file), a
small CNN trained on the CPU for a few epochs with the real DataLoader and two
workers, decoding plus a random crop and flip after the cache. Every
configuration reads the same record file with O_DIRECT and the same emulated
latency per read (bandwidth folded in), applied in C to every reader:

  no cache; cachetools LRU, LFU, FIFO, RR (one cache of C items per worker, as
  users write them); one LRU shared through a multiprocessing manager; a static
  cache of the first C items (shared); OPT; OPT + prefetch; everything in memory;
  and, asked for with --configs, the real alternatives: MosaicML Streaming,
  LitData, OPT4TorchDataSet v1.1.0 (--v11-src PATH) and our compat layer for
  its API (opt4torch.lab.peers; run in the bench environment, make bench-env).

Under epoch shuffle, sampling with replacement and class-balanced weighted
sampling. Writes bench/results/e2e.md, e2e.json and two PNG plots. This file
is the full comparison's command line; the run itself is opt4torch.lab.e2e,
which `opt4torch demo` runs small (installed wheels have no bench/).

--format parquet: the same JPEGs as Hub-style Parquet shards (datasets'
to_parquet), read by datasets with torch's DataLoader, datasets in
opt4torch.DataLoader, opt4torch.Parquet (page ranges, row groups, a rewrite
in small row groups), LitData's ParquetLoader and in memory, locally or
(--store s3) over the S3 server (opt4torch.lab.e2e_parquet). Writes
<out>/e2e-parquet.{md,json} and e2e-parquet-epoch-time.png; --from-json A,B
draws several runs (local, over a link) side by side.

    python bench/e2e.py [--images 1000] [--epochs 3] [--capacity 0.5] [--latency 0.005]
        [--bandwidth 100e6] [--repeats 3] [--configs ...] [--samplers ...] [--data out/e2e-data]
        [--image-size-max PX] [--v11-src PATH] [--shard-bytes B] [--progress] [--store {file,s3}] [--link B]
        [--train-cpus LIST] [--server-cpus LIST] [--format {records,parquet}] [--shards N] [--small-row-group N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import machine  # noqa: E402
from s3server import parse_cpus  # noqa: E402

from opt4torch.lab import e2e_parquet  # noqa: E402
from opt4torch.lab.e2e import (  # noqa: E402
    ALL_CONFIGS, CONFIGS, SAMPLERS, Setup, markdown, prepare_data, run, write_outputs,
)


def _argv_setup(argv: Sequence[str] | None = None) -> tuple[Setup, Any]:
    d = Setup()
    ap = argparse.ArgumentParser(prog="bench/e2e.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=d.images)
    ap.add_argument("--classes", type=int, default=d.classes)
    ap.add_argument("--image-size", type=int, default=d.image_size)
    ap.add_argument("--image-size-max", type=int, default=d.image_size_max,
                    help="> --image-size: each image's side drawn from [image-size, image-size-max] "
                    "(160 to 400: JPEGs of 15 to 97 KB, mean 51 KB)")
    ap.add_argument("--crop", type=int, default=d.crop)
    ap.add_argument("--epochs", type=int, default=d.epochs)
    ap.add_argument("--batch", type=int, default=d.batch)
    ap.add_argument("--workers", type=int, default=d.workers)
    ap.add_argument("--capacity", type=float, default=d.capacity, help="cache size, a share of the images")
    ap.add_argument("--latency", type=float, default=d.latency, help="seconds per read (emulated)")
    ap.add_argument("--bandwidth", type=float, default=d.bandwidth,
                    help="bytes/s per read, folded into the latency (0: none)")
    ap.add_argument("--buffered", action="store_true", help="read without O_DIRECT")
    ap.add_argument("--store", choices=("file", "s3"), default=d.store,
                    help="file: the record file, latency and bandwidth emulated in C (default); s3: the images "
                    "(and the peers' shards) as objects on an S3-compatible server on 127.0.0.1 started here "
                    "(bench/s3server.py, moto), which adds --latency and --bandwidth to every request")
    ap.add_argument("--link", type=float, default=d.link,
                    help="with --store s3: bytes/s of one link all the server's responses share (0: none)")
    ap.add_argument("--train-cpus", default=d.train_cpus, metavar="LIST",
                    help="run the training process (and all it starts) on these CPUs, as 0 or 0-1 (default: all)")
    ap.add_argument("--server-cpus", default=d.server_cpus, metavar="LIST",
                    help="with --store s3: run the S3 server on these CPUs (default: all): with --train-cpus, "
                    "keeps the server's CPU off the training cores, as a store runs on machines of its own")
    ap.add_argument("--moto-gets", action="store_true",
                    help="with --store s3: the server answers every GET by moto, which reads the whole object for "
                    "each range (by default it answers from a copy of each object: bench/s3server.py)")
    ap.add_argument("--threads", type=int, default=d.threads, help="prefetch threads")
    ap.add_argument("--lookahead", type=int, default=d.lookahead)
    ap.add_argument("--repeats", type=int, default=d.repeats)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--format", choices=("records", "parquet"), default=d.format,
                    help="records: the record file (default); parquet: the same JPEGs as Hub-style Parquet shards, "
                    "the Parquet configurations (local files in the page cache, no emulated latency; with --store "
                    "s3 the server's)")
    ap.add_argument("--shards", type=int, default=d.parquet_shards, help="with --format parquet: shards")
    ap.add_argument("--small-row-group", type=int, default=d.small_row_group,
                    help="with --format parquet: rows a row group of the rewrite parquet-opt-small reads")
    ap.add_argument("--configs", default=None,
                    help="comma-separated, of: " + ", ".join(ALL_CONFIGS) + " (default: the first "
                    f"{len(CONFIGS)}; 'all' for every one); with --format parquet, of: "
                    + ", ".join(e2e_parquet.CONFIGS) + " (default and 'all': every one)")
    ap.add_argument("--v11-src", default=d.v11_src, metavar="PATH",
                    help="a checkout of OPT4TorchDataSet v1.1.0 (its repository's root): the "
                    "'OPT4TorchDataSet v1.1.0' configuration builds its extension from it (docs/e2e.md)")
    ap.add_argument("--shard-bytes", type=int, default=d.shard_bytes,
                    help="Streaming's and LitData's shard size (default: theirs, 64 MiB, made smaller when "
                    "the cache budget would hold fewer than 8 shards)")
    ap.add_argument("--progress", action="store_true", help="tqdm bars: data generation, each run's batches")
    ap.add_argument("--samplers", default=None, help="comma-separated, of: " + ", ".join(SAMPLERS)
                    + " (default: all; with --format parquet: shuffle)")
    ap.add_argument("--data", default="out/e2e-data", help="where the JPEGs and the record file go "
                    "(made once, reused; a disk, not tmpfs, for O_DIRECT)")
    ap.add_argument("--out", default="bench/results", help="where e2e.md, e2e.json and the plots go")
    ap.add_argument("--name", default=None, help="file name prefix of the outputs (default: e2e; with --format "
                    "parquet: e2e-parquet)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--from-json", default=None, metavar="PATH",
                    help="do not run: rewrite the table and plots of an earlier run's JSON (with --format parquet: "
                    "A,B,...: each one's table, and their epoch times side by side in <name>-epoch-time.png)")
    a = ap.parse_args(argv)
    parquet = a.format == "parquet"
    every = e2e_parquet.CONFIGS if parquet else ALL_CONFIGS
    if a.configs is None:
        a.configs = ",".join(e2e_parquet.CONFIGS if parquet else CONFIGS)
    if a.samplers is None:
        a.samplers = "shuffle" if parquet else ",".join(SAMPLERS)
    if a.name is None:
        a.name = "e2e-parquet" if parquet else "e2e"
    setup = Setup(images=a.images, classes=a.classes, image_size=a.image_size, crop=a.crop, epochs=a.epochs,
                  batch=a.batch, workers=a.workers, capacity=a.capacity, latency=a.latency,
                  bandwidth=a.bandwidth, direct=not a.buffered, threads=a.threads, lookahead=a.lookahead,
                  repeats=a.repeats, seed=a.seed,
                  configs=(list(every) if a.configs.strip() == "all"
                           else [c.strip() for c in a.configs.split(",") if c.strip()]),
                  samplers=[s.strip() for s in a.samplers.split(",") if s.strip()],
                  image_size_max=a.image_size_max, v11_src=a.v11_src, shard_bytes=a.shard_bytes,
                  progress=a.progress, store=a.store, link=a.link, train_cpus=a.train_cpus,
                  server_cpus=a.server_cpus, moto_gets=a.moto_gets, format=a.format, parquet_shards=a.shards,
                  small_row_group=a.small_row_group)
    for opt in ("train_cpus", "server_cpus"):
        if getattr(a, opt):
            try:
                parse_cpus(getattr(a, opt))
            except ValueError as e:
                ap.error(f"--{opt.replace('_', '-')}: {e}")
    for opt in ("server_cpus", "moto_gets"):
        if getattr(a, opt) and a.store != "s3":
            ap.error(f"--{opt.replace('_', '-')}: there is a server only with --store s3")
    return setup, a


def main(argv: Sequence[str] | None = None) -> int:
    setup, a = _argv_setup(argv)
    info = machine(("numpy", "opt4torchdataset", "torch", "cachetools", "pillow", "mosaicml-streaming",
                    "litdata", "torchvision", "datasets", "pyarrow", "polars"))
    if a.from_json and setup.format == "parquet":
        return _parquet_from_json(a.from_json.split(","), a, info)
    if a.from_json:
        with open(a.from_json) as f:
            result = json.load(f)
        info = result.pop("machine", None) or info
        print(markdown(result))
        print("\nwrote " + ", ".join(write_outputs(result, a.out, info, prefix=a.name, plots=not a.no_plots)))
        return 0
    path = prepare_data(a.data, setup, log=lambda m: print(m, file=sys.stderr))
    runner = e2e_parquet.run if setup.format == "parquet" else run
    uptime0 = _uptime()
    if setup.train_cpus:  # after the data is made (on every core); threads and processes started later inherit it
        os.sched_setaffinity(0, parse_cpus(setup.train_cpus))
    if setup.store == "s3":
        from s3server import Server

        # The loopback server takes any credentials; the clients (boto3,
        # s3torchconnector, the peers') take these and the endpoint as boto3
        # does, and Streaming its own S3_ENDPOINT_URL.
        for k, v in (("AWS_ACCESS_KEY_ID", "opt4-e2e"), ("AWS_SECRET_ACCESS_KEY", "opt4-e2e"),
                     ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_REGION", "us-east-1"),
                     ("AWS_EC2_METADATA_DISABLED", "true")):
            os.environ[k] = v
        with Server(setup.latency, bandwidth=setup.bandwidth, link=setup.link, cpus=setup.server_cpus,
                    moto_gets=setup.moto_gets) as server:
            setup.s3_endpoint, setup.s3_server_pid = server.endpoint, server.proc.pid
            os.environ["AWS_ENDPOINT_URL"] = os.environ["S3_ENDPOINT_URL"] = server.endpoint
            print(f"S3 server at {server.endpoint} (pid {server.proc.pid})", file=sys.stderr)
            result = runner(setup, path, log=lambda m: print(m, file=sys.stderr))
    else:
        result = runner(setup, path, log=lambda m: print(m, file=sys.stderr))
    result["command"] = ["python", "bench/e2e.py", *(argv if argv is not None else sys.argv[1:])]
    if setup.format == "parquet":
        from opt4torch.lab import e2e_parquet_report as report

        result["uptime"] = [uptime0, _uptime()]
        print(report.markdown(result))
        written = report.write_outputs(result, a.out, info, prefix=a.name, plots=not a.no_plots)
    else:
        print(markdown(result))
        written = write_outputs(result, a.out, info, prefix=a.name, plots=not a.no_plots)
    print("\nwrote " + ", ".join(written))
    return 0


def _uptime() -> str:
    """The machine's load as `uptime` prints it (the runs share it)."""
    import subprocess

    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _parquet_from_json(paths: list[str], a: Any, info: dict[str, Any]) -> int:
    """Parquet runs' JSONs: each one's table again, and one plot of them all."""
    from opt4torch.lab import e2e_parquet_report as report

    results = {}
    for p in paths:
        with open(p) as f:
            result = json.load(f)
        machine_info = result.pop("machine", None) or info
        name = os.path.basename(p).removesuffix(".json")
        print("wrote " + ", ".join(report.write_outputs(result, a.out, machine_info, prefix=name, plots=False)))
        results[report.panel_title(result)] = result
    if not a.no_plots:
        os.makedirs(a.out, exist_ok=True)
        print("wrote " + report.plot(results, os.path.join(a.out, f"{a.name}-epoch-time.png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
