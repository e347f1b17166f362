/* pool.c - the binding's Pool type: a handle on a shared-memory pool (the
 * batch calls of the DataLoader's workers, the prefetch claims, stats) and
 * the functions that make, attach, list and remove pools. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "opt4.h"
#include "binding.h"
#include "decode.h"

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
                           "owner_pid", "staging_slots", "staging_slot_bytes", "spare_pages", NULL};
  PyObject *plan_obj;
  unsigned long long page_size, timeout_ms = 0, slot_bytes = 0, spare = 0;
  unsigned int max_procs = 0, owner_pid = 0, staging = 0;
  int occurrences = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OK|KIpIIKK", kwlist, &plan_obj, &page_size,
                                   &timeout_ms, &max_procs, &occurrences, &owner_pid, &staging,
                                   &slot_bytes, &spare))
    return NULL;
  opt4_plan *plan = opt4py_plan_enter(plan_obj);
  if (plan == NULL) return NULL;
  opt4_pool_opts opts;
  memset(&opts, 0, sizeof opts);
  opts.page_size = page_size;
  opts.wait_timeout_ms = timeout_ms;
  opts.max_procs = max_procs;
  opts.flags = occurrences ? OPT4_POOL_OCCURRENCES : 0;
  opts.owner_pid = owner_pid;
  opts.staging_slots = staging;
  opts.staging_slot_bytes = slot_bytes;
  opts.spare_pages = spare;
  opt4_pool *pool = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_pool_create(plan, &opts, &pool);
  Py_END_ALLOW_THREADS opt4py_plan_leave(plan_obj);
  if (rc != 0) return opt4py_raise(rc, "create pool");
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
  Py_END_ALLOW_THREADS if (rc != 0) return opt4py_raise(rc, "attach pool");
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
  if (rc != 0) return opt4py_raise(rc, "unlink pool");
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

static PyObject *info_dict(const opt4_pool_info *in, const char *name) {
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:I,s:I,s:I,s:s}", "accesses",
                       (unsigned long long)in->accesses, "items", (unsigned long long)in->items,
                       "fingerprint", (unsigned long long)in->fingerprint, "page_size",
                       (unsigned long long)in->page_size, "pages", (unsigned long long)in->pages,
                       "generations", (unsigned long long)in->generations, "shm_bytes",
                       (unsigned long long)in->shm_bytes, "wait_timeout_ms",
                       (unsigned long long)in->wait_timeout_ms, "max_procs", in->max_procs,
                       "attached", in->attached, "owner_pid", in->owner_pid, "name", name);
}

static PyObject *stats_dict(const opt4_pool_stats *st) {
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "hits",
                       (unsigned long long)st->hits, "admits", (unsigned long long)st->admits,
                       "bypasses", (unsigned long long)st->bypasses, "fallbacks",
                       (unsigned long long)st->fallbacks, "deferred",
                       (unsigned long long)st->deferred, "stored", (unsigned long long)st->stored,
                       "store_failed", (unsigned long long)st->store_failed, "timeouts",
                       (unsigned long long)st->timeouts, "waits", (unsigned long long)st->waits,
                       "wait_ns", (unsigned long long)st->wait_ns, "prefetched",
                       (unsigned long long)st->prefetched, "prefetch_stored",
                       (unsigned long long)st->prefetch_stored, "prefetch_dropped",
                       (unsigned long long)st->prefetch_dropped, "stalls",
                       (unsigned long long)st->stalls, "stall_ns", (unsigned long long)st->stall_ns);
}

/* A view as one dict: the info's keys, the counters' keys, and the
 * position and page figures. */
static PyObject *view_dict(const opt4_pool_view *v, const char *name) {
  PyObject *d = info_dict(&v->info, name), *st = NULL, *more = NULL;
  if (d == NULL) goto fail;
  st = stats_dict(&v->stats);
  if (st == NULL || PyDict_Update(d, st) < 0) goto fail;
  more = Py_BuildValue("{s:K,s:K,s:K,s:K}", "head", (unsigned long long)v->head, "floor",
                       (unsigned long long)v->floor, "pages_ready", (unsigned long long)v->pages_ready,
                       "pages_failed", (unsigned long long)v->pages_failed);
  if (more == NULL || PyDict_Update(d, more) < 0) goto fail;
  Py_DECREF(st);
  Py_DECREF(more);
  return d;
fail:
  Py_XDECREF(d);
  Py_XDECREF(st);
  Py_XDECREF(more);
  return NULL;
}

