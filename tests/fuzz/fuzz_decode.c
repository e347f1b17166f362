/* fuzz_decode.c - libFuzzer target for the binding's record decoder
 * (binding/decode.c), the code that turns a cached record back into Python
 * objects on every HIT. It runs in a CPython embedded here (isolated: no
 * site, no environment), so the decoder makes real objects.
 *
 * The input is one record. It is decoded alone, then as a batch of three
 * copies side by side at 16-byte boundaries (the layout get_batch gives, so
 * same-shaped arrays form runs), and those again with bytes as read-only
 * views of the batch's buffer (get_batch(..., views=True)), which must give
 * the same objects. Arrays are made by a make_arrays written
 * here that checks each run and stands a marker (tag, dtype, shape, flags,
 * perm, after a sentinel object) in for each array. Whatever the bytes:
 *   - the decoder accepts or declines, never fails (-1 is only for running
 *     out of memory) and never leaves an exception set;
 *   - every run lies inside the buffer: offset + (count - 1) * stride plus
 *     the payload (itemsize times the shape's product) ends at or before
 *     the buffer's end, and the arrays of a run do not overlap;
 *   - make_arrays is asked for exactly as many arrays as there are slots,
 *     and each lands in its place: the decoded objects reach exactly as
 *     many markers as there were slots, and the record alone and each of
 *     the three copies decode to the same object (compared by repr, so NaN
 *     is equal to itself);
 *   - nothing leaks: decoding the input again leaves as many Python
 *     blocks allocated (sys.getallocatedblocks, after a full collection)
 *     as there were before.
 * Any violation aborts, which libFuzzer reports with the input. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
const char *__lsan_default_suppressions(void);

/* The interpreter is never finalized (CPython 3.11 does not free all it
 * holds even then): what libpython allocated is not reported as a leak at
 * exit. Leaks of Python objects are caught by the block count instead. */
const char *__lsan_default_suppressions(void) { return "leak:libpython"; }

#define COPIES 3

static PyObject *getallocatedblocks;
static PyObject *sentinel; /* first in every marker: an object() of its own */

static _Noreturn void fail(const char *what) {
  fprintf(stderr, "fuzz_decode: %s\n", what);
  if (PyErr_Occurred()) PyErr_Print();
  abort();
}

static void start_python(void) {
  PyConfig config;
  PyConfig_InitIsolatedConfig(&config);
  config.site_import = 0;
  config.install_signal_handlers = 0;
  PyStatus st = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(st)) Py_ExitStatusException(st);
  getallocatedblocks = PySys_GetObject("getallocatedblocks"); /* borrowed; sys lives on */
  if (getallocatedblocks == NULL) fail("no sys.getallocatedblocks");
  Py_INCREF(getallocatedblocks);
  sentinel = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  if (sentinel == NULL) fail("object() failed");
}

/* The blocks Python has allocated, after a full collection, which also
 * empties the free lists (of tuples, floats, dicts: one of 2,000 tuples
 * fills slowly, a block per call, so without this a second decode can hold
 * a block more than the first without any leak). */
static Py_ssize_t blocks(void) {
  PyGC_Collect();
  PyObject *n = PyObject_CallNoArgs(getallocatedblocks);
  if (n == NULL) fail("sys.getallocatedblocks() failed");
  Py_ssize_t v = PyLong_AsSsize_t(n);
  Py_DECREF(n);
  return v;
}

static uint64_t unsigned_of(PyObject *t, Py_ssize_t k) {
  uint64_t v = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, k));
  if (PyErr_Occurred()) fail("a run field is not an unsigned int");
  return v;
}

/* make_arrays(data, runs): checks each run (see the top) and returns count
 * markers per run. */
