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

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "opt4.h"
#include "binding.h"
#include "decode.h"

/* ------------------------------------------------------------------------ */
/* Exceptions                                                                */
/* ------------------------------------------------------------------------ */

static PyObject *Opt4Error;
static PyObject *PlanFileError;
static PyObject *InvalidInputError;
static PyObject *Opt4IOError;
static PyObject *Opt4MemoryError;

static PyObject *raise_code_ex(int rc, const char *context, int with_text);

static PyObject *raise_code(int rc, const char *context) { return raise_code_ex(rc, context, 1); }

/* Record files share the plan file's codes, whose texts name plan files:
 * there the detail alone says it. */
PyObject *opt4py_raise_records(int rc, const char *context) { return raise_code_ex(rc, context, 0); }

static PyObject *raise_code_ex(int rc, const char *context, int with_text) {
  PyObject *type;
  switch (rc) {
  case OPT4_EBADMAGIC:
  case OPT4_EVERSION:
  case OPT4_ETRUNCATED:
  case OPT4_ECHECKSUM:
  case OPT4_ECORRUPT:
  case OPT4_EFINGERPRINT: type = PlanFileError; break;
  case OPT4_ENOMEM: type = Opt4MemoryError; break;
  case OPT4_EIO:
  case OPT4_ESHM:
  case OPT4_ENOSPACE: type = Opt4IOError; break;
  default: type = InvalidInputError; break;
  }
  const char *detail = opt4_errdetail();
  PyObject *msg;
  if (detail[0] != '\0' && !with_text)
    msg = PyUnicode_FromFormat("%s: %s", context, detail);
  else if (detail[0] != '\0')
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

PyObject *opt4py_raise(int rc, const char *context) { return raise_code(rc, context); }

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

/* gen_pages(g) -> bytes of uint32 pages (sized plans). */
static PyObject *plan_gen_pages(PlanObject *self, PyObject *arg) {
  if (plan_check_open(self) < 0) return NULL;
  unsigned long long g = PyLong_AsUnsignedLongLong(arg);
  if (g == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  const uint32_t *pages;
  uint64_t n;
  int rc = opt4_plan_gen_pages(self->plan, g, &pages, &n);
  if (rc != 0) return raise_code(rc, "gen_pages");
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


/* ------------------------------------------------------------------------ */
/* Pool                                                                      */
/* ------------------------------------------------------------------------ */

/* One handle per thread: a handle's hazard announcements are its own, so a
 * handle refuses to be entered by two threads at once (the Python layer keeps
 * one per thread). */
typedef struct {
  PyObject_HEAD
  opt4_pool *pool;
  int busy;
  int owned; /* this process created it as its owner: in the owned list below */
} PoolObject;

/* The pools this process created as their owner and has not removed yet,
 * by name, with the creating pid. A pool joins the list inside pool_create,
 * before Python code runs again: a Ctrl-C or a SIGTERM handled in Python
 * can only act after it, so the pool is already known to whoever removes
 * it (issue 20: two of 16 Ctrl-Cs during a DataLoader's construction left
 * its 1 GiB pool behind, created but not yet registered). It leaves the
 * list when unlinked. What is left is removed when its Pool object is
 * dropped without close() in the creating process, by remove_owned_pools()
 * (the Python layer's SIGTERM handler), and at exit (Py_AtExit, after the
 * interpreter is gone: plain C). A forked child inherits the list and never
 * acts on it (the pid differs). A process killed outright (SIGKILL, a
 * signal with its default action) leaves its pools to the next start's
 * sweep, which finds them dead by their lock. The GIL guards the list; the
 * exit hook runs after the last Python thread. */
#define OWNED_MAX 256
static struct {
  char name[64];
  pid_t pid;
} owned_pools[OWNED_MAX];
static int owned_hook_installed;

static void owned_remove_all(void) {
  for (int i = 0; i < OWNED_MAX; i++) {
    if (owned_pools[i].name[0] == '\0' || owned_pools[i].pid != getpid()) continue;
    (void)opt4_pool_remove(owned_pools[i].name, 1);
    owned_pools[i].name[0] = '\0';
  }
}

static void owned_add(PoolObject *self) {
  const char *name = opt4_pool_name(self->pool);
  if (!owned_hook_installed) owned_hook_installed = Py_AtExit(owned_remove_all) == 0;
  for (int i = 0; i < OWNED_MAX; i++) {
    if (owned_pools[i].name[0] != '\0' && owned_pools[i].pid == getpid()) continue;
    snprintf(owned_pools[i].name, sizeof owned_pools[i].name, "%s", name);
    owned_pools[i].pid = getpid();
    self->owned = 1;
    return;
  }
  /* More than OWNED_MAX live pools: this one is left to the owner's own
   * unlink and, failing that, to the next sweep. */
}

static void owned_drop(PoolObject *self, const char *name) {
  self->owned = 0;
  for (int i = 0; i < OWNED_MAX; i++)
    if (owned_pools[i].pid == getpid() && strcmp(owned_pools[i].name, name) == 0)
      owned_pools[i].name[0] = '\0';
}

static PyTypeObject PoolType;

static int pool_enter(PoolObject *self) {
  if (self->pool == NULL) {
    PyErr_SetString(PyExc_ValueError, "operation on a closed pool");
    return -1;
  }
  if (self->busy) {
    PyErr_SetString(PyExc_RuntimeError, "this pool handle is in use by another thread; "
                                        "attach one handle per thread");
    return -1;
  }
  self->busy = 1;
  return 0;
}

static void pool_leave(PoolObject *self) { self->busy = 0; }

static PyObject *pool_wrap(opt4_pool *pool) {
  PoolObject *self = PyObject_New(PoolObject, &PoolType);
  if (self == NULL) {
    opt4_pool_close(pool);
    return NULL;
  }
  self->pool = pool;
  self->busy = 0;
  self->owned = 0;
  return (PyObject *)self;
}

static void pool_dealloc(PoolObject *self) {
  /* An owner's pool dropped without close() or unlink() in the process
   * that created it (an exception, a Ctrl-C, between its creation and its
   * registration with the Python layer's cleanup): nobody else will remove
   * it while this process lives. */
  if (self->owned && self->pool != NULL && opt4_pool_is_owner(self->pool)) {
    int mine = 0;
    for (int i = 0; i < OWNED_MAX && !mine; i++)
      mine = owned_pools[i].pid == getpid() &&
             strcmp(owned_pools[i].name, opt4_pool_name(self->pool)) == 0;
    if (mine) {
      (void)opt4_pool_unlink(self->pool);
      owned_drop(self, opt4_pool_name(self->pool));
    }
  }
  opt4_pool_close(self->pool);
  PyObject_Free(self);
}

static PyObject *py_pool_create(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"plan", "page_size", "wait_timeout_ms", "max_procs", "occurrences",
                           "owner_pid", "staging_slots", "staging_slot_bytes", NULL};
  PlanObject *plan;
  unsigned long long page_size, timeout_ms = 0, slot_bytes = 0;
  unsigned int max_procs = 0, owner_pid = 0, staging = 0;
  int occurrences = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!K|KIpIIK", kwlist, &PlanType, &plan, &page_size,
                                   &timeout_ms, &max_procs, &occurrences, &owner_pid, &staging,
                                   &slot_bytes))
    return NULL;
  if (plan_check_open(plan) < 0) return NULL;
  opt4_pool_opts opts;
  memset(&opts, 0, sizeof opts);
  opts.page_size = page_size;
  opts.wait_timeout_ms = timeout_ms;
  opts.max_procs = max_procs;
  opts.flags = occurrences ? OPT4_POOL_OCCURRENCES : 0;
  opts.owner_pid = owner_pid;
  opts.staging_slots = staging;
  opts.staging_slot_bytes = slot_bytes;
  opt4_pool *pool = NULL;
  int rc;
  plan->busy++;
  Py_BEGIN_ALLOW_THREADS rc = opt4_pool_create(plan->plan, &opts, &pool);
  Py_END_ALLOW_THREADS plan->busy--;
  if (rc != 0) return raise_code(rc, "create pool");
  const int owner = owner_pid == 0 || owner_pid == (unsigned int)getpid();
  char name[64];
  snprintf(name, sizeof name, "%s", opt4_pool_name(pool));
  PoolObject *obj = (PoolObject *)pool_wrap(pool);
  if (obj == NULL) { /* pool_wrap closed the handle; the segments are ours to remove */
    if (owner) (void)opt4_pool_remove(name, 1);
    return NULL;
  }
  if (owner) owned_add(obj);
  return (PyObject *)obj;
}

