"""The cached tar index, <shard>.opt4idx.json, as a hostile file (issue 38,
bug 1): a real FIFO at its path, a link to /dev/zero, a file larger than
any index of its shard, deep nesting, Infinity, and ranges swapped under the
right identity. Each is rebuilt with a warning naming what was wrong, within
the test's timeout, and the samples read afterwards are the shard's own.
The reader is also fed hostile bytes by hypothesis."""

from __future__ import annotations

import io
import json
import os
import tarfile
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opt4torch
from opt4torch import sources
from opt4torch.sources import local
from opt4torch.sources import tarindex as _tarindex

pytestmark = pytest.mark.timeout(60)


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    tf.addfile(ti, io.BytesIO(data))


@pytest.fixture
def shard(tmp_path) -> str:
    path = os.fspath(tmp_path / "s.tar")
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(6):
            _add(tf, f"k{i}.jpg", bytes([i]) * (100 + 37 * i))
            _add(tf, f"k{i}.cls", str(i).encode())
    return path


def _want(shard: str) -> list[dict]:
    return [{"__key__": f"k{i}", "jpg": bytes([i]) * (100 + 37 * i), "cls": str(i).encode()} for i in range(6)]


def _rebuilt(shard: str, match: str, *, stays: bool = False) -> None:
    """TarShards over shard warns `match`, reads the shard's own samples, and
    leaves a good index behind (read again without a warning); or, when what
    was planted is not a regular file (`stays`: the writer never replaces
    one), refuses it again the next time, as fast."""
    with pytest.warns(RuntimeWarning, match=match):
        ds = opt4torch.TarShards([shard])
    assert [dict(s) for s in ds] == _want(shard)
    if stays:
        with pytest.warns(RuntimeWarning, match=match):
            assert [dict(s) for s in opt4torch.TarShards([shard])] == _want(shard)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [dict(s) for s in opt4torch.TarShards([shard])] == _want(shard)


def _index(shard: str) -> dict:
    opt4torch.TarShards([shard])
    with open(shard + ".opt4idx.json", encoding="ascii") as f:
        return json.load(f)


def _plant(shard: str, text: str | bytes) -> None:
    where = shard + ".opt4idx.json"
    if os.path.lexists(where):
        os.unlink(where)
    with open(where, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)


def test_a_fifo_at_the_index_path_is_refused_not_waited_on(shard: str) -> None:
    os.mkfifo(shard + ".opt4idx.json")
    _rebuilt(shard, r"not a regular file \(a FIFO\)", stays=True)


def test_a_link_to_dev_zero_is_refused_not_read(shard: str) -> None:
    os.symlink("/dev/zero", shard + ".opt4idx.json")
    _rebuilt(shard, r"not a regular file \(a character device\)", stays=True)


def test_an_index_larger_than_its_shard_allows_is_not_read(shard: str) -> None:
    where = shard + ".opt4idx.json"
    with open(where, "wb") as f:  # sparse: 8 GiB that take no disk, and must not be read
        f.truncate(8 << 30)
    _rebuilt(shard, r"it is 8589934592 bytes, more than an index of this shard can be")


def test_deep_nesting_is_refused_before_parsing(shard: str) -> None:
    _plant(shard, "[" * 200_000 + "]" * 200_000)
    _rebuilt(shard, "nests deeper than an index does")
    body = _index(shard)  # deep inside a well-formed body, where the samples go
    body["samples"] = [[[[[[[[1]]]]]]]]
    _plant(shard, json.dumps(body))
    _rebuilt(shard, "nests deeper")


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e400", "1.5", "9" * 5000, "-1",
                                    str(2**63)])
def test_numbers_an_index_never_holds_are_refused(shard: str, number: str) -> None:
    body = _index(shard)
    text = json.dumps(body).replace(f'"k2", {body["samples"][2][1]},', f'"k2", {number},', 1)
    assert number in text
    _plant(shard, text)
    _rebuilt(shard, "is corrupt")