static PyObject *make_arrays(PyObject *Py_UNUSED(self), PyObject *args) {
  PyObject *buf, *runs;
  if (!PyArg_ParseTuple(args, "OO", &buf, &runs)) fail("make_arrays called wrongly");
  if (!PyByteArray_CheckExact(buf) || !PyList_CheckExact(runs)) fail("make_arrays: not (bytearray, list)");
  uint64_t len = (uint64_t)PyByteArray_GET_SIZE(buf);
  PyObject *out = PyList_New(0);
  if (out == NULL) return NULL;
  for (Py_ssize_t r = 0; r < PyList_GET_SIZE(runs); r++) {
    PyObject *run = PyList_GET_ITEM(runs, r);
    if (!PyTuple_CheckExact(run) || PyTuple_GET_SIZE(run) != 8) fail("a run is not an 8-tuple");
    /* (tag, dtype, shape, offset, flags, count, stride, perm) */
    uint64_t tag = unsigned_of(run, 0), offset = unsigned_of(run, 3), flags = unsigned_of(run, 4);
    uint64_t count = unsigned_of(run, 5), stride = unsigned_of(run, 6);
    PyObject *dtype = PyTuple_GET_ITEM(run, 1), *shape = PyTuple_GET_ITEM(run, 2);
    PyObject *perm = PyTuple_GET_ITEM(run, 7);
    uint64_t itemsize;
    if (tag == REC_NDARRAY) {
      Py_ssize_t n = 0;
      const char *s = PyUnicode_Check(dtype) ? PyUnicode_AsUTF8AndSize(dtype, &n) : NULL;
      if (s == NULL) fail("an ndarray run's dtype is not a str");
      itemsize = rec_dtype_itemsize((const uint8_t *)s, (size_t)n);
    } else if (tag == REC_TENSOR) {
      itemsize = rec_tensor_dtype_itemsize((unsigned)PyLong_AsUnsignedLong(dtype));
    } else {
      fail("a run of neither arrays nor tensors");
    }
    if (itemsize == 0) fail("a run whose dtype the decoder should have declined");
    if (!PyTuple_CheckExact(shape)) fail("a run's shape is not a tuple");
    if (perm != Py_None && (!PyTuple_CheckExact(perm) || PyTuple_GET_SIZE(perm) != PyTuple_GET_SIZE(shape)))
      fail("a run's perm is neither None nor a tuple as long as its shape");
    /* The product of the dimensions other than zero, times itemsize, fits
     * a Py_ssize_t (numpy and torch refuse the shape otherwise), and is the
     * payload's size unless a dimension is zero. */
    uint64_t nbytes = itemsize;
    int empty = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(shape); k++) {
      uint64_t d = unsigned_of(shape, k);
      if (d == 0) empty = 1;
      else if (__builtin_mul_overflow(nbytes, d, &nbytes) || nbytes > (uint64_t)PY_SSIZE_T_MAX)
        fail("a shape numpy and torch refuse (its size overflows)");
    }
    if (empty) nbytes = 0;
    uint64_t last, end;
    if (count == 0) fail("an empty run");
    if (count > 1 && stride < nbytes) fail("arrays of a run overlap");
    if (__builtin_mul_overflow(count - 1, stride, &last) || __builtin_add_overflow(last, offset, &last) ||
        __builtin_add_overflow(last, nbytes, &end) || end > len)
      fail("a run reaches past the buffer");
    for (uint64_t j = 0; j < count; j++) {
      PyObject *marker = Py_BuildValue("(OKOOKO)", sentinel, (unsigned long long)tag, dtype, shape,
                                       (unsigned long long)flags, perm);
      if (marker == NULL || PyList_Append(out, marker) < 0) {
        Py_XDECREF(marker);
        Py_DECREF(out);
        return NULL;
      }
      Py_DECREF(marker);
    }
  }
  return out;
}

static PyMethodDef make_arrays_def = {"make_arrays", make_arrays, METH_VARARGS, NULL};

/* The markers make_arrays made that obj reaches (a marker is a tuple that
 * starts with the sentinel). */
static size_t markers_in(PyObject *obj) {
  size_t n = 0;
  if (PyTuple_CheckExact(obj) && PyTuple_GET_SIZE(obj) > 0 && PyTuple_GET_ITEM(obj, 0) == sentinel) return 1;
  if (PyTuple_CheckExact(obj) || PyList_CheckExact(obj)) {
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(obj); i++)
      n += markers_in(PySequence_Fast_ITEMS(obj)[i]);
  } else if (PyDict_CheckExact(obj)) {
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(obj, &pos, &k, &v)) n += markers_in(k) + markers_in(v);
  }
  return n;
}

/* obj with every memoryview in it made bytes (a new reference), after
 * checking each is a read-only view of buf's bytes (get_batch's views). */
static PyObject *unview(PyObject *obj, PyObject *buf) {
  if (PyMemoryView_Check(obj)) {
    const Py_buffer *v = PyMemoryView_GET_BUFFER(obj);
    const char *lo = PyByteArray_AS_STRING(buf), *p = v->buf;
    if (!v->readonly || v->ndim != 1 || v->itemsize != 1 || p < lo || v->len > PyByteArray_GET_SIZE(buf) ||
        p - lo > PyByteArray_GET_SIZE(buf) - v->len)
      fail("a view is writable, not of bytes, or reaches outside the batch's buffer");
    return PyBytes_FromStringAndSize(p, v->len);
  }
  if (PyTuple_CheckExact(obj) || PyList_CheckExact(obj)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    PyObject *out = PyTuple_CheckExact(obj) ? PyTuple_New(n) : PyList_New(n);
    if (out == NULL) fail("out of memory");
    for (Py_ssize_t i = 0; i < n; i++) {
      PyObject *x = unview(PySequence_Fast_ITEMS(obj)[i], buf);
      if (PyTuple_CheckExact(out)) PyTuple_SET_ITEM(out, i, x);
      else PyList_SET_ITEM(out, i, x);
    }
    return out;
  }
  if (PyDict_CheckExact(obj)) {
    PyObject *out = PyDict_New(), *k, *v;
    Py_ssize_t pos = 0;
    if (out == NULL) fail("out of memory");
    while (PyDict_Next(obj, &pos, &k, &v)) {
      if (PyMemoryView_Check(k)) fail("a dict key came out as a view");
      PyObject *x = unview(v, buf);
      if (PyDict_SetItem(out, k, x) < 0) fail("out of memory");
      Py_DECREF(x);
    }
    return out;
  }
  return Py_NewRef(obj);
}