static PyObject *py_remove_owned_pools(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored)) {
  owned_remove_all();
  Py_RETURN_NONE;
}

static PyObject *py_pool_attach(PyObject *Py_UNUSED(m), PyObject *arg) {
  const char *name = PyUnicode_AsUTF8(arg);
  if (name == NULL) return NULL;
  opt4_pool *pool = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_pool_attach(name, &pool);
  Py_END_ALLOW_THREADS if (rc != 0) return raise_code(rc, "attach pool");
  return pool_wrap(pool);
}

static PyObject *pool_close(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->busy) {
    PyErr_SetString(PyExc_RuntimeError, "cannot close a pool handle in use");
    return NULL;
  }
  opt4_pool_close(self->pool);
  self->pool = NULL;
  Py_RETURN_NONE;
}

static PyObject *pool_unlink(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pool == NULL) Py_RETURN_NONE;
  int rc = opt4_pool_unlink(self->pool);
  if (rc != 0) return raise_code(rc, "unlink pool");
  if (self->owned) owned_drop(self, opt4_pool_name(self->pool));
  Py_RETURN_NONE;
}

static PyObject *pool_get_name(PoolObject *self, void *Py_UNUSED(c)) {
  if (self->pool == NULL) Py_RETURN_NONE;
  return PyUnicode_FromString(opt4_pool_name(self->pool));
}

static PyObject *pool_get_is_owner(PoolObject *self, void *Py_UNUSED(c)) {
  return PyBool_FromLong(self->pool != NULL && opt4_pool_is_owner(self->pool));
}

static PyObject *pool_get_closed(PoolObject *self, void *Py_UNUSED(c)) {
  return PyBool_FromLong(self->pool == NULL);
}

static PyObject *pool_info(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  opt4_pool_info in;
  int rc = opt4_pool_info_get(self->pool, &in);
  if (rc != 0) return raise_code(rc, "pool info");
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:I,s:I,s:I,s:s}", "accesses",
                       (unsigned long long)in.accesses, "items", (unsigned long long)in.items,
                       "fingerprint", (unsigned long long)in.fingerprint, "page_size",
                       (unsigned long long)in.page_size, "pages", (unsigned long long)in.pages,
                       "generations", (unsigned long long)in.generations, "shm_bytes",
                       (unsigned long long)in.shm_bytes, "wait_timeout_ms",
                       (unsigned long long)in.wait_timeout_ms, "max_procs", in.max_procs,
                       "attached", in.attached, "owner_pid", in.owner_pid, "name",
                       opt4_pool_name(self->pool));
}

