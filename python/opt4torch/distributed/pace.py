"""When a cluster node's transfer thread runs each turn (docs/cluster.md,
"The run time"): turn k, which runs window k's collective and hands over
what window k + 1 gets, comes once the node's workers asked for the reads
of window k - 1, as the pool counts their progress (in blocks of
HEAD_BLOCK positions: ``wait_head``).

May touch: nothing; numbers out of the node plan.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import _engine
from ..planning.cluster import NodePlan

__all__ = ["turn_paces"]


def turn_paces(p: NodePlan, turns: Sequence[int], epoch_starts: Sequence[int] | None
               ) -> tuple[dict[int, int], int]:
    """Each turn's pace (the node-plan position the workers' progress must
    reach before it runs), and the pace of the node's last read (the
    workers got there unless the run was cut).

    Turn k's is the block of window k - 1's first read (or of the last read
    of all). A turn whose read shares its block with its epoch's first read
    (``epoch_starts``: node-plan positions) waits for the block after: else
    the last reads of the epoch before, or the thread's own reads of the
    new epoch's first window, would count as its pace, on the nodes where
    the block's edge falls so, and at an epoch's end the nodes would
    disagree on their last turn (one of them then waits out
    cluster_timeout in a collective nobody else comes to). Never past the
    first read of window k + 1, which may wait for turn k's items."""
    reads = p.reads
    B = _engine.HEAD_BLOCK
    starts = np.sort(np.asarray(epoch_starts if epoch_starts is not None else [], dtype=np.int64))
    pace: dict[int, int] = {}
    for k in turns:
        j = int(np.searchsorted(p.window[reads], k - 1)) if reads.size else 0
        r = int(reads[min(j, reads.size - 1)]) if reads.size else 0
        pace[k] = r // B * B
        e = int(np.searchsorted(starts, r, side="right")) - 1
        if reads.size and e >= 0 and int(starts[e]) // B == r // B:
            after = int(np.searchsorted(p.window[reads], k + 1))
            cap = int(reads[min(after, reads.size - 1)]) // B * B  # or the last read's block
            pace[k] = max(r // B * B, min(r // B * B + B, cap))
    return pace, (int(reads[-1]) // B * B if reads.size else 0)
