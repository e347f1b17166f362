/* pysource.c - a source that calls into Python: item i is what load(i)
 * returns, a sequence of buffers (the codec's parts of dataset[i]), or None
 * to leave the item to the worker that needs it. It lets the C prefetch
 * threads (src/io/prefetcher.c) load from any map-style dataset: a thread
 * takes the GIL for the call and the copy of the parts into its buffer, and
 * nothing else, where the Python thread prefetcher before it held the GIL
 * for its whole loop and polled with sleeps.
 *
 * The GIL and fork. os.fork holds the GIL across fork(), and the
 * prefetcher's prepare handler waits for its threads to reach a safe point:
 * a thread waiting for the GIL, or inside load(), would never get there
 * (the handler would wait out its 10 s and fork with the thread inside
 * Python). So Python's before-fork hook (opt4torch/_forksafe.py) calls
 * prefetchers_park() first: with the GIL released it parks every
 * prefetcher's threads (opt4_prefetchers_park), each finishing the call it
 * is in; the prepare handler then finds them parked. A load() that forks
 * itself is the forking thread and is not waited for.
 *
 * Thread states. A thread keeps one Python thread state for its life: the
 * first call it makes takes one (PyGILState_Ensure, then
 * PyEval_SaveThread, the idiom for a thread that enters Python again and
 * again), and each call after that only takes and gives back the GIL. A
 * thread state made and dropped per call, as PyGILState_Ensure alone does
 * on a thread Python does not know, costs an allocation and its frame
 * stack each time. The states are listed here and deleted when the source
 * is closed: with the GIL, after the prefetcher has stopped (its threads
 * are joined), in the process that made them (a forked child's Python
 * deleted its copies of other threads' states when it forked). Up to
 * Python 3.11 only: from 3.12 on, deleting a thread state bound to another
 * thread unbinds the deleting thread's own (pystate.c,
 * unbind_gilstate_tstate clears the caller's slot), so there each call
 * makes and drops its state as before, and a thread-local of the dataset
 * lasts one call.
 *
 * Exit. A thread that takes the GIL while the interpreter finalizes is
 * ended by CPython on the spot; the loader stops its prefetcher before
 * that (weakref.finalize, which runs at exit), and a read that finds the
 * interpreter finalizing anyway returns OPT4_EIO without taking the GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "opt4.h"
#include "binding.h"

typedef struct py_source {
  PyObject *load; /* strong; used and released with the GIL only */
  uint64_t items, max_size;
  /* Each prefetch thread's own thread state (see the top), under lock. */
  pthread_mutex_t lock;
  PyThreadState **states;
  size_t n_states, cap_states;
  pid_t pid;
} py_source;

/* This thread's thread state for source s, kept since its first call here
 * (a thread serves one prefetcher, so one source). */
static _Thread_local const py_source *tl_source;

/* Take this thread's own thread state for s, on its first call: made with
 * the GIL, then the GIL given back with the state kept, and listed (no lock
 * is held while the GIL is taken). When the list cannot grow, the state is
 * dropped again and the calls go through PyGILState_Ensure alone. */
#if PY_VERSION_HEX < 0x030C0000
#define KEEP_STATES 1
#else
#define KEEP_STATES 0
#endif

static void own_state(py_source *s) {
  if (!KEEP_STATES || tl_source == s) return;
  PyGILState_STATE g = PyGILState_Ensure(); /* released only if it cannot be listed */
  PyThreadState *ts = PyEval_SaveThread();
  pthread_mutex_lock(&s->lock);
  int ok = s->n_states < s->cap_states;
  if (!ok) {
    size_t cap = s->cap_states ? 2 * s->cap_states : 16;
    PyThreadState **grown = realloc(s->states, cap * sizeof *grown);
    if (grown != NULL) {
      s->states = grown;
      s->cap_states = cap;
      ok = 1;
    }
  }
  if (ok) s->states[s->n_states++] = ts;
  pthread_mutex_unlock(&s->lock);
  if (ok) {
    tl_source = s;
  } else {
    PyEval_RestoreThread(ts);
    PyGILState_Release(g);
  }
}

static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

static int ps_count(void *state, uint64_t *items) {
  *items = ((const py_source *)state)->items;
  return 0;
}

/* An item's length is known once it is loaded: the bound is what the
 * prefetcher sizes its buffers by. */
