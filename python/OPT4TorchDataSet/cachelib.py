"""Alias of :mod:`opt4torch.cachelib` under the earlier design's name."""

from opt4torch.cachelib import (
    DivergenceWarning,
    OPTCacheDecorator,
    SharedOPTCacheDecorator,
    generate_precomputed_file,
    get_opt_cache,
)

__all__ = [
    "DivergenceWarning",
    "OPTCacheDecorator",
    "SharedOPTCacheDecorator",
    "generate_precomputed_file",
    "get_opt_cache",
]
