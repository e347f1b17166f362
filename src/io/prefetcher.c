/*
 * prefetcher.c - threads that load a plan's misses from a source (a record
 * file, or any opt4_source) ahead of the consumers, straight into the pool.
 *
 * Each thread has its own pool handle (hazards and claims are per handle)
 * and a few buffers as large as the largest item plus its frame. It claims
 * the next miss in the window, reads the item through the source's table
 * (submit, then reap), and hands it over; a failed read gives the claim
 * back so the consumer loads it. When it can do nothing (the window has
 * nothing to claim, or what it holds must wait for the consumers to come
 * near) it sleeps on the consumers' progress word in the pool, woken when
 * they reach the block it waits for (opt4__pool_head_wait_for: the next
 * one when it can claim more, else the one where its earliest held item
 * may find its place), so a thread that is ahead costs no CPU, and one
 * whose item must wait is not woken by every move of the consumers.
 *
 * Depth. The threads reading at once are the reads in flight: a blocking
 * source (pread, a Python call) has one read per thread. How many the
 * consumers need is what they take per second times the time a read takes
 * (Little's law), which the prefetcher learns only by running. It starts
 * opts.threads threads reading and keeps up to max_threads more asleep
 * (dormant: no pool handle, no buffers yet), each waiting on the gate word.
 * Every ADAPT_PERIOD_NS one reading thread (whichever first finds the
 * period over; a compare-and-swap on adapt_at) looks at the depth:
 *  - the estimate (pf_wanted, renewed every RATE_PERIOD_NS): the positions
 *    the consumers passed per second, times the share of misses in the
 *    MISS_SPAN positions ahead of them in the plan, times the average time
 *    of a source read (timed by the threads), twice over (batches come in
 *    bursts). The rate is taken over RATE_MIN_POSITIONS positions at
 *    least, or over RATE_LONGEST_NS; none when the consumers did not move
 *    (a head start, between epochs);
 *  - short (pf_short): since the last look the consumers loaded a miss
 *    themselves, or spent half the time waiting for reads in flight. A rate
 *    measured while the reads held the consumers back is what the threads
 *    supplied, not what the consumers would take, so a short look adds half
 *    again as many threads whatever the estimate says.
 * It grows to the larger of the two. It shrinks, to twice the estimate,
 * when that is half the depth or less, the consumers were not short, and
 * the depth has not grown for SHRINK_AFTER_NS: shrinking to the estimate
 * itself, a callback source at 2 ms a read (reads that wait for the GIL
 * too) flapped, grown again by every short look, and stalled 0.8-1.1 % of
 * its accesses where it stalled none before. The threads above the depth
 * hand over what they hold and wait at the gate, handle kept. Growing
 * attaches handles for the threads that never had one and opens the gate;
 * growing and shrinking hold the registry lock (taken with a trylock: a
 * fork or a stop under way skips one look), so that fork and stop see the
 * depth and the handles settled. Idle threads sleep on the
 * consumers' progress word and cost a wake-up whenever the consumers reach
 * the block they wait for: a depth that follows the estimate down saves
 * those wake-ups (test_depth_shrinks:
 * a slow consumer over 1 ms reads, from 24 threads to 4). A
 * dormant thread holds no lock, so its wait is a safe point for fork
 * (below); it leaves when it is activated, stopped, or the plan has no
 * more misses (ended).
 *
 * Fork. No process may fork while one of these threads can hold a lock (the
 * allocator's, stdio's, a sanitizer's): the child would inherit the lock
 * held by a thread it does not have, and deadlock on first use. DataLoader
 * forks its workers (every epoch, without persistent workers) while the
 * prefetcher runs, so fork is part of the protocol:
 *
 *  - prepare (pthread_atfork, in the forking thread): take the registry
 *    lock, open a new parking round in every running prefetcher (park =
 *    round) and wake its idle threads; wait until every thread has reported
 *    the round from a safe point, or is resting (done, waiting to be
 *    stopped). Safe points hold nothing: the top of the loop, the idle
 *    wait, and the sleeping part of the pool's bounded waits (the pool
 *    handle's safe_point hook). Between two safe points a thread does a
 *    bounded amount of work (one read, one copy), so the wait is short; it
 *    is bounded all the same (PARK_TIMEOUT_NS, then the fork goes ahead and
 *    the miss is counted in park_timeouts).
 *  - parent: park = 0, wake the parked threads; release the lock.
 *  - child: the child has no threads. Every prefetcher is marked orphaned,
 *    so stopping it frees its memory without interrupting or joining
 *    anything; release the lock.
 *
 * Early parking (opt4_prefetchers_park / _resume): the same round, opened
 * by a caller before the fork rather than inside it, for threads that need
 * what the forking thread holds to reach a safe point. A source that calls
 * into Python needs the GIL, which os.fork holds across fork(): Python's
 * before-fork hook parks the threads with the GIL released (the binding),
 * so the prepare handler finds them parked already; the parent handler (or
 * the hook after a fork that failed) lets them go. Nothing else changes:
 * the prepare handler still opens its own round, which parked threads
 * report at once.
 *
 * A thread reports a round by storing it in its own word while it is inside
 * the safe point, and leaves only once park is 0; a round number, not a
 * count, so a thread that has just been let go from one round and has not
 * yet left cannot be taken as parked for the next. Start and stop hold the
 * registry lock too, so no thread starts or exits across a fork.
 */
