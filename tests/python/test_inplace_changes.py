"""Files read in place that change under their reader (issue 38, bugs 2-4):
an image or a shard rewritten in place at its old size with its mtime put
back, an image replaced by a longer one, and a FIFO where an indexed image
or shard was. Each read of a changed item fails naming it, at once, in
``ds[i]``, in the prefetch threads and in fork workers; no other item's
bytes are ever returned and nothing blocks."""

from __future__ import annotations

import io
import os
import pickle
import re
import tarfile
import time

import numpy as np
import pytest

import opt4torch
from opt4torch import _engine
from opt4torch.sources import FolderLoopError

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_leaked_pools")]


def _image(i: int) -> bytes:
    return bytes([i % 251]) * (300 + 17 * i)


@pytest.fixture
def folder(tmp_path) -> str:
    root = tmp_path / "imgs"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
    for i in range(24):
        (root / ("a" if i % 2 else "b") / f"{i:03d}.jpg").write_bytes(_image(i))
    return os.fspath(root)


def _rewrite_same_size(path: str, data: bytes) -> None:
    """Write data over path in place (same inode), then put its mtime back."""
    before = os.stat(path)
    assert len(data) == before.st_size
    time.sleep(0.01)  # ctime has ns resolution, but a coarse clock could tick 0 between the two writes
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def test_an_image_rewritten_in_place_is_refused_naming_it(folder: str) -> None:
    ds = opt4torch.ImageFolder(folder)
    path, _ = ds.samples[5]
    first = ds[5][0]
    _rewrite_same_size(path, bytes(reversed(first)) if first != first[::-1] else b"\x01" * len(first))
    with pytest.raises(opt4torch.Opt4Error, match=rf"{os.path.basename(path)} was not served: the file changed "
                                                  r"since it was indexed \(another ctime"):
        ds[5]
    assert ds[6][0] == open(ds.samples[6][0], "rb").read()  # the others still read


def test_an_image_replaced_by_a_longer_one_is_not_served_as_a_prefix(folder: str) -> None:
    ds = opt4torch.ImageFolder(folder)
    path, _ = ds.samples[3]
    with open(path, "ab") as f:  # in place, longer: the old read returned the new file's prefix
        f.write(b"more")
    with pytest.raises(opt4torch.Opt4Error, match=r"changed since it was indexed \(another size; \d+ bytes now"):
        ds[3]


def test_a_shard_rewritten_in_place_is_refused_naming_it(tmp_path) -> None:
    shard = os.fspath(tmp_path / "s.tar")
    with tarfile.open(shard, "w") as tf:
        for i in range(4):
            ti = tarfile.TarInfo(f"k{i}.bin")
            ti.size = 600
            tf.addfile(ti, io.BytesIO(bytes([i]) * 600))
    ds = opt4torch.TarShards([shard])
    assert ds[1]["bin"] == b"\x01" * 600
    data = bytearray(open(shard, "rb").read())
    off = int(ds._rows[1, 1])
    data[off:off + 600] = b"\x09" * 600  # k1's bytes swapped for others, headers intact: same size
    _rewrite_same_size(shard, bytes(data))
    for i in (0, 1, 3):  # the kept descriptor is checked on every read, not only the item written
        with pytest.raises(opt4torch.Opt4Error, match=rf"item {i} of {shard} was not served: the file changed"):
            ds[i]


def _fifo_over(path: str) -> None:
    os.unlink(path)
    os.mkfifo(path)


def test_a_fifo_where_an_image_was_fails_at_once(folder: str) -> None:
    ds = opt4torch.ImageFolder(folder)
    path, _ = ds.samples[7]
    _fifo_over(path)
    t0 = time.monotonic()
    with pytest.raises(opt4torch.Opt4Error, match=r"is not a regular file \(a FIFO \(named pipe\)\) and was not "
                                                  "read"):
        ds[7]
    assert time.monotonic() - t0 < 5
    os.unlink(path)
    os.symlink("/dev/zero", path)  # a device of endless bytes: refused too, not read
    with pytest.raises(opt4torch.Opt4Error, match=r"not a regular file \(a character device\)"):
        ds[7]


