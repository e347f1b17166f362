/*
 * runtime.c - following the plan at run time, across processes.
 *
 * The protocol (docs/runtime.md has the full argument):
 *
 * Generations. Every ADMIT at position a starts generation g (numbered in
 * position order) that owns some pages; the HITs that read what it stored
 * are its reads. The meta segment gives, per position, its kind and
 * generation, and per generation its admit position, its number of reads,
 * its last read, and its pages with, for each, the generation that owned the
 * page before (its predecessor there). The pages are the pool's choice, not
 * the plan's (meta.c): a generation's pages are free after its last read,
 * and an ADMIT takes those freed longest ago, so a predecessor's last read
 * always comes before its successor's ADMIT, and with spare pages long
 * before it.
 *
 * Page words. Each page has word = (generation << 32 | state) with states
 * EMPTY, WRITING, READY, FAILED, and reads = (generation << 32 | count).
 *
 * Reader (HIT of g): for each page, wait until word == (g, READY); announce
 * the page in this process's record (hazard), full fence, re-read the word:
 * if unchanged the bytes cannot change until the hazard is cleared. Copy,
 * count the read (only if reads still carries g), clear the hazard.
 *
 * Writer (ADMIT of g): for each page, wait until its predecessor p has been
 * written and read as many times as the plan says (or failed, or lies wholly
 * below the floor), then CAS the word to (g, WRITING), full fence, and wait
 * until no record announces the page. Then write, and publish (g, READY)
 * with a release store.
 *
 * Why it is exact: a write waits for exactly the reads the plan gives its
 * predecessor, and a read waits for exactly its generation, so with all
 * positions run the pool serves every HIT. Why it is safe: bytes are copied
 * only between a hazard announcement and its clearing, and a writer that has
 * claimed a page does not write until no hazard names it (the fences make
 * one side see the other). Why nothing hangs: every wait is for an earlier
 * position, every wait is bounded (then the caller loads from the source,
 * counted), and dead processes are detected by pid and start time: a dead
 * reader's hazard is cleared, a dead writer's generation marked failed.
 * A batch consumer that commits after its whole batch still owes its
 * earlier positions while it gets later ones: it never waits for itself
 * (DEFER for a HIT on its own ADMIT, AGAIN for a prefetcher's claim whose
 * store may wait for its own; see opt4_pool_get).
 */
#include "runtime.h"

#include <sched.h>
#include <string.h>
#include <time.h>

/* ---- waiting ---- */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Waits for a page, a claim or a staging slot all go the same way: check
 * the condition, and if it does not hold, take a wait step; again until it
 * holds or the pool's timeout passes. A step spins (64 times), then yields
 * (64 times), then sleeps on event_seq, the pool's futex word for "something
 * a wait looks for has changed", for at most 20 us at first, doubling to
 * 1 ms. Whoever makes such a change (a page published, written or failed; a
 * generation's last planned read; a hazard cleared under a writer; a claim
 * or a slot settled; the floor moved; an interrupt; a fork's park) bumps
 * event_seq after it and wakes the sleepers, so a wait ends as soon as its
 * condition can hold, not at the end of a sleep. The sleeps stay bounded:
 * a process that died changes nothing, so a wait looks for dead ones now
 * and then (wait_is_slow), and a change that bumps nothing (a bug) costs at
 * most a millisecond, never a hang.
 *
 * No wake-up is lost. Each step reads event_seq last, so the next check of
 * the condition comes after that read; the next sleep is only while
 * event_seq still holds it. A changer stores its change, then bumps
 * event_seq, then reads event_waiters; a sleeper adds itself to
 * event_waiters, then sleeps while event_seq holds what it read (the kernel
 * compares), all sequentially consistent. If the bump came before the
 * sleeper's read, its check saw the change; if after, either the kernel
 * sees the new value and does not sleep, or the changer sees the sleeper
 * counted and wakes it. Only the wake-up system call waits for a sleeper:
 * a change costs one atomic add on a line of its own. A process killed
 * while it sleeps stays counted in event_waiters: every later change then
 * makes a wake-up call that finds nobody (a cost, never a hang). */
void opt4__pool_event(pool_header *h) {
  atomic_fetch_add(&h->event_seq, 1);
  if (atomic_load(&h->event_waiters) != 0) opt4__futex_wake(&h->event_seq, 1);
}

/* One step of a bounded wait (above). Returns 1 once the pool's timeout has
 * passed, or the handle was interrupted. */
int opt4__wait_step(const opt4_pool *pool, waiter *w) {
  pool_header *h = pool->h;
  if (atomic_load_explicit(&((opt4_pool *)pool)->interrupted, memory_order_relaxed)) return 1;
  if (w->spins == 0) w->start = opt4__now_ns();
  w->spins++;
  if (w->spins < 64) {
    cpu_relax();
  } else {
    if (opt4__now_ns() - w->start > pool->timeout_ns) return 1;
    if (w->spins < 128) {
      sched_yield();
    } else {
      if (pool->safe_point != NULL) w->start += pool->safe_point(pool->safe_ctx);
      uint32_t shift = (w->spins - 128) / 16;
      uint64_t ns = (uint64_t)20000 << (shift > 6 ? 6 : shift);
      atomic_fetch_add(&h->event_waiters, 1);
      opt4__futex_wait(&h->event_seq, w->seq, ns > 1000000u ? 1000000u : ns, 1);
      atomic_fetch_sub(&h->event_waiters, 1);
    }
  }
  w->seq = atomic_load(&h->event_seq);
  return 0;
}

static void wait_done(opt4_pool *pool, const waiter *w) {
  if (w->spins == 0) return;
  count(pool, C_WAITS, 1);
  count(pool, C_WAIT_NS, opt4__now_ns() - w->start);
}

/* A page seen stuck in WRITING by generation x (word w): if no live process
 * says it is writing x, its writer died; mark x failed so that nobody waits
 * for it.
 *
 * "Nobody says so" is not enough by itself: a writer announces x in its
 * record before it claims the page and clears the record only after it has
 * published every page READY, so a live writer that finished between our
 * load of w and our scan is found by nobody either. The page then no longer
 * holds w. So the verdict is the CAS from w to FAILED, made after the scan:
 * it succeeds only if the page is still WRITING x, which (seq_cst loads of
 * the records, published READY before the record is cleared) means that no
 * live writer held it during the scan. Marking x failed before that check
 * failed a generation that had just been stored: its successors took its
 * pages before its reads, and a planned HIT fell back (1 in 50 runs of 200
 * fork epochs under load; test_pool's test_finished_writer_is_not_dead). */
void opt4__recover_dead_writer(opt4_pool *pool, page_state *ps, uint64_t w) {
  uint32_t x = PS_GEN(w);
  for (uint32_t i = 0; i < pool->h->max_procs; i++) {
    proc_rec *r = &pool->procs[i];
    if (atomic_load(&r->writing) != (uint64_t)x + 1) continue;
    if (!opt4__pool_reclaim_if_dead(pool, i)) return; /* a live writer */
  }
  if (atomic_compare_exchange_strong(&ps->word, &w, PS_WORD(x, PS_FAILED))) mark_failed(pool, x);
}

/* ---- reading ---- */

static int in_batch(const uint64_t *batch, size_t n, uint64_t pos) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (batch[mid] < pos)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && batch[lo] == pos;
}

