"""The package on a machine without each optional Python dependency.

docs/dependencies.md names every optional dependency and what is lost
without it. Each test runs a fresh interpreter in which one of them cannot
be imported (``sys.modules[name] = None`` makes ``import name`` fail as if it
were not installed), and checks both halves of that promise: what does not
need it still works, and what does need it says what to install. The C
libraries' "without" paths are built by ``make test-without``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def run_without(modules: list[str], code: str, *args: str) -> subprocess.CompletedProcess[str]:
    block = "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    src = "import sys\n" + block + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", src, *args], capture_output=True, text=True, timeout=150,
                          stdin=subprocess.DEVNULL)


def test_without_torch_the_planner_and_simulator_work_and_the_loader_says_what_to_install() -> None:
    out = run_without(["torch"], """
        import numpy as np
        import opt4torch
        from opt4torch.lab import sim
        seq = np.array([0, 1, 2, 0, 1, 3, 0, 2] * 10, dtype=np.int64)
        p = opt4torch.plan(seq, capacity=2)
        print("hits", p.hits)
        print("sim", sim.simulate("lru", seq, 2)["hits"])
        try:
            opt4torch.DataLoader
        except ModuleNotFoundError as e:
            print("error:", e)
        """)
    assert out.returncode == 0, out.stderr
    hits = int(out.stdout.split("hits ", 1)[1].split()[0])
    assert hits > 0, out.stdout
    assert "error: opt4torch.DataLoader needs torch" in out.stdout, out.stdout
    assert "pip install 'opt4torchdataset[torch]'" in out.stdout, out.stdout


def test_without_matplotlib_simulate_prints_its_table_and_plots_say_what_to_install(tmp_path) -> None:
    code = """
        from opt4torch.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    common = ["simulate", "--pattern", "zipf", "--items", "100", "--epochs", "3", "--policy", "lru,opt",
              "--capacity", "10"]
    table = run_without(["matplotlib"], code, *common, "--no-plots")
    assert table.returncode == 0, table.stderr
    assert "lru" in table.stdout and "opt" in table.stdout.lower(), table.stdout
    plots = run_without(["matplotlib"], code, *common, "--out", str(tmp_path / "out"))
    assert plots.returncode == 2, (plots.stdout, plots.stderr)
    assert "plots need matplotlib" in plots.stderr and "--no-plots" in plots.stderr, plots.stderr


@pytest.mark.parametrize("missing", [["PIL"], ["tensorboard", "torch.utils.tensorboard"], ["s3torchconnector"],
                                     ["safetensors", "cachetools"], ["datasets"], ["pyarrow"]])
def test_the_loader_needs_none_of_the_optional_packages(missing: list[str]) -> None:
    out = run_without(missing, """
        import opt4torch
        data = [i * 3 for i in range(40)]
        dl = opt4torch.DataLoader(data, batch_size=4, shuffle=True, seed=0, num_workers=0, cache_items=10,
                                  epochs=2, log_every=5)
        seen = []
        for epoch in range(2):
            for batch in dl:
                seen.extend(int(x) for x in batch)
        st = dl.cache.stats()
        print("served", len(seen), "distinct", len(set(seen)), "hits", st["hits"], "plan", st["plan_hits"])
        """)
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    served, distinct, hits, plan_hits = (int(words[i]) for i in (1, 3, 5, 7))
    assert served == 80 and distinct == 40
    assert hits == plan_hits > 0, out.stdout



@pytest.mark.parametrize("missing", [["datasets"], ["pyarrow"]])
def test_without_datasets_or_pyarrow_hf_datasets_say_what_to_install(missing: list[str]) -> None:
    out = run_without(missing, """
        import opt4torch
        try:
            opt4torch.HFDataset([1, 2])
        except ModuleNotFoundError as e:
            print("error:", e)
        """)
    assert out.returncode == 0, out.stderr
    assert f"error: opt4torch.HFDataset needs {missing[0]}" in out.stdout, out.stdout
    assert "pip install 'opt4torchdataset[hf]'" in out.stdout, out.stdout


def test_without_pyarrow_parquet_says_what_to_install() -> None:
    out = run_without(["pyarrow"], """
        import opt4torch
        try:
            opt4torch.Parquet("x.parquet")
        except ModuleNotFoundError as e:
            print("error:", e)
        """)
    assert out.returncode == 0, out.stderr
    assert "error: opt4torch.Parquet needs pyarrow" in out.stdout, out.stdout
    assert "pip install 'opt4torchdataset[hf]'" in out.stdout, out.stdout
