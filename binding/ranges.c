/* ranges.c - Ranges (byte ranges of files read in place: image folders,
 * tar shards), the tar indexer (tar_index) and tar_records. */
#define PY_SSIZE_T_CLEAN
#include "binding.h"
#include "io.h"

#include <string.h>
#include <unistd.h>

/* ---- Ranges: byte ranges of files (opt4_ranges), and the tar indexer ---- */

int opt4py_ranges_check(RangesObject *self) {
  if (self->r == NULL) {
    PyErr_SetString(PyExc_ValueError, "operation on closed file ranges");
    return -1;
  }
  return 0;
}

int opt4py_rows_view(PyObject *items, Py_buffer *view, uint64_t *n, const char *what) {
  if (PyObject_GetBuffer(items, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
  if (view->itemsize != 8 || view->format == NULL ||
      (strcmp(view->format, "q") != 0 && strcmp(view->format, "l") != 0) || view->len % 24 != 0) {
    PyBuffer_Release(view);
    PyErr_Format(PyExc_TypeError, "items must be a contiguous int64 array of (%s, offset, length) rows", what);
    return -1;
  }
  const int64_t *rows = view->buf;
  *n = (uint64_t)view->len / 24;
  for (uint64_t i = 0; i < 3 * *n; i++)
    if (rows[i] < 0) {
      PyBuffer_Release(view);
      PyErr_Format(PyExc_ValueError, "item %llu has a negative %s, offset or length", (unsigned long long)(i / 3),
                   what);
      return -1;
    }
  return 0;
}

int opt4py_give_sums(void *reader, PyObject *sums, uint64_t n, opt4py_expect_sums_fn expect) {
  if (sums == Py_None) return 0;
  Py_buffer v;
  if (PyObject_GetBuffer(sums, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
  int ok = v.itemsize == 8 && v.format != NULL && (strcmp(v.format, "Q") == 0 || strcmp(v.format, "L") == 0) &&
           (uint64_t)v.len == n * 8;
  int rc = ok ? expect(reader, v.buf, n) : 0;
  PyBuffer_Release(&v);
  if (!ok) {
    PyErr_Format(PyExc_TypeError, "sums must be a contiguous uint64 array of %llu checksums, one an item",
                 (unsigned long long)n);
    return -1;
  }
  if (rc != 0) {
    opt4py_raise(rc, "item checksums");
    return -1;
  }
  return 0;
}

static int ranges_expect_sums_fn(void *r, const uint64_t *sums, uint64_t n) {
  return opt4_ranges_expect_sums(r, sums, n);
}

PyObject *opt4py_read_item(void *reader, Py_ssize_t *readers, PyObject *arg, opt4py_len_fn len_of,
                           opt4py_read_fn read) {
  unsigned long long i = PyLong_AsUnsignedLongLong(arg);
  if (i == (unsigned long long)-1 && PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_IndexError, "item index %R is out of range", arg);
    }
    return NULL;
  }
  uint64_t len = 0;
  int rc = len_of(reader, i, &len);
  if (rc != 0) return opt4py_raise_read(rc, "read item");
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
  if (out == NULL) return NULL;
  (*readers)++;
  Py_BEGIN_ALLOW_THREADS rc = read(reader, i, PyBytes_AS_STRING(out), (size_t)len, &len);
  Py_END_ALLOW_THREADS (*readers)--;
  if (rc != 0) {
    Py_DECREF(out);
    return opt4py_raise_read(rc, "read item");
  }
  return out;
}

/* Ranges(paths, items, direct=False, ident=None, sums=None): items is a
 * C-contiguous int64 buffer of (file, offset, length) rows; ident, one
 * (size, inode, mtime_ns, ctime_ns) int64 row a file, as indexed
 * (opt4_ranges_expect); sums, one uint64 XXH3-64 an item, as indexed
 * (opt4_ranges_expect_sums). */
static PyObject *ranges_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"paths", "items", "direct", "ident", "sums", NULL};
  PyObject *paths, *items, *ident = Py_None, *sums = Py_None;
  int direct = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|pOO", kwlist, &paths, &items, &direct, &ident, &sums))
    return NULL;
  PyObject *seq = PySequence_Fast(paths, "paths must be a sequence of paths");
  if (seq == NULL) return NULL;
  Py_ssize_t nf = PySequence_Fast_GET_SIZE(seq);
  PyObject *result = NULL;
  PyObject **enc = PyMem_Calloc((size_t)(nf ? nf : 1), sizeof *enc);
  const char **cp = PyMem_Calloc((size_t)(nf ? nf : 1), sizeof *cp);
  Py_buffer view = {0};
  int have_view = 0;
  if (enc == NULL || cp == NULL) {
    PyErr_NoMemory();
    goto leave;
  }
  for (Py_ssize_t f = 0; f < nf; f++) {
    if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, f), &enc[f])) goto leave;
    cp[f] = PyBytes_AS_STRING(enc[f]);
  }
  uint64_t n = 0;
  if (opt4py_rows_view(items, &view, &n, "file") < 0) goto leave;
  have_view = 1;
  opt4_ranges *r = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_ranges_open(cp, (uint64_t)nf, (const opt4_range *)view.buf, n,
                                               direct ? OPT4_RANGES_DIRECT : 0, &r);
  Py_END_ALLOW_THREADS if (rc != 0) {
    opt4py_raise_records(rc, "open file ranges");
    goto leave;
  }
  if (ident != Py_None) {
    Py_buffer iv;
    if (PyObject_GetBuffer(ident, &iv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
      opt4_ranges_close(r);
      goto leave;
    }
    int ok = iv.itemsize == 8 && iv.format != NULL && (strcmp(iv.format, "q") == 0 || strcmp(iv.format, "l") == 0);
    if (!ok || iv.len != (Py_ssize_t)(nf * (Py_ssize_t)sizeof(opt4_file_ident))) {
      PyBuffer_Release(&iv);
      opt4_ranges_close(r);
      PyErr_Format(PyExc_TypeError, "ident must be a contiguous int64 array of %zd (size, inode, mtime_ns, "
                   "ctime_ns) rows, one a path", nf);
      goto leave;
    }
    rc = opt4_ranges_expect(r, (const opt4_file_ident *)iv.buf, (uint64_t)nf);
    PyBuffer_Release(&iv);
    if (rc != 0) {
      opt4_ranges_close(r);
      opt4py_raise_records(rc, "file identities");
      goto leave;
    }
  }
  if (opt4py_give_sums(r, sums, n, ranges_expect_sums_fn) < 0) {
    opt4_ranges_close(r);
    goto leave;
  }
  RangesObject *self = (RangesObject *)type->tp_alloc(type, 0);
  if (self == NULL) {
    opt4_ranges_close(r);
    goto leave;
  }
  self->r = r;
  result = (PyObject *)self;
leave:
  if (have_view) PyBuffer_Release(&view);
  if (enc != NULL)
    for (Py_ssize_t f = 0; f < nf; f++) Py_XDECREF(enc[f]);
  PyMem_Free(enc);
  PyMem_Free(cp);
  Py_DECREF(seq);
  return result;
}

