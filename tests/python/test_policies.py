"""Every simulator policy: the C engine against the pure-Python reference on
many random traces, LRU/FIFO/Belady (and CLOCK, SIEVE, LFU, whose rules are
the same there) against PyPI's libcachesim, and the properties every policy
must have."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TEXTBOOK
from hypothesis import given
from hypothesis import strategies as st

import opt4torch
from opt4torch.lab import reference
from opt4torch.lab.traces import save_oracle_general

#: Policies whose rule is the same as libcachesim's (docs/policies.md), so the
#: hit counts must be equal. libcachesim's Belady never bypasses: it is our
#: opt-nobypass. Its ARC keeps p as a float and its S3FIFO differs from the
#: paper, so those two are compared in bench/sim_speed.py, not here.
LIBCACHESIM_SAME = {
    "lru": "LRU",
    "fifo": "FIFO",
    "opt-nobypass": "Belady",
    "clock": "Clock",
    "sieve": "Sieve",
    "lfu": "LFU",
}

#: Policies that admit every miss; opt-nobypass has the most hits among them.
DEMAND = [p for p in opt4torch.POLICIES if p not in ("opt", "static", "freq")]


@st.composite
def traces(draw: st.DrawFn, max_items: int = 60, max_len: int = 500) -> tuple[list[int], int, int]:
    items = draw(st.integers(1, max_items))
    # A skewed mix: a hot subset is drawn often, so hits and evictions happen.
    hot = draw(st.integers(1, items))
    ids = st.one_of(st.integers(0, items - 1), st.integers(0, hot - 1))
    seq = draw(st.lists(ids, min_size=1, max_size=max_len))
    capacity = draw(st.integers(1, items + 3))
    return seq, items, capacity


@given(traces(), st.integers(0, 2**64 - 1), st.sampled_from(["int32", "int64", "uint32", "uint64"]))
def test_every_policy_equals_reference(trace: tuple[list[int], int, int], seed: int, dtype: str) -> None:
    seq, items, capacity = trace
    arr = np.array(seq, dtype=dtype)
    for policy in opt4torch.POLICIES:
        got = opt4torch.simulate(policy, arr, capacity, items=items, seed=seed)
        want = reference.simulate(policy, seq, capacity, seed=seed)
        assert got["hits"] == want, (policy, got["hits"], want)
        assert (got["accesses"], got["hits"] + got["misses"]) == (len(seq), len(seq))


def test_longer_traces_equal_reference() -> None:
    """Longer traces of each generator, where the queues, ghosts and ARC's
    target go through many more states than in the small examples."""
    gens = [
        ("zipf", opt4torch.traces.zipf(400, 20_000, alpha=0.9, seed=1), 400),
        ("epoch_shuffle", opt4torch.traces.epoch_shuffle(300, 8, seed=2), 300),
        ("markov", opt4torch.traces.markov(500, 10_000, jump=0.05, seed=3), 500),
        ("weighted", opt4torch.traces.weighted(500, 10_000, imbalance=50, seed=4), 500),
    ]
    for name, seq, items in gens:
        lst = seq.tolist()
        for capacity in (1, 7, items // 10, items // 3, items - 1):
            for policy in opt4torch.POLICIES:
                got = opt4torch.simulate(policy, seq, capacity, items=items, seed=11)["hits"]
                assert got == reference.simulate(policy, lst, capacity, seed=11), (name, capacity, policy)


# ---- libcachesim ----


def libcachesim_hits(name: str, path: str, capacity: int, accesses: int) -> int:
    lcs = pytest.importorskip("libcachesim")
    reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
    # A small hash table: the default (2^24 buckets) costs 0.1 s per cache.
    cache = getattr(lcs, name)(capacity, hashpower=12)
    miss_ratio, _ = cache.process_trace(reader)
    return round((1 - miss_ratio) * accesses)


@given(traces(max_items=80, max_len=800))
def test_libcachesim_agrees(tmp_path_factory: pytest.TempPathFactory, trace: tuple[list[int], int, int]) -> None:
    seq, items, capacity = trace
    path = str(tmp_path_factory.mktemp("lcs") / "trace.bin")
    save_oracle_general(path, np.array(seq))
    for ours, theirs in LIBCACHESIM_SAME.items():
        got = opt4torch.simulate(ours, seq, capacity, items=items)["hits"]
        assert got == libcachesim_hits(theirs, path, capacity, len(seq)), (ours, capacity)


def test_libcachesim_agrees_on_long_traces(tmp_path) -> None:
    path = str(tmp_path / "trace.bin")
    for seq, items in (
        (opt4torch.traces.zipf(5_000, 100_000, alpha=0.8, seed=5), 5_000),
        (opt4torch.traces.epoch_shuffle(4_000, 5, seed=6), 4_000),
    ):
        save_oracle_general(path, seq)
        for capacity in (50, 500, 2_000):
            for ours, theirs in LIBCACHESIM_SAME.items():
                got = opt4torch.simulate(ours, seq, capacity, items=items)["hits"]
                assert got == libcachesim_hits(theirs, path, capacity, seq.size), (ours, capacity)


def test_oracle_general_layout(tmp_path) -> None:
    """traces.save_oracle_general, checked against the format by hand."""
    path = tmp_path / "t.bin"
    save_oracle_general(str(path), np.array([5, 7, 5]))
    raw = path.read_bytes()
    assert len(raw) == 3 * 24
    first = np.frombuffer(raw[:24], dtype=np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")]))
    assert (int(first["t"][0]), int(first["id"][0]), int(first["size"][0]), int(first["next"][0])) == (1, 6, 1, 3)
    last = np.frombuffer(raw[48:], dtype=first.dtype)
    assert int(last["next"][0]) == -1


# ---- properties ----


@given(traces(), st.integers(0, 2**32))
def test_opt_bounds_every_policy(trace: tuple[list[int], int, int], seed: int) -> None:
    seq, items, capacity = trace
    hits = {p: opt4torch.simulate(p, seq, capacity, items=items, seed=seed)["hits"] for p in opt4torch.POLICIES}
    for policy, h in hits.items():
        assert h <= hits["opt"], policy
    for policy in DEMAND:
        assert hits[policy] <= hits["opt-nobypass"], policy


@given(traces())
def test_stack_policies_never_lose_hits_with_more_room(trace: tuple[list[int], int, int]) -> None:
    """LRU and OPT are stack algorithms (Mattson et al. 1970): a larger cache
    holds a superset, so hits never fall as capacity grows."""
    seq, items, _ = trace
    for policy in ("lru", "opt-nobypass", "opt"):
        hits = [opt4torch.simulate(policy, seq, c, items=items)["hits"] for c in range(1, items + 2)]
        assert hits == sorted(hits), policy


@given(traces())
def test_large_capacity_never_evicts(trace: tuple[list[int], int, int]) -> None:
    seq, items, _ = trace
    for policy in opt4torch.POLICIES:
        for capacity in (items, items + 1, 2**40):
            assert opt4torch.simulate(policy, seq, capacity, items=items)["hits"] == len(seq) - len(set(seq))


@given(traces())
def test_static_and_freq_from_their_definitions(trace: tuple[list[int], int, int]) -> None:
    """static keeps the first C distinct ids, freq the C most frequent (lower
    id on ties); each chosen id hits on every access after its first."""
    seq, items, capacity = trace
    arr = np.array(seq)
    first_distinct = list(dict.fromkeys(seq))[:capacity]
    counts = np.bincount(arr, minlength=items)
    top = sorted(range(items), key=lambda i: (-counts[i], i))[:capacity]
    for policy, chosen in (("static", first_distinct), ("freq", top)):
        want = int(sum(max(0, counts[i] - 1) for i in chosen))
        assert opt4torch.simulate(policy, seq, capacity, items=items)["hits"] == want, policy


def test_random_is_seeded() -> None:
    seq = opt4torch.traces.zipf(200, 5_000, alpha=0.7, seed=1)
    runs = {s: opt4torch.simulate("random", seq, 30, seed=s)["hits"] for s in range(12)}
    assert all(opt4torch.simulate("random", seq, 30, seed=s)["hits"] == h for s, h in runs.items())
    assert len(set(runs.values())) > 1  # the seed matters
    assert all(reference.simulate("random", seq.tolist(), 30, seed=s) == h for s, h in runs.items())


def test_textbook_every_policy() -> None:
    """Silberschatz's string, 3 frames; the C test (test_policies.c) holds
    the same counts."""
    want = {"opt": 12, "opt-nobypass": 11, "lru": 8, "fifo": 5, "lfu": 9, "clock": 9, "sieve": 9,
            "s3fifo": 6, "arc": 7, "static": 9, "freq": 11}
    got = {p: opt4torch.simulate(p, TEXTBOOK, 3)["hits"] for p in want}
    assert got == want
    assert {p: reference.simulate(p, TEXTBOOK, 3) for p in want} == want


def test_policy_list_and_errors() -> None:
    assert opt4torch.POLICIES == ("opt", "opt-nobypass", "lru", "fifo", "lfu", "random", "clock", "sieve",
                                  "s3fifo", "arc", "static", "freq")
    assert set(reference.POLICIES) == set(opt4torch.POLICIES)
    with pytest.raises(opt4torch.InvalidInputError, match="unknown cache policy"):
        opt4torch.simulate("belady", [0, 1], 1)
    with pytest.raises(opt4torch.InvalidInputError, match="at least one item"):
        opt4torch.simulate("sieve", [0, 1], 0)
    with pytest.raises(opt4torch.InvalidInputError, match="position 2"):
        opt4torch.simulate("freq", [0, 1, 5], 1, items=3)


def test_memory_is_returned() -> None:
    from opt4torch import _engine

    seq = opt4torch.traces.uniform(1_000, 20_000, seed=3)
    before = _engine.mem_stats()["current_bytes"]
    for policy in opt4torch.POLICIES:
        opt4torch.simulate(policy, seq, 100)
    assert _engine.mem_stats()["current_bytes"] == before


def test_static_reaches_opt_on_epoch_shuffles() -> None:
    """Each id comes once per epoch, so a hit needs its id resident across
    an epoch boundary: no policy gets more than capacity hits per epoch, and
    static (like freq, and OPT with bypass) gets exactly that after the first.
    OPT without bypass must cache every miss, so it may keep one slot fewer
    across a boundary: between (C - 1)(E - 1) and C(E - 1) (docs/why-opt.md);
    with C = 1 it holds only the last item and gets ~0."""
    items, epochs = 1_000, 6
    seq = opt4torch.traces.epoch_shuffle(items, epochs, seed=3)
    for capacity in (1, 10, 250, 999):
        hits = {p: opt4torch.simulate(p, seq, capacity)["hits"] for p in opt4torch.POLICIES}
        assert hits["static"] == hits["opt"] == hits["freq"] == capacity * (epochs - 1)
        assert (capacity - 1) * (epochs - 1) <= hits["opt-nobypass"] <= capacity * (epochs - 1)
        assert max(hits.values()) == capacity * (epochs - 1)
    assert opt4torch.simulate("opt-nobypass", seq, 1)["hits"] < epochs - 1
