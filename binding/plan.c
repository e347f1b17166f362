/* plan.c - the binding's Plan type (a plan; its arrays as zero-copy Array
 * views) and the functions that make plans: build_plan, plan_from_seq,
 * replan, open_plan, load_plan_bytes. One file per Python type, as in
 * python-zstandard's c-ext/; _engine.c makes the module. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "opt4.h"
#include "binding.h"

/* ------------------------------------------------------------------------ */
/* Plan                                                                      */
/* ------------------------------------------------------------------------ */

typedef struct {
  PyObject_HEAD
  opt4_plan *plan;
  Py_ssize_t exports; /* live buffers over seq or ops */
  Py_ssize_t busy;    /* threads in a GIL-released section */
} PlanObject;

static PyTypeObject PlanType;

static PyObject *plan_wrap(opt4_plan *plan) {
  PlanObject *self = PyObject_New(PlanObject, &PlanType);
  if (self == NULL) {
    opt4_plan_close(plan);
    return NULL;
  }
  self->plan = plan;
  self->exports = 0;
  self->busy = 0;
  return (PyObject *)self;
}

static int plan_check_open(PlanObject *self) {
  if (self->plan == NULL) {
    PyErr_SetString(PyExc_ValueError, "operation on a closed plan");
    return -1;
  }
  return 0;
}

static void plan_dealloc(PlanObject *self) {
  /* Exports and busy sections hold references, so both are 0 here. */
  opt4_plan_close(self->plan);
  PyObject_Free(self);
}

static PyObject *plan_close(PlanObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->exports > 0 || self->busy > 0) {
    PyErr_SetString(PyExc_BufferError,
                    "cannot close a plan while arrays exported from it are alive "
                    "(delete them first) or another thread is using it");
    return NULL;
  }
  opt4_plan_close(self->plan);
  self->plan = NULL;
  Py_RETURN_NONE;
}

static PyObject *plan_closed(PlanObject *self, void *Py_UNUSED(closure)) {
  return PyBool_FromLong(self->plan == NULL);
}

static PyObject *plan_info(PlanObject *self, PyObject *Py_UNUSED(ignored)) {
  if (plan_check_open(self) < 0) return NULL;
  opt4_plan_info in;
  int rc = opt4_plan_info_get(self->plan, &in);
  if (rc != 0) return opt4py_raise(rc, "plan info");
  size_t dlen;
  const char *desc = opt4_plan_desc(self->plan, &dlen);
  return Py_BuildValue(
      "{s:K,s:K,s:K,s:O,s:O,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O,s:K,s:K,s:K,s:s#}", "items",
      (unsigned long long)in.items, "accesses", (unsigned long long)in.accesses,
      "capacity", (unsigned long long)in.capacity, "bypass",
      (in.flags & OPT4_PLAN_NOBYPASS) ? Py_False : Py_True, "has_ops",
      in.has_ops ? Py_True : Py_False, "fingerprint",
      (unsigned long long)in.fingerprint, "hits", (unsigned long long)in.hits,
      "misses", (unsigned long long)in.misses, "admits",
      (unsigned long long)in.admits, "bypasses", (unsigned long long)in.bypasses,
      "compulsory", (unsigned long long)in.compulsory, "slots",
      (unsigned long long)in.slots, "sized", (in.flags & OPT4_PLAN_SIZED) ? Py_True : Py_False,
      "capacity_bytes", (unsigned long long)in.capacity_bytes, "page_size",
      (unsigned long long)in.page_size, "generations", (unsigned long long)in.generations,
      "description", desc,
      (Py_ssize_t)dlen);
}

static PyObject *plan_set_description(PlanObject *self, PyObject *arg) {
  if (plan_check_open(self) < 0) return NULL;
  Py_ssize_t len;
  const char *s = PyUnicode_AsUTF8AndSize(arg, &len);
  if (s == NULL) return NULL;
  int rc = opt4_plan_set_desc(self->plan, s, (size_t)len);
  if (rc != 0) return opt4py_raise(rc, "set description");
  Py_RETURN_NONE;
}

static PyObject *plan_save(PlanObject *self, PyObject *arg) {
  if (plan_check_open(self) < 0) return NULL;
  PyObject *bytes = NULL;
  if (!PyUnicode_FSConverter(arg, &bytes)) return NULL;
  const char *path = PyBytes_AS_STRING(bytes);
  int rc;
  self->busy++;
  Py_BEGIN_ALLOW_THREADS rc = opt4_plan_save(self->plan, path);
  Py_END_ALLOW_THREADS self->busy--;
  Py_DECREF(bytes);
  if (rc != 0) return opt4py_raise(rc, "save plan");
  Py_RETURN_NONE;
}

