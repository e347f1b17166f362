"""Shared fixtures. Tests run against the installed package (make test
installs it into .venv), never against the source tree."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from opt4torch.lab.launch import free_port, torchrun  # noqa: F401 - the tests' launcher


def _own_pool_namespace() -> None:
    """This run's pools live in a namespace of their own (inherited by
    workers, subprocesses and torchrun ranks): another test run on the same
    machine never sweeps this run's deliberately stale pools, nor this run
    theirs. Under pytest-xdist (make test runs `-n 2`) each xdist worker is
    a run of its own: it does not keep the namespace its controller set
    (which it inherited), but its own processes (DataLoader workers that
    import this file, subprocesses) keep the worker's."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        os.environ.setdefault("OPT4TORCH_POOL_NAMESPACE", f"py{os.getpid()}")
    elif os.environ.get("OPT4TORCH_TEST_NAMESPACE_OF") != worker:
        os.environ["OPT4TORCH_POOL_NAMESPACE"] = f"py{os.getpid()}"
        os.environ["OPT4TORCH_TEST_NAMESPACE_OF"] = worker


_own_pool_namespace()


def _sweep_dead_test_runs() -> None:
    """Stale pools of earlier test runs that were killed (their namespaces,
    py<pid> and the C tests' c<pid>, are seen by no other sweep): for each
    such namespace whose run is gone, the engine's own sweep, in it. Live
    runs' namespaces are left alone, their stale-on-purpose pools included."""
    import re

    from opt4torch.data import remove_stale_pools

    mine = os.environ["OPT4TORCH_POOL_NAMESPACE"]
    pat = re.compile(rf"opt4-{os.getuid()}-((?:py|c)(\d+))-")
    dead = set()
    for n in os.listdir("/dev/shm"):
        m = pat.match(n)
        if m and m.group(1) != mine and not os.path.exists(f"/proc/{m.group(2)}"):
            dead.add(m.group(1))
    for ns in sorted(dead):
        os.environ["OPT4TORCH_POOL_NAMESPACE"] = ns
        try:
            remove_stale_pools()
        finally:
            os.environ["OPT4TORCH_POOL_NAMESPACE"] = mine


_sweep_dead_test_runs()


def pool_prefix(pid: int) -> str:
    """The start of the /dev/shm names of pools that process pid makes in
    this run's namespace."""
    ns = os.environ.get("OPT4TORCH_POOL_NAMESPACE", "")
    return f"opt4-{os.getuid()}-{ns + '-' if ns else ''}{pid}-"


settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=200
)
settings.register_profile("thorough", deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

#: Silberschatz's reference string: with 3 frames OPT faults 9 times, LRU 12,
#: FIFO 15 (Operating System Concepts, the page-replacement chapter).
TEXTBOOK = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


def script(name: str) -> str:
    """The console script installed beside this interpreter (the venv's bin),
    so tests run the installed commands whether or not the venv is active."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):
        raise RuntimeError(f"{name} is not installed beside {sys.executable}: run `make install`")
    return path



#: pytest.mark.started_early(argv): the test's one long wait is another
#: program's own idle schedule (a third-party client's fixed retries, which
#: nothing of ours can shorten). That program, argv, is started when the
#: session's tests are known, in a process of its own, so that its wait
#: overlaps the other tests; the test takes its result (the fixture
#: started_early) and checks it as it would have checked the same code run
#: in its place. Its output goes to files (no pipe fills while nobody reads).
#: Under pytest-xdist each worker starts those of the tests it collected, and
#: the ones its tests did not take are killed at the end.
class EarlyProcess:
    def __init__(self, argv: list[str]) -> None:
        import tempfile

        self.out, self.err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(argv, stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL, text=True)

    def result(self, timeout: float) -> tuple[int, str, str]:
        """Once it has ended: its exit code, its output and its error output."""
        code = self.proc.wait(timeout=timeout)
        self.out.seek(0)
        self.err.seek(0)
        return code, self.out.read(), self.err.read()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


_EARLY = pytest.StashKey[EarlyProcess]()


def _freeze_what_collection_made() -> None:
    """Once the tests are collected, every object alive (the modules the
    test files imported: torch, pyarrow, boto3, hypothesis..., and pytest's
    items) is moved out of the garbage collector's sight (gc.freeze): none of
    it is ever garbage while the session runs, yet every full collection
    walked it again. no_leaked_pools collects after each test that uses it
    (hundreds), and torch's objects alone take 55 ms a walk; what is walked
    now is what the tests made. The garbage of the imports is collected
    first, so nothing collectable is frozen."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    _freeze_what_collection_made()
    for item in session.items:
        mark = item.get_closest_marker("started_early")
        if mark is not None:
            item.stash[_EARLY] = EarlyProcess(mark.args[0])


def pytest_sessionfinish(session: pytest.Session) -> None:
    for item in session.items:
        early = item.stash.get(_EARLY, None)
        if early is not None:
            early.kill()


@pytest.fixture
def started_early(request: pytest.FixtureRequest) -> EarlyProcess:
    """The process of this test's pytest.mark.started_early."""
    return request.node.stash[_EARLY]


def leaked_since(before: set[str]) -> set[str]:
    """Pools that appeared since `before` and are owned by this process: a
    test's leak. On a machine where another job of the same user runs its own
    tests at the same time (the shared dev machine), that job's pools come
    and go, live ones and, for a moment, those of owners it killed on purpose;
    none of them is this run's. Pools of this run's own subprocesses are
    checked by the tests that make them."""
    from opt4torch import _engine

    me = os.getpid()
    return {p["name"] for p in _engine.pool_list() if p["name"] not in before and p["owner_pid"] == me}


@pytest.fixture
def no_leaked_pools():
    """Fails the test if it leaves a pool of this process behind (use with
    ``pytestmark = pytest.mark.usefixtures("no_leaked_pools")``)."""
    import gc

    from opt4torch import _engine

    before = {p["name"] for p in _engine.pool_list()}
    yield
    gc.collect()
    leaked = leaked_since(before)
    assert not leaked, f"pools left behind: {leaked}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """A failure whose traceback pytest cannot render is still reported as
    that test's failure. CPython 3.11 can leave a traceback entry without a
    line number (an exception raised by a signal handler between two lines:
    torch's SIGCHLD handler raises that way when a worker exits badly), and
    pytest's own formatting then fails with INTERNALERROR, which ends the
    whole session and hides every test after it (a fresh-clone run of
    f706643, 271 tests into test-python)."""
    try:
        return (yield)
    except TypeError:
        if call.excinfo is None:
            raise
        exc = call.excinfo.value
        lines = ["pytest could not render this failure's traceback; as the frames give it:"]
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            lines.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}')
            tb = tb.tb_next
        lines.append(f"{type(exc).__name__}: {exc}")
        return pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed",
                                 "\n".join(lines), call.when, list(item._report_sections),
                                 call.duration, call.start, call.stop)

