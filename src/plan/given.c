/*
 * given.c - a plan whose decisions are given (opt4_plan_from_kinds, opt4.h):
 * the kinds come from elsewhere (a node's part of a cluster plan), and the
 * engine only hands out the places and checks the result.
 *
 * Two passes. Backward, each position learns whether its generation ends
 * there (no HIT of the item before its next ADMIT); the flag waits in the
 * ops array's slot bits. Forward, an ADMIT takes a slot, or its item's
 * pages, from a stack of free places (0, 1, 2, ... from the top at first,
 * as opt4_plan_build's), and a generation's places go back on it after its
 * last read. Then the plan is verified as a plan file
 * is (opt4__plan_verify, opt4__plan_verify_sized): what a pool will trust.
 */
#include "internal.h"

#include <string.h>

#define ENDS 1u /* in the slot bits during the passes: the generation ends here */

typedef struct places {
  uint64_t n;      /* places: slots, or pages */
  uint32_t *free;  /* a stack, lowest on top */
  uint64_t n_free;
} places;

static int places_init(places *p, uint64_t n) {
  p->n = n;
  p->free = opt4__malloc((size_t)(n ? n : 1) * 4);
  if (p->free == NULL) return OPT4_ENOMEM;
  for (uint64_t i = 0; i < n; i++) p->free[i] = (uint32_t)(n - 1 - i);
  p->n_free = n;
  return 0;
}

static void places_free(places *p) { opt4__free(p->free, (size_t)(p->n ? p->n : 1) * 4); }

/* Backward: kinds checked, each generation's end marked in ops; counts. */
static int mark_ends(const opt4_plan *plan, const uint8_t *kinds, uint32_t *ops, uint8_t *open_gen,
                     uint64_t *admits, uint64_t *pages_total, const uint32_t *sizes, uint64_t page) {
  const uint64_t T = plan->info.accesses;
  memset(open_gen, 0, (size_t)plan->info.items);
  for (uint64_t t = T; t-- > 0;) {
    const uint32_t x = plan->seq[t], kind = kinds[t];
    if (kind > OPT4_OP_BYPASS)
      return opt4__fail(OPT4_EINVAL, "position %llu: kind %u (HIT 0, ADMIT 1 or BYPASS 2)",
                        (unsigned long long)t, kind);
    uint32_t ends = 0;
    if (kind != OPT4_OP_BYPASS) {
      ends = !open_gen[x]; /* no later HIT of this generation */
      open_gen[x] = kind == OPT4_OP_HIT;
      if (kind == OPT4_OP_ADMIT) {
        (*admits)++;
        if (sizes != NULL) *pages_total += opt4__pages_for(sizes[x], page);
      }
    }
    ops[t] = OPT4_OP_MAKE(kind, ends);
  }
  return 0;
}

