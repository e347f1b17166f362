/* test_source.c - sources: the record file behind the source table, a
 * table's checks, a queued source of the caller's own (reads completed by
 * another thread, as an io_uring would) feeding the prefetcher, and
 * prefetch threads that sleep, not poll, while the consumers pause, and
 * threads parked early for a fork (a source that needs the forking
 * thread's lock, as Python callbacks need the GIL). */
#include "pool_util.h"

#include "internal.h"
#include "layout.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void tmp_path(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "./opt4-test-%d-%s", (int)getpid(), name);
}

/* The record file as a source reads what opt4_records_read reads, counts
 * into the same counters, and refuses a bad batch before any read. */
static void test_records_source(void) {
  char path[128];
  tmp_path(path, sizeof path, "src.rec");
  write_items(path, 50);
  opt4_records *r = NULL;
  ASSERT_OK(opt4_records_open(path, 0, &r));
  opt4_source *src = NULL;
  ASSERT_OK(opt4_source_records(r, &src));
  ASSERT(strcmp(opt4_source_name(src), "records") == 0);
  ASSERT_U64_EQ(opt4_source_count(src), 50);
  uint8_t buf[PAGE];
  for (uint32_t i = 0; i < 50; i++) {
    uint64_t len = 0;
    ASSERT_OK(opt4_source_size_of(src, i, &len));
    ASSERT_U64_EQ(len, item_len(i));
    ASSERT_OK(opt4_source_read_one(src, i, buf, sizeof buf, &len));
    ASSERT(item_check(i, buf, (size_t)len));
  }
  /* A batch: every read completes in submit (no reap needed). */
  opt4_source_read rd[3];
  uint8_t bufs[3][PAGE];
  memset(rd, 0, sizeof rd);
  for (int k = 0; k < 3; k++) {
    rd[k].item = (uint64_t)(7 * k + 1);
    rd[k].dst = bufs[k];
    rd[k].cap = PAGE;
  }
  rd[2].cap = 4; /* too small: that read alone fails */
  ASSERT_OK(opt4_source_submit(src, rd, 3));
  ASSERT_OK(opt4_source_reap(src, rd, 3, 0));
  ASSERT_EQ(rd[0].status, 0);
  ASSERT_EQ(rd[1].status, 0);
  ASSERT(item_check(1, bufs[0], (size_t)rd[0].len) && item_check(8, bufs[1], (size_t)rd[1].len));
  ASSERT_EQ(rd[2].status, OPT4_EITEMSIZE);
  ASSERT_U64_EQ(rd[2].len, item_len(15));
  opt4_records_info ri;
  ASSERT_OK(opt4_records_info_get(r, &ri));
  ASSERT_U64_EQ(ri.reads, 52);
  /* Out of range: the whole batch is refused, nothing read. */
  rd[1].item = 50;
  ASSERT_ERR(opt4_source_submit(src, rd, 3), OPT4_ERANGE);
  ASSERT(strstr(opt4_errdetail(), "item 50") != NULL);
  uint64_t len = 0;
  ASSERT_ERR(opt4_source_size_of(src, 50, &len), OPT4_ERANGE);
  ASSERT_OK(opt4_records_info_get(r, &ri));
  ASSERT_U64_EQ(ri.reads, 52);
  opt4_source_close(src);
  opt4_source_close(NULL);
  opt4_records_close(r);
  unlink(path);
  ASSERT_NO_ENGINE_MEMORY();
}

/* ---- a queued source: items in memory, reads completed by a "device"
 * thread, reap waits for them (the shape of io_uring behind the table) ---- */

#define QCAP 1024

typedef struct mem_queue {
  uint32_t items;
  pthread_mutex_t mu;
  pthread_cond_t submitted, completed;
  opt4_source_read *q[QCAP];
  uint32_t qhead, qlen;
  int stop;
  pthread_t device;
  uint64_t reads, closed;
  int fail_count; /* count() fails: create must close the state */
} mem_queue;

static void *device_main(void *p) {
  mem_queue *m = p;
  pthread_mutex_lock(&m->mu);
  for (;;) {
    while (m->qlen == 0 && !m->stop) pthread_cond_wait(&m->submitted, &m->mu);
    if (m->qlen == 0) break;
    opt4_source_read *rd = m->q[m->qhead];
    m->qhead = (m->qhead + 1) % QCAP;
    m->qlen--;
    uint32_t x = (uint32_t)rd->item;
    rd->len = item_len(x);
    if (rd->len > rd->cap) {
      rd->status = OPT4_EITEMSIZE;
    } else {
      item_fill(x, rd->dst);
      rd->status = 0;
    }
    m->reads++;
    pthread_cond_broadcast(&m->completed);
  }
  pthread_mutex_unlock(&m->mu);
  return NULL;
}

