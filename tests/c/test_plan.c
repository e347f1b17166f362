/* test_plan.c - the planner against golden counts and a naive oracle. */
#include "task.h"

#define NONE UINT32_MAX

/* The semantics of opt4_plan_build spelled out naively, O(T^2 C): every next
 * use is found by scanning forward from scratch. */
static uint64_t naive_next(const uint32_t *seq, uint64_t T, uint64_t t, uint32_t id) {
  for (uint64_t u = t + 1; u < T; u++)
    if (seq[u] == id) return u;
  return UINT64_MAX;
}

static void naive_plan(const uint32_t *seq, uint64_t T, uint64_t N, uint64_t C,
                       int bypass, uint32_t *ops, uint64_t *hits) {
  uint64_t slots = C < N ? C : N;
  uint32_t *where = malloc(N * sizeof *where); /* live resident id -> slot */
  uint32_t *stack = malloc((slots + 1) * sizeof *stack);
  uint64_t top = 0;
  for (uint64_t i = 0; i < N; i++) where[i] = NONE;
  for (uint64_t i = 0; i < slots; i++) stack[top++] = (uint32_t)(slots - 1 - i);
  *hits = 0;
  for (uint64_t t = 0; t < T; t++) {
    uint32_t x = seq[t];
    uint64_t n = naive_next(seq, T, t, x);
    if (where[x] != NONE) {
      uint32_t s = where[x];
      ops[t] = OPT4_OP_MAKE(OPT4_OP_HIT, s);
      (*hits)++;
      if (n == UINT64_MAX) {
        where[x] = NONE;
        stack[top++] = s;
      }
      continue;
    }
    if (n == UINT64_MAX && bypass) {
      ops[t] = OPT4_OP_MAKE(OPT4_OP_BYPASS, 0);
      continue;
    }
    uint32_t s;
    if (top > 0) {
      s = stack[--top];
    } else {
      uint32_t far_id = NONE;
      uint64_t far = 0;
      for (uint32_t y = 0; y < N; y++) {
        if (where[y] == NONE) continue;
        uint64_t ny = naive_next(seq, T, t, y);
        if (far_id == NONE || ny > far) {
          far = ny;
          far_id = y;
        }
      }
      if (bypass && far < n) {
        ops[t] = OPT4_OP_MAKE(OPT4_OP_BYPASS, 0);
        continue;
      }
      s = where[far_id];
      where[far_id] = NONE;
    }
    ops[t] = OPT4_OP_MAKE(OPT4_OP_ADMIT, s);
    if (n == UINT64_MAX)
      stack[top++] = s;
    else
      where[x] = s;
  }
  free(where);
  free(stack);
}

static opt4_plan *build(const uint32_t *seq, uint64_t T, uint64_t N, uint64_t C,
                        uint32_t flags) {
  opt4_seq s = {seq, OPT4_U32, T, N};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = C;
  o.flags = flags;
  opt4_plan *p = NULL;
  ASSERT_OK(opt4_plan_build(&s, &o, &p));
  return p;
}

/* Silberschatz's reference string: 3 frames give 9 faults under OPT. */
static const uint32_t textbook[] = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3,
                                    0, 3, 2, 1, 2, 0, 1, 7, 0, 1};

static void test_textbook(void) {
  opt4_plan *p = build(textbook, 20, 8, 3, OPT4_PLAN_NOBYPASS);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(p, &in));
  ASSERT_U64_EQ(in.misses, 9);
  ASSERT_U64_EQ(in.hits, 11);
  ASSERT_U64_EQ(in.bypasses, 0);
  ASSERT_U64_EQ(in.compulsory, 6); /* ids 0 1 2 3 4 7 */
  opt4_plan_close(p);

  /* With bypass, the 4 at position 7 and the 7 at position 17 are never used
   * again and are not stored: the 4 no longer evicts a live id, 8 misses
   * (worked by hand in docs/algorithm.md). */
  p = build(textbook, 20, 8, 3, 0);
  ASSERT_OK(opt4_plan_info_get(p, &in));
  ASSERT_U64_EQ(in.misses, 8);
  ASSERT_U64_EQ(in.bypasses, 2);
  ASSERT_U64_EQ(in.hits + in.misses, 20);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A hand-checked trace, decision by decision: C = 1, "a b a". */
