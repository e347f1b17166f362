"""opt4torch.DataLoader(..., cluster=True) under torchrun: four ranks, each
a node of its own (OPT4TORCH_NODE=rank) with its own pool and two fork
workers, three epochs of DistributedSampler shuffle over items of 64-2,063
bytes, a quarter of the dataset's bytes a node (cluster_loader_run.py); and two
nodes of two ranks each, or one node of four, whose ranks share its pool.

Every sample is the source's. Each node reads from storage exactly what the
cluster plan says for it (reads and bytes), its hits are the plan's, split
into local and peer hits as the plan splits them, with no fallback; with
the storage prefetcher on as well. A rank that leaves costs the others
storage reads, never a wrong sample, and they finish; a rank killed makes
torchrun stop the job, within the timeout."""

from __future__ import annotations

import json
import os
import time

import pytest

import opt4torch
from conftest import torchrun

HERE = os.path.dirname(__file__)
WORLD = 4

pytestmark = pytest.mark.timeout(300)


def run(tmp_path, *args: str, node_env: str | None = "rank", ok: bool = True) -> tuple[list[dict | None], str]:
    out = tmp_path / "rank"
    r = torchrun(os.path.join(HERE, "cluster_loader_run.py"), WORLD, "--out", str(out), *args, node_env=node_env,
                 timeout=240)
    if ok:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    got = []
    for k in range(WORLD):
        path = tmp_path / f"rank.{k}.json"
        got.append(json.loads(path.read_text()) if path.exists() else None)
    return got, r.stderr


@pytest.mark.parametrize("prefetch", [False, True])
def test_every_node_reads_what_the_plan_says(tmp_path, prefetch: bool) -> None:
    ranks, _ = run(tmp_path, *(["--prefetch"] if prefetch else []))
    assert all(r is not None for r in ranks)
    plan_reads = 0
    for r in ranks:
        st, plan = r["stats"], r["node_stats"]
        assert r["wrong"] == 0 and r["samples"] == 3 * 600 // WORLD
        assert st["cluster_errors"] == [] and r["thread_error"] is None
        assert r["storage_reads"] == plan["storage_reads"] == st["plan_storage_reads"]
        assert r["storage_bytes"] == st["plan_storage_bytes"]
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0
        assert (st["local_hits"], st["peer_hits"]) == (plan["local_hits"], plan["peer_hits"])
        assert st["peer_hits"] > 0 and st["peer_bytes_sent"] > 0 and st["peer_bytes_received"] > 0
        assert (st["peer_items_sent"], st["peer_items_received"]) == (plan["peer_items_sent"],
                                                                      plan["peer_items_received"])
        plan_reads += plan["storage_reads"]
        assert r["plans_alive"] == 0  # each rank planned (a node of its own), and let the plan go
    # The nodes' storage reads add up to the cluster plan's: fewer than the
    # accesses less the hits any one node could make alone.
    assert sum(r["storage_reads"] for r in ranks) == plan_reads < ranks[0]["accesses"]
    # All of it with windows in flight: a turn's collective issued while the
    # turn before stored its items (the workers here outrun the transfer thread).
    early = [r["begun_early"] for r in ranks]
    print("turns begun early, by node:", early)
    assert sum(early) > 0, early


def test_the_dataset_is_read_once_when_the_nodes_hold_it(tmp_path) -> None:
    """35 % of the dataset's bytes a node holds all of it in the four pools,
    codec margins and pages included, and with windows of one step no peer
    read comes late: the plan reads every item from storage once, and so
    does the run, summed over the nodes (600 reads, the dataset's bytes)."""
    ranks, _ = run(tmp_path, "--fraction", "0.35", "--window", "1")
    assert all(r["wrong"] == 0 and r["stats"]["fallbacks"] == 0 for r in ranks)
    assert sum(r["node_stats"]["storage_reads"] for r in ranks) == 600 and ranks[0]["late"] == 0
    assert sum(r["storage_reads"] for r in ranks) == 600
    assert sum(r["storage_bytes"] for r in ranks) == sum(64 + (x * 7919) % 2000 for x in range(600))


