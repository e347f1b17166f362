#!/usr/bin/env python3
"""bench/s3clients: which S3 client the object-store source uses, measured.

Many small ranged GETs (objects of 1-40 KiB, each read whole as one byte
range, as the source reads an image) from T threads of one process, against
the loopback S3 server (bench/s3server.py, moto) with latency added at the
server, for each client:

* ``obstore`` (Rust object_store over tokio/reqwest): ``obstore.get_range``;
* ``boto3`` (Python, botocore over urllib3): ``get_object(Range=...)``, one
  client shared by the threads (botocore clients are thread-safe), its pool
  sized to the threads;
* ``s3torchconnector`` (Rust, the AWS CRT): ``S3Client``'s native
  ``get_object(bucket, key, start, end)``;
* ``opt4-c``: the engine's own GET (``_engine.S3Ranges.read``: libcurl,
  SigV4 signed in C, the GIL released for the whole request), as
  ``opt4torch.S3ImageFolder`` reads with ``client="c"``. Called here from
  Python threads like the others; the C prefetch threads call it with no
  Python at all.

Per client and thread count: requests per second, the process's CPU time
(user + system, all its threads) per request, and how much of the GIL the
client left to Python: a thread that only counts runs beside the readers,
and its count is compared with its count alone over as long (1.0: the
readers never held the GIL; 0.5: held half the time). Then each client is
used in a forked child after the parent used it: does it answer, or hang?

    python bench/s3clients.py [--threads 8,16,32] [--requests 1500]
        [--latency 0.01] [--out bench/results/s3clients.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import machine  # noqa: E402

BUCKET = "clients"
REGION = "us-east-1"
CLIENTS = ("obstore", "boto3", "s3torchconnector", "opt4-c")


def start_server(latency: float) -> tuple[subprocess.Popen[str], str]:
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, os.path.join(here, "s3server.py"), "--latency", str(latency)],
                            stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"the S3 server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def make_reader(name: str, endpoint: str, threads: int,
                objects: list[tuple[str, int]] | None = None) -> Callable[[str, int], bytes]:
    """A function (key, size) -> the object's bytes, by one ranged GET
    (``objects``: every (key, size) it will be asked for; opt4-c needs them)."""
    if name == "opt4-c":
        from opt4torch import _engine

        objects = list(objects or [])
        index = {key: i for i, (key, _) in enumerate(objects)}
        rows = np.array([(i, 0, size) for i, (_, size) in enumerate(objects)], dtype=np.int64).reshape(-1, 3)
        reader = _engine.S3Ranges(endpoint, BUCKET, [k for k, _ in objects], rows, region=REGION,
                                  access_key="testing", secret_key="testing", path_style=True)
        return lambda key, size: reader.read(index[key])
    if name == "obstore":
        import obstore
        from obstore.store import S3Store

        store = S3Store(BUCKET, endpoint=endpoint, region=REGION, access_key_id="testing",
                        secret_access_key="testing", client_options={"allow_http": True})
        return lambda key, size: bytes(obstore.get_range(store, key, start=0, length=size))
    if name == "boto3":
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                              aws_secret_access_key="testing",
                              config=Config(max_pool_connections=threads, retries={"max_attempts": 3}))
        return lambda key, size: client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes=0-{size - 1}")["Body"].read()
    from s3torchconnector._s3client import S3Client, S3ClientConfig

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    s3 = S3Client(REGION, endpoint=endpoint, s3client_config=S3ClientConfig(force_path_style=True))
    return lambda key, size: b"".join(s3._client.get_object(BUCKET, key, 0, size))


def ticker(stop: threading.Event, out: list[int]) -> None:
    n = 0
    while not stop.is_set():
        for _ in range(1000):
            n += 1
    out.append(n)


def tick_rate(seconds: float) -> float:
    stop, out = threading.Event(), []
    t = threading.Thread(target=ticker, args=(stop, out))
    t0 = time.perf_counter()
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join()
    return out[0] / (time.perf_counter() - t0)


def run(name: str, endpoint: str, threads: int, keys: list[tuple[str, int]], alone: float,
        objects: list[tuple[str, int]]) -> dict[str, Any]:
    read = make_reader(name, endpoint, threads, objects)
    for key, size in keys[:threads]:  # connections up, runtime started
        read(key, size)
    next_i = [0]
    lock = threading.Lock()
    errors: list[str] = []

    def worker() -> None:
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= len(keys):
                return
            key, size = keys[i]
            try:
                if len(read(key, size)) != size:
                    errors.append(f"{key}: short")
            except Exception as exc:  # noqa: BLE001 - counted and shown
                errors.append(f"{key}: {exc}")

    def once(with_ticker: bool) -> tuple[float, float, int]:
        next_i[0] = 0
        stop, ticks = threading.Event(), [0]
        tk = threading.Thread(target=ticker, args=(stop, ticks))
        pool = [threading.Thread(target=worker) for _ in range(threads)]
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        if with_ticker:
            tk.start()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        wall = time.perf_counter() - t0
        stop.set()
        if with_ticker:
            tk.join()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), ticks[-1]

    # Throughput and CPU with the readers alone; then again beside a thread
    # that only counts, for the share of the GIL they leave to Python.
    wall, cpu, _ = once(False)
    wall_t, _, ticks = once(True)
    return {"client": name, "threads": threads, "requests": len(keys), "seconds": wall,
            "requests_per_s": len(keys) / wall, "cpu_s": cpu,
            "cpu_us_per_request": cpu / len(keys) * 1e6,
            "gil_left": ticks / (alone * wall_t), "errors": len(errors), "first_error": errors[:1]}


FORK_CHILD = """
import os, sys
sys.path.insert(0, {here!r})
from s3clients import make_reader
read = make_reader({name!r}, {endpoint!r}, 4, [({key!r}, {size})])
read({key!r}, {size})
import time
t0 = time.perf_counter()
pid = os.fork()
if pid != 0:
    print("FORK_SECONDS", time.perf_counter() - t0, flush=True)
