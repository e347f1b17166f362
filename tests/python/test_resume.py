"""Resuming by position (issue 21): a state saved with one batch size
resumes exactly with another, every sample of the epoch once across the
save/resume chain; and every state that cannot resume here is refused,
naming the key at fault. One test per row of docs/reliability.md."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from datasets_for_tests import Checked, expected_tensor

import opt4torch

pytestmark = pytest.mark.usefixtures("no_leaked_pools")

N, CAPACITY, EPOCHS, SEED = 200, 60, 2, 21


def make(batch_size: int | None, *, workers: int = 2, n: int = N, **kw) -> opt4torch.DataLoader:
    kw = {"shuffle": True, "seed": SEED, **kw}
    if workers:
        kw.update(num_workers=workers, multiprocessing_context="fork")
    return opt4torch.DataLoader(Checked(n), batch_size=batch_size, cache_items=CAPACITY, epochs=EPOCHS, **kw)


def take(it, batches: int | None = None) -> list[list[int]]:
    """The next batches' indices (all that remain with None), each sample
    checked byte-equal to the source."""
    out = []
    for x, y in it:
        for row, i in zip(x, y.tolist()):
            assert torch.equal(row, expected_tensor(i)), f"sample {i} differs from the source"
        out.append(y.tolist())
        if batches is not None and len(out) == batches:
            break
    return out


def plan_hits(loader: opt4torch.DataLoader, first: int, last: int) -> int:
    return int(np.count_nonzero(loader.cache.plan.kinds[first:last] == opt4torch.HIT))


def test_resume_across_batch_sizes_8_16_3_sees_every_sample_once() -> None:
    """Epoch 1 is read by three loaders in turn, under fork workers: 5
    batches of 8, then (resumed) 3 batches of 16 of which the first is cut
    short at the saved position, then (resumed) the rest in batches of 3.
    Together they are epoch 1 exactly, in the captured order; the last
    loader gets exactly the plan's hits from its position on."""
    a = make(8)
    try:
        seq = np.array(a.cache.plan.seq, dtype=np.int64)
        epoch1 = seq[N:].tolist()
        assert sorted(epoch1) == list(range(N))
        assert [i for b in take(a) for i in b] == seq[:N].tolist()  # epoch 0, whole
        it = iter(a)
        got_a = take(it, 5)
        state_a = a.state_dict()
        del it
        assert a.cache.stats()["fallbacks"] == 0
    finally:
        a.cache.close()
    assert [len(b) for b in got_a] == [8] * 5
    assert state_a["epoch"] == 1 and state_a["batches_done"] == 5
    assert state_a["samples_done"] == 40 and state_a["position"] == N + 40

    b = make(16)
    try:
        b.load_state_dict(state_a)
        assert b.resumed_at == N + 40
        assert b.state_dict() == {**state_a, "batches_done": 2, "batch_size": 16}  # nothing run yet
        it = iter(b)
        got_b = take(it, 3)
        state_b = b.state_dict()
        del it
        st = b.cache.stats()
        # The workers ran ahead of the 3 batches taken; what they ran
        # followed the plan (its hits over what ran, no fallback).
        assert st["fallbacks"] == 0 and st["timeouts"] == 0, st
        assert plan_hits(b, N + 40, N + 80) <= st["hits"] <= plan_hits(b, N + 40, 2 * N), st
    finally:
        b.cache.close()
    assert [len(x) for x in got_b] == [8, 16, 16]  # 40 is mid-batch in batches of 16: the first is short
    assert state_b["samples_done"] == 80 and state_b["position"] == N + 80 and state_b["batches_done"] == 5

    c = make(3)
    try:
        c.load_state_dict(state_b)
        assert c.resumed_at == N + 80
        got_c = take(c)
        st = c.cache.stats()
        assert st["fallbacks"] == 0 and st["timeouts"] == 0, st
        assert st["hits"] == plan_hits(c, N + 80, 2 * N), st
        assert st["hits"] + st["misses"] == N - 80
        end = c.state_dict()
        assert end["epoch"] == 1 and end["samples_done"] == N and end["position"] == 2 * N
    finally:
        c.cache.close()
    # 80 = 26 * 3 + 2: the first batch is the one sample left of batch 26.
    assert len(got_c[0]) == 1 and all(len(x) == 3 for x in got_c[1:-1]) and len(got_c[-1]) == 2
    chain = [i for batches in (got_a, got_b, got_c) for x in batches for i in x]
    assert chain == epoch1
    assert sorted(chain) == list(range(N))  # every sample of the epoch exactly once


