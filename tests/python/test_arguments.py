"""The DataLoader's arguments, samplers and iterators, and the CLI's limits:
one test per row of docs/reliability.md that names them. Each odd input gets
an error that names the argument, at once; nothing waits out a wait_timeout."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import warnings

import pytest
from datasets_for_tests import Checked

import opt4torch
from conftest import script

#: Iterator cases run with this wait_timeout and must end well under it.
WAIT = 10.0
FAST = WAIT / 2

pytestmark = pytest.mark.usefixtures("no_leaked_pools")


def forked_loader(epochs: int = 2, **kw) -> opt4torch.DataLoader:
    return opt4torch.DataLoader(Checked(40), batch_size=4, shuffle=True, seed=3, cache_items=10, epochs=epochs,
                                num_workers=2, multiprocessing_context="fork", wait_timeout=WAIT, **kw)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0, "cache_items": 3}, r"batch_size must be a positive integer .*got 0"),
        ({"cache_bytes": float("inf")}, r"cache_bytes: not a finite size in bytes: inf"),
        ({"cache_bytes": float("nan")}, r"cache_bytes: not a finite size in bytes: nan"),
        ({"cache_bytes": "0x1000"}, r"cache_bytes: not a size in bytes: '0x1000' \(try 8GiB"),
        ({"cache_items": 2.7}, r"cache_items must be an integer number of items, got 2.7 \(float\)"),
        ({"cache_items": True}, r"cache_items must be an integer number of items, got True \(bool\)"),
        ({"cache_items": 3, "wait_timeout": -1}, r"wait_timeout must be a number of seconds from 0.001 to "
                                                 r"1e9, got -1"),
        ({"cache_items": 3, "wait_timeout": float("inf")}, r"wait_timeout must be a number of seconds .*got inf"),
        ({"cache_items": 3, "prefetch": True, "prefetch_threads": 2.5},
         r"prefetch_threads must be between 1 and \d+, got 2.5"),
        ({"cache_items": 3, "prefetch": True, "prefetch_threads": "4"},
         r"prefetch_threads must be between 1 and \d+, got '4'"),
        ({"cache_items": 3, "prefetch": True, "prefetch_max_threads": 8.0},
         r"prefetch_max_threads must be between prefetch_threads \(\d+\) and \d+, got 8.0"),
        ({"cache_items": 3, "shuffle": True, "seed": "abc"}, r"seed must be an integer \(or None to draw one\), "
                                                             r"got 'abc' \(str\)"),
        ({"cache_items": 3, "shuffle": True, "seed": 1.5}, r"seed must be an integer .*got 1.5 \(float\)"),
        ({"cache_items": 3, "lookahead": 10**30, "prefetch": True},
         r"lookahead must be a positive integer number of positions up to 2\*\*63 - 1, got 10{30}"),
    ],
)
def test_odd_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        opt4torch.DataLoader(Checked(10), **kwargs)


def test_largest_lookahead_is_taken_and_prefetches() -> None:
    """The bound is the engine's: the largest lookahead accepted runs with
    its prefetcher alive (no thread dies of OverflowError)."""
    loader = opt4torch.DataLoader(Checked(20), batch_size=5, cache_items=5, epochs=2, prefetch=True,
                                  prefetch_threads=2, lookahead=(1 << 63) - 1)
    try:
        for _ in range(2):
            assert sum(len(b[1]) for b in loader) == 20
        pf = loader.cache.stats()["prefetcher"]
        assert pf["loaded"] > 0 and pf["errors"] == 0, pf
    finally:
        loader.cache.close()


@pytest.mark.parametrize("argument", ["sampler", "batch_sampler"])
def test_one_shot_sampler_is_refused(argument: str) -> None:
    one_shot = (i for i in range(10)) if argument == "sampler" else iter([[0, 1], [2, 3]])
    kw = {argument: one_shot, "batch_size": 2} if argument == "sampler" else {argument: one_shot}
    with pytest.raises(TypeError, match=f"{argument}=.* is a one-shot iterator: it cannot be replayed for each "
                                        "epoch. Pass .* a list of indices"):
        opt4torch.DataLoader(Checked(10), cache_items=3, epochs=2, **kw)


@pytest.mark.parametrize("argument", ["sampler", "batch_sampler"])
def test_float_indices_are_refused_not_truncated(argument: str) -> None:
    kw = {"sampler": [0, 2.7, 1]} if argument == "sampler" else {"batch_sampler": [[0, 1], [2.7, 3]]}
    with pytest.raises(ValueError, match=r"the sampler yielded 2.7 \(float\), not an integer index"):
        opt4torch.DataLoader(Checked(10), cache_items=3, **kw)


def test_two_live_iterators_are_refused_at_once() -> None:
    loader = forked_loader(epochs=3)
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="already has a live iterator .*plan fixes one order of positions"):
            list(zip(iter(loader), iter(loader)))
        # The first, dropped by the failed zip, no longer counts; one that is
        # exhausted does not either.
        first = iter(loader)
        assert sum(len(b[1]) for b in first) == 40
        assert sum(len(b[1]) for b in loader) == 40
        elapsed = time.monotonic() - t0
        assert elapsed < FAST, f"took {elapsed:.1f} s with wait_timeout={WAIT}"
        assert loader.cache.stats()["timeouts"] == 0
    finally:
        loader.cache.close()


def test_dropped_iterator_does_not_block_a_new_one() -> None:
    loader = forked_loader(epochs=2)
    try:
        t0 = time.monotonic()
        it = iter(loader)
        next(it)
        del it
        batches = list(loader)
        assert sum(len(b[1]) for b in batches) == 40
        assert time.monotonic() - t0 < FAST
    finally:
        loader.cache.close()


def test_two_threads_on_one_loader_one_is_refused_fast() -> None:
    """Thread a is mid-epoch (it holds after its first batch until b is done)
    when thread b runs list(dl): b is refused at once, a finishes its epoch."""
    loader = forked_loader(epochs=2)
    results: dict[str, object] = {}
    a_started, b_done = threading.Event(), threading.Event()

    def a() -> None:
        n = 0
        for i, batch in enumerate(loader):
            n += len(batch[1])
            if i == 0:
                a_started.set()
                b_done.wait(FAST)
        results["a"] = n

    def b() -> None:
        a_started.wait(FAST)
        try:
            results["b"] = sum(len(batch[1]) for batch in loader)
        except RuntimeError as exc:
            results["b"] = exc
        finally:
            b_done.set()

    try:
        t0 = time.monotonic()
        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(2 * FAST)
        elapsed = time.monotonic() - t0
        assert not any(th.is_alive() for th in threads), f"still running after {elapsed:.1f} s"
        assert elapsed < FAST, f"took {elapsed:.1f} s with wait_timeout={WAIT}"
        assert results["a"] == 40, results
        assert isinstance(results["b"], RuntimeError) and "already has a live iterator" in str(results["b"]), results
        assert loader.cache.stats()["timeouts"] == 0
    finally:
        loader.cache.close()


def test_next_epoch_after_cache_close_says_closed_by_user() -> None:
    loader = forked_loader(epochs=2)
    it = iter(loader)
    next(it)
    loader.cache.close()
    del it
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"was closed by cache.close\(\): .*Build a new opt4torch.DataLoader"):
        list(loader)
    assert time.monotonic() - t0 < FAST


def test_large_plan_says_its_cost_first() -> None:
    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # stop at the warning, before building
        with pytest.raises(RuntimeWarning, match=r"a plan of 20,000,000 accesses \(200,000 epochs of 100\) takes "
                                                 r"about 1.0 GiB of memory to capture and build on top of the "
                                                 r"[0-9.]+ GiB this process holds \([0-9.]+ GiB at the peak\), "
                                                 r"and keeps 0.7 GiB while training"):
            opt4torch.DataLoader(Checked(100), cache_items=10, epochs=200_000)
    page = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    epochs = page // 56 // 100 * 2  # twice the machine's memory (PLAN_PEAK_BYTES_PER_ACCESS)
    with pytest.raises(ValueError, match=r"GiB of memory to capture and build( on top of .* at the peak\))?, "
                                         r"more than this machine's .* "
                                         "give fewer epochs="):
        opt4torch.DataLoader(Checked(100), cache_items=10, epochs=epochs)
    assert time.monotonic() - t0 < 5, "the estimate must come before the capture"


def simulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([script("opt4torch"), "simulate", *args], capture_output=True, text=True, timeout=120)


def test_simulate_refuses_capacity_over_100_percent() -> None:
    for capacity in ("250%", "10%,100.5%"):
        r = simulate("--pattern", "uniform", "--items", "100", "--capacity", capacity)
        assert r.returncode == 2, r.stderr
        assert "a percentage of the items must be above 0 % and at most 100 %" in r.stderr
        assert r.stdout == ""
    r = simulate("--pattern", "uniform", "--items", "100", "--epochs", "1", "--capacity", "100%")
    assert r.returncode == 0, r.stderr


def test_simulate_checks_out_before_the_sweep() -> None:
    t0 = time.monotonic()
    # A sweep that takes minutes: the check must come first.
    r = simulate("--pattern", "all", "--items", "1000000", "--epochs", "20", "--out", "/dev/full")
    assert r.returncode == 2, r.stderr
    assert "--out '/dev/full' exists and is not a directory" in r.stderr
    assert r.stdout == "" and time.monotonic() - t0 < 30


def test_simulate_checks_out_is_writable_first(tmp_path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):
        pytest.skip("running as root: permissions do not stop writes")
    r = simulate("--pattern", "uniform", "--items", "100", "--out", str(locked / "sub" / "out"))
    assert r.returncode == 2 and "cannot write in" in r.stderr and r.stdout == "", r.stderr


def test_two_threads_list_one_loader_as_in_the_issue() -> None:
    """The issue's own form: threading.Thread(target=lambda: list(dl)), twice,
    started together. Whichever starts second either finds the first done
    (and gets the next epoch) or is refused at once; never a stall."""
    loader = forked_loader(epochs=2)
    results: list[object] = []

    def run() -> None:
        try:
            results.append(sum(len(b[1]) for b in list(loader)))
        except RuntimeError as exc:
            results.append(exc)

    try:
        t0 = time.monotonic()
        threads = [threading.Thread(target=run) for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(2 * FAST)
        elapsed = time.monotonic() - t0
        assert not any(th.is_alive() for th in threads), f"still running after {elapsed:.1f} s"
        assert elapsed < FAST, f"took {elapsed:.1f} s with wait_timeout={WAIT}"
        assert 40 in results and len(results) == 2, results
        other = results[1 - results.index(40)]
        assert other == 40 or (isinstance(other, RuntimeError) and "already has a live iterator" in str(other)), results
        assert loader.cache.stats()["timeouts"] == 0
    finally:
        loader.cache.close()


def test_precompute_refuses_capacity_over_100_percent_and_a_folder_as_trace(tmp_path) -> None:
    """Issue 38's weak spots: `--capacity 150%` was accepted (6 items of 4),
    and `--trace /tmp` printed IsADirectoryError's traceback."""
    trace = tmp_path / "t.txt"
    trace.write_text("1\n2\n3\n1\n")
    out = str(tmp_path / "p.opt4")
    for args, want in ((["--trace", str(trace), "--items", "4", "--capacity", "150%"],
                        "capacity '150%': a percentage of the items must be above 0 % and at most 100 %"),
                       (["--trace", str(tmp_path), "--capacity", "2"],
                        f"--trace '{tmp_path}' is a folder; give a trace file")):
        r = subprocess.run([script("opt4torch"), "precompute", *args, "--output", out], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and want in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([script("opt4torch"), "precompute", "--trace", str(trace), "--items", "4", "--capacity",
                        "100%", "--output", out], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
