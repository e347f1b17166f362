"""opt4torch.lab.theory against simulation: every formula within its stated
tolerance on seeded traces, exact results exactly.

The default run stays under about 30 s; heavier checks are marked slow.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import opt4torch
from opt4torch.lab import reference, theory
from opt4torch.lab.science import (
    repeated_aug_trace,
    sharded_epoch_traces,
    static_first_hits,
    static_top_hits,
    window_hits,
    worker_streams,
    zipf_trace,
)
from opt4torch.lab.traces import epoch_shuffle, uniform


def opt_hits(seq, capacity, items, bypass=True) -> int:
    return opt4torch.plan(seq, capacity, bypass=bypass, items=items).hits


def sim_hits(policy, seq, capacity, items, seed=0) -> int:
    return opt4torch.simulate(policy, seq, capacity, items=items, seed=seed)["hits"]


# ---------------------------------------------------------------------------
# small exact oracles
# ---------------------------------------------------------------------------


def _stationary(states, transitions):
    index = {s: i for i, s in enumerate(states)}
    m = np.zeros((len(states), len(states)))
    for s in states:
        for t, pr in transitions(s):
            m[index[s], index[t]] += pr
    w, v = np.linalg.eig(m.T)
    pi = np.real(v[:, np.argmin(np.abs(w - 1.0))])
    return pi / pi.sum()


POP = np.array([0.4, 0.25, 0.15, 0.12, 0.08])


@pytest.mark.parametrize("capacity", [1, 2, 3, 4])
def test_fifo_random_product_form_against_markov_chains(capacity: int) -> None:
    """King's product form equals the stationary hit rate of the FIFO chain
    (ordered queues) and of the Random-eviction chain (sets), solved by
    brute force."""
    n = POP.size
    ordered = list(itertools.permutations(range(n), capacity))

    def fifo(s):
        return [(s, POP[i]) if i in s else (s[1:] + (i,), POP[i]) for i in range(n)]

    pi = _stationary(ordered, fifo)
    h_fifo = sum(pi[j] * POP[list(s)].sum() for j, s in enumerate(ordered))
    sets = list(itertools.combinations(range(n), capacity))

    def rand(s):
        out = []
        for i in range(n):
            if i in s:
                out.append((s, POP[i]))
            else:
                out += [(tuple(sorted(set(s) - {v} | {i})), POP[i] / capacity) for v in s]
        return out

    pr = _stationary(sets, rand)
    h_rand = sum(pr[j] * POP[list(s)].sum() for j, s in enumerate(sets))
    exact = theory.fifo_random_irm_hit_rate_exact(POP, capacity)
    assert exact == pytest.approx(h_fifo, abs=1e-10)
    assert exact == pytest.approx(h_rand, abs=1e-10)
    # the characteristic-time form is an approximation, and not exact here
    assert abs(theory.fifo_random_irm_hit_rate(POP, capacity) - exact) < 0.05


@pytest.mark.parametrize("capacity", [1, 2, 3])
def test_lru_steady_state_equals_static_first_expectation(capacity: int) -> None:
    """LRU's stationary hit rate (Markov chain on recency stacks) equals the
    expected hit rate of the static cache of the first C distinct ids
    (successive sampling without replacement, enumerated exactly)."""
    n = POP.size
    ordered = list(itertools.permutations(range(n), capacity))

    def lru(s):
        return [((i,) + tuple(x for x in s if x != i), POP[i]) if i in s else ((i,) + s[:-1], POP[i])
                for i in range(n)]

    pi = _stationary(ordered, lru)
    h_lru = sum(pi[j] * POP[list(s)].sum() for j, s in enumerate(ordered))
    h_static = 0.0
    for s in ordered:  # the first C distinct ids, in order of appearance
        prob, used = 1.0, 0.0
        for i in s:
            prob *= POP[i] / (1.0 - used)
            used += POP[i]
        h_static += prob * used
    assert h_lru == pytest.approx(h_static, abs=1e-10)


# ---------------------------------------------------------------------------
# uniform independent access
# ---------------------------------------------------------------------------


def test_expected_distinct() -> None:
    assert theory.expected_distinct(1, 5) == 1.0
    assert theory.expected_distinct(1000, 0) == 0.0
    got = np.mean([np.unique(uniform(200, 300, seed=s)).size for s in range(400)])
    assert got == pytest.approx(theory.expected_distinct(200, 300), abs=1.0)


@pytest.mark.parametrize("policy", ["lru", "fifo", "static-first", "random"])
def test_online_policies_get_c_over_n(policy: str) -> None:
    n, cap = 1000, 300
    t = 30_000 if policy == "random" else 200_000
    seq = uniform(n, t, seed=11)
    if policy == "static-first":
        h = static_first_hits(seq, cap)
    elif policy == "random":
        h = reference.simulate("random", seq.tolist(), cap, seed=3)
    else:
        h = sim_hits(policy, seq, cap, n)
    expect = theory.online_uniform_expected_hits(n, cap, t)
    assert abs(h - expect) <= 4 * math.sqrt(t * 0.3 * 0.7)
    # and the warm-up loss is real: fewer than C T / N
    assert expect < cap * t / n


@pytest.mark.parametrize(("n", "cap", "t"), [(100, 50, 60), (100, 50, 150), (100, 50, 5000), (50, 10, 400)])
def test_online_uniform_expected_hits_warmup(n: int, cap: int, t: int) -> None:
    """Exact expectation (recursion or closed form) against the mean of many
    seeded runs of LRU and FIFO, within 4 standard errors."""
    expect = theory.online_uniform_expected_hits(n, cap, t)
    runs = 2000 if t > 1000 else 6000
    for policy in ("lru", "fifo"):
        hs = np.array([sim_hits(policy, uniform(n, t, seed=s), cap, n) for s in range(runs)])
        assert abs(hs.mean() - expect) <= 4 * hs.std() / math.sqrt(runs) + 1e-9


def test_online_uniform_regimes_agree() -> None:
    """The closed form and the recursion meet where both apply."""
    n, cap = 200, 50
    # just past the threshold where the closed form takes over
    a = theory.online_uniform_expected_hits(n, cap, 2000)
    b = cap * 2000 / n - sum((cap - k) / (n - k) for k in range(cap))
    assert a == pytest.approx(b, abs=1e-6)
    # a cache that never fills: accesses minus distinct ids
    assert theory.online_uniform_expected_hits(10_000, 5000, 500) == pytest.approx(
        500 - theory.expected_distinct(10_000, 500), abs=1e-6)


def test_opt_uniform_limit_values() -> None:
    assert theory.opt_uniform_hit_rate_limit(0.5) == pytest.approx(0.8133, abs=1e-4)
    assert theory.opt_uniform_hit_rate_limit(0.1) == pytest.approx(0.4125, abs=1e-4)
    for c in (0.05, 0.3, 0.7):
        h = theory.opt_uniform_hit_rate_limit(c)
        a = -math.log(1 - h)
        assert 1 - (1 + a) * math.exp(-a) == pytest.approx(c, abs=1e-9)
        # finite-N discrete bound tends to the limit
        assert theory.opt_uniform_hit_rate(100_000, int(c * 100_000)) == pytest.approx(h, abs=1e-4)
        # the IRM formula with uniform p agrees
        assert theory.opt_irm_hit_rate(np.ones(20_000), int(c * 20_000)) == pytest.approx(h, abs=1e-6)


@pytest.mark.parametrize("c", [0.1, 0.5, 0.9])
def test_opt_uniform_steady_state(c: float) -> None:
    n = 10_000
    cap = int(c * n)
    t = 20 * n
    seq = uniform(n, t, seed=21)
    w = window_hits("opt", seq, cap, n, 5 * n, 15 * n) / (10 * n)
    bound = theory.opt_uniform_hit_rate(n, cap)
    noise = 4 * math.sqrt(0.25 / (10 * n))
    assert w <= bound + noise
    assert w >= bound - theory.opt_gap_tolerance(cap) - noise
    # OPT beats every online policy by far more than noise
    assert w > c + 0.05


@pytest.mark.parametrize(("c", "r"), [(0.1, 1), (0.5, 1), (0.5, 3), (0.5, 10), (0.9, 3)])
def test_opt_uniform_band(c: float, r: int) -> None:
    n = 5000
    cap = int(c * n)
    t = r * n
    seq = uniform(n, t, seed=100 + r)
    lo, hi = theory.opt_uniform_expected_hits(n, cap, t)
    tol = (theory.opt_gap_tolerance(cap) + 4 * math.sqrt(0.25 / t)) * t
    assert lo - tol <= opt_hits(seq, cap, n) <= hi + tol


# ---------------------------------------------------------------------------
# the length bound and the OPT variants, on arbitrary traces
# ---------------------------------------------------------------------------


@given(st.lists(st.integers(0, 12), min_size=1, max_size=120), st.integers(1, 8))
def test_length_bound_and_variants(seq: list[int], cap: int) -> None:
    """OPT <= length bound; MIN <= OPT; MIN with C slots >= OPT with C - 1."""
    items = max(seq) + 1
    o = opt_hits(seq, cap, items)
    nb = opt_hits(seq, cap, items, bypass=False)
    assert o <= theory.length_bound(seq, cap)
    assert nb <= o
    if cap >= 2:
        assert nb >= opt_hits(seq, cap - 1, items)
    assert theory.length_bound(seq, cap) <= len(seq) - len(set(seq))


def test_length_bound_is_tight_on_long_uniform_traces() -> None:
    n, cap = 2000, 1000
    seq = uniform(n, 100 * n, seed=5)
    o = opt_hits(seq, cap, n)
    b = theory.length_bound(seq, cap)
    assert o <= b
    assert (b - o) / seq.size < 0.015  # O(C) hits apart on T = 100 N
    assert b / seq.size == pytest.approx(theory.opt_uniform_hit_rate(n, cap), abs=0.015)


def test_length_bound_edge_cases() -> None:
    assert theory.length_bound([], 3) == 0
    assert theory.length_bound([1], 3) == 0
    assert theory.length_bound([1, 1, 1], 0) == 0
    assert theory.length_bound([0, 1, 0, 1], 1) == 1  # two intervals of length 2, budget 3


# ---------------------------------------------------------------------------
# independent access with skew (Zipf)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zipf_cases():
    n, t = 5000, 1_000_000
    out = {}
    for alpha in (0.8, 1.0):
        out[alpha] = (zipf_trace(n, alpha, t, seed=int(alpha * 10)), theory.zipf_popularity(n, alpha))
    return n, t, out


@pytest.mark.parametrize("alpha", [0.8, 1.0])
@pytest.mark.parametrize("cap", [100, 1000])
def test_zipf_formulas_against_simulation(zipf_cases, alpha: float, cap: int) -> None:
    n, t, cases = zipf_cases
    seq, pop = cases[alpha]
    start, stop = t // 4, 3 * t // 4
    w = stop - start
    noise = 4 * math.sqrt(0.25 / w)
    lru = window_hits("lru", seq, cap, n, start, stop) / w
    fifo = window_hits("fifo", seq, cap, n, start, stop) / w
    opt = window_hits("opt", seq, cap, n, start, stop) / w
    top = window_hits("static-top", seq, cap, n, start, stop, popularity=pop) / w
    assert abs(lru - theory.lru_che_hit_rate(pop, cap)) <= 0.002 + noise
    assert abs(fifo - theory.fifo_random_irm_hit_rate(pop, cap)) <= 0.002 + noise
    assert abs(fifo - theory.fifo_random_irm_hit_rate_exact(pop, cap)) <= 3 * noise
    assert abs(top - theory.static_top_hit_rate(pop, cap)) <= noise
    bound = theory.opt_irm_hit_rate(pop, cap)
    assert bound - theory.opt_gap_tolerance(cap) - noise <= opt <= bound + noise
    # the ordering the theory predicts: OPT > best online >= LRU >= FIFO
    assert opt > top > lru > fifo


def test_static_first_matches_lru_under_skew() -> None:
    """E[static first-C] = LRU's steady state, averaged over seeds."""
    n, cap, t = 2000, 200, 200_000
    pop = theory.zipf_popularity(n, 0.8)
    rates = [static_first_hits(zipf_trace(n, 0.8, t, seed=s), cap) / t for s in range(30)]
    # the static cache fills quickly (a few thousand accesses), so the
    # whole-trace rate is within 1 % of its steady value
    assert np.mean(rates) == pytest.approx(theory.lru_che_hit_rate(pop, cap), abs=0.01)
    assert theory.static_first_hit_rate(pop, cap) == theory.lru_che_hit_rate(pop, cap)


