"""Capturing samplers: the vectorised fast paths equal iteration, and capture
leaves every sampler as it found it."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from opt4torch import CaptureWarning, capture


def iterate(sampler, epochs: int, start: int = 0) -> np.ndarray:
    """What a training loop sees: set_epoch, then iterate, per epoch."""
    out = []
    for e in range(epochs):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(start + e)
        for item in sampler:
            out.extend(item if isinstance(item, list) else [item])
    return np.array(out, dtype=np.int64)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_samplers() -> list:
    data = range(97)
    return [
        RandomSampler(data, generator=gen(1)),
        RandomSampler(data, generator=gen(2), num_samples=300),
        RandomSampler(data, generator=gen(3), num_samples=194),  # a multiple of n
        RandomSampler(data, generator=gen(4), num_samples=50),
        RandomSampler(data, replacement=True, generator=gen(5)),
        RandomSampler(data, replacement=True, num_samples=1000, generator=gen(6)),
        RandomSampler(data, replacement=True, num_samples=33, generator=gen(7)),
        SequentialSampler(data),
        WeightedRandomSampler(torch.rand(97, generator=gen(80)), 200, generator=gen(8)),
        WeightedRandomSampler(torch.rand(97, generator=gen(90)), 60, replacement=False, generator=gen(9)),
        DistributedSampler(data, num_replicas=4, rank=1, seed=3),
        DistributedSampler(data, num_replicas=4, rank=3, seed=3, drop_last=True),
        DistributedSampler(data, num_replicas=3, rank=0, shuffle=False),
        DistributedSampler(range(2), num_replicas=5, rank=4, seed=1),  # pads past n
    ]


@pytest.mark.parametrize("index", range(len(make_samplers())))
def test_fast_path_equals_iteration(index: int) -> None:
    fast_sampler = make_samplers()[index]
    slow_sampler = make_samplers()[index]
    got = capture(fast_sampler, 3, start_epoch=2)
    want = iterate(slow_sampler, 3, start=2)
    assert np.array_equal(got, want)
    assert np.array_equal(capture(make_samplers()[index], 3, start_epoch=2, fast=False), want)


@pytest.mark.parametrize("index", range(len(make_samplers())))
def test_capture_leaves_the_sampler_untouched(index: int) -> None:
    sampler = make_samplers()[index]
    epoch = getattr(sampler, "epoch", None)
    captured = capture(sampler, 2)
    assert getattr(sampler, "epoch", None) == epoch
    # Training after capture sees exactly the captured order.
    assert np.array_equal(iterate(sampler, 2), captured)


def test_unseeded_random_sampler_warns_and_restores_global_rng() -> None:
    torch.manual_seed(11)
    sampler = RandomSampler(range(50))
    with pytest.warns(CaptureWarning, match="no generator"):
        captured = capture(sampler, 2)
    # The global RNG is where it was, so iterating now replays the capture.
    assert np.array_equal(iterate(sampler, 2), captured)


def test_batch_sampler_and_custom_sampler_and_lists() -> None:
    batches = BatchSampler(RandomSampler(range(40), generator=gen(3)), batch_size=7, drop_last=False)
    want = iterate(BatchSampler(RandomSampler(range(40), generator=gen(3)), 7, False), 2)
    assert np.array_equal(capture(batches, 2), want)

    class EveryOther(Sampler[int]):
        def __init__(self) -> None:
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self):
            return iter(range(self.epoch % 2, 20, 2))

        def __len__(self) -> int:
            return 10

    assert np.array_equal(capture(EveryOther(), 3), iterate(EveryOther(), 3))
    assert np.array_equal(capture([3, 1, 2], 2), [3, 1, 2, 3, 1, 2])
    assert np.array_equal(capture(iter(range(3))), [0, 1, 2])  # no len()


def test_subclass_does_not_take_the_fast_path() -> None:
    class Reversed(RandomSampler):
        def __iter__(self):
            return reversed(list(super().__iter__()))

    got = capture(Reversed(range(30), generator=gen(1)))
    want = iterate(Reversed(range(30), generator=gen(1)), 1)
    assert np.array_equal(got, want)


def test_fast_path_falls_back_when_it_disagrees(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    capture_module = importlib.import_module("opt4torch.capture")  # the module, not the function
    monkeypatch.setattr(capture_module, "_random_sampler", lambda s: np.zeros(len(s), dtype=np.int64))
    sampler = RandomSampler(range(30), generator=gen(1))
    with pytest.warns(CaptureWarning, match="disagrees"):
        got = capture(sampler)
    assert np.array_equal(got, iterate(RandomSampler(range(30), generator=gen(1)), 1))


def test_bad_epochs() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="epochs"):
            capture([1, 2], bad)  # type: ignore[arg-type]


def test_large_capture_is_exact() -> None:
    """10 M indices through the fast path equal the sampler's own stream."""
    sampler = RandomSampler(range(1_000_000), replacement=True, num_samples=10_000_000, generator=gen(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = capture(sampler, progress=False)
    assert got.size == 10_000_000 and got.dtype == np.int64
    head = list(itertools.islice(iter(RandomSampler(range(1_000_000), replacement=True,
                                                   num_samples=10_000_000, generator=gen(0))), 100_000))
    assert np.array_equal(got[:100_000], head)


@pytest.mark.parametrize("n, world, shuffle, drop_last", [
    (103, 4, True, False),    # padded by one
    (103, 4, True, True),     # cut to 100
    (10, 16, True, False),    # padded past the dataset (more ranks than items)
    (50, 5, False, False),    # no shuffle, no padding
    (1, 3, False, True),      # every rank gets nothing
])
def test_capture_ranks_draws_one_order_an_epoch(n: int, world: int, shuffle: bool, drop_last: bool) -> None:
    """capture_ranks of a DistributedSampler draws the epoch's permutation once
    and slices it for every rank (not once a rank); each rank's arrays equal
    iterating that rank's own sampler, from a start epoch other than 0."""
    from opt4torch import capture_ranks
    from opt4torch.planning import capture as capture_module

    drawn = []
    real = capture_module._distributed_order

    def counted(s):  # type: ignore[no-untyped-def]
        drawn.append(s.epoch)
        return real(s)

    sampler = DistributedSampler(range(n), num_replicas=world, rank=world - 1, shuffle=shuffle, seed=11,
                                 drop_last=drop_last)
    mp = pytest.MonkeyPatch()
    mp.setattr(capture_module, "_distributed_order", counted)
    try:
        got = capture_ranks(sampler, 3, start_epoch=4, progress=False)
    finally:
        mp.undo()
    for r in range(world):
        own = DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=shuffle, seed=11,
                                 drop_last=drop_last)
        assert [a.tolist() for a in got[r]] == [iterate(own, 1, start=4 + e).tolist() for e in range(3)]
    # Two checks (the first and the last rank), then one draw an epoch.
    assert drawn.count(4) <= 3 and drawn[-3:] == [4, 5, 6] and len(drawn) <= 5
    assert sampler.rank == world - 1 and sampler.epoch == 0  # left as it was


def test_capture_ranks_of_a_subclass_goes_rank_by_rank() -> None:
    from opt4torch import capture_ranks

    class Backwards(DistributedSampler):
        def __iter__(self):
            return reversed(list(super().__iter__()))

    got = capture_ranks(Backwards(range(20), num_replicas=3, rank=0, seed=2), 2, progress=False)
    for r in range(3):
        own = Backwards(range(20), num_replicas=3, rank=r, seed=2)
        assert [a.tolist() for a in got[r]] == [iterate(own, 1, start=e).tolist() for e in range(2)]
