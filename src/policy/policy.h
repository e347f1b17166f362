/*
 * policy.h - the interface every online cache policy implements.
 *
 * One file per policy (lru.c, fifo.c, ...) defines a const opt4__policy_ops
 * and registers it in registry.c. Item ids are dense in [0, items), so
 * policies index plain arrays by id instead of hashing. A policy holds its
 * state behind p->state and allocates only through opt4__malloc/opt4__free.
 *
 * The exact rule of each policy is written down in docs/policies.md, and the
 * pure-Python reference (python/opt4torch/lab/reference.py) implements the same
 * rules; the tests hold the two to the same hit count on every trace.
 */
#ifndef OPT4_POLICY_H
#define OPT4_POLICY_H

#include "internal.h"

typedef struct opt4__policy opt4__policy;

typedef struct opt4__policy_ops {
  const char *name;
  /* Allocate p->state for p->capacity items over ids [0, p->items). On
   * failure it may leave a partial p->state: destroy() frees what is there. */
  int (*init)(opt4__policy *p);
  /* Optional (NULL for online policies): called once after init with the
   * whole sequence, before the first access, for placements that are decided
   * from the full horizon (freq). 0, OPT4_ENOMEM or OPT4_ERANGE. */
  int (*prepare)(opt4__policy *p, const opt4_seq *seq);
  /* Replay n ids; returns the number of hits. A miss admits the id (or
   * bypasses it, for policies that may decline), evicting as the policy
   * decides. One call per chunk rather than per id, so that each policy's
   * loop can inline its own access step. */
  uint64_t (*run)(opt4__policy *p, const uint32_t *ids, size_t n);
  /* Free p->state (a partial one too). */
  void (*destroy)(opt4__policy *p);
} opt4__policy_ops;

struct opt4__policy {
  const opt4__policy_ops *ops;
  /* In items, 1 <= capacity <= items: a cache that can hold every id never
   * evicts, so a larger capacity is clamped to items when the policy opens
   * and behaves the same, hit for hit. */
  uint64_t capacity;
  uint64_t items;
  uint64_t seed;
  void *state;
};

/* Defines `static uint64_t <prefix>_run(...)` from a `static inline int
 * <prefix>_access(opt4__policy *, uint32_t)` that returns 1 on a hit. */
#define OPT4__POLICY_RUN(prefix)                                              \
  static uint64_t prefix##_run(opt4__policy *p, const uint32_t *ids,          \
                               size_t n) {                                    \
    uint64_t hits = 0;                                                        \
    for (size_t i = 0; i < n; i++) hits += (uint64_t)prefix##_access(p, ids[i]); \
    return hits;                                                              \
  }

/* The registered policy with this name, or NULL. */
const opt4__policy_ops *opt4__policy_find(const char *name);

/* Create and destroy a policy instance by name. */
int opt4__policy_open(const char *name, uint64_t capacity, uint64_t items,
                      uint64_t seed, opt4__policy **out);
void opt4__policy_close(opt4__policy *p);

extern const opt4__policy_ops opt4__policy_lru;
extern const opt4__policy_ops opt4__policy_fifo;
extern const opt4__policy_ops opt4__policy_lfu;
extern const opt4__policy_ops opt4__policy_random;
extern const opt4__policy_ops opt4__policy_clock;
extern const opt4__policy_ops opt4__policy_sieve;
extern const opt4__policy_ops opt4__policy_s3fifo;
extern const opt4__policy_ops opt4__policy_arc;
extern const opt4__policy_ops opt4__policy_static;
extern const opt4__policy_ops opt4__policy_freq;

/* Slots needed: never more than the number of distinct ids. */
static inline uint64_t opt4__policy_slots(const opt4__policy *p) {
  return p->capacity < p->items ? p->capacity : p->items;
}

#endif /* OPT4_POLICY_H */
