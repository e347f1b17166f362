"""Epochs cut short (a `break`, Lightning's limit_train_batches): the loader
plans again what remains, from what the pool holds (no cold start), expecting
whole epochs until two epochs in a row were cut alike, and follows the new
plan exactly; it says so once. Persistent workers follow it too. stats()
counts the run: every pool's counters, and what the loop received. Real
workers, every sample checked; hits checked against the pure-Python
reference Belady run through the same re-plans."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from datasets_for_tests import Checked, CountingSlow, expected_tensor

import opt4torch
from opt4torch.data import handover_spare
from opt4torch.lab.reference import ADMIT, HIT, belady

pytestmark = [pytest.mark.usefixtures("no_leaked_pools"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create"),
              pytest.mark.filterwarnings("ignore:opt4torch. epoch .* so the cache planned")]


def run(loader: opt4torch.DataLoader, epochs: int, cut: int | None | list[int | None],
        order: list[list[int]] | None = None) -> int:
    """Iterate ``epochs`` epochs, leaving each after ``cut`` batches (one
    number for all, or one per epoch; None: whole). Every sample is checked;
    ``order`` gets each epoch's indices as received."""
    seen = 0
    for epoch in range(epochs):
        k = cut[epoch] if isinstance(cut, list) else cut
        got: list[int] = []
        for b, (x, y) in enumerate(loader):
            for row, i in zip(x, y.tolist()):
                assert torch.equal(row, expected_tensor(i)), f"sample {i} differs from the source"
            got.extend(y.tolist())
            if k is not None and b == k - 1:
                break
        seen += len(got)
        if order is not None:
            order.append(got)
    return seen


def whole_epochs(seed: int, n: int, epochs: int) -> list[list[int]]:
    """The order shuffle=True with this seed gives, epoch by epoch (what the
    loader captures, whatever the batch size)."""
    probe = opt4torch.DataLoader(Checked(n), batch_size=n, shuffle=True, seed=seed, cache_items=1, epochs=epochs)
    try:
        return [y.tolist() for _ in range(epochs) for _, y in probe]
    finally:
        probe.cache.close()


def oracle(whole: list[list[int]], batch: int, ran: list[list[int]], replans: list[tuple[int, int | None]],
           capacity: int, items: int) -> tuple[int, int]:
    """(hits, kept) of a run that received ``ran`` (each epoch's samples, a
    prefix of what ``whole`` gives) through ``replans``, by the reference
    Belady: each plan covers its epochs cut as it expects, after a prefix of
    the items the plan before held where the run left it (its resident set
    there, sorted), and serves its positions up to there. Samples past a
    plan's cut are misses; ``kept``: the prefix items a plan admits."""
    at = dict(replans)
    hits = kept = 0
    first, cut, prefix = 0, None, []
    for e in range(1, len(ran) + 1):
        if e < len(ran) and e not in at:
            continue
        planned = [len(w) if cut is None else min(cut * batch, len(w)) for w in whole]
        seq = prefix + [i for f in range(first, len(whole)) for i in whole[f][:planned[f]]]
        ops = [kind for kind, _ in belady(seq, capacity, items=items).ops]
        kept += sum(1 for kind in ops[:len(prefix)] if kind == ADMIT)
        stop = len(prefix) + sum(planned[first:e - 1]) + min(len(ran[e - 1]), planned[e - 1])
        hits += sum(1 for kind in ops[len(prefix):stop] if kind == HIT)
        first_kind: dict[int, int] = {}
        for t in range(stop, len(seq)):
            first_kind.setdefault(seq[t], ops[t])
        prefix = sorted(i for i, kind in first_kind.items() if kind == HIT)
        if e < len(ran):
            first, cut = e, at[e]
    return hits, kept


