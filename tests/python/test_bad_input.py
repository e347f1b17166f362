"""Bad input, one test per row of the table in docs/reliability.md: each gets
a clear exception that says what was wrong and what to do, and leaves
nothing behind in /dev/shm."""

from __future__ import annotations

import os
import pickle
import stat
import threading
import time

import numpy as np
import pytest
import torch
from datasets_for_tests import Checked, Resized

import opt4torch
from conftest import leaked_since, pool_prefix
from opt4torch import PlanFileError, _engine


def our_pools() -> set[str]:
    return {p["name"] for p in _engine.pool_list()}


@pytest.fixture(autouse=True)
def no_leaked_pools():
    before = our_pools()
    yield
    leaked = leaked_since(before)
    assert not leaked, f"pools left behind: {leaked}"


def test_capacity_zero_or_negative() -> None:
    for capacity in (0, -1):
        with pytest.raises(opt4torch.InvalidInputError, match=f"capacity is {capacity}: a cache must hold at least one item"):
            opt4torch.plan([0, 1, 0], capacity=capacity)
        with pytest.raises(ValueError, match=f"cache_items must be at least 1, got {capacity}"):
            opt4torch.DataLoader(Checked(10), cache_items=capacity)
    for cache_bytes in (0, -5):
        with pytest.raises(ValueError, match=f"cache_bytes={cache_bytes} holds no item of .* bytes"):
            opt4torch.DataLoader(Checked(10), cache_bytes=cache_bytes)


def test_item_larger_than_the_pool() -> None:
    with pytest.raises(opt4torch.InvalidInputError,
                       match="item 1 is 500 bytes, larger than the whole pool .*: give the cache more bytes"):
        opt4torch.plan([0, 1, 0], items=2, capacity_bytes=100, item_sizes=[50, 500], page_size=10)
    with pytest.raises(opt4torch.InvalidInputError, match="item 9 is .* larger than the whole pool"):
        opt4torch.DataLoader(Checked(10), cache_bytes=1000, item_bytes=[100] * 9 + [5000], epochs=1)


def test_dataset_length_changed_since_the_plan() -> None:
    ds = Resized(10)
    loader = opt4torch.DataLoader(ds, batch_size=5, cache_items=3, epochs=1)
    try:
        ds.n = 12
        with pytest.raises(RuntimeError, match="has 12 items but the cache was planned for 10: .*needs a new loader"):
            list(loader)
    finally:
        loader.cache.close()


def test_position_or_index_out_of_range() -> None:
    with pytest.raises(opt4torch.InvalidInputError, match="id 5 at position 1 is outside \\[0, 3\\)"):
        opt4torch.plan([0, 5], items=3, capacity=1)
    with pytest.raises(opt4torch.InvalidInputError, match="id -1 at position 1 is negative"):
        opt4torch.plan([0, -1], capacity=1)
    p = opt4torch.plan([0, 1, 0, 2], capacity=1)
    with pytest.raises(opt4torch.InvalidInputError, match="position 10 is outside \\[0, 4\\]"):
        p.resident_at(10)
    loader = opt4torch.DataLoader(Checked(10), batch_size=5, cache_items=3, epochs=1)
    try:
        for bad in (10, 10**9, -1):
            with pytest.raises(IndexError, match=f"position {bad} is outside this cache's plan, which has "
                                                 "positions 0 to 9: .*read the wrapped dataset"):
                loader.dataset[bad]
        x, i = loader.dataset[3]  # the positions inside still work
        assert torch.equal(x, Checked(10)[i][0])
    finally:
        loader.cache.close()


def test_plan_made_for_another_sequence() -> None:
    """A fingerprint mismatch: state from a loader with another plan."""
    def make(seed: int) -> opt4torch.DataLoader:
        return opt4torch.DataLoader(Checked(20), batch_size=5, shuffle=True, seed=seed, cache_items=5, epochs=1)

    a, b = make(0), make(1)
    try:
        assert a.cache.plan.fingerprint != b.cache.plan.fingerprint
        with pytest.raises(ValueError, match="saved by a loader with another plan"):
            b.load_state_dict(a.state_dict())
    finally:
        a.cache.close()
        b.cache.close()


