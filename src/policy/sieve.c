/* sieve.c - SIEVE (Zhang, Yang, Yue, Vigfusson and Rashmi, "SIEVE is simpler
 * than LRU", NSDI'24): a FIFO queue that a hit never reorders; a hit sets
 * the id's visited bit. The hand starts at the oldest id and walks towards
 * newer ones, clearing visited bits and wrapping from the newest back to the
 * oldest; it evicts the first unvisited id and then rests on the next newer
 * one (or, if the victim was the newest, on the oldest at the next
 * eviction). Amortised O(1): each step of the hand clears a bit some hit
 * set. */
#include "idlist.h"
#include "policy.h"

enum { SIEVE_RESIDENT = 1, SIEVE_VISITED = 2 };

typedef struct sieve_state {
  opt4__link *links;
  uint8_t *flags; /* by id: SIEVE_RESIDENT | SIEVE_VISITED */
  opt4__idlist queue;
  uint32_t hand; /* OPT4__NIL: start at the oldest */
} sieve_state;

static int sieve_init(opt4__policy *p) {
  sieve_state *s = opt4__calloc(1, sizeof *s);
  if (s == NULL) return OPT4_ENOMEM;
  p->state = s;
  s->links = opt4__malloc((size_t)p->items * sizeof *s->links);
  s->flags = opt4__calloc((size_t)p->items, 1);
  if (s->links == NULL || s->flags == NULL) return OPT4_ENOMEM;
  opt4__idlist_init(&s->queue);
  s->hand = OPT4__NIL;
  return 0;
}

static void sieve_destroy(opt4__policy *p) {
  sieve_state *s = p->state;
  if (s == NULL) return;
  opt4__free(s->links, (size_t)p->items * sizeof *s->links);
  opt4__free(s->flags, (size_t)p->items);
  opt4__free(s, sizeof *s);
  p->state = NULL;
}

static inline int sieve_access(opt4__policy *p, uint32_t id) {
  sieve_state *s = p->state;
  uint8_t f = s->flags[id];
  if (f & SIEVE_RESIDENT) {
    if (!(f & SIEVE_VISITED)) s->flags[id] = f | SIEVE_VISITED;
    return 1;
  }
  if (s->queue.size == p->capacity) {
    uint32_t o = s->hand == OPT4__NIL ? s->queue.oldest : s->hand;
    while (s->flags[o] & SIEVE_VISITED) {
      s->flags[o] = SIEVE_RESIDENT;
      o = s->links[o].newer == OPT4__NIL ? s->queue.oldest : s->links[o].newer;
    }
    s->hand = s->links[o].newer;
    opt4__idlist_remove(s->links, &s->queue, o);
    s->flags[o] = 0;
  }
  opt4__idlist_push(s->links, &s->queue, id);
  s->flags[id] = SIEVE_RESIDENT;
  return 0;
}

OPT4__POLICY_RUN(sieve)

const opt4__policy_ops opt4__policy_sieve = {"sieve", sieve_init, NULL, sieve_run,
                                             sieve_destroy};
