#!/usr/bin/env python3
"""bench/objstore: training from an S3-compatible object store, through the
public API (``opt4torch.S3ImageFolder``).

N objects of 1 to 40 KiB (random bytes, in 10 class folders) are put in the
loopback S3 server (bench/s3server.py: moto's server with the latency added
at the server, so every configuration pays it per request), then read for E
epochs of epoch shuffle by W fork workers, with a CPU-bound training step per
batch (single-threaded torch matrix products, a fixed count, about 90 ms a
batch here by default: the loopback server serves about 600 small GETs a second, and
a faster loop would measure it rather than the loader; on a 2-core
machine the CPU our threads and the server take comes out of it), four ways:

* in memory: the same items from a list in RAM, plain torch DataLoader;
* no cache: plain torch DataLoader over ``S3ImageFolder`` (every access a GET);
* OPT: ``opt4torch.DataLoader`` at C % capacity (bytes), prefetch off;
* OPT + prefetch: the same, prefetch on (the C threads call ``ds[i]``).

Every configuration runs once per repeat, interleaved; medians are reported.
Per row: time and CPU (user + system of this process with its threads, plus
its workers once joined) against in memory, the server's CPU (it runs on the
same cores), the stall rate, hits against the plan's, the bytes read from the
store against the plan's miss bytes, and the GETs the server saw.

    python bench/objstore.py [--items 2000] [--latency 0.01] [--epochs 3]
        [--capacity 0.5] [--batch 32] [--workers 2] [--step-reps 600]
        [--threads 16] [--repeats 3] [--out bench/results/objstore.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import machine  # noqa: E402
from callback_prefetch import step_work, train  # noqa: E402
from prefetch import InMemory, cpu_seconds  # noqa: E402
from s3server import Server  # noqa: E402

import opt4torch  # noqa: E402

CONFIGS = ("in memory", "no cache", "OPT", "OPT + prefetch")
BUCKET, KEY, SECRET, REGION = "bench", "bench-key", "bench-secret", "us-east-1"


def fill(server: Server, n: int, seed: int) -> list[tuple[bytes, int]]:
    """The objects, prefix train/, class c<k>; returns the items in the
    dataset's order."""
    import boto3
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1024, 40 * 1024, size=n)
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name=REGION, aws_access_key_id=KEY,
                          aws_secret_access_key=SECRET)
    client.create_bucket(Bucket=BUCKET)
    blobs = [rng.integers(0, 256, size=int(s), dtype=np.uint8).tobytes() for s in sizes]

    def put(i: int) -> None:
        client.put_object(Bucket=BUCKET, Key=f"train/c{i % 10}/{i:06d}.jpg", Body=blobs[i])

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(put, range(n)))
    # The dataset's order: classes sorted, names sorted within.
    return [(blobs[i], c) for c in range(10) for i in range(c, n, 10)]


