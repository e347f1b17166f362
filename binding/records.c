/* records.c - record files for Python: Records (a reader: reads without
 * the GIL) and RecordWriter. */
#define PY_SSIZE_T_CLEAN
#include "binding.h"
#include "io.h"

#include <string.h>
#include <unistd.h>

/* ---- Records ---- */

int opt4py_records_check(RecordsObject *self) {
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
  if (opt4py_records_check(self) < 0) return -1;
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
  if (opt4py_records_check(self) < 0) return NULL;
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
  if (opt4py_records_check(self) < 0) return NULL;
  unsigned long long i = PyLong_AsUnsignedLongLong(arg);
  if (i == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  uint64_t len = 0;
  int rc = opt4_records_len(self->r, i, &len);
  if (rc != 0) return opt4py_raise(rc, "record length");
  return PyLong_FromUnsignedLongLong(len);
}

static PyObject *records_info(RecordsObject *self, PyObject *Py_UNUSED(ignored)) {
  if (opt4py_records_check(self) < 0) return NULL;
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
  if (opt4py_records_check(self) < 0) return NULL;
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

PyTypeObject opt4py_RecordsType = {
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

int opt4py_records_init(PyObject *m) {
  if (PyType_Ready(&opt4py_RecordsType) < 0 || PyType_Ready(&WriterType) < 0) return -1;
  if (PyModule_AddObjectRef(m, "Records", (PyObject *)&opt4py_RecordsType) < 0) return -1;
  if (PyModule_AddObjectRef(m, "RecordWriter", (PyObject *)&WriterType) < 0) return -1;
  return 0;
}
