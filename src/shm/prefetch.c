/*
 * prefetch.c - the prefetchers' side of the claim protocol: claiming the
 * misses ahead of the consumers, storing them (an ADMIT into its pages, a
 * BYPASS into the staging ring) or giving them up (opt4_pool_prefetch_*).
 * The consumers' side, claim_miss, is in runtime.c, on opt4_pool_get's path,
 * and so are the waits and the writer protocol used here (runtime.h); the
 * threads that call these live in src/io/prefetcher.c.
 *
 * A prefetcher (any thread of any process, with its own handle) follows the
 * plan ahead of the consumers: it claims the next miss in the window
 * [cursor, head + lookahead), loads it, and hands it over. Each miss has a
 * claim word; whoever moves it from OPEN first loads the item, so it is
 * loaded exactly once: by its consumer (SELF) or by a prefetcher (LOADING).
 *
 * An ADMIT goes into its own pages, by the writer protocol (runtime.c),
 * once the generations it replaces have had their planned reads. Its
 * consumer then reads it like a HIT, and that read is the "+1" every
 * generation owes (see opt4__may_take). A BYPASS goes into staging slot
 * (ordinal % slots), once the BYPASS that used the slot before is DONE
 * (copied out) or SELF (never staged); its consumer moves the claim
 * READY -> READING -> DONE around the copy, so a slot is never written
 * while it is read.
 *
 * A consumer that finds a claim LOADING waits for it (a stall, counted),
 * bounded: on timeout, or when the claim's owner has died, it marks the
 * claim ABANDONED and loads the item itself. The prefetcher then still
 * stores an ADMIT (its readers benefit) with the consumer's read counted,
 * and lets an abandoned BYPASS go.
 */
#include "runtime.h"

#include <string.h>

static _Atomic uint32_t *claim_of(opt4_pool *pool, uint32_t v) {
  if (RT_KIND(v) == OPT4_OP_ADMIT) return &pool->gclaim[RT_GEN(v)];
  if (RT_KIND(v) == OPT4_OP_BYPASS && pool->bclaim != NULL) return &pool->bclaim[RT_GEN(v)];
  return NULL;
}

/* Move t's claim from OPEN to this handle's LOADING and describe the job;
 * 0 when someone holds it already. */
static int take_claim(opt4_pool *pool, uint64_t t, _Atomic uint32_t *claim, opt4_prefetch_job *job) {
  const uint32_t mine = ((pool->rec + 1u) << 4) | CL_LOADING;
  uint32_t open = CL_OPEN;
  if (!atomic_compare_exchange_strong(claim, &open, mine)) return 0;
  const uint32_t v = pool->rt[t];
  job->t = t;
  job->item = pool->seq[t];
  job->kind = RT_KIND(v);
  job->space = RT_KIND(v) == OPT4_OP_ADMIT ? (uint64_t)pool->gens[RT_GEN(v)].npages * pool->h->page_size
                                           : pool->h->staging_slot_bytes;
  return 1;
}

int opt4_pool_prefetch_claim(opt4_pool *pool, uint64_t lookahead, opt4_prefetch_job *job,
                             int *status) {
  if (pool == NULL || job == NULL || status == NULL)
    return opt4__fail(OPT4_EINVAL, "pool, job or status is NULL");
  int rc = opt4__pool_register(pool);
  if (rc != 0) return rc;
  pool_header *h = pool->h;
  const uint64_t T = h->accesses;
  memset(job, 0, sizeof *job);
  /* Bounded work per call: a caller that gets IDLE comes back later. */
  for (int round = 0; round < 64; round++) {
    uint64_t c = atomic_load_explicit(&h->pf_cursor, memory_order_acquire);
    uint64_t f = floor_now(pool);
    if (c < f) {
      atomic_compare_exchange_strong(&h->pf_cursor, &c, f);
      continue;
    }
    if (c >= T) {
      *status = OPT4_PREFETCH_END;
      return 0;
    }
    uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
    uint64_t limit = head + lookahead;
    if (limit > T || limit < head) limit = T;
    if (c >= limit) break;
    uint64_t stop = limit - c > 4096 ? c + 4096 : limit, t = c;
    _Atomic uint32_t *claim = NULL;
    for (; t < stop; t++) {
      uint32_t v = pool->rt[t];
      claim = claim_of(pool, v);
      if (claim != NULL) break;
    }
    if (t == stop) { /* only HITs here: move past them */
      atomic_compare_exchange_strong(&h->pf_cursor, &c, t);
      continue;
    }
    if (!atomic_compare_exchange_strong(&h->pf_cursor, &c, t + 1)) continue;
    if (take_claim(pool, t, claim, job)) { /* else its consumer, or another loader, has it */
      *status = OPT4_PREFETCH_CLAIMED;
      return 0;
    }
  }
  *status = OPT4_PREFETCH_IDLE;
  return 0;
}

