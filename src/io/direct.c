/*
 * direct.c - reading byte ranges of files: whole preads and O_DIRECT reads
 * (see direct.h). Shared by the record file and the byte-range source.
 */
#define _GNU_SOURCE /* O_DIRECT, statx */
#include "direct.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int opt4__pread_full(int fd, void *buf, size_t len, uint64_t off) {
  uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = pread(fd, p, len, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0 ? (errno = EIO, -1) : -1;
    p += n;
    len -= (size_t)n;
    off += (uint64_t)n;
  }
  return 0;
}

/* statx's STATX_DIOALIGN where the kernel reports it (Linux 6.1+), else the
 * filesystem's block size. */
void opt4__dio_alignment(int fd, uint64_t *mem, uint64_t *off) {
  *mem = 0;
  *off = 0;
#ifdef STATX_DIOALIGN
  struct statx stx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) &&
      stx.stx_dio_offset_align != 0) {
    *mem = stx.stx_dio_mem_align;
    *off = stx.stx_dio_offset_align;
    return;
  }
#endif
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_blksize > 0) *mem = *off = (uint64_t)st.st_blksize;
  if (*off == 0) *mem = *off = 4096;
}

int opt4__pread_direct(int dfd, uint64_t mem_align, uint64_t off_align, uint64_t off, uint64_t n,
                       uint8_t *dst) {
  const uint64_t a = off_align ? off_align : 4096, first = off / a * a;
  const uint64_t span = (off + n - first + a - 1) / a * a;
  void *bounce = NULL;
  size_t ma = mem_align > sizeof(void *) ? (size_t)mem_align : 4096;
  if (posix_memalign(&bounce, ma, (size_t)span) != 0) return -1;
  int rc = 0;
  uint64_t got = 0;
  while (got < span) {
    ssize_t k = pread(dfd, (uint8_t *)bounce + got, (size_t)(span - got), (off_t)(first + got));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      rc = -1;
      break;
    }
    if (k == 0) break; /* the end of the file: the tail block is short */
    got += (uint64_t)k;
  }
  if (rc == 0 && got < off - first + n) {
    errno = EIO;
    rc = -1;
  }
  if (rc == 0) memcpy(dst, (uint8_t *)bounce + (off - first), (size_t)n);
  free(bounce);
  return rc;
}

void opt4__sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

const char *opt4__file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}