def test_irm_helpers_edge_cases() -> None:
    pop = theory.zipf_popularity(10, 1.0)
    assert pop.sum() == pytest.approx(1.0) and pop[0] > pop[-1]
    assert np.allclose(theory.zipf_popularity(4, 0.0), 0.25)
    for fn in (theory.lru_che_hit_rate, theory.fifo_random_irm_hit_rate, theory.fifo_random_irm_hit_rate_exact,
               theory.opt_irm_hit_rate, theory.static_top_hit_rate):
        assert fn(pop, 0) == 0.0
        assert fn(pop, 10) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        theory.zipf_popularity(0, 1.0)
    with pytest.raises(ValueError):
        theory.lru_che_hit_rate([0.0, 0.0], 1)


# ---------------------------------------------------------------------------
# epoch shuffle
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "cap", "epochs"), [(50, 1, 3), (50, 2, 4), (200, 37, 5), (200, 199, 3),
                                                  (200, 200, 3), (200, 500, 2), (1000, 500, 6)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_epoch_shuffle_opt_is_exact(n: int, cap: int, epochs: int, seed: int) -> None:
    seq = epoch_shuffle(n, epochs, seed=seed)
    exact = theory.opt_epoch_shuffle_hits(n, cap, epochs)
    assert opt_hits(seq, cap, n) == exact
    assert static_first_hits(seq, cap) == exact
    lo, hi = theory.opt_nobypass_epoch_shuffle_hits_bounds(n, cap, epochs)
    assert lo <= opt_hits(seq, cap, n, bypass=False) <= hi
    for policy in ("lru", "fifo"):  # the bound holds for every policy
        assert sim_hits(policy, seq, cap, n) <= exact


def test_epoch_shuffle_holds_for_any_order() -> None:
    """The result needs only 'each id once per epoch': a fixed order
    repeated (no shuffling at all) gives the same OPT count, and LRU none."""
    n, cap, epochs = 300, 100, 4
    seq = np.tile(np.arange(n), epochs)
    assert opt_hits(seq, cap, n) == theory.opt_epoch_shuffle_hits(n, cap, epochs)
    assert sim_hits("lru", seq, cap, n) == 0


@pytest.mark.parametrize(("n", "cap"), [(30, 10), (20, 19), (40, 3)])
def test_lru_epoch_shuffle_exact_expectation(n: int, cap: int) -> None:
    epochs, runs = 3, 5000
    hs = np.array([sim_hits("lru", epoch_shuffle(n, epochs, seed=s), cap, n) for s in range(runs)])
    expect = theory.lru_epoch_shuffle_expected_hits(n, cap, epochs)
    assert abs(hs.mean() - expect) <= 4 * hs.std() / math.sqrt(runs)


def test_epoch_shuffle_limits_against_simulation() -> None:
    n, epochs = 20_000, 4
    seq = epoch_shuffle(n, epochs, seed=9)
    later = n * (epochs - 1)
    for c in (0.2, 0.5):
        cap = int(c * n)
        lru = sim_hits("lru", seq, cap, n) / later
        fifo = sim_hits("fifo", seq, cap, n) / later
        assert lru == pytest.approx(theory.lru_epoch_shuffle_hit_rate_limit(c), abs=0.003)
        assert lru == pytest.approx(theory.lru_epoch_shuffle_expected_hits(n, cap, epochs) / later, abs=0.003)
        assert fifo == pytest.approx(theory.fifo_epoch_shuffle_hit_rate_limit(c), abs=0.004)
        # the gap to OPT (= c) that the theory predicts
        assert c - lru > 0.1
    assert math.isnan(theory.fifo_epoch_shuffle_hit_rate_limit(0.7))
    # exact sum and its limit agree at large N
    assert theory.lru_epoch_shuffle_expected_hits(100_000, 50_000, 2) / 100_000 == pytest.approx(
        theory.lru_epoch_shuffle_hit_rate_limit(0.5), abs=1e-4)


def test_random_epoch_shuffle_limit() -> None:
    n, epochs = 2000, 5
    seq = epoch_shuffle(n, epochs, seed=4)
    later = n * (epochs - 1)
    for c in (0.3, 0.6):
        cap = int(c * n)
        h = reference.simulate("random", seq.tolist(), cap, seed=8) / later
        assert h == pytest.approx(theory.random_epoch_shuffle_hit_rate_limit(c), abs=0.012)
    assert theory.random_epoch_shuffle_hit_rate_limit(0.001) == pytest.approx(1e-6, rel=0.01)


# ---------------------------------------------------------------------------
# repeated augmentation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [1, 2, 10, 250, 499, 500, 700])
def test_repeated_augmentation(cap: int) -> None:
    n, epochs, k = 500, 5, 3
    seq = repeated_aug_trace(n, epochs, k, seed=cap)
    lo, hi = theory.opt_repeated_aug_hits_bounds(n, cap, epochs, k)
    assert lo <= opt_hits(seq, cap, n) <= hi
    # LRU identity per trace: repeats hit, first copies as in the plain shuffle
    plain = seq[::k]
    assert sim_hits("lru", seq, cap, n) == (k - 1) * n * epochs + sim_hits("lru", plain, cap, n)


def test_repeated_augmentation_lru_expectation() -> None:
    n, cap, epochs, k, runs = 40, 12, 3, 2, 3000
    hs = [sim_hits("lru", repeated_aug_trace(n, epochs, k, seed=s), cap, n) for s in range(runs)]
    expect = theory.lru_repeated_aug_expected_hits(n, cap, epochs, k)
    assert abs(np.mean(hs) - expect) <= 4 * np.std(hs) / math.sqrt(runs)


# ---------------------------------------------------------------------------
# several workers or ranks
# ---------------------------------------------------------------------------


def test_worker_streams_deal_batches_in_turn() -> None:
    seq = np.arange(10)
    parts = worker_streams(seq, 3, 2)
    assert [p.tolist() for p in parts] == [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5]]


