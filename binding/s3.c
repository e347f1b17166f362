/* s3.c - S3Ranges: byte ranges of objects in an S3-compatible store, read
 * by ranged GETs made in C (opt4_s3, src/source/s3.c), the GIL released
 * for the whole request. The Prefetcher reads through it as through Ranges. */
#define PY_SSIZE_T_CLEAN
#include "binding.h"
#include "io.h"

#include <string.h>

int opt4py_s3_check(S3RangesObject *self) {
  if (self->r == NULL) {
    PyErr_SetString(PyExc_ValueError, "operation on a closed S3 reader");
    return -1;
  }
  return 0;
}

static int s3_expect_sums_fn(void *r, const uint64_t *sums, uint64_t n) { return opt4_s3_expect_sums(r, sums, n); }

/* S3Ranges(endpoint, bucket, keys, items, region=None, access_key=None,
 * secret_key=None, session_token=None, path_style=True, max_attempts=3,
 * timeout=60.0, deadline=300.0, min_rate=1024, etags=None, sizes=None,
 * ca_bundle=None, sums=None):
 * items is a C-contiguous int64 buffer of (object, offset, length) rows;
 * etags (str) and sizes (int), one an object as listed (opt4_s3_expect);
 * sums, one uint64 XXH3-64 an item as indexed (opt4_s3_expect_sums). */
static PyObject *s3_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"endpoint", "bucket", "keys", "items", "region", "access_key", "secret_key",
                           "session_token", "path_style", "max_attempts", "timeout", "deadline", "min_rate",
                           "etags", "sizes", "ca_bundle", "sums", NULL};
  const char *endpoint = NULL, *bucket, *region = NULL, *access_key = NULL, *secret_key = NULL, *token = NULL;
  PyObject *keys, *items;
  int path_style = 1;
  unsigned int max_attempts = 3;
  double timeout = 60.0, deadline = 300.0;
  unsigned long long min_rate = 1024;
  PyObject *etags = Py_None, *sizes = Py_None, *sums = Py_None;
  const char *ca_bundle = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "zsOO|zzzzpIddKOOzO", kwlist, &endpoint, &bucket, &keys, &items,
                                   &region, &access_key, &secret_key, &token, &path_style, &max_attempts, &timeout,
                                   &deadline, &min_rate, &etags, &sizes, &ca_bundle, &sums))
    return NULL;
  if (!(timeout > 0.0 && timeout <= 86400.0))
    return PyErr_Format(PyExc_ValueError, "timeout must be between 0 and 86400 seconds, not %g", timeout);
  if (!(deadline > 0.0 && deadline <= 7 * 86400.0))
    return PyErr_Format(PyExc_ValueError, "deadline must be between 0 and 604800 seconds, not %g", deadline);
  if (min_rate < 1 || min_rate > ((unsigned long long)1 << 40))
    return PyErr_Format(PyExc_ValueError, "min_rate must be between 1 and 2**40 bytes a second, not %llu", min_rate);
  if (max_attempts < 1 || max_attempts > 100)
    return PyErr_Format(PyExc_ValueError, "max_attempts must be between 1 and 100, not %u", max_attempts);
  PyObject *seq = PySequence_Fast(keys, "keys must be a sequence of str");
  if (seq == NULL) return NULL;
  Py_ssize_t nk = PySequence_Fast_GET_SIZE(seq);
  PyObject *result = NULL;
  const char **cp = PyMem_Calloc((size_t)(nk ? nk : 1), sizeof *cp);
  Py_buffer view = {0};
  int have_view = 0;
  const char **ep = NULL;
  uint64_t *sp = NULL;
  PyObject *eseq = NULL, *sseq = NULL;
  if (cp == NULL) {
    PyErr_NoMemory();
    goto leave;
  }
  for (Py_ssize_t k = 0; k < nk; k++) {
    PyObject *key = PySequence_Fast_GET_ITEM(seq, k);
    if (!PyUnicode_Check(key)) {
      PyErr_Format(PyExc_TypeError, "keys must be str, got %s", Py_TYPE(key)->tp_name);
      goto leave;
    }
    if ((cp[k] = PyUnicode_AsUTF8(key)) == NULL) goto leave; /* kept alive by seq */
  }
  uint64_t n = 0;
  if (opt4py_rows_view(items, &view, &n, "object") < 0) goto leave;
  have_view = 1;
  opt4_s3_config cfg = {.endpoint = endpoint, .bucket = bucket, .region = region, .access_key = access_key,
                        .secret_key = secret_key, .session_token = token, .path_style = (uint32_t)path_style,
                        .max_attempts = max_attempts, .timeout_ns = (uint64_t)(timeout * 1e9),
                        .deadline_ns = (uint64_t)(deadline * 1e9), .min_rate = (uint64_t)min_rate,
                        .ca_bundle = ca_bundle};
  if (etags != Py_None) {
    if ((eseq = PySequence_Fast(etags, "etags must be a sequence of str")) == NULL) goto leave;
    if (PySequence_Fast_GET_SIZE(eseq) != nk) {
      PyErr_Format(PyExc_ValueError, "%zd etags for %zd keys", PySequence_Fast_GET_SIZE(eseq), nk);
      goto leave;
    }
    if ((ep = PyMem_Calloc((size_t)(nk ? nk : 1), sizeof *ep)) == NULL) {
      PyErr_NoMemory();
      goto leave;
    }
    for (Py_ssize_t k = 0; k < nk; k++) {
      PyObject *e = PySequence_Fast_GET_ITEM(eseq, k);
      if (!PyUnicode_Check(e)) {
        PyErr_Format(PyExc_TypeError, "etags must be str, got %s", Py_TYPE(e)->tp_name);
        goto leave;
      }
      if ((ep[k] = PyUnicode_AsUTF8(e)) == NULL) goto leave;
    }
  }
  if (sizes != Py_None) {
    if ((sseq = PySequence_Fast(sizes, "sizes must be a sequence of int")) == NULL) goto leave;
    if (PySequence_Fast_GET_SIZE(sseq) != nk) {
      PyErr_Format(PyExc_ValueError, "%zd sizes for %zd keys", PySequence_Fast_GET_SIZE(sseq), nk);
      goto leave;
    }
    if ((sp = PyMem_Calloc((size_t)(nk ? nk : 1), sizeof *sp)) == NULL) {
      PyErr_NoMemory();
      goto leave;
    }
    for (Py_ssize_t k = 0; k < nk; k++) {
      unsigned long long v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(sseq, k));
      if (v == (unsigned long long)-1 && PyErr_Occurred()) goto leave;
      sp[k] = v;
    }
  }
  opt4_s3 *r = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_s3_open(&cfg, cp, (uint64_t)nk, (const opt4_range *)view.buf, n, &r);
  Py_END_ALLOW_THREADS if (rc != 0) {
    opt4py_raise_records(rc, "open S3 reader");
    goto leave;
  }
  if ((ep != NULL || sp != NULL) && (rc = opt4_s3_expect(r, ep, sp, (uint64_t)nk)) != 0) {
    opt4_s3_close(r);
    opt4py_raise_records(rc, "S3 objects' ETags and sizes");
    goto leave;
  }
  if (opt4py_give_sums(r, sums, n, s3_expect_sums_fn) < 0) {
    opt4_s3_close(r);
    goto leave;
  }
  S3RangesObject *self = (S3RangesObject *)type->tp_alloc(type, 0);
  if (self == NULL) {
    opt4_s3_close(r);
    goto leave;
  }
  self->r = r;
  result = (PyObject *)self;
