"""The simulator's cluster mode (opt4torch.lab.cluster, `opt4torch cluster`):
exact bounds, the closed forms of docs/cluster.md against the simulation,
the network load against the plan's transfers, and the command."""

from __future__ import annotations

import csv
import io
import json
import subprocess

import numpy as np
import pytest
from conftest import script

from opt4torch.cli import main
from opt4torch.cluster import cluster_plan
from opt4torch.lab.cluster import (
    FIELDS,
    ClusterSetup,
    expected,
    link_load,
    per_node_capacity,
    rank_orders,
    simulate_cluster,
)

pytestmark = pytest.mark.timeout(180)


def rows_by_policy(rows: list[dict]) -> dict[str, dict]:
    return {r["policy"]: r for r in rows}


@pytest.mark.parametrize("nodes", [4, 16])
def test_aggregate_holding_the_dataset(nodes: int) -> None:
    """A quarter of the dataset a node: from 4 nodes up the cluster holds it
    all, reads each item from storage once, and its local and peer shares
    are the closed forms'; per-node OPT is held to its shard's compulsory
    misses."""
    setup = ClusterSetup(nodes=nodes, items=4096, epochs=3, batch_size=8, item_bytes=1000, seed=2)
    r = rows_by_policy(simulate_cluster(setup, "25%"))
    T = r["no cache"]["accesses"]
    assert T == 3 * 4096 and r["no cache"]["storage_bytes"] == T * 1000
    assert r["cluster OPT"]["storage_reads"] == 4096  # the dataset, once
    assert r["cluster OPT"]["storage_bytes_after_first_epoch"] == 0
    assert r["cluster OPT"]["storage_reads"] < r["per-node OPT"]["storage_reads"] < T
    model = expected(nodes, 3, r["cluster OPT"]["aggregate_fraction"])
    assert r["cluster OPT"]["hit_rate"] == pytest.approx(model["cluster_hit_rate"], abs=1e-12)
    assert r["cluster OPT"]["local_hit_rate"] == pytest.approx(model["cluster_local_hit_rate"], abs=0.03)
    assert r["cluster OPT"]["peer_hit_rate"] == pytest.approx(model["cluster_peer_hit_rate"], abs=0.03)
    assert r["per-node OPT"]["hit_rate"] == pytest.approx(model["per_node_hit_rate"], abs=0.03)
    # Per-node OPT can miss no less than each node's distinct items (exact).
    orders = rank_orders(setup)
    distinct = sum(np.unique(np.concatenate(o)).size for o in orders)
    assert r["per-node OPT"]["storage_reads"] >= distinct


def test_late_hits_grow_with_the_window() -> None:
    """The share of the plan's hits that windows of transfers make late:
    none outside the cluster rows, the windowed plan's own count, and more
    as the window nears an epoch (16 steps here)."""
    late = []
    for window in (1, 4, 16):
        setup = ClusterSetup(nodes=4, items=512, epochs=3, batch_size=8, item_bytes=1, seed=6, window=window)
        r = rows_by_policy(simulate_cluster(setup, "25%"))
        assert r["no cache"]["late_hit_rate"] == r["per-node OPT"]["late_hit_rate"] == 0.0
        cp = cluster_plan(rank_orders(setup), None, 128, items=512, batch_size=8, window=window)
        assert r["cluster OPT"]["late_hit_rate"] == cp.late / cp.accesses
        late.append(cp.late)
    assert late[0] < late[1] < late[2]


def test_aggregate_below_the_dataset() -> None:
    setup = ClusterSetup(nodes=8, items=4096, epochs=3, batch_size=8, item_bytes=1, seed=4)
    r = rows_by_policy(simulate_cluster(setup, "agg50%"))
    assert per_node_capacity("agg50%", 4096, 8)[0] == 256
    model = expected(8, 3, r["cluster OPT"]["aggregate_fraction"])
    assert r["cluster OPT"]["hit_rate"] == pytest.approx(model["cluster_hit_rate"], abs=0.02)
    assert r["cluster OPT"]["hit_rate"] > r["per-node OPT"]["hit_rate"]
    assert r["cluster OPT"]["local_hit_rate"] + r["cluster OPT"]["peer_hit_rate"] == pytest.approx(
        r["cluster OPT"]["hit_rate"])


