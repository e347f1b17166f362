/*
 * check.c - validating a pool's segments before anything indexes them
 * (check.h says what each check promises). An attacher runs
 * opt4__pool_check_header (segment.c's opt4_pool_attach); the tests and the
 * fuzz target fuzz_pool_header run both. Both read only within the memory
 * and sizes they are given, and change nothing.
 */
#include "layout.h"
#include "check.h"

#include <string.h>

/* Whether count elements of elem bytes at off, aligned to align, lie in
 * [lo, hi), without overflow. */
static int region_ok(uint64_t off, uint64_t count, uint64_t elem, uint64_t align, uint64_t lo,
                     uint64_t hi) {
  if (off % align != 0 || off < lo || off > hi) return 0;
  return elem == 0 || count <= (hi - off) / elem;
}

#define BAD_POOL(...) opt4__fail(OPT4_EPOOL, __VA_ARGS__)

int opt4__pool_check_header(const void *base, size_t size, const void *meta, size_t msize,
                            uint32_t uid, const char *name) {
  if (base == NULL || meta == NULL) return opt4__fail(OPT4_EINVAL, "base or meta is NULL");
  if (size < POOL_HEADER_SIZE || msize < sizeof(meta_header))
    return BAD_POOL("%s is not an opt4 pool (segments of %zu and %zu bytes are too small)", name,
                    size, msize);
  const pool_header *h = (const pool_header *)base;
  const meta_header *mh = (const meta_header *)meta;
  if (memcmp(h->magic, POOL_MAGIC, 8) != 0 || memcmp(mh->magic, META_MAGIC, 8) != 0)
    return BAD_POOL("%s is not an opt4 pool (bad magic)", name);
  /* The creator writes the magic last, after a release fence. */
  atomic_thread_fence(memory_order_acquire);
  if (h->layout != POOL_LAYOUT || mh->layout != POOL_LAYOUT)
    return BAD_POOL("pool %s has layout %u; this library uses %u (mixed opt4torch versions in "
                    "one run?)", name, h->layout != POOL_LAYOUT ? h->layout : mh->layout,
                    POOL_LAYOUT);
  if (h->header_size != POOL_HEADER_SIZE || mh->header_size != sizeof(meta_header))
    return BAD_POOL("pool %s has header sizes %u and %u; this library uses %u and %zu", name,
                    h->header_size, mh->header_size, POOL_HEADER_SIZE, sizeof(meta_header));
  if (h->owner_uid != uid)
    return BAD_POOL("pool %s says it belongs to uid %u, not to this user (%u): refused", name,
                    h->owner_uid, uid);
  if (h->segment_size != size || h->meta_size != msize || mh->size != msize)
    return BAD_POOL("pool %s is inconsistent: its header gives sizes %llu and %llu, the "
                    "segments are %zu and %zu bytes", name, (unsigned long long)h->segment_size,
                    (unsigned long long)h->meta_size, size, msize);
  if (h->fingerprint != mh->fingerprint || h->accesses != mh->accesses ||
      h->items != mh->items || h->generations != mh->generations)
    return BAD_POOL("pool %s is inconsistent: its two segments describe different plans", name);
  if (h->accesses > OPT4_MAX_ACCESSES || h->items == 0 || h->items > OPT4_MAX_ITEMS ||
      h->generations > h->accesses || h->generations > (uint64_t)RT_MAX_GENS + 1)
    return BAD_POOL("pool %s is inconsistent: %llu accesses, %llu items, %llu generations", name,
                    (unsigned long long)h->accesses, (unsigned long long)h->items,
                    (unsigned long long)h->generations);
  if (h->max_procs == 0 || h->max_procs > (1u << 20) || h->page_size == 0 ||
      h->page_size > ((uint64_t)1 << 40) || h->pages > UINT32_MAX)
    return BAD_POOL("pool %s is inconsistent: %u process records, %llu pages of %llu bytes",
                    name, h->max_procs, (unsigned long long)h->pages,
                    (unsigned long long)h->page_size);
  /* The main segment's regions, in order, each after the one before. */
  const uint64_t gens = h->generations, sz = size;
  uint64_t end = POOL_HEADER_SIZE;
  if (!region_ok(h->procs_off, h->max_procs, sizeof(proc_rec), 64, end, sz))
    return BAD_POOL("pool %s is inconsistent: process records out of bounds", name);
  end = h->procs_off + (uint64_t)h->max_procs * sizeof(proc_rec);
  if (!region_ok(h->states_off, h->pages, sizeof(page_state), 64, end, sz))
    return BAD_POOL("pool %s is inconsistent: page states out of bounds", name);
  end = h->states_off + h->pages * sizeof(page_state);
  if (!region_ok(h->failed_off, (gens + 63) / 64, 8, 8, end, sz))
    return BAD_POOL("pool %s is inconsistent: failed-generation bitmap out of bounds", name);
  end = h->failed_off + (gens + 63) / 64 * 8;
  if (h->occ_count_off != 0) {
    if (!region_ok(h->occ_count_off, h->items, 4, 8, end, sz))
      return BAD_POOL("pool %s is inconsistent: occurrence counters out of bounds", name);
    end = h->occ_count_off + h->items * 4;
  }
  /* Claims: one per generation always, one per BYPASS with staging. */
  if (h->bypasses != mh->bypasses || h->bypasses > h->accesses ||
      h->bypasses + gens > h->accesses)
    return BAD_POOL("pool %s is inconsistent: %llu bypasses", name,
                    (unsigned long long)h->bypasses);
  if (h->staging_slots > ((uint64_t)1 << 20) || h->staging_slot_bytes > ((uint64_t)1 << 32) + 4096 ||
      (h->staging_slots != 0) != (h->bclaim_off != 0) ||
      (h->staging_slots != 0 && (h->staging_slot_bytes == 0 || h->staging_slot_bytes % 4096 != 0)))
    return BAD_POOL("pool %s is inconsistent: %llu staging slots of %llu bytes", name,
                    (unsigned long long)h->staging_slots,
                    (unsigned long long)h->staging_slot_bytes);
  if (!region_ok(h->gclaim_off, gens, 4, 4, end, sz))
    return BAD_POOL("pool %s is inconsistent: generation claims out of bounds", name);
  end = h->gclaim_off + gens * 4;
  if (h->bclaim_off != 0) {
    if (!region_ok(h->bclaim_off, h->bypasses, 4, 4, end, sz))
      return BAD_POOL("pool %s is inconsistent: bypass claims out of bounds", name);
    end = h->bclaim_off + h->bypasses * 4;
  }
  if (!region_ok(h->slot_len_off, h->staging_slots, sizeof(slot_state), 8, end, sz))
    return BAD_POOL("pool %s is inconsistent: staging slot states out of bounds", name);
  end = h->slot_len_off + h->staging_slots * sizeof(slot_state);
  /* Then the payload pages and the staging slots, which end the segment. */
  if (!region_ok(h->payload_off, h->pages, h->page_size, 64, end, sz) ||
      h->staging_off != ((h->payload_off + h->pages * h->page_size + 63) & ~(uint64_t)63) ||
      !region_ok(h->staging_off, h->staging_slots, h->staging_slot_bytes, 64, h->staging_off, sz) ||
      h->staging_off + h->staging_slots * h->staging_slot_bytes != sz)
    return BAD_POOL("pool %s is inconsistent: payload and staging do not end the segment", name);
  /* The meta segment's arrays (read-only, so order does not matter). */
  const uint64_t ms = msize, lo = sizeof(meta_header);
  if (!region_ok(mh->seq_off, h->accesses, 4, 4, lo, ms) ||
      !region_ok(mh->rt_off, h->accesses, 4, 4, lo, ms) ||
      !region_ok(mh->gens_off, gens, sizeof(gen_rec), 8, lo, ms) ||
      !region_ok(mh->list_off, mh->list_len, sizeof(list_ent), 4, lo, ms) ||
      !region_ok(mh->bpos_off, mh->bypasses, 4, 4, lo, ms))
    return BAD_POOL("pool %s is inconsistent: plan arrays out of bounds", name);
  if ((h->occ_count_off != 0) != (mh->occ_start_off != 0) ||
      (mh->occ_start_off != 0) != (mh->occ_pos_off != 0))
    return BAD_POOL("pool %s is inconsistent: half an occurrence index", name);
  if (mh->occ_start_off != 0 && (!region_ok(mh->occ_start_off, h->items + 1, 8, 8, lo, ms) ||
                                 !region_ok(mh->occ_pos_off, h->accesses, 4, 4, lo, ms)))
    return BAD_POOL("pool %s is inconsistent: occurrence index out of bounds", name);
  return 0;
}

