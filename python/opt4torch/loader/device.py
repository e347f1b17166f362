"""The stage to the GPU: copy the next batches while the current one trains.

:class:`DevicePrefetcher` wraps any iterable of batches (a DataLoader, an
``opt4torch.DataLoader``, a generator factory with ``__iter__``) and yields the
same batches on ``device``:

* On CUDA, a persistent staging thread with its own CUDA stream takes batches
  from the loader, pins their tensors (unless already pinned), copies them to
  the device with ``non_blocking`` inside that stream and records a CUDA event
  per batch. The consumer makes its current stream wait on the event (no host
  synchronisation) and marks every tensor with ``record_stream`` so the
  caching allocator does not hand their memory back to the side stream while
  the training step still uses it. At most ``depth`` batches are staged ahead
  of the one the consumer holds.
* On the CPU (including every machine without CUDA, where ``device=None``
  means the CPU), batches pass through unchanged: no thread, no copy, no pin.
* On any other device (``mps``, ``xpu``, ...), each batch is moved with a
  plain synchronous ``.to(device)`` in the consumer's thread.

Batches may be tensors or any nesting of tuples, lists, dicts and namedtuples
of tensors; everything that is not a tensor passes through as it is.

Each ``iter()`` is an epoch with its own staging thread, started after the
loader's iterator exists (so after its workers have forked). Breaking out of
the loop, dropping the iterator or calling its ``close()`` stops the thread; an
exception raised by the loader reaches the consumer at the batch where it
happened. Across an ``os.fork`` in another thread (a new DataLoader's
workers), the staging thread is parked: the fork waits for the batch it is
taking and staging, and it takes no other until the fork is done.

The CUDA path is guarded (it runs only when the device is a CUDA device) and
has not been run on a GPU in this project: the machine has none. The tests
drive its thread, depth bound, cancellation and error paths with stand-in
operations that record what the CUDA calls would have been (see
docs/python-prefetch.md).

May touch: CUDA streams and pinned memory of the batches it is given, one
thread of its own; never the cache.
"""

from __future__ import annotations

import atexit
import collections.abc
import queue
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ..io.forksafe import ForkGate

__all__ = ["DevicePrefetcher", "map_tensors"]

# How long a blocked wait sleeps before looking at the stop flag again.
_POLL = 0.05
# How long close() waits for the staging thread to finish the batch it is on.
_JOIN_TIMEOUT = 10.0

_BATCH, _END, _ERROR = 0, 1, 2


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """Apply ``fn`` to every tensor in a nested batch, keeping its structure.

    Tuples, lists, dicts (and other mappings that can be rebuilt from a dict)
    and namedtuples are rebuilt with their own type; anything else that is not
    a tensor (ints, strings, numpy arrays, ``None``) is returned unchanged.
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(map_tensors(fn, x) for x in obj))
    if isinstance(obj, (tuple, list)):
        mapped = [map_tensors(fn, x) for x in obj]
        try:
            return type(obj)(mapped)
        except TypeError:  # a subclass whose constructor takes other arguments
            return tuple(mapped) if isinstance(obj, tuple) else mapped
    if isinstance(obj, collections.abc.Mapping):
        mapped_d = {k: map_tensors(fn, v) for k, v in obj.items()}
        try:
            return type(obj)(mapped_d)  # type: ignore[call-arg]
        except TypeError:
            return mapped_d
    return obj


def _resolve_device(device: str | torch.device | int | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a torch device: {exc}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"device={device!r} asks for CUDA but torch.cuda.is_available() is False on this "
                "machine: pass device=None (the CPU here, the GPU where there is one) or 'cpu'"
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class _CudaOps:
    """The CUDA calls of the staging path, in one place.

    The tests replace this class with a recorder (there is no GPU here), so
    everything CUDA-specific the prefetcher does goes through these methods.
    """

    def __init__(self, device: torch.device, non_blocking: bool) -> None:
        self.device = device
        self.non_blocking = non_blocking

    def enter_thread(self) -> Any:
        """Called first in the staging thread: make ``device`` current there
        (the current device is per thread) and create the side stream."""
        torch.cuda.set_device(self.device)
        return torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]

    def stream_context(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """Pin ``t`` (a host tensor) and start its copy on the current (side)
        stream. A tensor already on the device is returned as it is."""
        if t.device == self.device:
            return t
        if t.device.type == "cpu" and not t.is_pinned():
            # Without pinned memory a non_blocking copy is synchronous anyway.
            t = t.pin_memory()
        return t.to(self.device, non_blocking=self.non_blocking)

    def record_event(self, stream: Any) -> Any:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(stream)
        return event

    def consumer_wait(self, event: Any) -> None:
        """Make the consumer's current stream wait for the batch's copies,
        without blocking the host."""
        torch.cuda.current_stream(self.device).wait_event(event)

    def consumer_claim(self, t: torch.Tensor) -> None:
        """The tensor was allocated on the side stream and is now used on the
        consumer's: tell the caching allocator, so its memory is not reused by
        the side stream before the consumer's work on it is done."""
        if t.device == self.device:
            t.record_stream(torch.cuda.current_stream(self.device))