/* A fresh bytearray of n int64 values filled by fn. */
static PyObject *int64_array(Py_ssize_t n) {
  if (n > PY_SSIZE_T_MAX / 8) return PyErr_NoMemory();
  return PyByteArray_FromStringAndSize(NULL, n * 8);
}

static PyObject *plan_victims(PlanObject *self, PyObject *Py_UNUSED(ignored)) {
  if (plan_check_open(self) < 0) return NULL;
  opt4_plan_info in;
  opt4_plan_info_get(self->plan, &in);
  PyObject *out = int64_array((Py_ssize_t)in.accesses);
  if (out == NULL) return NULL;
  int64_t *dst = (int64_t *)(void *)PyByteArray_AS_STRING(out);
  int rc;
  self->busy++;
  Py_BEGIN_ALLOW_THREADS rc = opt4_plan_victims(self->plan, dst, in.accesses);
  Py_END_ALLOW_THREADS self->busy--;
  if (rc != 0) {
    Py_DECREF(out);
    return opt4py_raise(rc, "victims");
  }
  return out;
}

/* gen_pages(g) -> bytes of uint32 pages (sized plans). */
static PyObject *plan_gen_pages(PlanObject *self, PyObject *arg) {
  if (plan_check_open(self) < 0) return NULL;
  unsigned long long g = PyLong_AsUnsignedLongLong(arg);
  if (g == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  const uint32_t *pages;
  uint64_t n;
  int rc = opt4_plan_gen_pages(self->plan, g, &pages, &n);
  if (rc != 0) return opt4py_raise(rc, "gen_pages");
  return PyBytes_FromStringAndSize((const char *)pages, (Py_ssize_t)(n * 4));
}

/* item_sizes() -> bytes of uint32 per item (sized plans), or None. */
static PyObject *plan_item_sizes(PlanObject *self, PyObject *Py_UNUSED(ignored)) {
  if (plan_check_open(self) < 0) return NULL;
  const uint32_t *sizes = opt4_plan_item_sizes(self->plan);
  if (sizes == NULL) Py_RETURN_NONE;
  opt4_plan_info in;
  opt4_plan_info_get(self->plan, &in);
  return PyBytes_FromStringAndSize((const char *)sizes, (Py_ssize_t)(in.items * 4));
}

static PyObject *plan_slots_at(PlanObject *self, PyObject *arg) {
  if (plan_check_open(self) < 0) return NULL;
  unsigned long long t = PyLong_AsUnsignedLongLong(arg);
  if (t == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  opt4_plan_info in;
  opt4_plan_info_get(self->plan, &in);
  uint64_t n = in.slots;
  PyObject *out = int64_array((Py_ssize_t)n);
  if (out == NULL) return NULL;
  int64_t *dst = (int64_t *)(void *)PyByteArray_AS_STRING(out);
  int rc;
  self->busy++;
  Py_BEGIN_ALLOW_THREADS rc = opt4_plan_slots_at(self->plan, t, dst, n);
  Py_END_ALLOW_THREADS self->busy--;
  if (rc != 0) {
    Py_DECREF(out);
    return opt4py_raise(rc, "slots_at");
  }
  return out;
}

/* ---- zero-copy views of the plan's arrays ---- */

typedef struct {
  PyObject_HEAD
  PlanObject *owner;
  int which; /* 0: seq, 1: ops */
} ArrayObject;

static PyTypeObject ArrayType;

static int array_getbuffer(ArrayObject *self, Py_buffer *view, int flags) {
  PlanObject *owner = self->owner;
  if (plan_check_open(owner) < 0) return -1;
  if (flags & PyBUF_WRITABLE) {
    PyErr_SetString(PyExc_BufferError, "plan arrays are read-only");
    return -1;
  }
  opt4_plan_info in;
  opt4_plan_info_get(owner->plan, &in);
  const uint32_t *data = self->which == 0 ? opt4_plan_seq(owner->plan)
                                          : opt4_plan_ops(owner->plan);
  static const uint32_t empty[1] = {0};
  if (data == NULL) data = empty; /* a plan of length 0 */
  view->buf = (void *)data;
  view->obj = (PyObject *)self;
  Py_INCREF(self);
  view->len = (Py_ssize_t)(in.accesses * sizeof(uint32_t));
  view->readonly = 1;
  view->itemsize = sizeof(uint32_t);
  view->format = (flags & PyBUF_FORMAT) ? "I" : NULL;
  view->ndim = 1;
  /* The shape is in items; it lives in view->internal until release. */
  view->shape = NULL;
  view->internal = NULL;
  if (flags & PyBUF_ND) {
    Py_ssize_t *shape = PyMem_Malloc(sizeof(Py_ssize_t));
    if (shape == NULL) {
      Py_DECREF(self);
      view->obj = NULL;
      PyErr_NoMemory();
      return -1;
    }
    *shape = (Py_ssize_t)in.accesses;
    view->shape = shape;
    view->internal = shape;
  }
  view->strides = NULL;
  view->suboffsets = NULL;
  owner->exports++;
  return 0;
}

static void array_releasebuffer(ArrayObject *self, Py_buffer *view) {
  PyMem_Free(view->internal);
  self->owner->exports--;
}

static void array_dealloc(ArrayObject *self) {
  Py_DECREF(self->owner);
  PyObject_Free(self);
}

static PyBufferProcs array_as_buffer = {(getbufferproc)array_getbuffer,
                                        (releasebufferproc)array_releasebuffer};

static PyTypeObject ArrayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opt4torch._engine.PlanArray",
    .tp_basicsize = sizeof(ArrayObject),
    .tp_dealloc = (destructor)array_dealloc,
    .tp_as_buffer = &array_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A read-only uint32 buffer over a plan's ids or ops.",
};

static PyObject *plan_array(PlanObject *self, int which) {
  if (plan_check_open(self) < 0) return NULL;
  if (which == 1 && opt4_plan_ops(self->plan) == NULL) {
    opt4_plan_info in;
    opt4_plan_info_get(self->plan, &in);
    if (in.accesses > 0 || !in.has_ops) return opt4py_raise(OPT4_ENOPLAN, "ops");
  }
  ArrayObject *a = PyObject_New(ArrayObject, &ArrayType);
  if (a == NULL) return NULL;
  Py_INCREF(self);
  a->owner = self;
  a->which = which;
  return (PyObject *)a;
}

static PyObject *plan_seq_buffer(PlanObject *self, PyObject *Py_UNUSED(ignored)) {
  return plan_array(self, 0);
}
static PyObject *plan_ops_buffer(PlanObject *self, PyObject *Py_UNUSED(ignored)) {
  return plan_array(self, 1);
}

static PyMethodDef plan_methods[] = {
    {"info", (PyCFunction)plan_info, METH_NOARGS, "Header fields and totals as a dict."},
    {"save", (PyCFunction)plan_save, METH_O, "save(path): write the plan file atomically."},
    {"set_description", (PyCFunction)plan_set_description, METH_O,
     "set_description(text): the sampler description stored with the plan."},
    {"victims", (PyCFunction)plan_victims, METH_NOARGS,
     "int64 victim per position (-1 if none) as a bytearray."},
    {"slots_at", (PyCFunction)plan_slots_at, METH_O,
     "slots_at(t): int64 contents per slot just before position t, as a bytearray."},
    {"gen_pages", (PyCFunction)plan_gen_pages, METH_O,
     "gen_pages(g): the pages of generation g (sized plans), as uint32 bytes."},
    {"item_sizes", (PyCFunction)plan_item_sizes, METH_NOARGS,
     "Each item's size in bytes (sized plans), as uint32 bytes, or None."},
    {"seq_buffer", (PyCFunction)plan_seq_buffer, METH_NOARGS,
     "A zero-copy read-only uint32 buffer over the ids."},
    {"ops_buffer", (PyCFunction)plan_ops_buffer, METH_NOARGS,
     "A zero-copy read-only uint32 buffer over the ops."},
    {"close", (PyCFunction)plan_close, METH_NOARGS,
     "Release the plan now (refused while buffers are exported)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef plan_getset[] = {
    {"closed", (getter)plan_closed, NULL, "Whether close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opt4torch._engine.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An OPT cache plan held by the C engine.",
    .tp_methods = plan_methods,
    .tp_getset = plan_getset,
};


/* An optional writable buffer of at least 8 aligned bytes that the build
 * updates with its progress (see opt4_plan_opts.progress). */
static int get_progress(PyObject *obj, Py_buffer *view, volatile uint64_t **out) {
  *out = NULL;
  if (obj == NULL || obj == Py_None) return 0;
  if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) < 0) return -1;
  if (view->len < 8 || ((uintptr_t)view->buf & 7) != 0) {
    PyBuffer_Release(view);
    PyErr_SetString(PyExc_ValueError, "progress must be a writable, 8-byte aligned "
                                      "buffer of at least 8 bytes");
    return -1;
  }
  *out = (volatile uint64_t *)view->buf;
  return 0;
}

static PyObject *py_build_plan(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"seq",       "items",     "capacity", "bypass", "progress", "item_sizes",
                           "capacity_bytes", "page_size", "kinds",  NULL};
  PyObject *obj, *prog_obj = NULL, *sizes_obj = NULL, *kinds_obj = NULL;
  unsigned long long items, capacity, capacity_bytes = 0, page_size = 0;
  int bypass = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OKK|pOOKKO", kwlist, &obj, &items, &capacity, &bypass,
                                   &prog_obj, &sizes_obj, &capacity_bytes, &page_size, &kinds_obj))
    return NULL;
  Py_buffer view, prog_view, sizes_view, kinds_view = {0};
  int have_sizes = sizes_obj != NULL && sizes_obj != Py_None;
  int have_kinds = kinds_obj != NULL && kinds_obj != Py_None;
  opt4_seq seq;
  opt4_plan_opts opts;
  memset(&opts, 0, sizeof opts);
  if (have_sizes) {
    if (PyObject_GetBuffer(sizes_obj, &sizes_view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    const char *f = sizes_view.format ? sizes_view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (sizes_view.itemsize != 8 || (strcmp(f, "Q") != 0 && strcmp(f, "L") != 0) ||
        (uint64_t)(sizes_view.len / 8) != items) {
      PyBuffer_Release(&sizes_view);
      PyErr_Format(PyExc_TypeError, "item_sizes must be a 1-D uint64 buffer with one entry per item (%llu)",
                   items);
      return NULL;
    }
    opts.item_sizes = (const uint64_t *)sizes_view.buf;
  }
  if (get_progress(prog_obj, &prog_view, &opts.progress) < 0) {
    if (have_sizes) PyBuffer_Release(&sizes_view);
    return NULL;
  }
  if (opt4py_get_seq(obj, items, &view, &seq) < 0) {
    if (opts.progress != NULL) PyBuffer_Release(&prog_view);
    if (have_sizes) PyBuffer_Release(&sizes_view);
    return NULL;
  }
  /* Given kinds (opt4_plan_from_kinds): one uint8 per position. */
  if (have_kinds) {
    int bad = PyObject_GetBuffer(kinds_obj, &kinds_view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0;
    if (!bad && (kinds_view.itemsize != 1 || (uint64_t)kinds_view.len != seq.len || !bypass)) {
      PyErr_Format(PyExc_ValueError, "kinds must be a 1-D uint8 buffer with one entry per position (%llu), "
                   "with bypass=True", (unsigned long long)seq.len);
      PyBuffer_Release(&kinds_view);
      bad = 1;
    }
    if (bad) {
      PyBuffer_Release(&view);
      if (opts.progress != NULL) PyBuffer_Release(&prog_view);
      if (have_sizes) PyBuffer_Release(&sizes_view);
      return NULL;
    }
  }
  opts.capacity = capacity;
  opts.capacity_bytes = capacity_bytes;
  opts.page_size = page_size;
  opts.flags = bypass ? 0 : OPT4_PLAN_NOBYPASS;
  opt4_plan *plan = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = have_kinds ? opt4_plan_from_kinds(&seq, kinds_view.buf, &opts, &plan)
                                         : opt4_plan_build(&seq, &opts, &plan);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (opts.progress != NULL) PyBuffer_Release(&prog_view);
  if (have_sizes) PyBuffer_Release(&sizes_view);
  if (have_kinds) PyBuffer_Release(&kinds_view);
  if (rc != 0) return opt4py_raise(rc, have_kinds ? "plan from kinds" : "build plan");
  return plan_wrap(plan);
}

static PyObject *py_plan_from_seq(PyObject *Py_UNUSED(m), PyObject *args) {
  PyObject *obj;
  unsigned long long items;
  if (!PyArg_ParseTuple(args, "OK", &obj, &items)) return NULL;
  Py_buffer view;
  opt4_seq seq;
  if (opt4py_get_seq(obj, items, &view, &seq) < 0) return NULL;
  opt4_plan *plan = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_plan_from_seq(&seq, &plan);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (rc != 0) return opt4py_raise(rc, "sequence plan");
  return plan_wrap(plan);
}

static PyObject *py_replan(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"plan", "capacity", "bypass", "progress", NULL};
  PlanObject *src;
  PyObject *prog_obj = NULL;
  unsigned long long capacity;
  int bypass = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!K|pO", kwlist, &PlanType, &src,
                                   &capacity, &bypass, &prog_obj))
    return NULL;
  if (plan_check_open(src) < 0) return NULL;
  opt4_plan_opts opts;
  memset(&opts, 0, sizeof opts);
  Py_buffer prog_view;
  if (get_progress(prog_obj, &prog_view, &opts.progress) < 0) return NULL;
  opts.capacity = capacity;
  opts.flags = bypass ? 0 : OPT4_PLAN_NOBYPASS;
  opt4_plan *plan = NULL;
  int rc;
  src->busy++;
  Py_BEGIN_ALLOW_THREADS rc = opt4_plan_replan(src->plan, &opts, &plan);
  Py_END_ALLOW_THREADS src->busy--;
  if (opts.progress != NULL) PyBuffer_Release(&prog_view);
  if (rc != 0) return opt4py_raise(rc, "replan");
  size_t dlen;
  const char *desc = opt4_plan_desc(src->plan, &dlen);
  if (dlen > 0 && (rc = opt4_plan_set_desc(plan, desc, dlen)) != 0) {
    opt4_plan_close(plan);
    return opt4py_raise(rc, "replan");
  }
  return plan_wrap(plan);
}

