#!/usr/bin/env python3
"""bench/gloo_gil: what one window's collective of the cluster loader costs
on this machine, and what the training loop beside it adds (issue 36;
docs/cluster.md, "Speed where storage is fast").

Four ranks under ``torchrun --standalone`` (as bench/cluster.py's nodes),
each issuing ``--rounds`` all_to_all collectives of ``--bytes`` a pair on a
gloo group of their own, as the transfer thread does (``alltoall_base``,
then ``wait``), and timing each. Beside it, in each rank:

* ``idle``: nothing;
* ``thread``: a Python thread in the same process running bench/cluster.py's
  training step (``a = torch.tanh(a @ a)`` on 96 x 96, in a loop), as the
  training loop beside the cluster loader's transfer thread: the two share
  the GIL;
* ``process``: the same loop in a forked child process instead: the same CPU
  taken, no GIL shared.

Reported per setting: each rank's median and 90th percentile collective
time, and with ``thread`` the loop's steps a second (rank 0's).

    python bench/gloo_gil.py [--rounds 40] [--bytes 51200] [--settings idle,thread,process]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import threading
import time


def _spin(stop: threading.Event | None, count: list[int]) -> None:
    import torch

    a = torch.randn(96, 96)
    while stop is None or not stop.is_set():
        a = torch.tanh(a @ a)
        count[0] += 1


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    group = dist.new_group(backend="gloo")
    stop, count = threading.Event(), [0]
    child = None
    if args.setting == "thread":
        threading.Thread(target=_spin, args=(stop, count), daemon=True).start()
    elif args.setting == "process":
        child = mp.get_context("fork").Process(target=_spin, args=(None, count), daemon=True)
        child.start()
    n = args.bytes
    inp, out = torch.zeros(n * world, dtype=torch.uint8), torch.empty(n * world, dtype=torch.uint8)
    dist.barrier(group)
    times = []
    began, steps = time.perf_counter(), count[0]
    for _ in range(args.rounds):
        t = time.perf_counter()
        if isinstance(group, dist.ProcessGroupGloo):
            group.alltoall_base(out, inp, [n] * world, [n] * world, dist.AllToAllOptions()).wait()
        else:
            dist.all_to_all_single(out, inp, group=group)
        times.append(time.perf_counter() - t)
    rate = (count[0] - steps) / (time.perf_counter() - began)
    stop.set()
    if child is not None:
        child.terminate()
        child.join()
    times.sort()
    with open(f"{args.out}.{rank}.json", "w") as f:
        json.dump({"rank": rank, "median_ms": 1e3 * statistics.median(times),
                   "p90_ms": 1e3 * times[int(0.9 * len(times))], "loop_steps_per_s": rate}, f)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--bytes", type=int, default=50 * 1024, help="bytes each rank sends each other rank")
    ap.add_argument("--settings", default="idle,thread,process")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="a JSON of every run (default: none)")
    args = ap.parse_args()
    if args.rank_run:
        rank_main(args)
        return
    import tempfile

    results = []
    with tempfile.TemporaryDirectory(prefix="opt4-bench-gil-") as tmp:
        for rep in range(args.repeats):
            for setting in args.settings.split(","):
                out = os.path.join(tmp, f"{setting}-{rep}")
                load = os.getloadavg()[0]
                r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                    "4", os.path.abspath(__file__), "--rank-run", "--setting", setting, "--out", out,
                                    "--rounds", str(args.rounds), "--bytes", str(args.bytes)],
                                   capture_output=True, text=True, timeout=600)
                if r.returncode != 0:
                    raise SystemExit(f"{setting}: torchrun failed\n{r.stderr[-3000:]}")
                ranks = [json.load(open(f"{out}.{k}.json")) for k in range(4)]
                results.append({"setting": setting, "load": load, "ranks": ranks})
                med = ", ".join(f"{x['median_ms']:.1f}" for x in ranks)
                p90 = ", ".join(f"{x['p90_ms']:.1f}" for x in ranks)
                loop = f"; loop {ranks[0]['loop_steps_per_s']:.0f} steps/s" if setting == "thread" else ""
                print(f"{setting:8s} load {load:5.1f}: collective median {med} ms, p90 {p90} ms{loop}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
