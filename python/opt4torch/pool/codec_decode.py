"""The codec's decoder in Python: the object of a record, and make_arrays,
the arrays and tensors the C decoder of the batch path (binding/decode.c)
asks for as views of the batch's buffer. Where the C decoder declines a
record (PIL images, pickles, big ints, complex numbers, structured dtypes),
decode_at reads it.

May touch: the buffer it is given (views of it are handed out when it is
writable), pickle for the records an encoder with allow_pickle wrote, torch
and PIL when a record holds theirs; never a pool.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

import numpy as np

from .codec_dtypes import _dtype
from .codec_format import (
    _F64, _I64, _NDARRAY_FLAGS, _TENSOR_FLAGS, _U32, _U64, F_GRAD, F_PARAM, F_PERM, F_READONLY, F_SCALAR,
    FORMAT, MAGIC, T_BIGINT, T_BYTEARRAY, T_BYTES, T_COMPLEX, T_DICT, T_FALSE, T_FLOAT, T_INT, T_LIST,
    T_NDARRAY, T_NONE, T_PICKLE, T_PIL, T_STR, T_TENSOR, T_TRUE, T_TUPLE, CodecError, _inverse,
    _itemsizes, _numpy_dtypes, _prod, _shape_struct, _torch_dtype_tables,
)


class _Reader:
    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def take(self, n: int) -> memoryview:
        if self.pos + n > self.end:
            raise CodecError("truncated cache record")
        v = self.buf[self.pos : self.pos + n]
        self.pos += n
        return v

    def u8(self) -> int:
        return self.take(1)[0]

    def unpack(self, s: struct.Struct) -> Any:
        return s.unpack(self.take(s.size))[0]

    def shape(self) -> tuple[int, ...]:
        n = self.u8()
        return tuple(self.unpack(_U64) for _ in range(n))

    def perm(self, flags: int, allowed: int, ndim: int) -> tuple[int, ...] | None:
        if flags & ~allowed:
            raise CodecError(f"unknown array flags {flags:#x} in a cache record")
        if not flags & F_PERM:
            return None
        return _check_perm(tuple(self.take(ndim)))

    def payload(self, nbytes: int) -> memoryview:
        pad = self.unpack(_U64)
        self.take(pad)
        return self.take(nbytes)


def _check_perm(perm: tuple[int, ...]) -> tuple[int, ...]:
    if sorted(perm) != list(range(len(perm))):
        raise CodecError("a cache record's dimension order is not a permutation")
    return perm


def _read(r: _Reader) -> Any:
    tag = r.u8()
    if tag == T_NONE:
        return None
    if tag == T_TRUE:
        return True
    if tag == T_FALSE:
        return False
    if tag == T_INT:
        return r.unpack(_I64)
    if tag == T_BIGINT:
        return int(bytes(r.take(r.unpack(_U32))))
    if tag == T_FLOAT:
        return r.unpack(_F64)
    if tag == T_COMPLEX:
        return complex(r.unpack(_F64), r.unpack(_F64))
    if tag == T_STR:
        return str(r.take(r.unpack(_U64)), "utf-8", "surrogatepass")
    if tag in (T_BYTES, T_BYTEARRAY):
        n = r.unpack(_U64)
        data = r.payload(n)
        return bytes(data) if tag == T_BYTES else bytearray(data)
    if tag in (T_TUPLE, T_LIST):
        n = r.unpack(_U32)
        items = [_read(r) for _ in range(n)]
        return tuple(items) if tag == T_TUPLE else items
    if tag == T_DICT:
        n = r.unpack(_U32)
        out = {}
        for _ in range(n):
            k = _read(r)
            out[k] = _read(r)
        return out
    if tag == T_NDARRAY:
        flags = r.u8()
        dt = _dtype(str(r.take(r.unpack(_U32)), "ascii"))
        shape = r.shape()
        perm = r.perm(flags, _NDARRAY_FLAGS, len(shape))
        n = _prod(shape)
        return _make_ndarray(r.payload(n * dt.itemsize), dt, shape, flags, perm, n, 0)
    if tag == T_TENSOR:
        code, flags = r.u8(), r.u8()
        if code >= len(_itemsizes()) or _itemsizes()[code] == 0:
            raise CodecError(f"unknown tensor dtype code {code} in a cache record")
        shape = r.shape()
        perm = r.perm(flags, _TENSOR_FLAGS, len(shape))
        n = _prod(shape)
        return _make_tensor(r.payload(n * _itemsizes()[code]), code, shape, flags, perm, n, 0)
    if tag == T_PIL:
        from PIL import Image

        mode = bytes(r.take(r.u8())).decode()
        size = (r.unpack(_U32), r.unpack(_U32))
        pal_mode = bytes(r.take(r.u8())).decode()
        pal = bytes(r.take(r.unpack(_U32)))
        info = _read(r)
        data = r.payload(r.unpack(_U64))
        img = Image.frombytes(mode, size, bytes(data))
        if pal_mode:
            img.putpalette(pal, pal_mode)
        img.info = info
        return img
    if tag == T_PICKLE:
        return pickle.loads(r.payload(r.unpack(_U64)))
    raise CodecError(f"unknown tag {tag} in a cache record")


_HEAD = struct.Struct("<2sBB")  # magic, format, top-level tag
_TOP_BYTES = struct.Struct("<QQ")  # length, pad
_TENSOR_HEAD = struct.Struct("<BBB")  # dtype code, flags, ndim


def _tensor_at(buf: Any, code: int, shape: tuple[int, ...], n: int, pos: int) -> Any:
    """A C-contiguous tensor of n elements of dtype code from buf[pos:]: a
    view of buf when buf is writable, else a copy (a tensor has no read-only
    flag, and the dataset's was writable)."""
    import torch

    _, by_code = _torch_dtype_tables()
    if n == 0:
        return torch.empty(shape, dtype=by_code[code])
    np_dtype = _numpy_dtypes()[code]
    if np_dtype is not None:
        # numpy's view plus from_numpy costs less than torch.frombuffer.
        a = np.frombuffer(buf, dtype=np_dtype, count=n, offset=pos)
        if not a.flags.writeable:
            a = a.copy()
        return torch.from_numpy(a.reshape(shape))
    a = np.frombuffer(buf, dtype=np.uint8, count=n * _itemsizes()[code], offset=pos)
    if not a.flags.writeable:
        a = a.copy()
    return torch.from_numpy(a).view(by_code[code]).view(shape)


def _tensor_flags(t: Any, flags: int) -> Any:
    """requires_grad and Parameter, as the dataset's tensor had them: a leaf
    of its own (detached from the batch view it was cut from)."""
    if flags & (F_GRAD | F_PARAM):
        t = t.detach()
        if flags & F_PARAM:
            import torch

            return torch.nn.Parameter(t, requires_grad=bool(flags & F_GRAD))
        t.requires_grad_(True)
    return t


def _make_tensor(buf: Any, code: int, shape: tuple[int, ...], flags: int, perm: tuple[int, ...] | None,
                 n: int, pos: int) -> Any:
    """The tensor a record's node describes, from its payload at buf[pos:]."""
    if perm is None:
        t = _tensor_at(buf, code, shape, n, pos)
    else:
        t = _tensor_at(buf, code, tuple(shape[d] for d in perm), n, pos).permute(_inverse(perm))
    return _tensor_flags(t, flags)


def _make_ndarray(buf: Any, dt: np.dtype, shape: tuple[int, ...], flags: int, perm: tuple[int, ...] | None,
                  n: int, pos: int) -> Any:
    """The numpy array (or scalar) a record's node describes, from its
    payload at buf[pos:]: a view of buf, or a copy where buf is read-only and
    the dataset's array was writeable."""
    stored = shape if perm is None else tuple(shape[d] for d in perm)
    if not flags & (F_READONLY | F_SCALAR) and memoryview(buf).readonly:
        # The dataset's array was writeable: a copy of the bytes (padding
        # of structured dtypes included, which ndarray.copy would not keep).
        buf, pos = bytearray(memoryview(buf)[pos:pos + n * dt.itemsize]), 0
    if dt.itemsize == 0:  # nothing to read (np.frombuffer refuses itemsize 0)
        arr = np.zeros(stored, dtype=dt)
    else:
        arr = np.frombuffer(buf, dtype=dt, count=n, offset=pos).reshape(stored)
    if flags & F_SCALAR:
        return arr[()]
    if perm is not None:
        arr = arr.transpose(_inverse(perm))
    if flags & F_READONLY:
        arr.flags.writeable = False
    return arr


def make_arrays(buf: Any, runs: list[tuple[int, Any, tuple[int, ...], int, int, int, int, Any]]) -> list[Any]:
    """The arrays and tensors the binding's decoder asks for, as views of buf.

    A run is ``(tag, dtype, shape, offset, flags, count, stride, perm)``:
    ``count`` numpy arrays (``T_NDARRAY``, dtype its description) or tensors
    (``T_TENSOR``, dtype its code) of one header (shape, flags and dimension
    order ``perm``, a tuple or None), whose payloads start at
    ``buf[offset + j * stride]``. A run of several becomes one strided view
    split along its first axis (a batch of same-shaped samples: one numpy and
    one torch call for the lot instead of a few per sample); anything else,
    one view at a time, made as the codec's decoder makes it. Returns the
    arrays in order, ``count`` per run."""
    out: list[Any] = []
    writable = not memoryview(buf).readonly
    for tag, dt, shape, offset, flags, count, stride, perm in runs:
        n = _prod(shape)
        if tag == T_TENSOR:
            np_dtype = _numpy_dtypes()[dt]
            itemsize = _itemsizes()[dt]
        else:
            np_dtype = _dtype(dt)
            itemsize = np_dtype.itemsize
        # (Rows of a stacked numpy array of 0-d arrays would be scalars.)
        if (count < 2 or np_dtype is None or n == 0 or itemsize == 0 or flags & F_SCALAR or not writable
                or stride < n * itemsize or stride % itemsize or (tag == T_NDARRAY and not shape)):
            for j in range(count):
                off = offset + j * stride
                if tag == T_TENSOR:
                    out.append(_make_tensor(buf, dt, shape, flags, perm, n, off))
                else:
                    out.append(_make_ndarray(buf, np_dtype, shape, flags, perm, n, off))
            continue
        stored = shape if perm is None else tuple(shape[d] for d in perm)
        strides = [itemsize] * (len(shape) + 1)
        for k in range(len(shape) - 1, 0, -1):
            strides[k] = strides[k + 1] * stored[k]
        strides[0] = stride
        stacked = np.ndarray((count, *stored), dtype=np_dtype, buffer=buf, offset=offset, strides=strides)
        axes = None if perm is None else (0, *(1 + d for d in _inverse(perm)))
        if tag == T_TENSOR:
            import torch

            ts = torch.from_numpy(stacked)
            if axes is not None:
                ts = ts.permute(axes)
            parts = ts.unbind(0)
            out.extend(_tensor_flags(x, flags) for x in parts) if flags & (F_GRAD | F_PARAM) else out.extend(parts)
        else:
            if axes is not None:
                stacked = stacked.transpose(axes)
            if flags & F_READONLY:
                stacked.flags.writeable = False
            out.extend(stacked)
    return out


def decode_at(buf: Any, offset: int, length: int) -> Any:
    """The object of the record at ``buf[offset:offset + length]``. Arrays,
    tensors and bytearrays are views of ``buf`` when it is writable (a
    bytearray), so keep it alive as long as they are. The common top-level
    types are parsed with one unpack each; the rest goes through the general
    reader."""
    if length < 4:
        raise CodecError("not a cache record")
    magic, fmt, tag = _HEAD.unpack_from(buf, offset)
    if magic != MAGIC:
        raise CodecError("not a cache record")
    if fmt != FORMAT:
        raise CodecError(f"cache record format {fmt} is not {FORMAT}")
    pos = offset + 4
    end = offset + length
    if tag == T_TENSOR and length >= 7:
        code, flags, ndim = _TENSOR_HEAD.unpack_from(buf, pos)
        if flags == 0 and code < len(_itemsizes()) and _itemsizes()[code] and pos + 3 + 8 * ndim + 8 <= end:
            pos += 3
            shape = _shape_struct(ndim).unpack_from(buf, pos)
            pos += 8 * ndim
            pad = _U64.unpack_from(buf, pos)[0]
            pos += 8 + pad
            n = _prod(shape)
            if pos + n * _itemsizes()[code] != end:
                raise CodecError("a cache record's tensor does not fill it")
            return _tensor_at(buf, code, shape, n, pos)
    if (tag == T_BYTES or tag == T_BYTEARRAY) and length >= 20:
        n, pad = _TOP_BYTES.unpack_from(buf, pos)
        pos += 16 + pad
        if pos + n != end:
            raise CodecError("a cache record's bytes do not fill it")
        view = memoryview(buf)[pos:end]
        return bytes(view) if tag == T_BYTES else bytearray(view)
    view = memoryview(buf).cast("B")[offset:end]
    r = _Reader(view)
    r.pos = 3
    obj = _read(r)
    if r.pos != r.end:
        raise CodecError("trailing bytes after a cache record")
    return obj


def decode(buf: Any) -> Any:
    """The object of one record (all of ``buf``); see :func:`decode_at`."""
    return decode_at(buf, 0, memoryview(buf).nbytes)
