"""The real alternatives in the end-to-end harness (opt4torch.lab.peers): a
peer whose package or checkout is missing is skipped with a line saying why,
and the compat layer runs as an OPT4TorchDataSet user's code over the same
records. The peers themselves run in the bench environment (make bench-env);
here, in .venv, Streaming and LitData are not installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("cachetools")
pytest.importorskip("safetensors")

from opt4torch.lab import e2e, peers  # noqa: E402


@pytest.fixture(scope="module")
def record_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    setup = e2e.Setup(images=60, image_size=40, crop=32)
    return e2e.prepare_data(str(tmp_path_factory.mktemp("peers")), setup, log=lambda m: None)


def test_import_opt4torch_imports_no_peer() -> None:
    code = ("import sys, opt4torch, opt4torch.lab.e2e, opt4torch.lab.peers; "
            "print(sorted(m for m in ('streaming', 'litdata', 'torchvision', 'OPT4TorchDataSet') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_harness_lists_every_peer() -> None:
    assert e2e.PEERS == peers.PEERS and set(peers.SHARDED) <= set(peers.PEERS)
    assert e2e.ALL_CONFIGS == e2e.CONFIGS + e2e.PEERS + e2e.S3_ONLY
    assert set(e2e.S3_ONLY) <= set(e2e.OPT_CONFIGS)


def test_the_object_store_only_configuration_asks_for_the_store() -> None:
    setup = e2e.Setup(configs=["OPT + prefetch (s3torchconnector)"])
    with pytest.raises(ValueError, match="reads the object store: give --store s3"):
        e2e.run(setup, "no-such.rec")


def test_unavailable_reasons(tmp_path) -> None:
    setup = e2e.Setup()
    assert "--v11-src" in (peers.unavailable(peers.V11, setup) or "")
    setup.v11_src = str(tmp_path)
    assert "not an OPT4TorchDataSet checkout" in (peers.unavailable(peers.V11, setup) or "")
    assert peers.unavailable(peers.COMPAT, setup) is None
    for name, module in ((peers.STREAMING, "streaming"), (peers.STREAMING_TUNED, "streaming"),
                         (peers.LITDATA, "litdata")):
        why = peers.unavailable(name, setup)
        if importlib.util.find_spec(module) is None:
            assert why is not None and "make bench-env" in why
        else:
            assert why is None
            assert "epoch shuffle only" in (peers.unavailable(name, setup, "balanced") or "")


def test_missing_peers_are_skipped_and_compat_runs(record_path: str, tmp_path) -> None:
    setup = e2e.Setup(images=60, image_size=40, crop=32, epochs=2, batch=16, latency=0.001, repeats=1,
                      samplers=["shuffle"], configs=["no cache", peers.V11, peers.COMPAT])
    lines: list[str] = []
    result = e2e.run(setup, record_path, log=lines.append)
    assert result["skipped"] == {peers.V11: peers.unavailable(peers.V11, setup)}
    assert any(line.startswith(f"skipped {peers.V11}: ") for line in lines)
    runs = {c: rs[0] for c, rs in result["runs"]["shuffle"].items()}
    assert set(runs) == {"no cache", peers.COMPAT}
    compat = runs[peers.COMPAT]
    # The same order as the sampler's, every sample, and its counters agree
    # with the record file's: an access that did not read storage hit.
    assert compat["label_sum"] == runs["no cache"]["label_sum"]
    assert compat["samples"] == setup.epochs * setup.images
    assert compat["hits"] == compat["peer_stats"]["hits"] > 0
    assert compat["hits"] + compat["storage_reads"] == compat["samples"]
    # Every sample it returned was checked against the record's checksum.
    assert compat["wrong_samples"] == 0 and compat["undecodable_samples"] == 0
    # Capacity 50 %, two epochs of shuffle: Belady keeps C items through the
    # epoch boundary, and the compat layer is exact.
    assert compat["hits"] == setup.capacity_items
    e2e.write_outputs(result, str(tmp_path), {"cores": 2}, plots=True)
    md = (tmp_path / "e2e.md").read_text()
    assert f"| {peers.COMPAT} |" in md and f"- {peers.V11} was not run: " in md
    assert (tmp_path / "e2e-hits.png").stat().st_size > 0


def test_v11_record_packing(record_path: str) -> None:
    from opt4torch.records import RecordFile

    rf = RecordFile(record_path)
    slot = 16 + int(rf.item_sizes().max())
    ds = peers._V11Records(rf, slot, lambda sample: sample)
    for i in (0, 7, len(rf) - 1):
        t = ds.load(i)
        assert t.dtype.itemsize == 1 and tuple(t.shape) == (slot,)
        assert ds[i] == rf[i]
    assert np.all(ds.load(3).numpy()[16 + len(rf[3][0]):] == 0)
    rf.close()
