/* cluster.c - cluster_place: where the generations of an aggregate plan
 * live across nodes (opt4_cluster_place in opt4.h). The caller (the Python
 * layer, python/opt4torch/planning/cluster.py) owns every array: it passes the
 * readers' nodes and the capacities in, and the kinds and nodes to fill. */
#define PY_SSIZE_T_CLEAN
#include "binding.h"

#include <string.h>

/* A 1-D C-contiguous buffer of unsigned integers of itemsize bytes (0, or
 * -1 with TypeError and nothing held). */
static int get_array(PyObject *obj, Py_ssize_t itemsize, int writable, const char *what, Py_buffer *view) {
  int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
  const char *fmt = view->format ? view->format : "B";
  if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
  int unsigned_fmt = fmt[0] != '\0' && fmt[1] == '\0' && strchr("BHILQ", fmt[0]) != NULL;
  if (view->ndim != 1 || view->itemsize != itemsize || !unsigned_fmt) {
    PyErr_Format(PyExc_TypeError, "%s must be a 1-D contiguous array of %zd-byte unsigned integers "
                 "(got format '%s', itemsize %zd, %d dimensions)", what, itemsize,
                 view->format ? view->format : "B", view->itemsize, view->ndim);
    PyBuffer_Release(view);
    return -1;
  }
  return 0;
}

static PyObject *node_dict(const opt4_cluster_node *s) {
  return Py_BuildValue(
      "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "accesses", (unsigned long long)s->accesses,
      "local_hits", (unsigned long long)s->local_hits, "peer_hits", (unsigned long long)s->peer_hits,
      "admits", (unsigned long long)s->admits, "bypasses", (unsigned long long)s->bypasses,
      "storage_bytes", (unsigned long long)s->storage_bytes, "homed", (unsigned long long)s->homed,
      "peer_items_sent", (unsigned long long)s->peer_items_sent, "peer_items_received",
      (unsigned long long)s->peer_items_received, "peer_bytes_sent", (unsigned long long)s->peer_bytes_sent,
      "peer_bytes_received", (unsigned long long)s->peer_bytes_received, "peak_resident",
      (unsigned long long)s->peak_resident, "late", (unsigned long long)s->late, "warm",
      (unsigned long long)s->warm);
}

