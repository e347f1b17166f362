#!/usr/bin/env python3
"""bench/e2e: a real training loop on an emulated slow store, every cache side by side.

A generated JPEG dataset (ImageFolder layout, packed into one record file), a
small CNN trained on the CPU for a few epochs with the real DataLoader and two
workers, decoding plus a random crop and flip after the cache. Every
configuration reads the same record file with O_DIRECT and the same emulated
latency per read (bandwidth folded in), applied in C to every reader:

  no cache; cachetools LRU, LFU, FIFO, RR (one cache of C items per worker, as
  users write them); one LRU shared through a multiprocessing manager; a static
  cache of the first C items (shared); OPT; OPT + prefetch; everything in memory.

Under epoch shuffle, sampling with replacement and class-balanced weighted
sampling. Writes bench/results/e2e.md, e2e.json and two PNG plots; the
implementation is opt4torch.lab.e2e (which `opt4torch demo` runs small).

    python bench/e2e.py [--images 1000] [--epochs 3] [--capacity 0.5] [--latency 0.005]
        [--bandwidth 100e6] [--repeats 3] [--configs ...] [--samplers ...] [--data out/e2e-data]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import machine  # noqa: E402

from opt4torch.lab.e2e import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(machine=machine(("numpy", "opt4torchdataset", "torch", "cachetools", "pillow"))))
