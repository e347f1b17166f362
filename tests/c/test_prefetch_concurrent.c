/* test_prefetch_concurrent.c - clairvoyant prefetch on the pool: prefetcher
 * threads following the plan ahead of consumer threads (run under
 * ThreadSanitizer too, by the "concurrent" label), the claim protocol in one
 * thread step by step, and a prefetcher process that dies holding a claim.
 *
 * What must hold: every item a consumer gets is byte-equal to the source;
 * the plan's hits are all served; and every miss is loaded exactly once,
 * by a prefetcher or by its consumer (loads = the plan's misses + what
 * prefetchers gave up, which is 0 when no wait times out). */
#include "pool_util.h"

#include "layout.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { BATCH = 16 };

static _Atomic uint64_t source_loads; /* every load from the "source" */

/* The consumers start once a prefetcher holds its first claim: else, on a
 * busy machine, the consumers can run through the whole plan before any
 * prefetcher thread is scheduled, loading every miss themselves (correct,
 * but then "prefetched > 0" would say nothing about the prefetchers; seen
 * once under make test's load, 4 prefetchers and 3 consumers on 2 cores). */
static pthread_mutex_t started_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t started_cond = PTHREAD_COND_INITIALIZER;
static int started; /* under started_lock */

static void mark_started(void) {
  pthread_mutex_lock(&started_lock);
  started = 1;
  pthread_cond_broadcast(&started_cond);
  pthread_mutex_unlock(&started_lock);
}

typedef struct consumer_arg {
  const char *name;
  uint64_t accesses;
  int index, workers;
  follow_counts fc;
} consumer_arg;

static void *consumer_main(void *p) {
  consumer_arg *a = p;
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_attach(a->name, &pool));
  uint64_t nb = (a->accesses + BATCH - 1) / BATCH;
  for (uint64_t b = (uint64_t)a->index; b < nb; b += (uint64_t)a->workers) {
    uint64_t first = b * BATCH, last = first + BATCH < a->accesses ? first + BATCH : a->accesses;
    follow_batch(pool, first, last, &a->fc);
  }
  atomic_fetch_add(&source_loads, a->fc.loads);
  opt4_pool_close(pool);
  return NULL;
}

typedef struct prefetcher_arg {
  const char *name;
  uint64_t lookahead;
  long delay_ns; /* emulated latency per load */
  uint64_t loaded, stored;
} prefetcher_arg;

static void sleep_ns(long ns) {
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

static void *prefetcher_main(void *p) {
  prefetcher_arg *a = p;
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_attach(a->name, &pool));
  uint8_t buf[PAGE];
  int signalled = 0;
  for (;;) {
    opt4_prefetch_job job;
    int status;
    ASSERT_OK(opt4_pool_prefetch_claim(pool, a->lookahead, &job, &status));
    if (status == OPT4_PREFETCH_END) break;
    if (status == OPT4_PREFETCH_IDLE) {
      sleep_ns(50000);
      continue;
    }
    if (!signalled) { /* once a thread: the lock stays off the claim loop */
      mark_started();
      signalled = 1;
    }
    ASSERT(job.kind == OPT4_OP_ADMIT || job.kind == OPT4_OP_BYPASS);
    ASSERT(job.space >= item_len(job.item));
    if (a->delay_ns) sleep_ns(a->delay_ns);
    item_fill(job.item, buf);
    a->loaded++;
    opt4_iovec part = {buf, item_len(job.item)};
    int stored = 0;
    ASSERT_OK(opt4_pool_prefetch_store(pool, job.t, &part, 1, &stored));
    a->stored += (uint64_t)stored;
  }
  atomic_fetch_add(&source_loads, a->loaded);
  opt4_pool_close(pool);
  return NULL;
}

