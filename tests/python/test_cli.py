"""The opt4torch command line, run as a user would run it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import RandomSampler

from conftest import script

import opt4torch
from opt4torch.cli import main


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([script("opt4torch"), *args], capture_output=True, text=True, timeout=300)


def test_precompute_from_trace_and_inspect(tmp_path) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("# a comment\n" + "\n".join(map(str, [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1])) + "\n\n")
    out = tmp_path / "p.opt4"
    r = run("precompute", "--trace", str(trace), "--capacity", "3", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert "hits 12" in r.stdout
    r = run("inspect", str(out), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    for key in ("items", "accesses", "capacity", "hits", "misses", "bypasses"):
        assert key in info
    assert (info["items"], info["accesses"], info["capacity"]) == (8, 20, 3)
    assert (info["hits"], info["misses"], info["bypasses"]) == (12, 8, 2)
    r = run("inspect", str(out))
    assert "hits        12 (60.00%)" in r.stdout
    # The misses split two ways, each into parts that add up to them (6 of
    # the 8 are first reads of the 6 items; 2 of them were bypassed).
    split = ("8 = 6 compulsory (an item's first read) + 2 capacity (read before, not kept) "
             "= 6 admitted (stored) + 2 bypassed (not stored)")
    assert f"misses      {split}" in r.stdout, r.stdout
    r = run("precompute", "--trace", str(trace), "--capacity", "3", "--output", str(out))
    assert f"misses {split}" in r.stdout, r.stdout


def test_precompute_from_npy_nobypass(tmp_path) -> None:
    seq = np.array([7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1])
    np.save(tmp_path / "t.npy", seq)
    assert main(["precompute", "--trace", str(tmp_path / "t.npy"), "--capacity", "3", "--no-bypass",
                 "--output", str(tmp_path / "p.opt4"), "--quiet"]) == 0
    assert opt4torch.load_plan(tmp_path / "p.opt4").misses == 9


def test_earlier_precompute_command_matches_the_api(tmp_path) -> None:
    """`opt4torch-precompute` with the earlier design's flags writes the same
    sequence as generate_precomputed_file() and as the sampler itself."""
    out = tmp_path / "precomputed" / "my_experiment.pkl"
    r = subprocess.run([script("opt4torch-precompute"), "--total-iter", "3000", "--output", str(out), "--seed", "42",
                        "--dataset-size", "1000"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    p = opt4torch.load_plan(out)
    assert not p.has_decisions and p.accesses == 3000 and p.items == 1000
    want = list(RandomSampler(range(1000), replacement=True, num_samples=3000,
                              generator=torch.Generator().manual_seed(42)))
    assert np.array_equal(p.seq, want)
    api = opt4torch.generate_precomputed_file(1000, 3000, tmp_path / "api.opt4", random_seed=42)
    assert api.fingerprint == p.fingerprint
    desc = json.loads(p.description)
    assert desc["seed"] == 42 and desc["sampler"] == "torch.utils.data:RandomSampler"


def test_precompute_sampler_epochs_no_replacement_capacity(tmp_path) -> None:
    out = tmp_path / "p.opt4"
    assert main(["precompute", "--dataset-size", "500", "--epochs", "4", "--no-replacement", "--seed", "3",
                 "--capacity", "25%", "--output", str(out), "--quiet"]) == 0
    p = opt4torch.load_plan(out)
    assert (p.accesses, p.items, p.capacity) == (2000, 500, 125)
    sampler = RandomSampler(range(500), generator=torch.Generator().manual_seed(3))
    want = [i for _ in range(4) for i in sampler]
    assert np.array_equal(p.seq, want)


def test_precompute_distributed_sampler(tmp_path) -> None:
    from torch.utils.data.distributed import DistributedSampler

    out = tmp_path / "d.opt4"
    assert main(["precompute", "--sampler", "torch.utils.data.distributed:DistributedSampler",
                 "--dataset-size", "100", "--epochs", "3", "--num-replicas", "2", "--rank", "1", "--seed", "5",
                 "--output", str(out), "--quiet"]) == 0
    s = DistributedSampler(range(100), num_replicas=2, rank=1, seed=5)
    want = []
    for e in range(3):
        s.set_epoch(e)
        want.extend(s)
    assert np.array_equal(opt4torch.load_plan(out).seq, want)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["precompute", "--total-iter", "10", "--output", "x.opt4"], "--dataset-size N is required"),
        (["precompute", "--dataset-size", "10", "--sampler", "nosuchmodule:X", "--output", "x.opt4"],
         "cannot import 'nosuchmodule'"),
        (["precompute", "--dataset-size", "10", "--sampler", "torch", "--output", "x.opt4"],
         "expected module:callable"),
        (["precompute", "--dataset-size", "10", "--capacity", "0", "--output", "x.opt4"], "at least one item"),
        (["precompute", "--dataset-size", "10", "--capacity", "lots", "--output", "x.opt4"], "not an integer"),
        (["precompute", "--dataset-size", "10", "--total-iter", "7", "--epochs", "2", "--output", "x.opt4"],
         "not a multiple"),
        (["inspect", "does-not-exist.opt4"], "no plan file"),
        (["simulate", "--trace", "does-not-exist.txt", "--capacity", "3"], "no trace file"),
    ],
)
def test_errors_are_clear(tmp_path, args: list[str], message: str) -> None:
    r = subprocess.run([script("opt4torch"), *args], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode != 0
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_inspect_damaged_file(tmp_path) -> None:
    bad = tmp_path / "old.pkl"
    bad.write_bytes(b"\x80\x04" + b"x" * 300)
    r = run("inspect", str(bad))
    assert r.returncode == 1
    assert "not an opt4 plan file" in r.stderr and "Traceback" not in r.stderr


def test_simulate_csv(tmp_path) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("\n".join(map(str, [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1])))
    r = run("simulate", "--trace", str(trace), "--policy", "lru,opt", "--capacity", "3,5", "--format", "csv")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("policy,capacity,accesses,hits,misses")
    rows = {(line.split(",")[0], int(line.split(",")[1])): line.split(",") for line in lines[1:]}
    assert int(rows[("lru", 3)][4]) == 12 and int(rows[("opt", 3)][4]) == 8
    r = run("simulate", "--trace", str(trace), "--policy", "belady", "--capacity", "3")
    assert r.returncode == 2 and "unknown policy belady" in r.stderr


def test_python_dash_m_and_version() -> None:
    r = subprocess.run([sys.executable, "-m", "opt4torch", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and opt4torch.__version__ in r.stdout


def test_demo_runs(tmp_path) -> None:
    r = run("demo", "--items", "2000", "--epochs", "3", "--out", str(tmp_path / "out"),
            "--loader-items", "120", "--latency", "0.001")
    assert r.returncode == 0, r.stderr
    assert "OPT" in r.stdout and "LRU" in r.stdout
    assert opt4torch.load_plan(tmp_path / "out" / "demo-shuffle.opt4").accesses == 6000
    # The end-to-end part: the table, its files (all inside --out), and the
    # hits observed with worker processes are the plan's.
    assert "| OPT + prefetch |" in r.stdout and "| in memory |" in r.stdout
    for name in ("e2e.md", "e2e.json", "e2e-epoch-time.png", "e2e-hits.png"):
        assert (tmp_path / "out" / name).exists(), name
    observed = re.search(r"hits observed\s+([\d,]+)", r.stdout)
    promised = re.search(r"hits the plan promised\s+([\d,]+)\s+fallbacks 0, timeouts 0", r.stdout)
    assert observed and promised, r.stdout
    assert observed.group(1) == promised.group(1) != "0"
