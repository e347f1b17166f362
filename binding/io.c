/*
 * io.c - record files, file ranges and the C prefetcher, for Python: the
 * types Records (a reader), Ranges (byte ranges of files), RecordWriter and
 * Prefetcher, and tar_index. Reads and the prefetcher's
 * threads run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include "binding.h"
#include "decode.h"

#include <string.h>
#include <unistd.h>

#include "opt4.h"

/* ---- Records ---- */

typedef struct {
  PyObject_HEAD
  opt4_records *r;
  PyObject *path;
  Py_ssize_t readers; /* calls in progress without the GIL */
} RecordsObject;

static PyTypeObject RecordsType;

static int records_check(RecordsObject *self) {
  if (self->r == NULL) {
    PyErr_SetString(PyExc_ValueError, "operation on a closed record file");
    return -1;
  }
  return 0;
}

static PyObject *records_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"path", "direct", NULL};
  PyObject *path;
  int direct = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p", kwlist, PyUnicode_FSConverter, &path, &direct))
    return NULL;
  opt4_records *r = NULL;
  int rc;
  const char *p = PyBytes_AS_STRING(path);
  Py_BEGIN_ALLOW_THREADS rc = opt4_records_open(p, direct ? OPT4_RECORDS_DIRECT : 0, &r);
  Py_END_ALLOW_THREADS if (rc != 0) {
    Py_DECREF(path);
    return opt4py_raise_records(rc, "open record file");
  }
  RecordsObject *self = (RecordsObject *)type->tp_alloc(type, 0);
  if (self == NULL) {
    opt4_records_close(r);
    Py_DECREF(path);
    return NULL;
  }
  self->r = r;
  self->path = path;
  return (PyObject *)self;
}

static void records_dealloc(RecordsObject *self) {
  opt4_records_close(self->r);
  Py_XDECREF(self->path);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *records_close(RecordsObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->readers > 0) {
    PyErr_SetString(PyExc_RuntimeError, "cannot close a record file while it is being read");
    return NULL;
  }
  opt4_records_close(self->r);
  self->r = NULL;
  Py_RETURN_NONE;
}

static Py_ssize_t records_length(RecordsObject *self) {
  if (records_check(self) < 0) return -1;
  opt4_records_info in;
  opt4_records_info_get(self->r, &in);
  return (Py_ssize_t)in.count;
}

/* Read record i into a new bytes object. */
static PyObject *read_one(RecordsObject *self, unsigned long long i) {
  uint64_t len = 0;
  int rc = opt4_records_len(self->r, i, &len);
  if (rc != 0) return opt4py_raise_records(rc, "read record");
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
  if (out == NULL) return NULL;
  self->readers++;
  Py_BEGIN_ALLOW_THREADS rc = opt4_records_read(self->r, i, PyBytes_AS_STRING(out), (size_t)len, &len);
  Py_END_ALLOW_THREADS self->readers--;
  if (rc != 0) {
    Py_DECREF(out);
    return opt4py_raise_records(rc, "read record");
  }
  return out;
}

static PyObject *records_read(RecordsObject *self, PyObject *arg) {
  if (records_check(self) < 0) return NULL;
  unsigned long long i = PyLong_AsUnsignedLongLong(arg);
  if (i == (unsigned long long)-1 && PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_IndexError, "record index %R is out of range", arg);
    }
    return NULL;
  }
  return read_one(self, i);
}

static PyObject *records_len_of(RecordsObject *self, PyObject *arg) {
  if (records_check(self) < 0) return NULL;
  unsigned long long i = PyLong_AsUnsignedLongLong(arg);
  if (i == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  uint64_t len = 0;
  int rc = opt4_records_len(self->r, i, &len);
  if (rc != 0) return opt4py_raise(rc, "record length");
  return PyLong_FromUnsignedLongLong(len);
}

static PyObject *records_info(RecordsObject *self, PyObject *Py_UNUSED(ignored)) {
  if (records_check(self) < 0) return NULL;
  opt4_records_info in;
  opt4_records_info_get(self->r, &in);
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:O,s:K,s:K,s:K,s:d,s:s,s:K,s:K}", "count",
                       (unsigned long long)in.count, "total_bytes", (unsigned long long)in.total_bytes,
                       "max_len", (unsigned long long)in.max_len, "file_size",
                       (unsigned long long)in.file_size, "direct", in.direct ? Py_True : Py_False,
                       "dio_align", (unsigned long long)in.dio_align, "reads",
                       (unsigned long long)in.reads, "bytes_read", (unsigned long long)in.bytes_read,
                       "latency", (double)in.latency_ns / 1e9, "note", in.note, "version",
                       (unsigned long long)in.version, "checksum", (unsigned long long)in.checksum);
}