/* Count a read of generation g on page ps. The read that completes the
 * plan's reads (plus the ADMIT's own, see opt4__may_take) is what a writer
 * of the page's next generation waits for: it bumps event_seq. */
static void count_read(opt4_pool *pool, page_state *ps, uint32_t g) {
  uint64_t r = atomic_load_explicit(&ps->reads, memory_order_relaxed);
  while (PS_GEN(r) == g) {
    if (atomic_compare_exchange_weak_explicit(&ps->reads, &r, r + 1, memory_order_release,
                                              memory_order_relaxed)) {
      if ((uint32_t)r + 1u >= pool->gens[g].reads + 1u) opt4__pool_event(pool->h);
      return;
    }
  }
}

/* ---- waiting for the consumers ----
 *
 * Prefetchers that are ahead (nothing to claim in their window, or an item
 * that must wait for the consumers to come near) sleep on head_seq, a
 * 32-bit futex word beside the 64-bit head, shared across processes. The
 * consumer that moves head bumps head_seq and calls futex_wake, but only
 * when head_waiters says someone sleeps: a consumer's access costs nothing
 * more (head moves once per 32 positions), and a wake-up system call only
 * when a prefetcher actually waits.
 *
 * No wake-up is lost. A sleeper announces itself (head_waiters + 1), then
 * reads head_seq, then checks its condition (head, interrupted, park), then
 * sleeps while head_seq still holds what it read; a mover changes head,
 * then bumps head_seq, then reads head_waiters, all sequentially
 * consistent. Either the mover sees the sleeper announced and wakes it, or
 * the sleeper's announcement comes after the mover's read: then its read of
 * head_seq comes after the bump, and its check sees the new head. A sleeper
 * waits for head to reach a block and sleeps on that block's bit; the mover
 * wakes the bits of every block it reached, so a sleeper whose block was
 * reached is among those woken, and the argument holds per bit. The
 * same holds for opt4_pool_interrupt and opt4__pool_head_kick, which bump
 * head_seq after they set what the sleeper checks (interrupted, park). */

static void head_bump_bits(pool_header *h, uint32_t bits) {
  atomic_fetch_add(&h->head_seq, 1);
  if (atomic_load(&h->head_waiters) != 0) opt4__futex_wake_bits(&h->head_seq, 1, bits);
}

/* Every sleeper: what it checks besides head changed (interrupted, park,
 * the floor), or it is to look again (the depth shrank). */
static void head_bump(pool_header *h) { head_bump_bits(h, HEAD_ALL_BLOCKS); }

/* Which sleepers a move of head from `from` to `to` concerns: a sleeper
 * waits for head to reach a block (a multiple of HEAD_BLOCK) and sleeps on
 * that block's bit (its number modulo 32), so a move wakes the bits of the
 * blocks it reached. A sleeper whose block shares a bit with a nearer one
 * (32 blocks apart) is woken early, looks, and sleeps again. */
static uint32_t head_bits(uint64_t from, uint64_t to) {
  const uint64_t b0 = from / HEAD_BLOCK, b1 = to / HEAD_BLOCK;
  if (b1 - b0 >= 32) return HEAD_ALL_BLOCKS;
  uint32_t bits = 0;
  for (uint64_t b = b0 + 1; b <= b1; b++) bits |= 1u << (b % 32);
  return bits;
}

/* Consumers' progress, for the prefetchers' window: the furthest position
 * asked for, rounded down to a multiple of 32 so that a CAS on this shared
 * line is needed once per 32 positions, not per access. */
static inline void advance_head(opt4_pool *pool, uint64_t t) {
  uint64_t want = t & ~(uint64_t)(HEAD_BLOCK - 1);
  uint64_t cur = atomic_load_explicit(&pool->h->head, memory_order_relaxed);
  while (want > cur) {
    if (atomic_compare_exchange_weak_explicit(&pool->h->head, &cur, want, memory_order_relaxed,
                                              memory_order_relaxed)) {
      head_bump_bits(pool->h, head_bits(cur, want));
      return;
    }
  }
}

uint64_t opt4__pool_head(const opt4_pool *pool) {
  return atomic_load_explicit(&pool->h->head, memory_order_relaxed);
}