def test_workers_forked_every_epoch_beside_the_transfer_thread(tmp_path) -> None:
    """persistent_workers=False: each epoch forks two workers a rank while
    the node's transfer thread runs. Its calls of the dataset are gated
    (_forksafe.ForkGate), so every fork finds it outside them (no park
    timeout), and the run is as exact as with persistent workers."""
    ranks, _ = run(tmp_path, "--no-persistent", "--prefetch")
    for r in ranks:
        st, plan = r["stats"], r["node_stats"]
        assert r["wrong"] == 0 and r["samples"] == 3 * 600 // WORLD
        assert st["cluster_errors"] == [] and r["thread_error"] is None
        assert r["storage_reads"] == plan["storage_reads"] and r["storage_bytes"] == st["plan_storage_bytes"]
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0
        assert (st["local_hits"], st["peer_hits"]) == (plan["local_hits"], plan["peer_hits"])
        assert r["parks"] >= 3 * 2 and r["park_timeouts"] == 0  # two workers forked in each of 3 epochs


def test_a_node_that_leaves_costs_the_others_storage_reads(tmp_path) -> None:
    ranks, _ = run(tmp_path, "--vanish-rank", "3", "--vanish-batch", "10", "--timeout", "20")
    assert ranks[3] is None
    for r in ranks[:3]:
        st, plan = r["stats"], r["node_stats"]
        assert r["wrong"] == 0 and r["samples"] == 3 * 600 // WORLD
        assert st["cluster_errors"]  # its collectives failed from some window on
        assert r["storage_reads"] > plan["storage_reads"]  # what it would have received
        assert st["peer_hits"] <= plan["peer_hits"]


def test_a_killed_rank_stops_the_job_in_time(tmp_path) -> None:
    t0 = time.monotonic()
    ranks, err = run(tmp_path, "--vanish-rank", "2", "--vanish-batch", "10", "--kill", "--timeout", "20", ok=False)
    assert time.monotonic() - t0 < 200
    assert ranks[2] is None
    assert all(r is None or r["wrong"] == 0 for r in ranks)
    assert "SIGKILL" in err or "Signals.SIGKILL" in err or "exitcode" in err


@pytest.mark.parametrize("node_env,alone", [("rank//2", "no"), (None, "auto"), ("rank//2", "yes")])
def test_the_ranks_of_a_node_share_its_pool(tmp_path, node_env: str | None, alone: str) -> None:
    """Two nodes of two ranks (rank//2), or all four ranks on one node
    (unset: torchrun's GROUP_RANK, 0 here): each node's first rank makes the
    pool and runs the transfers, the others read from it. One node plans
    alone where the cluster could save nothing (``cluster_alone=None``);
    two nodes told to plan alone (``True``) read what each node's own plan
    says, with no transfer at all."""
    ranks, _ = run(tmp_path, "--alone", alone, node_env=node_env)
    assert all(r is not None for r in ranks)
    nodes: dict[int, list[dict]] = {}
    for r in ranks:
        assert r["wrong"] == 0 and r["samples"] == 3 * 600 // WORLD
        assert r["thread_error"] is None
        nodes.setdefault(r["node"], []).append(r)
    assert sorted(nodes) == ([0, 1] if node_env else [0])
    for node, members in nodes.items():
        first, *others = sorted(members, key=lambda r: r["rank"])
        st, plan = first["stats"], first["node_stats"]
        assert st["cluster_leader"] == first["rank"] and st["cluster_errors"] == []
        # The node's ranks together read from storage what the plan says the node reads.
        assert sum(r["storage_reads"] for r in members) == plan["storage_reads"] == st["plan_storage_reads"]
        assert sum(r["storage_bytes"] for r in members) == st["plan_storage_bytes"]
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0
        assert (st["local_hits"], st["peer_hits"]) == (plan["local_hits"], plan["peer_hits"])
        assert (st["peer_items_sent"], st["peer_items_received"]) == (plan["peer_items_sent"],
                                                                      plan["peer_items_received"])
        # Only the node's first rank planned; the others mapped the same node plan and pool plan.
        # Every rank keeps the plan's figures alone (loader.cluster_plan), not its global arrays.
        assert (first["plans_made"], first["plan_type"]) == (1, "ClusterFigures")
        # ... and once its loader is built it holds no cluster plan: its transfer thread has its node's
        # transfers (NodeTransfers), the plan itself was let go.
        assert [r["plans_alive"] for r in members] == [0] * len(members)
        for r in others:
            assert (r["plans_made"], r["plan_type"]) == (0, "ClusterFigures")
            assert r["node_plan_digest"] == first["node_plan_digest"]
            assert r["pool_plan_fingerprint"] == first["pool_plan_fingerprint"]
            assert r["node_stats"] == plan and r["accesses"] == first["accesses"]
        for r in others:  # the pool's counters are the node's; the transfers are counted by its first rank
            assert r["stats"]["hits"] == st["hits"] and r["stats"]["cluster_leader"] == first["rank"]
            assert r["stats"]["peer_hits"] is None and r["stats"]["cluster_errors"] is None
            assert r["stats"]["plan_peer_hits"] == plan["peer_hits"]
    assert all(r["stats"]["plan_alone"] == (alone != "no") for r in ranks)
    if alone == "no":
        assert all(m[0]["stats"]["peer_hits"] > 0 for m in nodes.values())
    else:  # each node holds what it can alone: no peers, no transfers, no window
        for m in nodes.values():
            st = m[0]["stats"]
            assert st["peer_hits"] == st["peer_items_sent"] == st["peer_items_received"] == 0
            assert st["plan_peer_hits"] == 0 and m[0]["incoming"] == {}


