"""Every code block of the README runs as written and shows what the text
says it shows. The first screen's `make demo` / `make test` are left to CI,
which runs them; every other block is run here, in a fresh directory, with
small stand-ins for the names a block takes from the reader (`dataset`,
`sequence`, ...). A block that stops running fails its test, named."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess

import numpy as np
import pytest
import torch
from conftest import script

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def blocks(lang: str) -> list[tuple[int, str]]:
    """(line number, code) of the README's fenced blocks in ``lang``."""
    text = open(README).read()
    out = []
    for m in re.finditer(r"^```(\w+)\n(.*?)^```", text, re.S | re.M):
        if m.group(1) == lang:
            out.append((text.count("\n", 0, m.start()) + 1, m.group(2)))
    return out


class Small(torch.utils.data.Dataset):
    """What a reader's dataset returns: (image tensor, label)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return torch.full((3, 4, 4), float(i)), i % 10


def stand_ins(tmp_path) -> dict:
    from opt4torch.records import write_records

    write_records(tmp_path / "train.rec", (bytes([i % 256]) * (100 + i) for i in range(64)),
                  labels=[i % 10 for i in range(64)], classes=[str(k) for k in range(10)])
    for cls in ("cat", "dog"):  # opt4torch.ImageFolder("images/")
        (tmp_path / "images" / cls).mkdir(parents=True)
        for k in range(6):
            (tmp_path / "images" / cls / f"{k}.jpg").write_bytes(bytes([k]) * (100 + k))
    import io
    import tarfile

    with tarfile.open(tmp_path / "shard-000.tar", "w") as tf:  # opt4torch.TarShards(["shard-000.tar"])
        for k in range(4):
            for field, data in (("jpg", bytes([k]) * 50), ("cls", str(k % 2).encode())):
                ti = tarfile.TarInfo(f"{k:04d}.{field}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    rng = np.random.default_rng(0)
    return {
        "dataset": Small(),
        "augment": lambda x: x,
        "decode_and_augment": lambda x: x,
        "sequence": rng.integers(0, 1000, size=5000),
        "sampler": torch.utils.data.RandomSampler(range(100), generator=torch.Generator().manual_seed(0)),
    }


PY_BLOCKS = blocks("python")


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("line,code", PY_BLOCKS, ids=[f"README.md:{n}" for n, _ in PY_BLOCKS])
def test_python_block_runs(tmp_path, monkeypatch, line: int, code: str) -> None:
    import opt4torch

    monkeypatch.chdir(tmp_path)
    ns = {"opt4torch": opt4torch, **stand_ins(tmp_path)}
    store = s3_stand_in(monkeypatch) if "S3ImageFolder" in code else None
    try:
        exec(compile(code, f"README.md:{line}", "exec"), ns)
        if "print(loader.cache.stats())" in code:
            st = ns["loader"].cache.stats()
            assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0, st  # what its comment says
    finally:
        for value in ns.values():  # close what the block opened, as its process's exit would
            if isinstance(value, opt4torch.DataLoader):
                value.cache.close()
        if store is not None:
            store.stop()


def s3_stand_in(monkeypatch):
    """s3://my-bucket/train/ for the object-store block: the loopback S3
    server (tests/python/s3store.py) with two classes of images, found
    through the environment as the README says."""
    pytest.importorskip("s3torchconnector")
    boto3 = pytest.importorskip("boto3")
    from s3store import Server

    store = Server()
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("AWS_ENDPOINT_URL", store.endpoint), ("AWS_ACCESS_KEY_ID", "readme"),
                        ("AWS_SECRET_ACCESS_KEY", "readme"), ("AWS_DEFAULT_REGION", "us-east-1"),
                        ("AWS_EC2_METADATA_DISABLED", "true")):
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=store.endpoint)
    client.create_bucket(Bucket="my-bucket")
    for cls in ("cat", "dog"):
        for k in range(6):
            client.put_object(Bucket="my-bucket", Key=f"train/{cls}/{k}.jpg", Body=bytes([k]) * (100 + k))
    return store


def cli_lines() -> list[tuple[int, str]]:
    out = []
    for line, code in blocks("bash"):
        for k, raw in enumerate(code.splitlines()):
            cmd = raw.split("#", 1)[0].strip()
            if cmd.startswith("make "):
                continue  # the first screen: CI runs those
            if cmd:
                out.append((line + 1 + k, cmd))
    return out


def test_every_cli_line_runs_and_shows_what_it_says(tmp_path) -> None:
    lines = cli_lines()
    assert any(c.startswith("opt4torch precompute") for _, c in lines)
    (tmp_path / "trace.txt").write_text("\n".join(str(x) for x in np.random.default_rng(1).integers(0, 800, 4000)))
    for cls in ("cat", "dog"):
        (tmp_path / "images" / cls).mkdir(parents=True)
        for k in range(3):
            (tmp_path / "images" / cls / f"{k}.jpg").write_bytes(bytes([k]) * 500)
    for line, cmd in lines:
        argv = shlex.split(cmd)
        assert argv[0] in ("opt4torch", "opt4torch-precompute"), f"README.md:{line}: {cmd}"
        proc = subprocess.run([script(argv[0]), *argv[1:]], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"README.md:{line}: {cmd}\n{proc.stdout}\n{proc.stderr}"
        if argv[1] == "precompute":
            # Every plan the README makes has the hits inspect shows.
            out = argv[argv.index("--output") + 1]
            shown = subprocess.run([script("opt4torch"), "inspect", out, "--json"], cwd=tmp_path,
                                   capture_output=True, text=True, timeout=120)
            info = json.loads(shown.stdout)
            assert info["hits"] is not None and info["hit_rate"] is not None, f"README.md:{line}: {info}"
        if argv[1] == "inspect":
            assert json.loads(proc.stdout)["hits"] is not None, f"README.md:{line}"
        if argv[1] == "simulate":
            assert proc.stdout.splitlines()[0].count(",") >= 2, f"README.md:{line}: not CSV"
