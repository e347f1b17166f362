/* tarframe.c - WebDataset samples of tar shards as the pool stores them: a
 * source over the shards' byte ranges whose item i is the codec's record of
 * what opt4torch.TarShards returns for sample i, {"__key__": key, field:
 * bytes, ...}, so the C prefetch threads can load tar samples as they load
 * record files and image folders, with no Python on the path.
 *
 * A sample is one range of its shard (its members' data with the tar
 * headers and padding between them, docs/sources.md). A read reads that
 * range through the ranges source (the same reader, O_DIRECT, emulated
 * latency and read counters as ds[i]) into a buffer of its own, then writes
 * the record into the destination: the dict's header, the key, and for each
 * member its field name and a bytes node whose payload is copied from the
 * range. One copy of the sample's bytes, against a read that takes
 * milliseconds.
 *
 * The record is byte for byte what python/opt4torch/pool/codec.py writes for
 * the dict (tests compare them): "O4", the format byte, T_DICT and a u32
 * count, then key and value nodes in the dict's order ("__key__" first, the
 * fields in member order). A str node is T_STR, a u64 length and its UTF-8
 * bytes (encoded with surrogatepass, as the codec does: keys and fields
 * from the indexer are decoded with surrogateescape); a bytes node is
 * T_BYTES, a u64 length, a u64 pad and pad zero bytes so that the payload
 * starts at a multiple of 16 from the record's start, then the payload.
 *
 * A sample with a field named "__key__" (a member "x.__key__") is not laid
 * out here: in the dict ds[i] returns, that field replaces the key, and its
 * read returns OPT4_EINVAL, so the worker that needs it loads it (the
 * prefetcher counts it as an error). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "opt4.h"
#include "binding.h"
#include "decode.h"
static const char KEY_NAME[] = "__key__";

typedef struct tar_field {
  uint64_t name_off, name_len; /* in names */
  uint64_t off, size;          /* the member's data in the sample's range */
} tar_field;

typedef struct tar_sample {
  uint64_t key_off, key_len;
  uint64_t first, n; /* its fields: fields[first .. first + n) */
  uint64_t encoded;  /* the record's length; 0 for a sample not laid out here */
} tar_sample;

struct opt4py_tar_layout {
  opt4_source *inner; /* the ranges source: item i is sample i's range */
  tar_sample *samples;
  uint64_t n_samples;
  tar_field *fields;
  char *names;
  uint64_t max_encoded;
};

/* A str node at p (when p is not NULL); returns its length. */
static uint64_t put_str(uint8_t *p, const char *s, uint64_t n) {
  if (p != NULL) {
    p[0] = REC_STR;
    rec_le64(p + 1, n);
    memcpy(p + 9, s, (size_t)n);
  }
  return 9 + n;
}

/* A bytes node at p (when p is not NULL), pos bytes into the record, its
 * payload from data; returns its length. */
static uint64_t put_bytes(uint8_t *p, uint64_t pos, const uint8_t *data, uint64_t n) {
  size_t head = rec_bytes_head(p, pos, n);
  if (p != NULL) memcpy(p + head, data, (size_t)n);
  return head + n;
}

/* Sample s's record written to out (NULL: only measured) from its range;
 * returns its length. */
static uint64_t lay_out(const opt4py_tar_layout *l, const tar_sample *s, const uint8_t *range, uint8_t *out) {
  uint64_t pos = 0;
  if (out != NULL) {
    out[0] = 'O';
    out[1] = '4';
    out[2] = REC_FORMAT;
    out[3] = REC_DICT;
    rec_le32(out + 4, (uint32_t)(s->n + 1));
  }
  pos = 8;
  pos += put_str(out ? out + pos : NULL, KEY_NAME, sizeof KEY_NAME - 1);
  pos += put_str(out ? out + pos : NULL, l->names + s->key_off, s->key_len);
  for (uint64_t k = 0; k < s->n; k++) {
    const tar_field *f = &l->fields[s->first + k];
    pos += put_str(out ? out + pos : NULL, l->names + f->name_off, f->name_len);
    pos += put_bytes(out ? out + pos : NULL, pos, range ? range + f->off : NULL, f->size);
  }
  return pos;
}

