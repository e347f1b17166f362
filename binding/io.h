/* io.h - what the binding's I/O files share: the Records, Ranges and
 * S3Ranges objects, which the Prefetcher reads through (and keeps open: readers). */
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

typedef struct {
  PyObject_HEAD
  opt4_s3 *r;
  Py_ssize_t readers; /* calls in progress without the GIL, and prefetchers */
} S3RangesObject;

extern PyTypeObject opt4py_RecordsType, opt4py_RangesType, opt4py_S3RangesType;

/* 0 if open, else -1 with ValueError. */
int opt4py_records_check(RecordsObject *self);
int opt4py_ranges_check(RangesObject *self);
int opt4py_s3_check(S3RangesObject *self);

/* The (index, offset, length) rows of Ranges and S3Ranges: items as a
 * C-contiguous int64 buffer, checked (what: "file", "object"). 0 with the
 * view held (release it), or -1 with an exception and no view. */
int opt4py_rows_view(PyObject *items, Py_buffer *view, uint64_t *n, const char *what);
/* Give a reader its items' checksums from sums (None: none), a contiguous
 * uint64 buffer of n entries, through expect (opt4_ranges_expect_sums,
 * opt4_s3_expect_sums). 0, or -1 with an exception set. */
typedef int (*opt4py_expect_sums_fn)(void *reader, const uint64_t *sums, uint64_t n);
int opt4py_give_sums(void *reader, PyObject *sums, uint64_t n, opt4py_expect_sums_fn expect);
/* read(i) of Ranges and S3Ranges: item i as bytes, read with the GIL
 * released, counted in *readers while it reads. */
typedef int (*opt4py_len_fn)(void *reader, uint64_t i, uint64_t *len);
typedef int (*opt4py_read_fn)(void *reader, uint64_t i, void *dst, size_t cap, uint64_t *len);
PyObject *opt4py_read_item(void *reader, Py_ssize_t *readers, PyObject *arg, opt4py_len_fn len_of,
                           opt4py_read_fn read);

#endif
