/*
 * runtime.h - what runtime.c shares with prefetch.c, private to src/shm:
 * the bounded wait, the wake-up of waits, the writer protocol, and the
 * small helpers on a handle that both use. runtime.c's header comment is
 * the protocol; its "waiting" comment is how a wait sleeps and wakes.
 */
#ifndef OPT4_SHM_RUNTIME_H
#define OPT4_SHM_RUNTIME_H

#include "layout.h"

/* A bounded wait in progress (runtime.c, "waiting"). */
typedef struct waiter {
  uint64_t start;
  uint32_t spins;
  uint32_t seq; /* event_seq as read at the end of the last step */
} waiter;

/* Bump event_seq and wake its sleepers: whoever changes something a wait
 * looks for calls this after the change. */
void opt4__pool_event(pool_header *h);
/* One step of a bounded wait. Returns 1 once the pool's timeout has passed,
 * or the handle was interrupted. */
int opt4__wait_step(const opt4_pool *pool, waiter *w);
/* Whether this wait has gone on long enough to look for dead processes. */
static inline int wait_is_slow(const waiter *w) { return w->spins >= 128 && (w->spins & 31) == 0; }

/* Whether generation g may take a page whose word is w, given its
 * predecessor prev there. */
int opt4__may_take(const opt4_pool *pool, page_state *ps, uint64_t w, uint32_t prev);
/* Write the ADMIT at t into its pages by the writer protocol, its page reads
 * starting at reads_start (the reads already done). *stored: 1 if stored. */
int opt4__pool_write(opt4_pool *pool, uint64_t t, const opt4_iovec *parts, size_t n_parts,
                     uint32_t reads_start, int *stored);

static inline proc_rec *my_rec(opt4_pool *pool) { return &pool->procs[pool->rec]; }

static inline void count(opt4_pool *pool, int c, uint64_t v) {
  atomic_fetch_add_explicit(&my_rec(pool)->counters[c], v, memory_order_relaxed);
}

static inline uint64_t floor_now(const opt4_pool *pool) {
  return atomic_load_explicit(&pool->h->floor, memory_order_acquire);
}

static inline int gen_failed(const opt4_pool *pool, uint32_t g) {
  return (atomic_load_explicit(&pool->failed[g / 64], memory_order_acquire) >> (g % 64)) & 1;
}

static inline void mark_failed(opt4_pool *pool, uint32_t g) {
  atomic_fetch_or_explicit(&pool->failed[g / 64], (uint64_t)1 << (g % 64), memory_order_release);
  opt4__pool_event(pool->h);
}

/* One thread at a time in a handle. A handle's process record holds one
 * hazard (the page its reader is copying out) and one writing generation,
 * so a second thread inside the same handle would overwrite the first's
 * announcement, and a writer could then change bytes the first is still
 * copying. The calls that announce (opt4_pool_get, opt4_pool_put,
 * opt4_pool_warm, the prefetch stores) enter the handle; a second thread
 * gets OPT4_EINVAL at once, naming the fix (opt4.h, "Thread and process
 * safety"). A forked child's copy of a handle that a thread of its parent
 * was inside is free: that thread is not in the child.
 *
 * It is a check, not a lock: a plain load and store, no read-modify-write.
 * Two threads that enter in the same instant can both pass it, but a
 * program that shares a handle between threads has one inside while the
 * other enters almost every time, and is told at once. A locked exchange
 * would catch that instant too, at the price of one more locked instruction
 * on every HIT (the C hit path costs about 20 ns in all, bench/RESULTS.md).
 */
static inline int handle_enter(opt4_pool *pool, const char *call) {
  if (atomic_load_explicit(&pool->entered, memory_order_relaxed) == 0 ||
      pool->fork_gen != opt4__fork_generation()) {
    atomic_store_explicit(&pool->entered, 1, memory_order_relaxed);
    return 0;
  }
  return opt4__fail(OPT4_EINVAL, "%s: pool handle %s is in use by another thread; a handle serves "
                    "one thread at a time: attach one for each thread (opt4_pool_attach)",
                    call, pool->name);
}

static inline void handle_leave(opt4_pool *pool) {
  atomic_store_explicit(&pool->entered, 0, memory_order_relaxed);
}

#endif /* OPT4_SHM_RUNTIME_H */
