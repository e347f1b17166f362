/* test_policies.c - every simulator policy on tiny traces whose counts were
 * worked out by hand (the walkthrough is beside each), plus the properties
 * every policy must have: capacity >= items never evicts, every dtype gives
 * the same count, bad ids fail cleanly, OPT bounds them all, and nothing
 * leaks. docs/policies.md states each rule. */
#include "task.h"

static uint64_t hits_of(const char *policy, const uint32_t *seq, uint64_t T,
                        uint64_t N, uint64_t C, uint64_t seed) {
  opt4_seq s = {seq, OPT4_U32, T, N};
  opt4_sim_result r;
  ASSERT_OK(opt4_simulate(policy, &s, C, seed, &r));
  ASSERT_U64_EQ(r.accesses, T);
  ASSERT_U64_EQ(r.hits + r.misses, T);
  return r.hits;
}

#define HITS(policy, arr, N, C) \
  hits_of((policy), (arr), sizeof(arr) / sizeof((arr)[0]), (N), (C), 0)

/* C = 3. 0 1 2 fill the ring [0 1 2], hand at 0. 0 hits (ref0 = 1).
 * 3: the hand clears ref0, evicts 1 -> [0 3 2], hand at 2. 0 hits.
 * 4: evicts 2 (clear) -> [0 3 4], hand at 0. 1: clears ref0, evicts 3.
 * CLOCK 2 hits; FIFO (3 evicts 0, so 0 misses) 1; LRU 2. */
static void test_clock(void) {
  const uint32_t s[] = {0, 1, 2, 0, 3, 0, 4, 1};
  ASSERT_U64_EQ(HITS("clock", s, 5, 3), 2);
  ASSERT_U64_EQ(HITS("fifo", s, 5, 3), 1);
  ASSERT_U64_EQ(HITS("lru", s, 5, 3), 2);
  ASSERT_NO_ENGINE_MEMORY();
}

/* C = 3, queue oldest first. 0 1 2 -> [0 1 2]. 0 hits (visited).
 * 3: the hand starts at the oldest, 0, clears it, evicts 1 and rests on 2
 * -> [0 2 3]. 1: evicts 2, the hand rests on 3 -> [0 3 1]. 4: evicts 3,
 * rests on 1 -> [0 1 4]. 0 hits: SIEVE 2 hits. CLOCK on the same trace
 * passes 0 once and then evicts it at 4 (ring [0 3 1], hand back at 0), so
 * 0 misses: 1 hit. */
