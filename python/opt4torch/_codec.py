"""The codec: what a dataset returns, as raw bytes with a small header.

Stored types: torch tensors (CPU), numpy arrays, bytes/bytearray, str, int,
float, bool, None, PIL images, and tuples, lists and dicts of them. Anything
else only through pickle, and only when the user opts in (``allow_pickle``),
because unpickling runs code.

Layout of one record: ``b"O4"``, a format byte, then one node. A node is a tag
byte and its fields (little-endian). Array payloads start on a 16-byte
boundary of the record, so that decoding can hand out zero-copy views of the
buffer the record was copied into. ``encode`` returns a list of parts (header
bytes and the arrays' own buffers), which the pool gathers without joining
them first.
"""

from __future__ import annotations

import pickle
import struct
import sys
from typing import Any

import numpy as np

__all__ = ["encode", "decode", "decode_at", "encoded_size", "make_arrays", "CodecError"]

MAGIC = b"O4"
FORMAT = 1
ALIGN = 16

(T_NONE, T_TRUE, T_FALSE, T_INT, T_BIGINT, T_FLOAT, T_STR, T_BYTES, T_BYTEARRAY, T_TUPLE, T_LIST,
 T_DICT, T_NDARRAY, T_TENSOR, T_PIL, T_PICKLE) = range(16)

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")

# torch dtypes by code, resolved lazily (torch may not be installed).
_TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32",
                 "int64", "bool", "complex64", "complex128", "uint16", "uint32", "uint64")


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


class _Writer:
    __slots__ = ("head", "parts", "size", "allow_pickle")

    def __init__(self, allow_pickle: bool) -> None:
        self.head = bytearray(MAGIC)
        self.head += _U8.pack(FORMAT)
        self.parts: list[Any] = []
        self.size = 3
        self.allow_pickle = allow_pickle

    def raw(self, b: bytes | bytearray) -> None:
        self.head += b
        self.size += len(b)

    def payload(self, buf: Any, nbytes: int) -> None:
        """An array's bytes: pad the header to ALIGN, then the buffer itself."""
        pad = -(self.size + 8) % ALIGN
        self.raw(_U64.pack(pad))
        self.raw(b"\0" * pad)
        self.parts.append(bytes(self.head))
        self.head = bytearray()
        if nbytes:
            self.parts.append(buf)
        self.size += nbytes

    def finish(self) -> list[Any]:
        if self.head:
            self.parts.append(bytes(self.head))
        return self.parts


def _shape(w: _Writer, shape: tuple[int, ...]) -> None:
    w.raw(_U8.pack(len(shape)))
    for d in shape:
        w.raw(_U64.pack(d))


def _node(w: _Writer, obj: Any) -> None:
    t = type(obj)
    if obj is None:
        w.raw(_U8.pack(T_NONE))
    elif t is bool:
        w.raw(_U8.pack(T_TRUE if obj else T_FALSE))
    elif t is int:
        if -(1 << 63) <= obj < (1 << 63):
            w.raw(_U8.pack(T_INT) + _I64.pack(obj))
        else:
            s = str(obj).encode()
            w.raw(_U8.pack(T_BIGINT) + _U32.pack(len(s)) + s)
    elif t is float:
        w.raw(_U8.pack(T_FLOAT) + _F64.pack(obj))
    elif t is str:
        s = obj.encode("utf-8", "surrogatepass")
        w.raw(_U8.pack(T_STR) + _U64.pack(len(s)) + s)
    elif t is bytes or t is bytearray:
        w.raw(_U8.pack(T_BYTES if t is bytes else T_BYTEARRAY) + _U64.pack(len(obj)))
        w.payload(obj, len(obj))
    elif t is tuple or t is list:
        w.raw(_U8.pack(T_TUPLE if t is tuple else T_LIST) + _U32.pack(len(obj)))
        for x in obj:
            _node(w, x)
    elif t is dict:
        w.raw(_U8.pack(T_DICT) + _U32.pack(len(obj)))
        for k, v in obj.items():
            _node(w, k)
            _node(w, v)
    elif t is np.ndarray:
        _ndarray(w, obj)
    elif t.__module__ == "torch" and t.__name__ in ("Tensor", "Parameter") or _is_tensor(obj):
        _tensor(w, obj)
    elif t.__module__.startswith("PIL.") and hasattr(obj, "tobytes") and hasattr(obj, "mode"):
        _pil(w, obj)
    elif isinstance(obj, np.generic):
        _ndarray(w, np.asarray(obj), scalar=True)
    elif w.allow_pickle:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        w.raw(_U8.pack(T_PICKLE) + _U64.pack(len(data)))
        w.payload(data, len(data))
    else:
        raise CodecError(
            f"cannot cache an object of type {t.__module__}.{t.__qualname__}: the cache stores "
            "tensors, numpy arrays, bytes, str, numbers, PIL images and tuples, lists and dicts of "
            "them. Return one of those from the dataset (and do the rest in a transform), or pass "
            "allow_pickle=True to store it with pickle."
        )


