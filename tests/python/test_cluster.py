"""Cluster plans (opt4torch.cluster_plan, the C engine's opt4_cluster_place):
held to the pure-Python reference position by position, golden counts on
hand-checked timelines, the capacity invariant on random ones, the global
timeline against the one share_across_ranks builds, and capture_ranks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import opt4torch
from opt4torch import cluster
from opt4torch.cluster import ADMIT, BYPASS, LATE, LOCAL_HIT, PEER_HIT, cluster_plan, global_timeline
from opt4torch.lab import reference
from opt4torch.lab.reference_cluster import NODE_KEYS, cluster_place

pytestmark = pytest.mark.timeout(120)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[list[int]], list[int], list[int], int, int]:
    """Random ranks' orders, a node per rank, capacities per node, a batch
    size and the number of items."""
    items = draw(st.integers(1, 30))
    world = draw(st.integers(1, 6))
    length = st.integers(0, 40)
    seqs = [draw(st.lists(st.integers(0, items - 1), min_size=0, max_size=draw(length))) for _ in range(world)]
    if not any(seqs):
        seqs[0] = [0]
    n_nodes = draw(st.integers(1, world + 1))
    node_of = [draw(st.integers(0, n_nodes - 1)) for _ in range(world)]
    caps = [draw(st.integers(0, 6)) for _ in range(n_nodes)]
    if sum(caps) == 0:
        caps[draw(st.integers(0, n_nodes - 1))] = 1
    return seqs, node_of, caps, draw(st.integers(1, 4)), items


windows = st.one_of(st.none(), st.integers(1, 4))


@given(clusters(), st.booleans(), windows)
def test_engine_equals_reference(case: tuple, sized: bool, window: int | None) -> None:
    seqs, node_of, caps, batch, items = case
    sizes = np.arange(1, items + 1, dtype=np.int64) * 7 if sized else None
    cp = cluster_plan(seqs, node_of, caps, items=items, batch_size=batch, item_bytes=5, item_sizes=sizes,
                      window=window)
    ref = cluster_place(cp.seq, cp.reader, caps, item_sizes=sizes, item_bytes=5, items=items,
                        window_of=None if window is None else cp.windows().tolist())
    assert cp.kinds.tolist() == ref.kinds
    assert cp.nodes.tolist() == ref.nodes
    assert (cp.remote_admits, cp.late) == (ref.remote_admits, ref.late)
    mine = cp._per_node  # the engine's own field names
    assert [{k: d[k] for k in NODE_KEYS} for d in mine] == ref.per_node
    # The aggregate plan is Belady at the total capacity: the hits are its,
    # less those that cannot arrive in time.
    assert cp.hits + cp.late == reference.belady(cp.seq.tolist(), sum(caps), items=items).hits == cp.plan.hits
    assert window is not None or cp.late == 0


@given(clusters(), st.integers(1, 16), st.data())
def test_engine_equals_reference_in_bytes(case: tuple, page: int, data: st.DataObject) -> None:
    """Capacities in bytes: the aggregate plan is size-aware Belady over the
    nodes' pages; a generation needs its pages on one node, or is read from
    storage (unplaced). The engine and the reference agree position by
    position, unplaced ones included."""
    seqs, node_of, caps, batch, items = case
    sizes = data.draw(st.lists(st.integers(1, 40), min_size=items, max_size=items))
    node_bytes = [c * page * 3 + data.draw(st.integers(0, page - 1)) for c in caps]
    big = -(-max(sizes[x] for s in seqs for x in s) // page)  # pages of the largest item read
    if sum(b // page for b in node_bytes) < big:  # the plan refuses an item larger than the pool
        node_bytes[0] += big * page
    window = data.draw(windows)
    cp = cluster_plan(seqs, node_of, cache_bytes=node_bytes, page_size=page, items=items, batch_size=batch,
                      item_sizes=sizes, window=window)
    assert cp.sized and cp.page_size == page
    assert cp.capacities.tolist() == [b // page for b in node_bytes]
    ref = cluster_place(cp.seq, cp.reader, cp.capacities.tolist(), item_sizes=sizes, items=items,
                        page_size=page, plan_sizes=sizes,
                        window_of=None if window is None else cp.windows().tolist())
    assert cp.kinds.tolist() == ref.kinds
    assert cp.nodes.tolist() == ref.nodes
    assert (cp.unplaced, cp.unplaced_hits, cp.remote_admits, cp.late) == (
        ref.unplaced, ref.unplaced_hits, ref.remote_admits, ref.late)
    assert [{k: d[k] for k in NODE_KEYS} for d in cp._per_node] == ref.per_node
    assert cp.hits + cp.unplaced_hits + cp.late == cp.plan.hits
    assert all(d["peak_resident"] <= d["capacity"] for d in cp.node_stats())


@given(clusters(), st.booleans(), windows, st.data())
def test_warm_prefix_equals_reference(case: tuple, sized: bool, window: int | None, data: st.DataObject) -> None:
    """A warm prefix (what each node's pool holds when a live loader plans
    the rest again): the engine and the reference agree position by
    position; a kept warm item stays at the node that holds it (no
    transfer), the prefix counts in no access, and OPT decides what to
    keep as for any access (the hits are Belady's over prefix and rest)."""
    seqs, node_of, caps, batch, items = case
    n_nodes = len(caps)
    warm = [data.draw(st.lists(st.integers(0, items - 1), max_size=6, unique=True)) for _ in range(n_nodes)]
    for n in range(n_nodes):  # a node with no rank holds nothing a plan can name
        if n not in node_of:
            warm[n] = []
    sizes = np.arange(1, items + 1, dtype=np.int64) * 7 if sized else None
    cp = cluster_plan(seqs, node_of, caps, items=items, batch_size=batch, item_bytes=5, item_sizes=sizes,
                      window=window, warm=warm)
    firsts: list[int] = []
    for n in range(n_nodes):
        firsts.extend(x for x in warm[n] if x not in firsts)
    assert cp.prefix == len(firsts) and cp.seq[:cp.prefix].tolist() == firsts
    pre_nodes = cp.reader[:cp.prefix].tolist()
    assert all(x in warm[n] for x, n in zip(firsts, pre_nodes))
    ref = cluster_place(cp.seq, cp.reader, caps, item_sizes=sizes, item_bytes=5, items=items,
                        window_of=None if window is None else cp.windows().tolist(), prefix=cp.prefix)
    assert cp.kinds.tolist() == ref.kinds
    assert cp.nodes.tolist() == ref.nodes
    assert (cp.remote_admits, cp.late, cp.unplaced, cp.unplaced_hits, cp.stats()["warm"]) == (
        ref.remote_admits, ref.late, ref.unplaced, ref.unplaced_hits, ref.warm)
    assert [{k: d[k] for k in NODE_KEYS} for d in cp._per_node] == ref.per_node
    kept = cp.kinds[:cp.prefix] == ADMIT
    assert (cp.nodes[:cp.prefix][kept] == cp.reader[:cp.prefix][kept]).all()  # never moved
    assert cp.accesses == cp.seq.size - cp.prefix
    assert sum(d["accesses"] for d in cp.node_stats()) == cp.accesses
    assert cp.stats()["warm"] == int(kept.sum())
    # Every hit of the rest is the aggregate plan's, over prefix and rest.
    assert cp.hits + cp.late + cp.unplaced_hits == cp.plan.hits
    if window is not None:
        check_warm_node_plans(cp)


def check_warm_node_plans(cp: cluster.ClusterPlan) -> None:
    """Each node's plan: its kept warm items first, stored, never read by a
    worker; and the pool's plan fits the node's capacity."""
    kept = cp.kinds[:cp.prefix] == ADMIT
    for n in range(cp.n_nodes):
        np_ = cp.node_plan(n)
        w = np.flatnonzero(np_.role == cluster.WARM)
        assert w.tolist() == list(range(w.size))
        assert sorted(np_.seq[w].tolist()) == sorted(cp.seq[:cp.prefix][kept & (cp.reader[:cp.prefix] == n)]
                                                       .tolist())
        cp.pool_plan(n, np_)  # the engine checks that it fits the node's capacity


def test_warm_prefix_refused() -> None:
    with pytest.raises(opt4torch.InvalidInputError, match="one array of item ids per node"):
        cluster_plan([[0, 1]], None, 1, warm=[[0], [1]])
    with pytest.raises(opt4torch.InvalidInputError, match="no rank is on node 1"):
        cluster_plan([[0, 1]], None, [1, 1], warm=[[0], [1]])
    with pytest.raises(opt4torch.InvalidInputError, match=r"warm\[0\] must be a 1-D array"):
        cluster_plan([[0, 1]], None, 1, warm=[[-1]])


def test_golden_bytes_unplaced() -> None:
    """Two nodes of 20 bytes in 10-byte pages. B and C (10 bytes) go to
    their next readers, leaving one page on each node: A (20 bytes) fits the
    cluster but no node, so both its reads come from storage."""
    cp = cluster_plan([[1, 0, 1], [2, 2, 0]], None, cache_bytes=20, page_size=10, item_sizes=[20, 10, 10])
    assert cp.seq.tolist() == [1, 2, 0, 2, 1, 0]
    assert cp.plan.hits == 3
    assert cp.kinds.tolist() == [ADMIT, ADMIT, BYPASS, LOCAL_HIT, LOCAL_HIT, BYPASS]
    assert (cp.unplaced, cp.unplaced_hits, cp.hits) == (1, 1, 2)
    assert cp.storage_bytes == 10 + 10 + 20 + 20


@given(clusters())
def test_no_node_holds_more_than_its_capacity(case: tuple) -> None:
    """Replayed here from the kinds alone: a generation lives from its ADMIT
    to its last read, at its home; every hit reads it there."""
    seqs, node_of, caps, batch, items = case
    cp = cluster_plan(seqs, node_of, caps, items=items, batch_size=batch)
    seq, kinds, nodes, reader = cp.seq.tolist(), cp.kinds.tolist(), cp.nodes.tolist(), cp.reader.tolist()
    nxt = reference.next_uses(seq)
    live = [0] * len(caps)
    holder: dict[int, int] = {}
    for t, x in enumerate(seq):
        last = nxt[t] == len(seq) or kinds[nxt[t]] not in (LOCAL_HIT, PEER_HIT)
        if kinds[t] in (LOCAL_HIT, PEER_HIT):
            assert holder[x] == nodes[t]
            assert (kinds[t] == LOCAL_HIT) == (nodes[t] == reader[t])
            if last:
                live[holder.pop(x)] -= 1
        elif kinds[t] == ADMIT:
            assert x not in holder and not last
            holder[x] = nodes[t]
            live[nodes[t]] += 1
            assert live[nodes[t]] <= caps[nodes[t]]
        else:
            assert kinds[t] == BYPASS and nodes[t] == -1 and x not in holder
    assert not holder
    per = cp.node_stats()
    assert all(d["peak_resident"] <= d["capacity"] for d in per)
    assert sum(d["accesses"] for d in per) == cp.accesses == len(seq)
    assert sum(d["peer_bytes_sent"] for d in per) == sum(d["peer_bytes_received"] for d in per) == cp.peer_bytes
    assert cp.peer_bytes == cp.peer_hits + cp.remote_admits  # one byte an item by default
    assert cp.storage_bytes == cp.storage_reads == cp.plan.misses
    tr = cp.transfers()
    assert tr["position"].size == cp.peer_hits + cp.remote_admits
    assert (tr["src"] != tr["dst"]).all()


def test_golden_two_nodes() -> None:
    """Rank 0 (node 0) reads A B A, rank 1 (node 1) reads B A C, one item a
    node. Timeline A B | B A | A C. A is read next by node 1: kept there; B
    by node 0: kept there. B, then A are local hits; node 0's last A is
    node 1's copy. C is never read again: bypassed."""
    cp = cluster_plan([[0, 1, 0], [1, 0, 2]], [0, 1], [1, 1], item_bytes=100)
    assert cp.seq.tolist() == [0, 1, 1, 0, 0, 2]
    assert cp.kinds.tolist() == [ADMIT, ADMIT, LOCAL_HIT, LOCAL_HIT, PEER_HIT, BYPASS]
    assert cp.nodes.tolist() == [1, 0, 0, 1, 1, -1]
    n0, n1 = cp.node_stats()
    assert (n0["local_hits"], n0["peer_hits"], n0["storage_reads"], n0["plan_storage_bytes"]) == (1, 1, 1, 100)
    assert (n1["local_hits"], n1["peer_hits"], n1["storage_reads"], n1["plan_storage_bytes"]) == (1, 0, 2, 200)
    assert (n0["peer_bytes_sent"], n0["peer_bytes_received"]) == (100, 200)
    assert (n1["peer_bytes_sent"], n1["peer_bytes_received"]) == (200, 100)
    tr = cp.transfers()
    assert list(zip(tr["position"].tolist(), tr["src"].tolist(), tr["dst"].tolist())) == [(0, 0, 1), (1, 1, 0),
                                                                                          (4, 1, 0)]


def test_golden_two_nodes_in_windows_of_one_step() -> None:
    """The timeline above, with windows of one step (A B | B A | A C are
    windows 0, 1, 2). A's next reader (node 1, window 1) cannot get it from
    node 0 before window 2, so node 0 keeps it; so does node 1 with B. Both
    window-1 reads come too early for a transfer (LATE, from storage); node
    0's read of A in window 2 is its own."""
    cp = cluster_plan([[0, 1, 0], [1, 0, 2]], [0, 1], [1, 1], item_bytes=100, window=1)
    assert cp.windows().tolist() == [0, 0, 1, 1, 2, 2]
    assert cp.kinds.tolist() == [ADMIT, ADMIT, LATE, LATE, LOCAL_HIT, BYPASS]
    assert cp.nodes.tolist() == [0, 1, 1, 0, 0, -1]
    assert (cp.late, cp.hits, cp.peer_bytes, cp.remote_admits) == (2, 1, 0, 0)
    n0, n1 = cp.node_stats()
    assert (n0["late"], n0["storage_reads"], n0["plan_storage_bytes"]) == (1, 2, 200)
    assert (n1["late"], n1["storage_reads"], n1["plan_storage_bytes"]) == (1, 3, 300)
    assert cp.transfers()["position"].size == 0
    assert cp.stats()["late"] == 2 and cp.stats()["window"] == 1


def replay_windows(cp: cluster.ClusterPlan) -> None:
    """Run the plan as the run time will (docs/cluster.md, "The run time"),
    from its kinds, nodes and transfer list alone, and check that every
    transfer is possible: at the start of window k each node sends the
    transfers of window k, which it must hold then (a generation in its
    pool, or an item it read from storage for another home); they arrive
    for window k + 1. A local hit needs the item in the reader's pool, a
    peer hit the copy sent for it, and no pool holds more than its node's
    capacity."""
    w = cp.windows().tolist()
    seq, kinds, nodes, reader = cp.seq.tolist(), cp.kinds.tolist(), cp.nodes.tolist(), cp.reader.tolist()
    nxt = reference.next_uses(seq)
    tr = cp.transfers()
    by_window: dict[int, list[tuple[int, int, int, int, int]]] = {}
    for row in zip(tr["window"].tolist(), tr["position"].tolist(), tr["src"].tolist(), tr["dst"].tolist(),
                   tr["item"].tolist(), tr["kind"].tolist()):
        by_window.setdefault(row[0], []).append(row[1:])
    assert all(k >= 0 for k in by_window)
    pool: list[set[int]] = [set() for _ in range(cp.n_nodes)]
    outbox: list[set[int]] = [set() for _ in range(cp.n_nodes)]
    copies: set[tuple[int, int]] = set()  # (position, item) sent to a peer hit
    pos_of_window: dict[int, list[int]] = {}
    for t, k in enumerate(w):
        pos_of_window.setdefault(k, []).append(t)
    last = max([*w, *by_window]) if w else -1
    sent = 0
    for k in range(last + 1):
        arriving: list[tuple[int, int]] = []
        for t, src, dst, x, kind in by_window.get(k, []):
            if kind == PEER_HIT:
                assert x in pool[src], f"window {k}: node {src} sends item {x} (for position {t}) it does not hold"
                assert w[t] == k + 1
                copies.add((t, x))
            else:
                assert kind == ADMIT and x in outbox[src], f"window {k}: node {src} forwards {x} it did not read"
                outbox[src].discard(x)
                arriving.append((dst, x))
            sent += 1
        for t in pos_of_window.get(k, []):
            x, r = seq[t], reader[t]
            if kinds[t] == LOCAL_HIT:
                assert x in pool[r], f"position {t}: node {r} reads item {x} before it arrives"
            elif kinds[t] == PEER_HIT:
                assert (t, x) in copies, f"position {t}: no copy of {x} was sent for it"
            elif kinds[t] == ADMIT:
                (pool[r] if nodes[t] == r else outbox[r]).add(x)
            else:
                assert kinds[t] in (BYPASS, LATE)
            ends = nxt[t] == len(seq) or kinds[nxt[t]] not in (LOCAL_HIT, PEER_HIT, LATE)
            if kinds[t] in (LOCAL_HIT, PEER_HIT, LATE, ADMIT) and ends:
                pool[nodes[t]].discard(x)
        for dst, x in arriving:
            pool[dst].add(x)
        assert all(len(p) <= c for p, c in zip(pool, cp.capacities.tolist()))
    assert sent == tr["position"].size
    assert not any(outbox)


@given(clusters(), st.integers(1, 4))
def test_windows_keep_every_transfer_possible(case: tuple, window: int) -> None:
    seqs, node_of, caps, batch, items = case
    cp = cluster_plan(seqs, node_of, caps, items=items, batch_size=batch, window=window)
    replay_windows(cp)
    assert cp.storage_reads == cp.plan.misses + cp.late


def check_node_plans(cp: cluster.ClusterPlan, need: list[int] | None = None) -> None:
    """Each node's plan, as its pool will run it: every HIT reads a
    generation the node admitted (from storage or a RECEIVE) and still
    holds; the generations live at once (ADMIT to last read here) never take
    more than the node's capacity (``need[x]`` places an item); its storage
    bytes are the cluster plan's for it. Across nodes: a SEND for each peer
    hit, in the window before it, read by a WORKER from a peer; a RECEIVE
    for each forward, two windows after the read that forwards it."""
    w = cp.windows()
    sizes = cp.item_size(np.arange(cp.plan.items))
    sends: list[int] = []
    receives: list[int] = []
    worker_at: dict[int, tuple[int, int, bool]] = {}  # position: (node, source, forward)
    for n in range(cp.n_nodes):
        npn = cp.node_plan(n)
        assert (np.diff(npn.window) >= 0).all()
        reads = npn.reads
        assert npn.position[reads].tolist() == np.flatnonzero(cp.reader == n).tolist()
        seq, op = npn.seq.tolist(), npn.op.tolist()
        ends: dict[int, int] = {}  # per ADMIT: its generation's last read here
        admitted_at: dict[int, int] = {}
        for i, x in enumerate(seq):
            if op[i] == opt4torch.ADMIT:
                ends[i] = admitted_at[x] = i
            elif op[i] == opt4torch.HIT and x in admitted_at:
                ends[admitted_at[x]] = i
        held: dict[int, int] = {}  # item: its generation's last read here
        used = 0
        for i, x in enumerate(seq):
            for y in [y for y, e in held.items() if e < i]:
                del held[y]
                used -= need[y] if need else 1
            if op[i] == opt4torch.HIT:
                assert x in held, f"node {n}, position {i}: a HIT of {x}, which the pool does not hold"
            elif op[i] == opt4torch.ADMIT:
                assert x not in held
                held[x] = ends[i]
                used += need[x] if need else 1
                assert used <= int(cp.capacities[n]), f"node {n} holds more than its capacity at {i}"
        worker = npn.role == cluster.WORKER
        storage = worker & (npn.source == cluster.FROM_STORAGE)
        assert int(sizes[npn.seq[storage]].sum()) == cp.node_stats()[n]["plan_storage_bytes"]
        assert (npn.op[worker & (npn.source == cluster.FROM_POOL)] == opt4torch.HIT).all()
        for i in np.flatnonzero(npn.role == cluster.SEND).tolist():
            sends.append(int(npn.position[i]))
            assert npn.window[i] == w[npn.position[i]] - 1 and npn.op[i] == opt4torch.HIT
        for i in np.flatnonzero(npn.role == cluster.RECEIVE).tolist():
            receives.append(int(npn.position[i]))
            assert npn.window[i] == w[npn.position[i]] + 2 and npn.op[i] == opt4torch.ADMIT
        for i in reads.tolist():
            worker_at[int(npn.position[i])] = (n, int(npn.source[i]), bool(npn.forward[i]))
    assert sorted(sends) == np.flatnonzero(cp.kinds == PEER_HIT).tolist()
    assert all(worker_at[t][1] == cluster.FROM_PEER for t in sends)
    assert sum(src == cluster.FROM_PEER for _, src, _ in worker_at.values()) == len(sends)
    assert sorted(receives) == sorted(t for t, (_, _, fwd) in worker_at.items() if fwd)
    assert len(receives) == cp.remote_admits


@given(clusters(), st.integers(1, 4))
def test_node_plans_run_the_cluster_plan(case: tuple, window: int) -> None:
    seqs, node_of, caps, batch, items = case
    cp = cluster_plan(seqs, node_of, caps, items=items, batch_size=batch, window=window, item_bytes=3)
    check_node_plans(cp)


@given(clusters(), st.integers(1, 16), st.integers(1, 4), st.data())
def test_node_plans_in_bytes(case: tuple, page: int, window: int, data: st.DataObject) -> None:
    seqs, node_of, caps, batch, items = case
    sizes = data.draw(st.lists(st.integers(1, 40), min_size=items, max_size=items))
    node_bytes = [c * page * 3 for c in caps]
    big = -(-max(sizes[x] for s in seqs for x in s) // page)
    if sum(b // page for b in node_bytes) < big:
        node_bytes[0] += big * page
    alone = data.draw(st.sampled_from([False, None]))  # None: alone where the cluster saves little
    cp = cluster_plan(seqs, node_of, cache_bytes=node_bytes, page_size=page, items=items, batch_size=batch,
                      item_sizes=sizes, window=window, alone=alone)
    check_node_plans(cp, need=[-(-v // page) for v in sizes])
    if cp.alone:
        assert cp.peer_bytes == 0 and cp.late == 0 and alone is None


@given(clusters(), st.integers(1, 4), st.integers(1, 40), st.data())
def test_a_nodes_transfers_without_the_whole_table(case: tuple, window: int, chunk: int, data: st.DataObject
                                                   ) -> None:
    """What a node's transfer thread keeps of the plan (NodeTransfers, on the
    planning rank, which then lets the plan go): its rows found a chunk of
    positions at a time (transfers_of), never making the cluster's table,
    are that table's rows for it, by window then position, and the windows
    with a transfer anywhere are the table's; with a warm prefix too. The
    table itself is held to its definition, position by position. What an
    Exchange keeps of them (routes: each window's rows, as group ranks,
    with the node-plan index each received item goes to) is what a plain
    loop over the rows gives."""
    from opt4torch.distributed.exchange import NodeTransfers, routes

    seqs, node_of, caps, batch, items = case
    warm = None
    if data.draw(st.booleans()):
        warm = [data.draw(st.lists(st.integers(0, items - 1), max_size=4, unique=True)) if n in node_of else []
                for n in range(len(caps))]
    cp = cluster_plan(seqs, node_of, caps, items=items, batch_size=batch, item_bytes=3, window=window, warm=warm)
    w, nodes = cp.windows(), cp.nodes
    ref = []  # (position, window, src, dst, kind): a peer hit sent the window before, an admit kept away after
    for t, k in enumerate(cp.kinds.tolist()):
        if k == PEER_HIT:
            ref.append((t, int(w[t]) - 1, int(nodes[t]), int(cp.reader[t]), k))
        elif k == ADMIT and nodes[t] != cp.reader[t]:
            ref.append((t, int(w[t]) + 1, int(cp.reader[t]), int(nodes[t]), k))
    tr = cp.transfers()
    assert list(zip(*(tr[k].tolist() for k in ("position", "window", "src", "dst", "kind")))) == ref
    assert cp.transfer_windows(chunk).tolist() == np.unique(tr["window"]).tolist()
    for n in range(cp.n_nodes):
        mine = (tr["src"] == n) | (tr["dst"] == n)
        part = cp.transfers_of(n, chunk)
        assert part.keys() == tr.keys()
        assert all(part[k].tolist() == v[mine].tolist() for k, v in tr.items())
        t = NodeTransfers.of(cp, n)
        order = np.lexsort((tr["position"][mine], tr["window"][mine]))
        for k in ("window", "position", "src", "dst", "kind", "item"):
            assert getattr(t, k).tolist() == tr[k][mine][order].tolist(), k
        assert t.windows.tolist() == np.unique(tr["window"]).tolist()
        assert (t.node, t.n_nodes, t.checksum) == (n, cp.n_nodes, cp.checksum)
        assert type(t.figures) is cluster.ClusterFigures  # the figures alone, not the plan
        p = cp.node_plan(n)
        peers = data.draw(st.permutations(range(cp.n_nodes)))
        room = t.item * 3 + 1
        where = {(int(r), int(x)): i for i, (r, x) in enumerate(zip(p.role, p.position)) if r != cluster.WORKER}
        reads = {int(p.position[i]): int(i) for i in p.reads}
        out: dict[int, list[tuple]] = {}
        got: dict[int, list[tuple]] = {}
        for k, x, s, d, kd, r in zip(*(a.tolist() for a in (t.window, t.position, t.src, t.dst, t.kind, room))):
            if s == n:
                out.setdefault(k, []).append((peers[d], x, kd, r))
            if d == n:
                got.setdefault(k, []).append((peers[s], x, reads[x] if kd == PEER_HIT else where[(cluster.RECEIVE, x)],
                                              r))
        sent, received, send_at = routes(t, p, list(peers), room)
        for k in range(-1, int(w.max(initial=0)) + 3):
            assert sent.get(k) == out.get(k, []) and received.get(k) == sorted(got.get(k, [])), k
        assert send_at == {x: i for (r, x), i in where.items() if r == cluster.SEND}
    with pytest.raises(opt4torch.InvalidInputError, match="outside"):
        cp.transfers_of(cp.n_nodes)


def test_node_plan_needs_windows() -> None:
    with pytest.raises(opt4torch.InvalidInputError, match="windows"):
        cluster_plan([[0, 1]], None, 1).node_plan(0)
    with pytest.raises(opt4torch.InvalidInputError, match="outside"):
        cluster_plan([[0, 1]], None, 1, window=1).node_plan(1)


def test_windows_replay_a_distributed_shuffle() -> None:
    """4 nodes of 25 %, 3 epochs of DistributedSampler-style shuffles, windows
    of 4 steps: the transfers all work out, few hits are late, and a window
    as long as the run makes every transfer impossible."""
    n, world, epochs = 400, 4, 3
    rng = np.random.default_rng(5)
    perms = [rng.permutation(n) for _ in range(epochs)]
    seqs = [[p[r::world] for p in perms] for r in range(world)]
    free = cluster_plan(seqs, None, n // 4, batch_size=8)
    cp = cluster_plan(seqs, None, n // 4, batch_size=8, window=4)
    replay_windows(cp)
    assert cp.plan.hits == free.plan.hits and cp.hits + cp.late == free.hits
    assert 0 < cp.late < 0.05 * cp.accesses
    whole = cluster_plan(seqs, None, n // 4, batch_size=8, window=cp.timeline.steps)
    assert whole.peer_hits == whole.remote_admits == 0 and whole.transfers()["position"].size == 0
    assert whole.local_hits + whole.late == free.hits
    assert cp.checksum != free.checksum


def test_bad_window_is_refused() -> None:
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(opt4torch.InvalidInputError, match="window"):
            cluster_plan([[0, 1]], None, 1, window=bad)
    with pytest.raises(opt4torch.InvalidInputError, match="no windows"):
        cluster_plan([[0, 1]], None, 1).windows()


def test_golden_tie_break() -> None:
    """Node 1 holds nothing; X and Y go to the node with most room (node 2,
    two places), then to the lower id of two with one place each (node 0)."""
    cp = cluster_plan([[0, 1, 0, 1]], [1], [1, 0, 2])
    assert cp.kinds.tolist() == [ADMIT, ADMIT, PEER_HIT, PEER_HIT]
    assert cp.nodes.tolist() == [2, 0, 2, 0]
    assert [d["homed"] for d in cp.node_stats()] == [1, 0, 1]


def test_one_node_is_the_plan() -> None:
    seq = opt4torch.traces.epoch_shuffle(200, 4, seed=3)
    cp = cluster_plan([seq], None, 50)
    p = opt4torch.plan(seq, 50)
    assert cp.local_hits == p.hits and cp.peer_hits == 0 and cp.peer_bytes == 0
    assert cp.storage_reads == p.misses
    assert cp.admits <= p.admits  # admits nothing reads become bypasses
    assert np.array_equal(cp.kinds == LOCAL_HIT, p.kinds == opt4torch.HIT)


@given(clusters(), st.booleans(), windows, st.data())
def test_nodes_alone_are_each_nodes_own_plan(case: tuple, sized: bool, window: int | None,
                                             data: st.DataObject) -> None:
    """``alone=True``: each node's kinds are the reference placement of its
    own reads as a cluster of one (so Belady's at its own capacity: every
    hit local, nothing sent); ``alone=None`` takes it exactly when the
    cluster's plan would not read MIN_SAVING fewer bytes; the node plans
    run it. With a warm prefix sometimes (a live loader resumed): each node
    keeps what OPT keeps of its own."""
    seqs, node_of, caps, batch, items = case
    sizes = np.arange(1, items + 1, dtype=np.int64) * 7 if sized else None
    warm = None
    if data.draw(st.booleans()):
        warm = [data.draw(st.lists(st.integers(0, items - 1), max_size=6, unique=True)) if n in node_of else []
                for n in range(len(caps))]
    kw = dict(items=items, batch_size=batch, item_bytes=5, item_sizes=sizes, window=window, warm=warm)
    with_cluster = cluster_plan(seqs, node_of, caps, **kw)
    assert not with_cluster.alone
    reading = set(with_cluster.reader.tolist())  # the nodes with a position (a read, or a warm item)
    if any(caps[n] == 0 for n in reading):
        with pytest.raises(opt4torch.InvalidInputError, match=r"node \d+ reads, but its capacity \(0\)"):
            cluster_plan(seqs, node_of, caps, alone=True, **kw)
        assert not cluster_plan(seqs, node_of, caps, alone=None, **kw).alone
        return
    cp = cluster_plan(seqs, node_of, caps, alone=True, **kw)
    assert cp.alone and cp.peer_hits == 0 and cp.peer_bytes == 0 and cp.remote_admits == 0
    assert cp.late == 0 and len(cp.transfers()["position"]) == 0
    assert np.array_equal(cp.reader, with_cluster.reader) and np.array_equal(cp.seq, with_cluster.seq)
    for n in range(len(caps)):
        mine = np.flatnonzero(cp.reader == n)
        ref = cluster_place(cp.seq[mine].tolist(), [0] * mine.size, [max(caps[n], 1)], item_sizes=sizes,
                            item_bytes=5, items=items, prefix=int((mine < cp.prefix).sum()),
                            window_of=None if window is None else cp.windows()[mine].tolist())
        assert cp.kinds[mine].tolist() == ref.kinds
        assert cp.nodes[mine].tolist() == [-1 if x == -1 else n for x in ref.nodes]
        assert {k: cp._per_node[n][k] for k in NODE_KEYS} == ref.per_node[0]
        if mine.size and not cp.prefix:
            assert cp.node_stats()[n]["local_hits"] == reference.belady(cp.seq[mine].tolist(), caps[n],
                                                                         items=items).hits
    if window is not None and cp.prefix:
        check_warm_node_plans(cp)
    elif window is not None:
        check_node_plans(cp)
    auto = cluster_plan(seqs, node_of, caps, alone=None, **kw)
    expect = with_cluster.storage_bytes > (1 - cluster.MIN_SAVING) * cp.storage_bytes
    assert auto.alone == expect
    assert auto.checksum == (cp if expect else with_cluster).checksum
    assert np.array_equal(auto.kinds, (cp if expect else with_cluster).kinds)


@given(st.lists(st.integers(0, 5), max_size=60), st.integers(1, 7))
def test_positions_by_node_across_chunks(reader: list[int], chunk: int) -> None:
    """Each node's positions, sorted a chunk at a time, are exactly where
    it reads, in order, whatever the chunk."""
    from opt4torch.planning import alone

    r = np.asarray(reader, dtype=np.uint32)
    saved, alone._CHUNK = alone._CHUNK, chunk
    try:
        got = alone.positions_by_node(r, 7)
    finally:
        alone._CHUNK = saved
    assert [g.tolist() for g in got] == [np.flatnonzero(r == n).tolist() for n in range(7)]


def test_two_nodes_of_a_quarter_plan_alone_and_four_do_not() -> None:
    """DistributedSampler shuffles, 4 epochs: two nodes that each hold a
    quarter of the dataset save under 1 % of the storage reads by one plan
    (the numbers bench/cluster.py's 2-node run gives), four save 60 %."""
    from torch.utils.data.distributed import DistributedSampler

    def orders(world: int, n: int) -> list[list[np.ndarray]]:
        out = []
        for r in range(world):
            s = DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=True, seed=0)
            out.append([np.fromiter((s.set_epoch(e), iter(s))[1], np.int64) for e in range(4)])
        return out

    two = cluster_plan(orders(2, 8000), None, 2000, batch_size=16, window=8, alone=None)
    two_cluster = cluster_plan(orders(2, 8000), None, 2000, batch_size=16, window=8)
    assert two.alone and two.peer_bytes == 0 and two_cluster.peer_bytes > 0
    assert two.storage_reads * 0.99 < two_cluster.storage_reads <= two.storage_reads
    four = cluster_plan(orders(4, 2000), None, 500, batch_size=16, window=8, alone=None)
    assert not four.alone and four.storage_reads < 0.4 * cluster_plan(
        orders(4, 2000), None, 500, batch_size=16, window=8, alone=True).storage_reads
    assert two.stats()["alone"] and not four.stats()["alone"]


def test_aggregate_holding_the_dataset_reads_each_item_once() -> None:
    """4 nodes of 25 % each, DistributedSampler-style shuffles for 3 epochs:
    the cluster reads the dataset from storage once; a node alone would not."""
    n, world, epochs = 400, 4, 3
    rng = np.random.default_rng(1)
    perms = [rng.permutation(n) for _ in range(epochs)]
    seqs = [[p[r::world] for p in perms] for r in range(world)]
    sizes = rng.integers(1000, 5000, size=n)
    cp = cluster_plan(seqs, None, n // 4, batch_size=8, item_sizes=sizes)
    assert cp.storage_reads == n
    assert cp.storage_bytes == int(sizes.sum())
    alone = sum(opt4torch.plan(np.concatenate(s), n // 4, items=n).misses for s in seqs)
    assert alone > 2 * n


def test_checksum_names_the_cluster() -> None:
    seqs = [[0, 1, 2, 3, 1], [3, 2, 1, 0, 2]]
    a = cluster_plan(seqs, [0, 1], [2, 2])
    assert a.checksum == cluster_plan(seqs, [0, 1], [2, 2]).checksum
    assert a.checksum != cluster_plan(seqs, [0, 1], [3, 1]).checksum
    assert a.checksum != cluster_plan(seqs, [1, 0], [2, 2]).checksum
    assert a.checksum != cluster_plan(seqs, [0, 1], [2, 2], batch_size=2).checksum


def test_each_nodes_part() -> None:
    """Every read belongs to one node's part; what one node sends, another
    receives; a node's homes are the ADMITs placed there."""
    rng = np.random.default_rng(8)
    seqs = [rng.integers(0, 60, size=80) for _ in range(6)]
    cp = cluster_plan(seqs, [0, 0, 1, 1, 2, 2], [10, 5, 0], batch_size=3, item_bytes=9)
    parts = [cp.for_node(n) for n in range(3)]
    assert sorted(np.concatenate([p["reads"]["position"] for p in parts]).tolist()) == list(range(cp.accesses))
    assert sum(p["sends"]["position"].size for p in parts) == sum(p["receives"]["position"].size for p in parts)
    for p in parts:
        n = p["node"]
        assert (p["reads"]["kind"] == LOCAL_HIT).sum() == p["stats"]["local_hits"]
        assert p["homes"].size == p["stats"]["homed"]
        assert int(p["sends"]["bytes"].sum()) == p["stats"]["peer_bytes_sent"]
        assert int(p["receives"]["bytes"].sum()) == p["stats"]["peer_bytes_received"]
        assert (p["reads"]["node"][p["reads"]["kind"] == LOCAL_HIT] == n).all()
    assert parts[2]["homes"].size == 0  # no memory, no homes
    with pytest.raises(opt4torch.InvalidInputError, match="outside"):
        cp.for_node(3)


def test_checksum_is_the_same_in_another_process() -> None:
    """What ranks will compare through the store: another interpreter
    planning the same cluster gets the same checksum."""
    import subprocess
    import sys

    code = ("import numpy as np, opt4torch; rng = np.random.default_rng(3); "
            "seqs = [rng.integers(0, 500, size=2000) for _ in range(4)]; "
            "print(opt4torch.cluster_plan(seqs, [0, 1, 2, 3], 60, batch_size=16).checksum)")
    out = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
           .stdout.strip() for _ in range(2)]
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, 500, size=2000) for _ in range(4)]
    here = cluster_plan(seqs, [0, 1, 2, 3], 60, batch_size=16).checksum
    assert out == [str(here), str(here)]


def test_global_timeline_order() -> None:
    tl = global_timeline([[0, 1, 2, 3, 4], [10, 11, 12]], batch_size=2)
    assert tl.seq.tolist() == [0, 1, 10, 11, 2, 3, 12, 4]
    assert tl.rank.tolist() == [0, 0, 1, 1, 0, 0, 1, 0]
    assert tl.step.tolist() == [0, 0, 0, 0, 1, 1, 1, 2]
    # Epochs: batches restart, and steps go on.
    tl = global_timeline([[[0, 1, 2], [3, 4]], [[5], [6, 7, 8]]], batch_size=2)
    assert tl.seq.tolist() == [0, 1, 5, 2, 3, 4, 6, 7, 8]
    assert tl.step.tolist() == [0, 0, 0, 1, 2, 2, 2, 2, 3]
    assert tl.steps == 4


def test_timeline_is_share_across_ranks_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same order the DataLoader's share_across_ranks builds for the
    ranks of one node (data.py's _interleave_ranks), with its all-gather
    answered here."""
    import torch.distributed as dist

    from opt4torch import data

    rng = np.random.default_rng(5)
    world, epochs, batch = 3, 2, 4
    orders = [[rng.integers(0, 50, size=int(rng.integers(5, 30))) for _ in range(epochs)] for _ in range(world)]
    lengths = [[np.array([min(batch, len(o) - i) for i in range(0, len(o), batch)]) for o in rank]
               for rank in orders]

    def gather(out: list, obj: object, group: object = None) -> None:
        for r in range(world):
            out[r] = (orders[r], lengths[r])

    monkeypatch.setattr(dist, "all_gather_object", gather)
    seq, *_ = data._interleave_ranks(orders[0], lengths[0], None, 0, world)
    assert np.array_equal(global_timeline(orders, batch_size=batch).seq, seq)


def test_capture_ranks_is_each_ranks_sampler() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler

    ds = list(range(103))
    sampler = DistributedSampler(ds, num_replicas=4, rank=2, shuffle=True, seed=7)
    sampler.set_epoch(5)
    got = opt4torch.capture_ranks(sampler, 3)
    assert sampler.rank == 2 and sampler.epoch == 5  # left as it was
    assert len(got) == 4 and all(len(r) == 3 for r in got)
    for r in range(4):
        s = DistributedSampler(ds, num_replicas=4, rank=r, shuffle=True, seed=7)
        for e in range(3):
            s.set_epoch(e)
            assert got[r][e].tolist() == list(iter(s))
    # Every rank's shard together is the dataset (with DistributedSampler's padding).
    assert set(np.concatenate([got[r][0] for r in range(4)]).tolist()) == set(ds)
    cp = cluster_plan(got, [0, 0, 1, 1], 30, batch_size=8)
    assert cp.accesses == 3 * 4 * sampler.num_samples
    with pytest.raises(ValueError, match="distributed sampler"):
        opt4torch.capture_ranks(torch.utils.data.RandomSampler(ds), 1)


@pytest.mark.parametrize("args, match", [
    (([[0, 1]], [0, 0], 1), "one integer node per rank"),
    (([[0, 1]], [-1], 1), "negative"),
    (([[0, 1]], [0], 0), "add up to 0"),
    (([[0, 1]], [0], [1, -1]), "negative"),
    (([[0, 1]], [2], [1, 1]), "names 2 nodes"),
    (([[0, 1.5]], None, 1), "integer"),
    (([], None, 1), "empty"),
    (([[], []], None, 1), "nothing to plan"),
])
def test_bad_input_is_refused(args: tuple, match: str) -> None:
    with pytest.raises(opt4torch.InvalidInputError, match=match):
        cluster_plan(*args)


def test_bad_capacities_are_refused() -> None:
    with pytest.raises(opt4torch.InvalidInputError, match="not both"):
        cluster_plan([[0, 1]], None, 1, cache_bytes=100, item_sizes=[1, 1])
    with pytest.raises(opt4torch.InvalidInputError, match="not both and not neither"):
        cluster_plan([[0, 1]], None)
    with pytest.raises(opt4torch.InvalidInputError, match="needs item_sizes"):
        cluster_plan([[0, 1]], None, cache_bytes=100)
    with pytest.raises(opt4torch.InvalidInputError, match="hold no page"):
        cluster_plan([[0, 1]], None, cache_bytes=10, page_size=64, item_sizes=[1, 1])
    with pytest.raises(opt4torch.InvalidInputError, match="one per node"):
        cluster_plan([[0, 1]], None, cache_bytes="lots", item_sizes=[1, 1])


def test_bad_alone_is_refused() -> None:
    with pytest.raises(opt4torch.InvalidInputError, match="alone must be True, False or None"):
        cluster_plan([[0, 1]], None, 1, alone="auto")


def test_bad_batch_and_sizes_are_refused() -> None:
    with pytest.raises(opt4torch.InvalidInputError, match="batch_size"):
        cluster_plan([[0, 1]], None, 1, batch_size=0)
    with pytest.raises(opt4torch.InvalidInputError, match="item_sizes"):
        cluster_plan([[0, 1]], None, 1, item_sizes=[1])
    with pytest.raises(opt4torch.InvalidInputError, match="item_bytes"):
        cluster_plan([[0, 1]], None, 1, item_bytes=-1)


def test_names() -> None:
    assert opt4torch.cluster_plan is cluster.cluster_plan
    assert opt4torch.ClusterPlan is cluster.ClusterPlan
    assert set(cluster.NODE_KEYS) >= {"local_hits", "peer_hits", "peer_bytes_sent", "peer_bytes_received",
                                      "plan_storage_bytes"}
    assert "ClusterPlan" in repr(cluster_plan([[0, 1, 0]], None, 1))
