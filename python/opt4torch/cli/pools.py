"""``opt4torch cleanup`` and ``opt4torch top``: this user's shared-memory
pools, listed and the stale ones removed, or watched live.

May touch: /dev/shm through the binding (pool_list, pool_remove,
pool_peek: top maps a pool read-only and never changes it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from .._engine import Opt4Error
from .common import UsageError, text_table


def _cmd_cleanup(args: argparse.Namespace) -> int:
    from .. import _engine

    pools = _engine.pool_list()
    if args.names:
        wanted = {n if n.startswith("/") else "/" + n for n in args.names}
        unknown = sorted(wanted - {p["name"] for p in pools})
        if unknown:
            raise UsageError(f"no such pool of this user in /dev/shm: {', '.join(unknown)} "
                             "(`opt4torch cleanup --dry-run` lists them)")
        pools = [p for p in pools if p["name"] in wanted]
    ns = os.environ.get("OPT4TORCH_POOL_NAMESPACE", "")
    where = f" in namespace {ns!r} (OPT4TORCH_POOL_NAMESPACE)" if ns else ""
    if not pools:
        print(f"no opt4 pools in /dev/shm for this user{where}")
        return 0
    removed = 0
    for p in pools:
        if not p["owner_alive"]:
            state, remove = "stale", True
        elif p["unchecked"]:
            # Another PID namespace and no lock to test: nothing proves the
            # owner dead. Only --force takes these (or a named pool).
            state = "in another PID namespace, liveness unknown"
            remove = args.force
        else:
            state = "live, in another PID namespace" if p["other_namespace"] else "live"
            remove = args.force and bool(args.names)  # a live pool goes only when named
        action = ""
        if remove and not args.dry_run:
            try:
                _engine.pool_remove(p["name"], force=bool(p["owner_alive"]))
                action = " -> removed"
                removed += 1
            except Opt4Error as exc:
                action = f" -> not removed: {exc}"
        elif remove:
            action = " -> would be removed"
        elif p["unchecked"]:
            action = f" -> kept (once its job has ended: opt4torch cleanup --force {p['name']})"
        print(f"{p['name']}  owner pid {p['owner_pid']} ({state})  {p['bytes'] / 2**20:.1f} MiB{action}")
    if args.dry_run:
        print("dry run: nothing removed")
    elif args.force:
        print(f"removed {removed} pool(s)")
    else:
        print(f"removed {removed} stale pool(s); live pools, and pools whose owner is in another PID "
              "namespace and cannot be checked, are kept (--force removes the latter)")
    return 0


def _top_table(figs: list[dict[str, Any]]) -> str:
    head = ("pool", "pid", "position", "progress", "hit rate", "stalls", "prefetched", "fallbacks",
            "pool full", "accesses/s")
    rows = [head]
    for f in figs:
        rows.append((f["name"], str(f["owner_pid"]), f"{f['position']:,}/{f['accesses']:,}",
                     f"{100 * f['progress']:.1f}%", f"{100 * f['hit_rate']:.1f}%",
                     f"{100 * f['stall_rate']:.1f}%", f"{f['prefetched']:,}", f"{f['fallbacks']:,}",
                     f"{100 * f['occupancy']:.1f}%",
                     f"{f['accesses_per_s']:,.0f}" if "accesses_per_s" in f else "-"))
    return text_table(rows)


def _cmd_top(args: argparse.Namespace) -> int:
    from .. import _engine
    from ..pool.live import figures

    if not args.interval > 0:
        raise UsageError(f"--interval must be a positive number of seconds, got {args.interval}")
    wanted = {n if n.startswith("/") else "/" + n for n in args.names}
    ns = os.environ.get("OPT4TORCH_POOL_NAMESPACE", "")
    where = f" in namespace {ns!r} (OPT4TORCH_POOL_NAMESPACE)" if ns else ""
    last: dict[str, tuple[float, dict[str, Any]]] = {}
    tty = sys.stdout.isatty() and not args.once
    while True:
        figs = []
        for entry in _engine.pool_list():
            name = entry["name"]
            if (wanted and name not in wanted) or not entry["owner_alive"]:
                continue
            try:
                view = _engine.pool_peek(name)
            except Opt4Error:
                continue  # ended between the listing and the look
            now = time.monotonic()
            prev = last.get(name)
            figs.append(figures(view, prev[1] if prev else None, now - prev[0] if prev else None))
            last[name] = (now, view)
        missing = sorted(wanted - {f["name"] for f in figs})
        if args.once and missing:
            raise UsageError(f"no running pool of this user named {', '.join(missing)}{where} "
                             "(`opt4torch top --once` lists the running ones)")
        if args.json:
            print(json.dumps(figs), flush=True)
        else:
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J")
            print(_top_table(figs) if figs else f"no running opt4 pools of this user{where}", flush=True)
            if not args.once and not tty:
                print(flush=True)
        if args.once:
            return 0
        time.sleep(args.interval)


def add_cleanup_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cleanup", help="list this user's shared-memory pools and remove stale ones",
                       description="Remove pools in /dev/shm whose owner process is gone (a run "
                                   "killed by SIGKILL or a crash). Pools of live runs are kept, in "
                                   "this PID namespace or another (a container or an `unshare -p` job "
                                   "sharing /dev/shm): an owner holds a lock on its pool that the kernel "
                                   "drops when it dies. A pool whose owner is in another PID namespace "
                                   "and holds no lock (made by an older opt4torch, or on behalf of "
                                   "another process) cannot be checked from here and is kept unless "
                                   "--force is given. With OPT4TORCH_POOL_NAMESPACE set, only the pools "
                                   "of that namespace are seen (as by every sweep of that job).")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="only these pools (as listed, e.g. /opt4-1000-4242-0123456789abcdef)")
    p.add_argument("--dry-run", action="store_true", help="only list")
    p.add_argument("--force", action="store_true",
                   help="also remove pools whose owner is in another PID namespace and cannot be "
                        "checked; with NAMEs, remove those pools whatever their owner's state (a "
                        "live job using one fails)")
    p.set_defaults(func=_cmd_cleanup)


def add_top_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("top", help="live figures of this user's running jobs, read from their pools",
                       description="Where each running job is and how its cache does: position in the "
                                   "plan, hit rate, stall rate, prefetched and fallen-back accesses, how "
                                   "full the pool is and accesses per second, refreshed every --interval "
                                   "seconds until Ctrl-C. Each pool is mapped read-only for the look: a "
                                   "job is never changed by being watched. With OPT4TORCH_POOL_NAMESPACE "
                                   "set, only that namespace's pools are seen.")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="only these pools (as `opt4torch cleanup --dry-run` lists them)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default: %(default)s)")
    p.add_argument("--once", action="store_true", help="print once and exit")
    p.add_argument("--json", action="store_true", help="one JSON list of figures per refresh")
    p.set_defaults(func=_cmd_top)
