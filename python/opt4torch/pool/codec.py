"""The codec: what a dataset returns, as raw bytes with a small header.

A hit returns what the dataset returned: the same type, dtype (structured,
byte order and subarray fields included), shape, values and flags. Stored
natively: torch tensors (CPU, dense, plain ``torch.Tensor`` or
``torch.nn.Parameter``, with ``requires_grad``), numpy arrays (exactly
``numpy.ndarray``, with the writeable flag) and numpy scalars, bytes,
bytearray, str, int, float, complex, bool, None, PIL images (plain
``PIL.Image.Image``, with palette and ``info``), and tuples, lists and dicts
of them. Arrays and tensors that are dense in some dimension order (C,
Fortran, channels-last, any transpose) keep their strides; other views come
back C-contiguous. Anything else is refused when it is encoded (on the miss
that would store it), with a message naming the type and what to do, or
stored with pickle when the user opts in (``allow_pickle``), because
unpickling runs code. docs/runtime.md ("What is cached") has the full table.

Layout of one record: ``b"O4"``, a format byte, then one node. A node is a tag
byte and its fields (little-endian). Array payloads start on a 16-byte
boundary of the record, so that decoding can hand out zero-copy views of the
buffer the record was copied into. ``encode`` returns a list of parts (header
bytes and the arrays' own buffers), which the pool gathers without joining
them first. The C decoder of the batch path (binding/decode.c) reads the
same format; where it declines a record, this module decodes it. The C
encoder (binding/encode.c) writes it for plain values, part for part what
:func:`encode_py` writes; it leaves everything else to this module.

Array nodes (format 2):

- ``T_NDARRAY flags:u8 dtlen:u32 dtype:dtlen ndim:u8 shape:u64*ndim
  [perm:u8*ndim] pad:u64 zeros:pad payload``. ``dtype`` is ``dtype.str``
  for a plain dtype, or a JSON description (starting with ``{``) of a
  structured one, which the C decoder leaves to this module.
- ``T_TENSOR code:u8 flags:u8 ndim:u8 shape:u64*ndim [perm:u8*ndim] pad:u64
  zeros:pad payload``.

``shape`` is the array's own; ``perm`` (present when flags has ``F_PERM``)
lists its dimensions from outermost to innermost in memory, and the payload
is the elements in that order (the array transposed by ``perm``, which is
C-contiguous).

May touch: the bytes it is given and the binding's encoder and decoder;
pickle only with allow_pickle; never a pool.
"""

from __future__ import annotations

import json
import pickle
import struct
import sys
from typing import Any, cast

import numpy as np

from .. import _engine

__all__ = ["encode", "decode", "decode_at", "encoded_size", "make_arrays", "CodecError"]

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


def _shape(w: _Writer, shape: tuple[int, ...], perm: tuple[int, ...] | None = None) -> None:
    w.raw(_U8.pack(len(shape)) + _shape_struct(len(shape)).pack(*shape))
    if perm is not None:
        w.raw(bytes(perm))