void opt4__pool_head_kick(opt4_pool *pool) {
  if (pool == NULL) return;
  head_bump(pool->h);
  opt4__pool_event(pool->h); /* a thread asked to park may sleep on either word */
}

int opt4__pool_head_wait(opt4_pool *pool, uint64_t seen, uint64_t timeout_ns,
                         const _Atomic uint32_t *unless) {
  return opt4__pool_head_wait_for(pool, seen + 1, timeout_ns, unless); /* head only grows */
}

int opt4__pool_head_wait_for(opt4_pool *pool, uint64_t target, uint64_t timeout_ns,
                             const _Atomic uint32_t *unless) {
  pool_header *h = pool->h;
  /* head is a multiple of HEAD_BLOCK: reaching target is reaching its block. */
  const uint64_t block = (target + HEAD_BLOCK - 1) / HEAD_BLOCK;
  const uint32_t bit = 1u << (block % 32);
  atomic_fetch_add(&h->head_waiters, 1);
  uint32_t seq = atomic_load(&h->head_seq);
  int timed_out = 0;
  if (atomic_load(&h->head) < target && !atomic_load(&pool->interrupted) &&
      (unless == NULL || atomic_load(unless) == 0) && (pool->park == NULL || atomic_load(pool->park) == 0))
    timed_out = opt4__futex_wait_bits(&h->head_seq, seq, timeout_ns, 1, bit);
  atomic_fetch_sub(&h->head_waiters, 1);
  return timed_out;
}

int opt4_pool_wait_head(opt4_pool *pool, uint64_t target, uint64_t timeout_ns, int *reached) {
  if (pool == NULL || reached == NULL) return opt4__fail(OPT4_EINVAL, "pool or reached is NULL");
  if (atomic_load(&pool->h->head) < target) opt4__pool_head_wait_for(pool, target, timeout_ns, NULL);
  *reached = atomic_load(&pool->h->head) >= target;
  return 0;
}

int opt4_pool_head(const opt4_pool *pool, uint64_t *head) {
  if (pool == NULL || head == NULL) return opt4__fail(OPT4_EINVAL, "pool or head is NULL");
  *head = atomic_load(&pool->h->head);
  return 0;
}

int opt4_pool_interrupt(opt4_pool *pool) {
  if (pool == NULL) return opt4__fail(OPT4_EINVAL, "pool is NULL");
  atomic_store(&pool->interrupted, 1);
  head_bump(pool->h);        /* this handle's thread may sleep on head_seq */
  opt4__pool_event(pool->h); /* or on event_seq */
  return 0;
}

/* Clear this process's hazard on page ps, pinned while it held word. A
 * writer that claimed the page since (the word moved on) may be waiting for
 * exactly this (wait_hazards): tell it. The store and the load are
 * sequentially consistent, as the writer's claim and its read of the
 * hazards are, so either it sees the hazard cleared or we see its claim. */
static inline void unpin(opt4_pool *pool, proc_rec *me, page_state *ps, uint64_t word) {
  atomic_store(&me->hazard, 0);
  if (atomic_load(&ps->word) != word) opt4__pool_event(pool->h);
}

/* Copy generation g out of its pages into dst (the HIT path, also taken by an
 * ADMIT that a prefetcher stored). Returns OPT4_GET_HIT, OPT4_GET_TOO_SMALL
 * (res->len set) or OPT4_GET_LOAD (fallback, counted). */
static uint32_t read_gen(opt4_pool *pool, uint32_t g, void *dst, size_t dst_cap, waiter *w,
                         uint64_t *len_out) {
  const gen_rec *gen = &pool->gens[g];
  proc_rec *me = my_rec(pool);
  const uint64_t page_size = pool->h->page_size;
  uint64_t len = 0, copied = 0;
  for (uint32_t i = 0; i < gen->npages; i++) {
    const list_ent *ent = &pool->list[gen->list_off + i];
    page_state *ps = &pool->states[ent->page];
    uint64_t word;
    for (;;) {
      word = atomic_load_explicit(&ps->word, memory_order_acquire);
      uint32_t tag = PS_GEN(word), st = PS_STATE(word);
      if (tag == g && st == PS_READY) {
        atomic_store_explicit(&me->hazard, (uint64_t)ent->page + 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load_explicit(&ps->word, memory_order_acquire) == word) break;
        unpin(pool, me, ps, word);
        continue;
      }
      /* Not (or no longer) ours to read: give up at once when waiting
       * cannot help. */
      if ((tag == g && st == PS_FAILED) || gen_failed(pool, g) ||
          (st != PS_EMPTY && tag != NO_GEN && tag > g) || gen->admit < floor_now(pool))
        return OPT4_GET_LOAD;
      if (wait_is_slow(w) && tag == g && st == PS_WRITING) opt4__recover_dead_writer(pool, ps, word);
      if (opt4__wait_step(pool, w)) {
        count(pool, C_TIMEOUTS, 1);
        return OPT4_GET_LOAD;
      }
    }
    /* Pinned: the bytes of page ent->page belong to g until we clear. */
    if (i == 0) {
      len = atomic_load_explicit(&ps->len, memory_order_relaxed);
      if (len > dst_cap) {
        unpin(pool, me, ps, word);
        *len_out = len;
        return OPT4_GET_TOO_SMALL;
      }
    }
    uint64_t chunk = len - copied < page_size ? len - copied : page_size;
    memcpy((uint8_t *)dst + copied, pool->payload + (uint64_t)ent->page * page_size, chunk);
    copied += chunk;
    count_read(pool, ps, g);
    unpin(pool, me, ps, word);
  }
  *len_out = len;
  return OPT4_GET_HIT;
}