@pytest.fixture
def plan_bytes(tmp_path) -> bytes:
    p = opt4torch.plan(list(range(50)) * 4, 10)
    p.save(tmp_path / "ok.opt4")
    return (tmp_path / "ok.opt4").read_bytes()


@pytest.mark.parametrize(
    ("name", "damage", "code", "message"),
    [
        ("truncated", lambda d: d[: len(d) // 2], "OPT4_ETRUNCATED", "truncated"),
        ("corrupted", lambda d: d[:-1] + bytes([d[-1] ^ 0x01]), "OPT4_ECHECKSUM", "checksum mismatch"),
        ("foreign", lambda d: b"\x89PNG\r\n\x1a\n" + d[8:], "OPT4_EBADMAGIC", "not an opt4 plan file"),
        ("newer", lambda d: d[:8] + (7).to_bytes(4, "little") + d[12:], "OPT4_EVERSION",
         "newer than this library.*upgrade opt4torch"),
    ],
)
def test_damaged_plan_file(tmp_path, plan_bytes: bytes, name: str, damage, code: str, message: str) -> None:
    path = tmp_path / f"{name}.opt4"
    path.write_bytes(damage(plan_bytes))
    with pytest.raises(PlanFileError, match=message) as info:
        opt4torch.load_plan(path)
    assert info.value.code_name == code
    assert str(path) in str(info.value)


class _Payload:
    """A pickle that runs code when loaded: it creates a file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_legacy_pickle_plan_refused_unless_allowed(tmp_path) -> None:
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    legacy = tmp_path / "precomputed.pkl"
    with open(legacy, "wb") as f:
        pickle.dump({"future_index": seq, "future_map": {}}, f, protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(PlanFileError, match="It is a pickle.*runs code.*refused.*allow_pickle=True"):
        opt4torch.load_plan(legacy)
    p = opt4torch.load_plan(legacy, allow_pickle=True)
    assert p.seq.tolist() == seq and not p.has_decisions
    p.save(tmp_path / "converted.opt4")
    assert opt4torch.load_plan(tmp_path / "converted.opt4").seq.tolist() == seq
    # A hostile pickle never runs unless allowed.
    marker = tmp_path / "ran"
    hostile = tmp_path / "hostile.pkl"
    with open(hostile, "wb") as f:
        pickle.dump({"future_index": _Payload(str(marker))}, f, protocol=4)
    with pytest.raises(PlanFileError, match="refused"):
        opt4torch.load_plan(hostile)
    assert not marker.exists()


def test_dev_shm_too_small() -> None:
    with pytest.raises(opt4torch.Opt4IOError, match="/dev/shm is too small.*--shm-size=.*or give the cache fewer bytes"):
        opt4torch.DataLoader(Checked(10), cache_items=5, item_bytes=1 << 39)  # 2.5 TiB of pool


def _squat(mode: int, uid: int | None) -> str:
    """A file under this user's pool prefix that this library did not make."""
    name = "/" + pool_prefix(os.getpid()) + os.urandom(8).hex()
    for suffix in ("", ".meta"):
        path = f"/dev/shm{name}{suffix}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
        os.ftruncate(fd, 8192)
        os.fchmod(fd, mode)
        if uid is not None:
            os.fchown(fd, uid, uid)
        os.close(fd)
    return name


def _unsquat(name: str) -> None:
    for suffix in ("", ".meta"):
        try:
            os.unlink(f"/dev/shm{name}{suffix}")
        except FileNotFoundError:
            pass


def test_pool_name_taken_by_another_user() -> None:
    name = _squat(0o666, None)
    try:
        with pytest.raises(opt4torch.Opt4Error, match="has mode 666; pools are created 0600.*refused"):
            _engine.pool_attach(name)
    finally:
        _unsquat(name)
    if os.getuid() != 0:
        pytest.skip("the other-uid part needs root (chown)")
    name = _squat(0o600, 65534)
    try:
        with pytest.raises(opt4torch.Opt4Error, match="belongs to uid 65534, not to this user.*refused"):
            _engine.pool_attach(name)
        assert name not in our_pools()  # not listed, so never swept as stale
        with pytest.raises(opt4torch.Opt4Error, match="belongs to uid 65534.*not removed"):
            _engine.pool_remove(name, force=True)
        assert os.stat(f"/dev/shm{name}").st_uid == 65534
    finally:
        _unsquat(name)


class Unpicklable(Checked):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.lock = threading.Lock()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_dataset_that_cannot_be_pickled_under_spawn() -> None:
    loader = opt4torch.DataLoader(Unpicklable(10), batch_size=5, cache_items=3, epochs=1, num_workers=1,
                                  multiprocessing_context="spawn")
    try:
        with pytest.raises(TypeError, match="cannot be pickled: .*lock.*'spawn' receive it pickled.*"
                                            "multiprocessing_context='fork'"):
            list(loader)
    finally:
        loader.cache.close()
    # Under fork it is never pickled, and works.
    loader = opt4torch.DataLoader(Unpicklable(10), batch_size=5, cache_items=3, epochs=1, num_workers=1,
                                  multiprocessing_context="fork")
    try:
        assert sum(len(y) for _, y in loader) == 10
    finally:
        loader.cache.close()


def test_more_epochs_than_the_plan_covers() -> None:
    loader = opt4torch.DataLoader(Checked(10), batch_size=5, cache_items=3, epochs=1)
    try:
        list(loader)
        with pytest.raises(RuntimeError, match="planned for 1 epochs and they are all used; build it with a "
                                               "larger epochs="):
            list(loader)
        with pytest.raises(ValueError, match="planned for 1 epochs; epoch 3 is outside them"):
            loader.set_epoch(3)
    finally:
        loader.cache.close()


def test_output_paths_are_validated_and_symlinks_not_followed(tmp_path) -> None:
    import subprocess

    from conftest import script

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([script("opt4torch"), *args], capture_output=True, text=True, timeout=300)

    r = cli("precompute", "--dataset-size", "5", "--total-iter", "10", "--output", str(tmp_path), "--quiet")
    assert r.returncode != 0 and "is a directory; give a file name" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "afile").write_text("x")
    r = cli("precompute", "--dataset-size", "5", "--total-iter", "10", "--output", str(tmp_path / "afile" / "p.opt4"),
            "--quiet")
    assert r.returncode != 0 and "is a file, not a directory" in r.stderr
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "results.csv").symlink_to(victim)
    trace = tmp_path / "t.txt"
    trace.write_text("\n".join(str(i % 7) for i in range(100)))
    r = cli("simulate", "--trace", str(trace), "--policy", "lru", "--capacity", "3", "--out", str(out), "--no-plots")
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "keep"  # the symlink was replaced, not written through
    assert not (out / "results.csv").is_symlink() and "lru" in (out / "results.csv").read_text()
    # A plan saved over a symlink replaces the link too.
    link = tmp_path / "plan.opt4"
    link.symlink_to(victim)
    opt4torch.plan([0, 1, 0], capacity=1).save(link)
    assert victim.read_text() == "keep" and not link.is_symlink()
    assert stat.S_ISREG(os.lstat(link).st_mode)


def test_a_pool_handle_serves_one_thread_at_a_time() -> None:
    """A handle holds one hazard (include/opt4.h, "Thread and process
    safety"): while one thread waits inside a handle, another thread's call
    on it is refused, saying what to do, and a handle of its own serves
    that thread meanwhile."""
    plan = opt4torch.plan([0, 1, 0, 1], capacity=1, items=2)
    pool = _engine.pool_create(plan._h, 64)
    waiting = threading.Thread(target=pool.wait_head, args=(4, 60.0))  # position 4 is never reached
    try:
        waiting.start()
        refused = None
        for _ in range(10_000):  # until the thread is inside; a free handle answers at once
            try:
                pool.wait_head(0, 0.0)
            except RuntimeError as e:
                refused = e
                break
            time.sleep(0.001)
        assert refused is not None and "attach one handle per thread" in str(refused), refused
        own = _engine.pool_attach(pool.name)
        try:
            assert own.wait_head(0, 0.0) is True  # its own handle: served while the other waits
        finally:
            own.close()
    finally:
        pool.interrupt()  # the waiting thread returns at once
        waiting.join(timeout=30)
        assert not waiting.is_alive()
        pool.unlink()
        pool.close()
