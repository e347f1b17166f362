"""What a cluster node's ranks report of the plan beside the measured
transfers (issue 18; docs/cluster.md, "The run time"): the plan's figures
for a node (:func:`plan_keys`), and :class:`ClusterFollower`, what the
node's other ranks hold in the transfer thread's place
(distributed/runtime.py).

May touch: nothing but the plan it is given.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..planning.cluster import FROM_STORAGE, WORKER, NodePlan
from ..planning.clusterplan import ClusterFigures

__all__ = ["ClusterFollower", "plan_keys"]


def plan_keys(cp: ClusterFigures, node_plan: NodePlan, storage_sizes: np.ndarray | None) -> dict[str, int]:
    """The plan's figures for a node, as ``stats()`` gives them beside the
    measured ones. Storage bytes are the items' own (the plan counts what the
    pool stores, with the codec's margin) when their sizes are known."""
    plan = cp.node_stats()[node_plan.node]
    mine = (node_plan.role == WORKER) & (node_plan.source == FROM_STORAGE)
    return {
        "plan_local_hits": plan["local_hits"],
        "plan_peer_hits": plan["peer_hits"],
        "plan_storage_bytes": (int(storage_sizes[node_plan.seq[mine]].sum()) if storage_sizes is not None
                               else plan["plan_storage_bytes"]),
        "plan_storage_reads": plan["storage_reads"],
        # A resumed loader's warm prefix: items its old pool held that the
        # plan keeps (stored before any worker starts, not storage reads).
        "plan_warm": plan["warm"],
        # Whether every node planned alone (cluster_alone=): no transfers.
        "plan_alone": cp.alone,
    }


class ClusterFollower:
    """What a node's other ranks hold in the transfer thread's place: they
    share the node's pool, and its first rank moves the items. Their
    ``stats()`` give the node's pool counters and the plan's figures; the
    measured transfers (``local_hits``, ``peer_hits``, ``peer_bytes_*``,
    ``peer_items_*``, ``exchange_seconds``, ``exchange_thread_cpu_seconds``)
    and their faults (``cluster_errors``, ``cluster_failed_windows``,
    ``cluster_regroups``)
    are the first rank's thread's to see, and are None here."""

    error: BaseException | None = None
    done = True
    bytes_moved = None

    def __init__(self, cp: ClusterFigures, node_plan: NodePlan, storage_sizes: np.ndarray | None,
                 leader: int) -> None:
        self.plan_keys = plan_keys(cp, node_plan, storage_sizes)
        #: The node's plan, as the node's first rank handed it over (it
        #: planned; this rank did not: distributed/setup.py).
        self.plan = node_plan
        #: The global rank whose transfer thread serves this node.
        self.leader = leader

    def start(self) -> None:
        pass

    def finish(self, timeout: float | None = None) -> None:
        pass

    def stop(self, timeout: float | None = None) -> None:
        pass

    def stats(self, hits: int) -> dict[str, Any]:
        return {"local_hits": None, "peer_hits": None, "peer_bytes_sent": None, "peer_bytes_received": None,
                "peer_items_sent": None, "peer_items_received": None, "peer_bytes_per_s": None,
                "exchange_seconds": None, "exchange_thread_cpu_seconds": None, **self.plan_keys,
                "cluster_errors": None, "cluster_leader": self.leader,
                "cluster_failed_windows": None, "cluster_regroups": None}
