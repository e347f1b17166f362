/* test_pool_kill.c - the pool while random processes die by SIGKILL.
 *
 * Worker processes serve a plan batch by batch, as DataLoader workers do,
 * and check every HIT byte for byte against the source. A supervisor kills
 * a random worker every few milliseconds, whatever it is doing (inside
 * opt4_pool_get, inside opt4_pool_put, or between calls: each worker
 * announces its phase before each call, and the supervisor tallies the
 * phase it killed in), re-queues the batch the victim held (a batch may so
 * run twice, which the pool must survive too) and forks a replacement.
 *
 * It holds that no sample returned differs from the source, that nothing
 * hangs (no engine call lasts longer than the wait timeout plus slack, and
 * the run always progresses), and that a consistency check of the pool
 * passes afterwards: headers and metadata valid, no live record left but
 * the owner's, no hazard left, every page's word names a generation that
 * owns the page, and every READY page holds exactly its item's bytes.
 *
 * A last part kills the owner itself: the next start finds its pool stale
 * and removes it, and never touches the pool of a live owner.
 *
 *   test_pool_kill [reads]      (default 100000; OPT4_KILL_READS too)
 * prints the figures: reads checked, kills by phase, timeouts, fallbacks. */
#include "task.h"

#include "check.h"
#include "layout.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>

/* Kills allowed before some batch must finish (see the supervisor). */
#define KILLS_PER_BATCH 4
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { W = 4, BATCH = 32, PAGE_BYTES = 4096, TIMEOUT_MS = 1000, RETRY_CAP = 1 << 16 };
enum { PH_IDLE, PH_GET, PH_PUT, PH_OTHER, PH_COUNT };
static const char *phase_names[PH_COUNT] = {"between calls", "in opt4_pool_get",
                                            "in opt4_pool_put", "in note_read/attach"};

/* Item x: a length and bytes that depend only on x (the "source"). */
static size_t item_len(uint32_t x) { return 512 + (x * 7919u) % (PAGE_BYTES - 512); }
static uint8_t item_byte(uint32_t x, size_t i) { return (uint8_t)(x * 131u + i * 7u + (i >> 8)); }
static void item_fill(uint32_t x, uint8_t *buf) {
  for (size_t i = 0; i < item_len(x); i++) buf[i] = item_byte(x, i);
}
static int item_ok(uint32_t x, const uint8_t *buf, size_t len) {
  if (len != item_len(x)) return 0;
  for (size_t i = 0; i < len; i++)
    if (buf[i] != item_byte(x, i)) return 0;
  return 1;
}

typedef struct wslot {
  _Atomic uint64_t batch; /* batch + 1 held now, 0: none */
  _Atomic uint32_t phase;
  _Atomic uint64_t reads_checked, wrong, loads, stored, defers, max_call_ns;
} wslot;

/* Shared by the supervisor and the workers (an anonymous shared mapping). */
typedef struct ctl {
  _Atomic uint64_t next_batch;
  _Atomic uint64_t retry_head, retry_tail;
  _Atomic uint64_t distinct_done, completions, last_progress_ns;
  _Atomic int stop;
  uint64_t retry[RETRY_CAP];
  wslot w[W];
  _Atomic uint8_t done[]; /* one per batch */
} ctl;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void max_store(_Atomic uint64_t *m, uint64_t v) {
  uint64_t cur = atomic_load(m);
  while (v > cur && !atomic_compare_exchange_weak(m, &cur, v)) {
  }
}

/* The next batch to run, announced in the slot before it is taken from the
 * queue, so that a worker killed in between leaves it to be re-queued (run
 * twice at worst, never lost). */
static int claim(ctl *c, wslot *s, uint64_t nb, uint64_t *out) {
  for (;;) {
    uint64_t h = atomic_load(&c->retry_head);
    if (h < atomic_load(&c->retry_tail)) {
      uint64_t b = c->retry[h % RETRY_CAP];
      atomic_store(&s->batch, b + 1);
      if (atomic_compare_exchange_strong(&c->retry_head, &h, h + 1)) {
        *out = b;
        return 1;
      }
      continue;
    }
    uint64_t b = atomic_load(&c->next_batch);
    if (b >= nb) return 0;
    atomic_store(&s->batch, b + 1);
    if (atomic_compare_exchange_strong(&c->next_batch, &b, b + 1)) {
      *out = b;
      return 1;
    }
  }
}

