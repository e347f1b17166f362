"""numpy dtypes in the codec's records: a description (``dtype.str``, or
JSON for a structured or subarray dtype) that comes back as the same dtype,
checked once per dtype object, and the dtype read back from it.

May touch: numpy dtypes; nothing else.
"""

from __future__ import annotations

import json
from typing import Any, cast

import numpy as np

from .codec_format import CodecError


_SIMPLE_KINDS = frozenset("biufcmMSUV")


class _Unstorable(Exception):
    """Why a numpy dtype cannot be described (becomes a CodecError)."""


def _dtype_spec(dt: np.dtype) -> Any:
    """A JSON-able description of dt: ``dt.str`` for a plain dtype, a dict
    for a structured or subarray one."""
    if dt.metadata is not None:
        raise _Unstorable(f"its dtype {dt} carries metadata {dt.metadata!r}, which the cache does not keep")
    if dt.subdtype is not None:
        base, shape = dt.subdtype
        return {"sub": _dtype_spec(base), "shape": list(shape)}
    if dt.names is not None:
        if dt.type is not np.void:
            raise _Unstorable(f"its structured dtype has the scalar type {dt.type.__module__}."
                              f"{dt.type.__qualname__} (a record array's); the cache keeps numpy.void ones")
        by_name = dt.fields
        assert by_name is not None  # a dtype with names has fields
        fields = [by_name[n] for n in dt.names]
        return {"names": list(dt.names), "formats": [_dtype_spec(f[0]) for f in fields],
                "offsets": [f[1] for f in fields], "titles": [(f[2:] or (None,))[0] for f in fields],
                "itemsize": dt.itemsize, "aligned": bool(dt.isalignedstruct)}
    if dt.kind not in _SIMPLE_KINDS:
        raise _Unstorable(f"its dtype {dt} ({type(dt).__name__}) is not one the cache stores as bytes")
    return dt.str


def _dtype_from_spec(spec: Any) -> np.dtype:
    if isinstance(spec, str):
        return np.dtype(spec)
    if "sub" in spec:
        return np.dtype((_dtype_from_spec(spec["sub"]), tuple(spec["shape"])))
    return np.dtype({"names": spec["names"], "formats": [_dtype_from_spec(f) for f in spec["formats"]],
                     "offsets": spec["offsets"], "titles": spec["titles"], "itemsize": spec["itemsize"],
                     "aligned": spec["aligned"]})


_DESCS: dict[int, tuple[np.dtype, Any]] = {}


def _dtype_desc(dt: np.dtype) -> bytes:
    """The record's description of dt, checked once per dtype object to come
    back as the same dtype (type, fields, offsets, titles, byte order,
    alignment flag); raises _Unstorable when it would not. Cached by
    identity, since dtypes that compare equal may still differ (metadata)."""
    hit = _DESCS.get(id(dt))
    if hit is not None and hit[0] is dt:
        if isinstance(hit[1], _Unstorable):
            raise hit[1]
        return cast(bytes, hit[1])
    result: Any
    try:
        spec = _dtype_spec(dt)
        text = spec if isinstance(spec, str) else json.dumps(spec, separators=(",", ":"))
        back = _dtype(text)
        if not (back == dt and type(back) is type(dt) and back.isalignedstruct == dt.isalignedstruct
                and repr(back) == repr(dt) and _dtype_spec(back) == spec):
            raise _Unstorable(f"its dtype {dt!r} ({type(dt).__name__}) does not come back from its description "
                              f"(it would be {back!r}); a user-defined numpy dtype is not stored as bytes")
        result = text.encode("ascii")
    except _Unstorable as exc:
        result = exc
    if len(_DESCS) >= 4096:
        _DESCS.clear()
    _DESCS[id(dt)] = (dt, result)
    if isinstance(result, _Unstorable):
        raise result
    return cast(bytes, result)


_DTYPES: dict[str, np.dtype] = {}


def _dtype(s: str) -> np.dtype:
    """The dtype of a record's description (see _dtype_desc), cached."""
    dt = _DTYPES.get(s)
    if dt is None:
        try:
            dt = _dtype_from_spec(json.loads(s)) if s[:1] == "{" else np.dtype(s)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise CodecError(f"a cache record's dtype {s[:80]!r} cannot be read: {exc}") from exc
        if len(_DTYPES) >= 4096:
            _DTYPES.clear()
        _DTYPES[s] = dt
    return dt
