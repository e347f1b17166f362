/*
 * bench/uring_read.c - random reads of variable-size items from one big file:
 * N threads each doing a blocking pread (what src/io/prefetcher.c does today)
 * against one thread keeping D reads in flight on an io_uring (issue 17,
 * item 5). Self-contained: raw io_uring syscalls, no liburing, no engine code.
 *
 * The file is cut into items packed back to back (sizes drawn from --sizes with
 * a fixed seed, as a record file packs them); each run reads --reads items
 * chosen uniformly at random. With --direct the file is opened O_DIRECT and a
 * read covers the item rounded out to the file's DIO alignment (statx
 * STATX_DIOALIGN, else st_blksize, as src/io/direct.c), into an aligned
 * buffer, and the item is then copied out of it, as opt4__pread_direct does.
 * Without --direct the page cache is dropped for the file before every run
 * (posix_fadvise DONTNEED) and the fraction still resident is reported.
 *
 * With --rate R, read i is not issued before i/R seconds into the run (a
 * consumer taking R items a second, as a prefetcher serves training): the
 * CPU a read costs when reads trickle in, not only when they flood. With
 * --batch B they fall due B at a time, as when a prefetch window opens.
 *
 * Modes run interleaved, one run of each per repeat in a rotating order, and
 * the table gives each column's median over the repeats. CPU is getrusage
 * RUSAGE_SELF around the run: it counts our threads and the kernel's io_uring
 * threads (io-wq workers, the SQPOLL thread), which belong to the process.
 * Device bytes are the read sectors of the file system's block device
 * (/sys/dev/block/M:m/stat), so readahead and cache hits show.
 *
 *   bench_uring_read --file PATH [--sizes 1-40|16] [--reads N] [--direct]
 *                    [--modes threads:16,uring:64,...] [--repeats R]
 *                    [--rate R [--batch B]] [--seed S] [--verbose]
 *
 * Modes: threads:N   N threads, blocking pread
 *        uring:D     one ring, D in flight, SINGLE_ISSUER|DEFER_TASKRUN
 *        plain:D     one ring, D in flight, no setup flags
 *        fixed:D     as uring:D with a registered file and registered buffers
 *        sqpoll:D    as fixed:D with SQPOLL (a kernel thread polls the ring)
 */
#define _GNU_SOURCE /* O_DIRECT, statx */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

/* -DOPT4_BENCH_NO_URING builds the threads mode alone, as where the kernel
 * headers lack io_uring. */
#if defined(__linux__) && defined(__has_include) && !defined(OPT4_BENCH_NO_URING)
#if __has_include(<linux/io_uring.h>)
#define HAVE_URING 1
#include <linux/io_uring.h>
#include <sys/syscall.h>
#endif
#endif

#define MAX_MODES 32

typedef struct {
  uint64_t off, len;
} item;

typedef struct {
  char kind[8]; /* threads, uring, plain, fixed, sqpoll */
  unsigned n;
} mode;

/* One run's figures; the table shows each one's median over the repeats. */
enum { M_RATE, M_MBS, M_CPU, M_USR, M_SYS, M_CPU_PER, M_USR_PER, M_SYS_PER, M_P50, M_P99, M_DEV, M_RES, M_COUNT };

typedef struct {
  double m[M_COUNT];
} result;

static struct {
  const char *file;
  unsigned smin, smax; /* KiB */
  uint64_t reads;
  int direct;
  unsigned repeats;
  uint64_t seed;
  double rate; /* reads issued per second, 0: as fast as they complete */
  uint64_t batch; /* with rate: reads fall due in groups of this many */
  int verbose;
  mode modes[MAX_MODES];
  unsigned nmodes;
} opt = {.smin = 1, .smax = 40, .reads = 50000, .repeats = 5, .seed = 1, .batch = 1};

static int fd = -1;
static uint64_t align_mem = 4096, align_off = 4096, file_size;
static item *items;
static uint64_t nitems, max_span;
static char dev_stat[64];