def test_private_caches_that_never_fill_make_every_policy_equal() -> None:
    """Per worker: if the distinct ids it sees fit, OPT = LRU = FIFO =
    accesses - distinct, exactly; the total matches the expectation."""
    n, workers, batch = 5000, 8, 64
    t = 2 * n
    cap = n // 2
    seq = uniform(n, t, seed=31)
    streams = worker_streams(seq, workers, batch)
    total = 0
    for s in streams:
        assert np.unique(s).size < cap
        expect = s.size - np.unique(s).size
        assert opt_hits(s, cap, n) == expect
        assert sim_hits("lru", s, cap, n) == expect == sim_hits("fifo", s, cap, n)
        total += expect
    assert abs(total - theory.private_uniform_expected_hits(n, cap, t, workers)) <= 4 * math.sqrt(t * 0.25)


def test_private_small_caches_online() -> None:
    n, workers, batch = 2000, 4, 32
    t = 40 * n
    cw = n // 8
    streams = worker_streams(uniform(n, t, seed=41), workers, batch)
    got = sum(sim_hits("lru", s, cw, n) for s in streams)
    assert abs(got - theory.private_uniform_expected_hits(n, cw, t, workers)) <= 4 * math.sqrt(t * 0.25)
    # W caches of C/W get W times fewer hits than one cache of C, in steady state
    assert got < 1.1 * (cw / n) * t


