"""Building a loader's plan and pool, from the arguments to a running cache.

The steps, in order: capture the order (every epoch, batch by batch, from
the sampler), make it one sequence (with ``share_across_ranks``, the node's
ranks interleaved), size the items and plan OPT over the sequence, then make
the pool (or, for ranks sharing one, attach the node's). A cluster's build
is distributed/setup.py's, handed the same pieces. What comes out is one
frozen :class:`Built`, which the DataLoader wires in one place. May touch:
the sampler (captured with its RNG states restored), the dataset (its
length, a few items to size them), the planner, pools, torch.distributed
for a node's ranks.
"""

from __future__ import annotations

import json
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from ..planning.capture import as_index, preserved, capture_epochs
from ..planning.plan import Plan, plan as build_plan
from ..planning.sizing import choose_page, handover_spare, item_sizes, parse_bytes, staging_slots
from ..pool.cache import OPTCache
from ..pool.codec import encode, encoded_size
from ..sources.base import ReadUnits
from .checks import Options, refuse_one_shot
from .elastic import resumable
from .replan import ReplanContext

__all__ = ["Built", "build_cluster", "build_local", "capture_order", "layout_digest", "probe_item_bytes"]


@dataclass(frozen=True)
class Built:
    """What a DataLoader runs on, however it was built."""

    cache: OPTCache
    #: Per epoch: this loader's batches (their first positions and lengths)
    #: and the epoch's first position.
    starts: list[np.ndarray]
    own: list[np.ndarray]
    floors: list[int]
    #: The seed that shuffled the order (given or drawn; None for a
    #: sampler's or a generator's order), and whether it was drawn here.
    seed: int | None
    seed_drawn: bool
    #: The node's process group (held weakly), this rank in it and its size,
    #: for ranks sharing one pool; None otherwise.
    group: tuple[weakref.ref[Any], int, int] | None
    #: What a re-plan needs, for a loader that may re-plan (else None).
    replan: ReplanContext | None
    #: A cluster's plan and this rank's node in it (cluster=True), else None.
    cluster_plan: Any = None
    node: int | None = None
    #: This node's part of that plan (a NodePlan), else None.
    node_plan: Any = None
    #: What the pool holds items of, and the transform after the cache,
    #: where they differ from the loader's (a :class:`ReadUnits` source's
    #: units, and the step that takes a position's row from its unit).
    units: tuple[Any, Any] | None = None
    #: The DistributedSampler whose order this loader replays, rank by rank
    #: (a cluster's, or one given as sampler= to a loader of its own pool;
    #: torch's class itself, :func:`~opt4torch.loader.elastic.resumable`):
    #: its states resume on another world (loader/elastic.py). Else None.
    dist_sampler: Any = None

    @property
    def rank(self) -> int:
        return self.group[1] if self.group is not None else 0


def probe_item_bytes(dataset: Any, seq: np.ndarray, allow_pickle: bool, probes: int = 16) -> tuple[int, int]:
    """Encoded sizes of a few items spread over the sequence: (min, max)."""
    picks = np.unique(seq[np.linspace(0, seq.size - 1, num=min(probes, seq.size)).astype(np.int64)])
    sizes = [encoded_size(encode(dataset[int(i)], allow_pickle)) for i in picks]
    return min(sizes), max(sizes)


def layout_digest(starts: list[np.ndarray], lengths: list[np.ndarray], floors: list[int], *,
                   shared: bool) -> int:
    """64 bits naming how the sequence splits into epochs (each one's first
    position and sample count) and, for ranks sharing one sequence, which
    runs of positions are this rank's. Batch sizes do not enter, except
    through those runs: a state resumes across batch sizes by position."""
    import hashlib

    h = hashlib.blake2b(digest_size=8)
    h.update(np.array(floors, dtype=np.int64).tobytes())
    h.update(np.array([int(lens.sum()) for lens in lengths], dtype=np.int64).tobytes())
    for e, lens in enumerate(lengths if shared else ()):
        if lens.size:
            s = np.asarray(starts[e], dtype=np.int64)
            ends = s + lens
            cut = np.flatnonzero(s[1:] != ends[:-1]) + 1  # where a run of this rank's positions breaks
            h.update(s[np.r_[0, cut]].tobytes())
            h.update(ends[np.r_[cut - 1, ends.size - 1]].tobytes())
    return int.from_bytes(h.digest(), "little")


