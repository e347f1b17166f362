"""Traces: access sequences on disk and seeded generators of them.

On disk a trace is either a text file with one id per line (blank lines and
``#`` comments allowed) or a ``.npy`` file holding a 1-D integer array. Both
load into an int64 numpy array.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ._engine import InvalidInputError

__all__ = ["load_trace", "save_trace", "uniform", "epoch_shuffle"]


def load_trace(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a trace: ``.npy`` (a 1-D integer array) or text, one id per line."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no trace file at {path!r}")
    if path.endswith(".npy"):
        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise InvalidInputError(f"{path}: not a readable .npy array ({exc})") from None
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise InvalidInputError(
                f"{path}: a trace must be a 1-D integer array, got shape {arr.shape} "
                f"and dtype {arr.dtype}"
            )
        return arr.astype(np.int64, copy=False)
    try:
        arr = np.loadtxt(path, dtype=np.int64, comments="#", ndmin=1)
    except ValueError as exc:
        raise InvalidInputError(
            f"{path}: a text trace holds one integer id per line ({exc})"
        ) from None
    if arr.ndim != 1:
        raise InvalidInputError(f"{path}: one id per line, got {arr.shape[1]} columns")
    return arr


def save_trace(path: str | os.PathLike[str], seq: Any) -> None:
    """Write a trace: ``.npy`` by extension, else text with one id per line."""
    arr = np.asarray(seq, dtype=np.int64)
    path = os.fspath(path)
    if path.endswith(".npy"):
        np.save(path, arr, allow_pickle=False)
    else:
        np.savetxt(path, arr, fmt="%d")


def uniform(items: int, accesses: int, seed: int = 0) -> np.ndarray:
    """Independent uniform draws with replacement (RandomSampler(replacement=True))."""
    return np.random.default_rng(seed).integers(0, items, size=accesses, dtype=np.int64)


def epoch_shuffle(items: int, epochs: int, seed: int = 0) -> np.ndarray:
    """A fresh permutation of all items per epoch (RandomSampler, shuffle=True)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(items) for _ in range(epochs)]).astype(np.int64)