def test_unbatched_loader_resumes_a_batched_state() -> None:
    """batch_size=None yields samples one by one: a state of batches of 8
    resumes there at its sample."""
    a = make(8, workers=0)
    try:
        it = iter(a)
        got = [i for b in take(it, 3) for i in b]
        state = a.state_dict()
        seq = np.array(a.cache.plan.seq, dtype=np.int64)
        del it
    finally:
        a.cache.close()
    b = make(None, workers=0)
    try:
        b.load_state_dict(state)
        rest = [int(y) for _, y in b]
        assert got + rest == seq[:N].tolist()
        assert b.cache.stats()["hits"] == plan_hits(b, 24, N)
    finally:
        b.cache.close()


def test_state_at_an_epochs_end_resumes_at_the_next_epoch() -> None:
    a = make(8, workers=0)
    try:
        take(a)
        state = a.state_dict()
        seq = np.array(a.cache.plan.seq, dtype=np.int64)
    finally:
        a.cache.close()
    assert state["epoch"] == 0 and state["samples_done"] == N and state["position"] == N
    b = make(16, workers=0)
    try:
        b.load_state_dict(state)
        assert b.resumed_at == N
        assert take(b) == []  # the rest of epoch 0: nothing
        assert [i for x in take(b) for i in x] == seq[N:].tolist()
    finally:
        b.cache.close()


# ---- refusals: each names the key ----


@pytest.fixture
def saved() -> tuple[dict, opt4torch.DataLoader]:
    """A state 5 batches of 8 into epoch 1, and a loader to resume it in."""
    a = make(8, workers=0)
    try:
        take(a)
        it = iter(a)
        take(it, 5)
        state = a.state_dict()
        del it
    finally:
        a.cache.close()
    b = make(8, workers=0)
    yield state, b
    b.cache.close()


