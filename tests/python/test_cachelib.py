"""The earlier design's API: names, signatures and behaviour."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as data
from datasets_for_tests import expected_tensor
from torch.utils.data import DataLoader, RandomSampler

from conftest import leaked_since
import opt4torch
from opt4torch import _engine
from opt4torch.compat.cachelib import DivergenceWarning


def our_pools() -> set[str]:
    return {p["name"] for p in _engine.pool_list()}


def test_generate_precomputed_file_meaning(tmp_path) -> None:
    from OPT4TorchDataSet.cachelib import generate_precomputed_file

    path = tmp_path / "precomputed" / "my_experiment.pkl"
    p = generate_precomputed_file(dataset_size=1000, total_iterations=3000, persist_path=str(path),
                                  random_seed=42, replacement=True)
    assert path.exists() and p.accesses == 3000
    want = list(RandomSampler(range(1000), replacement=True, num_samples=3000,
                              generator=torch.Generator().manual_seed(42)))
    assert np.array_equal(opt4torch.load_plan(path).seq, want)
    # Without replacement: a permutation, like the sampler gives. capacity=
    # is the earlier spelling of maxsize=.
    with pytest.warns(DeprecationWarning, match="use maxsize="):
        q = generate_precomputed_file(100, 100, tmp_path / "nr.opt4", random_seed=1, replacement=False,
                                      capacity=30)
    want = list(RandomSampler(range(100), replacement=False, num_samples=100,
                              generator=torch.Generator().manual_seed(1)))
    assert np.array_equal(q.seq, want) and q.capacity == 30
    # OPT4TorchDataSet 1.1 refuses more samples than items without replacement.
    with pytest.raises(ValueError, match=r"total_iterations \(250\) cannot exceed dataset_size \(100\)"):
        generate_precomputed_file(100, 250, tmp_path / "nr2.opt4", random_seed=1, replacement=False)


class CustomDataset(data.Dataset):
    """The earlier README's example dataset, with its decorator usage."""

    def __init__(self, data_source, cache_size=None, precomputed_path=None, decorator="plain", **kw):
        self.data_source = data_source
        if precomputed_path and cache_size:
            self.setup_cache(precomputed_path, cache_size, decorator, kw)

    def setup_cache(self, precomputed_path, cache_size, decorator, kw):
        from OPT4TorchDataSet.cachelib import (
            OPTCacheDecorator,
            SharedOPTCacheDecorator,
            generate_precomputed_file,
        )

        if not os.path.exists(precomputed_path):
            generate_precomputed_file(dataset_size=len(self.data_source),
                                      total_iterations=len(self.data_source) * 3,
                                      persist_path=precomputed_path, random_seed=42)
        cls = OPTCacheDecorator if decorator == "plain" else SharedOPTCacheDecorator
        self.cache_decorator = cls(precomputed_path=precomputed_path, maxsize=cache_size,
                                   prediction_window=10000, total_iter=len(self.data_source) * 3, **kw)
        self._cached_getitem = self.cache_decorator(self._load_data)

    def _load_data(self, obj, index):
        return self.data_source[index]

    def __len__(self):
        return len(self.data_source)

    def __getitem__(self, index):
        if hasattr(self, "_cached_getitem"):
            return self._cached_getitem(self, index)
        return self._load_data(self, index)


def readme_sampler(n: int) -> RandomSampler:
    return RandomSampler(range(n), replacement=True, num_samples=n * 3,
                         generator=torch.Generator().manual_seed(42))


@pytest.mark.parametrize("mode", ["c", "cpp", "python"])
def test_readme_example_single_process_is_exact(tmp_path, mode: str) -> None:
    source = list(range(1000))
    ds = CustomDataset(source, cache_size=300, precomputed_path=str(tmp_path / "opt_cache.pkl"), mode=mode)
    loader = DataLoader(ds, batch_size=32, shuffle=False, num_workers=0, sampler=readme_sampler(1000))
    got = [int(x) for batch in loader for x in batch]
    assert got == list(readme_sampler(1000))  # every item is the right one
    st = ds.cache_decorator.stats()
    assert st["mismatches"] == 0 and not st["degraded_to_lru"]
    assert st["hits"] == st["plan_hits"] == opt4torch.plan(got, 300, items=1000).hits


