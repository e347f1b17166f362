/* seq.c - checking and converting borrowed sequences. */
#include "internal.h"

#include <string.h>

int opt4__seq_check(const opt4_seq *seq) {
  if (seq == NULL) return opt4__fail(OPT4_EINVAL, "sequence is NULL");
  if (seq->dtype < OPT4_I32 || seq->dtype > OPT4_U64)
    return opt4__fail(OPT4_EINVAL, "unknown dtype %d", (int)seq->dtype);
  if (seq->len > 0 && seq->data == NULL)
    return opt4__fail(OPT4_EINVAL, "sequence data is NULL");
  if (seq->items == 0)
    return opt4__fail(OPT4_EINVAL, "items must be at least 1");
  if (seq->items > OPT4_MAX_ITEMS)
    return opt4__fail(OPT4_ETOOBIG, "items = %llu exceeds the limit %llu",
                      (unsigned long long)seq->items,
                      (unsigned long long)OPT4_MAX_ITEMS);
  if (seq->len > OPT4_MAX_ACCESSES)
    return opt4__fail(OPT4_ETOOBIG, "%llu accesses exceed the limit %llu",
                      (unsigned long long)seq->len,
                      (unsigned long long)OPT4_MAX_ACCESSES);
  return 0;
}

static int out_of_range(const opt4_seq *seq, uint64_t t) {
  uint64_t raw = opt4__seq_get(seq, t);
  if (seq->dtype == OPT4_I32 || seq->dtype == OPT4_I64)
    return opt4__fail(OPT4_ERANGE,
                      "id %lld at position %llu is outside [0, %llu)",
                      (long long)(int64_t)raw, (unsigned long long)t,
                      (unsigned long long)seq->items);
  return opt4__fail(OPT4_ERANGE, "id %llu at position %llu is outside [0, %llu)",
                    (unsigned long long)raw, (unsigned long long)t,
                    (unsigned long long)seq->items);
}

/* One loop per dtype so the compiler sees a plain typed loop. Signed ids are
 * compared as unsigned, which turns negatives into huge values. */
#define OPT4__TO_U32(T_)                                                 \
  do {                                                                   \
    const T_ *src = (const T_ *)seq->data + first;                       \
    for (uint64_t i = 0; i < count; i++) {                               \
      uint64_t v = (uint64_t)src[i];                                     \
      if (OPT4__UNLIKELY(v >= items)) return out_of_range(seq, first + i); \
      dst[i] = (uint32_t)v;                                              \
    }                                                                    \
  } while (0)

int opt4__seq_to_u32(const opt4_seq *seq, uint64_t first, uint64_t count,
                     uint32_t *dst) {
  const uint64_t items = seq->items;
  if (count == 0) return 0; /* an empty sequence may have no data at all */
  switch (seq->dtype) {
  case OPT4_I32: OPT4__TO_U32(int32_t); break;
  case OPT4_I64: OPT4__TO_U32(int64_t); break;
  case OPT4_U32: OPT4__TO_U32(uint32_t); break;
  case OPT4_U64: OPT4__TO_U32(uint64_t); break;
  }
  return 0;
}

int opt4_fingerprint(const opt4_seq *seq, uint64_t *out) {
  opt4__clear_detail();
  if (out == NULL) return opt4__fail(OPT4_EINVAL, "out is NULL");
  int rc = opt4__seq_check(seq);
  if (rc != 0) return rc;
  /* Hash canonical little-endian uint32 ids, converted in chunks. */
  enum { CHUNK = 4096 };
  uint32_t buf[CHUNK];
  opt4__hasher *h = opt4__hasher_new();
  if (h == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for the hasher");
  for (uint64_t base = 0; base < seq->len; base += CHUNK) {
    uint64_t n = seq->len - base < CHUNK ? seq->len - base : CHUNK;
    rc = opt4__seq_to_u32(seq, base, n, buf);
    if (rc != 0) break;
    opt4__hasher_update(h, buf, (size_t)n * sizeof(uint32_t));
  }
  if (rc == 0) *out = opt4__hasher_digest(h);
  opt4__hasher_free(h);
  return rc;
}