/* Whether every batch has finished at least once. The counter is a hint (a
 * worker killed between marking a batch and counting it leaves it short);
 * the marks are the truth, scanned near the end. */
static int all_done(ctl *c, uint64_t nb) {
  if (atomic_load(&c->distinct_done) + 2 * W < nb) return 0;
  for (uint64_t b = 0; b < nb; b++)
    if (!atomic_load(&c->done[b])) return 0;
  return 1;
}

static void timed_call_end(wslot *s, uint64_t start) {
  max_store(&s->max_call_ns, now_ns() - start);
  atomic_store(&s->phase, PH_IDLE);
}

static void serve_batch(opt4_pool *pool, wslot *s, uint64_t first, uint64_t last) {
  uint64_t batch[BATCH];
  size_t n = (size_t)(last - first);
  for (size_t i = 0; i < n; i++) batch[i] = first + i;
  static uint8_t buf[PAGE_BYTES];
  for (uint64_t t = first; t < last; t++) {
    opt4_get_result r;
    atomic_store(&s->phase, PH_GET);
    uint64_t t0 = now_ns();
    int rc = opt4_pool_get(pool, t, batch, n, buf, sizeof buf, &r);
    timed_call_end(s, t0);
    if (rc != 0) _exit(10);
    if (r.status == OPT4_GET_HIT) {
      if (item_ok(r.item, buf, r.len))
        atomic_fetch_add(&s->reads_checked, 1);
      else
        atomic_fetch_add(&s->wrong, 1);
    } else if (r.status == OPT4_GET_DEFER) {
      atomic_store(&s->phase, PH_OTHER);
      t0 = now_ns();
      rc = opt4_pool_note_read(pool, t);
      timed_call_end(s, t0);
      if (rc != 0) _exit(11);
      atomic_fetch_add(&s->defers, 1);
    } else if (r.status == OPT4_GET_LOAD) {
      atomic_fetch_add(&s->loads, 1);
      if (r.reason == OPT4_REASON_ADMIT) {
        item_fill(r.item, buf);
        opt4_iovec part = {buf, item_len(r.item)};
        int stored = 0;
        atomic_store(&s->phase, PH_PUT);
        t0 = now_ns();
        rc = opt4_pool_put(pool, t, &part, 1, &stored);
        timed_call_end(s, t0);
        if (rc != 0) _exit(12);
        atomic_fetch_add(&s->stored, (uint64_t)stored);
      }
    } else {
      _exit(13);
    }
  }
}

static void worker(ctl *c, int i, opt4_pool *inherited, uint64_t T) {
  wslot *s = &c->w[i];
  opt4_pool *pool = inherited;
  atomic_store(&s->phase, PH_OTHER);
  /* Half attach by name; half use the handle inherited through fork. */
  if ((i & 1) == 0 && opt4_pool_attach(opt4_pool_name(inherited), &pool) != 0) _exit(20);
  atomic_store(&s->phase, PH_IDLE);
  uint64_t nb = (T + BATCH - 1) / BATCH, b;
  while (!atomic_load(&c->stop)) {
    if (!claim(c, s, nb, &b)) {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL); /* re-queued batches may still come */
      continue;
    }
    uint64_t first = b * BATCH, last = first + BATCH < T ? first + BATCH : T;
    serve_batch(pool, s, first, last);
    /* Done first, released second: killed in between, the batch runs twice
     * rather than never. */
    if (atomic_exchange(&c->done[b], 1) == 0) atomic_fetch_add(&c->distinct_done, 1);
    atomic_fetch_add(&c->completions, 1);
    atomic_store(&c->last_progress_ns, now_ns());
    atomic_store(&s->batch, 0);
  }
  if (pool != inherited) opt4_pool_close(pool);
  _exit(0);
}