leave:
  if (have_view) PyBuffer_Release(&view);
  PyMem_Free(cp);
  PyMem_Free(ep);
  PyMem_Free(sp);
  Py_XDECREF(eseq);
  Py_XDECREF(sseq);
  Py_DECREF(seq);
  return result;
}

static void s3_dealloc(S3RangesObject *self) {
  opt4_s3_close(self->r);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *s3_close(S3RangesObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->readers > 0) {
    PyErr_SetString(PyExc_RuntimeError, "cannot close an S3 reader while it is being read");
    return NULL;
  }
  opt4_s3_close(self->r);
  self->r = NULL;
  Py_RETURN_NONE;
}

static Py_ssize_t s3_length(S3RangesObject *self) {
  if (opt4py_s3_check(self) < 0) return -1;
  opt4_s3_info in;
  opt4_s3_info_get(self->r, &in);
  return (Py_ssize_t)in.count;
}

static int s3_len_fn(void *r, uint64_t i, uint64_t *len) { return opt4_s3_len(r, i, len); }
static int s3_read_fn(void *r, uint64_t i, void *dst, size_t cap, uint64_t *len) {
  return opt4_s3_read(r, i, dst, cap, len);
}

static PyObject *s3_read(S3RangesObject *self, PyObject *arg) {
  if (opt4py_s3_check(self) < 0) return NULL;
  return opt4py_read_item(self->r, &self->readers, arg, s3_len_fn, s3_read_fn);
}

static PyObject *s3_info(S3RangesObject *self, PyObject *Py_UNUSED(ignored)) {
  if (opt4py_s3_check(self) < 0) return NULL;
  opt4_s3_info in;
  opt4_s3_info_get(self->r, &in);
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:s}", "count", (unsigned long long)in.count, "objects",
                       (unsigned long long)in.objects, "total_bytes", (unsigned long long)in.total_bytes, "max_len",
                       (unsigned long long)in.max_len, "reads", (unsigned long long)in.reads, "bytes_read",
                       (unsigned long long)in.bytes_read, "requests", (unsigned long long)in.requests, "retries",
                       (unsigned long long)in.retries, "failures", (unsigned long long)in.failures, "note", in.note);
}

static PyMethodDef s3_methods[] = {
    {"read", (PyCFunction)s3_read, METH_O, "read(i) -> bytes of item i: one ranged GET, the GIL released"},
    {"info", (PyCFunction)s3_info, METH_NOARGS, "Counts (shared with forked processes), sizes, how reads are done."},
    {"close", (PyCFunction)s3_close, METH_NOARGS, "Close the reader and its connections."},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods s3_as_sequence = {.sq_length = (lenfunc)s3_length};

PyTypeObject opt4py_S3RangesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opt4torch._engine.S3Ranges",
    .tp_basicsize = sizeof(S3RangesObject),
    .tp_dealloc = (destructor)s3_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "S3Ranges(endpoint, bucket, keys, items, region=None, access_key=None, secret_key=None, "
              "session_token=None, path_style=True, max_attempts=3, timeout=60.0, deadline=300.0, min_rate=1024, "
              "etags=None, sizes=None, ca_bundle=None, sums=None): byte ranges of objects "
              "read by ranged GETs in C (thread-safe); items are int64 (object, offset, length) rows.",
    .tp_methods = s3_methods,
    .tp_as_sequence = &s3_as_sequence,
    .tp_new = s3_new,
};

int opt4py_s3_init(PyObject *m) {
  if (PyType_Ready(&opt4py_S3RangesType) < 0) return -1;
  if (PyModule_AddObjectRef(m, "S3Ranges", (PyObject *)&opt4py_S3RangesType) < 0) return -1;
  return PyModule_AddIntConstant(m, "HAVE_S3", opt4_s3_available());
}
