/* test_sim.c - the simulator's online policies on golden traces. */
#include "task.h"

static const uint32_t textbook[] = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3,
                                    0, 3, 2, 1, 2, 0, 1, 7, 0, 1};

static uint64_t misses(const char *policy, const uint32_t *seq, uint64_t T,
                       uint64_t N, uint64_t C) {
  opt4_seq s = {seq, OPT4_U32, T, N};
  opt4_sim_result r;
  ASSERT_OK(opt4_simulate(policy, &s, C, 1, &r));
  ASSERT_U64_EQ(r.accesses, T);
  ASSERT_U64_EQ(r.hits + r.misses, T);
  return r.misses;
}

static void test_textbook(void) {
  /* Silberschatz, Operating System Concepts: 3 frames. */
  ASSERT_U64_EQ(misses("opt-nobypass", textbook, 20, 8, 3), 9);
  ASSERT_U64_EQ(misses("lru", textbook, 20, 8, 3), 12);
  ASSERT_U64_EQ(misses("fifo", textbook, 20, 8, 3), 15);
  ASSERT_U64_EQ(misses("opt", textbook, 20, 8, 3), 8);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Belady's anomaly: FIFO on 1 2 3 4 1 2 5 1 2 3 4 5 misses 9 times with 3
 * frames and 10 times with 4; LRU, a stack policy, cannot do that. */
static void test_belady_anomaly(void) {
  const uint32_t s[] = {1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5};
  ASSERT_U64_EQ(misses("fifo", s, 12, 6, 3), 9);
  ASSERT_U64_EQ(misses("fifo", s, 12, 6, 4), 10);
  ASSERT_U64_EQ(misses("lru", s, 12, 6, 3), 10);
  ASSERT_U64_EQ(misses("lru", s, 12, 6, 4), 8);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A cyclic scan one larger than the cache: LRU and FIFO miss every time,
 * OPT keeps C - 1 of every C + 1 ... and never does worse. */
static void test_loop_and_bound(void) {
  enum { N = 11, T = 1100 };
  uint32_t s[T];
  for (int t = 0; t < T; t++) s[t] = (uint32_t)(t % N);
  ASSERT_U64_EQ(misses("lru", s, T, N, N - 1), T);
  ASSERT_U64_EQ(misses("fifo", s, T, N, N - 1), T);
  uint64_t opt = misses("opt", s, T, N, N - 1);
  ASSERT(opt < T / 5);
  uint64_t rng = 4;
  for (int round = 0; round < 50; round++) {
    uint64_t n = 2 + test_rand(&rng) % 60, c = 1 + test_rand(&rng) % n;
    for (int t = 0; t < T; t++) s[t] = (uint32_t)(test_rand(&rng) % n);
    uint64_t o = misses("opt", s, T, n, c), onb = misses("opt-nobypass", s, T, n, c);
    ASSERT(o <= onb);
    ASSERT(onb <= misses("lru", s, T, n, c));
    ASSERT(onb <= misses("fifo", s, T, n, c));
  }
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_errors(void) {
  const uint32_t s[] = {0, 1, 2};
  opt4_seq seq = {s, OPT4_U32, 3, 3};
  opt4_sim_result r;
  ASSERT_ERR(opt4_simulate("nope", &seq, 2, 0, &r), OPT4_EUNKNOWN_POLICY);
  ASSERT(strstr(opt4_errdetail(), "nope") != NULL);
  ASSERT_ERR(opt4_simulate("lru", &seq, 0, 0, &r), OPT4_ECAPACITY);
  seq.items = 2;
  ASSERT_ERR(opt4_simulate("lru", &seq, 2, 0, &r), OPT4_ERANGE);
  const char *const *names = opt4_policy_names();
  int n = 0;
  while (names[n] != NULL) n++;
  ASSERT(n >= 4);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_textbook);
  RUN(test_belady_anomaly);
  RUN(test_loop_and_bound);
  RUN(test_errors);
  return 0;
}
