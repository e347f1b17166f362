"""The package's layout: the runtime a training job imports, opt4torch.lab
(the research side) and opt4torch.compat (the earlier design's names), and
every name users import today still where they import it."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import opt4torch


def run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_import_loads_neither_torch_nor_lab_nor_compat() -> None:
    code = ("import sys, opt4torch; opt4torch.plan([0, 1, 0], 1); "
            "print(sorted(m for m in ('torch', 'opt4torch.lab', 'opt4torch.compat', 'opt4torch.data') "
            "if m in sys.modules))")
    assert run_python(code) == "[]"


def test_lab_and_compat_names_need_no_torch() -> None:
    code = ("import sys, opt4torch; opt4torch.simulate('lru', [0, 1, 0], 1); opt4torch.POLICIES; "
            "opt4torch.traces.uniform(10, 20, seed=0); opt4torch.reference; opt4torch.get_opt_cache; "
            "import opt4torch.cachelib, opt4torch.lab.science, opt4torch.lab.theory; "
            "print('torch' in sys.modules)")
    assert run_python(code) == "False"


@pytest.mark.parametrize("name", [
    "opt4torch.lab", "opt4torch.lab.sim", "opt4torch.lab.traces", "opt4torch.lab.reference",
    "opt4torch.lab.theory", "opt4torch.lab.science", "opt4torch.lab.plots", "opt4torch.lab.e2e",
    "opt4torch.compat", "opt4torch.compat.cachelib", "opt4torch.compat.preload",
    "opt4torch.cachelib", "opt4torch.preload", "OPT4TorchDataSet", "OPT4TorchDataSet.cachelib",
])
def test_modules_import(name: str) -> None:
    module = importlib.import_module(name)
    assert isinstance(module.__all__, list) and module.__all__
    for attr in module.__all__:
        if not attr.startswith("__"):
            assert hasattr(module, attr) or importlib.import_module(f"{name}.{attr}"), (name, attr)


def test_old_names_are_the_compat_modules() -> None:
    import opt4torch.cachelib
    import opt4torch.compat.cachelib
    import opt4torch.compat.preload
    import opt4torch.preload

    # The same module objects, not copies: what users patch or read is one thing.
    assert opt4torch.cachelib is opt4torch.compat.cachelib
    assert opt4torch.preload is opt4torch.compat.preload
    assert sys.modules["opt4torch.cachelib"] is opt4torch.compat.cachelib
    from opt4torch.preload import AsyncPrefetchDataset, CachedDataset

    assert CachedDataset is opt4torch.compat.preload.CachedDataset
    assert AsyncPrefetchDataset is opt4torch.compat.preload.AsyncPrefetchDataset


def test_one_name_one_thing() -> None:
    import opt4torch.compat.preload
    import opt4torch.data

    assert opt4torch.CachedDataset is opt4torch.compat.preload.CachedDataset
    assert opt4torch.PlannedDataset is opt4torch.data.PlannedDataset
    assert not hasattr(opt4torch.data, "CachedDataset")


def test_old_package_names_resolve_from_compat() -> None:
    import OPT4TorchDataSet
    import OPT4TorchDataSet.cachelib
    import opt4torch.compat.cachelib as cachelib

    for name in ("get_opt_cache", "OPTCacheDecorator", "SharedOPTCacheDecorator", "generate_precomputed_file"):
        assert getattr(OPT4TorchDataSet, name) is getattr(cachelib, name)
        assert getattr(opt4torch, name) is getattr(cachelib, name)
    assert OPT4TorchDataSet.cachelib.DivergenceWarning is cachelib.DivergenceWarning


def test_top_level_names_resolve_from_lab() -> None:
    import opt4torch.lab.reference
    import opt4torch.lab.sim
    import opt4torch.lab.traces

    assert opt4torch.simulate is opt4torch.lab.sim.simulate
    assert opt4torch.POLICIES is opt4torch.lab.sim.POLICIES
    assert opt4torch.reference is opt4torch.lab.reference
    assert opt4torch.traces is opt4torch.lab.traces
    from opt4torch import reference, traces

    assert reference is opt4torch.lab.reference and traces is opt4torch.lab.traces


def test_every_exported_name_resolves() -> None:
    for name in opt4torch.__all__:
        assert getattr(opt4torch, name) is not None, name
    assert set(opt4torch.__all__) <= set(dir(opt4torch))


@pytest.mark.parametrize("old", ["sim", "science", "theory", "plots", "e2e"])
def test_moved_modules_are_gone_from_the_runtime(old: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"opt4torch.{old}")
