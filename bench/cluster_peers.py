#!/usr/bin/env python3
"""bench/cluster_peers: MosaicML Streaming and LitData as rows of
bench/cluster.py's S3 comparison (issue 36), each run as 4 ranks over the
same items on the same S3 server.

They run as the 4 ranks of one node (``torchrun --nproc-per-node 4``), their
natural mode on one machine: posing as four nodes of one rank each, four
processes on one machine broke both (bench/RESULTS.md, "Over storage every
node shares"). Their ranks then share one local cache, of the four nodes'
capacities together. Run with a Python that has them (``--peer-python``
of bench/cluster.py; ``make bench-env`` makes .venv-bench):

    python bench/cluster_peers.py --prepare RECORDS OUT_DIR --shard-bytes B   (convert; once)
    torchrun --nproc-per-node 4 bench/cluster_peers.py --rank-run --config Streaming|LitData \\
        --url s3://BUCKET/PREFIX --cache DIR --budget BYTES --epochs E --batch B --workers W --out PREFIX

Each rank writes ``<out>.<rank>.json``: its epoch times and samples. The
bytes are the server's count (bench/cluster.py reads it around the job).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

STREAMING, LITDATA = "Streaming", "LitData"
#: The peer configurations bench/cluster.py offers.
PEERS = (STREAMING, LITDATA)


def prepare(records: str, out: str, shard_bytes: int) -> dict[str, str]:
    """The record file's items in each peer's shard format, under ``out``
    (``mds/``, ``litdata/``): their own writers, as their docs show
    (opt4torch.lab.peers, which bench/e2e.py converts with too)."""
    from opt4torch.lab import peers

    made = {}
    for name, sub, convert in ((STREAMING, "mds", peers._convert_streaming),
                               (LITDATA, "litdata", peers._convert_litdata)):
        d = os.path.join(out, sub)
        convert(records, d, shard_bytes)
        made[name] = d
    return made


def _as_bytes(obj: dict[str, Any]) -> tuple[bytes, int]:
    return bytes(obj["jpeg"]), int(obj["label"])


def rank_main(args: argparse.Namespace) -> None:
    """One rank of a peer's job: its dataset over the S3 prefix, its loader,
    ``args.epochs`` epochs of its shuffle; every sample counted."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    if args.config == STREAMING:
        from streaming import StreamingDataset

        os.environ.setdefault("S3_ENDPOINT_URL", endpoint)  # its boto3 downloader's endpoint
        ds: Any = StreamingDataset(remote=args.url, local=args.cache, shuffle=True, shuffle_seed=0,
                                   batch_size=args.batch, cache_limit=args.budget)
        from torch.utils.data import DataLoader

        loader: Any = DataLoader(ds, batch_size=args.batch, num_workers=args.workers,
                                 persistent_workers=args.workers > 0, multiprocessing_context="fork",
                                 collate_fn=list)
    else:
        from litdata import StreamingDataLoader, StreamingDataset
        from litdata.streaming import downloader as dl
        from litdata.streaming.resolver import Dir

        if hasattr(dl, "_OBSTORE_CLIENT_OPTIONS"):  # obstore refuses plain http unless told
            dl._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
        # Its samples hold the bytes as a memoryview, which a worker cannot
        # pickle into its result queue: the queue's feeder thread fails
        # ("cannot pickle memoryview objects") and the loader waits for good.
        # Bytes, as the other configurations hand out.
        ds = StreamingDataset(input_dir=Dir(path=args.cache, url=args.url), max_cache_size=args.budget,
                              shuffle=True, seed=0, storage_options={"endpoint_url": endpoint},
                              transform=_as_bytes)
        loader = StreamingDataLoader(ds, batch_size=args.batch, num_workers=args.workers,
                                     persistent_workers=args.workers > 0, collate_fn=list)
    a = torch.randn(96, 96)
    dist.barrier()
    times, samples = [], []
    for _ in range(args.epochs):
        t0 = time.perf_counter()
        n = 0
        for batch in loader:
            n += len(batch)
            for _ in range(len(batch)):  # bench/cluster.py's step
                a = torch.tanh(a @ a)
        times.append(time.perf_counter() - t0)
        samples.append(n)
    with open(f"{args.out}.{rank}.json", "w") as f:
        json.dump({"rank": rank, "epoch_seconds": times, "samples": samples}, f)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", nargs=2, metavar=("RECORDS", "OUT_DIR"))
    ap.add_argument("--shard-bytes", type=int, default=1 << 20)
    ap.add_argument("--rank-run", action="store_true")
    ap.add_argument("--config", choices=PEERS)
    ap.add_argument("--url")
    ap.add_argument("--cache")
    ap.add_argument("--budget", type=int)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.prepare:
        json.dump(prepare(*args.prepare, args.shard_bytes), sys.stdout)
    elif args.rank_run:
        rank_main(args)
    else:
        ap.error("--prepare or --rank-run")


if __name__ == "__main__":
    main()
