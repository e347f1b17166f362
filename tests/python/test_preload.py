"""opt4torch.compat.preload (opt4torch.preload): the plan-aware CachedDataset and AsyncPrefetchDataset.

Every item read is compared with the source; prefetching is shown to overlap
by its counters (hits > 0 on a slow dataset), never by wall-time ratios.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ourthreads import our_threads, wait_for_no_threads_of_ours
from torch.utils.data import DataLoader, TensorDataset

import opt4torch
from opt4torch.compat import preload
from opt4torch.compat.preload import AsyncPrefetchDataset, CachedDataset, freq_ranking, item_nbytes

# ---- datasets (module level, so spawn workers can import them) ----


class Slow:
    """Item i is (i * 3, a tensor of i) after ``delay`` seconds of I/O-like
    sleep (which releases the GIL, as a file or network read does)."""

    def __init__(self, n: int = 64, delay: float = 0.005, fail_at: int | None = None) -> None:
        self.n = n
        self.delay = delay
        self.fail_at = fail_at
        self.loads = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        with self._lock:
            self.loads += 1
        time.sleep(self.delay)
        if i == self.fail_at:
            raise ValueError(f"item {i} is broken")
        return i * 3, torch.full((4,), float(i))


def expected(i: int) -> tuple[int, torch.Tensor]:
    return i * 3, torch.full((4,), float(i))


class WithHits(AsyncPrefetchDataset):
    """Returns (item, hits so far in this process, pid): lets a test see the
    counters of DataLoader worker processes."""

    def __getitem__(self, i: int) -> tuple[tuple[int, torch.Tensor], int, int]:
        item = super().__getitem__(i)
        import os

        return item, self.stats()["hits"], os.getpid()


class WithResyncs(AsyncPrefetchDataset):
    """Returns (index, resyncs so far in this process)."""

    def __getitem__(self, i: int) -> tuple[int, int]:
        return super().__getitem__(i)[0] // 3, self.stats()["resyncs"]


def same(a: tuple[int, torch.Tensor], i: int) -> bool:
    b = expected(i)
    return int(a[0]) == b[0] and torch.equal(torch.as_tensor(a[1]), b[1])


# ----------------------------------------------------------- CachedDataset


def test_lazy_exports() -> None:
    assert opt4torch.AsyncPrefetchDataset is AsyncPrefetchDataset
    assert "DevicePrefetcher" in opt4torch.__all__ and "AsyncPrefetchDataset" in opt4torch.__all__
    # One name, one thing: opt4torch.CachedDataset is the earlier design's preloading
    # dataset; the DataLoader's position-mapped one is PlannedDataset.
    assert opt4torch.CachedDataset is CachedDataset
    assert opt4torch.CachedDataset.__module__ == "opt4torch.compat.preload"
    assert opt4torch.PlannedDataset.__module__ == "opt4torch.loader.worker"
    assert opt4torch.PlannedDataset is not CachedDataset


def test_tensor_without_budget_is_zero_copy() -> None:
    data = torch.arange(60, dtype=torch.float32).reshape(10, 6)
    ds = CachedDataset(data)
    assert len(ds) == 10 and ds.preloaded == 10 and ds.preloaded_bytes == data.nbytes
    for i in range(10):
        assert ds[i].data_ptr() == data[i].data_ptr()
        assert torch.equal(ds[i], data[i])
    assert torch.equal(ds[-1], data[9])
    assert ds.stats()["hits"] == 21 and ds.stats()["misses"] == 0
    with pytest.raises(IndexError, match="out of range"):
        ds[10]


def test_views_share_the_preloaded_memory() -> None:
    data = np.arange(24, dtype=np.int32).reshape(6, 4)
    ds = CachedDataset(data)
    a, b = ds[2], ds[2]
    assert isinstance(a, torch.Tensor) and a.tolist() == [8, 9, 10, 11]
    assert a.data_ptr() == b.data_ptr()


def test_sequence_and_dataset_items() -> None:
    tds = TensorDataset(torch.arange(12.0).reshape(6, 2), torch.arange(6))
    ds = CachedDataset(tds)
    for i in range(6):
        x, y = ds[i]
        assert torch.equal(x, tds[i][0]) and int(y) == i
    assert ds[3] is ds[3]  # the stored item itself, not a copy
    words = CachedDataset(["a", "bb", "ccc"])
    assert [words[i] for i in range(3)] == ["a", "bb", "ccc"]


def test_memmap_rows_are_read_once(tmp_path) -> None:
    path = tmp_path / "rows.npy"
    src = np.arange(200, dtype=np.float64).reshape(50, 4)
    np.save(path, src)
    mm = np.load(path, mmap_mode="r")
    order = np.array([7, 7, 7, 3, 3, 49, 0], dtype=np.int64)
    ds = CachedDataset(mm, order=order, budget_bytes=2 * 4 * 8)
    assert ds.preloaded == 2 and ds.is_preloaded(7) and ds.is_preloaded(3)
    assert ds.planned_hits == 5
    for i in order.tolist():
        assert ds[i].tolist() == src[i].tolist()
    assert ds.stats()["hits"] == 5 and ds.stats()["misses"] == 2


def test_pin_memory_without_cuda_is_a_silent_no_op(monkeypatch) -> None:
    monkeypatch.setattr(preload, "_cuda_available", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = CachedDataset(torch.ones(4, 3), pin_memory=True)
    assert ds.pinned is False and ds.stats()["pinned"] is False
    assert torch.equal(ds[0], torch.ones(3))


def test_pin_memory_with_cuda_pins_what_is_preloaded(monkeypatch) -> None:
    # No GPU here: stand in for Tensor.pin_memory to see that it is called on
    # the preloaded memory (a real pin needs CUDA).
    pinned = []

    def fake_pin(t: torch.Tensor) -> torch.Tensor:
        pinned.append(tuple(t.shape))
        return t.clone()

    monkeypatch.setattr(preload, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    ds = CachedDataset(torch.arange(12.0).reshape(4, 3), pin_memory=True, order=[1, 1, 2], budget_bytes=24)
    assert ds.pinned and pinned == [(2, 3)]
    items = CachedDataset(TensorDataset(torch.zeros(3, 2)), pin_memory=True)
    assert items.pinned and pinned[1:] == [(2,), (2,), (2,)]


def test_order_can_be_a_plan() -> None:
    seq = np.array([5, 1, 5, 2, 5, 1, 9, 9], dtype=np.int64)
    plan = opt4torch.plan(seq, capacity=2)
    data = torch.arange(10.0).unsqueeze(1)
    a = CachedDataset(data, order=plan, budget_bytes=8)
    b = CachedDataset(data, order=seq, budget_bytes=8)
    assert a.preloaded == b.preloaded == 2
    assert [i for i in range(10) if a.is_preloaded(i)] == [1, 5]  # 5 (3 uses), then 1 and 9 tie: 1
    assert a.planned_hits == b.planned_hits == 5


def test_order_without_budget_preloads_everything() -> None:
    ds = CachedDataset(torch.zeros(8, 2), order=[1, 2])
    assert ds.preloaded == 8 and ds.planned_hits == 2


def test_budget_without_order_takes_the_lowest_indices() -> None:
    ds = CachedDataset([b"x" * 10, b"y" * 10, b"z" * 10], budget_bytes=25)
    assert [ds.is_preloaded(i) for i in range(3)] == [True, True, False]
    assert ds[2] == b"z" * 10 and ds.stats()["misses"] == 1


def test_bad_arguments_say_what_to_do() -> None:
    with pytest.raises(IndexError, match=r"order\[1\] = 12 is not an index.*10 items"):
        CachedDataset(torch.zeros(10), order=[0, 12], budget_bytes=8)
    with pytest.raises(ValueError, match="budget_bytes"):
        CachedDataset(torch.zeros(10), budget_bytes=-1)
    with pytest.raises(TypeError, match="must have a length"):
        CachedDataset(iter([1, 2]))
    with pytest.raises(ValueError, match="0-dimensional"):
        CachedDataset(torch.tensor(3.0))
    with pytest.raises(TypeError, match="integers"):
        CachedDataset(torch.zeros(3))["a"]


@given(
    n=st.integers(1, 40),
    order=st.lists(st.integers(0, 39), max_size=120),
    budget_rows=st.integers(0, 45),
    other=st.lists(st.integers(0, 39), max_size=45, unique=True),
)
@settings(max_examples=150)
def test_freq_placement_uniform_rows(n: int, order: list[int], budget_rows: int, other: list[int]) -> None:
    order = [i % n for i in order]
    data = torch.arange(n * 3, dtype=torch.int64).reshape(n, 3)  # 24 bytes a row
    ds = CachedDataset(data, order=order, budget_bytes=budget_rows * 24 + 23)
    counts = np.bincount(np.asarray(order, dtype=np.int64), minlength=n)
    ranked = sorted((i for i in range(n) if counts[i]), key=lambda i: (-counts[i], i))
    chosen = {i for i in range(n) if ds.is_preloaded(i)}
    assert chosen == set(ranked[:budget_rows])
    assert ds.preloaded_bytes <= budget_rows * 24 + 23
    # No other set of the same size gets more hits over the order.
    alt = {i % n for i in other}
    alt = set(list(alt)[: len(chosen)])
    assert ds.planned_hits >= int(sum(counts[i] for i in alt))
    for i in order:
        assert torch.equal(ds[i], data[i])
    s = ds.stats()
    assert s["hits"] == ds.planned_hits and s["hits"] + s["misses"] == len(order)


@given(
    sizes=st.lists(st.integers(0, 50), min_size=1, max_size=30),
    order=st.lists(st.integers(0, 29), min_size=1, max_size=80),
    budget=st.integers(0, 400),
)
@settings(max_examples=150)
def test_freq_placement_varying_sizes(sizes: list[int], order: list[int], budget: int) -> None:
    n = len(sizes)
    order = [i % n for i in order]
    items = [bytes([i % 251]) * s for i, s in enumerate(sizes)]
    ds = CachedDataset(items, order=order, budget_bytes=budget)
    ranked = freq_ranking(order, n).tolist()
    taken = [i for i in ranked if ds.is_preloaded(i)]
    # A prefix of the ranking, within the budget, stopped by the next item.
    assert taken == ranked[: len(taken)]
    assert ds.preloaded_bytes == sum(sizes[i] for i in taken) <= budget
    if len(taken) < len(ranked):
        assert ds.preloaded_bytes + sizes[ranked[len(taken)]] > budget
    assert all(ds[i] == items[i] for i in order)


def test_item_nbytes() -> None:
    assert item_nbytes(torch.zeros(3, 4)) == 48
    assert item_nbytes(np.zeros(5, dtype=np.int16)) == 10
    assert item_nbytes((b"abc", {"x": torch.zeros(2, dtype=torch.uint8)})) == 5


# Spawn workers import torch afresh (seconds each): marked slow, run by make test.
@pytest.mark.parametrize("workers,method", [(0, None), (2, "fork"),
                                            pytest.param(2, "spawn", marks=pytest.mark.slow)])
def test_cached_dataset_in_a_dataloader(workers: int, method: str | None) -> None:
    data = torch.arange(300, dtype=torch.float32).reshape(100, 3)
    order = torch.randperm(100, generator=torch.Generator().manual_seed(1))
    ds = CachedDataset(data, order=order[:40].repeat(2), budget_bytes=20 * 12)
    loader = DataLoader(ds, batch_size=8, sampler=order.tolist(), num_workers=workers,
                        multiprocessing_context=method)
    got = torch.cat(list(loader))
    assert torch.equal(got, data[order])


def test_cached_dataset_pickles() -> None:
    ds = CachedDataset([b"a", b"bb", b"ccc"], order=[2, 2, 1], budget_bytes=5)
    ds[2]
    back = pickle.loads(pickle.dumps(ds))
    assert [back[i] for i in range(3)] == [b"a", b"bb", b"ccc"]
    assert back.is_preloaded(2) and back.is_preloaded(1) and not back.is_preloaded(0)


# ---------------------------------------------------- AsyncPrefetchDataset


def test_order_mode_prefetches_exactly_the_order() -> None:
    base = Slow(64)
    order = np.random.default_rng(3).integers(0, 64, size=120)
    with AsyncPrefetchDataset(base, queue_size=8, num_workers=3, order=order) as ds:
        for i in order.tolist():
            assert same(ds[i], i)
        s = ds.stats()
    assert s["hits"] > 60, s  # most come from the threads on a slow dataset
    assert s["hits"] + s["sync_loads"] == len(order)
    assert s["resyncs"] == s["off_order"] == s["errors"] == 0
    assert s["position"] == len(order)
    assert s["discarded"] == 0
    # Nothing was loaded that the order did not ask for.
    assert base.loads == len(order)


def test_sequential_mode_prefetches_the_next_indices() -> None:
    base = Slow(40)
    ds = AsyncPrefetchDataset(base, queue_size=6, num_workers=2)
    for i in range(40):
        assert same(ds[i], i)
    s = ds.stats()
    ds.close()
    assert s["hits"] > 20 and s["position"] is None
    assert s["hits"] + s["sync_loads"] == 40


def test_sequential_mode_with_shuffled_requests_stays_correct() -> None:
    ds = AsyncPrefetchDataset(Slow(30, delay=0.001), queue_size=4, num_workers=2)
    perm = np.random.default_rng(0).permutation(30).tolist()
    try:
        assert all(same(ds[i], i) for i in perm)
        assert ds.stats()["hits"] + ds.stats()["sync_loads"] == 30
    finally:
        ds.close()


def test_divergence_is_counted_and_never_wrong() -> None:
    order = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] * 2
    with AsyncPrefetchDataset(Slow(20, delay=0.002), queue_size=3, num_workers=2, order=order) as ds:
        assert same(ds[0], 0) and same(ds[1], 1)
        assert same(ds[15], 15)  # never in the order: served, position unchanged
        s = ds.stats()
        assert s["off_order"] == 1 and s["position"] == 2
        assert same(ds[6], 6)  # later in the order: the position jumps past it
        s = ds.stats()
        assert s["resyncs"] == 1 and s["position"] == 7
        assert same(ds[7], 7) and same(ds[2], 2)  # 2 is next at position 12
        assert ds.stats()["position"] == 13


def test_at_most_queue_size_items_ahead() -> None:
    base = Slow(100, delay=0.001)
    with AsyncPrefetchDataset(base, queue_size=5, num_workers=4, order=list(range(100))) as ds:
        ds[0]
        time.sleep(0.2)  # ample time for the threads to run as far as they may
        assert base.loads == 1 + 5
        assert ds.stats()["prefetched"] == 5


def test_errors_reach_the_caller() -> None:
    base = Slow(20, delay=0.001, fail_at=5)
    with AsyncPrefetchDataset(base, queue_size=4, num_workers=2, order=list(range(20))) as ds:
        for i in range(5):
            assert same(ds[i], i)
        deadline = time.monotonic() + 5
        while 5 not in ds._rt.ready and time.monotonic() < deadline:  # a thread has failed on 5
            time.sleep(0.005)
        with pytest.raises(ValueError, match="item 5 is broken"):
            ds[5]
        assert ds.stats()["errors"] == 1
        assert all(same(ds[i], i) for i in range(6, 20))
    plain = AsyncPrefetchDataset(base, num_workers=0)
    with pytest.raises(ValueError, match="item 5 is broken"):
        plain[5]


def test_threads_start_lazily_and_stop_on_close() -> None:
    assert wait_for_no_threads_of_ours() == []  # an earlier test's, ended
    ds = AsyncPrefetchDataset(Slow(50, delay=0.001), queue_size=4, num_workers=3, order=list(range(50)))
    assert ds.threads == [] and not our_threads()
    ds[0]
    assert len(ds.threads) == 3 and set(our_threads()) == set(ds.threads)
    threads = ds.threads
    ds.close()
    assert not any(t.is_alive() for t in threads)
    assert not our_threads()
    # Used again: threads again, position and counters go on.
    assert same(ds[1], 1) and ds.stats()["position"] == 2
    ds.close()
    assert wait_for_no_threads_of_ours() == []


def test_early_break_and_garbage_collection_stop_the_threads() -> None:
    assert wait_for_no_threads_of_ours() == []  # an earlier test's, ended
    ds = AsyncPrefetchDataset(Slow(200, delay=0.002), queue_size=8, num_workers=2, order=list(range(200)))
    for i in range(200):
        ds[i]
        if i == 10:
            break
    threads = ds.threads
    assert threads
    del ds
    assert wait_for_no_threads_of_ours() == []
    assert not any(t.is_alive() for t in threads)


def test_no_threads_with_num_workers_zero() -> None:
    ds = AsyncPrefetchDataset(Slow(5, delay=0), num_workers=0, order=[1, 2])
    assert all(same(ds[i], i) for i in range(5))
    assert not our_threads()
    assert ds.stats()["sync_loads"] == 5 and ds.stats()["hits"] == 0


def test_async_bad_arguments() -> None:
    with pytest.raises(ValueError, match="queue_size"):
        AsyncPrefetchDataset(Slow(3), queue_size=0)
    with pytest.raises(ValueError, match="num_workers"):
        AsyncPrefetchDataset(Slow(3), num_workers=-1)
    with pytest.raises(IndexError, match="not an index"):
        AsyncPrefetchDataset(Slow(3), order=[0, 3])
    with pytest.raises(IndexError, match="out of range"):
        AsyncPrefetchDataset(Slow(3), num_workers=0)[3]


def test_async_pickles_without_threads() -> None:
    assert wait_for_no_threads_of_ours() == []  # an earlier test's, ended
    ds = AsyncPrefetchDataset(Slow(20, delay=0.001), queue_size=4, order=list(range(20)))
    ds[0]
    back = pickle.loads(pickle.dumps(ds))
    assert back.threads == [] and back.stats()["position"] == 0
    assert all(same(back[i], i) for i in range(20))
    assert back.stats()["hits"] > 0
    back.close()
    ds.close()
    assert wait_for_no_threads_of_ours() == []


def _child_reads(ds: AsyncPrefetchDataset, out: mp.Queue) -> None:
    ok = all(same(ds[i], i) for i in range(1, 30))
    out.put((ok, ds.stats()["hits"], len(ds.threads)))
    ds.close()


def test_fork_while_threads_run() -> None:
    ds = AsyncPrefetchDataset(Slow(30, delay=0.002), queue_size=6, num_workers=2, order=list(range(30)))
    ds[0]  # the parent's threads are loading now
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_child_reads, args=(ds, out))
    p.start()
    ok, hits, threads = out.get(timeout=20)
    p.join(20)
    ds.close()
    assert p.exitcode == 0 and ok and threads == 2 and hits > 0


@pytest.mark.parametrize("workers,method", [(0, None), (2, "fork"), (2, "spawn")])
def test_async_in_a_dataloader(workers: int, method: str | None) -> None:
    n = 48
    sampler = torch.randperm(n, generator=torch.Generator().manual_seed(7)).tolist()
    ds = WithHits(Slow(n, delay=0.003), queue_size=8, num_workers=2, order=sampler)
    if method == "fork":
        ds[sampler[0]]  # threads running in the parent at the fork
    loader = DataLoader(ds, batch_size=6, sampler=sampler, num_workers=workers,
                        multiprocessing_context=method)
    seen: list[int] = []
    hits: dict[int, int] = {}
    for (ids, tensors), h, pids in loader:
        for k in range(len(ids)):
            seen.append(int(ids[k]) // 3)
            assert torch.equal(tensors[k], torch.full((4,), float(int(ids[k]) // 3)))
        for pid, v in zip(pids.tolist(), h.tolist()):
            hits[pid] = max(hits.get(pid, 0), v)
    ds.close()
    assert seen == sampler
    assert sum(hits.values()) > 0, hits
    assert len(hits) == max(1, workers)


def test_two_epochs_follow_the_captured_order() -> None:
    n = 24
    g = torch.Generator().manual_seed(3)
    sampler = torch.utils.data.RandomSampler(range(n), generator=g)
    order = opt4torch.capture(sampler, epochs=2)
    ds = AsyncPrefetchDataset(Slow(n, delay=0.002), queue_size=6, num_workers=2, order=order)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=0)
    got = [int(i) // 3 for _ in range(2) for ids, _ in loader for i in ids]
    s = ds.stats()
    ds.close()
    assert got == order.tolist()
    assert s["resyncs"] == s["off_order"] == 0 and s["hits"] > n


def test_seek_moves_the_window() -> None:
    order = list(range(30)) * 2
    with AsyncPrefetchDataset(Slow(30, delay=0.001), queue_size=4, num_workers=2, order=order) as ds:
        assert same(ds[0], 0)
        ds.seek(40)
        assert ds.stats()["position"] == 40
        assert all(same(ds[i], i) for i in range(10, 30))
        s = ds.stats()
        assert s["resyncs"] == 0 and s["position"] == 60
        with pytest.raises(ValueError, match="position must be"):
            ds.seek(61)
    with pytest.raises(ValueError, match="needs an order"):
        AsyncPrefetchDataset(Slow(3)).seek(0)


@pytest.mark.parametrize("seek", [True, False])
def test_seek_per_epoch_for_workers_that_are_not_persistent(seek: bool) -> None:
    n, epochs = 16, 3
    sampler = torch.utils.data.RandomSampler(range(n), generator=torch.Generator().manual_seed(5))
    order = opt4torch.capture(sampler, epochs=epochs)
    ds = WithResyncs(Slow(n, delay=0.001), queue_size=4, num_workers=2, order=order)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=1, multiprocessing_context="fork")
    resyncs = []
    for e in range(epochs):
        if seek:
            ds.seek(e * n)
        got, r = zip(*[(int(i), int(k)) for ids, ks in loader for i, k in zip(ids, ks)])
        assert list(got) == order[e * n:(e + 1) * n].tolist()
        resyncs.append(max(r))
    if seek:
        assert resyncs == [0] * epochs
    else:
        assert resyncs[0] == 0 and max(resyncs[1:]) > 0  # each epoch's workers start over at 0