def refused(loader: opt4torch.DataLoader, state: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        loader.load_state_dict(state)  # type: ignore[arg-type]
    # Nothing changed: the loader still starts at the beginning.
    assert loader.resumed_at is None and loader.state_dict()["position"] == 0


def test_negative_batches_done_is_refused(saved) -> None:
    state, b = saved
    refused(b, {**state, "batches_done": -1}, ValueError,
            r"state\['batches_done'\] is -1: a count of batches cannot be negative")


@pytest.mark.parametrize("samples", [N + 1, -1, 10**12])
def test_samples_past_the_epoch_are_refused(saved, samples: int) -> None:
    state, b = saved
    refused(b, {**state, "samples_done": samples, "position": N + samples}, ValueError,
            rf"state\['samples_done'\] is {samples}, outside epoch 1, which has {N} samples")


def test_position_that_disagrees_is_refused(saved) -> None:
    state, b = saved
    for position in (2 * N + 5, N + 41):
        refused(b, {**state, "position": position}, ValueError,
                rf"state\['position'\] is {position}, but 40 samples into epoch 1 is position {N + 40}")


def test_epoch_outside_the_plan_is_refused(saved) -> None:
    state, b = saved
    refused(b, {**state, "epoch": EPOCHS}, ValueError, r"state\['epoch'\] is 2: this loader's epochs are 0 to 1")


@pytest.mark.parametrize("key", ["epoch", "batches_done", "fingerprint", "epochs", "samples_done", "position",
                                 "items", "layout", "rank", "batch_size"])
def test_missing_key_is_named(saved, key: str) -> None:
    state, b = saved
    cut = {k: v for k, v in state.items() if k != key}
    refused(b, cut, ValueError, rf"the state has no '{key}': it is not \(all of\) a state_dict\(\)")


@pytest.mark.parametrize(("key", "value"), [("samples_done", "40"), ("epoch", 1.0), ("batches_done", True),
                                            ("fingerprint", None), ("position", 240.5), ("batch_size", "8")])
def test_wrong_type_is_named(saved, key: str, value: object) -> None:
    state, b = saved
    refused(b, {**state, key: value}, TypeError, rf"state\['{key}'\] must be an integer, got ")


def test_not_a_dict_is_refused(saved) -> None:
    _, b = saved
    refused(b, [("epoch", 1)], TypeError, "load_state_dict takes the dict state_dict\\(\\) returned, got list")


def test_state_of_another_dataset_length_is_refused() -> None:
    """The same indices in the same order, over a dataset of another length:
    the sequence (and its fingerprint) is the same, the data is not."""
    order = list(range(40))
    a = opt4torch.DataLoader(Checked(40), batch_size=4, sampler=order, cache_items=10, epochs=2)
    b = opt4torch.DataLoader(Checked(80), batch_size=4, sampler=order, cache_items=10, epochs=2)
    try:
        assert a.cache.plan.fingerprint == b.cache.plan.fingerprint
        take(a)
        refused(b, a.state_dict(), ValueError, r"state\['items'\] is 40: the state was saved by a loader over a "
                                               "dataset of 40 items, and this loader's dataset has 80")
    finally:
        a.cache.close()
        b.cache.close()


def test_state_of_other_epochs_is_refused(saved) -> None:
    """A 2-epoch state in a loader planned for 1 epoch. (One planned for 3,
    a run extended, resumes it: see test_a_state_of_fewer_epochs_resumes.)"""
    state, _ = saved
    c = opt4torch.DataLoader(Checked(N), batch_size=8, shuffle=True, seed=SEED, cache_items=CAPACITY, epochs=1)
    try:
        refused(c, state, ValueError, r"state\['epochs'\] is 2 but this loader was planned for 1 epochs: "
                                      r"build it with epochs=2 \(or more\)")
    finally:
        c.cache.close()


def test_another_plan_is_refused(saved) -> None:
    state, b = saved
    refused(b, {**state, "fingerprint": state["fingerprint"] ^ 1}, ValueError,
            r"another plan \(state\['fingerprint'\] differs: sampler, seed")


def test_drop_last_with_another_batch_size_is_refused_saying_why() -> None:
    """drop_last=True: batches of 8 keep all 200 samples of an epoch,
    batches of 16 drop the last 8: another sequence, so the next sample is
    not the same one."""
    a = make(8, workers=0, drop_last=True)
    b = make(16, workers=0, drop_last=True)
    try:
        it = iter(a)
        take(it, 5)
        state = a.state_dict()
        del it
        refused(b, state, ValueError, r"drop_last=True drops another tail of each epoch with batch_size=8 \(saved\) "
                                      r"than with 16 \(here\).*resume with batch_size=8")
    finally:
        a.cache.close()
        b.cache.close()


class Split(torch.utils.data.Sampler):
    """Indices 0..19 over two epochs, the first ``first`` of them in epoch 0."""

    def __init__(self, first: int) -> None:
        self.first, self.epoch = first, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.first if self.epoch == 0 else 20 - self.first

    def __iter__(self):
        return iter(range(self.first) if self.epoch == 0 else range(self.first, 20))


def test_same_sequence_split_otherwise_into_epochs_is_refused() -> None:
    """Two samplers whose epochs concatenate to the same sequence: the
    fingerprint agrees, the sample after 2 of epoch 1 does not (12 or 17)."""
    a = opt4torch.DataLoader(Checked(20), batch_size=2, sampler=Split(10), cache_items=5, epochs=2)
    b = opt4torch.DataLoader(Checked(20), batch_size=2, sampler=Split(15), cache_items=5, epochs=2)
    try:
        assert a.cache.plan.fingerprint == b.cache.plan.fingerprint
        take(a)
        it = iter(a)
        assert take(it, 1) == [[10, 11]]
        state = a.state_dict()
        del it
        refused(b, state, ValueError, r"state\['layout'\] differs: the same sequence was split otherwise into "
                                      "epochs")
    finally:
        a.cache.close()
        b.cache.close()


def test_state_without_positions_resumes_by_batch_with_a_warning(saved) -> None:
    """A state saved before states recorded positions (the four old keys):
    taken as this loader's batches, and said so."""
    state, b = saved
    old = {k: state[k] for k in ("epoch", "batches_done", "fingerprint", "epochs")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b.load_state_dict(old)
    assert any("has no 'samples_done'" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert b.resumed_at == N + 40
    with pytest.raises(ValueError, match=r"state\['batches_done'\] is 26, past the end of epoch 1 \(25 batches\)"):
        b.load_state_dict({**old, "batches_done": 26})


# ---- a drawn seed, and a run extended: each step in a process of its own ----


def run_step(tmp_path, *args: str) -> dict:
    """resume_run.py in a new process (fork workers of its own)."""
    import json
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    out = tmp_path / f"{args[0]}-{len(list(tmp_path.iterdir()))}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, os.path.join(here, "resume_run.py"), args[0], str(tmp_path / "state.pt"),
                        str(out), *args[1:]], capture_output=True, text=True, timeout=150, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("epochs", [3, 4], ids=["same run", "extended by an epoch"])
def test_a_drawn_seed_resumes_in_a_new_process(tmp_path, epochs: int) -> None:
    """shuffle=True without seed=: the saving process draws one seed, the
    resuming process another. The state names the first; the new loader
    plans again with it and reads on from the saved sample, in the order
    the saved run would have read (checked against a loader built here
    with that seed). Built for 4 epochs, it resumes the 3-epoch state and
    reads the extra epoch too. Its hits are the plan's from the resume on."""
    n, batch = 120, 8
    saved = run_step(tmp_path, "save", "3", "5")
    state = saved["state"]
    assert _is_seed(saved["seed"]) and state["seed"] == saved["seed"] == saved["seed_built"]
    assert state["epochs"] == 3 and state["epoch"] == 1 and state["samples_done"] == 5 * batch
    resumed = run_step(tmp_path, "resume", str(epochs))
    assert resumed["seed_built"] != saved["seed"]  # the new process drew another seed...
    assert resumed["seed"] == saved["seed"]  # ...and planned again with the state's
    assert resumed["resumed_at"] == n + 5 * batch
    # Saved then resumed: the run's order exactly, each sample once per epoch.
    assert saved["seq"] == resumed["seq"][:3 * n]
    assert saved["got"] + resumed["got"] == resumed["seq"]
    assert len(resumed["seq"]) == epochs * n
    assert all(sorted(resumed["seq"][e * n:(e + 1) * n]) == list(range(n)) for e in range(epochs))
    reference = opt4torch.DataLoader(Checked(n), batch_size=batch, shuffle=True, seed=saved["seed"], cache_items=40,
                                     epochs=epochs)
    try:
        assert np.asarray(reference.cache.plan.seq).tolist() == resumed["seq"]
    finally:
        reference.cache.close()
    st = resumed["stats"]
    kinds = np.asarray(resumed["kinds"])
    assert st["fallbacks"] == 0 and st["timeouts"] == 0, st
    assert st["hits"] == int(np.count_nonzero(kinds[n + 5 * batch:] == opt4torch.HIT)), st
    assert st["hits"] + st["misses"] == epochs * n - (n + 5 * batch)


def _is_seed(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def test_a_state_of_fewer_epochs_resumes(saved) -> None:
    """A run extended: a loader of 3 epochs resumes the 2-epoch state (its
    first 2 epochs are the state's) and reads on into the third."""
    state, _ = saved
    longer = opt4torch.DataLoader(Checked(N), batch_size=8, shuffle=True, seed=SEED, cache_items=CAPACITY, epochs=3)
    try:
        longer.load_state_dict(state)
        assert longer.resumed_at == N + 40
        seq = np.asarray(longer.cache.plan.seq).tolist()
        assert [i for x in take(longer) for i in x] == seq[N + 40:2 * N]
        assert [i for x in take(longer) for i in x] == seq[2 * N:]
        st = longer.cache.stats()
        assert st["hits"] == plan_hits(longer, N + 40, 3 * N) and st["fallbacks"] == 0, st
        assert longer.state_dict()["epochs"] == 3
    finally:
        longer.cache.close()


def test_a_given_seed_that_differs_is_named(saved) -> None:
    """seed= given (not drawn): the loader keeps it and says which to use."""
    state, _ = saved
    other = opt4torch.DataLoader(Checked(N), batch_size=8, shuffle=True, seed=SEED + 1, cache_items=CAPACITY,
                                 epochs=EPOCHS)
    try:
        assert other.seed == SEED + 1 and state["seed"] == SEED
        refused(other, state, ValueError, rf"state\['seed'\] is {SEED} and this loader's seed is {SEED + 1}: build "
                                          rf"it with seed={SEED}")
    finally:
        other.cache.close()


def test_a_drawn_seed_refused_after_replanning_leaves_the_loader_as_it_was(saved) -> None:
    """A state with another drawn seed but a key at fault: refused, and the
    loader keeps its own seed and pool."""
    state, _ = saved
    drawn = opt4torch.DataLoader(Checked(N), batch_size=8, shuffle=True, cache_items=CAPACITY, epochs=EPOCHS)
    try:
        seed, name = drawn.seed, drawn.cache.name
        assert _is_seed(seed) and seed != SEED
        refused(drawn, {**state, "position": state["position"] + 1}, ValueError, r"state\['position'\] is")
        assert drawn.seed == seed and drawn.cache.name == name
        drawn.load_state_dict(state)  # the state itself resumes: planned again with its seed
        assert drawn.seed == SEED and drawn.cache.name != name and drawn.resumed_at == N + 40
    finally:
        drawn.cache.close()
