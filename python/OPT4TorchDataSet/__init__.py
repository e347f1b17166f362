"""The earlier design's package name: ``from OPT4TorchDataSet.cachelib import
generate_precomputed_file, OPTCacheDecorator`` keeps working. The code lives in
``opt4torch``; this is a thin alias."""

from opt4torch import __version__

__all__ = ["__version__"]
