/*
 * belady.c - Belady's OPT decisions for a whole sequence, in three passes over
 * one uint32 array (ops) that holds, in turn, next uses, decisions, and ops.
 *
 * Pass 1 (backward): ops[t] = next(t), the next position with the same id, or
 *   OPT4__NEVER; also the last position of every id.
 * Pass 2 (forward, decisions): keeps the resident ids in a key set keyed by
 *   next use (keyset.h). The id at t is resident iff key t is present; the
 *   farthest resident id is the largest key, which the pass keeps at hand and
 *   walks down with a predecessor query after each eviction (usually within
 *   one word). No slots are needed to decide, only
 *   how many are free, so this pass touches nothing but the key set. It writes
 *   a code into ops[t]: HIT, BYPASS, ADMIT into a free slot, or, for an ADMIT
 *   that evicts, the victim's key (a position > t, so it cannot clash with the
 *   three codes at the top of the range).
 * Pass 3 (forward, slots): replays the codes with the free-slot stack and a
 *   slot per id. An eviction's slot is slot_of[seq[key]], two dependent random
 *   loads; since every victim is known from the codes ahead, both loads are
 *   prefetched in a two-stage pipeline, and the pass runs at streaming speed.
 *
 * Memory: ops (4 bytes per access) plus the key set (1 bit per access) plus
 * 8 bytes per id, and the plan's copy of the ids (4 bytes per access) is made
 * by the caller after the key set is freed: at most 8 bytes per access plus
 * O(items) at any moment.
 *
 * Every pass is written once per input dtype (OPT4__BELADY_IMPL) so that the
 * inner loops read a plain typed array.
 */
#include "internal.h"
#include "keyset.h"

#include <string.h>

/* Pass 2 codes; every other value is the key of an evicted id. */
#define CODE_ADMIT_FREE (UINT32_MAX - 3)
#define CODE_HIT (UINT32_MAX - 2)
#define CODE_BYPASS (UINT32_MAX - 1)

/* Prefetch distance, in accesses. Pass 3 looks 2 * AHEAD ahead for the first
 * stage of a victim lookup and AHEAD for the second. */
#define AHEAD 16

typedef struct id_state {
  uint32_t slot; /* pass 1: last position seen; pass 3: slot while resident */
  uint32_t last; /* last position of the id in the sequence */
} id_state;

typedef struct belady_ctx {
  uint64_t T, N, C;
  volatile uint64_t *progress;
  int bypass;
  uint32_t *ops;
  id_state *ids;
  uint32_t *stack; /* free slots, pass 3 */
  uint64_t n_slots;
  opt4__keyset ks;
  uint64_t hits, admits, bypasses, distinct;
} belady_ctx;

static int range_error(uint64_t raw, int is_signed, uint64_t t, uint64_t N) {
  if (is_signed)
    return opt4__fail(OPT4_ERANGE, "id %lld at position %llu is outside [0, %llu)",
                      (long long)(int64_t)raw, (unsigned long long)t,
                      (unsigned long long)N);
  return opt4__fail(OPT4_ERANGE, "id %llu at position %llu is outside [0, %llu)",
                    (unsigned long long)raw, (unsigned long long)t,
                    (unsigned long long)N);
}

/* Publish how far the build is, every 65536 positions of a pass. */
#define REPORT(c, pass, done)                                                  \
  do {                                                                         \
    if (OPT4__UNLIKELY(((done)&0xFFFF) == 0) && (c)->progress != NULL)         \
      __atomic_store_n((c)->progress, (uint64_t)(pass) * (c)->T + (done),      \
                       __ATOMIC_RELAXED);                                      \
  } while (0)

