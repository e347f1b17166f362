"""Clairvoyant prefetch through the public API: record files, the C
prefetcher and the Python-thread prefetcher under real DataLoader workers.

What must hold with prefetching, as without: every sample equals what the
dataset returns; observed hits equal the plan's; and every miss is loaded
exactly once (bytes read from storage = the plan's miss bytes), whoever
loads it, the prefetcher or the worker that needs it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from typing import Any

import numpy as np
import pytest
import torch
from ourthreads import our_c_threads, our_threads, wait_for_no_threads_of_ours
from datasets_for_tests import CountingSlow

import opt4torch
from opt4torch import _engine
from opt4torch._codec import decode, encode
from opt4torch.records import RecordFile, image_folder_to_records, write_records

N_ITEMS, CAPACITY, BATCH, EPOCHS = 300, 100, 16, 3


pytestmark = pytest.mark.usefixtures("no_leaked_pools")


def record_bytes(i: int) -> bytes:
    """Record i: 100 to 2,099 bytes that depend only on i."""
    rng = np.random.default_rng(1000 + i)
    return rng.integers(0, 256, size=100 + (i * 37) % 2000, dtype=np.uint8).tobytes()


@pytest.fixture(scope="module")
def record_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("records") / "data.rec"
    write_records(path, (record_bytes(i) for i in range(N_ITEMS)),
                  labels=[i % 7 for i in range(N_ITEMS)], classes=[f"c{k}" for k in range(7)])
    return os.fspath(path)


def plan_miss_bytes(loader: opt4torch.DataLoader, sizes: np.ndarray) -> int:
    plan = loader.cache.plan
    return int(sizes[plan.seq[plan.kinds != opt4torch.HIT]].sum())


# ---- record files ----


def test_records_round_trip(record_path: str) -> None:
    rf = RecordFile(record_path)
    assert len(rf) == N_ITEMS
    assert rf.classes == [f"c{k}" for k in range(7)]
    for i in (0, 1, 57, N_ITEMS - 1, -1):
        j = i % N_ITEMS
        assert rf[i] == (record_bytes(j), j % 7)
    assert rf.opt4_item_bytes(5) == len(record_bytes(5))
    assert list(rf.item_sizes()[:3]) == [len(record_bytes(i)) for i in range(3)]
    with pytest.raises(IndexError, match="out of range"):
        rf[N_ITEMS]
    raw = RecordFile(record_path, with_labels=False)
    assert raw[3] == record_bytes(3)
    info = RecordFile(record_path, direct=True).info()
    assert info["count"] == N_ITEMS and info["note"]
    # Read counters: shared by the handle's users, in bytes.
    before = raw.info()["bytes_read"]
    raw[4]
    assert raw.info()["bytes_read"] - before == len(record_bytes(4))


def test_records_direct_reads_equal_buffered(record_path: str) -> None:
    direct, buffered = RecordFile(record_path, direct=True), RecordFile(record_path)
    assert all(direct[i] == buffered[i] for i in range(0, N_ITEMS, 7))


@pytest.mark.parametrize(("damage", "message"), [
    (lambda b: b"XXXX" + b[4:], "not an opt4 record file"),
    (lambda b: b[:8] + b"\x09" + b[9:], "version 9"),
    (lambda b: b[:5000], "shorter than|says"),
    (lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:], "checksum"),
    (lambda b: b + b"\0" * 16, "its header says"),
])
def test_damaged_record_files_are_refused(tmp_path, record_path: str, damage, message: str) -> None:
    bad = tmp_path / "bad.rec"
    bad.write_bytes(damage(open(record_path, "rb").read()))
    with pytest.raises(opt4torch.Opt4Error, match=message) as e:
        RecordFile(bad)
    assert "plan" not in str(e.value)  # the message is about record files


def test_writer_refuses_symlinks_and_missing_folders(tmp_path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep me")
    link = tmp_path / "link.rec"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        write_records(link, [b"a"])
    assert target.read_bytes() == b"keep me"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_records(tmp_path / "no" / "such" / "x.rec", [b"a"])


def test_a_failed_write_leaves_nothing(tmp_path) -> None:
    def items():
        yield b"one"
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        write_records(tmp_path / "x.rec", items())
    assert os.listdir(tmp_path) == []


def test_image_folder_to_records(tmp_path) -> None:
    from PIL import Image

    root = tmp_path / "images"
    want = {}
    for cls in ("dog", "cat"):
        (root / cls).mkdir(parents=True)
        for k in range(3):
            img = Image.new("RGB", (8 + k, 8), color=(k * 40, 10, 200 if cls == "dog" else 0))
            path = root / cls / f"{k}.png"
            img.save(path)
            want[(cls, k)] = path.read_bytes()
    (root / "cat" / "notes.txt").write_text("not an image")
    rf = image_folder_to_records(root, tmp_path / "images.rec")
    assert rf.classes == ["cat", "dog"]  # sorted, as ImageFolder numbers them
    assert len(rf) == 6
    assert rf[0] == (want[("cat", 0)], 0) and rf[5] == (want[("dog", 2)], 1)
    meta = json.loads((tmp_path / "images.rec.json").read_text())
    assert meta["files"][0] == os.path.join("cat", "0.png")
    with pytest.raises(ValueError, match="no class folders"):
        image_folder_to_records(tmp_path / "images" / "cat", tmp_path / "x.rec")


def _prefetching(rf: RecordFile) -> tuple[np.ndarray, opt4torch.Plan, opt4torch.OPTCache]:
    """0..19 twice over a cache of 5, its C prefetcher started over ``rf``."""
    seq = np.arange(40) % 20
    plan = opt4torch.plan(seq, capacity=5, items=N_ITEMS)
    cache = opt4torch.OPTCache(plan, 4096, staging_slots=8)
    try:
        cache.configure_prefetch(rf, threads=2, lookahead=64)
        cache.start_prefetch()
    except BaseException:
        cache.close()
        raise
    return seq, plan, cache


def test_prefetcher_frames_records_as_the_codec_does(record_path: str) -> None:
    """What the C prefetcher stores decodes to exactly what the dataset returns."""
    rf = RecordFile(record_path)
    for i in (0, 9, 123):
        assert decode(bytearray().join(encode(rf[i]))) == rf[i]
    seq, plan, cache = _prefetching(rf)
    try:
        deadline = time.monotonic() + 10
        while cache.stats()["prefetch_stored"] < 5 and time.monotonic() < deadline:
            time.sleep(0.005)  # the first items go into empty slots at once
        pool = _engine.pool_attach(cache.name)
        out, _, rest = pool.get_batch(list(range(40)))
        for t, obj in enumerate(out):
            if obj is not None:
                assert obj == rf[int(seq[t])]
        pool.close()
        st = cache.stats()
        assert st["prefetched"] > 0, st
    finally:
        cache.close()


def test_get_batch_views_hand_bytes_over_as_read_only_views_of_its_data(record_path: str) -> None:
    """get_batch(..., views=True): every HIT's bytes are a read-only
    memoryview of the batch's own buffer (the prefetcher's frames and a
    worker's stores alike), equal to what the dataset returns, and they
    stay right after the pool has moved on (the buffer is the call's copy)."""
    rf = RecordFile(record_path)

    def plain(x):
        return (bytes(x[0]), x[1]) if isinstance(x, tuple) else bytes(x)

    seq, plan, cache = _prefetching(rf)
    try:
        pool = _engine.pool_attach(cache.name)
        kept = []
        for lo in range(0, 40, 8):
            out, data, rest = pool.get_batch(list(range(lo, lo + 8)), None, True)
            assert len(out) == 8, "no AGAIN expected: nothing in this batch waits for another"
            commits = []
            for i, status, item, a, _b in rest:
                assert status in (_engine.ENTRY_LOAD, _engine.ENTRY_DEFER), rest  # no HIT left to the codec
                out[i] = rf[item]
                if status == _engine.ENTRY_DEFER:
                    commits.append((lo + i, None))
                elif a == _engine.REASON_ADMIT:
                    commits.append((lo + i, encode(out[i])))
            if commits:
                assert _engine.STORE_TOO_LARGE not in pool.store_batch(commits)
            loaded = {e[0] for e in rest}
            for k, obj in enumerate(out):
                if k in loaded:
                    continue
                view = obj[0] if isinstance(obj, tuple) else obj
                assert isinstance(view, memoryview) and view.readonly and view.obj is data, type(view)
                assert plain(obj) == plain(rf[int(seq[lo + k])]), lo + k
                kept.append((lo + k, obj))
        hits = int((plan.kinds == opt4torch.HIT).sum())
        assert len(kept) >= hits > 0, f"{len(kept)} HITs in 40 positions, {hits} planned"
        for t, obj in kept:  # the pool has moved on; the views still hold the rows they were
            assert plain(obj) == plain(rf[int(seq[t])]), t
        pool.close()
    finally:
        cache.close()


def test_a_worker_commits_before_it_waits_for_a_prefetcher_that_waits_for_it() -> None:
    """0 0 1 1 at capacity 1, one batch: the worker loads 0 itself and
    commits it after the batch's first pass, while a prefetcher holds 2,
    whose store waits for 0's reads. The worker must commit 0 before it
    waits for 2 (the pool answers AGAIN), not wait until the timeout."""
    import threading

    from opt4torch.data import PlannedDataset

    plan = opt4torch.plan(np.array([0, 0, 1, 1]), capacity=1, items=2)
    cache = opt4torch.OPTCache(plan, 4096, wait_timeout=20)
    items = [b"zero", b"one"]
    pf = _engine.pool_attach(cache.name)
    try:
        assert pf.prefetch_claim(100)[:2] == (_engine.PREFETCH_CLAIMED, 0)
        pf.prefetch_release(0)  # its consumer loads it
        status, t, item, _, _ = pf.prefetch_claim(100)
        assert (status, t, item) == (_engine.PREFETCH_CLAIMED, 2, 1)
        stored: list[int] = []
        store = threading.Thread(target=lambda: stored.append(pf.prefetch_store(2, encode(b"one"))))
        store.start()  # waits for 0's reads: the worker's own
        t0 = time.monotonic()
        out = PlannedDataset(items, cache.name, 4, 2).__getitems__([0, 1, 2, 3])
        elapsed = time.monotonic() - t0
        store.join(30)
        assert out == [b"zero", b"zero", b"one", b"one"]
        assert stored == [_engine.STORE_DONE]
        st = cache.stats()
        assert st["timeouts"] == 0 and st["fallbacks"] == 0 and st["prefetched"] == 1, st
        assert elapsed < 10, elapsed  # not the 20 s timeout
    finally:
        pf.close()
        cache.close()


def _pairs_pool(n: int) -> tuple[Any, Any]:
    """A pool of items 0 0 1 1 ... at capacity 1: item k's ADMIT (position
    2k) replaces item k - 1, whose last read is position 2k - 1, so a store
    ahead of the consumers must wait for them; and a handle that claims it."""
    plan = opt4torch.plan(np.repeat(np.arange(n), 2), capacity=1, items=n)
    cache = opt4torch.OPTCache(plan, 4096, wait_timeout=20)
    return cache, _engine.pool_attach(cache.name)


def _record(obj: Any) -> bytes:
    return b"".join(bytes(memoryview(p).cast("B")) for p in encode(obj))


def test_prefetch_deliver_stores_in_order_as_the_consumers_come_near() -> None:
    """A cluster node's transfer thread's stores (pool.prefetch_deliver):
    claimed positions stored in order in one call, each once the consumers
    come near it; a wait that ends with them still far returns what was
    done (none here), and a record larger than its space is -1, given to
    its reader."""
    from opt4torch.data import PlannedDataset

    n = 100
    items = [f"item {i}".encode() * (1 + i % 5) for i in range(n)]
    items[75] = b"x" * 100_000  # larger than its page: too large to keep
    cache, pf = _pairs_pool(n)
    reader = _engine.pool_attach(cache.name)
    try:
        claimed = list(range(n, 2 * n, 2))  # the ADMITs of items 50-99
        for t in claimed:
            assert pf.prefetch_claim_at(t)[0] == _engine.PREFETCH_CLAIMED
        records = [_record(items[t // 2]) for t in claimed]
        stores = bytes([_engine.DELIVER_STORE]) * len(claimed)
        assert pf.head() == 0  # a look at the consumers' progress, which wait_head waits on
        t0 = time.monotonic()
        assert pf.prefetch_deliver(claimed, stores, records, 0.2, reader)[::2] == (0, [])  # the consumers: far
        assert 0.15 < time.monotonic() - t0 < 10
        with pytest.raises(ValueError, match="50 positions, 50 ops .50 stores. and 1 records"):
            pf.prefetch_deliver(claimed, stores, records[:1], 0.2, reader)
        with pytest.raises(ValueError, match="another handle"):
            pf.prefetch_deliver(claimed, stores, records, 0.2, pf)
        got: list[tuple[int, bytearray, list[tuple[int, int, int]]]] = []
        store = threading.Thread(target=lambda: got.append(pf.prefetch_deliver(claimed, stores, records, 30, reader)))
        store.start()
        with pytest.warns(RuntimeWarning, match="does not fit its space"):  # item 75, which its reader loads
            out = PlannedDataset(items, cache.name, 2 * n, n).__getitems__(list(range(2 * n)))
        store.join(30)
        assert out == [x for x in items for _ in range(2)]
        done, _, results = got[0]
        assert done == len(claimed)
        assert results == [(-1 if t == 150 else _engine.STORE_DONE, 0, 0) for t in claimed]
        assert pf.head() == (2 * n - 1) // _engine.HEAD_BLOCK * _engine.HEAD_BLOCK  # the last read's block
        assert pf.wait_head(pf.head(), 0.01) and not pf.wait_head(pf.head() + 1, 0.01)
        st = cache.stats()
        assert st["prefetched"] == len(claimed) - 1 and st["timeouts"] == 0, st
    finally:
        reader.close()
        pf.close()
        cache.close()


def test_prefetch_deliver_reads_its_own_positions_between_its_stores() -> None:
    """Reads and stores in position order in one call: a read is a
    worker's (its record copied out as the pool holds it); a store waits
    for the reads of what it replaces, the call's own reads among them (a
    stored ADMIT is read at its own position too, as its consumer would). A
    read the pool cannot serve (an ADMIT nobody stored) ends the call there,
    for the caller to load it as a worker does."""
    n = 4
    items = [f"item {i}".encode() * 3 for i in range(n)]
    cache, pf = _pairs_pool(n)  # 0 0 1 1 2 2 3 3 at capacity 1
    reader = _engine.pool_attach(cache.name)
    try:
        for t in (2, 4, 6):
            assert pf.prefetch_claim_at(t)[0] == _engine.PREFETCH_CLAIMED
        S, R = _engine.DELIVER_STORE, _engine.DELIVER_READ
        positions = [0, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7]
        ops = bytes([R, R, S, R, R, S, R, R, S, R, R])
        records = [_record(items[k]) for k in (1, 2, 3)]
        done, _, results = pf.prefetch_deliver(positions, ops, records, 10, reader)
        assert (done, results) == (1, [(_engine.ENTRY_LOAD, _engine.REASON_ADMIT, 0)])  # item 0: nobody stored it
        assert reader.store_batch([(0, encode(items[0]))]) == [_engine.STORE_STORED]  # as a worker commits it
        t0 = time.monotonic()
        done, data, results = pf.prefetch_deliver(positions[1:], ops[1:], records, 10, reader)
        assert done == len(positions) - 1 and time.monotonic() - t0 < 5  # no store waited out the timeout
        reads = [(t, r) for t, op, r in zip(positions[1:], ops[1:], results) if op == R]
        assert [r[0] for _, r in reads] == [_engine.ENTRY_HIT] * len(reads)
        assert [bytes(data[a:a + b]) for _, (_, a, b) in reads] == [_record(items[t // 2]) for t, _ in reads]
        assert [r for op, r in zip(ops[1:], results) if op == S] == [(_engine.STORE_DONE, 0, 0)] * 3
        st = cache.stats()
        # The HITs (1, 3, 5, 7), and the ADMITs, prefetched but for the one loaded (a miss each).
        assert st["hits"] == 4 and st["misses"] == 4 and st["prefetched"] == 3 and st["timeouts"] == 0, st
    finally:
        reader.close()
        pf.close()
        cache.close()


def test_prefetch_deliver_returns_at_once_on_an_interrupted_handle() -> None:
    """finish() interrupts the transfer thread's handle: a delivery whose
    consumers are far returns then, with nothing done."""
    cache, pf = _pairs_pool(40)
    reader = _engine.pool_attach(cache.name)
    try:
        assert pf.prefetch_claim_at(70)[0] == _engine.PREFETCH_CLAIMED
        threading.Timer(0.3, pf.interrupt).start()
        t0 = time.monotonic()
        assert pf.prefetch_deliver([70], bytes([_engine.DELIVER_STORE]), [b"record"], 60, reader)[::2] == (0, [])
        assert 0.2 < time.monotonic() - t0 < 10  # woken by the interrupt, not the 60 s
        pf.prefetch_release(70)
    finally:
        reader.close()
        pf.close()
        cache.close()


# ---- through the DataLoader ----

CONFIGS = [(0, None), (2, "fork"), (2, "spawn")]


@pytest.mark.parametrize(("workers", "ctx"), CONFIGS, ids=[f"{w}w-{c or 'main'}" for w, c in CONFIGS])
@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_record_prefetch_is_exact(record_path: str, workers: int, ctx: str | None, direct: bool) -> None:
    rf = RecordFile(record_path, direct=direct, latency=0.0005)
    sizes = rf.item_sizes()
    loader = opt4torch.DataLoader(rf, batch_size=BATCH, shuffle=True, seed=3, num_workers=workers,
                                  multiprocessing_context=ctx, cache_items=CAPACITY, epochs=EPOCHS,
                                  prefetch_threads=4, collate_fn=list)
    try:
        for _ in range(EPOCHS):
            for batch in loader:
                for data, label in batch:
                    i = _index_of(data)
                    assert data == record_bytes(i) and label == i % 7
        st = loader.cache.stats()
        assert st["fallbacks"] == 0 and st["timeouts"] == 0, st
        assert st["hits"] == st["plan_hits"], st
        assert st["prefetched"] > 0, st
        assert st["prefetched"] + st["admits"] + st["bypasses"] == st["plan_misses"], st
        assert st["prefetcher"]["kind"] == "records"
        if ctx != "spawn":  # a spawned worker counts its reads in its own process
            assert st["storage_reads"] == st["plan_misses"], st
            assert st["storage_bytes"] == plan_miss_bytes(loader, sizes), st
    finally:
        loader.cache.close()


_by_content: dict[bytes, int] = {}


def _index_of(data: bytes) -> int:
    """The record whose bytes these are (records differ in their first 16 bytes)."""
    if not _by_content:
        _by_content.update({record_bytes(i)[:16]: i for i in range(N_ITEMS)})
    return _by_content[data[:16]]


def test_record_prefetch_samples_are_the_source(record_path: str) -> None:
    rf = RecordFile(record_path)
    loader = opt4torch.DataLoader(rf, batch_size=BATCH, shuffle=True, seed=5, num_workers=2,
                                  cache_items=CAPACITY, epochs=2, collate_fn=list)
    try:
        seq = loader.cache.plan.seq
        t = 0
        for _ in range(2):
            for batch in loader:
                for data, label in batch:
                    i = int(seq[t])
                    assert data == record_bytes(i) and label == i % 7, f"position {t}"
                    t += 1
        assert t == len(seq)
        assert loader.cache.stats()["prefetched"] > 0
    finally:
        loader.cache.close()


def test_thread_prefetch_for_any_dataset(tmp_path) -> None:
    """prefetch=True on a plain Dataset: the C threads load its misses,
    calling dataset[i] with the GIL (binding/pysource.c)."""
    counter = tmp_path / "loads"
    ds = CountingSlow(N_ITEMS, os.fspath(counter), delay=0.001)
    loader = opt4torch.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=9, num_workers=2,
                                  cache_items=CAPACITY, epochs=EPOCHS, prefetch=True, prefetch_threads=4,
                                  multiprocessing_context="fork")
    probed = counter.stat().st_size  # the loader loads a few items to size the cache
    try:
        seq = loader.cache.plan.seq
        t = 0
        for _ in range(EPOCHS):
            for x, y in loader:
                for row, i in zip(x, y.tolist()):
                    assert i == int(seq[t]) and torch.equal(row, ds.expected(i))
                    t += 1
        st = loader.cache.stats()
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0, st
        assert st["prefetched"] > 0 and st["prefetcher"]["kind"] == "callback", st
        # Every miss loaded once: by a prefetch thread or by a worker.
        assert counter.stat().st_size - probed == st["plan_misses"], st
    finally:
        loader.cache.close()


class PerThreadHandle(torch.utils.data.Dataset):
    """Opens a "handle" once per thread, kept in a threading.local, as
    datasets do with files, LMDB environments or object-store clients."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.local = threading.local()
        self.opens: list[int] = []  # list.append is atomic

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if getattr(self.local, "handle", None) is None:
            self.local.handle = object()
            self.opens.append(threading.get_ident())
        time.sleep(0.0005)
        return torch.full((4,), i)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="kept up to Python 3.11 only (binding/pysource.c says why)")
def test_a_prefetch_thread_keeps_its_python_thread_state() -> None:
    """Each C prefetch thread calls the dataset with one Python thread state
    for its life (binding/pysource.c), so what the dataset keeps in a
    threading.local lasts: a handle is opened once per thread, not once per
    load. With a thread state made and dropped per call, every prefetched
    load opened one again."""
    ds = PerThreadHandle(N_ITEMS)
    loader = opt4torch.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=5, num_workers=0, cache_items=CAPACITY,
                                  epochs=EPOCHS, prefetch=True, prefetch_threads=4, prefetch_max_threads=4)
    try:
        seq = loader.cache.plan.seq
        t = 0
        for _ in range(EPOCHS):
            for x in loader:
                for row in x:
                    assert int(row[0]) == int(seq[t])
                    t += 1
        st = loader.cache.stats()
        assert st["hits"] == st["plan_hits"] and st["prefetched"] > 50, st
        threads = st["prefetcher"]["threads"]
    finally:
        loader.cache.close()
    # The main thread's (sizing, and the misses it loaded itself), and one a prefetch thread.
    assert len(ds.opens) <= 1 + threads, (len(ds.opens), st["prefetched"])


def test_head_start_starts_as_many_readers_as_it_has_misses(record_path: str) -> None:
    """The batches handed out first are wanted at once: the prefetcher
    starts with as many readers as they hold misses (at least
    prefetch_threads, at most prefetch_max_threads), rather than reading
    them prefetch_threads at a time; prefetch_max_threads=prefetch_threads
    keeps the depth fixed."""
    rf = RecordFile(record_path, latency=0.005)
    for threads, most, expected in ((2, 64, None), (3, 3, 3)):
        loader = opt4torch.DataLoader(rf, batch_size=BATCH, shuffle=True, seed=4, cache_items=CAPACITY, epochs=1,
                                      prefetch=True, prefetch_threads=threads, prefetch_max_threads=most,
                                      collate_fn=list)
        try:
            it = iter(loader)
            next(it)  # starts the prefetcher, after the head start
            plan = loader.cache.plan
            misses = int((plan.kinds[:BATCH] != opt4torch.HIT).sum())
            pf = loader.cache.stats()["prefetcher"]
            if expected is None:
                expected = min(most, max(threads, misses))
                assert expected > threads, misses  # the first batch of a cold cache: all misses
            # Nothing can have moved the depth yet: no grow without a short
            # look, no estimate (so no shrink) before the loop passes 64
            # positions or a second goes by.
            assert pf["active"] == expected and pf["grows"] == 0 and pf["shrinks"] == 0, pf
            for _ in it:
                pass
            if most == threads:
                assert loader.cache.stats()["prefetcher"]["active"] == threads
        finally:
            loader.cache.close()


def test_prefetch_threads_stop_with_the_cache(record_path: str) -> None:
    assert wait_for_no_threads_of_ours() == []  # an earlier test's, ended
    # Slow enough loads that the threads cannot have loaded every miss of
    # the plan (about 500, 20 ms each, 3 threads) by the time we look: with
    # instant loads they sometimes had, finished, and were gone.
    ds = CountingSlow(N_ITEMS, None, delay=0.02)
    loader = opt4torch.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=1, cache_items=CAPACITY,
                                  epochs=2, prefetch=True, prefetch_threads=3, prefetch_max_threads=5)
    it = iter(loader)
    next(it)  # the first batch starts the prefetcher
    # C threads calling the dataset: 3 reading from the start, 2 more that
    # read only if the depth grows (started with the others, asleep).
    assert our_c_threads() == [f"opt4-pf-{k}" for k in range(5)]
    pf = loader.cache.stats()["prefetcher"]
    assert pf["finished"] == 0 and pf["threads"] == 5 and 3 <= pf["active"] <= 5
    del it  # dropped mid-epoch
    loader.cache.close()
    assert not our_c_threads() and not our_threads()  # joined by close(), not later
    rf = RecordFile(record_path, latency=0.01)
    loader = opt4torch.DataLoader(rf, batch_size=BATCH, shuffle=True, seed=1, cache_items=CAPACITY,
                                  epochs=2, prefetch_threads=8, lookahead=10_000, collate_fn=list)
    next(iter(loader))
    loader.cache.close()  # C threads waiting on a slow store stop at once


def test_break_mid_epoch_with_prefetch(record_path: str) -> None:
    rf = RecordFile(record_path)
    # A wait for a position the break skipped would last the whole
    # wait_timeout, whatever its value; 60 s, not less, so that a wait that
    # is only slow (a loaded machine, the ASan build: one such wait passed
    # 5 s there) is not mistaken for one.
    loader = opt4torch.DataLoader(rf, batch_size=BATCH, shuffle=True, seed=2, num_workers=2,
                                  cache_items=CAPACITY, epochs=2, collate_fn=list, wait_timeout=60)
    try:
        for k, _ in enumerate(loader):
            if k == 4:
                break
        t0 = time.monotonic()
        for batch in loader:  # the next epoch, whole
            assert all(len(d) > 0 for d, _ in batch)
        st = loader.cache.stats()
        assert st["timeouts"] == 0, st
        assert time.monotonic() - t0 < 50
    finally:
        loader.cache.close()


def test_prefetch_argument_errors(record_path: str) -> None:
    rf = RecordFile(record_path)
    with pytest.raises(ValueError, match="prefetch_threads"):
        opt4torch.DataLoader(rf, batch_size=4, cache_items=10, prefetch_threads=0)
    with pytest.raises(ValueError, match="lookahead"):
        opt4torch.DataLoader(rf, batch_size=4, cache_items=10, lookahead=0)
    with pytest.raises(ValueError, match="staging_slots"):
        opt4torch.DataLoader(rf, batch_size=4, cache_items=10, staging_slots=-1)
    with pytest.raises(ValueError, match=r"prefetch_max_threads must be between prefetch_threads \(8\) and 256"):
        opt4torch.DataLoader(rf, batch_size=4, cache_items=10, prefetch_max_threads=4)
    with pytest.raises(ValueError, match="prefetch_max_threads"):
        opt4torch.DataLoader(rf, batch_size=4, cache_items=10, prefetch_max_threads=257)


@pytest.mark.parametrize("source", ["records", "callback"])
def test_prefetch_depth_grows_while_the_workers_stall(record_path: str, source: str) -> None:
    """One thread reading 10 ms at a time cannot keep up with a loop that
    takes a batch at once: the loop stalls, and the prefetcher adds threads
    (src/io/prefetcher.c, "Depth"), up to prefetch_max_threads (40: the
    head start's 16 positions start it at 16 at most). Every
    sample is still what the dataset returns, and the hits are the plan's."""
    if source == "records":
        ds: object = RecordFile(record_path, latency=0.01)
        expected = [RecordFile(record_path)[i] for i in range(N_ITEMS)]
    else:
        ds = CountingSlow(N_ITEMS, None, delay=0.01)
        expected = [CountingSlow.expected(i) for i in range(N_ITEMS)]
    loader = opt4torch.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=3, cache_items=CAPACITY, epochs=1,
                                  prefetch=True, prefetch_threads=1, prefetch_max_threads=40, collate_fn=list)
    try:
        for batch in loader:
            for sample in batch:
                if source == "records":
                    assert sample in expected  # a record of the file, whole
                else:
                    x, i = sample
                    assert torch.equal(x, expected[i])
        st = loader.cache.stats()
        pf = st["prefetcher"]
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0, st
        assert pf["threads"] == 40 and pf["grows"] >= 1 and 1 < pf["active"] <= 40, pf
    finally:
        loader.cache.close()


def test_prefetch_depth_follows_the_estimate_down(record_path: str) -> None:
    """A slow loop over fast reads needs few reads in flight (Little's law:
    about 530 positions a second, two thirds of them misses, reads of a few
    ms, twice over: under 12 even on a loaded machine; a short lookahead
    keeps the threads reading all along). Started at 24
    threads, the depth goes down to the estimate (src/io/prefetcher.c,
    "Depth"); samples and hits are unchanged."""
    rf = RecordFile(record_path, latency=0.001)
    expected = [RecordFile(record_path)[i] for i in range(N_ITEMS)]
    loader = opt4torch.DataLoader(rf, batch_size=BATCH, shuffle=True, seed=3, cache_items=CAPACITY, epochs=2,
                                  prefetch=True, prefetch_threads=24, prefetch_max_threads=32, lookahead=64,
                                  collate_fn=list)
    try:
        for _ in range(2):
            for batch in loader:
                assert all(sample in expected for sample in batch)
                time.sleep(0.03)
        st = loader.cache.stats()
        pf = st["prefetcher"]
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0, st
        assert pf["shrinks"] >= 1 and 2 <= pf["wanted"] <= 12 and pf["read_seconds"] >= 0.001, pf
    finally:
        loader.cache.close()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_head_start_does_not_wait_out_the_timeout(record_path: str) -> None:
    """A cache much smaller than the head start (the batches handed out
    first): part of the head start can only load after the workers read, so
    the first batch must not wait for all of it (it waited the whole
    wait_timeout, 10 s, before)."""
    rf = RecordFile(record_path, latency=0.0002)
    loader = opt4torch.DataLoader(rf, batch_size=64, shuffle=True, seed=1, num_workers=2,
                                  multiprocessing_context="fork", cache_items=10, epochs=2,
                                  staging_slots=4, prefetch_threads=4, collate_fn=list)
    try:
        t0 = time.monotonic()
        it = iter(loader)
        next(it)
        first = time.monotonic() - t0
        for _ in it:
            pass
        for _ in loader:
            pass
        st = loader.cache.stats()
        assert st["hits"] == st["plan_hits"] and st["fallbacks"] == 0, st
        assert first < 5.0, f"the first batch took {first:.1f} s"
    finally:
        loader.cache.close()


def test_records_are_packed_tightly(tmp_path) -> None:
    """2-4 KiB records (small JPEGs): the file is within 5 % of the data."""
    rng = np.random.default_rng(3)
    items = [rng.integers(0, 256, size=int(n), dtype=np.uint8).tobytes() for n in rng.integers(2048, 4097, 500)]
    rf = write_records(tmp_path / "small.rec", items)
    data = sum(len(x) for x in items)
    size = os.path.getsize(tmp_path / "small.rec")
    assert size <= data * 1.05, (size, data)
    assert all(RecordFile(tmp_path / "small.rec", direct=True)[i] == items[i] for i in range(0, 500, 37))
    assert rf.info()["total_bytes"] == data


def test_a_record_file_changed_under_its_reader(tmp_path, record_path: str) -> None:
    """Overwritten in place (cp over it) or cut short while open: an error
    that says what happened, never another record's bytes."""
    import shutil

    path = tmp_path / "live.rec"
    shutil.copy(record_path, path)
    rf = RecordFile(path, with_labels=False)
    assert rf[148] == record_bytes(148)
    other = tmp_path / "other.rec"
    write_records(other, (bytes(reversed(record_bytes(i))) for i in range(N_ITEMS)))
    with open(other, "rb") as src, open(path, "r+b") as dst:  # what `cp other.rec live.rec` does
        dst.write(src.read())
        dst.truncate()
    with pytest.raises(opt4torch.Opt4Error, match="does not match its checksum: the file was changed"):
        rf[148]
    os.truncate(path, 5000)
    with pytest.raises(opt4torch.Opt4Error, match="shorter than the .* it had when opened"):
        rf[200]