static PyObject *pool_info(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  opt4_pool_info in;
  int rc = opt4_pool_info_get(self->pool, &in);
  if (rc != 0) return opt4py_raise(rc, "pool info");
  return info_dict(&in, opt4_pool_name(self->pool));
}

static PyObject *pool_stats(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  opt4_pool_stats st;
  int rc = opt4_pool_stats_get(self->pool, &st);
  if (rc != 0) return opt4py_raise(rc, "pool stats");
  return stats_dict(&st);
}

static PyObject *pool_view(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  opt4_pool_view v;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_pool_view_get(self->pool, &v);
  Py_END_ALLOW_THREADS
  if (rc != 0) return opt4py_raise(rc, "pool view");
  return view_dict(&v, opt4_pool_name(self->pool));
}

static PyObject *pool_item(PoolObject *self, PyObject *arg) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  unsigned long long t = PyLong_AsUnsignedLongLong(arg);
  if (t == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  uint32_t item, kind;
  int rc = opt4_pool_item(self->pool, t, &item, &kind);
  if (rc != 0) return opt4py_raise(rc, "pool item");
  return Py_BuildValue("(II)", item, kind);
}

static PyObject *pool_set_floor(PoolObject *self, PyObject *arg) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  unsigned long long p = PyLong_AsUnsignedLongLong(arg);
  if (p == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  int rc = opt4_pool_set_floor(self->pool, p);
  if (rc != 0) return opt4py_raise(rc, "set floor");
  Py_RETURN_NONE;
}

static PyObject *pool_floor(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  uint64_t floor;
  int rc = opt4_pool_floor_get(self->pool, &floor);
  if (rc != 0) return opt4py_raise(rc, "floor");
  return PyLong_FromUnsignedLongLong(floor);
}

static PyObject *pool_skip(PoolObject *self, PyObject *arg) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  unsigned long long t = PyLong_AsUnsignedLongLong(arg);
  if (t == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  int rc = opt4_pool_skip(self->pool, t);
  if (rc != 0) return opt4py_raise(rc, "skip");
  Py_RETURN_NONE;
}

/* occurrence_next(item) -> position, or None once the plan has no more. */
static PyObject *pool_occurrence_next(PoolObject *self, PyObject *arg) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  unsigned long item = PyLong_AsUnsignedLong(arg);
  if (item == (unsigned long)-1 && PyErr_Occurred()) return NULL;
  if (item > UINT32_MAX) return opt4py_raise(OPT4_ERANGE, "occurrence");
  uint64_t t;
  int rc = opt4_pool_occurrence_next(self->pool, (uint32_t)item, &t);
  if (rc != 0) return opt4py_raise(rc, "occurrence");
  if (t == UINT64_MAX) Py_RETURN_NONE;
  return PyLong_FromUnsignedLongLong(t);
}

static PyObject *pool_clock_next(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pool == NULL) return PyErr_Format(PyExc_ValueError, "operation on a closed pool");
  uint64_t t;
  int rc = opt4_pool_clock_next(self->pool, &t);
  if (rc != 0) return opt4py_raise(rc, "clock");
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
      opt4py_raise(rc, "read batch");
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
    opt4py_raise(rc, "read batch");
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
/* store_batch results, exported as STORE_*. */
enum { STORE_NOT_STORED = 0, STORE_STORED = 1, STORE_TOO_LARGE = -1 };

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



/* get_batch(positions, make_arrays=None, views=False) -> (objects, data, rest):
 * the batch with its HITs decoded where the C decoder can (objects[i]);
 * arrays made by make_arrays(data, runs) when given; with views, bytes come
 * out as read-only memoryviews of data (no copy; data is this call's own
 * copy of the pool's bytes, so the views stay exact while anyone holds them). rest lists the other positions'
 * entries as (i, status, item, a, b), in order (see entry_of), for the Python
 * layer to load, store or decode from data. An AGAIN entry ends rest, and
 * objects stops at it: the positions before it are served; commit them and
 * ask again from its i. */
