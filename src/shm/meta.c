/*
 * meta.c - laying out a plan in the meta segment: the owner builds it once
 * at creation (segment.c), and everyone reads it from then on.
 *
 * Per position, its item (seq) and its kind and generation (rt); per
 * generation, its ADMIT, its reads, its last read and its page list, each
 * page with its predecessor there; the BYPASS positions in order; and, on
 * request, the occurrence index. runtime.c's header comment, "Generations",
 * says what these mean to the protocol; layout.h gives the segment's shape,
 * and check.c what an attacher checks of it.
 */
#include "layout.h"

#include <string.h>

static uint64_t align8(uint64_t v) { return (v + 63) & ~(uint64_t)63; }

int opt4__meta_size(const opt4_plan *plan, int occurrences, uint64_t *size, uint64_t *gens,
                    uint64_t *list_len) {
  const opt4_plan_info *in = &plan->info;
  if (in->admits > RT_MAX_GENS)
    return opt4__fail(OPT4_ETOOBIG, "the plan has %llu admissions; the pool supports %u",
                      (unsigned long long)in->admits, RT_MAX_GENS);
  if (in->bypasses > RT_MAX_GENS)
    return opt4__fail(OPT4_ETOOBIG, "the plan has %llu bypasses; the pool supports %u",
                      (unsigned long long)in->bypasses, RT_MAX_GENS);
  *gens = in->admits;
  /* One page per generation in item-capacity plans; a list in sized ones. */
  *list_len = (in->flags & OPT4_PLAN_SIZED) ? plan->pages_len : in->admits;
  uint64_t off = align8(sizeof(meta_header));
  off = align8(off + in->accesses * 4); /* seq */
  off = align8(off + in->accesses * 4); /* rt */
  off = align8(off + *gens * sizeof(gen_rec));
  off = align8(off + *list_len * sizeof(list_ent));
  off = align8(off + in->bypasses * 4); /* bpos */
  if (occurrences) {
    off = align8(off + (in->items + 1) * 8);
    off = align8(off + in->accesses * 4);
  }
  *size = off;
  return 0;
}