static PyObject *pool_stats(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  opt4_pool_stats st;
  int rc = opt4_pool_stats_get(self->pool, &st);
  if (rc != 0) return raise_code(rc, "pool stats");
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "hits",
                       (unsigned long long)st.hits, "admits", (unsigned long long)st.admits,
                       "bypasses", (unsigned long long)st.bypasses, "fallbacks",
                       (unsigned long long)st.fallbacks, "deferred",
                       (unsigned long long)st.deferred, "stored", (unsigned long long)st.stored,
                       "store_failed", (unsigned long long)st.store_failed, "timeouts",
                       (unsigned long long)st.timeouts, "waits", (unsigned long long)st.waits,
                       "wait_ns", (unsigned long long)st.wait_ns, "prefetched",
                       (unsigned long long)st.prefetched, "prefetch_stored",
                       (unsigned long long)st.prefetch_stored, "prefetch_dropped",
                       (unsigned long long)st.prefetch_dropped, "stalls",
                       (unsigned long long)st.stalls, "stall_ns", (unsigned long long)st.stall_ns);
}

static PyObject *pool_item(PoolObject *self, PyObject *arg) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  unsigned long long t = PyLong_AsUnsignedLongLong(arg);
  if (t == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  uint32_t item, kind;
  int rc = opt4_pool_item(self->pool, t, &item, &kind);
  if (rc != 0) return raise_code(rc, "pool item");
  return Py_BuildValue("(II)", item, kind);
}

static PyObject *pool_set_floor(PoolObject *self, PyObject *arg) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  unsigned long long p = PyLong_AsUnsignedLongLong(arg);
  if (p == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  int rc = opt4_pool_set_floor(self->pool, p);
  if (rc != 0) return raise_code(rc, "set floor");
  Py_RETURN_NONE;
}

static PyObject *pool_skip(PoolObject *self, PyObject *arg) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  unsigned long long t = PyLong_AsUnsignedLongLong(arg);
  if (t == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  int rc = opt4_pool_skip(self->pool, t);
  if (rc != 0) return raise_code(rc, "skip");
  Py_RETURN_NONE;
}

/* occurrence_next(item) -> position, or None once the plan has no more. */
static PyObject *pool_occurrence_next(PoolObject *self, PyObject *arg) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  unsigned long item = PyLong_AsUnsignedLong(arg);
  if (item == (unsigned long)-1 && PyErr_Occurred()) return NULL;
  if (item > UINT32_MAX) return raise_code(OPT4_ERANGE, "occurrence");
  uint64_t t;
  int rc = opt4_pool_occurrence_next(self->pool, (uint32_t)item, &t);
  if (rc != 0) return raise_code(rc, "occurrence");
  if (t == UINT64_MAX) Py_RETURN_NONE;
  return PyLong_FromUnsignedLongLong(t);
}

static PyObject *pool_clock_next(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  uint64_t t;
  int rc = opt4_pool_clock_next(self->pool, &t);
  if (rc != 0) return raise_code(rc, "clock");
  return PyLong_FromUnsignedLongLong(t);
}

/* Positions from any sequence of ints into a malloc'd array. (A tuple of
 * them: a list could change under us while __index__ runs.) */
static uint64_t *positions_from(PyObject *seq_obj, Py_ssize_t *n_out) {
  PyObject *fast = PyTuple_CheckExact(seq_obj) ? Py_NewRef(seq_obj) : PySequence_Tuple(seq_obj);
  if (fast == NULL) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_SetString(PyExc_TypeError, "positions must be a sequence of ints");
    }
    return NULL;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  uint64_t *pos = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
  if (pos == NULL) {
    Py_DECREF(fast);
    PyErr_NoMemory();
    return NULL;
  }
  PyObject **items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t i = 0; i < n; i++) {
    if (PyLong_CheckExact(items[i])) {
      pos[i] = PyLong_AsUnsignedLongLong(items[i]);
    } else { /* numpy integers, tensors of one element: anything with __index__ */
      PyObject *v = PyNumber_Index(items[i]);
      pos[i] = v == NULL ? (uint64_t)-1 : PyLong_AsUnsignedLongLong(v);
      Py_XDECREF(v);
    }
    if (pos[i] == (uint64_t)-1 && PyErr_Occurred()) {
      PyMem_Free(pos);
      Py_DECREF(fast);
      return NULL;
    }
  }
  Py_DECREF(fast);
  *n_out = n;
  return pos;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Records sit at multiples of this in a batch's buffer: the codec aligns
 * array payloads to 16 bytes within a record, and views of them (torch's
 * complex128 kernels among others) need that alignment in memory too. */
#define BATCH_ALIGN 16
#define ALIGN_UP(x) (((x) + (BATCH_ALIGN - 1)) & ~(uint64_t)(BATCH_ALIGN - 1))

/* One batch of reads, as read_batch and get_batch share it: every position's
 * result, and the HITs' records copied one after another into data, each at
 * a 16-byte boundary of it. */
typedef struct fetched {
  PyObject *data; /* bytearray of the HITs' records */
  opt4_get_result *res;
  uint64_t *offsets; /* of each HIT's record in data */
  uint64_t *pos;
  Py_ssize_t n;
} fetched;

static void fetched_release(fetched *f) {
  Py_CLEAR(f->data);
  PyMem_Free(f->res);
  PyMem_Free(f->offsets);
  PyMem_Free(f->pos);
  f->res = NULL;
  f->offsets = NULL;
  f->pos = NULL;
}

