"""Epochs cut short (a `break`, Lightning's limit_train_batches): the loader
plans again what remains, expecting later epochs to be cut the same way, and
follows the new plan exactly; an epoch that runs whole after all brings back
a plan for whole epochs. Real workers, every sample checked."""

from __future__ import annotations

import pytest
import torch
from datasets_for_tests import Checked, expected_tensor

import opt4torch
from opt4torch.data import handover_spare

pytestmark = [pytest.mark.usefixtures("no_leaked_pools"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]


def run(loader: opt4torch.DataLoader, epochs: int, cut: int | None) -> int:
    seen = 0
    for _ in range(epochs):
        for k, (x, y) in enumerate(loader):
            for row, i in zip(x, y.tolist()):
                assert torch.equal(row, expected_tensor(i)), f"sample {i} differs from the source"
            seen += len(y)
            if cut is not None and k == cut - 1:
                break
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_every_epoch_cut_after_4_batches_gets_the_cut_plans_hits(workers: int) -> None:
    loader = opt4torch.DataLoader(Checked(200), batch_size=8, shuffle=True, seed=0, cache_items=60, epochs=30,
                                  num_workers=workers, multiprocessing_context="fork" if workers else None)
    try:
        assert run(loader, 30, cut=4) == 30 * 4 * 8
        st = loader.cache.stats()
        assert loader.replans == [(1, 4)]
        assert loader.cache.plan.accesses == 29 * 4 * 8  # the plan is for what runs
        assert st["fallbacks"] == 0 and st["timeouts"] == 0, st
        assert st["hits"] == st["plan_hits"] > 400, st  # 7 hits (0 workers), 24 (2) before
    finally:
        loader.cache.close()


def test_an_epoch_that_runs_whole_brings_whole_epochs_back() -> None:
    loader = opt4torch.DataLoader(Checked(120), batch_size=8, shuffle=True, seed=1, cache_items=40, epochs=4,
                                  num_workers=2, multiprocessing_context="fork")
    try:
        run(loader, 1, cut=3)
        assert len(loader) == 15  # still the whole epoch: 3 planned batches, 12 loaded past the cut
        assert run(loader, 1, cut=None) == 120
        assert run(loader, 2, cut=None) == 240
        assert loader.replans == [(1, 3), (2, None)]
        st = loader.cache.stats()
        assert st["fallbacks"] == 0 and st["hits"] == st["plan_hits"], st
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
        assert a.replans == [(1, 2)]
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


def test_persistent_workers_keep_their_plan() -> None:
    """Persistent workers keep the pool they attached: no re-plan, and the
    cut epochs cost no timeout (the rest of a cut epoch is declared
    skipped at once)."""
    loader = opt4torch.DataLoader(Checked(120), batch_size=8, shuffle=True, seed=3, cache_items=40, epochs=5,
                                  num_workers=2, multiprocessing_context="fork", persistent_workers=True,
                                  wait_timeout=30)
    try:
        run(loader, 5, cut=3)
        assert loader.replans == []
        assert loader.cache.stats()["timeouts"] == 0
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
        assert run(loader, 12, cut=3) == 12 * 3 * 8
        assert loader.replans == [(1, 3)]
        st = loader.cache.stats()
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0, st
        assert st["spare_pages"] == handover_spare(loader.cache.plan, (2 + 1) * 8) != first
        assert 0 <= st["spare_pages"] <= loader.cache.plan._info["slots"] // 8
        assert loader.cache.info()["pages"] == loader.cache.plan._info["slots"] + st["spare_pages"]
    finally:
        loader.cache.close()