/* Pass 2 does not depend on the dtype: it reads only ops and the key set. */
static void decide(belady_ctx *c) {
  uint32_t *restrict ops = c->ops;
  opt4__keyset *ks = &c->ks;
  const uint64_t T = c->T;
  const int bypass = c->bypass;
  uint64_t free_slots = c->n_slots;
  uint64_t hits = 0, admits = 0, bypasses = 0;
  /* The largest key, kept up to date so that most evictions need no search:
   * inserts raise it, and removing it walks to its predecessor, usually in
   * the same word. NO_MAX when the set is empty. */
  const uint64_t NO_MAX = UINT64_MAX;
  uint64_t max = NO_MAX;
  for (uint64_t t = 0; t < T; t++) {
    if (t + AHEAD < T) {
      uint32_t nx_ahead = ops[t + AHEAD];
      if (nx_ahead != OPT4__NEVER) OPT4__PREFETCH(&ks->level[0][nx_ahead >> 6]);
    }
    REPORT(c, 1, t);
    const uint32_t nx = ops[t];
    if (opt4__ks_take(ks, t)) {
      if (t == max) max = NO_MAX; /* it was the only key: t is the smallest */
      if (nx != OPT4__NEVER) {
        opt4__ks_insert(ks, nx);
        if (max == NO_MAX || nx > max) max = nx;
      } else {
        free_slots++; /* dead from now on: its slot is free */
      }
      ops[t] = CODE_HIT;
      hits++;
      continue;
    }
    if (nx == OPT4__NEVER && bypass) {
      ops[t] = CODE_BYPASS;
      bypasses++;
      continue;
    }
    uint32_t code;
    if (free_slots > 0) {
      free_slots--;
      code = CODE_ADMIT_FREE;
    } else {
      uint64_t far = max;
      if (bypass && far < nx) { /* needed later than every resident id */
        ops[t] = CODE_BYPASS;
        bypasses++;
        continue;
      }
      opt4__ks_remove(ks, far);
      if (!opt4__ks_pred(ks, far, &max)) max = NO_MAX;
      code = (uint32_t)far;
    }
    ops[t] = code;
    admits++;
    if (nx != OPT4__NEVER) {
      opt4__ks_insert(ks, nx);
      if (max == NO_MAX || nx > max) max = nx;
    } else {
      free_slots++; /* opt-nobypass admitted a dead id */
    }
  }
  c->hits = hits;
  c->admits = admits;
  c->bypasses = bypasses;
}

#define OPT4__BELADY_IMPL(SUFFIX, T_, IS_SIGNED)                               \
  static int next_use_##SUFFIX(belady_ctx *c, const T_ *seq) {                \
    uint32_t *restrict ops = c->ops;                                           \
    id_state *restrict ids = c->ids;                                           \
    const uint64_t N = c->N;                                                   \
    uint64_t distinct = 0;                                                     \
    for (uint64_t t = c->T; t-- > 0;) {                                        \
      if (t >= AHEAD) {                                                        \
        uint64_t ahead = (uint64_t)seq[t - AHEAD];                             \
        OPT4__PREFETCH(&ids[ahead < N ? ahead : 0]);                           \
      }                                                                        \
      REPORT(c, 0, c->T - t);                                                  \
      uint64_t x = (uint64_t)seq[t];                                           \
      if (OPT4__UNLIKELY(x >= N)) return range_error(x, IS_SIGNED, t, N);      \
      uint32_t nx = ids[x].slot;                                               \
      if (nx == OPT4__NEVER) {                                                 \
        distinct++;                                                            \
        ids[x].last = (uint32_t)t;                                             \
      }                                                                        \
      ops[t] = nx;                                                             \
      ids[x].slot = (uint32_t)t;                                               \
    }                                                                          \
    c->distinct = distinct;                                                    \
    return 0;                                                                  \
  }                                                                            \
                                                                               \
  static void assign_slots_##SUFFIX(belady_ctx *c, const T_ *seq) {           \
    uint32_t *restrict ops = c->ops;                                           \
    id_state *restrict ids = c->ids;                                           \
    uint32_t *restrict stack = c->stack;                                       \
    const uint64_t T = c->T;                                                   \
    uint64_t top = c->n_slots;                                                 \
    for (uint64_t t = 0; t < T; t++) {                                         \
      if (t + 2 * AHEAD < T) {                                                 \
        uint32_t c2 = ops[t + 2 * AHEAD];                                      \
        if (c2 < CODE_ADMIT_FREE) OPT4__PREFETCH(&seq[c2]);                    \
      }                                                                        \
      if (t + AHEAD < T) {                                                     \
        uint32_t c1 = ops[t + AHEAD];                                          \
        OPT4__PREFETCH(&ids[(uint64_t)seq[t + AHEAD]]);                        \
        if (c1 < CODE_ADMIT_FREE) OPT4__PREFETCH(&ids[(uint64_t)seq[c1]]);     \
      }                                                                        \
      REPORT(c, 2, t);                                                         \
      const uint32_t x = (uint32_t)seq[t];                                     \
      const uint32_t code = ops[t];                                            \
      uint32_t s;                                                              \
      if (code == CODE_HIT) {                                                  \
        s = ids[x].slot;                                                       \
        if (ids[x].last == t) stack[top++] = s;                                \
        ops[t] = OPT4_OP_MAKE(OPT4_OP_HIT, s);                                 \
        continue;                                                              \
      }                                                                        \
      if (code == CODE_BYPASS) {                                               \
        ops[t] = OPT4_OP_MAKE(OPT4_OP_BYPASS, 0);                              \
        continue;                                                              \
      }                                                                        \
      if (code == CODE_ADMIT_FREE)                                             \
        s = stack[--top];                                                      \
      else                                                                     \
        s = ids[(uint32_t)seq[code]].slot;                                     \
      ops[t] = OPT4_OP_MAKE(OPT4_OP_ADMIT, s);                                 \
      if (ids[x].last == t)                                                    \
        stack[top++] = s;                                                      \
      else                                                                     \
        ids[x].slot = s;                                                       \
    }                                                                          \
  }

