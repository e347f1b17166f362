"""The tests' torchrun launcher (opt4torch.lab.launch): a job that ended but
left a process holding its output is not waited on forever. The process is
found by the pipe it holds, though it is no one's descendant, and ended."""

from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest

from opt4torch.lab.launch import torchrun

pytestmark = pytest.mark.timeout(120)


def test_a_process_left_holding_the_output_is_found_and_ended(tmp_path) -> None:
    script = tmp_path / "leave.py"
    pidfile = tmp_path / "orphan.pid"
    # Rank 0 forks a child into a session of its own (as torch's agent puts
    # ranks, and as a DataLoader worker whose rank died ends up: its parent
    # gone, no one's descendant), which keeps the output open and sleeps.
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        if os.environ["RANK"] == "0":
            pid = os.fork()
            if pid == 0:
                os.setsid()
                with open({str(pidfile)!r}, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(600)
                os._exit(0)
        sys.exit(0)
    """))
    t0 = time.monotonic()
    r = torchrun(str(script), 2, timeout=10)
    took = time.monotonic() - t0
    assert r.returncode == -signal.SIGABRT
    assert "torchrun itself had ended (0), but processes it left behind held its output" in r.stderr
    assert took < 60, f"the launcher waited {took:.0f} s"
    orphan = int(pidfile.read_text())
    for _ in range(100):  # its end is asynchronous to the signal: up to 10 s
        try:
            os.kill(orphan, 0)
        except ProcessLookupError:
            break
        if open(f"/proc/{orphan}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            break  # ended, not yet reaped by init
        time.sleep(0.1)
    else:
        pytest.fail(f"the orphan {orphan} is still running")
