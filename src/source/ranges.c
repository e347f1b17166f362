/*
 * ranges.c - byte ranges of files as a source: item i is `length` bytes at
 * `offset` of file `file`. Files are read in place (an ImageFolder tree, one
 * file an item; tar shards, many items a file) with pread, or O_DIRECT
 * through the record file's aligned reads (src/io/direct.c).
 *
 * Reads are blocking, so submit completes each read and there is no reap.
 * Fork safety: the state is immutable after open except the descriptor
 * table and the counters. The counters live in a shared anonymous mapping,
 * so processes forked after open (DataLoader workers) count into the same
 * place, as the record file does. With few files (tar shards) a descriptor
 * is opened on first use and kept, installed with a compare-and-swap (a
 * thread that loses closes its own); a forked child inherits those already
 * open and opens the rest itself. With many files (an image folder: one an
 * item, more than a process may hold open) each read opens and closes its
 * file, as torchvision's loader does.
 *
 * Files are hostile: each is opened O_NONBLOCK (a FIFO where an image was
 * must not block the open) and fstat'ed, and anything but a regular file is
 * refused before a byte is read. With the files' identities given
 * (opt4_ranges_expect: size, inode, mtime, ctime, as indexed), every read
 * fstats its descriptor after the pread and refuses bytes read from a file
 * that is no longer the one indexed (rewritten in place, even at its old
 * size with its mtime put back: ctime moved). Checked after the read, so a
 * write before or during it is caught. With the items' checksums given
 * (opt4_ranges_expect_sums, XXH3-64 as the record file keeps them, computed
 * by opt4_ranges_sums when the dataset was indexed), every read also hashes
 * what it read: a change the identity cannot show (a filesystem whose ctime
 * means nothing, an identity forced back) is refused too.
 */
#define _GNU_SOURCE /* O_DIRECT */
#include "direct.h"
#include "source.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Files kept open once used; past this many, each read opens its file. */
#define KEEP_OPEN 64u

struct ranges_counters {
  _Atomic uint64_t latency_ns;
  _Atomic uint64_t reads, bytes_read;
};

struct opt4_ranges {
  uint64_t n_files, count, total_bytes, max_len;
  opt4_range *items;
  char **paths; /* into path_buf */
  char *path_buf;
  size_t path_bytes;
  _Atomic int *fds; /* buffered, then O_DIRECT: 2 per file, -1 until opened (with KEEP_OPEN) */
  int direct;
  uint64_t dio_mem_align, dio_off_align;
  struct ranges_counters *shared;
  opt4_file_ident *ids; /* per file, as indexed (opt4_ranges_expect), or NULL: not checked */
  uint64_t *sums;       /* per item, XXH3-64 as indexed (opt4_ranges_expect_sums), or NULL: not checked */
  char note[160];
};

/* Open file f, O_NONBLOCK so that a FIFO does not block the open; -1 with
 * errno for a file that is not regular (EFTYPE's stand-in, ENODATA: the
 * failing read says what it is, from stat). */
