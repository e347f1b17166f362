/*
 * _engine.c - the CPython binding of the opt4 engine: the only file in the
 * project that includes Python.h.
 *
 * Conventions (see docs/architecture.md):
 *   - Engine codes become exceptions that carry the code, its name and the
 *     engine's detail sentence: PlanFileError for damaged or foreign plan
 *     files, MemoryError for OPT4_ENOMEM, OSError for I/O, InvalidInputError
 *     (a ValueError) for the rest. All derive from Opt4Error.
 *   - The GIL is released only around pure C work. A Plan counts the threads
 *     inside such sections and the buffers it has exported, and refuses to
 *     close under either (the way CPython's mmap refuses to close under
 *     exports).
 *   - Sequences come in through the buffer protocol (numpy arrays, array,
 *     bytes with a cast memoryview): 1-D, C-contiguous, integers of 4 or 8
 *     bytes. The Python layer converts anything else with numpy first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "opt4.h"

/* ------------------------------------------------------------------------ */
/* Exceptions                                                                */
/* ------------------------------------------------------------------------ */

static PyObject *Opt4Error;
static PyObject *PlanFileError;
static PyObject *InvalidInputError;
static PyObject *Opt4IOError;
static PyObject *Opt4MemoryError;

static PyObject *raise_code(int rc, const char *context) {
  PyObject *type;
  switch (rc) {
  case OPT4_EBADMAGIC:
  case OPT4_EVERSION:
  case OPT4_ETRUNCATED:
  case OPT4_ECHECKSUM:
  case OPT4_ECORRUPT:
  case OPT4_EFINGERPRINT: type = PlanFileError; break;
  case OPT4_ENOMEM: type = Opt4MemoryError; break;
  case OPT4_EIO: type = Opt4IOError; break;
  default: type = InvalidInputError; break;
  }
  const char *detail = opt4_errdetail();
  PyObject *msg;
  if (detail[0] != '\0')
    msg = PyUnicode_FromFormat("%s: %s: %s", context, opt4_strerror(rc), detail);
  else
    msg = PyUnicode_FromFormat("%s: %s", context, opt4_strerror(rc));
  if (msg == NULL) return NULL;
  PyObject *exc = PyObject_CallOneArg(type, msg);
  Py_DECREF(msg);
  if (exc == NULL) return NULL;
  PyObject *code = PyLong_FromLong(rc);
  PyObject *name = PyUnicode_FromString(opt4_err_name(rc));
  PyObject *det = PyUnicode_FromString(detail);
  if (code == NULL || name == NULL || det == NULL ||
      PyObject_SetAttrString(exc, "code", code) < 0 ||
      PyObject_SetAttrString(exc, "code_name", name) < 0 ||
      PyObject_SetAttrString(exc, "detail", det) < 0) {
    Py_XDECREF(code);
    Py_XDECREF(name);
    Py_XDECREF(det);
    Py_DECREF(exc);
    return NULL;
  }
  Py_DECREF(code);
  Py_DECREF(name);
  Py_DECREF(det);
  PyErr_SetObject(type, exc);
  Py_DECREF(exc);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Sequences from the buffer protocol                                        */
/* ------------------------------------------------------------------------ */

static int get_seq(PyObject *obj, uint64_t items, Py_buffer *view, opt4_seq *seq) {
  if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
  const char *fmt = view->format ? view->format : "B";
  if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
  int ok_fmt = fmt[0] != '\0' && fmt[1] == '\0' && strchr("iIlLqQ", fmt[0]) != NULL;
  if (view->ndim > 1 || !ok_fmt || (view->itemsize != 4 && view->itemsize != 8)) {
    PyErr_Format(PyExc_TypeError,
                 "sequence must be a 1-D buffer of 32- or 64-bit integers "
                 "(got format '%s', itemsize %zd, %d dimensions)",
                 view->format ? view->format : "B", view->itemsize, view->ndim);
    PyBuffer_Release(view);
    return -1;
  }
  int is_signed = fmt[0] == 'i' || fmt[0] == 'l' || fmt[0] == 'q';
  seq->data = view->buf;
  seq->len = (uint64_t)(view->len / view->itemsize);
  seq->items = items;
  if (view->itemsize == 4)
    seq->dtype = is_signed ? OPT4_I32 : OPT4_U32;
  else
    seq->dtype = is_signed ? OPT4_I64 : OPT4_U64;
  return 0;
}

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
  if (rc != 0) return raise_code(rc, "plan info");
  size_t dlen;
  const char *desc = opt4_plan_desc(self->plan, &dlen);
  return Py_BuildValue(
      "{s:K,s:K,s:K,s:O,s:O,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:s#}", "items",
      (unsigned long long)in.items, "accesses", (unsigned long long)in.accesses,
      "capacity", (unsigned long long)in.capacity, "bypass",
      (in.flags & OPT4_PLAN_NOBYPASS) ? Py_False : Py_True, "has_ops",
      in.has_ops ? Py_True : Py_False, "fingerprint",
      (unsigned long long)in.fingerprint, "hits", (unsigned long long)in.hits,
      "misses", (unsigned long long)in.misses, "admits",
      (unsigned long long)in.admits, "bypasses", (unsigned long long)in.bypasses,
      "compulsory", (unsigned long long)in.compulsory, "slots",
      (unsigned long long)in.slots, "description", desc,
      (Py_ssize_t)dlen);
}

