"""Upgrading from OPT4TorchDataSet 1.1.0, as docs/migrating.md tells its users.

To pip, ``OPT4TorchDataSet`` and ``opt4torchdataset`` are one project
(names compare case-folded, PEP 503), so this package is that project's
next version, and the upgrade is one ``pip install -U``. The slow test runs
the page's ``pip`` commands in a fresh virtual environment that holds a
stand-in for 1.1.0: a wheel named ``OPT4TorchDataSet`` 1.1.0 with the same
top-level package and ``opt4`` command as the real one, and a file only
1.1.0 has. The real 1.1.0 (a JIT-compiled C++ extension, timm, typer, ...)
is not on this machine's index; the page says what was checked against it
by hand. This package's wheel is built from the tree; its dependencies come
from the environment running the tests (a ``.pth`` to a folder of links to
everything there except this package), so nothing is downloaded.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import opt4torch
from opt4torch import _engine

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "migrating.md"
EARLIER = (1, 1, 0)


def canonical(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def test_one_version_everywhere() -> None:
    """pyproject.toml, CMakeLists.txt, include/opt4.h and the installed
    package give one version, above 1.1.0, under the earlier package's name."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    version = project["version"]
    assert canonical(project["name"]) == canonical("OPT4TorchDataSet"), project["name"]
    assert version_tuple(version) > EARLIER, f"{version} is not above 1.1.0: pip would keep 1.1.0"
    cmake = re.search(r"project\(opt4 VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text())
    assert cmake is not None and cmake.group(1) == version
    header = (ROOT / "include" / "opt4.h").read_text()
    parts = [re.search(rf"#define OPT4_VERSION_{p} (\d+)", header) for p in ("MAJOR", "MINOR", "PATCH")]
    assert all(parts) and ".".join(m.group(1) for m in parts if m) == version
    assert f'#define OPT4_VERSION_STRING "{version}"' in header
    assert opt4torch.__version__ == version
    assert _engine.ENGINE_VERSION == version
    # The installed package is the tree's (make install reinstalls on a change).
    assert importlib.metadata.version("opt4torchdataset") == version


def page_blocks() -> list[list[list[str]]]:
    """The commands of each ```bash block of the page, comments dropped."""
    text = PAGE.read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
    return [[shlex.split(line, comments=True) for line in b.splitlines() if shlex.split(line, comments=True)]
            for b in blocks]


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def stand_in_wheel(folder: Path) -> Path:
    """OPT4TorchDataSet 1.1.0 as pip sees it: its name and version, its
    top-level package and ``opt4`` command, and files only it has."""
    info = "OPT4TorchDataSet-1.1.0.dist-info"
    files = {
        "OPT4TorchDataSet/__init__.py": '__version__ = "1.1.0"\nSTAND_IN = True\n',
        "OPT4TorchDataSet/cli.py": 'def main() -> int:\n    print("stand-in opt4 1.1.0")\n    return 0\n',
        "OPT4TorchDataSet/atomic_extension.py": "# only 1.1.0 has this file\n",
        "OPT4TorchDataSet/cpp/atomic_ext.cpp": "// only 1.1.0 has this file\n",
        f"{info}/METADATA": ("Metadata-Version: 2.1\nName: OPT4TorchDataSet\nVersion: 1.1.0\n"
                             "Requires-Dist: torch\nRequires-Dist: safetensors\nRequires-Dist: cachetools\n"),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test_migration\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\nopt4 = OPT4TorchDataSet.cli:main\n",
    }
    path = folder / "OPT4TorchDataSet-1.1.0-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            data = text.encode()
            z.writestr(name, data)
            record.append(f"{name},{record_hash(data)},{len(data)}")
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def environment_without_this_package(venv: Path, links: Path) -> None:
    """Make the test environment's packages, except this one, importable in
    venv (after its own site-packages): links to them in one folder, named
    by a .pth file."""
    ours = importlib.metadata.distribution("opt4torchdataset")
    own = {Path(str(f)).parts[0] for f in ours.files or [] if not str(f).startswith("..")}
    assert {"opt4torch", "OPT4TorchDataSet"} <= own, own
    links.mkdir()
    for key in ("purelib", "platlib"):
        site = Path(sysconfig.get_paths()[key])
        for entry in site.iterdir():
            if entry.name not in own and not (links / entry.name).exists():
                (links / entry.name).symlink_to(entry)
    site = Path(venv_run(venv, "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (site / "zz_test_environment.pth").write_text(f"{links}\n")


def clean_env() -> dict[str, str]:
    """No PYTHONPATH, no pip configuration of this machine: only what the
    test passes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def venv_run(venv: Path, code: str) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         env=clean_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def pip(venv: Path, argv: list[str], wheels: Path) -> str:
    """One of the page's commands, as written, with the test's two wheels
    as the only index."""
    assert argv[0] == "pip", f"the page runs {argv}; this test runs pip commands"
    cmd = [str(venv / "bin" / "python"), "-m", "pip", *argv[1:], "--no-index", "--find-links", str(wheels)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=120)
    assert out.returncode == 0, f"{' '.join(argv)}:\n{out.stdout}\n{out.stderr}"
    return out.stdout


STATE = """
import importlib.metadata, json, re, OPT4TorchDataSet as o
same = [d.version for d in importlib.metadata.distributions()
        if re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() == "opt4torchdataset"]
print(json.dumps({"versions": same, "version": o.__version__, "file": o.__file__,
                  "stand_in": hasattr(o, "STAND_IN"),
                  "get_opt_cache": getattr(getattr(o, "get_opt_cache", None), "__module__", None)}))
"""


def state(venv: Path) -> dict:
    return json.loads(venv_run(venv, STATE).strip().splitlines()[-1])


@pytest.mark.slow
def test_upgrade_from_1_1_0_is_the_pages_command(tmp_path: Path) -> None:
    pytest.importorskip("scikit_build_core", reason="building the wheel needs scikit-build-core")
    blocks = page_blocks()
    assert blocks, "docs/migrating.md has no bash block"
    upgrade = blocks[0]
    back = [b for b in blocks if any("opt4torchdataset==1.1.0" in a for cmd in b for a in cmd)]
    assert len(back) == 1, "the page says how to go back to 1.1.0 in one bash block"

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    stand_in_wheel(wheels)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--quiet", "-w", str(wheels), str(ROOT)],
                           capture_output=True, text=True, env=clean_env(), timeout=150)
    assert build.returncode == 0, build.stdout + build.stderr
    ours = opt4torch.__version__
    assert [p.name for p in wheels.glob(f"opt4torchdataset-{ours}-*.whl")], sorted(os.listdir(wheels))

    venv = tmp_path / "venv"
    # Without a pip (nor the setuptools ensurepip brings) of its own: the
    # environment's, linked in, would otherwise be shadowed by older ones.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=clean_env(),
                   timeout=120)
    environment_without_this_package(venv, tmp_path / "environment")
    site = Path(venv_run(venv, "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    pip(venv, ["pip", "install", str(wheels / "OPT4TorchDataSet-1.1.0-py3-none-any.whl")], wheels)
    before = state(venv)
    assert before["versions"] == ["1.1.0"] and before["stand_in"], before
    assert (site / "OPT4TorchDataSet" / "cpp" / "atomic_ext.cpp").exists()

    for argv in upgrade:
        pip(venv, argv, wheels)
    after = state(venv)
    # One distribution of the name is left, this one, and it is what imports.
    assert after["versions"] == [ours], after
    assert after["version"] == ours and not after["stand_in"], after
    assert after["get_opt_cache"] == "opt4torch.compat.cachelib", after
    assert Path(after["file"]).parent == site / "OPT4TorchDataSet", after
    # 1.1.0's own files went with it.
    assert not (site / "OPT4TorchDataSet" / "atomic_extension.py").exists()
    assert not (site / "OPT4TorchDataSet" / "cpp").exists()
    # `opt4` is this package's: it writes a plan that opt4torch reads.
    plan_path = tmp_path / "plan.opt4"
    run = subprocess.run([str(venv / "bin" / "opt4"), "-d", "50", "-t", "200", "-o", str(plan_path), "-m", "10"],
                         capture_output=True, text=True, env=clean_env(), timeout=120, cwd=tmp_path)
    assert run.returncode == 0 and "stand-in" not in run.stdout, run.stdout + run.stderr
    assert opt4torch.load_plan(str(plan_path)).accesses == 200

    for argv in back[0]:
        pip(venv, argv, wheels)
    again = state(venv)
    assert again["versions"] == ["1.1.0"] and again["stand_in"], again
    assert (site / "OPT4TorchDataSet" / "cpp" / "atomic_ext.cpp").exists()
