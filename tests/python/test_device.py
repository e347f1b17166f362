"""opt4torch.device: DevicePrefetcher.

This machine has no GPU. The CPU path (batches pass through) is tested for
real, with real DataLoaders. The CUDA path's thread, depth bound, cancellation
and error handling are tested with ``_cuda_ops_factory`` replaced by a
recorder that stands in for the CUDA calls (streams, events, pinning,
record_stream); the CUDA calls themselves are not exercised here.
"""

from __future__ import annotations

import collections
import gc
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
import torch
from ourthreads import our_threads, wait_for_no_threads_of_ours
from torch.utils.data import DataLoader, Dataset

import opt4torch
from opt4torch import device as devmod
from opt4torch.device import DevicePrefetcher, map_tensors


class Pair(NamedTuple):
    x: torch.Tensor
    label: int


class Items(Dataset):
    def __init__(self, n: int = 20, fail_at: int | None = None) -> None:
        self.n = n
        self.fail_at = fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == self.fail_at:
            raise KeyError(f"item {i} is missing")
        return {"x": torch.full((3,), float(i)), "i": i, "name": f"n{i}"}


# ------------------------------------------------------------ structure


def test_map_tensors_keeps_the_structure() -> None:
    t = torch.ones(2)
    batch = {
        "a": (t, [t, 3, "s"]),
        "b": Pair(t, 7),
        "c": collections.OrderedDict(z=t),
        "d": None,
    }
    out = map_tensors(lambda x: x * 2, batch)
    assert type(out) is dict and type(out["c"]) is collections.OrderedDict
    assert isinstance(out["b"], Pair) and out["b"].label == 7
    assert torch.equal(out["b"].x, t * 2) and torch.equal(out["c"]["z"], t * 2)
    assert out["a"][1][1:] == [3, "s"] and isinstance(out["a"], tuple)
    assert out["d"] is None
    assert torch.equal(out["a"][0], t * 2)
    assert map_tensors(lambda x: x, "plain") == "plain"


def test_lazy_export() -> None:
    assert opt4torch.DevicePrefetcher is DevicePrefetcher


# ------------------------------------------------------------ the CPU path


@pytest.mark.skipif(torch.cuda.is_available(), reason="device=None means CUDA on this machine")
def test_default_device_without_cuda_is_the_cpu() -> None:
    assert DevicePrefetcher([1]).device == torch.device("cpu")


def test_cuda_without_cuda_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="asks for CUDA.*device=None"):
        DevicePrefetcher([1], device="cuda")
    with pytest.raises(ValueError, match="depth"):
        DevicePrefetcher([1], device="cpu", depth=0)
    with pytest.raises(ValueError, match="not a torch device"):
        DevicePrefetcher([1], device="warp-drive")
    with pytest.raises(TypeError, match="iterable"):
        DevicePrefetcher(3, device="cpu")  # type: ignore[arg-type]


def test_cpu_passes_batches_through_unchanged() -> None:
    batches = [{"x": torch.ones(2)}, (torch.zeros(1), "s"), Pair(torch.ones(1), 1), 5]
    pf = DevicePrefetcher(batches, device="cpu")
    assert len(pf) == 4
    out = list(pf)
    assert all(a is b for a, b in zip(out, batches)) and len(out) == 4
    assert list(pf) == out  # each iter() is an epoch
    it = iter(pf)
    next(it)
    it.close()
    assert list(it) == []
    assert not our_threads()  # the CPU path starts no thread
    with pytest.raises(TypeError, match="no len"):
        len(DevicePrefetcher(iter(batches), device="cpu"))


# Spawn workers import torch afresh (seconds each): marked slow, run by make test.
@pytest.mark.parametrize("workers,method", [(0, None), (2, "fork"),
                                            pytest.param(2, "spawn", marks=pytest.mark.slow)])
def test_cpu_with_a_dataloader(workers: int, method: str | None) -> None:
    assert wait_for_no_threads_of_ours() == []  # an earlier test's, ended
    loader = DataLoader(Items(20), batch_size=4, num_workers=workers, multiprocessing_context=method,
                        persistent_workers=workers > 0)
    pf = DevicePrefetcher(loader)
    assert len(pf) == 5
    for _ in range(2):
        seen = []
        for batch in pf:
            assert torch.equal(batch["x"][:, 0], batch["i"].float())
            assert batch["name"] == [f"n{int(i)}" for i in batch["i"]]
            seen += batch["i"].tolist()
        assert seen == list(range(20))
    # Early break: the loader's iterator and its workers go with the epoch.
    for k, _ in enumerate(pf):
        if k == 1:
            break
    del loader, pf
    assert wait_for_no_threads_of_ours() == []