def capture_order(dataset: Any, batch_size: int | None, shuffle: bool | None, sampler: Any,
             batch_sampler: Any, drop_last: bool, generator: Any, epochs: int, seed: int | None,
             progress: bool | None) -> tuple[list[np.ndarray], list[np.ndarray], str, int | None]:
    """Every epoch's indices and batch lengths, the sampler's name, and
    the seed that shuffled them: ``seed``, or the one drawn here for
    ``shuffle=True`` without one (None when the order is a sampler's or
    a generator's)."""
    if batch_sampler is not None:
        if batch_size not in (1, None) or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last")
        refuse_one_shot(batch_sampler, "batch_sampler")
        idx, lengths = [], []
        inner = getattr(batch_sampler, "sampler", batch_sampler)
        with preserved(inner), preserved(batch_sampler):
            for e in range(epochs):
                for s in {id(batch_sampler): batch_sampler, id(inner): inner}.values():
                    if callable(getattr(s, "set_epoch", None)):
                        s.set_epoch(e)
                batches = [list(map(as_index, b)) for b in batch_sampler]
                lengths.append(np.array([len(b) for b in batches], dtype=np.int64))
                idx.append(np.array([i for b in batches for i in b], dtype=np.int64))
        return idx, lengths, type(batch_sampler).__name__, None
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if sampler is not None:
        refuse_one_shot(sampler, "sampler")
    used: int | None = None
    if sampler is None:
        if shuffle:
            if generator is None:
                if seed is None:
                    seed = int(torch.empty((), dtype=torch.int64).random_().item())
                used = int(seed)
                generator = torch.Generator().manual_seed(used)
            sampler = tud.RandomSampler(dataset, generator=generator)
        else:
            sampler = tud.SequentialSampler(dataset)
    idx, lengths = [], []
    with warnings.catch_warnings():
        # An unseeded sampler is fine here: this loader replays what it
        # captured, whatever the global RNG does later.
        warnings.filterwarnings("ignore", message="the RandomSampler has no generator")
        parts = capture_epochs(sampler, epochs, progress=progress)
    for part in parts:
        if batch_size is None:
            lengths.append(np.ones(part.size, dtype=np.int64))
        else:
            full, rest = divmod(part.size, batch_size)
            if drop_last:
                part = part[: full * batch_size]
                rest = 0
            lens = np.full(full, batch_size, dtype=np.int64)
            lengths.append(np.append(lens, rest) if rest else lens)
        idx.append(part)
    return idx, lengths, type(sampler).__name__, used


def sequence_of(dataset: Any, o: Options, per_epoch: tuple[list[np.ndarray], list[np.ndarray], str, int | None]
                ) -> tuple[np.ndarray, list[np.ndarray], list[int], list[np.ndarray], str, int | None,
                           tuple[Any, int, int] | None]:
    """Step 1: the index order for every epoch, as one sequence. Returns the
    sequence, this loader's batch starts and lengths per epoch, the epochs'
    first positions, the sampler's name, the seed used, and (ranks sharing
    a pool) the node's group, this rank and their count."""
    per_epoch_idx, per_epoch_lengths, desc_sampler, used_seed = per_epoch
    node = None
    if o.share_across_ranks:
        from ..distributed.node import interleave_ranks, node_group

        node = node_group()
        seq, starts, floors, own = interleave_ranks(per_epoch_idx, per_epoch_lengths, *node)
    else:
        seq = np.concatenate(per_epoch_idx) if per_epoch_idx else np.empty(0, np.int64)
        starts, floors = [], []
        offset = 0
        for lengths in per_epoch_lengths:
            floors.append(offset)
            starts.append(offset + np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
                          if lengths.size else np.empty(0, np.int64))
            offset += int(lengths.sum())
        own = per_epoch_lengths
    if seq.size == 0:
        raise ValueError("the sampler yields no indices: nothing to cache")
    return seq, starts, floors, own, desc_sampler, used_seed, node