static int ps_size_of(void *state, uint64_t item, uint64_t *len) {
  (void)item;
  *len = ((const py_source *)state)->max_size;
  return 0;
}

static int ps_max_size(void *state, uint64_t *len) {
  *len = ((const py_source *)state)->max_size;
  return 0;
}

/* With the GIL: load(item) into rd. */
static int ps_call(py_source *s, opt4_source_read *rd) {
  PyObject *parts = PyObject_CallFunction(s->load, "K", (unsigned long long)rd->item);
  if (parts == NULL) {
    /* load() reports the dataset's errors itself and returns None; an
     * exception here is a bug in it: shown, and the item left to the worker. */
    PyErr_WriteUnraisable(s->load);
    return OPT4_EIO;
  }
  int rc = 0;
  if (parts == Py_None) {
    rc = OPT4_EINVAL; /* the worker loads it */
  } else {
    PyObject *fast = PySequence_Fast(parts, "load() must return a sequence of buffers or None");
    Py_ssize_t n = fast ? PySequence_Fast_GET_SIZE(fast) : 0;
    uint64_t total = 0;
    for (Py_ssize_t pass = 0; fast != NULL && rc == 0 && pass < 2; pass++) {
      /* First the length, then (when it fits) the bytes. */
      for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        Py_buffer v;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), &v, PyBUF_C_CONTIGUOUS) < 0) {
          rc = OPT4_EINVAL;
          break;
        }
        if (pass == 1) memcpy((uint8_t *)rd->dst + total, v.buf, (size_t)v.len);
        total += (uint64_t)v.len;
        PyBuffer_Release(&v);
      }
      if (pass == 0 && rc == 0) {
        rd->len = total;
        if (total > rd->cap) rc = OPT4_EITEMSIZE;
        total = 0;
      }
    }
    if (fast == NULL || PyErr_Occurred()) {
      PyErr_WriteUnraisable(s->load);
      rc = OPT4_EINVAL;
    }
    Py_XDECREF(fast);
  }
  Py_DECREF(parts);
  return rc;
}

static int ps_submit(void *state, opt4_source_read *reads, size_t n) {
  py_source *s = state;
  for (size_t i = 0; i < n; i++) {
    if (finalizing()) {
      reads[i].status = OPT4_EIO;
      continue;
    }
    own_state(s);
    PyGILState_STATE g = PyGILState_Ensure(); /* this thread's own state: the GIL only */
    reads[i].status = ps_call(s, &reads[i]);
    PyGILState_Release(g);
  }
  return 0;
}

static void ps_close(void *state) {
  py_source *s = state;
  /* Closed with the GIL held (the Prefetcher's dealloc, or a failed start),
   * the threads joined: their states go, in the process that made them. */
  if (getpid() == s->pid) {
    for (size_t i = 0; i < s->n_states; i++) {
      PyThreadState_Clear(s->states[i]);
      PyThreadState_Delete(s->states[i]);
    }
  }
  free(s->states);
  pthread_mutex_destroy(&s->lock);
  Py_XDECREF(s->load);
  PyMem_RawFree(s);
}

int opt4py_py_source(PyObject *load, uint64_t items, uint64_t max_size, opt4_source **out) {
  static const opt4_source_ops ops = {
      .version = OPT4_SOURCE_OPS_VERSION,
      .name = "python",
      .count = ps_count,
      .size_of = ps_size_of,
      .max_size = ps_max_size,
      .submit = ps_submit,
      .close = ps_close,
  };
  py_source *s = PyMem_RawCalloc(1, sizeof *s);
  if (s == NULL) return OPT4_ENOMEM;
  s->load = Py_NewRef(load);
  s->items = items;
  s->max_size = max_size;
  pthread_mutex_init(&s->lock, NULL);
  s->pid = getpid();
  return opt4_source_create(&ops, s, out); /* closes s when it fails */
}

/* prefetchers_park() -> int: see the top; the threads not parked in time. */
PyObject *opt4py_prefetchers_park(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored)) {
  uint32_t missed;
  Py_BEGIN_ALLOW_THREADS missed = opt4_prefetchers_park();
  Py_END_ALLOW_THREADS return PyLong_FromUnsignedLong(missed);
}

PyObject *opt4py_prefetchers_resume(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored)) {
  Py_BEGIN_ALLOW_THREADS opt4_prefetchers_resume();
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
}