def test_cpu_loader_errors_reach_the_consumer() -> None:
    pf = DevicePrefetcher(DataLoader(Items(12, fail_at=9), batch_size=4), device="cpu")
    it = iter(pf)
    next(it)
    next(it)
    with pytest.raises(KeyError, match="item 9 is missing"):
        next(it)


def test_other_devices_get_a_synchronous_copy() -> None:
    # The "meta" device stands in for a non-CUDA accelerator: this tests the
    # plain .to(device) path and the structure it keeps, not CUDA.
    pf = DevicePrefetcher([(torch.ones(2, 3), 4)], device="meta")
    (x, label), = list(pf)
    assert x.device.type == "meta" and x.shape == (2, 3) and label == 4


# ---------------------------------------- the CUDA path, with stand-in ops


class FakeOps:
    """Records what the CUDA path asks for, in the order it asks."""

    log: list[tuple[str, Any]] = []

    def __init__(self, device: torch.device, non_blocking: bool) -> None:
        self.device = device
        self.non_blocking = non_blocking
        self.in_stream = threading.local()
        self.thread: threading.Thread | None = None
        self.events = 0

    def enter_thread(self) -> str:
        self.thread = threading.current_thread()
        self.log.append(("enter", self.thread.name))
        return "side-stream"

    def stream_context(self, stream: str) -> Any:
        ops = self

        class Ctx:
            def __enter__(self) -> None:
                ops.in_stream.on = stream

            def __exit__(self, *a: Any) -> None:
                ops.in_stream.on = None

        return Ctx()

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        assert getattr(self.in_stream, "on", None) == "side-stream", "copy outside the side stream"
        assert threading.current_thread() is self.thread, "copy outside the staging thread"
        self.log.append(("copy", self.non_blocking))
        return t.clone()

    def record_event(self, stream: str) -> int:
        assert self.in_stream.on == stream
        self.events += 1
        self.log.append(("event", self.events))
        return self.events

    def consumer_wait(self, event: int) -> None:
        assert threading.current_thread() is threading.main_thread()
        self.log.append(("wait", event))

    def consumer_claim(self, t: torch.Tensor) -> None:
        assert threading.current_thread() is threading.main_thread()
        self.log.append(("claim", tuple(t.shape)))


@pytest.fixture
def fake_cuda(monkeypatch) -> type[FakeOps]:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devmod, "_cuda_ops_factory", FakeOps)
    FakeOps.log = []
    return FakeOps


class Counting:
    """An iterable of n batches that counts how many were taken, and whether
    its iterator was closed (the loader's resources released)."""

    def __init__(self, n: int, fail_at: int | None = None, delay: float = 0.0) -> None:
        self.n = n
        self.fail_at = fail_at
        self.delay = delay
        self.taken = 0
        self.closed = threading.Event()

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Any]:
        try:
            for k in range(self.n):
                if k == self.fail_at:
                    raise OSError(f"batch {k} could not be read")
                time.sleep(self.delay)
                self.taken += 1
                yield Pair(torch.full((2, 2), float(k)), k), {"y": torch.tensor([k])}
        finally:
            self.closed.set()


def test_cuda_path_stages_on_a_side_stream_and_waits_per_batch(fake_cuda) -> None:
    assert wait_for_no_threads_of_ours() == []  # an earlier test's, ended
    pf = DevicePrefetcher(Counting(5), device="cuda:0", depth=2, non_blocking=True)
    assert pf.device == torch.device("cuda", 0)
    out = []
    for (pair, d) in pf:
        # The consumer waited on this batch's event and claimed its tensors
        # for its stream before it saw the batch.
        consumer = [e for e in fake_cuda.log if e[0] in ("wait", "claim")]  # the thread logs too
        assert consumer[-3:] == [("wait", pair.label + 1), ("claim", (2, 2)), ("claim", (1,))]
        out.append((pair.x[0, 0].item(), pair.label, d["y"].item()))
    assert out == [(float(k), k, k) for k in range(5)]
    kinds = [k for k, _ in fake_cuda.log]
    assert kinds.count("enter") == 1 and kinds[0] == "enter"
    assert kinds.count("copy") == 10 and kinds.count("event") == 5 and kinds.count("wait") == 5
    assert all(v is True for k, v in fake_cuda.log if k == "copy")
    # Per batch: its two copies, then its event.
    staged = [k for k in kinds if k in ("copy", "event")]
    assert staged == ["copy", "copy", "event"] * 5
    assert wait_for_no_threads_of_ours() == []