static void die(const char *what) {
  fprintf(stderr, "uring_read: %s: %s\n", what, strerror(errno));
  exit(1);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

/* When read i is due, with --rate: a steady stream of reads as a consumer
 * asks for them, instead of as many as the storage takes; with --batch B,
 * B at a time (a prefetch window that opens B items at once). */
static uint64_t due_ns(uint64_t start, uint64_t i) {
  return opt.rate > 0 ? start + (uint64_t)((double)(i / opt.batch * opt.batch) * 1e9 / opt.rate) : 0;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(const result *runs, int k, double *v) {
  for (unsigned q = 0; q < opt.repeats; q++) v[q] = runs[q].m[k];
  qsort(v, opt.repeats, sizeof *v, cmp_double);
  return opt.repeats % 2 ? v[opt.repeats / 2] : (v[opt.repeats / 2 - 1] + v[opt.repeats / 2]) / 2;
}

/* The read issued for an item: itself, or rounded out to the DIO alignment. */
static void span_of(const item *it, uint64_t *off, uint64_t *len) {
  if (!opt.direct) {
    *off = it->off;
    *len = it->len;
    return;
  }
  uint64_t first = it->off / align_off * align_off;
  *off = first;
  *len = (it->off + it->len - first + align_off - 1) / align_off * align_off;
}

static void *buffer(uint64_t n) {
  void *p = NULL;
  size_t a = align_mem > sizeof(void *) ? (size_t)align_mem : 4096;
  if (posix_memalign(&p, a < 4096 ? 4096 : a, (size_t)n) != 0) die("posix_memalign");
  memset(p, 0, (size_t)n);
  return p;
}

static uint64_t dev_sectors_read(void) {
  FILE *f = fopen(dev_stat, "r");
  unsigned long long ios, merges, sectors;
  if (f == NULL) return 0;
  int ok = fscanf(f, "%llu %llu %llu", &ios, &merges, &sectors) == 3;
  fclose(f);
  return ok ? (uint64_t)sectors : 0;
}

/* Drops the file from the page cache and returns the fraction still resident. */
static double drop_cache(void) {
  int bfd = open(opt.file, O_RDONLY);
  if (bfd < 0) die("open");
  (void)fdatasync(bfd);
  if (posix_fadvise(bfd, 0, 0, POSIX_FADV_DONTNEED) != 0) die("posix_fadvise");
  void *m = mmap(NULL, (size_t)file_size, PROT_READ, MAP_SHARED, bfd, 0);
  if (m == MAP_FAILED) die("mmap");
  size_t pages = (size_t)((file_size + 4095) / 4096);
  unsigned char *vec = malloc(pages);
  if (vec == NULL || mincore(m, (size_t)file_size, vec) != 0) die("mincore");
  size_t res = 0;
  for (size_t i = 0; i < pages; i++) res += vec[i] & 1;
  free(vec);
  munmap(m, (size_t)file_size);
  close(bfd);
  return (double)res / (double)pages;
}

/* ---- threads: N blocking preads ---------------------------------------- */

typedef struct {
  const uint32_t *order;
  uint64_t *lat;
  _Atomic uint64_t next;
  uint64_t t0;
  pthread_barrier_t start;
} tshared;

static void *thread_main(void *arg) {
  tshared *s = arg;
  uint8_t *buf = buffer(max_span), *dst = buffer(max_span);
  pthread_barrier_wait(&s->start);
  for (;;) {
    uint64_t i = atomic_fetch_add_explicit(&s->next, 1, memory_order_relaxed);
    if (i >= opt.reads) break;
    if (opt.rate > 0) {
      uint64_t due = due_ns(s->t0, i);
      struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
      while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
      }
    }
    const item *it = &items[s->order[i]];
    uint64_t off, len, got = 0, t0 = now_ns();
    span_of(it, &off, &len);
    while (got < len) {
      ssize_t k = pread(fd, buf + got, (size_t)(len - got), (off_t)(off + got));
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) die("pread");
      if (k == 0) break; /* the end of the file: a short tail block */
      got += (uint64_t)k;
    }
    if (got < it->off - off + it->len) die("short read");
    if (opt.direct) memcpy(dst, buf + (it->off - off), (size_t)it->len);
    s->lat[i] = now_ns() - t0;
  }
  free(buf);
  free(dst);
  return NULL;
}

