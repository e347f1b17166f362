/* binding.h - what the binding's files share. Only the binding includes
 * Python.h; the engine never does. */
#ifndef OPT4_BINDING_H
#define OPT4_BINDING_H

#include <Python.h>

/* Raise the Python exception for engine code rc, with context. Returns NULL. */
PyObject *opt4py_raise(int rc, const char *context);
/* The same for record files: the message is the context and the detail. */
PyObject *opt4py_raise_records(int rc, const char *context);

/* The codec's record format (python/opt4torch/_codec.py FORMAT): the C
 * decoder of the batch path reads it and the prefetcher frames records in
 * it. */
#define OPT4PY_CODEC_FORMAT 2

/* tarframe.c: WebDataset samples laid out as the codec stores the dicts
 * opt4torch.TarShards returns. A layout is made from TarShards' keys and
 * members (with the GIL; NULL with an exception set), then given to
 * opt4py_tar_source with the ranges source of the same shards: the source
 * owns both from then on (also when it fails), and its item i is sample
 * i's record. */
#include "opt4.h"
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

/* io.c: the Records, RecordWriter and Prefetcher types. */
int opt4py_io_init(PyObject *module);

#endif
