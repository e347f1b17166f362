#!/usr/bin/env python3
"""bench/memory: what a cache costs in memory, beyond the cache itself.

A job's memory is the proportional set size (PSS, /proc/PID/smaps_rollup)
summed over the training process and its DataLoader workers: shared pages
(the pool, torch's libraries) are split between the processes that map them,
so the sum counts each page once. Measured at the end of an epoch (the
second-to-last batch of the second epoch, all workers alive, the cache
full), in a fresh process per run, for:

* plain ``torch.utils.data.DataLoader`` over the same record file (the
  baseline: what the job costs without any cache);
* ``opt4torch.DataLoader`` with a cache of C bytes, prefetch off;
* the same with prefetch on (C threads, the staging ring, loaded items held).

Reported per configuration: total PSS, the difference to the baseline, and
that difference less the cache's C bytes ("beyond the cache"), with the
mappings that make it up. Medians of --repeats runs.

    python bench/memory.py [--cache-mb 20] [--workers 0,2,4] [--items 2000]
        [--min-bytes 10000] [--max-bytes 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def by_mapping(pid: int) -> collections.Counter[str]:
    """PSS bytes by kind of mapping."""
    out: collections.Counter[str] = collections.Counter()
    name = "[anon]"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                    parts = line.split()
                    name = parts[5] if len(parts) > 5 else "[anon]"
                    if name.startswith("/dev/shm/opt4"):
                        name = "pool (shared memory)"
                    elif name.startswith("/"):
                        name = "files (libraries, ...)"
                elif line.startswith("Pss:"):
                    out[name] += int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def one_run(config: str, cache_mb: int, workers: int, path: str) -> dict[str, Any]:
    """In this process: iterate one epoch and measure at its end."""
    import torch

    import opt4torch
    from opt4torch.records import RecordFile

    rf = RecordFile(path, with_labels=False)
    kw: dict[str, Any] = dict(batch_size=32, shuffle=True, num_workers=workers, collate_fn=list,
                              persistent_workers=workers > 0,
                              multiprocessing_context="fork" if workers else None)
    if config == "torch":
        loader: Any = torch.utils.data.DataLoader(rf, generator=torch.Generator().manual_seed(0), **kw)
    else:
        loader = opt4torch.DataLoader(rf, seed=0, cache_bytes=f"{cache_mb}MiB", epochs=2,
                                      prefetch=config == "opt+prefetch", **kw)
    for _ in loader:  # the first epoch fills the cache with what the second reads again
        pass
    it = iter(loader)
    for k, _ in enumerate(it):
        if k == len(loader) - 2:
            break
    from opt4torch.lab.e2e import _descendants, _pss  # the e2e harness measures memory the same way

    procs = [os.getpid(), *_descendants(os.getpid())]
    maps: collections.Counter[str] = collections.Counter()
    for p in procs:
        maps.update(by_mapping(p))
    # Memory of our own making: everything but file-backed mappings. The
    # PSS of a library's pages depends on how many other processes on the
    # machine map the same file, so it moves with whatever else runs.
    own = sum(v for k, v in maps.items() if not k.startswith("files"))
    out = {"total": sum(_pss(p) for p in procs), "own": own, "processes": len(procs), "maps": dict(maps)}
    del it
    if config != "torch":
        loader.cache.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-mb", type=int, default=20)
    ap.add_argument("--workers", default="0,2,4")
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--min-bytes", type=int, default=10_000)
    ap.add_argument("--max-bytes", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "memory.json"))
    ap.add_argument("--_child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._child:
        config, cache_mb, workers, path = a._child
        print(json.dumps(one_run(config, int(cache_mb), int(workers), path)))
        return 0

    import numpy as np

    sys.path.insert(0, HERE)
    from _machine import machine

    from opt4torch.records import write_records

    tmp = tempfile.mkdtemp(prefix="opt4-bench-mem-")
    path = os.path.join(tmp, "data.rec")
    rng = np.random.default_rng(0)
    write_records(path, (rng.integers(0, 256, size=int(n), dtype=np.uint8).tobytes()
                         for n in rng.integers(a.min_bytes, a.max_bytes, a.items)))
    workers = [int(w) for w in a.workers.split(",")]
    configs = ["torch", "opt", "opt+prefetch"]
    runs: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in range(a.repeats):
        for w in workers:
            for c in configs:  # side by side in each repeat
                out = subprocess.run([sys.executable, __file__, "--_child", c, str(a.cache_mb), str(w), path],
                                     capture_output=True, text=True, check=True, timeout=600)
                runs[f"{c}/{w}"].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(f"repeat {r + 1}/{a.repeats}: {c:<13} {w} workers "
                      f"{runs[f'{c}/{w}'][-1]['total'] / 2**20:7.1f} MiB", file=sys.stderr)
    mib = 2**20
    rows = []
    lines = [f"{a.items:,} records of {a.min_bytes:,}-{a.max_bytes:,} bytes, cache {a.cache_mb} MiB, "
             f"medians of {a.repeats}; PSS summed over the training process and its workers.", "",
             "| workers | configuration | total PSS | vs plain torch | beyond the cache | where (vs plain torch) |",
             "|---|---|---|---|---|---|"]
    notes = ["", "Beyond the cache: the difference in PSS to plain torch less the cache's bytes, counting "
             "anonymous and shared memory only (heap, anonymous maps, the pool); a library's PSS moves "
             "with how many other processes on the machine map it, so file-backed pages are left out "
             "there (and shown in the last column)."]
    for w in workers:
        base = statistics.median(x["total"] for x in runs[f"torch/{w}"])
        base_own = statistics.median(x["own"] for x in runs[f"torch/{w}"])
        base_maps = runs[f"torch/{w}"][0]["maps"]
        for c in configs:
            rs = runs[f"{c}/{w}"]
            total = statistics.median(x["total"] for x in rs)
            extra = total - base
            beyond = statistics.median(x["own"] for x in rs) - base_own - (a.cache_mb * mib if c != "torch" else 0)
            diff = {k: v - base_maps.get(k, 0) for k, v in rs[0]["maps"].items()}
            where = ", ".join(f"{k} {v / mib:+.1f}" for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))
                              if abs(v) >= 0.5 * mib)
            rows.append({"workers": w, "config": c, "total_mib": total / mib, "extra_mib": extra / mib,
                         "beyond_cache_mib": beyond / mib, "runs": rs})
            lines.append(f"| {w} | {c} | {total / mib:.1f} MiB | {extra / mib:+.1f} MiB | "
                         f"{'' if c == 'torch' else f'{beyond / mib:+.1f} MiB'} | {where if c != 'torch' else ''} |")
    lines += notes
    print("\n".join(lines))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"command": ["python", "bench/memory.py", *sys.argv[1:]], "machine": machine(),
                   "rows": rows, "table": lines}, f, indent=1)
    print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