static void run_threads(unsigned n, const uint32_t *order, uint64_t *lat, uint64_t *t0, uint64_t *t1,
                        struct rusage *r0, struct rusage *r1) {
  tshared s = {order, lat, 0, 0, {{0}}};
  pthread_t *th = calloc(n, sizeof *th);
  if (th == NULL) die("calloc");
  pthread_barrier_init(&s.start, NULL, n + 1);
  for (unsigned i = 0; i < n; i++)
    if ((errno = pthread_create(&th[i], NULL, thread_main, &s)) != 0) die("pthread_create");
  getrusage(RUSAGE_SELF, r0);
  *t0 = s.t0 = now_ns();
  pthread_barrier_wait(&s.start);
  for (unsigned i = 0; i < n; i++) pthread_join(th[i], NULL);
  *t1 = now_ns();
  getrusage(RUSAGE_SELF, r1);
  pthread_barrier_destroy(&s.start);
  free(th);
}

/* ---- io_uring: one thread, D reads in flight --------------------------- */

#ifdef HAVE_URING
typedef struct {
  int fd;
  unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *sq_flags;
  unsigned *cq_head, *cq_tail, *cq_mask;
  struct io_uring_sqe *sqes;
  struct io_uring_cqe *cqes;
  void *sq_map, *cq_map;
  size_t sq_size, cq_size, sqes_size;
  unsigned sq_tail_local, to_submit;
  int sqpoll;
} ring;

static int ring_open(ring *r, unsigned depth, unsigned flags) {
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  memset(r, 0, sizeof *r);
  p.flags = flags;
  if (flags & IORING_SETUP_SQPOLL) p.sq_thread_idle = 20; /* ms: spin no longer than that after a run */
  r->fd = (int)syscall(__NR_io_uring_setup, depth, &p);
  if (r->fd < 0) return -1;
  r->sqpoll = (flags & IORING_SETUP_SQPOLL) != 0;
  r->sq_size = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  r->cq_size = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  if (p.features & IORING_FEAT_SINGLE_MMAP) {
    if (r->cq_size > r->sq_size) r->sq_size = r->cq_size;
    r->cq_size = r->sq_size;
  }
  r->sq_map = mmap(NULL, r->sq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                   IORING_OFF_SQ_RING);
  if (r->sq_map == MAP_FAILED) return -1;
  if (p.features & IORING_FEAT_SINGLE_MMAP) {
    r->cq_map = r->sq_map;
  } else {
    r->cq_map = mmap(NULL, r->cq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                     IORING_OFF_CQ_RING);
    if (r->cq_map == MAP_FAILED) return -1;
  }
  r->sqes_size = p.sq_entries * sizeof(struct io_uring_sqe);
  r->sqes = mmap(NULL, r->sqes_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                 IORING_OFF_SQES);
  if (r->sqes == MAP_FAILED) return -1;
  uint8_t *sq = r->sq_map, *cq = r->cq_map;
  r->sq_head = (unsigned *)(sq + p.sq_off.head);
  r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
  r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
  r->sq_array = (unsigned *)(sq + p.sq_off.array);
  r->sq_flags = (unsigned *)(sq + p.sq_off.flags);
  r->cq_head = (unsigned *)(cq + p.cq_off.head);
  r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
  r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
  r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
  r->sq_tail_local = *r->sq_tail;
  return 0;
}

static void ring_close(ring *r) {
  if (r->sqes != NULL && r->sqes != MAP_FAILED) munmap(r->sqes, r->sqes_size);
  if (r->cq_map != NULL && r->cq_map != MAP_FAILED && r->cq_map != r->sq_map) munmap(r->cq_map, r->cq_size);
  if (r->sq_map != NULL && r->sq_map != MAP_FAILED) munmap(r->sq_map, r->sq_size);
  if (r->fd >= 0) close(r->fd);
}

static struct io_uring_sqe *ring_sqe(ring *r) {
  unsigned t = r->sq_tail_local, i = t & *r->sq_mask;
  struct io_uring_sqe *sqe = &r->sqes[i];
  memset(sqe, 0, sizeof *sqe);
  r->sq_array[i] = i;
  r->sq_tail_local = t + 1;
  r->to_submit++;
  return sqe;
}

/* Publishes the prepared entries; submits them, and waits for at least one
 * completion when wait is set, for at most timeout_ns if that is not
 * negative. */
