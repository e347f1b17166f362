/* arc.c - ARC (Megiddo and Modha, "ARC: a self-tuning, low overhead
 * replacement cache", FAST'03, Fig. 4). Two LRU lists of residents, T1 (seen
 * once recently) and T2 (seen at least twice), and two ghost lists of ids
 * recently evicted from them, B1 and B2; a target p for |T1| in [0, c].
 *
 * The paper's p is real; here it is an integer, adapted with floor
 * division, computed while the id is still in its ghost list:
 *   hit in B1: p = min(p + max(1, |B2| / |B1|), c)
 *   hit in B2: p = max(p - max(1, |B1| / |B2|), 0)
 * REPLACE moves T1's LRU id to B1 if T1 is not empty and (|T1| > p, or the
 * request is in B2 and |T1| == p), else T2's LRU id to B2. A complete miss
 * follows case IV: if |T1| + |B1| == c, drop B1's LRU and REPLACE (or, when
 * B1 is empty, evict T1's LRU outright); else, once the four lists hold c
 * or more ids, drop B2's LRU if they hold 2c, and REPLACE. The new id enters
 * T1; a ghost hit enters T2. O(1) per access; the four lists share one
 * array of links. */
#include "idlist.h"
#include "policy.h"

enum { L_NONE = 0, L_T1, L_T2, L_B1, L_B2 };

typedef struct arc_state {
  opt4__link *links;
  uint8_t *list; /* by id: L_* */
  opt4__idlist t1, t2, b1, b2;
  uint64_t p;
} arc_state;

static int arc_init(opt4__policy *p) {
  arc_state *s = opt4__calloc(1, sizeof *s);
  if (s == NULL) return OPT4_ENOMEM;
  p->state = s;
  s->links = opt4__malloc((size_t)p->items * sizeof *s->links);
  s->list = opt4__calloc((size_t)p->items, 1);
  if (s->links == NULL || s->list == NULL) return OPT4_ENOMEM;
  opt4__idlist_init(&s->t1);
  opt4__idlist_init(&s->t2);
  opt4__idlist_init(&s->b1);
  opt4__idlist_init(&s->b2);
  return 0;
}

static void arc_destroy(opt4__policy *p) {
  arc_state *s = p->state;
  if (s == NULL) return;
  opt4__free(s->links, (size_t)p->items * sizeof *s->links);
  opt4__free(s->list, (size_t)p->items);
  opt4__free(s, sizeof *s);
  p->state = NULL;
}

static inline void move_to(arc_state *s, opt4__idlist *from, opt4__idlist *to,
                           uint32_t id, uint8_t tag) {
  opt4__idlist_remove(s->links, from, id);
  opt4__idlist_push(s->links, to, id);
  s->list[id] = tag;
}

/* REPLACE(x, p). The cache is full whenever it is called, so the list it
 * takes from is not empty. */
static inline void arc_replace(arc_state *s, int in_b2) {
  uint64_t n1 = s->t1.size;
  if (n1 > 0 && (n1 > s->p || (in_b2 && n1 == s->p)))
    move_to(s, &s->t1, &s->b1, s->t1.oldest, L_B1);
  else
    move_to(s, &s->t2, &s->b2, s->t2.oldest, L_B2);
}

static inline void drop_oldest(arc_state *s, opt4__idlist *l) {
  s->list[opt4__idlist_pop(s->links, l)] = L_NONE;
}

static inline int arc_access(opt4__policy *p, uint32_t id) {
  arc_state *s = p->state;
  const uint64_t c = p->capacity;
  switch (s->list[id]) {
  case L_T1: move_to(s, &s->t1, &s->t2, id, L_T2); return 1;
  case L_T2:
    if (s->t2.newest != id) move_to(s, &s->t2, &s->t2, id, L_T2);
    return 1;
  case L_B1: {
    uint64_t d = s->b2.size / s->b1.size;
    s->p += d > 1 ? d : 1;
    if (s->p > c) s->p = c;
    arc_replace(s, 0);
    move_to(s, &s->b1, &s->t2, id, L_T2);
    return 0;
  }
  case L_B2: {
    uint64_t d = s->b1.size / s->b2.size;
    if (d < 1) d = 1;
    s->p = s->p > d ? s->p - d : 0;
    arc_replace(s, 1);
    move_to(s, &s->b2, &s->t2, id, L_T2);
    return 0;
  }
  default: break;
  }
  if (s->t1.size + s->b1.size == c) {
    if (s->t1.size < c) {
      drop_oldest(s, &s->b1);
      arc_replace(s, 0);
    } else {
      drop_oldest(s, &s->t1);
    }
  } else {
    uint64_t total = s->t1.size + s->t2.size + s->b1.size + s->b2.size;
    if (total >= c) {
      if (total == 2 * c) drop_oldest(s, &s->b2);
      arc_replace(s, 0);
    }
  }
  opt4__idlist_push(s->links, &s->t1, id);
  s->list[id] = L_T1;
  return 0;
}

OPT4__POLICY_RUN(arc)

const opt4__policy_ops opt4__policy_arc = {"arc", arc_init, NULL, arc_run, arc_destroy};
