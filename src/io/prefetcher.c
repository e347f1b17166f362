/*
 * prefetcher.c - threads that load a plan's misses from a record file ahead
 * of the consumers, straight into the pool.
 *
 * Each thread has its own pool handle (hazards and claims are per handle)
 * and a few buffers as large as the largest record plus its frame. It claims
 * the next miss in the window, reads the record with pread (O_DIRECT where
 * the reader has it), and hands it over; a failed read gives the claim back
 * so the consumer loads it. When the window has nothing to claim it sleeps,
 * backing off from 50 us to 1 ms, so a stalled consumer costs no CPU.
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_THREADS 8u
#define MAX_THREADS 256u
#define DEFAULT_LOOKAHEAD 4096u
#define DEFAULT_PENDING_BYTES ((uint64_t)64 << 20)

typedef struct pf_thread {
  opt4_prefetcher *pf;
  opt4_pool *pool;
  pthread_t tid;
  int started;
} pf_thread;

struct opt4_prefetcher {
  opt4_records *src;
  opt4_prefetcher_opts opts;
  uint64_t buf_len;
  uint32_t pending; /* loaded items a thread may hold */
  pf_thread *threads;
  uint32_t n;
  _Atomic int stop;
  _Atomic uint64_t loaded, bytes, stored, errors, idle_ns;
  _Atomic uint32_t finished;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One loaded item a thread holds until the pool can take it. */
typedef struct pf_item {
  uint64_t t;
  size_t len; /* head + record */
  size_t tail_len;
  uint8_t tail[OPT4_FRAME_CAP];
  uint8_t *buf;
} pf_item;

/* Hand item it over if the pool can take it; 1 if it is settled (stored or
 * given up), 0 if it must wait longer. */
static int pf_try(pf_thread *th, pf_item *it) {
  opt4_iovec parts[2] = {{it->buf, it->len}, {it->tail, it->tail_len}};
  int result = 0;
  if (opt4_pool_prefetch_try_store(th->pool, it->t, parts, 2, &result) != 0) return 1;
  if (result == 2) return 0;
  if (result == 1) atomic_fetch_add_explicit(&th->pf->stored, 1, memory_order_relaxed);
  return 1;
}

/* Claim the next miss and load it into it->buf. 1 loaded, 0 nothing to
 * claim now, -1 the plan has no more misses. */
static int pf_load(pf_thread *th, pf_item *it) {
  opt4_prefetcher *pf = th->pf;
  opt4_prefetch_job job;
  int status;
  if (opt4_pool_prefetch_claim(th->pool, pf->opts.lookahead, &job, &status) != 0 ||
      status == OPT4_PREFETCH_END)
    return -1;
  if (status == OPT4_PREFETCH_IDLE) return 0;
  uint64_t rec_len = 0, len = 0;
  size_t head = 0;
  it->t = job.t;
  it->tail_len = 0;
  int bad = opt4_records_len(pf->src, job.item, &rec_len) != 0;
  if (!bad && pf->opts.frame != NULL)
    bad = pf->opts.frame(pf->opts.frame_ctx, job.item, rec_len, it->buf, &head, it->tail, &it->tail_len) != 0 ||
          head > OPT4_FRAME_CAP || it->tail_len > OPT4_FRAME_CAP;
  if (bad || opt4_records_read(pf->src, job.item, it->buf + head, (size_t)(pf->buf_len - OPT4_FRAME_CAP),
                               &len) != 0) {
    atomic_fetch_add_explicit(&pf->errors, 1, memory_order_relaxed);
    opt4_pool_prefetch_release(th->pool, job.t);
    return 1;
  }
  atomic_fetch_add_explicit(&pf->loaded, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&pf->bytes, len, memory_order_relaxed);
  it->len = head + (size_t)len;
  return 2;
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
  const uint32_t cap = pf->pending;
  pf_item *items = calloc(cap, sizeof *items);
  uint32_t *order = calloc(cap, sizeof *order); /* held items, earliest claim first */
  uint32_t held = 0, allocated = 0;
  long backoff = 50000;
  int end = 0;
  if (items == NULL || order == NULL) goto leave;
  for (; allocated < cap; allocated++)
    if ((items[allocated].buf = malloc((size_t)pf->buf_len)) == NULL) break;
  if (allocated == 0) goto leave;
  while (!atomic_load_explicit(&pf->stop, memory_order_relaxed)) {
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
    if (!end && held < allocated) {
      /* The free slot: one not in order[0 .. held). */
      uint32_t slot = 0;
      for (; slot < allocated; slot++) {
        uint32_t k = 0;
        while (k < in_use && order[k] != slot) k++;
        if (k == in_use) break;
      }
      int r = pf_load(th, &items[slot]);
      if (r < 0) end = 1;
      if (r == 2) {
        /* Tried with the others, earliest first, next round: handing it
         * over may wait for the consumers, who may first need an item this
         * thread holds from an earlier claim. */
        progressed = 1;
        order[held++] = slot;
      } else if (r == 1) {
        progressed = 1;
      }
    }
    if (end && held == 0) break;
    if (!progressed) {
      uint64_t t0 = now_ns();
      struct timespec ts = {0, backoff};
      nanosleep(&ts, NULL);
      atomic_fetch_add_explicit(&pf->idle_ns, now_ns() - t0, memory_order_relaxed);
      backoff = backoff * 2 > 1000000 ? 1000000 : backoff * 2;
    } else {
      backoff = 50000;
    }
  }
  /* Stopped: give back what is still held; its consumers load it. */
  for (uint32_t i = 0; i < held; i++) opt4_pool_prefetch_release(th->pool, items[order[i]].t);
leave:
  for (uint32_t i = 0; i < allocated; i++) free(items[i].buf);
  free(items);
  free(order);
  atomic_fetch_add(&pf->finished, 1);
  return NULL;
}

