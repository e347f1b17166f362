/* test_records_concurrent.c - record files (write, read back, every kind of
 * damage refused) and the prefetcher threads loading a plan's misses from
 * one into the pool while consumer threads follow the plan (the
 * "concurrent" label puts it under ThreadSanitizer too). */
#include "pool_util.h"

#include "layout.h"
#include "records.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

static void tmp_path(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "./opt4-test-%d-%s", (int)getpid(), name);
}

static void test_write_and_read(void) {
  char path[128];
  tmp_path(path, sizeof path, "rw.rec");
  write_items(path, 300);
  for (int direct = 0; direct <= 1; direct++) {
    opt4_records *r = NULL;
    ASSERT_OK(opt4_records_open(path, direct ? OPT4_RECORDS_DIRECT : 0, &r));
    opt4_records_info in;
    ASSERT_OK(opt4_records_info_get(r, &in));
    ASSERT_U64_EQ(in.count, 300);
    fprintf(stderr, "    direct=%d: %s\n", direct, in.note);
    uint8_t buf[PAGE];
    uint64_t total = 0;
    for (uint32_t i = 0; i < 300; i++) {
      uint64_t len = 0;
      ASSERT_OK(opt4_records_read(r, i, buf, sizeof buf, &len));
      ASSERT(item_check(i, buf, len));
      total += len;
    }
    ASSERT_OK(opt4_records_info_get(r, &in));
    ASSERT_U64_EQ(in.bytes_read, total);
    ASSERT_U64_EQ(in.total_bytes, total);
    ASSERT_U64_EQ(in.reads, 300);
    uint64_t len = 0;
    ASSERT_EQ(opt4_records_read(r, 300, buf, sizeof buf, &len), OPT4_ERANGE);
    ASSERT_EQ(opt4_records_read(r, 5, buf, 3, &len), OPT4_EITEMSIZE);
    ASSERT_U64_EQ(len, item_len(5));
    opt4_records_close(r);
  }
  unlink(path);
  /* The writer refuses to write through an existing temporary name? No: it
   * makes a fresh one; and an empty file set is fine. */
  tmp_path(path, sizeof path, "empty.rec");
  write_items(path, 0);
  opt4_records *r = NULL;
  ASSERT_OK(opt4_records_open(path, OPT4_RECORDS_DIRECT, &r));
  opt4_records_close(r);
  unlink(path);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Flip, cut or grow a copy of a good file: each must fail to open with its
 * own code, never crash or read out of bounds. */
static void test_damage(void) {
  char path[128], bad[128];
  tmp_path(path, sizeof path, "good.rec");
  tmp_path(bad, sizeof bad, "bad.rec");
  write_items(path, 20);
  int fd = open(path, O_RDONLY);
  struct stat st;
  ASSERT(fstat(fd, &st) == 0);
  size_t n = (size_t)st.st_size;
  uint8_t *good = malloc(n + 16);
  ASSERT(pread(fd, good, n, 0) == (ssize_t)n);
  close(fd);
  struct {
    size_t at; /* byte to flip (or, with cut, the new length) */
    int cut, want;
  } cases[] = {
      {0, 0, OPT4_EBADMAGIC},          {8, 0, OPT4_EVERSION},
      {17, 0, OPT4_ECHECKSUM},          {n - 3, 0, OPT4_ECHECKSUM},
      {100, 1, OPT4_ETRUNCATED},        {n - 1, 1, OPT4_ETRUNCATED},
      {n + 16, 1, OPT4_ECORRUPT},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    unlink(bad);
    int w = open(bad, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ASSERT(w >= 0);
    uint8_t *copy = calloc(1, n + 16);
    memcpy(copy, good, n);
    size_t len = n;
    if (cases[k].cut)
      len = cases[k].at;
    else
      copy[cases[k].at] ^= 0x40;
    ASSERT(write(w, copy, len) == (ssize_t)len);
    close(w);
    free(copy);
    opt4_records *r = NULL;
    int rc = opt4_records_open(bad, 0, &r);
    if (rc != cases[k].want) fprintf(stderr, "    case %zu: %s (%s)\n", k, opt4_err_name(rc), opt4_errdetail());
    ASSERT_EQ(rc, cases[k].want);
    ASSERT(r == NULL);
  }
  opt4_records *r = NULL;
  ASSERT_EQ(opt4_records_open("./no-such-file.rec", 0, &r), OPT4_EIO);
  unlink(bad);
  unlink(path);
  free(good);
  ASSERT_NO_ENGINE_MEMORY();
}

static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Records are packed: the file is the data, the 4 KiB header and 24 bytes a
 * record (offset, length, checksum), nothing else. */
static void test_packed_size(void) {
  char path[128];
  tmp_path(path, sizeof path, "packed.rec");
  write_items(path, 300);
  struct stat st;
  ASSERT(stat(path, &st) == 0);
  uint64_t data = 0;
  for (uint32_t i = 0; i < 300; i++) data += item_len(i);
  ASSERT_U64_EQ((uint64_t)st.st_size, 4096u + data + 300u * 24u);
  opt4_records *r = NULL;
  ASSERT_OK(opt4_records_open(path, OPT4_RECORDS_DIRECT, &r)); /* direct reads of unaligned records */
  uint8_t buf[PAGE];
  for (uint32_t i = 0; i < 300; i++) {
    uint64_t len = 0;
    ASSERT_OK(opt4_records_read(r, i, buf, sizeof buf, &len));
    ASSERT(len == item_len(i) && item_check(i, buf, len));
  }
  opt4_records_close(r);
  unlink(path);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A file changed in place under an open reader: the changed record is
 * refused (checksum), never returned; a file cut short is named as such. */
static void test_changed_under_the_reader(void) {
  char path[128];
  tmp_path(path, sizeof path, "changed.rec");
  write_items(path, 50);
  for (int direct = 0; direct < 2; direct++) {
    opt4_records *r = NULL;
    ASSERT_OK(opt4_records_open(path, direct ? OPT4_RECORDS_DIRECT : 0, &r));
    uint8_t buf[PAGE];
    uint64_t len = 0;
    ASSERT_OK(opt4_records_read(r, 7, buf, sizeof buf, &len));
    /* Overwrite one byte of record 7 in place, as `cp other x.rec` would. */
    uint64_t off = 4096;
    for (uint32_t i = 0; i < 7; i++) off += item_len(i);
    int fd = open(path, O_RDWR);
    uint8_t b = 0;
    ASSERT(pread(fd, &b, 1, (off_t)off + 3) == 1);
    b ^= 0xff;
    ASSERT(pwrite(fd, &b, 1, (off_t)off + 3) == 1);
    if (direct) ASSERT(fdatasync(fd) == 0);
    ASSERT_ERR(opt4_records_read(r, 7, buf, sizeof buf, &len), OPT4_ECHECKSUM);
    ASSERT(strstr(opt4_errdetail(), "does not match its checksum") != NULL);
    ASSERT_OK(opt4_records_read(r, 8, buf, sizeof buf, &len)); /* the others still read */
    b ^= 0xff;
    ASSERT(pwrite(fd, &b, 1, (off_t)off + 3) == 1);
    /* Cut the file inside the data: a read past the cut says so. */
    struct stat st;
    ASSERT(fstat(fd, &st) == 0);
    uint8_t *keep = malloc((size_t)st.st_size);
    ASSERT(pread(fd, keep, (size_t)st.st_size, 0) == st.st_size);
    ASSERT(ftruncate(fd, (off_t)off) == 0);
    ASSERT_ERR(opt4_records_read(r, 30, buf, sizeof buf, &len), OPT4_ETRUNCATED);
    ASSERT(strstr(opt4_errdetail(), "shorter than the") != NULL);
    ASSERT(pwrite(fd, keep, (size_t)st.st_size, 0) == st.st_size);
    free(keep);
    close(fd);
    opt4_records_close(r);
  }
  unlink(path);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Version 1 files (records at multiples of 4096, 16-byte entries, no record
 * checksums), written before packing, are still read. */
static void test_version_1_still_reads(void) {
  char path[128];
  tmp_path(path, sizeof path, "v1.rec");
  const uint32_t n = 5;
  uint64_t index_off = 4096u * (1u + n);
  size_t size = (size_t)index_off + 16u * n;
  uint8_t *f = calloc(1, size);
  uint8_t *idx = f + index_off;
  for (uint32_t i = 0; i < n; i++) {
    item_fill(i, f + 4096u * (1u + i));
    put64(idx + 16 * i, 4096u * (1u + i));
    put64(idx + 16 * i + 8, item_len(i));
  }
  memcpy(f, "OPT4REC", 8);
  f[8] = 1;
  put64(f + 16, n);
  put64(f + 24, 4096);
  put64(f + 32, index_off);
  put64(f + 40, size);
  put64(f + 48, opt4__hash64(idx, 16u * n));
  put64(f + 56, opt4__hash64(f, 56));
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT(write(fd, f, size) == (ssize_t)size);
  close(fd);
  free(f);
  opt4_records *r = NULL;
  ASSERT_OK(opt4_records_open(path, 0, &r));
  uint8_t buf[PAGE];
  for (uint32_t i = 0; i < n; i++) {
    uint64_t len = 0;
    ASSERT_OK(opt4_records_read(r, i, buf, sizeof buf, &len));
    ASSERT(len == item_len(i) && item_check(i, buf, len));
  }
  opt4_records_close(r);
  unlink(path);
  ASSERT_NO_ENGINE_MEMORY();
}

/* ---- the prefetcher ---- */

enum { BATCH = 16 };

typedef struct consumer_arg {
  const char *name;
  opt4_records *src;
  uint64_t accesses;
  int index, workers;
  uint64_t hits, loads, wrong, prefetched;
} consumer_arg;

/* A consumer that loads its misses from the record file too (a worker
 * calling the dataset), so the file's counters see every load. */
static void *consumer_main(void *p) {
  consumer_arg *a = p;
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_attach(a->name, &pool));
  uint8_t buf[PAGE];
  uint64_t nb = (a->accesses + BATCH - 1) / BATCH;
  for (uint64_t b = (uint64_t)a->index; b < nb; b += (uint64_t)a->workers) {
    uint64_t first = b * BATCH, last = first + BATCH < a->accesses ? first + BATCH : a->accesses;
    uint64_t batch[BATCH];
    for (uint64_t t = first; t < last; t++) batch[t - first] = t;
    for (uint64_t t = first; t < last; t++) {
      opt4_get_result r;
      ASSERT_OK(opt4_pool_get(pool, t, batch, last - first, buf, sizeof buf, &r));
      if (r.status == OPT4_GET_HIT) {
        a->hits++;
        a->prefetched += r.reason == OPT4_REASON_PREFETCHED;
        if (!item_check(r.item, buf, r.len)) a->wrong++;
      } else if (r.status == OPT4_GET_DEFER) {
        a->hits++;
        ASSERT_OK(opt4_pool_note_read(pool, t));
      } else {
        uint64_t len = 0;
        ASSERT_OK(opt4_records_read(a->src, r.item, buf, sizeof buf, &len));
        a->loads++;
        if (!item_check(r.item, buf, len)) a->wrong++;
        if (r.reason == OPT4_REASON_ADMIT) {
          opt4_iovec part = {buf, len};
          int stored;
          ASSERT_OK(opt4_pool_put(pool, t, &part, 1, &stored));
        }
      }
    }
  }
  opt4_pool_close(pool);
  return NULL;
}

static void run_prefetcher(uint32_t threads, uint32_t staging, uint64_t latency_ns, int direct) {
  char path[128];
  tmp_path(path, sizeof path, "pf.rec");
  const uint32_t N = 400;
  write_items(path, N);
  opt4_records *src = NULL;
  ASSERT_OK(opt4_records_open(path, direct ? OPT4_RECORDS_DIRECT : 0, &src));
  opt4_records_set_latency(src, latency_ns);
  opt4_plan *plan = random_plan(8000, N, 100, 99 + threads);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 20000, .staging_slots = staging};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  opt4_prefetcher_opts po = {threads, 0, 256, NULL, NULL, 0};
  opt4_prefetcher *pf = NULL;
  ASSERT_OK(opt4_prefetcher_start(opt4_pool_name(pool), src, &po, &pf));
  pthread_t ct[2];
  consumer_arg ca[2];
  for (int i = 0; i < 2; i++) {
    ca[i] = (consumer_arg){opt4_pool_name(pool), src, in.accesses, i, 2, 0, 0, 0, 0};
    ASSERT(pthread_create(&ct[i], NULL, consumer_main, &ca[i]) == 0);
  }
  uint64_t hits = 0, wrong = 0, prefetched = 0;
  for (int i = 0; i < 2; i++) {
    ASSERT(pthread_join(ct[i], NULL) == 0);
    hits += ca[i].hits;
    wrong += ca[i].wrong;
    prefetched += ca[i].prefetched;
  }
  opt4_prefetcher_stats ps;
  ASSERT_OK(opt4_prefetcher_stats_get(pf, &ps));
  opt4_prefetcher_stop(pf);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  opt4_records_info ri;
  ASSERT_OK(opt4_records_info_get(src, &ri));
  /* The plan's miss bytes: what a perfect run reads from storage. */
  const uint32_t *seq = opt4_plan_seq(plan), *ops = opt4_plan_ops(plan);
  uint64_t miss_bytes = 0;
  for (uint64_t t = 0; t < in.accesses; t++)
    if (OPT4_OP_KIND(ops[t]) != OPT4_OP_HIT) miss_bytes += item_len(seq[t]);
  if (st.fallbacks != 0)
    fprintf(stderr, "    fallbacks %llu timeouts %llu stalls %llu dropped %llu store_failed %llu hits %llu/%llu\n",
            (unsigned long long)st.fallbacks, (unsigned long long)st.timeouts,
            (unsigned long long)st.stalls, (unsigned long long)st.prefetch_dropped,
            (unsigned long long)st.store_failed, (unsigned long long)(st.hits + st.deferred),
            (unsigned long long)in.hits);
  ASSERT_U64_EQ(wrong, 0);
  ASSERT_U64_EQ(st.fallbacks, 0);
  ASSERT_U64_EQ(st.hits + st.deferred, in.hits);
  ASSERT_U64_EQ(hits, in.hits + prefetched);
  ASSERT_U64_EQ(st.prefetched, prefetched);
  ASSERT_U64_EQ(ri.reads, in.misses);
  ASSERT_U64_EQ(ri.bytes_read, miss_bytes);
  ASSERT_U64_EQ(ps.errors, 0);
  ASSERT(prefetched > 0);
  fprintf(stderr, "    %u threads, staging %u, latency %llu us, %s: %llu of %llu misses prefetched, "
          "%llu stalls, %llu bytes read = plan's miss bytes\n", threads, staging,
          (unsigned long long)latency_ns / 1000, ri.note, (unsigned long long)prefetched,
          (unsigned long long)in.misses, (unsigned long long)st.stalls, (unsigned long long)ri.bytes_read);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  opt4_records_close(src);
  unlink(path);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_prefetcher(void) {
  run_prefetcher(4, 0, 0, 0);
  run_prefetcher(4, 16, 0, 1);
  run_prefetcher(8, 16, 100000, 1); /* 100 us a read */
}

/* Stopping mid-run: threads join, claims in hand are settled, and the
 * consumers still get every item right. */
static void test_prefetcher_stop_early(void) {
  char path[128];
  tmp_path(path, sizeof path, "stop.rec");
  write_items(path, 200);
  opt4_records *src = NULL;
  ASSERT_OK(opt4_records_open(path, 0, &src));
  opt4_records_set_latency(src, 200000);
  opt4_plan *plan = random_plan(3000, 200, 50, 3);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(plan, &in));
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 20000, .staging_slots = 8};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  opt4_prefetcher_opts po = {4, 0, 1 << 20, NULL, NULL, 0};
  opt4_prefetcher *pf = NULL;
  ASSERT_OK(opt4_prefetcher_start(opt4_pool_name(pool), src, &po, &pf));
  /* Stop once some items are in (4 threads, 200 us a read), while others
   * wait for the items they replace to be read: stop must not wait those
   * out (the pool's timeout is 20 s). */
  opt4_prefetcher_stats ps;
  for (int i = 0; i < 5000; i++) {
    ASSERT_OK(opt4_prefetcher_stats_get(pf, &ps));
    if (ps.stored >= 20) break;
    usleep(1000);
  }
  uint64_t t0 = opt4__now_ns();
  opt4_prefetcher_stop(pf);
  ASSERT((opt4__now_ns() - t0) / 1000000u < 2000);
  opt4_records_set_latency(src, 0);
  consumer_arg ca = {opt4_pool_name(pool), src, in.accesses, 0, 1, 0, 0, 0, 0};
  consumer_main(&ca);
  opt4_pool_stats st;
  ASSERT_OK(opt4_pool_stats_get(pool, &st));
  ASSERT_U64_EQ(ca.wrong, 0);
  ASSERT_U64_EQ(st.hits + st.deferred, in.hits);
  ASSERT_U64_EQ(st.fallbacks, 0);
  fprintf(stderr, "    stopped early: %llu prefetched, %llu dropped, %llu stored by prefetchers\n",
          (unsigned long long)ca.prefetched, (unsigned long long)st.prefetch_dropped,
          (unsigned long long)st.prefetch_stored);
  ASSERT(ca.prefetched > 0);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  opt4_records_close(src);
  unlink(path);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_write_and_read);
  RUN(test_damage);
  RUN(test_packed_size);
  RUN(test_changed_under_the_reader);
  RUN(test_version_1_still_reads);
  RUN(test_prefetcher);
  RUN(test_prefetcher_stop_early);
  return 0;
}