static PyObject *pool_get_batch(PoolObject *self, PyObject *args) {
  PyObject *positions, *make_arrays = Py_None;
  int views = 0;
  if (!PyArg_ParseTuple(args, "O|Op:get_batch", &positions, &make_arrays, &views)) return NULL;
  if (pool_enter(self) < 0) return NULL;
  fetched f;
  rec_ctx c = {.arrays = make_arrays != Py_None};
  PyObject *out = NULL, *objects = NULL, *rest = NULL, *whole = NULL;
  if (fetch_batch(self, positions, &f) < 0) goto leave;
  objects = PyList_New(f.n);
  rest = PyList_New(0);
  if (objects == NULL || rest == NULL) goto leave;
  const uint8_t *buf = (const uint8_t *)PyByteArray_AS_STRING(f.data);
  c.base = buf;
  if (views) {
    whole = rec_readonly_view(f.data);
    if (whole == NULL) goto leave;
    c.views = whole;
  }
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
  Py_XDECREF(whole);
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
 * processed in order: parts stores the ADMIT at position (STORE_STORED,
 * STORE_NOT_STORED: late or timed out, STORE_TOO_LARGE for its space); None
 * notes the DEFER at position as a read (STORE_STORED). A batch must commit in position
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
      stored = STORE_STORED;
    } else {
      r = opt4_pool_put(self->pool, pos[i], gs[i].iov, (size_t)gs[i].n, &stored);
    }
    if (r == OPT4_EITEMSIZE) {
      results[i] = STORE_TOO_LARGE;
    } else if (r != 0) {
      rc = r;
      failed_at = i;
      break;
    } else {
      results[i] = stored ? STORE_STORED : STORE_NOT_STORED;
    }
  }
  Py_END_ALLOW_THREADS if (rc != 0) {
    (void)failed_at;
    opt4py_raise(rc, "store batch");
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
      opt4py_raise(rc, "note reads");
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
    opt4py_raise(rc, "live_at");
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

/* warm(admit, parts, reads_before) -> STORE_STORED, STORE_NOT_STORED or
 * STORE_TOO_LARGE, as store_batch's results. */
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
      out = PyLong_FromLong(STORE_TOO_LARGE);
    else if (rc != 0)
      opt4py_raise(rc, "warm");
    else
      out = PyLong_FromLong(stored ? STORE_STORED : STORE_NOT_STORED);
  }
  pool_leave(self);
  return out;
}

/* prefetch_claim(lookahead) -> (status, t, item, kind, space): status 0
 * claimed, 1 nothing in the window now, 2 the plan's misses are all taken.
 * prefetch_claim_at(t) -> the same for the miss at t itself
 * (opt4_pool_prefetch_claim_at). */
static PyObject *claim(PoolObject *self, PyObject *arg, int at) {
  unsigned long long n = PyLong_AsUnsignedLongLong(arg);
  if (n == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  if (pool_enter(self) < 0) return NULL;
  opt4_prefetch_job job;
  int status = 0, rc;
  Py_BEGIN_ALLOW_THREADS rc = at ? opt4_pool_prefetch_claim_at(self->pool, n, &job, &status)
                                 : opt4_pool_prefetch_claim(self->pool, n, &job, &status);
  Py_END_ALLOW_THREADS pool_leave(self);
  if (rc != 0) return opt4py_raise(rc, "prefetch claim");
  return Py_BuildValue("(iKIIK)", status, (unsigned long long)job.t, job.item, job.kind,
                       (unsigned long long)job.space);
}

static PyObject *pool_prefetch_claim(PoolObject *self, PyObject *arg) { return claim(self, arg, 0); }

static PyObject *pool_prefetch_claim_at(PoolObject *self, PyObject *arg) { return claim(self, arg, 1); }

/* prefetch_store(t, parts, try_only=False) -> STORE_DONE (handed over),
 * STORE_GIVEN_UP, -1 too large, or STORE_NOT_YET (try_only): keep it and
 * try again later. */
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
      opt4py_raise(rc, "prefetch store");
    else
      out = PyLong_FromLong(stored);
  }
  pool_leave(self);
  return out;
}