int opt4__meta_build(const opt4_plan *plan, int occurrences, uint8_t *meta, uint64_t size,
                     uint64_t gens, uint64_t list_len, uint64_t pages) {
  const opt4_plan_info *in = &plan->info;
  const uint64_t slots = in->slots;
  if (pages < slots)
    return opt4__fail(OPT4_EINVAL, "a pool of %llu pages for a plan that uses %llu",
                      (unsigned long long)pages, (unsigned long long)slots);
  /* The generation in each of the plan's slots while walking it (to find a
   * HIT's generation in an item plan); each physical page's generation, and
   * the free pages, oldest first (a ring), for the page assignment below. */
  uint32_t *slot_gen = opt4__malloc((size_t)(slots ? slots : 1) * sizeof(uint32_t));
  uint32_t *page_gen = opt4__malloc((size_t)(pages ? pages : 1) * sizeof(uint32_t));
  uint32_t *ring = opt4__malloc((size_t)(pages ? pages : 1) * sizeof(uint32_t));
  int rc = 0;
  if (slot_gen == NULL || page_gen == NULL || ring == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory to lay out %llu pages", (unsigned long long)pages);
    goto leave;
  }
  for (uint64_t s = 0; s < slots; s++) slot_gen[s] = NO_GEN;
  meta_header *mh = (meta_header *)(void *)meta;
  mh->layout = POOL_LAYOUT;
  mh->header_size = sizeof *mh;
  mh->size = size;
  mh->fingerprint = in->fingerprint;
  mh->accesses = in->accesses;
  mh->items = in->items;
  mh->generations = gens;
  mh->list_len = list_len;
  mh->seq_off = align8(sizeof *mh);
  mh->rt_off = align8(mh->seq_off + in->accesses * 4);
  mh->gens_off = align8(mh->rt_off + in->accesses * 4);
  mh->list_off = align8(mh->gens_off + gens * sizeof(gen_rec));
  mh->bypasses = in->bypasses;
  mh->bpos_off = align8(mh->list_off + list_len * sizeof(list_ent));
  if (occurrences) {
    /* Positions grouped by item (a counting sort), so the k-th request for
     * an item finds its k-th planned position. */
    mh->occ_start_off = align8(mh->bpos_off + in->bypasses * 4);
    mh->occ_pos_off = align8(mh->occ_start_off + (in->items + 1) * 8);
    uint64_t *start = (uint64_t *)(void *)(meta + mh->occ_start_off);
    uint32_t *pos = (uint32_t *)(void *)(meta + mh->occ_pos_off);
    for (uint64_t t = 0; t < in->accesses; t++) start[plan->seq[t] + 1]++;
    for (uint64_t i = 0; i < in->items; i++) start[i + 1] += start[i];
    /* Fill using start[] as cursors, then shift it back. */
    for (uint64_t t = 0; t < in->accesses; t++) pos[start[plan->seq[t]]++] = (uint32_t)t;
    for (uint64_t i = in->items; i > 0; i--) start[i] = start[i - 1];
    start[0] = 0;
  }
  uint32_t *seq = (uint32_t *)(void *)(meta + mh->seq_off);
  uint32_t *rt = (uint32_t *)(void *)(meta + mh->rt_off);
  gen_rec *gr = (gen_rec *)(void *)(meta + mh->gens_off);
  list_ent *le = (list_ent *)(void *)(meta + mh->list_off);
  uint32_t *bpos = (uint32_t *)(void *)(meta + mh->bpos_off);
  uint32_t next_bypass = 0;
  memcpy(seq, plan->seq, in->accesses * 4);
  /* Pass 1: the generations. A sized plan already numbers them (an op's low
   * bits) and lists their pages; an item plan's op names a slot, its ADMITs
   * are the generations in order, each of one page, and a HIT reads the
   * generation in its slot. */
  const int sized = (in->flags & OPT4_PLAN_SIZED) != 0;
  uint32_t next_gen = 0;
  for (uint64_t t = 0; t < in->accesses; t++) {
    uint32_t op = plan->ops[t], kind = OPT4_OP_KIND(op), bits = OPT4_OP_SLOT(op);
    if (kind == OPT4_OP_BYPASS) {
      bpos[next_bypass] = (uint32_t)t;
      rt[t] = (OPT4_OP_BYPASS << 30) | next_bypass++;
    } else if (kind == OPT4_OP_HIT) {
      uint32_t g = sized ? bits : slot_gen[bits];
      rt[t] = (OPT4_OP_HIT << 30) | g;
      gr[g].reads++;
      gr[g].last_read = (uint32_t)t;
    } else {
      uint32_t g = sized ? bits : next_gen++;
      uint64_t off = sized ? plan->gen_off[g] : g, n = sized ? plan->gen_off[g + 1] - off : 1;
      gr[g].admit = (uint32_t)t;
      gr[g].reads = 0;
      gr[g].last_read = (uint32_t)t;
      gr[g].npages = (uint32_t)n;
      gr[g].list_off = off;
      if (!sized) slot_gen[bits] = g;
      rt[t] = (OPT4_OP_ADMIT << 30) | g;
    }
  }
  /* Pass 2: the pages. The plan decides which generations are resident;
   * which pages they take is the pool's. A generation's pages are free
   * again after its last planned read (its ADMIT's, or its last HIT's), and
   * an ADMIT takes the pages freed longest ago: a prefetcher may store an
   * ADMIT only after the planned reads of its pages' previous generations,
   * so the longer ago those were, the less its reader waits for the
   * handover (docs/prefetch.md, "Handover"). Beyond the plan's pages, the
   * spare ones (pages - slots) keep that distance when the plan evicts an
   * item just read. The live generations at an ADMIT are residents of the
   * plan there, so they never take more than the plan's pages, and the ring
   * always has enough. */
  uint64_t head = 0, n_free = pages;
  for (uint64_t p = 0; p < pages; p++) {
    ring[p] = (uint32_t)p;
    page_gen[p] = NO_GEN;
  }
  for (uint64_t t = 0; t < in->accesses; t++) {
    uint32_t v = rt[t], kind = RT_KIND(v), g = RT_GEN(v);
    if (kind == OPT4_OP_BYPASS) continue;
    if (kind == OPT4_OP_ADMIT) {
      if (gr[g].npages > n_free) {
        rc = opt4__fail(OPT4_ECORRUPT, "the plan keeps more pages than it has at position %llu",
                        (unsigned long long)t);
        goto leave;
      }
      for (uint32_t i = 0; i < gr[g].npages; i++) {
        uint32_t page = ring[head];
        head = head + 1 == pages ? 0 : head + 1;
        n_free--;
        le[gr[g].list_off + i].page = page;
        le[gr[g].list_off + i].prev_gen = page_gen[page];
        page_gen[page] = g;
      }
    }
    if (gr[g].last_read == t) {
      for (uint32_t i = 0; i < gr[g].npages; i++) {
        uint64_t tail = head + n_free;
        ring[tail >= pages ? tail - pages : tail] = le[gr[g].list_off + i].page;
        n_free++;
      }
    }
  }
  memcpy(mh->magic, META_MAGIC, 8);
leave:
  opt4__free(slot_gen, (size_t)(slots ? slots : 1) * sizeof(uint32_t));
  opt4__free(page_gen, (size_t)(pages ? pages : 1) * sizeof(uint32_t));
  opt4__free(ring, (size_t)(pages ? pages : 1) * sizeof(uint32_t));
  return rc;
}