int opt4_prefetcher_start(const char *pool_name, opt4_records *src, const opt4_prefetcher_opts *opts,
                          opt4_prefetcher **out) {
  opt4__clear_detail();
  if (pool_name == NULL || src == NULL || out == NULL)
    return opt4__fail(OPT4_EINVAL, "pool name, records or out is NULL");
  *out = NULL;
  opt4_prefetcher_opts o;
  memset(&o, 0, sizeof o);
  if (opts != NULL) o = *opts;
  if (o.threads == 0) o.threads = DEFAULT_THREADS;
  if (o.threads > MAX_THREADS)
    return opt4__fail(OPT4_EINVAL, "%u prefetch threads is too many (at most %u)", o.threads, MAX_THREADS);
  if (o.lookahead == 0) o.lookahead = DEFAULT_LOOKAHEAD;
  opt4_records_info ri;
  int rc = opt4_records_info_get(src, &ri);
  if (rc != 0) return rc;
  opt4_prefetcher *pf = opt4__calloc(1, sizeof *pf);
  if (pf == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a prefetcher");
  pf->src = src;
  pf->opts = o;
  pf->buf_len = ri.max_len + OPT4_FRAME_CAP;
  /* Loaded items held per thread: as many as the budget allows, 1 to 32. */
  uint64_t budget = o.pending_bytes ? o.pending_bytes : DEFAULT_PENDING_BYTES;
  uint64_t per = budget / ((uint64_t)o.threads * pf->buf_len);
  pf->pending = per < 1 ? 1 : per > 32 ? 32 : (uint32_t)per;
  pf->threads = opt4__calloc(o.threads, sizeof *pf->threads);
  if (pf->threads == NULL) {
    opt4__free(pf, sizeof *pf);
    return opt4__fail(OPT4_ENOMEM, "no memory for %u prefetch threads", o.threads);
  }
  pf->n = o.threads;
  for (uint32_t i = 0; i < o.threads; i++) {
    pf->threads[i].pf = pf;
    rc = opt4_pool_attach(pool_name, &pf->threads[i].pool);
    if (rc != 0) goto fail;
  }
  /* The threads block every signal: signals belong to the application's
   * threads (Python handles them in its main thread). */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  uint32_t started = 0;
  for (uint32_t i = 0; i < o.threads; i++) {
    if (pthread_create(&pf->threads[i].tid, NULL, pf_main, &pf->threads[i]) == 0) {
      pf->threads[i].started = 1;
      started++;
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (started == 0) {
    rc = opt4__fail(OPT4_EIO, "could not start any prefetch thread");
    goto fail;
  }
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
  for (uint32_t i = 0; i < pf->n; i++) out->threads += (uint32_t)pf->threads[i].started;
  out->finished = atomic_load(&pf->finished);
  return 0;
}

void opt4_prefetcher_stop(opt4_prefetcher *pf) {
  if (pf == NULL) return;
  atomic_store(&pf->stop, 1);
  /* A thread may be waiting to store an item (for the items it replaces to
   * be read): interrupt, so it gives the item back at once. */
  for (uint32_t i = 0; i < pf->n; i++)
    if (pf->threads[i].pool != NULL) opt4_pool_interrupt(pf->threads[i].pool);
  for (uint32_t i = 0; i < pf->n; i++) {
    if (pf->threads[i].started) pthread_join(pf->threads[i].tid, NULL);
    opt4_pool_close(pf->threads[i].pool);
  }
  opt4__free(pf->threads, (size_t)pf->n * sizeof *pf->threads);
  opt4__free(pf, sizeof *pf);
}
