#!/usr/bin/env python3
"""An S3-compatible server on the loopback address, for tests and benchmarks:
moto's server (``moto[server]``) behind a small WSGI middleware that adds
what a real store costs, at the server, so every client pays it the same way.

* ``--latency S``: every request waits S seconds before it is answered (in
  its own server thread: requests in flight overlap, as at a real store);
* ``--bandwidth B``: a response body of n bytes takes n / B seconds more,
  per request (each response on a link of its own);
* ``--link B``: one link of B bytes a second that every response body
  crosses, in the order the bodies are ready: a body of n bytes leaves
  n / B seconds after the link is free (as a store's network, or a node's
  NIC, that every reader shares: the bytes a configuration fetches become
  time once the link is busy);
* ``--access-key K``: requests signed with another access key id get S3's
  ``403 InvalidAccessKeyId`` (moto itself accepts any credentials);
* ``--secret S`` (with ``--access-key``): every request's Signature Version
  4 is computed again, by botocore, from what arrived (the headers it names
  as signed, the URI as sent, its x-amz-date) and the secret; a request
  whose signature differs gets S3's ``403 SignatureDoesNotMatch``. So a
  client that signs wrongly fails here as it would at AWS;
* ``GET /_opt4/stats`` answers JSON counters (requests, GETs, ranged GETs,
  bytes of GET bodies, GETs answered from a copy), ``POST /_opt4/reset`` zeroes them, and
  ``POST /_opt4/set?latency=S&bandwidth=B&link=L`` changes the costs of a
  running server. These paths are not S3's.
* ``POST /_opt4/set?fault=F`` makes every object GET answer wrongly, as a
  broken or hostile store might (tests of the client's checks): ``range-from-0``
  (the bytes from 0 for any range: a 206 for other bytes than asked),
  ``etag`` (If-Match ignored, and another ETag sent), ``ignore-if-match``,
  ``no-etag`` (If-Match ignored and no ETag sent: a changed object looks the
  same to every header check),
  ``long-length`` (a Content-Length 5 bytes over the body), ``grown-total``
  (a Content-Range total 100 bytes over the object's), ``chunked`` (no
  Content-Length: the body goes chunked), ``huge-listing`` (a LIST that says
  every object is 1 TiB), ``redirect`` (a 307 to the same server under
  another host name, with a query: the client must sign again),
  ``redirect-loop`` (307s without end), ``redirect-relative`` (a 307 whose
  Location is a path, not a URL); ``fault=`` (empty) ends it.
  ``trickle=B`` sends object bodies at B bytes a second, a byte at a time
  (0: off): a store too slow to wait for.
* ``--tls-cert FILE --tls-key FILE``: https instead of http, with this
  certificate (PEM) and key (tests make a CA of their own to sign it).
* Object GETs are answered from a copy of the object the middleware keeps
  (``ObjectCopies``), made by moto's own answer to the object's first GET
  and dropped at any request that may write (every method but GET and
  HEAD): moto reads the whole object for every ranged GET (1.2 ms more a
  GET of a 13 MB object on this machine, on top of its 1.1 ms), which no
  real store costs its clients. A GET with a query, a condition other than
  an ``If-Match`` that holds, a range that is not one satisfiable range, or
  while a fault or trickle is set, goes to moto as before. ``--moto-gets``
  sends every GET to moto (the old costs, for comparison).
* ``--cpus LIST``: the CPUs the server may run on (``1``, ``0,1``, ``2-3``),
  set before it starts: a benchmark can keep the server's CPU off the cores
  that train, as a store runs on machines of its own.

It binds 127.0.0.1 on ``--port`` (0: a free one), prints ``PORT <n>`` on one
line of stdout once it listens, and serves until SIGTERM or SIGINT.
:class:`Server` starts one in a subprocess (tests and benchmarks import it;
this module imports only the standard library until ``main`` runs).

    python bench/s3server.py [--port 0] [--latency 0.01] [--bandwidth 0] [--link 0]
        [--access-key testing [--secret S]] [--cpus 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

__all__ = ["CostMiddleware", "ObjectCopies", "Server", "main", "parse_cpus"]

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
# Headers of moto's answer that belong to one request or to the whole body
# only (a range gets its own length and Content-Range; the checksum is of
# the whole object, sent only where the body is all of it).
_PER_ANSWER = {"date", "server", "x-amzn-requestid", "content-length", "content-range", "connection"}
_WHOLE_ONLY = {"x-amz-checksum-crc32", "x-amz-checksum-crc32c", "x-amz-checksum-sha1", "x-amz-checksum-sha256"}
_KEY_ID = re.compile(r"Credential=([^/,\s]+)/")
_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidAccessKeyId</Code>'
           b'<Message>The AWS Access Key Id you provided does not exist in our records.</Message></Error>')
_BAD_SIGNATURE = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SignatureDoesNotMatch</Code>'
                  b'<Message>The request signature we calculated does not match the signature you provided.'
                  b'</Message></Error>')
_SIGV4 = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/,\s]+)/(\d{8})/([^/]+)/s3/aws4_request,\s*"
                    r"SignedHeaders=([a-z0-9;-]+),\s*Signature=([0-9a-f]{64})$")


def signature_matches(environ: dict[str, Any], secret: str) -> bool:
    """Whether the request's SigV4 signature is the one botocore computes
    for what arrived, with this secret."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    m = _SIGV4.match(environ.get("HTTP_AUTHORIZATION", ""))
    if m is None:
        return False
    key_id, day, region, signed, signature = m.groups()
    headers = {}
    for name in signed.split(";"):
        env = {"content-type": "CONTENT_TYPE", "content-length": "CONTENT_LENGTH"}.get(
            name, "HTTP_" + name.upper().replace("-", "_"))
        if env not in environ:
            return False
        headers[name] = environ[env]
    date = environ.get("HTTP_X_AMZ_DATE", "")
    if not date.startswith(day):
        return False
    uri = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
    req = AWSRequest(method=environ.get("REQUEST_METHOD", "GET"), url=f"http://{headers.get('host', '')}{uri}",
                     headers=headers)
    req.context["timestamp"] = date
    auth = S3SigV4Auth(Credentials(key_id, secret), "s3", region)
    return auth.signature(auth.string_to_sign(req, auth.canonical_request(req)), req) == signature