def test_swapped_ranges_under_the_right_identity_are_refused(shard: str) -> None:
    body = _index(shard)
    assert body["shard"] == local._shard_id(os.stat(shard))  # the identity stays right throughout
    s = body["samples"]
    s[0][1:], s[1][1:] = s[1][1:], s[0][1:]  # k0 would read k1's bytes
    _plant(shard, json.dumps(body))
    _rebuilt(shard, "overlaps or precedes the sample before it")


@pytest.mark.parametrize("edit, match", [
    (lambda s: s[4].__setitem__(1, s[4][1] - 600), "where tar holds no member's data"),  # inside k3's padding
    (lambda s: s[4].__setitem__(1, s[4][1] - 512), "where tar holds no member's data"),  # onto its own header
    (lambda s: s[4].__setitem__(1, s[3][1] + 3), "overlaps or precedes"),  # inside the sample before
    (lambda s: s[5].__setitem__(1, s[5][1] + 10**6), "lies outside the shard"),
    (lambda s: s[1][3].reverse(), "lies outside the sample or overlaps"),  # fields out of order
    (lambda s: s[1][3][1].__setitem__(0, "jpg"), "has a field twice"),
    (lambda s: s[2][3][1].__setitem__(2, 0), "its last field ends at"),
    (lambda s: s[2].__setitem__(3, []), "is not \\[key, offset, length"),
    (lambda s: s[2].__setitem__(0, 7), "not a string"),
    (lambda s: s[4][3][0].__setitem__(1, True), "not an integer"),
])
def test_inconsistent_ranges_are_refused(shard: str, edit, match: str) -> None:
    body = _index(shard)
    edit(body["samples"])
    _plant(shard, json.dumps(body))
    _rebuilt(shard, match)


def test_an_index_that_is_not_ascii_is_refused(shard: str) -> None:
    body = _index(shard)
    _plant(shard, json.dumps(body, ensure_ascii=False).replace('"k3"', '"k\u00e9"'))
    _rebuilt(shard, "not ASCII")


def test_a_shard_rewritten_in_place_with_its_mtime_put_back_is_indexed_again(shard: str) -> None:
    """Same size, same inode, mtime restored (as rsync -t or touch -d do):
    only ctime tells, and the index holds it (issue 38, bug 2)."""
    opt4torch.TarShards([shard])
    before = os.stat(shard)
    data = bytearray(open(shard, "rb").read())
    ds = opt4torch.TarShards([shard])
    off = int(ds._rows[2, 1])
    data[off:off + 174] = b"\x07" * 174  # k2's jpg, the headers left as they were: same size
    with open(shard, "r+b") as f:  # in place: same inode
        f.write(data)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(shard)
    assert (after.st_size, after.st_ino, after.st_mtime_ns) == (before.st_size, before.st_ino, before.st_mtime_ns)
    assert after.st_ctime_ns != before.st_ctime_ns

    def indexed(path: str):
        calls.append(path)
        return real(path)

    calls: list[str] = []
    real = sources._engine.tar_index
    sources._engine.tar_index = indexed
    try:
        ds = opt4torch.TarShards([shard])
    finally:
        sources._engine.tar_index = real
    assert calls == [shard], "the stale index was used"
    assert ds[2]["jpg"] == b"\x07" * 174