static PyObject *records_set_latency(RecordsObject *self, PyObject *arg) {
  if (records_check(self) < 0) return NULL;
  double sec = PyFloat_AsDouble(arg);
  if (sec == -1.0 && PyErr_Occurred()) return NULL;
  if (!(sec >= 0.0 && sec < 3600.0)) {
    PyErr_SetString(PyExc_ValueError, "latency must be between 0 and 3600 seconds");
    return NULL;
  }
  opt4_records_set_latency(self->r, (uint64_t)(sec * 1e9 + 0.5));
  Py_RETURN_NONE;
}

static PyObject *records_get_path(RecordsObject *self, void *Py_UNUSED(c)) {
  return PyUnicode_DecodeFSDefaultAndSize(PyBytes_AS_STRING(self->path), PyBytes_GET_SIZE(self->path));
}

static PyMethodDef records_methods[] = {
    {"read", (PyCFunction)records_read, METH_O, "read(i) -> bytes of record i"},
    {"len_of", (PyCFunction)records_len_of, METH_O, "len_of(i) -> length of record i"},
    {"info", (PyCFunction)records_info, METH_NOARGS, "Counts, sizes, how reads are done."},
    {"set_latency", (PyCFunction)records_set_latency, METH_O,
     "set_latency(seconds): sleep this long before each read (an emulated slow store)"},
    {"close", (PyCFunction)records_close, METH_NOARGS, "Close the file."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef records_getset[] = {
    {"path", (getter)records_get_path, NULL, "The file's path.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods records_as_sequence = {.sq_length = (lenfunc)records_length};

static PyTypeObject RecordsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opt4torch._engine.Records",
    .tp_basicsize = sizeof(RecordsObject),
    .tp_dealloc = (destructor)records_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Records(path, direct=False): a record file, read by index (thread-safe).",
    .tp_methods = records_methods,
    .tp_getset = records_getset,
    .tp_as_sequence = &records_as_sequence,
    .tp_new = records_new,
};

/* ---- RecordWriter ---- */

typedef struct {
  PyObject_HEAD
  opt4_records_writer *w;
} WriterObject;

static PyObject *writer_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"path", NULL};
  PyObject *path;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&", kwlist, PyUnicode_FSConverter, &path)) return NULL;
  opt4_records_writer *w = NULL;
  int rc = opt4_records_writer_open(PyBytes_AS_STRING(path), &w);
  Py_DECREF(path);
  if (rc != 0) return opt4py_raise_records(rc, "create record file");
  WriterObject *self = (WriterObject *)type->tp_alloc(type, 0);
  if (self == NULL) {
    opt4_records_writer_abort(w);
    return NULL;
  }
  self->w = w;
  return (PyObject *)self;
}

static void writer_dealloc(WriterObject *self) {
  opt4_records_writer_abort(self->w);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *writer_add(WriterObject *self, PyObject *arg) {
  if (self->w == NULL) return PyErr_Format(PyExc_ValueError, "the writer is finished");
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_records_writer_add(self->w, view.buf, (size_t)view.len);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (rc != 0) return opt4py_raise_records(rc, "write record");
  Py_RETURN_NONE;
}

static PyObject *writer_finish(WriterObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->w == NULL) return PyErr_Format(PyExc_ValueError, "the writer is finished");
  int rc;
  opt4_records_writer *w = self->w;
  self->w = NULL;
  Py_BEGIN_ALLOW_THREADS rc = opt4_records_writer_finish(w);
  Py_END_ALLOW_THREADS if (rc != 0) return opt4py_raise_records(rc, "finish record file");
  Py_RETURN_NONE;
}

static PyObject *writer_prepare(WriterObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->w == NULL) return PyErr_Format(PyExc_ValueError, "the writer is finished");
  int rc;
  uint64_t sum = 0;
  Py_BEGIN_ALLOW_THREADS rc = opt4_records_writer_prepare(self->w, &sum);
  Py_END_ALLOW_THREADS if (rc != 0) return opt4py_raise_records(rc, "complete record file");
  return PyLong_FromUnsignedLongLong(sum);
}

