"""Datasets used by the DataLoader tests. They live in a module of their own
so that spawn and forkserver workers can import them by name."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset


def expected_tensor(i: int, shape: tuple[int, ...] = (3, 8, 8)) -> torch.Tensor:
    """Item i's tensor: content that depends only on i."""
    return torch.from_numpy(np.random.default_rng(i).standard_normal(shape).astype(np.float32))


class Checked(Dataset):
    """Item i is (a float32 tensor determined by i, i). Counts its loads in
    a shared counter so tests can see how often the source was hit."""

    def __init__(self, n: int, shape: tuple[int, ...] = (3, 8, 8)) -> None:
        self.n = n
        self.shape = shape
        self.loads = torch.zeros(1, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.loads += 1
        return expected_tensor(i, self.shape), i


class Mixed(Dataset):
    """Items of many types and sizes (the codec's job)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng(i)
        return {
            "image": torch.from_numpy(rng.integers(0, 255, size=(2, 4 + i % 5, 3), dtype=np.uint8)),
            "label": i % 7,
            "weight": float(i) / 3,
            "name": f"item-{i}",
            "raw": bytes(rng.integers(0, 255, size=i % 13, dtype=np.uint8)),
            "arr": rng.standard_normal(i % 4 + 1),
        }


class Resized(Dataset):
    """A dataset whose length can be changed after planning."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


def blob(i: int) -> bytes:
    """Item i's bytes: 100 B to 20 KB, depending only on i (like encoded images)."""
    rng = np.random.default_rng(1000 + i)
    return rng.integers(0, 256, size=int(rng.integers(100, 20_000)), dtype=np.uint8).tobytes()


class Blobs(Dataset):
    """Variable-size bytes items, with their sizes known up front (as file
    sizes would be) through opt4_item_bytes."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.sizes = [len(blob(i)) for i in range(n)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        return blob(i), i

    def opt4_item_bytes(self, i: int) -> int:
        return self.sizes[i] + 64  # the tuple and the int around the bytes


class Unaligned(Dataset):
    """Records of uneven length (a name that grows with i) around complex128
    tensors and float64 arrays, whose views need 16-byte alignment."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str, np.ndarray, int]:
        rng = np.random.default_rng(i)
        z = torch.from_numpy(rng.standard_normal(6)).view(torch.complex128)
        return z, "x" * (i % 11), rng.standard_normal((2, 2)), i


class CountingSlow(Dataset):
    """Item i is (a float32 tensor determined by i, i), loaded after `delay`
    seconds (I/O-like: the GIL is released). Every load appends one byte to
    the file `counter` (O_APPEND writes are atomic), so the count is exact
    across worker processes and threads, whatever the start method."""

    def __init__(self, n: int, counter: str | None, delay: float = 0.0) -> None:
        self.n = n
        self.counter = counter
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    @staticmethod
    def expected(i: int) -> torch.Tensor:
        return expected_tensor(i, (4, 4))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        if self.delay:
            import time

            time.sleep(self.delay)
        if self.counter is not None:
            import os

            fd = os.open(self.counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, b"x")
            finally:
                os.close(fd)
        return self.expected(i), i
