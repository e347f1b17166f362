/*
 * idlist.h - doubly linked lists of ids threaded through one array of links
 * indexed by id, for policies that keep ids in queues (LFU's buckets, SIEVE,
 * S3-FIFO, ARC). An id is on at most one list of a policy at a time, so the
 * lists of one policy share the links. O(1) push, pop and removal, 8 bytes
 * per id, no allocation after init.
 */
#ifndef OPT4_IDLIST_H
#define OPT4_IDLIST_H

#include <stdint.h>

#define OPT4__NIL UINT32_MAX

typedef struct opt4__link {
  uint32_t older, newer;
} opt4__link;

typedef struct opt4__idlist {
  uint32_t oldest, newest; /* OPT4__NIL when empty */
  uint64_t size;
} opt4__idlist;

static inline void opt4__idlist_init(opt4__idlist *l) {
  l->oldest = l->newest = OPT4__NIL;
  l->size = 0;
}

/* Append id at the newest end. */
static inline void opt4__idlist_push(opt4__link *lk, opt4__idlist *l, uint32_t id) {
  lk[id].older = l->newest;
  lk[id].newer = OPT4__NIL;
  if (l->newest != OPT4__NIL) lk[l->newest].newer = id;
  else l->oldest = id;
  l->newest = id;
  l->size++;
}

static inline void opt4__idlist_remove(opt4__link *lk, opt4__idlist *l, uint32_t id) {
  uint32_t o = lk[id].older, n = lk[id].newer;
  if (o != OPT4__NIL) lk[o].newer = n;
  else l->oldest = n;
  if (n != OPT4__NIL) lk[n].older = o;
  else l->newest = o;
  l->size--;
}

/* Remove and return the oldest id; the list must not be empty. */
static inline uint32_t opt4__idlist_pop(opt4__link *lk, opt4__idlist *l) {
  uint32_t id = l->oldest;
  opt4__idlist_remove(lk, l, id);
  return id;
}

#endif /* OPT4_IDLIST_H */
