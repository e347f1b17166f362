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
    # Three runs of each configuration by default: every timing target gives
    # its median and range, and a verdict only as the runs allow.
    timing = [line for line in r.stdout.splitlines()
              if line.startswith("- ") and ("faster than" in line or "within 10 %" in line)]
    assert len(timing) == 3, r.stdout
    for line in timing:
        assert "(median of 3 runs; " in line and re.search(r"\((met|NOT met|no verdict: .+)\)$", line), line
    if "Implausible, so left out of the verdicts" in r.stdout:
        assert not any(line.endswith("(met)") for line in timing), r.stdout


def test_every_command_has_a_description(capsys) -> None:
    """`opt4torch COMMAND --help` says what COMMAND does, for every command."""
    with pytest.raises(SystemExit):
        main(["--help"])
    commands = re.findall(r"^    (\w+)", capsys.readouterr().out, re.MULTILINE)
    assert {"precompute", "inspect", "simulate", "demo"} <= set(commands) and len(commands) >= 8
    for command in commands:
        with pytest.raises(SystemExit) as exc:
            main([command, "--help"])
        assert exc.value.code == 0
        paragraphs = capsys.readouterr().out.split("\n\n")
        # usage, then the description, then the arguments
        assert not paragraphs[1].startswith(("positional arguments:", "options:")), (command, paragraphs[1])
        assert len(paragraphs[1]) > 60, (command, paragraphs[1])


def test_demo_refuses_zero_repeats(tmp_path) -> None:
    r = run("demo", "--items", "200", "--epochs", "1", "--out", str(tmp_path / "out"), "--loader-items", "20",
            "--repeats", "0")
    assert r.returncode == 2 and "--repeats must be at least 1" in r.stderr and "Traceback" not in r.stderr


# ---- inspect: what it may be handed besides plans ----


def _tar_shard(path, samples: int = 5) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for k in range(samples):
            for field, data in (("jpg", b"j" * (100 + k)), ("cls", str(k).encode()), ("seg.png", b"p" * 7)):
                if field == "seg.png" and k % 2:
                    continue
                ti = tarfile.TarInfo(f"train/{k:04d}.{field}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))


def test_inspect_describes_a_tar_shard(tmp_path) -> None:
    shard = tmp_path / "shard-000000.tar"
    _tar_shard(shard)
    r = run("inspect", str(shard))
    assert r.returncode == 0, r.stderr
    assert "tar shard" in r.stdout and "pickle" not in r.stdout + r.stderr
    assert "samples     5, keys 'train/0000' ... 'train/0004'" in r.stdout
    assert "fields      cls 5, jpg 5, seg.png 3" in r.stdout
    assert "opt4torch.TarShards(path)" in r.stdout
    info = json.loads(run("inspect", str(shard), "--json").stdout)
    ds = opt4torch.TarShards(str(shard))
    assert info["kind"] == "tar" and info["samples"] == len(ds) == 5
    assert info["fields"] == {"jpg": 5, "cls": 5, "seg.png": 3}
    assert info["data_bytes"] == sum(len(v) for i in range(5) for k, v in ds[i].items() if k != "__key__")
    assert info["max_sample_bytes"] == int(ds.item_sizes().max()) and info["file_bytes"] == shard.stat().st_size


def test_inspect_writes_nothing_beside_a_shard(tmp_path) -> None:
    shard = tmp_path / "s.tar"
    _tar_shard(shard)
    assert run("inspect", str(shard)).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.tar"]


def test_inspect_refuses_a_compressed_shard_saying_what_to_do(tmp_path) -> None:
    import gzip

    shard = tmp_path / "s.tar"
    _tar_shard(shard)
    (tmp_path / "s.tar.gz").write_bytes(gzip.compress(shard.read_bytes()))
    r = run("inspect", str(tmp_path / "s.tar.gz"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "is a gzip-compressed file" in r.stderr and f"gzip -dc {tmp_path / 's.tar.gz'} > {shard}" in r.stderr
    (tmp_path / "z.zip").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    r = run("inspect", str(tmp_path / "z.zip"))
    assert r.returncode == 1 and "is a zip archive" in r.stderr and "not an opt4 plan file" in r.stderr
    assert "pickle" not in r.stderr


def test_inspect_describes_an_image_folder(tmp_path) -> None:
    root = tmp_path / "images"
    for cls, n in (("cat", 3), ("dog", 2), (".ipynb_checkpoints", 1), ("empty", 0)):
        (root / cls).mkdir(parents=True)
        for k in range(n):
            (root / cls / f"{k}.jpg").write_bytes(b"x" * (10 + k))
    r = run("inspect", str(root))
    assert r.returncode == 0, r.stderr
    assert "image folder" in r.stdout and "(6 images, 64 bytes, 10 to 12 each)" in r.stdout
    assert "0 '.ipynb_checkpoints' 1, 1 'cat' 3, 2 'dog' 2, 3 'empty' 0" in r.stdout
    assert "'.ipynb_checkpoints': names that start with a dot are classes" in r.stdout
    assert "'empty': no image" in r.stdout
    info = json.loads(run("inspect", str(root), "--json").stdout)
    assert info["kind"] == "image_folder" and info["images"] == 6 and info["classes"] == 4
    assert info["class_counts"] == {".ipynb_checkpoints": 1, "cat": 3, "dog": 2, "empty": 0}
    assert info["dot_classes"] == [".ipynb_checkpoints"] and info["empty_classes"] == ["empty"]