def test_a_fifo_where_a_shard_was_fails_at_once(tmp_path) -> None:
    shard = os.fspath(tmp_path / "s.tar")
    with tarfile.open(shard, "w") as tf:
        ti = tarfile.TarInfo("k.bin")
        ti.size = 10
        tf.addfile(ti, io.BytesIO(b"0123456789"))
    ds = opt4torch.TarShards([shard])  # indexed, not yet opened for reading
    _fifo_over(shard)
    with pytest.raises(opt4torch.Opt4Error, match=r"not a regular file \(a FIFO"):
        ds[0]


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_fifo_in_the_folder_fails_fork_workers_and_prefetch_never_blocks(folder: str, prefetch: bool) -> None:
    """The epoch fails with the error naming the FIFO, within the timeout,
    whether the item is read by a prefetch thread or a fork worker; no
    worker is left behind."""
    ds = opt4torch.ImageFolder(folder)
    path, _ = ds.samples[11]
    _fifo_over(path)
    loader = opt4torch.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=2,
                                  multiprocessing_context="fork", cache_items=6, epochs=1, prefetch=prefetch,
                                  prefetch_threads=2, collate_fn=list)
    t0 = time.monotonic()
    message = ""
    try:
        for _ in loader:
            pass
    except Exception as exc:  # torch re-raises the worker's error with its traceback as text
        message = str(exc)
    del loader  # the pool goes with the loader (the exception's frames held it)
    assert time.monotonic() - t0 < 30
    assert re.search(rf"{re.escape(path)}: it is not a regular file \(a FIFO", message), message


def test_a_workers_error_joins_the_workers_as_the_exception_goes(folder: str) -> None:
    """After a worker's error, torch's iterator and its workers end when the
    exception is dropped, not at some later garbage collection (whose
    __del__ waited 5 s a worker: 10 s here, loader/iterator.py)."""
    import gc
    import multiprocessing

    ds = opt4torch.ImageFolder(folder)
    _fifo_over(ds.samples[5][0])
    loader = opt4torch.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=2,
                                  multiprocessing_context="fork", cache_items=6, epochs=1, collate_fn=list)
    before = set(multiprocessing.active_children())
    gc.disable()  # what is left for a collection stays
    try:
        try:
            for _ in loader:
                pass
        except Exception as exc:
            assert "not a regular file" in str(exc)
        else:
            raise AssertionError("the FIFO's read did not fail")
        assert set(multiprocessing.active_children()) <= before  # joined already
    finally:
        gc.enable()
    del loader


def test_symlink_loops_in_an_image_folder_are_refused_naming_the_path(tmp_path) -> None:
    """Two real symlink loops (was: still walking after 90 s; one loop turned
    6 files into 246 items, as torchvision's walk does): refused at once,
    naming the folder the loop closes at."""
    root = tmp_path / "loops"
    (root / "a" / "sub").mkdir(parents=True)
    (root / "b").mkdir()
    for k in range(3):
        (root / "a" / "sub" / f"{k}.jpg").write_bytes(b"a" * (k + 1))
        (root / "b" / f"{k}.jpg").write_bytes(b"b" * (k + 1))
    os.symlink("..", root / "a" / "sub" / "back")  # a/sub/back is a again
    os.symlink("..", root / "b" / "up")  # b/up is the root: b/up/b is b again
    t0 = time.monotonic()
    with pytest.raises(FolderLoopError, match=r"loops/a/sub/back is the folder .*loops/a again "
                                                                r"\(a symbolic link back to its own ancestor\)"):
        opt4torch.ImageFolder(root)
    assert time.monotonic() - t0 < 5
    os.unlink(root / "a" / "sub" / "back")
    with pytest.raises(FolderLoopError, match=r"loops/b/up/b is the folder .*loops/b again"):
        opt4torch.ImageFolder(root)
    os.unlink(root / "b" / "up")
    os.symlink("../a/sub", root / "b" / "other")  # a link that is no loop is followed, as torchvision does
    ds = opt4torch.ImageFolder(root)
    assert len(ds) == 9 and sum(1 for p, _ in ds.samples if "/b/other/" in p) == 3


# ---- checksum=True: a change the identity cannot show ----

_CHANGED = r"does not match the checksum recorded when it was indexed"


