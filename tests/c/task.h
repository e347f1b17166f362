/*
 * task.h - a tiny test harness in the manner of libuv's test/task.h: asserts
 * that print both sides and where, then exit non-zero. Each test file is its
 * own executable run by ctest with a timeout.
 */
#ifndef OPT4_TEST_TASK_H
#define OPT4_TEST_TASK_H

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "opt4.h"

/* The watchdog: a test still running after OPT4_TEST_TIMEOUT seconds (240
 * unless the environment says otherwise, under ctest's 300) prints the
 * stack of every thread (gdb, when installed) and aborts, so that a hang
 * is a failure with its stacks rather than a silent kill. A POSIX timer, not
 * alarm(), which tests keep for their own use; not inherited by children. */
static char task__pid[24];

static void task__on_timeout(int sig) {
  (void)sig;
  static const char msg[] = "\n*** test timed out: the stacks of every thread follow ***\n";
  if (write(2, msg, sizeof msg - 1) < 0) _exit(3);
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  pid_t g = fork();
  if (g == 0) {
    dup2(2, 1);
    execlp("gdb", "gdb", "-batch", "-nx", "-p", task__pid, "-ex", "thread apply all bt", (char *)NULL);
    _exit(127);
  }
  if (g > 0) waitpid(g, NULL, 0);
  signal(SIGABRT, SIG_DFL);
  abort();
}

/* Each test process makes and sweeps pools in a namespace of its own
 * (OPT4TORCH_POOL_NAMESPACE, inherited by its children), so that two test
 * runs on one machine never sweep each other's deliberately stale pools.
 * A namespace given from outside is kept. */
__attribute__((constructor)) static void task__pool_namespace(void) {
  if (getenv("OPT4TORCH_POOL_NAMESPACE") != NULL) return;
  char ns[24];
  snprintf(ns, sizeof ns, "c%d", (int)getpid());
  setenv("OPT4TORCH_POOL_NAMESPACE", ns, 1);
}

/* A pool name as the engine would give one to process pid in this
 * process's namespace: /opt4-<uid>-[<namespace>-]<pid>-<tail>. */
static inline void task_pool_name(char *buf, size_t cap, int pid, const char *tail) {
  const char *ns = getenv("OPT4TORCH_POOL_NAMESPACE");
  int has = ns != NULL && ns[0] != '\0';
  snprintf(buf, cap, "/opt4-%u-%s%s%d-%s", (unsigned)getuid(), has ? ns : "", has ? "-" : "", pid,
           tail);
}

__attribute__((constructor)) static void task__watchdog(void) {
  const char *env = getenv("OPT4_TEST_TIMEOUT");
  long seconds = env != NULL ? atol(env) : 240;
  if (seconds <= 0) return;
  snprintf(task__pid, sizeof task__pid, "%d", (int)getpid());
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = task__on_timeout;
  sigaction(SIGRTMIN + 1, &sa, NULL);
  struct sigevent sev;
  memset(&sev, 0, sizeof sev);
  sev.sigev_notify = SIGEV_SIGNAL;
  sev.sigev_signo = SIGRTMIN + 1;
  timer_t timer;
  if (timer_create(CLOCK_MONOTONIC, &sev, &timer) != 0) return;
  struct itimerspec its;
  memset(&its, 0, sizeof its);
  its.it_value.tv_sec = seconds;
  timer_settime(timer, 0, &its, NULL);
}

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

/* What a test needs is not in this build (an optional library): the rest
 * of the executable is skipped, and ctest reports it as skipped with the
 * reason (SKIP_RETURN_CODE 77 in CMakeLists.txt), never as passed. */
#define TEST_SKIP_EXIT_CODE 77
#define SKIP_REST(reason)                                                   \
  do {                                                                      \
    fprintf(stderr, "SKIPPED: %s\n", reason);                               \
    exit(TEST_SKIP_EXIT_CODE);                                              \
  } while (0)

#define S3_NOT_BUILT                                                        \
  "this build has no S3 reader (libcurl's and OpenSSL's headers were not found at build time; "   \
  "Debian: apt install libcurl4-openssl-dev libssl-dev)"

#define RUN(test)                                                           \
  do {                                                                      \
    fprintf(stderr, "  %s\n", #test);                                       \
    test();                                                                 \
  } while (0)

#endif