def parse_cpus(text: str) -> set[int]:
    """``"1"``, ``"0,2"``, ``"0-3"`` (Linux's cpu list format) as a set of CPU
    numbers, each a CPU of this machine; a clear error otherwise."""
    cpus: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if m is None or int(m.group(2) or m.group(1)) < int(m.group(1)):
            raise ValueError(f"CPU list {text!r}: write CPU numbers and ranges, as 1 or 0,2 or 0-3")
        cpus.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    n = os.cpu_count() or 1
    if max(cpus) >= n:
        raise ValueError(f"CPU list {text!r}: this machine has CPUs 0-{n - 1}")
    return cpus


class ObjectCopies:
    """Object GETs answered from a copy of each object moto gave, with moto's
    headers: the whole object (200), or one satisfiable range of it (206,
    ``Content-Range``), as moto answers them. What a copy cannot answer
    exactly as moto would, ``answer`` leaves to moto (returns None)."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._copies: dict[tuple[str, str], tuple[bytes, list[tuple[str, str]], str]] = {}
        self._writes = 0  # forget()s so far: a copy fetched across one is not kept

    def forget(self) -> None:
        """Drops every copy (a request that may write came)."""
        with self._lock:
            self._copies.clear()
            self._writes += 1

    def answer(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes] | None:
        if environ.get("QUERY_STRING") or any(h in environ for h in (
                "HTTP_IF_NONE_MATCH", "HTTP_IF_MODIFIED_SINCE", "HTTP_IF_UNMODIFIED_SINCE")):
            return None
        path = environ.get("PATH_INFO", "")
        if path.count("/") < 2 or path.endswith("/"):
            return None  # a bucket, not an object
        where = (environ.get("HTTP_HOST", ""), path)
        with self._lock:
            copy = self._copies.get(where)
            writes = self._writes
        if copy is None:
            copy = self._fetch(environ)
            if copy is None:
                return None
            with self._lock:
                if writes != self._writes:
                    return None  # a write came while moto answered: ask moto again
                self._copies[where] = copy
        body, headers, etag = copy
        if "HTTP_IF_MATCH" in environ and environ["HTTP_IF_MATCH"] != etag:
            return None  # moto answers 412
        asked = environ.get("HTTP_RANGE")
        if asked is None:
            start_response("200 OK", headers + [("Content-Length", str(len(body)))])
            return [body]
        m = _RANGE.fullmatch(asked)
        if m is None or not (m.group(1) or m.group(2)):
            return None
        size = len(body)
        if m.group(1):
            first = int(m.group(1))
            last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if first >= size or (m.group(2) and int(m.group(2)) < first):
                return None  # moto: 416, or the whole object for a reversed range
        else:
            n = int(m.group(2))
            if n == 0 or size == 0:
                return None
            first, last = max(0, size - n), size - 1
        part = body[first:last + 1]
        whole = first == 0 and last == size - 1  # moto sends the checksum then, as for a whole GET
        start_response("206 Partial Content",
                       [h for h in headers if whole or h[0].lower() not in _WHOLE_ONLY]
                       + [("Content-Length", str(len(part))), ("Content-Range", f"bytes {first}-{last}/{size}")])
        return [part]

    def _fetch(self, environ: dict[str, Any]) -> tuple[bytes, list[tuple[str, str]], str] | None:
        """moto's answer to a plain GET of the object, if it is a 200 with an ETag."""
        plain = {k: v for k, v in environ.items() if k not in ("HTTP_RANGE", "HTTP_IF_MATCH")}
        got: list[Any] = []
        body = b"".join(self.app(plain, lambda status, headers, exc_info=None: got.extend((status, headers))))
        if not got or not got[0].startswith("200"):
            return None
        headers = [(k, v) for k, v in got[1] if k.lower() not in _PER_ANSWER]
        etag = next((v for k, v in headers if k.lower() == "etag"), None)
        length = next((v for k, v in got[1] if k.lower() == "content-length"), None)
        if etag is None or length != str(len(body)):
            return None
        return body, headers, etag