static void run(const opt4_plan *plan, uint32_t staging, int prefetchers, int consumers,
                uint64_t lookahead, long delay_ns) {
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool_opts o = {.page_size = (in.flags & OPT4_PLAN_SIZED) ? 0 : PAGE, .wait_timeout_ms = 20000, .staging_slots = staging};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  atomic_store(&source_loads, 0);
  pthread_t pt[8], ct[8];
  prefetcher_arg pa[8];
  consumer_arg ca[8];
  started = 0;
  for (int i = 0; i < prefetchers; i++) {
    pa[i] = (prefetcher_arg){opt4_pool_name(pool), lookahead, delay_ns, 0, 0};
    ASSERT(pthread_create(&pt[i], NULL, prefetcher_main, &pa[i]) == 0);
  }
  if (prefetchers > 0) { /* position 0 is a miss: some prefetcher claims it, within 20 s */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    pthread_mutex_lock(&started_lock);
    int rc = 0;
    while (!started && rc == 0) rc = pthread_cond_timedwait(&started_cond, &started_lock, &until);
    int ok = started;
    pthread_mutex_unlock(&started_lock);
    ASSERT(ok);
  }
  for (int i = 0; i < consumers; i++) {
    ca[i] = (consumer_arg){opt4_pool_name(pool), in.accesses, i, consumers, {0, 0, 0, 0}};
    ASSERT(pthread_create(&ct[i], NULL, consumer_main, &ca[i]) == 0);
  }
  uint64_t hits_seen = 0, wrong = 0;
  for (int i = 0; i < consumers; i++) {
    ASSERT(pthread_join(ct[i], NULL) == 0);
    hits_seen += ca[i].fc.hits + ca[i].fc.deferred;
    wrong += ca[i].fc.wrong;
  }
  for (int i = 0; i < prefetchers; i++) ASSERT(pthread_join(pt[i], NULL) == 0);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(wrong, 0);
  ASSERT_U64_EQ(st.timeouts, 0);
  ASSERT_U64_EQ(st.fallbacks, 0);
  ASSERT_U64_EQ(st.prefetch_dropped, 0);
  /* Every planned hit served, and every miss loaded exactly once. */
  ASSERT_U64_EQ(st.hits + st.deferred, in.hits);
  ASSERT_U64_EQ(hits_seen, in.hits + st.prefetched);
  ASSERT_U64_EQ(atomic_load(&source_loads), in.misses);
  ASSERT_U64_EQ(st.prefetched + st.admits + st.bypasses, in.misses);
  if (staging == 0) ASSERT_U64_EQ(st.bypasses, in.bypasses); /* never prefetched */
  if (prefetchers > 0) ASSERT(st.prefetched > 0);
  fprintf(stderr, "    %d prefetchers, %d consumers, staging %u, lookahead %llu: %llu of %llu misses "
          "prefetched, %llu stalls\n", prefetchers, consumers, staging,
          (unsigned long long)lookahead, (unsigned long long)st.prefetched,
          (unsigned long long)in.misses, (unsigned long long)st.stalls);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
}

static void test_prefetch_threads(void) {
  opt4_plan *plan = random_plan(20000, 600, 150, 77);
  run(plan, 0, 2, 2, 256, 0);      /* ADMITs only */
  run(plan, 32, 2, 2, 256, 0);     /* and BYPASSes through 32 staging slots */
  run(plan, 4, 4, 3, 64, 0);       /* a small ring, more threads than cores */
  run(plan, 16, 3, 2, 512, 20000); /* loads that take 20 us */
  run(plan, 16, 0, 2, 256, 0);     /* staging but no prefetcher: plain pool */
  opt4_plan_close(plan);
  opt4_plan *sized = random_sized_plan(15000, 400, 64 * 300, 64, 78);
  run(sized, 16, 2, 2, 256, 0); /* items over 1 to 4 pages */
  opt4_plan_close(sized);
  ASSERT_NO_ENGINE_MEMORY();
}

/* One thread, step by step: claims respect the window and go to the
 * prefetcher or the consumer exactly once; a claim is only stored by its
 * owner; a released claim goes back to the consumer. */
