"""A cluster node's transfer thread (issue 18; docs/cluster.md, "The run
time"; what the node's other ranks hold in its place is follower.py's): it
claims the positions whose bytes come from peers, runs each window's
exchange (distributed/exchange.py) paced by the workers' progress, and
stores what came where the workers read it. A window whose items are lost
is read from storage, counted, and the next one works again.

May touch: the node's pool (claims, stores, reads through a handle of its
own), the exchange, the dataset (storage reads of forwards); never the
loader.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any, TypeVar

import numpy as np

from .. import _engine
from ..io.forksafe import ForkGate
from ..planning.sizing import CODEC_MARGIN, PREFETCH_MAX_THREADS
from ..planning.cluster import FROM_PEER, RECEIVE, SEND, WORKER, NodePlan
from .exchange import Exchange, NodeTransfers, Record, Window, record_of
from .follower import plan_keys
from .pace import turn_paces

__all__ = ["ClusterRuntime"]

T = TypeVar("T")


class ClusterRuntime:
    """A node's transfer thread (docs/cluster.md, "The receive side, under
    the claim protocol"), in the process that owns the node's pool.

    Made before any prefetcher runs, it claims every position of the node
    plan whose bytes do not come from the node's own storage reads (its
    RECEIVEs, its ranks' peer reads) and the forward reads, which it loads
    itself. Started once the DataLoader's workers exist, it goes window by
    window: it loads the window's forwards from storage (into the staging
    ring for their reader, and keeps their records to send), runs the
    window's exchange, stores what came at its positions (a RECEIVE into
    the pool, a peer read into the staging ring) and reads its RECEIVEs, as
    a worker would. A window whose collective failed releases its claims:
    their readers load from storage (a RECEIVE, it loads itself). Whatever
    it still holds when it stops, it releases.
    """

    def __init__(self, transfers: NodeTransfers, node_plan: NodePlan, pool_name: str, dataset: Any, *,
                 allow_pickle: bool = False, group: Any = None, peers: list[int] | None = None,
                 storage_sizes: np.ndarray | None = None, timeout: float = 60.0,
                 epoch_starts: list[int] | None = None, readers: int = PREFETCH_MAX_THREADS) -> None:
        import torch.distributed as dist

        self.plan, self.dataset, self.allow_pickle = node_plan, dataset, allow_pickle
        self.plan_keys = plan_keys(transfers.figures, node_plan, storage_sizes)
        # Each item's room in its window's one collective: its record's bound,
        # the bytes the pool plans for it (None without per-item sizes: two
        # collectives a window, the lengths first).
        rooms = None if storage_sizes is None else storage_sizes.astype(np.int64) + CODEC_MARGIN
        self.exchange = Exchange(transfers, node_plan, group, peers, timeout, rooms=rooms)
        #: This rank (the node's first): where the node's transfer figures are.
        self.leader = dist.get_rank()
        p = node_plan
        worker = p.role == WORKER
        peer = worker & (p.source == FROM_PEER)
        forward = worker & p.forward
        receive = p.role == RECEIVE
        # The thread's own handle: the claims belong to it.
        self._pool = _engine.pool_attach(pool_name)
        self._pool_name = pool_name
        self._claims: set[int] = set()
        for i in np.flatnonzero(peer | forward | receive).tolist():
            if self._pool.prefetch_claim_at(i)[0] == _engine.PREFETCH_CLAIMED:
                self._claims.add(i)
        self._forwards: dict[int, list[int]] = {}
        for i in np.flatnonzero(forward).tolist():
            self._forwards.setdefault(int(p.window[i]), []).append(i)
        self._receive = set(np.flatnonzero(receive).tolist())
        # Its SENDs by window, read ahead of their collective: window k + 1's
        # sit before the reads of window k + 1 that its delivery stores, and a
        # store may wait for them, so they are read in position order there.
        self._sends: dict[int, list[int]] = {}
        for i in np.flatnonzero(p.role == SEND).tolist():
            self._sends.setdefault(int(p.window[i]), []).append(i)
        self._sent: dict[int, Record] = {}  # node-plan index: record read (a buffer), until its collective
        # Turn k runs window k's collective and hands over what window k + 1
        # gets (its forwards, and what the collective brought), at its pace.
        self._turns = sorted(set(self.exchange.windows) | {w - 1 for w in self._forwards})
        self._pace, self._end = turn_paces(p, self._turns, epoch_starts)
        #: Threads reading forwards from storage at once: the loader's
        #: prefetch_max_threads, the bound its storage prefetcher has. A first
        #: epoch's window has most of a node's reads as forwards (92 of 128 in
        #: bench/cluster.py); at 32 threads and 10 ms a read the first epoch
        #: took 1.3x per-node OPT's, at 64 as long (bench/RESULTS.md).
        self.readers = int(readers)
        self._view_pool: Any = None  # the thread's handle for reads of its own positions
        self.timeout = float(timeout)  # a collective's, at most
        # Workers that are not persistent are forked every epoch while the
        # thread runs. Its calls of the dataset (which may take the user's
        # locks) run inside this gate, which a fork waits to find empty
        # (io/forksafe.py). Nothing else it does holds a lock a child could
        # want across a GIL release: its reads of its own pool handle wait
        # on shared memory, and its collectives are gloo's, which no child
        # touches. Its waits on the workers' progress stay outside the gate,
        # so a fork never waits for the workers it is about to make.
        self._gate = ForkGate()
        self._stop = threading.Event()
        self._closing = threading.Event()  # the loader is ending: finish(), or the default group gone
        self._finishing = threading.Event()  # finish(): closing turns (docs/cluster.md, "The last turn, agreed")
        self._thread: threading.Thread | None = None
        self._in_window: int | None = None  # the turn whose collective is under way
        #: Windows whose collective failed while the loader was ending.
        self.abandoned: list[int] = []
        self._abandon_said = False
        self._pid = os.getpid()  # a forked worker's copy never acts
        self.error: BaseException | None = None
        self.handed_over = {"peer": 0, "forward": 0, "receive": 0}
        self.own_sends = 0  # its reads of its SENDs (HITs of the plan)
        self.storage_reads = 0  # items it read from storage (forwards, and RECEIVEs whose window failed)
        self.begun_early = 0  # turns whose collective went out in the delivery before (_begin_early)
        #: The thread's own CPU seconds so far (as of its last turn): what the
        #: exchange takes of the cores training runs on.
        self.thread_cpu = 0.0

    # ---- the thread ----

    def start(self) -> None:
        if self._thread is not None or self._stop.is_set() or os.getpid() != self._pid:
            return
        self._thread = threading.Thread(target=self._run, name="opt4-cluster", daemon=True)
        self._thread.start()

    def finish(self, timeout: float | None = None) -> None:
        """How a loader ends (closed, collected, at exit; docs/cluster.md,
        "Ending a run"): the thread ends the turn under way, then runs the
        turns after in closing mode (no pace, no pool reads or stores, its
        items sent empty, its closing flag set) and stops right after the
        first collective in which every node's flag was set: all nodes stop
        after the same window ("The last turn, agreed"). It stops at the
        first collective that fails then (a node is gone), and is joined, so
        no collective of the loader's group is in flight when this returns,
        nor a thread that a later ``destroy_process_group()`` or the
        interpreter's exit would find in one. Bounded by ``timeout``
        (default: a collective's timeout, plus 5 s): a thread still in a
        collective then is abandoned, and a warning says which window."""
        if os.getpid() != self._pid:
            return
        self._finishing.set()
        self._closing.set()
        if self._thread is not None and self._thread.is_alive() and not self._reached_end():
            # An epoch cut short: the workers will read no further, so a store
            # waiting for their reads (a page, a staging slot) would wait out
            # the pool's timeout. Every wait on the thread's handles ends now.
            self._pool.interrupt()
            if self._view_pool is not None:
                self._view_pool.interrupt()
        # The thread ends by itself after the window the nodes agree on;
        # stop() first would skip one that another node's thread may be in
        # already.
        limit = self.timeout + 5 if timeout is None else timeout
        began = time.monotonic()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(limit)
        self.stop(max(0.1, limit - (time.monotonic() - began)))

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the window under way (a collective ends by its
        timeout) and give back the claims left; in the process that made it
        only. The other nodes' collectives after it then fail, and their
        readers load from storage. Waits ``timeout`` seconds at most (None:
        for good) for the thread to end, and warns, once, when it has not:
        a thread abandoned in a collective."""
        import warnings

        if os.getpid() != self._pid:
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            self._release(list(self._claims))
            self.exchange.close()
        elif timeout != 0 and not self._abandon_said:
            self._abandon_said = True
            where = f"window {self._in_window}'s collective" if self._in_window is not None else "a wait"
            warnings.warn(f"opt4torch cluster loader: the transfer thread was still in {where} after {timeout:g} s "
                          "(cluster_timeout); abandoned it", RuntimeWarning, stacklevel=2)
        if self.abandoned and not self._abandon_said:
            self._abandon_said = True
            warnings.warn(f"opt4torch cluster loader: closed with the epoch cut; window {self.abandoned[0]}'s "
                          "collective found the other nodes gone and was abandoned (their readers load from "
                          "storage)", RuntimeWarning, stacklevel=2)

    def _reached_end(self) -> bool:
        """Whether the workers asked for the node's last reads (a handle of
        the caller's own: the thread's is the thread's alone)."""
        from .. import _engine

        try:
            watch = _engine.pool_attach(self._pool_name)
        except Exception:  # noqa: BLE001 - the pool is gone: nobody reads any more
            return False
        try:
            return watch.head() >= self._end
        finally:
            watch.close()

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def _run(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        begun: Window | None = None  # a turn's collective, issued; completed by the turn
        try:
            # The handle its reads of its own positions take (one a thread),
            # for finish() to interrupt.
            self._view_pool = _engine.pool_attach(self._pool_name)
            with ThreadPoolExecutor(max_workers=self.readers, thread_name_prefix="opt4-cluster-read") as readers:
                loading: list[Future[bytes]] = []
                for n, k in enumerate(self._turns):
                    if begun is None or begun.k != k:  # not issued during the delivery before
                        if not self._await_turn(k):
                            break
                        if self._finishing.is_set():
                            if self._closing_turn(k):
                                continue
                            break
                        begun, loading = self._begin(k, readers)
                    self._in_window = k
                    ok = self.exchange.complete(begun)
                    self._in_window = None
                    records = {i: f.result() for i, f in zip(self._forwards.get(k + 1, []), loading)}
                    if not ok and self._ending():
                        # The other nodes have stopped: nobody comes to the next collective either.
                        self.abandoned.append(k)
                        break
                    for i, record in records.items():
                        self.exchange.keep_forward(i, record)
                    # Window k + 1's collective, the next turn's, goes out once this delivery read its SENDs.
                    after = n + 1 < len(self._turns) and self._turns[n + 1] == k + 1
                    early = self._deliver(k, ok, records, partial(self._begin_early, k + 1, readers) if after
                                          else None)
                    if early is not None:
                        begun, loading = early
                    self.thread_cpu = time.thread_time()
        except BaseException as e:  # noqa: BLE001 - kept for stats(); the readers load instead
            self.error = e.with_traceback(None)  # no cycle through this frame (see Exchange.run)
        finally:
            if begun is not None and begun.ok is None:  # no collective of the group left in flight
                self._in_window = begun.k  # for stop()'s warning, as in _run
                self.exchange.complete(begun)
            self._in_window = None
            self._release(list(self._claims))
            if self._view_pool is not None:
                self._view_pool.close()
            self.thread_cpu = time.thread_time()

    def _begin(self, k: int, readers: Executor) -> tuple[Window, list[Future[bytes]]]:
        """Turn k's start: window k + 1's forwards put to the readers (read
        from storage while window k's exchange runs), and window k's
        collective issued."""
        loading = [readers.submit(self._load, i) for i in self._forwards.get(k + 1, [])]
        for i in self._sends.pop(k, []):  # a turn's with no delivery before it (the first)
            self._read_send(i)
        self._in_window = k
        try:
            return self.exchange.begin(k, self._send_record), loading
        finally:
            self._in_window = None

    def _begin_early(self, k: int, readers: Executor) -> tuple[Window, list[Future[bytes]]] | None:
        """Turn k begun in turn k - 1's delivery, once that read window k's
        SENDs (docs/cluster.md, "The order within a window matters"): only
        at its pace, not ending, and with one collective a window (two run
        to their end as issued); else it starts in _run as any turn."""
        if self.exchange.rooms is None or self._ending() or self._pool.head() < self._pace[k]:
            return None
        self.begun_early += 1
        return self._begin(k, readers)

    def _closing_turn(self, k: int) -> bool:
        """Turn k once finish() was called (docs/cluster.md, "The last
        turn, agreed"): window k's collective with this node's closing flag,
        its SENDs read already sent as read and the others empty (nothing
        read from the pool, nothing stored, no forward loaded), what came
        dropped. True to go on to the next turn; False to stop: every node's
        flag was set (all nodes stop after this window), or the collective
        failed (a node is gone)."""
        self._sends.pop(k, None)
        self._in_window = k
        ok = self.exchange.run(k, lambda i: self._sent.pop(i, b""), closing=True)
        self._in_window = None
        for i in self.exchange.incoming(k):
            self.exchange.take(i)
        if not ok:
            self.abandoned.append(k)
            return False
        return not self.exchange.all_closing

    def _ending(self) -> bool:
        """The loader is ending: closed (finish()), or the user destroyed
        the default process group, which takes the loader's group with it
        (torch.distributed.destroy_process_group destroys every group)."""
        import torch.distributed as dist

        if self._closing.is_set() or self._stop.is_set():
            return True
        if not dist.is_initialized():
            self._closing.set()
            return True
        return False

    def _await_turn(self, k: int) -> bool:
        """Sleep on the workers' progress until turn k's pace, or until
        finish() (a closing turn needs no pace); False when the thread is to
        stop instead: stop() was called, or the default group was destroyed
        (no flag can travel then)."""
        import torch.distributed as dist

        while not self._stop.is_set() and dist.is_initialized():
            if self._finishing.is_set() or self._pool.head() >= self._pace[k]:
                return True
            if self._ending():
                return False
            self._pool.wait_head(self._pace[k], 0.5)  # awake twice a second to look
        self._closing.set()
        return False

    def _load(self, i: int) -> bytes:
        self.storage_reads += 1
        with self._gate.busy():
            return record_of(self.dataset[int(self.plan.seq[i])], self.allow_pickle)

    def _do(self, ops: list[tuple[int, int, Record, str]]) -> None:
        """A delivery's ops, (position, DELIVER_STORE or DELIVER_READ,
        record (a read's: empty), what), in position order: a store waits for the reads of
        what it replaces (pages, a staging slot), which only positions
        before it hold, among them this thread's own reads (its SENDs, its
        RECEIVEs, read as a worker reads them: counted, and owed to their
        generation). One call into C does them without the GIL, sleeping on
        the workers' progress while they are far from the next store; it
        comes back every half second for this thread to look whether the
        loader is ending. A SEND's record is kept as the pool holds it (a
        view of the read's copy), never decoded and encoded again."""
        ops = [o for o in ops if o[1] != _engine.DELIVER_STORE or o[0] in self._claims]
        while ops:
            if self._ending():
                # An ending loader's workers read no further: a store is tried once, no read is made.
                for i, _, record, what in (o for o in ops if o[1] == _engine.DELIVER_STORE):
                    r = self._pool.prefetch_store(i, [record], True)
                    if r == _engine.STORE_NOT_YET:
                        self._release([i])
                    else:
                        self._claims.discard(i)
                        self.handed_over[what] += r == _engine.STORE_DONE
                return
            n, data, results = self._pool.prefetch_deliver(
                [o[0] for o in ops], bytes(o[1] for o in ops),
                [o[2] for o in ops if o[1] == _engine.DELIVER_STORE], 0.5, self._view_pool)
            got = memoryview(data)
            for (i, op, _, what), (code, a, b) in zip(ops, results):
                if op == _engine.DELIVER_STORE:
                    self._claims.discard(i)
                    self.handed_over[what] += code == _engine.STORE_DONE
                elif code == _engine.ENTRY_HIT:
                    if what == "send":
                        self._sent[i] = got[a:a + b]
                elif (loaded := self._missed(i, code, a, keep=what == "send")) is not None:
                    self._sent[i] = loaded
            ops = ops[n:]
            if ops and self._stop.is_set():
                self._release([o[0] for o in ops if o[1] == _engine.DELIVER_STORE])
                return

    def _missed(self, i: int, status: int, reason: int, keep: bool) -> Record | None:
        """Its own position i read as not held (a store given up): loaded
        from storage when ``keep`` (a SEND's record, to send) or when i is an
        ADMIT (then stored, as a worker does), else not at all."""
        if status != _engine.ENTRY_LOAD:  # one position alone: neither deferred nor served later
            raise RuntimeError(f"node-plan position {i} was read as status {status}: the pool does not hold "
                               "this node's plan")
        if reason != _engine.REASON_ADMIT and not keep:
            return None
        record = self._load(i)
        if reason == _engine.REASON_ADMIT:
            self._view_pool.store_batch([(i, [record])])
        return record if keep else None

    def _read_send(self, i: int) -> None:
        self.own_sends += 1  # a HIT of the plan: counted in the pool's hits
        self._do([(i, _engine.DELIVER_READ, b"", "send")])

    def _send_record(self, i: int) -> Record:
        if i not in self._sent:
            self._read_send(i)
        return self._sent.pop(i)

    def _deliver(self, k: int, ok: bool, forwards: dict[int, bytes],
                 then: Callable[[], T] | None = None) -> T | None:
        """Everything window k + 1 gets from this thread, in position order:
        its forwards, and what window k's collective brought; and the reads
        of its SENDs, kept for window k + 1's collective: one call into C
        (:meth:`_do`), or two when ``then()`` is called once those reads are
        done (it returns what that returns)."""
        STORE, READ = _engine.DELIVER_STORE, _engine.DELIVER_READ
        incoming = {i: (self.exchange.take(i) if ok else None) for i in self.exchange.incoming(k)}
        sends = set(self._sends.pop(k + 1, []))
        last_send = max(sends, default=-1)
        done: T | None = None
        ops: list[tuple[int, int, Record, str]] = []
        for i in sorted([*forwards, *incoming, *sends]):
            if then is not None and i > last_send:
                self._do(ops)
                ops = []
                done, then = then(), None
            if i in sends:
                if not self._ending():  # read for a collective an ending loader never runs
                    self.own_sends += 1  # a HIT of the plan: counted in the pool's hits
                    ops.append((i, READ, b"", "send"))
            elif i in forwards:
                ops.append((i, STORE, forwards[i], "forward"))
            elif i in self._receive:
                record = incoming[i]
                if record is None:  # its window failed: loaded here, after what comes before it
                    self._do(ops)
                    ops = []
                    record = self._load(i)
                ops.append((i, STORE, record, "receive"))
                if not self._ending():  # its read, as a worker's: the generation owes it
                    ops.append((i, READ, b"", "receive"))
            elif (peer := incoming[i]) is not None:
                ops.append((i, STORE, peer, "peer"))
            else:
                self._release([i])
        self._do(ops)
        return then() if then is not None else done

    def _release(self, positions: list[int]) -> None:
        for i in positions:
            if i in self._claims:
                self._claims.discard(i)
                try:
                    self._pool.prefetch_release(i)
                except Exception:  # noqa: BLE001 - a closed pool: nobody waits any more
                    pass

    # ---- figures ----

    @property
    def bytes_moved(self) -> int:
        """Bytes this node sent and received so far (the live figures')."""
        return self.exchange.bytes_sent + self.exchange.bytes_received

    def stats(self, hits: int) -> dict[str, Any]:
        """The cluster keys of ``stats()``, given the pool's hits (every
        process's): measured, beside the plan's for this node."""
        ex = self.exchange
        errors = [f"window {k}: {type(e).__name__}: {e}" for k, e in ex.errors[:3]]
        if len(ex.failed) > len(errors):
            errors.append(f"{len(ex.failed)} windows read from storage in all")
        if ex.oversize:
            errors.append(f"{ex.oversize} items sent were larger than their planned bytes: their readers read "
                          "them from storage")
        return {
            "local_hits": hits - self.own_sends,
            "peer_hits": self.handed_over["peer"],
            "peer_bytes_sent": ex.bytes_sent,
            "peer_bytes_received": ex.bytes_received,
            "peer_items_sent": ex.items_sent,
            "peer_items_received": ex.items_received,
            "peer_bytes_per_s": ex.bytes_per_s,
            "exchange_seconds": ex.seconds,
            "exchange_thread_cpu_seconds": self.thread_cpu,
            **self.plan_keys,
            "cluster_leader": self.leader,
            "cluster_errors": errors + ([f"{type(self.error).__name__}: {self.error}"] if self.error is not None
                                        else []),
            "cluster_failed_windows": len(ex.failed),
            "cluster_regroups": ex.groups.regroups,
        }