#include "internal.h"
#include "source.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

/* Loaded items the threads may hold while they wait for their place, in
 * all: 4 MiB, 1 to 32 items a thread (bench/RESULTS.md, memory). */
#define DEFAULT_PENDING_BYTES ((uint64_t)4 << 20)
#define PARK_TIMEOUT_NS ((uint64_t)10 * 1000000000u)
/* The longest an idle thread sleeps before it looks again without being
 * woken: a bound (what it waits for may change without the consumers moving:
 * a floor raised, a claim given back), not a poll interval. */
#define IDLE_WAIT_NS ((uint64_t)20 * 1000000u)
/* The same bound for a thread that waits only for the consumers to reach
 * the block where its held item may be handed over: what else could let it
 * go sooner (a floor raised, a stop, a fork, the depth lowered) wakes every
 * sleeper. */
#define HOLD_WAIT_NS ((uint64_t)200 * 1000000u)
/* How often the depth is looked at (see "Depth" above). */
#define ADAPT_PERIOD_NS ((uint64_t)10 * 1000000u)
/* How long the consumers' rate is measured over, the fewest positions they
 * must pass in that time for it to count, and how far ahead the misses are
 * counted (see "Depth"). */
#define RATE_PERIOD_NS ((uint64_t)50 * 1000000u)
#define RATE_MIN_POSITIONS 64u
#define RATE_LONGEST_NS ((uint64_t)1000 * 1000000u)
/* The depth goes down no sooner than this after it went up. */
#define SHRINK_AFTER_NS ((uint64_t)1000 * 1000000u)
#define MISS_SPAN 2048u

typedef struct pf_thread {
  opt4_prefetcher *pf;
  opt4_pool *pool;
  pthread_t tid;
  int started;
  _Atomic uint32_t parked; /* the last parking round seen from a safe point */
  _Atomic uint32_t resting; /* done: waits, at a safe point, to be stopped */
} pf_thread;

struct opt4_prefetcher {
  opt4_source *src;
  int own_src; /* made by opt4_prefetcher_start from a record file */
  opt4_prefetcher_opts opts;
  uint64_t buf_len;
  uint32_t pending; /* loaded items a thread may hold */
  /* Bytes of the pending budget no thread has taken yet: a thread's first
   * buffer is its own, the others come out of this (so threads added by
   * the depth hold one item each once the first ones have taken it all). */
  _Atomic uint64_t pending_left;
  pf_thread *threads;
  uint32_t n; /* threads started: opts.max_threads */
  int fixed;  /* opts.max_threads was 0: the depth stays at opts.threads */
  /* Depth: threads [0, active) read; the others wait on gate, which is
   * bumped (and woken) when active grows, at stop, at the end of the plan
   * and when a parking round opens. Handles of threads [0, active) are
   * attached before active covers them (release/acquire on active). */
  _Atomic uint32_t active, gate, ended, grows, shrinks;
  /* Threads [0, attached) have a pool handle (moves under reg_lock only);
   * at most limit can (lowered, under reg_lock, when an attach failed:
   * every process record in use; read without it by the adapting thread). */
  uint32_t attached;
  _Atomic uint32_t limit;
  /* What the depth's estimate learns: the source reads' time since the last
   * estimate (ns, count), its running average, the consumers' head and the
   * time at the last estimate, and the depth it asked for (0: none yet). */
  _Atomic uint64_t read_ns, reads_timed, read_avg_ns, rate_head, rate_ns, grown_at;
  _Atomic uint32_t wanted;
  _Atomic uint64_t adapt_at;      /* when the depth is looked at next */
  /* At the last look: the consumers' own loads, their waits (ns), when. */
  _Atomic uint64_t adapt_loads, adapt_wait_ns, adapt_last_ns;
  _Atomic uint32_t stop;
  _Atomic uint32_t park; /* the open parking round, 0 when none */
  uint32_t round;        /* the last round opened (under reg_lock) */
  int orphan;            /* a forked child's copy: its threads are not here */
  opt4_prefetcher *reg_next;
  _Atomic uint64_t loaded, bytes, stored, errors, idle_ns, idle_waits, parks, park_timeouts;
  _Atomic uint32_t finished;
  /* Bumped whenever a claim is settled (stored, given up, given back) or a
   * thread is done: what opt4_prefetcher_wait sleeps on. */
  _Atomic uint32_t progress, progress_waiters;
};

/* ---- fork: the registry of running prefetchers, and parking ---- */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static opt4_prefetcher *reg_head;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Wake the dormant threads to look again (seq_cst: what they check, set
 * before this by the caller, is seen after they wake). */
static void pf_open_gate(opt4_prefetcher *pf) {
  atomic_fetch_add(&pf->gate, 1);
  opt4__futex_wake(&pf->gate, 0);
}

/* A safe point: if a parking round is open, report it and sleep until the
 * parent lets the threads go. Returns the nanoseconds spent parked. */
static uint64_t pf_safe_point(void *arg) {
  pf_thread *th = arg;
  opt4_prefetcher *pf = th->pf;
  uint32_t r = atomic_load_explicit(&pf->park, memory_order_acquire);
  if (r == 0) return 0;
  uint64_t t0 = now_ns();
  while (r != 0) {
    atomic_store_explicit(&th->parked, r, memory_order_release);
    opt4__futex_wake(&th->parked, 0);
    opt4__futex_wait(&pf->park, r, 0, 0);
    r = atomic_load_explicit(&pf->park, memory_order_acquire);
  }
  return now_ns() - t0;
}

