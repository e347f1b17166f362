#!/usr/bin/env python3
"""bench/codec_speed: encoding what datasets return, on every miss that is
stored, through what the cache calls (``opt4torch._codec.encode``: plain
values in C, binding/encode.c) beside the Python encoder alone
(``encode_py``, what every miss paid before). Medians of repeats, per
call, in one thread of an otherwise idle process.

    python bench/codec_speed.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from opt4torch import _engine
from opt4torch._codec import encode, encode_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import machine  # noqa: E402


def per_call(fn, obj, n: int, repeats: int) -> float:
    """Median over repeats of the seconds one call takes (n calls a repeat)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(obj)
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50_000)
    ap.add_argument("--json", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                   "codec_speed.json"))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    jpeg = rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes()
    cases = {
        "(bytes, label): an ImageFolder or record item": (jpeg, 7),
        "a WebDataset sample: {__key__, jpg, cls}": {"__key__": "shard-0003/000123", "jpg": jpeg, "cls": b"7"},
        "a dict of 8 str and number fields and a bytes field": {
            "id": 123456, "path": "train/n01440764/n01440764_10026.JPEG", "label": 0, "width": 250,
            "height": 250, "mean": 0.4812, "tags": ["fish", "tench"], "data": jpeg},
        "a numpy array (not plain: the Python codec, both ways)": np.zeros((3, 32, 32), np.float32),
    }
    rows = []
    for name, obj in cases.items():
        assert b"".join(encode(obj)) == b"".join(encode_py(obj))
        c = per_call(encode, obj, args.calls, args.repeats)
        py = per_call(encode_py, obj, args.calls, args.repeats)
        rows.append({"item": name, "encode_us": c * 1e6, "encode_py_us": py * 1e6, "plain": _engine.encode_plain(obj)
                     is not None})
        print(f"{name:55s} encode {c * 1e6:6.2f} us   Python encoder {py * 1e6:6.2f} us   ({py / c:.1f}x)",
              flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"machine": machine(), "args": vars(args), "rows": rows}, f, indent=1)
    print(f"results: {args.json}")


if __name__ == "__main__":
    main()
