/* decode.h - the binding's record decoder (decode.c): records in the
 * codec's format (python/opt4torch/pool/codec.py) made into Python objects on the
 * batch path. Shared by _engine.c (get_batch, decode_records) and the fuzz
 * target tests/fuzz/fuzz_decode.c.
 *
 * The hit path decodes records here, in the call that reads them: plain
 * values (bytes, bytearray, str, int, float, bool, None and tuples, lists and
 * dicts) become objects at once. Numpy arrays and tensors are collected as
 * runs: arrays with the same header (kind, dtype, shape) at evenly spaced
 * offsets, which is what a batch of same-shaped samples gives (the header
 * holds the flags, so requires_grad, Parameter, read-only and dimension
 * order are the same across a run). One call per
 * batch to the codec's make_arrays(data, runs) turns each run into views of
 * the batch buffer (one strided view, split, for a run of many: far cheaper
 * than a view per sample), and C puts each array into its place. Anything
 * else (PIL images, pickles, ints beyond 64 bits, complex numbers, arrays of
 * structured dtypes, whose description is JSON) and any record that does not
 * parse cleanly is left to the Python codec, which owns the format and its
 * error messages (the array node layout is in its module docstring). Tags and
 * layout must match _codec.py; tests compare the two, and fuzz_decode.c
 * feeds the decoder any bytes. */

#ifndef OPT4_BINDING_DECODE_H
#define OPT4_BINDING_DECODE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "binding.h"

/* The node tags of the format, defined here only: the Python codec takes
 * them from the binding (_engine.CODEC_TAGS, rec_export). */
#define REC_TAGS(X)                                                                                    \
  X(NONE, 0) X(TRUE, 1) X(FALSE, 2) X(INT, 3) X(BIGINT, 4) X(FLOAT, 5) X(STR, 6) X(BYTES, 7)             \
  X(BYTEARRAY, 8) X(TUPLE, 9) X(LIST, 10) X(DICT, 11) X(NDARRAY, 12) X(TENSOR, 13) X(PIL, 14)           \
  X(PICKLE, 15) X(COMPLEX, 16)
#define REC_ENUM(name, value) REC_##name = value,
enum { REC_TAGS(REC_ENUM) };
#undef REC_ENUM
#define REC_FORMAT OPT4PY_CODEC_FORMAT
/* Array and bytes payloads start at a multiple of this from the record's start. */
#define REC_ALIGN 16

/* Little-endian u32 and u64 at p. */
static inline void rec_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void rec_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The head of a bytes node whose tag is at pos in the record: tag, u64
 * length, u64 pad and pad zero bytes, so that its payload (len bytes, not
 * written here) starts at a multiple of REC_ALIGN. Writes it at p unless p
 * is NULL; returns its length (at most 17 + 15). */
static inline size_t rec_bytes_head(uint8_t *p, uint64_t pos, uint64_t len) {
  size_t pad = (size_t)((REC_ALIGN - (pos + 17) % REC_ALIGN) % REC_ALIGN);
  if (p != NULL) {
    p[0] = REC_BYTES;
    rec_le64(p + 1, len);
    rec_le64(p + 9, pad);
    memset(p + 17, 0, pad);
  }
  return 17 + pad;
}

/* Adds CODEC_FORMAT, CODEC_ALIGN and CODEC_TAGS ({"NONE": 0, ...}) to the
 * module. 0, or -1 with an exception set. */
int rec_export(PyObject *module);
/* Array flags (_codec.F_*): which each kind may carry. */
#define REC_F_SCALAR 1
#define REC_F_READONLY 2
#define REC_F_PERM 4
#define REC_F_GRAD 8
#define REC_F_PARAM 16
#define REC_NDARRAY_FLAGS (REC_F_SCALAR | REC_F_READONLY | REC_F_PERM)
#define REC_TENSOR_FLAGS (REC_F_PERM | REC_F_GRAD | REC_F_PARAM)
#define REC_MAX_DEPTH 32
#define REC_MAX_NDIM 64 /* numpy's limit */

/* Arrays whose headers are byte-equal, at offset + j * stride for j < count. */
typedef struct rec_run {
  const uint8_t *hdr; /* the node from its tag to the end of its shape */
  size_t hdr_len;
  int tag, flags;
  PyObject *dtype, *shape, *perm; /* strong references (perm: a tuple, or None) */
  uint64_t offset, stride;
  size_t count;
} rec_run;

/* Where an array goes once made: container[index] (tuple or list) or
 * container[key] (dict). */
typedef struct rec_slot {
  PyObject *container; /* borrowed: owned by the record being built */
  Py_ssize_t index;
  PyObject *key; /* a strong reference, or NULL */
  size_t run;
} rec_slot;

typedef struct rec_ctx {
  const uint8_t *base; /* run offsets count from here */
  int arrays;          /* whether arrays are decoded here (else records with them decline) */
  int in_key;          /* decoding a dict key: an array there is no valid record */
  /* A read-only memoryview of the buffer base points into (borrowed), or
   * NULL: when given, bytes nodes come out as its slices (no copy) instead
   * of bytes objects, except dict keys, which stay bytes. */
  PyObject *views;
  rec_slot *slots;
  size_t nslots, slots_cap;
  rec_run *runs;
  size_t nruns, runs_cap;
} rec_ctx;

/* The record at buf[0:len] decoded into holder[index] (a list). Returns 1
 * when decoded, 0 when the record is the Python codec's (holder[index] is
 * then None), -1 on error (only running out of memory, or the list
 * operations failing, is one; whatever else fails, a malformed string or an
 * unhashable key, is left to the codec, which raises its own error). */
int rec_decode_into(rec_ctx *c, const uint8_t *buf, size_t len, PyObject *holder, Py_ssize_t index);

/* Make the arrays of every record decoded so far with make_arrays(data,
 * runs), runs as (tag, dtype, shape, offset, flags, count, stride, perm), and
 * put each in its slot. 0, or -1 with an exception set. */
int rec_place_arrays(rec_ctx *c, PyObject *make_arrays, PyObject *data);

/* A read-only memoryview of all of data (a bytearray), for rec_ctx.views: a
 * new memoryview, marked read-only before anyone else sees it (as
 * memoryview.toreadonly does; calling that from C left a block allocated
 * per call in fuzz_decode's leak check). NULL with an exception set. */
PyObject *rec_readonly_view(PyObject *data);

/* Drop what c holds (the runs and slots of arrays not placed). */
void rec_ctx_release(rec_ctx *c);

/* Bytes per element of a numpy dtype string as dtype.str writes it ("<f4",
 * "|u1", "<U5", "|S3", "<M8[ns]"), or 0 for one this decoder leaves alone. */
uint64_t rec_dtype_itemsize(const uint8_t *s, size_t n);

/* Bytes per element of torch dtype code code (_codec._TORCH_DTYPES), 0 for
 * an unknown code. */
uint64_t rec_tensor_dtype_itemsize(unsigned code);

#endif