/* Store claimed position t as prefetch_store(t, [record], True) would, and
 * while that says STORE_NOT_YET (the consumers are still far from t) sleep
 * on their progress until they come within a block, then store as a waiting
 * store (a consumer may wait for this item). *result: prefetch_store's
 * (-1 too large), or OPT4_STORE_NOT_YET when a wait of ns ended with the
 * consumers still far (or at once on an interrupted handle). */
static int store_near(opt4_pool *pool, uint64_t t, const opt4_iovec *record, uint64_t ns, int *result) {
  const uint64_t near = t > OPT4_HEAD_BLOCK ? t - OPT4_HEAD_BLOCK : 0;
  int rc = 0, reached = 0;
  *result = OPT4_STORE_NOT_YET;
  for (;;) {
    uint64_t head = 0;
    rc = opt4_pool_head(pool, &head); /* a look: a load, not a system call */
    if (rc == 0)
      rc = head >= near ? opt4_pool_prefetch_store(pool, t, record, 1, result)
                        : opt4_pool_prefetch_try_store(pool, t, record, 1, result);
    if (rc != 0 || *result != OPT4_STORE_NOT_YET) break;
    rc = opt4_pool_wait_head(pool, near, ns, &reached);
    if (rc != 0 || !reached) break;
  }
  if (rc == OPT4_EITEMSIZE) {
    *result = -1;
    return 0;
  }
  return rc;
}

/* The ops of prefetch_deliver. */
enum { DELIVER_STORE = 0, DELIVER_READ = 1 };

/* prefetch_deliver(positions, ops, records, timeout, reader) -> (done, data,
 * results): a cluster node's transfer thread's delivery of a window, in
 * position order, in one call without the GIL (docs/cluster.md, "The run
 * time"). ops[j] (bytes-like, one a position) says what to do at
 * positions[j]: DELIVER_STORE stores the next of records (one buffer each)
 * at that claimed position of this handle (store_near); DELIVER_READ reads
 * it through reader (another handle of the same pool) as a worker reads it,
 * its record copied into data. results[j] is (code, a, b): a store's
 * (prefetch_store's result, 0, 0); a read's as read_batch's entry (ENTRY_HIT:
 * offset in data and length; ENTRY_LOAD: the reason). It stops after a read
 * that is not a HIT (the caller loads it as a worker would) and before a
 * store whose wait ended with the consumers still far (the caller decides:
 * the loader may be ending); done says how many ops were done. */
