"""The end-to-end harness (bench/e2e.py, the tail of `opt4torch demo`) on a
tiny setting: its invariants, not its timings."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("cachetools")

from opt4torch.lab import e2e  # noqa: E402


@pytest.fixture(scope="module")
def record_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    setup = e2e.Setup(images=100, image_size=40, crop=32)
    return e2e.prepare_data(str(tmp_path_factory.mktemp("e2e")), setup, log=lambda m: None)


def check(result: dict, setup: e2e.Setup) -> None:
    for sampler, configs in result["runs"].items():
        runs = {c: rs[0] for c, rs in configs.items()}
        opt = runs["OPT"]
        for c, r in runs.items():
            # Every configuration trained on the same order, every sample of it.
            assert r["samples"] == setup.epochs * setup.images, (sampler, c, r)
            assert r["label_sum"] == opt["plan_label_sum"], (sampler, c, r)
            assert 0 <= r["hits"] <= r["samples"] and 0.0 <= r["stall_rate"] <= 1.0, (sampler, c, r)
            assert r["cpu_s"] > 0 and r["peak_memory_bytes"] > 0, (sampler, c, r)
        for c in ("OPT", "OPT + prefetch"):
            r = runs[c]
            assert r["hits"] == r["plan_hits"], (sampler, c, r)
            assert r["storage_bytes"] == r["plan_miss_bytes"], (sampler, c, r)
            assert r["fallbacks"] == 0 and r["timeouts"] == 0, (sampler, c, r)
        assert runs["OPT + prefetch"]["prefetched"] > 0
        assert runs["OPT + prefetch"]["plan_miss_bytes"] == opt["plan_miss_bytes"]
        # No policy with the same capacity, shared by the workers, beats OPT.
        for c in ("shared LRU", "static"):
            assert runs[c]["hits"] <= opt["hits"], (sampler, c)
        assert runs["no cache"]["storage_reads"] == runs["no cache"]["samples"]
        assert runs["in memory"]["storage_bytes"] == 0
        s = result["summary"][sampler]
        assert s["OPT"]["exact"] and s["OPT + prefetch"]["exact"]


def test_e2e_invariants_shuffle(record_path: str, tmp_path) -> None:
    setup = e2e.Setup(images=100, image_size=40, crop=32, epochs=2, batch=16, latency=0.001, repeats=1,
                      samplers=["shuffle"], threads=4)
    result = e2e.run(setup, record_path, log=lambda m: None)
    check(result, setup)
    # Epoch shuffle, two epochs: the static cache gets what OPT gets (C hits).
    runs = {c: rs[0] for c, rs in result["runs"]["shuffle"].items()}
    assert runs["static"]["hits"] == runs["OPT"]["hits"] == setup.capacity_items
    written = e2e.write_outputs(result, str(tmp_path), {"cores": 2}, plots=True)
    md = (tmp_path / "e2e.md").read_text()
    assert "| OPT + prefetch |" in md and "(plan: equal)" in md
    assert json.loads((tmp_path / "e2e.json").read_text())["summary"]["shuffle"]["OPT"]["exact"]
    assert sum(p.endswith(".png") for p in written) == 2
    assert [t[2] for t in e2e.targets(result)][-1] is True  # bytes read = the plan's


@pytest.mark.slow
def test_e2e_invariants_replacement_and_balanced(record_path: str) -> None:
    setup = e2e.Setup(images=100, image_size=40, crop=32, epochs=2, batch=16, latency=0.001, repeats=1,
                      samplers=["replacement", "balanced"], threads=4,
                      configs=["no cache", "LRU (cachetools)", "shared LRU", "static", "OPT", "OPT + prefetch",
                               "in memory"])
    check(e2e.run(setup, record_path, log=lambda m: None), setup)


def test_balanced_sampler_draws_small_classes_more(record_path: str) -> None:
    from opt4torch.capture import capture
    from opt4torch.records import RecordFile

    labels = RecordFile(record_path).labels
    counts = np.bincount(labels)
    assert counts[0] > 3 * counts[-1]  # unequal classes
    seq = capture(e2e.make_sampler("balanced", labels, 0), 20)
    drawn = np.bincount(labels[seq], minlength=len(counts)) / seq.size
    assert np.all(np.abs(drawn - 1 / len(counts)) < 0.03)


def test_e2e_over_the_s3_server(record_path: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """store="s3": the images go to the loopback S3 server as objects and every
    configuration reads them there; the server's counts agree with the
    readers' own (no cache: one GET a sample; OPT: the plan's miss bytes,
    exactly; in memory: none)."""
    pytest.importorskip("moto", reason="needs moto[server] (requirements-dev.txt)")
    pytest.importorskip("s3torchconnector", reason="needs s3torchconnector (requirements-dev.txt)")
    pytest.importorskip("boto3", reason="needs boto3 (requirements-dev.txt)")
    from s3store import Server

    for k, v in (("AWS_ACCESS_KEY_ID", "e2e"), ("AWS_SECRET_ACCESS_KEY", "e2e"), ("AWS_DEFAULT_REGION", "us-east-1"),
                 ("AWS_EC2_METADATA_DISABLED", "true")):
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(k, raising=False)
    last = str((os.cpu_count() or 1) - 1)
    with Server(0.001, cpus=last) as server:
        setup = e2e.Setup(images=100, image_size=40, crop=32, epochs=2, batch=16, latency=0.001, repeats=1,
                          samplers=["shuffle"], threads=4, store="s3", s3_endpoint=server.endpoint,
                          s3_server_pid=server.proc.pid, server_cpus=last,
                          configs=["no cache", "LRU (cachetools)", "OPT", "OPT + prefetch", "in memory"])
        result = e2e.run(setup, record_path, log=lambda m: None)
    runs = {c: rs[0] for c, rs in result["runs"]["shuffle"].items()}
    opt = runs["OPT"]
    for c, r in runs.items():
        assert r["samples"] == setup.epochs * setup.images, (c, r)
        assert r["label_sum"] == opt["plan_label_sum"], (c, r)
        assert r["store_gets"] == r["storage_reads"] and r["store_get_bytes"] == r["storage_bytes"], (c, r)
        assert r["server_cpu_s"] is not None and r["server_cpu_s"] >= 0, (c, r)
    assert runs["no cache"]["store_gets"] == runs["no cache"]["samples"]
    assert runs["in memory"]["store_gets"] == 0
    for c in ("OPT", "OPT + prefetch"):
        assert runs[c]["hits"] == runs[c]["plan_hits"] and runs[c]["store_get_bytes"] == runs[c]["plan_miss_bytes"]
    assert runs["OPT + prefetch"]["prefetched"] > 0
    assert runs["LRU (cachetools)"]["hits"] <= opt["hits"]
    md = e2e.markdown(result)
    assert "an S3-compatible server on the loopback address" in md and "the server's CPU" in md
    assert f"the S3 server on CPU {last}" in md