/* ---- building the layout (with the GIL) ---- */

/* Appends s's UTF-8 bytes (surrogatepass) to *names; their place in *off, *len. */
static int add_name(PyObject *s, char **names, uint64_t *used, uint64_t *cap, uint64_t *off, uint64_t *len) {
  if (!PyUnicode_Check(s)) {
    PyErr_Format(PyExc_TypeError, "tar sample keys and fields must be str, not %s", Py_TYPE(s)->tp_name);
    return -1;
  }
  PyObject *b = PyUnicode_AsEncodedString(s, "utf-8", "surrogatepass");
  if (b == NULL) return -1;
  uint64_t n = (uint64_t)PyBytes_GET_SIZE(b);
  if (*used + n > *cap) {
    uint64_t c = *cap ? *cap : 4096;
    while (c < *used + n) c *= 2;
    char *p = PyMem_RawRealloc(*names, (size_t)c);
    if (p == NULL) {
      Py_DECREF(b);
      PyErr_NoMemory();
      return -1;
    }
    *names = p;
    *cap = c;
  }
  memcpy(*names + *used, PyBytes_AS_STRING(b), (size_t)n);
  *off = *used;
  *len = n;
  *used += n;
  Py_DECREF(b);
  return 0;
}

void opt4py_tar_layout_free(opt4py_tar_layout *l) {
  if (l == NULL) return;
  PyMem_RawFree(l->samples);
  PyMem_RawFree(l->fields);
  PyMem_RawFree(l->names);
  PyMem_RawFree(l);
}

opt4py_tar_layout *opt4py_tar_layout_new(PyObject *keys, PyObject *members) {
  PyObject *fk = PySequence_Fast(keys, "keys must be a sequence of str");
  PyObject *fm = fk ? PySequence_Fast(members, "members must be a sequence of (field, offset, size) tuples") : NULL;
  opt4py_tar_layout *l = NULL;
  char *names = NULL;
  uint64_t used = 0, cap = 0, n_fields = 0, fields_cap = 0;
  if (fm == NULL) goto fail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fk);
  if (PySequence_Fast_GET_SIZE(fm) != n) {
    PyErr_Format(PyExc_ValueError, "%zd keys but %zd member lists", n, PySequence_Fast_GET_SIZE(fm));
    goto fail;
  }
  l = PyMem_RawCalloc(1, sizeof *l);
  if (l == NULL || (l->samples = PyMem_RawCalloc((size_t)(n ? n : 1), sizeof *l->samples)) == NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  l->n_samples = (uint64_t)n;
  for (Py_ssize_t i = 0; i < n; i++) {
    tar_sample *s = &l->samples[i];
    if (add_name(PySequence_Fast_GET_ITEM(fk, i), &names, &used, &cap, &s->key_off, &s->key_len) < 0) goto fail;
    PyObject *ms = PySequence_Fast(PySequence_Fast_GET_ITEM(fm, i), "a sample's members must be a sequence");
    if (ms == NULL) goto fail;
    s->first = n_fields;
    s->n = (uint64_t)PySequence_Fast_GET_SIZE(ms);
    int has_key_field = 0;
    for (uint64_t k = 0; k < s->n; k++) {
      if (n_fields == fields_cap) {
        uint64_t c = fields_cap ? 2 * fields_cap : 1024;
        tar_field *p = PyMem_RawRealloc(l->fields, (size_t)c * sizeof *p);
        if (p == NULL) {
          Py_DECREF(ms);
          PyErr_NoMemory();
          goto fail;
        }
        l->fields = p;
        fields_cap = c;
      }
      tar_field *f = &l->fields[n_fields];
      PyObject *field;
      unsigned long long off, size;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(ms, k), "UKK", &field, &off, &size) ||
          add_name(field, &names, &used, &cap, &f->name_off, &f->name_len) < 0) {
        Py_DECREF(ms);
        goto fail;
      }
      f->off = off;
      f->size = size;
      has_key_field |= f->name_len == sizeof KEY_NAME - 1 && memcmp(names + f->name_off, KEY_NAME, f->name_len) == 0;
      n_fields++;
    }
    Py_DECREF(ms);
    if (s->n + 1 > UINT32_MAX) {
      PyErr_Format(PyExc_ValueError, "tar sample %zd has %llu fields", i, (unsigned long long)s->n);
      goto fail;
    }
    s->encoded = 0;
    if (!has_key_field) {
      l->names = names; /* lay_out reads names through l */
      s->encoded = lay_out(l, s, NULL, NULL);
      if (s->encoded > l->max_encoded) l->max_encoded = s->encoded;
    }
  }
  l->names = names;
  Py_DECREF(fk);
  Py_DECREF(fm);
  return l;