static PyObject *pool_prefetch_deliver(PoolObject *self, PyObject *args) {
  PyObject *positions, *ops_obj, *records;
  PoolObject *reader;
  double timeout;
  if (!PyArg_ParseTuple(args, "OOOdO!", &positions, &ops_obj, &records, &timeout, &PoolType, &reader)) return NULL;
  if (!(timeout >= 0)) return PyErr_Format(PyExc_ValueError, "timeout must be >= 0 seconds, got %g", timeout);
  if (reader == self) return PyErr_Format(PyExc_ValueError, "the reader must be another handle than the storer");
  Py_ssize_t n = 0;
  uint64_t *pos = positions_from(positions, &n);
  if (pos == NULL) return NULL;
  PyObject *out = NULL, *data = NULL;
  Py_buffer ops = {0};
  gathered g = {NULL, NULL, 0};
  int entered = 0;
  uint64_t *a = PyMem_Calloc((size_t)(n ? n : 1), sizeof *a), *b = PyMem_Calloc((size_t)(n ? n : 1), sizeof *b);
  int *code = PyMem_Calloc((size_t)(n ? n : 1), sizeof *code);
  if (a == NULL || b == NULL || code == NULL) {
    PyErr_NoMemory();
    goto leave;
  }
  if (PyObject_GetBuffer(ops_obj, &ops, PyBUF_SIMPLE) < 0) goto leave;
  if (gather(records, &g) < 0) goto leave;
  const uint8_t *op = ops.buf;
  Py_ssize_t stores = 0;
  for (Py_ssize_t j = 0; j < ops.len; j++) stores += op[j] == DELIVER_STORE;
  if (ops.len != n || stores != g.n) {
    PyErr_Format(PyExc_ValueError, "%zd positions, %zd ops (%zd stores) and %zd records: one op a position, "
                 "one record a store", n, ops.len, stores, g.n);
    goto leave;
  }
  if (pool_enter(self) < 0) goto leave;
  if (pool_enter(reader) < 0) {
    pool_leave(self);
    goto leave;
  }
  entered = 1;
  /* Room for every read's record, each at a 16-byte boundary (as read_batch's). */
  uint64_t total = BATCH_ALIGN;
  for (Py_ssize_t j = 0; j < n; j++) {
    if (op[j] == DELIVER_STORE) continue;
    uint64_t space = 0;
    int rc = op[j] == DELIVER_READ ? opt4_pool_space(reader->pool, pos[j], &space) : OPT4_EINVAL;
    if (rc != 0) {
      opt4py_raise(rc, "prefetch deliver");
      goto leave;
    }
    total += ALIGN_UP(space);
  }
  data = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
  if (data == NULL) goto leave;
  uint8_t *buf = (uint8_t *)PyByteArray_AS_STRING(data);
  uint64_t used = ALIGN_UP((uintptr_t)buf) - (uintptr_t)buf;
  const uint64_t ns = timeout > 1e9 ? UINT64_MAX : timeout * 1e9 < 1 ? 1 : (uint64_t)(timeout * 1e9);
  int rc = 0;
  Py_ssize_t done = 0, store = 0;
  Py_BEGIN_ALLOW_THREADS for (; done < n; done++) {
    if (op[done] == DELIVER_STORE) {
      int result = 0;
      rc = store_near(self->pool, pos[done], &g.iov[store], ns, &result);
      if (rc != 0 || result == OPT4_STORE_NOT_YET) break;
      code[done] = result;
      store++;
      continue;
    }
    opt4_get_result res;
    rc = opt4_pool_get(reader->pool, pos[done], &pos[done], 1, buf + used, total - used, &res);
    if (rc != 0) break;
    if (res.status == OPT4_GET_HIT) {
      code[done] = ENTRY_HIT;
      a[done] = used;
      b[done] = res.len;
      used = ALIGN_UP(used + res.len);
      continue;
    }
    code[done] = res.status == OPT4_GET_AGAIN ? ENTRY_AGAIN : res.status == OPT4_GET_DEFER ? ENTRY_DEFER : ENTRY_LOAD;
    a[done] = res.status == OPT4_GET_LOAD ? res.reason : res.status == OPT4_GET_DEFER ? res.defer_to : 0;
    done++; /* done: the caller loads it */
    break;
  }
  Py_END_ALLOW_THREADS if (rc != 0) {
    opt4py_raise(rc, "prefetch deliver");
    goto leave;
  }
  PyObject *list = PyList_New(done);
  if (list == NULL) goto leave;
  for (Py_ssize_t j = 0; j < done; j++) {
    PyObject *t = Py_BuildValue("(iKK)", code[j], (unsigned long long)a[j], (unsigned long long)b[j]);
    if (t == NULL) {
      Py_DECREF(list);
      goto leave;
    }
    PyList_SET_ITEM(list, j, t);
  }
  out = Py_BuildValue("(nON)", done, data, list);
leave:
  if (entered) {
    pool_leave(reader);
    pool_leave(self);
  }
  Py_XDECREF(data);
  if (g.iov != NULL) gathered_release(&g);
  if (ops.obj != NULL) PyBuffer_Release(&ops);
  PyMem_Free(a);
  PyMem_Free(b);
  PyMem_Free(code);
  PyMem_Free(pos);
  return out;
}

