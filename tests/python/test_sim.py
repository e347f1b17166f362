"""Sweeps: many simulations on a thread pool give exactly what one-by-one runs
give, and the engine lets other threads run while it works."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import opt4torch
from opt4torch.lab import sim


def test_sweep_equals_one_by_one() -> None:
    seq = opt4torch.traces.zipf(2_000, 40_000, alpha=0.9, seed=7)
    capacities = [1, 20, 200, 1_000, 2_500]
    rows = sim.sweep(seq, opt4torch.POLICIES, capacities, seed=3, workers=2)
    assert [(r["policy"], r["capacity"]) for r in rows] == [(p, c) for p in opt4torch.POLICIES for c in capacities]
    for r in rows:
        one = opt4torch.simulate(r["policy"], seq, r["capacity"], seed=3)
        assert (r["accesses"], r["hits"], r["misses"]) == (one["accesses"], one["hits"], one["misses"])
        assert r["hit_rate"] == pytest.approx(one["hits"] / one["accesses"])


def test_simulate_many_is_ordered_and_worker_count_does_not_matter() -> None:
    a = opt4torch.traces.uniform(500, 10_000, seed=1)
    b = opt4torch.traces.epoch_shuffle(800, 4, seed=2)
    jobs = [sim.SimJob(p, s, n, c, seed=5) for s, n in ((a, 500), (b, 800)) for p in ("opt", "lru", "random", "arc")
            for c in (10, 100, 400)]
    done: list[sim.SimJob] = []
    serial = sim.simulate_many(jobs, workers=1)
    parallel = sim.simulate_many(jobs, workers=2, on_done=done.append)
    four = sim.simulate_many(jobs, workers=4)
    assert serial == parallel == four
    assert done == jobs  # reported in order, once each
    assert [r["hits"] for r in serial] == [opt4torch.simulate(j.policy, j.seq, j.capacity, items=j.items,
                                                              seed=j.seed)["hits"] for j in jobs]


def test_simulate_many_raises_the_engine_error() -> None:
    seq = np.arange(10)
    jobs = [sim.SimJob("lru", seq, 10, 3), sim.SimJob("nope", seq, 10, 3), sim.SimJob("fifo", seq, 10, 3)]
    with pytest.raises(opt4torch.InvalidInputError, match="unknown cache policy"):
        sim.simulate_many(jobs, workers=2)
    with pytest.raises(opt4torch.InvalidInputError, match="capacity"):
        sim.simulate_many([sim.SimJob("lru", seq, 10, 0)], workers=2)
    with pytest.raises(ValueError, match="workers"):
        sim.simulate_many(jobs, workers=0)
    with pytest.raises(ValueError, match="unknown policy belady"):
        sim.sweep(seq, ["belady"], [3])


def _longest_stall(work) -> tuple[float, float]:
    """Run work() on a thread while this thread spins; return how long work
    took and the longest this thread went without running."""
    took: list[float] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        t0 = time.perf_counter()
        work()
        took.append(time.perf_counter() - t0)

    t = threading.Thread(target=run)
    last = time.perf_counter()
    longest = 0.0
    t.start()
    started.wait()
    while t.is_alive():
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
    longest = max(longest, time.perf_counter() - last)  # a stall that ran to the end
    t.join()
    return took[0], longest


def test_engine_releases_the_gil() -> None:
    """While a simulation runs on one thread, this thread keeps running
    Python. With the GIL held, it would stall for the whole simulation."""
    seq = opt4torch.traces.uniform(500_000, 6_000_000, seed=9)
    took, stall = _longest_stall(lambda: opt4torch.simulate("lru", seq, 100_000))
    assert stall < took / 2, (stall, took)


def test_stall_probe_sees_a_held_gil() -> None:
    """The probe above does catch a C call that keeps the GIL: libc's usleep
    through ctypes.PyDLL, which does not release it."""
    import ctypes

    libc = ctypes.PyDLL(None)
    took, stall = _longest_stall(lambda: libc.usleep(300_000))
    assert stall > took / 2, (stall, took)