def _is_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _ndarray(w: _Writer, arr: np.ndarray, scalar: bool = False) -> None:
    if arr.dtype.hasobject:
        if not w.allow_pickle:
            raise CodecError("cannot cache a numpy array of Python objects without allow_pickle=True")
        data = pickle.dumps(arr, protocol=pickle.HIGHEST_PROTOCOL)
        w.raw(_U8.pack(T_PICKLE) + _U64.pack(len(data)))
        w.payload(data, len(data))
        return
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make 0-d arrays 1-d)
        arr = arr.copy(order="C")
    dt = arr.dtype.str.encode()
    w.raw(_U8.pack(T_NDARRAY) + _U8.pack(1 if scalar else 0) + _U8.pack(len(dt)) + dt)
    _shape(w, arr.shape)
    # A byte view: memoryview cannot export every dtype (datetime64 is one).
    w.payload(memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else b"", arr.nbytes)


_SHAPE_STRUCTS: dict[int, struct.Struct] = {}


def _shape_struct(ndim: int) -> struct.Struct:
    st = _SHAPE_STRUCTS.get(ndim)
    if st is None:
        st = _SHAPE_STRUCTS[ndim] = struct.Struct(f"<{ndim}Q")
    return st


def _tensor(w: _Writer, t: Any) -> None:
    to_code, _ = _torch_dtype_tables()
    if t.device.type != "cpu":
        raise CodecError(
            f"the cache stores CPU tensors; this one is on {t.device}. Move it to the device in a "
            "transform after the cache (or in the training loop)."
        )
    if t.layout is not _torch_strided():
        raise CodecError("the cache stores dense (strided) tensors only")
    code = to_code.get(t.dtype)
    if code is None:
        raise CodecError(f"the cache cannot store tensors of dtype {t.dtype}")
    if t.requires_grad:
        t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    shape = tuple(t.shape)
    w.raw(_U8.pack(T_TENSOR) + _U8.pack(code) + _U8.pack(len(shape)) + _shape_struct(len(shape)).pack(*shape))
    nbytes = t.numel() * t.element_size()
    # A byte view of the tensor's storage, without a copy (uint8 reinterprets
    # any dtype numpy lacks, such as bfloat16).
    w.payload(memoryview(t.reshape(-1).view(_torch_uint8()).numpy()) if nbytes else b"", nbytes)


_strided = None
_uint8 = None


def _torch_strided() -> Any:
    global _strided
    if _strided is None:
        import torch

        _strided = torch.strided
    return _strided


def _torch_uint8() -> Any:
    global _uint8
    if _uint8 is None:
        import torch

        _uint8 = torch.uint8
    return _uint8


def _pil(w: _Writer, img: Any) -> None:
    mode = img.mode.encode()
    data = img.tobytes()
    w.raw(_U8.pack(T_PIL) + _U8.pack(len(mode)) + mode + _U32.pack(img.size[0]) + _U32.pack(img.size[1]))
    w.raw(_U64.pack(len(data)))
    w.payload(data, len(data))


def encode(obj: Any, allow_pickle: bool = False) -> list[Any]:
    """The record for ``obj`` as a list of buffers (to be concatenated)."""
    w = _Writer(allow_pickle)
    _node(w, obj)
    return w.finish()


def encoded_size(parts: list[Any]) -> int:
    return sum(memoryview(p).nbytes for p in parts)


# ---- decoding ----


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

    def payload(self, nbytes: int) -> memoryview:
        pad = self.unpack(_U64)
        self.take(pad)
        return self.take(nbytes)


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
        scalar = r.u8()
        dt = np.dtype(bytes(r.take(r.u8())).decode())
        shape = r.shape()
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        data = r.payload(n * dt.itemsize)
        arr = np.frombuffer(data, dtype=dt, count=n).reshape(shape)
        return arr[()] if scalar else arr
    if tag == T_TENSOR:
        import torch

        _, by_code = _torch_dtype_tables()
        dtype = by_code[r.u8()]
        shape = r.shape()
        n = 1
        for d in shape:
            n *= d
        data = r.payload(n * dtype.itemsize)
        if n == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(data, dtype=dtype, count=n).view(shape)
    if tag == T_PIL:
        from PIL import Image

        mode = bytes(r.take(r.u8())).decode()
        size = (r.unpack(_U32), r.unpack(_U32))
        data = r.payload(r.unpack(_U64))
        return Image.frombytes(mode, size, bytes(data))
    if tag == T_PICKLE:
        return pickle.loads(r.payload(r.unpack(_U64)))
    raise CodecError(f"unknown tag {tag} in a cache record")