# The class that builds the CUDA operations; the tests swap it for a recorder.
_cuda_ops_factory: Callable[[torch.device, bool], Any] = _CudaOps


class _Shared:
    """What the staging thread and the consumer share. The thread holds this,
    never the epoch iterator, so dropping the iterator lets it be collected
    and its finalizer stop the thread."""

    def __init__(self, depth: int) -> None:
        self.queue: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self.slots = threading.Semaphore(depth)
        self.stop = threading.Event()


def _acquire(shared: _Shared) -> bool:
    while not shared.stop.is_set():
        if shared.slots.acquire(timeout=_POLL):
            return not shared.stop.is_set()
    return False


# Staging threads are parked across os.fork (the package's rule: no fork
# while a thread of ours can hold a lock): a thread takes its next batch and
# stages it inside the gate's busy region, so a fork in another thread waits
# for the batch it is on, and the thread waits for the fork to end before it
# takes the next one (io/forksafe.py).
_gate = ForkGate()


def _stage(shared: _Shared, loader_it: Iterator[Any], ops: Any) -> None:
    """The staging thread: loader -> pinned -> device, one event per batch."""
    try:
        stream = ops.enter_thread()
        while _acquire(shared):
            with _gate.busy():
                try:
                    batch = next(loader_it)
                except StopIteration:
                    shared.queue.put((_END, None))
                    return
                with ops.stream_context(stream):
                    staged = map_tensors(ops.copy, batch)
                    event = ops.record_event(stream)
                del batch
            shared.queue.put((_BATCH, (staged, event)))
        # Stopped: nobody will read what is left.
    except BaseException as exc:  # handed to the consumer, re-raised there
        shared.queue.put((_ERROR, exc))
    finally:
        # The loader's iterator (and its worker processes) goes with this frame.
        del loader_it


def _shutdown(shared: _Shared, thread: threading.Thread | None, join: float) -> None:
    # Also run by the garbage collector, in whatever thread it runs in: set
    # the flag, take no lock the staging thread may hold. The thread sees it
    # within _POLL seconds.
    shared.stop.set()
    if thread is not None and join > 0 and thread is not threading.current_thread():
        thread.join(join)
    # Staged batches hold device memory: let it go now.
    while True:
        try:
            shared.queue.get_nowait()
        except queue.Empty:
            break


# The staging threads alive, with their shared state, for the exit hook.
_live: weakref.WeakKeyDictionary[threading.Thread, _Shared] = weakref.WeakKeyDictionary()


@atexit.register
def _join_at_exit() -> None:
    # Python finalizes with daemon threads frozen wherever they are; one
    # frozen inside torch can abort the exit. Stop them and let each finish
    # the batch it is on.
    for thread, shared in list(_live.items()):
        _shutdown(shared, thread, _JOIN_TIMEOUT)


class _PassThrough:
    """An epoch on the CPU: the loader's batches, unchanged."""

    def __init__(self, loader_it: Iterator[Any], to: Callable[[Any], Any] | None) -> None:
        self._it: Iterator[Any] | None = loader_it
        self._to = to

    def __iter__(self) -> _PassThrough:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            raise StopIteration
        try:
            batch = next(self._it)
        except StopIteration:
            self._it = None
            raise
        return batch if self._to is None else self._to(batch)

    def close(self) -> None:
        """End the epoch now; the loader's iterator is released."""
        self._it = None