def check_counts(loader: opt4torch.DataLoader, whole: list[list[int]], batch: int, ran: list[list[int]],
                 capacity: int, workers: int) -> dict:
    """stats() against the oracle; returns it."""
    st = loader.cache.stats()
    served = sum(len(r) for r in ran)
    hits, kept = oracle(whole, batch, ran, loader.replans, capacity, len(whole[0]))
    assert st["served"] == served == st["plan_accesses"], st
    assert st["plan_hits"] == hits, (st, hits)
    # Carried over: copied from the old pool, or loaded where it no longer held them
    # (pages a worker or prefetcher took after a break).
    assert st["kept"] + st["kept_loaded"] == kept, (st, kept)
    assert st["fallbacks"] == 0 and st["timeouts"] == 0, st
    if workers == 0:  # nothing loaded ahead: the counters are what the loop received
        assert st["hits"] == hits and st["hits"] + st["misses"] == served, st
        assert st["kept_loaded"] == 0, st
    else:  # plus, at most, the batches the workers loaded ahead of each break (2 each)
        ahead = 2 * workers * batch * sum(len(r) < len(w) for r, w in zip(ran, whole))
        assert 0 <= st["hits"] - hits <= ahead, (st, hits, ahead)
        assert served <= st["hits"] + st["misses"] <= served + ahead, (st, ahead)
    return st


SETUPS = [(0, None, False), (2, "fork", False), (2, "fork", True), (2, "spawn", True)]


@pytest.mark.parametrize("workers,context,persistent", SETUPS)
def test_a_break_in_the_first_epoch_keeps_the_cache(workers: int, context: str | None, persistent: bool) -> None:
    """The issue's smoke run: 3 epochs of 10 batches, left after 3 batches
    in the first. The later epochs are planned whole, from what the pool
    holds: they hit (they got 0 when the re-plan started cold and expected
    every epoch cut)."""
    whole = whole_epochs(0, 400, 3)
    loader = opt4torch.DataLoader(Checked(400), batch_size=40, shuffle=True, seed=0, cache_items=200, epochs=3,
                                  num_workers=workers, multiprocessing_context=context,
                                  persistent_workers=persistent)
    try:
        ran: list[list[int]] = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert run(loader, 3, [3, None, None], ran) == 120 + 800
        said = [str(w.message) for w in caught if "planned" in str(w.message)]
        assert len(said) == 1 and "\n" not in said[0], said
        assert said[0].startswith("opt4torch: epoch 0 ended after 3 of 10 batches"), said
        assert ran[1:] == whole[1:] and ran[0] == whole[0][:120]
        assert loader.replans == [(1, None)]
        st = check_counts(loader, whole, 40, ran, 200, workers)
        assert st["kept"] > st["kept_loaded"], st  # copied, not loaded again
        whole_run = belady([i for e in whole for i in e], 200).hits
        assert st["plan_hits"] > 0.5 * whole_run, (st, whole_run)  # not a cold start: 0 before
    finally:
        loader.cache.close()


@pytest.mark.parametrize("workers,context,persistent", SETUPS[:3])  # spawn: test_a_break_in_the_first_epoch
def test_every_epoch_cut_gets_the_hits_of_a_plan_for_the_cut_run(workers: int, context: str | None,
                                                                  persistent: bool) -> None:
    """Lightning's limit_train_batches: every epoch left after 10 of 25
    batches. One cut is taken for a one-off (whole epochs planned), the
    second alike for a rule (cut epochs planned); then the plan's hits
    exactly, near those of a plan made for the cut run from the start.
    Persistent workers too (they got 60 % of it before, keeping their pool)."""
    n, batch, epochs = 500, 20, 12
    whole = whole_epochs(1, n, epochs)
    loader = opt4torch.DataLoader(Checked(n), batch_size=batch, shuffle=True, seed=1, cache_items=150, epochs=epochs,
                                  num_workers=workers, multiprocessing_context=context,
                                  persistent_workers=persistent)
    try:
        ran: list[list[int]] = []
        assert run(loader, epochs, 10, ran) == epochs * 10 * batch
        assert loader.replans == [(1, None), (2, 10)]
        st = check_counts(loader, whole, batch, ran, 150, workers)
        best = belady([i for e in ran for i in e], 150).hits  # planned for the cut run from the start
        assert st["plan_hits"] >= 0.85 * best, (st["plan_hits"], best)
    finally:
        loader.cache.close()


