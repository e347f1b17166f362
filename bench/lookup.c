/*
 * bench/lookup.c - the cost of a HIT in the C pool, per access.
 *
 * A plan over N items with capacity N, T accesses: after the first N misses
 * every access is a HIT. The pool is warmed (every ADMIT stored), then the
 * HITs are timed in one process, in order, for two item sizes: 16 bytes
 * (the path's own overhead: plan lookup, generation, page word, hazard and
 * fence, read count) and ITEM bytes. A plain memcpy of ITEM bytes over the
 * same pages is timed too, so that "excluding the copy" can be read off.
 * Prints one JSON object.
 *
 *   bench_lookup [T] [N] [ITEM] [REPEATS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "opt4.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#define CHECK(call)                                                                 \
  do {                                                                              \
    int rc_ = (call);                                                               \
    if (rc_ != 0) {                                                                 \
      fprintf(stderr, "%s: %s %s\n", #call, opt4_strerror(rc_), opt4_errdetail()); \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

/* Median ns per HIT over repeats, for items of item bytes. */
static double time_hits(const opt4_plan *plan, uint64_t T, size_t item, int repeats,
                        double *copy_ns) {
  opt4_pool_opts o;
  memset(&o, 0, sizeof o);
  o.page_size = item;
  opt4_pool *pool = NULL;
  CHECK(opt4_pool_create(plan, &o, &pool));
  uint8_t *buf = malloc(item), *dst = malloc(item);
  memset(buf, 7, item);
  const uint32_t *ops = opt4_plan_ops(plan);
  uint64_t first_hit = 0;
  opt4_get_result r;
  for (uint64_t t = 0; t < T; t++) { /* warm: store every ADMIT */
    if (OPT4_OP_KIND(ops[t]) == OPT4_OP_HIT) {
      first_hit = t;
      break;
    }
    CHECK(opt4_pool_get(pool, t, NULL, 0, dst, item, &r));
    opt4_iovec part = {buf, item};
    int stored;
    CHECK(opt4_pool_put(pool, t, &part, 1, &stored));
  }
  double *runs = malloc(sizeof(double) * (size_t)repeats);
  uint64_t n = T - first_hit;
  for (int k = 0; k < repeats; k++) {
    double t0 = now();
    for (uint64_t t = first_hit; t < T; t++) {
      opt4_pool_get(pool, t, NULL, 0, dst, item, &r);
      if (r.status != OPT4_GET_HIT) {
        fprintf(stderr, "position %llu was not a hit\n", (unsigned long long)t);
        exit(1);
      }
    }
    runs[k] = (now() - t0) / (double)n * 1e9;
    /* The pool counts reads; the plan's counts are reached after the first
     * pass, which changes nothing for readers. */
  }
  qsort(runs, (size_t)repeats, sizeof(double), cmp_double);
  double med = runs[repeats / 2];
  /* memcpy of the same size from rotating sources the size of the pool. */
  size_t pages = 1024;
  uint8_t *src = malloc(item * pages);
  memset(src, 3, item * pages);
  for (int k = 0; k < repeats; k++) {
    double t0 = now();
    for (uint64_t t = 0; t < n; t++) memcpy(dst, src + (t % pages) * item, item);
    runs[k] = (now() - t0) / (double)n * 1e9;
    __asm__ __volatile__("" : : "r"(dst) : "memory");
  }
  qsort(runs, (size_t)repeats, sizeof(double), cmp_double);
  *copy_ns = runs[repeats / 2];
  free(src);
  free(runs);
  free(buf);
  free(dst);
  opt4_pool_unlink(pool);
  opt4_pool_close(pool);
  return med;
}

int main(int argc, char **argv) {
  uint64_t T = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000000;
  uint64_t N = argc > 2 ? strtoull(argv[2], NULL, 10) : 1024;
  size_t item = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : 4096;
  int repeats = argc > 4 ? atoi(argv[4]) : 7;
  uint32_t *seq = malloc(T * sizeof *seq);
  uint64_t x = 88172645463325252ull;
  for (uint64_t t = 0; t < T; t++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    seq[t] = t < N ? (uint32_t)t : (uint32_t)(x % N);
  }
  opt4_seq s = {seq, OPT4_U32, T, N};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = N;
  opt4_plan *plan = NULL;
  CHECK(opt4_plan_build(&s, &o, &plan));
  double copy_small, copy_item;
  double small = time_hits(plan, T, 16, repeats, &copy_small);
  double big = time_hits(plan, T, item, repeats, &copy_item);
  printf("{\"accesses\": %llu, \"items\": %llu, \"repeats\": %d, \"hit_ns_16B\": %.1f, "
         "\"memcpy_ns_16B\": %.1f, \"hit_ns_item\": %.1f, \"memcpy_ns_item\": %.1f, "
         "\"item_bytes\": %zu}\n",
         (unsigned long long)T, (unsigned long long)N, repeats, small, copy_small, big, copy_item,
         item);
  opt4_plan_close(plan);
  free(seq);
  return 0;
}
