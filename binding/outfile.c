/* outfile.c - OutFile (opt4_outfile: the one way files are written, a
 * temporary beside the target renamed when complete) and outfile_check. */
#define PY_SSIZE_T_CLEAN
#include "binding.h"
#include "io.h"

#include <string.h>
#include <unistd.h>

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

static PyMethodDef outfile_functions[] = {
    {"outfile_check", (PyCFunction)(void (*)(void))py_outfile_check, METH_VARARGS | METH_KEYWORDS,
     "outfile_check(path, no_symlink=False): refuse a target as OutFile would, creating nothing"},
    {NULL, NULL, 0, NULL}};

int opt4py_outfile_init(PyObject *m) {
  if (PyType_Ready(&OutFileType) < 0) return -1;
  if (PyModule_AddObjectRef(m, "OutFile", (PyObject *)&OutFileType) < 0) return -1;
  return PyModule_AddFunctions(m, outfile_functions);
}