static PyObject *plan_set_description(PlanObject *self, PyObject *arg) {
  if (plan_check_open(self) < 0) return NULL;
  Py_ssize_t len;
  const char *s = PyUnicode_AsUTF8AndSize(arg, &len);
  if (s == NULL) return NULL;
  int rc = opt4_plan_set_desc(self->plan, s, (size_t)len);
  if (rc != 0) return raise_code(rc, "set description");
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
  if (rc != 0) return raise_code(rc, "save plan");
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
    return raise_code(rc, "victims");
  }
  return out;
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
    return raise_code(rc, "slots_at");
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
    if (in.accesses > 0 || !in.has_ops) return raise_code(OPT4_ENOPLAN, "ops");
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

/* ------------------------------------------------------------------------ */
/* Module functions                                                          */
/* ------------------------------------------------------------------------ */

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
  static char *kwlist[] = {"seq", "items", "capacity", "bypass", "progress", NULL};
  PyObject *obj, *prog_obj = NULL;
  unsigned long long items, capacity;
  int bypass = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OKK|pO", kwlist, &obj, &items, &capacity,
                                   &bypass, &prog_obj))
    return NULL;
  Py_buffer view, prog_view;
  opt4_seq seq;
  opt4_plan_opts opts;
  memset(&opts, 0, sizeof opts);
  if (get_progress(prog_obj, &prog_view, &opts.progress) < 0) return NULL;
  if (get_seq(obj, items, &view, &seq) < 0) {
    if (opts.progress != NULL) PyBuffer_Release(&prog_view);
    return NULL;
  }
  opts.capacity = capacity;
  opts.flags = bypass ? 0 : OPT4_PLAN_NOBYPASS;
  opt4_plan *plan = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_plan_build(&seq, &opts, &plan);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (opts.progress != NULL) PyBuffer_Release(&prog_view);
  if (rc != 0) return raise_code(rc, "build plan");
  return plan_wrap(plan);
}

static PyObject *py_plan_from_seq(PyObject *Py_UNUSED(m), PyObject *args) {
  PyObject *obj;
  unsigned long long items;
  if (!PyArg_ParseTuple(args, "OK", &obj, &items)) return NULL;
  Py_buffer view;
  opt4_seq seq;
  if (get_seq(obj, items, &view, &seq) < 0) return NULL;
  opt4_plan *plan = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_plan_from_seq(&seq, &plan);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (rc != 0) return raise_code(rc, "sequence plan");
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
  if (rc != 0) return raise_code(rc, "replan");
  size_t dlen;
  const char *desc = opt4_plan_desc(src->plan, &dlen);
  if (dlen > 0 && (rc = opt4_plan_set_desc(plan, desc, dlen)) != 0) {
    opt4_plan_close(plan);
    return raise_code(rc, "replan");
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
  if (rc != 0) return raise_code(rc, "open plan");
  return plan_wrap(plan);
}

static PyObject *py_load_plan_bytes(PyObject *Py_UNUSED(m), PyObject *arg) {
  Py_buffer view;
  if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
  opt4_plan *plan = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_plan_load_buffer(view.buf, (size_t)view.len, &plan);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (rc != 0) return raise_code(rc, "load plan");
  return plan_wrap(plan);
}

static PyObject *py_simulate(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"policy", "seq", "items", "capacity", "seed", NULL};
  const char *policy;
  PyObject *obj;
  unsigned long long items, capacity, seed = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sOKK|K", kwlist, &policy, &obj, &items,
                                   &capacity, &seed))
    return NULL;
  Py_buffer view;
  opt4_seq seq;
  if (get_seq(obj, items, &view, &seq) < 0) return NULL;
  opt4_sim_result r;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_simulate(policy, &seq, capacity, seed, &r);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (rc != 0) return raise_code(rc, "simulate");
  return Py_BuildValue("{s:K,s:K,s:K}", "accesses", (unsigned long long)r.accesses,
                       "hits", (unsigned long long)r.hits, "misses",
                       (unsigned long long)r.misses);
}

static PyObject *py_fingerprint(PyObject *Py_UNUSED(m), PyObject *args) {
  PyObject *obj;
  unsigned long long items;
  if (!PyArg_ParseTuple(args, "OK", &obj, &items)) return NULL;
  Py_buffer view;
  opt4_seq seq;
  if (get_seq(obj, items, &view, &seq) < 0) return NULL;
  uint64_t fp = 0;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_fingerprint(&seq, &fp);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (rc != 0) return raise_code(rc, "fingerprint");
  return PyLong_FromUnsignedLongLong(fp);
}

