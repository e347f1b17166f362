"""docs/architecture.md names every source file, and names none that is gone.

The set: every file ``git ls-files`` lists under ``src/``, ``binding/``,
``include/`` and ``python/`` (the engine, its public header, the binding,
the ``opt4torch`` package and the earlier package's name,
``OPT4TorchDataSet``), whatever its kind (``.c``, ``.h``, ``.py``, ``.pyi``,
``py.typed``).

Named means listed in the doc's tree, the code block under "## The tree".
An entry of the tree starts at the first column with a folder
(``src/source/``) or a file (``include/opt4.h``, whose folder is then
``include/``) and goes on over the indented lines below it. In an entry, a
file name without a slash names the file of that folder (``tar.c`` under
``src/source/`` is ``src/source/tar.c``), a path that starts with a top
folder of the repository is taken as it is (``tests/fuzz/fuzz_decode.c``),
and any other path is taken from the entry's folder (``lab/sim.py`` under
``python/opt4torch/``). Basenames alone would not do: ``records.c`` is
three files (``src/io/``, ``src/source/``, ``binding/``).

The other way round: every file the tree names, and every repository path
the doc mentions anywhere (``src/shm/runtime.c``, ``tests/c/``), exists, so
a file renamed or removed fails here too.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
COVERED = ("src/", "binding/", "include/", "python/")
TOP = ("src/", "binding/", "include/", "python/", "tests/", "bench/", "docs/", "scripts/", "third_party/")
FILE = re.compile(r"(?<![\w./<-])((?:[\w.-]+/)*(?:[\w.-]+\.(?:c|h|py|pyi)|py\.typed))(?![\w/])")
REPO_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(t) for t in TOP) + r")[\w./-]*[\w/])")


def tracked() -> set[str]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--", *COVERED, *TOP],
                             capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("git is not installed: the tracked files are what git lists")
    if out.returncode != 0:
        pytest.skip(f"not a git checkout ({out.stderr.strip()}): the tracked files are what git lists")
    return set(out.stdout.split())


def tree_block() -> str:
    text = DOC.read_text()
    m = re.search(r"^## The tree\n.*?^```\n(.*?)^```", text, re.S | re.M)
    assert m, "docs/architecture.md has no code block under '## The tree'"
    return m.group(1)


def tree_files() -> dict[str, int]:
    """Each file the tree names, as a repository path, with its line in the
    block."""
    named: dict[str, int] = {}
    folder = ""
    for no, line in enumerate(tree_block().splitlines(), 1):
        if line[:1] not in ("", " "):
            first = line.split()[0]
            folder = first if first.endswith("/") else first.rsplit("/", 1)[0] + "/" if "/" in first else ""
        for name in FILE.findall(line):
            path = name if name.startswith(TOP) or not folder else folder + name
            named.setdefault(path, no)
    return named


def test_every_tracked_source_file_is_named() -> None:
    files = {f for f in tracked() if f.startswith(COVERED)}
    assert len(files) > 50, sorted(files)  # the set is what it says, not empty by a wrong path
    missing = sorted(files - set(tree_files()))
    assert not missing, ("docs/architecture.md's tree does not name these tracked files (list each under "
                         f"its folder's entry, with what it is for): {missing}")


def test_every_file_the_tree_names_exists() -> None:
    files = tracked()
    gone = sorted(f"{path} (tree line {no})" for path, no in tree_files().items() if path not in files)
    assert not gone, f"docs/architecture.md's tree names files that are not tracked: {gone}"


def test_every_repository_path_in_the_doc_exists() -> None:
    files = tracked()
    folders = {f[: i + 1] for f in files for i, c in enumerate(f) if c == "/"}
    text = DOC.read_text()
    gone = sorted({p for p in REPO_PATH.findall(text) if p not in files and p.rstrip("/") + "/" not in folders})
    assert not gone, f"docs/architecture.md mentions paths that are not tracked: {gone}"
