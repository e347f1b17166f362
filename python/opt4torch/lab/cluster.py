"""The simulator's cluster mode: N virtual nodes reading DistributedSampler
shards, under no cache, per-node OPT and cluster OPT (docs/cluster.md).

Every rank's order is generated as DistributedSampler gives it
(:func:`opt4torch.lab.traces.distributed`: a permutation per epoch, padded,
every ``world``-th index), the ranks interleaved step by step
(:func:`opt4torch.cluster.global_timeline`). Then

* **no cache**: every access is read from storage;
* **per-node OPT** (what each node does today): each node plans the
  interleaved sequence of its own ranks with its own capacity, alone;
* **cluster OPT**: one plan over the aggregate memory
  (:func:`opt4torch.cluster_plan`): local hits, peer hits, storage reads.

Besides totals, each cluster row has the network load the plan implies:
the bytes a node receives from its peers per step (mean and the largest
over nodes and steps), and per window of ``window`` steps, the bytes on the
busiest (sender, receiver) pair, which is what one ``all_to_all`` of that
window carries on its largest link, and ``late_hit_rate``: the share of
accesses that are hits of the plan but, with transfers a window ahead as the
run time makes them, cannot arrive in time (the plan with ``window=``, whose
LATE reads go to storage). What this does not simulate: time. It
counts bytes; docs/cluster.md turns them into seconds with a bandwidth model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import _engine
from .._progress import progress_bar
from ..planning.sizing import choose_page
from ..planning.cluster import ClusterPlan, cluster_plan, global_timeline
from . import traces

__all__ = ["ClusterSetup", "FIELDS", "expected", "item_sizes", "link_load", "per_node_capacity", "plot_cluster",
           "rank_orders", "simulate_cluster", "sweep_cluster"]

#: The columns of a row, in order.
FIELDS: tuple[str, ...] = (
    "nodes", "ranks_per_node", "items", "epochs", "batch_size", "item_bytes", "size_sigma", "seed", "config",
    "capacity",
    "capacity_fraction", "aggregate_fraction", "policy",
    "accesses", "steps", "storage_reads", "storage_bytes", "storage_bytes_after_first_epoch", "peer_bytes",
    "local_hit_rate", "peer_hit_rate", "hit_rate", "ingress_mean_per_step", "ingress_max_per_step",
    "window", "pair_max_per_window", "storage_max_per_step", "storage_mean_per_step_after_first_epoch",
    "unplaced_hits", "late_hit_rate",
)


@dataclass(frozen=True)
class ClusterSetup:
    """One simulated cluster: ``nodes`` nodes of ``ranks_per_node`` ranks
    each, reading ``items`` items of ``item_bytes`` bytes for ``epochs``
    epochs, ``batch_size`` samples per rank per step. With ``size_sigma``
    > 0 items have lognormal sizes of mean ``item_bytes`` (sigma of the
    log) and caches are in bytes (:func:`item_sizes`)."""

    nodes: int
    items: int
    epochs: int = 3
    ranks_per_node: int = 1
    batch_size: int = 32
    item_bytes: int = 110_000
    seed: int = 0
    window: int = 8
    size_sigma: float = 0.0

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


def item_sizes(setup: ClusterSetup) -> np.ndarray | None:
    """Each item's bytes when ``setup.size_sigma`` > 0 (lognormal, mean
    ``item_bytes``, drawn from ``seed + 1``), else None: one size for all."""
    if setup.size_sigma <= 0:
        return None
    rng = np.random.default_rng(setup.seed + 1)
    mu = math.log(setup.item_bytes) - setup.size_sigma ** 2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, setup.size_sigma, setup.items))).astype(np.int64)


def per_node_capacity(spec: str | float | int, items: int, nodes: int, unit: str = "items") -> tuple[int, str]:
    """A capacity per node, in items (or bytes: ``items`` is then the
    dataset's bytes and ``unit`` "bytes"), and its label. ``"25%"``: a share
    of the dataset per node; ``"agg50%"``: a share of the dataset for the
    whole cluster, split evenly over the nodes; an integer: items (bytes) per
    node."""
    text = str(spec).strip()
    if text.startswith("agg") and text.endswith("%"):
        share = float(text[3:-1]) / 100.0
        return max(1, math.floor(share * items / nodes)), f"{text[3:]} of data, in all"
    if text.endswith("%"):
        share = float(text[:-1]) / 100.0
        return max(1, round(share * items)), f"{text} of data a node"
    value = int(text)
    if value < 1:
        raise ValueError(f"capacity {spec!r}: a node must hold at least one item")
    return value, f"{value} {unit} a node"


def rank_orders(setup: ClusterSetup) -> list[list[np.ndarray]]:
    """Each rank's DistributedSampler order, one array per epoch: the orders
    of :func:`opt4torch.lab.traces.distributed` for every rank, with each
    epoch's permutation drawn once for all ranks rather than once a rank."""
    world, items = setup.world, setup.items
    if world > items:
        return [np.split(traces.distributed(items, setup.epochs, world=world, rank=r, seed=setup.seed),
                         setup.epochs) for r in range(world)]
    total = -(-items // world) * world
    rng = np.random.default_rng(setup.seed)
    out: list[list[np.ndarray]] = [[] for _ in range(world)]
    for _ in range(setup.epochs):
        order = rng.permutation(items)
        if total > items:
            order = np.resize(order, total)  # repeats the start, as torch pads
        for r in range(world):
            out[r].append(order[r:total:world].astype(np.int64))
    return out


def link_load(cp: ClusterPlan, window: int) -> dict[str, float]:
    """The network load of a cluster plan, from its transfers: bytes a node
    receives per step (mean over nodes and steps, and the largest), and the
    busiest (sender, receiver) pair's bytes in a window of ``window`` steps."""
    n, steps = cp.n_nodes, max(cp.timeline.steps, 1)
    tr = cp.transfers()
    per_node_step = np.bincount(tr["step"] * n + tr["dst"], weights=tr["bytes"], minlength=steps * n)
    windows = (steps + window - 1) // window
    pairs = np.bincount((tr["step"] // window) * n * n + tr["src"] * n + tr["dst"], weights=tr["bytes"],
                        minlength=windows * n * n)
    return {
        "ingress_mean_per_step": float(per_node_step.mean()) if per_node_step.size else 0.0,
        "ingress_max_per_step": float(per_node_step.max()) if per_node_step.size else 0.0,
        "pair_max_per_window": float(pairs.max()) if pairs.size else 0.0,
    }


def _storage_per_step(step: np.ndarray, miss: np.ndarray, sizes: np.ndarray, steps: int,
                      first_steps: int) -> dict[str, float]:
    """Bytes the cluster reads from storage per step: the largest step, and
    the mean over the epochs after the first (the steady state: the first
    epoch's reads are compulsory for every cache)."""
    per_step = np.bincount(step[miss], weights=sizes[miss], minlength=steps) if steps else np.zeros(1)
    later = per_step[first_steps:]
    return {"storage_max_per_step": float(per_step.max()),
            "storage_mean_per_step_after_first_epoch": float(later.mean()) if later.size else 0.0}


def simulate_cluster(setup: ClusterSetup, capacity: str | int = "25%") -> list[dict[str, Any]]:
    """No cache, per-node OPT and cluster OPT on one simulated cluster: three
    rows of :data:`FIELDS`."""
    sizes = item_sizes(setup)
    D, B = setup.items, setup.item_bytes
    whole = D if sizes is None else int(sizes.sum())  # the dataset, in the capacity's unit
    cap, label = per_node_capacity(capacity, whole, setup.nodes, "items" if sizes is None else "bytes")
    page = 0 if sizes is None else choose_page(sizes)
    orders = rank_orders(setup)
    node_of_rank = np.arange(setup.world) // setup.ranks_per_node
    tl = global_timeline(orders, setup.batch_size)
    T, steps = tl.seq.size, tl.steps
    first_steps = tl.steps // setup.epochs  # every epoch has the same steps (DistributedSampler pads)
    first_epoch_end = int(np.searchsorted(tl.step, first_steps))
    reader = node_of_rank[tl.rank]
    all_bytes = np.full(T, B, dtype=np.int64) if sizes is None else sizes[tl.seq]
    base = {**asdict(setup),
            "config": label, "capacity": cap, "capacity_fraction": cap / whole,
            "aggregate_fraction": cap * setup.nodes / whole, "accesses": T, "steps": steps, "unplaced_hits": 0,
            "late_hit_rate": 0.0}
    rows = []

    # No cache: every access from storage.
    rows.append({**base, "policy": "no cache", "storage_reads": T, "storage_bytes": int(all_bytes.sum()),
                 "storage_bytes_after_first_epoch": int(all_bytes[first_epoch_end:].sum()), "peer_bytes": 0,
                 "local_hit_rate": 0.0, "peer_hit_rate": 0.0, "hit_rate": 0.0, "ingress_mean_per_step": 0.0,
                 "ingress_max_per_step": 0.0, "pair_max_per_window": 0.0,
                 **_storage_per_step(tl.step, np.ones(T, bool), all_bytes, steps, first_steps)})

    # Per-node OPT: each node plans its own ranks' interleaved reads alone.
    node_pos = [np.flatnonzero(reader == n) for n in range(setup.nodes)]
    miss = np.zeros(T, dtype=bool)
    hits = 0
    for p in node_pos:
        node_seq = np.ascontiguousarray(tl.seq[p])
        if sizes is None:
            plan = _engine.build_plan(node_seq, D, cap)
        else:
            plan = _engine.build_plan(node_seq, D, 0, True, item_sizes=sizes.astype(np.uint64),
                                      capacity_bytes=cap // page * page, page_size=page)
        kinds = np.frombuffer(plan.ops_buffer(), dtype=np.uint32) >> 30
        miss[p] = kinds != 0
        hits += int((kinds == 0).sum())
        plan.close()
    reads = int(miss.sum())
    rows.append({**base, "policy": "per-node OPT", "storage_reads": reads,
                 "storage_bytes": int(all_bytes[miss].sum()),
                 "storage_bytes_after_first_epoch": int(all_bytes[first_epoch_end:][miss[first_epoch_end:]].sum()),
                 "peer_bytes": 0,
                 "local_hit_rate": hits / T, "peer_hit_rate": 0.0, "hit_rate": hits / T,
                 "ingress_mean_per_step": 0.0, "ingress_max_per_step": 0.0, "pair_max_per_window": 0.0,
                 **_storage_per_step(tl.step, miss, all_bytes, steps, first_steps)})

    # Cluster OPT: one plan over the aggregate memory.
    def plan_cluster(window: int | None) -> ClusterPlan:
        if sizes is None:
            return cluster_plan(orders, node_of_rank.tolist(), cap, items=D, batch_size=setup.batch_size,
                                item_bytes=B, window=window)
        return cluster_plan(orders, node_of_rank.tolist(), cache_bytes=cap, page_size=page, item_sizes=sizes,
                            items=D, batch_size=setup.batch_size, window=window)

    cp = plan_cluster(None)
    late = plan_cluster(setup.window).late
    cmiss = cp.kinds >= 2  # ADMIT or BYPASS: read from storage
    rows.append({**base, "policy": "cluster OPT", "storage_reads": cp.storage_reads,
                 "storage_bytes": cp.storage_bytes, "unplaced_hits": cp.unplaced_hits,
                 "storage_bytes_after_first_epoch": int(all_bytes[first_epoch_end:][cmiss[first_epoch_end:]].sum()),
                 "peer_bytes": cp.peer_bytes, "local_hit_rate": cp.local_hits / T, "late_hit_rate": late / T,
                 "peer_hit_rate": cp.peer_hits / T, "hit_rate": cp.hits / T, **link_load(cp, setup.window),
                 **_storage_per_step(tl.step, cmiss, all_bytes, steps, first_steps)})
    return rows


def sweep_cluster(nodes: Sequence[int], capacities: Sequence[str | int], *, items: int, epochs: int = 3,
                  ranks_per_node: int = 1, batch_size: int = 32, item_bytes: int = 110_000, seed: int = 0,
                  window: int = 8, size_sigma: float = 0.0, progress: bool | None = None) -> list[dict[str, Any]]:
    """:func:`simulate_cluster` for every node count and capacity, with a
    progress bar (shown on a terminal unless ``progress=False``)."""
    rows: list[dict[str, Any]] = []
    with progress_bar(total=len(nodes) * len(capacities), desc="cluster", unit="cluster", show=progress) as bar:
        for n in nodes:
            setup = ClusterSetup(nodes=int(n), items=items, epochs=epochs, ranks_per_node=ranks_per_node,
                                 batch_size=batch_size, item_bytes=item_bytes, seed=seed, window=window,
                                 size_sigma=size_sigma)
            for cap in capacities:
                rows += simulate_cluster(setup, cap)
                bar.update(1)
    return rows


def expected(nodes: int, epochs: int, aggregate_fraction: float) -> dict[str, float]:
    """Closed forms for DistributedSampler shuffles, each item read once per
    epoch by a node drawn uniformly at random (docs/cluster.md, "The model"),
    as fractions of all accesses:

    * per-node OPT, at any capacity: at most the reuse a node sees of its own
      shards, ``1 - (1 - (1 - 1/N)^E) * N / E`` (its distinct items are
      compulsory misses);
    * cluster OPT with the dataset in aggregate memory: ``1 - 1/E`` hits, of
      which local ``(1 + (E - 2) / N) / E`` (an item's second read is local,
      since its home is its next reader; each later read is local when the
      same node read it last, 1 in N), peer the rest;
    * cluster OPT below that (``aggregate_fraction`` f < 1), for the hit rate:
      ``(E - 1) * f / E`` (Belady keeps a fraction f of the items from epoch
      to epoch, docs/why-opt.md).
    """
    N, E, f = nodes, epochs, aggregate_fraction
    per_node = 1.0 - (1.0 - (1.0 - 1.0 / N) ** E) * N / E
    if f >= 1.0:
        local = (1.0 + (E - 2) / N) / E
        return {"per_node_hit_rate": per_node, "cluster_hit_rate": 1.0 - 1.0 / E,
                "cluster_local_hit_rate": local, "cluster_peer_hit_rate": 1.0 - 1.0 / E - local}
    return {"per_node_hit_rate": per_node, "cluster_hit_rate": (E - 1) * f / E}


def plot_cluster(rows: Sequence[dict[str, Any]], path: str) -> str:
    """Storage bytes and hit rates against the node count, one column per
    capacity setting: the figure of docs/cluster.md. Returns ``path``."""
    from .plots import require_matplotlib

    plt = require_matplotlib()
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(2, len(configs), figsize=(5.2 * len(configs), 7.2), squeeze=False)
    styles = {"no cache": ("#d62728", "s"), "per-node OPT": ("#1f77b4", "o"), "cluster OPT": ("black", "D")}
    for j, config in enumerate(configs):
        sub = [r for r in rows if r["config"] == config]
        top, bottom = axes[0][j], axes[1][j]
        for policy, (color, marker) in styles.items():
            pts = sorted((r["nodes"], r) for r in sub if r["policy"] == policy)
            if not pts:
                continue
            xs = [n for n, _ in pts]
            top.plot(xs, [r["storage_bytes"] / 1e9 for _, r in pts], color=color, marker=marker, label=policy)
            if policy == "cluster OPT":
                bottom.plot(xs, [r["hit_rate"] for _, r in pts], color=color, marker=marker,
                            label="cluster OPT: all hits")
                bottom.plot(xs, [r["local_hit_rate"] for _, r in pts], color=color, marker=marker,
                            linestyle="--", label="cluster OPT: local")
                bottom.plot(xs, [r["peer_hit_rate"] for _, r in pts], color=color, marker=marker,
                            linestyle=":", label="cluster OPT: peer")
            elif policy == "per-node OPT":
                bottom.plot(xs, [r["hit_rate"] for _, r in pts], color=color, marker=marker, label=policy)
        model = []
        for r in sub:
            if r["policy"] == "cluster OPT":
                e = expected(r["nodes"], r["epochs"], r["aggregate_fraction"])
                model.append((r["nodes"], [v for k, v in e.items()]))
        for n, values in model:
            bottom.plot([n] * len(values), values, linestyle="none", marker="x", markersize=9, color="#2ca02c",
                        label="closed form" if n == model[0][0] else None, zorder=6)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r["nodes"] for r in sub}))
            ax.set_xticklabels([str(n) for n in sorted({r["nodes"] for r in sub})])
            ax.set_xlabel("nodes")
            ax.grid(True, alpha=0.3)
        top.set_ylim(bottom=0)
        top.set_ylabel("bytes read from storage, whole run (GB)")
        top.set_title(f"cache: {config}")
        bottom.set_ylim(0, 1)
        bottom.set_ylabel("share of accesses")
        top.legend(fontsize=8)
        bottom.legend(fontsize=8, loc="upper center", ncol=3)
    first = rows[0]
    fig.suptitle(f"{first['items']:,} items of {first['item_bytes']:,} bytes, {first['epochs']} epochs of "
                 f"DistributedSampler shuffles, {first['ranks_per_node']} rank(s) a node, "
                 f"batch {first['batch_size']} a rank")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
