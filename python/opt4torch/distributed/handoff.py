"""A node's part of the cluster plan, handed from the rank that planned it
(the node's first) to the node's other ranks (issue 36, "Scale";
docs/cluster.md, "Planning once a node"). The planning rank writes two files
in shared memory (/dev/shm): the node plan's arrays with the plan's figures,
and the pool's plan as an engine plan file. The other ranks map them
read-only: a node's share is in memory once, however many ranks it has, and
nothing of it goes through a collective. The planning rank removes the files
once its ranks have mapped them; files of a process that died first are
removed by the next write (:func:`sweep_stale`).

May touch: files under /dev/shm named ``opt4plan-<uid>-<pid>-...``; never a
pool, never a collective.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _engine
from ..planning.clusterplan import ClusterFigures, NodePlan
from ..planning.plan import Plan

__all__ = ["NodeShare", "read_share", "remove_share", "share_path", "sweep_stale", "write_share"]

SHM_DIR = "/dev/shm"
_MAGIC = b"OPT4NODE"
_VERSION = 1
_HEAD = struct.Struct("<8sIIQ")  # magic, version, reserved, JSON length
_ALIGN = 64
#: The node plan's arrays and their dtypes, then the rank reading each position.
_ARRAYS: dict[str, str] = {"seq": "<i8", "op": "u1", "role": "u1", "source": "u1", "forward": "|b1",
                           "window": "<i8", "position": "<i8", "ranks": "<i4"}


@dataclass(frozen=True)
class NodeShare:
    """What a node's ranks need of the cluster plan: their node's plan, the
    global rank that reads each of its positions, the pool's plan, and the
    cluster's figures (totals, each node's counts, the checksum)."""

    node_plan: NodePlan
    ranks: npt.NDArray[np.int32]
    plan: Plan
    figures: ClusterFigures


def _prefix() -> str:
    return f"opt4plan-{os.getuid()}-"


def share_path(token: str, node: int) -> str:
    """Where this process shares node ``node``'s part of the plan of the
    build named ``token`` (the ``.plan`` file beside it holds the pool's plan)."""
    if not token.isalnum():
        raise ValueError(f"a share token is alphanumeric, got {token!r}")
    return os.path.join(SHM_DIR, f"{_prefix()}{os.getpid()}-{token}-n{int(node)}")


def sweep_stale() -> list[str]:
    """Remove the shares of this user's processes that have died (a planning
    rank killed before its ranks mapped its files). Returns what it removed."""
    removed: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(_prefix()):
            continue
        pid_text = name[len(_prefix()):].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # alive (or not ours to signal): not stale
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def write_share(path: str, share: NodeShare) -> None:
    """Write ``share`` at ``path`` (and its pool plan at ``path + '.plan'``),
    created 0600 and exclusively; removed again if the write fails."""
    sweep_stale()
    p = share.node_plan
    arrays = {name: np.ascontiguousarray(getattr(p, name) if name != "ranks" else share.ranks, dtype=dt)
              for name, dt in _ARRAYS.items()}
    f = share.figures
    meta: dict[str, Any] = {
        "node": int(p.node), "length": len(p), "arrays": {},
        "figures": {"capacities": np.asarray(f.capacities).tolist(), "info": {k: int(v) for k, v in f._info.items()},
                    "per_node": [{k: int(v) for k, v in d.items()} for d in f._per_node],
                    "page_size": int(f.page_size), "window": f.window},
    }
    # The offsets depend on the header's length, which depends on them: lay
    # the arrays out after a header padded to a bound that holds any offsets.
    body = 0
    for name, a in arrays.items():
        meta["arrays"][name] = [body, int(a.nbytes)]
        body += -(-a.nbytes // _ALIGN) * _ALIGN
    text = json.dumps(meta).encode()
    start = -(-(_HEAD.size + len(text) + 64) // _ALIGN) * _ALIGN
    try:
        share.plan.save(path + ".plan")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(_HEAD.pack(_MAGIC, _VERSION, 0, len(text)))
            out.write(text)
            out.write(b"\0" * (start - _HEAD.size - len(text)))
            for a in arrays.values():
                out.write(memoryview(a).cast("B"))
                out.write(b"\0" * (-a.nbytes % _ALIGN))
            out.write(struct.pack("<Q", start))  # where the arrays start, last
    except BaseException:
        remove_share(path)
        raise


def _bad(path: str, what: str) -> ValueError:
    return ValueError(f"{path}: not a node plan shared by its node's first rank ({what}); it was written by "
                      "another version of opt4torch, or damaged: rebuild the loader")


def read_share(path: str) -> NodeShare:
    """Map the share at ``path`` read-only (the arrays stay valid after the
    file is removed) and check it as outside input."""
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    size = len(mm)
    if size < _HEAD.size + 8:
        raise _bad(path, f"{size} bytes")
    magic, version, _, n_text = _HEAD.unpack_from(mm, 0)
    if magic != _MAGIC or version != _VERSION:
        raise _bad(path, f"magic {magic!r}, version {version}")
    if _HEAD.size + n_text > size:
        raise _bad(path, "its header runs past its end")
    try:
        meta = json.loads(bytes(mm[_HEAD.size:_HEAD.size + n_text]))
        (start,) = struct.unpack_from("<Q", mm, size - 8)
        length = int(meta["length"])
        arrays = {}
        for name, dt in _ARRAYS.items():
            off, nbytes = (int(v) for v in meta["arrays"][name])
            dtype = np.dtype(dt)
            if off < 0 or nbytes != length * dtype.itemsize or start + off + nbytes > size - 8:
                raise _bad(path, f"array {name} at {off} of {nbytes} bytes, for {length} positions")
            arrays[name] = np.frombuffer(mm, dtype=dtype, count=length, offset=start + off)
        fig = meta["figures"]
        figures = ClusterFigures(np.asarray(fig["capacities"], dtype=np.int64), dict(fig["info"]),
                                 [dict(d) for d in fig["per_node"]], int(fig["page_size"]),
                                 None if fig["window"] is None else int(fig["window"]))
        node = int(meta["node"])
    except (KeyError, TypeError, ValueError, struct.error) as exc:
        if isinstance(exc, ValueError) and "not a node plan" in str(exc):
            raise
        raise _bad(path, f"{type(exc).__name__}: {exc}") from None
    node_plan = NodePlan(node=node, **{k: v for k, v in arrays.items() if k != "ranks"})
    plan = Plan(_engine.open_plan(path + ".plan"))
    if len(plan) != length:
        raise _bad(path, f"its pool plan has {len(plan)} positions for a node plan of {length}")
    return NodeShare(node_plan=node_plan, ranks=arrays["ranks"], plan=plan, figures=figures)


def remove_share(path: str | None) -> None:
    """Remove a share's files (its ranks' mappings stay valid)."""
    if path is None:
        return
    for p in (path, path + ".plan"):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