static PyObject *writer_abort(WriterObject *self, PyObject *Py_UNUSED(ignored)) {
  opt4_records_writer_abort(self->w);
  self->w = NULL;
  Py_RETURN_NONE;
}

static PyMethodDef writer_methods[] = {
    {"add", (PyCFunction)writer_add, METH_O, "add(buffer): append a record"},
    {"prepare", (PyCFunction)writer_prepare, METH_NOARGS,
     "prepare() -> checksum: complete and sync the file, not yet in place (then finish or abort)"},
    {"finish", (PyCFunction)writer_finish, METH_NOARGS, "Complete the file (atomically renamed)."},
    {"abort", (PyCFunction)writer_abort, METH_NOARGS, "Remove the partial file."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opt4torch._engine.RecordWriter",
    .tp_basicsize = sizeof(WriterObject),
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RecordWriter(path): stream records into a new record file.",
    .tp_methods = writer_methods,
    .tp_new = writer_new,
};

/* ---- OutFile: opt4_outfile, the one way files are written ---- */

typedef struct {
  PyObject_HEAD
  opt4_outfile *f;
} OutFileObject;

static PyObject *outfile_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"path", "no_symlink", NULL};
  PyObject *path;
  int no_symlink = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p", kwlist, PyUnicode_FSConverter, &path, &no_symlink))
    return NULL;
  opt4_outfile *f = NULL;
  int rc;
  const char *p = PyBytes_AS_STRING(path);
  uint32_t flags = no_symlink ? OPT4_OUTFILE_NO_SYMLINK : 0;
  Py_BEGIN_ALLOW_THREADS rc = opt4_outfile_open(p, flags, &f);
  Py_END_ALLOW_THREADS Py_DECREF(path);
  if (rc != 0) return opt4py_raise_records(rc, "write file");
  OutFileObject *self = (OutFileObject *)type->tp_alloc(type, 0);
  if (self == NULL) {
    opt4_outfile_abort(f);
    return NULL;
  }
  self->f = f;
  return (PyObject *)self;
}

static void outfile_dealloc(OutFileObject *self) {
  opt4_outfile_abort(self->f);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int outfile_check_open(OutFileObject *self) {
  if (self->f != NULL) return 0;
  PyErr_SetString(PyExc_ValueError, "the file is already committed or aborted");
  return -1;
}

static PyObject *outfile_write(OutFileObject *self, PyObject *arg) {
  if (outfile_check_open(self) < 0) return NULL;
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_outfile_write(self->f, view.buf, (size_t)view.len);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (rc != 0) return opt4py_raise_records(rc, "write file");
  Py_RETURN_NONE;
}

static PyObject *outfile_sync(OutFileObject *self, PyObject *Py_UNUSED(ignored)) {
  if (outfile_check_open(self) < 0) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_outfile_sync(self->f);
  Py_END_ALLOW_THREADS if (rc != 0) return opt4py_raise_records(rc, "write file");
  Py_RETURN_NONE;
}

static PyObject *outfile_commit(OutFileObject *self, PyObject *Py_UNUSED(ignored)) {
  if (outfile_check_open(self) < 0) return NULL;
  int rc;
  opt4_outfile *f = self->f;
  self->f = NULL;
  Py_BEGIN_ALLOW_THREADS rc = opt4_outfile_commit(f);
  Py_END_ALLOW_THREADS if (rc != 0) return opt4py_raise_records(rc, "write file");
  Py_RETURN_NONE;
}

static PyObject *outfile_abort(OutFileObject *self, PyObject *Py_UNUSED(ignored)) {
  opt4_outfile_abort(self->f);
  self->f = NULL;
  Py_RETURN_NONE;
}

static PyObject *outfile_get_tmp(OutFileObject *self, void *Py_UNUSED(c)) {
  if (self->f == NULL) Py_RETURN_NONE;
  return PyUnicode_DecodeFSDefault(opt4_outfile_tmp_path(self->f));
}

static PyObject *py_outfile_check(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"path", "no_symlink", NULL};
  PyObject *path;
  int no_symlink = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p", kwlist, PyUnicode_FSConverter, &path, &no_symlink))
    return NULL;
  int rc = opt4_outfile_check(PyBytes_AS_STRING(path), no_symlink ? OPT4_OUTFILE_NO_SYMLINK : 0);
  Py_DECREF(path);
  if (rc != 0) return opt4py_raise_records(rc, "write file");
  Py_RETURN_NONE;
}

