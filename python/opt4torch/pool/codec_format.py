"""The codec's format, as both of its sides use it: the record's magic,
format number, alignment and node tags (taken from the binding, which
defines them once in binding/decode.h), the array flags, the structs the
fields are packed with, the torch dtype codes, and CodecError. The layout
itself is described in codec.py.

May touch: the binding's constants; torch's dtypes, looked up on first use.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from .. import _engine

MAGIC = b"O4"
# The format number, the alignment and the node tags are defined once, in
# binding/decode.h (the C decoder, the prefetcher's framing and the tar
# layout use them there); this module takes them from the binding.
FORMAT = _engine.CODEC_FORMAT
ALIGN = _engine.CODEC_ALIGN
MAX_DEPTH = 200  # containers nested deeper (or containing themselves) are refused

_TAGS = _engine.CODEC_TAGS
T_NONE, T_TRUE, T_FALSE, T_INT, T_BIGINT = _TAGS["NONE"], _TAGS["TRUE"], _TAGS["FALSE"], _TAGS["INT"], _TAGS["BIGINT"]
T_FLOAT, T_STR, T_BYTES, T_BYTEARRAY = _TAGS["FLOAT"], _TAGS["STR"], _TAGS["BYTES"], _TAGS["BYTEARRAY"]
T_TUPLE, T_LIST, T_DICT = _TAGS["TUPLE"], _TAGS["LIST"], _TAGS["DICT"]
T_NDARRAY, T_TENSOR, T_PIL, T_PICKLE, T_COMPLEX = (_TAGS["NDARRAY"], _TAGS["TENSOR"], _TAGS["PIL"],
                                                   _TAGS["PICKLE"], _TAGS["COMPLEX"])

# Array flags. F_SCALAR: a numpy scalar (a 0-d array, returned as arr[()]).
# F_READONLY: a numpy array that was not writeable. F_PERM: a dimension order
# follows the shape. F_GRAD: a tensor that requires grad. F_PARAM: a
# torch.nn.Parameter.
F_SCALAR, F_READONLY, F_PERM, F_GRAD, F_PARAM = 1, 2, 4, 8, 16
_NDARRAY_FLAGS = F_SCALAR | F_READONLY | F_PERM
_TENSOR_FLAGS = F_PERM | F_GRAD | F_PARAM

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")

# torch dtypes by code, resolved lazily (torch may not be installed).
# Codes are the format: append only (binding/_engine.c has their item sizes).
_TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32",
                 "int64", "bool", "complex64", "complex128", "uint16", "uint32", "uint64", "complex32",
                 "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


class CodecError(TypeError):
    """An object the cache cannot store (or a record it cannot read)."""


def _torch_tables() -> tuple[dict[Any, int], list[Any]]:
    import torch

    by_code = [getattr(torch, name, None) for name in _TORCH_DTYPES]
    return {dt: code for code, dt in enumerate(by_code) if dt is not None}, by_code


_tables: tuple[dict[Any, int], list[Any]] | None = None


def _torch_dtype_tables() -> tuple[dict[Any, int], list[Any]]:
    global _tables
    if _tables is None:
        _tables = _torch_tables()
    return _tables


_SHAPE_STRUCTS: dict[int, struct.Struct] = {}


def _shape_struct(ndim: int) -> struct.Struct:
    st = _SHAPE_STRUCTS.get(ndim)
    if st is None:
        st = _SHAPE_STRUCTS[ndim] = struct.Struct(f"<{ndim}Q")
    return st


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for k, d in enumerate(perm):
        inv[d] = k
    return tuple(inv)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


_ITEMSIZE: list[int] | None = None


def _itemsizes() -> list[int]:
    global _ITEMSIZE
    if _ITEMSIZE is None:
        _, by_code = _torch_dtype_tables()
        _ITEMSIZE = [dt.itemsize if dt is not None else 0 for dt in by_code]
    return _ITEMSIZE


_NP_DTYPES: list[Any] | None = None


def _numpy_dtypes() -> list[Any]:
    """numpy's dtype for each torch dtype code, or None where numpy has none
    (bfloat16) or torch.from_numpy would not give the same dtype."""
    global _NP_DTYPES
    if _NP_DTYPES is None:
        names = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "uint8": "u1", "int8": "i1",
                 "int16": "<i2", "int32": "<i4", "int64": "<i8", "bool": "?", "complex64": "<c8",
                 "complex128": "<c16"}
        _NP_DTYPES = [np.dtype(names[n]) if n in names else None for n in _TORCH_DTYPES]
    return _NP_DTYPES
