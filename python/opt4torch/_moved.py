"""The modules' earlier names (before the package took the engine's shape,
issue 35), kept importable for one release: ``opt4torch.records`` is
:mod:`opt4torch.sources.records`, the same module object, so what users
import, read or patch under the old name is the one thing.

The one table of old names; nothing else here. A finder on ``sys.meta_path``
answers an old name with the module at its new place (imported then, so
the names that need torch still load on first use). ``opt4torch.data`` is
not here: its names went to several modules, and data.py re-exports them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: Old name -> the module's place now.
MOVED = {
    "opt4torch._plan": "opt4torch.planning.plan",
    "opt4torch.capture": "opt4torch.planning.capture",
    "opt4torch.cluster": "opt4torch.planning.cluster",
    "opt4torch._codec": "opt4torch.pool.codec",
    "opt4torch._live": "opt4torch.pool.live",
    "opt4torch._prefetch": "opt4torch.pool.prefetch",
    "opt4torch._forksafe": "opt4torch.io.forksafe",
    "opt4torch._files": "opt4torch.io.files",
    "opt4torch.records": "opt4torch.sources.records",
    "opt4torch.objstore": "opt4torch.sources.s3",
    "opt4torch._shardnames": "opt4torch.sources.shardnames",
    "opt4torch._formats": "opt4torch.sources.formats",
    "opt4torch._exchange": "opt4torch.distributed.exchange",
    "opt4torch.device": "opt4torch.loader.device",
}

#: Old names whose module opt4torch itself imports: registered at once, so
#: that importing them later never rebinds ``opt4torch.capture`` (the
#: function) to the module, as the import system does for a submodule it loads.
EAGER = ("opt4torch._plan", "opt4torch.capture")


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        # The import system gives the module the old name's spec between the
        # two calls below; exec_module puts its own back.
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[spec.name])
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        old = module.__spec__.name if module.__spec__ is not None else ""
        module.__spec__ = self._specs.pop(old, module.__spec__)


def install() -> None:
    if not any(isinstance(f, _OldNames) for f in sys.meta_path):
        sys.meta_path.append(_OldNames())
    for old in EAGER:
        sys.modules.setdefault(old, importlib.import_module(MOVED[old]))
