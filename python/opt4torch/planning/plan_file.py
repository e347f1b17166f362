"""Opening a plan file (docs/plan-format.md): the path checked, the engine's
reader called, and its refusals made clear: a record file or an earlier
OPT4TorchDataSet pickle named as what it is, with what to do. The earlier
design's pickled precomputed files are read only on request (unpickling runs
code), as their sequence.

May touch: the file at the path (read; its first bytes looked at for the
hints), pickle only with allow_pickle; never a pool.
"""

from __future__ import annotations

import os

import numpy as np

from .. import _engine
from .._engine import PlanFileError

__all__ = ["open_plan_file"]


_BAD_MAGIC_HINT = (
    " If this file came from the earlier OPT4TorchDataSet (a pickle), it cannot be "
    "read: regenerate it with `opt4torch precompute` or generate_precomputed_file()."
)


_RECORDS_HINT = (
    " It is an opt4 record file (a dataset, written by write_records or `opt4torch pack`), not a "
    "plan: read it with opt4torch.records.RecordFile; `opt4torch inspect` describes it."
)


def _starts_with(path: str, magic: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def _is_pickle(path: str) -> bool:
    """Whether the file starts as a pickle of protocol 2 or later does (what
    the earlier design's precompute step wrote)."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return False
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def _legacy_sequence(path: str) -> np.ndarray:
    """The earlier design's precomputed file: a pickled dict whose
    ``future_index`` is the captured sequence. Only on explicit request:
    unpickling runs whatever code the file names."""
    import pickle

    with open(path, "rb") as f:
        obj = pickle.load(f)  # noqa: S301 - the caller passed allow_pickle=True
    seq = obj.get("future_index") if isinstance(obj, dict) else obj
    if seq is None:
        raise PlanFileError(f"{path}: a pickle without 'future_index': not an earlier "
                            "OPT4TorchDataSet precomputed file")
    try:
        return np.asarray(seq, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise PlanFileError(f"{path}: its 'future_index' is not a sequence of item ids ({exc})") from None


def open_plan_file(path: str, *, allow_pickle: bool) -> _engine.Plan | np.ndarray:
    """The engine's plan read from ``path`` into memory of its own and
    validated; or, for an earlier OPT4TorchDataSet pickle and only with
    ``allow_pickle``, its sequence of item ids (the caller makes it a
    sequence-only plan)."""
    if "\0" in path:
        raise ValueError(f"{path!r}: a path cannot contain a NUL byte")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no plan file at {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a directory, not a plan file")
    try:
        return _engine.open_plan(path)
    except PlanFileError as exc:
        if getattr(exc, "code_name", "") == "OPT4_EBADMAGIC" and _is_pickle(path):
            if allow_pickle:
                return _legacy_sequence(path)
            raise _with_message(exc, f"{path}: {exc}. It is a pickle, from the earlier "
                                "OPT4TorchDataSet: unpickling runs code from the file, so it is "
                                "refused. Regenerate it with `opt4torch precompute`, or, if you "
                                "trust the file, load_plan(path, allow_pickle=True) and save() "
                                "the result as a plan file") from None
        hint = ""
        if getattr(exc, "code_name", "") == "OPT4_EBADMAGIC":
            hint = _RECORDS_HINT if _starts_with(path, b"OPT4REC\0") else _BAD_MAGIC_HINT
        raise _with_message(exc, f"{path}: {exc}{hint}") from None


def _with_message(exc: BaseException, message: str) -> BaseException:
    """The same kind of engine error with a fuller message, keeping .code,
    .code_name and .detail."""
    new = type(exc)(message)
    for attr in ("code", "code_name", "detail"):
        if hasattr(exc, attr):
            setattr(new, attr, getattr(exc, attr))
    return new