static int fetch_batch(PoolObject *self, PyObject *arg, fetched *f) {
  memset(f, 0, sizeof *f);
  uint64_t *sorted = NULL;
  Py_ssize_t n = 0;
  f->pos = positions_from(arg, &n);
  if (f->pos == NULL) return -1;
  f->n = n;
  f->res = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *f->res);
  f->offsets = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *f->offsets);
  sorted = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *sorted);
  if (f->res == NULL || f->offsets == NULL || sorted == NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  memcpy(sorted, f->pos, (size_t)n * sizeof *f->pos);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_u64);
  uint64_t total = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    uint64_t space;
    int rc = opt4_pool_space(self->pool, f->pos[i], &space);
    if (rc != 0) {
      raise_code(rc, "read batch");
      goto fail;
    }
    total += ALIGN_UP(space);
  }
  /* One spare block, so the records can start at an aligned address whatever
   * the allocator gave. */
  f->data = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(total + BATCH_ALIGN));
  if (f->data == NULL) goto fail;
  uint8_t *buf = (uint8_t *)PyByteArray_AS_STRING(f->data);
  int rc = 0;
  uint64_t used = ALIGN_UP((uintptr_t)buf) - (uintptr_t)buf;
  total += used;
  /* The positions are served in order up to the first AGAIN (the caller
   * commits those, then asks again from there): f->n ends just past it. */
  Py_ssize_t served = n;
  Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
    rc = opt4_pool_get(self->pool, f->pos[i], sorted, (size_t)n, buf + used, total - used, &f->res[i]);
    f->offsets[i] = used;
    if (rc == 0 && f->res[i].status == OPT4_GET_HIT) used = ALIGN_UP(used + f->res[i].len);
    if (rc == 0 && f->res[i].status == OPT4_GET_AGAIN) {
      served = i + 1;
      break;
    }
  }
  Py_END_ALLOW_THREADS f->n = served;
  if (rc != 0) {
    raise_code(rc, "read batch");
    goto fail;
  }
  /* Not shrunk: a resize may move the buffer and lose the alignment. */
  PyMem_Free(sorted);
  return 0;
fail:
  PyMem_Free(sorted);
  fetched_release(f);
  return -1;
}

/* The statuses of a batch's entries (exported as ENTRY_*). */
enum { ENTRY_HIT = 0, ENTRY_DEFER = 1, ENTRY_LOAD = 2, ENTRY_AGAIN = 3 };

/* The entry of result i: (status, item, a, b) with status 0 HIT (a = offset
 * in data, b = length), 1 DEFER (a = position to copy from), 2 LOAD (a =
 * reason: 1 ADMIT, 2 BYPASS, 3 FALLBACK), 3 AGAIN (the last entry: the
 * batch was served up to here; commit, then ask again from i); led by i
 * itself when indexed. */
static PyObject *entry_of(const fetched *f, Py_ssize_t i, int indexed) {
  const opt4_get_result *r = &f->res[i];
  int status;
  unsigned long long a, b = 0;
  switch (r->status) {
  case OPT4_GET_HIT:
    status = ENTRY_HIT;
    a = f->offsets[i];
    b = r->len;
    break;
  case OPT4_GET_DEFER:
    status = ENTRY_DEFER;
    a = r->defer_to;
    break;
  case OPT4_GET_AGAIN:
    status = ENTRY_AGAIN;
    a = 0;
    break;
  default: /* LOAD; TOO_SMALL cannot happen with space-sized buffers */
    status = ENTRY_LOAD;
    a = r->status == OPT4_GET_LOAD ? r->reason : OPT4_REASON_FALLBACK;
    break;
  }
  if (indexed) return Py_BuildValue("(niIKK)", i, status, r->item, a, b);
  return Py_BuildValue("(iIKK)", status, r->item, a, b);
}

/* read_batch(positions) -> (data: bytearray, entries: list of (status, item, a, b)),
 * one entry per position served: all of them, or up to an AGAIN, the last. */