static void test_claims_step_by_step(void) {
  /* 0 1 2 0 1 3 0 ... at capacity 2 */
  uint32_t seq[] = {0, 1, 2, 0, 1, 3, 0, 1, 2, 3};
  opt4_seq s = {seq, OPT4_U32, 10, 4};
  opt4_plan_opts po;
  memset(&po, 0, sizeof po);
  po.capacity = 2;
  opt4_plan *plan = NULL;
  ASSERT_OK(opt4_plan_build(&s, &po, &plan));
  const uint32_t *ops = opt4_plan_ops(plan);
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 200, .staging_slots = 2};
  opt4_pool *pool = NULL, *other = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  ASSERT_OK(opt4_pool_attach(opt4_pool_name(pool), &other));
  opt4_prefetch_job job;
  int status;
  ASSERT_OK(opt4_pool_prefetch_claim(pool, 0, &job, &status));
  ASSERT_EQ(status, OPT4_PREFETCH_IDLE); /* an empty window */
  ASSERT_OK(opt4_pool_prefetch_claim(pool, 1, &job, &status));
  ASSERT_EQ(status, OPT4_PREFETCH_CLAIMED);
  ASSERT_U64_EQ(job.t, 0);
  ASSERT_EQ(job.kind, OPT4_OP_KIND(ops[0]));
  /* Another handle may not store or release what this one claimed. */
  uint8_t buf[PAGE];
  item_fill(0, buf);
  opt4_iovec part = {buf, item_len(0)};
  int stored = 0;
  ASSERT_EQ(opt4_pool_prefetch_store(other, 0, &part, 1, &stored), OPT4_EINVAL);
  ASSERT_EQ(opt4_pool_prefetch_release(other, 0), OPT4_EINVAL);
  ASSERT_OK(opt4_pool_prefetch_store(pool, 0, &part, 1, &stored));
  ASSERT_EQ(stored, 1);
  ASSERT_EQ(opt4_pool_prefetch_store(pool, 0, &part, 1, &stored), OPT4_EINVAL); /* not twice */
  /* The consumer at 0 gets it from the pool. */
  opt4_get_result r;
  ASSERT_OK(opt4_pool_get(other, 0, NULL, 0, buf, sizeof buf, &r));
  ASSERT_EQ(r.status, OPT4_GET_HIT);
  ASSERT_EQ(r.reason, OPT4_REASON_PREFETCHED);
  ASSERT(item_check(0, buf, r.len));
  /* Position 1: the consumer claims it first; the prefetcher skips it. */
  ASSERT_OK(opt4_pool_get(other, 1, NULL, 0, buf, sizeof buf, &r));
  ASSERT_EQ(r.status, OPT4_GET_LOAD);
  uint64_t next_miss = 2;
  ASSERT_OK(opt4_pool_prefetch_claim(pool, 100, &job, &status));
  ASSERT_EQ(status, OPT4_PREFETCH_CLAIMED);
  ASSERT_U64_EQ(job.t, next_miss);
  /* Released (a failed load): its consumer loads it itself. */
  ASSERT_OK(opt4_pool_prefetch_release(pool, job.t));
  ASSERT_OK(opt4_pool_get(other, 2, NULL, 0, buf, sizeof buf, &r));
  ASSERT_EQ(r.status, OPT4_GET_LOAD);
  ASSERT(r.reason == OPT4_REASON_ADMIT || r.reason == OPT4_REASON_BYPASS);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.prefetched, 1);
  ASSERT_U64_EQ(st.prefetch_dropped, 1);
  /* Past the last miss: END. */
  for (;;) {
    ASSERT_OK(opt4_pool_prefetch_claim(pool, 100, &job, &status));
    if (status != OPT4_PREFETCH_CLAIMED) break;
    ASSERT_OK(opt4_pool_prefetch_release(pool, job.t));
  }
  ASSERT_EQ(status, OPT4_PREFETCH_END);
  opt4_pool_close(other);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

typedef struct store_arg {
  opt4_pool *pool;
  uint64_t t;
  uint32_t item;
  int stored;
} store_arg;

static void *store_main(void *p) {
  store_arg *a = p;
  uint8_t buf[PAGE];
  item_fill(a->item, buf);
  opt4_iovec part = {buf, item_len(a->item)};
  ASSERT_OK(opt4_pool_prefetch_store(a->pool, a->t, &part, 1, &a->stored));
  return NULL;
}

/* A consumer that serves its batch in two passes (get every position, then
 * load and commit: the Python worker) must not wait for a prefetcher whose
 * store waits for the consumer's own commit. Here 0 0 1 1 at capacity 1 in
 * one batch: the consumer loads 0 itself (ADMIT, stored at commit), reads it
 * at 1 (DEFER), and a prefetcher holds 2 (ADMIT of 1), whose store must wait
 * for generation 0's reads before it takes its page. Before OPT4_GET_AGAIN,
 * get(2) waited for the prefetcher until the wait timed out (a fallback and
 * a timeout; 1 in 12 runs of test_fork_safety.py's thread test under load). */
