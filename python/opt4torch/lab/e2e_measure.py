"""Measuring one configuration of the end-to-end comparison, in a process of
its own: its loader, the training loop, CPU time and peak memory.
May touch: the processes it starts.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import resource
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from .e2e_baselines import (
    DecodeCropFlip,
    InMemory,
    lru_manager,
    NoCache,
    PerWorkerCache,
    SharedLRU,
    StaticShared,
    make_model,
    make_sampler,
)
from .e2e_data import (
    proc_cpu_seconds,
    s3_stats,
    S3Images,
)
from .e2e_setup import CACHETOOLS, CONFIGS, OPT_CONFIGS, PEERS, S3_ONLY, Setup

__all__ = ["run_config", "train", "run_isolated"]


# ---- measuring one configuration (in its own process) ----


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(c) for c in f.read().split()]
                out.extend(kids)
                todo.extend(kids)
        except OSError:
            pass
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakMemory(threading.Thread):
    """Samples the PSS of this process and its descendants (workers, the
    manager) every 0.2 s: shared pages count once in all, split among their users."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self._stop_event = threading.Event()

    def sample(self) -> None:
        me = os.getpid()
        self.peak = max(self.peak, sum(_pss(p) for p in [me, *_descendants(me)]))

    def run(self) -> None:
        while not self._stop_event.wait(0.2):
            self.sample()

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        self.sample()
        return self.peak


def cpu_seconds() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def shutdown_loader(loader: Any) -> None:
    """Join the persistent workers now, so their CPU time is counted."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


def run_config(name: str, sampler_kind: str, path: str, setup: Setup,
               prepared: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train ``setup.epochs`` epochs under configuration ``name``; the counters.
    ``prepared``: what :func:`.peers.prepare` made for the peer configurations."""
    import torch
    from torch.utils.data import DataLoader as TorchLoader

    from ..sources.records import RecordFile

    torch.set_num_threads(1)
    cpu0 = cpu_seconds()
    mem = PeakMemory()
    mem.start()
    latency = setup.latency
    s3 = setup.store == "s3"
    rf: Any
    if s3:  # the costs are the server's
        rf = S3Images(path, setup)
        sizes = rf.item_sizes()
    else:
        rf = RecordFile(path, direct=setup.direct, latency=0.0)
        sizes = rf.item_sizes()
        latency += float(sizes.mean()) / setup.bandwidth if setup.bandwidth > 0 else 0.0
        rf.set_latency(latency)
    labels = rf.labels
    n, c, w = len(rf), setup.capacity_items, setup.workers
    transform = DecodeCropFlip(setup.crop)
    common = dict(batch_size=setup.batch, num_workers=w, persistent_workers=w > 0,
                  multiprocessing_context="fork" if w > 0 else None)
    out: dict[str, Any] = {"config": name, "sampler": sampler_kind, "latency_s": latency,
                           "read_note": rf.info()["note"]}
    items: list[Any] | None = None
    if name == "in memory":
        plain = RecordFile(path)
        items = [plain[i] for i in range(n)]
        plain.close()
    before = rf.info()
    if s3:
        s3_stats(setup, "reset")
        server_cpu0 = proc_cpu_seconds(setup.s3_server_pid) if setup.s3_server_pid else 0.0
    manager = None
    t0 = time.perf_counter()
    ds: Any = None
    peer: Any = None
    if name in PEERS:
        from . import peers

        seq = None
        if name not in peers.SHARDED:  # a plan for the sampler's order: captured, as OPT's is
            from ..planning.capture import capture

            seq = capture(make_sampler(sampler_kind, labels, setup.seed), setup.epochs)
        budget = int(round(setup.capacity * float(sizes.sum())))
        loader, peer = peers.make_loader(name, make_sampler(sampler_kind, labels, setup.seed), seq, rf, setup,
                                         os.path.dirname(os.path.abspath(path)), transform, common,
                                         (prepared or {}).get(name, {}), budget)
        out["cache_bytes"] = budget
    elif name in OPT_CONFIGS:
        from ..loader.dataloader import DataLoader

        prefetch = name != "OPT"
        source = rf.dataset_for("s3torchconnector" if name in S3_ONLY else "auto") if s3 else rf
        out["s3_client"] = source.info()["client"] if s3 else None
        loader: Any = DataLoader(source, sampler=make_sampler(sampler_kind, labels, setup.seed), cache_items=c,
                                 epochs=setup.epochs, transform=transform, prefetch=prefetch,
                                 prefetch_threads=setup.threads, lookahead=setup.lookahead,
                                 progress=False, **common)
    else:
        if name == "no cache":
            ds = NoCache(rf, transform)
        elif name == "in memory":
            ds = InMemory(items, transform)
        elif name in CACHETOOLS:
            ds = PerWorkerCache(rf, CACHETOOLS[name], c, w, transform)
        elif name == "shared LRU":
            manager = lru_manager()
            manager.start()
            ds = SharedLRU(rf, manager.LRUStore(c), transform)
        elif name == "static":
            from ..planning.capture import capture

            seq = capture(make_sampler(sampler_kind, labels, setup.seed), setup.epochs)
            _, first = np.unique(seq, return_index=True)
            keep = seq[np.sort(first)][:c]
            ds = StaticShared(rf, keep, w, transform)
        else:
            raise ValueError(f"unknown configuration {name!r} (one of {', '.join(CONFIGS)})")
        loader = TorchLoader(ds, sampler=make_sampler(sampler_kind, labels, setup.seed), **common)
    setup_s = time.perf_counter() - t0
    trained = train(loader, setup, f"{name} / {sampler_kind}", n)
    samples = trained["samples"]
    seconds = time.perf_counter() - t0
    shutdown_loader(loader)
    after = rf.info()
    out.update(trained, seconds=seconds, setup_s=setup_s, storage_reads=after["reads"] - before["reads"],
               storage_bytes=after["bytes_read"] - before["bytes_read"], accesses=samples)
    if s3:
        # What the server served, whoever asked (the peers' own clients too):
        # GETs and their bytes, every request (LIST pages, HEADs), its CPU.
        srv = s3_stats(setup)
        if name in PEERS:
            out.update(storage_reads=srv["gets"], storage_bytes=srv["get_bytes"])
        out.update(store_gets=srv["gets"], store_get_bytes=srv["get_bytes"], store_requests=srv["requests"],
                   server_cpu_s=(proc_cpu_seconds(setup.s3_server_pid) - server_cpu0
                                 if setup.s3_server_pid else None))
    if peer is not None:
        from . import peers

        out.update(peer.counters(samples, int(round(samples * float(sizes.mean())))))
        if s3 and name in peers.SHARDED:  # counted at the server; of bytes, as with the local remote
            accessed = int(round(samples * float(sizes.mean())))
            out.update(stall_rate=None, hits=None, hit_rate_note="bytes",
                       hit_rate=max(0.0, 1.0 - out["storage_bytes"] / max(1, accessed)))
        if name not in peers.SHARDED:
            # Measured the same way for v1.1.0 and the compat layer: an access
            # that read the record file missed, and waited for it (a sample
            # that came back undecodable was read again: counted as a miss).
            out.update(hits=samples - out["storage_reads"], stall_rate=out["storage_reads"] / max(1, samples))
    elif name in OPT_CONFIGS:
        st = loader.cache.stats()
        plan = loader.cache.plan
        out.update(hits=st["hits"], plan_hits=plan.hits, stall_rate=st["stall_rate"],
                   prefetched=st["prefetched"], stalls=st["stalls"], fallbacks=st["fallbacks"], timeouts=st["timeouts"],
                   prefetch_dropped=st["prefetch_dropped"],
                   plan_miss_bytes=int(sizes[plan.seq[plan.kinds != 0]].sum()),
                   plan_label_sum=int(labels[plan.seq].sum()))
        loader.cache.close()
    elif name == "shared LRU":
        hits, misses = ds.store.counts()
        out.update(hits=hits, stall_rate=misses / max(1, samples))
        manager.shutdown()  # type: ignore[union-attr]
    elif name in CACHETOOLS or name == "static":
        out.update(hits=int(ds.counts[0::2].sum()), stall_rate=int(ds.counts[1::2].sum()) / max(1, samples))
    elif name == "no cache":
        out.update(hits=0, stall_rate=1.0)
    else:
        out.update(hits=samples, stall_rate=0.0)
    if out.get("hit_rate") is None:
        out["hit_rate"] = out["hits"] / max(1, samples)
    del loader
    out["cpu_s"] = cpu_seconds() - cpu0
    # The machine's load over the last minute, against its cores: what the
    # timings of a run on a shared machine depend on (see implausible_runs).
    out["load_average"], out["cores"] = os.getloadavg()[0], os.cpu_count() or 1
    out["peak_memory_bytes"] = mem.stop()
    rf.close()
    return out