static PyObject *pool_read_batch(PoolObject *self, PyObject *arg) {
  if (pool_enter(self) < 0) return NULL;
  fetched f;
  PyObject *out = NULL, *entries = NULL;
  if (fetch_batch(self, arg, &f) < 0) goto leave;
  entries = PyList_New(f.n);
  if (entries == NULL) goto leave;
  for (Py_ssize_t i = 0; i < f.n; i++) {
    PyObject *e = entry_of(&f, i, 0);
    if (e == NULL) goto leave;
    PyList_SET_ITEM(entries, i, e);
  }
  out = PyTuple_Pack(2, f.data, entries);
leave:
  pool_leave(self);
  Py_XDECREF(entries);
  fetched_release(&f);
  return out;
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

/* get_batch(positions, make_arrays=None) -> (objects, data, rest): the batch
 * with its HITs decoded where the C decoder can (objects[i]); arrays made by
 * make_arrays(data, runs) when given. rest lists the other positions'
 * entries as (i, status, item, a, b), in order (see entry_of), for the Python
 * layer to load, store or decode from data. An AGAIN entry ends rest, and
 * objects stops at it: the positions before it are served; commit them and
 * ask again from its i. */
static PyObject *pool_get_batch(PoolObject *self, PyObject *args) {
  PyObject *positions, *make_arrays = Py_None;
  if (!PyArg_ParseTuple(args, "O|O:get_batch", &positions, &make_arrays)) return NULL;
  if (pool_enter(self) < 0) return NULL;
  fetched f;
  rec_ctx c = {.arrays = make_arrays != Py_None};
  PyObject *out = NULL, *objects = NULL, *rest = NULL;
  if (fetch_batch(self, positions, &f) < 0) goto leave;
  objects = PyList_New(f.n);
  rest = PyList_New(0);
  if (objects == NULL || rest == NULL) goto leave;
  const uint8_t *buf = (const uint8_t *)PyByteArray_AS_STRING(f.data);
  c.base = buf;
  for (Py_ssize_t i = 0; i < f.n; i++) PyList_SET_ITEM(objects, i, Py_NewRef(Py_None));
  for (Py_ssize_t i = 0; i < f.n; i++) {
    int rc = 0;
    if (f.res[i].status == OPT4_GET_HIT) {
      rc = rec_decode_into(&c, buf + f.offsets[i], f.res[i].len, objects, i);
      if (rc < 0) goto leave;
    }
    if (rc == 0) {
      PyObject *row = entry_of(&f, i, 1);
      if (row == NULL || PyList_Append(rest, row) < 0) {
        Py_XDECREF(row);
        goto leave;
      }
      Py_DECREF(row);
    }
  }
  if (rec_place_arrays(&c, make_arrays, f.data) < 0) goto leave;
  out = PyTuple_Pack(3, objects, f.data, rest);
leave:
  pool_leave(self);
  rec_ctx_release(&c);
  Py_XDECREF(objects);
  Py_XDECREF(rest);
  fetched_release(&f);
  return out;
}

/* Gather the buffers of parts (a sequence of buffer objects). */
typedef struct gathered {
  Py_buffer *views;
  opt4_iovec *iov;
  Py_ssize_t n;
} gathered;

static void gathered_release(gathered *g) {
  for (Py_ssize_t i = 0; i < g->n; i++) PyBuffer_Release(&g->views[i]);
  PyMem_Free(g->views);
  PyMem_Free(g->iov);
  g->views = NULL;
  g->iov = NULL;
  g->n = 0;
}

static int gather(PyObject *parts, gathered *g) {
  g->views = NULL;
  g->iov = NULL;
  g->n = 0;
  PyObject *fast = PySequence_Fast(parts, "parts must be a sequence of buffers");
  if (fast == NULL) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  g->views = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
  g->iov = PyMem_Calloc((size_t)(n ? n : 1), sizeof(opt4_iovec));
  if (g->views == NULL || g->iov == NULL) {
    Py_DECREF(fast);
    PyMem_Free(g->views);
    PyMem_Free(g->iov);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), &g->views[i], PyBUF_C_CONTIGUOUS) < 0) {
      Py_DECREF(fast);
      gathered_release(g);
      return -1;
    }
    g->n = i + 1;
    g->iov[i].base = g->views[i].buf;
    g->iov[i].len = (size_t)g->views[i].len;
  }
  Py_DECREF(fast);
  return 0;
}

/* store_batch(entries: list of (position, parts or None)) -> list of results,
 * processed in order: parts stores the ADMIT at position (1 stored, 0 not
 * stored: late or timed out, -1 too large for its space); None notes the
 * DEFER at position as a read (result 1). A batch must commit in position
 * order: a generation admitted and read in one batch may be evicted later in
 * the same batch, and its eviction waits for those reads. */
static PyObject *pool_store_batch(PoolObject *self, PyObject *arg) {
  if (pool_enter(self) < 0) return NULL;
  PyObject *out = NULL;
  PyObject *fast = PySequence_Fast(arg, "entries must be a sequence of (position, parts)");
  if (fast == NULL) {
    pool_leave(self);
    return NULL;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  gathered *gs = PyMem_Calloc((size_t)(n ? n : 1), sizeof *gs);
  uint64_t *pos = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *pos);
  int *results = PyMem_Calloc((size_t)(n ? n : 1), sizeof *results);
  Py_ssize_t ready = 0;
  if (gs == NULL || pos == NULL || results == NULL) {
    PyErr_NoMemory();
    goto leave;
  }
  for (; ready < n; ready++) {
    unsigned long long t;
    PyObject *parts;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, ready), "KO;an entry is (position, parts)",
                          &t, &parts))
      goto leave;
    pos[ready] = t;
    if (parts == Py_None) {
      gs[ready].n = -1; /* a note, not a store */
      continue;
    }
    if (gather(parts, &gs[ready]) < 0) goto leave;
  }
  int rc = 0;
  Py_ssize_t failed_at = -1;
  Py_BEGIN_ALLOW_THREADS for (Py_ssize_t i = 0; i < n; i++) {
    int stored = 0, r;
    if (gs[i].n < 0) {
      r = opt4_pool_note_read(self->pool, pos[i]);
      stored = 1;
    } else {
      r = opt4_pool_put(self->pool, pos[i], gs[i].iov, (size_t)gs[i].n, &stored);
    }
    if (r == OPT4_EITEMSIZE) {
      results[i] = -1;
    } else if (r != 0) {
      rc = r;
      failed_at = i;
      break;
    } else {
      results[i] = stored;
    }
  }
  Py_END_ALLOW_THREADS if (rc != 0) {
    (void)failed_at;
    raise_code(rc, "store batch");
    goto leave;
  }
  out = PyList_New(n);
  if (out == NULL) goto leave;
  for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(out, i, PyLong_FromLong(results[i]));
leave:
  for (Py_ssize_t i = 0; i < ready && gs != NULL; i++)
    if (gs[i].n >= 0) gathered_release(&gs[i]);
  PyMem_Free(gs);
  PyMem_Free(pos);
  PyMem_Free(results);
  Py_DECREF(fast);
  pool_leave(self);
  return out;
}

static PyObject *pool_note_reads(PoolObject *self, PyObject *arg) {
  if (pool_enter(self) < 0) return NULL;
  Py_ssize_t n = 0;
  uint64_t *pos = positions_from(arg, &n);
  PyObject *out = NULL;
  if (pos != NULL) {
    int rc = 0;
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) rc = opt4_pool_note_read(self->pool, pos[i]);
    if (rc != 0)
      raise_code(rc, "note reads");
    else
      out = Py_NewRef(Py_None);
    PyMem_Free(pos);
  }
  pool_leave(self);
  return out;
}

