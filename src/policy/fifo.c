/* fifo.c - first in, first out: evict the id admitted longest ago; hits do
 * not reorder. A ring of slots plus a residency flag per id. */
#include "policy.h"

typedef struct fifo_state {
  uint32_t *ring;
  uint8_t *resident;
  uint64_t n_slots, head, count;
} fifo_state;

static int fifo_init(opt4__policy *p) {
  fifo_state *s = opt4__calloc(1, sizeof *s);
  if (s == NULL) return OPT4_ENOMEM;
  p->state = s;
  s->n_slots = opt4__policy_slots(p);
  s->ring = opt4__malloc((size_t)s->n_slots * sizeof(uint32_t));
  s->resident = opt4__calloc((size_t)p->items, 1);
  if (s->ring == NULL || s->resident == NULL) return OPT4_ENOMEM;
  return 0;
}

static void fifo_destroy(opt4__policy *p) {
  fifo_state *s = p->state;
  if (s == NULL) return;
  opt4__free(s->ring, (size_t)s->n_slots * sizeof(uint32_t));
  opt4__free(s->resident, (size_t)p->items);
  opt4__free(s, sizeof *s);
  p->state = NULL;
}

static inline int fifo_access(opt4__policy *p, uint32_t id) {
  fifo_state *s = p->state;
  if (s->resident[id]) return 1;
  uint64_t at;
  if (s->count == s->n_slots) {
    at = s->head; /* the oldest admission */
    s->resident[s->ring[at]] = 0;
    s->head = s->head + 1 == s->n_slots ? 0 : s->head + 1;
  } else {
    at = (s->head + s->count) % s->n_slots;
    s->count++;
  }
  s->ring[at] = id;
  s->resident[id] = 1;
  return 0;
}

OPT4__POLICY_RUN(fifo)

const opt4__policy_ops opt4__policy_fifo = {"fifo", fifo_init, NULL, fifo_run,
                                             fifo_destroy};