/* Decode n records at spans (offset, len) of buf; results[i] is the repr of
 * record i's object, or NULL where the decoder declined. With views, bytes
 * come out as views of buf (get_batch(..., views=True)); they are checked
 * and made bytes before the repr. Returns how many were accepted. */
static int decode(PyObject *buf, const size_t *offs, size_t len, int n, PyObject *fn, int views,
                  PyObject **results) {
  const uint8_t *base = (const uint8_t *)PyByteArray_AS_STRING(buf);
  rec_ctx c = {.base = base, .arrays = 1};
  PyObject *whole = NULL;
  if (views) {
    whole = rec_readonly_view(buf);
    if (whole == NULL) fail("out of memory");
    c.views = whole;
  }
  PyObject *holder = PyList_New(n);
  if (holder == NULL) fail("out of memory");
  for (int i = 0; i < n; i++) PyList_SET_ITEM(holder, i, Py_NewRef(Py_None));
  int accepted = 0, handled[COPIES];
  for (int i = 0; i < n; i++) {
    handled[i] = rec_decode_into(&c, base + offs[i], len, holder, i);
    if (handled[i] < 0) fail("the decoder failed (only running out of memory may do that)");
    if (PyErr_Occurred()) fail("the decoder left an exception set");
    accepted += handled[i];
  }
  size_t slots = c.nslots;
  if (rec_place_arrays(&c, fn, buf) < 0) fail("placing the arrays failed");
  if (c.nslots != slots) fail("placing the arrays changed the slots");
  rec_ctx_release(&c);
  size_t reached = 0;
  for (int i = 0; i < n; i++) {
    PyObject *obj = PyList_GET_ITEM(holder, i);
    PyObject *plain = handled[i] ? unview(obj, buf) : NULL;
    results[i] = handled[i] ? PyObject_Repr(plain) : NULL;
    Py_XDECREF(plain);
    if (handled[i] && results[i] == NULL) fail("repr of a decoded object failed");
    reached += handled[i] ? markers_in(obj) : 0;
  }
  Py_XDECREF(whole);
  if (reached != slots) fail("the decoded objects do not reach every array made for them");
  Py_DECREF(holder);
  return accepted;
}

static void once(const uint8_t *data, size_t size, PyObject *fn) {
  /* Alone, at the start of a buffer of its own. */
  PyObject *one = PyByteArray_FromStringAndSize((const char *)data, (Py_ssize_t)size);
  if (one == NULL) fail("out of memory");
  size_t zero = 0;
  PyObject *alone;
  int ok = decode(one, &zero, size, 1, fn, 0, &alone);
  /* Three copies, each at a 16-byte boundary. */
  size_t step = (size + 15) & ~(size_t)15, offs[COPIES];
  PyObject *three = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(step * COPIES));
  if (three == NULL) fail("out of memory");
  memset(PyByteArray_AS_STRING(three), 0, step * COPIES);
  for (int i = 0; i < COPIES; i++) {
    offs[i] = step * (size_t)i;
    memcpy(PyByteArray_AS_STRING(three) + offs[i], data, size);
  }
  /* The batch decoded as get_batch does it, then again with bytes as views
   * of the batch's buffer (views=True): the same objects. */
  for (int views = 0; views < 2; views++) {
    PyObject *copies[COPIES];
    int got = decode(three, offs, size, COPIES, fn, views, copies);
    if (got != (ok ? COPIES : 0)) fail("a record decoded alone and in a batch differently (accepted or not)");
    for (int i = 0; ok && i < COPIES; i++)
      if (PyUnicode_Compare(alone, copies[i]) != 0) fail("a record decoded alone and in a batch to different objects");
    for (int i = 0; i < COPIES; i++) Py_XDECREF(copies[i]);
  }
  if (PyErr_Occurred()) fail("an exception left set");
  Py_XDECREF(alone);
  Py_DECREF(one);
  Py_DECREF(three);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static PyObject *fn;
  if (!Py_IsInitialized()) {
    start_python();
    fn = PyCFunction_New(&make_arrays_def, NULL);
    if (fn == NULL) fail("PyCFunction_New failed");
  }
  once(data, size, fn); /* the first time fills the interpreter's free lists */
  Py_ssize_t before = blocks();
  once(data, size, fn);
  if (blocks() != before) fail("decoding the input again left Python blocks allocated (a reference leak)");
  return 0;
}
