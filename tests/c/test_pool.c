/* test_pool.c - the shared-memory pool in one process: following a plan
 * gives exactly its hits with byte-exact items, and every error is clean. */
#include "pool_util.h"

#include "layout.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static opt4_pool *make_pool(const opt4_plan *plan, uint64_t timeout_ms) {
  opt4_pool_opts o;
  memset(&o, 0, sizeof o);
  o.page_size = PAGE;
  o.wait_timeout_ms = timeout_ms;
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  return pool;
}

static void finish(opt4_pool *pool) {
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
}

/* Serial, one position per batch: hits equal the plan's, bytes are right. */
static void test_follow_plan(void) {
  opt4_plan *plan = random_plan(20000, 500, 60, 1);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool *pool = make_pool(plan, 2000);
  follow_counts fc = {0, 0, 0, 0};
  for (uint64_t t = 0; t < in.accesses; t++) follow_batch(pool, t, t + 1, &fc);
  ASSERT_U64_EQ(fc.hits, in.hits);
  ASSERT_U64_EQ(fc.wrong, 0);
  ASSERT_U64_EQ(fc.loads, in.misses);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.hits, in.hits);
  ASSERT_U64_EQ(st.admits, in.admits);
  ASSERT_U64_EQ(st.bypasses, in.bypasses);
  ASSERT_U64_EQ(st.stored, in.admits);
  ASSERT_U64_EQ(st.fallbacks + st.timeouts + st.store_failed + st.waits, 0);
  finish(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Batches of 32: HITs on items admitted earlier in the batch are deferred. */
static void test_batches_defer(void) {
  opt4_plan *plan = random_plan(20000, 300, 50, 2);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool *pool = make_pool(plan, 2000);
  follow_counts fc = {0, 0, 0, 0};
  for (uint64_t t = 0; t < in.accesses; t += 32)
    follow_batch(pool, t, t + 32 < in.accesses ? t + 32 : in.accesses, &fc);
  ASSERT(fc.deferred > 0);
  ASSERT_U64_EQ(fc.hits + fc.deferred, in.hits);
  ASSERT_U64_EQ(fc.wrong, 0);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.fallbacks + st.timeouts + st.store_failed, 0);
  finish(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_attach_info_and_unlink(void) {
  opt4_plan *plan = random_plan(1000, 50, 10, 3);
  opt4_pool *pool = make_pool(plan, 1000);
  opt4_pool *other = NULL;
  ASSERT_OK(opt4_pool_attach(opt4_pool_name(pool), &other));
  ASSERT(opt4_pool_is_owner(pool) && !opt4_pool_is_owner(other));
  opt4_pool_info a, b;
  ASSERT_OK(opt4_pool_info_get(pool, &a));
  ASSERT_OK(opt4_pool_info_get(other, &b));
  ASSERT_U64_EQ(a.fingerprint, b.fingerprint);
  ASSERT_EQ(a.attached, 2);
  ASSERT_U64_EQ(a.page_size, PAGE);
  /* Work through the second handle shows in the first's stats. */
  follow_counts fc = {0, 0, 0, 0};
  follow_batch(other, 0, 1000, &fc);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.hits + st.deferred, fc.hits + fc.deferred);
  opt4_pool_close(other);
  ASSERT_OK(opt4_pool_info_get(pool, &a));
  ASSERT_EQ(a.attached, 1);
  ASSERT_OK(opt4_pool_stats_get(pool, &st)); /* retired counters survive */
  ASSERT_U64_EQ(st.hits + st.deferred, fc.hits + fc.deferred);
  char name[128];
  snprintf(name, sizeof name, "%s", opt4_pool_name(pool));
  finish(pool);
  ASSERT_ERR(opt4_pool_attach(name, &other), OPT4_ESHM);
  ASSERT(strstr(opt4_errdetail(), "owner has ended") != NULL);
  ASSERT_ERR(opt4_pool_attach("/not-ours", &other), OPT4_EINVAL);
  ASSERT_ERR(opt4_pool_attach("/opt4-0-x/y", &other), OPT4_EINVAL);
  opt4_pool_close(NULL);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_errors(void) {
  opt4_plan *plan = random_plan(500, 40, 8, 4);
  opt4_pool_opts o;
  memset(&o, 0, sizeof o);
  opt4_pool *pool = NULL;
  ASSERT_ERR(opt4_pool_create(plan, &o, &pool), OPT4_EINVAL); /* page_size 0 */
  ASSERT(pool == NULL);
  opt4_plan *only = NULL;
  opt4_seq s = {opt4_plan_seq(plan), OPT4_U32, 500, 40};
  ASSERT_OK(opt4_plan_from_seq(&s, &only));
  o.page_size = PAGE;
  ASSERT_ERR(opt4_pool_create(only, &o, &pool), OPT4_ENOPLAN);
  /* A pool larger than /dev/shm fails at creation with the fix named, and
   * leaves nothing behind. */
  o.page_size = (uint64_t)1 << 40;
  ASSERT_ERR(opt4_pool_create(plan, &o, &pool), OPT4_ENOSPACE);
  ASSERT(strstr(opt4_errdetail(), "--shm-size") != NULL);
  pool = make_pool(plan, 500);
  uint8_t buf[PAGE];
  opt4_get_result r;
  ASSERT_ERR(opt4_pool_get(pool, 500, NULL, 0, buf, sizeof buf, &r), OPT4_ERANGE);
  /* put at a non-ADMIT position, an item too large, TOO_SMALL buffers. */
  /* An ADMIT whose item's next occurrence is a HIT of what it stores. */
  const uint32_t *ops = opt4_plan_ops(plan), *seq = opt4_plan_seq(plan);
  uint64_t admit = 0, hit = 500;
  for (; admit < 500 && hit == 500; admit++) {
    if (OPT4_OP_KIND(ops[admit]) != OPT4_OP_ADMIT) continue;
    uint64_t next = admit + 1;
    while (next < 500 && seq[next] != seq[admit]) next++;
    if (next < 500 && OPT4_OP_KIND(ops[next]) == OPT4_OP_HIT) hit = next;
  }
  admit--;
  ASSERT(hit < 500);
  int stored;
  opt4_iovec big = {buf, PAGE + 1};
  uint8_t large[PAGE + 1];
  big.base = large;
  ASSERT_ERR(opt4_pool_put(pool, hit, &big, 1, &stored), OPT4_EINVAL);
  ASSERT_ERR(opt4_pool_put(pool, admit, &big, 1, &stored), OPT4_EITEMSIZE);
  ASSERT_EQ(stored, 0);
  /* Its reader falls back at once (the generation failed), not after a wait. */
  uint64_t t0 = (uint64_t)time(NULL);
  ASSERT_OK(opt4_pool_get(pool, hit, NULL, 0, buf, sizeof buf, &r));
  ASSERT_EQ(r.status, OPT4_GET_LOAD);
  ASSERT_EQ(r.reason, OPT4_REASON_FALLBACK);
  ASSERT((uint64_t)time(NULL) - t0 < 2);
  finish(pool);
  /* TOO_SMALL then success. */
  pool = make_pool(plan, 500);
  item_fill(opt4_plan_seq(plan)[admit], buf);
  opt4_iovec part = {buf, item_len(opt4_plan_seq(plan)[admit])};
  for (uint64_t t = 0; t < admit; t++) { /* run the prefix first */
    follow_counts fc = {0, 0, 0, 0};
    follow_batch(pool, t, t + 1, &fc);
  }
  ASSERT_OK(opt4_pool_put(pool, admit, &part, 1, &stored));
  ASSERT_EQ(stored, 1);
  uint8_t tiny[4];
  ASSERT_OK(opt4_pool_get(pool, hit, NULL, 0, tiny, sizeof tiny, &r));
  ASSERT_EQ(r.status, OPT4_GET_TOO_SMALL);
  ASSERT_U64_EQ(r.len, part.len);
  uint8_t back[PAGE];
  ASSERT_OK(opt4_pool_get(pool, hit, NULL, 0, back, sizeof back, &r));
  ASSERT_EQ(r.status, OPT4_GET_HIT);
  ASSERT(item_check(r.item, back, r.len));
  finish(pool);
  opt4_plan_close(only);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Skipped positions (a loop that broke out of an epoch) cost no waits once
 * the floor passes them. */
static void test_floor(void) {
  opt4_plan *plan = random_plan(4000, 100, 30, 5);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool *pool = make_pool(plan, 3000);
  follow_counts fc = {0, 0, 0, 0};
  uint64_t floor = 1;
  ASSERT_OK(opt4_pool_floor_get(pool, &floor));
  ASSERT_U64_EQ(floor, 0);
  for (uint64_t t = 0; t < 1000; t++) follow_batch(pool, t, t + 1, &fc);
  /* Skip [1000, 2000): as if the epoch was cut short. */
  ASSERT_OK(opt4_pool_set_floor(pool, 2000));
  ASSERT_OK(opt4_pool_set_floor(pool, 1500)); /* never lowered */
  ASSERT_OK(opt4_pool_floor_get(pool, &floor));
  ASSERT_U64_EQ(floor, 2000);
  ASSERT_ERR(opt4_pool_floor_get(NULL, &floor), OPT4_EINVAL);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (uint64_t t = 2000; t < in.accesses; t++) follow_batch(pool, t, t + 1, &fc);
  clock_gettime(CLOCK_MONOTONIC, &b);
  ASSERT(b.tv_sec - a.tv_sec < 2); /* no 3 s timeouts */
  ASSERT_U64_EQ(fc.wrong, 0);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.timeouts, 0);
  ASSERT(st.fallbacks > 0); /* hits on items the skipped part would have stored */
  finish(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

typedef struct seen_ctx {
  const char *want;
  int found, alive;
} seen_ctx;

static int visit(void *ctx, const char *name, uint32_t pid, int alive, uint64_t bytes) {
  seen_ctx *c = ctx;
  (void)pid;
  (void)bytes;
  if (strcmp(name, c->want) == 0) {
    c->found = 1;
    c->alive = alive;
  }
  return 0;
}

/* A pool whose owner died is listed as stale and can be removed; a live
 * owner's pool is protected. */
static void test_stale_cleanup(void) {
  opt4_plan *plan = random_plan(300, 20, 5, 6);
  opt4_pool *mine = make_pool(plan, 500);
  seen_ctx c = {opt4_pool_name(mine), 0, 0};
  ASSERT_OK(opt4_pool_list(visit, &c));
  ASSERT(c.found && c.alive);
  ASSERT_ERR(opt4_pool_remove(opt4_pool_name(mine), 0), OPT4_EPOOL);
  int fds[2];
  ASSERT(pipe(fds) == 0);
  pid_t child = fork();
  if (child == 0) {
    opt4_pool *p = NULL;
    if (opt4_pool_create(plan, &(opt4_pool_opts){.page_size = PAGE, .wait_timeout_ms = 500}, &p) != 0) _exit(1);
    char name[128];
    snprintf(name, sizeof name, "%s", opt4_pool_name(p));
    if (write(fds[1], name, sizeof name) != (ssize_t)sizeof name) _exit(1);
    _exit(0); /* dies without unlinking */
  }
  char name[128];
  ASSERT(read(fds[0], name, sizeof name) == (ssize_t)sizeof name);
  int status;
  ASSERT(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(fds[0]);
  close(fds[1]);
  seen_ctx d = {name, 0, 1};
  ASSERT_OK(opt4_pool_list(visit, &d));
  ASSERT(d.found && !d.alive);
  ASSERT_OK(opt4_pool_remove(name, 0));
  d.found = 0;
  ASSERT_OK(opt4_pool_list(visit, &d));
  ASSERT(!d.found);
  finish(mine);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Namespaces (OPT4TORCH_POOL_NAMESPACE): a pool is listed, so swept, only
 * in its own namespace, stale or not; a malformed namespace is refused. */
static void test_namespaces(void) {
  const char *outer = getenv("OPT4TORCH_POOL_NAMESPACE");
  char saved[32];
  snprintf(saved, sizeof saved, "%s", outer != NULL ? outer : "");
  opt4_plan *plan = random_plan(300, 20, 5, 6);
  setenv("OPT4TORCH_POOL_NAMESPACE", "nsa", 1);
  opt4_pool *a = make_pool(plan, 500);
  ASSERT(strstr(opt4_pool_name(a), "-nsa-") != NULL);
  seen_ctx c = {opt4_pool_name(a), 0, 0};
  ASSERT_OK(opt4_pool_list(visit, &c));
  ASSERT(c.found && c.alive);
  setenv("OPT4TORCH_POOL_NAMESPACE", "nsb", 1);
  c.found = 0;
  ASSERT_OK(opt4_pool_list(visit, &c));
  ASSERT(!c.found);
  unsetenv("OPT4TORCH_POOL_NAMESPACE");
  opt4_pool *none = make_pool(plan, 500);
  ASSERT_OK(opt4_pool_list(visit, &c));
  ASSERT(!c.found); /* the default namespace does not see nsa's */
  seen_ctx d = {opt4_pool_name(none), 0, 0};
  ASSERT_OK(opt4_pool_list(visit, &d));
  ASSERT(d.found && d.alive);
  finish(none);
  const char *bad[] = {"Upper", "1abc", "a-b", "abcdefghijklmnopq", "a/b"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("OPT4TORCH_POOL_NAMESPACE", bad[i], 1);
    opt4_pool *p = NULL;
    opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 500};
    ASSERT_ERR(opt4_pool_create(plan, &o, &p), OPT4_EINVAL);
    ASSERT(strstr(opt4_errdetail(), "OPT4TORCH_POOL_NAMESPACE") != NULL);
    ASSERT_ERR(opt4_pool_list(visit, &c), OPT4_EINVAL);
  }
  setenv("OPT4TORCH_POOL_NAMESPACE", "nsa", 1);
  finish(a);
  if (saved[0]) setenv("OPT4TORCH_POOL_NAMESPACE", saved, 1); else unsetenv("OPT4TORCH_POOL_NAMESPACE");
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A pool still being created (segment there, header not yet written) by a
 * live process is not stale, whoever sweeps; once its creator is dead, it is.
 * (Two ranks of a node start together: one's sweep met the other's pool in
 * creation and removed it.) */
static void test_pool_in_creation_is_not_stale(void) {
  char name[64];
  task_pool_name(name, sizeof name, (int)getpid(), "00000000feedf00d");
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT(fd >= 0);
  ASSERT(ftruncate(fd, 4096) == 0); /* sized, all zeros: no magic yet */
  close(fd);
  seen_ctx c = {name, 0, 0};
  ASSERT_OK(opt4_pool_list(visit, &c));
  ASSERT(c.found && c.alive);
  ASSERT_ERR(opt4_pool_remove(name, 0), OPT4_EPOOL);
  ASSERT(strstr(opt4_errdetail(), "being created") != NULL);
  ASSERT_OK(opt4_pool_remove(name, 1)); /* force */

  /* The same from a creator that has died: stale. */
  pid_t child = fork();
  if (child == 0) _exit(0);
  int status;
  ASSERT(waitpid(child, &status, 0) == child);
  task_pool_name(name, sizeof name, (int)child, "00000000feedf00d");
  fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT(fd >= 0);
  ASSERT(ftruncate(fd, 4096) == 0);
  close(fd);
  seen_ctx d = {name, 0, 1};
  ASSERT_OK(opt4_pool_list(visit, &d));
  ASSERT(d.found && !d.alive);
  ASSERT_OK(opt4_pool_remove(name, 0));
  ASSERT_NO_ENGINE_MEMORY();
}

/* Resuming at p in a fresh pool: warm it with the generations live at p,
 * then the rest of the plan runs with exactly the plan's hits after p. */
static void test_resume_warm(void) {
  opt4_plan *plan = random_plan(8000, 200, 40, 8);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  const uint32_t *ops = opt4_plan_ops(plan);
  uint64_t p = 5000, hits_after = 0;
  for (uint64_t t = p; t < in.accesses; t++) hits_after += OPT4_OP_KIND(ops[t]) == OPT4_OP_HIT;
  opt4_pool *pool = make_pool(plan, 3000);
  ASSERT_OK(opt4_pool_set_floor(pool, p));
  uint64_t admits[64];
  uint32_t items[64], before[64];
  size_t n = 0;
  ASSERT_OK(opt4_pool_live_at(pool, p, admits, items, before, 64, &n));
  ASSERT(n > 0 && n <= 40);
  for (size_t i = 0; i < n; i++) {
    ASSERT(admits[i] < p);
    ASSERT_EQ(items[i], opt4_plan_seq(plan)[admits[i]]);
    uint8_t buf[PAGE];
    item_fill(items[i], buf);
    opt4_iovec part = {buf, item_len(items[i])};
    int stored = 0;
    ASSERT_OK(opt4_pool_warm(pool, admits[i], &part, 1, before[i], &stored));
    ASSERT_EQ(stored, 1);
  }
  follow_counts fc = {0, 0, 0, 0};
  for (uint64_t t = p; t < in.accesses; t++) follow_batch(pool, t, t + 1, &fc);
  ASSERT_U64_EQ(fc.wrong, 0);
  ASSERT_U64_EQ(fc.hits, hits_after);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.fallbacks + st.timeouts + st.store_failed, 0);
  finish(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

/* The occurrence index maps the k-th request for an item to its k-th planned
 * position; skipping positions releases whoever would wait on them. */
static void test_occurrences_and_skip(void) {
  opt4_plan *plan = random_plan(6000, 150, 30, 9);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  const uint32_t *seq = opt4_plan_seq(plan), *ops = opt4_plan_ops(plan);
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 2000, .flags = OPT4_POOL_OCCURRENCES};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  uint64_t t;
  ASSERT_ERR(opt4_pool_occurrence_next(pool, 150, &t), OPT4_ERANGE);
  /* Skip every 7th position (an ADMIT or a HIT that runs as something else);
   * the others run: none waits for a skipped one. */
  follow_counts fc = {0, 0, 0, 0};
  uint64_t skipped_admits = 0;
  for (uint64_t u = 0; u < in.accesses; u++) {
    ASSERT_OK(opt4_pool_occurrence_next(pool, seq[u], &t));
    ASSERT_U64_EQ(t, u);
    if (u % 7 == 3) {
      skipped_admits += OPT4_OP_KIND(ops[u]) == OPT4_OP_ADMIT;
      ASSERT_OK(opt4_pool_skip(pool, u));
      continue;
    }
    follow_batch(pool, u, u + 1, &fc);
  }
  for (uint32_t item = 0; item < 150; item++) { /* the plan has no more */
    ASSERT_OK(opt4_pool_occurrence_next(pool, item, &t));
    ASSERT_U64_EQ(t, UINT64_MAX);
  }
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.timeouts, 0);
  ASSERT_U64_EQ(fc.wrong, 0);
  ASSERT(skipped_admits > 0 && st.fallbacks > 0);
  ASSERT_U64_EQ(st.store_failed, skipped_admits);
  finish(pool);
  /* Without the index. */
  pool = make_pool(plan, 500);
  ASSERT_ERR(opt4_pool_occurrence_next(pool, 0, &t), OPT4_EINVAL);
  finish(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A sized plan: items of 16 to 255 bytes in pages of 64 (1 to 4 pages each),
 * in batches: exact hits, right bytes. */
static void test_sized_pool(void) {
  opt4_plan *plan = random_sized_plan(20000, 300, 64 * 200, 64, 12);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  ASSERT(in.flags & OPT4_PLAN_SIZED);
  opt4_pool_opts o = {.wait_timeout_ms = 2000}; /* page size from the plan */
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  opt4_pool_info info;
  ASSERT_OK(opt4_pool_info_get(pool, &info));
  ASSERT_U64_EQ(info.page_size, 64);
  ASSERT_U64_EQ(info.pages, in.slots);
  follow_counts fc = {0, 0, 0, 0};
  for (uint64_t t = 0; t < in.accesses; t += 16)
    follow_batch(pool, t, t + 16 < in.accesses ? t + 16 : in.accesses, &fc);
  ASSERT_U64_EQ(fc.hits + fc.deferred, in.hits);
  ASSERT_U64_EQ(fc.wrong, 0);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.fallbacks + st.timeouts + st.store_failed, 0);
  ASSERT_U64_EQ(st.stored, in.admits);
  finish(pool);
  /* A page_size that contradicts the plan is refused. */
  o.page_size = 128;
  ASSERT_ERR(opt4_pool_create(plan, &o, &pool), OPT4_EINVAL);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Pages of a size that is not a multiple of 64 (a sized plan's page may be
 * any size), an odd number of them, and staging slots after them: the pool
 * is consistent, so another handle attaches, and it follows the plan. */
static void test_sized_pool_odd_page(void) {
  opt4_plan *plan = random_sized_plan(20000, 300, 100 * 201, 100, 5);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  ASSERT_U64_EQ(in.slots, 201);
  opt4_pool_opts o = {.wait_timeout_ms = 2000, .staging_slots = 3};
  opt4_pool *pool = NULL, *other = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  ASSERT_OK(opt4_pool_attach(opt4_pool_name(pool), &other));
  opt4_pool_info info;
  ASSERT_OK(opt4_pool_info_get(other, &info));
  ASSERT_U64_EQ(info.page_size, 100);
  follow_counts fc = {0, 0, 0, 0};
  for (uint64_t t = 0; t < in.accesses; t += 16)
    follow_batch(other, t, t + 16 < in.accesses ? t + 16 : in.accesses, &fc);
  ASSERT_U64_EQ(fc.hits + fc.deferred, in.hits);
  ASSERT_U64_EQ(fc.wrong, 0);
  opt4_pool_close(other);
  finish(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

/* The ADMITs of a pool whose pages were last read within `window`
 * positions before them (the handover distance, docs/prefetch.md), and the
 * smallest such distance; every previous generation's last read comes
 * before the ADMIT (the protocol's "waits point back"). */
static uint64_t close_handovers(const opt4_pool *pool, uint64_t window, uint64_t *min_gap) {
  uint64_t close = 0;
  *min_gap = UINT64_MAX;
  for (uint64_t g = 0; g < pool->mh->generations; g++) {
    const gen_rec *r = &pool->gens[g];
    uint64_t latest = 0;
    int any = 0;
    for (uint32_t i = 0; i < r->npages; i++) {
      uint32_t prev = pool->list[r->list_off + i].prev_gen;
      if (prev == NO_GEN) continue;
      ASSERT(pool->gens[prev].last_read < r->admit);
      if (!any || pool->gens[prev].last_read > latest) latest = pool->gens[prev].last_read;
      any = 1;
    }
    if (!any) continue;
    uint64_t gap = r->admit - latest;
    if (gap < *min_gap) *min_gap = gap;
    close += gap <= window;
  }
  return close;
}

/* Spare pages: the pool assigns pages itself, each ADMIT taking the pages
 * freed longest ago, so with spare pages no ADMIT takes pages read just
 * before it; the plan's hits and bytes are unchanged, and the pool is
 * larger by exactly the spare pages. */
static void test_spare_pages(void) {
  opt4_plan *plan = random_sized_plan(20000, 300, 64 * 200, 64, 21);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool_opts o = {.wait_timeout_ms = 2000};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  uint64_t gap0 = 0, close0 = close_handovers(pool, 32, &gap0);
  finish(pool);
  o.spare_pages = 150;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  opt4_pool_info info;
  ASSERT_OK(opt4_pool_info_get(pool, &info));
  ASSERT_U64_EQ(info.pages, in.slots + 150);
  uint64_t gap1 = 0, close1 = close_handovers(pool, 32, &gap1);
  if (!(close0 > 50 && close1 == 0 && gap1 > 32))
    FAIL_AT("ADMITs within 32 positions of their pages' last read: %llu without spare pages "
            "(closest %llu), %llu with 150 (closest %llu)", (unsigned long long)close0,
            (unsigned long long)gap0, (unsigned long long)close1, (unsigned long long)gap1);
  follow_counts fc = {0, 0, 0, 0};
  for (uint64_t t = 0; t < in.accesses; t += 16)
    follow_batch(pool, t, t + 16 < in.accesses ? t + 16 : in.accesses, &fc);
  ASSERT_U64_EQ(fc.hits + fc.deferred, in.hits);
  ASSERT_U64_EQ(fc.wrong, 0);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.fallbacks + st.timeouts + st.store_failed, 0);
  finish(pool);
  /* The same for an item plan: one page per item. */
  opt4_plan *items = random_plan(20000, 400, 100, 22);
  opt4_pool_opts oi = {.page_size = PAGE, .wait_timeout_ms = 2000, .spare_pages = 40};
  ASSERT_OK(opt4_pool_create(items, &oi, &pool));
  ASSERT_U64_EQ(close_handovers(pool, 16, &gap1), 0);
  fc = (follow_counts){0, 0, 0, 0};
  opt4_plan_info ii;
  ASSERT_OK(opt4_plan_info_get(items, &ii));
  for (uint64_t t = 0; t < ii.accesses; t += 16)
    follow_batch(pool, t, t + 16 < ii.accesses ? t + 16 : ii.accesses, &fc);
  ASSERT_U64_EQ(fc.hits + fc.deferred, ii.hits);
  ASSERT_U64_EQ(fc.wrong, 0);
  finish(pool);
  /* More than the plan's pages again (and over 1024) is refused. */
  oi.spare_pages = 5000;
  ASSERT_ERR(opt4_pool_create(items, &oi, &pool), OPT4_EINVAL);
  opt4_plan_close(items);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

/* The compatibility clock hands out each position once. */
static void test_clock(void) {
  opt4_plan *plan = random_plan(100, 10, 3, 7);
  opt4_pool *pool = make_pool(plan, 500);
  for (uint64_t want = 0; want < 50; want++) {
    uint64_t t;
    ASSERT_OK(opt4_pool_clock_next(pool, &t));
    ASSERT_U64_EQ(t, want);
  }
  finish(pool);
  opt4_plan_close(plan);
}

static int gen_is_failed(const opt4_pool *pool, uint32_t g) {
  return (int)((atomic_load(&pool->failed[g / 64]) >> (g % 64)) & 1);
}

/* A waiter that saw a page WRITING, then looks for its writer after the
 * writer has finished (published READY and cleared its record), must not
 * call the writer dead: the generation stays good, its HIT is served, and
 * its successors wait for its reads. Deterministic: the waiter's stale view
 * is handed to the recovery directly. Then a writer that really died
 * (the page still WRITING, no live record writing it) is recovered. */
static void test_finished_writer_is_not_dead(void) {
  /* Items 0 1 0 1 2 2 with room for one: position 0 admits item 0 (gen 0),
   * position 2 hits it. */
  uint32_t seq[] = {0, 1, 0, 1, 2, 2};
  opt4_seq s = {seq, OPT4_U32, 6, 3};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = 1;
  opt4_plan *plan = NULL;
  ASSERT_OK(opt4_plan_build(&s, &o, &plan));
  opt4_pool *pool = make_pool(plan, 2000);
  follow_counts fc = {0, 0, 0, 0};
  follow_batch(pool, 0, 1, &fc); /* ADMIT of item 0: gen 0 stored, READY */
  ASSERT_U64_EQ(fc.loads, 1);
  const uint32_t g = RT_GEN(pool->rt[0]);
  page_state *ps = &pool->states[pool->list[pool->gens[g].list_off].page];
  ASSERT_U64_EQ(atomic_load(&ps->word), PS_WORD(g, PS_READY));
  opt4__recover_dead_writer(pool, ps, PS_WORD(g, PS_WRITING)); /* the stale view */
  ASSERT_EQ(gen_is_failed(pool, g), 0);
  ASSERT_U64_EQ(atomic_load(&ps->word), PS_WORD(g, PS_READY));
  for (uint64_t t = 1; t < 6; t++) follow_batch(pool, t, t + 1, &fc);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  ASSERT_U64_EQ(fc.hits, in.hits);
  ASSERT_U64_EQ(fc.wrong, 0);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(st.fallbacks + st.timeouts + st.store_failed, 0);

  /* A writer that died mid-store: the page stays WRITING and no live record
   * names the generation. */
  const uint32_t g2 = RT_GEN(pool->rt[4]);
  page_state *ps2 = &pool->states[pool->list[pool->gens[g2].list_off].page];
  atomic_store(&ps2->word, PS_WORD(g2, PS_WRITING));
  opt4__recover_dead_writer(pool, ps2, PS_WORD(g2, PS_WRITING));
  ASSERT_EQ(gen_is_failed(pool, g2), 1);
  ASSERT_U64_EQ(atomic_load(&ps2->word), PS_WORD(g2, PS_FAILED));
  finish(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A view of a running pool, from its own handle and from outside
 * (opt4_pool_peek): the same counters, the consumers' position, the pages
 * that hold bytes; a peek takes no process record and writes nothing. */
static void test_view_and_peek(void) {
  opt4_plan *plan = random_plan(4000, 200, 50, 9);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool *pool = make_pool(plan, 2000);
  opt4_pool_view before;
  ASSERT_OK(opt4_pool_peek(opt4_pool_name(pool), &before));
  ASSERT_U64_EQ(before.head, 0);
  ASSERT_U64_EQ(before.pages_ready, 0);
  ASSERT_U64_EQ(before.stats.hits, 0);
  ASSERT_U64_EQ(before.info.accesses, in.accesses);
  follow_counts fc = {0, 0, 0, 0};
  const uint64_t half = in.accesses / 2;
  for (uint64_t t = 0; t < half; t += 32) follow_batch(pool, t, t + 32 < half ? t + 32 : half, &fc);
  opt4_pool_view mine, seen;
  ASSERT_OK(opt4_pool_view_get(pool, &mine));
  ASSERT_OK(opt4_pool_peek(opt4_pool_name(pool), &seen));
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(seen.stats.hits, st.hits);
  ASSERT_U64_EQ(seen.stats.admits, st.admits);
  ASSERT_U64_EQ(seen.stats.bypasses, st.bypasses);
  ASSERT_U64_EQ(seen.stats.stored, st.stored);
  ASSERT_U64_EQ(mine.stats.hits, st.hits);
  ASSERT_U64_EQ(seen.head, mine.head);
  ASSERT(seen.head > 0 && seen.head < half);
  ASSERT_U64_EQ(seen.head % 32, 0);
  ASSERT_U64_EQ(seen.pages_ready, mine.pages_ready);
  ASSERT(seen.pages_ready > 0 && seen.pages_ready <= in.capacity);
  ASSERT_U64_EQ(seen.pages_failed, 0);
  /* Peeking took no record: the pool counts one process attached, ours. */
  ASSERT_EQ(seen.info.attached, mine.info.attached);
  opt4_pool_view nothing;
  ASSERT_EQ(opt4_pool_peek("/opt4-0-nosuchpool", &nothing), OPT4_ESHM);
  ASSERT_EQ(opt4_pool_peek("/tmp/x", &nothing), OPT4_EINVAL);
  ASSERT_EQ(opt4_pool_peek(NULL, &nothing), OPT4_EINVAL);
  char name[128];
  snprintf(name, sizeof name, "%s", opt4_pool_name(pool));
  finish(pool);
  ASSERT_EQ(opt4_pool_peek(name, &nothing), OPT4_ESHM);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_follow_plan);
  RUN(test_batches_defer);
  RUN(test_attach_info_and_unlink);
  RUN(test_errors);
  RUN(test_floor);
  RUN(test_stale_cleanup);
  RUN(test_namespaces);
  RUN(test_pool_in_creation_is_not_stale);
  RUN(test_resume_warm);
  RUN(test_occurrences_and_skip);
  RUN(test_sized_pool);
  RUN(test_sized_pool_odd_page);
  RUN(test_clock);
  RUN(test_finished_writer_is_not_dead);
  RUN(test_view_and_peek);
  RUN(test_spare_pages);
  return 0;
}
