/*
 * internal.h - private declarations shared by the engine's areas.
 * Non-static private symbols use the opt4__ prefix.
 */
#ifndef OPT4_INTERNAL_H
#define OPT4_INTERNAL_H

#include "opt4.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define OPT4__LIKELY(x) __builtin_expect(!!(x), 1)
#define OPT4__UNLIKELY(x) __builtin_expect(!!(x), 0)
#define OPT4__PREFETCH(p) __builtin_prefetch((p))
#define OPT4__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define OPT4__LIKELY(x) (x)
#define OPT4__UNLIKELY(x) (x)
#define OPT4__PREFETCH(p) ((void)(p))
#define OPT4__PRINTF(a, b)
#endif

/* "Never used again": one past the largest position. */
#define OPT4__NEVER UINT32_MAX

/* ---- memory: every engine allocation goes through these, so the allocator
 * hook and the peak counter see all of it. The size is passed back to free
 * so that no per-block header is needed. ---- */
void *opt4__malloc(size_t size);
void *opt4__calloc(size_t count, size_t size);
void opt4__free(void *ptr, size_t size);
/* Ask for transparent huge pages on a large array before first touch: the
 * planner makes random accesses over tens of MB, where 4 KiB pages cost a
 * page walk each, and faulting in fresh memory is 5x cheaper in 2 MiB pages.
 * Only a hint; small arrays and other allocators are unaffected. */
void opt4__advise_huge(void *ptr, size_t len);
/* count * size with overflow check; returns 0 and sets *out on success. */
int opt4__mul_size(size_t count, size_t size, size_t *out);

/* ---- errors: record a sentence for opt4_errdetail() and return code. ---- */
int opt4__fail(int code, const char *fmt, ...) OPT4__PRINTF(2, 3);
void opt4__clear_detail(void);

/* ---- futex: sleep until a 32-bit word changes (futex.c). ----
 * opt4__futex_wait sleeps while *word == expect, until woken, for at most
 * timeout_ns (0: no limit); 1 if the time ran out, else 0 (woken, changed,
 * or a signal: callers re-check their condition). shared: the word is in
 * memory shared between processes. */
int opt4__futex_wait(_Atomic uint32_t *word, uint32_t expect, uint64_t timeout_ns, int shared);
void opt4__futex_wake(_Atomic uint32_t *word, int shared);
/* The same, for the sleepers whose bits meet the waker's (bits != 0;
 * 0xFFFFFFFF: every sleeper, and a sleeper woken by every waker). */
int opt4__futex_wait_bits(_Atomic uint32_t *word, uint32_t expect, uint64_t timeout_ns, int shared,
                          uint32_t bits);
void opt4__futex_wake_bits(_Atomic uint32_t *word, int shared, uint32_t bits);

/* ---- pools: what other areas may ask of a handle (src/shm). ----
 * fn is called, with ctx, inside the handle's bounded waits, where its
 * thread holds no lock: a thread may park there (around fork). It returns
 * the nanoseconds it kept the thread, not counted against the timeout. */
void opt4__pool_set_safe_point(opt4_pool *pool, uint64_t (*fn)(void *ctx), void *ctx,
                               const _Atomic uint32_t *park);
/* Another handle on src's pool, with a process record of its own, sharing
 * src's mappings rather than mapping the segments again (the last of them
 * closed unmaps): a page one of them touched is mapped for all, so threads
 * of one process that write the pool (the prefetcher's) do not each fault
 * on every page. Not thread-safe against other calls on src. */
int opt4__pool_attach_shared(opt4_pool *src, opt4_pool **out);
/* The consumers' progress (the pool's head: the furthest position asked
 * for, rounded down to a multiple of 32). */
uint64_t opt4__pool_head(const opt4_pool *pool);
/* Sleep until head differs from seen, for at most timeout_ns: on the
 * shared futex word head_seq, woken by the consumer that moves head, by
 * opt4_pool_interrupt, or by opt4__pool_head_kick. Returns at once if head
 * already moved, the handle is interrupted, or *unless (or the handle's
 * park word) is nonzero. 1 if the time ran out, else 0. */
int opt4__pool_head_wait(opt4_pool *pool, uint64_t seen, uint64_t timeout_ns,
                         const _Atomic uint32_t *unless);
/* Sleep until head reaches target (head >= target), for at most
 * timeout_ns, woken only by a move that reaches target's block (or by an
 * interrupt or a kick), with the same early returns. A return is not a
 * promise that head reached target: callers look again. */
int opt4__pool_head_wait_for(opt4_pool *pool, uint64_t target, uint64_t timeout_ns,
                             const _Atomic uint32_t *unless);
/* The head at which a prefetcher's loaded item t (claimed by pool) may find
 * its place: the block of the last planned read of what its pages hold (an
 * ADMIT), or of the BYPASS before it in its staging slot, and at the latest
 * t's own block less one (the consumers are then near: the store waits
 * there rather than return). */
uint64_t opt4__pool_prefetch_ready_at(const opt4_pool *pool, uint64_t t);
/* Wake every thread sleeping in opt4__pool_head_wait on this pool (in any
 * process): they re-check their condition. */
void opt4__pool_head_kick(opt4_pool *pool);
/* Whether the prefetch window (lookahead positions past head) has nothing
 * left to claim: the cursor has reached its end, or the plan's. */