def run_config(config: str, ds: Any, items: list[Any], server: Server, args: argparse.Namespace,
               work: tuple[torch.Tensor, int, float]) -> dict[str, Any]:
    common = dict(batch_size=args.batch, num_workers=args.workers, collate_fn=list,
                  persistent_workers=True, multiprocessing_context="fork")
    out: dict[str, Any] = {"config": config}
    gc.collect()
    before, srv_before = ds.info(), server.call("stats")
    cpu0, srv_cpu0 = cpu_seconds(), server.cpu_seconds()
    if config in ("in memory", "no cache"):
        data = InMemory(items) if config == "in memory" else ds
        loader: Any = DataLoader(data, sampler=RandomSampler(data, generator=torch.Generator().manual_seed(0)),
                                 **common)
    else:
        loader = opt4torch.DataLoader(ds, shuffle=True, seed=0, epochs=args.epochs,
                                      cache_bytes=int(args.capacity * int(ds.item_sizes().sum())),
                                      prefetch=config == "OPT + prefetch", prefetch_threads=args.threads, **common)
    seconds, n = train(loader, args.epochs, work[0], work[1])
    out.update(seconds=seconds, samples=n)
    if isinstance(loader, opt4torch.DataLoader):
        st = loader.cache.stats()
        plan = loader.cache.plan
        out.update(hits=st["hits"], plan_hits=st["plan_hits"], stall_rate=st["stall_rate"],
                   fallbacks=st["fallbacks"], kind=st.get("prefetcher", {}).get("kind"),
                   threads_reading=st.get("prefetcher", {}).get("active"),
                   plan_miss_bytes=int(ds.item_sizes()[plan.seq[plan.kinds != opt4torch.HIT]].sum()))
        loader.cache.close()
    del loader
    gc.collect()  # the workers are joined here, so RUSAGE_CHILDREN has them
    out["cpu_s"] = cpu_seconds() - cpu0
    out["server_cpu_s"] = server.cpu_seconds() - srv_cpu0
    after, srv_after = ds.info(), server.call("stats")
    out["storage_bytes"] = after["bytes_read"] - before["bytes_read"]
    out["storage_reads"] = after["reads"] - before["reads"]
    out["requests"] = after["requests"] - before["requests"]
    out["server_gets"] = srv_after["gets"] - srv_before["gets"]
    out["server_get_bytes"] = srv_after["get_bytes"] - srv_before["get_bytes"]
    return out


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
    rows = ["| configuration | time | vs in memory | CPU | CPU vs in memory | server CPU | stall rate "
            "| hits (plan) | bytes read (plan's miss bytes) | GETs at the server |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    med = {c: statistics.median(x["seconds"] for x in runs[c]) for c in runs}
    cpu = {c: statistics.median(x["cpu_s"] for x in runs[c]) for c in runs}
    for c in runs:
        x = runs[c][-1]
        srv = statistics.median(y["server_cpu_s"] for y in runs[c])
        row = [c, f"{med[c]:.2f} s", f"{med[c] / med['in memory']:.2f}x", f"{cpu[c]:.2f} s",
               f"{cpu[c] / cpu['in memory']:.2f}x", f"{srv:.2f} s"]
        if c == "in memory":
            row += ["–", "–", "–", "–"]
        elif c == "no cache":
            row += ["100 %", "0", f"{x['storage_bytes']:,}", f"{x['server_gets']:,}"]
        else:
            stall = statistics.median(y["stall_rate"] for y in runs[c])
            exact = all(y["storage_bytes"] == y["plan_miss_bytes"] for y in runs[c])
            row += [f"{stall:.2%}", f"{x['hits']:,} ({x['plan_hits']:,})",
                    f"{x['storage_bytes']:,} ({'equal' if exact else format(x['plan_miss_bytes'], ',')})",
                    f"{x['server_gets']:,}"]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--latency", type=float, default=0.01, help="seconds the server adds to every request")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--capacity", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--step-reps", type=int, default=600,
                    help="matrix products per batch: the CPU-bound training step (its time here is printed); "
                         "the default asks for fewer items a second than the loopback server can serve")
    ap.add_argument("--threads", type=int, default=16, help="prefetch threads at the start")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="which to run (in memory always runs: the others are compared with it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "objstore.json"))
    args = ap.parse_args()
    configs = ["in memory"] + [c for c in CONFIGS[1:] if c in args.configs.split(",")]
    torch.set_num_threads(1)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION=REGION,
                      AWS_EC2_METADATA_DISABLED="true")
    work = step_work(args.step_reps)
    # What a step takes here, after a warm-up (step_work's own figure
    # includes torch's first calls).
    a = work[0]
    for _ in range(3 * args.step_reps):
        a = torch.tanh(a @ a)
    t0 = time.perf_counter()
    for _ in range(10 * args.step_reps):
        a = torch.tanh(a @ a)
    work = (work[0], work[1], (time.perf_counter() - t0) / 10)
    print(f"training step: {args.step_reps} products, {work[2] * 1000:.1f} ms a batch here", flush=True)
    server = Server(0.0, KEY)
    try:
        t0 = time.perf_counter()
        items = fill(server, args.items, args.seed)
        server.call("set", latency=args.latency)
        ds = opt4torch.S3ImageFolder(f"s3://{BUCKET}/train/", endpoint_url=server.endpoint)
        assert len(ds) == len(items) and all(ds[i] == items[i] for i in range(0, len(ds), 97))
        print(f"data: {len(ds)} objects, {int(ds.item_sizes().sum()):,} bytes, in {time.perf_counter() - t0:.1f} s; "
              f"server latency {args.latency * 1e3:g} ms", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
        for r in range(args.repeats):
            for c in configs:
                res = run_config(c, ds, items, server, args, work)
                runs[c].append(res)
                print(f"  repeat {r + 1}, {c}: {res['seconds']:.2f} s, cpu {res['cpu_s']:.2f} s, server cpu "
                      f"{res['server_cpu_s']:.2f} s, stalls {res.get('stall_rate', 0):.2%}, "
                      f"bytes {res['storage_bytes']:,} (plan {res.get('plan_miss_bytes', '-')}), "
                      f"GETs {res['server_gets']:,} {res.get('kind') or ''} {res.get('threads_reading') or ''}",
                      flush=True)
    finally:
        server.stop()
    head = (f"{args.items} objects of 1-40 KiB in the loopback S3 server (moto, {args.latency * 1e3:g} ms a "
            f"request at the server), {args.epochs} epochs of epoch shuffle, capacity {args.capacity:.0%} of the "
            f"bytes, batch {args.batch}, {args.workers} fork workers (persistent), {work[2] * 1000:.1f} ms CPU step "
            f"a batch, {args.threads} prefetch threads at the start; medians of {args.repeats}")
    print(f"\n{head}\n")
    print(table(runs))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    info = machine(("numpy", "opt4torchdataset", "torch", "s3torchconnector", "moto"))
    with open(args.out, "w") as f:
        json.dump({"machine": info, "args": vars(args), "step_seconds": work[2], "results": runs}, f, indent=1)
    md = os.path.splitext(args.out)[0] + ".md"
    with open(md, "w") as f:
        f.write(f"# bench/objstore.py\n\n{head}.\n\n{table(runs)}\n\nMachine: {json.dumps(info)}\n")
    print(f"\nraw results: {args.out}, table: {md}")


if __name__ == "__main__":
    main()
