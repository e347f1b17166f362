"""The loopback S3 server for tests: bench/s3server.py's :class:`Server`
(moto's server mode behind a middleware that adds latency at the server and
accepts one access key id) in a subprocess, on a free port of 127.0.0.1."""

from __future__ import annotations

import os
import sys
from typing import Any

_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)

from s3server import Server  # noqa: E402

__all__ = ["Server", "SERVER_SCRIPT", "only_these_credentials"]

SERVER_SCRIPT = os.path.join(_BENCH, "s3server.py")


def only_these_credentials(monkeypatch: Any, key: str, secret: str, region: str) -> None:
    """Credentials and region as boto3 takes them, set for one test (and
    inherited by spawned workers); nothing from the machine's own."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION",
                 "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", region)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-role lookups on this machine
