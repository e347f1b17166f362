"""The pure-Python reference of cluster plans: the oracle that
``opt4torch.cluster_plan`` (the C engine's ``opt4_cluster_place``) is held to,
position by position.

The rule, in the plainest code (``include/opt4.h`` and docs/cluster.md say why
it always fits):

1. Belady with bypass over the global timeline at the nodes' total capacity
   (:func:`opt4torch.lab.reference.belady`) fixes which accesses hit.
2. A generation is an ADMIT and the HITs that read it after it; it holds one
   item of its home node's capacity from its ADMIT to its last read. An ADMIT
   that no HIT reads is a BYPASS: keeping it would serve nothing.
3. A generation's home, chosen at its ADMIT among the nodes with room: the
   node that reads it next; else the node that reads it now; else the node
   with the most room, the lowest id on ties.
4. With windows (``window_of``, each position's transfer window): a
   generation admitted in window w is read by its home from window w + 2
   when the home is not the node that admitted it (from its ADMIT on when
   it is), and by another node from one window after its home could send
   it (w + 1 for the node that admitted it, w + 2 for another home), so from
   w + 2 or w + 3. Earlier reads are LATE (from storage). Rule 3's first
   choice, the next reader's node, is taken only if it is the reader's own
   or its read is in window w + 2 or later. A generation kept away from
   the node that read it that ends with no read in time was sent for
   nothing: its ADMIT becomes a BYPASS, and nothing is sent.

5. A warm prefix (``prefix``, a resumed run's): positions before it are
   not reads but what each reader's node holds at the start. A kept one
   (an ADMIT of the aggregate plan) stays at that node, if it has room (else
   it is dropped, ``unplaced``); its home reads it at once and a peer from
   ``window_of[0] + 1``. Prefix positions count in no figure but ``warm``
   (and ``homed``, ``peak_resident``).

In bytes (``page_size`` and ``plan_sizes`` given) the aggregate plan is
:func:`~opt4torch.lab.reference.belady_sized` over the nodes' pages, room is
free pages, and a generation no node has enough free pages for is read from
storage at each of its accesses (``unplaced``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .reference import ADMIT as PLAN_ADMIT
from .reference import HIT as PLAN_HIT
from .reference import belady, belady_sized, next_uses

__all__ = ["LOCAL_HIT", "PEER_HIT", "ADMIT", "BYPASS", "LATE", "NODE_KEYS", "ReferenceCluster", "cluster_place"]

LOCAL_HIT, PEER_HIT, ADMIT, BYPASS, LATE = 0, 1, 2, 3, 4

#: Per-node counts, named as the C engine's opt4_cluster_node fields.
NODE_KEYS = ("accesses", "local_hits", "peer_hits", "admits", "bypasses", "storage_bytes", "homed",
             "peer_items_sent", "peer_items_received", "peer_bytes_sent", "peer_bytes_received",
             "peak_resident", "late", "warm")


@dataclass
class ReferenceCluster:
    """Per position: the kind and the node (home of an ADMIT, the holder a HIT
    reads, -1 for a BYPASS); per node: the counts of :data:`NODE_KEYS`."""

    kinds: list[int] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    per_node: list[dict[str, int]] = field(default_factory=list)
    remote_admits: int = 0
    unplaced: int = 0
    unplaced_hits: int = 0
    late: int = 0
    warm: int = 0


def cluster_place(seq: Sequence[int], node_of: Sequence[int], capacities: Sequence[int], *,
                  item_sizes: Sequence[int] | None = None, item_bytes: int = 0,
                  items: int | None = None, page_size: int | None = None,
                  plan_sizes: Sequence[int] | None = None,
                  window_of: Sequence[int] | None = None, prefix: int = 0) -> ReferenceCluster:
    """Plan ``seq`` (the global timeline; ``node_of[t]`` reads position t)
    over nodes holding ``capacities[n]`` items each (pages of ``page_size``
    bytes each, with ``plan_sizes`` the items' sizes for the plan)."""
    seq = [int(x) for x in seq]
    node_of = [int(n) for n in node_of]
    caps = [int(c) for c in capacities]
    if len(node_of) != len(seq):
        raise ValueError("node_of needs one node per position")
    total = sum(caps)
    sized = page_size is not None
    if sized:
        assert plan_sizes is not None
        plan = belady_sized(seq, plan_sizes, total * page_size, page_size)
        need = [max(1, -(-int(v) // page_size)) for v in plan_sizes]
    else:
        plan = belady(seq, total, bypass=True, items=items)
        need = [1] * (max(seq) + 1 if seq else 1)
    kinds_plan = [kind for kind, _ in plan.ops]
    nxt = next_uses(seq)
    never = len(seq)
    out = ReferenceCluster(per_node=[dict.fromkeys(NODE_KEYS, 0) for _ in caps])
    live = [0] * len(caps)
    home: dict[int, int] = {}
    #: With windows: per item, its generation's ADMIT position and window,
    #: whether it was kept away from the node that read it, and whether a
    #: read of it has been in time.
    admitted: dict[int, list[int]] = {}

    def in_time(x: int, h: int, reader: int, w: int) -> bool:
        _, at, away, _ = admitted[x]
        if admitted[x][0] < prefix:  # held from the start
            return reader == h or w >= int(window_of[0]) + 1  # type: ignore[index]
        if reader == h:
            return not away or w >= at + 2
        return w >= at + 2 + away

    def forward_undo(x: int, h: int, size: int) -> None:
        s, _, away, served = admitted[x]
        if not away or served:
            return
        r = node_of[s]
        out.kinds[s], out.nodes[s] = BYPASS, -1
        out.per_node[r]["admits"] -= 1
        out.per_node[r]["bypasses"] += 1
        out.per_node[h]["homed"] -= 1
        out.remote_admits -= 1
        for key, d in (("sent", r), ("received", h)):
            out.per_node[d][f"peer_items_{key}"] -= 1
            out.per_node[d][f"peer_bytes_{key}"] -= size

    def size_of(x: int) -> int:
        if item_sizes is not None:
            return int(item_sizes[x])
        if sized and item_bytes == 0:
            return int(plan_sizes[x])  # type: ignore[index]
        return item_bytes

    def transfer(src: int, dst: int, size: int) -> None:
        out.per_node[src]["peer_items_sent"] += 1
        out.per_node[src]["peer_bytes_sent"] += size
        out.per_node[dst]["peer_items_received"] += 1
        out.per_node[dst]["peer_bytes_received"] += size

    if len(set(seq[:prefix])) < prefix:
        raise ValueError("an item twice in the warm prefix")
    for t, x in enumerate(seq):
        r = node_of[t]
        me = out.per_node[r]
        size = size_of(x)
        goes_on = nxt[t] != never and kinds_plan[nxt[t]] == PLAN_HIT
        if t < prefix:
            if kinds_plan[t] == PLAN_ADMIT and goes_on and caps[r] - live[r] >= need[x]:
                live[r] += need[x]
                me["peak_resident"] = max(me["peak_resident"], live[r])
                me["homed"] += 1
                me["warm"] += 1
                out.warm += 1
                home[x] = r
                admitted[x] = [t, 0, 0, 0]
                out.kinds.append(ADMIT)
                out.nodes.append(r)
                continue
            if kinds_plan[t] == PLAN_ADMIT and goes_on:  # no room where it is: dropped
                home[x] = -1
                out.unplaced += 1
            out.kinds.append(BYPASS)
            out.nodes.append(-1)
            continue
        me["accesses"] += 1
        if kinds_plan[t] == PLAN_HIT and home.get(x, -1) >= 0:
            h = home[x]
            if window_of is not None and not in_time(x, h, r, int(window_of[t])):
                out.kinds.append(LATE)
                me["late"] += 1
                me["bypasses"] += 1
                me["storage_bytes"] += size
                out.late += 1
            else:
                if window_of is not None:
                    admitted[x][3] = 1
                if h == r:
                    out.kinds.append(LOCAL_HIT)
                    me["local_hits"] += 1
                else:
                    out.kinds.append(PEER_HIT)
                    me["peer_hits"] += 1
                    transfer(h, r, size)
            out.nodes.append(h)
            if not goes_on:
                live[h] -= need[x]
                del home[x]
                if window_of is not None:
                    forward_undo(x, h, size)
            continue
        me["storage_bytes"] += size
        if kinds_plan[t] == PLAN_HIT:  # a generation that found no home
            out.unplaced_hits += 1
            if not goes_on:
                del home[x]
        if kinds_plan[t] != PLAN_ADMIT or not goes_on:
            out.kinds.append(BYPASS)
            out.nodes.append(-1)
            me["bypasses"] += 1
            continue
        candidates = [node_of[nxt[t]], r]
        if window_of is not None and candidates[0] != r and window_of[nxt[t]] < window_of[t] + 2:
            candidates = [r]  # the next reader's node cannot get it in time
        h = next((n for n in candidates if caps[n] - live[n] >= need[x]), None)
        if h is None:
            h = max(range(len(caps)), key=lambda n: (caps[n] - live[n], -n))
        if caps[h] - live[h] < need[x]:
            if not sized:
                raise AssertionError(f"at position {t} every node is full")
            home[x] = -1
            out.unplaced += 1
            out.kinds.append(BYPASS)
            out.nodes.append(-1)
            me["bypasses"] += 1
            continue
        live[h] += need[x]
        out.per_node[h]["peak_resident"] = max(out.per_node[h]["peak_resident"], live[h])
        out.per_node[h]["homed"] += 1
        home[x] = h
        if window_of is not None:
            admitted[x] = [t, int(window_of[t]), int(h != r), 0]
        out.kinds.append(ADMIT)
        out.nodes.append(h)
        me["admits"] += 1
        if h != r:
            out.remote_admits += 1
            transfer(r, h, size)
    return out
