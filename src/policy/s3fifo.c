/* s3fifo.c - S3-FIFO (Yang, Zhang, Qiu, Yue and Rashmi, "FIFO queues are all
 * you need for cache eviction", SOSP'23, Algorithm 1): a small FIFO S for new
 * ids, a main FIFO M, and a ghost FIFO G of ids recently evicted from S.
 *
 *   - A hit adds 1 to the id's frequency, capped at 3 (two bits).
 *   - A miss first evicts one id if the cache is full, then admits the new
 *     id with frequency 0: into M if its id is in G (it leaves G), else S.
 *   - Evict: if 10 * |S| >= capacity (S holds at least 10 % of the cache,
 *     i.e. ceil(capacity / 10) ids), S's oldest id is examined: with a
 *     frequency above 1 it moves to M's newest end with frequency 0 and the
 *     next is examined; otherwise it is evicted and enters G, which keeps the
 *     newest capacity - ceil(capacity / 10) ids (the size of M). If S is
 *     below 10 % or empties without evicting, M's oldest id is examined: with
 *     a frequency above 0 it goes to M's newest end with frequency - 1,
 *     otherwise it is evicted.
 *
 * Unlike the paper's pseudo-code, moving an id from S to M never evicts from
 * M by itself: every miss in a full cache evicts exactly one id (as
 * libCacheSim's S3FIFO.c does). All three queues share one array of links;
 * amortised O(1) per access, since each reinsertion spends a hit. */
#include "idlist.h"
#include "policy.h"

enum { Q_NONE = 0, Q_SMALL = 1, Q_MAIN = 2, Q_GHOST = 3 };
#define QUEUE_OF(b) ((b)&3u)
#define FREQ_OF(b) ((b) >> 2)
#define PACK(q, f) ((uint8_t)((q) | ((f) << 2)))

typedef struct s3fifo_state {
  opt4__link *links;
  uint8_t *state; /* by id: queue in bits 0-1, frequency in bits 2-3 */
  opt4__idlist small, main, ghost;
  uint64_t ghost_cap;
} s3fifo_state;

static int s3fifo_init(opt4__policy *p) {
  s3fifo_state *s = opt4__calloc(1, sizeof *s);
  if (s == NULL) return OPT4_ENOMEM;
  p->state = s;
  s->links = opt4__malloc((size_t)p->items * sizeof *s->links);
  s->state = opt4__calloc((size_t)p->items, 1);
  if (s->links == NULL || s->state == NULL) return OPT4_ENOMEM;
  opt4__idlist_init(&s->small);
  opt4__idlist_init(&s->main);
  opt4__idlist_init(&s->ghost);
  uint64_t small_target = p->capacity / 10 + (p->capacity % 10 != 0);
  s->ghost_cap = p->capacity - small_target;
  return 0;
}

static void s3fifo_destroy(opt4__policy *p) {
  s3fifo_state *s = p->state;
  if (s == NULL) return;
  opt4__free(s->links, (size_t)p->items * sizeof *s->links);
  opt4__free(s->state, (size_t)p->items);
  opt4__free(s, sizeof *s);
  p->state = NULL;
}

static void s3fifo_evict(opt4__policy *p, s3fifo_state *s) {
  if (10 * s->small.size >= p->capacity) {
    while (s->small.size > 0) {
      uint32_t t = opt4__idlist_pop(s->links, &s->small);
      if (FREQ_OF(s->state[t]) > 1) {
        opt4__idlist_push(s->links, &s->main, t);
        s->state[t] = PACK(Q_MAIN, 0u);
        continue;
      }
      opt4__idlist_push(s->links, &s->ghost, t);
      s->state[t] = Q_GHOST;
      if (s->ghost.size > s->ghost_cap)
        s->state[opt4__idlist_pop(s->links, &s->ghost)] = Q_NONE;
      return;
    }
  }
  for (;;) {
    uint32_t t = opt4__idlist_pop(s->links, &s->main);
    unsigned f = FREQ_OF(s->state[t]);
    if (f == 0) {
      s->state[t] = Q_NONE;
      return;
    }
    opt4__idlist_push(s->links, &s->main, t);
    s->state[t] = PACK(Q_MAIN, f - 1);
  }
}

static inline int s3fifo_access(opt4__policy *p, uint32_t id) {
  s3fifo_state *s = p->state;
  unsigned b = s->state[id];
  unsigned q = QUEUE_OF(b);
  if (q == Q_SMALL || q == Q_MAIN) {
    if (FREQ_OF(b) < 3) s->state[id] = (uint8_t)(b + 4);
    return 1;
  }
  if (s->small.size + s->main.size == p->capacity) {
    s3fifo_evict(p, s);
    q = QUEUE_OF(s->state[id]); /* the eviction may have aged id out of G */
  }
  if (q == Q_GHOST) {
    opt4__idlist_remove(s->links, &s->ghost, id);
    opt4__idlist_push(s->links, &s->main, id);
    s->state[id] = PACK(Q_MAIN, 0u);
  } else {
    opt4__idlist_push(s->links, &s->small, id);
    s->state[id] = PACK(Q_SMALL, 0u);
  }
  return 0;
}

OPT4__POLICY_RUN(s3fifo)

const opt4__policy_ops opt4__policy_s3fifo = {"s3fifo", s3fifo_init, NULL, s3fifo_run,
                                              s3fifo_destroy};
