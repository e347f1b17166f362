"""opt4torch.DataLoader with real torch DataLoader worker processes.

The invariants (docs/runtime.md): with every position run, observed hits
equal the plan's hits, which equal single-process Belady on the same sequence
and capacity; every sample is byte-equal to what the dataset produces; no
wait times out; nothing is left in /dev/shm.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from datasets_for_tests import Checked, Mixed, Resized, Unaligned, expected_tensor
from torch.utils.data import RandomSampler

import opt4torch
from conftest import leaked_since
from opt4torch import _engine
from opt4torch.lab import reference

N_ITEMS, CAPACITY, BATCH, EPOCHS = 240, 80, 16, 2


def our_pools() -> set[str]:
    return {p["name"] for p in _engine.pool_list()}


@pytest.fixture(autouse=True)
def no_leaked_pools():
    before = our_pools()
    yield
    leaked = leaked_since(before)
    assert not leaked, f"pools left behind: {leaked}"


def run_epochs(loader: opt4torch.DataLoader, epochs: int) -> list[int]:
    """Iterate like a training loop; check every sample; return the indices."""
    seen: list[int] = []
    for _ in range(epochs):
        for x, y in loader:
            for row, i in zip(x, y.tolist()):
                assert torch.equal(row, expected_tensor(i)), f"sample {i} differs from the source"
            seen.extend(y.tolist())
    return seen


def assert_exact(loader: opt4torch.DataLoader) -> None:
    st = loader.cache.stats()
    plan = loader.cache.plan
    assert st["fallbacks"] == 0 and st["timeouts"] == 0 and st["store_failed"] == 0, repr(st)
    assert st["hits"] == st["plan_hits"] == plan.hits, repr(st)
    assert st["hits"] + st["misses"] == plan.accesses
    # ... and the plan is single-process Belady on the same sequence.
    want = reference.belady(plan.seq.tolist(), plan.capacity, items=plan.items)
    assert plan.hits == want.hits


CONFIGS = [(0, None, False)] + [
    (workers, ctx, persistent)
    for workers, ctx, persistent in itertools.product((1, 2, 4, 8), ("fork", "spawn", "forkserver"), (False, True))
]


@pytest.mark.parametrize(("workers", "ctx", "persistent"), CONFIGS,
                         ids=[f"{w}w-{c or 'main'}-{'persistent' if p else 'fresh'}" for w, c, p in CONFIGS])
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_exact_across_workers(workers: int, ctx: str | None, persistent: bool) -> None:
    ds = Checked(N_ITEMS)
    loader = opt4torch.DataLoader(
        ds, batch_size=BATCH, shuffle=True, seed=7, num_workers=workers, cache_items=CAPACITY,
        epochs=EPOCHS, persistent_workers=persistent, multiprocessing_context=ctx)
    try:
        seen = run_epochs(loader, EPOCHS)
        assert np.array_equal(seen, loader.cache.plan.seq)  # the captured order, replayed
        assert_exact(loader)
    finally:
        loader.cache.close()


@pytest.mark.parametrize("workers", [0, 3])
def test_replacement_sampling_defers_duplicates(workers: int) -> None:
    """With replacement an item can appear twice in one batch: the second is
    served from the first's copy (deferred), still a hit."""
    ds = Checked(60)
    sampler = RandomSampler(ds, replacement=True, num_samples=600, generator=torch.Generator().manual_seed(3))
    loader = opt4torch.DataLoader(ds, batch_size=32, sampler=sampler, num_workers=workers, cache_items=20,
                                  epochs=2, multiprocessing_context="fork" if workers else None)
    try:
        run_epochs(loader, 2)
        assert_exact(loader)
        assert loader.cache.stats()["deferred"] > 0
    finally:
        loader.cache.close()


def test_loads_only_misses() -> None:
    ds = Checked(100)
    loader = opt4torch.DataLoader(ds, batch_size=10, shuffle=True, seed=1, cache_items=40, epochs=3)
    try:
        run_epochs(loader, 3)
        st = loader.cache.stats()
        # The loader probes a few items for their size, then loads misses only.
        probes = int(ds.loads) - st["misses"]
        assert 0 < probes <= 16
        assert st["misses"] == loader.cache.plan.misses
    finally:
        loader.cache.close()


