/* binding.h - what the binding's files share. Only the binding includes
 * Python.h; the engine never does. */
#ifndef OPT4_BINDING_H
#define OPT4_BINDING_H

#include <Python.h>

/* _engine.c: the module (its exceptions, the simulator, memory counters),
 * made of the files below, one per Python type: plan.c, pool.c,
 * records.c, outfile.c, ranges.c, prefetcher.c, and decode.c (the batch
 * path's decoder), tarframe.c and pysource.c (sources of the binding's own).
 *
 * A sequence from the buffer protocol: 1-D, C-contiguous, integers of 4 or
 * 8 bytes (0, or -1 with TypeError; release view after use). */
#include "opt4.h"
int opt4py_get_seq(PyObject *obj, uint64_t items, Py_buffer *view, opt4_seq *seq);

/* plan.c: the Plan and Array types and the functions that make plans.
 * opt4py_plan_enter gives the engine plan of an open Plan (borrowed; NULL
 * with an exception for anything else) and keeps the Plan from closing
 * until opt4py_plan_leave, for a call made with the GIL released. */
int opt4py_plan_init(PyObject *module);
opt4_plan *opt4py_plan_enter(PyObject *obj);
void opt4py_plan_leave(PyObject *obj);

/* pool.c: the Pool type and the functions that make, attach, list and
 * remove pools. */
int opt4py_pool_init(PyObject *module);

/* Raise the Python exception for engine code rc, with context. Returns NULL. */
PyObject *opt4py_raise(int rc, const char *context);
/* The same for record files: the message is the context and the detail. */
PyObject *opt4py_raise_records(int rc, const char *context);
/* For a read of a file or an object read in place: a cut short, changed or
 * corrupt one raises Opt4IOError (an OSError), not PlanFileError. */
PyObject *opt4py_raise_read(int rc, const char *context);

/* The codec's record format (python/opt4torch/pool/codec.py FORMAT): the C
 * decoder of the batch path reads it and the prefetcher frames records in
 * it. */
#define OPT4PY_CODEC_FORMAT 2

/* tarframe.c: WebDataset samples laid out as the codec stores the dicts
 * opt4torch.TarShards returns. A layout is made from TarShards' keys and
 * members (with the GIL; NULL with an exception set), then given to
 * opt4py_tar_source with the ranges source of the same shards: the source
 * owns both from then on (also when it fails), and its item i is sample
 * i's record. */
typedef struct opt4py_tar_layout opt4py_tar_layout;
opt4py_tar_layout *opt4py_tar_layout_new(PyObject *keys, PyObject *members);
void opt4py_tar_layout_free(opt4py_tar_layout *layout);
int opt4py_tar_source(opt4_source *ranges, opt4py_tar_layout *layout, opt4_source **out);

/* pysource.c: a source whose item i is load(i) (a sequence of buffers, or
 * None to leave it to the worker), called by the C prefetch threads with
 * the GIL; it holds a reference to load until it is closed (with the GIL).
 * And the early parking of the prefetch threads that Python's before-fork
 * hook needs (pysource.c says why). */
int opt4py_py_source(PyObject *load, uint64_t items, uint64_t max_size, opt4_source **out);
PyObject *opt4py_prefetchers_park(PyObject *module, PyObject *ignored);
PyObject *opt4py_prefetchers_resume(PyObject *module, PyObject *ignored);

/* The I/O types, a file each (io.h has what they share): records.c
 * (Records, RecordWriter), outfile.c (OutFile), ranges.c (Ranges, the tar
 * indexer), prefetcher.c (Prefetcher). */
int opt4py_records_init(PyObject *module);
int opt4py_outfile_init(PyObject *module);
int opt4py_ranges_init(PyObject *module);
int opt4py_s3_init(PyObject *module);
int opt4py_prefetcher_init(PyObject *module);

/* cluster.c: cluster_place, the generations of an aggregate plan placed
 * over nodes (opt4_cluster_place), and its CLUSTER_* constants. */
int opt4py_cluster_init(PyObject *module);
/* forkfix.c: renews CPython's HEAD_LOCK in a forked child where Python
 * does not (3.8 to 3.11.7, gh-112275); FORK_HEAD_LOCK_FIX says if it is on. */
int opt4py_forkfix_init(PyObject *module);
/* encode.c: encode_plain, the codec's encoder in C for plain values. */
int opt4py_encode_init(PyObject *module);

#endif
