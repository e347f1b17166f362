"""A run saved mid-epoch on 4 nodes and resumed on 4 and on 2, under
torchrun (cluster_resume_run.py), each rank a node of its own
(OPT4TORCH_NODE=rank): a cluster=True loader, and beside it a loader of the
rank's own pool over a DistributedSampler given as sampler=. 242 items of
64-2,063 bytes, batches of 4, 2 epochs, saved after 5 batches of epoch 0
(80 samples of its global order consumed).

Every sample is the source's. Over the two runs, each sample of the cut
epoch comes exactly once, apart from the DistributedSampler padding of the
new world, which repeats the epoch order's first samples as a
DistributedSampler's padding does (2 on 4 ranks: the rest is 162 samples;
none on 2); the next epoch is the new world's. On the same world the
resumed ranks read exactly what they would have read. A resumed cluster
node reads from storage exactly what its new plan says, with the plan's
hits and no fallback. A state is refused, naming the fact, by a loader of
another seed or another dataset; ranks that disagree on their node ids
(OPT4TORCH_NODE) are refused on every rank."""

from __future__ import annotations

import collections
import json
import os

import pytest
from torch.utils.data.distributed import DistributedSampler

from conftest import torchrun

HERE = os.path.dirname(__file__)
N, CUT, BATCH, SAVED = 242, 5, 4, 4
SEEDS = {"cluster": 3, "own": 5, "warm": 11}

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
    ranks = job(directory, 4, "--phase", "resume", "--warm")
    check_resumed(saves, ranks, 4)
    check_warm([r["warm"] for r in ranks])


def check_warm(ranks: list[dict]) -> None:
    """A resume in the same processes keeps what the pools hold (issue 36):
    3 epochs; epoch 0 and 5 batches of epoch 1 read with workers that are
    not persistent, saved, load_state_dict'ed on the same loader, the rest
    read. Each rank reads epochs 1 and 2 exactly as it would have, every
    sample the source's; each node reads from storage exactly what the
    warm plan says (items its old pool lost are loaded while warming, and
    counted as kept_loaded), with the plan's hits, local and peer, and no
    fallback; and the warm plan hits more than the cold one, which a
    loader built afresh plans for the same state. The resume takes well
    under cluster_timeout (30 s). (Copying from the old pool moves its
    transfer thread's pace: left running, the old threads waited out the
    timeout in turns the other nodes never entered, 60-65 s a resume in
    bench/cluster_warm_resume.py --run; at this job's scale they happened
    to agree, so that is measured there, not here.)"""
    for k, r in enumerate(ranks):
        assert r["epoch0"] == order("warm", 4, k, 0)
        assert r["epoch1_before"] + r["epoch1_after"] == order("warm", 4, k, 1), k
        assert r["epoch2"] == order("warm", 4, k, 2), k
        assert r["resume_seconds"] < 10, (k, r["resume_seconds"])
        assert len(r["epoch1_before"]) == CUT * BATCH
        st, plan = r["stats"], r["node_stats"]
        assert r["wrong"] == 0 and r["thread_error"] is None and st["cluster_errors"] == [], k
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0, k
        assert (st["local_hits"], st["peer_hits"]) == (plan["local_hits"], plan["peer_hits"]), k
        assert r["reads"] == plan["storage_reads"] == st["plan_storage_reads"], k
        assert r["bytes"] == st["plan_storage_bytes"], k
        assert st["kept"] + st["kept_loaded"] == plan["warm"] == st["plan_warm"], k
        assert r["loaded_in_resume"] == st["kept_loaded"], k
    warm, cold = ranks[0]["warm_plan"], ranks[0]["cold_plan"]
    assert all(r["warm_plan"] == warm and r["cold_plan"] == cold for r in ranks)
    assert cold["warm"] == 0 and warm["warm"] == sum(r["node_stats"]["warm"] for r in ranks) > 0
    assert warm["hits"] > cold["hits"] and warm["storage_bytes"] < cold["storage_bytes"]


@pytest.fixture(scope="module")
def resumed_on_2(saved) -> list[dict]:
    directory, _ = saved
    return job(directory, 2, "--phase", "resume", "--refusals")


def test_saved_on_4_nodes_resumes_on_2_and_refuses_another_seed_or_dataset(saved, resumed_on_2) -> None:
    check_resumed(saved[1], resumed_on_2, 2)
    for r in resumed_on_2:
        assert r["refused_seed"].startswith("the seed differs: state['distributed']['seed'] is 3")
        assert r["refused_dataset"].startswith("the dataset differs: state['items'] is 242")
        assert r["own_refused_seed"].startswith("the seed differs: state['distributed']['seed'] is 5")


