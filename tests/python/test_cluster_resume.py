"""A run saved mid-epoch on 4 nodes and resumed on 4 and on 2, under
torchrun (cluster_resume_run.py), each rank a node of its own
(OPT4TORCH_NODE=rank): a cluster=True loader, and beside it a loader of the
rank's own pool over a DistributedSampler given as sampler=. 242 items of
64-1,063 bytes, batches of 4, 2 epochs, saved after 5 batches of epoch 0
(80 samples of its global order consumed).

Every sample is the source's. Over the two runs, each sample of the cut
epoch comes exactly once, apart from the DistributedSampler padding of the
new world, which repeats the epoch order's first samples as a
DistributedSampler's padding does (2 on 4 ranks: the rest is 162 samples;
none on 2); the next epoch is the new world's. On the same world the
resumed ranks read exactly what they would have read. A resumed cluster
node reads from storage exactly what its new plan says, with the plan's
hits and no fallback. A state is refused, naming the fact, by a loader of
another seed or another dataset."""

from __future__ import annotations

import collections
import json
import os

import pytest
from torch.utils.data.distributed import DistributedSampler

from conftest import torchrun

HERE = os.path.dirname(__file__)
N, CUT, BATCH, SAVED = 242, 5, 4, 4
SEEDS = {"cluster": 3, "own": 5}

pytestmark = pytest.mark.timeout(300)


def job(directory, world: int, *args: str) -> list[dict]:
    phase = args[1]
    r = torchrun(os.path.join(HERE, "cluster_resume_run.py"), world, "--dir", str(directory), *args,
                 node_env="rank", timeout=200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    return [json.loads((directory / f"{phase}.{k}.json").read_text()) for k in range(world)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[object, list[dict]]:
    directory = tmp_path_factory.mktemp("resume")
    return directory, job(directory, SAVED, "--phase", "save")


def order(kind: str, world: int, rank: int, epoch: int) -> list[int]:
    s = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=True, seed=SEEDS[kind])
    s.set_epoch(epoch)
    return list(s)


def check_resumed(saves: list[dict], ranks: list[dict], world: int) -> None:
    consumed = SAVED * CUT * BATCH
    whole = order("cluster", 1, 0, 0)
    for kind in ("cluster", "own"):
        whole = order(kind, 1, 0, 0)
        assert all(s[f"{kind}_wrong"] == 0 and len(s[f"{kind}_seen"]) == CUT * BATCH for s in saves)
        assert all(s[f"{kind}_state"]["distributed"] == {"world": SAVED, "seed": SEEDS[kind], "shuffle": True,
                                                         "drop_last": False, "consumed": consumed} for s in saves)
        cut = collections.Counter(x for s in saves for x in s[f"{kind}_seen"])
        cut.update(x for r in ranks for x in r[f"{kind}_seen"][0])
        pad = (-(N - consumed)) % world  # the new world's padding of the rest, from the order's start
        assert cut == collections.Counter(range(N)) + collections.Counter(whole[:pad]), kind
        nxt = collections.Counter(x for r in ranks for x in r[f"{kind}_seen"][1])
        assert nxt == collections.Counter(x for k in range(world) for x in order(kind, world, k, 1)), kind
        if world == SAVED:  # the same world: each rank reads on exactly as it would have
            for k, r in enumerate(ranks):
                assert r[f"{kind}_seen"][0] == order(kind, SAVED, k, 0)[CUT * BATCH:], (kind, k)
    for r in ranks:
        st = r["stats"]
        assert r["wrong"] == 0 and r["thread_error"] is None and st["cluster_errors"] == []
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0
        assert r["reads"] == r["node_stats"]["storage_reads"] == st["plan_storage_reads"]
        # The new plan is the rest: the cut epoch's 162 samples (padded), then a whole epoch.
        rest = N - consumed + (-(N - consumed)) % world
        assert r["resumed_plan"]["accesses"] == rest + N + (-N) % world
        assert r["resumed_at"] == 0 and r["state_after"]["epoch"] == 1
        assert r["state_after"]["distributed"]["world"] == world
        assert r["state_after"]["distributed"]["consumed"] == N  # the last epoch done


def test_saved_on_4_nodes_resumes_on_4(saved) -> None:
    directory, saves = saved
    check_resumed(saves, job(directory, 4, "--phase", "resume"), 4)


def test_saved_on_4_nodes_resumes_on_2_and_refuses_another_seed_or_dataset(saved) -> None:
    directory, saves = saved
    ranks = job(directory, 2, "--phase", "resume", "--refusals")
    check_resumed(saves, ranks, 2)
    for r in ranks:
        assert r["refused_seed"].startswith("the seed differs: state['distributed']['seed'] is 3")
        assert r["refused_dataset"].startswith("the dataset differs: state['items'] is 242")
        assert r["own_refused_seed"].startswith("the seed differs: state['distributed']['seed'] is 5")
