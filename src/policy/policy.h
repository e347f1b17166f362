/*
 * policy.h - the interface every online cache policy implements.
 *
 * One file per policy (lru.c, fifo.c, ...) defines a const opt4__policy_ops
 * and registers it in registry.c. Item ids are dense in [0, items), so
 * policies index plain arrays by id instead of hashing. A policy holds its
 * state behind p->state and allocates only through opt4__malloc/opt4__free.
 */
#ifndef OPT4_POLICY_H
#define OPT4_POLICY_H

#include "internal.h"

typedef struct opt4__policy opt4__policy;

typedef struct opt4__policy_ops {
  const char *name;
  /* Allocate p->state for p->capacity items over ids [0, p->items). */
  int (*init)(opt4__policy *p);
  /* One access; returns 1 on a hit, 0 on a miss (the id is then admitted,
   * evicting as the policy decides). */
  int (*access)(opt4__policy *p, uint32_t id);
  /* Free p->state. */
  void (*destroy)(opt4__policy *p);
} opt4__policy_ops;

struct opt4__policy {
  const opt4__policy_ops *ops;
  uint64_t capacity; /* in items, >= 1 */
  uint64_t items;
  uint64_t seed;
  void *state;
};

/* The registered policy with this name, or NULL. */
const opt4__policy_ops *opt4__policy_find(const char *name);

/* Create and destroy a policy instance by name. */
int opt4__policy_open(const char *name, uint64_t capacity, uint64_t items,
                      uint64_t seed, opt4__policy **out);
void opt4__policy_close(opt4__policy *p);

extern const opt4__policy_ops opt4__policy_lru;
extern const opt4__policy_ops opt4__policy_fifo;

/* Slots needed: never more than the number of distinct ids. */
static inline uint64_t opt4__policy_slots(const opt4__policy *p) {
  return p->capacity < p->items ? p->capacity : p->items;
}

#endif /* OPT4_POLICY_H */
