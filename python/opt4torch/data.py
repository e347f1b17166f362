"""``opt4torch.data``: the earlier home of the DataLoader and its pieces, kept
one release as re-exports (issue 35 split it by concern: loader/, pool/,
planning/sizing.py, distributed/). New code imports from those places; the
names here are the same objects.
"""

from __future__ import annotations

from .distributed.node import interleave_ranks as _interleave_ranks
from .distributed.node import node_group as _node_group
from .loader.build import layout_digest as _layout_digest
from .loader.build import probe_item_bytes as _probe_item_bytes
from .loader.checks import check_arguments as _check_arguments
from .loader.dataloader import DataLoader
from .loader.sampler import PositionBatchSampler
from .loader.worker import PlannedDataset
from .planning.sizing import (
    CODEC_MARGIN,
    PLAN_KEPT_BYTES_PER_ACCESS,
    PLAN_PEAK_BYTES_PER_ACCESS,
    PLAN_WARN_BYTES,
    PREFETCH_MAX_THREADS,
    SIZED_PLAN_BYTES_PER_ACCESS,
    SIZED_PLAN_BYTES_PER_ITEM,
    STAGING_BUDGET,
    choose_page,
    handover_spare,
    parse_bytes,
    plan_cost,
)
from .planning.sizing import check_plan_cost as _check_plan_cost
from .planning.sizing import item_sizes as _item_sizes
from .planning.sizing import resident_bytes as _resident_bytes
from .pool.cache import OPTCache
from .pool.cleanup import remove_stale_pools

_choose_page = choose_page

__all__ = ["DataLoader", "PlannedDataset", "PositionBatchSampler", "OPTCache", "parse_bytes", "remove_stale_pools"]

# The names kept for code that imported them from here.
_KEPT = (_interleave_ranks, _node_group, _layout_digest, _probe_item_bytes, _check_arguments, _check_plan_cost,
         _item_sizes, _resident_bytes, CODEC_MARGIN, PLAN_KEPT_BYTES_PER_ACCESS, PLAN_PEAK_BYTES_PER_ACCESS,
         PLAN_WARN_BYTES, PREFETCH_MAX_THREADS, SIZED_PLAN_BYTES_PER_ACCESS, SIZED_PLAN_BYTES_PER_ITEM,
         STAGING_BUDGET, handover_spare, plan_cost)
