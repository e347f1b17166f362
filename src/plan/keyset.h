/*
 * keyset.h - a set of distinct integer keys in [0, universe) as a 64-ary
 * hierarchical bitmap.
 *
 * Why this fits Belady: the keys are the next-use positions of resident items.
 * Two resident items never share a next use (a position holds one id), so the
 * keys are distinct, "the farthest item" is the largest key, and "is the item
 * at position t resident" is "is key t present". Every operation touches one
 * word per level: ceil(log64(universe)) words, 4 for 10 M positions.
 *
 * Level 0 has one bit per key; a bit at level l + 1 is set when its 64-bit
 * word at level l is non-zero. Memory is universe / 8 bytes plus 1/63 of that.
 */
#ifndef OPT4_KEYSET_H
#define OPT4_KEYSET_H

#include "internal.h"

#define OPT4__KS_MAX_LEVELS 7 /* 64^6 > 2^32 keys */

typedef struct opt4__keyset {
  uint64_t *words; /* all levels, level 0 first */
  size_t n_words;
  uint64_t *level[OPT4__KS_MAX_LEVELS];
  int n_levels;
} opt4__keyset;

static inline int opt4__ks_init(opt4__keyset *ks, uint64_t universe) {
  size_t counts[OPT4__KS_MAX_LEVELS];
  size_t total = 0;
  uint64_t n = universe == 0 ? 1 : universe;
  int levels = 0;
  do {
    n = (n + 63) / 64;
    counts[levels++] = (size_t)n;
    total += (size_t)n;
  } while (n > 1);
  ks->words = opt4__calloc(total, sizeof(uint64_t));
  if (ks->words == NULL) return OPT4_ENOMEM;
  ks->n_words = total;
  ks->n_levels = levels;
  uint64_t *p = ks->words;
  for (int l = 0; l < levels; l++) {
    ks->level[l] = p;
    p += counts[l];
  }
  return 0;
}

static inline void opt4__ks_free(opt4__keyset *ks) {
  opt4__free(ks->words, ks->n_words * sizeof(uint64_t));
  ks->words = NULL;
}

static inline void opt4__ks_insert(opt4__keyset *ks, uint64_t key) {
  for (int l = 0; l < ks->n_levels; l++) {
    uint64_t *w = &ks->level[l][key >> 6];
    uint64_t old = *w;
    *w = old | ((uint64_t)1 << (key & 63));
    if (old != 0) return; /* the levels above already mark this word */
    key >>= 6;
  }
}

static inline void opt4__ks_remove(opt4__keyset *ks, uint64_t key) {
  for (int l = 0; l < ks->n_levels; l++) {
    uint64_t *w = &ks->level[l][key >> 6];
    *w &= ~((uint64_t)1 << (key & 63));
    if (*w != 0) return; /* the word is still non-empty above */
    key >>= 6;
  }
}

/* Remove key if present; returns whether it was. */
static inline int opt4__ks_take(opt4__keyset *ks, uint64_t key) {
  uint64_t *w = &ks->level[0][key >> 6];
  uint64_t bit = (uint64_t)1 << (key & 63);
  if ((*w & bit) == 0) return 0;
  *w &= ~bit;
  if (*w == 0) opt4__ks_remove(ks, key); /* clear the summary bits above */
  return 1;
}

static inline int opt4__ks_empty(const opt4__keyset *ks) {
  return ks->level[ks->n_levels - 1][0] == 0;
}

/* The largest key; the set must not be empty. */
static inline uint64_t opt4__ks_max(const opt4__keyset *ks) {
  uint64_t idx = 0;
  for (int l = ks->n_levels - 1; l >= 0; l--) {
    uint64_t w = ks->level[l][idx];
    idx = (idx << 6) | (uint64_t)(63 - __builtin_clzll(w));
  }
  return idx;
}

/* The largest key below key; returns 0 if there is none. */
static inline int opt4__ks_pred(const opt4__keyset *ks, uint64_t key, uint64_t *out) {
  int l = 0;
  /* Climb until a word holds a set bit below the position we came from. */
  for (; l < ks->n_levels; l++) {
    uint64_t w = ks->level[l][key >> 6] & (((uint64_t)1 << (key & 63)) - 1);
    if (w != 0) {
      key = (key & ~(uint64_t)63) | (uint64_t)(63 - __builtin_clzll(w));
      break;
    }
    if ((key >> 6) == 0 && l == ks->n_levels - 1) return 0;
    key >>= 6;
  }
  if (l == ks->n_levels) return 0;
  /* Descend taking the highest bit at each level. */
  for (; l > 0; l--) {
    uint64_t w = ks->level[l - 1][key];
    key = (key << 6) | (uint64_t)(63 - __builtin_clzll(w));
  }
  *out = key;
  return 1;
}

#endif /* OPT4_KEYSET_H */