static void ranges_dealloc(RangesObject *self) {
  opt4_ranges_close(self->r);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ranges_close(RangesObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->readers > 0) {
    PyErr_SetString(PyExc_RuntimeError, "cannot close file ranges while they are being read");
    return NULL;
  }
  opt4_ranges_close(self->r);
  self->r = NULL;
  Py_RETURN_NONE;
}

static Py_ssize_t ranges_length(RangesObject *self) {
  if (opt4py_ranges_check(self) < 0) return -1;
  opt4_ranges_info in;
  opt4_ranges_info_get(self->r, &in);
  return (Py_ssize_t)in.count;
}

static int ranges_len_fn(void *r, uint64_t i, uint64_t *len) { return opt4_ranges_len(r, i, len); }
static int ranges_read_fn(void *r, uint64_t i, void *dst, size_t cap, uint64_t *len) {
  return opt4_ranges_read(r, i, dst, cap, len);
}

static PyObject *ranges_read(RangesObject *self, PyObject *arg) {
  if (opt4py_ranges_check(self) < 0) return NULL;
  return opt4py_read_item(self->r, &self->readers, arg, ranges_len_fn, ranges_read_fn);
}

/* checksums() -> bytes: each item's XXH3-64 as a native uint64 array's
 * bytes, read from storage now (opt4_ranges_sums; not counted as reads). */
static PyObject *ranges_checksums(RangesObject *self, PyObject *Py_UNUSED(ignored)) {
  if (opt4py_ranges_check(self) < 0) return NULL;
  opt4_ranges_info in;
  opt4_ranges_info_get(self->r, &in);
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(in.count * 8));
  if (out == NULL) return NULL;
  int rc;
  self->readers++;
  Py_BEGIN_ALLOW_THREADS rc = opt4_ranges_sums(self->r, (uint64_t *)PyBytes_AS_STRING(out), in.count);
  Py_END_ALLOW_THREADS self->readers--;
  if (rc != 0) {
    Py_DECREF(out);
    return opt4py_raise_read(rc, "checksum items");
  }
  return out;
}