int opt4_pool_prefetch_claim_at(opt4_pool *pool, uint64_t t, opt4_prefetch_job *job, int *status) {
  if (pool == NULL || job == NULL || status == NULL)
    return opt4__fail(OPT4_EINVAL, "pool, job or status is NULL");
  int rc = opt4__pool_register(pool);
  if (rc != 0) return rc;
  if (t >= pool->h->accesses)
    return opt4__fail(OPT4_ERANGE, "position %llu is past the plan (%llu positions)", (unsigned long long)t,
                      (unsigned long long)pool->h->accesses);
  memset(job, 0, sizeof *job);
  _Atomic uint32_t *claim = claim_of(pool, pool->rt[t]);
  *status = claim != NULL && take_claim(pool, t, claim, job) ? OPT4_PREFETCH_CLAIMED : OPT4_PREFETCH_IDLE;
  return 0;
}

/* The claim at t held by this handle, or NULL (with the error set). */
static _Atomic uint32_t *my_claim(opt4_pool *pool, uint64_t t, uint32_t *v_out) {
  if (t >= pool->h->accesses) {
    opt4__fail(OPT4_ERANGE, "position %llu is past the plan", (unsigned long long)t);
    return NULL;
  }
  uint32_t v = pool->rt[t];
  _Atomic uint32_t *claim = claim_of(pool, v);
  uint32_t c = claim != NULL ? atomic_load(claim) : 0;
  if (claim == NULL || CL_OWNER(c) != pool->rec + 1u ||
      (CL_STATE(c) != CL_LOADING && CL_STATE(c) != CL_ABANDONED)) {
    opt4__fail(OPT4_EINVAL, "position %llu is not claimed by this handle (claim it with "
               "opt4_pool_prefetch_claim first)", (unsigned long long)t);
    return NULL;
  }
  *v_out = v;
  return claim;
}

/* Give a claim up: LOADING goes back to OPEN (its consumer loads); an
 * ABANDONED one is settled (its consumer loaded and will not store). */
static void give_up(opt4_pool *pool, _Atomic uint32_t *claim, uint32_t v) {
  uint32_t c = atomic_load(claim);
  for (;;) {
    if (CL_STATE(c) == CL_LOADING) {
      if (atomic_compare_exchange_weak(claim, &c, CL_OPEN)) break;
      continue;
    }
    /* ABANDONED: nobody will store this ADMIT; its readers must not wait. */
    if (RT_KIND(v) == OPT4_OP_ADMIT)
      mark_failed(pool, RT_GEN(v));
    atomic_store(claim, CL_DONE);
    break;
  }
  opt4__pool_event(pool->h); /* its consumer, waiting in claim_miss */
  count(pool, C_PF_DROPPED, 1);
}

int opt4_pool_prefetch_release(opt4_pool *pool, uint64_t t) {
  if (pool == NULL) return opt4__fail(OPT4_EINVAL, "pool is NULL");
  uint32_t v;
  _Atomic uint32_t *claim = my_claim(pool, t, &v);
  if (claim == NULL) return OPT4_EINVAL;
  give_up(pool, claim, v);
  return 0;
}

/* Copy parts into dst. */
static void gather_into(uint8_t *dst, const opt4_iovec *parts, size_t n_parts) {
  for (size_t i = 0; i < n_parts; i++) {
    memcpy(dst, parts[i].base, parts[i].len);
    dst += parts[i].len;
  }
}

/* A prefetcher far ahead waits for the consumers to come near, however long
 * that takes (a slow training step), without spending its timeout: the
 * timeout bounds only waits once the consumers have reached position t,
 * where a consumer may be waiting for this very item. Each step sleeps on
 * head_seq until the consumers move (at most FAR_WAIT_NS, a bound, not a
 * poll interval); returns 1 while the consumers are behind and nothing
 * interrupted. */