static void ring_enter(ring *r, int wait, int64_t timeout_ns) {
  atomic_store_explicit((_Atomic unsigned *)r->sq_tail, r->sq_tail_local, memory_order_release);
  unsigned flags = wait ? IORING_ENTER_GETEVENTS : 0, submit = r->to_submit;
  if (r->sqpoll) {
    submit = 0; /* the kernel thread takes them */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit((_Atomic unsigned *)r->sq_flags, memory_order_relaxed) & IORING_SQ_NEED_WAKEUP)
      flags |= IORING_ENTER_SQ_WAKEUP;
    if (flags == 0) {
      r->to_submit = 0;
      return;
    }
  }
  struct __kernel_timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
  struct io_uring_getevents_arg arg = {0, 0, 0, (uint64_t)(uintptr_t)&ts};
  void *argp = NULL;
  size_t argsz = 0;
  if (wait && timeout_ns >= 0) {
    flags |= IORING_ENTER_EXT_ARG;
    argp = &arg;
    argsz = sizeof arg;
  }
  for (;;) {
    long k = syscall(__NR_io_uring_enter, r->fd, submit, wait ? 1 : 0, flags, argp, argsz);
    if (k < 0 && errno == ETIME) break;
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EBUSY)) continue;
    if (k < 0) die("io_uring_enter");
    if (!r->sqpoll && (unsigned)k < submit) {
      submit -= (unsigned)k;
      continue;
    }
    break;
  }
  r->to_submit = 0;
}

static unsigned count_io_threads(void) {
  unsigned n = 0;
  DIR *d = opendir("/proc/self/task");
  if (d == NULL) return 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    char path[300], comm[32] = "";
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    if (fgets(comm, sizeof comm, f) != NULL && strncmp(comm, "iou-", 4) == 0) n++;
    fclose(f);
  }
  closedir(d);
  return n;
}

typedef struct {
  uint64_t read, off, len, got, t0;
  uint8_t *buf, *dst;
} slot;

static void prep(ring *r, slot *s, unsigned idx, int fixed) {
  struct io_uring_sqe *sqe = ring_sqe(r);
  sqe->opcode = fixed ? IORING_OP_READ_FIXED : IORING_OP_READ;
  sqe->fd = fixed ? 0 : fd;
  if (fixed) {
    sqe->flags = IOSQE_FIXED_FILE;
    sqe->buf_index = (uint16_t)idx;
  }
  sqe->off = s->off + s->got;
  sqe->addr = (uint64_t)(uintptr_t)(s->buf + s->got);
  sqe->len = (uint32_t)(s->len - s->got);
  sqe->user_data = idx;
}

static void start_read(ring *r, slot *s, unsigned idx, int fixed, uint64_t read, const uint32_t *order) {
  s->read = read;
  s->got = 0;
  span_of(&items[order[read]], &s->off, &s->len);
  s->t0 = now_ns();
  prep(r, s, idx, fixed);
}