static int mq_count(void *state, uint64_t *items) {
  mem_queue *m = state;
  if (m->fail_count) return OPT4_EIO;
  *items = m->items;
  return 0;
}

static int mq_size_of(void *state, uint64_t item, uint64_t *len) {
  (void)state;
  *len = item_len((uint32_t)item);
  return 0;
}

static int mq_submit(void *state, opt4_source_read *reads, size_t n) {
  mem_queue *m = state;
  pthread_mutex_lock(&m->mu);
  if (m->qlen + n > QCAP) {
    pthread_mutex_unlock(&m->mu);
    return OPT4_EIO;
  }
  for (size_t i = 0; i < n; i++) m->q[(m->qhead + m->qlen++) % QCAP] = &reads[i];
  pthread_cond_signal(&m->submitted);
  pthread_mutex_unlock(&m->mu);
  return 0;
}

static int mq_reap(void *state, opt4_source_read *reads, size_t n, uint64_t timeout_ns) {
  mem_queue *m = state;
  (void)timeout_ns; /* the device always completes */
  pthread_mutex_lock(&m->mu);
  for (size_t i = 0; i < n; i++)
    while (reads[i].status == OPT4_SOURCE_PENDING) pthread_cond_wait(&m->completed, &m->mu);
  pthread_mutex_unlock(&m->mu);
  return 0;
}

static void mq_close(void *state) {
  mem_queue *m = state;
  pthread_mutex_lock(&m->mu);
  m->stop = 1;
  m->closed++;
  pthread_cond_signal(&m->submitted);
  pthread_mutex_unlock(&m->mu);
  pthread_join(m->device, NULL);
}

static const opt4_source_ops mq_ops = {
    .version = OPT4_SOURCE_OPS_VERSION,
    .name = "mem_queue",
    .count = mq_count,
    .size_of = mq_size_of,
    .submit = mq_submit,
    .reap = mq_reap,
    .close = mq_close,
};

static void mq_init(mem_queue *m, uint32_t items) {
  memset(m, 0, sizeof *m);
  m->items = items;
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->submitted, NULL);
  pthread_cond_init(&m->completed, NULL);
  ASSERT(pthread_create(&m->device, NULL, device_main, m) == 0);
}

static void mq_destroy(mem_queue *m) {
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->submitted);
  pthread_cond_destroy(&m->completed);
}

/* The table's checks, and who closes the state. */
static void test_create_checks(void) {
  opt4_source *src = NULL;
  ASSERT_ERR(opt4_source_create(NULL, NULL, &src), OPT4_EINVAL);
  opt4_source_ops bad = mq_ops;
  bad.version = 99;
  ASSERT_ERR(opt4_source_create(&bad, NULL, &src), OPT4_EINVAL);
  ASSERT(strstr(opt4_errdetail(), "version 99") != NULL);
  bad = mq_ops;
  bad.submit = NULL;
  bad.close = NULL;
  ASSERT_ERR(opt4_source_create(&bad, NULL, &src), OPT4_EINVAL);
  ASSERT(strstr(opt4_errdetail(), "submit") != NULL);
  ASSERT(src == NULL);
  /* count fails: the state is closed (ops.close set), nothing leaks. */
  mem_queue m;
  mq_init(&m, 10);
  m.fail_count = 1;
  ASSERT_ERR(opt4_source_create(&mq_ops, &m, &src), OPT4_EIO);
  ASSERT_U64_EQ(m.closed, 1);
  mq_destroy(&m);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Voluntary context switches of this process's threads other than the
 * calling one: each sleep that ends (a wake-up or a timeout) is one. */
static uint64_t other_threads_switches(void) {
  DIR *d = opendir("/proc/self/task");
  ASSERT(d != NULL);
  uint64_t sum = 0;
  long self = (long)syscall(SYS_gettid);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || atol(e->d_name) == self) continue;
    char p[320], line[256];
    snprintf(p, sizeof p, "/proc/self/task/%s/status", e->d_name);
    FILE *f = fopen(p, "r");
    if (f == NULL) continue; /* a thread that has just exited */
    while (fgets(line, sizeof line, f) != NULL) {
      unsigned long long v;
      if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1) sum += v;
    }
    fclose(f);
  }
  closedir(d);
  return sum;
}

/* A consumer serving position t: a HIT checked, a LOAD read from src
 * (stored when it is an ADMIT), counted into c. */
typedef struct served {
  uint64_t hits, prefetched, wrong, loads;
} served;

