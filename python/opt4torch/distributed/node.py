"""Ranks sharing one pool (``share_across_ranks=True``): the node's process
group, and one sequence for the node's ranks. May touch: torch.distributed
(collectives on the node's group); never a pool.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..planning.timeline import interleave

__all__ = ["interleave_ranks", "node_group", "release_group"]


def node_group() -> tuple[Any, int, int]:
    """The process group of this node's ranks (torchrun numbers them
    contiguously per node), this rank in it, and its size."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("share_across_ranks needs torch.distributed initialised "
                           "(torch.distributed.init_process_group) before the loader is built")
    world, rank = dist.get_world_size(), dist.get_rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world == local:
        return dist.group.WORLD, rank, world
    groups = [dist.new_group(list(range(n * local, (n + 1) * local))) for n in range(world // local)]
    return groups[rank // local], rank % local, local


def interleave_ranks(per_epoch_idx: list[np.ndarray], per_epoch_lengths: list[np.ndarray], group: Any,
                      rank: int, world: int) -> tuple[np.ndarray, list[np.ndarray], list[int], list[np.ndarray]]:
    """One sequence for a node's ranks, as data-parallel training reads it:
    epoch by epoch, step by step, rank 0's batch, then rank 1's, ...
    (:func:`opt4torch.cluster.interleave`, the order cluster plans use too).
    Returns the sequence, this rank's batch starts per epoch (global
    positions), the epochs' first positions, and this rank's batch lengths."""
    import torch.distributed as dist

    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, (per_epoch_idx, per_epoch_lengths), group=group)
    timeline, starts, floors = interleave([e[0] for e in everyone], [e[1] for e in everyone])
    return timeline.seq, starts[rank], floors, per_epoch_lengths


def release_group(group: Any) -> None:
    """Destroy a process group the loader made for itself, once nothing of
    the loader's uses it: its gloo threads end here, not in the
    interpreter's finalization or under a later ``destroy_process_group()``
    (issue 39). Local (no collective). Nothing to do when the default group
    is gone already: destroying it destroyed this one too."""
    import torch.distributed as dist

    if group is None or not (dist.is_available() and dist.is_initialized()) or group is dist.group.WORLD:
        return
    try:
        dist.destroy_process_group(group)
    except ValueError:  # "Invalid process group specified": destroyed already
        pass