fail:
  if (l != NULL) l->names = names;
  else PyMem_RawFree(names);
  opt4py_tar_layout_free(l);
  Py_XDECREF(fk);
  Py_XDECREF(fm);
  return NULL;
}

/* ---- the source ---- */

static int tar_count(void *state, uint64_t *items) {
  *items = ((const opt4py_tar_layout *)state)->n_samples;
  return 0;
}

static int tar_size_of(void *state, uint64_t item, uint64_t *len) {
  const opt4py_tar_layout *l = state;
  if (item >= l->n_samples) return OPT4_ERANGE;
  *len = l->samples[item].encoded;
  return 0;
}

static int tar_max_size(void *state, uint64_t *len) {
  *len = ((const opt4py_tar_layout *)state)->max_encoded;
  return 0;
}

/* One read: the range into a buffer of its own, then the record into dst. */
static int tar_read(const opt4py_tar_layout *l, opt4_source_read *rd) {
  const tar_sample *s = &l->samples[rd->item];
  if (s->encoded == 0) return OPT4_EINVAL; /* not laid out here: the worker loads it */
  rd->len = s->encoded;
  if (s->encoded > rd->cap) return OPT4_EITEMSIZE;
  uint64_t range_len = 0, got = 0;
  int rc = opt4_source_size_of(l->inner, rd->item, &range_len);
  if (rc != 0) return rc;
  for (uint64_t k = 0; k < s->n; k++) {
    const tar_field *f = &l->fields[s->first + k];
    if (f->off > range_len || f->size > range_len - f->off) return OPT4_EINVAL; /* the index disagrees */
  }
  uint8_t *buf = malloc(range_len ? (size_t)range_len : 1);
  if (buf == NULL) return OPT4_ENOMEM;
  rc = opt4_source_read_one(l->inner, rd->item, buf, (size_t)range_len, &got);
  if (rc == 0 && got != range_len) rc = OPT4_ETRUNCATED;
  if (rc == 0) lay_out(l, s, buf, rd->dst);
  free(buf);
  return rc;
}

static int tar_submit(void *state, opt4_source_read *reads, size_t n) {
  for (size_t i = 0; i < n; i++) reads[i].status = tar_read(state, &reads[i]);
  return 0;
}

static void tar_close(void *state) {
  opt4py_tar_layout *l = state;
  opt4_source_close(l->inner);
  opt4py_tar_layout_free(l);
}

int opt4py_tar_source(opt4_source *inner, opt4py_tar_layout *layout, opt4_source **out) {
  static const opt4_source_ops ops = {
      .version = OPT4_SOURCE_OPS_VERSION,
      .name = "tar samples",
      .count = tar_count,
      .size_of = tar_size_of,
      .max_size = tar_max_size,
      .submit = tar_submit,
      .close = tar_close,
  };
  int rc = opt4_source_count(inner) == layout->n_samples ? 0 : OPT4_EINVAL;
  if (rc != 0) {
    opt4_source_close(inner);
    opt4py_tar_layout_free(layout);
    return rc;
  }
  layout->inner = inner;
  return opt4_source_create(&ops, layout, out); /* closes both when it fails */
}
