"""Removing pools: this run's at exit and on SIGTERM/SIGHUP, dead runs' when a
new cache starts.

Every :class:`~opt4torch.pool.cache.OPTCache` a process owns is listed here
(weakly) from its creation; the handlers unlink them all and then chain to
whatever handler was installed before. May touch: the binding's pool list
and removal (``_engine.pool_list``, ``pool_remove``, ``remove_owned_pools``),
signal handlers of the main thread, atexit. Nothing else.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref
from typing import TYPE_CHECKING, Any

from .. import _engine

if TYPE_CHECKING:
    from .cache import OPTCache

__all__ = ["remove_stale_pools", "track"]

_live_caches: weakref.WeakSet[OPTCache] = weakref.WeakSet()
_handlers_installed = False
_previous_handlers: dict[int, Any] = {}


def track(cache: OPTCache) -> None:
    """Unlink ``cache``'s pool when the process exits or is terminated."""
    _live_caches.add(cache)
    install_handlers()


def _unlink_all(finish: bool = True) -> None:
    for cache in list(_live_caches):
        cache._unlink(finish)


def _on_signal(signum: int, frame: Any) -> None:
    _unlink_all(finish=False)  # a cluster's transfer thread stops at once: no waiting in a handler
    # And any pool made but not yet handed to an OPTCache (the signal came
    # during a constructor): the engine lists them from their creation on.
    _engine.remove_owned_pools()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    else:  # re-deliver with the default action
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install_handlers() -> None:
    """atexit, plus SIGTERM and SIGHUP (SIGINT becomes KeyboardInterrupt,
    which unwinds to atexit). Only from the main thread, chaining to any
    handler already there."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_unlink_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        current = signal.getsignal(sig)
        if current in (signal.SIG_IGN,) or current is None:
            continue
        _previous_handlers[sig] = current
        signal.signal(sig, _on_signal)


def remove_stale_pools() -> list[dict[str, Any]]:
    """Remove this user's pools whose owner process is gone; never a live
    job's, in this PID namespace or another (a container sharing /dev/shm):
    an owner holds a lock on its pool that the kernel drops when it dies,
    and a pool whose owner is in another namespace without such a lock is
    kept (``opt4torch cleanup --force`` removes those). Returns what was
    removed."""
    removed = []
    for entry in _engine.pool_list():
        if entry["owner_alive"]:
            continue
        try:
            _engine.pool_remove(entry["name"])
            removed.append(entry)
        except _engine.Opt4Error:
            pass  # someone else removed it first, or it came alive
    return removed
