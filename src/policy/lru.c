/* lru.c - least recently used: evict the id whose last access is oldest.
 * A doubly linked list threaded through arrays indexed by id; the head is the
 * most recent. O(1) per access, 8 bytes per id. */
#include "policy.h"

#include <string.h>

#define NIL UINT32_MAX

typedef struct lru_state {
  uint32_t *prev, *next; /* prev[id] == NIL and id != head: not resident */
  uint8_t *resident;
  uint32_t head, tail;
  uint64_t count;
} lru_state;

static int lru_init(opt4__policy *p) {
  lru_state *s = opt4__calloc(1, sizeof *s);
  if (s == NULL) return OPT4_ENOMEM;
  size_t n = (size_t)p->items;
  s->prev = opt4__malloc(n * sizeof(uint32_t));
  s->next = opt4__malloc(n * sizeof(uint32_t));
  s->resident = opt4__calloc(n, 1);
  s->head = s->tail = NIL;
  p->state = s;
  if (s->prev == NULL || s->next == NULL || s->resident == NULL) return OPT4_ENOMEM;
  return 0;
}

static void lru_destroy(opt4__policy *p) {
  lru_state *s = p->state;
  if (s == NULL) return;
  size_t n = (size_t)p->items;
  opt4__free(s->prev, n * sizeof(uint32_t));
  opt4__free(s->next, n * sizeof(uint32_t));
  opt4__free(s->resident, n);
  opt4__free(s, sizeof *s);
  p->state = NULL;
}

static inline void unlink_id(lru_state *s, uint32_t id) {
  uint32_t pr = s->prev[id], nx = s->next[id];
  if (pr != NIL) s->next[pr] = nx; else s->head = nx;
  if (nx != NIL) s->prev[nx] = pr; else s->tail = pr;
}

static inline void push_front(lru_state *s, uint32_t id) {
  s->prev[id] = NIL;
  s->next[id] = s->head;
  if (s->head != NIL) s->prev[s->head] = id; else s->tail = id;
  s->head = id;
}

static inline int lru_access(opt4__policy *p, uint32_t id) {
  lru_state *s = p->state;
  if (s->resident[id]) {
    if (s->head != id) {
      unlink_id(s, id);
      push_front(s, id);
    }
    return 1;
  }
  if (s->count == p->capacity) {
    uint32_t victim = s->tail;
    unlink_id(s, victim);
    s->resident[victim] = 0;
  } else {
    s->count++;
  }
  push_front(s, id);
  s->resident[id] = 1;
  return 0;
}

OPT4__POLICY_RUN(lru)

const opt4__policy_ops opt4__policy_lru = {"lru", lru_init, NULL, lru_run,
                                             lru_destroy};