/* Whether this caller, serving batch (sorted) up to position t, has an
 * ADMIT earlier in the batch that it claimed to load itself (CL_SELF) and
 * has not stored yet: a batch consumer that commits after the whole batch
 * (the Python worker: get_batch, then load, then store_batch) still owes
 * it. A consumer that stores each ADMIT as it goes never does. */
static int owes_earlier_store(const opt4_pool *pool, const uint64_t *batch, size_t batch_len,
                              uint64_t t) {
  for (size_t k = 0; k < batch_len && batch[k] < t; k++) {
    uint32_t v = pool->rt[batch[k]];
    if (RT_KIND(v) != OPT4_OP_ADMIT) continue;
    uint32_t g = RT_GEN(v);
    if (CL_STATE(atomic_load_explicit(&pool->gclaim[g], memory_order_acquire)) != CL_SELF ||
        pool->gens[g].npages == 0 || gen_failed(pool, g))
      continue;
    uint64_t w = atomic_load_explicit(
        &pool->states[pool->list[pool->gens[g].list_off].page].word, memory_order_acquire);
    uint32_t tag = PS_GEN(w);
    if (tag == NO_GEN || tag < g || (tag == g && PS_STATE(w) == PS_WRITING)) return 1;
  }
  return 0;
}

/* A consumer's claim on a miss (claims[k]) at position t of batch (which
 * may be NULL): returns the state it found settled: CL_SELF (load it
 * yourself), CL_READY (prefetched), or CL_ABANDONED (waited too long for a
 * prefetcher: load, never store). A claim in flight is waited for, bounded,
 * and counted as a stall; except that when the caller owes a store earlier
 * in its batch, it returns CL_AGAIN at once, untouched: the prefetcher's
 * store may be waiting for that very store (it replaces what the caller
 * admitted), so the caller commits first and asks again. The claim
 * protocol as a whole, and the prefetchers' side of it, are prefetch.c's. */
static uint32_t claim_miss(opt4_pool *pool, _Atomic uint32_t *claim, const uint64_t *batch,
                           size_t batch_len, uint64_t t) {
  uint32_t c = atomic_load_explicit(claim, memory_order_acquire);
  if (CL_STATE(c) == CL_OPEN &&
      atomic_compare_exchange_strong_explicit(claim, &c, CL_SELF, memory_order_acq_rel,
                                              memory_order_acquire))
    return CL_SELF;
  waiter w = {0, 0, 0};
  uint32_t got;
  for (;;) {
    uint32_t st = CL_STATE(c);
    if (st == CL_OPEN) {
      if (atomic_compare_exchange_strong(claim, &c, CL_SELF)) {
        got = CL_SELF;
        break;
      }
      continue;
    }
    if (st == CL_SELF) {
      /* Served before, by a consumer that may have died before it stored:
       * load and store again. The put stores it, or finds it written or
       * being written and marks the generation failed, so its readers never
       * wait for a store that will not come (test_pool_kill). */
      got = CL_SELF;
      break;
    }
    if (st == CL_READY || st == CL_ABANDONED || st == CL_DONE || st == CL_READING) {
      /* ABANDONED/DONE/READING here: this position was served before (a
       * retry): load. READY: take it. */
      got = st == CL_READY ? CL_READY : CL_ABANDONED;
      break;
    }
    /* LOADING or STORING: a prefetcher has it in hand. */
    if (w.spins == 0 && batch != NULL && owes_earlier_store(pool, batch, batch_len, t))
      return CL_AGAIN;
    int timed_out = opt4__wait_step(pool, &w);
    if (timed_out || (wait_is_slow(&w) && opt4__claimer_dead(pool, c))) {
      /* The owner's record stays in the word, so that whoever needs the
       * claim settled can tell a dead owner from a slow one. */
      if (atomic_compare_exchange_strong(claim, &c, (c & ~15u) | CL_ABANDONED)) {
        opt4__pool_event(pool->h); /* a prefetcher waiting for a slot's turn gives up */
        if (timed_out) count(pool, C_TIMEOUTS, 1);
        got = CL_ABANDONED;
        break;
      }
      continue; /* it moved on: look again */
    }
    c = atomic_load_explicit(claim, memory_order_acquire);
  }
  if (w.spins) {
    count(pool, C_PF_STALLS, 1);
    count(pool, C_PF_STALL_NS, opt4__now_ns() - w.start);
  }
  return got;
}

/* res for a read of the pool (read_gen's st): a HIT, counted as counter,
 * with reason; TOO_SMALL; or a fallback to the source, counted. */
static int read_result(opt4_pool *pool, uint32_t st, uint64_t len, int counter, uint32_t reason,
                       opt4_get_result *res) {
  if (st == OPT4_GET_HIT) {
    count(pool, counter, 1);
    res->status = OPT4_GET_HIT;
    res->reason = reason;
    res->len = len;
  } else if (st == OPT4_GET_TOO_SMALL) {
    res->status = st;
    res->len = len;
  } else {
    count(pool, C_FALLBACKS, 1);
    res->status = OPT4_GET_LOAD;
    res->reason = OPT4_REASON_FALLBACK;
  }
  return 0;
}

static int get_entered(opt4_pool *pool, uint64_t t, const uint64_t *batch, size_t batch_len,
                       void *dst, size_t dst_cap, opt4_get_result *res);

int opt4_pool_get(opt4_pool *pool, uint64_t t, const uint64_t *batch, size_t batch_len,
                  void *dst, size_t dst_cap, opt4_get_result *res) {
  if (pool == NULL || res == NULL || (dst == NULL && dst_cap > 0))
    return opt4__fail(OPT4_EINVAL, "pool, dst or res is NULL");
  int rc = handle_enter(pool, "opt4_pool_get");
  if (rc != 0) return rc;
  rc = get_entered(pool, t, batch, batch_len, dst, dst_cap, res);
  handle_leave(pool);
  return rc;
}

