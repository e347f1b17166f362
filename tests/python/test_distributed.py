"""DistributedSampler under torchrun (gloo, 2 processes, CPU): each rank
planning its own shard, and the ranks of a node sharing one pool planned over
their interleaved sequences."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from datasets_for_tests import Checked
from torch.utils.data.distributed import DistributedSampler

import opt4torch
from opt4torch import _engine
from opt4torch.lab.launch import free_port, rank_errors
from opt4torch.lab.launch import torchrun as run_torchrun

HERE = os.path.dirname(__file__)


def torchrun(tmp_path, *args: str) -> list[dict]:
    out = tmp_path / "result.json"
    r = run_torchrun(os.path.join(HERE, "ddp_run.py"), 2, "--out", str(out), *args, timeout=150)
    assert r.returncode == 0, r.stdout[-2000:] + rank_errors(r.stderr) + r.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.fixture(autouse=True)
def no_leaked_pools():
    """The ranks run in processes of their own, which have all exited by
    teardown: a pool one of them left behind has a dead owner. A new pool
    with a live owner other than this process belongs to another job
    running at the same time (another test run on the machine), not to
    this test."""
    before = {p["name"] for p in _engine.pool_list()}
    yield
    left = {p["name"] for p in _engine.pool_list()
            if p["name"] not in before and (p["owner_pid"] == os.getpid() or not p["owner_alive"])}
    assert not left, f"pools left behind: {left}"


def test_each_rank_plans_its_shard(tmp_path) -> None:
    ranks = torchrun(tmp_path)
    for r in ranks:
        st = r["stats"]
        assert r["bad"] == 0
        assert st["fallbacks"] == 0 and st["timeouts"] == 0
        assert st["hits"] == st["plan_hits"] == r["plan_hits"]
        assert r["plan_accesses"] == 3 * 200  # its shard: 400 / 2 per epoch


def test_ranks_share_one_pool(tmp_path) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    # Then, in the same job, Parquet rows through one pool: page ranges of
    # 3 rows (max_rows_per_page) in row groups of 12.
    folder = tmp_path / "parquet"
    folder.mkdir()
    for k in range(2):
        ids = np.arange(k * 30, (k + 1) * 30)
        pq.write_table(pyarrow.table({"id": ids, "blob": [bytes([i % 251]) * (50 + i) for i in ids]}),
                       folder / f"p{k}.parquet", row_group_size=12, max_rows_per_page=3, write_page_index=True)
    ranks = torchrun(tmp_path, "--shared", "--parquet", str(folder))
    assert all(r["bad"] == 0 for r in ranks)
    assert ranks[0]["plan_accesses"] == ranks[1]["plan_accesses"] == 3 * 400  # both shards, interleaved
    pqr = [r["parquet"] for r in ranks]
    assert all(p["bad"] == 0 and p["order_bad"] == 0 and p["fallbacks"] == 0 == p["timeouts"] for p in pqr), pqr
    assert pqr[0]["accesses"] == pqr[1]["accesses"] == 2 * 60 and pqr[0]["units"] == 2 * 10, pqr  # both ranks' rows
    assert pqr[0]["hits"] == pqr[1]["hits"] == pqr[0]["plan_hits"] > 0, pqr  # one pool's counters
    assert pqr[0]["storage_bytes"] + pqr[1]["storage_bytes"] == pqr[0]["plan_miss_bytes"], pqr
    assert ranks[0]["plan_hits"] == ranks[1]["plan_hits"]  # one plan
    # One pool: each rank reads the counters of every rank's processes, taken
    # after both finished (the barrier), so they agree and cover the run.
    final = ranks[0]["stats"]
    assert final["timeouts"] == 0 and final["fallbacks"] == 0
    assert final["hits"] == ranks[0]["plan_hits"]
    assert final["hits"] + final["misses"] == 3 * 400


@pytest.mark.parametrize("shared", [False, True], ids=["own-pools", "shared-pool"])
def test_ranks_resume_mid_epoch(tmp_path, shared: bool) -> None:
    """Stop mid-epoch, save, resume in new loaders: the same samples in the
    same order, and from the resume position exactly the plan's hits (the
    pool warmed by local rank 0 when shared, before any rank reads)."""
    ranks = torchrun(tmp_path, "--resume-after", "5", *(["--shared"] if shared else []))
    for r in ranks:
        assert r["bad"] == 0 and r["order_ok"], r
        st = r["stats"]
        assert st["fallbacks"] == 0 and st["timeouts"] == 0, st
    if shared:
        # One plan, one pool: both ranks resumed at the node's earliest next
        # batch (rank 0's), and the pool's hits are the plan's from there.
        assert ranks[0]["resumed_at"] == ranks[1]["resumed_at"]
        assert ranks[0]["resumed_at"] == 400 + 5 * 2 * 16  # epoch 1, after 5 steps of both ranks
        assert ranks[0]["stats"]["hits"] == ranks[0]["plan_hits_after"] > 0
    else:
        for r in ranks:
            assert r["resumed_at"] == 200 + 5 * 16
            assert r["stats"]["hits"] == r["plan_hits_after"] > 0


def test_sharing_gains_over_separate_pools_of_the_same_total() -> None:
    """The plans alone: one pool of C over the interleaved sequence against
    W pools of C / W over each rank's shard (exact OPT counts). Per rank and
    epoch only about N / W**2 of its shard returns in its next shard, so the
    separate pools cannot hit more than about N / W per epoch in all, while
    the shared pool hits C: sharing gains exactly when C > N / W."""
    items, epochs, world, batch = 1000, 4, 2, 16
    shards = []
    for rank in range(world):
        s = DistributedSampler(range(items), num_replicas=world, rank=rank, seed=11)
        shards.append([opt4torch.capture(s, 1, start_epoch=e) for e in range(epochs)])
    merged = []
    for e in range(epochs):
        for step in range(0, len(shards[0][e]), batch):
            for r in range(world):
                merged.append(shards[r][e][step:step + batch])
    merged = np.concatenate(merged)

    def compare(cap: int) -> tuple[int, int]:
        separate = sum(opt4torch.plan(np.concatenate(shards[r]), cap // world, items=items).hits
                       for r in range(world))
        return separate, opt4torch.plan(merged, cap, items=items).hits

    separate, shared = compare(250)  # C = N / 4 < N / W
    assert shared == separate == 250 * (epochs - 1)
    separate, shared = compare(750)  # C = 3N / 4 > N / W
    assert shared == 750 * (epochs - 1)
    assert shared > 1.2 * separate


def test_a_state_one_rank_refuses_is_refused_on_every_rank(tmp_path) -> None:
    """load_state_dict is collective with a shared pool: when rank 1's state
    is bad (a negative batches_done), rank 1 names the key and rank 0 says
    rank 1 refused; neither waits for the other."""
    ranks = torchrun(tmp_path, "--resume-after", "5", "--shared", "--bad-state", "negative")
    assert len(ranks) == 2 and all(r["resumed_at"] is None for r in ranks), ranks
    assert "state['batches_done'] is -1" in ranks[1]["refused"], ranks
    assert ranks[0]["refused"].startswith("rank 1 of the node refused its state, so no rank resumes: "
                                          "state['batches_done'] is -1"), ranks


def test_ranks_sharing_a_pool_refuse_each_others_states(tmp_path) -> None:
    """One sequence for the node (the same fingerprint on both ranks), but
    each rank's own batches: a rank given the other's state refuses it."""
    ranks = torchrun(tmp_path, "--resume-after", "5", "--shared", "--bad-state", "swapped")
    assert len(ranks) == 2 and all(r["resumed_at"] is None for r in ranks), ranks
    assert "state['rank'] is 1 but this is rank 0" in ranks[0]["refused"], ranks
    assert "state['rank'] is 0 but this is rank 1" in ranks[1]["refused"], ranks


def one_rank(tmp_path, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` in a fresh interpreter after a one-rank gloo group and a
    loader shared across ranks (``loader``) trained one epoch (``state``)."""
    script = tmp_path / "one_rank.py"
    script.write_text(f"""
import gc, sys, weakref
import torch.distributed as dist
sys.path.insert(0, {HERE!r})
from datasets_for_tests import Checked
import opt4torch

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
loader = opt4torch.DataLoader(Checked(40), batch_size=4, shuffle=True, cache_items=10, epochs=1,
                              share_across_ranks=True, seed=3)
assert sum(len(y) for _, y in loader) == 40
state = loader.state_dict()
""" + body)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"})


