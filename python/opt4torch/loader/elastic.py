"""Resuming a DistributedSampler run where its epoch's global order stopped,
on the world it was saved on or another one (docs/cluster.md, "Resuming a
cluster run, and elastic resume").

A DistributedSampler's order for an epoch does not depend on the world size
apart from its padding: rank r reads the (i * world + r)-th index of one
order of the dataset. With ranks stepping together, the samples consumed
after each rank read s of them are the first s * world of that order. So a
state names the epoch and that prefix (``state['distributed']``), and a
loader resumes it by planning again with :class:`ResumedSampler`: the rest of
the cut epoch split over this world, then the later epochs as a
DistributedSampler of this world gives them. The one way in is the
loader's rebuild (``_rebuilt``), as for a state saved under another drawn
seed; a cluster loader's rebuild plans the rest of the timeline over the
nodes of this job. May touch: the loader (rebuilt and adopted), a gloo
group of a cluster job's ranks (made for one all_gather to agree, then
destroyed).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from torch.utils.data.distributed import DistributedSampler

from ..planning.capture import capture_epochs, capture_ranks
from .checks import is_int

__all__ = ["ElasticResume", "ResumedSampler", "resumable"]


class ResumedSampler(DistributedSampler[int]):
    """A DistributedSampler resumed ``consumed`` samples into the global
    order of epoch ``cut_epoch``: that epoch yields the rest of its order
    split over ``num_replicas`` ranks as a DistributedSampler splits a whole
    one (padded from the order's start to a multiple of the world, or cut
    with ``drop_last``); earlier epochs yield nothing (they are done); later
    epochs are the DistributedSampler's own. On the world that saved it,
    the rest is exactly what each rank would have read next."""

    def __init__(self, dataset: Any, *, num_replicas: int, rank: int, shuffle: bool, seed: int,
                 drop_last: bool, cut_epoch: int, consumed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.cut_epoch, self.consumed = int(cut_epoch), int(consumed)

    def global_order(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s order of the whole dataset, before any split
        (a DistributedSampler of one rank, without padding)."""
        whole: DistributedSampler[int] = DistributedSampler(self.dataset, num_replicas=1, rank=0,
                                                            shuffle=self.shuffle, seed=self.seed)
        return capture_epochs(whole, 1, start_epoch=epoch)[0]

    def rest(self) -> np.ndarray:
        """The cut epoch's samples not yet consumed, as this world reads
        them (rank r the r-th of every ``num_replicas``)."""
        order = self.global_order(self.cut_epoch)
        rest, world = order[self.consumed:], self.num_replicas
        if self.drop_last:
            return rest[: rest.size // world * world]
        pad = (-rest.size) % world
        return np.concatenate([rest, np.resize(order, pad)]) if pad else rest

    def _count(self) -> int | None:
        if self.epoch < self.cut_epoch:
            return 0
        if self.epoch > self.cut_epoch:
            return None
        left = max(len(self.dataset) - self.consumed, 0)  # type: ignore[arg-type]
        return left // self.num_replicas if self.drop_last else -(-left // self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        if self._count() is None:
            return super().__iter__()
        if self.epoch < self.cut_epoch:
            return iter([])
        return iter(self.rest()[self.rank::self.num_replicas].tolist())

    def __len__(self) -> int:
        n = self._count()
        return super().__len__() if n is None else n

    def opt4_capture_ranks(self, epochs: int, *, start_epoch: int = 0, progress: bool | None = None,
                           fast: bool = True) -> list[list[np.ndarray]]:
        """Every rank's epochs (:func:`~opt4torch.planning.capture.capture_ranks`):
        the cut epoch's rest drawn once and split, and the later epochs as
        a DistributedSampler of this world captures them (one order an
        epoch, not one a rank)."""
        world = int(self.num_replicas)
        out: list[list[np.ndarray]] = [[] for _ in range(world)]
        later = [e for e in range(start_epoch, start_epoch + epochs) if e > self.cut_epoch]
        for e in range(start_epoch, start_epoch + epochs - len(later)):
            rest = self.rest() if e == self.cut_epoch else np.empty(0, np.int64)
            for r in range(world):
                out[r].append(np.ascontiguousarray(rest[r::world], dtype=np.int64))
        if later:
            plain: DistributedSampler[int] = DistributedSampler(
                self.dataset, num_replicas=world, rank=0, shuffle=self.shuffle, seed=self.seed,
                drop_last=self.drop_last)
            for r, epochs_of_r in enumerate(capture_ranks(plain, len(later), start_epoch=later[0],
                                                          progress=progress, fast=fast)):
                out[r].extend(epochs_of_r)
        return out


def resumable(sampler: Any) -> DistributedSampler[int] | None:
    """``sampler`` if its order is a DistributedSampler's own (the class
    itself, or a resumed one), whose rest :class:`ResumedSampler` knows;
    None for anything else, a subclass included (it may order otherwise)."""
    return sampler if type(sampler) in (DistributedSampler, ResumedSampler) else None


def _facts(sampler: DistributedSampler[int]) -> dict[str, Any]:
    return {"world": int(sampler.num_replicas), "seed": int(sampler.seed), "shuffle": bool(sampler.shuffle),
            "drop_last": bool(sampler.drop_last)}


class ElasticResume:
    """States of a DistributedSampler run, and their resume on any world (a
    base of :class:`~opt4torch.loader.checkpoint.Checkpoints`)."""

    cache: Any
    resumed_at: int | None
    _dist_sampler: DistributedSampler[int] | None
    _positions: Any
    _items: int
    _fingerprint: int
    _iter_epoch: int
    _samples_at_iter: int
    _batches_at_iter: int
    _batches_done: int
    _live: Any
    _iterator: Any

    def _rebuilt(self, **changes: Any) -> Any:
        raise NotImplementedError  # the DataLoader's

    def _adopt(self, fresh: Any, *, drawn: bool = True) -> None:
        raise NotImplementedError  # Checkpoints'

    def _distributed_state(self, epoch: int, samples: int) -> dict[str, Any] | None:
        """``state['distributed']``: the sampler's facts and ``consumed``,
        the samples of epoch ``epoch``'s global order consumed by every
        rank together (the whole dataset once this rank's epoch is done);
        None when the order is not a DistributedSampler's."""
        s = self._dist_sampler
        if s is None:
            return None
        grid = self._positions.grid(epoch)
        n = len(s.dataset)  # type: ignore[arg-type]
        if samples >= (int(grid[-1]) if grid.size else 0):
            consumed = n
        else:
            base = s.consumed if isinstance(s, ResumedSampler) and epoch == s.cut_epoch else 0
            consumed = min(base + samples * int(s.num_replicas), n)
        return {**_facts(s), "consumed": consumed}

    def _elastic_wanted(self, state: Any) -> bool:
        """Whether ``state`` resumes by planning the rest again: always on a
        cluster loader; on another, a DistributedSampler run's state saved on
        another world, or by a loader of another plan (a resumed one)."""
        if getattr(self, "cluster_plan", None) is not None:
            return True
        s = self._dist_sampler
        d = state.get("distributed") if isinstance(state, Mapping) else None
        if s is None or not isinstance(d, Mapping):
            return False
        return d.get("world") != s.num_replicas or state.get("fingerprint") != self._fingerprint

    def _check_elastic(self, state: Any) -> tuple[int, int]:
        """The (epoch, samples of its global order consumed) a state
        resumes at, or a refusal naming the fact at fault (a RuntimeError
        when this loader is serving its plan). Changes nothing."""
        if not isinstance(state, Mapping):
            raise TypeError(f"load_state_dict takes the dict state_dict() returned, got {type(state).__name__}")
        s = self._dist_sampler
        d = state.get("distributed")
        if s is None:
            raise ValueError("this loader's order is not a DistributedSampler's own (a subclass may order "
                             "otherwise), so it cannot place the state in the epoch's global order: a "
                             "cluster=True loader resumes with torch's DistributedSampler only")
        if not isinstance(d, Mapping):
            raise ValueError(
                "the state has no 'distributed' (where the epoch's global order stopped): it was saved by a "
                "loader whose order was not a DistributedSampler's, or by an earlier opt4torch, and a "
                "cluster=True loader resumes only states of a DistributedSampler run it can place in that order")
        for key in ("epoch", "epochs", "items"):
            if not is_int(state.get(key)):
                raise TypeError(f"state[{key!r}] must be an integer, got {state.get(key)!r}")
        for key in ("world", "consumed", "seed"):
            if not is_int(d.get(key)):
                raise TypeError(f"state['distributed'][{key!r}] must be an integer, got {d.get(key)!r}")
        n = len(s.dataset)  # type: ignore[arg-type]
        if int(state["items"]) != self._items:
            raise ValueError(
                f"the dataset differs: state['items'] is {int(state['items'])}, the items of the dataset the "
                f"state was saved with, and this loader's dataset has {self._items}. Resume with that dataset")
        mine = _facts(s)
        for key, what in (("shuffle", "shuffle"), ("drop_last", "drop_last")):
            if bool(d.get(key)) != mine[key]:
                raise ValueError(f"state['distributed'][{key!r}] is {bool(d.get(key))} and this loader's "
                                 f"DistributedSampler has {what}={mine[key]}: another order; build it with "
                                 f"{what}={bool(d.get(key))} to resume the state")
        if mine["shuffle"] and int(d["seed"]) != mine["seed"]:
            raise ValueError(f"the seed differs: state['distributed']['seed'] is {int(d['seed'])} and this "
                             f"loader's DistributedSampler has seed={mine['seed']}, another order of every epoch: "
                             f"build it with seed={int(d['seed'])} to resume the state")
        saved_epochs, epochs = int(state["epochs"]), len(self._positions.batches)
        if not 1 <= saved_epochs <= epochs:
            raise ValueError(f"state['epochs'] is {saved_epochs} but this loader was planned for {epochs} "
                             f"epochs: build it with epochs={saved_epochs} (or more) to resume this state")
        epoch, consumed = int(state["epoch"]), int(d["consumed"])
        if not 0 <= epoch < saved_epochs:
            raise ValueError(f"state['epoch'] is {epoch}: the state's epochs are 0 to {saved_epochs - 1}")
        if not 0 <= consumed <= n or int(d["world"]) < 1:
            raise ValueError(f"state['distributed'] says {consumed} samples consumed on {int(d['world'])} ranks, "
                             f"which no run over {n} items saves: the state was edited, or is another run's")
        live = self._live() if self._live is not None else None
        if live is not None or self._iterator is not None:
            raise RuntimeError("resuming this state means planning the rest of the run again, which cannot happen "
                               "under an iterator or persistent workers that serve this plan: call "
                               "load_state_dict before iterating (or on a loader built for it)")
        return epoch, consumed

    def _agreed(self, state: Any) -> tuple[int, int]:
        """:meth:`_check_elastic` on every rank of a cluster job at once (a
        collective): a state one rank refuses is
        refused on every rank, and ranks whose states stopped at different
        places (they did not step together) are refused. On a gloo group of
        its own, destroyed after."""
        import torch.distributed as dist

        try:
            at: tuple[int, int] | None = self._check_elastic(state)
            error: BaseException | None = None
        except (TypeError, ValueError, RuntimeError) as exc:
            at, error = None, exc
        from ..distributed.node import release_group

        # A gloo group of its own, as every collective of the loader's: the
        # job's default group may be NCCL's.
        group = dist.new_group(backend="gloo")
        outcomes: list[Any] = [None] * dist.get_world_size()
        try:
            dist.all_gather_object(outcomes, at if error is None else str(error), group=group)
        finally:
            release_group(group)
        if error is not None:
            try:
                raise error
            finally:
                del error  # no frame holding its own exception (see Checkpoints.load_state_dict)
        refused = [(r, o) for r, o in enumerate(outcomes) if isinstance(o, str)]
        if refused:
            raise ValueError(f"rank {refused[0][0]} refused its state, so no rank resumes: {refused[0][1]}")
        places = {tuple(o) for o in outcomes}
        if len(places) > 1:
            shown = ", ".join(f"rank {r}: epoch {o[0]}, {o[1]} consumed" for r, o in enumerate(outcomes[:8]))
            raise ValueError(f"the ranks' states stopped at different places ({shown}): a cluster resumes "
                             "states saved at the same training step, one a rank")
        assert at is not None
        return at

    def _pool_stop(self) -> int:
        """Where this loader's run left its plan: the position of its next
        batch not yet yielded (the plan's end past the last). On a cluster
        node's first rank, the node's: its batch comes first at every step,
        and the node's ranks step together."""
        pos, e, b = self._positions, self._iter_epoch, self._batches_done
        for epoch in range(e, len(pos.starts)):
            starts = pos.starts[epoch]
            k = b if epoch == e else 0
            if k < len(starts):
                return int(starts[k])
        return int(self.cache.plan.accesses)

    def _held(self) -> Any:
        """On the rank that owns a cluster node's pool: what the pool holds
        with a read to come, for the plan of the rest to keep
        (distributed/warm.py); None elsewhere."""
        from ..distributed.runtime import ClusterRuntime
        from ..distributed.warm import held_by

        if not isinstance(self.cache.transfers, ClusterRuntime):
            return None
        return held_by(self.cache, self._pool_stop())

    def _resume_elastic(self, state: Any) -> None:
        """Resume ``state`` by planning the rest of the run again: the rest
        of the cut epoch over this world, then the later epochs. Pools are
        new; a cluster loader's keep what the old ones hold where the new
        plan reads it (distributed/warm.py): in a loader that has read, the
        old pools are live in these processes. A loader built afresh (a
        relaunched job) has nothing to keep: its cache starts cold and fills
        as the new plan reads."""
        cluster = getattr(self, "cluster_plan", None) is not None
        epoch, consumed = self._agreed(state) if cluster else self._check_elastic(state)
        s = self._dist_sampler
        assert s is not None
        n, world = len(s.dataset), int(s.num_replicas)  # type: ignore[arg-type]
        left = n - consumed
        if left <= 0 or (s.drop_last and left < world):  # the cut epoch is over here: the next one
            epoch, consumed = epoch + 1, 0
        pos = self._positions
        if epoch >= len(pos.batches):  # the run is over: the next iter() says every epoch is used
            pos._next_epoch = len(pos.batches)
            self.resumed_at = int(self.cache.plan.accesses)
            return
        resumed = ResumedSampler(s.dataset, num_replicas=world, rank=int(s.rank), shuffle=bool(s.shuffle),
                                 seed=int(s.seed), drop_last=bool(s.drop_last), cut_epoch=epoch, consumed=consumed)
        from ..distributed.warm import keeping

        with keeping(self._held() if cluster else None):
            fresh = self._rebuilt(sampler=resumed, shuffle=None, seed=None)
        self._adopt(fresh, drawn=False)
        start, batches = self._positions.resume(epoch, 0)
        self.cache.set_floor(start)
        self._iter_epoch, self._samples_at_iter = epoch, 0
        self._batches_done = self._batches_at_iter = batches
        self.resumed_at = start