def planner(dataset: Any, o: Options, seq: np.ndarray, desc: str,
            node: tuple[Any, int, int] | None) -> tuple[Callable[[np.ndarray], Plan], int]:
    """Step 2: how large an item is, one size for all (every item gets that
    many bytes) or a size per item (a plan in bytes over pages); returns
    the planner of a sequence and the pool's page (0: the plan's)."""
    n_items = len(dataset)
    item_bytes = o.item_bytes
    sizes = item_sizes(dataset, item_bytes, n_items, o.progress)
    if sizes is not None and o.cache_items is not None and item_bytes is None:
        # The dataset knows its items' sizes, but the cache was given in
        # items: every item gets the largest one's space.
        item_bytes = int(sizes.max()) if sizes.size else 1
        sizes = None
    if sizes is not None:
        if o.cache_bytes is None:
            raise ValueError("per-item sizes need the cache size in bytes: give cache_bytes=")
        total = parse_bytes(o.cache_bytes)
        page = int(o.page_size) if o.page_size else choose_page(sizes[np.unique(seq)])

        def make_sized(s: np.ndarray) -> Plan:
            return build_plan(s, items=n_items, capacity_bytes=total, item_sizes=sizes, page_size=page,
                              bypass=o.bypass, progress=o.progress, description=desc)

        return make_sized, 0
    if item_bytes is None:
        item_bytes = measured_item_bytes(dataset, seq, o.allow_pickle, node)
    page = int(item_bytes)
    if page < 1:
        raise ValueError(f"item_bytes must be positive, got {item_bytes}")
    if o.cache_items is not None:
        capacity = int(o.cache_items)
    else:
        capacity = parse_bytes(o.cache_bytes) // page  # type: ignore[arg-type]
        if capacity < 1:
            raise ValueError(f"cache_bytes={o.cache_bytes!r} holds no item of {page} bytes: an "
                             "item needs at least that much")
    if capacity < 1:
        raise ValueError(f"cache_items must be at least 1, got {o.cache_items}")
    capacity = min(capacity, n_items)  # a cache larger than the data holds all of it

    def make_plan(s: np.ndarray) -> Plan:
        return build_plan(s, capacity, o.bypass, items=n_items, progress=o.progress, description=desc)

    return make_plan, page


def measured_item_bytes(dataset: Any, seq: np.ndarray, allow_pickle: bool, node: tuple[Any, int, int] | None) -> int:
    """One size for every item, measured on a few (the largest seen; every
    rank of a node agrees on it), with a warning when they differ."""
    lo, hi = probe_item_bytes(dataset, seq, allow_pickle)
    if node is not None:  # every rank must agree on the pool's layout
        group, _, world = node
        probe: list[Any] = [None] * world
        torch.distributed.all_gather_object(probe, (lo, hi), group=group)
        lo, hi = min(x[0] for x in probe), max(x[1] for x in probe)
    if lo != hi:
        warnings.warn(
            f"items differ in size (between {lo} and {hi} bytes in a sample): every cached "
            f"item is given {hi} bytes, and larger ones are loaded instead of cached; give "
            "item_bytes= a size per item (a sequence or a callable) to plan in bytes",
            RuntimeWarning, stacklevel=5)
    return hi


def make_pool(plan: Plan, pool_page: int, o: Options, staging: int, spare: int,
              node: tuple[Any, int, int] | None) -> OPTCache:
    """Step 3: the pool (one per node when shared across ranks: local rank
    0 creates it, the others attach by name)."""
    if node is None:
        return OPTCache(plan, pool_page, wait_timeout=o.wait_timeout, staging_slots=staging, spare_pages=spare)
    group, rank, _ = node
    name: list[Any] = [None]
    cache = None
    if rank == 0:
        cache = OPTCache(plan, pool_page, wait_timeout=o.wait_timeout, staging_slots=staging, spare_pages=spare)
        name = [cache.name]
    torch.distributed.broadcast_object_list(name, src=torch.distributed.get_global_rank(group, 0), group=group)
    if cache is None:
        cache = OPTCache.attach(name[0], plan, pool_page or plan.page_size)
    return cache


