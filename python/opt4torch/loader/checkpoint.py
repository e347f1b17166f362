"""Checkpoints: where a run is (:meth:`state_dict`), and resuming there
(:meth:`load_state_dict`), by position in the sequence, not by batch, so a
state resumes under another batch size. A state that cannot resume is
refused naming the key at fault; one saved under another drawn seed
re-plans with that seed first; a cluster's, or a DistributedSampler run's
saved on another world, plans the rest again (elastic.py). May touch: the loader's sampler (resume),
the pool's floor, the pool's pages (warmed with what the plan holds at the
resumed position), the node's group for ranks sharing a pool.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _engine
from ..planning.plan import fingerprint
from ..pool.cache import OPTCache
from ..pool.codec import encode
from .build import layout_digest
from .checks import is_int
from .elastic import ElasticResume

if TYPE_CHECKING:
    import weakref

    from .replan import ReplanContext
    from .sampler import PositionBatchSampler
    from .worker import PlannedDataset

__all__ = ["Checkpoints"]


class Checkpoints(ElasticResume):
    """The DataLoader's checkpoints (a base of :class:`DataLoader`)."""

    cache: OPTCache
    dataset: Any
    shared_across_ranks: bool
    resumed_at: int | None
    replans: list[tuple[int, int | None]]
    _positions: PositionBatchSampler
    _replan_from: ReplanContext | None
    _fingerprint: int
    _layout: int
    _orig: tuple[list[np.ndarray], list[np.ndarray], list[int], int]
    _items: int
    _rank: int
    _seed: int | None
    _seed_drawn: bool
    _batch_size: int | None
    _drop_last: bool
    _group: tuple[weakref.ref[Any], int, int] | None
    _iter_epoch: int
    _samples_at_iter: int
    _batches_at_iter: int
    _batches_done: int
    _init_args: dict[str, Any]
    _reporter: Any
    _live: Any
    _iterator: Any

    def _rebuilt(self, **changes: Any) -> Checkpoints:
        raise NotImplementedError  # the DataLoader's: this loader built again with ``changes``

    def state_dict(self) -> dict[str, Any]:
        """Where the run is, by position in the sequence (not by batch):

        ``epoch``
            the epoch iterated (or about to be, once ``iter()`` was called);
        ``samples_done``
            its samples already yielded (of this rank, with
            ``share_across_ranks``);
        ``position``
            the position of the next sample in the plan's sequence, as the
            loader was built (re-plans do not renumber it);
        ``batches_done``
            this loader's batches of the epoch already yielded (kept for
            reading; resuming goes by ``samples_done``);
        ``fingerprint``, ``layout``, ``epochs``, ``items``, ``rank``
            what the state can only resume: the same sequence, split the same
            way into epochs (and ranks), over a dataset of as many items;
        ``batch_size``
            the batch size that saved it, to explain a refusal;
        ``seed``
            the seed that shuffled the order (:attr:`seed`): a loader that
            drew its own seed (``shuffle=True``, no ``seed=``) resumes a
            state saved under another drawn one by planning again with it;
        ``distributed``
            with a DistributedSampler's order (and always with
            ``cluster=True``): its ``world``, ``seed``, ``shuffle`` and
            ``drop_last``, and ``consumed``, the samples of the epoch's
            global order that every rank together consumed, which is what a
            resume on another world (or a cluster's) starts from.

        A state resumes in a loader with another batch size: the next sample
        is the same one; and in a loader planned for more epochs than the
        state's (a run extended), whose first epochs are the state's.
        """
        e = self._iter_epoch
        samples = self._positions.samples_after(e, self._samples_at_iter,
                                                self._batches_done - self._batches_at_iter)
        out: dict[str, Any] = {
            "epoch": e,
            "batches_done": self._batches_done,
            "fingerprint": self._fingerprint,
            "epochs": len(self._positions.batches),
            "samples_done": samples,
            "position": self._orig_position(e, samples),
            "items": self._items,
            "layout": self._layout,
            "rank": self._rank,
            "batch_size": self._batch_size,
            "seed": self._seed,
        }
        distributed = self._distributed_state(e, samples)
        if distributed is not None:
            out["distributed"] = distributed
        return out

    def _orig_position(self, epoch: int, samples: int) -> int:
        """The position, in the plan as built, of epoch ``epoch``'s sample
        after ``samples`` done (past its last: the next epoch's first)."""
        starts, lengths, floors, accesses = self._orig
        ends = np.cumsum(lengths[epoch], dtype=np.int64)
        if samples >= (int(ends[-1]) if ends.size else 0):
            return int(floors[epoch + 1]) if epoch + 1 < len(floors) else int(accesses)
        b = int(np.searchsorted(ends, samples, side="right"))
        return int(starts[epoch][b]) + samples - (int(ends[b - 1]) if b else 0)

    def _check_state(self, state: Any) -> tuple[int, int]:
        """The (epoch, samples done) a state resumes at, or a refusal that
        names the key at fault. Changes nothing."""
        if not isinstance(state, Mapping):
            raise TypeError(f"load_state_dict takes the dict state_dict() returned, got "
                            f"{type(state).__name__}")
        old_keys = ("epoch", "batches_done", "fingerprint", "epochs")
        new_keys = ("samples_done", "position", "items", "layout", "rank", "batch_size")
        legacy = all(k in state for k in old_keys) and not any(k in state for k in new_keys)
        for key in old_keys + (() if legacy else new_keys):
            if key not in state:
                raise ValueError(
                    f"the state has no {key!r}: it is not (all of) a state_dict() of an "
                    "opt4torch.DataLoader. Pass the dict state_dict() returned, whole")
        for key in old_keys + (() if legacy else new_keys):
            value = state[key]
            if not is_int(value) and not (key == "batch_size" and value is None):
                raise TypeError(f"state[{key!r}] must be an integer, got {value!r} ({type(value).__name__})")
        seed = state.get("seed")  # absent in states of an earlier opt4torch
        if seed is not None and not is_int(seed):
            raise TypeError(f"state['seed'] must be an integer or None, got {seed!r} ({type(seed).__name__})")
        pos = self._positions
        epochs = len(pos.batches)
        if not legacy and int(state["items"]) != self._items:
            raise ValueError(
                f"state['items'] is {int(state['items'])}: the state was saved by a loader over a dataset "
                f"of {int(state['items'])} items, and this loader's dataset has {self._items}. Resume with "
                "the dataset the state was saved with")
        # A loader planned for more epochs resumes a state of fewer (a run
        # extended): the state names the first ones, which must be the same.
        saved_epochs = int(state["epochs"])
        if not 1 <= saved_epochs <= epochs:
            raise ValueError(
                f"state['epochs'] is {saved_epochs} but this loader was planned for {epochs} "
                f"epochs: build it with epochs={saved_epochs} (or more) to resume this state")
        if int(state["fingerprint"]) != self._fingerprint_of(saved_epochs):
            why = ("sampler, seed, epochs or dataset differ"
                   + ("" if self.shared_across_ranks else ", or drop_last dropped another tail"))
            if seed is not None and self._seed is not None and int(seed) != self._seed:
                why = (f"state['seed'] is {int(seed)} and this loader's seed is {self._seed}: build it with "
                       f"seed={int(seed)} (or without seed=, to plan again with the state's)")
            saved = None if legacy else state["batch_size"]
            if saved is not None and self._batch_size is not None and int(saved) != self._batch_size:
                if self.shared_across_ranks:
                    why = (f"with share_across_ranks the node's sequence interleaves the ranks batch by "
                           f"batch, so batch_size={int(saved)} (saved) and {self._batch_size} (here) are two "
                           f"sequences: resume with batch_size={int(saved)}")
                elif self._drop_last:
                    why = (f"drop_last=True drops another tail of each epoch with batch_size={int(saved)} "
                           f"(saved) than with {self._batch_size} (here), so another sequence: resume with "
                           f"batch_size={int(saved)}, or build both loaders with drop_last=False")
            raise ValueError("this state was saved by a loader with another plan (state['fingerprint'] "
                             f"differs: {why}): it cannot resume here")
        if not legacy:
            if self.shared_across_ranks and int(state["rank"]) != self._rank:
                raise ValueError(f"state['rank'] is {int(state['rank'])} but this is rank {self._rank} of "
                                 "the node's shared pool: each rank resumes the state it saved")
            if int(state["layout"]) != self._layout_of(saved_epochs):
                raise ValueError(
                    "state['layout'] differs: the same sequence was split otherwise into epochs (or, with "
                    "share_across_ranks, into the ranks' batches), so the samples that come next are not "
                    "the same here; resume with the sampler and batching the state was saved with")
        epoch = int(state["epoch"])
        if not 0 <= epoch < saved_epochs:
            whose = "this loader's" if saved_epochs == epochs else f"the state's (a run of {saved_epochs})"
            raise ValueError(f"state['epoch'] is {epoch}: {whose} epochs are 0 to {saved_epochs - 1}")
        batches = int(state["batches_done"])
        if batches < 0:
            raise ValueError(f"state['batches_done'] is {batches}: a count of batches cannot be negative")
        grid = pos.grid(epoch)
        total = int(grid[-1]) if grid.size else 0
        if legacy:
            # Saved before states recorded positions: its batches are taken
            # for this loader's, which is right only with the same batching.
            if batches > grid.size:
                raise ValueError(f"state['batches_done'] is {batches}, past the end of epoch {epoch} "
                                 f"({grid.size} batches)")
            warnings.warn("this state has no 'samples_done' (saved by an earlier opt4torch): it resumes "
                          f"after {batches} batches of this loader, which is the saved position only if the "
                          "batch size is the one it was saved with", RuntimeWarning, stacklevel=3)
            return epoch, int(grid[batches - 1]) if batches else 0
        samples = int(state["samples_done"])
        if not 0 <= samples <= total:
            raise ValueError(f"state['samples_done'] is {samples}, outside epoch {epoch}, which has {total} "
                             "samples: the state is not one this loader saved (edited, or another run's)")
        expected = self._orig_position(epoch, samples)
        if int(state["position"]) != expected:
            raise ValueError(
                f"state['position'] is {int(state['position'])}, but {samples} samples into epoch {epoch} is "
                f"position {expected} (of {self._orig[3]}): the state's keys disagree (edited, or mixed "
                "from two states)")
        return epoch, samples

    def _fingerprint_of(self, epochs: int) -> int:
        """The fingerprint of this loader's first ``epochs`` epochs, as
        built (a state of a run planned for that many)."""
        if epochs == len(self._orig[2]):
            return self._fingerprint
        # The sequence as built: re-plans cut the pool's; their context keeps it whole.
        seq = self._replan_from.seq if self.replans and self._replan_from is not None else self.cache.plan.seq
        return fingerprint(seq[:int(self._orig[2][epochs])], self._items)

    def _layout_of(self, epochs: int) -> int:
        """The layout digest of this loader's first ``epochs`` epochs."""
        if epochs == len(self._orig[2]):
            return self._layout
        starts, lengths, floors, _ = self._orig
        return layout_digest(starts[:epochs], lengths[:epochs], floors[:epochs], shared=self._group is not None)

    def _reseeded(self, state: Any) -> Checkpoints | None:
        """This loader built again with the seed of ``state``, when this
        one drew its seed and the state was saved under another (a new
        process draws a new one); None when the order stays."""
        given = state.get("seed") if isinstance(state, Mapping) else None
        if not self._seed_drawn or not is_int(given) or int(given) == self._seed:
            return None
        seed = int(given)
        if self._group is not None:
            raise ValueError(f"state['seed'] is {seed} (drawn by the loader that saved it) and this loader drew "
                             f"{self._seed}: ranks sharing a pool plan together only when built, so build this "
                             f"loader with seed=state['seed'] ({seed}) to resume the state")
        live = self._live() if self._live is not None else None
        if live is not None or self._iterator is not None:
            raise RuntimeError(f"state['seed'] is {seed} and this loader drew {self._seed}: resuming it means "
                               "planning again with the state's seed, which cannot happen under an iterator "
                               "or persistent workers that serve this plan. Call load_state_dict before "
                               f"iterating, or build the loader with seed={seed}")
        return self._rebuilt(seed=seed)

    def _adopt(self, fresh: Checkpoints, *, drawn: bool = True) -> None:
        """Become ``fresh``, this loader built again (with another seed, or
        another sampler): its plan, pool, positions and torch's state over
        them. This loader's pool goes. ``drawn``: its seed still counts as
        drawn (a later state may name another)."""
        old, reporter = self.cache, self._reporter
        self.__dict__.update(fresh.__dict__)  # past torch's guard on dataset and batch_sampler
        self._reporter = reporter
        if drawn:
            self._seed_drawn = True
            self._init_args = {**self._init_args, "seed": None}
        old.close()

    def load_state_dict(self, state: dict[str, Any], *, warm: bool = True) -> None:
        """Resume at the saved position: the next sample is the one that
        would have come next, whatever the batch size (a batch that the saved
        position cuts comes first, short). Warm the pool with the items the
        plan holds there (loaded now, so the first batches hit). A state that
        cannot resume here is refused, naming the key at fault.

        With ``share_across_ranks=True`` every rank of the node must call it
        (it is collective, like the constructor), with the state it saved at
        the same training step: the node resumes at its earliest next batch,
        and local rank 0 warms the one pool for all of them. A state one rank
        refuses is refused on every rank (none waits for the others).

        A loader that drew its seed (``shuffle=True`` without ``seed=``)
        resumes a state saved under another drawn seed (``state['seed']``)
        by planning again with that one, before anything else: building
        the loader with ``seed=state['seed']`` saves that second plan.

        With ``cluster=True`` every rank of the job calls it (a collective),
        each with a state saved at the same step (any rank's: they name the
        same place), and on any number of ranks and nodes: the rest of the
        timeline is planned again over this job's nodes, from the saved
        place in the epoch's global order, and its transfers start at the
        window that place falls in. The same holds, rank by rank, for a
        DistributedSampler run without ``cluster`` resumed on another world
        (``state['distributed']``; docs/cluster.md, "Resuming a cluster run,
        and elastic resume"). The pools are new. A cluster loader that has
        read keeps what its nodes' pools hold where the new plan reads it
        (planned as a warm prefix, copied into the new pools before any
        worker starts; stats()' ``kept``, ``kept_loaded``, ``plan_warm``);
        a loader built afresh (a relaunched job) has nothing to keep and
        starts cold. ``warm`` does not apply to these resumes."""
        if self._elastic_wanted(state):
            self._resume_elastic(state)
            return
        fresh = self._reseeded(state)
        if fresh is not None:
            try:
                fresh._check_state(state)
            except BaseException:
                fresh.cache.close()
                raise
            self._adopt(fresh)
        if self._group is None:
            epoch, samples = self._check_state(state)
            start, batches = self._positions.resume(epoch, samples)
            self.cache.set_floor(start)
            if warm:
                self._warm(start)
        else:
            # Ranks sharing the pool: a collective call. The node resumes at
            # its earliest next batch (in lockstep, rank 0's); local rank 0
            # warms the pool for everyone, and nobody reads before it has.
            # Every rank checks its state first and all hear of a refusal.
            import torch.distributed as dist

            group_ref, rank, world = self._group
            group = group_ref()
            if group is None:
                raise RuntimeError("load_state_dict with share_across_ranks=True is a collective call on the "
                                   "process group the loader was built on, which is gone "
                                   "(torch.distributed.destroy_process_group was called): resume in a loader "
                                   "built after init_process_group")
            try:
                epoch, samples = self._check_state(state)
                error: BaseException | None = None
            except (TypeError, ValueError) as exc:
                error = exc
            outcomes: list[Any] = [None] * world
            dist.all_gather_object(outcomes, None if error is None else str(error), group=group)
            if error is not None:
                # Raised with no local left naming it: a frame holding its own
                # exception is a cycle (frame -> error -> traceback -> frame)
                # that keeps ``group`` alive until the collector runs, after
                # destroy_process_group; then gloo's threads outlive the group
                # into the interpreter's finalization, and the rank aborts
                # (std::terminate; rank 1 of a torchrun test died of SIGABRT).
                try:
                    raise error
                finally:
                    del error, group
            refused = [(r, msg) for r, msg in enumerate(outcomes) if msg is not None]
            if refused:
                r, msg = refused[0]
                raise ValueError(f"rank {r} of the node refused its state, so no rank resumes: {msg}")
            start, batches = self._positions.resume(epoch, samples)
            starts: list[Any] = [None] * world
            dist.all_gather_object(starts, start, group=group)
            start = min(starts)
            self._positions.resume_floor(start)
            self.cache.set_floor(start)
            if warm and rank == 0:
                self._warm(start)
            dist.barrier(group=group)
        self._iter_epoch, self._samples_at_iter = epoch, samples
        self._batches_done = self._batches_at_iter = batches
        self.resumed_at = start

    def _warm(self, position: int) -> int:
        owner = _engine.pool_attach(self.cache.name)
        try:
            live = owner.live_at(position)
            ds: PlannedDataset = self.dataset
            stored = 0
            for admit, item, before in live:
                stored += owner.warm(admit, encode(ds.dataset[item], ds.allow_pickle), before) == _engine.STORE_STORED
            return stored
        finally:
            owner.close()