#define FAR_WAIT_NS ((uint64_t)50 * 1000000u)
static int far_ahead(opt4_pool *pool, uint64_t t) {
  return !atomic_load_explicit(&pool->interrupted, memory_order_relaxed) &&
         atomic_load_explicit(&pool->h->head, memory_order_relaxed) + HEAD_BLOCK <= t;
}

static int consumers_behind(opt4_pool *pool, uint64_t t, waiter *w) {
  if (atomic_load_explicit(&pool->interrupted, memory_order_relaxed)) return 0;
  uint64_t head = atomic_load_explicit(&pool->h->head, memory_order_relaxed);
  if (head + HEAD_BLOCK > t) return 0;
  if (pool->safe_point != NULL) pool->safe_point(pool->safe_ctx);
  opt4__pool_head_wait(pool, head, FAR_WAIT_NS, NULL);
  w->spins = 0; /* the timeout starts when they arrive */
  return 1;
}

/* *stored: 1 handed over, 0 given up, 2 (try only) not yet: the item cannot
 * be handed over before the consumers come nearer; try again later. */
static int store_admit(opt4_pool *pool, uint64_t t, uint32_t v, _Atomic uint32_t *claim,
                       const opt4_iovec *parts, size_t n_parts, uint64_t total, int try_only,
                       int *stored) {
  const uint32_t g = RT_GEN(v);
  const gen_rec *gen = &pool->gens[g];
  if (total > (uint64_t)gen->npages * pool->h->page_size) {
    give_up(pool, claim, v);
    return opt4__fail(OPT4_EITEMSIZE, "item %u at position %llu is %llu bytes; its space in "
                      "the pool is %llu", pool->seq[t], (unsigned long long)t,
                      (unsigned long long)total,
                      (unsigned long long)gen->npages * pool->h->page_size);
  }
  /* Wait (bounded) until every page may be taken: the generations this one
   * replaces have had their planned reads. Only then claim STORING, so a
   * consumer waits for a prefetcher only while it loads or copies. */
  waiter w = {0, 0, 0};
  for (uint32_t i = 0; i < gen->npages; i++) {
    const list_ent *ent = &pool->list[gen->list_off + i];
    page_state *ps = &pool->states[ent->page];
    for (;;) {
      uint64_t word = atomic_load_explicit(&ps->word, memory_order_acquire);
      uint32_t tag = PS_GEN(word), st = PS_STATE(word);
      if ((st != PS_EMPTY && tag != NO_GEN && tag >= g) || gen_failed(pool, g) ||
          gen->admit < floor_now(pool)) {
        give_up(pool, claim, v); /* overtaken or skipped: nothing to store */
        return 0;
      }
      if (opt4__may_take(pool, ps, word, ent->prev_gen)) break;
      if (wait_is_slow(&w) && st == PS_WRITING) opt4__recover_dead_writer(pool, ps, word);
      if (try_only && far_ahead(pool, t)) {
        *stored = OPT4_STORE_NOT_YET;
        return 0;
      }
      if (consumers_behind(pool, t, &w)) continue;
      if (opt4__wait_step(pool, &w)) {
        give_up(pool, claim, v);
        return 0;
      }
    }
  }
  uint32_t c = atomic_load(claim), reads_start = 0;
  for (;;) {
    uint32_t next = (c & ~15u) | CL_STORING;
    if (atomic_compare_exchange_weak(claim, &c, next)) break;
  }
  if (CL_STATE(c) == CL_ABANDONED) reads_start = 1; /* its consumer has its own copy */
  int ok = 0;
  int rc = opt4__pool_write(pool, t, parts, n_parts, reads_start, &ok);
  /* READY even if the store failed: the generation is then marked failed
   * and its consumer, like its readers, falls back at once. */
  atomic_store_explicit(claim, reads_start ? CL_DONE : CL_READY, memory_order_release);
  opt4__pool_event(pool->h); /* its consumer, waiting in claim_miss */
  if (rc != 0) return rc;
  if (ok) count(pool, C_PF_STORED, 1);
  *stored = ok ? OPT4_STORE_DONE : OPT4_STORE_GIVEN_UP;
  return 0;
}