def _force_identity(ds, rows) -> None:
    """Give the reader the identity its files have now, as a filesystem
    whose ctime means nothing (or a clock put back) would show them: from
    here on, only a checksum can tell a rewrite."""
    for k in rows:
        st = os.stat(ds._files[k])
        ds._idents[k] = (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
    ds._r.close()
    ds._open_ranges()


def test_an_image_rewritten_under_a_forced_identity_is_caught_by_its_checksum(folder: str) -> None:
    """A real rewrite in place (same size, mtime put back) whose identity is
    then forced equal: without checksum=True the new bytes are served as the
    old item (what the checksum is for); with it the read fails naming the
    item, the others read, and a reader made after the change fails too."""
    plain, checked = opt4torch.ImageFolder(folder), opt4torch.ImageFolder(folder, checksum=True)
    assert checked.checksum and not plain.checksum and checked._sums.dtype == np.uint64
    assert [checked[i] for i in range(len(checked))] == [plain[i] for i in range(len(plain))]
    path, _ = checked.samples[5]
    old = checked[5][0]
    new = bytes(reversed(old)) if old != old[::-1] else b"\x01" * len(old)
    _rewrite_same_size(path, new)
    for ds in (plain, checked):
        _force_identity(ds, [5])
    assert plain[5][0] == new  # a wrong sample, served: the identity alone cannot see it
    with pytest.raises(opt4torch.Opt4Error, match=rf"item 5 \({len(old)} bytes of {re.escape(path)}\) {_CHANGED}"):
        checked[5]
    assert checked[6][0] == open(checked.samples[6][0], "rb").read()
    assert checked.info()["reads"] == 1  # (the reader was made anew above) a refusal is not counted
    with pytest.raises(opt4torch.Opt4Error, match=_CHANGED):  # a spawned worker's copy checks too
        pickle.loads(pickle.dumps(checked))[5]


def test_checksumming_at_indexing_is_not_counted_as_reads(folder: str) -> None:
    ds = opt4torch.ImageFolder(folder, checksum=True)
    assert ds.info()["reads"] == 0 and ds.info()["bytes_read"] == 0
    assert [ds[i][0] for i in range(len(ds))] == [_image(int(os.path.basename(p)[:3])) for p, _ in ds.samples]
    assert ds.info()["reads"] == len(ds)


def test_a_checksum_failure_fails_fork_workers_and_the_prefetch_threads(folder: str) -> None:
    """The C prefetch threads and fork workers read through the same
    reader: the epoch fails naming the item; no wrong sample reaches the
    batches before the failure."""
    ds = opt4torch.ImageFolder(folder, checksum=True)
    want = {ds.samples[i][0]: ds[i][0] for i in range(len(ds))}
    path, _ = ds.samples[9]
    _rewrite_same_size(path, b"\x07" * len(want[path]))
    _force_identity(ds, [9])
    loader = opt4torch.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=1,
                                  multiprocessing_context="fork", cache_items=6, epochs=1, prefetch=True,
                                  prefetch_threads=2, collate_fn=list)
    message, served = "", []
    try:
        for batch in loader:
            served += batch
    except Exception as exc:  # torch re-raises the worker's error with its traceback as text
        message = str(exc)
    del loader
    assert re.search(rf"item 9 \(\d+ bytes of {re.escape(path)}\) {_CHANGED}", message), message
    by_bytes = {v: k for k, v in want.items()}
    assert all(data in by_bytes for data, _ in served) and b"\x07" * len(want[path]) not in [d for d, _ in served]


def _shard_of(tmp_path, fill: int = 0) -> str:
    shard = os.fspath(tmp_path / "c.tar")
    with tarfile.open(shard, "w") as tf:
        for i in range(4):
            ti = tarfile.TarInfo(f"k{i}.bin")
            ti.size = 600
            tf.addfile(ti, io.BytesIO(bytes([fill + i]) * 600))
    return shard


def test_a_shard_rewritten_under_a_forced_identity_is_caught_by_its_checksum(tmp_path) -> None:
    """The checksums are recorded in the index (added to an index made
    without them), and used from it: a shard rewritten in place, then its
    cached index's identity forced to the shard's new one, serves the new
    bytes without checksum=True and fails naming the sample with it."""
    import json

    shard = _shard_of(tmp_path)
    where = shard + ".opt4idx.json"
    opt4torch.TarShards([shard])
    assert "xxh3" not in json.load(open(where))
    ds = opt4torch.TarShards([shard], checksum=True)
    body = json.load(open(where))
    assert len(body["xxh3"]) == 16 * 4 and [int(body["xxh3"][16 * i:16 * i + 16], 16) for i in range(4)] == [
        _engine.checksum(bytes([i]) * 600) for i in range(4)]
    stamp = os.stat(where).st_mtime_ns
    assert [s["bin"] for s in opt4torch.TarShards([shard], checksum=True)] == [bytes([i]) * 600 for i in range(4)]
    assert os.stat(where).st_mtime_ns == stamp  # read from the index, not recomputed or rewritten
    data = bytearray(open(shard, "rb").read())
    off = int(ds._rows[1, 1])
    data[off:off + 600] = b"\x09" * 600
    _rewrite_same_size(shard, bytes(data))
    st = os.stat(shard)
    body["shard"].update(size=st.st_size, ino=st.st_ino, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)
    with open(where, "w") as f:
        json.dump(body, f)
    assert opt4torch.TarShards([shard])[1]["bin"] == b"\x09" * 600  # the wrong sample, without checksums
    ds = opt4torch.TarShards([shard], checksum=True)
    with pytest.raises(opt4torch.Opt4Error, match=rf"item 1 \(600 bytes of {re.escape(shard)}\) {_CHANGED}"):
        ds[1]
    assert ds[2]["bin"] == b"\x02" * 600
    # The C tar frame (what the prefetch threads store) refuses it alike.
    with pytest.raises(opt4torch.Opt4Error, match=_CHANGED):
        _engine.tar_records(ds._r, (ds.keys, ds._members), [1])


def test_checksum_takes_a_bool_only(folder: str) -> None:
    with pytest.raises(TypeError, match="checksum must be True or False, not 'yes'"):
        opt4torch.ImageFolder(folder, checksum="yes")
