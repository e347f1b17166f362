"""The loopback S3 server for tests: bench/s3server.py (moto's server mode
behind a middleware that adds latency at the server and accepts one access
key id) in a subprocess, on a free port of 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from typing import Any

__all__ = ["Server", "SERVER_SCRIPT"]

SERVER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "s3server.py")


class Server:
    """The server in a session of its own (no terminal, default signal
    dispositions, no standard input); ``endpoint`` is its URL."""

    def __init__(self, latency: float = 0.0, access_key: str | None = None) -> None:
        args = [sys.executable, SERVER_SCRIPT, "--port", "0", "--latency", str(latency)]
        if access_key is not None:
            args += ["--access-key", access_key]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True, start_new_session=True, restore_signals=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded by the test's timeout
        if not line.startswith("PORT "):
            err = self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""
            self.stop()
            raise RuntimeError(f"the S3 server did not start: {line!r} {err}")
        self.endpoint = f"http://127.0.0.1:{int(line.split()[1])}"

    def stats(self) -> dict[str, Any]:
        """What the server was asked: requests, gets, ranged_gets, get_bytes, lists, denied."""
        with urllib.request.urlopen(self.endpoint + "/_opt4/stats", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