/* Whether thread th is at a safe point for round r (or resting, or never
 * started); waits for it up to the deadline. */
static int pf_wait_parked(pf_thread *th, uint32_t r, uint64_t deadline) {
  /* A thread of ours that forks (a Python dataset that forks, called from a
   * source that calls into Python) is the forking thread: it cannot wait
   * for itself, and holds what any forking thread holds. */
  if (th->started && pthread_equal(th->tid, pthread_self())) return 1;
  for (;;) {
    if (!th->started || atomic_load_explicit(&th->resting, memory_order_acquire)) return 1;
    uint32_t seen = atomic_load_explicit(&th->parked, memory_order_acquire);
    if (seen == r) return 1;
    uint64_t now = now_ns();
    if (now >= deadline) return 0;
    /* Woken by the thread's report; the slice bounds a missed wake-up by a
     * thread that went resting instead. */
    uint64_t left = deadline - now;
    opt4__futex_wait(&th->parked, seen, left < 10000000u ? left : 10000000u, 0);
  }
}

/* Under reg_lock: open a parking round in every running prefetcher and
 * wait (up to PARK_TIMEOUT_NS) until each thread is at a safe point.
 * Returns the threads that were not; a fork counts itself in parks and
 * park_timeouts (count), an early park (opt4_prefetchers_park) does not. */
static uint32_t park_locked(int count) {
  uint32_t missed = 0;
  for (opt4_prefetcher *pf = reg_head; pf != NULL; pf = pf->reg_next) {
    pf->round = pf->round == UINT32_MAX ? 1 : pf->round + 1;
    atomic_store(&pf->park, pf->round);
    opt4__futex_wake(&pf->park, 0);
    /* The dormant ones sleep on the gate: they see park after the bump. */
    pf_open_gate(pf);
    /* The idle ones sleep on their pool's progress word: they see park
     * after the kick (opt4__pool_head_wait checks it). Only threads below
     * attached have a handle; it does not move under reg_lock. */
    for (uint32_t i = 0; i < pf->attached; i++) opt4__pool_head_kick(pf->threads[i].pool);
  }
  uint64_t deadline = now_ns() + PARK_TIMEOUT_NS;
  for (opt4_prefetcher *pf = reg_head; pf != NULL; pf = pf->reg_next) {
    for (uint32_t i = 0; i < pf->n; i++)
      if (!pf_wait_parked(&pf->threads[i], pf->round, deadline)) {
        missed++;
        if (count) atomic_fetch_add_explicit(&pf->park_timeouts, 1, memory_order_relaxed);
      }
    if (count) atomic_fetch_add_explicit(&pf->parks, 1, memory_order_relaxed);
  }
  return missed;
}

/* Under reg_lock: let every parked thread go. */
static void resume_locked(void) {
  for (opt4_prefetcher *pf = reg_head; pf != NULL; pf = pf->reg_next) {
    atomic_store_explicit(&pf->park, 0, memory_order_release);
    opt4__futex_wake(&pf->park, 0);
  }
}

static void fork_prepare(void) {
  pthread_mutex_lock(&reg_lock);
  park_locked(1);
}

static void fork_parent(void) {
  resume_locked();
  pthread_mutex_unlock(&reg_lock);
}

uint32_t opt4_prefetcher_progress(opt4_prefetcher *pf) { return atomic_load(&pf->progress); }

int opt4_prefetcher_wait(opt4_prefetcher *pf, uint32_t seen, uint64_t timeout_ns) {
  if (atomic_load(&pf->progress) != seen) return 1;
  atomic_fetch_add(&pf->progress_waiters, 1);
  uint64_t deadline = now_ns() + timeout_ns;
  int moved;
  for (;;) {
    moved = atomic_load(&pf->progress) != seen;
    uint64_t now = now_ns();
    if (moved || now >= deadline) break;
    opt4__futex_wait(&pf->progress, seen, deadline - now, 0);
  }
  atomic_fetch_sub(&pf->progress_waiters, 1);
  return moved;
}

uint32_t opt4_prefetchers_park(void) {
  pthread_mutex_lock(&reg_lock);
  uint32_t missed = park_locked(0);
  pthread_mutex_unlock(&reg_lock);
  return missed;
}

void opt4_prefetchers_resume(void) {
  pthread_mutex_lock(&reg_lock);
  resume_locked();
  pthread_mutex_unlock(&reg_lock);
}

static void fork_child(void) {
  for (opt4_prefetcher *pf = reg_head; pf != NULL; pf = pf->reg_next) {
    pf->orphan = 1;
    atomic_store_explicit(&pf->park, 0, memory_order_relaxed);
  }
  pthread_mutex_unlock(&reg_lock);
}

