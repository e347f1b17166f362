/* pool_util.h - helpers shared by the pool tests: deterministic item bytes,
 * a plan over a random trace, and following a plan for a set of batches. */
#ifndef OPT4_TEST_POOL_UTIL_H
#define OPT4_TEST_POOL_UTIL_H

#include "task.h"

#define PAGE 256

/* Item x's bytes: a length and content that depend only on x. */
static inline size_t item_len(uint32_t x) { return 16 + (x * 7919u) % (PAGE - 16); }
static inline uint8_t item_byte(uint32_t x, size_t i) { return (uint8_t)(x * 31u + i * 7u); }
static inline void item_fill(uint32_t x, uint8_t *buf) {
  for (size_t i = 0; i < item_len(x); i++) buf[i] = item_byte(x, i);
}
static inline int item_check(uint32_t x, const uint8_t *buf, size_t len) {
  if (len != item_len(x)) return 0;
  for (size_t i = 0; i < len; i++)
    if (buf[i] != item_byte(x, i)) return 0;
  return 1;
}

static inline opt4_plan *random_plan(uint64_t T, uint64_t N, uint64_t C, uint64_t seed) {
  uint32_t *seq = malloc((T + 1) * sizeof *seq);
  uint64_t rng = seed;
  for (uint64_t t = 0; t < T; t++) {
    uint64_t r = test_rand(&rng);
    seq[t] = (uint32_t)((r & 3) ? r % N : (r >> 8) % (N / 8 + 1)); /* some skew */
  }
  opt4_seq s = {seq, OPT4_U32, T, N};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = C;
  opt4_plan *p = NULL;
  ASSERT_OK(opt4_plan_build(&s, &o, &p));
  free(seq);
  return p;
}

/* A sized plan over the same kind of trace: item x takes item_len(x) bytes
 * in pages of page bytes. */
static inline opt4_plan *random_sized_plan(uint64_t T, uint64_t N, uint64_t capacity_bytes,
                                           uint64_t page, uint64_t seed) {
  uint32_t *seq = malloc((T + 1) * sizeof *seq);
  uint64_t *sizes = malloc(N * sizeof *sizes);
  uint64_t rng = seed;
  for (uint64_t t = 0; t < T; t++) {
    uint64_t r = test_rand(&rng);
    seq[t] = (uint32_t)((r & 3) ? r % N : (r >> 8) % (N / 8 + 1));
  }
  for (uint64_t i = 0; i < N; i++) sizes[i] = item_len((uint32_t)i);
  opt4_seq s = {seq, OPT4_U32, T, N};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.item_sizes = sizes;
  o.capacity_bytes = capacity_bytes;
  o.page_size = page;
  opt4_plan *p = NULL;
  ASSERT_OK(opt4_plan_build(&s, &o, &p));
  free(seq);
  free(sizes);
  return p;
}

/* Items 0..n-1 with item_fill's bytes, as a record file at path. */
static inline void write_items(const char *path, uint32_t n) {
  opt4_records_writer *w = NULL;
  ASSERT_OK(opt4_records_writer_open(path, &w));
  uint8_t buf[PAGE];
  for (uint32_t i = 0; i < n; i++) {
    item_fill(i, buf);
    ASSERT_OK(opt4_records_writer_add(w, buf, item_len(i)));
  }
  ASSERT_OK(opt4_records_writer_finish(w));
}

typedef struct follow_counts {
  uint64_t hits, loads, wrong, deferred;
} follow_counts;

/* Serve positions [first, last) as one batch, in order, like a DataLoader
 * worker's __getitems__: read HITs, load and store ADMITs, note DEFERs. */
static inline void follow_batch(opt4_pool *pool, uint64_t first, uint64_t last,
                                follow_counts *fc) {
  uint64_t n = last - first;
  uint64_t *batch = malloc(n * sizeof *batch);
  for (uint64_t i = 0; i < n; i++) batch[i] = first + i;
  uint8_t buf[PAGE];
  for (uint64_t t = first; t < last; t++) {
    opt4_get_result r;
    ASSERT_OK(opt4_pool_get(pool, t, batch, n, buf, sizeof buf, &r));
    if (r.status == OPT4_GET_HIT) {
      fc->hits++;
      if (!item_check(r.item, buf, r.len)) fc->wrong++;
    } else if (r.status == OPT4_GET_DEFER) {
      /* The item was loaded (and stored) at defer_to, earlier in this batch:
       * serve that copy and count the read. */
      fc->deferred++;
      ASSERT(r.defer_to >= first && r.defer_to < t);
      ASSERT_OK(opt4_pool_note_read(pool, t));
    } else {
      ASSERT_EQ(r.status, OPT4_GET_LOAD);
      fc->loads++;
      if (r.reason == OPT4_REASON_ADMIT) {
        item_fill(r.item, buf);
        opt4_iovec part = {buf, item_len(r.item)};
        int stored;
        ASSERT_OK(opt4_pool_put(pool, t, &part, 1, &stored));
      }
    }
  }
  free(batch);
}

#endif
