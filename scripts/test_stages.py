#!/usr/bin/env python3
"""Run every test stage, whatever fails, and print one summary.

`make test` calls this with the stage targets in order. Each stage is a
`make` target run as a subprocess; its output goes to the terminal as it
comes and to build/test-logs/<stage>.log. A failing stage does not stop the
others. `--beside STAGE` (one of the targets) runs that stage from the
start, beside the others, which run one after another: on two cores the
Python tests, which keep about one core busy, and the rest, which fill the
other, take the time of the longer of the two instead of their sum. Its
lines come to the terminal prefixed with its name. At the end: a table (stage, result, passed, failed, skipped,
seconds) and a closing line "total: N passed, N failed, N skipped"; the exit
status is 1 if any stage failed.

Counts are read from each runner's own closing lines: ctest's "N% tests
passed, N tests failed out of N", pytest's "N passed, N failed, N skipped",
and scripts/fuzz.sh's "fuzz: NAME ok" / "FAILED" lines. A stage that exits
non-zero with no failure counted (a build error, a crash of the runner) is
counted as one failure, so a red stage is never read as green. A stage that
says "STAGE SKIPPED: reason" (scripts/fuzz.sh without clang) is shown as
skipped with its reason.

Stdlib only: it runs before anything is known to work.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

LOG_DIR = os.path.join("build", "test-logs")

# ctest 4 leaves out ", 0 tests failed" when none failed.
_CTEST = re.compile(r"(\d+)% tests passed(?:, (\d+) tests? failed)? out of (\d+)")
_CTEST_SKIP = re.compile(r"\(\s*(Skipped|Not Run|Disabled)\s*\)")
_PYTEST = re.compile(r"^=*\s*(\d+ \w+(?:, \d+ \w+)*) in [\d.]+s")
_PYTEST_PART = re.compile(r"(\d+) (\w+)")
_FUZZ_OK = re.compile(r"^fuzz: \S+ ok\b")
_FUZZ_FAIL = re.compile(r"^fuzz: \S+ FAILED\b")
_SKIPPED = re.compile(r"^STAGE SKIPPED: (.*)$")


def count(lines: list[str]) -> tuple[int, int, int, str]:
    """(passed, failed, skipped, note) from a stage's output."""
    passed = failed = skipped = 0
    note = ""
    for line in lines:
        m = _CTEST.search(line)
        if m:
            total, bad = int(m.group(3)), int(m.group(2) or 0)
            passed += total - bad
            failed += bad
            continue
        if _CTEST_SKIP.search(line) and " - " in line:
            skipped += 1
            continue
        m = _PYTEST.match(line.strip())
        if m:
            for n, what in _PYTEST_PART.findall(m.group(1)):
                if what == "passed" or what == "xpassed":
                    passed += int(n)
                elif what in ("failed", "error", "errors"):
                    failed += int(n)
                elif what in ("skipped", "xfailed"):
                    skipped += int(n)
            continue
        if _FUZZ_OK.match(line):
            passed += 1
        elif _FUZZ_FAIL.match(line):
            failed += 1
        m = _SKIPPED.match(line.strip())
        if m:
            skipped += 1
            note = m.group(1)
    # ctest counts a skipped test among the passed ones.
    if skipped and any(_CTEST.search(x) for x in lines):
        passed -= min(passed, sum(1 for x in lines if _CTEST_SKIP.search(x) and " - " in x))
    return passed, failed, skipped, note


_print_lock = threading.Lock()


def run_stage(target: str, prefix: str = "") -> dict[str, object]:
    os.makedirs(LOG_DIR, exist_ok=True)
    log_path = os.path.join(LOG_DIR, f"{target}.log")
    with _print_lock:
        print(f"\n==== {target} ===={' (beside the others)' if prefix else ''}", flush=True)
    start = time.monotonic()
    lines: list[str] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["make", "--no-print-directory", target], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                errors="replace", bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            with _print_lock:
                sys.stdout.write(prefix + line)
                sys.stdout.flush()
            log.write(line)
            lines.append(line.rstrip("\n"))
        rc = proc.wait()
    seconds = time.monotonic() - start
    passed, failed, skipped, note = count(lines)
    if rc != 0 and failed == 0:
        failed = 1
        note = f"exit status {rc} with no failing test counted (see {log_path})"
    if rc == 0 and failed:
        note = f"exit status 0 but {failed} counted as failed"
    if rc != 0:
        result = "FAILED"
    elif note and skipped and not passed:
        result = "skipped"
    else:
        result = "ok"
    return dict(stage=target, result=result, passed=passed, failed=failed, skipped=skipped,
                seconds=seconds, note=note, log=log_path)


def main(argv: list[str]) -> int:
    beside = None
    if argv[:1] == ["--beside"] and len(argv) > 1:
        beside, argv = argv[1], argv[2:]
    if not argv or (beside is not None and beside not in argv):
        print("usage: test_stages.py [--beside TARGET] TARGET [TARGET ...]  (the --beside target is one of them)",
              file=sys.stderr)
        return 2
    start = time.monotonic()
    done: dict[str, dict[str, object]] = {}
    thread = None
    if beside is not None:
        def run_beside(target: str) -> None:
            try:
                done[target] = run_stage(target, f"[{target}] ")
            except BaseException as exc:  # the row says so: never a missing row, never green
                done[target] = dict(stage=target, result="FAILED", passed=0, failed=1, skipped=0,
                                    seconds=time.monotonic() - start, note=f"not run: {exc!r}", log="")
        thread = threading.Thread(target=run_beside, args=(beside,))
        thread.start()
    for t in argv:
        if t != beside:
            done[t] = run_stage(t)
    if thread is not None:
        thread.join()
    rows = [done[t] for t in argv]
    print("\n==== summary ====")
    print(f"{'stage':<20} {'result':<8} {'passed':>7} {'failed':>7} {'skipped':>8} {'seconds':>8}")
    for r in rows:
        print(f"{r['stage']:<20} {r['result']:<8} {r['passed']:>7} {r['failed']:>7} {r['skipped']:>8} "
              f"{r['seconds']:>8.1f}")
    for r in rows:
        if r["note"]:
            print(f"  {r['stage']}: {r['note']}")
    bad = [r["stage"] for r in rows if r["result"] == "FAILED"]
    if bad:
        print(f"  failed stages: {', '.join(bad)} (logs in {LOG_DIR}/)")
    total = {k: sum(int(r[k]) for r in rows) for k in ("passed", "failed", "skipped")}
    print(f"wall time: {time.monotonic() - start:.1f} s" + (f" ({beside} beside the others)" if beside else ""))
    print(f"total: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 1 if bad or total["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
