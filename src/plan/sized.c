/*
 * sized.c - size-aware Belady over a paged pool (plans in bytes).
 *
 * The pool is P pages of page_size bytes; item x takes pages(x) =
 * ceil(size[x] / page_size) of them, any of them (no fragmentation). One pass
 * backward computes next uses (as belady.c does, into ops); one pass forward
 * decides, with the resident items keyed by next use in the same key set:
 *
 *   HIT       the item's current generation; if it is never used again its
 *             pages are freed.
 *   miss      (bypass) never used again: BYPASS. Otherwise, if fewer than
 *             pages(x) pages are free, walk the residents from the farthest
 *             next use down, collecting victims until enough pages would be
 *             free; with bypass, give up (BYPASS) as soon as a victim would be
 *             needed sooner than x. Evict the victims, ADMIT x into free pages
 *             (a new generation, its pages popped from the free stack).
 *
 * With equal sizes every item takes one page and this is exactly Belady (the
 * tests check it against the item-capacity planner). With unequal sizes it is
 * a heuristic: evicting by farthest next use is not optimal when sizes differ
 * (offline caching with sizes is NP-hard; Chrobak, Woeginger, Makino, Xu,
 * "Caching is hard - even in the fault model", Algorithmica 2012).
 *
 * The op's low 30 bits are the generation (ADMIT: the new one; HIT: the one it
 * reads). Generation g owns pages[gen_off[g] .. gen_off[g + 1]).
 */
#include "internal.h"
#include "keyset.h"

#include <string.h>

#define NONE32 UINT32_MAX

typedef struct vec32 {
  uint32_t *v;
  uint64_t n, cap;
} vec32;

typedef struct vec64 {
  uint64_t *v;
  uint64_t n, cap;
} vec64;