def test_the_s3_index_cache_is_read_as_hostile_too(tmp_path) -> None:
    """S3TarShards reads its index from the user's cache folder through the
    same reader: a FIFO there is refused, not waited on."""
    ident = {"url": "s3://b/s.tar", "endpoint": "", "size": 4096, "etag": '"x"'}
    where = os.fspath(tmp_path / "idx.json")
    os.mkfifo(where)
    with pytest.warns(RuntimeWarning, match="a FIFO"):
        assert _tarindex.read_index(where, "s3://b/s.tar", ident) is None


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(
    st.binary(max_size=2000),
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
                 lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=6), kids, max_size=5),
                 max_leaves=40).map(lambda v: json.dumps(v).encode()),
    st.builds(lambda samples: json.dumps({"format": _tarindex.INDEX_FORMAT, "version": 1, "shard": {"size": 5000},
                                          "samples": samples}).encode(),
              st.lists(st.lists(st.one_of(st.text(max_size=3), st.integers(-5, 6000),
                                          st.lists(st.lists(st.one_of(st.text(max_size=3),
                                                                      st.integers(-5, 6000)), max_size=4),
                                                   max_size=3)), max_size=5), max_size=6)),
))
def test_hostile_index_bytes_never_escape_and_never_give_bad_ranges(tmp_path_factory, raw: bytes) -> None:
    """Whatever the bytes, the reader returns None (with or without a
    warning) or samples that satisfy every range rule; it never raises."""
    where = os.fspath(tmp_path_factory.mktemp("idx") / "i.json")
    with open(where, "wb") as f:
        f.write(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _tarindex.read_index(where, "s.tar", {"size": 5000})
    if got is None:
        return
    end = 0
    for key, off, length, members in got:
        assert isinstance(key, str) and off >= end and off + length <= 5000
        end = off + length
        at = 0
        for i, (field, mo, ms) in enumerate(members):
            assert isinstance(field, str) and (mo == 0 if i == 0 else mo >= at) and mo + ms <= length
            at = mo + ms
        assert at == length and members


@pytest.mark.parametrize("xxh3", [12, "zz" * 8 * 6, "AB" * 8 * 6, "00" * 8 * 5, "00" * 8 * 7, " 0" * 8 * 6])
def test_malformed_checksums_in_an_index_are_refused(shard: str, xxh3) -> None:
    """``"xxh3"`` must be 16 lower-case hex digits a sample: anything else
    (a number, not hex, upper case, one sample short or over, whitespace,
    which bytes.fromhex would skip) makes the index corrupt: rebuilt."""
    body = _index(shard)
    body["xxh3"] = xxh3
    _plant(shard, json.dumps(body))
    _rebuilt(shard, r"its checksums are (a int|not 16 lower-case hex digits)")


def test_planted_checksums_never_pass_a_changed_sample(shard: str) -> None:
    """Checksums planted in an index that matches its shard (wrong ones)
    fail the reads they cover, naming the sample; they never make a read
    return other bytes."""
    body = _index(shard)
    body["xxh3"] = "0123456789abcdef" * 6
    _plant(shard, json.dumps(body))
    ds = opt4torch.TarShards([shard], checksum=True)
    with pytest.raises(opt4torch.Opt4Error, match=r"item 0 \(\d+ bytes of .*s\.tar\) does not match the checksum"):
        ds[0]


_SUMS = st.one_of(st.none(), st.integers(), st.text(alphabet="0123456789abcdefABCDEF ", max_size=120),
                  st.binary(min_size=0, max_size=24).map(bytes.hex))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 4), sums=_SUMS)
def test_hostile_checksums_never_escape_and_have_one_a_sample(tmp_path_factory, n: int, sums) -> None:
    """The checksum field fuzzed over a well-formed index of n samples:
    load_index returns None (rebuild), or one uint64 a sample, equal to the
    hex it was given."""
    samples = [[f"k{i}", 512 * (1 + 2 * i), 10, [["bin", 0, 10]]] for i in range(n)]
    body = {"format": _tarindex.INDEX_FORMAT, "version": 1, "shard": {"size": 5000}, "samples": samples}
    if sums is not None:
        body["xxh3"] = sums
    where = os.fspath(tmp_path_factory.mktemp("idx") / "i.json")
    with open(where, "w") as f:
        json.dump(body, f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _tarindex.load_index(where, "s.tar", {"size": 5000})
    if got is None:
        assert sums is not None
        return
    rows, have = got
    assert len(rows) == n
    if sums is None:
        assert have is None
    else:
        assert have.dtype == np.uint64 and len(have) == n
        assert [int(v) for v in have] == [int(sums[16 * i:16 * i + 16], 16) for i in range(n)]
