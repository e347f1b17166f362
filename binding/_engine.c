/*
 * _engine.c - the CPython binding of the opt4 engine: the module, its
 * exceptions and the functions of no type (the simulator, memory counters,
 * fingerprints). The types have a file each, as python-zstandard's c-ext/
 * does: plan.c (Plan, Array), pool.c (Pool), records.c (Records,
 * RecordWriter), outfile.c (OutFile), ranges.c (Ranges), prefetcher.c
 * (Prefetcher), with decode.c (the batch path's decoder),
 * tarframe.c and pysource.c (sources of the binding's own). These are the
 * only files of the library that include Python.h (binding.h says what they
 * share).
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

static PyObject *raise_code_ex(int rc, const char *context, int with_text, int in_place);

/* Record files share the plan file's codes, whose texts name plan files:
 * there the detail alone says it. */
PyObject *opt4py_raise_records(int rc, const char *context) { return raise_code_ex(rc, context, 0, 0); }

/* A read of a file or an object read in place: one cut short, changed or
 * corrupt since it was indexed is an I/O error (Opt4IOError, an OSError),
 * not a plan file's. */
PyObject *opt4py_raise_read(int rc, const char *context) { return raise_code_ex(rc, context, 0, 1); }

static PyObject *raise_code_ex(int rc, const char *context, int with_text, int in_place) {
  PyObject *type;
  switch (in_place && (rc == OPT4_ETRUNCATED || rc == OPT4_ECHECKSUM || rc == OPT4_ECORRUPT) ? OPT4_EIO : rc) {
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

PyObject *opt4py_raise(int rc, const char *context) { return raise_code_ex(rc, context, 1, 0); }

/* ------------------------------------------------------------------------ */
/* Sequences from the buffer protocol                                        */
/* ------------------------------------------------------------------------ */

int opt4py_get_seq(PyObject *obj, uint64_t items, Py_buffer *view, opt4_seq *seq) {
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
  if (opt4py_get_seq(obj, items, &view, &seq) < 0) return NULL;
  opt4_sim_result r;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_simulate(policy, &seq, capacity, seed, &r);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (rc != 0) return opt4py_raise(rc, "simulate");
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
  if (opt4py_get_seq(obj, items, &view, &seq) < 0) return NULL;
  uint64_t fp = 0;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_fingerprint(&seq, &fp);
  Py_END_ALLOW_THREADS PyBuffer_Release(&view);
  if (rc != 0) return opt4py_raise(rc, "fingerprint");
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
  PyObject *m = PyModule_Create(&module_def);
  if (m == NULL) return NULL;
  if (opt4py_plan_init(m) < 0 || opt4py_pool_init(m) < 0 || opt4py_records_init(m) < 0 ||
      opt4py_outfile_init(m) < 0 || opt4py_ranges_init(m) < 0 || opt4py_s3_init(m) < 0 || opt4py_prefetcher_init(m) < 0 ||
      opt4py_cluster_init(m) < 0 || opt4py_forkfix_init(m) < 0 || opt4py_encode_init(m) < 0)
    goto fail;
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
      /* a LOAD's reason (the entries' statuses: pool.c) */
      PyModule_AddIntConstant(m, "REASON_ADMIT", OPT4_REASON_ADMIT) < 0 ||
      PyModule_AddIntConstant(m, "REASON_BYPASS", OPT4_REASON_BYPASS) < 0 ||
      PyModule_AddIntConstant(m, "REASON_FALLBACK", OPT4_REASON_FALLBACK) < 0 ||
      /* prefetch_claim's status; prefetch_store's results */
      PyModule_AddIntConstant(m, "PREFETCH_CLAIMED", OPT4_PREFETCH_CLAIMED) < 0 ||
      PyModule_AddIntConstant(m, "PREFETCH_IDLE", OPT4_PREFETCH_IDLE) < 0 ||
      PyModule_AddIntConstant(m, "PREFETCH_END", OPT4_PREFETCH_END) < 0 ||
      PyModule_AddIntConstant(m, "STORE_GIVEN_UP", OPT4_STORE_GIVEN_UP) < 0 ||
      PyModule_AddIntConstant(m, "STORE_DONE", OPT4_STORE_DONE) < 0 ||
      PyModule_AddIntConstant(m, "STORE_NOT_YET", OPT4_STORE_NOT_YET) < 0 ||
      PyModule_AddIntConstant(m, "HEAD_BLOCK", OPT4_HEAD_BLOCK) < 0 ||
      /* the engine's defaults and limits (include/opt4.h): Python reads them here */
      PyModule_AddIntConstant(m, "DEFAULT_WAIT_TIMEOUT_MS", OPT4_DEFAULT_WAIT_TIMEOUT_MS) < 0 ||
      PyModule_AddIntConstant(m, "DEFAULT_MAX_PROCS", OPT4_DEFAULT_MAX_PROCS) < 0 ||
      PyModule_AddIntConstant(m, "DEFAULT_PREFETCH_THREADS", OPT4_DEFAULT_PREFETCH_THREADS) < 0 ||
      PyModule_AddIntConstant(m, "MAX_PREFETCH_THREADS", OPT4_MAX_PREFETCH_THREADS) < 0 ||
      PyModule_AddIntConstant(m, "DEFAULT_LOOKAHEAD", OPT4_DEFAULT_LOOKAHEAD) < 0)
    goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
