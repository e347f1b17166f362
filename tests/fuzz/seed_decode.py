"""Seeds for fuzz_decode: records in the codec's format (python/opt4torch/
_codec.py) of the values a dataset returns, small enough for the fuzzer's
4 KiB inputs: plain values, nested containers, numpy arrays and tensors of
several dtypes, shapes, flags and dimension orders, and records the C
decoder leaves to the codec (a big int, a structured dtype). Run with the
package installed:
    python tests/fuzz/seed_decode.py tests/fuzz/corpus/fuzz_decode
"""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
import torch

from opt4torch._codec import encode


def values() -> list[object]:
    arange = np.arange(12, dtype="<f4").reshape(3, 4)
    return [
        None, True, False, 0, -1, 2**63 - 1, 10**30, 1.5, float("nan"), "", "ümlaut", "\udc80",
        b"", b"jpeg bytes", bytearray(b"mutable"),
        (b"\xff\xd8\xff", 7), [1, [2, [3, [4]]]], {"label": 3, "path": "a/b.jpg"}, {1: None, "k": (1.0, "v")},
        arange, arange.T, arange[::2], np.zeros((0, 3), "<i8"), np.array(5, "<i2"), np.float32(2.5),
        np.array(["ab", "c"], "<U2"), np.array([b"xyz"], "|S3"), np.array([1, 2], ">i4"),
        np.array(["2020-01-01"], "<M8[ns]"), np.array([True, False]), np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
        np.frombuffer(b"\x01\x02\x03\x04", "|u1"),  # read-only
        torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.zeros(2, 3).t(),
        torch.ones(3, dtype=torch.bfloat16), torch.tensor(7, dtype=torch.int64), torch.zeros(0, dtype=torch.uint8),
        torch.ones(2, requires_grad=True), torch.nn.Parameter(torch.ones(2)),
        torch.zeros(2, 2, 2).permute(2, 0, 1), torch.tensor([1 + 2j], dtype=torch.complex64),
        (torch.zeros(4), torch.zeros(4), 3), {"image": torch.zeros(1, 2, 2), "label": torch.tensor(1)},
        [np.zeros(3, "<f4"), np.zeros(3, "<f4"), np.zeros(3, "<f4")],
    ]


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    written = 0
    for value in values():
        record = b"".join(bytes(memoryview(p)) for p in encode(value))
        if len(record) > 4096:
            continue
        with open(os.path.join(out, hashlib.sha1(record).hexdigest()), "wb") as f:
            f.write(record)
        written += 1
    print(f"{written} seeds in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