static PyObject *ranges_len_of(RangesObject *self, PyObject *arg) {
  if (opt4py_ranges_check(self) < 0) return NULL;
  unsigned long long i = PyLong_AsUnsignedLongLong(arg);
  if (i == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  uint64_t len = 0;
  int rc = opt4_ranges_len(self->r, i, &len);
  if (rc != 0) return opt4py_raise(rc, "item length");
  return PyLong_FromUnsignedLongLong(len);
}

static PyObject *ranges_info(RangesObject *self, PyObject *Py_UNUSED(ignored)) {
  if (opt4py_ranges_check(self) < 0) return NULL;
  opt4_ranges_info in;
  opt4_ranges_info_get(self->r, &in);
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:O,s:K,s:K,s:K,s:d,s:s}", "count", (unsigned long long)in.count, "files",
                       (unsigned long long)in.files, "total_bytes", (unsigned long long)in.total_bytes, "max_len",
                       (unsigned long long)in.max_len, "direct", in.direct ? Py_True : Py_False, "dio_align",
                       (unsigned long long)in.dio_align, "reads", (unsigned long long)in.reads, "bytes_read",
                       (unsigned long long)in.bytes_read, "latency", (double)in.latency_ns / 1e9, "note", in.note);
}

static PyObject *ranges_set_latency(RangesObject *self, PyObject *arg) {
  if (opt4py_ranges_check(self) < 0) return NULL;
  double sec = PyFloat_AsDouble(arg);
  if (sec == -1.0 && PyErr_Occurred()) return NULL;
  if (!(sec >= 0.0 && sec < 3600.0)) {
    PyErr_SetString(PyExc_ValueError, "latency must be between 0 and 3600 seconds");
    return NULL;
  }
  opt4_ranges_set_latency(self->r, (uint64_t)(sec * 1e9 + 0.5));
  Py_RETURN_NONE;
}

static PyMethodDef ranges_methods[] = {
    {"read", (PyCFunction)ranges_read, METH_O, "read(i) -> bytes of item i"},
    {"len_of", (PyCFunction)ranges_len_of, METH_O, "len_of(i) -> length of item i"},
    {"checksums", (PyCFunction)ranges_checksums, METH_NOARGS,
     "checksums() -> bytes: each item's XXH3-64 (native uint64), read from storage now, not counted"},
    {"info", (PyCFunction)ranges_info, METH_NOARGS, "Counts, sizes, how reads are done."},
    {"set_latency", (PyCFunction)ranges_set_latency, METH_O,
     "set_latency(seconds): sleep this long before each read (an emulated slow store)"},
    {"close", (PyCFunction)ranges_close, METH_NOARGS, "Close the files."},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods ranges_as_sequence = {.sq_length = (lenfunc)ranges_length};

PyTypeObject opt4py_RangesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opt4torch._engine.Ranges",
    .tp_basicsize = sizeof(RangesObject),
    .tp_dealloc = (destructor)ranges_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ranges(paths, items, direct=False, ident=None, sums=None): byte ranges of files read in place, by index "
              "(thread-safe); items are int64 (file, offset, length) rows.",
    .tp_methods = ranges_methods,
    .tp_as_sequence = &ranges_as_sequence,
    .tp_new = ranges_new,
};

static PyObject *decode_name(const char *p, uint64_t n) {
  return PyUnicode_DecodeUTF8(p, (Py_ssize_t)n, "surrogateescape");
}

/* tar_index(path) -> [(key, offset, length, [(field, offset, size), ...]), ...] */
static PyObject *py_tar_index(PyObject *Py_UNUSED(m), PyObject *arg) {
  PyObject *path;
  if (!PyUnicode_FSConverter(arg, &path)) return NULL;
  opt4_tar_index *t = NULL;
  int rc;
  const char *p = PyBytes_AS_STRING(path);
  Py_BEGIN_ALLOW_THREADS rc = opt4_tar_index_file(p, &t);
  Py_END_ALLOW_THREADS Py_DECREF(path);
  if (rc != 0) return opt4py_raise_records(rc, "index tar shard");
  opt4_tar_view v;
  opt4_tar_index_view(t, &v);
  PyObject *out = PyList_New((Py_ssize_t)v.n_samples);
  for (uint64_t s = 0; out != NULL && s < v.n_samples; s++) {
    const opt4_tar_sample *sm = &v.samples[s];
    PyObject *mem = PyList_New((Py_ssize_t)sm->members);
    for (uint64_t k = 0; mem != NULL && k < sm->members; k++) {
      const opt4_tar_member *mm = &v.members[sm->first_member + k];
      PyObject *field = decode_name(v.names + mm->field_off, mm->field_len);
      PyObject *row = field ? Py_BuildValue("(NKK)", field, (unsigned long long)mm->offset,
                                            (unsigned long long)mm->size) : NULL;
      if (row == NULL) Py_CLEAR(mem);
      else PyList_SET_ITEM(mem, (Py_ssize_t)k, row);
    }
    PyObject *key = mem ? decode_name(v.names + sm->key_off, sm->key_len) : NULL;
    PyObject *row = key ? Py_BuildValue("(NKKN)", key, (unsigned long long)sm->offset,
                                        (unsigned long long)sm->length, mem) : NULL;
    if (row == NULL) {
      if (key == NULL) Py_XDECREF(mem);
      Py_CLEAR(out);
    } else {
      PyList_SET_ITEM(out, (Py_ssize_t)s, row);
    }
  }
  opt4_tar_index_close(t);
  return out;
}