static void test_sieve(void) {
  const uint32_t s[] = {0, 1, 2, 0, 3, 1, 4, 0};
  ASSERT_U64_EQ(HITS("sieve", s, 5, 3), 2);
  ASSERT_U64_EQ(HITS("clock", s, 5, 3), 1);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_lfu(void) {
  /* C = 2. 0 0 1: counts 0:2 1:1. 2 evicts 1 (the fewest); 1 evicts 2
   * (count 1 against 0's 2); 0 hits. 2 hits. */
  const uint32_t a[] = {0, 0, 1, 2, 1, 0};
  ASSERT_U64_EQ(HITS("lfu", a, 3, 2), 2);
  /* Ties go to the least recently used: 0 1 0 1 gives both count 2, 0 last
   * seen earlier, so 2 evicts 0; then 0 evicts 2 (count 1). 2 hits (3 if
   * the tie went the other way). */
  const uint32_t b[] = {0, 1, 0, 1, 2, 0};
  ASSERT_U64_EQ(HITS("lfu", b, 3, 2), 2);
  /* Counts start again at admission: 0 0 1 1 1 -> 0:2 1:3; 2 evicts 0;
   * 0 evicts 2 and comes back with count 1, not 3; 2 evicts 0 again
   * (1 < 3), so the last 0 misses. 3 hits (4 with lifetime counts). */
  const uint32_t c[] = {0, 0, 1, 1, 1, 2, 0, 2, 0};
  ASSERT_U64_EQ(HITS("lfu", c, 3, 2), 3);
  ASSERT_NO_ENGINE_MEMORY();
}

/* C = 3: ceil(3 / 10) = 1, so S is evicted from whenever it is not empty,
 * and G keeps 3 - 1 = 2 ids.
 *   0 1 2   S [0 1 2]
 *   0 0     hits, f0 = 2
 *   3       S's oldest, 0, has f 2 > 1: to M with f 0; then 1 (f 0) is
 *           evicted to G [1]. 3 enters S [2 3]; M [0]
 *   1       evict: 2 to G [1 2]; then 1 is in G: it leaves G and enters M.
 *           S [3], M [0 1], G [2]
 *   4       3 to G [2 3]; S [4]
 *   0       hit (f0 = 1)
 *   2       4 to G [2 3 4], which drops its oldest, 2; so 2, no longer a
 *           ghost, enters S [2]
 *   1       hit (f1 = 1)
 *   3       2 to G [3 4 2] -> [4 2]: 3 has aged out, enters S [3]
 *   2       3 to G [4 2 3] -> [2 3]: 2 is still a ghost, enters M.
 *           S [], M [0 1 2]
 *   5       S is empty, so M: 0 (f 1) goes round with f 0, so does 1, and
 *           2 (f 0) is evicted. S [5], M [0 1]
 *   0 1     hits
 * 6 hits. */
static void test_s3fifo(void) {
  const uint32_t s[] = {0, 1, 2, 0, 0, 3, 1, 4, 0, 2, 1, 3, 2, 5, 0, 1};
  ASSERT_U64_EQ(HITS("s3fifo", s, 6, 3), 6);
  ASSERT_NO_ENGINE_MEMORY();
}

/* C = 2, p = 0.
 *   0 1      T1 [0 1]
 *   0        hit: T2 [0], T1 [1]
 *   2        |T1|+|B1| = 1 < 2, 4 ids listed >= 2: REPLACE: |T1| = 1 > p:
 *            1 -> B1. T1 [2]
 *   1        in B1: p += max(1, 0 / 1) = 1; REPLACE: |T1| = 1 not > 1:
 *            T2's 0 -> B2 [0]. T2 [1]
 *   0        in B2: p -= max(1, 0 / 1) -> 0; REPLACE (in B2): 2 -> B1 [2].
 *            T2 [1 0]
 *   2        in B1: p = 1; REPLACE: T1 empty: 1 -> B2 [1]. T2 [0 2]
 *   3        REPLACE: T1 empty: 0 -> B2 [1 0]. T1 [3]
 *   1        in B2: p = 0; REPLACE (in B2): 3 -> B1. T2 [2 1]
 *   2        hit
 * 2 hits. */
static void test_arc(void) {
  const uint32_t s[] = {0, 1, 0, 2, 1, 0, 2, 3, 1, 2};
  ASSERT_U64_EQ(HITS("arc", s, 4, 2), 2);
  ASSERT_NO_ENGINE_MEMORY();
}

/* static keeps the first C distinct ids: C = 2 holds {0, 1}; the later 0
 * and 1 hit, 2 and 3 never enter. */
static void test_static(void) {
  const uint32_t s[] = {0, 1, 2, 0, 1, 2, 3, 3, 0};
  ASSERT_U64_EQ(HITS("static", s, 4, 2), 3);
  ASSERT_U64_EQ(HITS("static", s, 4, 1), 2);
  ASSERT_NO_ENGINE_MEMORY();
}

/* freq keeps the C most accessed ids of the whole trace, lower id on ties:
 * counts 0:2 1:2 2:3. C = 1: {2}, which hits twice after its first access.
 * C = 2: {2, 0} (0 beats 1 on the tie): 2 + 1 hits. */
static void test_freq(void) {
  const uint32_t s[] = {0, 1, 1, 2, 2, 2, 0};
  ASSERT_U64_EQ(HITS("freq", s, 3, 1), 2);
  ASSERT_U64_EQ(HITS("freq", s, 3, 2), 3);
  ASSERT_U64_EQ(HITS("freq", s, 3, 3), 4);
  /* All counts equal: the lowest ids win. */
  const uint32_t e[] = {3, 2, 1, 0, 3, 2, 1, 0};
  ASSERT_U64_EQ(HITS("freq", e, 4, 2), 2); /* {0, 1} */
  ASSERT_NO_ENGINE_MEMORY();
}

/* random: with C = 1 every miss replaces the one resident, so a hit is an
 * id equal to the one before it. With C = 2 the victim is slot
 * splitmix64(seed) % 2 of the slots [0 1]. */
static void test_random(void) {
  const uint32_t s[] = {0, 0, 1, 1, 1, 0, 2, 2};
  ASSERT_U64_EQ(HITS("random", s, 3, 1), 4);
  const uint32_t t[] = {0, 1, 2, 0, 1};
  for (uint64_t seed = 0; seed < 8; seed++) {
    uint64_t state = seed;
    uint64_t victim_slot = test_rand(&state) % 2; /* 2 replaces 0 or 1 */
    /* Then 0 hits if 1 was evicted (slot 1); else 0 misses and evicts slot
     * test_rand % 2 of [2 1], and 1 hits if that slot was 0 (the 2). */
    uint64_t want;
    if (victim_slot == 1) {
      want = 1; /* 0 hits; 1 misses */
    } else {
      want = test_rand(&state) % 2 == 0 ? 1 : 0;
    }
    ASSERT_U64_EQ(hits_of("random", t, 5, 3, 2, seed), want);
  }
  ASSERT_NO_ENGINE_MEMORY();
}

/* The textbook string (Silberschatz) with 3 frames, for every policy; the
 * counts agree with reference.py. */
static void test_textbook_all(void) {
  static const uint32_t s[] = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3,
                               0, 3, 2, 1, 2, 0, 1, 7, 0, 1};
  static const struct {
    const char *policy;
    uint64_t hits;
  } want[] = {{"opt", 12},  {"opt-nobypass", 11}, {"lru", 8},    {"fifo", 5},
              {"lfu", 9},   {"clock", 9},         {"sieve", 9},  {"s3fifo", 6},
              {"arc", 7},   {"static", 9},        {"freq", 11}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    uint64_t h = HITS(want[i].policy, s, 8, 3);
    if (h != want[i].hits)
      FAIL_AT("%s: %" PRIu64 " hits, want %" PRIu64, want[i].policy, h, want[i].hits);
  }
  ASSERT_NO_ENGINE_MEMORY();
}