def test_ranks_that_disagree_on_their_node_ids_are_refused_on_every_rank(resumed_on_2) -> None:
    """Issue 36: rank 1 leaves OPT4TORCH_NODE unset (torchrun's GROUP_RANK,
    0 here) where rank 0 says 'rank'; then rank 1's cannot be read. On one
    machine no node spans two machines, so only the settings can tell."""
    for r in resumed_on_2:
        assert r["refused_numbering"] == (
            "the ranks of this job disagree on their node ids: OPT4TORCH_NODE is 'rank' on ranks [0]; unset "
            "(torchrun's GROUP_RANK) on ranks [1]. Set OPT4TORCH_NODE the same way on every rank ('rank', "
            "'rank//K', or unset to take torchrun's GROUP_RANK; an explicit id on every machine), or the nodes' "
            "pools and transfers would not be the ones each rank plans"), r["rank"]
        assert r["refused_unreadable"].startswith("rank 1 cannot tell its node: OPT4TORCH_NODE='node1': give a "
                                                  "node id"), r["rank"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_distributed_sampler_run_resumes_on_another_world_in_one_process(drop_last: bool) -> None:
    """No cluster: 4 loaders of their own pools play 4 ranks (batches of 3,
    50 items), save after 2 batches (24 consumed), and 3 loaders with
    batches of 5 resume: the cut epoch's rest once over the 3 ranks, padded
    from the order's start (1 sample) or cut (drop_last: the last 2 of the
    order, which 4 ranks dropped too), every sample the source's, the plan's
    hits; then the next epoch is the 3 ranks' DistributedSampler's. A state
    saved at the end of the run resumes to nothing more; a loader serving
    its plan (a live iterator) refuses to plan again."""
    import numpy as np

    import opt4torch

    n = 50
    data = [np.full(4, x, dtype=np.int64) for x in range(n)]

    def loader(world: int, rank: int, batch: int) -> opt4torch.DataLoader:
        s = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7, drop_last=drop_last)
        return opt4torch.DataLoader(data, sampler=s, batch_size=batch, cache_items=8, epochs=2, collate_fn=list)

    first, states, cut = [loader(4, r, 3) for r in range(4)], [], collections.Counter()
    for ld in first:
        for b, batch in enumerate(ld):
            cut.update(int(x[0]) for x in batch)
            if b == 1:
                break
        states.append(ld.state_dict())
        ld.cache.close()
    assert all(s["distributed"]["consumed"] == 24 and s["distributed"]["world"] == 4 for s in states)
    perm = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=7)
    perm = list(perm)
    nxt = collections.Counter()
    busy = loader(3, 0, 5)
    live = iter(busy)
    next(live)
    with pytest.raises(RuntimeError, match="under an iterator"):  # its plan is being served
        busy.load_state_dict(states[0])
    del live
    busy.cache.close()
    for r in range(3):
        ld = loader(3, r, 5)
        ld.load_state_dict(states[r])
        for batch in ld:
            cut.update(int(x[0]) for x in batch)
            assert all((x == x[0]).all() for x in batch)
        for batch in ld:
            nxt.update(int(x[0]) for x in batch)
        st = ld.cache.stats()
        assert st["hits"] == ld.cache.plan.hits and st["fallbacks"] == 0
        end = ld.state_dict()
        assert end["epoch"] == 1 and end["distributed"]["consumed"] == n
        ld.cache.close()
        over = loader(3, r, 5)
        over.load_state_dict(end)
        with pytest.raises(RuntimeError, match="all used"):
            next(iter(over))
        over.cache.close()
    expect = collections.Counter(perm[:48]) if drop_last else collections.Counter(perm) + collections.Counter(perm[:1])
    assert cut == expect
    s3 = [DistributedSampler(data, num_replicas=3, rank=r, shuffle=True, seed=7, drop_last=drop_last) for r in range(3)]
    for s in s3:
        s.set_epoch(1)
    assert nxt == collections.Counter(x for s in s3 for x in s)


@pytest.mark.timeout(60)
def test_a_subclass_of_distributed_sampler_is_not_resumed_on_another_world() -> None:
    """A subclass may order otherwise than the DistributedSampler's rule
    the rest is split by: its states name no global order, and resume only
    as any state does (the same world and plan)."""
    import opt4torch

    class Reversed(DistributedSampler):
        def __iter__(self):
            return reversed(list(super().__iter__()))

    data = list(range(20))
    ld = opt4torch.DataLoader(data, sampler=Reversed(data, num_replicas=2, rank=0, shuffle=False), batch_size=2,
                              cache_items=4, collate_fn=list)
    state = ld.state_dict()
    ld.cache.close()
    assert "distributed" not in state
    other = opt4torch.DataLoader(data, sampler=Reversed(data, num_replicas=4, rank=0, shuffle=False), batch_size=2,
                                 cache_items=4, collate_fn=list)
    with pytest.raises(ValueError, match="another plan"):
        other.load_state_dict(state)
    other.cache.close()


def test_a_resumed_sampler_captures_every_rank_as_iterating_it_would() -> None:
    """capture_ranks of a ResumedSampler (the cut epoch's rest drawn once,
    later epochs by the DistributedSampler's shared path) equals iterating
    each rank, epoch by epoch: before, at and after the cut."""
    import numpy as np

    from opt4torch.loader.elastic import ResumedSampler
    from opt4torch.planning.capture import capture_ranks

    data = list(range(53))
    for drop_last in (False, True):
        rs = ResumedSampler(data, num_replicas=3, rank=0, shuffle=True, seed=9, drop_last=drop_last, cut_epoch=1,
                            consumed=16)
        got = capture_ranks(rs, 4)
        for r in range(3):
            twin = ResumedSampler(data, num_replicas=3, rank=r, shuffle=True, seed=9, drop_last=drop_last,
                                  cut_epoch=1, consumed=16)
            for e in range(4):
                twin.set_epoch(e)
                assert np.array_equal(got[r][e], np.array(list(twin), dtype=np.int64)), (drop_last, r, e)
                assert len(twin) == got[r][e].size
        assert got[0][0].size == 0 and got[0][1].size == (13 if not drop_last else 12)  # 37 left
