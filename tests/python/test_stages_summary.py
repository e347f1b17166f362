"""`make test`'s summary (scripts/test_stages.py) reads each runner's own
closing lines; a stage that fails without a counted failure is still red."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "test_stages.py")


@pytest.fixture(scope="module")
def stages():
    spec = importlib.util.spec_from_file_location("test_stages", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("lines", "want"), [
    (["100% tests passed out of 17"], (17, 0, 0)),  # ctest 4, none failed
    (["94% tests passed, 1 tests failed out of 17"], (16, 1, 0)),
    (["100% tests passed out of 3", "The following tests did not run:",
      "\t  2 - test_x (Skipped)"], (2, 0, 1)),
    (["485 passed, 3 warnings, 1 error in 156.36s (0:02:36)"], (485, 1, 0)),
    (["==== 1 failed, 485 passed, 2 skipped, 4 deselected in 3.20s ===="], (485, 1, 2)),
    (["fuzz: fuzz_plan_load ok", "fuzz: fuzz_records FAILED (see build/fuzz/x.log)"], (1, 1, 0)),
    (["STAGE SKIPPED: no clang, so no libFuzzer run"], (0, 0, 1)),
])
def test_counts_from_closing_lines(stages, lines, want) -> None:
    assert stages.count(lines)[:3] == want


def test_every_stage_runs_and_a_failure_is_red(tmp_path) -> None:
    """Run the script on a Makefile of its own: a failing stage (a build
    error, no test counted) does not stop the next, the summary names it,
    and the exit status is 1."""
    (tmp_path / "Makefile").write_text(
        "broken:\n\t@echo compiling; exit 2\n"
        "good:\n\t@echo '3 passed, 1 skipped in 0.10s'\n"
        "noclang:\n\t@echo 'STAGE SKIPPED: no clang'\n")
    proc = subprocess.run([sys.executable, SCRIPT, "broken", "good", "noclang"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout
    summary = proc.stdout.split("==== summary ====")[1]
    rows = {line.split()[0]: line.split()[1:] for line in summary.splitlines()[2:5]}
    assert rows["broken"][:3] == ["FAILED", "0", "1"], summary
    assert rows["good"][:4] == ["ok", "3", "0", "1"], summary
    assert rows["noclang"][:4] == ["skipped", "0", "0", "1"], summary
    assert "total: 3 passed, 1 failed, 2 skipped" in proc.stdout
    assert "noclang: no clang" in summary
    assert (tmp_path / "build" / "test-logs" / "broken.log").read_text().startswith("compiling")


def test_a_stage_beside_the_others_runs_at_the_same_time_and_is_counted(tmp_path) -> None:
    """--beside: that stage starts first and runs while the others run in
    turn (each side opens a FIFO the other must open too, so they overlap
    or neither ends); its lines are prefixed with its name, its row is where
    the list puts it, and its failure is red as any other's."""
    os.mkfifo(tmp_path / "started")
    os.mkfifo(tmp_path / "done")
    (tmp_path / "Makefile").write_text(
        "long:\n\t@echo > started; cat done; echo '2 passed, 1 failed in 0.10s'; exit 1\n"
        "short:\n\t@cat started; echo > done; echo '4 passed in 0.10s'\n"
        "after:\n\t@echo '1 passed in 0.10s'\n")
    proc = subprocess.run([sys.executable, SCRIPT, "--beside", "long", "short", "long", "after"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout
    assert "[long] 2 passed, 1 failed" in proc.stdout, proc.stdout
    summary = proc.stdout.split("==== summary ====")[1]
    assert [line.split()[:2] for line in summary.splitlines()[2:5]] == [["short", "ok"], ["long", "FAILED"],
                                                                        ["after", "ok"]], summary
    assert "total: 7 passed, 1 failed, 0 skipped" in proc.stdout
    assert "(long beside the others)" in summary
    bad = subprocess.run([sys.executable, SCRIPT, "--beside", "nosuch", "short"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_a_failure_pytest_cannot_render_is_still_that_tests_failure(tmp_path) -> None:
    """conftest's makereport hook: when pytest's own rendering of a
    traceback fails (as it does on CPython 3.11 for a frame without a line
    number), the test is reported failed with the frames as they are, and the
    session goes on instead of ending in INTERNALERROR."""
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('opt4_conftest', {os.path.join(HERE, 'conftest.py')!r})\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(mod)\n"
        "pytest_runtest_makereport = mod.pytest_runtest_makereport\n"
        "import _pytest._code.code as code\n"
        "def lineless(self):\n"
        "    raise TypeError(\"unsupported operand type(s) for -: 'NoneType' and 'int'\")\n"
        "code.TracebackEntry.lineno = property(lineless)\n")
    (tmp_path / "test_x.py").write_text(
        "def test_fails():\n    assert 1 == 2\n\n\ndef test_after_it():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_x.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert "INTERNALERROR" not in out, out
    assert proc.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert "pytest could not render this failure's traceback" in out and "AssertionError" in out, out
