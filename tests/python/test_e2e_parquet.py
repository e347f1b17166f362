"""The end-to-end comparison's Parquet configuration (bench/e2e.py --format
parquet) on a tiny setting: its invariants, not its timings."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("PIL")
pytest.importorskip("datasets")
pytest.importorskip("pyarrow")

from opt4torch.lab import e2e, e2e_parquet, e2e_parquet_report  # noqa: E402


def test_parquet_configurations_read_the_same_rows(tmp_path) -> None:
    setup = e2e.Setup(images=48, image_size=40, crop=32, epochs=2, batch=8, repeats=1, samplers=["shuffle"],
                      threads=4, format="parquet", parquet_shards=2, small_row_group=4,
                      configs=["hf-torch", "hf-opt", "parquet-opt", "parquet-opt-small", "memory"])
    path = e2e.prepare_data(str(tmp_path / "data"), setup, log=lambda m: None)
    result = e2e_parquet.run(setup, path, log=lambda m: None)
    runs = {c: rs[0] for c, rs in result["runs"]["shuffle"].items()}
    shards = result["shards"]
    assert len(shards) == 2 and all(os.path.getsize(p) > 0 for p in shards)
    import pyarrow.parquet as papq

    # The small rewrite holds the same rows in row groups of 4.
    small = papq.ParquetFile(os.path.join(os.path.dirname(shards[0]), "small", os.path.basename(shards[0])))
    assert small.metadata.num_rows == 24 and small.metadata.row_group(0).num_rows == 4
    label_sums = {c: r["label_sum"] for c, r in runs.items()}
    for c, r in runs.items():
        assert r["samples"] == setup.epochs * setup.images, (c, r)
        assert r["cpu_s"] > 0 and r["peak_memory_bytes"] > 0, (c, r)
    # Every configuration saw every row's label, once an epoch.
    assert len(set(label_sums.values())) == 1, label_sums
    for c in ("hf-opt", "parquet-opt", "parquet-opt-small"):
        r = runs[c]
        assert r["hits"] == r["plan_hits"] and r["fallbacks"] == 0 and r["timeouts"] == 0, (c, r)
    for c in ("parquet-opt", "parquet-opt-small"):
        assert runs[c]["storage_bytes"] == runs[c]["plan_miss_bytes"] > 0, (c, runs[c])
    written = e2e_parquet_report.write_outputs(result, str(tmp_path / "out"), {"cores": 2})
    md = (tmp_path / "out" / "e2e-parquet.md").read_text()
    assert "| opt4torch.Parquet (rows alone) | local |" in md and "(=)" in md
    assert json.loads((tmp_path / "out" / "e2e-parquet.json").read_text())["summary"]["shuffle"]["parquet-opt"]["exact"]
    assert written[-1].endswith(".png") and os.path.getsize(written[-1]) > 0
    bytes_target = e2e_parquet_report.targets(result["runs"]["shuffle"], "file")[-1]
    assert bytes_target.met is True, bytes_target


def test_litdata_budget_stays_under_its_slot_gate() -> None:
    mb = 10**6
    # Half of four 12.9 MB shards is two mean shards: LitData 0.2.76 turns its
    # slot gate on there, and deadlocks; one byte under, it is off.
    total = 4 * 12_868_695
    assert e2e_parquet.litdata_budget(total, 4, 0.5) == total // 2 - 1
    # Under the gate (10 MiB) the budget is as asked.
    assert e2e_parquet.litdata_budget(8 * mb, 4, 0.5) == 4 * mb
    # A budget under two mean shards is as asked.
    assert e2e_parquet.litdata_budget(100 * 12 * mb, 100, 0.01) == 12 * mb
