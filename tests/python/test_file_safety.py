"""Files the project writes or reads back, under the hostile and unlucky
cases of issue 20: a device node, a FIFO or a directory given as output; a
plan file overwritten under a loaded plan; a record file and its sidecar
that must change together; temporaries left by SIGTERM and SIGKILL; a
hostile sidecar; `inspect` on what is not a plan. Real device nodes (mknod,
as root), real FIFOs, real signals to real subprocesses, a real `cp`."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import script

import opt4torch
from opt4torch.records import RecordFile, write_records

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="mknod of a character device needs root")


def cli(*args: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([script("opt4torch"), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def temporaries(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".tmp-" in n)


def null_device(path) -> None:
    """A node that is the system's /dev/null (character device 1, 3), made
    where a test may lose it: the real /dev/null is never offered as output
    here, so that a failure of these tests cannot break the machine."""
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def assert_null_device(path) -> None:
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 1 and os.minor(st.st_rdev) == 3


# ---- bug 1: a device node, a FIFO or a link to one given as output ----


def _every_writer(target, tmp_path) -> list[tuple[str, object]]:
    """(name, outcome) for each way the project writes a file, aimed at target."""
    out = []
    r = cli("precompute", "--dataset-size", "5", "--total-iter", "10", "--output", str(target), "--quiet")
    out.append(("precompute", r))
    images = tmp_path / "images"
    if not images.exists():
        for c in ("a", "b"):
            (images / c).mkdir(parents=True)
            (images / c / "0.jpg").write_bytes(b"x" * 10)
    out.append(("pack", cli("pack", str(images), str(target), "--quiet")))
    for name, fn in (("Plan.save", lambda: opt4torch.plan([0, 1, 0], capacity=1).save(target)),
                     ("write_records", lambda: write_records(target, [b"a", b"b"]))):
        try:
            fn()
            out.append((name, None))
        except Exception as exc:  # noqa: BLE001 - the type is asserted below
            out.append((name, exc))
    return out


def _assert_refused(outcomes, what: str) -> None:
    for name, r in outcomes:
        if isinstance(r, subprocess.CompletedProcess):
            assert r.returncode in (1, 2), (name, r.returncode, r.stderr)
            assert what in r.stderr and "Traceback" not in r.stderr, (name, r.stderr)
        else:
            assert isinstance(r, (opt4torch.Opt4Error, ValueError)), (name, r)
            assert what in str(r), (name, str(r))


@needs_root
def test_a_device_node_given_as_output_is_refused_by_every_writer(tmp_path) -> None:
    node = tmp_path / "n"
    null_device(node)
    outcomes = _every_writer(node, tmp_path)
    _assert_refused(outcomes, "character device")
    assert_null_device(node)
    assert temporaries(tmp_path) == []
    # simulate --out: its results.csv is a device node
    out = tmp_path / "sweep"
    out.mkdir()
    null_device(out / "results.csv")
    trace = tmp_path / "t.txt"
    trace.write_text("\n".join(str(i % 7) for i in range(100)))
    r = cli("simulate", "--trace", str(trace), "--policy", "lru", "--capacity", "3", "--out", str(out), "--no-plots")
    assert r.returncode == 1 and "character device" in r.stderr and "Traceback" not in r.stderr
    assert_null_device(out / "results.csv")


@pytest.mark.timeout(120)
def test_a_fifo_given_as_output_is_refused_and_never_opened(tmp_path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    outcomes = _every_writer(fifo, tmp_path)
    _assert_refused(outcomes, "a FIFO")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert temporaries(tmp_path) == []


@needs_root
def test_a_link_to_a_device_or_to_proc_is_refused_a_link_to_a_file_replaced(tmp_path) -> None:
    node = tmp_path / "n"
    null_device(node)
    link = tmp_path / "to-null.opt4"
    link.symlink_to(node)
    with pytest.raises(opt4torch.Opt4Error, match=r"symbolic link to .*n, which is a character device"):
        opt4torch.plan([0, 1, 0], capacity=1).save(link)
    assert link.is_symlink()
    assert_null_device(node)
    stdout_like = tmp_path / "stdout.opt4"
    stdout_like.symlink_to("/proc/self/fd/1")  # what /dev/stdout is
    with pytest.raises(opt4torch.Opt4Error, match="another process's open file"):
        opt4torch.plan([0, 1, 0], capacity=1).save(stdout_like)
    assert stdout_like.is_symlink()
    # A link to a regular file: the link itself is replaced, its target kept
    # (record files refuse every link: test_prefetch.py).
    victim = tmp_path / "victim"
    victim.write_text("keep")
    ok = tmp_path / "ok.opt4"
    ok.symlink_to(victim)
    opt4torch.plan([0, 1, 0], capacity=1).save(ok)
    assert victim.read_text() == "keep" and stat.S_ISREG(os.lstat(ok).st_mode)


# ---- bug 7: a directory as output; SIGTERM, SIGINT and SIGKILL mid-write ----


def test_a_directory_as_output_is_refused_before_any_item_is_read(tmp_path) -> None:
    target = tmp_path / "d"
    target.mkdir()
    consumed = []

    def items():
        consumed.append(1)
        yield b"a"

    with pytest.raises(opt4torch.Opt4Error, match="is a directory"):
        write_records(target, items())
    assert consumed == []
    with pytest.raises(opt4torch.Opt4Error, match="is a directory"):
        opt4torch.plan([0, 1, 0], capacity=1).save(target)
    assert temporaries(tmp_path) == [] and os.listdir(target) == []


# A writer that stops in the middle of writing: it prints "ready" once some
# records are in its temporary file, then waits for a line on stdin. Its
# signal dispositions are set here, so the test does not depend on how
# pytest was started.
_BLOCKED_WRITER = textwrap.dedent("""
    import signal, sys
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from opt4torch.records import write_records

    def items():
        for i in range(3):
            yield b"x" * 1000
        print("ready", flush=True)
        sys.stdin.readline()
        yield b"last"

    write_records(sys.argv[1], items(), labels=[1, 2, 3, 4])
    print("done", flush=True)