static PyMethodDef outfile_methods[] = {
    {"write", (PyCFunction)outfile_write, METH_O, "write(buffer): append to the temporary file"},
    {"sync", (PyCFunction)outfile_sync, METH_NOARGS, "Complete the temporary file, not yet in place."},
    {"commit", (PyCFunction)outfile_commit, METH_NOARGS, "Check the target again and rename over it."},
    {"abort", (PyCFunction)outfile_abort, METH_NOARGS, "Remove the temporary file."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef outfile_getset[] = {
    {"tmp_path", (getter)outfile_get_tmp, NULL, "The temporary file (None once done).", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject OutFileType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opt4torch._engine.OutFile",
    .tp_basicsize = sizeof(OutFileObject),
    .tp_dealloc = (destructor)outfile_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "OutFile(path, no_symlink=False): write a file atomically (opt4_outfile in opt4.h).",
    .tp_methods = outfile_methods,
    .tp_getset = outfile_getset,
    .tp_new = outfile_new,
};


/* ---- Ranges: byte ranges of files (opt4_ranges), and the tar indexer ---- */

typedef struct {
  PyObject_HEAD
  opt4_ranges *r;
  Py_ssize_t readers; /* calls in progress without the GIL, and prefetchers */
} RangesObject;

static PyTypeObject RangesType;

static int ranges_check(RangesObject *self) {
  if (self->r == NULL) {
    PyErr_SetString(PyExc_ValueError, "operation on closed file ranges");
    return -1;
  }
  return 0;
}

/* Ranges(paths, items, direct=False): items is a C-contiguous int64 buffer
 * of (file, offset, length) rows. */
static PyObject *ranges_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"paths", "items", "direct", NULL};
  PyObject *paths, *items;
  int direct = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|p", kwlist, &paths, &items, &direct)) return NULL;
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
  if (PyObject_GetBuffer(items, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto leave;
  have_view = 1;
  if (view.itemsize != 8 || view.format == NULL || (strcmp(view.format, "q") != 0 && strcmp(view.format, "l") != 0) ||
      view.len % 24 != 0) {
    PyErr_SetString(PyExc_TypeError, "items must be a contiguous int64 array of (file, offset, length) rows");
    goto leave;
  }
  const int64_t *rows = view.buf;
  uint64_t n = (uint64_t)view.len / 24;
  for (uint64_t i = 0; i < 3 * n; i++)
    if (rows[i] < 0) {
      PyErr_Format(PyExc_ValueError, "item %llu has a negative file, offset or length", (unsigned long long)(i / 3));
      goto leave;
    }
  opt4_ranges *r = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_ranges_open(cp, (uint64_t)nf, (const opt4_range *)view.buf, n,
                                               direct ? OPT4_RANGES_DIRECT : 0, &r);
  Py_END_ALLOW_THREADS if (rc != 0) {
    opt4py_raise_records(rc, "open file ranges");
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
  if (ranges_check(self) < 0) return -1;
  opt4_ranges_info in;
  opt4_ranges_info_get(self->r, &in);
  return (Py_ssize_t)in.count;
}

static PyObject *ranges_read(RangesObject *self, PyObject *arg) {
  if (ranges_check(self) < 0) return NULL;
  unsigned long long i = PyLong_AsUnsignedLongLong(arg);
  if (i == (unsigned long long)-1 && PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_IndexError, "item index %R is out of range", arg);
    }
    return NULL;
  }
  uint64_t len = 0;
  int rc = opt4_ranges_len(self->r, i, &len);
  if (rc != 0) return opt4py_raise_records(rc, "read item");
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
  if (out == NULL) return NULL;
  self->readers++;
  Py_BEGIN_ALLOW_THREADS rc = opt4_ranges_read(self->r, i, PyBytes_AS_STRING(out), (size_t)len, &len);
  Py_END_ALLOW_THREADS self->readers--;
  if (rc != 0) {
    Py_DECREF(out);
    return opt4py_raise_records(rc, "read item");
  }
  return out;
}

static PyObject *ranges_len_of(RangesObject *self, PyObject *arg) {
  if (ranges_check(self) < 0) return NULL;
  unsigned long long i = PyLong_AsUnsignedLongLong(arg);
  if (i == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  uint64_t len = 0;
  int rc = opt4_ranges_len(self->r, i, &len);
  if (rc != 0) return opt4py_raise(rc, "item length");
  return PyLong_FromUnsignedLongLong(len);
}

static PyObject *ranges_info(RangesObject *self, PyObject *Py_UNUSED(ignored)) {
  if (ranges_check(self) < 0) return NULL;
  opt4_ranges_info in;
  opt4_ranges_info_get(self->r, &in);
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:O,s:K,s:K,s:K,s:d,s:s}", "count", (unsigned long long)in.count, "files",
                       (unsigned long long)in.files, "total_bytes", (unsigned long long)in.total_bytes, "max_len",
                       (unsigned long long)in.max_len, "direct", in.direct ? Py_True : Py_False, "dio_align",
                       (unsigned long long)in.dio_align, "reads", (unsigned long long)in.reads, "bytes_read",
                       (unsigned long long)in.bytes_read, "latency", (double)in.latency_ns / 1e9, "note", in.note);
}

static PyObject *ranges_set_latency(RangesObject *self, PyObject *arg) {
  if (ranges_check(self) < 0) return NULL;
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
    {"info", (PyCFunction)ranges_info, METH_NOARGS, "Counts, sizes, how reads are done."},
    {"set_latency", (PyCFunction)ranges_set_latency, METH_O,
     "set_latency(seconds): sleep this long before each read (an emulated slow store)"},
    {"close", (PyCFunction)ranges_close, METH_NOARGS, "Close the files."},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods ranges_as_sequence = {.sq_length = (lenfunc)ranges_length};

static PyTypeObject RangesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opt4torch._engine.Ranges",
    .tp_basicsize = sizeof(RangesObject),
    .tp_dealloc = (destructor)ranges_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ranges(paths, items, direct=False): byte ranges of files read in place, by index "
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
  if (!PyArg_ParseTuple(args, "O!O!O:tar_records", &RangesType, &rec, &PyTuple_Type, &samples, &items)) return NULL;
  if (ranges_check((RangesObject *)rec) < 0) return NULL;
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

static PyMethodDef io_functions[] = {
    {"outfile_check", (PyCFunction)(void (*)(void))py_outfile_check, METH_VARARGS | METH_KEYWORDS,
     "outfile_check(path, no_symlink=False): refuse a target as OutFile would, creating nothing"},
    {"prefetchers_park", opt4py_prefetchers_park, METH_NOARGS,
     "prefetchers_park() -> int: park every C prefetch thread of this process at a safe point, with the GIL "
     "released (Python's before-fork hook); the threads not parked within 10 s"},
    {"prefetchers_resume", opt4py_prefetchers_resume, METH_NOARGS,
     "prefetchers_resume(): let the parked threads go (after a fork, in the parent)"},
    {"tar_records", py_tar_records, METH_VARARGS,
     "tar_records(ranges, (keys, members), items) -> [bytes or None]: samples as the C prefetcher stores "
     "them (frame='tar'); None where it leaves one to the worker"},
    {"tar_index", (PyCFunction)py_tar_index, METH_O,
     "tar_index(path) -> [(key, offset, length, [(field, offset, size), ...]), ...]: a tar shard's samples "
     "as WebDataset groups them (opt4_tar_index_file)"},
    {NULL, NULL, 0, NULL}};

/* ---- Prefetcher ---- */

/* How the prefetcher frames a record in the pool: as the codec stores what
 * the Python dataset returns (python/opt4torch/_codec.py), so the consumer's
 * decoder gives the same object: `bytes`, or `(bytes, label)`. */
enum { FRAME_RAW, FRAME_BYTES, FRAME_BYTES_LABEL };

typedef struct frame_ctx {
  int mode;
  const int64_t *labels;
  uint64_t n_labels;
} frame_ctx;

/* The codec's record (binding/decode.h): "O4", its format byte, then the
 * node: a bytes node, or a tuple (u32 count 2) of a bytes node and an int. */
static int frame_codec(void *vctx, uint32_t item, uint64_t len, uint8_t *head, size_t *head_len,
                       uint8_t *tail, size_t *tail_len) {
  const frame_ctx *ctx = vctx;
  size_t n = 0;
  head[n++] = 'O';
  head[n++] = '4';
  head[n++] = REC_FORMAT;
  if (ctx->mode == FRAME_BYTES_LABEL) {
    if (item >= ctx->n_labels) return -1;
    head[n++] = REC_TUPLE;
    rec_le32(head + n, 2);
    n += 4;
  }
  n += rec_bytes_head(head + n, n, len);
  *head_len = n;
  *tail_len = 0;
  if (ctx->mode == FRAME_BYTES_LABEL) {
    tail[0] = REC_INT;
    rec_le64(tail + 1, (uint64_t)ctx->labels[item]);
    *tail_len = 9;
  }
  return 0;
}

typedef struct {
  PyObject_HEAD
  opt4_prefetcher *pf;
  PyObject *records; /* Records or Ranges, kept alive while the threads read it */
  Py_ssize_t *readers; /* its count of readers, which keeps it open */
  opt4_source *src;    /* the source made over Ranges (records need none) */
  frame_ctx frame;
  int64_t *labels;
  pid_t pid; /* the threads live in this process only */
} PrefetcherObject;

static void prefetcher_stop_now(PrefetcherObject *self) {
  if (self->pf != NULL && getpid() != self->pid) {
    /* A forked child's copy: the threads are not here to stop. */
    self->pf = NULL;
    return;
  }
  if (self->pf != NULL) {
    opt4_prefetcher *pf = self->pf;
    self->pf = NULL;
    Py_BEGIN_ALLOW_THREADS opt4_prefetcher_stop(pf);
    Py_END_ALLOW_THREADS
  }
}

/* Start the threads over self->src (made by the caller, which the
 * prefetcher borrows until it stops); self is returned, or NULL with an
 * exception (self released). */
static PyObject *prefetcher_start(PrefetcherObject *self, const char *name, unsigned int threads,
                                  unsigned long long lookahead) {
  opt4_prefetcher_opts o;
  memset(&o, 0, sizeof o);
  o.threads = threads;
  o.lookahead = lookahead;
  opt4_prefetcher *pf = NULL;
  opt4_source *src = self->src;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_prefetcher_start_source(name, src, &o, &pf);
  Py_END_ALLOW_THREADS if (rc != 0) {
    Py_DECREF(self);
    return opt4py_raise(rc, "start prefetcher");
  }
  self->pf = pf;
  self->pid = getpid();
  return (PyObject *)self;
}

static PyObject *prefetcher_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"pool_name", "records", "threads", "lookahead", "frame", "labels", "samples",
                           "load", "items", "max_size", NULL};
  const char *name, *frame = "bytes";
  PyObject *rec;
  unsigned int threads = 0;
  unsigned long long lookahead = 0, items = 0, max_size = 0;
  PyObject *labels = Py_None, *samples = Py_None, *load = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|IKsOOOKK", kwlist, &name, &rec, &threads, &lookahead, &frame,
                                   &labels, &samples, &load, &items, &max_size))
    return NULL;
  if (load != Py_None) {
    /* A Python callback: records is None, and nothing is framed. */
    if (rec != Py_None || strcmp(frame, "raw") != 0 || !PyCallable_Check(load))
      return PyErr_Format(PyExc_ValueError, "load= takes a callable, with records=None and frame='raw'");
    PrefetcherObject *self = (PrefetcherObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->frame.mode = FRAME_RAW;
    int rc = opt4py_py_source(load, items, max_size, &self->src);
    if (rc != 0) {
      Py_DECREF(self);
      return opt4py_raise(rc, "start prefetcher");
    }
    return prefetcher_start(self, name, threads, lookahead);
  }
  int is_ranges = PyObject_TypeCheck(rec, &RangesType);
  if (!is_ranges && !PyObject_TypeCheck(rec, &RecordsType))
    return PyErr_Format(PyExc_TypeError, "the prefetcher reads Records or Ranges, not %s", Py_TYPE(rec)->tp_name);
  if (is_ranges ? ranges_check((RangesObject *)rec) < 0 : records_check((RecordsObject *)rec) < 0) return NULL;
  int tar = strcmp(frame, "tar") == 0;
  if (strcmp(frame, "raw") != 0 && strcmp(frame, "bytes") != 0 && !tar)
    return PyErr_Format(PyExc_ValueError, "frame must be 'bytes', 'tar' or 'raw', not '%s'", frame);
  if (tar != (samples != Py_None) || (tar && (!is_ranges || !PyTuple_Check(samples) || PyTuple_GET_SIZE(samples) != 2)))
    return PyErr_Format(PyExc_ValueError, "frame='tar' reads Ranges, with samples=(keys, members) as TarShards "
                                          "has them; samples= goes with frame='tar' only");
  /* Built before anything else, with the GIL: the threads only read it. */
  opt4py_tar_layout *layout = NULL;
  if (tar && (layout = opt4py_tar_layout_new(PyTuple_GET_ITEM(samples, 0), PyTuple_GET_ITEM(samples, 1))) == NULL)
    return NULL;
  PrefetcherObject *self = (PrefetcherObject *)type->tp_alloc(type, 0);
  if (self == NULL) {
    opt4py_tar_layout_free(layout);
    return NULL;
  }
  if (strcmp(frame, "bytes") == 0) self->frame.mode = labels == Py_None ? FRAME_BYTES : FRAME_BYTES_LABEL;
  else self->frame.mode = FRAME_RAW; /* raw, or tar: the source writes the record */
  if (self->frame.mode == FRAME_BYTES_LABEL) {
    Py_buffer view;
    if (PyObject_GetBuffer(labels, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
      Py_DECREF(self);
      return NULL;
    }
    if (view.itemsize != 8 || view.format == NULL || (strcmp(view.format, "q") != 0 && strcmp(view.format, "l") != 0)) {
      PyBuffer_Release(&view);
      Py_DECREF(self);
      return PyErr_Format(PyExc_TypeError, "labels must be a contiguous int64 array");
    }
    size_t n = (size_t)(view.len / 8);
    self->labels = PyMem_Malloc(n ? n * 8 : 8);
    if (self->labels == NULL) {
      PyBuffer_Release(&view);
      Py_DECREF(self);
      return PyErr_NoMemory();
    }
    memcpy(self->labels, view.buf, n * 8);
    PyBuffer_Release(&view);
    self->frame.labels = self->labels;
    self->frame.n_labels = n;
  }
  self->records = Py_NewRef(rec);
  self->readers = is_ranges ? &((RangesObject *)rec)->readers : &((RecordsObject *)rec)->readers;
  opt4_prefetcher_opts o;
  memset(&o, 0, sizeof o);
  o.threads = threads;
  o.lookahead = lookahead;
  if (self->frame.mode != FRAME_RAW) {
    o.frame = frame_codec;
    o.frame_ctx = &self->frame;
  }
  int rc;
  opt4_prefetcher *pf = NULL;
  if (is_ranges) {
    rc = opt4_source_ranges(((RangesObject *)rec)->r, &self->src);
    if (rc == 0 && layout != NULL) {
      opt4_source *ranges = self->src;
      self->src = NULL;
      rc = opt4py_tar_source(ranges, layout, &self->src); /* owns both from here */
    } else if (layout != NULL) {
      opt4py_tar_layout_free(layout);
    }
    if (rc != 0) {
      Py_DECREF(self);
      return opt4py_raise(rc, "start prefetcher");
    }
  }
  (*self->readers)++; /* the file stays open while the threads run */
  opt4_source *src = self->src;
  opt4_records *records = is_ranges ? NULL : ((RecordsObject *)rec)->r;
  Py_BEGIN_ALLOW_THREADS rc = src != NULL ? opt4_prefetcher_start_source(name, src, &o, &pf)
                                          : opt4_prefetcher_start(name, records, &o, &pf);
  Py_END_ALLOW_THREADS if (rc != 0) {
    (*self->readers)--;
    Py_DECREF(self);
    return opt4py_raise(rc, "start prefetcher");
  }
  self->pf = pf;
  self->pid = getpid();
  return (PyObject *)self;
}

static void prefetcher_release(PrefetcherObject *self) {
  int had = self->pf != NULL;
  prefetcher_stop_now(self);
  if (had && self->readers != NULL) (*self->readers)--;
}

static void prefetcher_dealloc(PrefetcherObject *self) {
  prefetcher_release(self);
  if (self->src != NULL && self->pf == NULL) {
    opt4_source_close(self->src); /* after the threads: they read through it */
    self->src = NULL;
  }
  Py_XDECREF(self->records);
  PyMem_Free(self->labels);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *prefetcher_stop(PrefetcherObject *self, PyObject *Py_UNUSED(ignored)) {
  prefetcher_release(self);
  Py_RETURN_NONE;
}

static PyObject *prefetcher_stats(PrefetcherObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pf == NULL) return PyErr_Format(PyExc_ValueError, "the prefetcher is stopped");
  opt4_prefetcher_stats st;
  opt4_prefetcher_stats_get(self->pf, &st);
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:d,s:I,s:I,s:K,s:K}", "loaded", (unsigned long long)st.loaded, "bytes",
                       (unsigned long long)st.bytes, "stored", (unsigned long long)st.stored, "errors",
                       (unsigned long long)st.errors, "idle_seconds", (double)st.idle_ns / 1e9, "threads",
                       st.threads, "finished", st.finished, "parks", (unsigned long long)st.parks,
                       "park_timeouts", (unsigned long long)st.park_timeouts);
}

