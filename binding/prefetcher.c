/* prefetcher.c - Prefetcher: the C prefetch threads (src/io/prefetcher.c)
 * over a record file, file ranges (a tar shard's samples laid out by
 * tarframe.c) or a Python callback (pysource.c); and the early parking of
 * the threads around os.fork. */
#define PY_SSIZE_T_CLEAN
#include "binding.h"
#include "io.h"

#include <string.h>
#include <unistd.h>
#include "decode.h"

/* ---- Prefetcher ---- */

/* How the prefetcher frames a record in the pool: as the codec stores what
 * the Python dataset returns (python/opt4torch/pool/codec.py), so the consumer's
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
static PyObject *prefetcher_start(PrefetcherObject *self, const char *name, const opt4_prefetcher_opts *o) {
  opt4_prefetcher *pf = NULL;
  opt4_source *src = self->src;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_prefetcher_start_source(name, src, o, &pf);
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
                           "load", "items", "max_size", "max_threads", "units", NULL};
  const char *name, *frame = "bytes";
  PyObject *rec;
  unsigned int threads = 0, max_threads = 0;
  unsigned long long lookahead = 0, items = 0, max_size = 0;
  PyObject *labels = Py_None, *samples = Py_None, *load = Py_None, *units = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|IKsOOOKKIO", kwlist, &name, &rec, &threads, &lookahead, &frame,
                                   &labels, &samples, &load, &items, &max_size, &max_threads, &units))
    return NULL;
  opt4_prefetcher_opts o;
  memset(&o, 0, sizeof o);
  o.threads = threads;
  o.max_threads = max_threads;
  o.lookahead = lookahead;
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
    return prefetcher_start(self, name, &o);
  }
  /* Ranges of files and ranges of objects are read alike (a source of
   * ranges, framed the same way): is_ranges covers both. */
  int is_s3 = PyObject_TypeCheck(rec, &opt4py_S3RangesType);
  int is_ranges = is_s3 || PyObject_TypeCheck(rec, &opt4py_RangesType);
  if (!is_ranges && !PyObject_TypeCheck(rec, &opt4py_RecordsType))
    return PyErr_Format(PyExc_TypeError, "the prefetcher reads Records, Ranges or S3Ranges, not %s",
                        Py_TYPE(rec)->tp_name);
  if (is_s3 ? opt4py_s3_check((S3RangesObject *)rec) < 0
            : is_ranges ? opt4py_ranges_check((RangesObject *)rec) < 0
                        : opt4py_records_check((RecordsObject *)rec) < 0)
    return NULL;
  int tar = strcmp(frame, "tar") == 0;
  if (strcmp(frame, "raw") != 0 && strcmp(frame, "bytes") != 0 && !tar)
    return PyErr_Format(PyExc_ValueError, "frame must be 'bytes', 'tar' or 'raw', not '%s'", frame);
  if (units != Py_None && (!is_ranges || tar))
    return PyErr_Format(PyExc_ValueError, "units= gathers pieces of Ranges or S3Ranges, framed as bytes or raw");
  if (tar != (samples != Py_None) || (tar && (!is_ranges || !PyTuple_Check(samples) || PyTuple_GET_SIZE(samples) != 2)))
    return PyErr_Format(PyExc_ValueError, "frame='tar' reads Ranges or S3Ranges, with samples=(keys, members) as TarShards "
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
  self->readers = is_s3       ? &((S3RangesObject *)rec)->readers
                  : is_ranges ? &((RangesObject *)rec)->readers
                              : &((RecordsObject *)rec)->readers;
  if (self->frame.mode != FRAME_RAW) {
    o.frame = frame_codec;
    o.frame_ctx = &self->frame;
  }
  int rc;
  opt4_prefetcher *pf = NULL;
  if (is_ranges) {
    rc = is_s3 ? opt4_source_s3(((S3RangesObject *)rec)->r, &self->src)
               : opt4_source_ranges(((RangesObject *)rec)->r, &self->src);
    if (rc == 0 && units != Py_None) {
      /* Read units of several pieces (a Parquet page range): the reader's
       * items are the pieces, and the prefetcher reads the units. */
      Py_buffer view;
      if (PyObject_GetBuffer(units, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        Py_DECREF(self);
        return NULL;
      }
      if (view.itemsize != 8 || view.format == NULL || (strcmp(view.format, "q") != 0 && strcmp(view.format, "l") != 0) ||
          view.len < 8) {
        PyBuffer_Release(&view);
        Py_DECREF(self);
        return PyErr_Format(PyExc_TypeError, "units must be a contiguous int64 array of n_units + 1 first pieces");
      }
      opt4_source *pieces = self->src;
      self->src = NULL;
      rc = opt4_source_gather(pieces, view.buf, (uint64_t)(view.len / 8) - 1, &self->src); /* owns pieces */
      PyBuffer_Release(&view);
    }
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
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:d,s:K,s:I,s:I,s:I,s:I,s:I,s:I,s:d,s:d,s:K,s:K}", "loaded",
                       (unsigned long long)st.loaded, "bytes", (unsigned long long)st.bytes, "stored",
                       (unsigned long long)st.stored, "errors", (unsigned long long)st.errors, "idle_seconds",
                       (double)st.idle_ns / 1e9, "idle_waits", (unsigned long long)st.idle_waits, "threads", st.threads, "finished", st.finished, "active", st.active,
                       "grows", st.grows, "shrinks", st.shrinks, "wanted", st.wanted, "read_seconds",
                       (double)st.read_avg_ns / 1e9, "cpu_seconds", (double)st.cpu_ns / 1e9, "parks", (unsigned long long)st.parks, "park_timeouts",
                       (unsigned long long)st.park_timeouts);
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
    .tp_doc = "Prefetcher(pool_name, records, threads=8, lookahead=4096, frame='bytes', labels=None, samples=None, load=None, items=0, max_size=0, max_threads=0): "
              "C threads loading a pool's misses from a record file (Records), file ranges (Ranges), or "
              "load(i) (a Python callable returning the codec's parts, or None) ahead of its consumers.",
    .tp_methods = prefetcher_methods,
    .tp_getset = prefetcher_getset,
    .tp_new = prefetcher_new,
};

static PyMethodDef prefetcher_functions[] = {
    {"prefetchers_park", opt4py_prefetchers_park, METH_NOARGS,
     "prefetchers_park() -> int: park every C prefetch thread of this process at a safe point, with the GIL "
     "released (Python's before-fork hook); the threads not parked within 10 s"},
    {"prefetchers_resume", opt4py_prefetchers_resume, METH_NOARGS,
     "prefetchers_resume(): let the parked threads go (after a fork, in the parent)"},
    {NULL, NULL, 0, NULL}};

int opt4py_prefetcher_init(PyObject *m) {
  if (PyType_Ready(&PrefetcherType) < 0) return -1;
  if (PyModule_AddObjectRef(m, "Prefetcher", (PyObject *)&PrefetcherType) < 0) return -1;
  return PyModule_AddFunctions(m, prefetcher_functions);
}