def test_a_planning_rank_that_fails_stops_every_rank_with_its_error(tmp_path) -> None:
    """Two nodes of two ranks: only each node's first rank plans. Rank 0's
    planning fails: it raises its own error, and every other rank (its
    node's, which waits for its plan, and the other node's) stops at once
    with an error naming rank 0 and what it raised, instead of waiting."""
    ranks, _ = run(tmp_path, "--fail-planning-rank", "0", node_env="rank//2", ok=False)
    assert all(r is not None for r in ranks), ranks
    assert ranks[0]["error"] == "MemoryError: injected: no memory to plan"
    assert ranks[1]["error"] == ("RuntimeError: the cluster plan was not made: rank 0, this node's planning rank, "
                                 "failed with MemoryError: injected: no memory to plan")
    for r in ranks[2:]:
        assert r["error"].startswith("RuntimeError: the cluster plan was not made: rank 0, node 0's planning rank")
    assert [r["plans_made"] for r in ranks] == [0, 0, 1, 0]  # rank 2 planned node 1's; 1 and 3 never plan
    assert all(r["seconds"] < 20 for r in ranks), ranks  # not a wait for the 30 s timeout


def test_cluster_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="share_across_ranks"):
        opt4torch.DataLoader(list(range(10)), cluster=True, cache_items=4, share_across_ranks=True)
    with pytest.raises(ValueError, match="drop_last"):
        opt4torch.DataLoader(list(range(10)), cluster=True, cache_items=4, batch_size=3, drop_last=True)
    with pytest.raises(ValueError, match="cluster_window"):
        opt4torch.DataLoader(list(range(10)), cluster=True, cache_items=4, cluster_window=0)
    with pytest.raises(RuntimeError, match="torch.distributed"):
        opt4torch.DataLoader(list(range(10)), cluster=True, cache_items=4)


def test_node_numberings_that_differ_are_refused() -> None:
    """What a job's ranks say of OPT4TORCH_NODE (the torchrun case is in
    test_cluster_resume.py): one way on every rank, or an explicit id each
    machine gives its own; a value one rank cannot read is said on all."""
    from opt4torch.cluster import check_numbering

    none = [None] * 4
    check_numbering(["rank"] * 4, none)
    check_numbering([None] * 4, none)
    check_numbering(["0", "0", " 1", "1"], none)  # an id per machine
    check_numbering(["rank//2", "RANK // 2", "rank//2", "rank//2"], none)
    with pytest.raises(ValueError, match=r"OPT4TORCH_NODE is 'rank//2' on ranks \[0, 1\]; 'rank//4' on ranks "
                                         r"\[2, 3\]\. Set OPT4TORCH_NODE the same way on every rank"):
        check_numbering(["rank//2", "rank//2", "rank//4", "rank//4"], none)
    with pytest.raises(ValueError, match=r"'rank' on ranks \[0, 1, 2, 3, 4, 5, 6, 7, \.\.\.\] \(511 ranks\); "
                                         r"a node id given per machine on ranks \[511\]"):
        check_numbering(["rank"] * 511 + ["3"], [None] * 512)
    with pytest.raises(ValueError, match=r"^rank 2 cannot tell its node: bad \(nor can ranks \[3\]\)$"):
        check_numbering(["rank", "rank", "x", "y"], [None, None, "bad", "worse"])
