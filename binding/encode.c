/* encode.c - the codec's encoder for plain values, in C: encode_plain(obj)
 * returns the parts python/opt4torch/pool/codec.py's encode(obj) returns, for
 * an object made only of None, bool, int (64-bit), float, str, bytes,
 * bytearray and exact tuples, lists and dicts of them, and None for any
 * other object, which the Python codec then encodes (it owns the rest of
 * the format, the refusals and their messages).
 *
 * Why: a miss that a prefetch thread or a worker loads is encoded before it
 * is stored, and a dataset's usual item, (bytes, label) or a dict of fields,
 * took about 10 us of Python (a writer object, struct packs, bytearray
 * appends) against about 1 us here, on every miss.
 *
 * The parts are the Python encoder's, part for part (tests compare them
 * with hypothesis): header bytes objects, and each bytes or bytearray
 * payload as the object itself (not copied; the pool gathers the parts), a
 * header part cut where a payload starts. A payload is padded so that it
 * starts at a multiple of REC_ALIGN from the record's start (rec_bytes_head,
 * shared with the tar layout). Nothing here calls back into Python (exact
 * types only, and str's UTF-8 comes from the object), so a dict or list
 * cannot change while it is walked. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "decode.h"

/* Containers nested deeper than this are left to the Python codec, which
 * refuses past its own limit with its message. */
#define ENC_MAX_DEPTH 32

typedef struct enc {
  uint8_t *head; /* the header bytes since the last payload */
  size_t len, cap;
  uint64_t pos;    /* bytes of the record so far, payloads included */
  PyObject *parts; /* list */
} enc;

enum { ENC_OK = 0, ENC_ERROR = -1, ENC_DECLINE = -2 };

static uint8_t *enc_room(enc *e, size_t n) {
  if (e->len + n > e->cap) {
    size_t cap = e->cap ? e->cap : 64;
    while (cap < e->len + n) cap *= 2;
    uint8_t *p = PyMem_Realloc(e->head, cap);
    if (p == NULL) {
      PyErr_NoMemory();
      return NULL;
    }
    e->head = p;
    e->cap = cap;
  }
  uint8_t *p = e->head + e->len;
  e->len += n;
  e->pos += n;
  return p;
}

/* The header so far as a part of its own; the head starts again empty. */
static int enc_cut(enc *e) {
  PyObject *b = PyBytes_FromStringAndSize((const char *)e->head, (Py_ssize_t)e->len);
  int rc = b == NULL ? -1 : PyList_Append(e->parts, b);
  Py_XDECREF(b);
  e->len = 0;
  return rc;
}

/* A tag and a u64 length, then n bytes from s (a str node). */
static int enc_str(enc *e, const char *s, Py_ssize_t n) {
  uint8_t *p = enc_room(e, 9 + (size_t)n);
  if (p == NULL) return ENC_ERROR;
  p[0] = REC_STR;
  rec_le64(p + 1, (uint64_t)n);
  memcpy(p + 9, s, (size_t)n);
  return ENC_OK;
}

