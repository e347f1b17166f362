"""OPT4TorchDataset: Belady-optimal (OPT) caching for PyTorch datasets.

The training order a seeded sampler gives is known in advance, so a cache can
evict by Belady's rule. This package captures that order, builds the OPT plan
with a C11 engine, and compares it with online policies.

``import opt4torch`` needs only numpy; torch is imported by the functions that
work with samplers.
"""

from __future__ import annotations

from ._engine import (
    InvalidInputError,
    Opt4Error,
    Opt4IOError,
    Opt4MemoryError,
    PlanFileError,
)
from ._plan import ADMIT, BYPASS, HIT, Plan, fingerprint, load_plan, plan, sequence_plan
from .cachelib import (
    OPTCacheDecorator,
    SharedOPTCacheDecorator,
    generate_precomputed_file,
    get_opt_cache,
)
from .capture import CaptureWarning, capture
from .sim import POLICIES, simulate
from . import reference, traces

__version__ = "0.1.0"

# The torch integration is imported on first use, so that `import opt4torch`
# needs only numpy.
_LAZY = {
    "DataLoader": "opt4torch.data",
    "CachedDataset": "opt4torch.data",
    "PositionBatchSampler": "opt4torch.data",
    "OPTCache": "opt4torch.data",
    "remove_stale_pools": "opt4torch.data",
    "AsyncPrefetchDataset": "opt4torch.preload",
    "DevicePrefetcher": "opt4torch.device",
    "RecordFile": "opt4torch.records",
    "write_records": "opt4torch.records",
    "image_folder_to_records": "opt4torch.records",
    "ImageFolder": "opt4torch.sources",
    "TarShards": "opt4torch.sources",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'opt4torch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "__version__",
    "ADMIT",
    "AsyncPrefetchDataset",
    "BYPASS",
    "HIT",
    "CachedDataset",
    "ImageFolder",
    "CaptureWarning",
    "DataLoader",
    "DevicePrefetcher",
    "OPTCache",
    "PositionBatchSampler",
    "SharedOPTCacheDecorator",
    "InvalidInputError",
    "OPTCacheDecorator",
    "Opt4Error",
    "Opt4IOError",
    "Opt4MemoryError",
    "Plan",
    "PlanFileError",
    "POLICIES",
    "RecordFile",
    "capture",
    "fingerprint",
    "generate_precomputed_file",
    "get_opt_cache",
    "image_folder_to_records",
    "load_plan",
    "plan",
    "remove_stale_pools",
    "sequence_plan",
    "simulate",
    "TarShards",
    "reference",
    "traces",
    "write_records",
]
