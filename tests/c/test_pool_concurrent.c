/* test_pool_concurrent.c - the pool under real concurrency: threads (run
 * under ThreadSanitizer too), forked processes, and processes that die while
 * reading or writing. The label "concurrent" (from the file name) puts it in
 * the TSan run. */
#include "pool_util.h"

#include "layout.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { BATCH = 16 };

typedef struct worker_arg {
  const char *name;
  uint64_t accesses;
  int index, workers;
  follow_counts fc;
} worker_arg;

/* DataLoader-style: worker i takes batches i, i + W, i + 2W, ... in order. */
static void run_worker(opt4_pool *pool, worker_arg *a) {
  uint64_t nb = (a->accesses + BATCH - 1) / BATCH;
  for (uint64_t b = (uint64_t)a->index; b < nb; b += (uint64_t)a->workers) {
    uint64_t first = b * BATCH, last = first + BATCH < a->accesses ? first + BATCH : a->accesses;
    follow_batch(pool, first, last, &a->fc);
  }
}

static void *thread_main(void *p) {
  worker_arg *a = p;
  opt4_pool *pool = NULL; /* one handle per thread: hazards are per handle */
  ASSERT_OK(opt4_pool_attach(a->name, &pool));
  run_worker(pool, a);
  opt4_pool_close(pool);
  return NULL;
}

static opt4_pool *make_pool(const opt4_plan *plan, uint64_t timeout_ms) {
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = timeout_ms};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  return pool;
}

static void check_exact(opt4_pool *pool, const opt4_plan *plan, uint64_t hits_seen) {
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.fallbacks, 0);
  ASSERT_U64_EQ(st.timeouts, 0);
  ASSERT_U64_EQ(st.store_failed, 0);
  ASSERT_U64_EQ(st.hits + st.deferred, in.hits);
  ASSERT_U64_EQ(hits_seen, in.hits);
  ASSERT_U64_EQ(st.stored, in.admits);
}

static void test_threads(int workers) {
  opt4_plan *plan = random_plan(40000, 800, 120, 10 + (uint64_t)workers);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool *pool = make_pool(plan, 20000);
  pthread_t th[8];
  worker_arg args[8];
  for (int i = 0; i < workers; i++) {
    args[i] = (worker_arg){opt4_pool_name(pool), in.accesses, i, workers, {0, 0, 0, 0}};
    ASSERT(pthread_create(&th[i], NULL, thread_main, &args[i]) == 0);
  }
  uint64_t hits = 0;
  for (int i = 0; i < workers; i++) {
    ASSERT(pthread_join(th[i], NULL) == 0);
    ASSERT_U64_EQ(args[i].fc.wrong, 0);
    hits += args[i].fc.hits + args[i].fc.deferred;
  }
  check_exact(pool, plan, hits);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  fprintf(stderr, "    %d threads: %llu hits, %llu waits\n", workers,
          (unsigned long long)st.hits, (unsigned long long)st.waits);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_threads_all(void) {
  int counts[] = {1, 2, 4, 8};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) test_threads(counts[i]);
}

/* Items spanning 1 to 4 pages, 4 threads. */
static void test_threads_sized(void) {
  opt4_plan *plan = random_sized_plan(30000, 500, 64 * 400, 64, 40);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool_opts o = {.wait_timeout_ms = 20000};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  pthread_t th[4];
  worker_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (worker_arg){opt4_pool_name(pool), in.accesses, i, 4, {0, 0, 0, 0}};
    ASSERT(pthread_create(&th[i], NULL, thread_main, &args[i]) == 0);
  }
  uint64_t hits = 0;
  for (int i = 0; i < 4; i++) {
    ASSERT(pthread_join(th[i], NULL) == 0);
    ASSERT_U64_EQ(args[i].fc.wrong, 0);
    hits += args[i].fc.hits + args[i].fc.deferred;
  }
  check_exact(pool, plan, hits);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
}

/* Forked processes, half attaching by name, half using the inherited handle
 * (which re-registers after fork). */