static void test_bypass_golden(void) {
  const uint32_t seq[] = {0, 1, 0};
  opt4_plan *p = build(seq, 3, 2, 1, 0);
  const uint32_t *ops = opt4_plan_ops(p);
  ASSERT_EQ(ops[0], OPT4_OP_MAKE(OPT4_OP_ADMIT, 0));
  ASSERT_EQ(ops[1], OPT4_OP_MAKE(OPT4_OP_BYPASS, 0)); /* never used again */
  ASSERT_EQ(ops[2], OPT4_OP_MAKE(OPT4_OP_HIT, 0));
  opt4_plan_close(p);
  p = build(seq, 3, 2, 1, OPT4_PLAN_NOBYPASS);
  ops = opt4_plan_ops(p);
  ASSERT_EQ(ops[0], OPT4_OP_MAKE(OPT4_OP_ADMIT, 0));
  ASSERT_EQ(ops[1], OPT4_OP_MAKE(OPT4_OP_ADMIT, 0)); /* must admit */
  ASSERT_EQ(ops[2], OPT4_OP_MAKE(OPT4_OP_ADMIT, 0));
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_against_naive(void) {
  uint64_t rng = 42;
  for (int round = 0; round < 400; round++) {
    uint64_t N = 1 + test_rand(&rng) % 40;
    uint64_t T = test_rand(&rng) % 300;
    uint64_t C = 1 + test_rand(&rng) % (N + 3);
    uint32_t *seq = malloc((T + 1) * sizeof *seq);
    /* Mix uniform ids with a skewed hot set so both hits and evictions occur. */
    for (uint64_t t = 0; t < T; t++) {
      uint64_t r = test_rand(&rng);
      seq[t] = (uint32_t)((r & 1) ? r % N : (r >> 8) % (N / 4 + 1));
    }
    for (int bypass = 0; bypass <= 1; bypass++) {
      uint32_t *want = malloc((T + 1) * sizeof *want);
      uint64_t want_hits;
      naive_plan(seq, T, N, C, bypass, want, &want_hits);
      opt4_plan *p = build(seq, T, N, C, bypass ? 0 : OPT4_PLAN_NOBYPASS);
      opt4_plan_info in;
      ASSERT_OK(opt4_plan_info_get(p, &in));
      ASSERT_U64_EQ(in.hits, want_hits);
      const uint32_t *ops = opt4_plan_ops(p);
      for (uint64_t t = 0; t < T; t++)
        if (ops[t] != want[t])
          FAIL_AT("round %d bypass %d N %llu C %llu: op %llu is %08x, want %08x",
                  round, bypass, (unsigned long long)N, (unsigned long long)C,
                  (unsigned long long)t, ops[t], want[t]);
      opt4_plan_close(p);
      free(want);
    }
    free(seq);
  }
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_dtypes_agree(void) {
  enum { T = 1000, N = 50 };
  int32_t a32[T];
  int64_t a64[T];
  uint32_t u32[T];
  uint64_t u64[T];
  uint64_t rng = 7;
  for (int t = 0; t < T; t++) {
    u64[t] = test_rand(&rng) % N;
    a32[t] = (int32_t)u64[t];
    a64[t] = (int64_t)u64[t];
    u32[t] = (uint32_t)u64[t];
  }
  const void *data[4] = {a32, a64, u32, u64};
  opt4_dtype types[4] = {OPT4_I32, OPT4_I64, OPT4_U32, OPT4_U64};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = 10;
  opt4_plan *first = NULL;
  uint64_t fp0 = 0;
  for (int i = 0; i < 4; i++) {
    opt4_seq s = {data[i], types[i], T, N};
    opt4_plan *p = NULL;
    uint64_t fp;
    ASSERT_OK(opt4_plan_build(&s, &o, &p));
    ASSERT_OK(opt4_fingerprint(&s, &fp));
    opt4_plan_info in;
    ASSERT_OK(opt4_plan_info_get(p, &in));
    ASSERT_U64_EQ(in.fingerprint, fp);
    if (i == 0) {
      first = p;
      fp0 = fp;
      continue;
    }
    ASSERT_U64_EQ(fp, fp0);
    ASSERT(memcmp(opt4_plan_ops(p), opt4_plan_ops(first), T * 4) == 0);
    ASSERT(memcmp(opt4_plan_seq(p), opt4_plan_seq(first), T * 4) == 0);
    opt4_plan_close(p);
  }
  /* One changed id changes the fingerprint. */
  u32[500] = (u32[500] + 1) % N;
  opt4_seq s = {u32, OPT4_U32, T, N};
  uint64_t fp;
  ASSERT_OK(opt4_fingerprint(&s, &fp));
  ASSERT(fp != fp0);
  opt4_plan_close(first);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_reconstruction(void) {
  enum { T = 2000, N = 100, C = 17 };
  uint32_t seq[T];
  uint64_t rng = 99;
  for (int t = 0; t < T; t++) seq[t] = (uint32_t)(test_rand(&rng) % N);
  opt4_plan *p = build(seq, T, N, C, 0);
  const uint32_t *ops = opt4_plan_ops(p);
  int64_t *victims = malloc(T * sizeof *victims);
  ASSERT_OK(opt4_plan_victims(p, victims, T));
  int64_t slots[C], expect[C];
  for (int s = 0; s < C; s++) expect[s] = -1;
  for (uint64_t t = 0; t <= T; t += 1) {
    if (t % 97 == 0 || t == T) {
      ASSERT_OK(opt4_plan_slots_at(p, t, slots, C));
      for (int s = 0; s < C; s++) ASSERT_EQ(slots[s], expect[s]);
    }
    if (t == T) break;
    uint32_t op = ops[t];
    if (OPT4_OP_KIND(op) == OPT4_OP_ADMIT) {
      ASSERT_EQ(victims[t], expect[OPT4_OP_SLOT(op)]);
      expect[OPT4_OP_SLOT(op)] = seq[t];
    } else {
      ASSERT_EQ(victims[t], -1);
      if (OPT4_OP_KIND(op) == OPT4_OP_HIT) ASSERT_EQ(expect[OPT4_OP_SLOT(op)], seq[t]);
    }
  }
  ASSERT_ERR(opt4_plan_victims(p, victims, T - 1), OPT4_EINVAL);
  ASSERT_ERR(opt4_plan_slots_at(p, T + 1, slots, C), OPT4_EINVAL);
  ASSERT_ERR(opt4_plan_slots_at(p, 0, slots, C - 1), OPT4_EINVAL);
  free(victims);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_edges(void) {
  /* Empty sequence. */
  opt4_plan *p = build(NULL, 0, 5, 3, 0);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(p, &in));
  ASSERT_U64_EQ(in.accesses, 0);
  ASSERT_U64_EQ(in.hits + in.misses + in.compulsory, 0);
  opt4_plan_close(p);
  /* A cache larger than the data: only compulsory misses. */
  uint32_t seq[300];
  uint64_t rng = 5;
  for (int t = 0; t < 300; t++) seq[t] = (uint32_t)(test_rand(&rng) % 30);
  for (uint32_t flags = 0; flags <= OPT4_PLAN_NOBYPASS; flags++) {
    p = build(seq, 300, 30, 1000, flags);
    ASSERT_OK(opt4_plan_info_get(p, &in));
    ASSERT_U64_EQ(in.misses, in.compulsory);
    opt4_plan_close(p);
  }
  /* Capacity 1, one id repeated: one miss. */
  uint32_t same[10] = {0};
  p = build(same, 10, 1, 1, 0);
  ASSERT_OK(opt4_plan_info_get(p, &in));
  ASSERT_U64_EQ(in.misses, 1);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_errors(void) {
  int64_t seq[4] = {0, 1, -1, 2};
  opt4_seq s = {seq, OPT4_I64, 4, 3};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = 2;
  opt4_plan *p = (opt4_plan *)&s; /* must be reset to NULL on failure */
  ASSERT_ERR(opt4_plan_build(&s, &o, &p), OPT4_ERANGE);
  ASSERT(p == NULL);
  ASSERT(strstr(opt4_errdetail(), "-1") != NULL);
  ASSERT(strstr(opt4_errdetail(), "position 2") != NULL);
  seq[2] = 3; /* == items */
  ASSERT_ERR(opt4_plan_build(&s, &o, &p), OPT4_ERANGE);
  ASSERT(strstr(opt4_errdetail(), "[0, 3)") != NULL);
  seq[2] = 1;
  o.capacity = 0;
  ASSERT_ERR(opt4_plan_build(&s, &o, &p), OPT4_ECAPACITY);
  o.capacity = 2;
  uint64_t sizes[3] = {1, 2, 3};
  o.item_sizes = sizes; /* without capacity_bytes and page_size */
  ASSERT_ERR(opt4_plan_build(&s, &o, &p), OPT4_EINVAL);
  o.capacity_bytes = 100;
  o.page_size = 10;
  ASSERT_ERR(opt4_plan_build(&s, &o, &p), OPT4_EINVAL); /* and capacity in items too */
  o.capacity = 0;
  sizes[2] = 101; /* item 2 cannot fit in the pool at all */
  ASSERT_ERR(opt4_plan_build(&s, &o, &p), OPT4_EITEMSIZE);
  ASSERT(strstr(opt4_errdetail(), "item 2 is 101 bytes") != NULL);
  o.capacity = 2;
  o.item_sizes = NULL;
  o.capacity_bytes = 0;
  o.page_size = 0;
  o.flags = 0x80;
  ASSERT_ERR(opt4_plan_build(&s, &o, &p), OPT4_EINVAL);
  o.flags = 0;
  s.items = 0;
  ASSERT_ERR(opt4_plan_build(&s, &o, &p), OPT4_EINVAL);
  s.items = 3;
  s.dtype = (opt4_dtype)9;
  ASSERT_ERR(opt4_plan_build(&s, &o, &p), OPT4_EINVAL);
  s.dtype = OPT4_I64;
  ASSERT_ERR(opt4_plan_build(NULL, &o, &p), OPT4_EINVAL);
  ASSERT_ERR(opt4_plan_build(&s, NULL, &p), OPT4_EINVAL);
  ASSERT_ERR(opt4_plan_build(&s, &o, NULL), OPT4_EINVAL);
  s.len = OPT4_MAX_ACCESSES + 1;
  ASSERT_ERR(opt4_plan_build(&s, &o, &p), OPT4_ETOOBIG);
  s.len = 4;
  opt4_plan_close(NULL); /* harmless */
  ASSERT(strcmp(opt4_strerror(OPT4_ECAPACITY), "capacity must be at least 1") == 0);
  ASSERT(strcmp(opt4_err_name(OPT4_ECHECKSUM), "OPT4_ECHECKSUM") == 0);
  ASSERT(strcmp(opt4_strerror(-999), "unknown error") == 0);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_seq_only_and_replan(void) {
  uint32_t seq[500];
  uint64_t rng = 11;
  for (int t = 0; t < 500; t++) seq[t] = (uint32_t)(test_rand(&rng) % 60);
  opt4_seq s = {seq, OPT4_U32, 500, 60};
  opt4_plan *only = NULL, *re = NULL;
  ASSERT_OK(opt4_plan_from_seq(&s, &only));
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(only, &in));
  ASSERT_EQ(in.has_ops, 0);
  ASSERT(opt4_plan_ops(only) == NULL);
  int64_t v[500];
  ASSERT_ERR(opt4_plan_victims(only, v, 500), OPT4_ENOPLAN);
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = 20;
  ASSERT_OK(opt4_plan_replan(only, &o, &re));
  opt4_plan *direct = build(seq, 500, 60, 20, 0);
  opt4_plan_info a, b;
  ASSERT_OK(opt4_plan_info_get(re, &a));
  ASSERT_OK(opt4_plan_info_get(direct, &b));
  ASSERT_U64_EQ(a.hits, b.hits);
  ASSERT_U64_EQ(a.fingerprint, in.fingerprint);
  ASSERT_U64_EQ(a.compulsory, in.compulsory);
  ASSERT(memcmp(opt4_plan_ops(re), opt4_plan_ops(direct), 2000) == 0);
  opt4_plan_close(only);
  opt4_plan_close(re);
  opt4_plan_close(direct);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Peak engine memory stays within 8 bytes per access plus O(items). */
static void test_memory_bound(void) {
  enum { N = 1000 };
  const uint64_t T = 2000000;
  uint32_t *seq = malloc(T * sizeof *seq);
  uint64_t rng = 3;
  for (uint64_t t = 0; t < T; t++) seq[t] = (uint32_t)(test_rand(&rng) % N);
  opt4_mem_peak_reset();
  opt4_plan *p = build(seq, T, N, N / 2, 0);
  opt4_mem_stats ms;
  opt4_mem_stats_get(&ms);
  uint64_t allowed = 8 * T + 64 * N + 4096;
  if (ms.peak_bytes > allowed)
    FAIL_AT("peak %llu bytes > %llu", (unsigned long long)ms.peak_bytes,
            (unsigned long long)allowed);
  opt4_plan_close(p);
  free(seq);
  ASSERT_NO_ENGINE_MEMORY();
}

static opt4_plan *build_sized(const uint32_t *seq, uint64_t T, uint64_t N, const uint64_t *sizes,
                              uint64_t capacity_bytes, uint64_t page, uint32_t flags) {
  opt4_seq s = {seq, OPT4_U32, T, N};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.item_sizes = sizes;
  o.capacity_bytes = capacity_bytes;
  o.page_size = page;
  o.flags = flags;
  opt4_plan *p = NULL;
  ASSERT_OK(opt4_plan_build(&s, &o, &p));
  return p;
}

/* With equal sizes (one page each) the sized planner is exactly Belady: the
 * same decisions, and each generation's page is the item planner's slot. */
static void test_sized_equal_sizes_is_belady(void) {
  uint64_t rng = 21;
  for (int round = 0; round < 200; round++) {
    uint64_t N = 1 + test_rand(&rng) % 30, T = test_rand(&rng) % 400, C = 1 + test_rand(&rng) % (N + 2);
    uint32_t *seq = malloc((T + 1) * sizeof *seq);
    for (uint64_t t = 0; t < T; t++) seq[t] = (uint32_t)(test_rand(&rng) % N);
    uint64_t *sizes = malloc(N * sizeof *sizes);
    for (uint64_t i = 0; i < N; i++) sizes[i] = 100; /* one page of 128 */
    for (uint32_t flags = 0; flags <= OPT4_PLAN_NOBYPASS; flags++) {
      opt4_plan *a = build(seq, T, N, C, flags);
      opt4_plan *b = build_sized(seq, T, N, sizes, C * 128 + 50, 128, flags);
      opt4_plan_info ia, ib;
      ASSERT_OK(opt4_plan_info_get(a, &ia));
      ASSERT_OK(opt4_plan_info_get(b, &ib));
      ASSERT_U64_EQ(ia.hits, ib.hits);
      ASSERT_U64_EQ(ia.bypasses, ib.bypasses);
      ASSERT(ib.flags & OPT4_PLAN_SIZED);
      ASSERT_U64_EQ(ib.capacity, C);
      const uint32_t *oa = opt4_plan_ops(a), *ob = opt4_plan_ops(b);
      for (uint64_t t = 0; t < T; t++) {
        ASSERT_EQ(OPT4_OP_KIND(oa[t]), OPT4_OP_KIND(ob[t]));
        if (OPT4_OP_KIND(ob[t]) != OPT4_OP_ADMIT) continue;
        const uint32_t *pages;
        uint64_t n;
        ASSERT_OK(opt4_plan_gen_pages(b, OPT4_OP_SLOT(ob[t]), &pages, &n));
        ASSERT_U64_EQ(n, 1);
        ASSERT_EQ(pages[0], OPT4_OP_SLOT(oa[t]));
      }
      opt4_plan_close(a);
      opt4_plan_close(b);
    }
    free(sizes);
    free(seq);
  }
  ASSERT_NO_ENGINE_MEMORY();
}

/* The progress word (opt4.h: from 0 to 3 * T) ends at 3 * T for both
 * planners; the sized one used to leave it at 0, so its bar never moved. */
static void test_progress_reaches_3T(void) {
  const uint64_t T = 300000, N = 1000;
  uint32_t *seq = malloc(T * sizeof *seq);
  uint64_t *sizes = malloc(N * sizeof *sizes);
  uint64_t rng = 5;
  for (uint64_t t = 0; t < T; t++) seq[t] = (uint32_t)(test_rand(&rng) % N);
  for (uint64_t i = 0; i < N; i++) sizes[i] = 50 + test_rand(&rng) % 300;
  for (int sized = 0; sized <= 1; sized++) {
    _Alignas(8) volatile uint64_t progress = 0;
    opt4_seq s = {seq, OPT4_U32, T, N};
    opt4_plan_opts o;
    memset(&o, 0, sizeof o);
    o.progress = &progress;
    if (sized) {
      o.item_sizes = sizes;
      o.capacity_bytes = 64 * 1000;
      o.page_size = 64;
    } else {
      o.capacity = 200;
    }
    opt4_plan *p = NULL;
    ASSERT_OK(opt4_plan_build(&s, &o, &p));
    ASSERT_U64_EQ(progress, 3 * T);
    opt4_plan_close(p);
  }
  free(sizes);
  free(seq);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Unequal sizes: a hand-checked trace. Pool of 4 pages of 10 bytes; item 0
 * takes 3 pages, items 1 and 2 one each. */
static void test_sized_golden(void) {
  const uint32_t seq[] = {0, 1, 2, 1, 0, 2};
  const uint64_t sizes[] = {25, 10, 5};
  opt4_plan *p = build_sized(seq, 6, 3, sizes, 40, 10, 0);
  const uint32_t *ops = opt4_plan_ops(p);
  /* 0: ADMIT (pages 0-2), 1: ADMIT (page 3), 2: no free page; the farthest
   * resident is 0 (next use 4) and 2's next use is 5, later: BYPASS. 1: HIT
   * (dead: page 3 freed). 0: HIT (dead). 2: miss, never again: BYPASS. */
  ASSERT_EQ(OPT4_OP_KIND(ops[0]), OPT4_OP_ADMIT);
  ASSERT_EQ(OPT4_OP_KIND(ops[1]), OPT4_OP_ADMIT);
  ASSERT_EQ(OPT4_OP_KIND(ops[2]), OPT4_OP_BYPASS);
  ASSERT_EQ(OPT4_OP_KIND(ops[3]), OPT4_OP_HIT);
  ASSERT_EQ(OPT4_OP_KIND(ops[4]), OPT4_OP_HIT);
  ASSERT_EQ(OPT4_OP_KIND(ops[5]), OPT4_OP_BYPASS);
  const uint32_t *pages;
  uint64_t n;
  ASSERT_OK(opt4_plan_gen_pages(p, 0, &pages, &n));
  ASSERT_U64_EQ(n, 3);
  ASSERT(pages[0] == 0 && pages[1] == 1 && pages[2] == 2);
  ASSERT_OK(opt4_plan_gen_pages(p, 1, &pages, &n));
  ASSERT(n == 1 && pages[0] == 3);
  int64_t slots[4];
  ASSERT_OK(opt4_plan_slots_at(p, 6, slots, 4));
  ASSERT(slots[0] == 0 && slots[2] == 0 && slots[3] == 1);
  int64_t v[6];
  ASSERT_ERR(opt4_plan_victims(p, v, 6), OPT4_ENOTSUP);
  opt4_plan_close(p);
  /* Without bypass, 2 must be admitted: it evicts the farthest, 0 (3 pages). */
  p = build_sized(seq, 6, 3, sizes, 40, 10, OPT4_PLAN_NOBYPASS);
  ops = opt4_plan_ops(p);
  ASSERT_EQ(OPT4_OP_KIND(ops[2]), OPT4_OP_ADMIT);
  ASSERT_EQ(OPT4_OP_KIND(ops[4]), OPT4_OP_ADMIT); /* 0 was evicted */
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A sized plan whose trace uses fewer pages than min(capacity, items,
 * accesses): ids that never appear, in a roomy pool. slots_at takes
 * info.slots entries (found by fuzzing: it used to demand the item-plan
 * count). */
static void test_sized_unused_items(void) {
  const uint32_t seq[] = {0, 1, 0, 1, 0, 1};
  uint64_t sizes[10];
  for (int i = 0; i < 10; i++) sizes[i] = 100;
  opt4_plan *p = build_sized(seq, 6, 10, sizes, 100 * 128, 128, 0);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(p, &in));
  ASSERT_U64_EQ(in.slots, 2);
  ASSERT_U64_EQ(in.hits, 4);
  int64_t slots[2];
  ASSERT_OK(opt4_plan_slots_at(p, 3, slots, 2));
  ASSERT(slots[0] == 0 && slots[1] == 1);
  ASSERT_ERR(opt4_plan_slots_at(p, 3, slots, 1), OPT4_EINVAL);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_textbook);
  RUN(test_sized_unused_items);
  RUN(test_sized_equal_sizes_is_belady);
  RUN(test_sized_golden);
  RUN(test_progress_reaches_3T);
  RUN(test_bypass_golden);
  RUN(test_against_naive);
  RUN(test_dtypes_agree);
  RUN(test_reconstruction);
  RUN(test_edges);
  RUN(test_errors);
  RUN(test_seq_only_and_replan);
  RUN(test_memory_bound);
  return 0;
}
