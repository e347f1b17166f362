"""``OPT4TorchDataSet.cachelib``: an alias of :mod:`opt4torch.compat.cachelib`."""

from opt4torch.compat.cachelib import (
    CachetoolsDecorator,
    DivergenceWarning,
    OPTCacheDecorator,
    SharedOPTCacheDecorator,
    SuboptimalPlanWarning,
    generate_precomputed_file,
    get_opt_cache,
    read_precomputed_safetensors,
)

__all__ = [
    "generate_precomputed_file",
    "OPTCacheDecorator",
    "SharedOPTCacheDecorator",
    "CachetoolsDecorator",
    "get_opt_cache",
    "read_precomputed_safetensors",
    "DivergenceWarning",
    "SuboptimalPlanWarning",
]
