#!/usr/bin/env python3
"""An S3-compatible server on the loopback address, for tests and benchmarks:
moto's server (``moto[server]``) behind a small WSGI middleware that adds
what a real store costs, at the server, so every client pays it the same way.

* ``--latency S``: every request waits S seconds before it is answered (in
  its own server thread: requests in flight overlap, as at a real store);
* ``--bandwidth B``: a response body of n bytes takes n / B seconds more
  (per request: there is no shared link to saturate);
* ``--access-key K``: requests signed with another access key id get S3's
  ``403 InvalidAccessKeyId`` (moto itself accepts any credentials; the
  secret is not checked);
* ``GET /_opt4/stats`` answers JSON counters (requests, GETs, ranged GETs,
  bytes of GET bodies), ``POST /_opt4/reset`` zeroes them, and
  ``POST /_opt4/set?latency=S&bandwidth=B`` changes the costs of a running
  server. These paths are not S3's.

It binds 127.0.0.1 on ``--port`` (0: a free one), prints ``PORT <n>`` on one
line of stdout once it listens, and serves until SIGTERM or SIGINT.

    python bench/s3server.py [--port 0] [--latency 0.01] [--bandwidth 0]
        [--access-key testing]
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

__all__ = ["CostMiddleware", "main"]

_KEY_ID = re.compile(r"Credential=([^/,\s]+)/")
_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidAccessKeyId</Code>'
           b'<Message>The AWS Access Key Id you provided does not exist in our records.</Message></Error>')


class CostMiddleware:
    """Latency and bandwidth added to every answer of the app it wraps, and
    counters of what was asked."""

    def __init__(self, app: Callable[..., Any], latency: float, bandwidth: float, access_key: str | None) -> None:
        self.app = app
        self.latency = float(latency)
        self.bandwidth = float(bandwidth)
        self.access_key = access_key
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        with self._lock:
            self.counts = {"requests": 0, "gets": 0, "ranged_gets": 0, "get_bytes": 0, "lists": 0, "denied": 0}

    def _count(self, **delta: int) -> None:
        with self._lock:
            for k, v in delta.items():
                self.counts[k] += v

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith("/_opt4/"):
            return self._control(path, environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        self._count(requests=1)
        if self.latency:
            time.sleep(self.latency)
        if self.access_key is not None:
            auth = environ.get("HTTP_AUTHORIZATION", "")
            m = _KEY_ID.search(auth)
            if m is None or m.group(1) != self.access_key:
                self._count(denied=1)
                start_response("403 Forbidden", [("Content-Type", "application/xml"),
                                                 ("Content-Length", str(len(_DENIED)))])
                return [_DENIED]
        body = b"".join(self.app(environ, _capture(start_response)))
        query = environ.get("QUERY_STRING", "")
        if method == "GET" and "list-type" in query:
            self._count(lists=1)
        elif method == "GET":
            self._count(gets=1, ranged_gets=int("HTTP_RANGE" in environ), get_bytes=len(body))
        if self.bandwidth and body:
            time.sleep(len(body) / self.bandwidth)
        return [body]

    def _control(self, path: str, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if path == "/_opt4/reset":
            self._reset()
        elif path == "/_opt4/set":
            q = parse_qs(environ.get("QUERY_STRING", ""))
            if "latency" in q:
                self.latency = float(q["latency"][0])
            if "bandwidth" in q:
                self.bandwidth = float(q["bandwidth"][0])
        with self._lock:
            out = json.dumps({**self.counts, "latency": self.latency, "bandwidth": self.bandwidth}).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
        return [out]


def _capture(start_response: Callable[..., Any]) -> Callable[..., Any]:
    """moto's app may stream its body; the middleware joins it (to count and
    throttle it) and leaves the headers as they are."""
    def inner(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return start_response(status, headers, exc_info)
    return inner


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    ap.add_argument("--bandwidth", type=float, default=0.0, help="bytes per second of a response body (0: no limit)")
    ap.add_argument("--access-key", default=None, help="the one access key id accepted (default: any)")
    args = ap.parse_args(argv)

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import WSGIRequestHandler, make_server

    class QuietHandler(WSGIRequestHandler):
        def log_request(self, *a: Any, **k: Any) -> None:
            pass

    app = CostMiddleware(DomainDispatcherApplication(create_backend_app), args.latency,
                         args.bandwidth, args.access_key)
    server = make_server("127.0.0.1", args.port, app, threaded=True, request_handler=QuietHandler)
    server.daemon_threads = True

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"PORT {server.server_port}", flush=True)
    server.serve_forever(poll_interval=0.2)
    sys.exit(0)


if __name__ == "__main__":
    main()