static int run_uring(const mode *m, const uint32_t *order, uint64_t *lat, uint64_t *t0, uint64_t *t1,
                     struct rusage *r0, struct rusage *r1, unsigned *io_threads) {
  unsigned depth = m->n, flags = 0;
  int fixed = 0;
  if (strcmp(m->kind, "uring") == 0 || strcmp(m->kind, "fixed") == 0)
    flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
  if (strcmp(m->kind, "fixed") == 0) fixed = 1;
  if (strcmp(m->kind, "sqpoll") == 0) {
    flags = IORING_SETUP_SQPOLL;
    fixed = 1;
  }
  ring r;
  if (ring_open(&r, depth, flags) != 0) {
    fprintf(stderr, "uring_read: io_uring_setup(%u, flags %#x): %s\n", depth, flags, strerror(errno));
    ring_close(&r);
    return -1;
  }
  slot *slots = calloc(depth, sizeof *slots);
  struct iovec *iov = calloc(depth, sizeof *iov);
  if (slots == NULL || iov == NULL) die("calloc");
  for (unsigned i = 0; i < depth; i++) {
    slots[i].buf = buffer(max_span);
    slots[i].dst = buffer(max_span);
    iov[i].iov_base = slots[i].buf;
    iov[i].iov_len = (size_t)max_span;
  }
  if (fixed) {
    if (syscall(__NR_io_uring_register, r.fd, IORING_REGISTER_FILES, &fd, 1) != 0) die("register files");
    if (syscall(__NR_io_uring_register, r.fd, IORING_REGISTER_BUFFERS, iov, depth) != 0)
      die("register buffers");
  }

  getrusage(RUSAGE_SELF, r0);
  *t0 = now_ns();
  uint64_t next = 0, done = 0;
  unsigned *idle = malloc(depth * sizeof *idle), nidle = 0;
  if (idle == NULL) die("malloc");
  for (unsigned i = depth; i-- > 0;) idle[nidle++] = i;
  while (done < opt.reads) {
    uint64_t now = opt.rate > 0 ? now_ns() : 0;
    while (next < opt.reads && nidle > 0 && due_ns(*t0, next) <= now) {
      unsigned i = idle[--nidle];
      start_read(&r, &slots[i], i, fixed, next++, order);
    }
    int64_t timeout = -1; /* until a read completes */
    if (opt.rate > 0 && next < opt.reads && nidle > 0) {
      timeout = (int64_t)due_ns(*t0, next) - (int64_t)now_ns();
      if (timeout < 1000) timeout = 1000;
    }
    ring_enter(&r, 1, timeout);
    unsigned head = *r.cq_head;
    unsigned tail = atomic_load_explicit((_Atomic unsigned *)r.cq_tail, memory_order_acquire);
    for (; head != tail; head++) {
      const struct io_uring_cqe *c = &r.cqes[head & *r.cq_mask];
      unsigned idx = (unsigned)c->user_data;
      slot *s = &slots[idx];
      const item *it = &items[order[s->read]];
      if (c->res < 0) {
        errno = -c->res;
        die("io_uring read");
      }
      s->got += (uint64_t)c->res;
      if (c->res > 0 && s->got < s->len) { /* short: read the rest */
        prep(&r, s, idx, fixed);
        continue;
      }
      if (s->got < it->off - s->off + it->len) {
        errno = EIO;
        die("short read");
      }
      if (opt.direct) memcpy(s->dst, s->buf + (it->off - s->off), (size_t)it->len);
      lat[s->read] = now_ns() - s->t0;
      done++;
      idle[nidle++] = idx;
    }
    atomic_store_explicit((_Atomic unsigned *)r.cq_head, head, memory_order_release);
  }
  *t1 = now_ns();
  getrusage(RUSAGE_SELF, r1);
  free(idle);

  /* The kernel's io threads of this process (io-wq workers, SQPOLL) linger
   * a while after a run: count them, to see whether reads went to workers. */
  *io_threads = count_io_threads();

  ring_close(&r);
  for (unsigned i = 0; i < depth; i++) {
    free(slots[i].buf);
    free(slots[i].dst);
  }
  free(slots);
  free(iov);
  return 0;
}
#endif

/* ---- driver ------------------------------------------------------------ */

static void parse_modes(const char *s) {
  char *copy = strdup(s), *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(tok, ':');
    if (colon == NULL || opt.nmodes == MAX_MODES || colon - tok >= (long)sizeof opt.modes[0].kind) {
      fprintf(stderr, "uring_read: bad mode '%s'\n", tok);
      exit(2);
    }
    mode *m = &opt.modes[opt.nmodes++];
    memcpy(m->kind, tok, (size_t)(colon - tok));
    m->kind[colon - tok] = 0;
    m->n = (unsigned)strtoul(colon + 1, NULL, 10);
    int known = strcmp(m->kind, "threads") == 0 || strcmp(m->kind, "uring") == 0 ||
                strcmp(m->kind, "plain") == 0 || strcmp(m->kind, "fixed") == 0 || strcmp(m->kind, "sqpoll") == 0;
    if (!known || m->n == 0) {
      fprintf(stderr, "uring_read: bad mode '%s'\n", tok);
      exit(2);
    }
#ifndef HAVE_URING
    if (strcmp(m->kind, "threads") != 0) {
      fprintf(stderr, "uring_read: built without <linux/io_uring.h>: skipping %s\n", tok);
      opt.nmodes--;
    }
#endif
  }
  free(copy);
}

static void usage(void) {
  fprintf(stderr,
          "usage: bench_uring_read --file PATH [--sizes MIN-MAX|SIZE (KiB)] [--reads N] [--direct]\n"
          "                        [--modes threads:16,uring:64,...] [--repeats R] [--rate READS_PER_S]\n"
          "                        [--batch B] [--seed S] [--verbose]\n");
  exit(2);
}

