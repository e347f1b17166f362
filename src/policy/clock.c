/* clock.c - CLOCK (Corbato, 1968), the one-bit second-chance FIFO: a hit
 * sets the id's reference bit; a new id enters with the bit clear; to evict,
 * the hand passes ids with the bit set, clearing it, and evicts the first
 * id whose bit is clear. The slots form a ring and the hand the oldest
 * position, so passing an id is the same as moving it to the newest end of
 * a FIFO queue: the reference writes it that way (a deque). */
#include "policy.h"

enum { CLOCK_RESIDENT = 1, CLOCK_REF = 2 };

typedef struct clock_state {
  uint32_t *ring;
  uint8_t *flags; /* by id: CLOCK_RESIDENT | CLOCK_REF */
  uint64_t n_slots, count, hand;
} clock_state;

static int clock_init(opt4__policy *p) {
  clock_state *s = opt4__calloc(1, sizeof *s);
  if (s == NULL) return OPT4_ENOMEM;
  p->state = s;
  s->n_slots = opt4__policy_slots(p);
  s->ring = opt4__malloc((size_t)s->n_slots * sizeof(uint32_t));
  s->flags = opt4__calloc((size_t)p->items, 1);
  if (s->ring == NULL || s->flags == NULL) return OPT4_ENOMEM;
  return 0;
}

static void clock_destroy(opt4__policy *p) {
  clock_state *s = p->state;
  if (s == NULL) return;
  opt4__free(s->ring, (size_t)s->n_slots * sizeof(uint32_t));
  opt4__free(s->flags, (size_t)p->items);
  opt4__free(s, sizeof *s);
  p->state = NULL;
}

static inline int clock_access(opt4__policy *p, uint32_t id) {
  clock_state *s = p->state;
  uint8_t f = s->flags[id];
  if (f & CLOCK_RESIDENT) {
    if (!(f & CLOCK_REF)) s->flags[id] = f | CLOCK_REF;
    return 1;
  }
  if (s->count < s->n_slots) {
    /* Filling: the hand stays at slot 0, the oldest. */
    s->ring[s->count++] = id;
  } else {
    uint64_t h = s->hand;
    for (;;) {
      uint32_t cand = s->ring[h];
      if (!(s->flags[cand] & CLOCK_REF)) break;
      s->flags[cand] = CLOCK_RESIDENT;
      h = h + 1 == s->n_slots ? 0 : h + 1;
    }
    s->flags[s->ring[h]] = 0;
    s->ring[h] = id;
    s->hand = h + 1 == s->n_slots ? 0 : h + 1;
  }
  s->flags[id] = CLOCK_RESIDENT;
  return 0;
}

OPT4__POLICY_RUN(clock)

const opt4__policy_ops opt4__policy_clock = {"clock", clock_init, NULL, clock_run,
                                             clock_destroy};