/* opt4_pool_get, inside the handle. */
static int get_entered(opt4_pool *pool, uint64_t t, const uint64_t *batch, size_t batch_len,
                       void *dst, size_t dst_cap, opt4_get_result *res) {
  if (t >= pool->h->accesses)
    return opt4__fail(OPT4_ERANGE, "position %llu is past the plan's %llu accesses",
                      (unsigned long long)t, (unsigned long long)pool->h->accesses);
  int rc = opt4__pool_register(pool);
  if (rc != 0) return rc;
  memset(res, 0, sizeof *res);
  advance_head(pool, t);
  const uint32_t v = pool->rt[t];
  res->item = pool->seq[t];
  const uint32_t g = RT_GEN(v);
  waiter w = {0, 0, 0};
  uint64_t len = 0;
  uint32_t st;
  switch (RT_KIND(v)) {
  case OPT4_OP_BYPASS:
    if (pool->bclaim != NULL) {
      uint32_t got = claim_miss(pool, &pool->bclaim[g], batch, batch_len, t);
      if (got == CL_AGAIN) {
        res->status = OPT4_GET_AGAIN;
        return 0;
      }
      if (got == CL_READY) {
        /* Ours alone from READING until DONE: no prefetcher writes the slot
         * while its claim is READING. */
        uint32_t c = CL_READY;
        if (atomic_compare_exchange_strong(&pool->bclaim[g], &c, CL_READING)) {
          uint64_t slot = g % pool->h->staging_slots;
          len = atomic_load_explicit(&pool->slots[slot].len, memory_order_relaxed);
          if (len > dst_cap) {
            atomic_store_explicit(&pool->bclaim[g], CL_READY, memory_order_release);
            res->status = OPT4_GET_TOO_SMALL;
            res->len = len;
            return 0;
          }
          memcpy(dst, pool->staging + slot * pool->h->staging_slot_bytes, len);
          atomic_store_explicit(&pool->bclaim[g], CL_DONE, memory_order_release);
          opt4__pool_event(pool->h); /* the prefetcher with the slot's next turn */
          count(pool, C_PF_SERVED, 1);
          res->status = OPT4_GET_HIT;
          res->reason = OPT4_REASON_PREFETCHED;
          res->len = len;
          return 0;
        }
      }
    }
    res->status = OPT4_GET_LOAD;
    res->reason = OPT4_REASON_BYPASS;
    count(pool, C_BYPASSES, 1);
    return 0;
  case OPT4_OP_ADMIT: {
    uint32_t got = claim_miss(pool, &pool->gclaim[g], batch, batch_len, t);
    if (got == CL_AGAIN) {
      res->status = OPT4_GET_AGAIN;
      return 0;
    }
    if (got == CL_SELF) {
      res->status = OPT4_GET_LOAD;
      res->reason = OPT4_REASON_ADMIT;
      count(pool, C_ADMITS, 1);
      return 0;
    }
    /* Abandoned, or stored and then lost: load, and leave the store to the
     * prefetcher that holds it. */
    st = OPT4_GET_LOAD;
    if (got == CL_READY) {
      st = read_gen(pool, g, dst, dst_cap, &w, &len);
      wait_done(pool, &w);
    }
    return read_result(pool, st, len, C_PF_SERVED, OPT4_REASON_PREFETCHED, res);
  }
  default: break;
  }
  const gen_rec *gen = &pool->gens[g];
  /* A HIT on an item this caller loads itself earlier in the same batch is
   * served from that copy. (One a prefetcher stored is read from the pool.) */
  if (batch != NULL && gen->admit != t && in_batch(batch, batch_len, gen->admit) &&
      CL_STATE(atomic_load_explicit(&pool->gclaim[g], memory_order_acquire)) == CL_SELF) {
    res->status = OPT4_GET_DEFER;
    res->defer_to = gen->admit;
    count(pool, C_DEFERRED, 1);
    return 0;
  }
  st = read_gen(pool, g, dst, dst_cap, &w, &len);
  wait_done(pool, &w);
  return read_result(pool, st, len, C_HITS, 0, res);
}

int opt4_pool_note_read(opt4_pool *pool, uint64_t t) {
  if (pool == NULL) return opt4__fail(OPT4_EINVAL, "pool is NULL");
  if (t >= pool->h->accesses) return opt4__fail(OPT4_ERANGE, "position past the plan");
  uint32_t v = pool->rt[t];
  if (RT_KIND(v) != OPT4_OP_HIT) return opt4__fail(OPT4_EINVAL, "position %llu is not a HIT", (unsigned long long)t);
  const gen_rec *gen = &pool->gens[RT_GEN(v)];
  for (uint32_t i = 0; i < gen->npages; i++)
    count_read(pool, &pool->states[pool->list[gen->list_off + i].page], RT_GEN(v));
  return 0;
}

/* ---- writing ---- */

/* Whether generation g may take a page whose word is w, given its
 * predecessor prev there. */
int opt4__may_take(const opt4_pool *pool, page_state *ps, uint64_t w, uint32_t prev) {
  uint32_t tag = PS_GEN(w), st = PS_STATE(w);
  if (st == PS_WRITING) return 0;
  if (st == PS_EMPTY || st == PS_FAILED) {
    /* Nothing to protect; but if the predecessor has yet to be written,
     * wait for it (unless it never will be). */
    if (prev == NO_GEN || tag == prev) return 1;
    return gen_failed(pool, prev) || pool->gens[prev].admit < floor_now(pool);
  }
  /* READY: its owner's reads must be done, or never coming. */
  uint64_t floor = floor_now(pool);
  if (tag != prev && prev != NO_GEN && !gen_failed(pool, prev) && pool->gens[prev].admit >= floor)
    return 0; /* the predecessor is still to come */
  uint64_t r = atomic_load_explicit(&ps->reads, memory_order_acquire);
  /* The plan's reads, plus one: the ADMIT's own consumer, who may read it
   * from the pool when a prefetcher stored it. */
  if (PS_GEN(r) == tag && (uint32_t)r >= pool->gens[tag].reads + 1u) return 1;
  return pool->gens[tag].last_read < floor;
}