static int open_file(const opt4_ranges *r, uint64_t f, int direct) {
  int fd = open(r->paths[f], O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (direct ? O_DIRECT : 0));
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int e = S_ISREG(st.st_mode) ? errno : ENODATA;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/* 0 if the open file fd is still file f as indexed (or nothing was given
 * to check it against); else fails naming item i and what changed. */
static int check_same(const opt4_ranges *r, int fd, uint64_t f, uint64_t i) {
  if (r->ids == NULL) return 0;
  const opt4_file_ident *want = &r->ids[f];
  struct stat st;
  if (fstat(fd, &st) != 0)
    return opt4__fail(OPT4_EIO, "cannot check item %llu of %s: fstat: %s", (unsigned long long)i, r->paths[f],
                      strerror(errno));
  int64_t mtime = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  int64_t ctime = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
  const char *what = (uint64_t)st.st_ino != want->ino           ? "another inode"
                     : (uint64_t)st.st_size != want->size       ? "another size"
                     : mtime != want->mtime_ns                   ? "another mtime"
                     : ctime != want->ctime_ns                   ? "another ctime (written, or its mode or links changed)"
                                                                 : NULL;
  if (what == NULL) return 0;
  return opt4__fail(OPT4_EIO, "item %llu of %s was not served: the file changed since it was indexed (%s; "
                    "%llu bytes now, %llu then), so its bytes may be another item's; make the dataset again "
                    "(it indexes the files anew)", (unsigned long long)i, r->paths[f], what,
                    (unsigned long long)st.st_size, (unsigned long long)want->size);
}

/* A descriptor for file f: a kept one, or a new one the caller closes
 * (*owned set). -1 with errno on failure. */
static int get_fd(opt4_ranges *r, uint64_t f, int direct, int *owned) {
  *owned = 0;
  if (r->fds == NULL) {
    *owned = 1;
    return open_file(r, f, direct);
  }
  _Atomic int *slot = &r->fds[2 * f + (direct ? 1 : 0)];
  int fd = atomic_load_explicit(slot, memory_order_acquire);
  if (fd >= 0) return fd;
  fd = open_file(r, f, direct);
  if (fd < 0) return -1;
  int expected = -1;
  if (!atomic_compare_exchange_strong_explicit(slot, &expected, fd, memory_order_acq_rel,
                                               memory_order_acquire)) {
    close(fd);
    fd = expected;
  }
  return fd;
}

/* Read item i (n bytes at off of file f) into dst. Returns 0; -1 with errno
 * when the read failed; 1 when it was refused (the file changed: the
 * failure is already set). */
static int read_range(opt4_ranges *r, uint64_t i, uint64_t f, uint64_t off, uint64_t n, uint8_t *dst) {
  int owned = 0, rc = -1, e = 0;
  if (r->direct) {
    int fd = get_fd(r, f, 1, &owned);
    if (fd >= 0) {
      rc = opt4__pread_direct(fd, r->dio_mem_align, r->dio_off_align, off, n, dst);
      e = errno;
      if (rc == 0 && check_same(r, fd, f, i) != 0) rc = 1;
      if (owned) close(fd);
      if (rc >= 0 || e != EINVAL) return errno = e, rc;
    }
    /* This file refuses O_DIRECT (another filesystem than the probe's): read it buffered. */
  }
  int fd = get_fd(r, f, 0, &owned);
  if (fd < 0) return -1;
  rc = opt4__pread_full(fd, dst, (size_t)n, off);
  e = errno;
  if (rc == 0 && check_same(r, fd, f, i) != 0) rc = 1;
  if (owned) close(fd);
  errno = e;
  return rc;
}

int opt4_ranges_open(const char *const *paths, uint64_t n_files, const opt4_range *items, uint64_t n_items,
                     uint32_t flags, opt4_ranges **out) {
  opt4__clear_detail();
  if (out == NULL || (paths == NULL && n_files > 0) || (items == NULL && n_items > 0))
    return opt4__fail(OPT4_EINVAL, "paths, items or out is NULL");
  *out = NULL;
  if (flags & ~(uint32_t)OPT4_RANGES_DIRECT) return opt4__fail(OPT4_EINVAL, "unknown range flags 0x%x", flags);
  if (n_items > OPT4_MAX_ITEMS)
    return opt4__fail(OPT4_ETOOBIG, "%llu items; at most %llu are supported", (unsigned long long)n_items,
                      (unsigned long long)OPT4_MAX_ITEMS);
  if (n_files > ((uint64_t)1 << 32)) return opt4__fail(OPT4_ETOOBIG, "%llu files; at most 2^32 are supported",
                                                       (unsigned long long)n_files);
  int rc = 0;
  opt4_ranges *r = opt4__calloc(1, sizeof *r);
  if (r == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a range reader");
  r->n_files = n_files;
  r->count = n_items;
  for (uint64_t i = 0; i < n_items; i++) {
    const opt4_range *it = &items[i];
    if (it->file >= n_files) {
      rc = opt4__fail(OPT4_ERANGE, "item %llu is in file %llu; there are %llu files", (unsigned long long)i,
                      (unsigned long long)it->file, (unsigned long long)n_files);
      goto leave;
    }
    if (it->offset > (uint64_t)INT64_MAX || it->length > (uint64_t)INT64_MAX - it->offset) {
      rc = opt4__fail(OPT4_ERANGE, "item %llu (%llu bytes at %llu) lies past any file's end",
                      (unsigned long long)i, (unsigned long long)it->length, (unsigned long long)it->offset);
      goto leave;
    }
    r->total_bytes += it->length;
    if (it->length > r->max_len) r->max_len = it->length;
  }
  for (uint64_t f = 0; f < n_files; f++) {
    if (paths[f] == NULL) {
      rc = opt4__fail(OPT4_EINVAL, "path %llu is NULL", (unsigned long long)f);
      goto leave;
    }
    r->path_bytes += strlen(paths[f]) + 1;
  }
  r->items = opt4__malloc(n_items ? (size_t)n_items * sizeof *r->items : 1);
  r->paths = opt4__malloc(n_files ? (size_t)n_files * sizeof *r->paths : 1);
  r->path_buf = opt4__malloc(r->path_bytes ? r->path_bytes : 1);
  if (r->items == NULL || r->paths == NULL || r->path_buf == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for %llu ranges of %llu files", (unsigned long long)n_items,
                    (unsigned long long)n_files);
    goto leave;
  }
  if (n_items) memcpy(r->items, items, (size_t)n_items * sizeof *r->items);
  char *p = r->path_buf;
  for (uint64_t f = 0; f < n_files; f++) {
    size_t k = strlen(paths[f]) + 1;
    memcpy(p, paths[f], k);
    r->paths[f] = p;
    p += k;
  }
  if (n_files > 0 && n_files <= KEEP_OPEN) {
    r->fds = opt4__malloc((size_t)n_files * 2 * sizeof *r->fds);
    if (r->fds == NULL) {
      rc = opt4__fail(OPT4_ENOMEM, "no memory for a range reader");
      goto leave;
    }
    for (uint64_t k = 0; k < 2 * n_files; k++) atomic_init(&r->fds[k], -1);
  }
  r->shared = mmap(NULL, sizeof *r->shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (r->shared == MAP_FAILED) {
    r->shared = NULL;
    rc = opt4__fail(OPT4_ENOMEM, "no memory for a range reader's counters");
    goto leave;
  }
  snprintf(r->note, sizeof r->note, "buffered reads");
  if (flags & OPT4_RANGES_DIRECT) {
    /* Probe with the first item that has bytes: some filesystems refuse
     * O_DIRECT at open, others accept it and refuse the reads. */
    uint64_t probe_item = n_items;
    for (uint64_t i = 0; i < n_items && probe_item == n_items; i++)
      if (items[i].length > 0) probe_item = i;
    if (probe_item == n_items) {
      snprintf(r->note, sizeof r->note, "no item has bytes to probe O_DIRECT with: buffered reads");
    } else {
      const opt4_range *it = &items[probe_item];
      int dfd = open_file(r, it->file, 1);
      if (dfd < 0) {
        snprintf(r->note, sizeof r->note, "O_DIRECT refused (%s): buffered reads", strerror(errno));
      } else {
        uint8_t probe[1];
        opt4__dio_alignment(dfd, &r->dio_mem_align, &r->dio_off_align);
        if (opt4__pread_direct(dfd, r->dio_mem_align, r->dio_off_align, it->offset, 1, probe) != 0) {
          snprintf(r->note, sizeof r->note, "O_DIRECT reads fail here (%s): buffered reads", strerror(errno));
        } else {
          r->direct = 1;
          snprintf(r->note, sizeof r->note, "O_DIRECT, offset alignment %llu, memory alignment %llu",
                   (unsigned long long)r->dio_off_align, (unsigned long long)r->dio_mem_align);
        }
        close(dfd);
      }
    }
  }
  *out = r;
  r = NULL;
leave:
  opt4_ranges_close(r);
  return rc;
}

void opt4_ranges_close(opt4_ranges *r) {
  if (r == NULL) return;
  if (r->fds != NULL) {
    for (uint64_t k = 0; k < 2 * r->n_files; k++) {
      int fd = atomic_load(&r->fds[k]);
      if (fd >= 0) close(fd);
    }
    opt4__free(r->fds, (size_t)r->n_files * 2 * sizeof *r->fds);
  }
  if (r->items != NULL) opt4__free(r->items, r->count ? (size_t)r->count * sizeof *r->items : 1);
  if (r->paths != NULL) opt4__free(r->paths, r->n_files ? (size_t)r->n_files * sizeof *r->paths : 1);
  if (r->path_buf != NULL) opt4__free(r->path_buf, r->path_bytes ? r->path_bytes : 1);
  if (r->shared != NULL) munmap(r->shared, sizeof *r->shared);
  if (r->ids != NULL) opt4__free(r->ids, (size_t)r->n_files * sizeof *r->ids);
  opt4__item_sums_free(r->sums, r->count);
  opt4__free(r, sizeof *r);
}

int opt4_ranges_expect(opt4_ranges *r, const opt4_file_ident *ids, uint64_t n_files) {
  opt4__clear_detail();
  if (r == NULL || ids == NULL) return opt4__fail(OPT4_EINVAL, "ranges or ids is NULL");
  if (n_files != r->n_files)
    return opt4__fail(OPT4_EINVAL, "%llu identities for %llu files", (unsigned long long)n_files,
                      (unsigned long long)r->n_files);
  if (r->ids == NULL && n_files > 0) {
    r->ids = opt4__malloc((size_t)n_files * sizeof *r->ids);
    if (r->ids == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for %llu file identities", (unsigned long long)n_files);
  }
  if (n_files > 0) memcpy(r->ids, ids, (size_t)n_files * sizeof *r->ids);
  return 0;
}

int opt4_ranges_info_get(const opt4_ranges *r, opt4_ranges_info *out) {
  if (r == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "ranges or out is NULL");
  memset(out, 0, sizeof *out);
  out->count = r->count;
  out->files = r->n_files;
  out->total_bytes = r->total_bytes;
  out->max_len = r->max_len;
  out->direct = (uint64_t)r->direct;
  out->dio_align = r->direct ? r->dio_off_align : 0;
  out->reads = atomic_load(&r->shared->reads);
  out->bytes_read = atomic_load(&r->shared->bytes_read);
  out->latency_ns = atomic_load(&r->shared->latency_ns);
  out->note = r->note;
  return 0;
}

int opt4_ranges_len(const opt4_ranges *r, uint64_t i, uint64_t *len) {
  if (r == NULL || len == NULL) return opt4__fail(OPT4_EINVAL, "ranges or len is NULL");
  if (i >= r->count)
    return opt4__fail(OPT4_ERANGE, "item %llu is outside [0, %llu)", (unsigned long long)i,
                      (unsigned long long)r->count);
  *len = r->items[i].length;
  return 0;
}

void opt4_ranges_set_latency(opt4_ranges *r, uint64_t ns) {
  if (r != NULL) atomic_store(&r->shared->latency_ns, ns);
}

/* Read item i (its length in dst) from storage, checked against its file's
 * identity; 0, or the failure set naming the item and what went wrong. Not
 * counted, no latency, no checksum: the callers add what they need. */
static int read_item(opt4_ranges *r, uint64_t i, void *dst) {
  const opt4_range *it = &r->items[i];
  int got = it->length > 0 ? read_range(r, i, it->file, it->offset, it->length, dst) : 0;
  if (got > 0) return OPT4_EIO; /* refused: the file changed (check_same set the detail) */
  if (got == 0) return 0;
  int e = errno;
  const char *path = r->paths[it->file];
  struct stat st;
  if (stat(path, &st) != 0) e = errno; /* gone since: say so, not what reading its old inode said */
  else if (!S_ISREG(st.st_mode))
    return opt4__fail(OPT4_EIO, "cannot read item %llu of %s: it is not a regular file (%s) and was not read; "
                      "it changed since it was indexed: put the file back, or make the dataset again",
                      (unsigned long long)i, path, opt4__file_kind(st.st_mode));
  else if ((uint64_t)st.st_size < it->offset + it->length)
    return opt4__fail(OPT4_ETRUNCATED, "cannot read item %llu (%llu bytes at %llu of %s): the file is now "
                      "%llu bytes; it changed since it was indexed; index it again",
                      (unsigned long long)i, (unsigned long long)it->length, (unsigned long long)it->offset,
                      path, (unsigned long long)st.st_size);
  return opt4__fail(OPT4_EIO, "cannot read item %llu (%llu bytes at %llu of %s): %s", (unsigned long long)i,
                    (unsigned long long)it->length, (unsigned long long)it->offset, path, strerror(e));
}

int opt4_ranges_read(opt4_ranges *r, uint64_t i, void *dst, size_t cap, uint64_t *len) {
  if (r == NULL || len == NULL || (dst == NULL && cap > 0))
    return opt4__fail(OPT4_EINVAL, "ranges, dst or len is NULL");
  if (i >= r->count)
    return opt4__fail(OPT4_ERANGE, "item %llu is outside [0, %llu)", (unsigned long long)i,
                      (unsigned long long)r->count);
  const opt4_range *it = &r->items[i];
  *len = it->length;
  if (it->length > cap)
    return opt4__fail(OPT4_EITEMSIZE, "item %llu is %llu bytes; the buffer holds %llu", (unsigned long long)i,
                      (unsigned long long)it->length, (unsigned long long)cap);
  uint64_t delay = atomic_load_explicit(&r->shared->latency_ns, memory_order_relaxed);
  if (delay) opt4__sleep_ns(delay); /* emulated storage latency, for benchmarks and tests */
  int rc = read_item(r, i, dst);
  if (rc == 0) rc = opt4__item_sum_check(r->sums, i, dst, it->length, r->paths[it->file]);
  if (rc != 0) return rc;
  atomic_fetch_add_explicit(&r->shared->reads, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&r->shared->bytes_read, it->length, memory_order_relaxed);
  return 0;
}

int opt4_ranges_expect_sums(opt4_ranges *r, const uint64_t *sums, uint64_t n_items) {
  opt4__clear_detail();
  if (r == NULL) return opt4__fail(OPT4_EINVAL, "ranges is NULL");
  return opt4__item_sums_set(&r->sums, r->count, sums, n_items);
}

int opt4_ranges_sums(opt4_ranges *r, uint64_t *sums, uint64_t n_items) {
  opt4__clear_detail();
  if (r == NULL || (sums == NULL && n_items > 0)) return opt4__fail(OPT4_EINVAL, "ranges or sums is NULL");
  if (n_items != r->count)
    return opt4__fail(OPT4_EINVAL, "room for %llu checksums; there are %llu items", (unsigned long long)n_items,
                      (unsigned long long)r->count);
  size_t cap = r->max_len ? (size_t)r->max_len : 1;
  uint8_t *buf = opt4__malloc(cap);
  if (buf == NULL)
    return opt4__fail(OPT4_ENOMEM, "no memory to read an item of %llu bytes", (unsigned long long)r->max_len);
  int rc = 0;
  for (uint64_t i = 0; i < n_items && rc == 0; i++)
    if ((rc = read_item(r, i, buf)) == 0) sums[i] = opt4__hash64(buf, (size_t)r->items[i].length);
  opt4__free(buf, cap);
  return rc;
}

/* ---- the source table ---- */

static int ranges_count(void *state, uint64_t *items) {
  *items = ((opt4_ranges *)state)->count;
  return 0;
}

static int ranges_size_of(void *state, uint64_t item, uint64_t *len) {
  return opt4_ranges_len(state, item, len);
}

static int ranges_max_size(void *state, uint64_t *len) {
  *len = ((opt4_ranges *)state)->max_len;
  return 0;
}

static int ranges_submit(void *state, opt4_source_read *reads, size_t n) {
  for (size_t i = 0; i < n; i++)
    reads[i].status = opt4_ranges_read(state, reads[i].item, reads[i].dst, reads[i].cap, &reads[i].len);
  return 0;
}

const opt4_source_ops opt4__source_ranges_ops = {
    .version = OPT4_SOURCE_OPS_VERSION,
    .name = "ranges",
    .count = ranges_count,
    .size_of = ranges_size_of,
    .max_size = ranges_max_size,
    .submit = ranges_submit,
};

int opt4_source_ranges(opt4_ranges *r, opt4_source **out) {
  opt4__clear_detail();
  if (r == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "ranges or out is NULL");
  return opt4_source_create(&opt4__source_ranges_ops, r, out);
}
