"""OPT4TorchDataSet's package name, served by ``opt4torch``.

``from OPT4TorchDataSet import get_opt_cache, OPTCacheDecorator,
SharedOPTCacheDecorator, generate_precomputed_file`` works as with
OPT4TorchDataSet 1.1 (and ``OPT4TorchDataSet.cachelib`` as before it): the
code is :mod:`opt4torch.compat.cachelib`; docs/migrating.md says what differs.
"""

from opt4torch import __version__ as __version__
from opt4torch.compat.cachelib import (
    OPTCacheDecorator,
    SharedOPTCacheDecorator,
    generate_precomputed_file,
    get_opt_cache,
)

__all__ = [
    "get_opt_cache",
    "OPTCacheDecorator",
    "SharedOPTCacheDecorator",
    "generate_precomputed_file",
]
