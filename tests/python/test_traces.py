"""Trace files in and out."""

from __future__ import annotations

import numpy as np
import pytest

from opt4torch import InvalidInputError
from opt4torch.lab.traces import epoch_shuffle, load_trace, save_trace, uniform


def test_roundtrip_text_and_npy(tmp_path) -> None:
    seq = uniform(100, 1000, seed=1)
    for name in ("t.txt", "t.npy"):
        save_trace(tmp_path / name, seq)
        assert np.array_equal(load_trace(tmp_path / name), seq)


def test_generators_are_seeded() -> None:
    assert np.array_equal(uniform(10, 50, seed=3), uniform(10, 50, seed=3))
    e = epoch_shuffle(20, 3, seed=4)
    assert e.size == 60 and all(sorted(e[i * 20:(i + 1) * 20]) == list(range(20)) for i in range(3))


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("words.txt", b"1\n2\nthree\n", "one integer id per line"),
        ("cols.txt", b"1 2\n3 4\n", "one id per line"),
        ("float.npy", None, "1-D integer array"),
        ("junk.npy", b"not numpy at all", "not a readable .npy"),
    ],
)
def test_bad_traces(tmp_path, name: str, content: bytes | None, match: str) -> None:
    path = tmp_path / name
    if content is None:
        np.save(path, np.array([0.5, 1.5]))
    else:
        path.write_bytes(content)
    with pytest.raises(InvalidInputError, match=match):
        load_trace(path)


# ---- generators ----

from opt4torch.lab import traces  # noqa: E402


@pytest.mark.parametrize("name", list(traces.GENERATORS))
def test_every_generator_is_seeded_and_in_range(name: str) -> None:
    a = traces.generate(name, 300, epochs=4, seed=1)
    b = traces.generate(name, 300, epochs=4, seed=1)
    c = traces.generate(name, 300, epochs=4, seed=2)
    assert a.dtype == np.int64 and a.ndim == 1
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.min() >= 0 and a.max() < 300


def test_generate_lengths_and_errors() -> None:
    assert traces.generate("uniform", 100, epochs=3).size == 300
    assert traces.generate("zipf", 100, accesses=77).size == 77
    assert traces.generate("epoch_shuffle", 100, epochs=3, accesses=5).size == 300  # epochs rule
    assert traces.generate("repeated_augmentation", 100, epochs=2, repeats=4).size == 800
    assert traces.generate("distributed", 101, epochs=2, world=4).size == 2 * 26
    with pytest.raises(InvalidInputError, match="unknown pattern 'nope'"):
        traces.generate("nope", 10)
    with pytest.raises(InvalidInputError, match="has no parameter alpha"):
        traces.generate("uniform", 10, alpha=1.0)
    for call, match in (
        (lambda: traces.zipf(10, 10, alpha=-1), "alpha"),
        (lambda: traces.markov(10, 10, jump=1.5), "jump"),
        (lambda: traces.weighted(10, 10, imbalance=0.5), "imbalance"),
        (lambda: traces.weighted(5, 10, classes=6), "classes"),
        (lambda: traces.distributed(10, 1, world=2, rank=2), "rank"),
        (lambda: traces.repeated_augmentation(10, 1, repeats=0), "repeats"),
        (lambda: traces.uniform(0, 10), "items"),
    ):
        with pytest.raises(InvalidInputError, match=match):
            call()


def test_uniform_is_uniform() -> None:
    counts = np.bincount(traces.uniform(50, 200_000, seed=3), minlength=50)
    # Each count is Binomial(200000, 1/50): mean 4000, sd 62.
    assert np.all(np.abs(counts - 4_000) < 6 * 62)


def test_zipf_follows_its_law() -> None:
    items, T, alpha = 1_000, 400_000, 1.1
    seq = traces.zipf(items, T, alpha=alpha, seed=4)
    counts = np.sort(np.bincount(seq, minlength=items))[::-1]
    p = np.arange(1, items + 1, dtype=float) ** -alpha
    p /= p.sum()
    for rank in (0, 1, 9, 99):
        expect = T * p[rank]
        assert abs(counts[rank] - expect) < 6 * np.sqrt(expect), rank
    # alpha = 0 is uniform; the hottest ids are spread over the range, not 0, 1, 2...
    flat = np.bincount(traces.zipf(20, 100_000, alpha=0.0, seed=5), minlength=20)
    assert np.all(np.abs(flat - 5_000) < 6 * 70)
    hottest = np.argsort(np.bincount(seq, minlength=items))[::-1][:10]
    assert sorted(hottest.tolist()) != list(range(10))