def test_transform_runs_after_the_cache() -> None:
    """Random augmentation stays random: a hit is transformed afresh."""
    torch.manual_seed(0)
    ds = Checked(20)
    noise = lambda s: (s[0] + torch.rand(1), s[1])  # noqa: E731
    loader = opt4torch.DataLoader(ds, batch_size=None, sampler=list(range(20)), cache_items=20, epochs=2,
                                  transform=noise)
    try:
        first = [x for x, _ in loader]
        second = [x for x, _ in loader]
        assert loader.cache.stats()["hits"] == 20
        for a, b, i in zip(first, second, range(20)):
            assert not torch.equal(a, b)  # different noise on the same cached item
            assert torch.allclose(a - b, (a - expected_tensor(i)) - (b - expected_tensor(i)))
    finally:
        loader.cache.close()


def test_mixed_types_round_trip() -> None:
    ds = Mixed(50)
    loader = opt4torch.DataLoader(ds, batch_size=None, shuffle=True, seed=2, cache_items=25, epochs=2,
                                  item_bytes=4096)
    try:
        for _ in range(2):
            for item in loader:
                want = ds[int(item["name"].split("-")[1])]
                assert item.keys() == want.keys()
                assert torch.equal(item["image"], want["image"])
                assert np.array_equal(item["arr"], want["arr"])
                for key in ("label", "weight", "name", "raw"):
                    assert item[key] == want[key] and type(item[key]) is type(want[key])
        assert loader.cache.stats()["pool_hits"] > 0
    finally:
        loader.cache.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_hand_out_aligned_views(workers: int) -> None:
    """Records of uneven length side by side in a batch: every tensor and
    array the batch path hands out is aligned as its dtype needs (torch's
    complex128 copy crashed on misaligned views), equal to the source, and
    the batch's records are decoded in C (no codec fallbacks)."""
    ds = Unaligned(60)
    loader = opt4torch.DataLoader(ds, batch_size=8, shuffle=True, seed=3, cache_items=30, epochs=2,
                                  num_workers=workers, collate_fn=list, item_bytes=512)
    try:
        for _ in range(2):
            for batch in loader:
                for z, name, arr, i in batch:
                    want = ds[i]
                    assert z.data_ptr() % 16 == 0 and arr.ctypes.data % 16 == 0
                    assert torch.equal(z.clone(), want[0]) and name == want[1]
                    assert np.array_equal(arr, want[2])
                torch.stack([z for z, *_ in batch])  # the collate's copy
        assert_exact(loader)
    finally:
        loader.cache.close()


def test_positions_that_change_while_read() -> None:
    """Positions are read from a snapshot: a list that an __index__ changes
    under the call (found in review: it crashed) cannot make it read freed
    memory."""
    plan = opt4torch.plan(np.array([0, 1, 2, 3, 0, 1, 2, 3]), 4, items=4)
    from opt4torch.data import OPTCache

    cache = OPTCache(plan, 4096)
    try:
        pool = _engine.pool_attach(cache.name)
        positions: list = []

        class Shifty:
            def __index__(self) -> int:
                positions.clear()
                positions.extend(object() for _ in range(1000))
                return 0

        positions[:] = [Shifty(), 1, 2, 3]
        _, entries = pool.read_batch(positions)
        assert len(entries) == 4 and len(positions) == 1000
        positions[:] = [Shifty(), 1, 2, 3]
        objects, _, _ = pool.get_batch(positions, None)
        assert len(objects) == 4 and len(positions) == 1000
        pool.close()
    finally:
        cache.close()


def test_break_mid_epoch_costs_no_timeouts() -> None:
    ds = Checked(200)
    loader = opt4torch.DataLoader(ds, batch_size=8, shuffle=True, seed=4, num_workers=2, cache_items=60,
                                  epochs=3, multiprocessing_context="fork", wait_timeout=30)
    try:
        for i, (x, y) in enumerate(loader):
            if i == 5:
                break
        run_epochs(loader, 2)  # epochs 1 and 2 in full
        st = loader.cache.stats()
        assert st["timeouts"] == 0
        # One cut epoch is taken for a one-off: epochs 1 and 2 were planned
        # whole, from what the pool held, and followed exactly (epoch 0's
        # batches that the workers loaded ahead hold no hit: its first
        # permutation repeats nothing).
        assert loader.replans == [(1, None)]
        assert st["fallbacks"] == 0 and st["hits"] == st["plan_hits"], st
        assert st["served"] == 6 * 8 + 2 * 200 == st["plan_accesses"], st
    finally:
        loader.cache.close()


