/*
 * task.h - a tiny test harness in the manner of libuv's test/task.h: asserts
 * that print both sides and where, then exit non-zero. Each test file is its
 * own executable run by ctest with a timeout.
 */
#ifndef OPT4_TEST_TASK_H
#define OPT4_TEST_TASK_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opt4.h"

#define FAIL_AT(fmt, ...)                                                   \
  do {                                                                      \
    fprintf(stderr, "%s:%d: " fmt "\n", __FILE__, __LINE__, __VA_ARGS__);   \
    exit(1);                                                                \
  } while (0)

#define ASSERT(expr)                                                        \
  do {                                                                      \
    if (!(expr)) FAIL_AT("assertion failed: %s", #expr);                    \
  } while (0)

#define ASSERT_EQ(a, b)                                                     \
  do {                                                                      \
    long long a_ = (long long)(a), b_ = (long long)(b);                     \
    if (a_ != b_) FAIL_AT("%s == %s: %lld != %lld", #a, #b, a_, b_);        \
  } while (0)

#define ASSERT_U64_EQ(a, b)                                                 \
  do {                                                                      \
    uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                        \
    if (a_ != b_)                                                           \
      FAIL_AT("%s == %s: %" PRIu64 " != %" PRIu64, #a, #b, a_, b_);         \
  } while (0)

/* An engine call that must succeed; prints the code and detail if not. */
#define ASSERT_OK(call)                                                     \
  do {                                                                      \
    int rc_ = (call);                                                       \
    if (rc_ != 0)                                                           \
      FAIL_AT("%s failed: %s (%s) %s", #call, opt4_err_name(rc_),           \
              opt4_strerror(rc_), opt4_errdetail());                        \
  } while (0)

/* An engine call that must fail with a given code. */
#define ASSERT_ERR(call, code)                                              \
  do {                                                                      \
    int rc_ = (call);                                                       \
    if (rc_ != (code))                                                      \
      FAIL_AT("%s: got %s, want %s (%s)", #call, opt4_err_name(rc_),        \
              opt4_err_name(code), opt4_errdetail());                       \
  } while (0)

/* After a test: the engine holds no memory. */
#define ASSERT_NO_ENGINE_MEMORY()                                           \
  do {                                                                      \
    opt4_mem_stats ms_;                                                     \
    opt4_mem_stats_get(&ms_);                                               \
    ASSERT_U64_EQ(ms_.current_bytes, 0);                                    \
  } while (0)

/* A small deterministic generator for test traces (splitmix64). */
static inline uint64_t test_rand(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

#define RUN(test)                                                           \
  do {                                                                      \
    fprintf(stderr, "  %s\n", #test);                                       \
    test();                                                                 \
  } while (0)

#endif
