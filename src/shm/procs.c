/*
 * procs.c - the processes that use a pool, and their records.
 *
 * Each process that touches a pool takes a record (proc_rec, layout.h): its
 * pid and start time, the page it is copying out (its hazard), the
 * generation it is writing, and its counters. A record outlives its process
 * only until someone notices: whoever finds a record whose process is gone
 * (a wait that has gone on long, a registration finding no free record, a
 * writer waiting on a hazard) reclaims it, retiring its counters into the
 * header and clearing what it announced. runtime.c's header comment says
 * why the protocol needs the records ("Why nothing hangs").
 *
 * A process is named by its pid and its start time (clock ticks since boot),
 * so that a reused pid is not taken for the process that had it. (A pool's
 * owner is judged otherwise, by its lock, in segment.c: a sweeper may live
 * in another PID namespace.) A forked child is not its parent: it takes a
 * record of its own (fork generation).
 *
 * This file calls no other file of src/shm (layout.h, "who calls whom").
 */
#include "layout.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The monotonic clock that waits and timeouts go by (here because every
 * file above uses it, and this one depends on none of them). */
uint64_t opt4__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- fork detection: a child must not use its parent's record ---- */

/* Bumped in every forked child by segment.c's atfork handler, installed
 * before a pool handle is handed out: a handle whose fork_gen differs was
 * registered by an ancestor, and its record is not this process's. */
static _Atomic uint64_t fork_gen = 1;

void opt4__fork_generation_bump(void) { atomic_fetch_add(&fork_gen, 1); }
uint64_t opt4__fork_generation(void) { return atomic_load_explicit(&fork_gen, memory_order_relaxed); }

/* ---- process identity ---- */

uint64_t opt4__proc_start_time(pid_t pid) {
  char path[64], buf[1024];
  /* Our own through /proc/self: in a PID namespace of its own, a process
   * whose /proc is the host's would find another process under its pid. */
  if (pid == getpid())
    snprintf(path, sizeof path, "/proc/self/stat");
  else
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  /* open/read, not stdio: no allocation and no lock, so any thread may
   * call this at any time, fork or no fork. */
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  /* Field 22 (starttime); the command name (field 2) may hold spaces and
   * parentheses, so count fields after its last ')'. */
  char *p = strrchr(buf, ')');
  if (p == NULL) return 0;
  int field = 2;
  for (p++; *p != '\0'; p++) {
    if (*p == ' ' && ++field == 22) return strtoull(p + 1, NULL, 10);
  }
  return 0;
}

int opt4__proc_alive(pid_t pid, uint64_t start) {
  if (pid <= 0) return 0;
  if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
  if (start == 0) return 1;
  uint64_t now = opt4__proc_start_time(pid);
  return now == 0 || now == start; /* 0: cannot tell, assume alive */
}

/* ---- records ---- */

/* A record's reclaimer: the pid of the process reclaiming it, kept in the
 * record's spare word (proc_rec.reserved), 0 when nobody is. A process can
 * be killed halfway through reclaiming someone else's record; without this,
 * that record would stay "being reclaimed" for good, and a hazard or a
 * writing mark left in it would make every later wait on its page run to
 * the timeout (test_pool_kill found it). With it, the next process finds
 * the reclaimer dead too and finishes the job. */
static uint32_t reclaimer_load(proc_rec *r) { return __atomic_load_n(&r->reserved, __ATOMIC_ACQUIRE); }

void opt4__pool_reclaim(opt4_pool *pool, uint32_t rec) {
  proc_rec *r = &pool->procs[rec];
  for (int c = 0; c < C_COUNT; c++) {
    uint64_t v = atomic_exchange_explicit(&r->counters[c], 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->h->retired[c], v, memory_order_relaxed);
  }
  atomic_store(&r->hazard, 0);
  atomic_store(&r->writing, 0);
  atomic_store(&r->start, 0);
  atomic_fetch_sub(&pool->h->attached, 1);
  atomic_store_explicit(&r->pid, 0, memory_order_release);
  /* Last: killed before this, the record is free and names a dead
   * reclaimer, which the next reclaim of it takes over. */
  __atomic_store_n(&r->reserved, 0, __ATOMIC_RELEASE);
}

/* A record being reclaimed holds this pid, so nobody else touches it. */
#define PID_RECLAIMING UINT32_MAX

int opt4__pool_reclaim_if_dead(opt4_pool *pool, uint32_t rec) {
  proc_rec *r = &pool->procs[rec];
  uint32_t pid = atomic_load(&r->pid);
  if (pid == 0) return 0;
  if (pid != PID_RECLAIMING && opt4__proc_alive((pid_t)pid, atomic_load(&r->start))) return 0;
  /* Become the reclaimer: only if nobody is, or the one who was is dead. */
  uint32_t by = reclaimer_load(r), me = (uint32_t)getpid();
  if (by != 0 && opt4__proc_alive((pid_t)by, 0)) return 0;
  if (!__atomic_compare_exchange_n(&r->reserved, &by, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return 0;
  /* Then take the record from the dead process (or from the dead reclaimer). */
  if (!atomic_compare_exchange_strong(&r->pid, &pid, PID_RECLAIMING)) {
    __atomic_compare_exchange_n(&r->reserved, &me, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
    return 0;
  }
  opt4__pool_reclaim(pool, rec);
  return 1;
}

int opt4__pool_register(opt4_pool *pool) {
  uint64_t fg = opt4__fork_generation();
  if (pool->fork_gen == fg && pool->rec != UINT32_MAX) return 0;
  pid_t me = getpid();
  uint64_t start = opt4__proc_start_time(me);
  uint32_t n = pool->h->max_procs;
  /* Two passes: free records first; then records of processes that are gone. */
  for (int pass = 0; pass < 2; pass++) {
    for (uint32_t i = 0; i < n; i++) {
      proc_rec *r = &pool->procs[i];
      if (pass == 1) opt4__pool_reclaim_if_dead(pool, i);
      uint32_t zero = 0;
      if (!atomic_compare_exchange_strong(&r->pid, &zero, (uint32_t)me)) continue;
      atomic_store(&r->start, start);
      atomic_store(&r->hazard, 0);
      atomic_store(&r->writing, 0);
      for (int c = 0; c < C_COUNT; c++) atomic_store(&r->counters[c], 0);
      atomic_fetch_add(&pool->h->attached, 1);
      pool->rec = i;
      pool->pid = me;
      pool->fork_gen = fg;
      return 0;
    }
  }
  return opt4__fail(OPT4_EPROCS, "all %u process records of pool %s are in use by live "
                    "processes", n, pool->name);
}

/* Whether the prefetcher that holds claim c has died (its record's process
 * is gone): then nobody will finish its load. */
int opt4__claimer_dead(opt4_pool *pool, uint32_t c) {
  uint32_t rec = CL_OWNER(c);
  if (rec == 0 || rec > pool->h->max_procs) return 0;
  proc_rec *r = &pool->procs[rec - 1];
  uint32_t pid = atomic_load(&r->pid);
  return pid == 0 || !opt4__proc_alive((pid_t)pid, atomic_load(&r->start));
}
