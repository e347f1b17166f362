"""Seeds for fuzz_pool_header: real pools' segments in the target's compact
form (u16 header length | main header | u32 extra | meta segment), from small
plans of each kind. Run with the package installed:
    python tests/fuzz/seed_pool_header.py tests/fuzz/corpus/fuzz_pool_header
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys

import numpy as np

import opt4torch
from opt4torch import _engine

HEADER = 4096
HLEN = 512  # the pool header's fields fit well within this


def seed(plan: opt4torch.Plan, page_size: int, occurrences: bool, staging: int = 0) -> bytes:
    pool = _engine.pool_create(plan._h, page_size, occurrences=occurrences, staging_slots=staging)
    try:
        name = pool.name
        with open(f"/dev/shm{name}", "rb") as f:
            main = f.read()
        with open(f"/dev/shm{name}.meta", "rb") as f:
            meta = f.read()
    finally:
        pool.unlink()
        pool.close()
    extra = len(main) - HEADER
    return struct.pack("<H", HLEN) + main[:HLEN] + struct.pack("<I", extra) + meta


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    seeds = []
    for T, N, C in [(1, 1, 1), (12, 4, 2), (40, 10, 3), (64, 20, 8)]:
        seq = rng.integers(0, N, size=T)
        for bypass in (True, False):
            p = opt4torch.plan(seq, capacity=C, items=N, bypass=bypass)
            for occ in (False, True):
                seeds.append(seed(p, 64, occ))
            seeds.append(seed(p, 64, True, staging=2))
    seq = rng.integers(0, 12, size=48)
    sizes = rng.integers(1, 200, size=12)
    p = opt4torch.plan(seq, items=12, capacity_bytes=400, item_sizes=sizes, page_size=64)
    seeds.append(seed(p, 0, False))
    seeds.append(seed(p, 0, True))
    seeds.append(seed(p, 0, False, staging=1))
    for s in seeds:
        with open(os.path.join(out, hashlib.sha1(s).hexdigest()), "wb") as f:
            f.write(s)
    print(f"{len(seeds)} seeds, largest {max(map(len, seeds))} bytes")


if __name__ == "__main__":
    main()