static void reg_install(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

/* Under reg_lock. */
static void reg_remove(opt4_prefetcher *pf) {
  for (opt4_prefetcher **p = &reg_head; *p != NULL; p = &(*p)->reg_next)
    if (*p == pf) {
      *p = pf->reg_next;
      return;
    }
}

/* One loaded item a thread holds until the pool can take it. */
typedef struct pf_item {
  uint64_t t;
  size_t len; /* head + record */
  size_t tail_len;
  uint8_t tail[OPT4_FRAME_CAP];
  uint8_t *buf;
} pf_item;

/* A claim settled or a thread done: wake whoever waits for progress
 * (seq_cst with the waiter's count and check: no wake-up is lost). */
static void pf_progress(opt4_prefetcher *pf) {
  atomic_fetch_add(&pf->progress, 1);
  if (atomic_load(&pf->progress_waiters) != 0) opt4__futex_wake(&pf->progress, 0);
}

/* Hand item it over if the pool can take it; 1 if it is settled (stored or
 * given up), 0 if it must wait longer. */
static int pf_try(pf_thread *th, pf_item *it) {
  opt4_iovec parts[2] = {{it->buf, it->len}, {it->tail, it->tail_len}};
  int result = 0;
  int rc = opt4_pool_prefetch_try_store(th->pool, it->t, parts, 2, &result);
  if (rc == 0 && result == OPT4_STORE_NOT_YET) return 0;
  if (rc == 0 && result == OPT4_STORE_DONE) atomic_fetch_add_explicit(&th->pf->stored, 1, memory_order_relaxed);
  pf_progress(th->pf);
  return 1;
}

/* What pf_load did. */
typedef enum pf_load_result {
  PF_END,     /* nothing more to claim: the plan has no more misses, or the
                 claim failed (the handle could not get a process record);
                 either way the thread stops and consumers load the rest */
  PF_IDLE,    /* nothing to claim in the window now */
  PF_SETTLED, /* claimed, but the read failed: given back to its consumer
                 (counted as an error); it->buf is free again */
  PF_LOADED   /* claimed and read: it holds the item, to hand over */
} pf_load_result;

/* Claim the next miss and load it into it->buf. */
static pf_load_result pf_load(pf_thread *th, pf_item *it) {
  opt4_prefetcher *pf = th->pf;
  opt4_prefetch_job job;
  int status;
  if (opt4_pool_prefetch_claim(th->pool, pf->opts.lookahead, &job, &status) != 0 ||
      status == OPT4_PREFETCH_END)
    return PF_END;
  if (status == OPT4_PREFETCH_IDLE) return PF_IDLE;
  uint64_t rec_len = 0;
  size_t head = 0;
  it->t = job.t;
  it->tail_len = 0;
  int bad = opt4_source_size_of(pf->src, job.item, &rec_len) != 0;
  if (!bad && pf->opts.frame != NULL)
    bad = pf->opts.frame(pf->opts.frame_ctx, job.item, rec_len, it->buf, &head, it->tail, &it->tail_len) != 0 ||
          head > OPT4_FRAME_CAP || it->tail_len > OPT4_FRAME_CAP;
  /* One read a batch: the claim protocol hands out one miss at a time. The
   * reap has no time limit (the source bounds its own I/O), so it returns
   * with the read complete: the buffer is the thread's again. */
  opt4_source_read rd;
  memset(&rd, 0, sizeof rd);
  rd.item = job.item;
  rd.dst = it->buf + head;
  rd.cap = (size_t)(pf->buf_len - OPT4_FRAME_CAP);
  const uint64_t r0 = now_ns();
  if (!bad) bad = opt4_source_submit(pf->src, &rd, 1) != 0;
  if (!bad && opt4_source_reap(pf->src, &rd, 1, 0) != 0) bad = 1;
  const uint64_t len = rd.len;
  if (!bad && rd.status == 0) {
    atomic_fetch_add_explicit(&pf->read_ns, now_ns() - r0, memory_order_relaxed);
    atomic_fetch_add_explicit(&pf->reads_timed, 1, memory_order_relaxed);
  }
  if (bad || rd.status != 0) {
    atomic_fetch_add_explicit(&pf->errors, 1, memory_order_relaxed);
    opt4_pool_prefetch_release(th->pool, job.t);
    pf_progress(pf);
    return PF_SETTLED;
  }
  atomic_fetch_add_explicit(&pf->loaded, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&pf->bytes, len, memory_order_relaxed);
  it->len = head + (size_t)len;
  return PF_LOADED;
}

/* Look at the depth (see "Depth" above): more threads reading if the
 * consumers loaded misses themselves since the last look. Called by reading threads between
 * reads; cheap when the period is not over. */
/* What says the depth is short, between two looks: the consumers loaded a
 * miss themselves (an ADMIT or a BYPASS whose claim they found open: no
 * thread had come to it), or their waits for reads in flight (threads just
 * ahead of them, each a read's time), summed over the consumers, took more
 * than half the time. Not any wait at all: an ADMIT handed over when its consumer is
 * next (the item it replaces was read just before it) is waited for, a few
 * microseconds, however many threads read. */
static int pf_short(opt4_prefetcher *pf, const opt4_pool_stats *st, uint64_t now) {
  const uint64_t loads = st->admits + st->bypasses;
  const uint64_t loads_before = atomic_exchange(&pf->adapt_loads, loads);
  const uint64_t waited_before = atomic_exchange(&pf->adapt_wait_ns, st->stall_ns);
  const uint64_t last = atomic_exchange(&pf->adapt_last_ns, now);
  return loads > loads_before || (st->stall_ns - waited_before) * 2 > now - last;
}

/* The depth the consumers need, by Little's law: the misses they take per
 * second times the time a read takes, twice over (their batches come in
 * bursts). 0 when it cannot tell: the consumers did not move since the last
 * estimate (waiting for a head start, between epochs) or no read has been
 * timed yet. A new estimate once the consumers have passed
 * RATE_MIN_POSITIONS over RATE_PERIOD_NS at least, or RATE_LONGEST_NS went
 * by; in between, the last one. Called by the adapting thread only
 * (adapt_at's CAS). */
static uint32_t pf_wanted(pf_thread *th, uint64_t now) {
  opt4_prefetcher *pf = th->pf;
  const uint64_t last_ns = atomic_load_explicit(&pf->rate_ns, memory_order_relaxed);
  const uint64_t head = opt4__pool_head(th->pool);
  const uint64_t last_head = atomic_load_explicit(&pf->rate_head, memory_order_relaxed);
  /* A rate over RATE_PERIOD_NS and RATE_MIN_POSITIONS at least; or over
   * RATE_LONGEST_NS, whatever the consumers passed (none: no estimate). */
  if (now - last_ns < RATE_PERIOD_NS ||
      (last_ns != 0 && head < last_head + RATE_MIN_POSITIONS && now - last_ns < RATE_LONGEST_NS))
    return atomic_load_explicit(&pf->wanted, memory_order_relaxed);
  atomic_store_explicit(&pf->rate_head, head, memory_order_relaxed);
  atomic_store_explicit(&pf->rate_ns, now, memory_order_relaxed);
  const uint64_t rn = atomic_exchange_explicit(&pf->read_ns, 0, memory_order_relaxed);
  const uint64_t rc = atomic_exchange_explicit(&pf->reads_timed, 0, memory_order_relaxed);
  uint64_t avg = atomic_load_explicit(&pf->read_avg_ns, memory_order_relaxed);
  if (rc > 0) avg = avg == 0 ? rn / rc : (avg * 3 + rn / rc) / 4;
  atomic_store_explicit(&pf->read_avg_ns, avg, memory_order_relaxed);
  uint32_t want = 0;
  if (last_ns != 0 && avg != 0 && head > last_head) {
    uint64_t span = 0;
    const uint64_t misses = opt4__pool_misses_in(th->pool, head, MISS_SPAN, &span);
    if (span > 0) {
      /* positions/ns x misses/position x ns/read x 2 */
      const double need = (double)(head - last_head) / (double)(now - last_ns) * (double)misses /
                          (double)span * (double)avg * 2.0;
      want = need >= (double)pf->n ? pf->n : (uint32_t)need + 1;
      if (want < 2) want = 2;
    }
  }
  atomic_store_explicit(&pf->wanted, want, memory_order_relaxed);
  return want;
}

/* Look at the depth (see "Depth" above), every ADAPT_PERIOD_NS, by whichever
 * reading thread first finds the period over. Cheap when it is not. */
static void pf_adapt(pf_thread *th) {
  opt4_prefetcher *pf = th->pf;
  if (pf->fixed) return;
  uint64_t now = now_ns(), at = atomic_load_explicit(&pf->adapt_at, memory_order_relaxed);
  if (now < at || !atomic_compare_exchange_strong(&pf->adapt_at, &at, now + ADAPT_PERIOD_NS)) return;
  opt4_pool_stats st;
  if (opt4_pool_stats_get(th->pool, &st) != 0) return;
  const int short_ = pf_short(pf, &st, now);
  const uint32_t little = pf_wanted(th, now);
  const uint32_t a = atomic_load(&pf->active);
  uint32_t want = a;
  if (short_) want = a + (a / 2 > 1 ? a / 2 : 1);
  if (little > want) {
    want = little;
  } else if (!short_ && little != 0 && little * 4 <= a &&
             now - atomic_load_explicit(&pf->grown_at, memory_order_relaxed) >= SHRINK_AFTER_NS) {
    want = little * 2; /* twice the estimate, when that is half the depth or less */
  }
  const uint32_t limit = atomic_load_explicit(&pf->limit, memory_order_relaxed);
  if (want > limit) want = limit;
  if (want == a || pthread_mutex_trylock(&reg_lock) != 0) return;
  if (want > a) {
    /* A handle each, attached before active covers the thread; a thread
     * whose handle cannot be attached (every process record in use) is not
     * added, nor those after it. */
    uint32_t k = pf->attached;
    for (; k < want; k++) {
      if (opt4__pool_attach_shared(pf->threads[0].pool, &pf->threads[k].pool) != 0) break;
      opt4__pool_set_safe_point(pf->threads[k].pool, pf_safe_point, &pf->threads[k], &pf->park);
    }
    pf->attached = k;
    if (k < want) {
      atomic_store_explicit(&pf->limit, k, memory_order_relaxed);
      want = k;
    }
    if (want > a) {
      atomic_store(&pf->active, want);
      atomic_fetch_add_explicit(&pf->grows, 1, memory_order_relaxed);
      atomic_store_explicit(&pf->grown_at, now, memory_order_relaxed);
      pf_open_gate(pf);
    }
  } else {
    /* The threads above want finish what they hold and go dormant (pf_main);
     * those asleep on the consumers' progress are woken to see it. */
    atomic_store(&pf->active, want);
    atomic_fetch_add_explicit(&pf->shrinks, 1, memory_order_relaxed);
    opt4__pool_head_kick(th->pool);
  }
  pthread_mutex_unlock(&reg_lock);
}

/* A dormant thread's wait (a safe point: it holds nothing): 1 when it is to
 * read, 0 when it is to leave (stopped, or the plan has no more misses). */
static int pf_gate(pf_thread *th) {
  opt4_prefetcher *pf = th->pf;
  const uint32_t me = (uint32_t)(th - pf->threads);
  for (;;) {
    pf_safe_point(th);
    const uint32_t g = atomic_load(&pf->gate);
    if (atomic_load(&pf->stop) || atomic_load(&pf->ended)) return 0;
    if (me < atomic_load(&pf->active)) return 1;
    if (atomic_load(&pf->park) != 0) continue;
    opt4__futex_wait(&pf->gate, g, 0, 0);
  }
}

/* One more buffer's bytes from the pending budget, if it has them. */
static int pf_budget_take(opt4_prefetcher *pf) {
  uint64_t left = atomic_load_explicit(&pf->pending_left, memory_order_relaxed);
  while (left >= pf->buf_len)
    if (atomic_compare_exchange_weak(&pf->pending_left, &left, left - pf->buf_len)) return 1;
  return 0;
}

/* A thread keeps up to `pending` loaded items that wait for their place (the
 * items they replace still have reads to come, or their staging slot is
 * taken), so its reads go on meanwhile; it retries them, earliest first,
 * before it claims more. Only the earliest can wait (the consumers are near
 * it); the waits it makes point at positions before it, which never need an
 * item this thread holds, since its claims come in position order. */
static void *pf_main(void *arg) {
  pf_thread *th = arg;
  opt4_prefetcher *pf = th->pf;
  /* Named for top -H, py-spy and the tests: opt4-pf-<k> (15 bytes at most). */
  char name[16];
  snprintf(name, sizeof name, "opt4-pf-%u", (unsigned)(th - pf->threads));
  prctl(PR_SET_NAME, name, 0, 0, 0);
  const uint32_t cap = pf->pending;
  pf_item *items = NULL;
  uint32_t *order = NULL; /* held items, earliest claim first */
  uint32_t held = 0, allocated = 0;
  int end = 0;
  /* A dormant thread allocates nothing (not even the allocator's arena a
   * thread gets on its first malloc) until it is to read. */
  if (!pf_gate(th)) goto leave;
  items = calloc(cap, sizeof *items);
  order = calloc(cap, sizeof *order);
  if (items == NULL || order == NULL) goto leave;
  if ((items[0].buf = malloc((size_t)pf->buf_len)) == NULL) goto leave;
  allocated = 1;
  while (!atomic_load_explicit(&pf->stop, memory_order_relaxed)) {
    pf_safe_point(th);
    /* The consumers' progress before this round: an idle round sleeps until
     * it moves from here, so a move during the round is never slept through. */
    const uint64_t seen = opt4__pool_head(th->pool);
    int progressed = 0;
    uint32_t kept = 0;
    /* Earliest first, and none after one that must wait: handing a later
     * item over may wait for the consumers, who may need the earlier one
     * first (the consumers can come near a later item between two tries). */
    uint32_t i = 0;
    for (; i < held; i++) {
      if (!pf_try(th, &items[order[i]])) break;
      progressed = 1;
    }
    for (; i < held; i++) order[kept++] = order[i];
    /* Freed slots go back after the held ones, in the same array. */
    uint32_t in_use = kept;
    held = kept;
    /* Above the depth (it shrank): claim nothing more; once what is held is
     * handed over, wait at the gate (a safe point, the handle kept) until
     * the depth grows again, the plan ends or a stop. */
    const int retiring = (uint32_t)(th - pf->threads) >= atomic_load_explicit(&pf->active, memory_order_acquire);
    if (retiring && held == 0 && !end) {
      if (!pf_gate(th)) break;
      continue;
    }
    if (!end && !retiring && held == allocated && allocated < cap && pf_budget_take(pf)) {
      if ((items[allocated].buf = malloc((size_t)pf->buf_len)) != NULL) allocated++;
      else atomic_fetch_add(&pf->pending_left, pf->buf_len);
    }
    if (!end && !retiring && held < allocated) {
      /* The free slot: one not in order[0 .. held). */
      uint32_t slot = 0;
      for (; slot < allocated; slot++) {
        uint32_t k = 0;
        while (k < in_use && order[k] != slot) k++;
        if (k == in_use) break;
      }
      switch (pf_load(th, &items[slot])) {
      case PF_END:
        end = 1;
        atomic_store(&pf->ended, 1); /* the dormant ones have nothing to read */
        pf_open_gate(pf);
        break;
      case PF_IDLE:
        /* Nothing claimed although the window is not full (the claim's work
         * per call is bounded): come back at once rather than sleep. */
        if (!opt4__pool_prefetch_window_full(th->pool, pf->opts.lookahead)) progressed = 1;
        break;
      case PF_SETTLED:
        progressed = 1;
        break;
      case PF_LOADED:
        /* Tried with the others, earliest first, next round: handing it
         * over may wait for the consumers, who may first need an item this
         * thread holds from an earlier claim. */
        progressed = 1;
        order[held++] = slot;
        break;
      }
    }
    if (end && held == 0) break;
    pf_adapt(th);
    if (!progressed) {
      /* Idle: sleep until the consumers move (what it holds, and the
       * window, wait for them), a fork opens a parking round (the park word
       * is checked in the wait, and fork_prepare kicks the word), or a stop
       * interrupts the handle. A thread that can claim more wakes at their
       * next move (the window moved). One that can only hand over what it
       * holds sleeps until they reach the block where its earliest item
       * may find its place (opt4__pool_prefetch_ready_at), not at every
       * move: the idle threads used to wake all at once every 32 positions,
       * most of them to find that their item still had to wait. */
      uint64_t target = seen + 1, bound = IDLE_WAIT_NS;
      if (held > 0 && (end || retiring || held == allocated)) {
        const uint64_t ready = opt4__pool_prefetch_ready_at(th->pool, items[order[0]].t);
        if (ready > seen) {
          target = ready;
          bound = HOLD_WAIT_NS;
        }
      }
      uint64_t t0 = now_ns();
      opt4__pool_head_wait_for(th->pool, target, bound, &pf->park);
      atomic_fetch_add_explicit(&pf->idle_ns, now_ns() - t0, memory_order_relaxed);
      atomic_fetch_add_explicit(&pf->idle_waits, 1, memory_order_relaxed);
    }
  }
  /* Stopped: give back what is still held; its consumers load it. */
  for (uint32_t i = 0; i < held; i++) opt4_pool_prefetch_release(th->pool, items[order[i]].t);
leave:
  for (uint32_t i = 0; i < allocated; i++) free(items[i].buf);
  if (allocated > 1) atomic_fetch_add(&pf->pending_left, (uint64_t)(allocated - 1) * pf->buf_len);
  free(items);
  free(order);
  atomic_fetch_add(&pf->finished, 1);
  pf_progress(pf);
  /* Rest until stopped: a thread exits only inside opt4_prefetcher_stop,
   * under the registry lock, so none is half way out across a fork. */
  atomic_store_explicit(&th->resting, 1, memory_order_release);
  opt4__futex_wake(&th->parked, 0);
  while (!atomic_load_explicit(&pf->stop, memory_order_acquire)) opt4__futex_wait(&pf->stop, 0, 0, 0);
  return NULL;
}

int opt4_prefetcher_start(const char *pool_name, opt4_records *src, const opt4_prefetcher_opts *opts,
                          opt4_prefetcher **out) {
  opt4__clear_detail();
  if (pool_name == NULL || src == NULL || out == NULL)
    return opt4__fail(OPT4_EINVAL, "pool name, records or out is NULL");
  opt4_source *s = NULL;
  int rc = opt4_source_records(src, &s);
  if (rc != 0) return rc;
  rc = opt4_prefetcher_start_source(pool_name, s, opts, out);
  if (rc != 0) {
    opt4_source_close(s);
    return rc;
  }
  (*out)->own_src = 1;
  return 0;
}

int opt4_prefetcher_start_source(const char *pool_name, opt4_source *src, const opt4_prefetcher_opts *opts,
                                 opt4_prefetcher **out) {
  opt4__clear_detail();
  if (pool_name == NULL || src == NULL || out == NULL)
    return opt4__fail(OPT4_EINVAL, "pool name, source or out is NULL");
  *out = NULL;
  opt4_prefetcher_opts o;
  memset(&o, 0, sizeof o);
  if (opts != NULL) o = *opts;
  if (o.threads == 0) o.threads = OPT4_DEFAULT_PREFETCH_THREADS;
  if (o.threads > OPT4_MAX_PREFETCH_THREADS)
    return opt4__fail(OPT4_EINVAL, "%u prefetch threads is too many (at most %u)", o.threads, OPT4_MAX_PREFETCH_THREADS);
  if (o.max_threads == 0) o.max_threads = o.threads;
  if (o.max_threads > OPT4_MAX_PREFETCH_THREADS)
    return opt4__fail(OPT4_EINVAL, "max_threads %u is too many (at most %u)", o.max_threads, OPT4_MAX_PREFETCH_THREADS);
  if (o.max_threads < o.threads)
    return opt4__fail(OPT4_EINVAL, "max_threads %u is below threads %u: the depth starts at threads and stays at most max_threads",
                      o.max_threads, o.threads);
  if (o.lookahead == 0) o.lookahead = OPT4_DEFAULT_LOOKAHEAD;
  uint64_t max_len = 0;
  int rc = opt4__source_max_size(src, &max_len);
  if (rc != 0) return rc > 0 ? OPT4_EIO : rc;
  if (max_len > ((uint64_t)1 << 40))
    return opt4__fail(OPT4_ETOOBIG, "source %s says its largest item is %llu bytes; at most 1 TiB",
                      src->ops.name, (unsigned long long)max_len);
  opt4_prefetcher *pf = opt4__calloc(1, sizeof *pf);
  if (pf == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a prefetcher");
  pf->src = src;
  pf->opts = o;
  pf->buf_len = max_len + OPT4_FRAME_CAP;
  /* Loaded items held per thread: as many as the budget allows, 1 to 32. */
  uint64_t budget = o.pending_bytes ? o.pending_bytes : DEFAULT_PENDING_BYTES;
  uint64_t per = budget / ((uint64_t)o.threads * pf->buf_len); /* at the starting depth */
  pf->pending = per < 1 ? 1 : per > 32 ? 32 : (uint32_t)per;
  /* The starting threads' first buffers are theirs; the rest of the budget
   * is shared, taken a buffer at a time as a thread needs one. */
  const uint64_t first = (uint64_t)o.threads * pf->buf_len;
  atomic_store(&pf->pending_left, budget > first ? budget - first : 0);
  pf->threads = opt4__calloc(o.max_threads, sizeof *pf->threads);
  if (pf->threads == NULL) {
    opt4__free(pf, sizeof *pf);
    return opt4__fail(OPT4_ENOMEM, "no memory for %u prefetch threads", o.max_threads);
  }
  pf->n = o.max_threads;
  pf->fixed = opts == NULL || opts->max_threads == 0;
  for (uint32_t i = 0; i < pf->n; i++) pf->threads[i].pf = pf;
  atomic_store(&pf->active, o.threads);
  atomic_store(&pf->limit, pf->n);
  for (uint32_t i = 0; i < o.threads; i++) {
    /* One mapping for all the threads (opt4__pool_attach_shared). */
    rc = i == 0 ? opt4_pool_attach(pool_name, &pf->threads[i].pool)
                : opt4__pool_attach_shared(pf->threads[0].pool, &pf->threads[i].pool);
    if (rc != 0) goto fail;
    pf->attached = i + 1;
    opt4__pool_set_safe_point(pf->threads[i].pool, pf_safe_point, &pf->threads[i], &pf->park);
  }
  {
    /* The consumers' stalls so far (an earlier epoch's) are not this
     * prefetcher's to answer. */
    opt4_pool_stats st;
    if (opt4_pool_stats_get(pf->threads[0].pool, &st) == 0)
      (void)pf_short(pf, &st, now_ns());
  }
  pthread_once(&reg_once, reg_install);
  pthread_mutex_lock(&reg_lock);
  /* The threads block every signal: signals belong to the application's
   * threads (Python handles them in its main thread). */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  uint32_t started = 0;
  for (uint32_t i = 0; i < pf->n; i++) {
    if (pthread_create(&pf->threads[i].tid, NULL, pf_main, &pf->threads[i]) == 0) {
      pf->threads[i].started = 1;
      started++;
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (started == 0) {
    pthread_mutex_unlock(&reg_lock);
    rc = opt4__fail(OPT4_EIO, "could not start any prefetch thread");
    goto fail;
  }
  pf->reg_next = reg_head;
  reg_head = pf;
  pthread_mutex_unlock(&reg_lock);
  *out = pf;
  return 0;
fail:
  opt4_prefetcher_stop(pf);
  return rc;
}

int opt4_prefetcher_stats_get(opt4_prefetcher *pf, opt4_prefetcher_stats *out) {
  if (pf == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "prefetcher or out is NULL");
  memset(out, 0, sizeof *out);
  out->loaded = atomic_load(&pf->loaded);
  out->bytes = atomic_load(&pf->bytes);
  out->stored = atomic_load(&pf->stored);
  out->errors = atomic_load(&pf->errors);
  out->idle_ns = atomic_load(&pf->idle_ns);
  out->idle_waits = atomic_load(&pf->idle_waits);
  out->parks = atomic_load(&pf->parks);
  out->park_timeouts = atomic_load(&pf->park_timeouts);
  for (uint32_t i = 0; i < pf->n; i++) {
    if (!pf->threads[i].started) continue;
    out->threads++;
    /* A started thread lives until opt4_prefetcher_stop joins it (a done one
     * rests), so its CPU clock can be read here. */
    clockid_t clock;
    struct timespec ts;
    if (!pf->orphan && pthread_getcpuclockid(pf->threads[i].tid, &clock) == 0 && clock_gettime(clock, &ts) == 0)
      out->cpu_ns += (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  }
  out->finished = atomic_load(&pf->finished);
  out->active = atomic_load(&pf->active);
  out->grows = atomic_load(&pf->grows);
  out->shrinks = atomic_load(&pf->shrinks);
  out->wanted = atomic_load(&pf->wanted);
  out->read_avg_ns = atomic_load(&pf->read_avg_ns);
  return 0;
}

void opt4_prefetcher_stop(opt4_prefetcher *pf) {
  if (pf == NULL) return;
  pthread_once(&reg_once, reg_install);
  pthread_mutex_lock(&reg_lock);
  reg_remove(pf);
  if (!pf->orphan) {
    atomic_store(&pf->stop, 1);
    opt4__futex_wake(&pf->stop, 0); /* the resting ones */
    pf_open_gate(pf);              /* the dormant ones */
    /* Parked early (opt4_prefetchers_park) and stopped before the fork: let
     * them go, or the join would wait forever. No fork is under way (it
     * would hold reg_lock). */
    atomic_store(&pf->park, 0);
    opt4__futex_wake(&pf->park, 0);
    /* A thread may be waiting to store an item (for the items it replaces
     * to be read): interrupt, so it gives the item back at once. */
    /* The handles (below attached) do not move under reg_lock. */
    for (uint32_t i = 0; i < pf->attached; i++)
      if (pf->threads[i].pool != NULL) opt4_pool_interrupt(pf->threads[i].pool);
    for (uint32_t i = 0; i < pf->n; i++)
      if (pf->threads[i].started) pthread_join(pf->threads[i].tid, NULL);
  }
  pthread_mutex_unlock(&reg_lock);
  /* A forked child's handles were its parent's: closing them releases
   * nothing of the parent's (opt4_pool_close checks). */
  for (uint32_t i = 0; i < pf->n; i++) opt4_pool_close(pf->threads[i].pool);
  if (pf->own_src) opt4_source_close(pf->src);
  opt4__free(pf->threads, (size_t)pf->n * sizeof *pf->threads);
  opt4__free(pf, sizeof *pf);
}
