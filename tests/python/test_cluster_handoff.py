"""A node's part of a cluster plan, handed from the rank that planned it to
the node's other ranks through /dev/shm (distributed/handoff.py): what they
map is what the planner had, files that are not such a share are refused
naming the fact, and the files of a planner that died are swept. The
torchrun side (only a node's first rank plans) is in test_cluster_loader.py."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from opt4torch.distributed.handoff import read_share, remove_share, share_path, sweep_stale, write_share
from opt4torch.distributed.setup import share_of
from opt4torch.planning.cluster import cluster_plan

pytestmark = pytest.mark.timeout(60)


def small_plan(sized: bool):
    rng = np.random.default_rng(5)
    orders = [[rng.permutation(120)[r::4] for _ in range(3)] for r in range(4)]  # 4 ranks, 3 epochs
    if sized:
        sizes = rng.integers(100, 3000, size=120)
        return cluster_plan(orders, [0, 0, 1, 1], cache_bytes=40_000, item_sizes=sizes, batch_size=5, window=2)
    return cluster_plan(orders, [0, 0, 1, 1], 30, batch_size=5, window=2)


@pytest.mark.parametrize("sized", [False, True])
def test_a_share_maps_back_to_what_the_planner_had(sized: bool) -> None:
    cp = small_plan(sized)
    for node in range(cp.n_nodes):
        mine = share_of(cp, node)
        path = share_path("t0test", node)
        try:
            write_share(path, mine)
            got = read_share(path)
        finally:
            remove_share(path)
        assert not os.path.exists(path) and not os.path.exists(path + ".plan")
        for key in ("seq", "op", "role", "source", "forward", "window", "position"):
            a, b = getattr(mine.node_plan, key), getattr(got.node_plan, key)
            assert a.dtype == b.dtype and np.array_equal(a, b), key
            assert not b.flags.writeable  # mapped read-only
        assert got.node_plan.node == node and np.array_equal(got.ranks, mine.ranks)
        assert np.array_equal(got.ranks, cp.timeline.rank[mine.node_plan.position])
        assert got.plan.fingerprint == mine.plan.fingerprint and np.array_equal(got.plan.kinds, mine.plan.kinds)
        assert got.figures.checksum == cp.checksum and got.figures.node_stats() == cp.node_stats()
        assert got.figures.stats() == cp.stats()
        assert type(got.figures).__name__ == "ClusterFigures"


def test_a_file_that_is_not_a_share_is_refused() -> None:
    cp = small_plan(False)
    path = share_path("t1test", 0)
    try:
        write_share(path, share_of(cp, 0))
        with open(path, "r+b") as f:  # the magic damaged
            f.write(b"NOTAPLAN")
        with pytest.raises(ValueError, match="not a node plan shared by its node's first rank.*magic"):
            read_share(path)
        remove_share(path)
        write_share(path, share_of(cp, 0))
        os.truncate(path, os.path.getsize(path) // 2)  # cut short
        with pytest.raises(ValueError, match="not a node plan shared by its node's first rank"):
            read_share(path)
        with pytest.raises(FileExistsError):  # never over another's file
            write_share(path, share_of(cp, 0))
    finally:
        remove_share(path)


def test_the_shares_of_a_dead_planner_are_swept() -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = share_path("t2test", 3).replace(f"-{os.getpid()}-", f"-{int(gone.stdout)}-")
    live = share_path("t2test", 4)
    try:
        for p in (dead, dead + ".plan", live):
            with open(p, "wb") as f:
                f.write(b"x")
        removed = sweep_stale()
        assert os.path.basename(dead) in removed and os.path.basename(dead) + ".plan" in removed
        assert not os.path.exists(dead) and os.path.exists(live)
    finally:
        for p in (dead, dead + ".plan", live):
            if os.path.exists(p):
                os.unlink(p)