/* Wait until no process announces page (hazard); clears dead readers. */
static int wait_hazards(opt4_pool *pool, uint32_t page, waiter *w) {
  for (uint32_t i = 0; i < pool->h->max_procs; i++) {
    proc_rec *r = &pool->procs[i];
    while (atomic_load_explicit(&r->hazard, memory_order_acquire) == (uint64_t)page + 1) {
      if (wait_is_slow(w) && opt4__pool_reclaim_if_dead(pool, i)) break;
      if (opt4__wait_step(pool, w)) return 1;
    }
  }
  return 0;
}

static int put_entered(opt4_pool *pool, uint64_t t, const opt4_iovec *parts, size_t n_parts,
                       uint32_t reads_start, int *stored);

static int put_impl(opt4_pool *pool, const char *call, uint64_t t, const opt4_iovec *parts,
                    size_t n_parts, uint32_t reads_start, int *stored) {
  if (pool == NULL) return opt4__fail(OPT4_EINVAL, "pool, parts or stored is NULL");
  int rc = handle_enter(pool, call);
  if (rc != 0) return rc;
  rc = put_entered(pool, t, parts, n_parts, reads_start, stored);
  handle_leave(pool);
  return rc;
}

/* put_impl inside the handle (and opt4__pool_write, whose caller is). */
static int put_entered(opt4_pool *pool, uint64_t t, const opt4_iovec *parts, size_t n_parts,
                       uint32_t reads_start, int *stored) {
  if (pool == NULL || stored == NULL || (parts == NULL && n_parts > 0))
    return opt4__fail(OPT4_EINVAL, "pool, parts or stored is NULL");
  *stored = 0;
  if (t >= pool->h->accesses)
    return opt4__fail(OPT4_ERANGE, "position %llu is past the plan's %llu accesses",
                      (unsigned long long)t, (unsigned long long)pool->h->accesses);
  const uint32_t v = pool->rt[t];
  if (RT_KIND(v) != OPT4_OP_ADMIT)
    return opt4__fail(OPT4_EINVAL, "position %llu is not an ADMIT", (unsigned long long)t);
  int rc = opt4__pool_register(pool);
  if (rc != 0) return rc;
  const uint32_t g = RT_GEN(v);
  const gen_rec *gen = &pool->gens[g];
  const uint64_t page_size = pool->h->page_size;
  uint64_t total = 0;
  for (size_t i = 0; i < n_parts; i++) total += parts[i].len;
  if (total > (uint64_t)gen->npages * page_size) {
    mark_failed(pool, g);
    count(pool, C_STORE_FAILED, 1);
    return opt4__fail(OPT4_EITEMSIZE, "item %u at position %llu is %llu bytes; its space in "
                      "the pool is %llu", pool->seq[t], (unsigned long long)t,
                      (unsigned long long)total, (unsigned long long)gen->npages * page_size);
  }
  proc_rec *me = my_rec(pool);
  atomic_store(&me->writing, (uint64_t)g + 1);
  waiter w = {0, 0, 0};
  uint32_t claimed = 0;
  for (uint32_t i = 0; i < gen->npages; i++) {
    const list_ent *ent = &pool->list[gen->list_off + i];
    page_state *ps = &pool->states[ent->page];
    for (;;) {
      uint64_t word = atomic_load_explicit(&ps->word, memory_order_acquire);
      uint32_t tag = PS_GEN(word), st = PS_STATE(word);
      if (st != PS_EMPTY && tag != NO_GEN && tag >= g) { /* overtaken: too late */
        goto abandon;
      }
      if (opt4__may_take(pool, ps, word, ent->prev_gen) &&
          atomic_compare_exchange_strong(&ps->word, &word, PS_WORD(g, PS_WRITING)))
        break;
      if (wait_is_slow(&w) && st == PS_WRITING) opt4__recover_dead_writer(pool, ps, word);
      if (opt4__wait_step(pool, &w)) {
        count(pool, C_TIMEOUTS, 1);
        goto abandon;
      }
    }
    claimed++;
    atomic_thread_fence(memory_order_seq_cst);
    if (wait_hazards(pool, ent->page, &w)) {
      count(pool, C_TIMEOUTS, 1);
      goto abandon;
    }
    atomic_store_explicit(&ps->reads, PS_WORD(g, reads_start), memory_order_relaxed);
  }
  /* All pages are ours: gather the parts into them. */
  {
    uint32_t page_i = 0;
    uint64_t page_off = 0;
    for (size_t i = 0; i < n_parts; i++) {
      const uint8_t *src = parts[i].base;
      uint64_t left = parts[i].len;
      while (left > 0) {
        uint64_t room = page_size - page_off, n = left < room ? left : room;
        uint32_t page = pool->list[gen->list_off + page_i].page;
        memcpy(pool->payload + (uint64_t)page * page_size + page_off, src, n);
        src += n;
        left -= n;
        page_off += n;
        if (page_off == page_size) {
          page_i++;
          page_off = 0;
        }
      }
    }
  }
  atomic_store_explicit(&pool->states[pool->list[gen->list_off].page].len, total,
                        memory_order_relaxed);
  for (uint32_t i = 0; i < gen->npages; i++)
    atomic_store_explicit(&pool->states[pool->list[gen->list_off + i].page].word,
                          PS_WORD(g, PS_READY), memory_order_release);
  opt4__pool_event(pool->h);
  atomic_store_explicit(&me->writing, 0, memory_order_release);
  wait_done(pool, &w);
  count(pool, C_STORED, 1);
  *stored = 1;
  return 0;
abandon:
  /* Pages already claimed become FAILED (nothing in them to read); the
   * generation is marked failed so its readers and successors stop waiting. */
  mark_failed(pool, g);
  for (uint32_t i = 0; i < claimed; i++)
    atomic_store_explicit(&pool->states[pool->list[gen->list_off + i].page].word,
                          PS_WORD(g, PS_FAILED), memory_order_release);
  opt4__pool_event(pool->h);
  atomic_store_explicit(&me->writing, 0, memory_order_release);
  wait_done(pool, &w);
  count(pool, C_STORE_FAILED, 1);
  return 0;
}

