"""OPT4TorchDataset: Belady-optimal (OPT) caching for PyTorch datasets.

The training order a seeded sampler gives is known in advance, so a cache can
evict by Belady's rule. This package captures that order, builds the OPT plan
with a C11 engine, and compares it with online policies.

``import opt4torch`` needs only numpy; torch is imported by the functions that
work with samplers.
"""

from __future__ import annotations

from ._engine import (
    InvalidInputError,
    Opt4Error,
    Opt4IOError,
    Opt4MemoryError,
    PlanFileError,
)
from ._plan import ADMIT, BYPASS, HIT, Plan, fingerprint, load_plan, plan, sequence_plan
from .cachelib import generate_precomputed_file
from .capture import CaptureWarning, capture
from .sim import POLICIES, simulate
from . import reference, traces

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "ADMIT",
    "BYPASS",
    "HIT",
    "CaptureWarning",
    "InvalidInputError",
    "Opt4Error",
    "Opt4IOError",
    "Opt4MemoryError",
    "Plan",
    "PlanFileError",
    "POLICIES",
    "capture",
    "fingerprint",
    "generate_precomputed_file",
    "load_plan",
    "plan",
    "sequence_plan",
    "simulate",
    "reference",
    "traces",
]
