"""Keeping this package's Python threads out of the way of ``os.fork``.

A child forked while another thread holds a lock (the allocator's inside a
C extension, a ``logging`` handler's, a file object's buffer lock, one in the
user's dataset code) inherits the lock held by a thread it does not have,
and can deadlock the first time it takes it. DataLoader forks its workers
every epoch unless they are persistent, while our prefetch threads run, so
those threads must be parked at a point where they hold nothing whenever a
fork happens. The C prefetcher does this for its own threads with
pthread_atfork (src/io/prefetcher.c), and the hook here parks them first,
with the GIL released, for those that call into Python (the callback
source, binding/pysource.c); :class:`ForkGate` does it for Python threads
with :func:`os.register_at_fork`.

A thread marks the work that may take locks (calling the user's dataset,
encoding) with ``with gate.busy():``. Before a fork, every gate of this
process closes: threads that are busy finish the call they are in, threads
that want to start one wait, and the fork goes ahead once none is busy
(bounded by :data:`PARK_TIMEOUT`; past it the fork goes ahead anyway, and
the gate counts it). After the fork the parent reopens the gates; in the
child the gates are new and empty (the threads are not there).

May touch: os.register_at_fork, and the gates of our own threads; never a
user's thread.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ForkGate", "PARK_TIMEOUT"]

#: Seconds a fork waits for busy threads to finish what they are doing.
PARK_TIMEOUT = 10.0


class ForkGate:
    """Parks a group of threads outside their busy regions across fork."""

    def __init__(self) -> None:
        self._reset()
        #: Forks this gate was closed for, and those that found a thread
        #: still busy at the timeout.
        self.parks = 0
        self.park_timeouts = 0
        _gates.add(self)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._busy: set[int] = set()  # idents of the threads in a busy region

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Run the body while no fork is in progress (waiting for one to end)."""
        me = threading.get_ident()
        with self._cond:
            while self._closed:
                self._cond.wait()
            self._busy.add(me)
        try:
            yield
        finally:
            with self._cond:
                self._busy.discard(me)
                if not self._busy:
                    self._cond.notify_all()

    def _close(self) -> None:
        with self._cond:
            self._closed = True
            self.parks += 1
            # A busy thread that forks itself (os.fork inside a dataset's
            # __getitem__) is the one thread that cannot be waited for.
            me = threading.get_ident()
            if not self._cond.wait_for(lambda: not (self._busy - {me}), timeout=PARK_TIMEOUT):
                self.park_timeouts += 1

    def _open(self) -> None:
        with self._cond:
            self._closed = False
            self._cond.notify_all()


_gates: weakref.WeakSet[ForkGate] = weakref.WeakSet()


def _before_fork() -> None:
    # The C prefetch threads first, with the GIL released: one that calls
    # into Python (a dataset's __getitem__) needs the GIL to finish its call
    # and reach a safe point, and os.fork holds it across fork()
    # (binding/pysource.c).
    from .. import _engine

    _engine.prefetchers_park()
    for gate in list(_gates):
        gate._close()


def _after_fork_in_parent() -> None:
    # Also after a fork that failed (the C parent handler did not run then).
    from .. import _engine

    _engine.prefetchers_resume()
    for gate in list(_gates):
        gate._open()


def _after_fork_in_child() -> None:
    # The threads are gone, and a gate's lock is not held (no gate is held
    # across the fork itself), but start clean all the same.
    for gate in list(_gates):
        gate._reset()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
