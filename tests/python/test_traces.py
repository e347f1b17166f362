"""Trace files in and out."""

from __future__ import annotations

import numpy as np
import pytest

from opt4torch import InvalidInputError
from opt4torch.traces import epoch_shuffle, load_trace, save_trace, uniform


def test_roundtrip_text_and_npy(tmp_path) -> None:
    seq = uniform(100, 1000, seed=1)
    for name in ("t.txt", "t.npy"):
        save_trace(tmp_path / name, seq)
        assert np.array_equal(load_trace(tmp_path / name), seq)


def test_generators_are_seeded() -> None:
    assert np.array_equal(uniform(10, 50, seed=3), uniform(10, 50, seed=3))
    e = epoch_shuffle(20, 3, seed=4)
    assert e.size == 60 and all(sorted(e[i * 20:(i + 1) * 20]) == list(range(20)) for i in range(3))


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("words.txt", b"1\n2\nthree\n", "one integer id per line"),
        ("cols.txt", b"1 2\n3 4\n", "one id per line"),
        ("float.npy", None, "1-D integer array"),
        ("junk.npy", b"not numpy at all", "not a readable .npy"),
    ],
)
def test_bad_traces(tmp_path, name: str, content: bytes | None, match: str) -> None:
    path = tmp_path / name
    if content is None:
        np.save(path, np.array([0.5, 1.5]))
    else:
        path.write_bytes(content)
    with pytest.raises(InvalidInputError, match=match):
        load_trace(path)