static PyObject *pool_prefetch_release(PoolObject *self, PyObject *arg) {
  unsigned long long t = PyLong_AsUnsignedLongLong(arg);
  if (t == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  if (pool_enter(self) < 0) return NULL;
  int rc = opt4_pool_prefetch_release(self->pool, t);
  pool_leave(self);
  if (rc != 0) return opt4py_raise(rc, "prefetch release");
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
  if (rc != 0) return opt4py_raise(rc, "prefetch pending");
  return PyLong_FromUnsignedLongLong(n);
}

/* interrupt(): callable from another thread while this handle waits. */
/* wait_head(target, timeout) -> bool: the consumers reached target (see
 * opt4_pool_wait_head), waiting at most timeout seconds without the GIL. */
static PyObject *pool_wait_head(PoolObject *self, PyObject *args) {
  unsigned long long target;
  double timeout;
  if (!PyArg_ParseTuple(args, "Kd", &target, &timeout)) return NULL;
  if (!(timeout >= 0)) return PyErr_Format(PyExc_ValueError, "timeout must be >= 0 seconds, got %g", timeout);
  if (pool_enter(self) < 0) return NULL;
  int reached = 0, rc;
  uint64_t ns = timeout > 1e9 ? UINT64_MAX : (uint64_t)(timeout * 1e9);
  Py_BEGIN_ALLOW_THREADS rc = opt4_pool_wait_head(self->pool, target, ns, &reached);
  Py_END_ALLOW_THREADS pool_leave(self);
  if (rc != 0) return opt4py_raise(rc, "wait head");
  return PyBool_FromLong(reached);
}

/* head() -> the consumers' progress now, without waiting (a look). */
static PyObject *pool_head(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (pool_enter(self) < 0) return NULL;
  uint64_t head = 0;
  int rc = opt4_pool_head(self->pool, &head);
  pool_leave(self);
  if (rc != 0) return opt4py_raise(rc, "head");
  return PyLong_FromUnsignedLongLong(head);
}

static PyObject *pool_interrupt(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
  if (self->pool == NULL) Py_RETURN_NONE;
  opt4_pool_interrupt(self->pool);
  Py_RETURN_NONE;
}

static PyMethodDef pool_methods[] = {
    {"close", (PyCFunction)pool_close, METH_NOARGS, "Detach (does not remove the pool)."},
    {"head", (PyCFunction)pool_head, METH_NOARGS,
     "head() -> the consumers' progress now (the position wait_head waits on), without waiting"},
    {"wait_head", (PyCFunction)pool_wait_head, METH_VARARGS,
     "wait_head(target, timeout) -> bool: sleep until the consumers reach position target"},
    {"unlink", (PyCFunction)pool_unlink, METH_NOARGS, "Remove the pool's segments."},
    {"info", (PyCFunction)pool_info, METH_NOARGS, "Layout and sizes as a dict."},
    {"stats", (PyCFunction)pool_stats, METH_NOARGS, "Counters summed over all processes."},
    {"view", (PyCFunction)pool_view, METH_NOARGS,
     "info(), stats(), and head, floor, pages_ready, pages_failed: where the job is (O(pages))."},
    {"item", (PyCFunction)pool_item, METH_O, "item(t) -> (item id, plan kind)."},
    {"set_floor", (PyCFunction)pool_set_floor, METH_O, "set_floor(p): positions below p are done."},
    {"floor", (PyCFunction)pool_floor, METH_NOARGS, "floor() -> the floor now (see set_floor)."},
    {"clock_next", (PyCFunction)pool_clock_next, METH_NOARGS, "The compatibility clock."},
    {"skip", (PyCFunction)pool_skip, METH_O, "skip(t): position t will not run as planned."},
    {"occurrence_next", (PyCFunction)pool_occurrence_next, METH_O,
     "occurrence_next(item) -> position of its next planned access, or None."},
    {"read_batch", (PyCFunction)pool_read_batch, METH_O,
     "read_batch(positions) -> (data, [(status, item, a, b)])"},
    {"get_batch", (PyCFunction)pool_get_batch, METH_VARARGS,
     "get_batch(positions, make_arrays=None, views=False) -> (objects, data, [(i, status, item, a, b)] left)"},
    {"store_batch", (PyCFunction)pool_store_batch, METH_O,
     "store_batch([(position, parts or None)]) -> [1 stored | 0 not | -1 too large], in order"},
    {"note_reads", (PyCFunction)pool_note_reads, METH_O, "note_reads(positions) for DEFERs."},
    {"live_at", (PyCFunction)pool_live_at, METH_O, "live_at(p) -> [(admit, item, reads_before)]"},
    {"warm", (PyCFunction)pool_warm, METH_VARARGS, "warm(admit, parts, reads_before) -> result"},
    {"prefetch_claim", (PyCFunction)pool_prefetch_claim, METH_O,
     "prefetch_claim(lookahead) -> (status, t, item, kind, space)"},
    {"prefetch_claim_at", (PyCFunction)pool_prefetch_claim_at, METH_O,
     "prefetch_claim_at(t) -> (status, t, item, kind, space): the miss at t itself"},
    {"prefetch_deliver", (PyCFunction)pool_prefetch_deliver, METH_VARARGS,
     "prefetch_deliver(positions, ops, records, timeout, reader) -> (done, data, results): claimed positions "
     "stored and own positions read in order, without the GIL (a cluster node's transfer thread's delivery)"},
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
    return opt4py_raise(rc, "list pools");
  }
  return list;
}

