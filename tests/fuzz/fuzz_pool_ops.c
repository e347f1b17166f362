/* fuzz_pool_ops.c - libFuzzer target: random operation sequences against
 * the engine in one process (planner, simulator, plan buffers, and a real
 * shared-memory pool).
 *
 * The input's first bytes choose a trace (items, length, ids), a capacity
 * and the plan kind (with or without bypass, or in bytes over pages); the
 * rest is a stream of operations on a pool made from the plan. Oracles:
 *   - the plan's hits equal the simulator's "opt" (or "opt-nobypass") count,
 *     and a plan reloaded from its own file bytes is identical;
 *   - served in order, in batches the input chooses, the pool gives exactly
 *     the plan's hits with no fallback, every byte equal to the source's;
 *   - then any operation at any position (get, put, skip, note_read, floor,
 *     live_at, warm, occurrence_next, clock), in or out of range, returns
 *     0 or a documented error, and every HIT it serves is the right item. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "opt4.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define PAGE 96
#define MAX_T 256

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

static uint32_t take(reader *r, uint32_t bound) {
  uint32_t v = 0;
  for (int i = 0; i < 2 && r->n > 0; i++, r->p++, r->n--) v = v << 8 | *r->p;
  return bound ? v % bound : v;
}

/* Item x's bytes depend only on x; sized plans give it item_len(x) bytes. */
static size_t item_len(uint32_t x) { return 1 + (x * 37u) % (2 * PAGE); }
static void item_fill(uint32_t x, uint8_t *buf) {
  for (size_t i = 0; i < 2 * PAGE; i++) buf[i] = (uint8_t)(x * 131u + i * 7u + 1u);
}
static void check_item(uint32_t x, const uint8_t *buf, size_t len, size_t want_len) {
  if (len != want_len) abort();
  for (size_t i = 0; i < len; i++)
    if (buf[i] != (uint8_t)(x * 131u + i * 7u + 1u)) abort();
}

static int documented(int rc) {
  return rc == 0 || rc == OPT4_EINVAL || rc == OPT4_ERANGE || rc == OPT4_EITEMSIZE;
}

static opt4_plan *reload(const opt4_plan *plan) {
  char path[64];
  snprintf(path, sizeof path, "/dev/shm/opt4-fuzz-ops-%d.opt4", (int)getpid());
  if (opt4_plan_save(plan, path) != 0) abort();
  FILE *f = fopen(path, "rb");
  if (f == NULL) abort();
  static uint8_t buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  unlink(path);
  opt4_plan *back = NULL;
  if (opt4_plan_load_buffer(buf, n, &back) != 0) abort();
  return back;
}