static PyObject *prefetcher_get_running(PrefetcherObject *self, void *Py_UNUSED(c)) {
  return PyBool_FromLong(self->pf != NULL);
}

static PyObject *prefetcher_progress(PrefetcherObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pf == NULL) return PyErr_Format(PyExc_ValueError, "the prefetcher is stopped");
  return PyLong_FromUnsignedLong(opt4_prefetcher_progress(self->pf));
}

/* wait(seen, timeout) -> bool: opt4_prefetcher_wait, with the GIL released. */
static PyObject *prefetcher_wait(PrefetcherObject *self, PyObject *args) {
  unsigned long seen;
  double timeout;
  if (!PyArg_ParseTuple(args, "kd:wait", &seen, &timeout)) return NULL;
  if (self->pf == NULL) return PyErr_Format(PyExc_ValueError, "the prefetcher is stopped");
  if (!(timeout >= 0)) return PyErr_Format(PyExc_ValueError, "timeout must be >= 0 seconds");
  uint64_t ns = timeout > 1e9 ? (uint64_t)1e18 : (uint64_t)(timeout * 1e9);
  opt4_prefetcher *pf = self->pf;
  int moved;
  Py_BEGIN_ALLOW_THREADS moved = opt4_prefetcher_wait(pf, (uint32_t)seen, ns);
  Py_END_ALLOW_THREADS return PyBool_FromLong(moved);
}