def build_local(dataset: Any, o: Options, transform: Callable[[Any], Any] | None = None) -> Built:
    """A loader's plan and pool, on this machine (alone, or shared by the
    node's ranks)."""
    per_epoch = capture_order(dataset, o.batch_size, o.shuffle, o.sampler, o.batch_sampler, o.drop_last,
                              o.generator, o.epochs, o.seed, o.progress)
    seq, starts, floors, own, desc_sampler, used_seed, node = sequence_of(dataset, o, per_epoch)
    units = None
    if isinstance(dataset, ReadUnits):
        # Rows smaller than a read (opt4torch.Parquet): the plan is over what
        # a read fetches, and each position's row is taken from its unit
        # after the cache (docs/algorithm.md, "Read units"). seq holds the
        # rows, the node's ranks' merged when they share a pool.
        dataset, after, seq = dataset.opt4_read_units(seq, transform)
        units = (dataset, after)
    desc = json.dumps({"sampler": desc_sampler, "epochs": o.epochs, "seed": used_seed,
                       "shared_ranks": o.share_across_ranks})
    make_plan, pool_page = planner(dataset, o, seq, desc, node)
    plan = make_plan(seq)
    staging = o.staging_slots
    if staging is None:
        staging = staging_slots(plan, pool_page) if o.prefetch else 0
    # Spare pages keep a prefetched ADMIT's pages read long before it
    # (handover_spare); without prefetch nobody hands over.
    spare_window = 0  # > 0: spare pages follow the plan (a re-plan computes them again)
    spare = o.spare_pages
    if spare is None:
        per_batch = int(o.batch_size or 1) if o.batch_sampler is None else int(own[0][:1].sum() or 1)
        spare_window = (max(o.num_workers, 1) + 1) * per_batch if o.prefetch else 0
        spare = handover_spare(plan, spare_window) if spare_window else 0
    elif isinstance(spare, bool) or not isinstance(spare, int) or spare < 0:
        raise ValueError(f"spare_pages must be a non-negative integer, got {spare!r}")
    cache = make_pool(plan, pool_page, o, staging, spare, node)
    # What a re-plan needs (epochs cut short, see replan.py). Not for ranks
    # sharing a pool (they would have to agree), or an unbatched loader (its
    # positions go to workers one by one, with nothing to say which pool
    # they are in).
    replan = None
    if node is None and o.batched and units is None:
        replan = ReplanContext(seq=seq, starts=list(starts), lengths=list(own), make_plan=make_plan,
                               pool_page=pool_page, wait_timeout=o.wait_timeout, staging_slots=staging,
                               spare_pages=spare, spare_window=spare_window,
                               prefetch=(dataset, o.prefetch_opts) if o.prefetch else None)
    # The node's process group, held weakly: a loader that kept it would
    # keep gloo's threads alive past destroy_process_group, to be torn
    # down in the interpreter's finalization, where a thread that drops a
    # collective's tensors dies taking the GIL and aborts the process
    # (std::terminate; seen as rank 1 of a torchrun test dying of SIGABRT).
    group = (weakref.ref(node[0]), node[1], node[2]) if node is not None else None
    dist_sampler = resumable(o.sampler) if node is None and units is None and o.batch_sampler is None else None
    return Built(cache=cache, starts=starts, own=own, floors=floors, seed=used_seed,
                 seed_drawn=o.seed is None and used_seed is not None, group=group, replan=replan,
                 units=units, dist_sampler=dist_sampler)


def build_cluster(dataset: Any, o: Options) -> Built:
    """``cluster=True`` (issue 18; docs/cluster.md): one plan over every
    node's memory. This rank's node keeps a pool that runs its part of
    the plan, and a transfer thread of the loader's own exchanges items
    with the other nodes, window by window of ``cluster_window`` steps,
    on a gloo group of its own with ``cluster_timeout`` seconds a
    collective. The node's ranks share its pool: its first rank makes
    it and runs the transfers, the others attach."""
    from ..distributed.setup import cluster_pool, cluster_setup

    if o.share_across_ranks:
        raise ValueError("cluster=True plans every node's pool itself: leave share_across_ranks off")
    if isinstance(dataset, ReadUnits):
        raise ValueError(f"{type(dataset).__name__} plans over read units, which cluster=True does not take yet: "
                         "give each node its own loader (cluster=False)")
    if o.batch_sampler is not None or o.batch_size is None or o.drop_last:
        raise ValueError("cluster=True needs batch_size= (a DistributedSampler's batches, the last one "
                         "short): batch_sampler, batch_size=None and drop_last are not supported with it")
    window, timeout = o.cluster_window, o.cluster_timeout
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"cluster_window must be a positive number of steps, got {window!r}")
    if not timeout > 0:
        raise ValueError(f"cluster_timeout must be positive seconds, got {timeout!r}")
    if o.cluster_alone not in (None, True, False):
        raise ValueError(f"cluster_alone must be None (alone where the cluster saves little), True or False, "
                         f"got {o.cluster_alone!r}")
    c = cluster_setup(dataset, batch_size=int(o.batch_size), shuffle=o.shuffle, sampler=o.sampler, seed=o.seed,
                      epochs=o.epochs, cache_bytes=o.cache_bytes, cache_items=o.cache_items,
                      item_bytes=o.item_bytes, page_size=o.page_size, allow_pickle=o.allow_pickle, window=window,
                      timeout=timeout, alone=o.cluster_alone, progress=o.progress, probe=probe_item_bytes)
    cache = cluster_pool(c, dataset, allow_pickle=o.allow_pickle, wait_timeout=o.wait_timeout,
                         staging=o.staging_slots, timeout=timeout, readers=int(o.prefetch_max_threads))
    seed = None if o.sampler is not None else (0 if o.seed is None else int(o.seed))  # cluster_setup's
    return Built(cache=cache, starts=c.starts, own=c.own, floors=c.floors, seed=seed, seed_drawn=False,
                 group=None, replan=None, cluster_plan=c.cp, node=c.node, node_plan=c.node_plan,
                 dist_sampler=resumable(c.sampler))