/* Move slot s's turn past every BYPASS that is finished with it: DONE
 * (copied out, or settled), or SELF (its consumer loaded it; never staged).
 * A staged one whose position was skipped (below the floor) is retired
 * first; with check_dead, so is an abandoned one whose prefetcher died. */
static void pass_turns(opt4_pool *pool, uint64_t s, int check_dead) {
  const uint64_t B = pool->h->bypasses, slots = pool->h->staging_slots;
  for (;;) {
    uint64_t p = atomic_load_explicit(&pool->slots[s].turn, memory_order_acquire);
    if (p >= B) return;
    _Atomic uint32_t *claim = &pool->bclaim[p];
    uint32_t c = atomic_load_explicit(claim, memory_order_acquire), st = CL_STATE(c);
    if ((st == CL_READY || st == CL_OPEN) && pool->bpos[p] < floor_now(pool)) {
      /* Nobody will copy it out: its consumer, were it still to come,
       * would find DONE and load. */
      atomic_compare_exchange_strong(claim, &c, CL_DONE);
      continue;
    }
    if (st == CL_ABANDONED && check_dead && opt4__claimer_dead(pool, c)) {
      atomic_compare_exchange_strong(claim, &c, CL_DONE);
      continue;
    }
    if (st != CL_DONE && st != CL_SELF) return;
    if (atomic_compare_exchange_strong(&pool->slots[s].turn, &p, p + slots))
      opt4__pool_event(pool->h);
  }
}

static int store_bypass(opt4_pool *pool, uint64_t t, uint32_t v, _Atomic uint32_t *claim,
                        const opt4_iovec *parts, size_t n_parts, uint64_t total, int try_only,
                        int *stored) {
  const uint64_t b = RT_GEN(v), slots = pool->h->staging_slots;
  if (total > pool->h->staging_slot_bytes) {
    give_up(pool, claim, v);
    return opt4__fail(OPT4_EITEMSIZE, "item %u at position %llu is %llu bytes; a staging slot "
                      "holds %llu", pool->seq[t], (unsigned long long)t,
                      (unsigned long long)total, (unsigned long long)pool->h->staging_slot_bytes);
  }
  /* Wait for our turn at the slot: every earlier BYPASS of this slot is
   * done with it (copied out) or never used it (its consumer loaded it). */
  waiter w = {0, 0, 0};
  while (atomic_load_explicit(&pool->slots[b % slots].turn, memory_order_acquire) != b) {
    pass_turns(pool, b % slots, wait_is_slow(&w));
    if (atomic_load_explicit(&pool->slots[b % slots].turn, memory_order_acquire) == b) break;
    if (try_only && CL_STATE(atomic_load(claim)) != CL_ABANDONED && far_ahead(pool, t)) {
      *stored = OPT4_STORE_NOT_YET;
      return 0;
    }
    if (CL_STATE(atomic_load(claim)) != CL_ABANDONED && consumers_behind(pool, t, &w)) continue;
    if (CL_STATE(atomic_load(claim)) == CL_ABANDONED || opt4__wait_step(pool, &w)) {
      give_up(pool, claim, v);
      return 0;
    }
  }
  const uint64_t slot = b % slots;
  gather_into(pool->staging + slot * pool->h->staging_slot_bytes, parts, n_parts);
  atomic_store_explicit(&pool->slots[slot].len, total, memory_order_relaxed);
  uint32_t c = ((pool->rec + 1u) << 4) | CL_LOADING;
  if (atomic_compare_exchange_strong_explicit(claim, &c, CL_READY, memory_order_release,
                                              memory_order_relaxed)) {
    count(pool, C_PF_STORED, 1);
    *stored = OPT4_STORE_DONE;
  } else { /* its consumer stopped waiting and loaded it: the slot is free */
    atomic_store_explicit(claim, CL_DONE, memory_order_release);
    count(pool, C_PF_DROPPED, 1);
  }
  opt4__pool_event(pool->h); /* its consumer, or the slot's next turn */
  return 0;
}

static int prefetch_store(opt4_pool *pool, uint64_t t, const opt4_iovec *parts, size_t n_parts,
                          int try_only, int *stored);

int opt4_pool_prefetch_store(opt4_pool *pool, uint64_t t, const opt4_iovec *parts,
                             size_t n_parts, int *stored) {
  return prefetch_store(pool, t, parts, n_parts, 0, stored);
}

