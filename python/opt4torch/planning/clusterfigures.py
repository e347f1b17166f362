"""A cluster plan's figures (:class:`ClusterFigures`): the nodes'
capacities, the totals, each node's counts and the checksum, without the
plan's per-position arrays. A :class:`~opt4torch.planning.clusterplan.ClusterPlan`
is one; on the ranks of a ``cluster=True`` job that did not plan, and on
every rank once the planning one let its plan go, this is what
``loader.cluster_plan`` is (docs/cluster.md, "Planning once a node"). May
touch: nothing but the figures it is given.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["NODE_KEYS", "ClusterFigures"]

#: The per-node counts :meth:`ClusterFigures.node_stats` gives. ``local_hits``,
#: ``peer_hits``, ``peer_bytes_sent``, ``peer_bytes_received`` and
#: ``plan_storage_bytes`` are also keys of the DataLoader's ``stats()`` with
#: ``cluster=True`` (there the first four are measured).
NODE_KEYS: tuple[str, ...] = (
    "capacity", "accesses", "local_hits", "peer_hits", "storage_reads", "admits", "bypasses",
    "plan_storage_bytes", "homed", "peer_items_sent", "peer_items_received", "peer_bytes_sent",
    "peer_bytes_received", "peak_resident", "late", "warm",
)


class ClusterFigures:
    """The figures of a cluster plan, without its per-position arrays: the
    nodes' capacities, the totals, each node's counts (:meth:`node_stats`)
    and the checksum. A :class:`ClusterPlan` is one; on the ranks of a job
    that did not plan (``cluster=True``: each node's first rank plans, its
    other ranks receive their node's part, distributed/handoff.py) this is
    what ``loader.cluster_plan`` is."""

    __slots__ = ("capacities", "page_size", "window", "_info", "_per_node")

    def __init__(self, capacities: np.ndarray, info: dict[str, int], per_node: list[dict[str, int]],
                 page_size: int = 0, window: int | None = None) -> None:
        #: What each node holds: items, or pages of ``page_size`` bytes
        #: for a plan in bytes.
        self.capacities = capacities
        #: 0 for a plan in items.
        self.page_size = page_size
        #: Steps a transfer window (``None``: transfers assumed in time).
        self.window = window
        self._info = info
        self._per_node = per_node

    def figures(self) -> ClusterFigures:
        """These figures alone (what a node's other ranks receive)."""
        return ClusterFigures(np.array(self.capacities, dtype=np.int64), dict(self._info),
                              [dict(d) for d in self._per_node], self.page_size, self.window)

    @property
    def sized(self) -> bool:
        """Whether capacities are in bytes (pages) rather than items."""
        return self.page_size > 0

    @property
    def unplaced(self) -> int:
        """Plans in bytes: generations no node had enough free pages for
        (read from storage at each of their accesses instead)."""
        return int(self._info["unplaced"])

    @property
    def unplaced_hits(self) -> int:
        """The aggregate plan's hits lost to :attr:`unplaced` generations."""
        return int(self._info["unplaced_hits"])

    @property
    def late(self) -> int:
        """With windows: the aggregate plan's hits that cannot arrive in
        time, read from storage instead (:data:`LATE`)."""
        return int(self._info["late"])

    @property
    def alone(self) -> bool:
        """Whether each node plans alone (``cluster_plan(alone=)``): every
        hit local, nothing sent, because one plan over the cluster would
        have read less than ``MIN_SAVING`` fewer bytes from storage (or
        ``alone=True``)."""
        return bool(self._info.get("alone", 0))

    @property
    def n_nodes(self) -> int:
        return int(self.capacities.size)

    @property
    def accesses(self) -> int:
        return int(self._info["accesses"])

    def __len__(self) -> int:
        return self.accesses

    @property
    def hits(self) -> int:
        """Local and peer hits: the aggregate plan's hits."""
        return int(self._info["hits"])

    @property
    def local_hits(self) -> int:
        return int(self._info["local_hits"])

    @property
    def peer_hits(self) -> int:
        return int(self._info["peer_hits"])

    @property
    def admits(self) -> int:
        return int(self._info["admits"])

    @property
    def bypasses(self) -> int:
        return int(self._info["bypasses"])

    @property
    def storage_reads(self) -> int:
        """Admits and bypasses (LATE reads included)."""
        return self.admits + self.bypasses

    @property
    def remote_admits(self) -> int:
        """Admits kept at a node other than the one that read them (one
        transfer each)."""
        return int(self._info["remote_admits"])

    @property
    def storage_bytes(self) -> int:
        return int(self._info["storage_bytes"])

    @property
    def peer_bytes(self) -> int:
        """Every transfer between nodes, counted once (peer hits and admits
        kept away from their reader)."""
        return int(self._info["peer_bytes"])

    @property
    def checksum(self) -> int:
        """XXH3-64 of the plan's fingerprint, the capacities and every
        position's reader, kind and node."""
        return int(self._info["checksum"])

    def node_stats(self) -> list[dict[str, int]]:
        """Per node, the counts of :data:`NODE_KEYS`."""
        out = []
        for n, d in enumerate(self._per_node):
            out.append({
                "capacity": int(self.capacities[n]),
                "accesses": d["accesses"],
                "local_hits": d["local_hits"],
                "peer_hits": d["peer_hits"],
                "storage_reads": d["admits"] + d["bypasses"],
                "admits": d["admits"],
                "bypasses": d["bypasses"],
                "plan_storage_bytes": d["storage_bytes"],
                "homed": d["homed"],
                "peer_items_sent": d["peer_items_sent"],
                "peer_items_received": d["peer_items_received"],
                "peer_bytes_sent": d["peer_bytes_sent"],
                "peer_bytes_received": d["peer_bytes_received"],
                "peak_resident": d["peak_resident"],
                "late": d["late"],
                "warm": d["warm"],
            })
        return out

    def stats(self) -> dict[str, Any]:
        """Totals and per-node counts as plain JSON-ready values."""
        T = self.accesses
        return {
            "accesses": T,
            "nodes": self.n_nodes,
            "alone": self.alone,
            "capacity": int(self._info["capacity"]),
            "hits": self.hits,
            "local_hits": self.local_hits,
            "peer_hits": self.peer_hits,
            "admits": self.admits,
            "bypasses": self.bypasses,
            "remote_admits": self.remote_admits,
            "page_size": self.page_size,
            "unplaced": self.unplaced,
            "unplaced_hits": self.unplaced_hits,
            "window": self.window,
            "late": self.late,
            "warm": int(self._info["warm"]),
            "hit_rate": self.hits / T if T else 0.0,
            "local_hit_rate": self.local_hits / T if T else 0.0,
            "peer_hit_rate": self.peer_hits / T if T else 0.0,
            "storage_bytes": self.storage_bytes,
            "peer_bytes": self.peer_bytes,
            "checksum": f"{self.checksum:016x}",
            "per_node": self.node_stats(),
        }

    def __repr__(self) -> str:
        T = max(self.accesses, 1)
        return (f"<{type(self).__name__} {self.accesses} accesses over {self.n_nodes} nodes, capacity "
                f"{int(self._info['capacity'])}: local {self.local_hits / T:.4f}, peer {self.peer_hits / T:.4f}, "
                f"storage {self.storage_reads / T:.4f}>")