def train(loader: Any, setup: Setup, desc: str, n: int | None = None) -> dict[str, Any]:
    """``setup.epochs`` epochs of the small CNN (seeded) on ``loader``'s
    batches: every epoch's seconds, the samples, their labels' sum, the last
    loss. ``n``: the items an epoch has, for the progress bar."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(setup.seed)
    model = make_model(setup.classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    epoch_s, samples, label_sum, loss = [], 0, 0, float("nan")
    bar = None
    if setup.progress:
        from tqdm import tqdm

        bar = tqdm(total=setup.epochs * math.ceil((n or setup.images) / setup.batch), desc=desc, unit="batch",
                   leave=False)
    for _ in range(setup.epochs):
        e0 = time.perf_counter()
        for x, y in loader:
            logits = model(x)
            l = F.cross_entropy(logits, y)
            opt.zero_grad()
            l.backward()
            opt.step()
            samples += len(y)
            label_sum += int(y.sum())
            loss = float(l.detach())
            if bar is not None:
                bar.update(1)
        epoch_s.append(time.perf_counter() - e0)
    if bar is not None:
        bar.close()
    return {"epoch_s": epoch_s, "samples": samples, "label_sum": label_sum, "final_loss": loss}


def _child(conn: Any, target: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> None:
    try:
        conn.send(("ok", target(*args)))
    except BaseException:  # report any failure to the parent, then exit
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_isolated(name: str, sampler_kind: str, path: Any, setup: Setup, timeout: float = 1800,
                 prepared: dict[str, Any] | None = None,
                 target: Callable[..., dict[str, Any]] | None = None) -> dict[str, Any]:
    """:func:`run_config` (or ``target``, given the same arguments but
    ``prepared``) in a forked child process of its own."""
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe(duplex=False)
    args = (name, sampler_kind, path, setup) + ((prepared,) if target is None else ())
    p = ctx.Process(target=_child, args=(there, target or run_config, args))
    p.start()
    there.close()
    try:
        if not here.poll(timeout):
            raise TimeoutError(f"{name} / {sampler_kind} did not finish in {timeout:.0f} s")
        status, value = here.recv()
    except EOFError:
        raise RuntimeError(f"{name} / {sampler_kind}: the process died (exit code {p.exitcode})") from None
    finally:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
            p.join()
    if status != "ok":
        raise RuntimeError(f"{name} / {sampler_kind} failed:\n{value}")
    return value
