"""Several processes on this machine as a torch.distributed job: the one
launcher the tests and benchmarks share (``torchrun --standalone`` on the
loopback address, each rank its own node or several ranks a node through
``OPT4TORCH_NODE``, see :data:`opt4torch.cluster.NODE_ENV`).

A rank killed by a signal dumps every thread's Python stack to stderr
(``PYTHONFAULTHANDLER``), and no rank reads the caller's terminal.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping

__all__ = ["descendants", "free_port", "rank_errors", "torchrun"]


def free_port() -> int:
    """A TCP port on the loopback address that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun(path: str, nproc: int, *args: str, node_env: str | None = None, timeout: float = 600,
             env: Mapping[str, str] | None = None, python: str | None = None) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node nproc path args`` on the loopback address,
    one OpenMP thread a rank, with ``OPT4TORCH_NODE`` set to ``node_env`` (or
    unset) and ``env`` added; its input closed, its output captured. Run by
    ``python`` (default: this interpreter; another environment's, for a
    benchmark of packages this one lacks).

    A job still running after ``timeout`` seconds is a hang: every process of
    it (torchrun, the ranks, their DataLoader workers) gets SIGABRT, so that
    each dumps its threads' Python stacks into the captured stderr
    (:func:`rank_errors` picks them out), and the result has returncode
    ``-SIGABRT`` and a first stderr line that says so. The ranks run in
    sessions of their own (torch's elastic agent makes them), and a process
    whose parent died is no one's descendant, so what the job left behind
    is found by what it holds: the job's output pipes. Every wait here ends."""
    cmd = [python or sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), path, *args]
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **(env or {})}
    full.pop("OPT4TORCH_NODE", None)
    if node_env is not None:
        full["OPT4TORCH_NODE"] = node_env
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          text=True, env=full, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            pipes = _pipe_inodes(proc)
            job = set(descendants(proc.pid) + [proc.pid]) | _holders(pipes)
            for pid in job:
                _signal(pid, signal.SIGABRT)
            try:
                out, err = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                _signal(-proc.pid, signal.SIGKILL)
                for pid in set(descendants(proc.pid)) | _holders(pipes):
                    _signal(pid, signal.SIGKILL)
                try:
                    out, err = proc.communicate(timeout=20)
                except subprocess.TimeoutExpired:  # held by a process we may not kill: stop reading
                    out, err = "", "launch.torchrun: the job's output stayed open after SIGKILL; not read\n"
            left = "" if proc.poll() is None or proc.returncode < 0 else (
                f"torchrun itself had ended ({proc.returncode}), but processes it left behind held its output: ")
            said = (f"launch.torchrun: the job ran past its {timeout:g} s: {left}SIGABRT to every process "
                    "for its stacks\n")
            return subprocess.CompletedProcess(cmd, -signal.SIGABRT, out, said + err)


def _pipe_inodes(proc: subprocess.Popen[str]) -> set[int]:
    """The inodes of the job's stdout and stderr pipes."""
    return {os.fstat(f.fileno()).st_ino for f in (proc.stdout, proc.stderr) if f is not None}


def _holders(inodes: set[int]) -> set[int]:
    """Every other process with one of these pipes open (from /proc)."""
    names = {f"pipe:[{i}]" for i in inodes}
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in names for fd in fds):
                found.add(int(entry))
        except OSError:
            continue  # gone meanwhile, or not ours to look at
    return found


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children first), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        if pid < 0:
            os.killpg(-pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def rank_errors(stderr: str) -> str:
    """What the ranks said when they failed: every rank's traceback (not only
    the last one torchrun prints) and the stacks a signal dumped."""
    errors = "\n".join(line for line in stderr.splitlines() if line.startswith("[rank"))
    dumps = "\n".join(line for line in stderr.splitlines()
                      if line.startswith(("Fatal Python error", "Thread 0x", "Current thread", "  File ",
                                          "terminate called", "what()")))
    return errors[-12000:] + "\n" + dumps[-12000:]
