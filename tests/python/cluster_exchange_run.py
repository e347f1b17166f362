"""Run under torchrun by test_cluster_exchange.py: each rank is a node
(OPT4TORCH_NODE=rank) with its own pool, made from its part of the job's
windowed cluster plan, and runs that plan itself, window by window: the
RECEIVEs, then the window's exchange (opt4torch._exchange, a real
all_to_all on gloo), then its ranks' reads, each checked against the
source. Writes what it counted to <out>.<rank>.json.

--rooms short: each window in one collective, every item in a room of its
planned bytes, except every 37th item, whose room is too small: it goes
empty, and its reader reads it from storage.

--vanish-rank R --vanish-window K: rank R leaves at the start of window K
without a word (os._exit(0), so torchrun does not stop the others): the
others' collectives fail from then on, and what they would have received
they read from storage."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections import defaultdict
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(__file__))

from opt4torch import cluster  # noqa: E402
from opt4torch._codec import decode  # noqa: E402
from opt4torch._exchange import Exchange, NodeTransfers, record_of  # noqa: E402
from opt4torch.cluster import job_plan  # noqa: E402
from opt4torch.data import CODEC_MARGIN, OPTCache, PlannedDataset  # noqa: E402


def size_of(x: int) -> int:
    return 1 + (x * 7919) % 900


def content(x: int) -> np.ndarray:
    return np.random.default_rng(x).integers(0, 256, size=size_of(x), dtype=np.uint8)


class Items:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class Router:
    """The node's dataset as its pool sees it: storage (counted), or what
    the exchange received for the position being read."""

    def __init__(self, n: int, exchange: Exchange) -> None:
        self.n, self.exchange = n, exchange
        self.at = -1
        self.source = cluster.FROM_STORAGE
        self.storage_reads = self.storage_bytes = self.fallbacks = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, x: int) -> Any:
        if self.source == cluster.FROM_PEER:
            record = self.exchange.take(self.at)
            if record is not None:
                return decode(record)
            self.fallbacks += 1
        self.storage_reads += 1
        self.storage_bytes += size_of(x)
        return content(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--capacity", type=int, default=60)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--vanish-rank", type=int, default=-1)
    ap.add_argument("--vanish-window", type=int, default=-1)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--rooms", choices=["none", "short"], default="none",
                    help="none: two collectives a window (lengths, then bytes); short: one, each item in a room "
                         "of its planned bytes, except items x % 37 == 0, whose room is too small")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    sampler = DistributedSampler(Items(args.items), num_replicas=world, rank=rank, seed=5)
    sizes = np.array([size_of(x) for x in range(args.items)], dtype=np.int64)
    cp, node = job_plan(sampler, args.epochs, batch_size=args.batch, capacity_per_node=args.capacity,
                        item_sizes=sizes, window=args.window)
    np_ = cp.node_plan(node)
    rooms = None
    if args.rooms == "short":  # the record's bound, as the loader gives it; too small for every 37th item
        rooms = sizes + CODEC_MARGIN
        rooms[::37] = sizes[::37] // 2
    exchange = Exchange(NodeTransfers.of(cp, node), np_, rooms=rooms)
    # Received items whose room is too small: sent empty, so read from storage.
    short = sum(int(np_.seq[at]) % 37 == 0 for k in exchange.windows for at in exchange.incoming(k)) if \
        rooms is not None else 0
    cache = OPTCache(cp.pool_plan(node, np_), 1024)
    router = Router(args.items, exchange)
    view = PlannedDataset(router, cache.name, len(np_), args.items)
    wrong = 0

    def read(i: int) -> Any:
        nonlocal wrong
        router.at, router.source = i, int(np_.source[i])
        got = view[i]
        wrong += not np.array_equal(got, content(int(np_.seq[i])))
        return got

    by: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in range(len(np_)):
        by[(int(np_.window[i]), int(np_.role[i]))].append(i)
    last = int(cp.windows()[-1]) + 2
    # Each window's closing flags (docs/cluster.md, "The last turn, agreed"):
    # in a node's n-th collective every node sets its flag but node n % world
    # (unless n % 3 == 0), so every node must see all flags set exactly when
    # n % 3 == 0.
    agreed: list[bool] = []
    for k in range(last + 1):
        if rank == args.vanish_rank and k == args.vanish_window:
            os._exit(0)
        for i in by.pop((k, cluster.RECEIVE), []):
            read(i)
        n = len(agreed)
        ok = exchange.run(k, lambda i: record_of(read(i)), closing=n % 3 == 0 or node != n % world)
        if ok and k in exchange.windows:
            agreed.append(exchange.all_closing)
        for i in by.pop((k, cluster.WORKER), []):
            got = read(i)
            if np_.forward[i]:
                exchange.keep_forward(i, record_of(got))
        by.pop((k, cluster.SEND), None)  # read by the exchange
    st = cache.stats()
    out = {
        "rank": rank, "node": node, "wrong": wrong, "left": len(by),
        "storage_reads": router.storage_reads, "storage_bytes": router.storage_bytes,
        "fallbacks": router.fallbacks, "hits": st["hits"], "plan_hits": st["plan_hits"],
        "pool_fallbacks": st["fallbacks"], "node_stats": cp.node_stats()[node],
        "items_sent": exchange.items_sent, "items_received": exchange.items_received,
        "bytes_sent": exchange.bytes_sent, "bytes_received": exchange.bytes_received,
        "short_received": short, "oversize": exchange.oversize,
        "errors": [f"window {k}: {type(e).__name__}" for k, e in exchange.errors],
        "agreed": agreed, "late": cp.late, "peer_hits": cp.peer_hits, "remote_admits": cp.remote_admits,
    }
    with open(f"{args.out}.{rank}.json", "w") as f:
        json.dump(out, f)
    exchange.close()  # its group, and the thread that forms it again after a failed window
    cache.close()
    if args.vanish_rank < 0:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