def _type_name(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__


def _other(w: _Writer, obj: Any, why: str, instead: str) -> None:
    """An object the cache cannot return as it is: pickled when the user
    allowed it, else refused, saying what it is and what to do."""
    if not w.allow_pickle:
        raise CodecError(f"cannot cache an object of type {_type_name(obj)}: {why}. {instead}, or pass "
                         "allow_pickle=True to store it with pickle.")
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise CodecError(f"cannot cache an object of type {_type_name(obj)}: {why}, and pickle fails on it "
                         f"too ({type(exc).__name__}: {exc}). {instead}.") from exc
    w.raw(_U8.pack(T_PICKLE) + _U64.pack(len(data)))
    w.payload(data, len(data))


_STORED = ("tensors, numpy arrays and scalars, bytes, bytearray, str, int, float, complex, bool, None, PIL "
           "images and tuples, lists and dicts of them")


def _node(w: _Writer, obj: Any, depth: int = 0) -> None:
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
    elif t is tuple or t is list or t is dict:
        if depth >= MAX_DEPTH:
            raise CodecError(f"cannot cache a {t.__name__} nested more than {MAX_DEPTH} deep (or one that "
                             "contains itself): flatten what the dataset returns")
        if t is dict:
            w.raw(_U8.pack(T_DICT) + _U32.pack(len(obj)))
            for k, v in obj.items():
                _node(w, k, depth + 1)
                _node(w, v, depth + 1)
        else:
            w.raw(_U8.pack(T_TUPLE if t is tuple else T_LIST) + _U32.pack(len(obj)))
            for x in obj:
                _node(w, x, depth + 1)
    elif t is np.ndarray:
        _ndarray(w, obj)
    elif t is complex:
        w.raw(_U8.pack(T_COMPLEX) + _F64.pack(obj.real) + _F64.pack(obj.imag))
    elif _is_tensor(obj):
        _tensor(w, obj)
    elif isinstance(obj, np.generic):
        if obj.dtype.type is not t:
            _other(w, obj, f"a subclass of numpy.{obj.dtype.type.__name__}; a hit would return the plain "
                   "numpy type", "Return a plain numpy scalar")
        else:
            _ndarray(w, np.asarray(obj), scalar=True)
    elif isinstance(obj, np.ndarray):
        _other(w, obj, "a subclass of numpy.ndarray; a hit would return a plain numpy.ndarray",
               "Return np.asarray(x) (a memmap slice: np.array(x) to copy it out of the file)")
    elif t.__module__.startswith("PIL.") and hasattr(obj, "tobytes") and hasattr(obj, "mode"):
        _pil(w, obj, depth)
    elif isinstance(obj, tuple) and hasattr(t, "_fields"):
        _other(w, obj, "a namedtuple; a hit would return a plain tuple", "Return a tuple or a dict")
    else:
        _other(w, obj, f"the cache stores {_STORED}", "Return one of those from the dataset (and do the "
               "rest in a transform)")


def _is_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _dense_order(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, ...] | None:
    """The dimensions of a dense, non-overlapping layout from outermost to
    innermost in memory (an array transposed by it is C-contiguous), or None
    when the elements have gaps, overlap or run backwards. Dimensions of
    length 1 address nothing: where they go does not matter."""
    order = tuple(sorted(range(len(shape)), key=lambda d: -strides[d]))
    expected = itemsize
    for d in reversed(order):
        if shape[d] > 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return order


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for k, d in enumerate(perm):
        inv[d] = k
    return tuple(inv)


# ---- numpy dtypes: a description that comes back as the same dtype ----

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


def _ndarray(w: _Writer, arr: np.ndarray, scalar: bool = False) -> None:
    what = "a numpy scalar" if scalar else "a numpy array"
    if arr.dtype.hasobject:
        _other(w, arr[()] if scalar else arr, f"{what} of dtype {arr.dtype} holds Python objects, not bytes",
               "Convert it to a fixed-size dtype")
        return
    try:
        dt = _dtype_desc(arr.dtype)
    except _Unstorable as exc:
        _other(w, arr[()] if scalar else arr, f"{what}: {exc}", "Convert it (arr.astype(...)) to a plain dtype")
        return
    flags = F_SCALAR if scalar else 0
    if not scalar and not arr.flags.writeable:
        flags |= F_READONLY
    perm = None
    if not arr.flags.c_contiguous:
        perm = _dense_order(arr.shape, arr.strides, arr.itemsize)
        if perm is None:  # gaps, overlaps or backwards: the elements, C-contiguous
            arr = arr.copy(order="C")
        else:
            flags |= F_PERM
    w.raw(_U8.pack(T_NDARRAY) + _U8.pack(flags) + _U32.pack(len(dt)) + dt)
    _shape(w, arr.shape, perm)
    if perm is not None:
        arr = arr.transpose(perm)
    # A byte view: memoryview cannot export every dtype (datetime64 is one).
    w.payload(memoryview(arr.reshape(-1).view(np.uint8)) if arr.nbytes else b"", arr.nbytes)


_SHAPE_STRUCTS: dict[int, struct.Struct] = {}


def _shape_struct(ndim: int) -> struct.Struct:
    st = _SHAPE_STRUCTS.get(ndim)
    if st is None:
        st = _SHAPE_STRUCTS[ndim] = struct.Struct(f"<{ndim}Q")
    return st


def _tensor(w: _Writer, t: Any) -> None:
    import torch

    to_code, _ = _torch_dtype_tables()
    flags = 0
    if type(t) is torch.nn.Parameter:
        flags |= F_PARAM
    elif type(t) is not torch.Tensor:
        _other(w, t, "a subclass of torch.Tensor; a hit would return a plain tensor",
               "Return t.as_subclass(torch.Tensor) and wrap it again in a transform")
        return
    if t.device.type != "cpu":
        raise CodecError(
            f"the cache stores CPU tensors; this one is on {t.device}. Move it to the device in a "
            "transform after the cache (or in the training loop)."
        )
    if t.layout is not _torch_strided():
        _other(w, t, f"a {t.layout} tensor; the cache stores dense (strided) ones", "Return t.to_dense()")
        return
    code = to_code.get(t.dtype)
    if code is None:
        _other(w, t, f"the cache cannot store tensors of dtype {t.dtype}", "Convert it (t.dequantize() for "
               "a quantized tensor, t.to(...) otherwise)")
        return
    if t.requires_grad:
        if t.grad_fn is not None:
            raise CodecError(
                f"cannot cache a tensor that requires grad and was computed by an operation ({t.grad_fn.name()}): "
                "its autograd graph cannot be stored. Return t.detach() (and call requires_grad_() in a "
                "transform if the training loop needs it).")
        flags |= F_GRAD
    if t.__dict__:
        _other(w, t, f"a tensor with Python attributes ({', '.join(map(str, t.__dict__))}), which the cache "
               "does not keep", "Return the attributes beside the tensor (a tuple or dict)")
        return
    t = t.detach()
    # A conjugate or negative view reads as its values: store those.
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    shape = tuple(t.shape)
    perm = None
    if not t.is_contiguous():
        perm = _dense_order(shape, tuple(t.stride()), 1)
        if perm is None:
            t = t.contiguous()
        else:
            flags |= F_PERM
            t = t.permute(perm)
    w.raw(_U8.pack(T_TENSOR) + _U8.pack(code) + _U8.pack(flags))
    _shape(w, shape, perm)
    nbytes = t.numel() * t.element_size()
    # A byte view of the tensor's storage, without a copy (uint8 reinterprets
    # any dtype numpy lacks, such as bfloat16). as_strided, not reshape: a
    # contiguous tensor may have any stride along a dimension of length 1.
    flat = t.as_strided((t.numel(),), (1,)) if nbytes else None
    w.payload(memoryview(flat.view(_torch_uint8()).numpy()) if flat is not None else b"", nbytes)


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


def _pil(w: _Writer, img: Any, depth: int) -> None:
    from PIL import Image

    if type(img) is not Image.Image:
        _other(w, img, "a PIL image of a subclass (an opened file's); a hit would return a plain "
               "PIL.Image.Image", "Return img.copy() or img.convert(mode)")
        return
    mode = img.mode.encode()
    data = img.tobytes()
    pal_mode = pal = b""
    if img.palette is not None and img.mode in ("P", "PA"):
        pal_mode = img.palette.mode.encode()
        pal = bytes(img.getpalette(img.palette.mode) or b"")
    w.raw(_U8.pack(T_PIL) + _U8.pack(len(mode)) + mode + _U32.pack(img.size[0]) + _U32.pack(img.size[1]))
    w.raw(_U8.pack(len(pal_mode)) + pal_mode + _U32.pack(len(pal)) + pal)
    try:
        _node(w, dict(img.info), depth + 1)
    except CodecError as exc:
        raise CodecError(f"cannot cache this PIL image's info (which a hit must return too): {exc}") from exc
    w.raw(_U64.pack(len(data)))
    w.payload(data, len(data))


def encode(obj: Any, allow_pickle: bool = False) -> list[Any]:
    """The record for ``obj`` as a list of buffers (to be concatenated).

    Plain values (None, bool, int, float, str, bytes, bytearray and tuples,
    lists and dicts of them: most datasets' items) are encoded in C
    (binding/encode.c, part for part what :func:`encode_py` gives); anything
    else here, in Python."""
    parts = _engine.encode_plain(obj)
    return parts if parts is not None else encode_py(obj, allow_pickle)


def encode_py(obj: Any, allow_pickle: bool = False) -> list[Any]:
    """:func:`encode` in Python alone: the reference the C encoder is tested
    against, and the encoder of everything but plain values."""
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


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


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