/* live_at(p) -> list of (admit, item, reads_before). */
static PyObject *pool_live_at(PoolObject *self, PyObject *arg) {
  if (pool_enter(self) < 0) return NULL;
  PyObject *out = NULL;
  unsigned long long p = PyLong_AsUnsignedLongLong(arg);
  opt4_pool_info in;
  uint64_t *admits = NULL;
  uint32_t *items = NULL, *before = NULL;
  if (p == (unsigned long long)-1 && PyErr_Occurred()) goto leave;
  opt4_pool_info_get(self->pool, &in);
  size_t cap = (size_t)(in.pages ? in.pages : 1), n = 0;
  admits = PyMem_Malloc(cap * sizeof *admits);
  items = PyMem_Malloc(cap * sizeof *items);
  before = PyMem_Malloc(cap * sizeof *before);
  if (admits == NULL || items == NULL || before == NULL) {
    PyErr_NoMemory();
    goto leave;
  }
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_pool_live_at(self->pool, p, admits, items, before, cap, &n);
  Py_END_ALLOW_THREADS if (rc != 0) {
    raise_code(rc, "live_at");
    goto leave;
  }
  out = PyList_New((Py_ssize_t)n);
  if (out == NULL) goto leave;
  for (size_t i = 0; i < n; i++) {
    PyObject *e = Py_BuildValue("(KII)", (unsigned long long)admits[i], items[i], before[i]);
    if (e == NULL) {
      Py_CLEAR(out);
      goto leave;
    }
    PyList_SET_ITEM(out, (Py_ssize_t)i, e);
  }
leave:
  PyMem_Free(admits);
  PyMem_Free(items);
  PyMem_Free(before);
  pool_leave(self);
  return out;
}

/* warm(admit, parts, reads_before) -> 1 stored, 0 not, -1 too large. */
static PyObject *pool_warm(PoolObject *self, PyObject *args) {
  unsigned long long admit;
  unsigned int before;
  PyObject *parts;
  if (!PyArg_ParseTuple(args, "KOI", &admit, &parts, &before)) return NULL;
  if (pool_enter(self) < 0) return NULL;
  gathered g;
  PyObject *out = NULL;
  if (gather(parts, &g) == 0) {
    int stored = 0, rc;
    Py_BEGIN_ALLOW_THREADS rc = opt4_pool_warm(self->pool, admit, g.iov, (size_t)g.n, before, &stored);
    Py_END_ALLOW_THREADS gathered_release(&g);
    if (rc == OPT4_EITEMSIZE)
      out = PyLong_FromLong(-1);
    else if (rc != 0)
      raise_code(rc, "warm");
    else
      out = PyLong_FromLong(stored);
  }
  pool_leave(self);
  return out;
}

/* prefetch_claim(lookahead) -> (status, t, item, kind, space): status 0
 * claimed, 1 nothing in the window now, 2 the plan's misses are all taken. */
