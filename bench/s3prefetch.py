#!/usr/bin/env python3
"""bench/s3prefetch: what a prefetched item from the object store costs the
training process, by client.

opt4torch.DataLoader over opt4torch.S3ImageFolder (2 fork workers, batch 64,
3 epochs of shuffle, capacity 50 %, 32 prefetch threads (``--threads``), no model: only the
loading), the training process on one CPU and the loopback S3 server
(bench/s3server.py, moto, 5 ms a request) on the other, as in the split runs
of docs/e2e.md. For each client (``client="c"``: the engine's GETs in C;
``client="s3torchconnector"``: its GETs through the prefetcher's Python
callback), runs interleaved: the wall time, the training process's CPU (its
threads: the prefetcher's, the main loop's; not the workers'), and that CPU
per prefetched item. Medians of the repeats.

    python bench/s3prefetch.py [--images 2000] [--repeats 3] [--threads 32] [--out bench/results/s3prefetch.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _machine import machine  # noqa: E402
from s3server import Server  # noqa: E402

CLIENTS = ("c", "s3torchconnector")


def one_run(endpoint: str, client: str, epochs: int, threads: int) -> dict[str, Any]:
    import opt4torch

    ds = opt4torch.S3ImageFolder("s3://bench/images/", endpoint_url=endpoint, client=client)
    loader = opt4torch.DataLoader(ds, batch_size=64, shuffle=True, seed=0, num_workers=2, persistent_workers=True,
                                  multiprocessing_context="fork", cache_bytes=int(ds.item_sizes().sum() * 0.5),
                                  epochs=epochs, prefetch_threads=threads, collate_fn=list, progress=False)
    try:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        n = 0
        for _ in range(epochs):
            for batch in loader:
                n += len(batch)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        st = loader.cache.stats()
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        if st["hits"] != st["plan_hits"] or n != len(loader.cache.plan.seq):
            raise RuntimeError(f"the run was not exact: {st}")
        return {"client": ds.info()["client"], "wall_s": wall, "cpu_s": cpu, "prefetched": st["prefetched"],
                "fallbacks": st["fallbacks"], "samples": n,
                "cpu_us_per_prefetched": cpu * 1e6 / max(1, st["prefetched"])}
    finally:
        loader.cache.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=32, help="prefetch threads")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "s3prefetch.json"))
    args = ap.parse_args()
    if os.cpu_count() is None or os.cpu_count() < 2:
        raise SystemExit("bench/s3prefetch.py puts the server and the training process on CPUs of their own: "
                         "it needs two")
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret", AWS_DEFAULT_REGION="us-east-1",
                      AWS_EC2_METADATA_DISABLED="true")
    import boto3

    info = machine(("numpy", "opt4torchdataset", "torch", "s3torchconnector", "moto"))
    rows: list[dict[str, Any]] = []
    with Server(0.005, cpus="1") as server:
        s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="bench")
        rng = np.random.default_rng(0)
        for i in range(args.images):  # the e2e images' range of sizes, 15-97 KB
            body = rng.integers(0, 256, int(rng.integers(15_000, 97_000)), dtype=np.uint8).tobytes()
            s3.put_object(Bucket="bench", Key=f"images/c{i % 10}/{i:05d}.jpg", Body=body)
        os.sched_setaffinity(0, {0})  # the training process (and its workers) on CPU 0
        for rep in range(args.repeats):
            for client in CLIENTS:
                row = one_run(server.endpoint, client, args.epochs, args.threads)
                row["repeat"] = rep
                rows.append(row)
                print(f"{client:17s} repeat {rep + 1}/{args.repeats}: {row['wall_s']:5.2f} s, training process CPU "
                      f"{row['cpu_s']:5.2f} s, {row['prefetched']} prefetched, "
                      f"{row['cpu_us_per_prefetched']:.0f} us of CPU each", flush=True)
    summary = []
    for client in CLIENTS:
        mine = [r for r in rows if r["client"].startswith("c ") == (client == "c")]
        summary.append({"client": client, **{k: statistics.median(r[k] for r in mine)
                                             for k in ("wall_s", "cpu_s", "prefetched", "cpu_us_per_prefetched")}})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": info, "command": " ".join(["python", "bench/s3prefetch.py"] + sys.argv[1:]),
                   "args": vars(args), "summary": summary, "runs": rows}, f, indent=1)
    print("| client | wall (3 epochs) | training process CPU | prefetched | CPU per prefetched item |")
    print("|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['client']} | {s['wall_s']:.2f} s | {s['cpu_s']:.2f} s | {s['prefetched']:.0f} | "
              f"{s['cpu_us_per_prefetched']:.0f} µs |")


if __name__ == "__main__":
    main()
