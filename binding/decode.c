/* decode.c - the C side of python/opt4torch/pool/codec.py: records made into
 * Python objects on the batch path (decode.h says what and why). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "decode.h"

/* Bytes per element of each torch dtype code (_codec._TORCH_DTYPES). */
static const uint8_t rec_tensor_itemsize[] = {4, 8, 2, 2, 1, 1, 2, 4, 8, 1, 8, 16, 2, 4, 8, 4, 1, 1, 1, 1, 1};

uint64_t rec_tensor_dtype_itemsize(unsigned code) {
  return code < sizeof rec_tensor_itemsize ? rec_tensor_itemsize[code] : 0;
}

typedef struct rec_reader {
  const uint8_t *p, *end;
} rec_reader;

static int rec_take(rec_reader *r, size_t n, const uint8_t **out) {
  if ((size_t)(r->end - r->p) < n) return -1;
  *out = r->p;
  r->p += n;
  return 0;
}

static int rec_u64(rec_reader *r, uint64_t *v) {
  const uint8_t *b;
  if (rec_take(r, 8, &b) < 0) return -1;
  uint64_t x = 0;
  for (int k = 7; k >= 0; k--) x = (x << 8) | b[k];
  *v = x;
  return 0;
}

static int rec_u32(rec_reader *r, uint32_t *v) {
  const uint8_t *b;
  if (rec_take(r, 4, &b) < 0) return -1;
  *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
  return 0;
}

/* The payload of an array: pad, then nbytes; its offset from base. */
static int rec_payload(rec_reader *r, const uint8_t *base, uint64_t nbytes, uint64_t *offset) {
  uint64_t pad;
  if (rec_u64(r, &pad) < 0 || pad > (uint64_t)(r->end - r->p)) return -1;
  r->p += pad;
  if (nbytes > (uint64_t)(r->end - r->p)) return -1;
  *offset = (uint64_t)(r->p - base);
  r->p += nbytes;
  return 0;
}

/* A shape of ndim u64s, and the byte count of its elements, bounded by what
 * is left of the record. The product of the dimensions other than zero,
 * times the itemsize, must fit a Py_ssize_t even when a zero makes the array
 * empty: numpy ("array is too big") and torch ("stride calculation
 * overflowed") refuse such a shape, so it is the codec's to report (found by
 * fuzz_decode: a zero-size array of shape (0, 2**62, 2**62) passed here and
 * failed in make_arrays, failing the whole batch). */
static int rec_dims(rec_reader *r, unsigned ndim, uint64_t itemsize, uint64_t *dims, uint64_t *nbytes) {
  int zero = 0;
  uint64_t n = itemsize;
  if (ndim > REC_MAX_NDIM) return -1;
  for (unsigned k = 0; k < ndim; k++) {
    if (rec_u64(r, &dims[k]) < 0 || dims[k] > (uint64_t)PY_SSIZE_T_MAX) return -1;
    if (dims[k] == 0) {
      zero = 1;
      continue;
    }
    if (n > (uint64_t)PY_SSIZE_T_MAX / dims[k]) return -1;
    n *= dims[k];
  }
  if (!zero && n > (uint64_t)(r->end - r->p)) return -1; /* more than the record holds */
  *nbytes = zero ? 0 : n;
  return 0;
}

uint64_t rec_dtype_itemsize(const uint8_t *s, size_t n) {
  size_t i = 0;
  if (i < n && (s[i] == '<' || s[i] == '>' || s[i] == '|' || s[i] == '=')) i++;
  if (i >= n) return 0;
  char kind = (char)s[i++];
  if (kind == '\0' || strchr("biufcSUVmM", kind) == NULL) return 0;
  uint64_t size = 0;
  size_t digits = 0;
  for (; i < n && s[i] >= '0' && s[i] <= '9' && digits < 12; i++, digits++) size = size * 10 + (s[i] - '0');
  if (digits == 0 || digits == 12) return 0;
  if (i < n) { /* only a datetime unit may follow: "[ns]" */
    if ((kind != 'm' && kind != 'M') || s[i] != '[' || s[n - 1] != ']') return 0;
    for (size_t k = i + 1; k + 1 < n; k++)
      if (!((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= 'A' && s[k] <= 'Z') || (s[k] >= '0' && s[k] <= '9')))
        return 0;
  }
  return kind == 'U' ? size * 4 : size;
}