int opt4_plan_from_kinds(const opt4_seq *seq, const uint8_t *kinds, const opt4_plan_opts *opts,
                         opt4_plan **out) {
  int rc = opt4__plan_begin(seq, opts, out);
  if (rc != 0) return rc;
  if (opts->flags != 0) return opt4__fail(OPT4_EINVAL, "flags must be 0 for a plan of given kinds");
  if (kinds == NULL && seq->len > 0) return opt4__fail(OPT4_EINVAL, "kinds is NULL");

  const uint64_t T = seq->len, N = seq->items;
  const int sized = opts->item_sizes != NULL;
  const uint64_t page = opts->page_size;
  opt4_plan *plan = opt4__plan_alloc();
  uint8_t *open_gen = NULL;
  uint32_t *cur = NULL; /* per item: its live generation's slot, or generation (sized) */
  places pl = {0, NULL, 0};
  if (plan == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a plan");
  plan->info.items = N;
  plan->info.accesses = T;
  plan->info.capacity = opts->capacity;
  plan->info.has_ops = 1;
  size_t bytes = (size_t)T * sizeof(uint32_t);
  plan->own_ops = opt4__malloc(bytes);
  open_gen = opt4__malloc((size_t)N);
  cur = opt4__malloc((size_t)N * 4);
  if (plan->own_ops == NULL || open_gen == NULL || cur == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for %llu positions", (unsigned long long)T);
    goto leave;
  }
  if ((rc = opt4__plan_attach_seq(plan, seq)) != 0) goto leave;
  uint32_t *ops = plan->own_ops;
  if (sized) {
    uint64_t P = 0;
    if ((rc = opt4__sized_pages(opts, N, &P, &plan->own_sizes)) != 0) goto leave;
    plan->sizes = plan->own_sizes;
    plan->info.flags = OPT4_PLAN_SIZED;
    plan->info.capacity = P;
    plan->info.capacity_bytes = opts->capacity_bytes;
    plan->info.page_size = page;
    rc = places_init(&pl, P);
  } else {
    plan->info.slots = opt4__slot_count(&plan->info);
    rc = places_init(&pl, plan->info.slots);
  }
  if (rc != 0) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for %llu free places", (unsigned long long)pl.n);
    goto leave;
  }

  uint64_t admits = 0, pages_total = 0;
  if ((rc = mark_ends(plan, kinds, ops, open_gen, &admits, &pages_total, plan->sizes, page)) != 0) goto leave;
  if (admits > 0x3FFFFFFFu) {
    rc = opt4__fail(OPT4_ETOOBIG, "%llu admissions; at most %u", (unsigned long long)admits, 0x3FFFFFFFu);
    goto leave;
  }
  if (sized) {
    /* The sizes first: opt4_plan_close frees by them. */
    plan->info.generations = admits;
    plan->pages_len = pages_total;
    plan->own_gen_off = opt4__malloc((size_t)(admits + 1) * 8);
    plan->own_pages = opt4__malloc((size_t)(pages_total ? pages_total : 1) * 4);
    if (plan->own_gen_off == NULL || plan->own_pages == NULL) {
      rc = opt4__fail(OPT4_ENOMEM, "no memory for %llu page lists", (unsigned long long)admits);
      goto leave;
    }
    plan->own_gen_off[0] = 0;
    plan->gen_off = plan->own_gen_off;
    plan->pages = plan->own_pages;
  }

  /* Forward: places handed out and given back. */
  memset(open_gen, 0, (size_t)N); /* now: the item has a live generation */
  uint64_t hits = 0, bypasses = 0, gens = 0, used = 0;
  for (uint64_t t = 0; t < T; t++) {
    const uint32_t x = plan->seq[t], kind = OPT4_OP_KIND(ops[t]), ends = OPT4_OP_SLOT(ops[t]) & ENDS;
    if (kind == OPT4_OP_BYPASS) {
      ops[t] = OPT4_OP_MAKE(OPT4_OP_BYPASS, 0);
      bypasses++;
      continue;
    }
    uint32_t id; /* the slot, or the generation */
    if (kind == OPT4_OP_HIT) {
      if (!open_gen[x]) {
        rc = opt4__fail(OPT4_EINVAL, "position %llu: a HIT of item %u, which no ADMIT before it holds",
                        (unsigned long long)t, x);
        goto leave;
      }
      id = cur[x];
      hits++;
    } else {
      const uint64_t need = sized ? opt4__pages_for(plan->sizes[x], page) : 1;
      if (pl.n_free < need) {
        rc = opt4__fail(OPT4_ECAPACITY, "position %llu: item %u needs %llu %s, and %llu of %llu are "
                        "free: the live generations need more than the capacity",
                        (unsigned long long)t, x, (unsigned long long)need, sized ? "pages" : "slot",
                        (unsigned long long)pl.n_free, (unsigned long long)pl.n);
        goto leave;
      }
      if (sized) {
        id = (uint32_t)gens;
        uint64_t off = plan->own_gen_off[gens];
        for (uint64_t i = 0; i < need; i++) {
          uint32_t pg = pl.free[--pl.n_free];
          plan->own_pages[off + i] = pg;
          if ((uint64_t)pg + 1 > used) used = (uint64_t)pg + 1;
        }
        plan->own_gen_off[gens + 1] = off + need;
      } else {
        id = pl.free[--pl.n_free];
      }
      gens++;
      cur[x] = id;
      open_gen[x] = 1;
    }
    ops[t] = OPT4_OP_MAKE(kind, id);
    if (ends) { /* its places are free again */
      open_gen[x] = 0;
      if (sized)
        for (uint64_t i = plan->own_gen_off[id + 1]; i-- > plan->own_gen_off[id];) pl.free[pl.n_free++] = plan->own_pages[i];
      else
        pl.free[pl.n_free++] = id;
    }
  }
  plan->ops = ops;
  plan->info.hits = hits;
  plan->info.admits = gens;
  plan->info.bypasses = bypasses;
  plan->info.misses = gens + bypasses;
  if (sized) plan->info.slots = used;
  rc = opt4__count_distinct(plan->seq, T, N, &plan->info.compulsory);
  if (rc != 0) {
    rc = opt4__fail(rc, "no memory to count distinct ids");
    goto leave;
  }
  rc = sized ? opt4__plan_verify_sized(plan) : opt4__plan_verify(plan->seq, ops, &plan->info);

leave:
  places_free(&pl);
  opt4__free(open_gen, (size_t)N);
  opt4__free(cur, (size_t)N * 4);
  if (rc != 0) {
    opt4_plan_close(plan);
    return rc;
  }
  *out = plan;
  return 0;
}