static PyMethodDef prefetcher_methods[] = {
    {"stop", (PyCFunction)prefetcher_stop, METH_NOARGS, "Stop and join the threads."},
    {"progress", (PyCFunction)prefetcher_progress, METH_NOARGS,
     "progress() -> int: a counter that moves whenever a claimed miss is settled or a thread is done."},
    {"wait", (PyCFunction)prefetcher_wait, METH_VARARGS,
     "wait(seen, timeout) -> bool: sleep until progress() differs from seen (True) or timeout seconds pass "
     "(False), with the GIL released."},
    {"stats", (PyCFunction)prefetcher_stats, METH_NOARGS, "Counters of the threads."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef prefetcher_getset[] = {
    {"running", (getter)prefetcher_get_running, NULL, "Whether stop() has not been called.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject PrefetcherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opt4torch._engine.Prefetcher",
    .tp_basicsize = sizeof(PrefetcherObject),
    .tp_dealloc = (destructor)prefetcher_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Prefetcher(pool_name, records, threads=8, lookahead=4096, frame='bytes', labels=None, samples=None, load=None, items=0, max_size=0): "
              "C threads loading a pool's misses from a record file (Records), file ranges (Ranges), or "
              "load(i) (a Python callable returning the codec's parts, or None) ahead of its consumers.",
    .tp_methods = prefetcher_methods,
    .tp_getset = prefetcher_getset,
    .tp_new = prefetcher_new,
};

int opt4py_io_init(PyObject *m) {
  if (PyType_Ready(&RecordsType) < 0 || PyType_Ready(&RangesType) < 0 || PyType_Ready(&WriterType) < 0 || PyType_Ready(&PrefetcherType) < 0 ||
      PyType_Ready(&OutFileType) < 0)
    return -1;
  if (PyModule_AddFunctions(m, io_functions) < 0) return -1;
  if (PyModule_AddObjectRef(m, "Records", (PyObject *)&RecordsType) < 0 ||
      PyModule_AddObjectRef(m, "Ranges", (PyObject *)&RangesType) < 0 ||
      PyModule_AddObjectRef(m, "RecordWriter", (PyObject *)&WriterType) < 0 ||
      PyModule_AddObjectRef(m, "OutFile", (PyObject *)&OutFileType) < 0 ||
      PyModule_AddObjectRef(m, "Prefetcher", (PyObject *)&PrefetcherType) < 0)
    return -1;
  return 0;
}
