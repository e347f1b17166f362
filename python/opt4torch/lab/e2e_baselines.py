"""What every configuration of the end-to-end comparison shares after the
cache (decode, random crop and flip; the model; the samplers), and the
baselines' datasets as users would write them: no cache, per-worker
cachetools caches, one LRU shared through a manager, a static cache.
May touch: shared memory of its own (the static cache), a manager process.
"""

from __future__ import annotations

import io
import mmap
import multiprocessing as mp
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .e2e_setup import SAMPLERS

__all__ = ["DecodeCropFlip", "crop_flip", "make_model", "make_sampler"]


# ---- after the cache: decode, random crop, random flip ----


class DecodeCropFlip:
    """``(jpeg bytes, label) -> (float tensor 3 x crop x crop, label)``: PIL
    decodes, then a random crop and a random horizontal flip (torch's RNG,
    which the DataLoader seeds per worker)."""

    def __init__(self, crop: int) -> None:
        self.crop = int(crop)

    def __call__(self, sample: Any) -> Any:
        from PIL import Image

        data, label = sample
        return crop_flip(Image.open(io.BytesIO(data)), self.crop), int(label)


def crop_flip(image: Any, crop: int) -> Any:
    """A PIL image -> a float tensor 3 x crop x crop: a random crop and a
    random horizontal flip (torch's RNG)."""
    import torch

    img = np.asarray(image.convert("RGB"))
    h, w = img.shape[:2]
    top = int(torch.randint(0, h - crop + 1, ()).item())
    left = int(torch.randint(0, w - crop + 1, ()).item())
    img = img[top:top + crop, left:left + crop]
    if torch.rand(()).item() < 0.5:
        img = img[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float().div_(255.0)


def make_model(classes: int) -> Any:
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes),
    )


def make_sampler(kind: str, labels: np.ndarray, seed: int) -> Any:
    """A fresh seeded sampler: every configuration gets the same order."""
    import torch
    from torch.utils.data import RandomSampler, WeightedRandomSampler

    n = len(labels)
    g = torch.Generator().manual_seed(seed)
    if kind == "shuffle":
        return RandomSampler(range(n), generator=g)
    if kind == "replacement":
        return RandomSampler(range(n), replacement=True, num_samples=n, generator=g)
    if kind == "balanced":
        counts = np.bincount(labels)
        weights = torch.as_tensor(1.0 / counts[labels], dtype=torch.double)
        return WeightedRandomSampler(weights, num_samples=n, replacement=True, generator=g)
    raise ValueError(f"unknown sampler {kind!r} (one of {', '.join(SAMPLERS)})")


# ---- the datasets of the baselines, as users would write them ----


def _shared_int64(n: int) -> np.ndarray:
    """Zeros in an anonymous shared mapping: forked workers write to it."""
    return np.frombuffer(mmap.mmap(-1, max(8, 8 * n)), dtype=np.int64)[:n]


def _worker_id() -> int:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return info.id if info is not None else 0


class NoCache:
    def __init__(self, rf: Any, transform: Callable[[Any], Any]) -> None:
        self.rf, self.transform = rf, transform

    def __len__(self) -> int:
        return len(self.rf)

    def __getitem__(self, i: int) -> Any:
        return self.transform(self.rf[i])


class InMemory(NoCache):
    """The records already in a list: the same path as no cache, minus storage."""


class PerWorkerCache(NoCache):
    """``cachetools.<Policy>(maxsize=C)`` in each worker process (made lazily,
    so each worker has its own, kept across epochs by persistent workers)."""

    def __init__(self, rf: Any, policy: str, capacity: int, workers: int,
                 transform: Callable[[Any], Any]) -> None:
        super().__init__(rf, transform)
        self.policy, self.capacity = policy, capacity
        self.counts = _shared_int64(2 * max(1, workers))  # hits, misses per worker
        self._cache: Any = None
        self._pid = -1

    def __getitem__(self, i: int) -> Any:
        if self._pid != os.getpid():
            import cachetools

            self._cache = getattr(cachetools, self.policy)(maxsize=self.capacity)
            self._pid = os.getpid()
        w = _worker_id()
        sample = self._cache.get(i)
        if sample is None:
            self.counts[2 * w + 1] += 1
            sample = self.rf[i]
            self._cache[i] = sample
        else:
            self.counts[2 * w] += 1
        return self.transform(sample)


class _LRUStore:
    """The shared LRU, living in a manager process; every get and put is a
    round trip to it from the workers."""

    def __init__(self, capacity: int) -> None:
        import cachetools

        self._cache = cachetools.LRUCache(maxsize=capacity)
        self._lock = threading.Lock()  # the manager serves each connection on a thread
        self.hits = self.misses = 0

    def get(self, key: int) -> Any:
        with self._lock:
            value = self._cache.get(key)
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
            return value

    def put(self, key: int, value: Any) -> None:
        with self._lock:
            self._cache[key] = value

    def counts(self) -> tuple[int, int]:
        return self.hits, self.misses


def lru_manager() -> Any:
    from multiprocessing.managers import BaseManager

    class LRUManager(BaseManager):
        pass

    LRUManager.register("LRUStore", _LRUStore)
    return LRUManager(ctx=mp.get_context("fork"))


class SharedLRU(NoCache):
    def __init__(self, rf: Any, store: Any, transform: Callable[[Any], Any]) -> None:
        super().__init__(rf, transform)
        self.store = store

    def __getitem__(self, i: int) -> Any:
        sample = self.store.get(i)
        if sample is None:
            sample = self.rf[i]
            self.store.put(i, sample)
        return self.transform(sample)


class StaticShared(NoCache):
    """A static cache (CoorDL's and MinIO's): the first C distinct items the
    run reads are kept for good, in one shared mapping all workers use."""

    def __init__(self, rf: Any, keep: np.ndarray, workers: int, transform: Callable[[Any], Any]) -> None:
        super().__init__(rf, transform)
        self.slot_of = {int(item): s for s, item in enumerate(keep.tolist())}
        sizes = rf.item_sizes()
        self.slot_bytes = int(sizes.max())
        self.buf = mmap.mmap(-1, max(1, len(keep)) * self.slot_bytes)
        self.lens = _shared_int64(len(keep))  # 0: not loaded yet
        self.labels = rf.labels
        self.counts = _shared_int64(2 * max(1, workers))

    def __getitem__(self, i: int) -> Any:
        w = _worker_id()
        s = self.slot_of.get(int(i))
        if s is not None and self.lens[s] > 0:
            self.counts[2 * w] += 1
            at = s * self.slot_bytes
            sample = (self.buf[at:at + int(self.lens[s])], int(self.labels[i]))
        else:
            self.counts[2 * w + 1] += 1
            sample = self.rf[i]
            if s is not None:
                at = s * self.slot_bytes
                self.buf[at:at + len(sample[0])] = sample[0]
                self.lens[s] = len(sample[0])  # after the bytes: readers check it first
        return self.transform(sample)