int main(int argc, char **argv) {
  const char *modes = "threads:4,threads:16,threads:32,uring:64,uring:128,uring:256";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--direct") == 0) {
      opt.direct = 1;
      continue;
    }
    if (strcmp(a, "--verbose") == 0) {
      opt.verbose = 1;
      continue;
    }
    if (v == NULL) usage();
    i++;
    if (strcmp(a, "--file") == 0) {
      opt.file = v;
    } else if (strcmp(a, "--sizes") == 0) {
      char *end;
      opt.smin = (unsigned)strtoul(v, &end, 10);
      opt.smax = *end == '-' ? (unsigned)strtoul(end + 1, NULL, 10) : opt.smin;
      if (opt.smin == 0 || opt.smax < opt.smin) usage();
    } else if (strcmp(a, "--reads") == 0) {
      opt.reads = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--modes") == 0) {
      modes = v;
    } else if (strcmp(a, "--repeats") == 0) {
      opt.repeats = (unsigned)strtoul(v, NULL, 10);
    } else if (strcmp(a, "--rate") == 0) {
      opt.rate = strtod(v, NULL);
    } else if (strcmp(a, "--batch") == 0) {
      opt.batch = strtoull(v, NULL, 10);
    } else if (strcmp(a, "--seed") == 0) {
      opt.seed = strtoull(v, NULL, 10);
    } else {
      usage();
    }
  }
  if (opt.file == NULL || opt.reads == 0 || opt.repeats == 0 || opt.batch == 0) usage();
  parse_modes(modes);

  fd = open(opt.file, O_RDONLY | O_CLOEXEC | (opt.direct ? O_DIRECT : 0));
  if (fd < 0) die(opt.file);
  struct stat st;
  if (fstat(fd, &st) != 0) die("fstat");
  file_size = (uint64_t)st.st_size;
  snprintf(dev_stat, sizeof dev_stat, "/sys/dev/block/%u:%u/stat", major(st.st_dev), minor(st.st_dev));
  if (opt.direct) {
    align_mem = align_off = 0;
#ifdef STATX_DIOALIGN
    struct statx stx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) &&
        stx.stx_dio_offset_align != 0) {
      align_mem = stx.stx_dio_mem_align;
      align_off = stx.stx_dio_offset_align;
    }