static PyObject *pool_prefetch_claim(PoolObject *self, PyObject *arg) {
  unsigned long long lookahead = PyLong_AsUnsignedLongLong(arg);
  if (lookahead == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  if (pool_enter(self) < 0) return NULL;
  opt4_prefetch_job job;
  int status = 0, rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_pool_prefetch_claim(self->pool, lookahead, &job, &status);
  Py_END_ALLOW_THREADS pool_leave(self);
  if (rc != 0) return raise_code(rc, "prefetch claim");
  return Py_BuildValue("(iKIIK)", status, (unsigned long long)job.t, job.item, job.kind,
                       (unsigned long long)job.space);
}

/* prefetch_store(t, parts, try_only=False) -> 1 handed over, 0 given up,
 * -1 too large, 2 (try_only) not yet: keep it and try again later. */
static PyObject *pool_prefetch_store(PoolObject *self, PyObject *args) {
  unsigned long long t;
  PyObject *parts;
  int try_only = 0;
  if (!PyArg_ParseTuple(args, "KO|p", &t, &parts, &try_only)) return NULL;
  if (pool_enter(self) < 0) return NULL;
  gathered g;
  PyObject *out = NULL;
  if (gather(parts, &g) == 0) {
    int stored = 0, rc;
    Py_BEGIN_ALLOW_THREADS rc = try_only
        ? opt4_pool_prefetch_try_store(self->pool, t, g.iov, (size_t)g.n, &stored)
        : opt4_pool_prefetch_store(self->pool, t, g.iov, (size_t)g.n, &stored);
    Py_END_ALLOW_THREADS gathered_release(&g);
    if (rc == OPT4_EITEMSIZE)
      out = PyLong_FromLong(-1);
    else if (rc != 0)
      raise_code(rc, "prefetch store");
    else
      out = PyLong_FromLong(stored);
  }
  pool_leave(self);
  return out;
}

static PyObject *pool_prefetch_release(PoolObject *self, PyObject *arg) {
  unsigned long long t = PyLong_AsUnsignedLongLong(arg);
  if (t == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  if (pool_enter(self) < 0) return NULL;
  int rc = opt4_pool_prefetch_release(self->pool, t);
  pool_leave(self);
  if (rc != 0) return raise_code(rc, "prefetch release");
  Py_RETURN_NONE;
}

/* prefetch_pending(from, to) -> misses in [from, to) not yet loaded. */
static PyObject *pool_prefetch_pending(PoolObject *self, PyObject *args) {
  unsigned long long from, to;
  if (!PyArg_ParseTuple(args, "KK", &from, &to)) return NULL;
  if (pool_enter(self) < 0) return NULL;
  uint64_t n = 0;
  int rc = opt4_pool_prefetch_pending(self->pool, from, to, &n);
  pool_leave(self);
  if (rc != 0) return raise_code(rc, "prefetch pending");
  return PyLong_FromUnsignedLongLong(n);
}

/* interrupt(): callable from another thread while this handle waits. */
static PyObject *pool_interrupt(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pool == NULL) Py_RETURN_NONE;
  opt4_pool_interrupt(self->pool);
  Py_RETURN_NONE;
}

static PyMethodDef pool_methods[] = {
    {"close", (PyCFunction)pool_close, METH_NOARGS, "Detach (does not remove the pool)."},
    {"unlink", (PyCFunction)pool_unlink, METH_NOARGS, "Remove the pool's segments."},
    {"info", (PyCFunction)pool_info, METH_NOARGS, "Layout and sizes as a dict."},
    {"stats", (PyCFunction)pool_stats, METH_NOARGS, "Counters summed over all processes."},
    {"item", (PyCFunction)pool_item, METH_O, "item(t) -> (item id, plan kind)."},
    {"set_floor", (PyCFunction)pool_set_floor, METH_O, "set_floor(p): positions below p are done."},
    {"clock_next", (PyCFunction)pool_clock_next, METH_NOARGS, "The compatibility clock."},
    {"skip", (PyCFunction)pool_skip, METH_O, "skip(t): position t will not run as planned."},
    {"occurrence_next", (PyCFunction)pool_occurrence_next, METH_O,
     "occurrence_next(item) -> position of its next planned access, or None."},
    {"read_batch", (PyCFunction)pool_read_batch, METH_O,
     "read_batch(positions) -> (data, [(status, item, a, b)])"},
    {"get_batch", (PyCFunction)pool_get_batch, METH_VARARGS,
     "get_batch(positions, make_arrays=None) -> (objects, data, [(i, status, item, a, b)] left)"},
    {"store_batch", (PyCFunction)pool_store_batch, METH_O,
     "store_batch([(position, parts or None)]) -> [1 stored | 0 not | -1 too large], in order"},
    {"note_reads", (PyCFunction)pool_note_reads, METH_O, "note_reads(positions) for DEFERs."},
    {"live_at", (PyCFunction)pool_live_at, METH_O, "live_at(p) -> [(admit, item, reads_before)]"},
    {"warm", (PyCFunction)pool_warm, METH_VARARGS, "warm(admit, parts, reads_before) -> result"},
    {"prefetch_claim", (PyCFunction)pool_prefetch_claim, METH_O,
     "prefetch_claim(lookahead) -> (status, t, item, kind, space)"},
    {"prefetch_store", (PyCFunction)pool_prefetch_store, METH_VARARGS,
     "prefetch_store(t, parts, try_only=False) -> 1 handed over, 0 given up, -1 too large, "
     "2 not yet (try_only)"},
    {"prefetch_release", (PyCFunction)pool_prefetch_release, METH_O,
     "prefetch_release(t): give a claimed miss back to its consumer"},
    {"prefetch_pending", (PyCFunction)pool_prefetch_pending, METH_VARARGS,
     "prefetch_pending(from, to) -> misses in [from, to) not loaded yet"},
    {"interrupt", (PyCFunction)pool_interrupt, METH_NOARGS,
     "interrupt(): waits on this handle end at once (from any thread)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef pool_getset[] = {
    {"name", (getter)pool_get_name, NULL, "The pool's shared-memory name.", NULL},
    {"is_owner", (getter)pool_get_is_owner, NULL, "Whether this process created it.", NULL},
    {"closed", (getter)pool_get_closed, NULL, "Whether close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opt4torch._engine.Pool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A handle on a shared-memory cache pool (one per thread).",
    .tp_methods = pool_methods,
    .tp_getset = pool_getset,
};

static int visit_list(void *ctx, const char *name, uint32_t pid, int state, uint64_t bytes) {
  PyObject *e = Py_BuildValue(
      "{s:s,s:I,s:O,s:O,s:O,s:O,s:K}", "name", name, "owner_pid", pid, "owner_alive",
      state ? Py_True : Py_False, "owner_locked", (state & OPT4_OWNER_LOCKED) ? Py_True : Py_False,
      "other_namespace", (state & OPT4_OWNER_OTHER_NS) ? Py_True : Py_False, "unchecked",
      (state & OPT4_OWNER_UNCHECKED) ? Py_True : Py_False, "bytes", (unsigned long long)bytes);
  if (e == NULL) return -1;
  int rc = PyList_Append((PyObject *)ctx, e);
  Py_DECREF(e);
  return rc;
}

static PyObject *py_pool_list(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored)) {
  PyObject *list = PyList_New(0);
  if (list == NULL) return NULL;
  int rc = opt4_pool_list(visit_list, list);
  if (rc == -1 && PyErr_Occurred()) {
    Py_DECREF(list);
    return NULL;
  }
  if (rc != 0) {
    Py_DECREF(list);
    return raise_code(rc, "list pools");
  }
  return list;
}

static PyObject *py_pool_remove(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"name", "force", NULL};
  const char *name;
  int force = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|p", kwlist, &name, &force)) return NULL;
  int rc = opt4_pool_remove(name, force);
  if (rc != 0) return raise_code(rc, "remove pool");
  Py_RETURN_NONE;
}

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
  static char *kwlist[] = {"seq", "items", "capacity", "bypass", "progress", "item_sizes",
                           "capacity_bytes", "page_size", NULL};
  PyObject *obj, *prog_obj = NULL, *sizes_obj = NULL;
  unsigned long long items, capacity, capacity_bytes = 0, page_size = 0;
  int bypass = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OKK|pOOKK", kwlist, &obj, &items, &capacity,
                                   &bypass, &prog_obj, &sizes_obj, &capacity_bytes, &page_size))
    return NULL;
  Py_buffer view, prog_view, sizes_view;
  int have_sizes = sizes_obj != NULL && sizes_obj != Py_None;
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
  if (get_seq(obj, items, &view, &seq) < 0) {
    if (opts.progress != NULL) PyBuffer_Release(&prog_view);
    if (have_sizes) PyBuffer_Release(&sizes_view);
    return NULL;
  }
  opts.capacity = capacity;
  opts.capacity_bytes = capacity_bytes;
  opts.page_size = page_size;
  opts.flags = bypass ? 0 : OPT4_PLAN_NOBYPASS;
  opt4_plan *plan = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_plan_build(&seq, &opts, &plan);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (opts.progress != NULL) PyBuffer_Release(&prog_view);
  if (have_sizes) PyBuffer_Release(&sizes_view);
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
     "build_plan(seq, items, capacity, bypass=True, progress=None, item_sizes=None, "
     "capacity_bytes=0, page_size=0) -> Plan"},
    {"plan_from_seq", py_plan_from_seq, METH_VARARGS,
     "plan_from_seq(seq, items) -> Plan holding the sequence only"},
    {"replan", (PyCFunction)(void (*)(void))py_replan, METH_VARARGS | METH_KEYWORDS,
     "replan(plan, capacity, bypass=True, progress=None) -> Plan"},
    {"open_plan", py_open_plan, METH_O, "open_plan(path) -> Plan (mmap, fully validated)"},
    {"load_plan_bytes", py_load_plan_bytes, METH_O, "load_plan_bytes(buffer) -> Plan"},
    {"simulate", (PyCFunction)(void (*)(void))py_simulate, METH_VARARGS | METH_KEYWORDS,
     "simulate(policy, seq, items, capacity, seed=0) -> dict"},
    {"fingerprint", py_fingerprint, METH_VARARGS, "fingerprint(seq, items) -> int"},
    {"decode_records", py_decode_records, METH_VARARGS,
     "decode_records(buffer, spans, make_arrays=None) -> [(True, object) or (False, None)]: "
     "the C decoder on records at (offset, length) spans of buffer"},
    {"policy_names", py_policy_names, METH_NOARGS, "Names of the simulator's policies."},
    {"mem_stats", py_mem_stats, METH_NOARGS, "Engine memory: current and peak bytes."},
    {"mem_peak_reset", py_mem_peak_reset, METH_NOARGS, "Reset the engine's peak counter."},
    {"pool_create", (PyCFunction)(void (*)(void))py_pool_create, METH_VARARGS | METH_KEYWORDS,
     "pool_create(plan, page_size, wait_timeout_ms=0, max_procs=0, occurrences=False) -> Pool"},
    {"pool_attach", py_pool_attach, METH_O, "pool_attach(name) -> Pool"},
    {"pool_list", py_pool_list, METH_NOARGS,
     "This user's pools: [{name, owner_pid, owner_alive, owner_locked, other_namespace, "
     "unchecked, bytes}]"},
    {"pool_remove", (PyCFunction)(void (*)(void))py_pool_remove, METH_VARARGS | METH_KEYWORDS,
     "pool_remove(name, force=False): remove a stale pool"},
    {"remove_owned_pools", py_remove_owned_pools, METH_NOARGS,
     "Remove every pool this process created as owner and has not unlinked (signal handlers)."},
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
  if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&ArrayType) < 0 || PyType_Ready(&PoolType) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (m == NULL) return NULL;
  if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0) goto fail;
  if (PyModule_AddObjectRef(m, "Pool", (PyObject *)&PoolType) < 0) goto fail;
  if (opt4py_io_init(m) < 0) goto fail;
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
      PyModule_AddIntConstant(m, "MAX_ACCESSES", (long long)OPT4_MAX_ACCESSES) < 0 ||
      rec_export(m) < 0 ||
      /* get_batch / read_batch entries: status, and a LOAD's reason */
      PyModule_AddIntConstant(m, "ENTRY_HIT", ENTRY_HIT) < 0 ||
      PyModule_AddIntConstant(m, "ENTRY_DEFER", ENTRY_DEFER) < 0 ||
      PyModule_AddIntConstant(m, "ENTRY_LOAD", ENTRY_LOAD) < 0 ||
      PyModule_AddIntConstant(m, "ENTRY_AGAIN", ENTRY_AGAIN) < 0 ||
      PyModule_AddIntConstant(m, "REASON_ADMIT", OPT4_REASON_ADMIT) < 0 ||
      PyModule_AddIntConstant(m, "REASON_BYPASS", OPT4_REASON_BYPASS) < 0 ||
      PyModule_AddIntConstant(m, "REASON_FALLBACK", OPT4_REASON_FALLBACK) < 0 ||
      /* prefetch_claim's status; prefetch_store's results */
      PyModule_AddIntConstant(m, "PREFETCH_CLAIMED", OPT4_PREFETCH_CLAIMED) < 0 ||
      PyModule_AddIntConstant(m, "PREFETCH_IDLE", OPT4_PREFETCH_IDLE) < 0 ||
      PyModule_AddIntConstant(m, "PREFETCH_END", OPT4_PREFETCH_END) < 0 ||
      PyModule_AddIntConstant(m, "STORE_GIVEN_UP", 0) < 0 ||
      PyModule_AddIntConstant(m, "STORE_DONE", 1) < 0 ||
      PyModule_AddIntConstant(m, "STORE_NOT_YET", 2) < 0)
    goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
