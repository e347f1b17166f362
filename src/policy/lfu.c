/* lfu.c - least frequently used: evict the resident id with the fewest
 * accesses since its admission; among those, the one accessed least
 * recently.
 *
 * O(1) per access with frequency buckets (Shah, Mitra and Matani, "An O(1)
 * algorithm for implementing the LFU cache eviction scheme", 2010): one
 * bucket per count that some resident id has, linked in increasing count,
 * each holding its ids oldest access first. An access moves an id to the
 * newest end of the next count's bucket, and it is then the most recent
 * access of all, so every bucket stays ordered by last access and the victim
 * is the oldest id of the lowest bucket. */
#include "idlist.h"
#include "policy.h"

#include <string.h>

typedef struct lfu_bucket {
  uint32_t count;
  uint32_t lower, higher; /* neighbouring buckets, or OPT4__NIL */
  opt4__idlist ids;
} lfu_bucket;

typedef struct lfu_state {
  opt4__link *links;   /* by id, within its bucket */
  uint32_t *bucket_of; /* by id: its bucket, OPT4__NIL if not resident */
  lfu_bucket *buckets; /* pool of n_slots + 1: at most one per resident id,
                          plus the one a hit may open before closing its own */
  uint32_t *free_buckets;
  uint64_t n_buckets, n_free, resident;
  uint32_t lowest;
} lfu_state;

static int lfu_init(opt4__policy *p) {
  lfu_state *s = opt4__calloc(1, sizeof *s);
  if (s == NULL) return OPT4_ENOMEM;
  p->state = s;
  size_t n = (size_t)p->items;
  s->n_buckets = opt4__policy_slots(p) + 1;
  s->links = opt4__malloc(n * sizeof *s->links);
  s->bucket_of = opt4__malloc(n * sizeof *s->bucket_of);
  s->buckets = opt4__malloc((size_t)s->n_buckets * sizeof *s->buckets);
  s->free_buckets = opt4__malloc((size_t)s->n_buckets * sizeof *s->free_buckets);
  if (s->links == NULL || s->bucket_of == NULL || s->buckets == NULL ||
      s->free_buckets == NULL)
    return OPT4_ENOMEM;
  memset(s->bucket_of, 0xFF, n * sizeof *s->bucket_of);
  for (uint64_t i = 0; i < s->n_buckets; i++)
    s->free_buckets[i] = (uint32_t)(s->n_buckets - 1 - i);
  s->n_free = s->n_buckets;
  s->lowest = OPT4__NIL;
  return 0;
}

static void lfu_destroy(opt4__policy *p) {
  lfu_state *s = p->state;
  if (s == NULL) return;
  size_t n = (size_t)p->items;
  opt4__free(s->links, n * sizeof *s->links);
  opt4__free(s->bucket_of, n * sizeof *s->bucket_of);
  opt4__free(s->buckets, (size_t)s->n_buckets * sizeof *s->buckets);
  opt4__free(s->free_buckets, (size_t)s->n_buckets * sizeof *s->free_buckets);
  opt4__free(s, sizeof *s);
  p->state = NULL;
}

/* A new empty bucket for count, linked right above `below` (or lowest). */
static inline uint32_t bucket_open(lfu_state *s, uint32_t count, uint32_t below) {
  uint32_t b = s->free_buckets[--s->n_free];
  lfu_bucket *nb = &s->buckets[b];
  nb->count = count;
  opt4__idlist_init(&nb->ids);
  nb->lower = below;
  nb->higher = below == OPT4__NIL ? s->lowest : s->buckets[below].higher;
  if (nb->higher != OPT4__NIL) s->buckets[nb->higher].lower = b;
  if (below == OPT4__NIL) s->lowest = b;
  else s->buckets[below].higher = b;
  return b;
}

static inline void bucket_close_if_empty(lfu_state *s, uint32_t b) {
  lfu_bucket *ob = &s->buckets[b];
  if (ob->ids.size != 0) return;
  if (ob->lower != OPT4__NIL) s->buckets[ob->lower].higher = ob->higher;
  else s->lowest = ob->higher;
  if (ob->higher != OPT4__NIL) s->buckets[ob->higher].lower = ob->lower;
  s->free_buckets[s->n_free++] = b;
}

static inline int lfu_access(opt4__policy *p, uint32_t id) {
  lfu_state *s = p->state;
  uint32_t b = s->bucket_of[id];
  if (b != OPT4__NIL) {
    uint32_t want = s->buckets[b].count + 1;
    uint32_t nb = s->buckets[b].higher;
    if (nb == OPT4__NIL || s->buckets[nb].count != want) nb = bucket_open(s, want, b);
    opt4__idlist_remove(s->links, &s->buckets[b].ids, id);
    opt4__idlist_push(s->links, &s->buckets[nb].ids, id);
    s->bucket_of[id] = nb;
    bucket_close_if_empty(s, b);
    return 1;
  }
  if (s->resident == p->capacity) {
    uint32_t low = s->lowest;
    uint32_t victim = opt4__idlist_pop(s->links, &s->buckets[low].ids);
    s->bucket_of[victim] = OPT4__NIL;
    bucket_close_if_empty(s, low);
  } else {
    s->resident++;
  }
  uint32_t one = s->lowest;
  if (one == OPT4__NIL || s->buckets[one].count != 1) one = bucket_open(s, 1, OPT4__NIL);
  opt4__idlist_push(s->links, &s->buckets[one].ids, id);
  s->bucket_of[id] = one;
  return 0;
}

OPT4__POLICY_RUN(lfu)

const opt4__policy_ops opt4__policy_lfu = {"lfu", lfu_init, NULL, lfu_run, lfu_destroy};