if pid == 0:
    try:
        read({key!r}, {size})
        os._exit(0)
    except BaseException as exc:
        print(type(exc).__name__, exc, flush=True)
        os._exit(3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def fork_check(name: str, endpoint: str, key: str, size: int) -> str:
    """Use the client in a process, fork, use it in the child (the same
    client object, or a new one where the client makes one per process)."""
    code = FORK_CHILD.format(here=os.path.dirname(os.path.abspath(__file__)), name=name, endpoint=endpoint,
                             key=key, size=size)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "the child hangs (killed after 20 s)"
    took = [float(line.split()[1]) for line in out.splitlines() if line.startswith("FORK_SECONDS")]
    fork_s = f" (os.fork took {took[0] * 1e3:.0f} ms in the parent)" if took else ""
    return ("works" + fork_s) if proc.returncode == 0 else f"fails ({proc.returncode}): {out.strip()[-200:]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--threads", default="8,16,32")
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--objects", type=int, default=500)
    ap.add_argument("--latency", type=float, default=0.01)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "s3clients.json"))
    args = ap.parse_args()
    clients = [c for c in args.clients.split(",") if c]
    server, endpoint = start_server(args.latency)
    try:
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                          aws_secret_access_key="testing")
        s3.create_bucket(Bucket=BUCKET)
        rng = np.random.default_rng(0)
        sizes = rng.integers(1024, 40 * 1024, size=args.objects)
        objects = []
        for i, size in enumerate(sizes):
            key = f"obj/{i:05d}.jpg"
            s3.put_object(Bucket=BUCKET, Key=key, Body=rng.integers(0, 256, int(size), dtype=np.uint8).tobytes())
            objects.append((key, int(size)))
        picks = rng.integers(0, len(objects), size=args.requests)
        keys = [objects[int(k)] for k in picks]
        alone = statistics.median(tick_rate(0.5) for _ in range(3))
        rows = []
        for rep in range(args.repeats):
            for threads in (int(t) for t in args.threads.split(",")):
                for name in clients:
                    row = run(name, endpoint, threads, keys, alone, objects)
                    row["repeat"] = rep
                    rows.append(row)
                    print(f"{name:17s} {threads:3d} threads: {row['requests_per_s']:7.0f} req/s, "
                          f"{row['cpu_us_per_request']:6.0f} us CPU/req, GIL left {row['gil_left']:.2f}, "
                          f"errors {row['errors']}", flush=True)
        forks = {name: fork_check(name, endpoint, *objects[0]) for name in clients}
        for name, what in forks.items():
            print(f"fork, {name}: {what}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    summary = []
    for threads in sorted({r["threads"] for r in rows}):
        for name in clients:
            mine = [r for r in rows if r["client"] == name and r["threads"] == threads]
            summary.append({"client": name, "threads": threads,
                            "requests_per_s": statistics.median(r["requests_per_s"] for r in mine),
                            "cpu_us_per_request": statistics.median(r["cpu_us_per_request"] for r in mine),
                            "gil_left": statistics.median(r["gil_left"] for r in mine),
                            "errors": sum(r["errors"] for r in mine)})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": machine(("obstore", "boto3", "botocore", "s3torchconnector", "moto", "opt4torchdataset")),
                   "args": vars(args), "summary": summary, "fork": forks, "runs": rows}, f, indent=1)
    print("| client | threads | requests/s | CPU per request | a Python thread's progress beside them |")
    print("|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['client']} | {s['threads']} | {s['requests_per_s']:,.0f} | {s['cpu_us_per_request']:,.0f} µs "
              f"| {s['gil_left']:.2f} |")


if __name__ == "__main__":
    main()
