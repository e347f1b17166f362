"""A cluster plan under torchrun: every rank plans the whole job from its own
sampler, and the ranks agree (the same checksum), or all stop with an error
that names what differs. Four ranks on this machine, each a node of its own
(OPT4TORCH_NODE=rank), or all on one node."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from torch.utils.data.distributed import DistributedSampler

from conftest import torchrun as run_torchrun
from datasets_for_tests import Checked

import opt4torch
from opt4torch.capture import capture_ranks
from opt4torch.cluster import InvalidInputError, node_of_this_rank

HERE = os.path.dirname(__file__)
WORLD = 4


def torchrun(tmp_path, *args: str, node_env: str | None = "rank") -> list[dict]:
    out = tmp_path / "rank"
    r = run_torchrun(os.path.join(HERE, "cluster_run.py"), WORLD, "--out", str(out), *args, node_env=node_env,
                     timeout=140)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    return [json.loads((tmp_path / f"rank.{k}.json").read_text()) for k in range(WORLD)]


def expected_plan(items: int = 400, capacity: int = 25, epochs: int = 3, batch: int = 8,
                  node_of_rank: list[int] | None = None) -> opt4torch.ClusterPlan:
    sampler = DistributedSampler(Checked(items), num_replicas=WORLD, rank=0, seed=11)
    return opt4torch.cluster_plan(capture_ranks(sampler, epochs), node_of_rank, capacity, batch_size=batch,
                                  item_sizes=np.full(items, 1000))


def test_every_rank_plans_the_same_cluster(tmp_path) -> None:
    ranks = torchrun(tmp_path)
    assert all("error" not in r for r in ranks), ranks
    assert [r["node"] for r in ranks] == [0, 1, 2, 3]
    assert {r["checksum"] for r in ranks} == {ranks[0]["checksum"]}
    # The plan every rank made is the one this process makes from the same
    # sampler arguments: nothing in it depends on the process that planned.
    want = expected_plan()
    assert ranks[0]["checksum"] == want.checksum and ranks[0]["nodes"] == WORLD
    assert all(r["node_stats"] == want.node_stats() for r in ranks)
    # Four nodes of 25 items over 400: the cluster holds 100, and every node
    # reads from storage only what the plan says.
    st = want.node_stats()
    assert sum(s["local_hits"] + s["peer_hits"] for s in st) == want.hits > 0
    assert all(s["accesses"] == want.accesses // WORLD for s in st)


def test_ranks_on_one_node(tmp_path) -> None:
    ranks = torchrun(tmp_path, node_env=None)  # torchrun's GROUP_RANK: every rank on node 0
    assert all("error" not in r for r in ranks), ranks
    assert [r["node"] for r in ranks] == [0] * WORLD and ranks[0]["nodes"] == 1
    want = expected_plan(node_of_rank=[0] * WORLD)
    assert {r["checksum"] for r in ranks} == {want.checksum}
    assert want.node_stats()[0]["peer_hits"] == 0


def test_a_rank_with_another_seed_stops_every_rank(tmp_path) -> None:
    ranks = torchrun(tmp_path, "--odd-seed-rank", "2")
    for r in ranks:
        assert "ValueError" in r.get("error", ""), r
        assert "disagree on seed" in r["error"] and "rank 2: 12" in r["error"] and "rank 0: 11" in r["error"]


def test_plans_that_differ_are_caught_by_the_checksum(tmp_path) -> None:
    ranks = torchrun(tmp_path, "--odd-sizes-rank", "3")
    for r in ranks:
        assert "planned different clusters" in r.get("error", ""), r
        assert "ranks [3]" in r["error"] and "ranks [0, 1, 2]" in r["error"]


def test_node_of_this_rank() -> None:
    assert node_of_this_rank(5, {"OPT4TORCH_NODE": "rank"}) == 5
    assert node_of_this_rank(5, {"OPT4TORCH_NODE": " 2 "}) == 2
    assert node_of_this_rank(5, {"GROUP_RANK": "3"}) == 3
    assert node_of_this_rank(5, {}) == 0
    assert [node_of_this_rank(r, {"OPT4TORCH_NODE": "rank//2"}) for r in range(5)] == [0, 0, 1, 1, 2]
    assert node_of_this_rank(7, {"OPT4TORCH_NODE": "RANK // 4"}) == 1
    for bad in ("-1", "node1", "", "rank//0", "rank//", "rank/2", "rank//-2"):
        with pytest.raises(InvalidInputError, match="OPT4TORCH_NODE"):
            node_of_this_rank(0, {"OPT4TORCH_NODE": bad})


def test_nodes_that_disagree_on_their_numbering_are_refused() -> None:
    """Issue 36: two machines whose ranks number nodes differently (here
    rank 2 left OPT4TORCH_NODE unset, so it took GROUP_RANK 0 on machine b)
    would share a pool that only one of them has."""
    from opt4torch.cluster import check_nodes, this_host

    a, b = "a/boot-1", "b/boot-2"
    check_nodes([0, 0, 1, 1], [a, a, b, b])  # one node a machine
    check_nodes([0, 1, 2, 3], [a, a, a, a])  # several nodes on one machine: each its own pool
    with pytest.raises(ValueError, match=r"ranks 0 and 2 both say they are node 0, but run on different machines "
                                         r"\(a and b\).*set OPT4TORCH_NODE the same way on every rank"):
        check_nodes([0, 1, 0, 3], [a, a, b, b])
    host = this_host()
    assert host.split("/")[0] and host == this_host()  # a name, the same each time


def test_job_plan_needs_torch_distributed() -> None:
    from opt4torch.cluster import job_plan

    sampler = DistributedSampler(Checked(16), num_replicas=1, rank=0)
    with pytest.raises(RuntimeError, match="init_process_group"):
        job_plan(sampler, 1, batch_size=4, capacity_per_node=4)
