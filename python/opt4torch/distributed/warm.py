"""A cluster loader resumed in its own processes keeps what its nodes' pools
hold (issue 36; docs/cluster.md, "The cache after a resume").

``load_state_dict`` on a live ``cluster=True`` loader plans the rest of the
timeline again. Before it does, each node's first rank (the one that owns
the node's pool) says what its pool holds with a read to come
(:func:`held_by`); the ranks gather that with what they agree on before
planning (planning/cluster.py, ``agree``), and the plan of the rest starts
with a warm prefix of those items (``cluster_plan(warm=)``), so OPT decides
which to keep and keeps each where it is. The new pool is warmed with them,
copied from the old one (pool/keep.py), before any worker starts.

The held items travel from the loader's resume to the loader's rebuild as a
context (:func:`keeping`), not as an argument of the DataLoader. May touch:
the old pool (read, its prefetcher stopped) and the new one (warmed), the
dataset (an item the old pool no longer holds).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..planning.clusterplan import WARM, NodePlan
from ..pool.cache import OPTCache
from ..pool.codec import encode
from ..pool.keep import keep_from

__all__ = ["Held", "held_by", "held_now", "keeping", "warm_count", "warm_pool"]


@dataclass(frozen=True)
class Held:
    """What a node's pool holds for the plan of the rest, on the rank that
    owns it: the old pool, where the run left its plan (``stop``, a
    node-plan position), the items it holds with a read to come there, and
    the old plan's position of each one's next read (where it is copied
    from)."""

    cache: OPTCache
    stop: int
    items: npt.NDArray[np.int64]
    reads: npt.NDArray[np.int64]


_held: ContextVar[Held | None] = ContextVar("opt4torch_cluster_held", default=None)


def held_by(cache: OPTCache, stop: int) -> Held:
    """What ``cache`` (a node's pool, on its owner) holds with a read to
    come once its plan ran up to position ``stop``."""
    at = min(max(int(stop), cache._prefix), cache.plan.accesses)
    items, reads = cache.plan.resident_reads_at(at)
    return Held(cache=cache, stop=at, items=items, reads=reads)


@contextmanager
def keeping(held: Held | None) -> Iterator[None]:
    """A loader built inside this plans after ``held``'s prefix (None: cold)."""
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)


def held_now() -> Held | None:
    """What the loader being built is to keep (:func:`keeping`), if any."""
    return _held.get()


def warm_count(node_plan: NodePlan) -> int:
    """The node plan's warm positions (its first ones)."""
    return int((node_plan.role == WARM).sum())


def warm_pool(held: Held, new: OPTCache, dataset: Any, allow_pickle: bool) -> tuple[int, int]:
    """Warm ``new`` (whose plan's first ``new._prefix`` positions are its
    node's warm prefix) with the items it keeps, from the old pool; an item
    the old pool no longer holds is read from ``dataset``. Returns how many
    were copied, and how many loaded.

    The old pool's prefetcher and transfer thread end first. The copy reads
    the old pool at the items' next reads, up to the end of its plan, which
    moves the pool's head, the pace of the old transfer thread: left
    running, each node's thread would run on to another turn and wait out
    ``cluster_timeout`` in a collective the others never enter (60-65 s a
    resume in bench/cluster_warm_resume.py --run, before). Every node's
    owner ends it here, at the same point of the resume, so the nodes agree
    on their last turn at once (docs/cluster.md, "The last turn, agreed");
    closing the old loader later finds it ended."""
    if held.cache.transfers is not None:
        held.cache.transfers.finish()
    held.cache.stop_prefetch()
    read_at = dict(zip(held.items.tolist(), held.reads.tolist()))
    return keep_from(held.cache, new, held.stop, read_at, lambda item: encode(dataset[item], allow_pickle))
