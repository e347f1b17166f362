/* decode.h - the binding's record decoder (decode.c): records in the
 * codec's format (python/opt4torch/_codec.py) made into Python objects on the
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

#include "binding.h"

enum {
  REC_NONE, REC_TRUE, REC_FALSE, REC_INT, REC_BIGINT, REC_FLOAT, REC_STR, REC_BYTES, REC_BYTEARRAY,
  REC_TUPLE, REC_LIST, REC_DICT, REC_NDARRAY, REC_TENSOR
};
#define REC_FORMAT OPT4PY_CODEC_FORMAT
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

/* Drop what c holds (the runs and slots of arrays not placed). */
void rec_ctx_release(rec_ctx *c);

/* Bytes per element of a numpy dtype string as dtype.str writes it ("<f4",
 * "|u1", "<U5", "|S3", "<M8[ns]"), or 0 for one this decoder leaves alone. */
uint64_t rec_dtype_itemsize(const uint8_t *s, size_t n);

/* Bytes per element of torch dtype code code (_codec._TORCH_DTYPES), 0 for
 * an unknown code. */
uint64_t rec_tensor_dtype_itemsize(unsigned code);

#endif
