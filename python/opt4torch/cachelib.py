"""The earlier design's API names, kept for its users.

``generate_precomputed_file`` captures a seeded ``RandomSampler`` and writes
the result as an opt4 plan file (the documented binary format, never a
pickle, whatever the file's extension).
"""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

from ._plan import Plan, plan as build_plan, sequence_plan
from .capture import capture

__all__ = ["generate_precomputed_file", "sampler_description"]


def sampler_description(**fields: Any) -> str:
    """The JSON description stored in a plan file: how to rebuild its sequence."""
    from . import __version__

    try:
        import torch

        fields.setdefault("torch", torch.__version__)
    except ImportError:  # pragma: no cover
        pass
    fields.setdefault("opt4torch", __version__)
    return json.dumps(fields, sort_keys=True)


def generate_precomputed_file(
    dataset_size: int,
    total_iterations: int,
    persist_path: str | os.PathLike[str],
    random_seed: int | None = 0,
    replacement: bool = True,
    *,
    capacity: int | None = None,
    bypass: bool = True,
    progress: bool | None = None,
) -> Plan:
    """Capture ``RandomSampler(range(dataset_size), replacement=replacement,
    num_samples=total_iterations, generator=torch.Generator().manual_seed(
    random_seed))`` and save it to ``persist_path``.

    Without ``capacity`` the file holds the sequence only, and the cache plans
    it at the size it is given (as the earlier design's decorator did with
    ``maxsize``). With ``capacity`` it also holds the OPT decisions. A
    ``random_seed`` of None draws a fresh seed and records it in the file.
    Parent directories are created. Returns the plan.
    """
    import torch
    from torch.utils.data import RandomSampler

    if int(dataset_size) < 1:
        raise ValueError(f"dataset_size must be at least 1, got {dataset_size}")
    if int(total_iterations) < 1:
        raise ValueError(f"total_iterations must be at least 1, got {total_iterations}")
    if random_seed is None:
        random_seed = secrets.randbits(63)
    gen = torch.Generator().manual_seed(int(random_seed))
    sampler = RandomSampler(
        range(int(dataset_size)),
        replacement=bool(replacement),
        num_samples=int(total_iterations),
        generator=gen,
    )
    seq = capture(sampler, 1, progress=progress)
    desc = sampler_description(
        sampler="torch.utils.data:RandomSampler",
        dataset_size=int(dataset_size),
        num_samples=int(total_iterations),
        replacement=bool(replacement),
        seed=int(random_seed),
        epochs=1,
    )
    if capacity is None:
        result = sequence_plan(seq, items=int(dataset_size), description=desc)
    else:
        result = build_plan(seq, capacity, bypass, items=int(dataset_size), description=desc, progress=progress)
    parent = os.path.dirname(os.fspath(persist_path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    result.save(persist_path)
    result.path = os.fspath(persist_path)
    return result
