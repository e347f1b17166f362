"""The pure-Python reference backend: the oracle the C engine is tested against.

Everything here is written to be obviously right, not fast: dicts, lists,
heapq and linear scans. It implements the same semantics as the engine,
decision by decision (``include/opt4.h``, docs/algorithm.md), so the two can be
compared on any trace; it is also the ``"python"`` mode, the debug path. The
online policies' rules, with their sources and integer choices, are in
docs/policies.md.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "HIT",
    "ADMIT",
    "BYPASS",
    "ReferencePlan",
    "next_uses",
    "belady",
    "belady_sized",
    "simulate",
    "POLICIES",
    "SplitMix64",
]

HIT, ADMIT, BYPASS = 0, 1, 2


def next_uses(seq: Sequence[int]) -> list[int]:
    """next[t]: the next position after t holding the same id, or len(seq)."""
    never = len(seq)
    nxt = [never] * len(seq)
    last: dict[int, int] = {}
    for t in range(len(seq) - 1, -1, -1):
        nxt[t] = last.get(seq[t], never)
        last[seq[t]] = t
    return nxt


@dataclass
class ReferencePlan:
    """Decisions per position as (kind, slot); slot is -1 for BYPASS."""

    ops: list[tuple[int, int]] = field(default_factory=list)
    hits: int = 0
    admits: int = 0
    bypasses: int = 0
    compulsory: int = 0

    @property
    def misses(self) -> int:
        return self.admits + self.bypasses

    def encoded(self) -> np.ndarray:
        """The ops in the engine's uint32 encoding (kind << 30 | slot)."""
        return np.array(
            [(kind << 30) | (slot if kind != BYPASS else 0) for kind, slot in self.ops],
            dtype=np.uint32,
        )


def belady(seq: Sequence[int], capacity: int, bypass: bool = True, items: int | None = None) -> ReferencePlan:
    """Belady's OPT with the engine's exact semantics.

    Free slots form a stack with slot 0 on top. A hit on an id that is never
    used again frees its slot. A miss on such an id is bypassed (with bypass)
    or admitted and its slot freed at once (without). Otherwise a miss takes a
    free slot if there is one, else evicts the resident id whose next use is
    farthest, unless (with bypass) the new id's next use is farther still.
    """
    seq = [int(x) for x in seq]
    if capacity < 1:
        raise ValueError("capacity must be at least 1")
    if items is None:
        items = max(seq) + 1 if seq else 1
    never = len(seq)
    nxt = next_uses(seq)
    plan = ReferencePlan(compulsory=len(set(seq)))
    free = list(range(min(capacity, items) - 1, -1, -1))  # pop() gives 0 first
    slot_of: dict[int, int] = {}  # live resident id -> slot
    key_of: dict[int, int] = {}  # live resident id -> next use
    heap: list[tuple[int, int]] = []  # (-next use, id), stale entries skipped

    for t, x in enumerate(seq):
        n = nxt[t]
        if x in slot_of:
            s = slot_of[x]
            plan.ops.append((HIT, s))
            plan.hits += 1
            if n == never:
                del slot_of[x], key_of[x]
                free.append(s)
            else:
                key_of[x] = n
                heapq.heappush(heap, (-n, x))
            continue
        if n == never and bypass:
            plan.ops.append((BYPASS, -1))
            plan.bypasses += 1
            continue
        if free:
            s = free.pop()
        else:
            while key_of.get(heap[0][1]) != -heap[0][0]:
                heapq.heappop(heap)
            far, victim = -heap[0][0], heap[0][1]
            if bypass and far < n:
                plan.ops.append((BYPASS, -1))
                plan.bypasses += 1
                continue
            heapq.heappop(heap)
            s = slot_of.pop(victim)
            del key_of[victim]
        plan.ops.append((ADMIT, s))
        plan.admits += 1
        if n == never:
            free.append(s)
        else:
            slot_of[x] = s
            key_of[x] = n
            heapq.heappush(heap, (-n, x))
    return plan