class _CudaEpoch:
    """An epoch on CUDA: a staging thread runs ``depth`` batches ahead."""

    def __init__(self, loader_it: Iterator[Any], ops: Any, depth: int) -> None:
        self._ops = ops
        self._shared = _Shared(depth)
        self._done = False
        self._thread = threading.Thread(
            target=_stage, args=(self._shared, loader_it, ops),
            name="opt4torch-device-prefetch",
            # Daemon only as a last resort: close(), the end of the epoch and
            # the finalizer below all stop it; a loader stuck inside next()
            # must still not keep the interpreter from exiting.
            daemon=True,
        )
        self._thread.start()
        self._finalizer = weakref.finalize(self, _shutdown, self._shared, self._thread, 0.0)
        _live[self._thread] = self._shared

    def __iter__(self) -> _CudaEpoch:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        shared = self._shared
        while True:
            try:
                kind, payload = shared.queue.get(timeout=_POLL)
                break
            except queue.Empty:
                if not self._thread.is_alive() and shared.queue.empty():
                    # Cannot happen unless the thread was killed from outside.
                    self.close()
                    raise RuntimeError("the device prefetch thread ended without a result") from None
        shared.slots.release()
        if kind == _BATCH:
            staged, event = payload
            self._ops.consumer_wait(event)
            map_tensors(self._ops.consumer_claim, staged)
            return staged
        self.close()
        if kind == _ERROR:
            raise payload
        raise StopIteration

    def close(self) -> None:
        """Stop the staging thread (after the batch it is loading, if any) and
        free the batches it staged."""
        self._done = True
        self._finalizer.detach()
        _shutdown(self._shared, self._thread, _JOIN_TIMEOUT)

    @property
    def thread(self) -> threading.Thread:
        """The staging thread (for tests and diagnostics)."""
        return self._thread


class DevicePrefetcher:
    """Batches from ``loader``, moved to ``device`` ahead of use.

    ``device`` defaults to the current CUDA device when CUDA is available and
    to the CPU otherwise; on the CPU batches pass through unchanged. ``depth``
    (at least 1) bounds how many batches are staged on the device ahead of the
    one the consumer holds. ``non_blocking`` is passed to the copies (CUDA
    only: they are issued on a side stream from pinned memory).

    ``len(prefetcher)`` is ``len(loader)``; each ``iter(prefetcher)`` is one
    epoch over ``iter(loader)``.

    Example::

        loader = DataLoader(dataset, batch_size=256, num_workers=8, pin_memory=True)
        for images, labels in DevicePrefetcher(loader):   # on the GPU, ready to use
            ...
    """

    def __init__(self, loader: Iterable[Any], device: str | torch.device | int | None = None,
                 depth: int = 2, non_blocking: bool = True) -> None:
        if not hasattr(loader, "__iter__"):
            raise TypeError(
                f"loader must be iterable (a DataLoader or any iterable of batches), got "
                f"{type(loader).__name__}"
            )
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer (batches staged ahead), got {depth!r}")
        self.loader = loader
        self.device = _resolve_device(device)
        self.depth = depth
        self.non_blocking = bool(non_blocking)

    def __len__(self) -> int:
        try:
            return len(self.loader)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"the wrapped loader ({type(self.loader).__name__}) has no len(); "
                "DevicePrefetcher's len() is the loader's"
            ) from None

    def __iter__(self) -> Iterator[Any]:
        loader_it = iter(self.loader)
        kind = self.device.type
        if kind == "cpu":
            return _PassThrough(loader_it, None)
        if kind == "cuda":
            return _CudaEpoch(loader_it, _cuda_ops_factory(self.device, self.non_blocking), self.depth)
        device = self.device
        return _PassThrough(loader_it, lambda b: map_tensors(lambda t: t.to(device), b))

    def __repr__(self) -> str:
        return (f"DevicePrefetcher({type(self.loader).__name__}, device={str(self.device)!r}, "
                f"depth={self.depth}, non_blocking={self.non_blocking})")
