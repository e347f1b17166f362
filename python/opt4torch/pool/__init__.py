"""The shared-memory cache at run time (the engine's src/shm): the owner's
side (cache.py), removing pools at exit and dead runs' (cleanup.py), the
bytes a dataset's items become (codec.py), the prefetcher that loads the
plan's misses ahead into the pool (prefetch.py, the engine's src/io/prefetcher.c)
and the live figures from a pool's counters (live.py). Imports planning/ and
io/, never loader/ or distributed/.
"""