static PyObject *py_cluster_place(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"plan",       "node_of",    "capacities", "kinds", "nodes",
                           "item_sizes", "item_bytes", "window_of",  "prefix", NULL};
  PyObject *plan_obj, *node_of_obj, *cap_obj, *kinds_obj, *nodes_obj, *sizes_obj = Py_None,
                                                                        *window_obj = Py_None;
  unsigned long long item_bytes = 0, prefix = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|OKOK", kwlist, &plan_obj, &node_of_obj, &cap_obj,
                                   &kinds_obj, &nodes_obj, &sizes_obj, &item_bytes, &window_obj, &prefix))
    return NULL;
  Py_buffer node_of = {0}, caps = {0}, kinds = {0}, nodes = {0}, sizes = {0}, windows = {0};
  opt4_cluster_node *stats = NULL;
  PyObject *result = NULL, *per_node = NULL;
  opt4_plan *plan = NULL;
  if (get_array(node_of_obj, 4, 0, "node_of", &node_of) < 0) goto leave;
  if (get_array(cap_obj, 8, 0, "capacities", &caps) < 0) goto leave;
  if (get_array(kinds_obj, 1, 1, "kinds", &kinds) < 0) goto leave;
  if (get_array(nodes_obj, 4, 1, "nodes", &nodes) < 0) goto leave;
  if (sizes_obj != Py_None && get_array(sizes_obj, 8, 0, "item_sizes", &sizes) < 0) goto leave;
  if (window_obj != Py_None && get_array(window_obj, 4, 0, "window_of", &windows) < 0) goto leave;
  Py_ssize_t n_nodes = caps.shape[0];
  if (n_nodes < 1 || (uint64_t)n_nodes >= OPT4_MAX_NODES) {
    PyErr_Format(PyExc_ValueError, "between 1 and %llu nodes, got %zd",
                 (unsigned long long)OPT4_MAX_NODES - 1, n_nodes);
    goto leave;
  }
  if (kinds.shape[0] != nodes.shape[0] || node_of.shape[0] < kinds.shape[0] ||
      (window_obj != Py_None && windows.shape[0] < kinds.shape[0])) {
    PyErr_SetString(PyExc_ValueError, "node_of, kinds, nodes and window_of must have one entry per position");
    goto leave;
  }
  plan = opt4py_plan_enter(plan_obj);
  if (plan == NULL) goto leave;
  opt4_plan_info pi;
  opt4_plan_info_get(plan, &pi);
  if (sizes_obj != Py_None && (uint64_t)sizes.shape[0] < pi.items) {
    PyErr_Format(PyExc_ValueError, "item_sizes has %zd entries; the plan has %llu items", sizes.shape[0],
                 (unsigned long long)pi.items);
    goto leave;
  }
  stats = PyMem_Calloc((size_t)n_nodes, sizeof *stats);
  if (stats == NULL) {
    PyErr_NoMemory();
    goto leave;
  }
  opt4_cluster_opts opts;
  memset(&opts, 0, sizeof opts);
  opts.node_of = node_of.buf;
  opts.n_nodes = (uint32_t)n_nodes;
  opts.capacity = caps.buf;
  opts.item_sizes = sizes_obj != Py_None ? sizes.buf : NULL;
  opts.item_bytes = item_bytes;
  opts.window_of = window_obj != Py_None ? windows.buf : NULL;
  opts.prefix = prefix;
  opt4_cluster_info info;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = opt4_cluster_place(plan, &opts, kinds.buf, nodes.buf,
                                                 (uint64_t)kinds.shape[0], stats, &info);
  Py_END_ALLOW_THREADS if (rc != 0) {
    opt4py_raise(rc, "cluster plan");
    goto leave;
  }
  per_node = PyList_New(n_nodes);
  if (per_node == NULL) goto leave;
  for (Py_ssize_t n = 0; n < n_nodes; n++) {
    PyObject *d = node_dict(&stats[n]);
    if (d == NULL) goto leave;
    PyList_SET_ITEM(per_node, n, d);
  }
  result = Py_BuildValue(
      "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}O", "accesses", (unsigned long long)info.accesses,
      "hits", (unsigned long long)info.hits, "local_hits", (unsigned long long)info.local_hits,
      "peer_hits", (unsigned long long)info.peer_hits, "admits", (unsigned long long)info.admits,
      "bypasses", (unsigned long long)info.bypasses, "remote_admits", (unsigned long long)info.remote_admits,
      "storage_bytes", (unsigned long long)info.storage_bytes, "peer_bytes",
      (unsigned long long)info.peer_bytes, "capacity", (unsigned long long)info.capacity, "unplaced",
      (unsigned long long)info.unplaced, "unplaced_hits", (unsigned long long)info.unplaced_hits, "late",
      (unsigned long long)info.late, "warm", (unsigned long long)info.warm, "checksum",
      (unsigned long long)info.checksum, per_node);

leave:
  if (plan != NULL) opt4py_plan_leave(plan_obj);
  Py_XDECREF(per_node);
  PyMem_Free(stats);
  if (node_of.obj != NULL) PyBuffer_Release(&node_of);
  if (caps.obj != NULL) PyBuffer_Release(&caps);
  if (kinds.obj != NULL) PyBuffer_Release(&kinds);
  if (nodes.obj != NULL) PyBuffer_Release(&nodes);
  if (sizes.obj != NULL) PyBuffer_Release(&sizes);
  if (windows.obj != NULL) PyBuffer_Release(&windows);
  return result;
}

static PyMethodDef cluster_functions[] = {
    {"cluster_place", (PyCFunction)(void (*)(void))py_cluster_place, METH_VARARGS | METH_KEYWORDS,
     "cluster_place(plan, node_of, capacities, kinds, nodes, item_sizes=None, item_bytes=0, window_of=None, "
     "prefix=0) -> (info, per_node)"},
    {NULL, NULL, 0, NULL}};

int opt4py_cluster_init(PyObject *m) {
  if (PyModule_AddIntConstant(m, "CLUSTER_LOCAL_HIT", OPT4_CLUSTER_LOCAL_HIT) < 0 ||
      PyModule_AddIntConstant(m, "CLUSTER_PEER_HIT", OPT4_CLUSTER_PEER_HIT) < 0 ||
      PyModule_AddIntConstant(m, "CLUSTER_ADMIT", OPT4_CLUSTER_ADMIT) < 0 ||
      PyModule_AddIntConstant(m, "CLUSTER_BYPASS", OPT4_CLUSTER_BYPASS) < 0 ||
      PyModule_AddIntConstant(m, "CLUSTER_LATE", OPT4_CLUSTER_LATE) < 0 ||
      PyModule_AddIntConstant(m, "CLUSTER_NONE", (long)OPT4_CLUSTER_NONE) < 0)
    return -1;
  return PyModule_AddFunctions(m, cluster_functions);
}