int opt4__pool_check_meta(const void *base, size_t size, const void *meta, size_t msize,
                          const char *name) {
  (void)size;
  (void)msize;
  const pool_header *h = (const pool_header *)base;
  const meta_header *mh = (const meta_header *)meta;
  const uint8_t *m = (const uint8_t *)meta;
  const uint32_t *seq = (const uint32_t *)(const void *)(m + mh->seq_off);
  const uint32_t *rt = (const uint32_t *)(const void *)(m + mh->rt_off);
  const gen_rec *gr = (const gen_rec *)(const void *)(m + mh->gens_off);
  const list_ent *le = (const list_ent *)(const void *)(m + mh->list_off);
  const uint32_t *bpos = (const uint32_t *)(const void *)(m + mh->bpos_off);
  const uint64_t T = h->accesses, G = h->generations;
  for (uint64_t k = 0; k < h->bypasses; k++)
    if (bpos[k] >= T || rt[bpos[k]] != ((OPT4_OP_BYPASS << 30) | (uint32_t)k))
      return BAD_POOL("pool %s: BYPASS %llu's position is inconsistent", name,
                      (unsigned long long)k);
  for (uint64_t t = 0; t < T; t++) {
    uint32_t v = rt[t], kind = RT_KIND(v), g = RT_GEN(v);
    if (seq[t] >= h->items) return BAD_POOL("pool %s: item %u at position %llu is out of range",
                                            name, seq[t], (unsigned long long)t);
    if (kind == OPT4_OP_BYPASS) {
      /* The low bits are the BYPASS's ordinal, and bpos maps it back. */
      if (g >= h->bypasses || bpos[g] != t)
        return BAD_POOL("pool %s: BYPASS at position %llu has a bad ordinal %u", name,
                        (unsigned long long)t, g);
      continue;
    }
    if (kind > OPT4_OP_BYPASS || g >= G)
      return BAD_POOL("pool %s: position %llu has a bad decision 0x%08x", name,
                      (unsigned long long)t, v);
    if (kind == OPT4_OP_ADMIT ? gr[g].admit != t : gr[g].admit >= t)
      return BAD_POOL("pool %s: position %llu names generation %u, admitted at %u", name,
                      (unsigned long long)t, g, gr[g].admit);
  }
  for (uint64_t g = 0; g < G; g++) {
    const gen_rec *r = &gr[g];
    if (r->admit >= T || rt[r->admit] != ((OPT4_OP_ADMIT << 30) | (uint32_t)g) ||
        r->last_read >= T || r->reads > T || r->npages == 0 ||
        r->list_off > mh->list_len || r->npages > mh->list_len - r->list_off)
      return BAD_POOL("pool %s: generation %llu is inconsistent", name, (unsigned long long)g);
    for (uint32_t i = 0; i < r->npages; i++) {
      const list_ent *e = &le[r->list_off + i];
      if (e->page >= h->pages || (e->prev_gen != NO_GEN && e->prev_gen >= g))
        return BAD_POOL("pool %s: generation %llu's page list is inconsistent", name,
                        (unsigned long long)g);
    }
  }
  if (mh->occ_start_off != 0) {
    const uint64_t *start = (const uint64_t *)(const void *)(m + mh->occ_start_off);
    const uint32_t *pos = (const uint32_t *)(const void *)(m + mh->occ_pos_off);
    if (start[0] != 0 || start[h->items] != T)
      return BAD_POOL("pool %s: occurrence index is inconsistent", name);
    for (uint64_t i = 0; i < h->items; i++) {
      if (start[i + 1] < start[i] || start[i + 1] > T)
        return BAD_POOL("pool %s: occurrence index is inconsistent", name);
      for (uint64_t k = start[i]; k < start[i + 1]; k++)
        if (pos[k] >= T || seq[pos[k]] != i || (k > start[i] && pos[k] <= pos[k - 1]))
          return BAD_POOL("pool %s: occurrence index is inconsistent", name);
    }
  }
  return 0;
}