def test_markov_runs_and_jumps() -> None:
    items, T, jump = 1_000, 100_000, 0.05
    seq = traces.markov(items, T, jump=jump, seed=6)
    step = (seq[1:] - seq[:-1]) % items == 1
    # A step is sequential unless it jumps (and a jump lands on x+1 with prob 1/items).
    expect = (1 - jump) + jump / items
    assert abs(step.mean() - expect) < 0.01
    assert np.all(traces.markov(10, 25, jump=0.0, seed=7)[1:] == (traces.markov(10, 25, jump=0.0, seed=7)[:-1] + 1) % 10)


def test_weighted_rebalances_classes_like_weighted_random_sampler() -> None:
    import torch
    from torch.utils.data import WeightedRandomSampler

    items, T, classes, imbalance = 2_000, 300_000, 5, 20.0
    sizes = traces.class_sizes(items, classes, imbalance)
    assert sizes.sum() == items and np.all(np.diff(sizes) <= 0)
    assert sizes[0] / sizes[-1] == pytest.approx(imbalance, rel=0.1)
    cls = np.repeat(np.arange(classes), sizes)
    ours = np.bincount(cls[traces.weighted(items, T, imbalance=imbalance, classes=classes, seed=8)],
                       minlength=classes) / T
    weights = torch.tensor(1.0 / sizes[cls], dtype=torch.double)
    sampler = WeightedRandomSampler(weights, T, replacement=True, generator=torch.Generator().manual_seed(8))
    theirs = np.bincount(cls[np.fromiter(sampler, dtype=np.int64)], minlength=classes) / T
    # Both draw every class equally often (1/5 each), up to sampling noise.
    assert np.allclose(ours, 1 / classes, atol=0.01)
    assert np.allclose(theirs, 1 / classes, atol=0.01)


def test_repeated_augmentation_has_each_index_k_times_per_epoch() -> None:
    items, epochs, k = 250, 3, 4
    for spread in (True, False):
        seq = traces.repeated_augmentation(items, epochs, repeats=k, seed=9, spread=spread)
        assert seq.size == items * k * epochs
        for e in range(epochs):
            epoch = seq[e * items * k:(e + 1) * items * k]
            assert np.all(np.bincount(epoch, minlength=items) == k)
        adjacent = np.all(seq.reshape(-1, k) == seq.reshape(-1, k)[:, :1])
        assert adjacent == (not spread)


@pytest.mark.parametrize(("items", "world", "drop_last"), [(100, 4, False), (101, 4, False), (103, 8, True),
                                                          (7, 3, False), (7, 3, True), (3, 5, False)])
def test_distributed_matches_torch(items: int, world: int, drop_last: bool) -> None:
    from torch.utils.data.distributed import DistributedSampler

    shards = []
    for rank in range(world):
        theirs = DistributedSampler(range(items), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last)
        ours = traces.distributed(items, 1, world=world, rank=rank, shuffle=False, drop_last=drop_last)
        assert ours.tolist() == list(theirs)
        shuffled = traces.distributed(items, 2, world=world, rank=rank, seed=3, drop_last=drop_last)
        assert shuffled.size == 2 * len(theirs)
        shards.append(shuffled[:len(theirs)])
    # With shuffling, the ranks' first epochs interleave into one permutation
    # of the items, padded by repeating its start (or, with drop_last, cut).
    merged = np.stack(shards, axis=1).reshape(-1)
    if drop_last:
        assert merged.size == items // world * world and len(set(merged.tolist())) == merged.size
    else:
        assert sorted(merged[:items].tolist()) == list(range(items))
        assert np.array_equal(merged[items:], merged[:merged.size - items])


def test_captured_sampler() -> None:
    import torch
    from torch.utils.data import RandomSampler

    sampler = RandomSampler(range(50), generator=torch.Generator().manual_seed(1))
    seq = traces.captured(sampler, 3, progress=False)
    again = RandomSampler(range(50), generator=torch.Generator().manual_seed(1))
    assert seq.tolist() == [i for _ in range(3) for i in again]


def test_save_oracle_general_refuses_what_it_cannot_write(tmp_path) -> None:
    path = tmp_path / "t.bin"
    with pytest.raises(InvalidInputError, match="non-negative"):
        traces.save_oracle_general(path, [3, -1])
    with pytest.raises(InvalidInputError, match="one-dimensional"):
        traces.save_oracle_general(path, [[1, 2], [3, 4]])
    assert not path.exists()
    traces.save_oracle_general(path, [])
    assert path.read_bytes() == b""