""")

# `opt4torch pack` itself, stopped the same way at its third image (the
# reader of the image files is wrapped to wait; the pack and the signal are
# real).
_BLOCKED_PACK = textwrap.dedent("""
    import signal, sys
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import opt4torch.records as records
    from opt4torch.cli import main

    read = records._read_regular
    seen = []

    def reading(path):
        seen.append(path)
        if len(seen) == 3:
            print("ready", flush=True)
            sys.stdin.readline()
        return read(path)

    records._read_regular = reading
    sys.exit(main(["pack", sys.argv[1], sys.argv[2], "--quiet"]))
""")


def _start(code: str, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready", p.stderr.read()
    return p


def _images(root, n: int = 6):
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for k in range(n // 2):
            (root / c / f"{k}.jpg").write_bytes(bytes([k]) * 500)
    return root


@pytest.mark.timeout(120)
@pytest.mark.parametrize("what", ["write_records", "pack"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_write_leaves_no_temporary_and_the_old_file(tmp_path, what: str, sig: int) -> None:
    out = tmp_path / "out" / "x.rec"
    out.parent.mkdir()
    write_records(out, [b"old"], labels=[9])
    before = out.read_bytes(), (tmp_path / "out" / "x.rec.json").read_bytes()
    if what == "write_records":
        p = _start(_BLOCKED_WRITER, str(out))
    else:
        p = _start(_BLOCKED_PACK, str(_images(tmp_path / "images")), str(out))
    assert len(temporaries(out.parent)) == 1  # mid-write: the temporary exists
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert p.returncode == -signal.SIGTERM, err  # it still ends as SIGTERM ends a process
    else:
        # The CLI says "interrupted" and exits 130; a script's uncaught
        # KeyboardInterrupt ends it by SIGINT (Python >= 3.8).
        assert p.returncode == (130 if what == "pack" else -signal.SIGINT), err
        assert ("interrupted" in err) if what == "pack" else ("KeyboardInterrupt" in err)
    assert temporaries(out.parent) == []
    assert (out.read_bytes(), (tmp_path / "out" / "x.rec.json").read_bytes()) == before


@pytest.mark.timeout(120)
def test_a_temporary_left_by_sigkill_is_removed_by_the_next_write_and_only_a_dead_writers(tmp_path) -> None:
    out = tmp_path / "x.rec"
    killed = _start(_BLOCKED_WRITER, str(out))
    [left] = temporaries(tmp_path)
    assert left.startswith(f"x.rec.tmp-{killed.pid}-")
    killed.kill()
    killed.wait(timeout=60)
    assert temporaries(tmp_path) == [left]  # SIGKILL: nobody could remove it
    live = _start(_BLOCKED_WRITER, str(out))
    try:
        [live_tmp] = [n for n in temporaries(tmp_path) if n != left]
        # A dead writer of another PID namespace (another container sharing
        # the folder): a pid proves nothing there, so it is left alone.
        foreign = f"x.rec.tmp-{killed.pid}-1-1-0"
        (tmp_path / foreign).write_bytes(b"")
        write_records(out, [b"new"])
        assert RecordFile(out)[0] == b"new"
        assert temporaries(tmp_path) == sorted([live_tmp, foreign])  # the dead one's is gone
        live.stdin.write("\n")
        live.stdin.flush()
        assert live.stdout.readline().strip() == "done"
        assert live.wait(timeout=60) == 0
    finally:
        live.kill()
        live.wait(timeout=60)
    assert temporaries(tmp_path) == [foreign]
    assert len(RecordFile(out)) == 4  # the live writer finished its own file


# ---- bug 3: a plan file overwritten under a loaded plan ----

_LOADED_PLAN = textwrap.dedent("""
    import sys
    import opt4torch
    p = opt4torch.load_plan(sys.argv[1])
    print(int(p.seq.sum()), int(p.ops.sum()), flush=True)
    sys.stdin.readline()
    print(int(p.seq.sum()), int(p.ops.sum()), p.hits, flush=True)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["cp", "in-place"])
