"""Live figures while a job runs: ``DataLoader(log_every=N)`` to a callback,
to TensorBoard and to standard error, and ``opt4torch top`` from another
process, read from the pool without attaching to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import script
from datasets_for_tests import Checked

import opt4torch
from opt4torch._live import SCALARS
from opt4torch.records import RecordFile, write_records

N = 240


def top(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([script("opt4torch"), "top", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("workers", [0, 2])
def test_log_every_reports_to_a_callback(workers: int) -> None:
    figs: list[dict] = []
    loader = opt4torch.DataLoader(Checked(N), batch_size=8, shuffle=True, seed=1, num_workers=workers,
                                  cache_items=N // 3, epochs=2, log_every=5, on_stats=figs.append)
    batches = 0
    for _ in range(2):
        for _ in loader:
            batches += 1
    assert batches == 60
    assert len(figs) == batches // 5
    assert [f["batches"] for f in figs] == list(range(5, 61, 5))
    assert [f["epoch"] for f in figs] == [0] * 6 + [1] * 6
    # Where the job is: positions only grow, rounded down to 32, never past
    # what the loader has handed out (8 per batch).
    pos = [f["position"] for f in figs]
    assert pos == sorted(pos) and all(p % 32 == 0 for p in pos)
    assert all(f["position"] <= f["batches"] * 8 + (2 * 2 * 8 if workers else 0) for f in figs)
    assert all(f["accesses"] == 2 * N for f in figs)
    # The counters behind the figures are the cache's own: the last report
    # counts no more than the end, and its rates follow from its counts.
    final = loader.cache.stats()
    last = figs[-1]
    assert last["hits"] <= final["hits"] and last["misses"] <= final["misses"]
    for f in figs:
        assert f["hits"] + f["misses"] == f["served"] > 0
        assert f["hit_rate"] == pytest.approx(f["hits"] / f["served"])
        assert 0.0 <= f["stall_rate"] <= 1.0 and 0.0 < f["occupancy"] <= 1.0
    assert all("accesses_per_s" in f and f["accesses_per_s"] > 0 for f in figs[1:])
    assert "accesses_per_s" not in figs[0]
    # The first epoch fills the pool; by its end it holds the plan's capacity.
    assert figs[5]["occupancy"] == 1.0
    assert final["hits"] == final["plan_hits"]
    loader.cache.close()


def test_log_every_storage_throughput(tmp_path) -> None:
    path = tmp_path / "d.rec"
    rng = np.random.default_rng(0)
    write_records(path, (rng.integers(0, 256, 1000 + i, dtype=np.uint8).tobytes() for i in range(N)))
    figs: list[dict] = []
    loader = opt4torch.DataLoader(RecordFile(path), batch_size=8, shuffle=True, seed=0, num_workers=2,
                                  cache_items=N // 2, epochs=1, log_every=6, on_stats=figs.append,
                                  prefetch_threads=2)
    for _ in loader:
        pass
    assert len(figs) == 5
    stored = [f["storage_bytes"] for f in figs]
    assert stored == sorted(stored) and stored[-1] <= loader.cache.stats()["storage_bytes"]
    assert all(f["storage_mb_per_s"] >= 0 for f in figs[1:])
    assert all(1 <= f["prefetch_threads"] <= 64 for f in figs)
    loader.cache.close()


def test_log_every_to_tensorboard(tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=os.fspath(tmp_path / "tb"))
    figs: list[dict] = []
    loader = opt4torch.DataLoader(Checked(N), batch_size=8, shuffle=True, seed=2, cache_items=N // 2,
                                  epochs=2, log_every=10, tensorboard=writer, on_stats=figs.append)
    for _ in range(2):
        for _ in loader:
            pass
    writer.close()
    acc = EventAccumulator(os.fspath(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"opt4torch/hit_rate", "opt4torch/stall_rate", "opt4torch/occupancy", "opt4torch/progress",
            "opt4torch/accesses_per_s"} <= set(tags)
    assert all(t.removeprefix("opt4torch/") in SCALARS for t in tags)
    hits = acc.Scalars("opt4torch/hit_rate")
    assert [e.step for e in hits] == [10, 20, 30, 40, 50, 60]
    assert [e.value for e in hits] == pytest.approx([f["hit_rate"] for f in figs])
    loader.cache.close()


def test_log_every_default_is_a_line_on_stderr(capfd) -> None:
    loader = opt4torch.DataLoader(Checked(64), batch_size=8, cache_items=16, epochs=1, log_every=4)
    for _ in loader:
        pass
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert err[0].startswith("opt4torch: ") and "hit rate" in err[0] and "pool" in err[0]
    assert "accesses/s" in err[1]
    loader.cache.close()


@pytest.mark.parametrize("kwargs, message", [
    (dict(log_every=0), "log_every must be a positive"),
    (dict(log_every=True), "log_every must be a positive"),
    (dict(on_stats=print), "give log_every"),
    (dict(tensorboard=object()), "give log_every"),
    (dict(log_every=3, on_stats=5), "on_stats must be callable"),
    (dict(log_every=3, tensorboard=object()), "SummaryWriter"),
])
def test_log_every_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        opt4torch.DataLoader(Checked(16), batch_size=4, cache_items=4, **kwargs)


def test_top_reads_a_running_job_without_touching_it() -> None:
    loader = opt4torch.DataLoader(Checked(N), batch_size=8, shuffle=True, seed=3, num_workers=2,
                                  cache_items=N // 3, epochs=2, persistent_workers=True)
    it = iter(loader)
    for _ in range(10):
        next(it)
    name = loader.cache.name
    attached = loader.cache.info()["attached"]
    out = top("--once", "--json", name)
    assert out.returncode == 0, out.stderr
    (fig,) = json.loads(out.stdout)
    assert fig["name"] == name and fig["owner_pid"] == os.getpid()
    assert fig["accesses"] == 2 * N and 0 < fig["position"] <= 2 * N
    # Same counters as the job's own (the workers may have served a few more
    # batches ahead meanwhile: never fewer).
    now = loader.cache.stats()
    assert 0 < fig["hits"] + fig["misses"] <= now["hits"] + now["misses"]
    assert loader.cache.info()["attached"] == attached  # the look took no process record
    for _ in it:
        pass
    table = top("--once", name)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.strip().splitlines()
    assert header.split()[:3] == ["pool", "pid", "position"]
    assert row.split()[0] == name and row.split()[1] == str(os.getpid())
    loader.cache.close()
    gone = top("--once", name)
    assert gone.returncode == 2 and "no running pool" in gone.stderr


def test_top_lists_only_this_namespace(tmp_path) -> None:
    loader = opt4torch.DataLoader(Checked(32), batch_size=8, cache_items=8, epochs=1)
    next(iter(loader))
    env = dict(os.environ, OPT4TORCH_POOL_NAMESPACE="elsewhere")
    out = subprocess.run([sys.executable, "-m", "opt4torch", "top", "--once"], capture_output=True,
                         text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert loader.cache.name not in out.stdout and "no running opt4 pools" in out.stdout
    mine = top("--once", "--json")
    assert loader.cache.name in {f["name"] for f in json.loads(mine.stdout)}
    bad = top("--once", "--interval", "0")
    assert bad.returncode == 2 and "--interval" in bad.stderr
    loader.cache.close()
