#!/usr/bin/env python3
"""bench/inplace_checks: what verifying in-place reads costs (issue 38).

The same N items of 1 to 40 KiB are written as an image folder (one file an
item) and as WebDataset tar shards (500 samples a shard), in a temporary
folder (the page cache warm: the check's CPU, not the disk, is measured).
Then, through the public API, with whatever opt4torch the interpreter
imports (run it with two installs to compare):

* ``imagefolder read``: ``ds[i]`` over every item of ``opt4torch.ImageFolder``
  (each read opens, reads and closes its file; with the checks, also an
  fstat at the open and one after the read);
* ``tar read``: ``ds[i]`` over every sample of ``opt4torch.TarShards`` (kept
  descriptors; with the checks, an fstat after each read);
* ``tar index load``: ``opt4torch.TarShards(paths)`` with every shard's
  cached index current (the index read and, with the checks, validated).

With ``--checksum`` (an install that has it), the same with
``checksum=True`` beside each (every read hashes what it read, XXH3-64), and
what recording the checksums costs: ``ImageFolder(root, checksum=True)``
against ``ImageFolder(root)`` (each file read once more), and the indexes'
load when they hold the checksums.

Each is run R times, interleaved; the median and the spread are printed as
microseconds an item (or milliseconds a load), wall clock and this process's
CPU time (user + system: less disturbed by other work on a shared machine),
with the machine.

    python bench/inplace_checks.py [--items 6000] [--repeats 7] [--checksum] [--out FILE]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tarfile
import tempfile
import time

import numpy as np


def make_data(folder: str, n: int) -> tuple[str, list[str]]:
    rng = np.random.default_rng(38)
    sizes = rng.integers(1024, 40 * 1024, size=n)
    root = os.path.join(folder, "imgs")
    shards = []
    for i, size in enumerate(sizes):
        d = os.path.join(root, f"c{i % 10}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{i:06d}.jpg"), "wb") as f:
            f.write(rng.integers(0, 256, size=int(size), dtype=np.uint8).tobytes())
    for s in range(0, n, 500):
        path = os.path.join(folder, f"shard-{s // 500:04d}.tar")
        with tarfile.open(path, "w") as tf:
            for i in range(s, min(n, s + 500)):
                data = rng.integers(0, 256, size=int(sizes[i]), dtype=np.uint8).tobytes()
                for name, body in ((f"{i:06d}.bin", data), (f"{i:06d}.cls", str(i % 10).encode())):
                    ti = tarfile.TarInfo(name)
                    ti.size = len(body)
                    tf.addfile(ti, io.BytesIO(body))
        shards.append(path)
    return root, shards


#: CPU seconds of this process (user + system) of each timed run, beside
#: the wall clock: on a shared machine the wall clock also counts the time
#: other processes held the cores.
CPU: dict[str, list[float]] = {}


def per_item_us(ds, n: int, name: str = "") -> float:
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        ds[i]
    if name:
        CPU.setdefault(name, []).append((time.process_time() - c0) / n * 1e6)
    return (time.perf_counter() - t0) / n * 1e6


def timed_ms(name: str, make) -> float:
    t0, c0 = time.perf_counter(), time.process_time()
    make()
    CPU.setdefault(name, []).append((time.process_time() - c0) * 1e3)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=6000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--checksum", action="store_true", help="add the checksum=True rows")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import opt4torch

    with tempfile.TemporaryDirectory(prefix="opt4-inplace-") as folder:
        root, shards = make_data(folder, args.items)
        img = opt4torch.ImageFolder(root)
        tar = opt4torch.TarShards(shards)  # writes the cached indexes
        names = ["imagefolder read (us/item)", "tar read (us/item)", "tar index load (ms)",
                 "imagefolder made (ms)"]
        sets = [("", {})]
        if args.checksum:
            sets.append((" checksum", {"checksum": True}))
            img_c = opt4torch.ImageFolder(root, checksum=True)
            tar_c = opt4torch.TarShards(shards, checksum=True)  # adds the checksums to the indexes
        runs: dict[str, list[float]] = {name.replace(" (", f"{tag} (", 1): [] for tag, _ in sets for name in names}
        for ds in (img, tar) + ((img_c, tar_c) if args.checksum else ()):
            per_item_us(ds, len(ds))  # warm the page cache and the code
        for _ in range(args.repeats):
            for tag, kw in sets:
                i, t = (img_c, tar_c) if kw else (img, tar)
                name = f"imagefolder read{tag} (us/item)"
                runs[name].append(per_item_us(i, len(i), name))
                name = f"tar read{tag} (us/item)"
                runs[name].append(per_item_us(t, len(t), name))
                name = f"tar index load{tag} (ms)"
                runs[name].append(timed_ms(name, lambda: opt4torch.TarShards(shards, **kw)))
                name = f"imagefolder made{tag} (ms)"
                runs[name].append(timed_ms(name, lambda: opt4torch.ImageFolder(root, **kw)))
    out = {"opt4torch": os.path.dirname(opt4torch.__file__), "items": args.items, "repeats": args.repeats,
           "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                      f"Python {platform.python_version()}",
           "median": {k: statistics.median(v) for k, v in runs.items()},
           "min": {k: min(v) for k, v in runs.items()}, "max": {k: max(v) for k, v in runs.items()},
           "cpu median": {k: statistics.median(v) for k, v in CPU.items()},
           "cpu min": {k: min(v) for k, v in CPU.items()}}
    for k in runs:
        print(f"{k:36s} wall median {out['median'][k]:8.2f} (min {out['min'][k]:.2f}, max {out['max'][k]:.2f})"
              f"   cpu median {out['cpu median'][k]:8.2f} (min {out['cpu min'][k]:.2f})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
