"""``opt4torch.compat``: the earlier design's API, served by this engine.

* :mod:`~opt4torch.compat.cachelib`: OPT4TorchDataSet's decorators and
  precomputed files (``get_opt_cache``, ``OPTCacheDecorator``,
  ``SharedOPTCacheDecorator``, ``generate_precomputed_file``); the
  ``OPT4TorchDataSet`` package and ``opt4torch.cachelib`` are this module.
* :mod:`~opt4torch.compat.preload`: ``CachedDataset`` and
  ``AsyncPrefetchDataset``, plan-aware; ``opt4torch.preload`` is this module.

The submodules are imported when asked for, not by ``import opt4torch.compat``.
"""

__all__ = ["cachelib", "preload"]
