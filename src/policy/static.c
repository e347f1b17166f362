/* static.c - a static cache, the one CoorDL (Mohan et al., "Analyzing and
 * mitigating data stalls in DNN training", VLDB 2021) calls MinIO: admit
 * misses until the cache is full, then never evict; later misses bypass. It
 * ends up holding the first `capacity` distinct ids of the sequence, each
 * loaded at its first access. */
#include "policy.h"

typedef struct static_state {
  uint8_t *resident;
  uint64_t count;
} static_state;

static int static_init(opt4__policy *p) {
  static_state *s = opt4__calloc(1, sizeof *s);
  if (s == NULL) return OPT4_ENOMEM;
  p->state = s;
  s->resident = opt4__calloc((size_t)p->items, 1);
  if (s->resident == NULL) return OPT4_ENOMEM;
  return 0;
}

static void static_destroy(opt4__policy *p) {
  static_state *s = p->state;
  if (s == NULL) return;
  opt4__free(s->resident, (size_t)p->items);
  opt4__free(s, sizeof *s);
  p->state = NULL;
}

static inline int static_access(opt4__policy *p, uint32_t id) {
  static_state *s = p->state;
  if (s->resident[id]) return 1;
  if (s->count < p->capacity) {
    s->resident[id] = 1;
    s->count++;
  }
  return 0;
}

OPT4__POLICY_RUN(static)

const opt4__policy_ops opt4__policy_static = {"static", static_init, NULL, static_run,
                                              static_destroy};