def test_state_dict_resumes_exactly_and_warms() -> None:
    def make():
        return opt4torch.DataLoader(Checked(150), batch_size=10, shuffle=True, seed=9, cache_items=50, epochs=2)

    a = make()
    try:
        all_batches = [y.tolist() for _ in range(2) for _, y in a]
        plan = a.cache.plan
    finally:
        a.cache.close()
    b = make()
    try:
        it = iter(b)
        for _ in range(15):  # epoch 0 has 15 batches
            next(it)
        del it
        it = iter(b)
        for _ in range(4):
            next(it)
        state = b.state_dict()
        assert state["epoch"] == 1 and state["batches_done"] == 4
        # Every batch of epoch 0 was taken (the iterator was only dropped
        # before its StopIteration): a whole epoch, no re-plan.
        assert b.replans == []
    finally:
        b.cache.close()
    c = make()
    try:
        c.load_state_dict(state)
        rest = [y.tolist() for _, y in c]
        assert rest == all_batches[15 + 4:]
        st = c.cache.stats()
        start = (15 + 4) * 10
        hits_after = int(np.count_nonzero(plan.kinds[start:] == opt4torch.HIT))
        assert st["hits"] == hits_after and st["fallbacks"] == 0
    finally:
        c.cache.close()
    d = make()
    try:
        with pytest.raises(ValueError, match="another plan"):
            d.load_state_dict({**state, "fingerprint": 1})
    finally:
        d.cache.close()


def test_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="cache_bytes=.*or cache_items="):
        opt4torch.DataLoader(Checked(10), batch_size=2)
    with pytest.raises(ValueError, match="epochs must be a positive integer"):
        opt4torch.DataLoader(Checked(10), cache_items=2, epochs=0)
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(TypeError, match="map-style"):
        opt4torch.DataLoader(Stream(), cache_items=2)
    with pytest.raises(ValueError, match="holds no item"):
        opt4torch.DataLoader(Checked(10), cache_bytes="100B")
    with pytest.raises(opt4torch.Opt4IOError, match="--shm-size"):
        opt4torch.DataLoader(Checked(10), cache_items=5, item_bytes=1 << 39)  # 2.5 TiB of pool
    loader = opt4torch.DataLoader(Checked(10), batch_size=5, cache_items=3, epochs=1)
    try:
        list(loader)
        with pytest.raises(RuntimeError, match="planned for 1 epochs"):
            list(loader)
    finally:
        loader.cache.close()
    ds = Resized(10)
    loader = opt4torch.DataLoader(ds, batch_size=5, cache_items=3, epochs=1)
    try:
        ds.n = 12
        with pytest.raises(RuntimeError, match="length changed"):
            list(loader)
    finally:
        loader.cache.close()


def test_items_too_large_are_loaded_not_cached() -> None:
    ds = Checked(30)
    with pytest.warns(RuntimeWarning, match="does not fit"):
        loader = opt4torch.DataLoader(ds, batch_size=5, shuffle=True, seed=0, cache_items=10, epochs=2,
                                      item_bytes=100)
        try:
            run_epochs(loader, 2)
            st = loader.cache.stats()
            assert st["pool_hits"] == 0 and st["store_failed"] > 0
        finally:
            loader.cache.close()


def test_cache_bytes_sizes_the_pool() -> None:
    from opt4torch.data import parse_bytes

    assert parse_bytes("8GiB") == 8 << 30
    assert parse_bytes("1.5 MB") == 1_500_000
    assert parse_bytes(4096) == 4096
    with pytest.raises(ValueError):
        parse_bytes("lots")
    loader = opt4torch.DataLoader(Checked(500), batch_size=4, cache_bytes="100KiB", epochs=1)
    try:
        st = loader.cache.stats()
        assert st["capacity_items"] == (100 << 10) // st["page_size"]
        assert st["shm_bytes"] >= st["capacity_items"] * st["page_size"]
    finally:
        loader.cache.close()