static int rec_grow(void **items, size_t *cap, size_t need, size_t size) {
  if (need <= *cap) return 0;
  size_t n = *cap ? 2 * *cap : 64;
  void *p = PyMem_Realloc(*items, n * size);
  if (p == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  *items = p;
  *cap = n;
  return 0;
}

/* A new run for the array whose header is hdr[0:hdr_len]. */
static int rec_new_run(rec_ctx *c, const uint8_t *hdr, size_t hdr_len, int tag, int flags,
                       const uint8_t *dt, size_t dtlen, unsigned ndim, const uint64_t *dims,
                       const uint8_t *perm, uint64_t offset) {
  if (rec_grow((void **)&c->runs, &c->runs_cap, c->nruns + 1, sizeof *c->runs) < 0) return -1;
  PyObject *dtype = tag == REC_NDARRAY ? PyUnicode_DecodeASCII((const char *)dt, (Py_ssize_t)dtlen, NULL)
                                       : PyLong_FromLong(dt[0]);
  PyObject *shape = dtype == NULL ? NULL : PyTuple_New(ndim);
  for (unsigned k = 0; shape != NULL && k < ndim; k++) {
    PyObject *d = PyLong_FromUnsignedLongLong(dims[k]);
    if (d == NULL) Py_CLEAR(shape);
    else PyTuple_SET_ITEM(shape, k, d);
  }
  PyObject *order = NULL;
  if (shape != NULL && perm == NULL) order = Py_NewRef(Py_None);
  else if (shape != NULL) order = PyTuple_New(ndim);
  for (unsigned k = 0; perm != NULL && order != NULL && k < ndim; k++) {
    PyObject *d = PyLong_FromLong(perm[k]);
    if (d == NULL) Py_CLEAR(order);
    else PyTuple_SET_ITEM(order, k, d);
  }
  if (order == NULL) {
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    return -1;
  }
  c->runs[c->nruns++] = (rec_run){hdr, hdr_len, tag, flags, dtype, shape, order, offset, 0, 1};
  return 0;
}

/* An array node (its tag read): it joins the last run or starts one, and
 * gets a slot; Py_None stands in for it until make_arrays has made it. */
static PyObject *rec_array(rec_reader *r, rec_ctx *c, int tag, PyObject *container,
                           Py_ssize_t index, PyObject *key) {
  const uint8_t *hdr = r->p - 1, *b, *dt, *perm = NULL;
  uint64_t itemsize, nbytes, offset, dims[REC_MAX_NDIM];
  uint32_t dtlen = 1;
  int flags;
  if (!c->arrays || c->in_key) return NULL;
  if (tag == REC_NDARRAY) {
    if (rec_take(r, 1, &b) < 0 || (b[0] & ~REC_NDARRAY_FLAGS) != 0) return NULL;
    flags = b[0];
    if (rec_u32(r, &dtlen) < 0 || rec_take(r, dtlen, &dt) < 0) return NULL;
    itemsize = rec_dtype_itemsize(dt, dtlen); /* 0 for a structured dtype's JSON: the codec's */
    if (itemsize == 0) return NULL;
  } else {
    if (rec_take(r, 2, &dt) < 0 || dt[0] >= sizeof rec_tensor_itemsize || (dt[1] & ~REC_TENSOR_FLAGS) != 0)
      return NULL;
    itemsize = rec_tensor_itemsize[dt[0]];
    flags = dt[1];
  }
  if (rec_take(r, 1, &b) < 0) return NULL;
  unsigned ndim = b[0];
  if (rec_dims(r, ndim, itemsize, dims, &nbytes) < 0) return NULL;
  if (flags & REC_F_PERM) { /* a permutation of 0 .. ndim - 1 */
    uint64_t seen = 0;
    if (rec_take(r, ndim, &perm) < 0) return NULL;
    for (unsigned k = 0; k < ndim; k++) {
      if (perm[k] >= ndim || (seen >> perm[k] & 1)) return NULL;
      seen |= (uint64_t)1 << perm[k];
    }
  }
  size_t hdr_len = (size_t)(r->p - hdr);
  if (rec_payload(r, c->base, nbytes, &offset) < 0) return NULL;
  if (rec_grow((void **)&c->slots, &c->slots_cap, c->nslots + 1, sizeof *c->slots) < 0) return NULL;
  rec_run *last = c->nruns ? &c->runs[c->nruns - 1] : NULL;
  uint64_t last_end = last ? last->offset + (last->count - 1) * last->stride : 0;
  if (last != NULL && last->hdr_len == hdr_len && memcmp(last->hdr, hdr, hdr_len) == 0 &&
      offset > last_end && (last->count == 1 || offset - last_end == last->stride)) {
    last->stride = offset - last->offset - (last->count - 1) * last->stride;
    last->count++;
  } else if (rec_new_run(c, hdr, hdr_len, tag, flags, dt, dtlen, ndim, dims, perm, offset) < 0) {
    return NULL;
  }
  Py_XINCREF(key);
  c->slots[c->nslots++] = (rec_slot){container, index, key, c->nruns - 1};
  Py_RETURN_NONE;
}

/* The n bytes at b (inside the buffer c->base points into) as a slice of
 * c->views: a read-only view of them, no copy. */
static PyObject *rec_view(const rec_ctx *c, const uint8_t *b, uint64_t n) {
  Py_ssize_t lo = (Py_ssize_t)(b - c->base);
  PyObject *lo_o = PyLong_FromSsize_t(lo), *hi_o = PyLong_FromSsize_t(lo + (Py_ssize_t)n);
  PyObject *slice = lo_o == NULL || hi_o == NULL ? NULL : PySlice_New(lo_o, hi_o, NULL);
  Py_XDECREF(lo_o);
  Py_XDECREF(hi_o);
  if (slice == NULL) return NULL;
  PyObject *view = PyObject_GetItem(c->views, slice);
  Py_DECREF(slice);
  return view;
}

/* A node as a new reference, bound for container[index] or container[key].
 * NULL with no exception set: the record is the Python codec's to decode;
 * NULL with one set: an error. */
static PyObject *rec_node(rec_reader *r, rec_ctx *c, int depth, PyObject *container,
                          Py_ssize_t index, PyObject *key) {
  const uint8_t *b;
  uint64_t n;
  uint32_t count;
  if (depth > REC_MAX_DEPTH || rec_take(r, 1, &b) < 0) return NULL;
  switch (b[0]) {
  case REC_NONE: Py_RETURN_NONE;
  case REC_TRUE: Py_RETURN_TRUE;
  case REC_FALSE: Py_RETURN_FALSE;
  case REC_INT:
    if (rec_u64(r, &n) < 0) return NULL;
    return PyLong_FromLongLong((long long)n);
  case REC_FLOAT: {
    if (rec_u64(r, &n) < 0) return NULL;
    double d;
    memcpy(&d, &n, sizeof d);
    return PyFloat_FromDouble(d);
  }
  case REC_STR:
    if (rec_u64(r, &n) < 0 || n > (uint64_t)(r->end - r->p)) return NULL;
    rec_take(r, (size_t)n, &b);
    return PyUnicode_DecodeUTF8((const char *)b, (Py_ssize_t)n, "surrogatepass");
  case REC_BYTES:
  case REC_BYTEARRAY: {
    int tag = b[0];
    uint64_t offset;
    if (rec_u64(r, &n) < 0 || rec_payload(r, r->p, n, &offset) < 0) return NULL;
    b = r->p - n;
    if (tag == REC_BYTES && c->views != NULL && !c->in_key) return rec_view(c, b, n); /* keys stay bytes */
    return tag == REC_BYTES ? PyBytes_FromStringAndSize((const char *)b, (Py_ssize_t)n)
                            : PyByteArray_FromStringAndSize((const char *)b, (Py_ssize_t)n);
  }
  case REC_TUPLE:
  case REC_LIST: {
    int tag = b[0];
    if (rec_u32(r, &count) < 0 || count > (uint64_t)(r->end - r->p)) return NULL;
    PyObject *seq = tag == REC_TUPLE ? PyTuple_New(count) : PyList_New(count);
    if (seq == NULL) return NULL;
    for (uint32_t i = 0; i < count; i++) {
      PyObject *x = rec_node(r, c, depth + 1, seq, (Py_ssize_t)i, NULL);
      if (x == NULL) {
        Py_DECREF(seq);
        return NULL;
      }
      if (tag == REC_TUPLE)
        PyTuple_SET_ITEM(seq, i, x);
      else
        PyList_SET_ITEM(seq, i, x);
    }
    return seq;
  }
  case REC_DICT: {
    if (rec_u32(r, &count) < 0 || count > (uint64_t)(r->end - r->p)) return NULL;
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    for (uint32_t i = 0; i < count; i++) {
      c->in_key++;
      PyObject *k = rec_node(r, c, depth + 1, NULL, 0, NULL);
      c->in_key--;
      PyObject *v = k == NULL ? NULL : rec_node(r, c, depth + 1, d, 0, k);
      /* A repeated key (only a damaged record has one) would replace a value
       * whose arrays still have slots: the codec's to decode. */
      if (v == NULL || PyDict_SetItem(d, k, v) < 0 || PyDict_GET_SIZE(d) != (Py_ssize_t)i + 1) {
        Py_XDECREF(k);
        Py_XDECREF(v);
        Py_DECREF(d);
        return NULL;
      }
      Py_DECREF(k);
      Py_DECREF(v);
    }
    return d;
  }
  case REC_NDARRAY:
  case REC_TENSOR: return rec_array(r, c, b[0], container, index, key);
  default: return NULL; /* PIL images, pickles, big ints */
  }
}

/* Drop the slots from n on, and their share of the runs (a record that
 * declined). */
static void rec_truncate(rec_ctx *c, size_t n) {
  while (c->nslots > n) {
    rec_slot *sl = &c->slots[--c->nslots];
    Py_CLEAR(sl->key);
    rec_run *run = &c->runs[sl->run];
    if (--run->count == 0) { /* the last run: slots and runs grow together */
      Py_CLEAR(run->dtype);
      Py_CLEAR(run->shape);
      Py_CLEAR(run->perm);
      c->nruns--;
    }
  }
}

PyObject *rec_readonly_view(PyObject *data) {
  PyObject *mv = PyMemoryView_FromObject(data);
  if (mv != NULL) PyMemoryView_GET_BUFFER(mv)->readonly = 1;
  return mv;
}

void rec_ctx_release(rec_ctx *c) {
  rec_truncate(c, 0);
  PyMem_Free(c->slots);
  PyMem_Free(c->runs);
  c->slots = NULL;
  c->runs = NULL;
  c->slots_cap = c->runs_cap = 0;
}

int rec_decode_into(rec_ctx *c, const uint8_t *buf, size_t len, PyObject *holder,
                           Py_ssize_t index) {
  if (len < 4 || buf[0] != 'O' || buf[1] != '4' || buf[2] != REC_FORMAT) return 0;
  size_t mark = c->nslots;
  rec_reader r = {buf + 3, buf + len};
  PyObject *obj = rec_node(&r, c, 0, holder, index, NULL);
  if (obj != NULL && r.p != r.end) Py_CLEAR(obj); /* trailing bytes */
  if (obj == NULL) {
    rec_truncate(c, mark);
    if (!PyErr_Occurred()) return 0;
    if (!PyErr_ExceptionMatches(PyExc_MemoryError)) {
      PyErr_Clear();
      return 0;
    }
    return -1;
  }
  PyList_SetItem(holder, index, obj); /* steals obj; drops the None there */
  return 1;
}

int rec_place_arrays(rec_ctx *c, PyObject *make_arrays, PyObject *data) {
  if (c->nslots == 0) return 0;
  PyObject *runs = PyList_New((Py_ssize_t)c->nruns);
  if (runs == NULL) return -1;
  for (size_t k = 0; k < c->nruns; k++) {
    const rec_run *run = &c->runs[k];
    PyObject *t = Py_BuildValue("(iOOKinKO)", run->tag, run->dtype, run->shape,
                                (unsigned long long)run->offset, run->flags, (Py_ssize_t)run->count,
                                (unsigned long long)run->stride, run->perm);
    if (t == NULL) {
      Py_DECREF(runs);
      return -1;
    }
    PyList_SET_ITEM(runs, (Py_ssize_t)k, t);
  }
  PyObject *arrays = PyObject_CallFunctionObjArgs(make_arrays, data, runs, NULL);
  Py_DECREF(runs);
  if (arrays == NULL) return -1;
  if (!PyList_CheckExact(arrays) || PyList_GET_SIZE(arrays) != (Py_ssize_t)c->nslots) {
    Py_DECREF(arrays);
    PyErr_SetString(PyExc_TypeError, "make_arrays must return a list with count arrays per run");
    return -1;
  }
  int rc = 0;
  for (size_t k = 0; k < c->nslots && rc == 0; k++) {
    PyObject *a = PyList_GET_ITEM(arrays, (Py_ssize_t)k), *box = c->slots[k].container;
    Py_INCREF(a);
    if (PyTuple_CheckExact(box)) { /* ours alone until returned: filled in place */
      PyObject *old = PyTuple_GET_ITEM(box, c->slots[k].index);
      PyTuple_SET_ITEM(box, c->slots[k].index, a);
      Py_DECREF(old);
      /* A collection during make_arrays may have untracked the tuple while
       * it held only None; what it holds now can be part of a cycle. */
      if (!PyObject_GC_IsTracked(box) && PyObject_GC_IsTracked(a)) PyObject_GC_Track(box);
    } else if (PyList_CheckExact(box)) {
      rc = PyList_SetItem(box, c->slots[k].index, a);
    } else {
      rc = PyDict_SetItem(box, c->slots[k].key, a);
      Py_DECREF(a);
    }
  }
  Py_DECREF(arrays);
  return rc;
}

/* decode_records(buffer, spans, make_arrays=None) -> [(True, object) or
 * (False, None) where the Python codec must decode it], one per (offset,
 * length) span of buffer, decoded as a batch is (arrays are views of
 * buffer). For tests of the C decoder against the codec. */
static PyObject *py_decode_records(PyObject *Py_UNUSED(m), PyObject *args) {
  PyObject *data, *spans, *make_arrays = Py_None, *out = NULL, *holder = NULL, *fast = NULL;
  if (!PyArg_ParseTuple(args, "OO|O", &data, &spans, &make_arrays)) return NULL;
  Py_buffer view;
  if (PyObject_GetBuffer(data, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
  rec_ctx c = {.base = view.buf, .arrays = make_arrays != Py_None};
  fast = PySequence_Fast(spans, "spans must be a sequence of (offset, length)");
  if (fast == NULL) goto done;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  holder = PyList_New(n);
  int *handled = PyMem_Calloc((size_t)(n ? n : 1), sizeof *handled);
  if (holder == NULL || handled == NULL) {
    PyMem_Free(handled);
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(holder, i, Py_NewRef(Py_None));
  for (Py_ssize_t i = 0; i < n; i++) {
    Py_ssize_t off, len;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "nn", &off, &len)) goto fail;
    if (off < 0 || len < 0 || off > view.len || len > view.len - off) {
      PyErr_SetString(PyExc_ValueError, "a span is outside the buffer");
      goto fail;
    }
    handled[i] = rec_decode_into(&c, (const uint8_t *)view.buf + off, (size_t)len, holder, i);
    if (handled[i] < 0) goto fail;
  }
  if (rec_place_arrays(&c, make_arrays, data) < 0) goto fail;
  out = PyList_New(n);
  for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
    PyObject *t = Py_BuildValue("(OO)", handled[i] ? Py_True : Py_False, PyList_GET_ITEM(holder, i));
    if (t == NULL) Py_CLEAR(out);
    else PyList_SET_ITEM(out, i, t);
  }
fail:
  PyMem_Free(handled);
done:
  rec_ctx_release(&c);
  Py_XDECREF(holder);
  Py_XDECREF(fast);
  PyBuffer_Release(&view);
  return out;
}

static PyMethodDef decode_functions[] = {
    {"decode_records", py_decode_records, METH_VARARGS,
     "decode_records(buffer, spans, make_arrays=None) -> [(True, object) or (False, None)]: "
     "the C decoder on records at (offset, length) spans of buffer"},
    {NULL, NULL, 0, NULL}};

int rec_export(PyObject *module) {
  if (PyModule_AddFunctions(module, decode_functions) < 0) return -1;
  PyObject *tags = PyDict_New();
  if (tags == NULL) return -1;
#define REC_ADD(name, value)                                                                           \
  if (rc == 0) {                                                                                       \
    PyObject *v = PyLong_FromLong(value);                                                              \
    rc = v == NULL ? -1 : PyDict_SetItemString(tags, #name, v);                                        \
    Py_XDECREF(v);                                                                                     \
  }
  int rc = 0;
  REC_TAGS(REC_ADD)
#undef REC_ADD
  if (rc == 0) rc = PyModule_AddIntConstant(module, "CODEC_FORMAT", REC_FORMAT);
  if (rc == 0) rc = PyModule_AddIntConstant(module, "CODEC_ALIGN", REC_ALIGN);
  if (rc == 0) rc = PyModule_AddObjectRef(module, "CODEC_TAGS", tags);
  Py_DECREF(tags);
  return rc;
}