OPT4__BELADY_IMPL(i32, int32_t, 1)
OPT4__BELADY_IMPL(i64, int64_t, 1)
OPT4__BELADY_IMPL(u32, uint32_t, 0)
OPT4__BELADY_IMPL(u64, uint64_t, 0)

static int next_use(belady_ctx *c, const opt4_seq *seq) {
  switch (seq->dtype) {
  case OPT4_I32: return next_use_i32(c, seq->data);
  case OPT4_I64: return next_use_i64(c, seq->data);
  case OPT4_U32: return next_use_u32(c, seq->data);
  default: return next_use_u64(c, seq->data);
  }
}

static void assign_slots(belady_ctx *c, const opt4_seq *seq) {
  switch (seq->dtype) {
  case OPT4_I32: assign_slots_i32(c, seq->data); break;
  case OPT4_I64: assign_slots_i64(c, seq->data); break;
  case OPT4_U32: assign_slots_u32(c, seq->data); break;
  default: assign_slots_u64(c, seq->data); break;
  }
}

int opt4__belady(const opt4_seq *seq, const opt4_plan_opts *opts, uint32_t *ops,
                 opt4_plan_info *info) {
  belady_ctx c;
  memset(&c, 0, sizeof c);
  c.T = seq->len;
  c.N = seq->items;
  c.C = opts->capacity;
  c.bypass = (opts->flags & OPT4_PLAN_NOBYPASS) == 0;
  c.ops = ops;
  c.progress = opts->progress;
  /* Never more than N ids are resident, so a larger capacity needs no more
   * than N slots; they are handed out lowest first. */
  c.n_slots = c.C < c.N ? c.C : c.N;
  const size_t ids_bytes = (size_t)c.N * sizeof(id_state);
  int rc = 0;

  opt4__advise_huge(ops, (size_t)c.T * sizeof(uint32_t));
  c.ids = opt4__malloc(ids_bytes);
  if (c.ids == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for %llu ids", (unsigned long long)c.N);
    goto leave;
  }
  opt4__advise_huge(c.ids, ids_bytes);
  memset(c.ids, 0xFF, ids_bytes); /* slot = last seen = OPT4__NEVER */
  rc = next_use(&c, seq);
  if (rc != 0) goto leave;

  if (opt4__ks_init(&c.ks, c.T) != 0) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for the key set of %llu accesses",
                    (unsigned long long)c.T);
    goto leave;
  }
  opt4__advise_huge(c.ks.words, c.ks.n_words * sizeof(uint64_t));
  decide(&c);
  opt4__ks_free(&c.ks);

  c.stack = opt4__malloc((size_t)c.n_slots * sizeof(uint32_t));
  if (c.stack == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for %llu slots",
                    (unsigned long long)c.n_slots);
    goto leave;
  }
  for (uint64_t i = 0; i < c.n_slots; i++)
    c.stack[i] = (uint32_t)(c.n_slots - 1 - i); /* slot 0 on top */
  assign_slots(&c, seq);

  if (c.progress != NULL) __atomic_store_n(c.progress, 3 * c.T, __ATOMIC_RELAXED);
  info->hits = c.hits;
  info->admits = c.admits;
  info->bypasses = c.bypasses;
  info->misses = c.admits + c.bypasses;
  info->compulsory = c.distinct;

leave:
  if (c.ks.words != NULL) opt4__ks_free(&c.ks);
  opt4__free(c.ids, ids_bytes);
  opt4__free(c.stack, (size_t)c.n_slots * sizeof(uint32_t));
  return rc;
}
