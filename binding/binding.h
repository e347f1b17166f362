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

/* io.c: the Records, RecordWriter and Prefetcher types. */
int opt4py_io_init(PyObject *module);

#endif