def test_cuda_path_depth_bounds_the_staged_batches(fake_cuda) -> None:
    loader = Counting(50)
    it = iter(DevicePrefetcher(loader, device="cuda:0", depth=3))
    next(it)
    time.sleep(0.3)  # the thread runs as far ahead as it may
    assert loader.taken == 1 + 3
    next(it)
    time.sleep(0.2)
    assert loader.taken == 2 + 3
    it.close()
    assert not it.thread.is_alive() and loader.closed.is_set()


def test_cuda_path_early_break_and_gc_stop_the_thread(fake_cuda) -> None:
    assert wait_for_no_threads_of_ours() == []  # an earlier test's, ended
    loader = Counting(100, delay=0.001)
    pf = DevicePrefetcher(loader, device="cuda:0", depth=2)
    it = iter(pf)
    thread = it.thread
    for k, _ in enumerate(it):
        if k == 3:
            break
    assert thread.is_alive()
    del it
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()
    assert loader.closed.wait(5), "the loader's iterator was not released"
    assert loader.taken < 100
    assert wait_for_no_threads_of_ours() == []
    # A new epoch works after a dropped one.
    assert sum(1 for _ in pf) == 100


def test_cuda_path_loader_errors_reach_the_consumer(fake_cuda) -> None:
    assert wait_for_no_threads_of_ours() == []  # an earlier test's, ended
    it = iter(DevicePrefetcher(Counting(10, fail_at=4), device="cuda:0", depth=2))
    labels = [next(it)[0].label for _ in range(4)]
    assert labels == [0, 1, 2, 3]
    with pytest.raises(OSError, match="batch 4 could not be read"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert wait_for_no_threads_of_ours() == []


def test_cuda_path_with_dataloader_workers(fake_cuda) -> None:
    assert wait_for_no_threads_of_ours() == []  # an earlier test's, ended
    loader = DataLoader(Items(24), batch_size=4, num_workers=2, multiprocessing_context="fork")
    pf = DevicePrefetcher(loader, device="cuda:0", depth=2)
    seen = [i for batch in pf for i in batch["i"].tolist()]
    assert seen == list(range(24))
    for k, _ in enumerate(pf):
        if k == 0:
            break
    del pf, loader
    assert wait_for_no_threads_of_ours() == []


class Slow:
    """Batches whose second takes `hold` seconds to produce, with the times
    it started and was done, so a test can fork while the staging thread is
    inside it."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.inside = threading.Event()
        self.done_at = 0.0

    def __iter__(self) -> Iterator[Any]:
        yield torch.zeros(2)
        self.inside.set()
        time.sleep(self.hold)
        self.done_at = time.monotonic()
        yield torch.ones(2)
        yield torch.full((2,), 2.0)


def test_cuda_path_parks_its_staging_thread_across_fork(fake_cuda) -> None:
    """A fork in the consumer waits for the batch the staging thread is on
    (the package's rule: no fork while a thread of ours may hold a lock), and
    the thread goes on after it: every batch arrives, in order."""
    assert wait_for_no_threads_of_ours() == []  # an earlier test's, ended
    loader = Slow(hold=0.5)
    it = iter(DevicePrefetcher(loader, device="cuda:0", depth=2))
    assert next(it).sum().item() == 0
    assert loader.inside.wait(10), "the staging thread never took the second batch"
    pid = os.fork()
    if pid == 0:
        os._exit(0)  # the child only has to exist
    forked_at = time.monotonic()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert loader.done_at > 0 and forked_at >= loader.done_at, \
        "the fork went ahead while the staging thread was inside the loader"
    assert [b[0].item() for b in it] == [1.0, 2.0]
    assert wait_for_no_threads_of_ours() == []
