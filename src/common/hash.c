/* hash.c - XXH3-64 for sequence fingerprints and plan-file checksums. The
 * vendored xxHash is compiled into this one file only. */
#include "internal.h"

#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include "xxhash.h"

struct opt4__hasher {
  XXH3_state_t state;
};

opt4__hasher *opt4__hasher_new(void) {
  opt4__hasher *h = opt4__malloc(sizeof *h);
  if (h == NULL) return NULL;
  XXH3_64bits_reset(&h->state);
  return h;
}

void opt4__hasher_update(opt4__hasher *h, const void *data, size_t len) {
  XXH3_64bits_update(&h->state, data, len);
}

uint64_t opt4__hasher_digest(const opt4__hasher *h) {
  return XXH3_64bits_digest(&h->state);
}

void opt4__hasher_free(opt4__hasher *h) { opt4__free(h, sizeof *h); }

uint64_t opt4__hash64(const void *data, size_t len) {
  return XXH3_64bits(data, len);
}

uint64_t opt4_checksum(const void *data, size_t len) { return XXH3_64bits(data, len); }