def test_the_cut_changes_and_the_plan_follows() -> None:
    """Cut, cut alike (now expected), longer (past the cut: loaded, not
    cached, and counted), whole, cut once more: each surprise re-plans,
    keeping the pool; one warning in all."""
    n, batch = 120, 8
    cuts: list[int | None] = [3, 3, 3, 6, None, 2, None]
    whole = whole_epochs(2, n, len(cuts))
    loader = opt4torch.DataLoader(Checked(n), batch_size=batch, shuffle=True, seed=2, cache_items=40,
                                  epochs=len(cuts), num_workers=2, multiprocessing_context="fork")
    try:
        ran: list[list[int]] = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run(loader, len(cuts), cuts, ran)
        assert len([w for w in caught if "planned" in str(w.message)]) == 1
        assert loader.replans == [(1, None), (2, 3), (4, None), (6, None)]
        st = check_counts(loader, whole, batch, ran, 40, 2)
        assert st["unplanned"] == 3 * batch  # epoch 3's batches 3-5, past the cut its plan expected
        assert len(loader) == 15  # still the whole epoch
    finally:
        loader.cache.close()


def test_a_state_saved_after_a_replan_resumes_a_fresh_loader() -> None:
    def make() -> opt4torch.DataLoader:
        return opt4torch.DataLoader(Checked(96), batch_size=8, shuffle=True, seed=2, cache_items=30, epochs=3)

    a = make()
    try:
        run(a, 1, cut=2)
        it = iter(a)
        next(it)
        state = a.state_dict()  # epoch 1, after the re-plan
        assert a.replans == [(1, None)]
        rest_a = [y.tolist() for _, y in it]
    finally:
        a.cache.close()
    b = make()
    try:
        b.load_state_dict(state)
        rest_b = [y.tolist() for _, y in b]
        assert rest_b == rest_a
    finally:
        b.cache.close()


def test_persistent_workers_drop_the_batches_a_break_left(tmp_path: Path) -> None:
    """Batches a persistent worker gets after the loop left their epoch are
    dropped unloaded, so the next epoch does not wait for them to load, and
    none costs a timeout. One worker, 4 batches handed out ahead: when the
    first comes back the worker starts the second, and the loop leaves; the
    third to fifth are dropped (kept, they were loaded: 40 loads, not 16)."""
    import os
    import time

    counter = str(tmp_path / "loads")
    loader = opt4torch.DataLoader(CountingSlow(64, counter, delay=0.05), batch_size=8, shuffle=True, seed=3,
                                  cache_items=16, epochs=2, num_workers=1, prefetch_factor=4,
                                  multiprocessing_context="fork", persistent_workers=True, wait_timeout=30)
    try:
        loads = os.path.getsize(counter)  # the constructor's probes
        it = iter(loader)
        next(it)
        del it
        time.sleep(1.5)  # the second batch takes 0.4 s; the three after it would take 1.2 s more
        assert os.path.getsize(counter) - loads == 16
        assert sum(len(y) for _, y in loader) == 64  # the next epoch, whole
        st = loader.cache.stats()
        assert st["served"] == 8 + 64 == st["plan_accesses"], st
        assert st["timeouts"] == 0 and st["fallbacks"] == 0, st
        assert loader.replans == [(1, None)]
    finally:
        loader.cache.close()


def test_a_prefetching_loader_plans_its_spare_pages_again() -> None:
    """Spare pages follow the plan: the cut plan admits less, so a re-plan
    computes them again (the engine refuses more than the plan's pages
    beyond 1024; the old count could exceed a small new plan's)."""
    loader = opt4torch.DataLoader(Checked(200), batch_size=8, shuffle=True, seed=2, cache_items=150, epochs=12,
                                  num_workers=2, multiprocessing_context="fork", prefetch=True,
                                  prefetch_threads=2)
    try:
        first = loader.cache.spare_pages
        assert 0 < first <= 150 // 8
        ran: list[list[int]] = []
        assert run(loader, 12, 3, ran) == 12 * 3 * 8
        assert loader.replans == [(1, None), (2, 3)]
        st = check_counts(loader, whole_epochs(2, 200, 12), 8, ran, 150, 2)
        assert st["spare_pages"] == handover_spare(loader.cache.plan, (2 + 1) * 8) != first
        assert 0 <= st["spare_pages"] <= loader.cache.plan._info["slots"] // 8
        assert loader.cache.info()["pages"] == loader.cache.plan._info["slots"] + st["spare_pages"]
    finally:
        loader.cache.close()