#endif
    if (align_off == 0) align_mem = align_off = st.st_blksize > 0 ? (uint64_t)st.st_blksize : 4096;
  }

  /* The items, packed back to back; the last one that fits ends the file. */
  uint64_t cap = file_size / ((uint64_t)opt.smin * 1024) + 1, off = 0, rng = 42;
  items = malloc(cap * sizeof *items);
  if (items == NULL) die("malloc");
  for (;;) {
    uint64_t len = ((uint64_t)opt.smin + splitmix(&rng) % (opt.smax - opt.smin + 1)) * 1024;
    if (opt.smax != opt.smin) len -= splitmix(&rng) % 1024; /* not whole KiB */
    if (off + len > file_size) break;
    items[nitems].off = off;
    items[nitems].len = len;
    nitems++;
    off += len;
  }
  max_span = (uint64_t)opt.smax * 1024 + 2 * (align_off > 4096 ? align_off : 4096);
  if (nitems == 0) {
    fprintf(stderr, "uring_read: %s is smaller than one item\n", opt.file);
    return 1;
  }

  uint32_t *order = malloc(opt.reads * sizeof *order);
  uint64_t *lat = malloc(opt.reads * sizeof *lat);
  result *res = calloc((size_t)opt.nmodes * opt.repeats, sizeof *res);
  unsigned *iot = calloc(opt.nmodes, sizeof *iot);
  if (order == NULL || lat == NULL || res == NULL || iot == NULL) die("malloc");

  printf("# file %s: %.2f GiB, %" PRIu64 " items of %u-%u KiB (mean %.1f KiB), %s", opt.file,
         (double)file_size / (1 << 30), nitems, opt.smin, opt.smax, (double)off / (double)nitems / 1024,
         opt.direct ? "O_DIRECT" : "buffered, page cache dropped before each run");
  if (opt.direct) printf(" (offset alignment %" PRIu64 ", memory alignment %" PRIu64 ")", align_off, align_mem);
  printf("\n# %" PRIu64 " random reads a run", opt.reads);
  if (opt.rate > 0) printf(", issued at %.0f reads/s, %" PRIu64 " at a time", opt.rate, opt.batch);
  printf(", %u repeats, modes interleaved; medians over the repeats\n", opt.repeats);
  fflush(stdout);

  uint64_t seed = opt.seed;
  for (unsigned rep = 0; rep < opt.repeats; rep++) {
    for (unsigned k = 0; k < opt.nmodes; k++) {
      unsigned mi = (k + rep) % opt.nmodes;
      const mode *m = &opt.modes[mi];
      /* A fresh sequence every run, so no run reads what another just warmed
       * (in the host's cache, say, which we cannot drop). */
      for (uint64_t i = 0; i < opt.reads; i++) order[i] = (uint32_t)(splitmix(&seed) % nitems);
      double resident = drop_cache();
      uint64_t t0 = 0, t1 = 0, s0 = dev_sectors_read(), bytes = 0;
      struct rusage r0, r1;
      if (strcmp(m->kind, "threads") == 0) {
        run_threads(m->n, order, lat, &t0, &t1, &r0, &r1);
      } else {
#ifdef HAVE_URING
        if (run_uring(m, order, lat, &t0, &t1, &r0, &r1, &iot[mi]) != 0) return 1;
#endif
      }
      uint64_t s1 = dev_sectors_read();
      for (uint64_t i = 0; i < opt.reads; i++) bytes += items[order[i]].len;
      qsort(lat, opt.reads, sizeof *lat, cmp_u64);
      result *x = &res[(size_t)mi * opt.repeats + rep];
      double secs = (double)(t1 - t0) * 1e-9, n = (double)opt.reads;
      double usr = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) +
                   (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) * 1e-6;
      double sys = (double)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) +
                   (double)(r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) * 1e-6;
      x->m[M_RATE] = n / secs;
      x->m[M_MBS] = (double)bytes / secs / 1e6;
      x->m[M_CPU] = usr + sys;
      x->m[M_USR] = usr;
      x->m[M_SYS] = sys;
      x->m[M_CPU_PER] = (usr + sys) * 1e6 / n;
      x->m[M_USR_PER] = usr * 1e6 / n;
      x->m[M_SYS_PER] = sys * 1e6 / n;
      x->m[M_P50] = (double)lat[opt.reads / 2] * 1e-3;
      x->m[M_P99] = (double)lat[opt.reads * 99 / 100] * 1e-3;
      x->m[M_DEV] = (double)(s1 - s0) * 512 / 1024 / n;
      x->m[M_RES] = resident;
      if (opt.verbose)
        fprintf(stderr,
                "rep %u %s:%u  %.3f s  %.0f reads/s  %.1f MB/s  cpu %.3f+%.3f s  p50 %.0f us  p99 %.0f us  "
                "dev %.1f KiB/read  resident %.4f\n",
                rep, m->kind, m->n, secs, x->m[M_RATE], x->m[M_MBS], usr, sys, x->m[M_P50], x->m[M_P99],
                x->m[M_DEV], resident);
    }
  }

  printf("| mode | in flight | reads/s | MB/s | CPU s (user+sys) | CPU µs/read (user+sys) | p50 µs | p99 µs "
         "| device KiB/read | resident before |\n");
  printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  double *v = malloc(opt.repeats * sizeof *v);
  if (v == NULL) die("malloc");
  for (unsigned mi = 0; mi < opt.nmodes; mi++) {
    const mode *m = &opt.modes[mi];
    const result *x = &res[(size_t)mi * opt.repeats];
    double md[M_COUNT];
    for (int k = 0; k < M_COUNT; k++) md[k] = median(x, k, v);
    printf("| %s%s | %u | %.0f | %.1f | %.3f (%.3f+%.3f) | %.1f (%.1f+%.1f) | %.0f | %.0f | %.1f | %.4f |\n",
           m->kind, m->kind[0] != 't' && iot[mi] > 0 ? "*" : "", m->n, md[M_RATE], md[M_MBS], md[M_CPU],
           md[M_USR], md[M_SYS], md[M_CPU_PER], md[M_USR_PER], md[M_SYS_PER], md[M_P50], md[M_P99],
           md[M_DEV], md[M_RES]);
  }
  for (unsigned mi = 0; mi < opt.nmodes; mi++)
    if (opt.modes[mi].kind[0] != 't' && iot[mi] > 0)
      printf("# * %s:%u: %u io_uring kernel thread(s) (iou-wrk/iou-sqp) alive after its last run\n",
             opt.modes[mi].kind, opt.modes[mi].n, iot[mi]);
  free(v);
  free(order);
  free(lat);
  free(res);
  free(iot);
  free(items);
  close(fd);
  return 0;
}
