/* random.c - evict a uniformly random resident id. The residents sit in an
 * array of slots; on a miss in a full cache the victim is slot
 * splitmix64() % capacity and the new id takes its slot. The generator and the
 * rule are the reference's (reference.py SplitMix64), so a seed gives the
 * same hits in both. */
#include "policy.h"

typedef struct random_state {
  uint32_t *slots;
  uint8_t *resident; /* by id */
  uint64_t n_slots, count, rng;
} random_state;

/* splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
 * generators", OOPSLA 2014). */
static inline uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int random_init(opt4__policy *p) {
  random_state *s = opt4__calloc(1, sizeof *s);
  if (s == NULL) return OPT4_ENOMEM;
  p->state = s;
  s->n_slots = opt4__policy_slots(p);
  s->rng = p->seed;
  s->slots = opt4__malloc((size_t)s->n_slots * sizeof(uint32_t));
  s->resident = opt4__calloc((size_t)p->items, 1);
  if (s->slots == NULL || s->resident == NULL) return OPT4_ENOMEM;
  return 0;
}

static void random_destroy(opt4__policy *p) {
  random_state *s = p->state;
  if (s == NULL) return;
  opt4__free(s->slots, (size_t)s->n_slots * sizeof(uint32_t));
  opt4__free(s->resident, (size_t)p->items);
  opt4__free(s, sizeof *s);
  p->state = NULL;
}

static inline int random_access(opt4__policy *p, uint32_t id) {
  random_state *s = p->state;
  if (s->resident[id]) return 1;
  uint64_t at;
  if (s->count == s->n_slots) {
    at = splitmix64(&s->rng) % s->n_slots;
    s->resident[s->slots[at]] = 0;
  } else {
    at = s->count++;
  }
  s->slots[at] = id;
  s->resident[id] = 1;
  return 0;
}

OPT4__POLICY_RUN(random)

const opt4__policy_ops opt4__policy_random = {"random", random_init, NULL, random_run,
                                              random_destroy};
