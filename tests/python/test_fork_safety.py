"""Fork while our threads run: DataLoader workers that are not persistent are
forked anew every epoch while the prefetch threads load ahead.

A child forked while another thread holds a lock inherits the lock held by a
thread it does not have, and deadlocks the first time it takes it. The C
prefetcher parks its threads around fork (pthread_atfork); those that call
a Python dataset are parked first by Python's before-fork hook, with the GIL
released (os.register_at_fork, binding/pysource.c), and other Python threads
park at :class:`opt4torch._forksafe.ForkGate`. Here, 200 epochs of fork
workers with prefetch on, for both sources; the Python case uses a dataset
whose every load holds a process-wide lock, the lock a forked worker takes
again on its own misses: before parking, a fork in the middle of a prefetch
thread's load left the worker waiting forever.
`make test-asan-binding` runs this module under ASan+UBSan too (where the
sanitizer's allocator lock was the one inherited held).
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import opt4torch
from opt4torch._forksafe import ForkGate
from opt4torch.records import RecordFile, write_records

pytestmark = pytest.mark.usefixtures("no_leaked_pools")

EPOCHS, N_ITEMS, BATCH, CAPACITY = 200, 48, 8, 16


def record_bytes(i: int) -> bytes:
    rng = np.random.default_rng(7000 + i)
    return rng.integers(0, 256, size=64 + (i * 53) % 900, dtype=np.uint8).tobytes()


def check_positions(loader: opt4torch.DataLoader, epochs: int, item_of) -> int:
    """Run the epochs; every sample must be the plan's item at its position."""
    seq = loader.cache.plan.seq
    t = 0
    for _ in range(epochs):
        for batch in loader:
            for sample in batch:
                assert item_of(sample) == int(seq[t]), f"position {t}"
                t += 1
    return t


def assert_exact_and_parked(loader: opt4torch.DataLoader, item_of, kind: str) -> None:
    """Run every epoch: every sample right, the plan's hits, and the
    prefetch threads parked for every fork."""
    assert check_positions(loader, EPOCHS, item_of) == EPOCHS * N_ITEMS
    st = loader.cache.stats()
    assert st["fallbacks"] == 0 and st["timeouts"] == 0, repr(st)  # repr: every counter shown
    assert st["hits"] == st["plan_hits"], repr(st)
    pf = st["prefetcher"]
    assert pf["kind"] == kind and st["prefetched"] > 0, st
    # Every epoch forked two workers while the threads ran (the first
    # epoch's workers are forked before the prefetcher starts).
    assert pf["parks"] >= 2 * (EPOCHS - 1), pf
    assert pf["park_timeouts"] == 0, pf


@pytest.mark.timeout(300)
def test_record_prefetch_across_200_epochs_of_fork_workers(tmp_path) -> None:
    path = tmp_path / "d.rec"
    write_records(path, (record_bytes(i) for i in range(N_ITEMS)))
    by_head = {record_bytes(i)[:16]: i for i in range(N_ITEMS)}
    rf = RecordFile(path, with_labels=False, latency=0.0002)
    loader = opt4torch.DataLoader(rf, batch_size=BATCH, shuffle=True, seed=11, num_workers=2,
                                  multiprocessing_context="fork", persistent_workers=False,
                                  cache_items=CAPACITY, epochs=EPOCHS, prefetch_threads=2,
                                  collate_fn=list)
    try:
        def item_of(data: bytes) -> int:
            i = by_head[data[:16]]
            assert data == record_bytes(i)
            return i

        assert_exact_and_parked(loader, item_of, "records")
    finally:
        loader.cache.close()


_LOAD_LOCK = threading.Lock()


class LockedLoads(Dataset):
    """Every load holds a process-wide lock for a moment (as a dataset that
    logs, or reads through a shared file object, does). A worker forked
    while a prefetch thread held it would wait for it forever."""

    def __len__(self) -> int:
        return N_ITEMS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with _LOAD_LOCK:
            time.sleep(0.0005)
            return torch.full((4,), float(i)), i