_HEAD = struct.Struct("<2sBB")  # magic, format, top-level tag
_TOP_BYTES = struct.Struct("<QQ")  # length, pad
_TENSOR_HEAD = struct.Struct("<BB")  # dtype code, ndim
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


def _tensor_at(buf: Any, code: int, shape: tuple[int, ...], n: int, pos: int) -> Any:
    """A tensor of n elements of dtype code, a view of buf from pos."""
    import torch

    np_dtype = _numpy_dtypes()[code]
    if np_dtype is not None and n:
        # numpy's view plus from_numpy costs less than torch.frombuffer.
        return torch.from_numpy(np.frombuffer(buf, dtype=np_dtype, count=n, offset=pos).reshape(shape))
    _, by_code = _torch_dtype_tables()
    if n == 0:
        return torch.empty(shape, dtype=by_code[code])
    return torch.frombuffer(buf, dtype=by_code[code], count=n, offset=pos).view(shape)


_DTYPES: dict[str, np.dtype] = {}


def _dtype(s: str) -> np.dtype:
    dt = _DTYPES.get(s)
    if dt is None:
        dt = _DTYPES[s] = np.dtype(s)
    return dt


def make_arrays(buf: Any, runs: list[tuple[int, Any, tuple[int, ...], int, int, int, int]]) -> list[Any]:
    """The arrays and tensors the binding's decoder asks for, as views of buf.

    A run is ``(tag, dtype, shape, offset, scalar, count, stride)``: ``count``
    numpy arrays (``T_NDARRAY``, dtype its ``dtype.str``; numpy scalars when
    scalar is 1) or tensors (``T_TENSOR``, dtype its code) of one shape, whose
    elements start at ``buf[offset + j * stride]``. A run of several becomes
    one strided view split along its first axis (a batch of same-shaped
    samples: one numpy and one torch call for the lot instead of a few per
    sample); anything else, one view at a time. Returns the arrays in order,
    ``count`` per run."""
    out: list[Any] = []
    for tag, dt, shape, offset, scalar, count, stride in runs:
        n = 1
        for d in shape:
            n *= d
        if tag == T_TENSOR:
            np_dtype = _numpy_dtypes()[dt]
            itemsize = _itemsizes()[dt]
        else:
            np_dtype = _dtype(dt)
            itemsize = np_dtype.itemsize
        # (Rows of a stacked numpy array of 0-d arrays would be scalars.)
        if (count < 2 or np_dtype is None or n == 0 or scalar or stride < n * itemsize or stride % itemsize
                or (tag == T_NDARRAY and not shape)):
            for j in range(count):
                off = offset + j * stride
                if tag == T_TENSOR:
                    out.append(_tensor_at(buf, dt, shape, n, off))
                else:
                    arr = np.frombuffer(buf, dtype=np_dtype, count=n, offset=off).reshape(shape)
                    out.append(arr[()] if scalar else arr)
            continue
        strides = [itemsize] * (len(shape) + 1)
        for k in range(len(shape) - 1, 0, -1):
            strides[k] = strides[k + 1] * shape[k]
        strides[0] = stride
        stacked = np.ndarray((count, *shape), dtype=np_dtype, buffer=buf, offset=offset, strides=strides)
        if tag == T_TENSOR:
            import torch

            out.extend(torch.from_numpy(stacked).unbind(0))
        else:
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
    if tag == T_TENSOR:
        code, ndim = _TENSOR_HEAD.unpack_from(buf, pos)
        pos += 2
        shape = _shape_struct(ndim).unpack_from(buf, pos)
        pos += 8 * ndim
        pad = _U64.unpack_from(buf, pos)[0]
        pos += 8 + pad
        n = 1
        for d in shape:
            n *= d
        nbytes = n * _itemsizes()[code]
        if pos + nbytes != end:
            raise CodecError("a cache record's tensor does not fill it")
        return _tensor_at(buf, code, shape, n, pos)
    if tag == T_BYTES or tag == T_BYTEARRAY:
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