int opt4_pool_prefetch_try_store(opt4_pool *pool, uint64_t t, const opt4_iovec *parts,
                                 size_t n_parts, int *result) {
  return prefetch_store(pool, t, parts, n_parts, 1, result);
}

static int prefetch_store(opt4_pool *pool, uint64_t t, const opt4_iovec *parts, size_t n_parts,
                          int try_only, int *stored) {
  if (pool == NULL || stored == NULL || (parts == NULL && n_parts > 0))
    return opt4__fail(OPT4_EINVAL, "pool, parts or stored is NULL");
  *stored = OPT4_STORE_GIVEN_UP;
  int rc = handle_enter(pool, try_only ? "opt4_pool_prefetch_try_store" : "opt4_pool_prefetch_store");
  if (rc != 0) return rc;
  rc = opt4__pool_register(pool);
  uint32_t v = 0;
  _Atomic uint32_t *claim = rc == 0 ? my_claim(pool, t, &v) : NULL;
  if (rc == 0 && claim == NULL) rc = OPT4_EINVAL;
  if (rc == 0) {
    uint64_t total = 0;
    for (size_t i = 0; i < n_parts; i++) total += parts[i].len;
    rc = RT_KIND(v) == OPT4_OP_ADMIT
             ? store_admit(pool, t, v, claim, parts, n_parts, total, try_only, stored)
             : store_bypass(pool, t, v, claim, parts, n_parts, total, try_only, stored);
  }
  handle_leave(pool);
  return rc;
}

uint64_t opt4__pool_prefetch_ready_at(const opt4_pool *pool, uint64_t t) {
  const uint64_t latest = t >= HEAD_BLOCK - 1 ? t - (HEAD_BLOCK - 1) : 0;
  if (t >= pool->h->accesses) return latest;
  const uint32_t v = pool->rt[t];
  uint64_t ready = 0;
  if (RT_KIND(v) == OPT4_OP_ADMIT) {
    const gen_rec *gen = &pool->gens[RT_GEN(v)];
    for (uint32_t i = 0; i < gen->npages; i++) {
      const uint32_t prev = pool->list[gen->list_off + i].prev_gen;
      if (prev != NO_GEN && pool->gens[prev].last_read > ready) ready = pool->gens[prev].last_read;
    }
  } else if (RT_KIND(v) == OPT4_OP_BYPASS && pool->h->staging_slots != 0) {
    const uint64_t b = RT_GEN(v);
    if (b >= pool->h->staging_slots) ready = pool->bpos[b - pool->h->staging_slots];
  }
  ready &= ~(uint64_t)(HEAD_BLOCK - 1); /* the block that reads it */
  return ready < latest ? ready : latest;
}

int opt4__pool_prefetch_window_full(opt4_pool *pool, uint64_t lookahead) {
  const uint64_t T = pool->h->accesses;
  uint64_t head = atomic_load_explicit(&pool->h->head, memory_order_relaxed);
  uint64_t limit = head + lookahead;
  if (limit > T || limit < head) limit = T;
  return atomic_load_explicit(&pool->h->pf_cursor, memory_order_acquire) >= limit;
}

uint64_t opt4__pool_misses_in(const opt4_pool *pool, uint64_t from, uint64_t span, uint64_t *positions) {
  const uint64_t T = pool->h->accesses;
  uint64_t to = from + span;
  if (to > T || to < from) to = T;
  uint64_t n = 0;
  for (uint64_t t = from; t < to; t++) n += RT_KIND(pool->rt[t]) != OPT4_OP_HIT;
  *positions = to > from ? to - from : 0;
  return n;
}

int opt4_pool_prefetch_pending(opt4_pool *pool, uint64_t from, uint64_t to, uint64_t *pending) {
  if (pool == NULL || pending == NULL) return opt4__fail(OPT4_EINVAL, "pool or pending is NULL");
  if (to > pool->h->accesses) to = pool->h->accesses;
  uint64_t n = 0;
  for (uint64_t t = from; t < to; t++) {
    _Atomic uint32_t *claim = claim_of(pool, pool->rt[t]);
    if (claim == NULL) continue;
    uint32_t st = CL_STATE(atomic_load_explicit(claim, memory_order_acquire));
    n += st == CL_OPEN || st == CL_LOADING || st == CL_STORING;
  }
  *pending = n;
  return 0;
}
