"""OPT4TorchDataset: Belady-optimal (OPT) caching for PyTorch datasets.

The training order a seeded sampler gives is known in advance, so a cache can
evict by Belady's rule. This package captures that order, builds the OPT plan
with a C11 engine, and compares it with online policies.

``import opt4torch`` needs only numpy; torch is imported by the functions that
work with samplers.

The package's front: the public names, each from the folder that owns it
(docs/architecture.md, "The package's shape"). May touch: nothing at import
but the binding, numpy and the table of earlier module names (_moved.py).
"""

from __future__ import annotations

from ._engine import (
    InvalidInputError,
    Opt4Error,
    Opt4IOError,
    Opt4MemoryError,
    PlanFileError,
)
from ._moved import install as _install_moved
from .planning.capture import CaptureWarning, capture, capture_ranks
from .planning.plan import ADMIT, BYPASS, HIT, Plan, fingerprint, load_plan, plan, sequence_plan

_install_moved()

__version__ = "2.0.0"

# The torch integration is imported on first use, so that `import opt4torch`
# needs only numpy; so are the research side (opt4torch.lab) and the earlier
# design's API (opt4torch.compat), which a training job does not need.
_LAZY = {
    "DataLoader": "opt4torch.loader.dataloader",
    "PlannedDataset": "opt4torch.loader.worker",
    "PositionBatchSampler": "opt4torch.loader.sampler",
    "OPTCache": "opt4torch.pool.cache",
    "remove_stale_pools": "opt4torch.pool.cleanup",
    "POLICIES": "opt4torch.lab.sim",
    "simulate": "opt4torch.lab.sim",
    "OPTCacheDecorator": "opt4torch.compat.cachelib",
    "SharedOPTCacheDecorator": "opt4torch.compat.cachelib",
    "generate_precomputed_file": "opt4torch.compat.cachelib",
    "get_opt_cache": "opt4torch.compat.cachelib",
    "CachedDataset": "opt4torch.compat.preload",
    "AsyncPrefetchDataset": "opt4torch.compat.preload",
    "DevicePrefetcher": "opt4torch.loader.device",
    "RecordFile": "opt4torch.sources.records",
    "write_records": "opt4torch.sources.records",
    "image_folder_to_records": "opt4torch.sources.records",
    "ImageFolder": "opt4torch.sources.local",
    "TarShards": "opt4torch.sources.local",
    "ClusterPlan": "opt4torch.planning.cluster",
    "cluster_plan": "opt4torch.planning.cluster",
    "S3ImageFolder": "opt4torch.sources.s3",
    "S3TarShards": "opt4torch.sources.s3",
    "HFDataset": "opt4torch.sources.hfdatasets",
    "Parquet": "opt4torch.sources.parquet",
}


#: Modules that are attributes of opt4torch itself: two of opt4torch.lab, and
#: the earlier design's names of opt4torch.compat's modules.
_LAZY_MODULES = {
    "reference": "opt4torch.lab.reference",
    "traces": "opt4torch.lab.traces",
    "cachelib": "opt4torch.compat.cachelib",
    "preload": "opt4torch.compat.preload",
}


#: Optional packages a lazily imported name may need, and the extra that
#: installs each (docs/dependencies.md lists what is lost without them).
_EXTRAS = {"torch": "torch", "safetensors": "compat", "cachetools": "compat", "matplotlib": "plot",
           "datasets": "hf", "pyarrow": "hf"}


def __getattr__(name: str) -> object:
    import importlib

    try:
        if name in _LAZY_MODULES:
            value = importlib.import_module(_LAZY_MODULES[name])
        elif name in _LAZY:
            value = getattr(importlib.import_module(_LAZY[name]), name)
        else:
            raise AttributeError(f"module 'opt4torch' has no attribute {name!r}")
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        if top not in _EXTRAS:
            raise
        raise ModuleNotFoundError(
            f"opt4torch.{name} needs {top}, which is not installed: pip install 'opt4torchdataset[{_EXTRAS[top]}]' "
            f"(or pip install {top}); the planner and simulator work without it", name=e.name) from e
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_MODULES))


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
    "PlannedDataset",
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
    "capture_ranks",
    "ClusterPlan",
    "cluster_plan",
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
    "S3ImageFolder",
    "S3TarShards",
    "HFDataset",
    "Parquet",
    "reference",
    "traces",
    "write_records",
]
