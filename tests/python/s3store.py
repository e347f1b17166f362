"""The loopback S3 server for tests: bench/s3server.py's :class:`Server`
(moto's server mode behind a middleware that adds latency at the server and
accepts one access key id) in a subprocess, on a free port of 127.0.0.1."""

from __future__ import annotations

import os
import sys

_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)

from s3server import Server  # noqa: E402

__all__ = ["Server", "SERVER_SCRIPT"]

SERVER_SCRIPT = os.path.join(_BENCH, "s3server.py")
