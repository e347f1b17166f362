"""The ``opt4torch`` command (and ``opt4torch-precompute``, its earlier name).

    opt4torch precompute   capture a sampler (or read a trace) and write a plan
    opt4torch inspect      describe a plan file, a record file, a tar shard or an image folder
    opt4torch simulate     replay a trace, or sweep generated patterns, through policies
    opt4torch cluster      simulate N nodes: no cache, per-node OPT and one OPT plan over all of them
    opt4torch pack         pack an image folder into a record file
    opt4torch cleanup      list this user's shared-memory pools, remove stale ones
    opt4torch top          live figures of this user's running jobs
    opt4torch demo         the whole job end to end on a generated default

One module per command (two for the pools: cleanup and top), each with the
function that adds its subparser and the function that runs it; entry.py
builds the parser from them and maps errors to exit codes; common.py holds
what several commands share (UsageError, the output check, capacities,
tables). The earlier design's ``opt4`` command is
python/OPT4TorchDataSet/cli.py; it takes UsageError and _check_output from
here.

May touch: nothing itself; its modules touch everything a command names:
plan files, record files, folders, pools (top, cleanup); the lab for
simulate, cluster and demo.
"""

from __future__ import annotations

from .common import UsageError as UsageError, check_output
from .demo import DEMO_CONFIGS as DEMO_CONFIGS
from .entry import main, precompute_main

__all__ = ["main", "precompute_main"]

#: The name the ``opt4`` command (python/OPT4TorchDataSet/cli.py) imports.
_check_output = check_output