class CostMiddleware:
    """Latency and bandwidth added to every answer of the app it wraps, and
    counters of what was asked."""

    def __init__(self, app: Callable[..., Any], latency: float, bandwidth: float, access_key: str | None,
                 link: float = 0.0, secret: str | None = None, moto_gets: bool = False) -> None:
        self.app = app
        self.copies = None if moto_gets else ObjectCopies(app)
        self.secret = secret
        self.latency = float(latency)
        self.bandwidth = float(bandwidth)
        self.link = float(link)
        self.access_key = access_key
        self._lock = threading.Lock()
        self._link_free = 0.0  # time.monotonic() at which the shared link is next free
        self.fault = ""
        self.trickle = 0.0
        self._reset()

    def _reset(self) -> None:
        with self._lock:
            self.counts = {"requests": 0, "gets": 0, "ranged_gets": 0, "get_bytes": 0, "lists": 0, "denied": 0,
                           "bad_signatures": 0, "copied_gets": 0}

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
            if self.secret is not None and not signature_matches(environ, self.secret):
                self._count(denied=1, bad_signatures=1)
                start_response("403 Forbidden", [("Content-Type", "application/xml"),
                                                 ("Content-Length", str(len(_BAD_SIGNATURE)))])
                return [_BAD_SIGNATURE]
        query = environ.get("QUERY_STRING", "")
        faulty = bool(self.fault) and method == "GET" and "list-type" not in query
        if faulty:
            environ, start_response = _faulty(self.fault, environ, start_response)
        if self.fault == "huge-listing" and method == "GET" and "list-type" in query:
            return _huge_listing(self.app, environ, start_response)
        if faulty and self.fault.startswith("redirect") and "x-opt4-redirected" not in query:
            # Another host name for this server (the client must sign again for
            # it), and a query the client must sign too; "redirect-loop" sends
            # every request on again; "redirect-relative" gives a path only.
            uri = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
            path = uri.split("?", 1)[0]
            to = {"redirect": f"http://localhost:{environ['SERVER_PORT']}{path}?x-opt4-redirected=1&a=b",
                  "redirect-loop": f"http://localhost:{environ['SERVER_PORT']}{path}",
                  "redirect-relative": f"{path}?x-opt4-redirected=1"}[self.fault]
            start_response("307 Temporary Redirect", [("Location", to), ("Content-Length", "0")])
            return [b""]
        answered = None
        if self.copies is not None:
            if method not in ("GET", "HEAD"):
                self.copies.forget()
            elif method == "GET" and not self.fault and not self.trickle:
                answered = self.copies.answer(environ, start_response)
        body = b"".join(self.app(environ, _capture(start_response)) if answered is None else answered)
        if method == "GET" and "list-type" in query:
            self._count(lists=1)
        elif method == "GET":
            self._count(gets=1, ranged_gets=int("HTTP_RANGE" in environ), get_bytes=len(body),
                        copied_gets=int(answered is not None))
        if self.bandwidth and body:
            time.sleep(len(body) / self.bandwidth)
        if self.link and body:
            with self._lock:  # the body's turn on the shared link
                now = time.monotonic()
                done = max(now, self._link_free) + len(body) / self.link
                self._link_free = done
            time.sleep(max(0.0, done - time.monotonic()))
        if self.trickle and body and method == "GET" and "list-type" not in query:
            return _trickle(body, self.trickle)
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
            if "link" in q:
                self.link = float(q["link"][0])
            if "fault" in q or "fault=" in environ.get("QUERY_STRING", ""):
                fault = q.get("fault", [""])[0]
                if fault not in _FAULTS:
                    raise ValueError(f"unknown fault {fault!r}; one of {sorted(_FAULTS)}")
                self.fault = fault
            if "trickle" in q:
                self.trickle = float(q["trickle"][0])
        with self._lock:
            out = json.dumps({**self.counts, "latency": self.latency, "bandwidth": self.bandwidth,
                              "link": self.link, "fault": self.fault, "trickle": self.trickle}).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
        return [out]