static void serve(opt4_pool *pool, opt4_source *src, uint64_t t, served *c) {
  uint8_t buf[PAGE];
  opt4_get_result r;
  ASSERT_OK(opt4_pool_get(pool, t, NULL, 0, buf, sizeof buf, &r));
  if (r.status == OPT4_GET_HIT) {
    c->hits++;
    c->prefetched += r.reason == OPT4_REASON_PREFETCHED;
    if (!item_check(r.item, buf, r.len)) c->wrong++;
    return;
  }
  ASSERT_EQ(r.status, OPT4_GET_LOAD);
  uint64_t len = 0;
  ASSERT_OK(opt4_source_read_one(src, r.item, buf, sizeof buf, &len));
  c->loads++;
  if (!item_check(r.item, buf, (size_t)len)) c->wrong++;
  if (r.reason == OPT4_REASON_ADMIT) {
    opt4_iovec part = {buf, (size_t)len};
    int stored;
    ASSERT_OK(opt4_pool_put(pool, t, &part, 1, &stored));
  }
}

/* Fork a child that exits at once, and reap it: the fork's handlers park
 * and let go every prefetch thread. */
static void fork_and_reap(void) {
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) _exit(0);
  int ws = 0;
  ASSERT(waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

/* After a run with one fork: every position served right, the hits the
 * plan's (a prefetched miss is served as a hit), each miss loaded once,
 * the fork found every thread parked in time. */
static void assert_served_exactly(opt4_pool *pool, const opt4_plan_info *in, const served *c,
                                  const opt4_prefetcher_stats *ps) {
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(c->wrong, 0);
  ASSERT_U64_EQ(st.fallbacks, 0);
  ASSERT_U64_EQ(c->hits, in->hits + c->prefetched);
  ASSERT_U64_EQ(c->prefetched + c->loads, in->misses);
  ASSERT_U64_EQ(ps->parks, 1);
  ASSERT_U64_EQ(ps->park_timeouts, 0);
}

/* A user's queued source behind the prefetcher: every miss is prefetched
 * through submit + reap, the bytes are right, the hits are the plan's. And
 * while the consumers pause, the prefetch threads sleep on the pool's
 * progress word: few wake-ups (bounded waits end by timeout, 20 to 50 ms),
 * where the polling threads before woke every 50 us to 1 ms. */
static void test_prefetch_from_queued_source(void) {
  const uint32_t N = 300, THREADS = 4;
  mem_queue m;
  mq_init(&m, N);
  opt4_source *src = NULL;
  ASSERT_OK(opt4_source_create(&mq_ops, &m, &src));
  opt4_plan *plan = random_plan(6000, N, 80, 17);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 20000, .staging_slots = 8};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  opt4_prefetcher_opts po = {THREADS, 0, 256, NULL, NULL, 0};
  opt4_prefetcher *pf = NULL;
  ASSERT_OK(opt4_prefetcher_start_source(opt4_pool_name(pool), src, &po, &pf));
  served c = {0, 0, 0, 0};
  uint64_t switches = 0;
  const uint64_t pause_at = in.accesses / 2;
  for (uint64_t t = 0; t < in.accesses; t++) {
    if (t == pause_at) {
      /* Let the threads fill the window and go idle, then count their
       * wake-ups over a pause of the consumers. */
      uint64_t pending = 1;
      for (int i = 0; i < 2000 && pending > 0; i++) {
        ASSERT_OK(opt4_pool_prefetch_pending(pool, t, t + 200, &pending));
        if (pending > 0) usleep(1000);
      }
      uint64_t before = other_threads_switches();
      usleep(400000);
      switches = other_threads_switches() - before;
    }
    serve(pool, src, t, &c);
  }
  opt4_prefetcher_stats ps;
  ASSERT_OK(opt4_prefetcher_stats_get(pf, &ps));
  opt4_prefetcher_stop(pf);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  fprintf(stderr, "    %llu of %llu misses prefetched, %llu loaded by the consumer, %llu stalls; "
          "%llu wake-ups of %u prefetch threads over a 400 ms pause\n",
          (unsigned long long)c.prefetched, (unsigned long long)in.misses, (unsigned long long)c.loads,
          (unsigned long long)st.stalls, (unsigned long long)switches, THREADS);
  ASSERT_U64_EQ(c.wrong, 0);
  ASSERT_U64_EQ(st.fallbacks, 0);
  ASSERT_U64_EQ(c.hits, in.hits + c.prefetched);
  ASSERT_U64_EQ(c.prefetched + c.loads, in.misses);
  ASSERT_U64_EQ(ps.errors, 0);
  ASSERT(ps.loaded >= c.prefetched);
  ASSERT(c.prefetched > 0);
  /* A 1 ms poll would be 400 a thread; a 20 ms bounded sleep is 20. */
  ASSERT(switches < 60u * THREADS);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  opt4_source_close(src);
  ASSERT_U64_EQ(m.closed, 1);
  mq_destroy(&m);
  ASSERT_NO_ENGINE_MEMORY();
}

