#!/usr/bin/env python3
"""bench/sources: every source the prefetcher loads from, side by side, through
the public API (issue 17's benchmark table).

The same N items of 1 to 40 KiB (random bytes, labels 0-9) are kept four ways,
and each is read through what users would call:

* ``record``: a record file, ``opt4torch.RecordFile(path, latency=L)``;
* ``imagefolder``: one file per item in class folders, read in place,
  ``opt4torch.ImageFolder(root, latency=L)``;
* ``tar``: WebDataset tar shards of 500 samples (``<key>.bin``, ``<key>.cls``),
  read in place, ``opt4torch.TarShards(paths, latency=L)``;
* ``callback``: a plain map-style Dataset whose ``__getitem__`` sleeps L and
  ``os.pread``s its item (bench/callback_prefetch.py's ``FileItems``), which
  the engine can only call.

Each source runs E epochs of epoch shuffle with W fork workers and a CPU-bound
training step per batch (single-threaded torch matrix products, a fixed count:
on a 2-core machine the CPU our threads take comes out of it), three ways:

* in memory: what the source returns, from a list in RAM, plain torch DataLoader;
* OPT: ``opt4torch.DataLoader`` at 50 % capacity (bytes), prefetch off;
* OPT + prefetch: the same with ``prefetch=True``.

Every configuration of a source runs once per repeat, interleaved; medians
are reported. Per row: time and CPU time (user + system of the process with
its threads, plus its workers once joined) against in memory; the same split
in two, the loop's (the process over the training loop, plus the persistent
workers' clocks read at its end) and the setup's (building the loader: the
capture, the plan, the pool; in memory, wrapping the list); the part of it
the prefetch threads took (their CPU clocks), the stall rate
(accesses that waited for their data), hits against the plan's, and the bytes
read from storage against the plan's miss bytes (the read lengths of the
accesses the plan does not serve from the pool). Each run also splits the
loop's CPU into the training thread's, the other threads' of its process and
the workers', with their minor page faults. For the plain Dataset, beside
each repeat, the dataset's own calls are timed with no loader at all (as
many as the plan has misses, from as many Python threads as the prefetcher
starts with): the CPU any loader that calls it for its misses pays at
least, and the in-memory run never pays.

    python bench/sources.py [--sources record,imagefolder,tar,callback]
        [--latency 0.002,0.010] [--items 3000] [--epochs 3] [--capacity 0.5]
        [--batch 32] [--workers 2] [--step-reps 48] [--threads 16] [--repeats 3]
        [--out bench/results/sources.json]
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tarfile
import tempfile
import threading
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler, get_worker_info

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import machine  # noqa: E402
from callback_prefetch import FileItems, step_work, train  # noqa: E402
from prefetch import InMemory, cpu_seconds  # noqa: E402

import opt4torch  # noqa: E402

SOURCES = ("record", "imagefolder", "tar", "callback")
CONFIGS = ("in memory", "OPT", "OPT + prefetch")
SHARD = 500


class CountedFileItems(FileItems):
    """FileItems that counts its reads and bytes, as the engine's own
    sources count theirs, at a fraction of a microsecond a read: each
    process adds to its own two words of a shared array (a worker by its
    id, the training process, whose prefetch threads call it, in the first
    two, under a thread lock), summed when read. A multiprocessing.Array
    with its lock, as before, cost about 6 us a read here, all of it on the
    misses, so on the cache's side of the comparison with in memory."""

    SLOTS = 64

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.counts = multiprocessing.RawArray("q", 2 * self.SLOTS)
        self._lock = threading.Lock()

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        item = super().__getitem__(i)
        w = get_worker_info()
        k = 2 * (w.id + 1) if w is not None else 0
        with self._lock:
            self.counts[k] += 1
            self.counts[k + 1] += len(item[0])
        return item

    def info(self) -> dict[str, int]:
        c = self.counts[:]
        return {"reads": sum(c[0::2]), "bytes_read": sum(c[1::2])}

    def item_sizes(self) -> np.ndarray:
        return self.sizes.astype(np.int64)


