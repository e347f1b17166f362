"""Differential and property tests: the C engine against the pure-Python
reference backend, decision by decision, and Belady's bound."""

from __future__ import annotations

import numpy as np
from conftest import TEXTBOOK
from hypothesis import given
from hypothesis import strategies as st

import opt4torch
from opt4torch.lab import reference


@st.composite
def traces(draw: st.DrawFn) -> tuple[list[int], int, int]:
    items = draw(st.integers(1, 40))
    # A skewed mix: a hot subset is drawn often, so hits and evictions happen.
    hot = draw(st.integers(1, items))
    ids = st.one_of(st.integers(0, items - 1), st.integers(0, hot - 1))
    seq = draw(st.lists(ids, max_size=400))
    capacity = draw(st.integers(1, items + 3))
    return seq, items, capacity


@given(traces(), st.booleans())
def test_engine_equals_reference(trace: tuple[list[int], int, int], bypass: bool) -> None:
    seq, items, capacity = trace
    want = reference.belady(seq, capacity, bypass=bypass, items=items)
    got = opt4torch.plan(seq, capacity, bypass=bypass, items=items)
    assert np.array_equal(got.ops, want.encoded())
    assert (got.hits, got.admits, got.bypasses, got.compulsory_misses) == (
        want.hits, want.admits, want.bypasses, want.compulsory,
    )


@given(traces(), st.integers(0, 2**32))
def test_belady_bound(trace: tuple[list[int], int, int], seed: int) -> None:
    """OPT never misses more than any online policy, and bypass never hurts."""
    seq, items, capacity = trace
    opt = opt4torch.plan(seq, capacity, items=items).misses if seq else 0
    opt_nb = opt4torch.plan(seq, capacity, bypass=False, items=items).misses if seq else 0
    assert opt <= opt_nb
    for policy in reference.POLICIES:
        misses = len(seq) - reference.simulate(policy, seq, capacity, seed=seed)
        assert opt <= misses, policy
        if policy not in ("opt", "static", "freq"):  # these may bypass
            assert opt_nb <= misses, policy


@given(traces())
def test_c_simulator_equals_reference(trace: tuple[list[int], int, int]) -> None:
    seq, items, capacity = trace
    if not seq:
        return
    for policy in opt4torch.POLICIES:
        got = opt4torch.simulate(policy, seq, capacity, items=items)
        assert got["hits"] == reference.simulate(policy, seq, capacity), policy
        assert got["hits"] + got["misses"] == len(seq)


def test_reference_textbook() -> None:
    assert 20 - reference.simulate("opt-nobypass", TEXTBOOK, 3) == 9
    assert 20 - reference.simulate("lru", TEXTBOOK, 3) == 12
    assert 20 - reference.simulate("fifo", TEXTBOOK, 3) == 15


def test_large_random_traces(rng: np.random.Generator) -> None:
    """A few longer traces: epoch shuffles and uniform draws."""
    for seq, items in (
        (opt4torch.traces.epoch_shuffle(300, 6, seed=1), 300),
        (opt4torch.traces.uniform(500, 6000, seed=2), 500),
    ):
        for capacity in (1, 37, items // 2, items):
            for bypass in (True, False):
                want = reference.belady(seq.tolist(), capacity, bypass=bypass, items=items)
                got = opt4torch.plan(seq, capacity, bypass=bypass, items=items)
                assert np.array_equal(got.ops, want.encoded())