/* opt4_prefetcher_start from a record file (the wrapper over
 * opt4_source_records) loads ahead of consumers that have not started (its
 * progress counter moves, then rests once the window is full), and
 * stop ends threads that sleep on the progress word (opt4_pool_interrupt
 * wakes them) without waiting out the pool's timeout. */
static void test_stop_wakes_sleepers(void) {
  char path[128];
  tmp_path(path, sizeof path, "stop.rec");
  write_items(path, 100);
  opt4_records *r = NULL;
  ASSERT_OK(opt4_records_open(path, 0, &r));
  opt4_plan *plan = random_plan(2000, 100, 30, 5);
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 20000, .staging_slots = 4};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  opt4_prefetcher_opts po = {4, 0, 64, NULL, NULL, 0};
  opt4_prefetcher *pf = NULL;
  ASSERT_OK(opt4_prefetcher_start(opt4_pool_name(pool), r, &po, &pf));
  /* Nothing consumes: the threads fill the window and sleep. */
  uint64_t pending = 1;
  for (int i = 0; i < 2000 && pending > 0; i++) {
    ASSERT_OK(opt4_pool_prefetch_pending(pool, 0, 32, &pending));
    if (pending > 0) usleep(1000);
  }
  ASSERT_U64_EQ(pending, 0);
  ASSERT(opt4_prefetcher_progress(pf) > 0); /* claims were settled */
  /* Once the window is full and nothing moves, a wait for progress sleeps
   * its time out (on the counter: woken by nothing). */
  int moved = 1;
  double waited = 0;
  for (int i = 0; i < 100 && moved; i++) {
    struct timespec a0, b0;
    clock_gettime(CLOCK_MONOTONIC, &a0);
    moved = opt4_prefetcher_wait(pf, opt4_prefetcher_progress(pf), 100000000u);
    clock_gettime(CLOCK_MONOTONIC, &b0);
    waited = (double)(b0.tv_sec - a0.tv_sec) * 1e3 + (double)(b0.tv_nsec - a0.tv_nsec) / 1e6;
  }
  ASSERT_EQ(moved, 0);
  ASSERT(waited >= 90.0);
  opt4_records_info ri;
  ASSERT_OK(opt4_records_info_get(r, &ri));
  ASSERT(ri.reads > 0);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  opt4_prefetcher_stop(pf);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
  fprintf(stderr, "    stop took %.1f ms\n", ms);
  /* The pool's timeout is 20 s: a stop that waited it out fails here. */
  ASSERT(ms < 2000.0);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  opt4_records_close(r);
  unlink(path);
  ASSERT_NO_ENGINE_MEMORY();
}

/* ---- early parking: a source whose reads need a lock the forking thread
 * holds (as a Python callback needs the GIL, which os.fork holds) ---- */

static pthread_mutex_t gil = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t gil_reads;

static int gil_count(void *state, uint64_t *items) {
  *items = *(const uint32_t *)state;
  return 0;
}

static int gil_submit(void *state, opt4_source_read *reads, size_t n) {
  (void)state;
  for (size_t i = 0; i < n; i++) {
    pthread_mutex_lock(&gil);
    uint32_t x = (uint32_t)reads[i].item;
    reads[i].len = item_len(x);
    if (reads[i].len > reads[i].cap) {
      reads[i].status = OPT4_EITEMSIZE;
    } else {
      item_fill(x, reads[i].dst);
      reads[i].status = 0;
    }
    atomic_fetch_add(&gil_reads, 1);
    pthread_mutex_unlock(&gil);
  }
  return 0;
}

static const opt4_source_ops gil_ops = {
    .version = OPT4_SOURCE_OPS_VERSION,
    .name = "needs the gil",
    .count = gil_count,
    .size_of = mq_size_of,
    .submit = gil_submit,
};

/* The threads are blocked in reads on the "GIL" the main thread holds. The
 * main thread lets it go and parks them (opt4_prefetchers_park: what the
 * binding does in Python's before-fork hook, with the GIL released), takes
 * it back and forks: the fork's prepare handler finds them parked (no
 * timeout, though none could finish a read now), and the parent lets them
 * go. Parked threads read nothing. Then every position is served exactly.
 * Last, a prefetcher parked early and stopped without a fork stops. */