def make_data(root: str, n: int, seed: int) -> dict[str, Any]:
    """The items, kept the four ways; returns what opens each."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1024, 40 * 1024, size=n)
    labels = [i % 10 for i in range(n)]
    blob = rng.integers(0, 256, size=int(sizes.sum()), dtype=np.uint8).tobytes()
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    payloads = [blob[o:o + s] for o, s in zip(offsets, sizes)]
    flat = os.path.join(root, "items.bin")
    with open(flat, "wb") as f:
        f.write(blob)
    rec = os.path.join(root, "items.rec")
    opt4torch.write_records(rec, payloads, labels=labels)
    folder = os.path.join(root, "folder")
    for c in range(10):
        os.makedirs(os.path.join(folder, f"c{c}"))
    for i, p in enumerate(payloads):  # names sort as the items do within a class
        with open(os.path.join(folder, f"c{labels[i]}", f"{i:06d}.jpg"), "wb") as f:
            f.write(p)
    shards = []
    for s in range(0, n, SHARD):
        path = os.path.join(root, f"shard-{s // SHARD:04d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
            for i in range(s, min(n, s + SHARD)):
                for ext, data in (("bin", payloads[i]), ("cls", str(labels[i]).encode())):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
        shards.append(path)
    return {"flat": flat, "offsets": offsets, "sizes": sizes, "rec": rec, "folder": folder, "shards": shards}


def open_source(name: str, data: dict[str, Any], latency: float) -> Any:
    if name == "record":
        return opt4torch.RecordFile(data["rec"], latency=latency)
    if name == "imagefolder":
        return opt4torch.ImageFolder(data["folder"], latency=latency)
    if name == "tar":
        return opt4torch.TarShards(data["shards"], latency=latency)
    return CountedFileItems(data["flat"], data["offsets"], data["sizes"], latency)


def self_cpu_seconds() -> float:
    """User + system time of this process (all its threads)."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime


