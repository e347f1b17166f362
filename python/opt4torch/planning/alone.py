"""When every node plans alone (issue 36, "never slower"; docs/cluster.md,
"When the nodes plan alone"): each node's own OPT plan over its own reads
at its own capacity, as a cluster plan's kinds, nodes and figures, and the
choice between it and the plan over the cluster (``cluster_plan(alone=)``).
May touch: the planner and the engine's placement; nothing of a run.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .. import _engine
from .._engine import InvalidInputError
from .clusterplan import BYPASS
from .plan import plan as build_plan

__all__ = ["MIN_SAVING", "choose", "nodes_alone", "positions_by_node"]

#: ``cluster_plan(alone=None)`` (and ``cluster=True``'s loader) plans with
#: the cluster only where that reads at least this fraction fewer bytes from
#: storage than every node planning alone. Two nodes that each hold a
#: quarter of the dataset save 0.3 % by one plan, for a transfer every
#: 3.3 reads (bench/RESULTS.md, "When the nodes plan alone"); the other
#: shapes measured save 5.3 % to 62 % (docs/cluster.md).
MIN_SAVING = 0.05

#: Positions sorted by node this many at a time (the sort's own index is
#: 8 bytes a position; the nodes' positions are kept at 4).
_CHUNK = 1 << 23

Placed = tuple[np.ndarray, np.ndarray, dict[str, int], list[dict[str, int]]]


def choose(alone: bool | None, placed: Placed, seq: np.ndarray, items: int, reader: np.ndarray, caps: np.ndarray,
           page: int, sizes: np.ndarray | None, item_bytes: int, window_of: np.ndarray | None, prefix: int
           ) -> Placed:
    """The cluster's placement (``placed``: kinds, nodes, totals, per node)
    or every node's own plan, as ``alone`` says (False, True, or None:
    alone unless the cluster's reads MIN_SAVING fewer bytes from storage).
    The totals say which (``alone``, 0 or 1). With None the nodes' plans
    are made once for their figures, and once more for their kinds only if
    they are taken: the plan over the cluster, kept, needs none of theirs."""
    placed[2]["alone"] = 0
    if alone is False:
        return placed
    mine = positions_by_node(reader, caps.size)
    args = (seq, items, mine, caps, page, sizes, item_bytes, window_of, prefix)
    solo = nodes_alone(*args, fill=bool(alone))
    if isinstance(solo, str):
        if alone:
            raise InvalidInputError(f"alone=True: {solo}; give it more, or plan with the cluster (alone=False)")
        return placed
    if alone:
        return solo
    if placed[2]["storage_bytes"] > (1 - MIN_SAVING) * solo[2]["storage_bytes"]:
        filled = nodes_alone(*args, fill=True)
        assert not isinstance(filled, str)
        return filled
    return placed


def positions_by_node(reader: np.ndarray, n_nodes: int) -> list[np.ndarray]:
    """Each node's positions, in timeline order (uint32 when the timeline
    allows it), found by a stable sort of a chunk at a time: not a pass over
    the timeline a node (64 nodes at ImageNet-1k, 90 epochs), nor a sort's
    8-byte index of the whole of it."""
    dtype = np.uint32 if reader.size < 2**32 else np.int64
    parts: list[list[np.ndarray]] = [[] for _ in range(n_nodes)]
    for lo in range(0, reader.size, _CHUNK):
        r = reader[lo:lo + _CHUNK]
        order = np.argsort(r, kind="stable")
        counts = np.bincount(r, minlength=n_nodes)
        ends = np.cumsum(counts)
        for n in np.flatnonzero(counts).tolist():
            parts[n].append((order[ends[n] - counts[n]:ends[n]] + lo).astype(dtype))
    return [np.concatenate(p) if p else np.empty(0, dtype) for p in parts]


def nodes_alone(seq: np.ndarray, items: int, by_node: list[np.ndarray], caps: np.ndarray, page: int,
                sizes: np.ndarray | None, item_bytes: int, window_of: np.ndarray | None, prefix: int, *,
                fill: bool = True) -> Placed | str:
    """Each node's own OPT plan over its own reads (``by_node[n]``, its
    positions) at its own capacity, as a cluster plan's kinds, nodes and
    figures (``cluster_plan(alone=True)``): each node placed by the engine
    as a cluster of one, so every hit is local and nothing is ever sent.
    ``fill=False``: the figures only (kinds and nodes empty). Or why it
    cannot be: a node that reads an item its own capacity cannot hold (only
    the cluster can serve it)."""
    size = seq.size if fill else 0
    kinds = np.full(size, BYPASS, dtype=np.uint8)
    nodes = np.full(size, _engine.CLUSTER_NONE, dtype=np.uint32)
    info: dict[str, int] = {}
    per_node: list[dict[str, int]] = []
    sums = []
    for n, mine in enumerate(by_node):
        sub = seq[mine]
        if mine.size:
            need = 1 if sizes is None or page == 0 else -(-int(sizes[np.unique(sub)].max()) // page)
            if need > caps[n]:
                what = "item" if page == 0 else f"largest item ({need} pages of {page} bytes)"
                return f"node {n} reads, but its capacity ({int(caps[n])}) cannot hold its {what}"
        cap = max(int(caps[n]), 1)  # a node that reads nothing is placed over no reads
        p = (build_plan(sub, cap, items=items, progress=False) if page == 0 else
             build_plan(sub, items=items, capacity_bytes=cap * page, item_sizes=sizes, page_size=page,
                        progress=False))
        k = np.empty(mine.size, dtype=np.uint8)
        nd = np.empty(mine.size, dtype=np.uint32)
        got, (st,) = _engine.cluster_place(p._h, np.zeros(mine.size, dtype=np.uint32),
                                           np.array([cap], dtype=np.uint64), k, nd, sizes, item_bytes,
                                           None if window_of is None else np.ascontiguousarray(window_of[mine]),
                                           int(np.searchsorted(mine, prefix)))
        if fill:
            kinds[mine] = k
            nodes[mine] = np.where(nd == _engine.CLUSTER_NONE, nd, np.uint32(n))
        per_node.append(st)
        sums.append(int(got.pop("checksum")))
        for key, v in got.items():
            info[key] = info.get(key, 0) + int(v)
    info["capacity"] = int(caps.sum())
    # The nodes' own checksums, in node order, with their capacities.
    h = hashlib.blake2b(b"opt4torch-cluster-alone", digest_size=8)
    h.update(np.asarray(sums, dtype=np.uint64).tobytes())
    h.update(np.ascontiguousarray(caps, dtype=np.uint64).tobytes())
    info["checksum"] = int.from_bytes(h.digest(), "little")
    info["alone"] = 1
    return kinds, nodes, info, per_node
