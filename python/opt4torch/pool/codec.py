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
same format; where it declines a record, the Python decoder
(codec_decode.py) reads it. The C encoder (binding/encode.c) writes it for
plain values, part for part what :func:`encode_py` writes; it leaves
everything else to the Python encoder (codec_encode.py).

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

Where each part is: codec_format.py (the constants of the format, the
torch dtype codes, CodecError), codec_dtypes.py (numpy dtypes described and
read back), codec_encode.py (the Python encoder, encode and encode_py),
codec_decode.py (the Python decoder, decode and decode_at, and make_arrays,
the views the C decoder asks for). This module names them in one place.

May touch: nothing itself; its parts touch the bytes they are given and the
binding's encoder and decoder, pickle only with allow_pickle, never a pool.
"""

from __future__ import annotations

from .codec_decode import decode as decode, decode_at as decode_at, make_arrays as make_arrays
from .codec_encode import encode as encode, encode_py as encode_py, encoded_size as encoded_size
from .codec_format import (
    _TORCH_DTYPES as _TORCH_DTYPES,
    ALIGN as ALIGN,
    F_GRAD as F_GRAD,
    F_PARAM as F_PARAM,
    F_PERM as F_PERM,
    F_READONLY as F_READONLY,
    F_SCALAR as F_SCALAR,
    FORMAT as FORMAT,
    MAGIC as MAGIC,
    MAX_DEPTH as MAX_DEPTH,
    T_BIGINT as T_BIGINT,
    T_BYTEARRAY as T_BYTEARRAY,
    T_BYTES as T_BYTES,
    T_COMPLEX as T_COMPLEX,
    T_DICT as T_DICT,
    T_FALSE as T_FALSE,
    T_FLOAT as T_FLOAT,
    T_INT as T_INT,
    T_LIST as T_LIST,
    T_NDARRAY as T_NDARRAY,
    T_NONE as T_NONE,
    T_PICKLE as T_PICKLE,
    T_PIL as T_PIL,
    T_STR as T_STR,
    T_TENSOR as T_TENSOR,
    T_TRUE as T_TRUE,
    T_TUPLE as T_TUPLE,
    CodecError as CodecError,
)

__all__ = ["encode", "decode", "decode_at", "encoded_size", "make_arrays", "CodecError"]