_FAULTS = {"", "range-from-0", "etag", "ignore-if-match", "no-etag", "long-length", "grown-total", "chunked",
           "huge-listing", "redirect", "redirect-loop", "redirect-relative"}


def _huge_listing(app: Callable[..., Any], environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """The store's LIST answer with every object's size made 1 TiB (and the
    Content-Length made right for the longer body)."""
    got: list[Any] = []
    body = b"".join(app(environ, lambda status, headers, exc_info=None: got.extend((status, headers))))
    body = re.sub(rb"<Size>\d+</Size>", b"<Size>1099511627776</Size>", body)
    headers = [(k, str(len(body)) if k.lower() == "content-length" else v) for k, v in got[1]]
    start_response(got[0], headers)
    return [body]


def _faulty(fault: str, environ: dict[str, Any],
            start_response: Callable[..., Any]) -> tuple[dict[str, Any], Callable[..., Any]]:
    """The request as the fault changes it before the store sees it, and a
    start_response that changes the answer's headers."""
    environ = dict(environ)
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", environ.get("HTTP_RANGE", ""))
    if fault == "range-from-0" and m:
        environ["HTTP_RANGE"] = f"bytes=0-{int(m.group(2)) - int(m.group(1))}"
    if fault in ("etag", "ignore-if-match", "no-etag"):
        environ.pop("HTTP_IF_MATCH", None)

    def edit(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        out = []
        for name, value in headers:
            low = name.lower()
            if fault == "no-etag" and low == "etag":
                continue
            if fault == "etag" and low == "etag":
                value = '"0123456789abcdef0123456789abcdef"'
            elif fault == "long-length" and low == "content-length":
                value = str(int(value) + 5)
            elif fault == "grown-total" and low == "content-range":
                head, total = value.rsplit("/", 1)
                value = f"{head}/{int(total) + 100}"
            elif fault == "chunked" and low == "content-length":
                continue
            out.append((name, value))
        return start_response(status, out, exc_info)
    return environ, edit


def _trickle(body: bytes, rate: float) -> Iterable[bytes]:
    """The body a byte at a time, at rate bytes a second."""
    for k in range(len(body)):
        time.sleep(1.0 / rate)
        yield body[k:k + 1]


def _capture(start_response: Callable[..., Any]) -> Callable[..., Any]:
    """moto's app may stream its body; the middleware joins it (to count and
    throttle it) and leaves the headers as they are."""
    def inner(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return start_response(status, headers, exc_info)
    return inner


class Server:
    """This server in a subprocess of its own session (no terminal, default
    signal dispositions, no standard input), on a free port; ``endpoint`` is
    its URL. ``python``: an interpreter that has ``moto[server]`` (default:
    this one); ``cpus``: the CPUs it runs on (``--cpus``; default: this
    process's). A context manager: stopped on exit."""

    def __init__(self, latency: float = 0.0, access_key: str | None = None, *, bandwidth: float = 0.0,
                 link: float = 0.0, python: str | None = None, cpus: str = "", secret: str | None = None,
                 tls: tuple[str, str] | None = None, moto_gets: bool = False) -> None:
        args = [python or sys.executable, os.path.abspath(__file__), "--port", "0", "--latency", str(latency),
                "--bandwidth", str(bandwidth), "--link", str(link)] + (["--moto-gets"] if moto_gets else [])
        if access_key is not None:
            args += ["--access-key", access_key]
        if secret is not None:
            args += ["--secret", secret]
        if cpus:
            args += ["--cpus", cpus]
        if tls is not None:
            args += ["--tls-cert", tls[0], "--tls-key", tls[1]]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True, start_new_session=True, restore_signals=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded by the caller's timeout
        if not line.startswith("PORT "):
            err = self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""
            self.stop()
            raise RuntimeError(f"the S3 server did not start: {line!r} {err}")
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{int(line.split()[1])}"

    def call(self, what: str, **query: float | str) -> dict[str, Any]:
        """``stats`` (GET), ``reset`` or ``set`` (POST, with ``query``): the counters after."""
        q = "&".join(f"{k}={v}" for k, v in query.items())
        req = urllib.request.Request(f"{self.endpoint}/_opt4/{what}" + (f"?{q}" if q else ""),
                                     method="GET" if what == "stats" else "POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def stats(self) -> dict[str, Any]:
        """What the server was asked: requests, gets, ranged_gets, get_bytes, lists, denied, bad_signatures,
        and copied_gets (the GETs answered from an object's copy, not by moto)."""
        return self.call("stats")

    def cpu_seconds(self) -> float:
        """The server process's CPU time so far (user + system)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    ap.add_argument("--bandwidth", type=float, default=0.0, help="bytes per second of a response body (0: no limit)")
    ap.add_argument("--link", type=float, default=0.0,
                    help="bytes per second of one link all response bodies share (0: no limit)")
    ap.add_argument("--access-key", default=None, help="the one access key id accepted (default: any)")
    ap.add_argument("--secret", default=None,
                    help="check every request's SigV4 signature with this secret (needs --access-key)")
    ap.add_argument("--tls-cert", default=None, help="serve https with this certificate (PEM)")
    ap.add_argument("--tls-key", default=None, help="the certificate's private key (PEM)")
    ap.add_argument("--moto-gets", action="store_true",
                    help="answer every object GET by moto (no copies: moto reads the whole object a GET)")
    ap.add_argument("--cpus", default="", help="the CPUs to run on, as 1 or 0,2 or 0-3 (default: all allowed)")
    args = ap.parse_args(argv)
    if args.secret is not None and args.access_key is None:
        ap.error("--secret needs --access-key")
    if args.cpus:
        try:
            os.sched_setaffinity(0, parse_cpus(args.cpus))  # before any thread: they inherit it
        except ValueError as e:
            ap.error(str(e))

    from moto.moto_server.werkzeug_app import create_backend_app
    from werkzeug.serving import WSGIRequestHandler, make_server

    class QuietHandler(WSGIRequestHandler):
        def log_request(self, *a: Any, **k: Any) -> None:
            pass

    # moto's S3 app itself, not its dispatcher of every service: the
    # dispatcher finds the service of each request under one lock, listing
    # moto's modules (about 180 stat calls a request), which made 1.6 ms of
    # the server's 2 ms of CPU a GET on this machine.
    app = CostMiddleware(create_backend_app("s3"), args.latency,
                         args.bandwidth, args.access_key, args.link, args.secret, args.moto_gets)
    if (args.tls_cert is None) != (args.tls_key is None):
        ap.error("--tls-cert and --tls-key go together")
    tls = (args.tls_cert, args.tls_key) if args.tls_cert else None
    server = make_server("127.0.0.1", args.port, app, threaded=True, request_handler=QuietHandler, ssl_context=tls)
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