def belady_sized(seq: Sequence[int], sizes: Sequence[int], capacity_bytes: int, page_size: int,
                 bypass: bool = True) -> ReferencePlan:
    """Size-aware Belady with the engine's exact semantics (sized plans).

    The pool has ``capacity_bytes // page_size`` pages; item x takes
    ``ceil(sizes[x] / page_size)`` (at least 1). Free pages form a stack with
    page 0 on top. On a miss with too few free pages, victims are taken from
    the farthest next use down until enough pages would be free; with bypass,
    if a victim is needed sooner than the new item, nothing is evicted and it
    is bypassed. Ops are (kind, generation); ``pages[g]`` lists generation
    g's pages.
    """
    seq = [int(x) for x in seq]
    total = capacity_bytes // page_size
    need = [max(1, -(-int(s) // page_size)) for s in sizes]
    never = len(seq)
    nxt = next_uses(seq)
    plan = ReferencePlan(compulsory=len(set(seq)))
    plan.pages = []  # type: ignore[attr-defined]
    free = list(range(total - 1, -1, -1))
    gen_of: dict[int, int] = {}  # live resident id -> generation
    key_of: dict[int, int] = {}  # live resident id -> next use
    for t, x in enumerate(seq):
        n = nxt[t]
        if x in gen_of:
            g = gen_of[x]
            plan.ops.append((HIT, g))
            plan.hits += 1
            if n == never:
                del gen_of[x], key_of[x]
                free.extend(plan.pages[g])  # type: ignore[attr-defined]
            else:
                key_of[x] = n
            continue
        if n == never and bypass:
            plan.ops.append((BYPASS, -1))
            plan.bypasses += 1
            continue
        if len(free) < need[x]:
            victims, got = [], len(free)
            for y in sorted(key_of, key=lambda y: -key_of[y]):  # farthest first
                if got >= need[x]:
                    break
                if bypass and key_of[y] < n:
                    break
                victims.append(y)
                got += need[y]
            if got < need[x]:
                plan.ops.append((BYPASS, -1))
                plan.bypasses += 1
                continue
            for y in victims:
                free.extend(plan.pages[gen_of[y]])  # type: ignore[attr-defined]
                del gen_of[y], key_of[y]
        g = plan.admits
        plan.pages.append([free.pop() for _ in range(need[x])])  # type: ignore[attr-defined]
        plan.ops.append((ADMIT, g))
        plan.admits += 1
        if n == never:
            free.extend(plan.pages[g])  # type: ignore[attr-defined]
        else:
            gen_of[x] = g
            key_of[x] = n
    return plan


class SplitMix64:
    """The engine's random generator (splitmix64), so seeded policies agree."""

    MASK = (1 << 64) - 1

    def __init__(self, seed: int) -> None:
        self.state = seed & self.MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return z ^ (z >> 31)


# ---- online policies: each returns the number of hits ----


def _lru(seq: Sequence[int], capacity: int, seed: int) -> int:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for x in seq:
        if x in cache:
            hits += 1
            cache.move_to_end(x)
            continue
        if len(cache) == capacity:
            cache.popitem(last=False)
        cache[x] = None
    return hits


def _fifo(seq: Sequence[int], capacity: int, seed: int) -> int:
    queue: deque[int] = deque()
    resident: set[int] = set()
    hits = 0
    for x in seq:
        if x in resident:
            hits += 1
            continue
        if len(queue) == capacity:
            resident.discard(queue.popleft())
        queue.append(x)
        resident.add(x)
    return hits


def _lfu(seq: Sequence[int], capacity: int, seed: int) -> int:
    """Evict the fewest accesses since admission; ties: least recently used."""
    count: dict[int, int] = {}
    last: dict[int, int] = {}
    hits = 0
    for t, x in enumerate(seq):
        if x in count:
            hits += 1
            count[x] += 1
            last[x] = t
            continue
        if len(count) == capacity:
            victim = min(count, key=lambda y: (count[y], last[y]))
            del count[victim], last[victim]
        count[x] = 1
        last[x] = t
    return hits


def _random(seq: Sequence[int], capacity: int, seed: int) -> int:
    """Evict a uniformly random resident: index rng() % size of the resident
    array, and the new id takes the victim's place in it."""
    rng = SplitMix64(seed)
    resident: list[int] = []
    where: dict[int, int] = {}
    hits = 0
    for x in seq:
        if x in where:
            hits += 1
            continue
        if len(resident) == capacity:
            i = rng.next() % len(resident)
            del where[resident[i]]
            resident[i] = x
            where[x] = i
        else:
            where[x] = len(resident)
            resident.append(x)
    return hits


def _clock(seq: Sequence[int], capacity: int, seed: int) -> int:
    """CLOCK as FIFO with reinsertion (second chance): a new id enters at the
    tail of the queue with its reference bit clear; a hit sets the bit; to
    evict, an id at the head whose bit is set has it cleared and goes to the
    tail, and the first id found with a clear bit is evicted."""
    queue: deque[int] = deque()  # left: the oldest
    ref: dict[int, int] = {}  # resident id -> reference bit
    hits = 0
    for x in seq:
        if x in ref:
            hits += 1
            ref[x] = 1
            continue
        if len(ref) == capacity:
            while ref[queue[0]]:
                y = queue.popleft()
                ref[y] = 0
                queue.append(y)
            del ref[queue.popleft()]
        queue.append(x)
        ref[x] = 0
    return hits


def _sieve(seq: Sequence[int], capacity: int, seed: int) -> int:
    """SIEVE (Zhang et al., NSDI'24): a FIFO queue that never reorders on a
    hit. A hit sets the id's visited bit. The hand starts at the oldest id and
    walks towards newer ones, clearing visited bits, wrapping from the newest
    back to the oldest; it evicts the first unvisited id and stays at the next
    newer one (or wraps to the oldest if the victim was the newest)."""
    queue: list[int] = []  # index 0: the oldest, the end: the newest
    visited: dict[int, bool] = {}
    hand = 0
    hits = 0
    for x in seq:
        if x in visited:
            hits += 1
            visited[x] = True
            continue
        if len(queue) == capacity:
            i = hand
            while visited[queue[i]]:
                visited[queue[i]] = False
                i = i + 1 if i + 1 < len(queue) else 0
            del visited[queue.pop(i)]
            hand = i if i < len(queue) else 0
        queue.append(x)
        visited[x] = False
    return hits


def _s3fifo(seq: Sequence[int], capacity: int, seed: int) -> int:
    """S3-FIFO (Yang et al., SOSP'23, Algorithm 1): a small FIFO S, a main
    FIFO M and a ghost FIFO G of ids. Frequencies count hits since admission,
    capped at 3. A miss first evicts (if the cache is full), then enters M if
    its id is in G (leaving G), else S, with frequency 0. Evict: if
    10 * |S| >= capacity (|S| >= 10 % of the cache), take S's oldest: with a
    frequency above 1 it moves to M (frequency reset to 0) and the next is
    tried; else it is evicted and its id enters G (G keeps the newest
    capacity - ceil(capacity / 10) ids). If S did not evict (it was below
    10 % or ran empty), take M's oldest: with a frequency above 0 it is
    reinserted with frequency - 1, else evicted."""
    small_target = (capacity + 9) // 10  # ceil(capacity / 10)
    ghost_cap = capacity - small_target
    small: deque[int] = deque()  # left: the oldest
    main: deque[int] = deque()
    ghost: deque[int] = deque()
    freq: dict[int, int] = {}  # resident id -> frequency
    hits = 0

    def evict() -> None:
        if 10 * len(small) >= capacity:
            while small:
                t = small.popleft()
                if freq[t] > 1:
                    freq[t] = 0
                    main.append(t)
                    continue
                del freq[t]
                ghost.append(t)
                if len(ghost) > ghost_cap:
                    ghost.popleft()
                return
        while True:
            t = main.popleft()
            if freq[t] > 0:
                freq[t] -= 1
                main.append(t)
            else:
                del freq[t]
                return

    for x in seq:
        if x in freq:
            hits += 1
            freq[x] = min(freq[x] + 1, 3)
            continue
        if len(freq) == capacity:
            evict()
        if x in ghost:
            ghost.remove(x)
            main.append(x)
        else:
            small.append(x)
        freq[x] = 0
    return hits


def _arc(seq: Sequence[int], capacity: int, seed: int) -> int:
    """ARC (Megiddo and Modha, FAST'03, Fig. 4) with an integer target p:
    on a hit in B1, p = min(p + max(1, |B2| // |B1|), c); in B2,
    p = max(p - max(1, |B1| // |B2|), 0) (floor division, computed while the
    id is still in its ghost list). Lists are LRU first, MRU last."""
    c = capacity
    t1: OrderedDict[int, None] = OrderedDict()
    t2: OrderedDict[int, None] = OrderedDict()
    b1: OrderedDict[int, None] = OrderedDict()
    b2: OrderedDict[int, None] = OrderedDict()
    p = 0
    hits = 0

    def replace(in_b2: bool) -> None:
        if t1 and ((in_b2 and len(t1) == p) or len(t1) > p):
            b1[t1.popitem(last=False)[0]] = None
        else:
            b2[t2.popitem(last=False)[0]] = None

    for x in seq:
        if x in t1:
            hits += 1
            del t1[x]
            t2[x] = None
        elif x in t2:
            hits += 1
            t2.move_to_end(x)
        elif x in b1:
            p = min(p + max(1, len(b2) // len(b1)), c)
            replace(False)
            del b1[x]
            t2[x] = None
        elif x in b2:
            p = max(p - max(1, len(b1) // len(b2)), 0)
            replace(True)
            del b2[x]
            t2[x] = None
        else:
            if len(t1) + len(b1) == c:
                if len(t1) < c:
                    b1.popitem(last=False)
                    replace(False)
                else:
                    t1.popitem(last=False)
            else:
                total = len(t1) + len(t2) + len(b1) + len(b2)
                if total >= c:
                    if total == 2 * c:
                        b2.popitem(last=False)
                    replace(False)
            t1[x] = None
    return hits


def _static(seq: Sequence[int], capacity: int, seed: int) -> int:
    """A static cache (CoorDL's MinIO): admit misses until full, then never
    evict; later misses bypass. It ends up holding the first capacity
    distinct ids of the trace."""
    cache: set[int] = set()
    hits = 0
    for x in seq:
        if x in cache:
            hits += 1
        elif len(cache) < capacity:
            cache.add(x)
    return hits


def _freq(seq: Sequence[int], capacity: int, seed: int) -> int:
    """NoPFS's placement: cache the capacity ids accessed most often over the
    whole trace (ties: the lower id), each admitted at its first access (a
    miss, as in every policy here); other ids always bypass."""
    count: dict[int, int] = {}
    for x in seq:
        count[x] = count.get(x, 0) + 1
    chosen = set(sorted(count, key=lambda y: (-count[y], y))[:capacity])
    loaded: set[int] = set()
    hits = 0
    for x in seq:
        if x in loaded:
            hits += 1
        elif x in chosen:
            loaded.add(x)
    return hits


def _opt(seq: Sequence[int], capacity: int, seed: int) -> int:
    return belady(seq, capacity, bypass=True).hits


def _opt_nobypass(seq: Sequence[int], capacity: int, seed: int) -> int:
    return belady(seq, capacity, bypass=False).hits


POLICIES: dict[str, Callable[[Sequence[int], int, int], int]] = {
    "opt": _opt,
    "opt-nobypass": _opt_nobypass,
    "lru": _lru,
    "fifo": _fifo,
    "lfu": _lfu,
    "random": _random,
    "clock": _clock,
    "sieve": _sieve,
    "s3fifo": _s3fifo,
    "arc": _arc,
    "static": _static,
    "freq": _freq,
}


def simulate(policy: str, seq: Sequence[int], capacity: int, seed: int = 0) -> int:
    """Hits of ``policy`` on ``seq`` at ``capacity`` items."""
    if capacity < 1:
        raise ValueError("capacity must be at least 1")
    try:
        fn = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}") from None
    return fn([int(x) for x in seq], capacity, seed)
