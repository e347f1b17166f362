"""A fault in the exchange costs speed, never the run's remaining exchange
(issue 36): opt4torch.DataLoader(..., cluster=True) under torchrun, four
ranks each a node of its own (cluster_loader_run.py), stepping together as
DDP's all-reduce makes them, each step 50 ms of "compute" (12 windows of
4 steps with transfers). Node 2's transfer thread comes to window 2's
collective 5 s late, past the 4 s
timeout: the others' collectives time out, node 2's finds them gone.

Each window whose items were lost is read from storage and counted, the
nodes form their group again (one new generation), and every later window
carries its items: each node receives exactly the plan's items less those
of its failed windows, and reads from storage exactly the plan's reads plus
those. Every sample is right, every planned hit hits. The exchange's bytes
a second are in stats() and in the live figures (log_every).

Then the regroup protocol alone, in this process (nodes as threads, a
store of their own, real gloo groups): every node starts the new group at
the same window, and a node gone for good costs the others no wait."""

from __future__ import annotations

import json
import os

import pytest

from conftest import torchrun

HERE = os.path.dirname(__file__)
WORLD = 4
STALL_WINDOW, TIMEOUT, STALL = 2, 4.0, 5.0

pytestmark = pytest.mark.timeout(200)


def test_a_late_window_costs_storage_reads_and_the_next_ones_work(tmp_path) -> None:
    out = tmp_path / "rank"
    r = torchrun(os.path.join(HERE, "cluster_loader_run.py"), WORLD, "--out", str(out), "--timeout", str(TIMEOUT),
                 "--wait-timeout", "60", "--stall-node", "2", "--stall-window", str(STALL_WINDOW),
                 "--stall-seconds", str(STALL), "--lockstep", "--step-seconds", "0.05", "--log-every", "5",
                 node_env="rank", timeout=160)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"rank.{k}.json").read_text()) for k in range(WORLD)]
    assert ranks[2]["stalled"] == [STALL_WINDOW]
    windows = sorted(int(k) for k in ranks[0]["incoming"])
    for rk in ranks:
        st, plan, failed = rk["stats"], rk["node_stats"], rk["failed"]
        assert rk["wrong"] == 0 and rk["samples"] == 3 * 600 // WORLD and rk["thread_error"] is None
        # The late window and the few after it, while the nodes formed their
        # group again; then one new generation, and no window lost after it.
        assert failed[0] == STALL_WINDOW and failed == list(range(failed[0], failed[-1] + 1))
        assert st["cluster_failed_windows"] == len(failed) and st["cluster_regroups"] == 1
        assert f"window {STALL_WINDOW}:" in st["cluster_errors"][0]
        later = [k for k in windows if k > failed[-1] and rk["incoming"][str(k)] > 0]
        assert len(later) >= 3, (failed, windows)  # several windows with items for this node came after
        lost = sum(rk["incoming"][str(k)] for k in failed)
        assert lost > 0
        assert st["peer_items_received"] == plan["peer_items_received"] - lost
        assert rk["storage_reads"] == plan["storage_reads"] + lost
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0
        # The exchange's rate: bytes sent and received a second inside the
        # collectives that worked, and in the live figures over each interval.
        assert st["exchange_seconds"] > 0
        assert st["exchange_thread_cpu_seconds"] > 0  # the transfer thread's own CPU
        assert st["peer_bytes_per_s"] == pytest.approx(
            (st["peer_bytes_sent"] + st["peer_bytes_received"]) / st["exchange_seconds"])
        figs = rk["figures"]
        assert figs and all("peer_bytes" in f for f in figs)
        assert figs[-1]["peer_bytes"] <= st["peer_bytes_sent"] + st["peer_bytes_received"]
        assert any(f.get("exchange_mb_per_s", 0) > 0 for f in figs)
        assert all(f["exchange_mb_per_s"] >= 0 for f in figs[1:])


def test_the_nodes_agree_on_the_new_group_and_its_first_window() -> None:
    """The regroup protocol alone (distributed/regroup.py), three nodes as
    threads of this process over a store of its own, real gloo groups on
    loopback. Two nodes lose their group; the third, late, finds them gone
    and leaves at once. Each goes on window by window, reading from storage
    (None) until the new group is made, and every node gets it first at the
    same window, where an all_to_all over it carries each node's numbers."""
    import threading
    import time

    import torch
    import torch.distributed as dist

    from opt4torch.distributed.regroup import ExchangeGroup

    store = dist.HashStore()
    size = 3
    groups = [ExchangeGroup(object(), r, size, 20.0, "test-agree", store=store) for r in range(size)]
    assert all(g.current(0, look=False) is not None for g in groups)  # generation 0: the group given
    groups[0].lost()
    groups[1].lost()
    assert groups[0].current(1) is None and groups[0].waiting
    first: dict[int, int] = {}
    got: dict[int, list[int]] = {}

    def node(r: int) -> None:
        g = groups[r]
        for k in range(1, 2000):
            group = g.current(k, look=True)
            if group is not None:
                first[r] = k
                out = torch.empty(size, dtype=torch.int64)
                g.all_to_all(group, out, torch.full((size,), 10 * r + k, dtype=torch.int64), [1] * size, [1] * size)
                got[r] = out.tolist()
                return
            time.sleep(0.005)  # a window's compute

    threads = [threading.Thread(target=node, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(first) == [0, 1, 2] and len(set(first.values())) == 1, first
    k = first[0]
    assert all(got[r] == [10 * s + k for s in range(size)] for r in range(size)), got
    assert all(g.regroups == 1 and g.generation == 1 and not g.waiting for g in groups)
    for g in groups:
        g.close()


def test_a_node_gone_for_good_costs_no_wait() -> None:
    """Two of three nodes lose their group; the third never comes (it
    exited). Their windows are read from storage without waiting, and
    closing ends the thread that looks for the new generation at once."""
    import time

    import torch.distributed as dist

    from opt4torch.distributed.regroup import ExchangeGroup

    store = dist.HashStore()
    groups = [ExchangeGroup(object(), r, 3, 20.0, "test-gone", store=store) for r in range(2)]
    for g in groups:
        g.lost()
    t0 = time.monotonic()
    assert all(g.current(k) is None for k in range(1, 50) for g in groups)
    assert time.monotonic() - t0 < 5
    t0 = time.monotonic()
    for g in groups:
        g.close()
    assert time.monotonic() - t0 < 2 and all(g.regroups == 0 for g in groups)