static pid_t spawn(ctl *c, int i, opt4_pool *pool, uint64_t T) {
  pid_t parent = getpid();
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    /* A supervisor that fails takes its workers with it. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(0);
    worker(c, i, pool, T);
  }
  return pid;
}

/* ---- the consistency check ---- */

typedef struct check_counts {
  uint64_t ready, ready_bytes_ok, writing_left, failed, empty, records_stuck, reclaims_taken_over;
} check_counts;

static void check_pool(opt4_pool *pool, check_counts *cc) {
  ASSERT_OK(opt4__pool_check_header(pool->base, pool->size, pool->meta, pool->meta_size,
                                    (uint32_t)getuid(), pool->name));
  ASSERT_OK(opt4__pool_check_meta(pool->base, pool->size, pool->meta, pool->meta_size,
                                  pool->name));
  const pool_header *h = pool->h;
  /* Every worker is gone: reclaim their records, then only ours is live.
   * A record left "being reclaimed" by a reclaimer that was killed is taken
   * over like any other dead one. */
  for (uint32_t i = 0; i < h->max_procs; i++) {
    cc->reclaims_taken_over += atomic_load(&pool->procs[i].pid) == UINT32_MAX;
    opt4__pool_reclaim_if_dead(pool, i);
  }
  for (uint32_t i = 0; i < h->max_procs; i++) {
    uint32_t pid = atomic_load(&pool->procs[i].pid);
    if (pid == UINT32_MAX) cc->records_stuck++; /* killed while reclaiming, never taken over */
    else if (i == pool->rec) ASSERT_EQ(pid, getpid());
    else if (pid != 0) FAIL_AT("record %u still names pid %u", i, pid);
    if (i != pool->rec && pid == 0) {
      ASSERT_U64_EQ(atomic_load(&pool->procs[i].hazard), 0);
      ASSERT_U64_EQ(atomic_load(&pool->procs[i].writing), 0);
    }
  }
  static uint8_t buf[PAGE_BYTES];
  for (uint64_t p = 0; p < h->pages; p++) {
    uint64_t w = atomic_load(&pool->states[p].word);
    uint32_t g = PS_GEN(w), st = PS_STATE(w);
    if (g == NO_GEN) {
      ASSERT_EQ(st, PS_EMPTY);
      cc->empty++;
      continue;
    }
    ASSERT(g < h->generations);
    const gen_rec *gr = &pool->gens[g];
    int owns = 0;
    for (uint32_t k = 0; k < gr->npages; k++) owns |= pool->list[gr->list_off + k].page == p;
    if (!owns) FAIL_AT("page %llu names generation %u, which does not own it",
                       (unsigned long long)p, g);
    if (st == PS_WRITING) {
      cc->writing_left++; /* its writer was killed mid-write, nobody needed the page since */
    } else if (st == PS_FAILED) {
      cc->failed++;
    } else if (st == PS_READY) {
      cc->ready++;
      uint32_t x = pool->seq[gr->admit];
      uint64_t len = atomic_load(&pool->states[p].len);
      ASSERT(len <= h->page_size);
      memcpy(buf, pool->payload + p * h->page_size, (size_t)len);
      if (!item_ok(x, buf, (size_t)len))
        FAIL_AT("page %llu is READY for item %u but holds other bytes", (unsigned long long)p, x);
      cc->ready_bytes_ok++;
    } else {
      FAIL_AT("page %llu: EMPTY with generation %u", (unsigned long long)p, g);
    }
  }
}

/* What every record and worker is doing, when the run seems stuck. */
static void dump(opt4_pool *pool, ctl *c) {
  opt4_pool_stats st;
  opt4_pool_stats_get(pool, &st);
  fprintf(stderr, "    stats: hits %llu fallbacks %llu timeouts %llu store_failed %llu\n",
          (unsigned long long)st.hits, (unsigned long long)st.fallbacks,
          (unsigned long long)st.timeouts, (unsigned long long)st.store_failed);
  for (int i = 0; i < W; i++)
    fprintf(stderr, "    worker %d: batch %llu phase %u\n", i,
            (unsigned long long)atomic_load(&c->w[i].batch) - 1, atomic_load(&c->w[i].phase));
  for (uint32_t i = 0; i < pool->h->max_procs; i++) {
    proc_rec *r = &pool->procs[i];
    uint32_t pid = atomic_load(&r->pid);
    if (pid == 0 && atomic_load(&r->hazard) == 0 && atomic_load(&r->writing) == 0) continue;
    fprintf(stderr, "    record %u: pid %u alive %d hazard %llu writing %llu\n", i, pid,
            pid && pid != UINT32_MAX ? opt4__proc_alive((pid_t)pid, atomic_load(&r->start)) : -1,
            (unsigned long long)atomic_load(&r->hazard),
            (unsigned long long)atomic_load(&r->writing));
  }
  uint64_t writing = 0;
  for (uint64_t p = 0; p < pool->h->pages; p++)
    writing += PS_STATE(atomic_load(&pool->states[p].word)) == PS_WRITING;
  fprintf(stderr, "    pages WRITING: %llu\n", (unsigned long long)writing);
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  return v && *v ? strtoull(v, NULL, 10) : dflt;
}

static void test_kill_at_random_points(uint64_t want_reads) {
  /* A skewed trace where about half the accesses hit. */
  const uint64_t N = 4000, C = 1600;
  uint64_t T = want_reads * 2 + 20000;
  if (T > 200000000u) T = 200000000u;
  uint32_t *seq = malloc(T * sizeof *seq);
  uint64_t rng = env_u64("OPT4_KILL_SEED", 1);
  for (uint64_t t = 0; t < T; t++) {
    uint64_t r = test_rand(&rng);
    seq[t] = (uint32_t)((r & 3) ? r % N : (r >> 8) % (N / 8));
  }
  opt4_seq s = {seq, OPT4_U32, T, N};
  opt4_plan_opts po;
  memset(&po, 0, sizeof po);
  po.capacity = C;
  opt4_plan *plan = NULL;
  ASSERT_OK(opt4_plan_build(&s, &po, &plan));
  free(seq);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool_opts o = {.page_size = PAGE_BYTES, .wait_timeout_ms = TIMEOUT_MS};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));

  uint64_t nb = (T + BATCH - 1) / BATCH;
  size_t csize = sizeof(ctl) + nb;
  ctl *c = mmap(NULL, csize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT(c != MAP_FAILED);
  atomic_store(&c->last_progress_ns, now_ns());
  pid_t pids[W];
  for (int i = 0; i < W; i++) pids[i] = spawn(c, i, pool, T);

  uint64_t kills[PH_COUNT] = {0}, total_kills = 0, requeued = 0, max_stall_ns = 0;
  uint64_t start = now_ns(), completions_at_kill = UINT64_MAX, kills_since_progress = 0;
  while (!all_done(c, nb)) {
    struct timespec ts = {0, (long)(200000 + test_rand(&rng) % 2800000)}; /* 0.2 to 3 ms */
    nanosleep(&ts, NULL);
    uint64_t last = atomic_load(&c->last_progress_ns), now = now_ns();
    uint64_t stall = now > last ? now - last : 0; /* a worker may have written after now */
    if (stall > max_stall_ns) max_stall_ns = stall;
    /* Nothing hangs: with every wait bounded, some batch always finishes.
     * (A chain of waits across workers can take several timeouts; a minute
     * without any batch finishing is a hang.) */
    if (stall > (uint64_t)60 * 1000000000u) {
      dump(pool, c);
      FAIL_AT("no batch finished for %.1f s: hung", (double)stall / 1e9);
    }
    /* At most KILLS_PER_BATCH kills, then none until some batch finishes.
     * Killing by the clock alone starved the workers on a loaded machine: a
     * worker lived a few ms of wall time, too little CPU to finish a batch,
     * and no batch finished for a minute (a fresh-clone run beside two busy
     * processes) with no wait ever timing out. Tied to progress, the kill
     * rate follows the machine's speed, and a minute without a finished
     * batch, with no kills in it, is a hang of the pool's. */
    uint64_t done_now = atomic_load(&c->completions);
    if (done_now != completions_at_kill) {
      completions_at_kill = done_now;
      kills_since_progress = 0;
    }
    if (kills_since_progress >= KILLS_PER_BATCH) continue;
    kills_since_progress++;
    int i = (int)(test_rand(&rng) % W);
    wslot *sl = &c->w[i];
    uint32_t phase = atomic_load(&sl->phase);
    ASSERT(kill(pids[i], SIGKILL) == 0);
    int status;
    ASSERT(waitpid(pids[i], &status, 0) == pids[i]);
    if (WIFEXITED(status)) FAIL_AT("worker exited with %d before the kill", WEXITSTATUS(status));
    kills[phase < PH_COUNT ? phase : PH_OTHER]++;
    total_kills++;
    uint64_t b = atomic_exchange(&sl->batch, 0);
    if (b != 0) {
      uint64_t tail = atomic_load(&c->retry_tail);
      ASSERT(tail - atomic_load(&c->retry_head) < RETRY_CAP);
      c->retry[tail % RETRY_CAP] = b - 1;
      atomic_store(&c->retry_tail, tail + 1);
      requeued++;
    }
    atomic_store(&sl->phase, PH_IDLE);
    pids[i] = spawn(c, i, pool, T);
  }
  atomic_store(&c->stop, 1);
  for (int i = 0; i < W; i++) {
    int status;
    ASSERT(waitpid(pids[i], &status, 0) == pids[i]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      FAIL_AT("worker %d ended with status 0x%x", i, status);
  }
  double secs = (double)(now_ns() - start) / 1e9;

  uint64_t reads = 0, wrong = 0, loads = 0, stored = 0, defers = 0, max_call = 0;
  for (int i = 0; i < W; i++) {
    reads += c->w[i].reads_checked;
    wrong += c->w[i].wrong;
    loads += c->w[i].loads;
    stored += c->w[i].stored;
    defers += c->w[i].defers;
    if (c->w[i].max_call_ns > max_call) max_call = c->w[i].max_call_ns;
  }
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  check_counts cc = {0, 0, 0, 0, 0, 0, 0};
  check_pool(pool, &cc);

  fprintf(stderr,
          "    %llu positions in %llu batches (%llu runs of a batch), %.1f s, %d workers\n"
          "    reads checked byte for byte: %llu, wrong: %llu (plan hits %llu; defers %llu)\n"
          "    kills: %llu (%llu %s, %llu %s, %llu %s, %llu %s), batches re-queued %llu\n"
          "    loads %llu, stored %llu; pool: fallbacks %llu, timeouts %llu, store_failed %llu\n"
          "    longest engine call %.3f s (timeout %d ms), longest stretch without a finished "
          "batch %.3f s\n"
          "    check: %llu pages READY with the right bytes, %llu FAILED, %llu left WRITING by "
          "killed writers, %llu EMPTY; records left mid-reclaim by a killed reclaimer: %llu (taken "
          "over), still stuck: %llu\n",
          (unsigned long long)T, (unsigned long long)nb,
          (unsigned long long)atomic_load(&c->completions), secs, W, (unsigned long long)reads,
          (unsigned long long)wrong, (unsigned long long)in.hits, (unsigned long long)defers,
          (unsigned long long)total_kills, (unsigned long long)kills[PH_GET], phase_names[PH_GET],
          (unsigned long long)kills[PH_PUT], phase_names[PH_PUT],
          (unsigned long long)kills[PH_IDLE], phase_names[PH_IDLE],
          (unsigned long long)kills[PH_OTHER], phase_names[PH_OTHER],
          (unsigned long long)requeued, (unsigned long long)loads, (unsigned long long)stored,
          (unsigned long long)st.fallbacks, (unsigned long long)st.timeouts,
          (unsigned long long)st.store_failed, (double)max_call / 1e9, TIMEOUT_MS,
          (double)max_stall_ns / 1e9, (unsigned long long)cc.ready_bytes_ok,
          (unsigned long long)cc.failed, (unsigned long long)cc.writing_left,
          (unsigned long long)cc.empty, (unsigned long long)cc.reclaims_taken_over,
          (unsigned long long)cc.records_stuck);

  ASSERT_U64_EQ(wrong, 0);
  ASSERT_U64_EQ(cc.records_stuck, 0);
  ASSERT(reads >= want_reads);
  ASSERT(total_kills > 0);
  /* Every wait is bounded by the timeout; the slack is for a loaded host. */
  ASSERT(max_call < (uint64_t)(TIMEOUT_MS + 3000) * 1000000u);
  munmap(c, csize);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
}

typedef struct seen {
  const char *name;
  int found, alive;
} seen;

static int visit(void *ctx, const char *name, uint32_t pid, int alive, uint64_t bytes) {
  (void)pid, (void)bytes;
  seen *s = ctx;
  if (strcmp(name, s->name) == 0) s->found = 1, s->alive = alive;
  return 0;
}

/* The owner killed with SIGKILL while a worker is attached: the next start
 * finds its pool stale and removes it; a live owner's pool is never taken. */
static void test_owner_killed(void) {
  opt4_plan *plan = NULL;
  uint32_t seq[64];
  for (int i = 0; i < 64; i++) seq[i] = (uint32_t)(i * 7 % 13);
  opt4_seq s = {seq, OPT4_U32, 64, 13};
  opt4_plan_opts po;
  memset(&po, 0, sizeof po);
  po.capacity = 4;
  ASSERT_OK(opt4_plan_build(&s, &po, &plan));
  opt4_pool_opts o = {.page_size = PAGE_BYTES, .wait_timeout_ms = TIMEOUT_MS};
  opt4_pool *live = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &live));
  int fds[2];
  ASSERT(pipe(fds) == 0);
  pid_t owner = fork();
  ASSERT(owner >= 0);
  if (owner == 0) {
    opt4_pool *p = NULL;
    if (opt4_pool_create(plan, &o, &p) != 0) _exit(1);
    char name[POOL_NAME_MAX] = {0};
    snprintf(name, sizeof name, "%s", opt4_pool_name(p));
    if (write(fds[1], name, sizeof name) != (ssize_t)sizeof name) _exit(1);
    for (;;) pause(); /* until killed */
  }
  char name[POOL_NAME_MAX];
  ASSERT(read(fds[0], name, sizeof name) == (ssize_t)sizeof name);
  close(fds[0]);
  close(fds[1]);
  opt4_pool *att = NULL;
  ASSERT_OK(opt4_pool_attach(name, &att)); /* a worker of the doomed run */
  seen sn = {name, 0, 0};
  ASSERT_OK(opt4_pool_list(visit, &sn));
  ASSERT(sn.found && sn.alive);
  ASSERT_ERR(opt4_pool_remove(name, 0), OPT4_EPOOL);
  ASSERT(kill(owner, SIGKILL) == 0);
  int status;
  ASSERT(waitpid(owner, &status, 0) == owner && WIFSIGNALED(status));
  /* The next start's sweep: list, remove what is stale. */
  sn.found = 0;
  ASSERT_OK(opt4_pool_list(visit, &sn));
  ASSERT(sn.found && !sn.alive);
  ASSERT_OK(opt4_pool_remove(name, 0));
  seen lv = {opt4_pool_name(live), 0, 0};
  ASSERT_OK(opt4_pool_list(visit, &lv));
  ASSERT(lv.found && lv.alive);
  ASSERT_ERR(opt4_pool_remove(opt4_pool_name(live), 0), OPT4_EPOOL);
  /* The attached worker keeps its mapping until it closes. */
  opt4_pool_close(att);
  sn.found = 0;
  ASSERT_OK(opt4_pool_list(visit, &sn));
  ASSERT(!sn.found);
  ASSERT_OK(opt4_pool_unlink(live));
  opt4_pool_close(live);
  opt4_plan_close(plan);
}

static uint64_t reads_wanted = 100000;
static void test_kill(void) { test_kill_at_random_points(reads_wanted); }

int main(int argc, char **argv) {
  reads_wanted = env_u64("OPT4_KILL_READS", argc > 1 ? strtoull(argv[1], NULL, 10) : 100000);
  RUN(test_kill);
  RUN(test_owner_killed);
  ASSERT_NO_ENGINE_MEMORY();
  return 0;
}
