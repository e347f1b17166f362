"""The Python plan API over the C engine."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import TEXTBOOK

import opt4torch
from opt4torch import ADMIT, BYPASS, HIT, InvalidInputError, PlanFileError


def test_textbook_counts() -> None:
    p = opt4torch.plan(TEXTBOOK, 3, bypass=False)
    assert (p.misses, p.hits, p.bypasses) == (9, 11, 0)
    assert p.compulsory_misses == 6
    q = opt4torch.plan(TEXTBOOK, 3)
    assert (q.misses, q.bypasses, q.admits) == (8, 2, 6)
    assert q.policy == "opt" and p.policy == "opt-nobypass"
    assert q.hit_rate == pytest.approx(12 / 20)


def test_arrays_are_consistent(rng: np.random.Generator) -> None:
    seq = rng.integers(0, 50, size=3000)
    p = opt4torch.plan(seq, 12, items=50)
    assert p.seq.dtype == np.uint32 and np.array_equal(p.seq, seq)
    kinds, slots = p.kinds, p.slots
    assert np.count_nonzero(kinds == HIT) == p.hits
    assert np.count_nonzero(kinds == ADMIT) == p.admits
    assert np.count_nonzero(kinds == BYPASS) == p.bypasses
    assert np.all(slots[kinds == BYPASS] == -1)
    assert slots.max() < 12
    # Replaying the plan: every HIT finds its id in its slot.
    held = np.full(12, -1)
    victims = p.victims()
    for t, (x, kind, slot) in enumerate(p):
        if kind == HIT:
            assert held[slot] == x
            assert victims[t] == -1
        elif kind == ADMIT:
            assert victims[t] == held[slot]
            held[slot] = x
    assert np.array_equal(p.slots_at(len(p)), held)


def test_resident_at_is_live_subset(rng: np.random.Generator) -> None:
    seq = rng.integers(0, 30, size=500)
    p = opt4torch.plan(seq, 8, items=30)
    for t in (0, 1, 100, 250, 499, 500):
        live = p.resident_at(t)
        assert len(live) <= 8
        assert set(live.tolist()) <= set(seq[t:].tolist())
        assert set(live.tolist()) <= set(p.slots_at(t).tolist())


def test_arrays_are_read_only_and_keep_the_plan_alive() -> None:
    p = opt4torch.plan(TEXTBOOK, 3)
    ops = p.ops
    with pytest.raises(ValueError):
        ops[0] = 1
    with pytest.raises(BufferError):
        p.close()
    del ops
    p.close()
    with pytest.raises(ValueError, match="closed"):
        _ = p.seq


def test_inputs_of_many_kinds() -> None:
    import torch

    want = opt4torch.plan(TEXTBOOK, 3).ops.copy()
    for seq in (
        TEXTBOOK,
        tuple(TEXTBOOK),
        np.array(TEXTBOOK, dtype=np.int32),
        np.array(TEXTBOOK, dtype=np.uint64),
        np.array(TEXTBOOK, dtype=np.int16),
        np.array(TEXTBOOK, dtype=np.float64),
        torch.tensor(TEXTBOOK),
        iter(TEXTBOOK),
    ):
        assert np.array_equal(opt4torch.plan(seq, 3).ops, want), type(seq)


@pytest.mark.parametrize(
    ("seq", "kwargs", "match"),
    [
        ([0, 1, -1], {}, "position 2 is negative"),
        ([0, 1, 5], {"items": 3}, r"id 5 at position 2 is outside \[0, 3\)"),
        ([0, 1], {"items": 0}, "items must be at least 1"),
        ([0.5, 1.0], {}, "integer item ids"),
        ([[0, 1]], {}, "one-dimensional"),
        ([], {}, "empty sequence"),
    ],
)
def test_bad_sequences(seq: list, kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        opt4torch.plan(seq, 2, **kwargs)


@pytest.mark.parametrize("capacity", [0, -3, 2.5, "8", True])
def test_bad_capacity(capacity: object) -> None:
    with pytest.raises(InvalidInputError, match="capacity"):
        opt4torch.plan(TEXTBOOK, capacity)  # type: ignore[arg-type]


def test_empty_sequence_with_items() -> None:
    p = opt4torch.plan([], 4, items=10)
    assert (p.accesses, p.hits, p.misses) == (0, 0, 0)
    assert p.seq.size == 0 and p.ops.size == 0


def test_save_load_roundtrip(tmp_path, rng: np.random.Generator) -> None:
    seq = rng.integers(0, 200, size=10_000)
    p = opt4torch.plan(seq, 40, items=200, description=json.dumps({"seed": 7}))
    path = tmp_path / "p.opt4"
    p.save(path)
    q = opt4torch.load_plan(path)
    assert q.path == str(path)
    assert q.stats() == p.stats()
    assert q.stats()["description"] == {"seed": 7}
    assert np.array_equal(q.ops, p.ops) and np.array_equal(q.seq, p.seq)
    assert q.fingerprint == opt4torch.fingerprint(seq, items=200)


def test_sequence_only_plan_and_with_capacity(tmp_path) -> None:
    p = opt4torch.sequence_plan(TEXTBOOK, items=8)
    assert not p.has_decisions and p.capacity == 0
    assert p.stats()["hits"] is None
    with pytest.raises(InvalidInputError, match="no cache decisions"):
        _ = p.ops
    p.save(tmp_path / "s.opt4")
    q = opt4torch.load_plan(tmp_path / "s.opt4").with_capacity(3, bypass=False)
    assert q.misses == 9 and q.fingerprint == p.fingerprint


def test_missing_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        opt4torch.load_plan(tmp_path / "nope.opt4")


def _saved(tmp_path) -> bytes:
    p = opt4torch.plan(list(range(50)) * 4, 10)
    p.save(tmp_path / "ok.opt4")
    return (tmp_path / "ok.opt4").read_bytes()


def test_damaged_files_raise_clear_errors(tmp_path) -> None:
    data = _saved(tmp_path)
    cases = {
        "truncated": (data[: len(data) // 2], "truncated"),
        "header-only": (data[:100], "truncated"),
        "pickle": (b"\x80\x04\x95" + data[3:], "not an opt4 plan file.*earlier OPT4TorchDataSet"),
        "newer": (data[:8] + (2).to_bytes(4, "little") + data[12:], "newer.*upgrade opt4torch"),
        "flipped": (data[:-1] + bytes([data[-1] ^ 0xFF]), "checksum"),
        "trailing": (data + b"\0" * 8, "trailing data"),
    }
    for name, (blob, match) in cases.items():
        path = tmp_path / f"{name}.opt4"
        path.write_bytes(blob)
        with pytest.raises(PlanFileError, match=match) as info:
            opt4torch.load_plan(path)
        assert str(path) in str(info.value), name
        assert info.value.code_name.startswith("OPT4_E")


def test_every_truncation_is_refused(tmp_path) -> None:
    data = _saved(tmp_path)
    from opt4torch import _engine

    for n in range(0, len(data), 7):
        with pytest.raises(PlanFileError):
            _engine.load_plan_bytes(data[:n])


def test_save_is_atomic_and_reports_errors(tmp_path) -> None:
    p = opt4torch.plan(TEXTBOOK, 3)
    with pytest.raises(opt4torch.Opt4IOError, match="No such file"):
        p.save(tmp_path / "missing-dir" / "x.opt4")
    assert not any(tmp_path.iterdir())  # no temporary file left behind


def test_fingerprint_is_dtype_independent() -> None:
    a = opt4torch.fingerprint(np.array(TEXTBOOK, dtype=np.int64))
    b = opt4torch.fingerprint(np.array(TEXTBOOK, dtype=np.uint32))
    c = opt4torch.fingerprint(TEXTBOOK[:-1] + [2])
    assert a == b != c


def test_progress_counter_reaches_the_end(capsys) -> None:
    seq = np.arange(200_000) % 1000
    p = opt4torch.plan(seq, 100, progress=True)
    assert p.hits == opt4torch.plan(seq, 100, progress=False).hits
    # The bar counts accesses (200k), not the engine's three passes (600k).
    err = capsys.readouterr().err
    assert "planning" in err and "/200k" in err and "600k" not in err, err


def test_import_needs_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, opt4torch; opt4torch.plan([0, 1, 0], 1); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_raw_typed_buffers() -> None:
    import array

    want = opt4torch.plan(TEXTBOOK, 3).ops.copy()
    raw64 = np.array(TEXTBOOK, dtype=np.int64).tobytes()
    assert np.array_equal(opt4torch.plan(memoryview(raw64).cast("q"), 3).ops, want)
    assert np.array_equal(opt4torch.plan(array.array("i", TEXTBOOK), 3).ops, want)
    assert np.array_equal(opt4torch.plan(np.frombuffer(raw64, dtype=np.int64), 3).ops, want)