/* Serve [first, last) as one batch, as a DataLoader worker does. */
static void serve(opt4_pool *pool, const opt4_plan *plan, int sized, uint64_t first,
                  uint64_t last, uint64_t *hits) {
  uint64_t batch[MAX_T];
  size_t n = (size_t)(last - first);
  for (size_t i = 0; i < n; i++) batch[i] = first + i;
  uint8_t buf[4 * PAGE];
  for (uint64_t t = first; t < last; t++) {
    opt4_get_result r;
    if (opt4_pool_get(pool, t, batch, n, buf, sizeof buf, &r) != 0) abort();
    uint32_t x = opt4_plan_seq(plan)[t];
    if (r.item != x) abort();
    if (r.status == OPT4_GET_HIT) {
      check_item(x, buf, r.len, sized ? item_len(x) : PAGE / 2);
      ++*hits;
    } else if (r.status == OPT4_GET_DEFER) {
      if (r.defer_to < first || r.defer_to >= t) abort();
      if (opt4_pool_note_read(pool, t) != 0) abort();
      ++*hits;
    } else if (r.status == OPT4_GET_LOAD && r.reason == OPT4_REASON_ADMIT) {
      item_fill(x, buf);
      opt4_iovec part = {buf, sized ? item_len(x) : PAGE / 2};
      int stored = 0;
      if (opt4_pool_put(pool, t, &part, 1, &stored) != 0 || !stored) abort();
    } else if (r.status != OPT4_GET_LOAD || r.reason == OPT4_REASON_FALLBACK) {
      abort(); /* in order, in one process: never a fallback */
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  uint32_t mode = take(&r, 0);
  uint32_t items = 1 + take(&r, 24);
  uint32_t T = 1 + take(&r, MAX_T);
  uint32_t seq[MAX_T];
  for (uint32_t t = 0; t < T; t++) seq[t] = take(&r, items);
  int sized = (mode & 3) == 2, nobypass = (mode & 3) == 1;
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  uint64_t sizes[25];
  if (sized) {
    for (uint32_t i = 0; i < items; i++) sizes[i] = item_len(i);
    o.item_sizes = sizes;
    o.page_size = 32 + take(&r, 64);
    o.capacity_bytes = 2 * PAGE + take(&r, 8 * PAGE);
  } else {
    o.capacity = 1 + take(&r, items + 2);
    o.flags = nobypass ? OPT4_PLAN_NOBYPASS : 0;
  }
  opt4_seq s = {seq, OPT4_U32, T, items};
  opt4_plan *plan = NULL;
  int rc = opt4_plan_build(&s, &o, &plan);
  if (rc == OPT4_EITEMSIZE && sized) return 0; /* an item larger than the pool */
  if (rc != 0) abort();
  opt4_plan_info in;
  if (opt4_plan_info_get(plan, &in) != 0 || in.hits + in.misses != T) abort();
  if (!sized) {
    opt4_sim_result sim;
    if (opt4_simulate(nobypass ? "opt-nobypass" : "opt", &s, o.capacity, 0, &sim) != 0 ||
        sim.hits != in.hits)
      abort();
  }
  opt4_plan *back = reload(plan);
  if (memcmp(opt4_plan_ops(back), opt4_plan_ops(plan), T * 4) != 0) abort();
  opt4_plan_close(back);

  opt4_pool_opts po = {.page_size = sized ? 0 : PAGE,
                       .wait_timeout_ms = 1,
                       .flags = (mode & 4) ? OPT4_POOL_OCCURRENCES : 0,
                       .staging_slots = (mode >> 3) & 3,
                       .spare_pages = (mode >> 5) & 3};
  opt4_pool *pool = NULL;
  if (opt4_pool_create(plan, &po, &pool) != 0) abort();

  /* In order, in batches of the input's sizes: exact. */
  uint64_t hits = 0, t = 0;
  while (t < T) {
    uint64_t len = 1 + take(&r, 16);
    uint64_t last = t + len < T ? t + len : T;
    serve(pool, plan, sized, t, last, &hits);
    t = last;
  }
  opt4_pool_stats st;
  if (opt4_pool_stats_get(pool, &st) != 0) abort();
  if (hits != in.hits || st.fallbacks != 0 || st.timeouts != 0 || st.store_failed != 0) abort();

  /* Then anything, anywhere. */
  uint8_t buf[4 * PAGE];
  /* A bounded number: each wait that cannot end gives up after 1 ms. */
  for (int ops = 0; ops < 64 && r.n > 0; ops++) {
    uint32_t op = take(&r, 9);
    uint64_t pos = take(&r, T + 4); /* a few past the end */
    opt4_get_result g;
    int stored;
    switch (op) {
    case 0:
      rc = opt4_pool_get(pool, pos, NULL, 0, buf, take(&r, sizeof buf + 1), &g);
      if (rc == 0 && g.status == OPT4_GET_HIT)
        check_item(g.item, buf, g.len, sized ? item_len(g.item) : PAGE / 2);
      break;
    case 1: {
      uint32_t x = pos < T ? seq[pos] : 0;
      item_fill(x, buf);
      opt4_iovec part = {buf, take(&r, 2) ? (sized ? item_len(x) : PAGE / 2) : 4 * PAGE};
      rc = opt4_pool_put(pool, pos, &part, 1, &stored);
      break;
    }
    case 2: rc = opt4_pool_skip(pool, pos); break;
    case 3: rc = opt4_pool_note_read(pool, pos); break;
    case 4: rc = opt4_pool_set_floor(pool, pos); break;
    case 5: {
      uint64_t admits[8];
      uint32_t its[8], before[8];
      size_t n;
      rc = opt4_pool_live_at(pool, pos, admits, its, before, 8, &n);
      break;
    }
    case 6: {
      uint32_t x = pos < T ? seq[pos] : 0;
      item_fill(x, buf);
      opt4_iovec part = {buf, sized ? item_len(x) : PAGE / 2};
      rc = opt4_pool_warm(pool, pos, &part, 1, take(&r, 4), &stored);
      break;
    }
    case 7: {
      uint64_t next;
      rc = opt4_pool_occurrence_next(pool, take(&r, items + 2), &next);
      if (rc == 0 && next != UINT64_MAX && (next >= T)) abort();
      break;
    }
    default: {
      uint64_t c;
      rc = opt4_pool_clock_next(pool, &c);
      break;
    }
    }
    if (!documented(rc)) abort();
  }
  if (opt4_pool_unlink(pool) != 0) abort();
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  opt4_mem_stats ms;
  opt4_mem_stats_get(&ms);
  if (ms.current_bytes != 0) abort();
  return 0;
}