def test_sizes_and_caches_in_bytes() -> None:
    """Lognormal sizes, caches in bytes: the same order of the three, byte
    counts that are sums of the sizes read, and the cluster reads about the
    dataset once when its nodes hold it with room to spare."""
    from opt4torch.lab.cluster import item_sizes

    setup = ClusterSetup(nodes=4, items=3000, epochs=3, batch_size=8, item_bytes=5000, size_sigma=0.5, seed=1)
    sizes = item_sizes(setup)
    assert sizes is not None and sizes.shape == (3000,) and abs(sizes.mean() / 5000 - 1) < 0.05
    r = rows_by_policy(simulate_cluster(setup, "40%"))
    orders = rank_orders(setup)
    everything = int(sum(sizes[np.concatenate(o)].sum() for o in orders))
    assert r["no cache"]["storage_bytes"] == everything
    assert r["cluster OPT"]["storage_bytes"] < r["per-node OPT"]["storage_bytes"] < everything
    assert r["cluster OPT"]["capacity"] == round(0.4 * int(sizes.sum()))
    assert r["cluster OPT"]["storage_bytes"] <= int(sizes.sum()) * 1.01 + r["cluster OPT"]["unplaced_hits"] * sizes.max()
    assert r["cluster OPT"]["unplaced_hits"] <= 0.001 * r["cluster OPT"]["accesses"]


def test_command_in_bytes(capsys) -> None:
    assert main(["cluster", "--nodes", "2", "--items", "500", "--epochs", "2", "--size-sigma", "0.4",
                 "--item-bytes", "1000", "--format", "json", "--quiet"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["size_sigma"] for r in rows} == {0.4} and all("bytes a node" not in r["config"] for r in rows)
    assert rows[0]["storage_bytes"] != rows[0]["accesses"] * 1000  # sizes differ


@pytest.mark.parametrize("items, nodes, ranks", [(1000, 4, 1), (1001, 3, 2), (50, 8, 1)])
def test_rank_orders_are_distributed_samplers(items: int, nodes: int, ranks: int) -> None:
    from opt4torch.lab import traces

    setup = ClusterSetup(nodes=nodes, items=items, epochs=3, ranks_per_node=ranks, seed=9)
    orders = rank_orders(setup)
    for r in range(setup.world):
        want = traces.distributed(items, 3, world=setup.world, rank=r, seed=9)
        assert np.array_equal(np.concatenate(orders[r]), want)


def test_link_load_adds_up_to_the_transfers() -> None:
    setup = ClusterSetup(nodes=4, items=1000, epochs=2, batch_size=5, item_bytes=7)
    orders = rank_orders(setup)
    cp = cluster_plan(orders, None, 250, batch_size=5, item_bytes=7)
    load = link_load(cp, window=4)
    steps = cp.timeline.steps
    assert load["ingress_mean_per_step"] * steps * 4 == pytest.approx(cp.peer_bytes)
    assert load["ingress_max_per_step"] >= load["ingress_mean_per_step"]
    # The busiest pair in a window of 4 steps carries at most 4 steps of the
    # busiest node's ingress, and at least a pair's share of the mean.
    assert load["pair_max_per_window"] <= 4 * load["ingress_max_per_step"]
    assert load["pair_max_per_window"] >= 4 * load["ingress_mean_per_step"] / 3 * 0.99


def test_per_node_capacity_specs() -> None:
    assert per_node_capacity("25%", 1000, 4) == (250, "25% of data a node")
    assert per_node_capacity("agg50%", 1000, 4)[0] == 125
    assert per_node_capacity("7", 1000, 4)[0] == 7
    with pytest.raises(ValueError):
        per_node_capacity("0", 1000, 4)


def test_command_csv_and_outputs(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["cluster", "--nodes", "2,4", "--items", "800", "--epochs", "2", "--capacity", "25%,agg50%",
                 "--batch-size", "4", "--item-bytes", "10", "--format", "csv", "--quiet", "--out", str(out)]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 2 * 2 * 3 and list(rows[0]) == list(FIELDS)
    assert {r["policy"] for r in rows} == {"no cache", "per-node OPT", "cluster OPT"}
    saved = json.loads((out / "cluster.json").read_text())
    assert [(r["nodes"], r["policy"], r["storage_reads"]) for r in saved] == [
        (int(r["nodes"]), r["policy"], int(r["storage_reads"])) for r in rows]
    png = (out / "cluster.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_command_table_and_errors() -> None:
    r = subprocess.run([script("opt4torch"), "cluster", "--nodes", "2", "--items", "300", "--epochs", "2",
                        "--quiet"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "cluster OPT" in r.stdout and "per-node OPT" in r.stdout and "no cache" in r.stdout
    for args, message in ((["--nodes", "0"], "positive integers"), (["--capacity", "lots"], "capacity"),
                          (["--epochs", "0"], "--epochs"), (["--size-sigma", "-1"], "--size-sigma")):
        r = subprocess.run([script("opt4torch"), "cluster", "--items", "100", *args], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