static void test_processes(void) {
  enum { W = 4 };
  opt4_plan *plan = random_plan(30000, 600, 100, 20);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool *pool = make_pool(plan, 20000);
  int fds[2];
  ASSERT(pipe(fds) == 0);
  pid_t kids[W];
  for (int i = 0; i < W; i++) {
    kids[i] = fork();
    ASSERT(kids[i] >= 0);
    if (kids[i] == 0) {
      worker_arg a = {opt4_pool_name(pool), in.accesses, i, W, {0, 0, 0, 0}};
      opt4_pool *mine = pool;
      if (i % 2 == 0 && opt4_pool_attach(opt4_pool_name(pool), &mine) != 0) _exit(3);
      run_worker(mine, &a);
      uint64_t hits = a.fc.hits + a.fc.deferred;
      if (write(fds[1], &hits, sizeof hits) != (ssize_t)sizeof hits) _exit(4);
      if (mine != pool) opt4_pool_close(mine);
      opt4_pool_close(pool); /* the parent's handle: only unmaps here */
      _exit(a.fc.wrong == 0 ? 0 : 2);
    }
  }
  uint64_t hits = 0;
  for (int i = 0; i < W; i++) {
    int status;
    ASSERT(waitpid(kids[i], &status, 0) == kids[i]);
    ASSERT(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
    uint64_t h;
    ASSERT(read(fds[0], &h, sizeof h) == (ssize_t)sizeof h);
    hits += h;
  }
  close(fds[0]);
  close(fds[1]);
  check_exact(pool, plan, hits);
  opt4_pool_info info;
  ASSERT_OK(opt4_pool_info_get(pool, &info));
  ASSERT_EQ(info.attached, 1); /* the children's records were released */
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
}

static double seconds_since(const struct timespec *a) {
  struct timespec b;
  clock_gettime(CLOCK_MONOTONIC, &b);
  return (double)(b.tv_sec - a->tv_sec) + (double)(b.tv_nsec - a->tv_nsec) / 1e9;
}

/* A reader dies holding a hazard on a page; the writer that needs the page
 * clears the dead record instead of timing out. A writer dies mid-write; its
 * readers give up well before the timeout and the next writer proceeds. */
static void test_dead_processes(void) {
  opt4_plan *plan = random_plan(3000, 60, 10, 30);
  const uint32_t *ops = opt4_plan_ops(plan), *seq = opt4_plan_seq(plan);
  opt4_pool *pool = make_pool(plan, 8000);
  /* Run up to the first ADMIT that evicts (its slot was used before). */
  uint64_t t = 0;
  int used[10] = {0};
  for (;; t++) {
    uint32_t op = ops[t];
    if (OPT4_OP_KIND(op) == OPT4_OP_ADMIT && used[OPT4_OP_SLOT(op)]) break;
    if (OPT4_OP_KIND(op) == OPT4_OP_ADMIT) used[OPT4_OP_SLOT(op)] = 1;
    follow_counts fc = {0, 0, 0, 0};
    follow_batch(pool, t, t + 1, &fc);
  }
  uint32_t page = OPT4_OP_SLOT(ops[t]);
  pid_t kid = fork();
  if (kid == 0) {
    opt4_pool *p = NULL;
    if (opt4_pool_attach(opt4_pool_name(pool), &p) != 0) _exit(1);
    atomic_store(&p->procs[p->rec].hazard, (uint64_t)page + 1);
    _exit(0); /* dies "while reading" */
  }
  int status;
  ASSERT(waitpid(kid, &status, 0) == kid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  uint8_t buf[PAGE];
  item_fill(seq[t], buf);
  opt4_iovec part = {buf, item_len(seq[t])};
  int stored = 0;
  ASSERT_OK(opt4_pool_put(pool, t, &part, 1, &stored));
  ASSERT_EQ(stored, 1);
  ASSERT(seconds_since(&start) < 4.0);

  /* Now a writer that dies mid-write: claim the next ADMIT's page by hand. */
  uint64_t a = t + 1;
  while (OPT4_OP_KIND(ops[a]) != OPT4_OP_ADMIT) {
    follow_counts fc = {0, 0, 0, 0};
    follow_batch(pool, a, a + 1, &fc);
    a++;
  }
  uint64_t h = a + 1; /* a later HIT of what a stores, if any */
  while (h < 3000 && seq[h] != seq[a]) h++;
  kid = fork();
  if (kid == 0) {
    opt4_pool *p = NULL;
    if (opt4_pool_attach(opt4_pool_name(pool), &p) != 0) _exit(1);
    uint32_t g = p->rt[a] & 0x3FFFFFFFu;
    const list_ent *ent = &p->list[p->gens[g].list_off];
    atomic_store(&p->procs[p->rec].writing, (uint64_t)g + 1);
    atomic_store(&p->states[ent->page].word, PS_WORD(g, PS_WRITING));
    _exit(0); /* dies "while writing" */
  }
  ASSERT(waitpid(kid, &status, 0) == kid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (h < 3000 && OPT4_OP_KIND(ops[h]) == OPT4_OP_HIT) {
    clock_gettime(CLOCK_MONOTONIC, &start);
    opt4_get_result r;
    ASSERT_OK(opt4_pool_get(pool, h, NULL, 0, buf, sizeof buf, &r));
    ASSERT_EQ(r.status, OPT4_GET_LOAD);
    ASSERT_EQ(r.reason, OPT4_REASON_FALLBACK);
    ASSERT(seconds_since(&start) < 4.0); /* found dead, not timed out */
  }
  /* The rest of the plan runs without timeouts; everything served is right. */
  follow_counts fc = {0, 0, 0, 0};
  for (uint64_t u = a + 1; u < 3000; u++) follow_batch(pool, u, u + 1, &fc);
  ASSERT_U64_EQ(fc.wrong, 0);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.timeouts, 0);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
}

/* A handle serves one thread at a time (opt4.h, "Thread and process
 * safety"): its record holds one hazard. */
typedef struct inside_arg {
  opt4_pool *pool;
  opt4_get_result res;
  int rc;
  uint8_t buf[PAGE];
} inside_arg;

static void *get_inside(void *p) {
  inside_arg *a = p;
  a->rc = opt4_pool_get(a->pool, 1, NULL, 0, a->buf, sizeof a->buf, &a->res);
  return NULL;
}

/* While one thread waits inside opt4_pool_get on a handle, another thread's
 * get or put on that handle fails at once with OPT4_EINVAL, saying why,
 * and changes nothing. A forked child's copy of the handle is its own: the
 * child loads and stores through it, and the parent's waiting read is
 * served those bytes. */
static void test_one_thread_per_handle(void) {
  uint32_t seq[] = {0, 0}; /* capacity 1: position 0 admits item 0, position 1 hits it */
  opt4_seq s = {seq, OPT4_U32, 2, 1};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = 1;
  opt4_plan *plan = NULL;
  ASSERT_OK(opt4_plan_build(&s, &o, &plan));
  opt4_pool *pool = make_pool(plan, 60000); /* the wait outlasts the steps below */
  static inside_arg a;
  memset(&a, 0, sizeof a);
  a.pool = pool;
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, NULL, get_inside, &a), 0);
  /* The HIT at 1 waits for the ADMIT at 0, inside the handle. */
  while (atomic_load(&pool->entered) == 0) sched_yield();

  uint8_t buf[PAGE];
  item_fill(0, buf);
  opt4_iovec part = {buf, item_len(0)};
  opt4_get_result res;
  int stored = -1;
  ASSERT_ERR(opt4_pool_get(pool, 0, NULL, 0, buf, sizeof buf, &res), OPT4_EINVAL);
  ASSERT(strstr(opt4_errdetail(), "in use by another thread") != NULL);
  ASSERT_ERR(opt4_pool_put(pool, 0, &part, 1, &stored), OPT4_EINVAL);
  ASSERT(strstr(opt4_errdetail(), "opt4_pool_put: pool handle") != NULL);
  ASSERT_ERR(opt4_pool_warm(pool, 0, &part, 1, 0, &stored), OPT4_EINVAL);
  ASSERT(strstr(opt4_errdetail(), "opt4_pool_warm: pool handle") != NULL);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.admits + st.stored + st.hits, 0);

  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    int ok = opt4_pool_get(pool, 0, NULL, 0, buf, sizeof buf, &res) == 0 && res.status == OPT4_GET_LOAD &&
             opt4_pool_put(pool, 0, &part, 1, &stored) == 0 && stored == 1;
    if (!ok) fprintf(stderr, "child: %s\n", opt4_errdetail());
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(pthread_join(th, NULL), 0);
  ASSERT_OK(a.rc);
  ASSERT_EQ(a.res.status, OPT4_GET_HIT);
  ASSERT(item_check(0, a.buf, a.res.len));
  ASSERT_EQ(atomic_load(&pool->entered), 0); /* free again once the call returned */
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.hits, 1);
  ASSERT_U64_EQ(st.timeouts, 0);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
}

int main(void) {
  RUN(test_one_thread_per_handle);
  RUN(test_threads_all);
  RUN(test_threads_sized);
  RUN(test_processes);
  RUN(test_dead_processes);
  ASSERT_NO_ENGINE_MEMORY();
  return 0;
}