static int is_demand(const char *policy) {
  /* Policies that admit every miss (no bypass): opt-nobypass bounds them. */
  return strcmp(policy, "opt") != 0 && strcmp(policy, "static") != 0 &&
         strcmp(policy, "freq") != 0;
}

/* On random traces: any capacity >= items never evicts (hits = T -
 * distinct); all four dtypes agree; OPT has the most hits of all and
 * opt-nobypass the most of those that always admit. */
static void test_properties(void) {
  enum { T = 3000 };
  static uint32_t s[T];
  static int32_t s32[T];
  static int64_t s64[T];
  static uint64_t u64[T];
  uint64_t rng = 99;
  const char *const *names = opt4_policy_names();
  for (int round = 0; round < 30; round++) {
    uint64_t n = 1 + test_rand(&rng) % 80, c = 1 + test_rand(&rng) % (n + 2);
    uint64_t hot = 1 + test_rand(&rng) % n;
    uint8_t seen[80] = {0};
    uint64_t distinct = 0;
    for (int t = 0; t < T; t++) {
      uint64_t r = test_rand(&rng);
      s[t] = (uint32_t)((r & 1) ? (r >> 1) % n : (r >> 1) % hot);
      s32[t] = (int32_t)s[t];
      s64[t] = s[t];
      u64[t] = s[t];
      if (!seen[s[t]]) distinct += (seen[s[t]] = 1);
    }
    uint64_t opt = hits_of("opt", s, T, n, c, 0);
    uint64_t opt_nb = hits_of("opt-nobypass", s, T, n, c, 0);
    for (const char *const *p = names; *p != NULL; p++) {
      uint64_t seed = test_rand(&rng);
      uint64_t h = hits_of(*p, s, T, n, c, seed);
      if (h > opt) FAIL_AT("%s: %" PRIu64 " hits beat opt's %" PRIu64, *p, h, opt);
      if (is_demand(*p) && h > opt_nb)
        FAIL_AT("%s: %" PRIu64 " hits beat opt-nobypass's %" PRIu64, *p, h, opt_nb);
      ASSERT_U64_EQ(hits_of(*p, s, T, n, n + test_rand(&rng) % 5, seed), T - distinct);
      opt4_seq v32 = {s32, OPT4_I32, T, n}, v64 = {s64, OPT4_I64, T, n},
               vu64 = {u64, OPT4_U64, T, n};
      opt4_sim_result r;
      ASSERT_OK(opt4_simulate(*p, &v32, c, seed, &r));
      ASSERT_U64_EQ(r.hits, h);
      ASSERT_OK(opt4_simulate(*p, &v64, c, seed, &r));
      ASSERT_U64_EQ(r.hits, h);
      ASSERT_OK(opt4_simulate(*p, &vu64, c, seed, &r));
      ASSERT_U64_EQ(r.hits, h);
    }
  }
  ASSERT_NO_ENGINE_MEMORY();
}

/* A bad id fails with OPT4_ERANGE naming its position, for every policy
 * (freq finds it while counting, before the replay), and leaks nothing.
 * A huge capacity is fine: no policy needs more than items slots. */
static void test_errors_and_limits(void) {
  const int64_t bad[] = {0, 1, 2, 1, -1, 0};
  opt4_seq s = {bad, OPT4_I64, 6, 3};
  opt4_sim_result r;
  for (const char *const *p = opt4_policy_names(); *p != NULL; p++) {
    ASSERT_ERR(opt4_simulate(*p, &s, 2, 0, &r), OPT4_ERANGE);
    if (strstr(opt4_errdetail(), "position 4") == NULL)
      FAIL_AT("%s: detail \"%s\" does not name position 4", *p, opt4_errdetail());
    ASSERT_ERR(opt4_simulate(*p, &s, 0, 0, &r), OPT4_ECAPACITY);
    opt4_seq ok = {bad, OPT4_I64, 4, 3};
    ASSERT_OK(opt4_simulate(*p, &ok, UINT64_MAX, 0, &r));
    ASSERT_U64_EQ(r.hits, 1);
    opt4_seq empty = {NULL, OPT4_I64, 0, 3};
    ASSERT_OK(opt4_simulate(*p, &empty, 2, 0, &r));
    ASSERT_U64_EQ(r.accesses, 0);
  }
  int n = 0;
  for (const char *const *p = opt4_policy_names(); *p != NULL; p++) n++;
  ASSERT_EQ(n, 12);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_clock);
  RUN(test_sieve);
  RUN(test_lfu);
  RUN(test_s3fifo);
  RUN(test_arc);
  RUN(test_static);
  RUN(test_freq);
  RUN(test_random);
  RUN(test_textbook_all);
  RUN(test_properties);
  RUN(test_errors_and_limits);
  return 0;
}