/* For prefetch.c (store_admit, whose caller has entered the handle). The
 * body stays static: with put_entered itself external, GCC 12 -fsanitize=thread -O2 refuses its
 * atomic_thread_fence (-Werror=tsan), which it accepts while it is static. */
int opt4__pool_write(opt4_pool *pool, uint64_t t, const opt4_iovec *parts, size_t n_parts,
                     uint32_t reads_start, int *stored) {
  return put_entered(pool, t, parts, n_parts, reads_start, stored);
}

int opt4_pool_put(opt4_pool *pool, uint64_t t, const opt4_iovec *parts, size_t n_parts,
                  int *stored) {
  /* The caller has the item in hand: its own read is done. */
  return put_impl(pool, "opt4_pool_put", t, parts, n_parts, 1, stored);
}

int opt4_pool_warm(opt4_pool *pool, uint64_t admit, const opt4_iovec *parts, size_t n_parts,
                   uint32_t reads_before, int *stored) {
  if (reads_before == UINT32_MAX) return opt4__fail(OPT4_EINVAL, "reads_before is out of range");
  int rc = put_impl(pool, "opt4_pool_warm", admit, parts, n_parts, reads_before + 1, stored);
  if (rc == 0) atomic_store(&pool->gclaim[RT_GEN(pool->rt[admit])], CL_SELF);
  return rc;
}

int opt4_pool_space(const opt4_pool *pool, uint64_t t, uint64_t *bytes) {
  if (pool == NULL || bytes == NULL) return opt4__fail(OPT4_EINVAL, "pool or bytes is NULL");
  if (t >= pool->h->accesses) return opt4__fail(OPT4_ERANGE, "position past the plan");
  uint32_t v = pool->rt[t];
  if (RT_KIND(v) == OPT4_OP_BYPASS)
    *bytes = pool->bclaim != NULL ? pool->h->staging_slot_bytes : 0;
  else
    *bytes = (uint64_t)pool->gens[RT_GEN(v)].npages * pool->h->page_size;
  return 0;
}