static void test_early_park(void) {
  const uint32_t N = 200, THREADS = 3;
  uint32_t items = N;
  opt4_source *src = NULL;
  ASSERT_OK(opt4_source_create(&gil_ops, &items, &src));
  opt4_plan *plan = random_plan(3000, N, 60, 23);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 20000, .staging_slots = 8};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  ASSERT_U64_EQ(opt4_prefetchers_park(), 0); /* no prefetcher: nothing to wait for */
  opt4_prefetchers_resume();
  pthread_mutex_lock(&gil);
  opt4_prefetcher_opts po = {THREADS, 0, 128, NULL, NULL, 0};
  opt4_prefetcher *pf = NULL;
  ASSERT_OK(opt4_prefetcher_start_source(opt4_pool_name(pool), src, &po, &pf));
  usleep(20000); /* the threads claim and block on the gil */
  uint32_t before = opt4_prefetcher_progress(pf);
  pthread_mutex_unlock(&gil);
  /* A wait for progress returns once a read gets the gil and its item is settled. */
  ASSERT_EQ(opt4_prefetcher_wait(pf, before, 5000000000u), 1);
  ASSERT_U64_EQ(opt4_prefetchers_park(), 0);
  uint64_t parked_at = atomic_load(&gil_reads);
  usleep(100000);
  ASSERT_U64_EQ(atomic_load(&gil_reads), parked_at); /* parked: no reads */
  pthread_mutex_lock(&gil);
  fork_and_reap();
  pthread_mutex_unlock(&gil);
  opt4_prefetcher_stats ps;
  ASSERT_OK(opt4_prefetcher_stats_get(pf, &ps));
  ASSERT_U64_EQ(ps.parks, 1); /* the fork, not the early park */
  ASSERT_U64_EQ(ps.park_timeouts, 0);
  served c = {0, 0, 0, 0};
  for (uint64_t t = 0; t < in.accesses; t++) {
    serve(pool, src, t, &c);
  }
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  fprintf(stderr, "    %llu of %llu misses prefetched around an early park and a fork\n",
          (unsigned long long)c.prefetched, (unsigned long long)in.misses);
  ASSERT_U64_EQ(c.wrong, 0);
  ASSERT_U64_EQ(st.fallbacks, 0);
  ASSERT_U64_EQ(c.hits, in.hits + c.prefetched);
  ASSERT_U64_EQ(c.prefetched + c.loads, in.misses);
  ASSERT(c.prefetched > 0);
  /* Parked early, then stopped with no fork and no resume: stop lets them go. */
  ASSERT_U64_EQ(opt4_prefetchers_park(), 0);
  opt4_prefetcher_stop(pf);
  opt4_prefetchers_resume();
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  opt4_source_close(src);
  ASSERT_NO_ENGINE_MEMORY();
}

/* ---- depth: more threads reading while the consumers stall ---- */

static _Atomic uint64_t slow_reads;

/* A source whose every read takes 1 ms (a slow store): one read in flight
 * per thread. */
static int slow_submit(void *state, opt4_source_read *reads, size_t n) {
  (void)state;
  for (size_t i = 0; i < n; i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
    uint32_t x = (uint32_t)reads[i].item;
    reads[i].len = item_len(x);
    if (reads[i].len > reads[i].cap) {
      reads[i].status = OPT4_EITEMSIZE;
    } else {
      item_fill(x, reads[i].dst);
      reads[i].status = 0;
    }
    atomic_fetch_add(&slow_reads, 1);
  }
  return 0;
}

static const opt4_source_ops slow_ops = {
    .version = OPT4_SOURCE_OPS_VERSION,
    .name = "slow",
    .count = gil_count,
    .size_of = mq_size_of,
    .submit = slow_submit,
};

/* One thread reading 1 ms at a time cannot keep up with a consumer that
 * takes every position at once: the consumer stalls (loads misses itself),
 * so the prefetcher adds threads, up to max_threads. A fork in the middle
 * finds every thread, reading or dormant, parked. Every position is served
 * exactly. With max_threads 0 (the same as threads) the depth is fixed. */
/* A plan of T accesses over n items (capacity c, from seed) and a pool for
 * it with `slots` staging slots; *in gets the plan's figures (if not NULL). */
static opt4_pool *slow_pool(uint64_t T, uint64_t n, uint64_t c, uint64_t seed, uint64_t slots, opt4_plan **plan,
                            opt4_plan_info *in) {
  *plan = random_plan(T, n, c, seed);
  if (in != NULL) ASSERT_OK(opt4_plan_info_get(*plan, in));
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 20000, .staging_slots = slots};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(*plan, &o, &pool));
  return pool;
}