static int push32(vec32 *a, uint32_t x) {
  if (a->n == a->cap) {
    uint64_t cap = a->cap ? a->cap * 2 : 1024;
    uint32_t *v = opt4__malloc((size_t)cap * 4);
    if (v == NULL) return OPT4_ENOMEM;
    if (a->n) memcpy(v, a->v, (size_t)a->n * 4);
    opt4__free(a->v, (size_t)a->cap * 4);
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = x;
  return 0;
}

static int push64(vec64 *a, uint64_t x) {
  if (a->n == a->cap) {
    uint64_t cap = a->cap ? a->cap * 2 : 1024;
    uint64_t *v = opt4__malloc((size_t)cap * 8);
    if (v == NULL) return OPT4_ENOMEM;
    if (a->n) memcpy(v, a->v, (size_t)a->n * 8);
    opt4__free(a->v, (size_t)a->cap * 8);
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = x;
  return 0;
}

/* Shrink a vector to its length: the plan owns exactly what it uses. */
static int fit32(vec32 *a, uint32_t **out) {
  uint32_t *v = opt4__malloc((size_t)(a->n ? a->n : 1) * 4);
  if (v == NULL) return OPT4_ENOMEM;
  if (a->n) memcpy(v, a->v, (size_t)a->n * 4);
  *out = v;
  return 0;
}

static int fit64(vec64 *a, uint64_t **out) {
  uint64_t *v = opt4__malloc((size_t)(a->n ? a->n : 1) * 8);
  if (v == NULL) return OPT4_ENOMEM;
  if (a->n) memcpy(v, a->v, (size_t)a->n * 8);
  *out = v;
  return 0;
}

int opt4__sized_pages(const opt4_plan_opts *opts, uint64_t items, uint64_t *pages, uint32_t **sizes) {
  const uint64_t P = opts->capacity_bytes / opts->page_size;
  *sizes = NULL;
  if (P == 0) return opt4__fail(OPT4_ECAPACITY, "capacity_bytes %llu holds no page of %llu bytes",
                                (unsigned long long)opts->capacity_bytes, (unsigned long long)opts->page_size);
  if (P > OPT4_MAX_CAPACITY)
    return opt4__fail(OPT4_ETOOBIG, "%llu pages exceed the limit %llu: use larger pages",
                      (unsigned long long)P, (unsigned long long)OPT4_MAX_CAPACITY);
  uint32_t *v = opt4__malloc((size_t)items * 4);
  if (v == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for %llu item sizes", (unsigned long long)items);
  for (uint64_t i = 0; i < items; i++) {
    if (opts->item_sizes[i] > UINT32_MAX) {
      opt4__free(v, (size_t)items * 4);
      return opt4__fail(OPT4_ETOOBIG, "item %llu is %llu bytes; items up to 4 GiB are supported",
                        (unsigned long long)i, (unsigned long long)opts->item_sizes[i]);
    }
    v[i] = (uint32_t)opts->item_sizes[i];
  }
  *pages = P;
  *sizes = v;
  return 0;
}

/* Publish how far the build is, every 65536 positions, on the scale of the
 * public contract (0 to 3 * T, opt4.h): the backward pass is the first T,
 * the decisions, which take most of the time, the other 2 * T. */
static inline void report(const opt4_plan_opts *opts, uint64_t step, uint64_t at) {
  if (OPT4__UNLIKELY((step & 0xFFFF) == 0) && opts->progress != NULL)
    __atomic_store_n(opts->progress, at, __ATOMIC_RELAXED);
}

int opt4__belady_sized(const opt4_seq *seq, const opt4_plan_opts *opts, opt4_plan *plan) {
  const uint64_t T = seq->len, N = seq->items, page = opts->page_size;
  uint64_t P = 0;
  const int bypass = (opts->flags & OPT4_PLAN_NOBYPASS) == 0;
  uint32_t *ops = plan->own_ops;
  uint32_t *sizes = NULL, *item_gen = NULL, *free_pages = NULL, *last = NULL;
  uint64_t *victims = NULL, max_need = 1;
  vec32 pages = {NULL, 0, 0};
  vec64 gen_off = {NULL, 0, 0};
  opt4__keyset ks;
  memset(&ks, 0, sizeof ks);
  uint64_t hits = 0, admits = 0, bypasses = 0, distinct = 0;

  int rc = opt4__sized_pages(opts, N, &P, &sizes);
  if (rc != 0) return rc;
  last = opt4__malloc((size_t)N * 4);
  item_gen = opt4__malloc((size_t)N * 4);
  free_pages = opt4__malloc((size_t)P * 4);
  if (last == NULL || item_gen == NULL || free_pages == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for %llu items and %llu pages", (unsigned long long)N,
                    (unsigned long long)P);
    goto leave;
  }

  /* Backward: next uses into ops, ids checked, and the largest item used. */
  memset(last, 0xFF, (size_t)N * 4);
  for (uint64_t t = T; t-- > 0;) {
    report(opts, T - t, T - t);
    uint64_t x = opt4__seq_get(seq, t);
    if (x >= N) {
      rc = opt4__fail(OPT4_ERANGE, "id %lld at position %llu is outside [0, %llu)",
                      (long long)(int64_t)x, (unsigned long long)t, (unsigned long long)N);
      goto leave;
    }
    uint64_t need = opt4__pages_for(sizes[x], page);
    if (need > P) {
      rc = opt4__fail(OPT4_EITEMSIZE, "item %llu is %u bytes, larger than the whole pool (%llu "
                      "pages of %llu bytes): give the cache more bytes", (unsigned long long)x,
                      sizes[x], (unsigned long long)P, (unsigned long long)page);
      goto leave;
    }
    if (need > max_need) max_need = need;
    distinct += last[x] == OPT4__NEVER;
    ops[t] = last[x];
    last[x] = (uint32_t)t;
  }
  opt4__free(last, (size_t)N * 4);
  last = NULL;

  victims = opt4__malloc((size_t)max_need * 8);
  if (victims == NULL || opt4__ks_init(&ks, T) != 0) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for the key set of %llu accesses", (unsigned long long)T);
    goto leave;
  }
  for (uint64_t i = 0; i < P; i++) free_pages[i] = (uint32_t)(P - 1 - i); /* page 0 on top */
  uint64_t n_free = P;
  const uint64_t NO_MAX = UINT64_MAX;
  uint64_t max = NO_MAX;

  for (uint64_t t = 0; t < T; t++) {
    report(opts, t, T + 2 * t);
    const uint32_t x = (uint32_t)opt4__seq_get(seq, t);
    const uint32_t nx = ops[t];
    if (opt4__ks_take(&ks, t)) {
      uint32_t g = item_gen[x];
      if (t == max) max = NO_MAX;
      if (nx != OPT4__NEVER) {
        opt4__ks_insert(&ks, nx);
        if (max == NO_MAX || nx > max) max = nx;
      } else { /* dead: its pages are free from now on */
        for (uint64_t i = gen_off.v[g]; i < gen_off.v[g + 1]; i++) free_pages[n_free++] = pages.v[i];
      }
      ops[t] = OPT4_OP_MAKE(OPT4_OP_HIT, g);
      hits++;
      continue;
    }
    if (nx == OPT4__NEVER && bypass) {
      ops[t] = OPT4_OP_MAKE(OPT4_OP_BYPASS, 0);
      bypasses++;
      continue;
    }
    const uint64_t need = opt4__pages_for(sizes[x], page);
    if (n_free < need) {
      /* The victims: residents from the farthest next use down. */
      uint64_t got = n_free, nv = 0, k = max;
      int ok = 1;
      while (got < need) {
        if (k == NO_MAX || (bypass && k < nx)) {
          ok = 0;
          break;
        }
        victims[nv++] = k;
        uint32_t vg = item_gen[(uint32_t)opt4__seq_get(seq, k)];
        got += gen_off.v[vg + 1] - gen_off.v[vg];
        if (!opt4__ks_pred(&ks, k, &k)) k = NO_MAX;
      }
      if (!ok) {
        ops[t] = OPT4_OP_MAKE(OPT4_OP_BYPASS, 0);
        bypasses++;
        continue;
      }
      for (uint64_t i = 0; i < nv; i++) {
        uint32_t vg = item_gen[(uint32_t)opt4__seq_get(seq, victims[i])];
        opt4__ks_remove(&ks, victims[i]);
        for (uint64_t j = gen_off.v[vg]; j < gen_off.v[vg + 1]; j++) free_pages[n_free++] = pages.v[j];
      }
      max = k; /* the victims were the largest keys; k is the next one */
    }
    if (admits >= 0x3FFFFFFFu) {
      rc = opt4__fail(OPT4_ETOOBIG, "more than %u admissions", 0x3FFFFFFFu);
      goto leave;
    }
    uint32_t g = (uint32_t)admits++;
    if ((gen_off.n == 0 && (rc = push64(&gen_off, 0)) != 0)) goto nomem;
    for (uint64_t i = 0; i < need; i++)
      if ((rc = push32(&pages, free_pages[--n_free])) != 0) goto nomem;
    if ((rc = push64(&gen_off, pages.n)) != 0) goto nomem;
    ops[t] = OPT4_OP_MAKE(OPT4_OP_ADMIT, g);
    if (nx != OPT4__NEVER) {
      item_gen[x] = g;
      opt4__ks_insert(&ks, nx);
      if (max == NO_MAX || nx > max) max = nx;
    } else { /* opt-nobypass admitted a dead id: free its pages at once */
      for (uint64_t i = gen_off.v[g]; i < gen_off.v[g + 1]; i++) free_pages[n_free++] = pages.v[i];
    }
  }
  if (gen_off.n == 0 && (rc = push64(&gen_off, 0)) != 0) goto nomem;

  /* Pages used: the free stack hands out the lowest first, so the largest
   * page ever used bounds them. */
  uint64_t used = 0;
  for (uint64_t i = 0; i < pages.n; i++)
    if ((uint64_t)pages.v[i] + 1 > used) used = (uint64_t)pages.v[i] + 1;
  if ((rc = fit64(&gen_off, &plan->own_gen_off)) != 0 || (rc = fit32(&pages, &plan->own_pages)) != 0)
    goto nomem;
  plan->gen_off = plan->own_gen_off;
  plan->pages = plan->own_pages;
  plan->pages_len = pages.n;
  plan->own_sizes = sizes;
  plan->sizes = sizes;
  sizes = NULL;
  plan->info.capacity = P;
  plan->info.capacity_bytes = opts->capacity_bytes;
  plan->info.page_size = page;
  plan->info.generations = admits;
  plan->info.slots = used;
  plan->info.hits = hits;
  plan->info.admits = admits;
  plan->info.bypasses = bypasses;
  plan->info.misses = admits + bypasses;
  plan->info.compulsory = distinct;
  if (opts->progress != NULL) __atomic_store_n(opts->progress, 3 * T, __ATOMIC_RELAXED);
  goto leave;
nomem:
  rc = opt4__fail(OPT4_ENOMEM, "no memory for the plan's page lists");
leave:
  if (ks.words != NULL) opt4__ks_free(&ks);
  opt4__free(sizes, (size_t)N * 4);
  opt4__free(last, (size_t)N * 4);
  opt4__free(item_gen, (size_t)N * 4);
  opt4__free(free_pages, (size_t)P * 4);
  opt4__free(victims, (size_t)max_need * 8);
  opt4__free(pages.v, (size_t)pages.cap * 4);
  opt4__free(gen_off.v, (size_t)gen_off.cap * 8);
  return rc;
}

int opt4__plan_verify_sized(const opt4_plan *plan) {
  const opt4_plan_info *in = &plan->info;
  const uint64_t T = in->accesses, N = in->items, G = in->generations, P = in->slots;
  uint32_t *owner = opt4__malloc((size_t)(P ? P : 1) * 4);
  uint32_t *item_gen = opt4__malloc((size_t)N * 4);
  int rc = 0;
  if (owner == NULL || item_gen == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory to verify the plan");
    goto leave;
  }
  memset(owner, 0xFF, (size_t)(P ? P : 1) * 4);
  memset(item_gen, 0xFF, (size_t)N * 4);
  uint64_t next_gen = 0, hits = 0, bypasses = 0;
  for (uint64_t t = 0; t < T; t++) {
    uint32_t op = plan->ops[t], kind = OPT4_OP_KIND(op), g = OPT4_OP_SLOT(op), x = plan->seq[t];
    if (kind == OPT4_OP_BYPASS) {
      if (g != 0) {
        rc = opt4__fail(OPT4_ECORRUPT, "op %llu: BYPASS with bits set", (unsigned long long)t);
        goto leave;
      }
      bypasses++;
      continue;
    }
    if (kind > OPT4_OP_BYPASS || g >= G) {
      rc = opt4__fail(OPT4_ECORRUPT, "op %llu: kind %u generation %u is invalid", (unsigned long long)t,
                      kind, g);
      goto leave;
    }
    if (kind == OPT4_OP_ADMIT) {
      uint64_t n = plan->gen_off[g + 1] - plan->gen_off[g];
      for (uint64_t i = plan->gen_off[g]; i < plan->gen_off[g + 1]; i++)
        if (plan->pages[i] >= P) {
          rc = opt4__fail(OPT4_ECORRUPT, "op %llu: page %u past the pool", (unsigned long long)t,
                          plan->pages[i]);
          goto leave;
        }
      if (g != next_gen || n != opt4__pages_for(plan->sizes[x], in->page_size)) {
        rc = opt4__fail(OPT4_ECORRUPT, "op %llu: ADMIT of generation %u (expected %llu) with %llu "
                        "pages", (unsigned long long)t, g, (unsigned long long)next_gen,
                        (unsigned long long)n);
        goto leave;
      }
      next_gen++;
      for (uint64_t i = plan->gen_off[g]; i < plan->gen_off[g + 1]; i++) owner[plan->pages[i]] = g;
      item_gen[x] = g;
    } else {
      int ok = item_gen[x] == g;
      for (uint64_t i = plan->gen_off[g]; ok && i < plan->gen_off[g + 1]; i++) ok = owner[plan->pages[i]] == g;
      if (!ok) {
        rc = opt4__fail(OPT4_ECORRUPT, "op %llu: HIT of generation %u, which does not hold item %u "
                        "there", (unsigned long long)t, g, x);
        goto leave;
      }
      hits++;
    }
  }
  if (next_gen != G || hits != in->hits || bypasses != in->bypasses || G != in->admits)
    rc = opt4__fail(OPT4_ECORRUPT, "totals in the header differ from the ops");
leave:
  opt4__free(owner, (size_t)(P ? P : 1) * 4);
  opt4__free(item_gen, (size_t)N * 4);
  return rc;
}