static PyObject *py_pool_peek(PyObject *Py_UNUSED(m), PyObject *arg) {
  const char *name = PyUnicode_AsUTF8(arg);
  if (name == NULL) return NULL;
  opt4_pool_view v;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_pool_peek(name, &v);
  Py_END_ALLOW_THREADS
  if (rc != 0) return opt4py_raise(rc, "pool peek");
  return view_dict(&v, name);
}

static PyObject *py_pool_remove(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"name", "force", NULL};
  const char *name;
  int force = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|p", kwlist, &name, &force)) return NULL;
  int rc = opt4_pool_remove(name, force);
  if (rc != 0) return opt4py_raise(rc, "remove pool");
  Py_RETURN_NONE;
}

static PyMethodDef pool_functions[] = {
    {"pool_create", (PyCFunction)(void (*)(void))py_pool_create, METH_VARARGS | METH_KEYWORDS,
     "pool_create(plan, page_size, wait_timeout_ms=0, max_procs=0, occurrences=False) -> Pool"},
    {"pool_attach", py_pool_attach, METH_O, "pool_attach(name) -> Pool"},
    {"pool_list", py_pool_list, METH_NOARGS,
     "This user's pools: [{name, owner_pid, owner_alive, owner_locked, other_namespace, "
     "unchecked, bytes}]"},
    {"pool_peek", py_pool_peek, METH_O,
     "pool_peek(name): a running pool's view (Pool.view's dict), read without attaching"},
    {"pool_remove", (PyCFunction)(void (*)(void))py_pool_remove, METH_VARARGS | METH_KEYWORDS,
     "pool_remove(name, force=False): remove a stale pool"},
    {"remove_owned_pools", py_remove_owned_pools, METH_NOARGS,
     "Remove every pool this process created as owner and has not unlinked (signal handlers)."},
    {NULL, NULL, 0, NULL}};

int opt4py_pool_init(PyObject *module) {
  if (PyType_Ready(&PoolType) < 0) return -1;
  if (PyModule_AddObjectRef(module, "Pool", (PyObject *)&PoolType) < 0) return -1;
  /* get_batch / read_batch entries: their status */
  if (PyModule_AddIntConstant(module, "ENTRY_HIT", ENTRY_HIT) < 0 ||
      PyModule_AddIntConstant(module, "ENTRY_DEFER", ENTRY_DEFER) < 0 ||
      PyModule_AddIntConstant(module, "ENTRY_LOAD", ENTRY_LOAD) < 0 ||
      PyModule_AddIntConstant(module, "ENTRY_AGAIN", ENTRY_AGAIN) < 0 ||
      PyModule_AddIntConstant(module, "STORE_NOT_STORED", STORE_NOT_STORED) < 0 ||
      PyModule_AddIntConstant(module, "STORE_STORED", STORE_STORED) < 0 ||
      PyModule_AddIntConstant(module, "STORE_TOO_LARGE", STORE_TOO_LARGE) < 0 ||
      PyModule_AddIntConstant(module, "DELIVER_STORE", DELIVER_STORE) < 0 ||
      PyModule_AddIntConstant(module, "DELIVER_READ", DELIVER_READ) < 0)
    return -1;
  return PyModule_AddFunctions(module, pool_functions);
}
