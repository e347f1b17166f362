"""Capacities in bytes: size-aware Belady over a paged pool."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets_for_tests import Blobs, blob
from hypothesis import given
from hypothesis import strategies as st

import opt4torch
from opt4torch import _engine
from opt4torch.lab import reference


@st.composite
def sized_cases(draw: st.DrawFn) -> tuple:
    items = draw(st.integers(1, 25))
    page = draw(st.integers(1, 40))
    sizes = draw(st.lists(st.integers(0, 5 * page), min_size=items, max_size=items))
    biggest = max(1, -(-max(sizes) // page)) * page
    capacity_bytes = draw(st.integers(biggest, biggest + 30 * page))
    hot = draw(st.integers(1, items))
    seq = draw(st.lists(st.one_of(st.integers(0, items - 1), st.integers(0, hot - 1)), max_size=300))
    return seq, items, sizes, capacity_bytes, page


@given(sized_cases(), st.booleans())
def test_engine_equals_reference(case: tuple, bypass: bool) -> None:
    seq, items, sizes, capacity_bytes, page = case
    got = opt4torch.plan(seq, items=items, capacity_bytes=capacity_bytes, item_sizes=sizes, page_size=page,
                         bypass=bypass)
    want = reference.belady_sized(seq, sizes, capacity_bytes, page, bypass=bypass)
    assert np.array_equal(got.ops, want.encoded())
    assert got.generations == want.admits
    for g in range(got.generations):
        assert got.gen_pages(g).tolist() == want.pages[g]  # type: ignore[attr-defined]
    assert (got.hits, got.bypasses) == (want.hits, want.bypasses)


@given(st.lists(st.integers(0, 29), max_size=400), st.integers(1, 32), st.booleans())
def test_equal_sizes_is_belady(seq: list[int], capacity: int, bypass: bool) -> None:
    items = opt4torch.plan(seq, capacity, bypass, items=30)
    sized = opt4torch.plan(seq, items=30, capacity_bytes=capacity * 64, item_sizes=[50] * 30, page_size=64,
                           bypass=bypass)
    assert sized.hits == items.hits and np.array_equal(sized.kinds, items.kinds)


def test_sized_plan_file_roundtrip(tmp_path) -> None:
    rng = np.random.default_rng(3)
    seq = rng.integers(0, 100, 5000)
    sizes = rng.integers(1, 5000, 100)
    p = opt4torch.plan(seq, items=100, capacity_bytes=60_000, item_sizes=sizes, page_size=1024)
    assert p.sized and p.page_size == 1024 and p.capacity == 58
    p.save(tmp_path / "s.opt4")
    q = opt4torch.load_plan(tmp_path / "s.opt4")
    assert q.sized and q.stats() == p.stats()
    assert np.array_equal(q.item_sizes, sizes)
    assert all(np.array_equal(q.gen_pages(g), p.gen_pages(g)) for g in range(p.generations))
    assert "page_size" in q.stats() and q.stats()["capacity_bytes"] == 60_000


def test_sized_errors() -> None:
    with pytest.raises(opt4torch.InvalidInputError, match="larger than the whole pool"):
        opt4torch.plan([0, 1], items=2, capacity_bytes=100, item_sizes=[10, 500], page_size=10)
    with pytest.raises(opt4torch.InvalidInputError, match="in items or in bytes"):
        opt4torch.plan([0, 1], 2, items=2, capacity_bytes=100, item_sizes=[10, 5], page_size=10)
    with pytest.raises(opt4torch.InvalidInputError, match="entries"):
        opt4torch.plan([0, 1], items=2, capacity_bytes=100, item_sizes=[10], page_size=10)


@pytest.mark.parametrize(("workers", "ctx"), [(0, None), (2, "fork"), (2, "spawn")])
def test_dataloader_in_bytes(workers: int, ctx: str | None) -> None:
    ds = Blobs(300)
    total = sum(ds.sizes)
    loader = opt4torch.DataLoader(ds, batch_size=None, shuffle=True, seed=5, num_workers=workers,
                                  multiprocessing_context=ctx, cache_bytes=total // 3, epochs=3)
    try:
        assert loader.cache.plan.sized
        for _ in range(3):
            for data, i in loader:
                assert data == blob(i)
        st_ = loader.cache.stats()
        assert st_["fallbacks"] == 0 and st_["timeouts"] == 0 and st_["store_failed"] == 0
        assert st_["hits"] == loader.cache.plan.hits > 0
        assert st_["shm_bytes"] < total // 3 + 4 * 2**20  # the pool is the bytes asked, not items x max
    finally:
        loader.cache.close()


def test_dataloader_sizes_too_small_are_loaded_not_cached() -> None:
    ds = Blobs(60)
    with pytest.warns(RuntimeWarning, match="does not fit"):
        loader = opt4torch.DataLoader(ds, batch_size=4, shuffle=True, seed=1, cache_bytes="200KB", epochs=2,
                                      item_bytes=[100] * 60)
        try:
            for _ in range(2):
                for data, i in loader:
                    for d, k in zip(data, i.tolist()):
                        assert d == blob(k)
            assert loader.cache.stats()["store_failed"] > 0
        finally:
            loader.cache.close()
    assert all(not p["name"].startswith(loader.cache.name) for p in _engine.pool_list())


@given(sized_cases(), st.booleans())
def test_live_residents_are_intact_in_their_pages(case: tuple, bypass: bool) -> None:
    """Just before each position, every live resident's generation still holds
    all its pages (slots_at is the pool's physical contents), no two share a
    page, and together they fit the pool. Ids the trace never uses take no
    pages (the fuzzer found slots_at refusing such plans)."""
    seq, items, sizes, capacity_bytes, page = case
    p = opt4torch.plan(seq, items=items, capacity_bytes=capacity_bytes, item_sizes=sizes, page_size=page,
                       bypass=bypass)
    kinds, ops = p.kinds, p.ops
    gen_of: dict[int, int] = {}
    for t, x in enumerate(seq):
        live = p.resident_at(t)
        assert (x in live) == (kinds[t] == opt4torch.HIT)
        held = p.slots_at(t)
        taken: set[int] = set()
        for y in live.tolist():
            pages = p.gen_pages(gen_of[y]).tolist()
            assert all(held[q] == y for q in pages), (t, y)
            assert taken.isdisjoint(pages)
            taken.update(pages)
        assert len(taken) <= p.capacity
        if kinds[t] == opt4torch.ADMIT:
            gen_of[x] = int(ops[t] & 0x3FFFFFFF)
    assert p.slots_at(len(seq)).size == (max((max(p.gen_pages(g)) for g in range(p.generations)), default=-1) + 1)


@given(st.lists(st.integers(0, 19), max_size=300), st.integers(1, 12), st.booleans())
def test_item_plan_live_residents_are_in_their_slots(seq: list[int], capacity: int, bypass: bool) -> None:
    p = opt4torch.plan(seq, capacity, bypass, items=20)
    kinds = p.kinds.tolist()
    for t in range(len(seq) + 1):
        held = p.slots_at(t).tolist()
        next_is_hit: dict[int, bool] = {}
        for u in range(len(seq) - 1, t - 1, -1):
            next_is_hit[seq[u]] = kinds[u] == opt4torch.HIT
        want = sorted(y for y, hit in next_is_hit.items() if hit)
        assert p.resident_at(t).tolist() == want
        assert set(want) <= set(held) and len(held) <= capacity  # each is in its slot
        if t < len(seq) and kinds[t] == opt4torch.HIT:
            assert held[int(p.slots[t])] == seq[t]


def test_unused_items_take_no_pages() -> None:
    p = opt4torch.plan([0, 1, 0, 1, 0, 1], items=10, capacity_bytes=100 * 4096, item_sizes=[4096] * 10,
                       page_size=4096)
    assert p.hits == 4
    assert p.slots_at(3).tolist() == [0, 1]
    assert p.resident_at(3).tolist() == [0, 1]
    assert p.resident_at(6).tolist() == []
    with pytest.raises(opt4torch.InvalidInputError, match="outside"):
        p.resident_at(7)


# ---- the page size, chosen from the item sizes ----


def old_page(sizes: np.ndarray) -> int:
    """The rule before: a quarter of the median, a power of two, >= 64."""
    return int(min(1 << max(6, int(np.log2(max(float(np.median(sizes)) / 4, 64)))), 1 << 20))


def waste(sizes: np.ndarray, page: int) -> int:
    return int((np.maximum(1, -(-sizes // page)) * page - sizes).sum())


@given(st.lists(st.integers(0, 300_000), min_size=1, max_size=200))
def test_chosen_page_wastes_no_more_than_the_powers_of_two(sizes: list[int]) -> None:
    """Within its slack (1 % of the sizes' total) the chosen page wastes no
    more than any power of two that keeps the median item in 16 pages, the
    old rule's page among them; it is a multiple of 16 and at most 1 MiB."""
    from opt4torch.planning.sizing import PAGE_ALIGN, PAGE_MAX, choose_page

    s = np.asarray(sizes, dtype=np.int64)
    page = choose_page(s)
    assert page % PAGE_ALIGN == 0 and PAGE_ALIGN <= page <= PAGE_MAX
    slack = 0.01 * max(int(s.sum()), 1)
    low = float(np.median(s)) / 16
    for k in range(4, 21):
        if 1 << k >= low and (1 << k) <= max(PAGE_ALIGN, -(-int(s.max()) // 16) * 16):
            assert waste(s, page) <= waste(s, 1 << k) + slack, (page, 1 << k)


def test_equal_sizes_fill_their_pages() -> None:
    from opt4torch.planning.sizing import choose_page

    assert choose_page(np.full(50, 1228)) == 1232  # was 256: 5 pages, 1280 bytes for 1228
    assert choose_page(np.full(50, 4096)) == 4096
    assert choose_page(np.array([], dtype=np.int64)) == 4096


@pytest.mark.parametrize("spread", [0, 220], ids=["1.1 KB items", "1.1 KB +- 20 %"])
def test_half_the_bytes_gets_closer_to_opts_bound(spread: int) -> None:
    """Two shuffled epochs with a cache of half the dataset's bytes: OPT's
    bound is 25 % hits. With 1.1 KB items the old 256-byte pages gave 21.5 %
    and 20.1 %; pages chosen from the sizes give more (the rest of the gap is
    the codec's 128-byte margin per item). The loader's plan uses the page
    chosen from the sizes of the items it reads."""
    from opt4torch.planning.sizing import choose_page

    rng = np.random.default_rng(0)
    n = 4000
    raw = 1100 + (rng.integers(-spread, spread + 1, n) if spread else np.zeros(n, dtype=np.int64))

    class Sized(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> tuple[bytes, int]:
            return bytes([i % 251]) * int(raw[i]), i

    loader = opt4torch.DataLoader(Sized(), batch_size=64, shuffle=True, seed=1, epochs=2,
                                  cache_bytes=int(raw.sum()) // 2, item_bytes=lambda i: int(raw[i]))
    try:
        plan = loader.cache.plan
        stored = raw + 128  # what the loader plans for (CODEC_MARGIN)
        assert plan.page_size == choose_page(stored)
        before = opt4torch.plan(plan.seq, items=n, capacity_bytes=int(raw.sum()) // 2, item_sizes=stored,
                                page_size=old_page(stored))
        assert before.page_size == 256
        assert plan.hit_rate > before.hit_rate + 0.005, (plan.hit_rate, before.hit_rate)
        assert plan.hit_rate <= 0.25
        for _ in range(2):  # and it serves them: every sample right, the plan's hits
            for data, index in loader:
                assert all(d == bytes([i % 251]) * int(raw[i]) for d, i in zip(data, index.tolist()))
        assert loader.cache.stats()["hits"] == plan.hits and loader.cache.stats()["store_failed"] == 0
    finally:
        loader.cache.close()