static void test_two_pass_batch_does_not_wait_for_itself(void) {
  uint32_t seq[] = {0, 0, 1, 1};
  opt4_seq s = {seq, OPT4_U32, 4, 2};
  opt4_plan_opts po;
  memset(&po, 0, sizeof po);
  po.capacity = 1;
  opt4_plan *plan = NULL;
  ASSERT_OK(opt4_plan_build(&s, &po, &plan));
  const uint32_t *ops = opt4_plan_ops(plan);
  ASSERT_EQ(OPT4_OP_KIND(ops[0]), OPT4_OP_ADMIT);
  ASSERT_EQ(OPT4_OP_KIND(ops[1]), OPT4_OP_HIT);
  ASSERT_EQ(OPT4_OP_KIND(ops[2]), OPT4_OP_ADMIT);
  ASSERT_EQ(OPT4_OP_KIND(ops[3]), OPT4_OP_HIT);
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 20000}; /* a 20 s wait would show */
  opt4_pool *pool = NULL, *pf = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  ASSERT_OK(opt4_pool_attach(opt4_pool_name(pool), &pf));
  const uint64_t batch[] = {0, 1, 2, 3};
  uint8_t buf[PAGE];
  opt4_get_result r;
  /* First pass. */
  ASSERT_OK(opt4_pool_get(pool, 0, batch, 4, buf, sizeof buf, &r));
  ASSERT_EQ(r.status, OPT4_GET_LOAD);
  ASSERT_EQ(r.reason, OPT4_REASON_ADMIT);
  opt4_prefetch_job job;
  int status;
  ASSERT_OK(opt4_pool_prefetch_claim(pf, 100, &job, &status));
  ASSERT_EQ(status, OPT4_PREFETCH_CLAIMED);
  ASSERT_U64_EQ(job.t, 2);
  store_arg sa = {pf, 2, 1, -1};
  pthread_t th;
  ASSERT(pthread_create(&th, NULL, store_main, &sa) == 0); /* waits for generation 0's reads */
  ASSERT_OK(opt4_pool_get(pool, 1, batch, 4, buf, sizeof buf, &r));
  ASSERT_EQ(r.status, OPT4_GET_DEFER);
  ASSERT_U64_EQ(r.defer_to, 0);
  uint64_t t0 = opt4__now_ns();
  ASSERT_OK(opt4_pool_get(pool, 2, batch, 4, buf, sizeof buf, &r));
  ASSERT_EQ(r.status, OPT4_GET_AGAIN);
  ASSERT((opt4__now_ns() - t0) / 1000000u < 5000); /* at once, not after the timeout */
  /* Commit what came before 2, then serve from 2 on. */
  item_fill(0, buf);
  opt4_iovec part = {buf, item_len(0)};
  int stored = 0;
  ASSERT_OK(opt4_pool_put(pool, 0, &part, 1, &stored));
  ASSERT_EQ(stored, 1);
  ASSERT_OK(opt4_pool_note_read(pool, 1));
  ASSERT_OK(opt4_pool_get(pool, 2, batch + 2, 2, buf, sizeof buf, &r));
  ASSERT_EQ(r.status, OPT4_GET_HIT);
  ASSERT_EQ(r.reason, OPT4_REASON_PREFETCHED);
  ASSERT(item_check(1, buf, r.len));
  ASSERT_OK(opt4_pool_get(pool, 3, batch + 2, 2, buf, sizeof buf, &r));
  ASSERT_EQ(r.status, OPT4_GET_HIT);
  ASSERT(item_check(1, buf, r.len));
  ASSERT(pthread_join(th, NULL) == 0);
  ASSERT_EQ(sa.stored, 1);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.timeouts, 0);
  ASSERT_U64_EQ(st.fallbacks, 0);
  ASSERT_U64_EQ(st.prefetched, 1);
  opt4_pool_close(pf);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A prefetcher process that dies holding a claim: the consumer at that
 * position stops waiting well before the timeout and loads it itself. */
static void test_dead_prefetcher(void) {
  opt4_plan *plan = random_plan(2000, 100, 30, 5);
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 60000, .staging_slots = 8};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  int fds[2];
  ASSERT(pipe(fds) == 0);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    opt4_pool *mine = NULL;
    if (opt4_pool_attach(opt4_pool_name(pool), &mine) != 0) _exit(2);
    opt4_prefetch_job job;
    int status;
    if (opt4_pool_prefetch_claim(mine, 1000, &job, &status) != 0 || status != OPT4_PREFETCH_CLAIMED)
      _exit(3);
    if (write(fds[1], &job.t, sizeof job.t) != (ssize_t)sizeof job.t) _exit(4);
    pause(); /* holds the claim until killed */
    _exit(0);
  }
  uint64_t t = 0;
  ASSERT(read(fds[0], &t, sizeof t) == (ssize_t)sizeof t);
  ASSERT(kill(pid, SIGKILL) == 0);
  int ws;
  ASSERT(waitpid(pid, &ws, 0) == pid);
  uint8_t buf[PAGE];
  opt4_get_result r;
  uint64_t t0 = opt4__now_ns();
  ASSERT_OK(opt4_pool_get(pool, t, NULL, 0, buf, sizeof buf, &r));
  uint64_t waited_ms = (opt4__now_ns() - t0) / 1000000u;
  ASSERT_EQ(r.status, OPT4_GET_LOAD);
  ASSERT_EQ(r.reason, OPT4_REASON_FALLBACK);
  ASSERT(waited_ms < 5000); /* found dead, not timed out (60 s) */
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.timeouts, 0);
  ASSERT_U64_EQ(st.stalls, 1);
  close(fds[0]);
  close(fds[1]);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_claims_step_by_step);
  RUN(test_two_pass_batch_does_not_wait_for_itself);
  RUN(test_prefetch_threads);
  RUN(test_dead_prefetcher);
  return 0;
}
