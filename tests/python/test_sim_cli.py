"""`opt4torch simulate`, run as a user would run it: traces, pattern sweeps,
tables, plots and errors."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess

import numpy as np
import pytest
from conftest import TEXTBOOK, script

import opt4torch
from opt4torch.lab import traces
from opt4torch.cli import main


def run(*args: str, cwd: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([script("opt4torch"), *args], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env=env)


def test_trace_csv_contract(tmp_path) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("\n".join(map(str, TEXTBOOK)) + "\n")
    r = run("simulate", "--trace", str(trace), "--policy", "lru,opt", "--capacity", "100,500", "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert r.stdout.splitlines()[0] == "policy,capacity,accesses,hits,misses,hit_rate"
    assert [(row["policy"], row["capacity"]) for row in rows] == [("lru", "100"), ("lru", "500"), ("opt", "100"),
                                                                   ("opt", "500")]
    assert all(int(row["hits"]) == 20 - 6 for row in rows)  # 6 distinct ids: only compulsory misses


def test_trace_json_rows_equal_the_api(tmp_path, capsys) -> None:
    seq = traces.zipf(400, 5_000, alpha=0.8, seed=1)
    np.save(tmp_path / "t.npy", seq)
    assert main(["simulate", "--trace", str(tmp_path / "t.npy"), "--policy", "all", "--capacity", "5%,25%",
                 "--items", "400", "--seed", "9", "--format", "json", "--quiet"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 * len(opt4torch.POLICIES)
    assert set(rows[0]) == {"policy", "capacity", "accesses", "hits", "misses", "hit_rate"}
    for row in rows:
        assert row["capacity"] in (20, 100)
        assert row["hits"] == opt4torch.simulate(row["policy"], seq, row["capacity"], items=400, seed=9)["hits"]


def test_pattern_sweep_writes_tables_and_plots(tmp_path) -> None:
    out = tmp_path / "out"
    r = run("simulate", "--pattern", "zipf", "--param", "alpha=0.6,1.2", "--items", "2000", "--epochs", "3",
            "--policy", "opt,lru,lfu,freq", "--capacity", "1%,10%,50%", "--seed", "4", "--out", str(out),
            "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "policy,capacity,accesses,hits,misses,hit_rate,pattern,param,value,items,seed"
    assert sorted(os.listdir(out)) == ["gain_zipf.png", "hit_rate_zipf.png", "results.csv", "results.json"]
    for png in ("gain_zipf.png", "hit_rate_zipf.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    rows = json.loads((out / "results.json").read_text())
    assert len(rows) == 2 * 4 * 3
    with open(out / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    for alpha in (0.6, 1.2):
        seq = traces.zipf(2000, 6000, alpha=alpha, seed=4)
        mine = [row for row in rows if row["value"] == alpha]
        assert {(row["pattern"], row["param"], row["items"], row["seed"]) for row in mine} == {("zipf", "alpha", 2000, 4)}
        for row in mine:
            want = opt4torch.simulate(row["policy"], seq, row["capacity"], items=2000, seed=4)
            assert (row["accesses"], row["hits"]) == (6000, want["hits"])


def test_all_patterns_table(tmp_path) -> None:
    r = run("simulate", "--pattern", "all", "--items", "500", "--epochs", "2", "--capacity", "10%",
            "--policy", "opt,lru", "--out", str(tmp_path / "o"), "--no-plots")
    assert r.returncode == 0, r.stderr
    for name in traces.GENERATORS:
        assert name in r.stdout
    assert sorted(os.listdir(tmp_path / "o")) == ["results.csv", "results.json"]
    rows = json.loads((tmp_path / "o" / "results.json").read_text())
    assert {row["pattern"] for row in rows} == set(traces.GENERATORS)


def test_missing_matplotlib_is_explained(tmp_path) -> None:
    """A matplotlib that cannot be imported (a stub package first on the
    path) gives the install command, before any simulation runs."""
    stub = tmp_path / "stub" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub")}
    r = run("simulate", "--pattern", "uniform", "--items", "100", "--out", str(tmp_path / "o"), env=env)
    assert r.returncode != 0
    assert "pip install 'opt4torchdataset[plot]'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()
    r = run("simulate", "--pattern", "uniform", "--items", "100", "--out", str(tmp_path / "o"), "--no-plots",
            env=env)
    assert r.returncode == 0, r.stderr


def test_help_lists_policies_and_patterns() -> None:
    r = run("simulate", "--help")
    assert r.returncode == 0
    for name in (*opt4torch.POLICIES, *traces.GENERATORS, "--pattern", "--param", "--out", "alpha=1.0"):
        assert name in r.stdout, name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "--capacity", "3"], "give either --trace PATH or --pattern"),
        (["simulate", "--pattern", "nope"], "unknown pattern nope"),
        (["simulate", "--pattern", "zipf", "--param", "alpha"], "expected NAME=V1,V2"),
        (["simulate", "--pattern", "uniform", "--param", "alpha=1"], "none of the patterns uniform has it"),
        (["simulate", "--pattern", "zipf", "--param", "alpha=high"], "not a valid float"),
        (["simulate", "--pattern", "zipf", "--param", "alpha=-1", "--items", "10"], "alpha must be"),
        (["simulate", "--pattern", "uniform", "--policy", "belady"], "unknown policy belady"),
        (["simulate", "--pattern", "uniform", "--capacity", "0"], "at least one item"),
        (["simulate", "--pattern", "uniform", "--epochs", "0"], "--epochs must be at least 1"),
        (["simulate", "--pattern", "uniform", "--workers", "0"], "--workers must be at least 1"),
    ],
)
def test_errors_are_clear(tmp_path, args: list[str], message: str) -> None:
    r = run(*args, cwd=str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_trace_rejects_pattern_flags(tmp_path) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text("0\n1\n")
    r = run("simulate", "--trace", str(trace), "--param", "alpha=1")
    assert r.returncode == 2 and "do not apply to --trace" in r.stderr
