"""Node plans run by real pools, in one process: each node of a windowed
cluster plan gets its own pool (ClusterPlan.pool_plan, a shared-memory
segment as a DataLoader makes) and reads through it (PlannedDataset, as a
worker does). The transfers are done by hand at each window's start, in the
order the run time's transfer thread will do them (docs/cluster.md, "The run
time"): deliveries, then RECEIVEs, then SENDs, then the ranks' reads.

What must hold: every sample equals the source's, each node reads from
storage exactly the plan's bytes for it, each pool's hits are its node
plan's, and every item sent is used once."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opt4torch import cluster
from opt4torch._codec import encode, encoded_size
from opt4torch.cluster import cluster_plan
from opt4torch.data import OPTCache, PlannedDataset

pytestmark = pytest.mark.timeout(180)


def content(x: int, size: int) -> np.ndarray:
    """Item x: its own bytes, so a wrong item cannot pass for it."""
    return np.random.default_rng(x).integers(0, 256, size=size, dtype=np.uint8)


class Storage:
    """The dataset as storage: counts each node's reads, and their bytes as
    the plan counts them (``counted``)."""

    def __init__(self, sizes: np.ndarray, counted: np.ndarray) -> None:
        self.sizes, self.counted = sizes, counted
        self.reads: dict[int, int] = defaultdict(int)
        self.bytes_read: dict[int, int] = defaultdict(int)

    def read(self, node: int, x: int) -> np.ndarray:
        self.reads[node] += 1
        self.bytes_read[node] += int(self.counted[x])
        return content(x, int(self.sizes[x]))


class Router:
    """A node's dataset: what the pool asks it to load comes from storage,
    or from the peers' deliveries, as the plan says for the position being
    read (``source``, set by the driver before each read)."""

    def __init__(self, node: int, storage: Storage, items: int) -> None:
        self.node, self.storage, self.items = node, storage, items
        self.source = cluster.FROM_STORAGE
        self.inbox: dict[int, list[np.ndarray]] = defaultdict(list)

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, x: int) -> Any:
        if self.source == cluster.FROM_POOL:
            raise AssertionError(f"node {self.node}: the pool loads item {x}, which the plan says it holds")
        if self.source == cluster.FROM_PEER:
            assert self.inbox[x], f"node {self.node}: item {x} was never delivered"
            return self.inbox[x].pop()
        return self.storage.read(self.node, x)


def run(cp: cluster.ClusterPlan, sizes: np.ndarray, page_size: int) -> None:
    items = int(sizes.size)
    storage = Storage(sizes, cp.item_size(np.arange(items)))
    plans = [cp.node_plan(n) for n in range(cp.n_nodes)]
    caches = [OPTCache(cp.pool_plan(n, plans[n]), page_size) for n in range(cp.n_nodes)]
    try:
        routers = [Router(n, storage, items) for n in range(cp.n_nodes)]
        views = [PlannedDataset(routers[n], caches[n].name, len(plans[n]), items) for n in range(cp.n_nodes)]
        deliver: dict[int, list[tuple[int, int, np.ndarray]]] = defaultdict(list)
        # Each node's positions by window and role, in its plan's order.
        by: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        for n, p in enumerate(plans):
            for i in range(len(p)):
                by[(int(p.window[i]), int(p.role[i]), n)].append(i)
        last = max(int(p.window[-1]) for p in plans if len(p)) if any(len(p) for p in plans) else -1

        def read(n: int, i: int) -> np.ndarray:
            p = plans[n]
            routers[n].source = int(p.source[i])
            got = views[n][i]
            x = int(p.seq[i])
            assert np.array_equal(got, content(x, int(sizes[x]))), f"node {n}, position {i}: wrong bytes"
            return got

        for k in range(last + 3):
            for n, x, obj in deliver.pop(k, []):
                routers[n].inbox[x].append(obj)
            for n in range(cp.n_nodes):
                for i in by.pop((k, cluster.RECEIVE, n), []):
                    read(n, i)
                for i in by.pop((k, cluster.SEND, n), []):
                    t = int(plans[n].position[i])
                    deliver[k + 1].append((int(cp.reader[t]), int(plans[n].seq[i]), read(n, i)))
            # The ranks' reads, in timeline order across nodes.
            reads = sorted((int(plans[n].position[i]), n, i) for n in range(cp.n_nodes)
                           for i in by.pop((k, cluster.WORKER, n), []))
            for t, n, i in reads:
                got = read(n, i)
                if plans[n].forward[i]:
                    deliver[k + 2].append((int(cp.nodes[t]), int(plans[n].seq[i]), got))
        assert not by and not deliver
        assert all(not any(r.inbox.values()) for r in routers), "an item was sent and never used"
        per_node = cp.node_stats()
        for n in range(cp.n_nodes):
            assert storage.reads[n] == per_node[n]["storage_reads"]
            assert storage.bytes_read[n] == per_node[n]["plan_storage_bytes"]
            st_ = caches[n].stats()
            assert st_["hits"] == st_["plan_hits"] == int((plans[n].op == 0).sum())
            assert st_["fallbacks"] == 0
    finally:
        for c in caches:
            c.close()


def shuffles(n: int, world: int, epochs: int, seed: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    perms = [rng.permutation(n) for _ in range(epochs)]
    return [[p[r::world] for p in perms] for r in range(world)]


@pytest.mark.parametrize("window", [1, 3])
def test_four_nodes_in_items(window: int) -> None:
    n = 300
    sizes = np.random.default_rng(1).integers(1, 400, size=n)
    cp = cluster_plan(shuffles(n, 4, 3, seed=2), None, n // 4, batch_size=4, window=window, item_sizes=sizes)
    assert cp.peer_hits > 0 and cp.remote_admits > 0
    run(cp, sizes, page_size=512)


def test_two_ranks_a_node_in_bytes() -> None:
    """Capacities in bytes: the plan's sizes are what a pool stores (the
    encoded records), and pages hold them."""
    n = 240
    sizes = np.random.default_rng(3).integers(1, 3000, size=n)
    stored = np.array([encoded_size(encode(content(x, int(sizes[x])))) for x in range(n)])
    cp = cluster_plan(shuffles(n, 4, 3, seed=4), [0, 0, 1, 1], cache_bytes=int(stored.sum()) // 4,
                      item_sizes=stored, batch_size=4, window=2)
    assert cp.sized and cp.peer_hits > 0
    run(cp, sizes, page_size=cp.page_size)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 6), st.integers(0, 2**16))
def test_random_clusters(nodes: int, window: int, batch: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 60))
    world = int(rng.integers(1, 5))
    sizes = rng.integers(1, 200, size=n)
    seqs = [[rng.integers(0, n, size=int(rng.integers(0, 30))) for _ in range(2)] for _ in range(world)]
    if not any(a.size for s in seqs for a in s):
        seqs[0][0] = np.array([0])
    node_of = rng.integers(0, nodes, size=world).tolist()
    caps = rng.integers(0, 6, size=nodes)
    caps[0] += 1
    cp = cluster_plan(seqs, node_of, caps.tolist(), items=n, batch_size=batch, window=window, item_sizes=sizes)
    run(cp, sizes, page_size=512)


# ---- the receive side's claims (opt4_pool_prefetch_claim_at) ----


class Counted:
    """Items of the shapes above; counts which items a reader loaded."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, x: int) -> np.ndarray:
        self.loaded.append(x)
        return content(x, 50 + x)