def test_readme_example_tensors_python_mode(tmp_path) -> None:
    source = [expected_tensor(i, (4,)) for i in range(200)]
    ds = CustomDataset(source, cache_size=50, precomputed_path=str(tmp_path / "p.opt4"), mode="python")
    for i in readme_sampler(200):
        assert torch.equal(ds[i], source[i])


@pytest.mark.parametrize("position", ["clock", "occurrence"])
@pytest.mark.parametrize("workers", [0, 2])
def test_shared_decorator_never_serves_a_wrong_item(tmp_path, position: str, workers: int) -> None:
    before = our_pools()
    source = [expected_tensor(i, (8,)) for i in range(300)]
    ds = CustomDataset(source, cache_size=100, precomputed_path=str(tmp_path / "s.opt4"),
                       decorator="shared", position=position)
    loader = DataLoader(ds, batch_size=16, sampler=readme_sampler(300), num_workers=workers,
                        multiprocessing_context="fork" if workers else None)
    order = list(readme_sampler(300))
    got = [row for batch in loader for row in batch]
    assert len(got) == len(order)
    for row, i in zip(got, order):
        assert torch.equal(row, source[i])
    st = ds.cache_decorator.pool_stats()
    assert st is not None and st["timeouts"] == 0
    if workers == 0 or position == "occurrence":
        # One process follows the plan exactly; occurrence matching is exact
        # whatever the interleaving (each item's requests come in order here).
        assert st["hits"] == ds.cache_decorator.plan.hits
    ds.cache_decorator.close()
    assert not leaked_since(before)


def test_divergence_falls_back_to_lru(tmp_path) -> None:
    source = list(range(500))
    ds = CustomDataset(source, cache_size=100, precomputed_path=str(tmp_path / "d.opt4"))
    other = list(RandomSampler(range(500), replacement=True, num_samples=1500,
                               generator=torch.Generator().manual_seed(7)))  # not the planned seed
    with pytest.warns(DivergenceWarning, match="did not match the plan"):
        got = [ds[i] for i in other]
    assert got == other  # still right
    st = ds.cache_decorator.stats()
    assert st["degraded_to_lru"] and st["hits"] > 0


def test_errors(tmp_path) -> None:
    from OPT4TorchDataSet.cachelib import OPTCacheDecorator, get_opt_cache

    path = tmp_path / "e.opt4"
    opt4torch.generate_precomputed_file(100, 300, path, random_seed=0)
    with pytest.raises(ValueError, match="total_iter=299 but .* 300 accesses"):
        OPTCacheDecorator(path, 10, 1000, 299)
    with pytest.raises(ValueError, match="maxsize"):
        OPTCacheDecorator(path, -1)
    # OPT4TorchDataSet 1.1: maxsize=0 passes every call straight through.
    assert OPTCacheDecorator(path, 0)(lambda obj, i: i * 2)(None, 21) == 42
    with pytest.raises(ValueError, match="mode must be"):
        get_opt_cache(mode="rust", precomputed_path=path, maxsize=10)
    with pytest.raises(FileNotFoundError):
        OPTCacheDecorator(tmp_path / "missing.pkl", 10)
    assert type(get_opt_cache(mode="python", precomputed_path=path, maxsize=10)).__name__ == "OPTCacheDecorator"
    shared = get_opt_cache(mode="cpp", precomputed_path=path, maxsize=10)
    assert type(shared).__name__ == "SharedOPTCacheDecorator"
    shared.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dec = OPTCacheDecorator(path, 10)
        f = dec(lambda obj, i: i)
        for i in opt4torch.load_plan(path).seq.tolist():
            assert f(None, i) == i
    # OPT4TorchDataSet 1.1: a call past total_iter raises IndexError.
    with pytest.raises(IndexError, match="past total_iter=300"):
        f(None, 5)