int opt4__pool_prefetch_window_full(opt4_pool *pool, uint64_t lookahead);
/* The misses (ADMITs and BYPASSes: what a prefetcher loads) among the
 * positions [from, from + span), cut at the plan's end; *positions gets how
 * many positions that is. O(span). */
uint64_t opt4__pool_misses_in(const opt4_pool *pool, uint64_t from, uint64_t span, uint64_t *positions);

/* ---- hashing (XXH3-64) ---- */
typedef struct opt4__hasher opt4__hasher;
opt4__hasher *opt4__hasher_new(void);
void opt4__hasher_update(opt4__hasher *h, const void *data, size_t len);
uint64_t opt4__hasher_digest(const opt4__hasher *h);
void opt4__hasher_free(opt4__hasher *h);
uint64_t opt4__hash64(const void *data, size_t len);

/* ---- sequences ---- */
static inline uint64_t opt4__seq_get(const opt4_seq *s, uint64_t t) {
  switch (s->dtype) {
  case OPT4_I32: return (uint64_t)(int64_t)((const int32_t *)s->data)[t];
  case OPT4_I64: return (uint64_t)((const int64_t *)s->data)[t];
  case OPT4_U32: return ((const uint32_t *)s->data)[t];
  default: return ((const uint64_t *)s->data)[t];
  }
}
/* Check the view's shape (not its values). */
int opt4__seq_check(const opt4_seq *seq);
/* Copy ids [first, first + count) into dst as uint32, checking each against
 * items (OPT4_ERANGE names the position). */
int opt4__seq_to_u32(const opt4_seq *seq, uint64_t first, uint64_t count,
                     uint32_t *dst);

/* ---- plans ---- */
struct opt4_plan {
  opt4_plan_info info;
  const uint32_t *seq; /* T ids */
  const uint32_t *ops; /* T ops, or NULL */
  char *desc;          /* owned copy, or NULL */
  size_t desc_len;
  /* Ownership: either owned heap arrays (freed with their sizes), or one
   * read-only mapping of a plan file / one owned buffer holding both. */
  uint32_t *own_seq;
  uint32_t *own_ops;
  /* Sized plans: generation g's pages are pages[gen_off[g] .. gen_off[g+1]). */
  const uint64_t *gen_off; /* generations + 1 */
  const uint32_t *pages;
  const uint32_t *sizes; /* items */
  uint64_t pages_len;
  uint64_t *own_gen_off;
  uint32_t *own_pages;
  uint32_t *own_sizes;
  void *map;
  size_t map_len;
  int map_is_mmap; /* 1: munmap(map); 0: opt4__free(map, map_len) */
};

opt4_plan *opt4__plan_alloc(void);
/* plan.c: what every plan-making call does first (the detail cleared, *out
 * NULL, the sequence and opt4_plan_opts checked as opt4_plan_build does);
 * the sequence copied into the plan as uint32 ids (and fingerprinted). */
int opt4__plan_begin(const opt4_seq *seq, const opt4_plan_opts *opts, opt4_plan **out);
int opt4__plan_attach_seq(opt4_plan *plan, const opt4_seq *seq);

/* min(capacity, items, accesses): no valid plan uses a slot at or above it. */
static inline uint64_t opt4__slot_count(const opt4_plan_info *in) {
  uint64_t n = in->capacity < in->items ? in->capacity : in->items;
  return n < in->accesses ? n : in->accesses;
}

/* The number of distinct ids in seq[0, T), all < items, in memory bounded by
 * the sequence's own size: a bitmap when it is no larger, else a sorted copy.
 * 0 or OPT4_ENOMEM. */
int opt4__count_distinct(const uint32_t *seq, uint64_t T, uint64_t items, uint64_t *out);

/* Belady over seq (any dtype) into ops[T]; fills the totals. ops doubles as
 * the next-use array during the build. */
int opt4__belady(const opt4_seq *seq, const opt4_plan_opts *opts, uint32_t *ops,
                 opt4_plan_info *info);

/* Size-aware Belady (sized plans): fills plan's ops, generations, pages and
 * sizes, and the totals. */
int opt4__belady_sized(const opt4_seq *seq, const opt4_plan_opts *opts, opt4_plan *plan);

/* Sized plans: the pages opts' capacity_bytes holds (checked against the
 * limits) and the items' sizes as uint32 (items entries, the caller's to
 * free; each checked to be at most 4 GiB). */
int opt4__sized_pages(const opt4_plan_opts *opts, uint64_t items, uint64_t *pages, uint32_t **sizes);

/* Pages an item of size bytes takes. */
static inline uint64_t opt4__pages_for(uint64_t size, uint64_t page_size) {
  return size == 0 ? 1 : (size + page_size - 1) / page_size;
}

/* Sized plans: replay the ops and check that every ADMIT creates the next
 * generation with the right number of pages below info.slots, and every HIT
 * reads its item's current generation whose pages nobody took since. */
int opt4__plan_verify_sized(const opt4_plan *plan);

/* Replay ops against seq and check every HIT finds its id in its slot, every
 * slot is < capacity, and the totals match. 0 or OPT4_ECORRUPT. */
int opt4__plan_verify(const uint32_t *seq, const uint32_t *ops,
                      const opt4_plan_info *info);

#endif /* OPT4_INTERNAL_H */