@pytest.mark.timeout(300)
def test_thread_prefetch_across_200_epochs_of_fork_workers() -> None:
    loader = opt4torch.DataLoader(LockedLoads(), batch_size=BATCH, shuffle=True, seed=12, num_workers=2,
                                  multiprocessing_context="fork", persistent_workers=False,
                                  cache_items=CAPACITY, epochs=EPOCHS, prefetch=True, prefetch_threads=2,
                                  collate_fn=list, wait_timeout=30)
    try:
        def item_of(sample: tuple[torch.Tensor, int]) -> int:
            x, i = sample
            assert torch.equal(x, torch.full((4,), float(i)))
            return i

        assert_exact_and_parked(loader, item_of, "callback")
    finally:
        loader.cache.close()


def test_gate_waits_for_busy_threads_and_blocks_new_work() -> None:
    """The gate's contract on its own: a fork waits until the busy thread
    leaves its region, and no thread enters one until the fork is over."""
    gate = ForkGate()
    inside, leave = threading.Event(), threading.Event()
    entered_during_fork = []

    def busy_worker() -> None:
        with gate.busy():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=busy_worker)
    t.start()
    assert inside.wait(10)
    threading.Timer(0.3, leave.set).start()
    t0 = time.monotonic()
    gate._close()  # what the before-fork hook does
    waited = time.monotonic() - t0
    assert not gate._busy and waited >= 0.2, waited

    def late_worker() -> None:
        with gate.busy():
            entered_during_fork.append(time.monotonic())

    t2 = threading.Thread(target=late_worker)
    t2.start()
    time.sleep(0.2)
    assert entered_during_fork == []  # held at the gate while "forking"
    opened = time.monotonic()
    gate._open()
    t2.join(10)
    t.join(10)
    assert entered_during_fork and entered_during_fork[0] >= opened
    assert gate.parks == 1 and gate.park_timeouts == 0


def test_fork_in_the_middle_of_a_load_does_not_wait_for_itself() -> None:
    """A busy thread that forks (os.fork inside a load) is not waited for."""
    gate = ForkGate()
    with gate.busy():
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        assert time.monotonic() - t0 < 5
    assert gate.park_timeouts == 0


FOREIGN_THREADS_FORKING = r'''
import ctypes, os, signal, sys, threading, time
if sys.argv[2] == "opt4torch":
    import opt4torch._engine  # noqa: F401 - its at-fork hook (binding/forkfix.c)
libc = ctypes.CDLL(None)
START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)

# At most 32 of them alive: unbounded, they piled up while the cores were
# busy, and under ASan (tens of MB committed a thread) os.fork() itself
# failed with ENOMEM (a make test run beside test-python).
slots = threading.BoundedSemaphore(32)

@START
def entry(arg):  # a C thread entering Python: PyGILState_Ensure makes its thread state
    slots.release()
    return None

def spawn():
    tid = ctypes.c_ulong()
    while True:
        slots.acquire()
        if libc.pthread_create(ctypes.byref(tid), None, entry, None) != 0:
            slots.release()
            continue
        libc.pthread_detach(tid)

for _ in range(4):
    threading.Thread(target=spawn, daemon=True).start()
hung = 0
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    deadline = time.monotonic() + 2
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:  # stuck in os.fork's after-fork code
            hung += 1
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.001)
print(hung)
os._exit(0)
'''


@pytest.mark.skipif(not opt4torch._engine.FORK_HEAD_LOCK_FIX, reason="this Python renews HEAD_LOCK itself")
def test_a_child_forked_while_c_threads_enter_python_does_not_hang(tmp_path) -> None:
    """CPython up to 3.11.7 (gh-112275): a child forked while a C thread is
    making its Python thread state inherits the runtime's HEAD_LOCK held,
    and hangs in os.fork itself; torch's threads do that beside a
    DataLoader that forks its workers (a torchrun test hung one run in ten).
    With the engine imported, its at-fork hook renews the lock in the child
    (binding/forkfix.c): none of 400 children hangs. Without it, 1-2 of 300
    hung here (not asserted: it is a race)."""
    import subprocess
    import sys

    script = tmp_path / "forking.py"
    script.write_text(FOREIGN_THREADS_FORKING)
    r = subprocess.run([sys.executable, str(script), "400", "opt4torch"], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split()[-1]) == 0