def test_private_epoch_static_and_no_eviction() -> None:
    n, epochs, ranks = 4000, 6, 4
    total = n // 2
    got, got_noevict = [], []
    for s in range(20):
        traces = sharded_epoch_traces(n, epochs, ranks, seed=s)
        got.append(sum(static_first_hits(tr, total // ranks) for tr in traces))
        got_noevict.append(sum(sim_hits("lru", tr, n, n) for tr in traces))
    assert np.mean(got) == pytest.approx(theory.private_epoch_static_hits(n, total, ranks, epochs), rel=0.02)
    assert np.mean(got_noevict) == pytest.approx(
        theory.private_epoch_no_eviction_hits(n, n, ranks, epochs), rel=0.005)
    assert math.isnan(theory.private_epoch_no_eviction_hits(n, 10, ranks, epochs))


def test_private_epoch_opt_between_fluid_value_and_upper_bound() -> None:
    n, epochs, first = 9600, 24, 8
    for ranks, c in ((4, 0.5), (8, 0.5), (8, 0.1)):
        total = int(c * n)
        share = n // ranks
        h = 0
        for tr in sharded_epoch_traces(n, epochs, ranks, seed=ranks):
            kinds = opt4torch.plan(tr, total // ranks, items=n).kinds
            h += int(np.count_nonzero(kinds[first * share:] == 0))
        per_epoch = h / (epochs - first)
        lo = theory.private_epoch_opt_hits_limit(n, total, ranks)
        hi = theory.private_epoch_opt_hits_upper(n, total, ranks)
        assert lo <= hi <= total
        gap = 3 * theory.opt_gap_tolerance(total // ranks)
        assert (1 - gap) * lo <= per_epoch <= hi * 1.005
        # private caches lose against one shared cache of the same total size
        assert per_epoch < total or c == 0.1
    assert theory.private_epoch_opt_hits_limit(n, 100, 1) == 100


def test_loader_speedup_bound() -> None:
    assert theory.loader_speedup_bound(0.5, 0.25, 0.0) == 2.0
    assert theory.loader_speedup_bound(0.5, 0.5, 1.0) == 1.0
    assert theory.loader_speedup_bound(0.5, 0.2, 1.0) == pytest.approx(1.5 / 1.2)
    assert math.isinf(theory.loader_speedup_bound(0.5, 0.0, 0.0))


# ---------------------------------------------------------------------------
# heavier checks: marked slow (bare pytest deselects them; make test runs them)
# ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("c", [0.1, 0.5, 0.9])
def test_opt_uniform_limit_large_n(c: float) -> None:
    n = 100_000
    cap = int(c * n)
    t = 30 * n
    w = window_hits("opt", uniform(n, t, seed=7), cap, n, 10 * n, 20 * n) / (10 * n)
    assert theory.opt_uniform_hit_rate_limit(c) - w <= theory.opt_gap_tolerance(cap) + 4 * math.sqrt(0.25 / (10 * n))
    assert w <= theory.opt_uniform_hit_rate(n, cap) + 4 * math.sqrt(0.25 / (10 * n))


@pytest.mark.slow
def test_science_quick_run_agrees(tmp_path) -> None:
    """The figures command end to end at quick sizes: every comparison within
    its tolerance, every figure and table written."""
    from opt4torch.lab import science

    assert science.main(["--out", str(tmp_path), "--seed", "3", "--quick"]) == 0
    for name in ("uniform", "uniform_horizon", "epoch_shuffle", "zipf", "gain_heatmap", "workers",
                 "distributed", "speedup"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
        assert (tmp_path / f"{name}.csv").exists()
    assert "0 outside tolerance" in (tmp_path / "tables.md").read_text()


@given(st.lists(st.integers(0, 40), max_size=400), st.integers(1, 45))
def test_science_static_caches_equal_the_simulator(seq: list[int], capacity: int) -> None:
    """The figures' directly computed static caches are the simulator's
    `static` (first C distinct, never evict) and `freq` (C most accessed)."""
    from opt4torch.lab import science

    if not seq:
        return
    assert science.static_first_hits(seq, capacity) == opt4torch.simulate("static", seq, capacity, items=41)["hits"]
    assert science.static_top_hits(seq, capacity) == opt4torch.simulate("freq", seq, capacity, items=41)["hits"]


# ---- the Markov trace (docs/why-opt.md, section 3.5) ----


@pytest.mark.parametrize("p", [0.0, 0.05, 0.3, 1.0])
def test_markov_transition_powers(p: float) -> None:
    """P = (1-p) S + p U gives P^t = (1-p)^t S^t + (1 - (1-p)^t) U: after the
    first jump the chain is uniform, and every access is uniform on its own."""
    n = 7
    shift = np.roll(np.eye(n), 1, axis=1)  # x -> x + 1 (mod n)
    unif = np.full((n, n), 1.0 / n)
    step = (1 - p) * shift + p * unif
    power = np.eye(n)
    for t in range(1, 12):
        power = power @ step
        want = (1 - p) ** t * np.linalg.matrix_power(shift, t) + (1 - (1 - p) ** t) * unif
        assert np.allclose(power, want)
        assert np.allclose(np.full(n, 1.0 / n) @ power, 1.0 / n)


def test_markov_scan_is_an_epoch_shuffle() -> None:
    """p = 0 is a cyclic scan from a random start: a fixed-order epoch
    shuffle, so OPT = static = C (E - 1) exactly, and LRU and FIFO get none."""
    from opt4torch.lab.traces import markov

    n, cap, epochs = 300, 70, 5
    seq = markov(n, n * epochs, jump=0.0, seed=4)
    for e in range(epochs):
        assert sorted(seq[e * n:(e + 1) * n].tolist()) == list(range(n))
    exact = theory.opt_epoch_shuffle_hits(n, cap, epochs)
    assert opt4torch.simulate("opt", seq, cap, items=n)["hits"] == exact
    assert opt4torch.simulate("static", seq, cap, items=n)["hits"] == exact
    assert opt4torch.simulate("lru", seq, cap, items=n)["hits"] == 0
    assert opt4torch.simulate("fifo", seq, cap, items=n)["hits"] == 0