def test_a_loaded_plan_survives_its_file_being_overwritten(tmp_path, how: str) -> None:
    rng = np.random.default_rng(3)
    big = opt4torch.plan(rng.integers(0, 5000, 400_000), capacity=500)
    big.save(tmp_path / "x.opt4")
    opt4torch.plan([0, 1, 0], capacity=1).save(tmp_path / "other.opt4")  # far shorter
    p = subprocess.Popen([sys.executable, "-c", _LOADED_PLAN, str(tmp_path / "x.opt4")], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline().split()
    assert first == [str(int(big.seq.sum())), str(int(big.ops.sum()))], p.stderr.read()
    if how == "cp":  # what the issue did: cp truncates the file, then writes the short one
        subprocess.run(["cp", str(tmp_path / "other.opt4"), str(tmp_path / "x.opt4")], check=True, timeout=60)
        assert os.path.getsize(tmp_path / "x.opt4") < 1000
    else:  # another process rewrites the sequence section in place
        with open(tmp_path / "x.opt4", "r+b") as f:
            f.seek(4096)
            f.write(b"\xff" * 100_000)
    out, err = p.communicate("\n", timeout=60)
    assert p.returncode == 0, (p.returncode, err)  # not -SIGBUS
    assert out.split() == first + [str(big.hits)]


# ---- bug 5: a record file and its sidecar change together or not at all ----


def test_labels_that_do_not_fit_leave_both_files_as_they_were(tmp_path) -> None:
    path = tmp_path / "x.rec"
    write_records(path, [b"a", b"b", b"c"], labels=[1, 2, 3])
    before = path.read_bytes(), (tmp_path / "x.rec.json").read_bytes()
    with pytest.raises(ValueError, match="2 labels for 3 records: nothing was written"):
        write_records(path, [b"new1", b"new2", b"new3"], labels=[7, 7])
    with pytest.raises(ValueError, match=r"label 1 is 2\.5, not an integer.*refusing to truncate"):
        write_records(path, [b"new1", b"new2", b"new3"], labels=[7, 2.5, 7])
    with pytest.raises(ValueError, match="label 0 is True, not an integer"):
        write_records(path, [b"new1"], labels=[True])
    assert (path.read_bytes(), (tmp_path / "x.rec.json").read_bytes()) == before
    assert temporaries(tmp_path) == []
    assert RecordFile(path)[2] == (b"c", 3)


def test_a_sidecar_of_another_version_of_the_file_is_refused(tmp_path) -> None:
    """What a crash between the two renames leaves (the sidecar is put in
    place first): the new sidecar beside the old file. Its checksum names
    the file it was written with, so the pair is refused, not misread."""
    path = tmp_path / "x.rec"
    write_records(path, [b"a", b"b", b"c"], labels=[1, 2, 3])
    old_file = path.read_bytes()
    write_records(path, [b"d", b"e", b"f"], labels=[4, 5, 6])
    path.write_bytes(old_file)
    with pytest.raises(ValueError, match=r"x\.rec\.json belongs to another version of .*x\.rec"):
        RecordFile(path)
    # The other order (a file written without labels, its old sidecar not
    # yet removed) is refused the same way.
    write_records(path, [b"a", b"b", b"c"], labels=[1, 2, 3])
    side = (tmp_path / "x.rec.json").read_bytes()
    write_records(path, [b"g", b"h", b"i"])
    assert not (tmp_path / "x.rec.json").exists()
    (tmp_path / "x.rec.json").write_bytes(side)
    with pytest.raises(ValueError, match="belongs to another version"):
        RecordFile(path)


def test_a_file_replaced_before_a_worker_reopens_it_is_refused(tmp_path) -> None:
    path = tmp_path / "x.rec"
    write_records(path, [b"a", b"b"], labels=[1, 2])
    rf = RecordFile(path)
    state = pickle.dumps(rf)  # what a spawned DataLoader worker receives
    write_records(path, [b"c", b"d"], labels=[3, 4])
    with pytest.raises(ValueError, match="was replaced by another version of the file after it was opened"):
        pickle.loads(state)


# ---- weak spots: a hostile sidecar; inspect on what is not a plan ----


@pytest.mark.parametrize("text, message", [
    ("{\"labels\": [1, 2", "is not valid JSON"),
    ("{\"labels\": [1.0, 2.7]}", r"label 0 is 1\.0, not an integer"),
    ("{\"labels\": [1, true]}", "label 1 is True, not an integer"),
    ("{\"labels\": \"12\"}", "labels must be a sequence of integers"),
    ("[1, 2]", "not a JSON object"),
    ("{\"labels\": [1, 2], \"classes\": [3]}", "'classes' must be a list of strings"),
])
def test_a_hostile_sidecar_is_refused_naming_the_file(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "x.rec"
    write_records(path, [b"a", b"b"])
    (tmp_path / "x.rec.json").write_text(text)
    with pytest.raises(ValueError, match=message) as e:
        RecordFile(path)
    assert str(tmp_path / "x.rec.json") in str(e.value)


@pytest.mark.timeout(60)
def test_a_fifo_sidecar_does_not_block(tmp_path) -> None:
    path = tmp_path / "x.rec"
    write_records(path, [b"a"])
    os.mkfifo(tmp_path / "x.rec.json")
    with pytest.raises(ValueError, match=r"x\.rec\.json is not a regular file \(a FIFO\)"):
        RecordFile(path)


def test_inspect_describes_a_record_file(tmp_path) -> None:
    path = tmp_path / "x.rec"
    write_records(path, [b"a" * 10, b"b" * 30, b"c"], labels=[0, 1, 1], classes=["cat", "dog"])
    r = cli("inspect", str(path))
    assert r.returncode == 0, r.stderr
    assert "record file" in r.stdout and "format version 2" in r.stdout
    assert "3, 41 bytes of data (1 to 30 bytes each)" in r.stdout
    assert "3 in 2 classes" in r.stdout and "pickle" not in r.stdout + r.stderr
    info = json.loads(cli("inspect", str(path), "--json").stdout)
    assert info["kind"] == "records" and info["records"] == 3 and info["format_version"] == 2
    assert info["checksum"] == f"{RecordFile(path).info()['checksum']:016x}"
    with pytest.raises(opt4torch.PlanFileError, match="It is an opt4 record file"):
        opt4torch.load_plan(path)


@pytest.mark.timeout(60)
def test_inspect_on_a_directory_a_fifo_or_an_unknown_file(tmp_path) -> None:
    r = cli("inspect", str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr and "Traceback" not in r.stderr
    os.mkfifo(tmp_path / "f")
    r = cli("inspect", str(tmp_path / "f"))
    assert r.returncode == 2 and "is a FIFO" in r.stderr
    (tmp_path / "u").write_bytes(b"hello world" * 20)
    r = cli("inspect", str(tmp_path / "u"))
    assert r.returncode == 1 and "not an opt4 plan file" in r.stderr and "Traceback" not in r.stderr


# ---- bug 8: pack on what is not a regular file, from the command line ----


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["fifo", "device", "urandom-link"])
def test_pack_refuses_what_is_not_a_regular_file_at_once(tmp_path, kind: str) -> None:
    root = _images(tmp_path / "images")
    odd = root / "b" / "x.jpg"
    if kind == "fifo":
        os.mkfifo(odd)
        expect = "a FIFO"
    elif kind == "device":
        if not ROOT:
            pytest.skip("mknod of a character device needs root")
        null_device(odd)
        expect = "a character device"
    else:
        odd.symlink_to("/dev/urandom")
        expect = "a character device"
    args = ["pack", str(root), str(tmp_path / "a.rec"), "--quiet"]
    r = cli(*args, *(["--follow-links"] if kind == "urandom-link" else []), timeout=60)
    assert r.returncode == 1 and f"x.jpg is not a regular file ({expect})" in r.stderr, r.stderr
    assert not (tmp_path / "a.rec").exists() and temporaries(tmp_path) == []
    if kind == "urandom-link":  # without --follow-links: a link out of the root
        r = cli(*args, timeout=60)
        assert r.returncode == 1 and "leads outside" in r.stderr
    shutil.rmtree(root)
