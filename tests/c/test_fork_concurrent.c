/* test_fork_concurrent.c - fork while the prefetcher's threads run.
 *
 * A DataLoader without persistent workers forks new workers every epoch
 * while the prefetch threads load ahead. A child forked while one of those
 * threads held a lock (the allocator's, stdio's, a sanitizer's) inherits the
 * lock held by a thread it does not have, and deadlocks on first use. The
 * prefetcher parks its threads at safe points around every fork
 * (src/io/prefetcher.c). Here: 200 rounds of two forked consumer processes,
 * each following its slice of the plan with the parent's pool handle (as a
 * forked DataLoader worker does) and using malloc and stdio, while 4
 * prefetch threads read with latency. What must hold: no child hangs (each
 * round is bounded), every item is byte-equal, the plan's hits are all
 * served, every fork found the threads parked, and the threads go on after
 * each fork (they prefetch through to the end). Under ASan this is the case
 * that deadlocked before parking (the "concurrent" label runs it under TSan
 * too). */
#include "pool_util.h"

#include "layout.h"
#include "records.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

enum { ROUNDS = 200, CHILDREN = 2, BATCH = 16, ROUND_SECONDS = 60 };

static volatile sig_atomic_t alarmed;
static void on_alarm(int sig) {
  (void)sig;
  alarmed = 1;
}

/* A forked consumer: serve [first, last) in batches (child k of CHILDREN
 * takes every CHILDREN-th batch), touching malloc and stdio as a worker
 * does. Exit 0 if every item was right, 2 if not. */
static void child_main(opt4_pool *pool, uint64_t first, uint64_t last, int k) {
  follow_counts fc = {0, 0, 0, 0};
  for (uint64_t b = first + (uint64_t)k * BATCH; b < last; b += (uint64_t)CHILDREN * BATCH) {
    uint64_t end = b + BATCH < last ? b + BATCH : last;
    follow_batch(pool, b, end, &fc);
    char *p = malloc(4096 + (size_t)(b % 7) * 1000);
    FILE *f = fopen("/proc/self/stat", "r");
    if (f != NULL) fclose(f);
    free(p);
  }
  _exit(fc.wrong == 0 ? 0 : 2);
}

static void test_fork_rounds(void) {
  char path[128];
  snprintf(path, sizeof path, "./opt4-test-%d-fork.rec", (int)getpid());
  const uint32_t N = 400;
  write_items(path, N);
  opt4_records *src = NULL;
  ASSERT_OK(opt4_records_open(path, 0, &src));
  opt4_records_set_latency(src, 50000); /* 50 us a read: threads are mid-read at forks */
  opt4_plan *plan = random_plan(ROUNDS * 96, N, 100, 77);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 20000, .staging_slots = 16};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  opt4_prefetcher_opts po = {4, 0, 512, NULL, NULL, 0};
  opt4_prefetcher *pf = NULL;
  ASSERT_OK(opt4_prefetcher_start(opt4_pool_name(pool), src, &po, &pf));

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm; /* no SA_RESTART: waitpid returns EINTR */
  sigaction(SIGALRM, &sa, NULL);
  const uint64_t per = in.accesses / ROUNDS;
  for (int round = 0; round < ROUNDS; round++) {
    uint64_t first = (uint64_t)round * per, last = round == ROUNDS - 1 ? in.accesses : first + per;
    pid_t kids[CHILDREN];
    for (int k = 0; k < CHILDREN; k++) {
      kids[k] = fork();
      ASSERT(kids[k] >= 0);
      if (kids[k] == 0) child_main(pool, first, last, k);
    }
    alarmed = 0;
    alarm(ROUND_SECONDS);
    for (int k = 0; k < CHILDREN; k++) {
      int status = 0;
      while (waitpid(kids[k], &status, 0) < 0) {
        ASSERT(errno == EINTR);
        if (alarmed) {
          for (int j = 0; j < CHILDREN; j++) kill(kids[j], SIGKILL);
          FAIL_AT("round %d: child %d (pid %d) still running after %d s: hung after fork", round, k,
                  (int)kids[k], ROUND_SECONDS);
        }
      }
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAIL_AT("round %d: child %d ended with status %d (2: a wrong item)", round, k, status);
    }
    alarm(0);
  }
  opt4_prefetcher_stats ps;
  ASSERT_OK(opt4_prefetcher_stats_get(pf, &ps));
  opt4_prefetcher_stop(pf);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  fprintf(stderr, "    %d forks: parked %llu times, %llu park timeouts; %llu of %llu misses prefetched, "
          "%llu fallbacks\n", ROUNDS * CHILDREN, (unsigned long long)ps.parks,
          (unsigned long long)ps.park_timeouts, (unsigned long long)st.prefetched,
          (unsigned long long)in.misses, (unsigned long long)st.fallbacks);
  ASSERT_U64_EQ(ps.parks, (uint64_t)ROUNDS * CHILDREN);
  ASSERT_U64_EQ(ps.park_timeouts, 0);
  ASSERT_U64_EQ(ps.errors, 0);
  ASSERT_U64_EQ(st.fallbacks, 0);
  ASSERT_U64_EQ(st.hits + st.deferred, in.hits);
  /* The threads went on after every fork: they prefetched into the last
   * rounds, not only before the first fork. */
  ASSERT(st.prefetched > in.misses / 2);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  opt4_records_close(src);
  unlink(path);
  ASSERT_NO_ENGINE_MEMORY();
}

/* In the child, stopping the parent's prefetcher frees the child's copy
 * only: it returns at once (there are no threads to join), and the parent's
 * threads are not disturbed. */
static void test_stop_in_child(void) {
  char path[128];
  snprintf(path, sizeof path, "./opt4-test-%d-forkstop.rec", (int)getpid());
  write_items(path, 50);
  opt4_records *src = NULL;
  ASSERT_OK(opt4_records_open(path, 0, &src));
  opt4_plan *plan = random_plan(2000, 50, 10, 5);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 20000, .staging_slots = 8};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  opt4_prefetcher_opts po = {2, 0, 256, NULL, NULL, 0};
  opt4_prefetcher *pf = NULL;
  ASSERT_OK(opt4_prefetcher_start(opt4_pool_name(pool), src, &po, &pf));
  pid_t kid = fork();
  ASSERT(kid >= 0);
  if (kid == 0) {
    alarm(20);
    opt4_prefetcher_stop(pf);
    _exit(0);
  }
  int status = 0;
  ASSERT(waitpid(kid, &status, 0) == kid);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  /* The parent's threads work on after the child's stop: they store items
   * ahead of a consumer that has not started (bounded: 10 s). */
  opt4_prefetcher_stats ps;
  for (int i = 0; i < 10000; i++) {
    ASSERT_OK(opt4_prefetcher_stats_get(pf, &ps));
    if (ps.stored >= 8) break;
    usleep(1000);
  }
  ASSERT(ps.stored >= 8);
  follow_counts fc = {0, 0, 0, 0};
  for (uint64_t b = 0; b < in.accesses; b += BATCH)
    follow_batch(pool, b, b + BATCH < in.accesses ? b + BATCH : in.accesses, &fc);
  ASSERT_OK(opt4_prefetcher_stats_get(pf, &ps));
  opt4_prefetcher_stop(pf);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(fc.wrong, 0);
  ASSERT_U64_EQ(st.hits + st.deferred, in.hits);
  ASSERT(st.prefetched > 0);
  ASSERT_U64_EQ(ps.parks, 1);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  opt4_records_close(src);
  unlink(path);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_stop_in_child);
  RUN(test_fork_rounds);
  return 0;
}