static PyObject *py_open_plan(PyObject *Py_UNUSED(m), PyObject *arg) {
  PyObject *bytes = NULL;
  if (!PyUnicode_FSConverter(arg, &bytes)) return NULL;
  const char *path = PyBytes_AS_STRING(bytes);
  opt4_plan *plan = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_plan_open(path, &plan);
  Py_END_ALLOW_THREADS Py_DECREF(bytes);
  if (rc != 0) return opt4py_raise(rc, "open plan");
  return plan_wrap(plan);
}

static PyObject *py_load_plan_bytes(PyObject *Py_UNUSED(m), PyObject *arg) {
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
  opt4_plan *plan = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_plan_load_buffer(view.buf, (size_t)view.len, &plan);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (rc != 0) return opt4py_raise(rc, "load plan");
  return plan_wrap(plan);
}

static PyMethodDef plan_functions[] = {
    {"build_plan", (PyCFunction)(void (*)(void))py_build_plan, METH_VARARGS | METH_KEYWORDS,
     "build_plan(seq, items, capacity, bypass=True, progress=None, item_sizes=None, "
     "capacity_bytes=0, page_size=0, kinds=None) -> Plan (kinds: the decisions given, opt4_plan_from_kinds)"},
    {"plan_from_seq", py_plan_from_seq, METH_VARARGS,
     "plan_from_seq(seq, items) -> Plan holding the sequence only"},
    {"replan", (PyCFunction)(void (*)(void))py_replan, METH_VARARGS | METH_KEYWORDS,
     "replan(plan, capacity, bypass=True, progress=None) -> Plan"},
    {"open_plan", py_open_plan, METH_O, "open_plan(path) -> Plan (mmap, fully validated)"},
    {"load_plan_bytes", py_load_plan_bytes, METH_O, "load_plan_bytes(buffer) -> Plan"},
    {NULL, NULL, 0, NULL}};

opt4_plan *opt4py_plan_enter(PyObject *obj) {
  if (!PyObject_TypeCheck(obj, &PlanType)) {
    PyErr_Format(PyExc_TypeError, "expected a Plan, not %s", Py_TYPE(obj)->tp_name);
    return NULL;
  }
  if (plan_check_open((PlanObject *)obj) < 0) return NULL;
  ((PlanObject *)obj)->busy++;
  return ((PlanObject *)obj)->plan;
}

void opt4py_plan_leave(PyObject *obj) { ((PlanObject *)obj)->busy--; }

int opt4py_plan_init(PyObject *module) {
  if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&ArrayType) < 0) return -1;
  if (PyModule_AddObjectRef(module, "Plan", (PyObject *)&PlanType) < 0) return -1;
  return PyModule_AddFunctions(module, plan_functions);
}