static PyObject *py_policy_names(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored)) {
  const char *const *names = opt4_policy_names();
  PyObject *list = PyList_New(0);
  if (list == NULL) return NULL;
  for (; *names != NULL; names++) {
    PyObject *s = PyUnicode_FromString(*names);
    if (s == NULL || PyList_Append(list, s) < 0) {
      Py_XDECREF(s);
      Py_DECREF(list);
      return NULL;
    }
    Py_DECREF(s);
  }
  return list;
}

static PyObject *py_mem_stats(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored)) {
  opt4_mem_stats ms;
  opt4_mem_stats_get(&ms);
  return Py_BuildValue("{s:K,s:K}", "current_bytes", (unsigned long long)ms.current_bytes,
                       "peak_bytes", (unsigned long long)ms.peak_bytes);
}

static PyObject *py_mem_peak_reset(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored)) {
  opt4_mem_peak_reset();
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"build_plan", (PyCFunction)(void (*)(void))py_build_plan, METH_VARARGS | METH_KEYWORDS,
     "build_plan(seq, items, capacity, bypass=True, progress=None) -> Plan"},
    {"plan_from_seq", py_plan_from_seq, METH_VARARGS,
     "plan_from_seq(seq, items) -> Plan holding the sequence only"},
    {"replan", (PyCFunction)(void (*)(void))py_replan, METH_VARARGS | METH_KEYWORDS,
     "replan(plan, capacity, bypass=True, progress=None) -> Plan"},
    {"open_plan", py_open_plan, METH_O, "open_plan(path) -> Plan (mmap, fully validated)"},
    {"load_plan_bytes", py_load_plan_bytes, METH_O, "load_plan_bytes(buffer) -> Plan"},
    {"simulate", (PyCFunction)(void (*)(void))py_simulate, METH_VARARGS | METH_KEYWORDS,
     "simulate(policy, seq, items, capacity, seed=0) -> dict"},
    {"fingerprint", py_fingerprint, METH_VARARGS, "fingerprint(seq, items) -> int"},
    {"policy_names", py_policy_names, METH_NOARGS, "Names of the simulator's policies."},
    {"mem_stats", py_mem_stats, METH_NOARGS, "Engine memory: current and peak bytes."},
    {"mem_peak_reset", py_mem_peak_reset, METH_NOARGS, "Reset the engine's peak counter."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "opt4torch._engine",
    "The OPT4TorchDataset C engine: planner, plan files and simulator.", -1,
    module_methods, NULL, NULL, NULL, NULL};

static PyObject *new_error(PyObject *module, const char *name, PyObject *bases,
                           const char *doc) {
  char qual[128];
  snprintf(qual, sizeof qual, "opt4torch.%s", name);
  PyObject *type = PyErr_NewExceptionWithDoc(qual, doc, bases, NULL);
  if (type == NULL) return NULL;
  if (PyModule_AddObjectRef(module, name, type) < 0) {
    Py_DECREF(type);
    return NULL;
  }
  return type;
}

PyMODINIT_FUNC PyInit__engine(void) {
  if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&ArrayType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (m == NULL) return NULL;
  if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0) goto fail;
  Opt4Error = new_error(m, "Opt4Error", NULL,
                        "Base of every error the engine raises; .code, .code_name "
                        "and .detail say what went wrong.");
  if (Opt4Error == NULL) goto fail;
  PyObject *bases;
  bases = PyTuple_Pack(2, Opt4Error, PyExc_ValueError);
  if (bases == NULL) goto fail;
  PlanFileError = new_error(m, "PlanFileError", bases,
                            "A plan file that is truncated, corrupted, foreign, from a "
                            "newer version, or made for another sequence.");
  InvalidInputError = new_error(m, "InvalidInputError", bases,
                                "An argument the engine cannot accept (an id out of "
                                "range, a capacity of zero, ...).");
  Py_DECREF(bases);
  if (PlanFileError == NULL || InvalidInputError == NULL) goto fail;
  bases = PyTuple_Pack(2, Opt4Error, PyExc_OSError);
  if (bases == NULL) goto fail;
  Opt4IOError = new_error(m, "Opt4IOError", bases, "A file could not be read or written.");
  Py_DECREF(bases);
  if (Opt4IOError == NULL) goto fail;
  bases = PyTuple_Pack(2, Opt4Error, PyExc_MemoryError);
  if (bases == NULL) goto fail;
  Opt4MemoryError = new_error(m, "Opt4MemoryError", bases, "The engine ran out of memory.");
  Py_DECREF(bases);
  if (Opt4MemoryError == NULL) goto fail;
  if (PyModule_AddIntConstant(m, "OP_HIT", OPT4_OP_HIT) < 0 ||
      PyModule_AddIntConstant(m, "OP_ADMIT", OPT4_OP_ADMIT) < 0 ||
      PyModule_AddIntConstant(m, "OP_BYPASS", OPT4_OP_BYPASS) < 0 ||
      PyModule_AddStringConstant(m, "ENGINE_VERSION", OPT4_VERSION_STRING) < 0 ||
      PyModule_AddIntConstant(m, "MAX_ACCESSES", (long long)OPT4_MAX_ACCESSES) < 0)
    goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