def test_the_loader_does_not_keep_the_process_group_alive(tmp_path) -> None:
    """A loader shared across ranks holds its process group weakly. Held
    strongly, destroy_process_group left gloo's threads running until the
    loader was collected in the interpreter's finalization, where a gloo
    thread dropping a collective's tensors dies taking the GIL and the rank
    aborts (std::terminate: rank 1 of a torchrun test died of SIGABRT at
    exit, 6 times in 17 runs of a script that kept a reference, under load).
    Once the group is gone, a collective load_state_dict says so."""
    r = one_rank(tmp_path, """
group = weakref.ref(dist.group.WORLD)
dist.destroy_process_group()
gc.collect()
print("group alive after destroy:", group() is not None)
try:
    loader.load_state_dict(state)
except RuntimeError as exc:
    print("refused:", exc)
loader.cache.close()
""")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "group alive after destroy: False" in r.stdout, r.stdout
    assert "refused: load_state_dict with share_across_ranks=True is a collective call" in r.stdout, r.stdout


def test_a_refused_state_does_not_keep_the_process_group_alive(tmp_path) -> None:
    """The refusal load_state_dict raises holds no cycle through the frame
    that holds the group: with the collector off, the group dies with
    destroy_process_group. It kept the group alive until the collector ran,
    and a rank that refused its state died of SIGABRT at exit, as in the
    test above (rank 1 of test_a_state_one_rank_refuses_is_refused_on_every_rank,
    once in CI)."""
    r = one_rank(tmp_path, """
gc.collect()
gc.disable()
try:
    loader.load_state_dict({**state, "batches_done": -1})
except ValueError as exc:
    print("refused:", exc)
group = weakref.ref(dist.group.WORLD)
dist.destroy_process_group()
print("group alive after destroy:", group() is not None)
gc.enable()
loader.cache.close()
""")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused: state['batches_done'] is -1" in r.stdout, r.stdout
    assert "group alive after destroy: False" in r.stdout, r.stdout