def workers_clocks(loader: Any) -> tuple[float, int]:
    """User + system time of a live loader's worker processes, and their
    minor page faults (/proc)."""
    it = getattr(loader, "_iterator", None)
    ticks = faults = 0
    for w in getattr(it, "_workers", []) or []:
        with open(f"/proc/{w.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        faults += int(fields[7])  # minflt (field 10)
    return ticks / os.sysconf("SC_CLK_TCK"), faults


def run_config(config: str, source: str, ds: Any, items: list[Any], args: argparse.Namespace,
               work: tuple[torch.Tensor, int, float]) -> dict[str, Any]:
    common = dict(batch_size=args.batch, num_workers=args.workers, collate_fn=list,
                  persistent_workers=True, multiprocessing_context="fork")
    out: dict[str, Any] = {"config": config}
    gc.collect()
    cpu0 = cpu_seconds()
    before = ds.info()
    if config == "in memory":
        mem = InMemory(items)
        loader: Any = DataLoader(mem, sampler=RandomSampler(mem, generator=torch.Generator().manual_seed(0)),
                                 **common)
    else:
        sizing: dict[str, Any]
        if source == "callback":  # the engine cannot size a plain dataset's items: one size for all
            sizing = dict(cache_items=int(args.capacity * len(ds)), item_bytes=int(ds.sizes.max()) + 64)
        else:
            total = sum(ds.opt4_item_bytes(i) for i in range(len(ds)))
            sizing = dict(cache_bytes=int(args.capacity * total))
        loader = opt4torch.DataLoader(ds, shuffle=True, seed=0, epochs=args.epochs,
                                      prefetch=config == "OPT + prefetch", prefetch_threads=args.threads,
                                      **sizing, **common)
    cpu_setup = cpu_seconds() - cpu0
    self0, main0 = self_cpu_seconds(), time.thread_time()
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds, n = train(loader, args.epochs, work[0], work[1])
    # The loop's CPU: this process and its threads over the loop, and the
    # persistent workers' clocks, read while they live (they started in it).
    # Split three ways: the training thread's own clock, the workers', and
    # the rest of this process (the prefetch threads, the pin thread if any);
    # with the minor page faults of this process and of the workers.
    main_s, self_s = time.thread_time() - main0, self_cpu_seconds() - self0
    workers_s, workers_faults = workers_clocks(loader)
    out.update(seconds=seconds, samples=n, setup_cpu_s=cpu_setup, loop_cpu_s=self_s + workers_s,
               main_thread_cpu_s=main_s, other_threads_cpu_s=self_s - main_s, workers_cpu_s=workers_s,
               faults=resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0, workers_faults=workers_faults)
    if isinstance(loader, opt4torch.DataLoader):
        st = loader.cache.stats()
        plan = loader.cache.plan
        out.update(hits=st["hits"], plan_hits=st["plan_hits"], stall_rate=st["stall_rate"],
                   fallbacks=st["fallbacks"], kind=st.get("prefetcher", {}).get("kind"),
                   threads_reading=st.get("prefetcher", {}).get("active"),
                   prefetch_cpu_s=st.get("prefetcher", {}).get("cpu_seconds"),
                   depth_grows=st.get("prefetcher", {}).get("grows"),
                   depth_shrinks=st.get("prefetcher", {}).get("shrinks"),
                   spare_pages=st.get("spare_pages", 0), page_size=st["page_size"],
                   capacity_bytes=st["capacity_bytes"], shm_bytes=st["shm_bytes"],
                   plan_miss_bytes=int(ds.item_sizes()[plan.seq[plan.kinds != opt4torch.HIT]].sum()))
        loader.cache.close()
    del loader
    gc.collect()  # the workers are joined here, so RUSAGE_CHILDREN has them
    out["cpu_s"] = cpu_seconds() - cpu0
    after = ds.info()
    out["storage_bytes"] = after["bytes_read"] - before["bytes_read"]
    out["storage_reads"] = after["reads"] - before["reads"]
    return out


def dataset_calls(ds: Any, calls: int, threads: int, seed: int) -> dict[str, float]:
    """A plain Dataset's own cost with no loader at all: ``calls`` calls of
    ``ds[i]`` (items drawn at random) split over ``threads`` Python threads
    in this process, as many as the prefetcher starts with. What any
    prefetcher that calls the dataset for its misses pays at least, and
    what the in-memory run never pays: its CPU (this process, all threads)
    and its time."""
    order = np.random.default_rng(seed).integers(0, len(ds), size=calls)
    parts = np.array_split(order, threads)
    gc.collect()
    cpu0, t0 = self_cpu_seconds(), time.perf_counter()
    pool = [threading.Thread(target=lambda part=part: [ds[int(i)] for i in part]) for part in parts]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return {"calls": calls, "threads": threads, "cpu_s": self_cpu_seconds() - cpu0,
            "seconds": time.perf_counter() - t0}


def table(results: dict[str, Any]) -> str:
    rows = ["| source | read | configuration | time | vs in memory | CPU | CPU vs in memory | loop CPU "
            "| loop CPU vs in memory | setup CPU | of which prefetch threads "
            "| stall rate | hits (plan) | bytes read (plan's miss bytes) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, runs in results.items():
        source, lat = key.split("@")
        med = {c: statistics.median(x["seconds"] for x in runs[c]) for c in runs}
        cpu = {c: statistics.median(x["cpu_s"] for x in runs[c]) for c in runs}
        loop = {c: statistics.median(x["loop_cpu_s"] for x in runs[c]) for c in runs}
        setup = {c: statistics.median(x["setup_cpu_s"] for x in runs[c]) for c in runs}
        for c in runs:
            x = runs[c][-1]
            row = [source, f"{float(lat) * 1e3:g} ms", c, f"{med[c]:.2f} s", f"{med[c] / med['in memory']:.2f}x",
                   f"{cpu[c]:.2f} s", f"{cpu[c] / cpu['in memory']:.2f}x", f"{loop[c]:.2f} s",
                   f"{loop[c] / loop['in memory']:.2f}x", f"{setup[c]:.2f} s"]
            if c == "in memory":
                row += ["–", "–", "–", "–"]
            else:
                pf_cpu = [y["prefetch_cpu_s"] for y in runs[c] if y.get("prefetch_cpu_s") is not None]
                row.append(f"{statistics.median(pf_cpu):.2f} s" if pf_cpu else "–")
                stall = statistics.median(y["stall_rate"] for y in runs[c])
                exact = all(y["storage_bytes"] == y["plan_miss_bytes"] for y in runs[c])
                row += [f"{stall:.2%}", f"{x['hits']:,} ({x['plan_hits']:,})",
                        f"{x['storage_bytes']:,} ({'equal' if exact else format(x['plan_miss_bytes'], ',')})"]
            rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", default=",".join(SOURCES))
    ap.add_argument("--latency", default="0.002,0.010", help="seconds per read (emulated), comma-separated")
    ap.add_argument("--items", type=int, default=3000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--capacity", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--step-reps", type=int, default=48,
                    help="matrix products per batch: the CPU-bound training step (its time here is printed)")
    ap.add_argument("--threads", type=int, default=16, help="prefetch threads")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="which of the three to run (in memory always runs: the others are compared with it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="where the data goes (default: a temporary directory)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "sources.json"))
    args = ap.parse_args()
    sources = [s for s in args.sources.split(",") if s]
    bad = sorted(set(sources) - set(SOURCES))
    if bad:
        ap.error(f"unknown source(s) {', '.join(bad)}: choose from {', '.join(SOURCES)}")
    latencies = [float(x) for x in args.latency.split(",")]
    configs = ["in memory"] + [c for c in CONFIGS[1:] if c in args.configs.split(",")]
    torch.set_num_threads(1)
    work = step_work(args.step_reps)
    print(f"training step: {args.step_reps} products, {work[2] * 1000:.1f} ms a batch here", flush=True)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    floors: dict[str, list[dict[str, float]]] = {}
    root = tempfile.mkdtemp(prefix="opt4-sources-", dir=args.dir)
    try:
        t0 = time.perf_counter()
        data = make_data(root, args.items, args.seed)
        print(f"data: {args.items} items, {int(data['sizes'].sum()):,} bytes, four ways, "
              f"in {time.perf_counter() - t0:.1f} s", flush=True)
        for lat in latencies:
            for source in sources:
                ds = open_source(source, data, lat)
                plain = open_source(source, data, 0.0)
                items = [plain[i] for i in range(len(plain))]
                runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
                for r in range(args.repeats):
                    for c in configs:
                        res = run_config(c, source, ds, items, args, work)
                        runs[c].append(res)
                        print(f"  {source} {lat * 1e3:g} ms, repeat {r + 1}, {c}: {res['seconds']:.2f} s, "
                              f"cpu {res['cpu_s']:.2f} s, stalls {res.get('stall_rate', 0):.2%} "
                              f"(training thread {res['main_thread_cpu_s']:.2f} s, other threads "
                              f"{res['other_threads_cpu_s']:.2f} s, workers {res['workers_cpu_s']:.2f} s; faults "
                              f"{res['faults']:,} + {res['workers_faults']:,}) "
                              f"{res.get('kind') or ''} {res.get('threads_reading') or ''}", flush=True)
                    if source == "callback" and "OPT + prefetch" in runs:
                        # Beside each repeat: the dataset's own calls for as
                        # many misses as the plan has, with no loader.
                        fl = dataset_calls(ds, runs["OPT + prefetch"][-1]["storage_reads"], args.threads, r)
                        floors.setdefault(f"{source}@{lat}", []).append(fl)
                        print(f"  {source} {lat * 1e3:g} ms, repeat {r + 1}, the dataset's own {fl['calls']:,} "
                              f"calls from {fl['threads']} threads, no loader: cpu {fl['cpu_s']:.2f} s "
                              f"({fl['cpu_s'] / fl['calls'] * 1e6:.0f} us a call)", flush=True)
                results[f"{source}@{lat}"] = runs
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{args.items} items of 1-40 KiB, {args.epochs} epochs of epoch shuffle, capacity "
          f"{args.capacity:.0%}, batch {args.batch}, {args.workers} fork workers, "
          f"{work[2] * 1000:.1f} ms CPU step a batch, {args.threads} prefetch threads; medians of {args.repeats}\n")
    print(table(results))
    for key, fls in floors.items():
        # The plain Dataset's CPU target measured against what its own calls
        # cost: in memory plus the dataset's calls is the least any loader
        # that calls it for the plan's misses can use.
        base = statistics.median(x["cpu_s"] for x in results[key]["in memory"])
        opt = statistics.median(x["cpu_s"] for x in results[key]["OPT + prefetch"])
        own = statistics.median(x["cpu_s"] for x in fls)
        print(f"\n{key}: the dataset's own calls (no loader, {fls[0]['threads']} threads) {own:.2f} s of CPU, "
              f"{own / base:.1%} of the in-memory run's; OPT + prefetch {opt / base:.2f}x in memory, "
              f"{opt / (base + own):.2f}x in memory plus those calls")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "args": vars(args), "step_seconds": work[2], "results": results,
                   "dataset_calls": floors}, f,
                  indent=1)
    print(f"\nraw results: {args.out}")


if __name__ == "__main__":
    main()