SIGNAL_SCRIPT = textwrap.dedent("""
    import signal, sys, time, torch
    # The dispositions the tests rely on, whatever this process inherited:
    # nohup starts it with SIGHUP ignored, a background job with SIGINT
    # ignored. A test may add its own after these.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    {extra}
    sys.path.insert(0, {here!r})
    import opt4torch
    from datasets_for_tests import Checked
    loader = opt4torch.DataLoader(Checked(50), batch_size=5, cache_items=10, epochs=1)
    print(loader.cache.name, flush=True)
    time.sleep(60)
""")


def signal_script(extra: str = "") -> list[str]:
    return [sys.executable, "-c", SIGNAL_SCRIPT.format(here=os.path.dirname(__file__), extra=extra)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_pool_removed_on_signals(sig: int) -> None:
    proc = subprocess.Popen(signal_script(),
                            stdout=subprocess.PIPE, text=True)
    name = proc.stdout.readline().strip()
    assert name in our_pools()
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert name not in our_pools()


def test_an_ignored_sighup_stays_ignored() -> None:
    """Under nohup (SIGHUP ignored), the loader does not make SIGHUP fatal:
    the process lives on, and SIGTERM still removes its pool."""
    proc = subprocess.Popen(signal_script("signal.signal(signal.SIGHUP, signal.SIG_IGN)"),
                            stdout=subprocess.PIPE, text=True)
    try:
        name = proc.stdout.readline().strip()
        assert name in our_pools()
        proc.send_signal(signal.SIGHUP)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
        assert name in our_pools()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
        assert name not in our_pools()
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_stale_pool_of_a_killed_owner_is_removed_at_next_start() -> None:
    proc = subprocess.Popen(signal_script(),
                            stdout=subprocess.PIPE, text=True)
    name = proc.stdout.readline().strip()
    proc.kill()  # SIGKILL: no chance to clean up
    proc.wait(timeout=60)
    assert name in our_pools()
    stale = [p for p in _engine.pool_list() if p["name"] == name]
    assert stale and not stale[0]["owner_alive"]
    loader = opt4torch.DataLoader(Checked(10), batch_size=5, cache_items=3, epochs=1)
    try:
        assert name not in our_pools()  # removed when the new run started
        assert loader.cache.name in our_pools()  # a live job's pool is kept
    finally:
        loader.cache.close()


def test_cleanup_command_removes_only_stale_pools() -> None:
    from conftest import script

    proc = subprocess.Popen(signal_script(),
                            stdout=subprocess.PIPE, text=True)
    stale = proc.stdout.readline().strip()
    proc.kill()
    proc.wait(timeout=60)
    live = opt4torch.DataLoader(Checked(10), batch_size=5, cache_items=3, epochs=1)
    try:
        # (creating the loader already removed the stale pool; make another)
        proc = subprocess.Popen(signal_script(),
                                stdout=subprocess.PIPE, text=True)
        stale = proc.stdout.readline().strip()
        proc.kill()
        proc.wait(timeout=60)
        dry = subprocess.run([script("opt4torch"), "cleanup", "--dry-run"], capture_output=True, text=True)
        assert dry.returncode == 0 and f"{stale}" in dry.stdout and "(stale)" in dry.stdout
        assert stale in our_pools()
        r = subprocess.run([script("opt4torch"), "cleanup"], capture_output=True, text=True)
        assert r.returncode == 0 and "removed" in r.stdout
        assert stale not in our_pools()
        assert live.cache.name in our_pools()
    finally:
        live.cache.close()


def test_unseeded_sampler_is_replayed_as_captured() -> None:
    """An unseeded RandomSampler is fine for this loader: it replays what it
    captured (no warning), and the epochs differ from each other."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = opt4torch.DataLoader(Checked(50), batch_size=10, sampler=RandomSampler(range(50)),
                                      cache_items=20, epochs=2)
    try:
        seen = run_epochs(loader, 2)
        assert np.array_equal(seen, loader.cache.plan.seq)
        assert seen[:50] != seen[50:]
        assert_exact(loader)
    finally:
        loader.cache.close()
