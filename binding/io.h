/* io.h - what the binding's I/O files share: the Records and Ranges
 * objects, which the Prefetcher reads through (and keeps open: readers). */
#ifndef OPT4_BINDING_IO_H
#define OPT4_BINDING_IO_H

#include "binding.h"

typedef struct {
  PyObject_HEAD
  opt4_records *r;
  PyObject *path;
  Py_ssize_t readers; /* calls in progress without the GIL */
} RecordsObject;

typedef struct {
  PyObject_HEAD
  opt4_ranges *r;
  Py_ssize_t readers; /* calls in progress without the GIL, and prefetchers */
} RangesObject;

extern PyTypeObject opt4py_RecordsType, opt4py_RangesType;

/* 0 if open, else -1 with ValueError. */
int opt4py_records_check(RecordsObject *self);
int opt4py_ranges_check(RangesObject *self);

#endif