static int enc_node(enc *e, PyObject *obj, int depth) {
  PyTypeObject *t = Py_TYPE(obj);
  uint8_t *p;
  if (obj == Py_None || obj == Py_True || obj == Py_False) {
    if ((p = enc_room(e, 1)) == NULL) return ENC_ERROR;
    p[0] = obj == Py_None ? REC_NONE : obj == Py_True ? REC_TRUE : REC_FALSE;
    return ENC_OK;
  }
  if (t == &PyLong_Type) {
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow) return ENC_DECLINE; /* a big int: the codec's decimal node */
    if (v == -1 && PyErr_Occurred()) return ENC_ERROR;
    if ((p = enc_room(e, 9)) == NULL) return ENC_ERROR;
    p[0] = REC_INT;
    rec_le64(p + 1, (uint64_t)v);
    return ENC_OK;
  }
  if (t == &PyFloat_Type) {
    if ((p = enc_room(e, 9)) == NULL) return ENC_ERROR;
    p[0] = REC_FLOAT;
    return PyFloat_Pack8(PyFloat_AS_DOUBLE(obj), (char *)p + 1, 1) < 0 ? ENC_ERROR : ENC_OK;
  }
  if (t == &PyUnicode_Type) {
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(obj, &n);
    if (s != NULL) return enc_str(e, s, n);
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return ENC_ERROR;
    PyErr_Clear(); /* lone surrogates: encoded as the codec does, with surrogatepass */
    PyObject *b = PyUnicode_AsEncodedString(obj, "utf-8", "surrogatepass");
    if (b == NULL) return ENC_ERROR;
    int rc = enc_str(e, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
    Py_DECREF(b);
    return rc;
  }
  if (t == &PyBytes_Type || t == &PyByteArray_Type) {
    uint64_t n = t == &PyBytes_Type ? (uint64_t)PyBytes_GET_SIZE(obj) : (uint64_t)PyByteArray_GET_SIZE(obj);
    size_t head = rec_bytes_head(NULL, e->pos, n);
    if ((p = enc_room(e, head)) == NULL) return ENC_ERROR;
    rec_bytes_head(p, e->pos - head, n);
    if (t == &PyByteArray_Type) p[0] = REC_BYTEARRAY;
    if (enc_cut(e) < 0) return ENC_ERROR;
    e->pos += n;
    return n == 0 || PyList_Append(e->parts, obj) == 0 ? ENC_OK : ENC_ERROR;
  }
  int is_tuple = t == &PyTuple_Type, is_list = t == &PyList_Type, is_dict = t == &PyDict_Type;
  if (!is_tuple && !is_list && !is_dict) return ENC_DECLINE;
  if (depth >= ENC_MAX_DEPTH) return ENC_DECLINE;
  Py_ssize_t n = is_dict ? PyDict_GET_SIZE(obj) : is_tuple ? PyTuple_GET_SIZE(obj) : PyList_GET_SIZE(obj);
  if ((uint64_t)n > UINT32_MAX) return ENC_DECLINE;
  if ((p = enc_room(e, 5)) == NULL) return ENC_ERROR;
  p[0] = is_dict ? REC_DICT : is_tuple ? REC_TUPLE : REC_LIST;
  rec_le32(p + 1, (uint32_t)n);
  if (is_dict) {
    Py_ssize_t i = 0;
    PyObject *k, *v;
    while (PyDict_Next(obj, &i, &k, &v)) {
      int rc = enc_node(e, k, depth + 1);
      if (rc == ENC_OK) rc = enc_node(e, v, depth + 1);
      if (rc != ENC_OK) return rc;
    }
    return ENC_OK;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    int rc = enc_node(e, is_tuple ? PyTuple_GET_ITEM(obj, i) : PyList_GET_ITEM(obj, i), depth + 1);
    if (rc != ENC_OK) return rc;
  }
  return ENC_OK;
}

/* encode_plain(obj) -> list of parts, or None when obj holds anything but
 * plain values (see the top). */
static PyObject *py_encode_plain(PyObject *Py_UNUSED(m), PyObject *obj) {
  enc e = {NULL, 0, 0, 0, PyList_New(0)};
  if (e.parts == NULL) return NULL;
  uint8_t *p = enc_room(&e, 3);
  int rc = p == NULL ? ENC_ERROR : ENC_OK;
  if (rc == ENC_OK) {
    p[0] = 'O';
    p[1] = '4';
    p[2] = REC_FORMAT;
    rc = enc_node(&e, obj, 0);
  }
  if (rc == ENC_OK && e.len > 0 && enc_cut(&e) < 0) rc = ENC_ERROR;
  PyMem_Free(e.head);
  if (rc != ENC_OK) {
    Py_CLEAR(e.parts);
    if (rc == ENC_DECLINE) Py_RETURN_NONE;
  }
  return e.parts;
}

static PyMethodDef encode_functions[] = {
    {"encode_plain", py_encode_plain, METH_O,
     "encode_plain(obj) -> list of parts, or None: the codec's encode(obj) in C, for an object of "
     "plain values only (None, bool, int, float, str, bytes, bytearray and tuples, lists and dicts of "
     "them); None for anything else, which the Python codec encodes"},
    {NULL, NULL, 0, NULL}};

int opt4py_encode_init(PyObject *module) { return PyModule_AddFunctions(module, encode_functions); }