static void test_depth_grows(void) {
  const uint32_t N = 300;
  uint32_t items = N;
  opt4_source *src = NULL;
  ASSERT_OK(opt4_source_create(&slow_ops, &items, &src));
  for (int fixed = 0; fixed < 2; fixed++) {
    opt4_plan *plan = NULL;
    opt4_plan_info in;
    opt4_pool *pool = slow_pool(3000, N, 90, 31 + (uint64_t)fixed, 16, &plan, &in);
    opt4_prefetcher_opts po = {fixed ? 2 : 1, fixed ? 0 : 24, 256, NULL, NULL, 0};
    opt4_prefetcher *pf = NULL;
    ASSERT_OK(opt4_prefetcher_start_source(opt4_pool_name(pool), src, &po, &pf));
    served c = {0, 0, 0, 0};
    for (uint64_t t = 0; t < in.accesses; t++) {
      if (t == in.accesses / 2) fork_and_reap();
      serve(pool, src, t, &c);
    }
    opt4_prefetcher_stats ps;
    ASSERT_OK(opt4_prefetcher_stats_get(pf, &ps));
    opt4_prefetcher_stop(pf);
    fprintf(stderr, "    %s: %u threads started, %u reading at the end after %u raises; %llu of %llu misses "
            "prefetched\n", fixed ? "fixed" : "growing", ps.threads, ps.active, ps.grows,
            (unsigned long long)c.prefetched, (unsigned long long)in.misses);
    assert_served_exactly(pool, &in, &c, &ps);
    if (fixed) {
      ASSERT_EQ(ps.threads, 2);
      ASSERT_EQ(ps.active, 2);
      ASSERT_EQ(ps.grows, 0);
    } else {
      ASSERT_EQ(ps.threads, 24);
      ASSERT(ps.grows >= 1);
      ASSERT(ps.active > 1 && ps.active <= 24);
    }
    ASSERT_OK(opt4_pool_unlink(pool));
    opt4_pool_close(pool);
    opt4_plan_close(plan);
  }
  opt4_source_close(src);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A slow consumer over 1 ms reads needs few reads in flight (Little's law:
 * under 2,000 positions a second, about two thirds misses, twice over:
 * fewer than 12 even under TSan), so a depth started at 24 goes down to the
 * estimate. A fork while the threads above it hand over what they hold and
 * go dormant finds them all parked; every position is served exactly. */
static void test_depth_shrinks(void) {
  const uint32_t N = 300;
  uint32_t items = N;
  opt4_source *src = NULL;
  ASSERT_OK(opt4_source_create(&slow_ops, &items, &src));
  opt4_plan *plan = NULL;
  opt4_plan_info in;
  opt4_pool *pool = slow_pool(3000, N, 90, 41, 16, &plan, &in);
  opt4_prefetcher_opts po = {24, 32, 64, NULL, NULL, 0};
  opt4_prefetcher *pf = NULL;
  ASSERT_OK(opt4_prefetcher_start_source(opt4_pool_name(pool), src, &po, &pf));
  served c = {0, 0, 0, 0};
  int forked = 0;
  for (uint64_t t = 0; t < in.accesses; t++) {
    opt4_prefetcher_stats ps;
    ASSERT_OK(opt4_prefetcher_stats_get(pf, &ps));
    if (!forked && (ps.shrinks > 0 || t == in.accesses - 1)) {
      forked = 1;
      fork_and_reap();
    }
    serve(pool, src, t, &c);
    struct timespec pause = {0, 500000};
    nanosleep(&pause, NULL);
  }
  opt4_prefetcher_stats ps;
  ASSERT_OK(opt4_prefetcher_stats_get(pf, &ps));
  opt4_prefetcher_stop(pf);
  fprintf(stderr, "    %u reading at the end (estimate %u, a read %.2f ms) after %u raises and %u cuts; %llu of %llu "
          "misses prefetched\n", ps.active, ps.wanted, (double)ps.read_avg_ns / 1e6, ps.grows, ps.shrinks,
          (unsigned long long)c.prefetched, (unsigned long long)in.misses);
  assert_served_exactly(pool, &in, &c, &ps);
  ASSERT(ps.shrinks >= 1);
  ASSERT(ps.wanted >= 2 && ps.wanted <= 12);
  ASSERT(ps.read_avg_ns >= 1000000u);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  opt4_source_close(src);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Threads that never read (no consumer ever stalls): a fork parks them at
 * their gate, and stop wakes and joins them; none took a pool handle. */
static void test_dormant_threads(void) {
  const uint32_t N = 100;
  uint32_t items = N;
  opt4_source *src = NULL;
  ASSERT_OK(opt4_source_create(&slow_ops, &items, &src));
  opt4_plan *plan = NULL;
  opt4_pool *pool = slow_pool(1000, N, 30, 37, 8, &plan, NULL);
  opt4_pool_info before;
  ASSERT_OK(opt4_pool_info_get(pool, &before));
  opt4_prefetcher_opts po = {2, 50, 64, NULL, NULL, 0};
  opt4_prefetcher *pf = NULL;
  ASSERT_OK(opt4_prefetcher_start_source(opt4_pool_name(pool), src, &po, &pf));
  opt4_pool_info during;
  ASSERT_OK(opt4_pool_info_get(pool, &during));
  ASSERT_U64_EQ(during.attached, before.attached + 2); /* the two reading threads' handles only */
  for (int k = 0; k < 3; k++) {
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) _exit(0);
    int ws = 0;
    ASSERT(waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  }
  opt4_prefetcher_stats ps;
  ASSERT_OK(opt4_prefetcher_stats_get(pf, &ps));
  ASSERT_EQ(ps.threads, 50);
  ASSERT_EQ(ps.active, 2);
  ASSERT_U64_EQ(ps.parks, 3);
  ASSERT_U64_EQ(ps.park_timeouts, 0);
  opt4_prefetcher_stop(pf);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  opt4_source_close(src);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A sleeper on the consumers' head waits for its own block: moves of head
 * below it do not wake it (the idle prefetch threads used to wake, all of
 * them, at every move), the move that reaches it does, and a kick wakes
 * it wherever head is. And opt4__pool_prefetch_ready_at never says later
 * than the block before an item's own. */
typedef struct head_waiter {
  opt4_pool *pool;
  uint64_t target;
  _Atomic int done;
  _Atomic uint64_t head_at_return;
  int timed_out;
} head_waiter;

static void *wait_for_head(void *arg) {
  head_waiter *w = arg;
  w->timed_out = opt4__pool_head_wait_for(w->pool, w->target, (uint64_t)10 * 1000000000u, NULL);
  atomic_store(&w->head_at_return, opt4__pool_head(w->pool));
  atomic_store(&w->done, 1);
  return NULL;
}

static int wait_done(head_waiter *w, int ms) {
  for (int i = 0; i < ms && !atomic_load(&w->done); i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return atomic_load(&w->done);
}

static void test_head_wait_for_its_block(void) {
  const uint32_t N = 100;
  uint32_t items = N;
  opt4_source *src = NULL;
  ASSERT_OK(opt4_source_create(&slow_ops, &items, &src));
  opt4_plan *plan = NULL;
  opt4_plan_info in;
  opt4_pool *pool = slow_pool(2000, N, 50, 43, 8, &plan, &in), *other = NULL;
  ASSERT_OK(opt4_pool_attach(opt4_pool_name(pool), &other));
  for (uint64_t t = 0; t < in.accesses; t++) {
    const uint64_t r = opt4__pool_prefetch_ready_at(pool, t);
    ASSERT(r + HEAD_BLOCK - 1 <= t || (t < HEAD_BLOCK - 1 && r == 0));
  }
  served c = {0, 0, 0, 0};
  head_waiter w = {other, 10 * HEAD_BLOCK, 0, 0, 0};
  pthread_t th;
  ASSERT(pthread_create(&th, NULL, wait_for_head, &w) == 0);
  uint64_t t = 0;
  for (; t < 7 * HEAD_BLOCK; t++) serve(pool, src, t, &c); /* head moves through blocks 1 to 6 */
  ASSERT_U64_EQ(opt4__pool_head(pool), 6 * HEAD_BLOCK);
  ASSERT(!wait_done(&w, 50)); /* none of those moves woke it */
  for (; t <= 10 * HEAD_BLOCK; t++) serve(pool, src, t, &c);
  ASSERT(wait_done(&w, 5000));
  ASSERT(!w.timed_out);
  ASSERT(atomic_load(&w.head_at_return) >= 10 * HEAD_BLOCK);
  ASSERT(pthread_join(th, NULL) == 0);
  /* Far ahead, then a kick: it wakes at once, head short of its block. */
  head_waiter far = {other, 40 * HEAD_BLOCK, 0, 0, 0};
  ASSERT(pthread_create(&th, NULL, wait_for_head, &far) == 0);
  ASSERT(!wait_done(&far, 30));
  opt4__pool_head_kick(pool);
  ASSERT(wait_done(&far, 5000));
  ASSERT(!far.timed_out);
  ASSERT(atomic_load(&far.head_at_return) < 40 * HEAD_BLOCK);
  ASSERT(pthread_join(th, NULL) == 0);
  ASSERT_U64_EQ(c.wrong, 0);
  opt4_pool_close(other);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  opt4_source_close(src);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Units of several pieces (opt4_source_gather): each unit reads its
 * pieces in order into one destination, the inner reader counts each
 * piece, bad unit tables are refused (and close the inner source), and a
 * file cut short fails the unit that reaches past it. */
static void test_gather(void) {
  char path[128];
  tmp_path(path, sizeof path, "gather.bin");
  uint8_t data[1000];
  for (int i = 0; i < 1000; i++) data[i] = (uint8_t)(i * 7 + 3);
  FILE *f = fopen(path, "wb");
  ASSERT(f != NULL && fwrite(data, 1, sizeof data, f) == sizeof data);
  fclose(f);
  const char *paths[] = {path};
  /* Unit 0: bytes 900-919 then 10-29; unit 1: 500-999 (one piece); unit 2: 0-9, 990-999, 100-100. */
  const opt4_range pieces[] = {{0, 900, 20}, {0, 10, 20}, {0, 500, 500}, {0, 0, 10}, {0, 990, 10}, {0, 100, 1}};
  const uint64_t first[] = {0, 2, 3, 6};
  opt4_ranges *r = NULL;
  opt4_source *inner = NULL, *g = NULL;
  ASSERT_OK(opt4_ranges_open(paths, 1, pieces, 6, 0, &r));
  ASSERT_OK(opt4_source_ranges(r, &inner));
  ASSERT_OK(opt4_source_gather(inner, first, 3, &g));
  ASSERT_U64_EQ(opt4_source_count(g), 3);
  uint64_t len = 0;
  ASSERT_OK(opt4_source_size_of(g, 2, &len));
  ASSERT_U64_EQ(len, 21);
  uint8_t buf[600], want[600];
  ASSERT_ERR(opt4_source_read_one(g, 1, buf, 499, &len), OPT4_EITEMSIZE);
  ASSERT_U64_EQ(len, 500);
  ASSERT_OK(opt4_source_read_one(g, 0, buf, sizeof buf, &len));
  memcpy(want, data + 900, 20);
  memcpy(want + 20, data + 10, 20);
  ASSERT_U64_EQ(len, 40);
  ASSERT(memcmp(buf, want, 40) == 0);
  ASSERT_OK(opt4_source_read_one(g, 2, buf, sizeof buf, &len));
  memcpy(want, data, 10);
  memcpy(want + 10, data + 990, 10);
  want[20] = data[100];
  ASSERT(len == 21 && memcmp(buf, want, 21) == 0);
  opt4_ranges_info info;
  ASSERT_OK(opt4_ranges_info_get(r, &info));
  ASSERT_U64_EQ(info.reads, 5); /* each piece one read */
  ASSERT_U64_EQ(info.bytes_read, 61);
  ASSERT_OK(opt4_source_read_one(g, 1, buf, sizeof buf, &len));
  ASSERT(len == 500 && memcmp(buf, data + 500, 500) == 0);
  /* Cut short: unit 1 reaches past the end, unit 0 does not. */
  ASSERT(truncate(path, 950) == 0);
  ASSERT_ERR(opt4_source_read_one(g, 1, buf, sizeof buf, &len), OPT4_ETRUNCATED);
  ASSERT_OK(opt4_source_read_one(g, 0, buf, sizeof buf, &len));
  ASSERT_U64_EQ(len, 40);
  opt4_source_close(g);
  /* Bad tables: not from 0, not to the end, a unit without pieces. Each
   * closes the inner source it was given. */
  const uint64_t from1[] = {1, 6}, short_[] = {0, 5}, empty_unit[] = {0, 2, 2, 6};
  const uint64_t *bad[] = {from1, short_, empty_unit};
  const uint64_t n_bad[] = {1, 1, 3};
  for (int k = 0; k < 3; k++) {
    ASSERT_OK(opt4_source_ranges(r, &inner));
    ASSERT_ERR(opt4_source_gather(inner, bad[k], n_bad[k], &g), OPT4_EINVAL);
    ASSERT(g == NULL);
  }
  ASSERT_ERR(opt4_source_gather(NULL, first, 3, &g), OPT4_EINVAL);
  opt4_ranges_close(r);
  unlink(path);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_records_source);
  RUN(test_create_checks);
  RUN(test_gather);
  RUN(test_prefetch_from_queued_source);
  RUN(test_stop_wakes_sleepers);
  RUN(test_early_park);
  RUN(test_depth_grows);
  RUN(test_depth_shrinks);
  RUN(test_dormant_threads);
  RUN(test_head_wait_for_its_block);
  return 0;
}
