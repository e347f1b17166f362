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
