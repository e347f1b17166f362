"""Writing files, and reading back what we wrote: the package's one way, over the engine's ``opt4_outfile``
(include/opt4.h), which plan files and record files use too.

A file is written into a temporary file beside its path and renamed over the
path once complete, so a reader sees the old file or the new one and a
failure leaves the old one. The target is checked before anything is
written: only a missing path or a regular file is replaced; a directory, a
device node (``/dev/null``), a FIFO or a socket is refused with the reason. A
symbolic link is never written through: it is replaced itself when it leads
to a regular file or to nothing, refused otherwise (and refused always with
``no_symlink=True``, as record files do). Temporaries carry their writer's
pid, start time and PID namespace, and the next write of the same path
removes those whose writer died (SIGKILL).

:func:`read_capped` reads back a file we cached (an index), as what it must
be: a regular file, opened without blocking (a FIFO planted there), of at
most the bytes it can take.

:func:`abort_on_sigterm` makes SIGTERM unwind a write as SIGINT does (the
temporary is removed), then ends the process as SIGTERM would have.

May touch: the paths it is given, through the binding's OutFile (temporary,
then renamed); SIGTERM's handler while a file is written.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import stat
import threading
from collections.abc import Iterator
from typing import IO, Any

from .. import _engine

__all__ = ["FileRefused", "abort_on_sigterm", "atomic_write", "check_output", "file_kind", "output_path",
           "read_capped"]


class FileRefused(ValueError):
    """A file :func:`read_capped` would not read: what was wrong with it."""


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, from its ``st_mode``."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return f"mode {stat.filemode(mode)}"


def read_capped(where: str | os.PathLike[str], cap: int, what: str = "this file") -> bytes:
    """The bytes of the regular file at ``where``, refused (FileRefused)
    when it is anything else or larger than ``cap`` (the most ``what`` can
    take). Opened with O_NONBLOCK,
    so that a FIFO planted there does not block the open; FileNotFoundError
    where there is none."""
    fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"it is not a regular file ({file_kind(st.st_mode)})")
        if st.st_size > cap:
            raise FileRefused(f"it is {st.st_size} bytes, more than {what} can be ({cap})")
        parts, got = [], 0
        while True:  # read to the end, at most cap + 1 bytes: a file growing under us is refused too
            part = os.read(fd, min(cap + 1 - got, 1 << 24))
            if not part:
                break
            parts.append(part)
            got += len(part)
            if got > cap:
                raise FileRefused(f"it grew past {cap} bytes while being read")
        return b"".join(parts)
    finally:
        os.close(fd)


def check_output(path: str | os.PathLike[str], *, no_symlink: bool = False) -> None:
    """Raise :class:`opt4torch.Opt4IOError` naming why ``path`` cannot be
    written (a directory, a device, a FIFO, a refused link), creating nothing."""
    _engine.outfile_check(os.fspath(path), no_symlink=no_symlink)


def output_path(path: str | os.PathLike[str], *, no_symlink: bool = False, parent_must_exist: bool = True) -> str:
    """The one check of a path the package is asked to write, before any
    work: a usable file name (ValueError), not a link when ``no_symlink``
    (ValueError), no file where a folder on the way should be
    (NotADirectoryError), its folder there when ``parent_must_exist``
    (FileNotFoundError), then the engine's check (:func:`check_output`:
    a directory, a device, a FIFO, a link to one). Returns the path as a str."""
    out = os.fspath(path)
    if not out or "\0" in out or out.endswith(os.sep):
        raise ValueError(f"{out!r} is not a usable file name: give the path of a file")
    if no_symlink and os.path.islink(out):
        raise ValueError(f"{out} is a symbolic link: refusing to write through it; give another path")
    parent = os.path.dirname(os.path.abspath(out))
    probe = parent
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        raise NotADirectoryError(f"{out!r}: {probe!r} is a file, not a directory")
    if parent_must_exist and not os.path.isdir(parent):
        raise FileNotFoundError(f"the folder {parent} does not exist: create it first")
    check_output(out, no_symlink=no_symlink)
    return out


class _Raw(io.RawIOBase):
    def __init__(self, out: Any) -> None:
        self._out = out

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self._out.write(b)
        return memoryview(b).nbytes


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", *, no_symlink: bool = False) -> Iterator[IO[Any]]:
    """A file object for ``path``, put in place when the block ends without
    an exception, removed otherwise. ``mode`` is ``"w"`` (UTF-8 text, no
    newline translation) or ``"wb"``. The target is checked (and dead
    writers' temporaries removed) before the block runs."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', not {mode!r}")
    out = _engine.OutFile(os.fspath(path), no_symlink=no_symlink)
    try:
        buffered = io.BufferedWriter(_Raw(out), buffer_size=1 << 16)
        f: IO[Any] = buffered if mode == "wb" else io.TextIOWrapper(buffered, encoding="utf-8", newline="")
        yield f
        f.flush()
        out.commit()
    except BaseException:
        out.abort()
        raise


class _Terminated(BaseException):
    """SIGTERM arrived during a write: unwinds it like KeyboardInterrupt."""


@contextlib.contextmanager
def abort_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises (so ``except BaseException`` cleanup
    runs and temporaries are removed, as for SIGINT); when the block has
    unwound, the previous disposition is restored and the signal delivered
    again, so the process ends (or its own handler runs) as it would have.
    Only in the main thread, and only where SIGTERM is not ignored; elsewhere
    a dead writer's temporary is removed by the next write of the path."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN or previous is None:
        yield
        return
    state = {"inside": True, "hit": False, "done": False}

    def handler(signum: int, frame: Any) -> None:
        state["hit"] = True
        if state["inside"]:
            raise _Terminated()

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
        state["done"] = True
    except _Terminated:
        pass
    finally:
        state["inside"] = False
        signal.signal(signal.SIGTERM, previous)
    if state["hit"]:
        signal.raise_signal(signal.SIGTERM)
        # The previous handler returned (it chose to go on). If the write
        # was undone, the caller must not take it as done.
        if not state["done"]:
            raise InterruptedError("SIGTERM arrived during the write; it was undone (nothing was replaced)")