int opt4_pool_live_at(opt4_pool *pool, uint64_t p, uint64_t *admits, uint32_t *items,
                      uint32_t *reads_before, size_t cap, size_t *n) {
  if (pool == NULL || n == NULL) return opt4__fail(OPT4_EINVAL, "pool or n is NULL");
  if (p > pool->h->accesses) return opt4__fail(OPT4_ERANGE, "position past the plan");
  const uint64_t G = pool->h->generations;
  uint32_t *before = opt4__calloc((size_t)(G ? G : 1), sizeof(uint32_t));
  if (before == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for %llu generations", (unsigned long long)G);
  uint64_t last_gen = 0; /* generations are numbered in admit order */
  for (uint64_t t = 0; t < p; t++) {
    uint32_t v = pool->rt[t];
    if (RT_KIND(v) == OPT4_OP_HIT) before[RT_GEN(v)]++;
    if (RT_KIND(v) == OPT4_OP_ADMIT) last_gen = (uint64_t)RT_GEN(v) + 1;
  }
  size_t count = 0;
  for (uint64_t g = 0; g < last_gen; g++) {
    const gen_rec *gen = &pool->gens[g];
    if (gen->reads == 0 || gen->last_read < p) continue; /* nothing left to read */
    if (count < cap) {
      if (admits != NULL) admits[count] = gen->admit;
      if (items != NULL) items[count] = pool->seq[gen->admit];
      if (reads_before != NULL) reads_before[count] = before[g];
    }
    count++;
  }
  opt4__free(before, (size_t)(G ? G : 1) * sizeof(uint32_t));
  *n = count;
  return 0;
}

int opt4_pool_skip(opt4_pool *pool, uint64_t t) {
  if (pool == NULL) return opt4__fail(OPT4_EINVAL, "pool is NULL");
  if (t >= pool->h->accesses) return opt4__fail(OPT4_ERANGE, "position past the plan");
  int rc = opt4__pool_register(pool);
  if (rc != 0) return rc;
  uint32_t v = pool->rt[t];
  if (RT_KIND(v) == OPT4_OP_ADMIT) {
    const uint32_t g = RT_GEN(v);
    _Atomic uint32_t *claim = &pool->gclaim[g];
    uint32_t c = atomic_load(claim);
    for (;;) {
      uint32_t st = CL_STATE(c);
      if (st == CL_OPEN || st == CL_SELF) {
        if (!atomic_compare_exchange_strong(claim, &c, CL_SELF)) continue;
        mark_failed(pool, g);
        count(pool, C_STORE_FAILED, 1);
      } else if (st == CL_READY) { /* prefetched: its own read is all it owes */
        const gen_rec *gen = &pool->gens[g];
        for (uint32_t i = 0; i < gen->npages; i++)
          count_read(pool, &pool->states[pool->list[gen->list_off + i].page], g);
      } else if (st == CL_LOADING || st == CL_STORING) {
        if (!atomic_compare_exchange_strong(claim, &c, (c & ~15u) | CL_ABANDONED)) continue;
      }
      break;
    }
  } else if (RT_KIND(v) == OPT4_OP_BYPASS && pool->bclaim != NULL) {
    _Atomic uint32_t *claim = &pool->bclaim[RT_GEN(v)];
    uint32_t c = atomic_load(claim);
    while ((CL_STATE(c) == CL_OPEN || CL_STATE(c) == CL_READY) &&
           !atomic_compare_exchange_weak(claim, &c, CL_DONE)) {
    }
    if (CL_STATE(c) == CL_LOADING || CL_STATE(c) == CL_STORING)
      atomic_compare_exchange_strong(claim, &c, (c & ~15u) | CL_ABANDONED);
  } else if (RT_KIND(v) == OPT4_OP_HIT) {
    const gen_rec *gen = &pool->gens[RT_GEN(v)];
    for (uint32_t i = 0; i < gen->npages; i++)
      count_read(pool, &pool->states[pool->list[gen->list_off + i].page], RT_GEN(v));
  }
  return 0;
}

int opt4_pool_occurrence_next(opt4_pool *pool, uint32_t item, uint64_t *t) {
  if (pool == NULL || t == NULL) return opt4__fail(OPT4_EINVAL, "pool or t is NULL");
  if (pool->occ_count == NULL)
    return opt4__fail(OPT4_EINVAL, "the pool was created without the occurrence index");
  if (item >= pool->h->items)
    return opt4__fail(OPT4_ERANGE, "item %u is outside [0, %llu)", item,
                      (unsigned long long)pool->h->items);
  uint32_t k = atomic_fetch_add_explicit(&pool->occ_count[item], 1, memory_order_relaxed);
  uint64_t first = pool->occ_start[item], n = pool->occ_start[item + 1] - first;
  *t = k < n ? pool->occ_pos[first + k] : UINT64_MAX;
  return 0;
}

/* ---- the rest ---- */

int opt4_pool_item(const opt4_pool *pool, uint64_t t, uint32_t *item, uint32_t *kind) {
  if (pool == NULL) return opt4__fail(OPT4_EINVAL, "pool is NULL");
  if (t >= pool->h->accesses) return opt4__fail(OPT4_ERANGE, "position past the plan");
  if (item != NULL) *item = pool->seq[t];
  if (kind != NULL) *kind = RT_KIND(pool->rt[t]);
  return 0;
}

int opt4_pool_set_floor(opt4_pool *pool, uint64_t floor) {
  if (pool == NULL) return opt4__fail(OPT4_EINVAL, "pool is NULL");
  uint64_t cur = atomic_load(&pool->h->floor);
  while (floor > cur) {
    if (atomic_compare_exchange_weak(&pool->h->floor, &cur, floor)) {
      head_bump(pool->h); /* sleeping prefetchers: their window moved */
      opt4__pool_event(pool->h); /* waits for what lies below it now end */
      break;
    }
  }
  return 0;
}

int opt4_pool_floor_get(const opt4_pool *pool, uint64_t *floor) {
  if (pool == NULL || floor == NULL) return opt4__fail(OPT4_EINVAL, "pool or floor is NULL");
  *floor = atomic_load_explicit(&pool->h->floor, memory_order_acquire);
  return 0;
}

int opt4_pool_clock_next(opt4_pool *pool, uint64_t *t) {
  if (pool == NULL || t == NULL) return opt4__fail(OPT4_EINVAL, "pool or t is NULL");
  *t = atomic_fetch_add(&pool->h->clock, 1);
  return 0;
}

int opt4_pool_stats_get(const opt4_pool *pool, opt4_pool_stats *out) {
  if (pool == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "pool or out is NULL");
  uint64_t sum[C_COUNT];
  for (int c = 0; c < C_COUNT; c++) sum[c] = atomic_load(&pool->h->retired[c]);
  for (uint32_t i = 0; i < pool->h->max_procs; i++) {
    proc_rec *r = &pool->procs[i];
    if (atomic_load(&r->pid) == 0) continue;
    for (int c = 0; c < C_COUNT; c++) sum[c] += atomic_load_explicit(&r->counters[c], memory_order_relaxed);
  }
  out->hits = sum[C_HITS];
  out->admits = sum[C_ADMITS];
  out->bypasses = sum[C_BYPASSES];
  out->fallbacks = sum[C_FALLBACKS];
  out->deferred = sum[C_DEFERRED];
  out->stored = sum[C_STORED];
  out->store_failed = sum[C_STORE_FAILED];
  out->timeouts = sum[C_TIMEOUTS];
  out->waits = sum[C_WAITS];
  out->wait_ns = sum[C_WAIT_NS];
  out->prefetched = sum[C_PF_SERVED];
  out->prefetch_stored = sum[C_PF_STORED];
  out->prefetch_dropped = sum[C_PF_DROPPED];
  out->stalls = sum[C_PF_STALLS];
  out->stall_ns = sum[C_PF_STALL_NS];
  return 0;
}

int opt4_pool_view_get(const opt4_pool *pool, opt4_pool_view *out) {
  if (pool == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "pool or out is NULL");
  memset(out, 0, sizeof *out);
  int rc = opt4_pool_info_get(pool, &out->info);
  if (rc == 0) rc = opt4_pool_stats_get(pool, &out->stats);
  if (rc != 0) return rc;
  out->head = atomic_load_explicit(&pool->h->head, memory_order_relaxed);
  out->floor = atomic_load_explicit(&pool->h->floor, memory_order_relaxed);
  for (uint64_t i = 0; i < pool->h->pages; i++) {
    uint32_t st = PS_STATE(atomic_load_explicit(&pool->states[i].word, memory_order_relaxed));
    out->pages_ready += st == PS_READY;
    out->pages_failed += st == PS_FAILED;
  }
  return 0;
}
