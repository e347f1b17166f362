#!/usr/bin/env python3
"""bench/lookup: what a cache hit costs at run time, and what N workers cost
in memory.

1. The C hit path (bench/lookup.c, built by CMake): ns per HIT in the pool,
   with 16-byte items (the path's own overhead) and 4 KiB items, beside a
   bare memcpy of the same size.
2. The Python batch path: PlannedDataset.__getitems__ on batches of 256
   positions that all HIT, per item, for 4 KiB items of three kinds: bytes,
   (bytes, label) pairs and float32 tensors. Beside it, the binding's
   read_batch alone (the C read of the batch into one bytearray) and
   read_batch followed by the Python codec's decode of each record.
3. Memory: N worker processes attached to one pool, each reading every item,
   against N workers that each keep a private dict of the same items (the
   earlier design's per-worker caches). PSS (proportional set size) splits
   shared pages among the processes that map them, so its sum is the real
   cost: one pool, not N.

    python bench/lookup.py [--workers 4] [--items 4096] [--item-bytes 4096]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def c_hit_path(build_dir: str) -> dict[str, Any]:
    exe = os.path.join(build_dir, "bench_lookup")
    if not os.path.exists(exe):
        cmake = os.environ.get("CMAKE", "cmake")
        subprocess.run([cmake, "-S", ROOT, "-B", build_dir, "-DOPT4_BUILD_BENCH=ON",
                        "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True)
        subprocess.run([cmake, "--build", build_dir, "--target", "bench_lookup"], check=True, capture_output=True)
    out = subprocess.run([exe, "2000000", "1024", "4096", "7"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


class Blobs:
    """Item i: a map-style dataset of ``size`` bytes that depend on i, as
    ``bytes`` (kind "bytes"), as a labelled pair ``(bytes, i)`` ("pair"), or
    as a float32 tensor ("tensor")."""

    def __init__(self, n: int, size: int, kind: str = "bytes") -> None:
        self.n, self.size, self.kind = n, size, kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        blob = bytes([i % 251]) * self.size
        if self.kind == "pair":
            return blob, i
        if self.kind == "tensor":
            import torch

            return torch.full((self.size // 4,), float(i))
        return blob


def make_cache(items: int, size: int, accesses: int, kind: str = "bytes") -> tuple[Any, Any, Any]:
    import opt4torch
    from opt4torch._codec import encode, encoded_size
    from opt4torch.data import PlannedDataset, OPTCache

    rng = np.random.default_rng(0)
    seq = np.concatenate([np.arange(items), rng.integers(0, items, accesses - items)])
    plan = opt4torch.plan(seq, items, items=items)
    ds = Blobs(items, size, kind)
    page = encoded_size(encode(ds[0]))
    cache = OPTCache(plan, page)
    cached = PlannedDataset(ds, cache.name, plan.accesses, items)
    cached.__getitems__(list(range(items)))  # warm: the first N are the ADMITs
    return cache, cached, plan


KINDS = ("bytes", "pair", "tensor")


def python_batch_path(items: int, size: int, batch: int = 256, repeats: int = 7) -> dict[str, Any]:
    """Per item kind, ns per item through __getitems__, through read_batch
    alone (the C read of the batch into one buffer), and through read_batch
    plus the Python codec's decode of every record (the batch path before the
    binding decoded plain values itself), timed side by side."""
    from opt4torch._codec import decode_at

    out: dict[str, Any] = {"batch": batch, "item_bytes": size, "repeats": repeats}
    for kind in KINDS:
        cache, cached, plan = make_cache(items, size, items + batch * 200, kind)
        pool = cached._pool()
        batches = [list(range(s, s + batch)) for s in range(items, plan.accesses, batch)]
        times: dict[str, list[float]] = {"getitems": [], "read_batch": [], "read_batch_codec": []}
        for _ in range(repeats):
            t0 = time.perf_counter()
            for b in batches:
                cached.__getitems__(b)
            times["getitems"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for b in batches:
                pool.read_batch(b)
            times["read_batch"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for b in batches:
                data, entries = pool.read_batch(b)
                [decode_at(data, e[2], e[3]) for e in entries]
            times["read_batch_codec"].append(time.perf_counter() - t0)
        st = cache.stats()
        cache.close()
        assert st["fallbacks"] == 0 and st["misses"] == items
        per = len(batches) * batch
        out[kind] = {f"{k}_ns_per_item": statistics.median(v) / per * 1e9 for k, v in times.items()}
    return out


def _smaps(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1].isdigit():
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def _shared_worker(name: str, positions: list[int], ready: Any, done: Any) -> None:
    from opt4torch import _engine

    pool = _engine.pool_attach(name)
    for s in range(0, len(positions), 256):
        pool.read_batch(positions[s:s + 256])
    ready.set()
    done.wait()
    pool.close()


def _idle_worker(ready: Any, done: Any) -> None:
    ready.set()
    done.wait()


def _private_worker(items: int, size: int, ready: Any, done: Any) -> None:
    ds = Blobs(items, size)
    cache = {i: ds[i] for i in range(items)}  # a private copy of every item
    ready.set()
    done.wait()
    del cache


def memory(workers: int, items: int, size: int) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    results: dict[str, Any] = {"workers": workers, "items": items, "item_bytes": size}
    cache, cached, plan = make_cache(items, size, items * 3)
    positions = list(range(items, plan.accesses))
    for mode in ("baseline", "shared pool", "private dicts"):
        done = ctx.Event()
        procs, readies = [], []
        for _ in range(workers):
            ready = ctx.Event()
            if mode == "shared pool":
                target, args = _shared_worker, (cache.name, positions, ready, done)
            elif mode == "private dicts":
                target, args = _private_worker, (items, size, ready, done)
            else:
                target, args = _idle_worker, (ready, done)
            p = ctx.Process(target=target, args=args)
            p.start()
            procs.append(p)
            readies.append(ready)
        for r in readies:
            r.wait(120)
        rows = [_smaps(p.pid) for p in procs]
        owner = _smaps(os.getpid())  # the owner maps the pool too
        done.set()
        for p in procs:
            p.join(60)
        results[mode] = {
            "pss_workers_mib": sum(r.get("Pss", 0) for r in rows) / 2**20,
            "pss_shmem_workers_mib": sum(r.get("Pss_Shmem", 0) for r in rows) / 2**20,
            "pss_shmem_owner_mib": owner.get("Pss_Shmem", 0) / 2**20,
            "rss_each_mib": statistics.median(r.get("Rss", 0) for r in rows) / 2**20,
        }
    base = results["baseline"]["pss_workers_mib"]
    for mode in ("shared pool", "private dicts"):
        r = results[mode]
        # What the cache adds: the workers' PSS over idle workers, plus the
        # owner's share of the pool's pages.
        r["added_mib"] = r["pss_workers_mib"] - base + (r["pss_shmem_owner_mib"] if mode == "shared pool" else 0)
    results["pool_mib"] = cache.stats()["shm_bytes"] / 2**20
    results["cached_data_mib"] = items * size / 2**20
    cache.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--items", type=int, default=4096)
    ap.add_argument("--item-bytes", type=int, default=4096)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "bench"))
    ap.add_argument("--json", default=os.path.join(HERE, "results", "lookup.json"))
    args = ap.parse_args()
    report: dict[str, Any] = {"command": "python bench/lookup.py"}
    report["c_hit_path"] = c = c_hit_path(args.build_dir)
    print(f"C hit path: {c['hit_ns_16B']:.1f} ns per HIT with 16-byte items (memcpy {c['memcpy_ns_16B']:.1f}); "
          f"{c['hit_ns_item']:.1f} ns with {c['item_bytes']}-byte items (memcpy {c['memcpy_ns_item']:.1f}): "
          f"{c['hit_ns_item'] - c['memcpy_ns_item']:.1f} ns excluding the copy", file=sys.stderr)
    report["python_batch_path"] = py = python_batch_path(args.items, args.item_bytes)
    for kind in KINDS:
        k = py[kind]
        print(f"Python batch path, {kind} items of {args.item_bytes} bytes: {k['getitems_ns_per_item']:.0f} ns "
              f"per item through __getitems__ (batches of {py['batch']}), {k['read_batch_ns_per_item']:.0f} ns "
              f"through read_batch, {k['read_batch_codec_ns_per_item']:.0f} ns through read_batch and the "
              "Python codec", file=sys.stderr)
    report["memory"] = mem = memory(args.workers, args.items, args.item_bytes)
    print(f"Memory, {args.workers} workers each reading {mem['cached_data_mib']:.0f} MiB of cached items: the shared "
          f"pool adds {mem['shared pool']['added_mib']:.0f} MiB in all (pool {mem['pool_mib']:.0f} MiB); private "
          f"per-worker caches add {mem['private dicts']['added_mib']:.0f} MiB", file=sys.stderr)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
