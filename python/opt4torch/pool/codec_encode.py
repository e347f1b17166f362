"""The codec's encoder in Python: a record (a list of buffers, gathered by
the pool without joining them first) for anything a dataset returns. Plain
values go to the C encoder first (binding/encode.c); this is what encodes
the rest (arrays, tensors, PIL images, big ints, pickles) with its refusals
and their messages, and the reference the C encoder is tested against.

May touch: the object it is given (read only), pickle only with
allow_pickle, torch and PIL when the object is theirs; never a pool.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

import numpy as np

from .. import _engine
from .codec_dtypes import _dtype_desc, _Unstorable
from .codec_format import (
    _F64, _I64, _U8, _U32, _U64, ALIGN, F_GRAD, F_PARAM, F_PERM, F_READONLY, F_SCALAR, FORMAT, MAGIC,
    MAX_DEPTH, T_BIGINT, T_BYTEARRAY, T_BYTES, T_COMPLEX, T_DICT, T_FALSE, T_FLOAT, T_INT, T_LIST,
    T_NDARRAY, T_NONE, T_PICKLE, T_PIL, T_STR, T_TENSOR, T_TRUE, T_TUPLE, CodecError, _shape_struct,
    _torch_dtype_tables,
)


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