def claimed_pool(release: set[int] | None = None) -> None:
    import threading

    import opt4torch
    from opt4torch import _engine

    rng = np.random.default_rng(9)
    seq = rng.integers(0, 40, size=300)
    plan = opt4torch.plan(seq, 10, items=40)
    kinds = plan.kinds
    misses = np.flatnonzero(kinds != opt4torch.HIT)
    mine = set(misses[::3].tolist())  # the receive side's
    cache = OPTCache(plan, 256, staging_slots=8, wait_timeout=20.0)
    try:
        rx = _engine.pool_attach(cache.name)
        for t in sorted(mine):
            status, t_, item, kind, space = rx.prefetch_claim_at(t)
            assert status == _engine.PREFETCH_CLAIMED and t_ == t and item == seq[t]
            assert rx.prefetch_claim_at(t)[0] == _engine.PREFETCH_IDLE  # held already
        hit = int(np.flatnonzero(kinds == opt4torch.HIT)[0])
        assert rx.prefetch_claim_at(hit)[0] == _engine.PREFETCH_IDLE
        with pytest.raises(opt4torch.InvalidInputError, match="past the plan"):
            rx.prefetch_claim_at(len(seq))
        # A storage prefetcher now never gets one of them.
        pf = _engine.pool_attach(cache.name)
        seen = []
        while True:
            status, t, *_ = pf.prefetch_claim(len(seq))
            if status != _engine.PREFETCH_CLAIMED:
                break
            seen.append(t)
            pf.prefetch_release(t)  # the reader loads it
        assert seen and not mine & set(seen)
        # The receiver stores its items while the reader reads in order: the
        # reader waits for them, or loads the released ones itself.
        released = release or set()

        def receive() -> None:
            for t in sorted(mine):
                if t in released:
                    rx.prefetch_release(t)
                else:
                    assert rx.prefetch_store(t, encode(content(int(seq[t]), 50 + int(seq[t])))) == 1

        ds = Counted(40)
        view = PlannedDataset(ds, cache.name, len(seq), 40)
        th = threading.Thread(target=receive)
        th.start()
        for t in range(len(seq)):
            assert np.array_equal(view[t], content(int(seq[t]), 50 + int(seq[t])))
        th.join()
        loaded = sorted(ds.loaded)
        assert loaded == sorted(int(seq[t]) for t in misses if t not in mine or t in released)
        st = cache.stats()
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0
        rx.close()
        pf.close()
    finally:
        cache.close()


def test_claimed_positions_are_the_claimers() -> None:
    """Positions the receive side claims up front: no storage prefetcher
    takes them, their reader waits for the store and loads none of them."""
    claimed_pool()


def test_a_released_claim_is_loaded_by_its_reader() -> None:
    """A window whose collective failed: the receive side gives its claims
    up, and their readers load the items themselves, right."""
    claimed_pool(release={int(t) for t in range(0, 300, 7)})
