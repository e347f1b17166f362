"""What the benchmarks record about the machine they ran on."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def machine(packages: tuple[str, ...] = ("numpy", "opt4torchdataset", "libcachesim", "torch")) -> dict[str, Any]:
    """Python, platform, cores, CPU model, memory, the load average now, and
    the versions of the installed ``packages``."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, StopIteration):
        pass
    for pkg in packages:
        try:
            info[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return info
