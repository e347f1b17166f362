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

    python bench/e2e.py [--images 1000] [--epochs 3] [--capacity 0.5] [--latency 0.005]
        [--bandwidth 100e6] [--repeats 3] [--configs ...] [--samplers ...] [--data out/e2e-data]
        [--image-size-max PX] [--v11-src PATH] [--shard-bytes B] [--progress] [--store {file,s3}] [--link B]
        [--train-cpus LIST] [--server-cpus LIST]
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
    ap.add_argument("--threads", type=int, default=d.threads, help="prefetch threads")
    ap.add_argument("--lookahead", type=int, default=d.lookahead)
    ap.add_argument("--repeats", type=int, default=d.repeats)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated, of: " + ", ".join(ALL_CONFIGS) + " (default: the first "
                    f"{len(CONFIGS)}; 'all' for every one)")
    ap.add_argument("--v11-src", default=d.v11_src, metavar="PATH",
                    help="a checkout of OPT4TorchDataSet v1.1.0 (its repository's root): the "
                    "'OPT4TorchDataSet v1.1.0' configuration builds its extension from it (docs/e2e.md)")
    ap.add_argument("--shard-bytes", type=int, default=d.shard_bytes,
                    help="Streaming's and LitData's shard size (default: theirs, 64 MiB, made smaller when "
                    "the cache budget would hold fewer than 8 shards)")
    ap.add_argument("--progress", action="store_true", help="tqdm bars: data generation, each run's batches")
    ap.add_argument("--samplers", default=",".join(SAMPLERS), help="comma-separated, of: " + ", ".join(SAMPLERS))
    ap.add_argument("--data", default="out/e2e-data", help="where the JPEGs and the record file go "
                    "(made once, reused; a disk, not tmpfs, for O_DIRECT)")
    ap.add_argument("--out", default="bench/results", help="where e2e.md, e2e.json and the plots go")
    ap.add_argument("--name", default="e2e", help="file name prefix of the outputs (default: %(default)s)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--from-json", default=None, metavar="PATH",
                    help="do not run: rewrite the table and plots of an earlier run's JSON")
    a = ap.parse_args(argv)
    setup = Setup(images=a.images, classes=a.classes, image_size=a.image_size, crop=a.crop, epochs=a.epochs,
                  batch=a.batch, workers=a.workers, capacity=a.capacity, latency=a.latency,
                  bandwidth=a.bandwidth, direct=not a.buffered, threads=a.threads, lookahead=a.lookahead,
                  repeats=a.repeats, seed=a.seed,
                  configs=(list(ALL_CONFIGS) if a.configs.strip() == "all"
                           else [c.strip() for c in a.configs.split(",") if c.strip()]),
                  samplers=[s.strip() for s in a.samplers.split(",") if s.strip()],
                  image_size_max=a.image_size_max, v11_src=a.v11_src, shard_bytes=a.shard_bytes,
                  progress=a.progress, store=a.store, link=a.link, train_cpus=a.train_cpus,
                  server_cpus=a.server_cpus)
    for opt in ("train_cpus", "server_cpus"):
        if getattr(a, opt):
            try:
                parse_cpus(getattr(a, opt))
            except ValueError as e:
                ap.error(f"--{opt.replace('_', '-')}: {e}")
    if a.server_cpus and a.store != "s3":
        ap.error("--server-cpus: there is a server only with --store s3")
    return setup, a


def main(argv: Sequence[str] | None = None) -> int:
    setup, a = _argv_setup(argv)
    info = machine(("numpy", "opt4torchdataset", "torch", "cachetools", "pillow", "mosaicml-streaming",
                    "litdata", "torchvision"))
    if a.from_json:
        with open(a.from_json) as f:
            result = json.load(f)
        info = result.pop("machine", None) or info
        print(markdown(result))
        print("\nwrote " + ", ".join(write_outputs(result, a.out, info, prefix=a.name, plots=not a.no_plots)))
        return 0
    path = prepare_data(a.data, setup, log=lambda m: print(m, file=sys.stderr))
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
        with Server(setup.latency, bandwidth=setup.bandwidth, link=setup.link, cpus=setup.server_cpus) as server:
            setup.s3_endpoint, setup.s3_server_pid = server.endpoint, server.proc.pid
            os.environ["AWS_ENDPOINT_URL"] = os.environ["S3_ENDPOINT_URL"] = server.endpoint
            print(f"S3 server at {server.endpoint} (pid {server.proc.pid})", file=sys.stderr)
            result = run(setup, path, log=lambda m: print(m, file=sys.stderr))
    else:
        result = run(setup, path, log=lambda m: print(m, file=sys.stderr))
    result["command"] = ["python", "bench/e2e.py", *(argv if argv is not None else sys.argv[1:])]
    print(markdown(result))
    written = write_outputs(result, a.out, info, prefix=a.name, plots=not a.no_plots)
    print("\nwrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
