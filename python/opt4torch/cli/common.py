"""What several of the command's subcommands share: the usage error and the
check of an output path, capacities and traces from the command line, text
tables, a plan's totals in words.

May touch: the paths it is given (checked, not written), trace files (read);
nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .._engine import Opt4Error
from ..io.files import output_path
from ..lab.traces import load_trace
from ..planning.plan import Plan


class UsageError(Exception):
    """A command line that cannot be run as given; the message says why."""


def check_output(path: str, what: str = "output") -> str:
    """A path from the user for a file to write: refused early, with the
    reason, if it cannot be one."""
    if path and os.path.isdir(path):
        raise UsageError(f"--{what} {path!r} is a directory; give a file name")
    try:
        # A device, a FIFO, a link to one, a file on the way: refused before any work.
        return output_path(path, parent_must_exist=False)
    except Opt4Error as exc:
        raise UsageError(f"--{what}: {getattr(exc, 'detail', '') or exc}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--{what}: {exc}") from None


# ---- shared output helpers ----


def text_table(rows: Sequence[Sequence[str]], align: str = "l") -> str:
    """Rows of cells (the first row the header) as aligned text: each column
    as wide as its widest cell, two spaces between columns whatever the
    content. ``align`` gives each column's alignment in turn ("l" or "r");
    the columns past its end are right-aligned (numbers)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if align[i:i + 1] == "l" else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows)

# ---- shared parsing helpers ----


def capacity_percent(part: str) -> float | None:
    """A capacity written as a percentage of the items ('25%'), checked to be
    above 0 and at most 100; None when it does not parse as one (the caller
    says what is wrong with it)."""
    try:
        percent = float(part[:-1])
    except ValueError:
        return None
    if not 0 < percent <= 100:
        raise UsageError(f"capacity {part!r}: a percentage of the items must be above 0 % and "
                         "at most 100 % (a cache larger than the data holds all of it)")
    return percent


def trace_arg(path: str) -> np.ndarray:
    """--trace PATH loaded, or a usage error naming what PATH is instead of a
    trace file (a folder, a file that cannot be read)."""
    if os.path.isdir(path):
        raise UsageError(f"--trace {path!r} is a folder; give a trace file (text, one id per line, or .npy)")
    try:
        return load_trace(path)
    except OSError as exc:
        raise UsageError(f"--trace {path!r}: {exc.strerror or exc}") from None


def parse_capacities(text: str, items: int | None) -> list[int]:
    """'100,500' or '10%,50%' (of items) -> capacities in items."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if part.endswith("%"):
                if items is None:
                    raise UsageError(f"capacity {part!r} is a percentage but the item count is unknown")
                percent = capacity_percent(part)
                if percent is None:
                    raise ValueError(part)
                value = max(1, round(percent / 100.0 * items))
            else:
                value = int(part)
        except ValueError:
            raise UsageError(f"capacity {part!r} is not an integer or a percentage like 25%") from None
        if value < 1:
            raise UsageError(f"capacity {part!r}: a cache must hold at least one item")
        out.append(value)
    if not out:
        raise UsageError("no capacity given")
    return out


def misses_text(p: Plan) -> str:
    """The misses, split two ways, each into parts that add up to them:
    why (an item's first read, which no cache avoids, or a later read of an
    item the plan did not keep) and what the cache did (stored the item or
    let it pass). A compulsory miss is admitted or bypassed like any other,
    so the two splits overlap; within each, the parts do not."""
    first = p.compulsory_misses
    return (f"{p.misses:,} = {first:,} compulsory (an item's first read) + {p.misses - first:,} capacity "
            f"(read before, not kept) = {p.admits:,} admitted (stored) + {p.bypasses:,} bypassed (not stored)")


def plan_summary(p: Plan) -> str:
    if not p.has_decisions:
        return f"{p.accesses:,} accesses over {p.items:,} items (sequence only: no capacity given)"
    return (
        f"{p.accesses:,} accesses over {p.items:,} items, capacity {p.capacity:,} ({p.policy}): "
        f"hits {p.hits:,} ({p.hit_rate:.2%}), misses {misses_text(p)}"
    )


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