/* tar_records(ranges, samples, items) -> [bytes or None]: items read
 * through the tar-sample source (tarframe.c), as the prefetcher stores them;
 * None for a sample it leaves to the worker. For tests against the codec. */
static PyObject *py_tar_records(PyObject *Py_UNUSED(m), PyObject *args) {
  PyObject *rec, *samples, *items;
  if (!PyArg_ParseTuple(args, "O!O!O:tar_records", &opt4py_RangesType, &rec, &PyTuple_Type, &samples, &items)) return NULL;
  if (opt4py_ranges_check((RangesObject *)rec) < 0) return NULL;
  if (PyTuple_GET_SIZE(samples) != 2) return PyErr_Format(PyExc_ValueError, "samples must be (keys, members)");
  opt4py_tar_layout *layout = opt4py_tar_layout_new(PyTuple_GET_ITEM(samples, 0), PyTuple_GET_ITEM(samples, 1));
  if (layout == NULL) return NULL;
  opt4_source *ranges = NULL, *src = NULL;
  int rc = opt4_source_ranges(((RangesObject *)rec)->r, &ranges);
  if (rc != 0) {
    opt4py_tar_layout_free(layout);
    return opt4py_raise(rc, "tar records");
  }
  if ((rc = opt4py_tar_source(ranges, layout, &src)) != 0) return opt4py_raise(rc, "tar records");
  PyObject *fast = PySequence_Fast(items, "items must be a sequence of ints"), *out = NULL;
  Py_ssize_t n = fast ? PySequence_Fast_GET_SIZE(fast) : 0;
  if (fast != NULL) out = PyList_New(n);
  for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
    unsigned long long item = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(fast, i));
    uint64_t len = 0;
    PyObject *b = NULL;
    if (PyErr_Occurred() || (rc = opt4_source_size_of(src, item, &len)) != 0) {
      if (!PyErr_Occurred()) opt4py_raise(rc, "tar records");
    } else if ((b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len)) != NULL) {
      Py_BEGIN_ALLOW_THREADS rc = opt4_source_read_one(src, item, PyBytes_AS_STRING(b), (size_t)len, &len);
      Py_END_ALLOW_THREADS
      if (rc == OPT4_EINVAL) Py_SETREF(b, Py_NewRef(Py_None));
      else if (rc != 0) {
        Py_CLEAR(b);
        opt4py_raise(rc, "tar records");
      }
    }
    if (b == NULL) Py_CLEAR(out);
    else PyList_SET_ITEM(out, i, b);
  }
  Py_XDECREF(fast);
  opt4_source_close(src);
  return out;
}

/* checksum(buffer) -> int: its XXH3-64 (opt4_checksum), the GIL released. */
static PyObject *py_checksum(PyObject *Py_UNUSED(m), PyObject *arg) {
  Py_buffer v;
  if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS) < 0) return NULL;
  uint64_t h;
  Py_BEGIN_ALLOW_THREADS h = opt4_checksum(v.buf, (size_t)v.len);
  Py_END_ALLOW_THREADS PyBuffer_Release(&v);
  return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef ranges_functions[] = {
    {"checksum", py_checksum, METH_O,
     "checksum(buffer) -> int: its XXH3-64, the per-item checksum of Ranges.checksums()"},
    {"tar_records", py_tar_records, METH_VARARGS,
     "tar_records(ranges, (keys, members), items) -> [bytes or None]: samples as the C prefetcher stores "
     "them (frame='tar'); None where it leaves one to the worker"},
    {"tar_index", (PyCFunction)py_tar_index, METH_O,
     "tar_index(path) -> [(key, offset, length, [(field, offset, size), ...]), ...]: a tar shard's samples "
     "as WebDataset groups them (opt4_tar_index_file)"},
    {NULL, NULL, 0, NULL}};

int opt4py_ranges_init(PyObject *m) {
  if (PyType_Ready(&opt4py_RangesType) < 0) return -1;
  if (PyModule_AddObjectRef(m, "Ranges", (PyObject *)&opt4py_RangesType) < 0) return -1;
  return PyModule_AddFunctions(m, ranges_functions);
}
