/*
 * outfile.c - the one way the engine (and, through the binding, the Python
 * package) writes a file: opt4_outfile (include/opt4.h has the contract).
 *
 * A file is written into a temporary file beside its path and renamed over
 * the path once complete and synced, so a reader never sees half a file and
 * a failed write leaves the old one. Three rules on top of that:
 *
 * - The target is checked before anything is written, and again just before
 *   the rename: only a missing path or a regular file may be replaced. A
 *   rename over a device node, a FIFO or a socket would replace the node
 *   itself (as root, `--output /dev/null` would replace the system's
 *   /dev/null), and a rename over a directory fails only after the whole
 *   file was written. A symbolic link is never written through; it is
 *   replaced (the link itself, as mv does) only when it leads to a regular
 *   file or to nothing, and never when it goes through /proc (/dev/stdout,
 *   /dev/fd/N name another process's open file). OPT4_OUTFILE_NO_SYMLINK
 *   refuses every link.
 * - Temporaries are named <path>.tmp-<pid>-<start>-<pidns>-<n>: the
 *   writer's pid, its start time (clock ticks after boot, /proc/<pid>/stat)
 *   and its PID namespace (the inode of /proc/self/ns/pid). A writer killed
 *   by SIGKILL cannot remove its temporary; the next writer of the same
 *   path removes every temporary of that path whose writer is dead, and
 *   only those: a pid and a start time prove liveness within one PID
 *   namespace only, so a temporary of another namespace (another
 *   container sharing the folder) is left alone, as is one owned by
 *   another user or one that is not a regular file.
 * - Nothing is followed or truncated: the temporary is created with
 *   O_CREAT | O_EXCL | O_NOFOLLOW, mode 0644 under the umask.
 */
#define _GNU_SOURCE
#include "direct.h" /* opt4__file_kind */
#include "internal.h"
#include "layout.h" /* opt4__proc_alive, opt4__proc_start_time (src/shm/procs.c) */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct opt4_outfile {
  int fd;
  uint32_t flags;
  int synced;
  char *path, *tmp, *dir; /* dir: the folder of path, and base its last part */
  const char *base;
  size_t path_bytes, tmp_bytes;
};

#define TMP_TAG ".tmp-"
#define TMP_EXTRA 96 /* ".tmp-" and four numbers */

static _Atomic uint32_t tmp_counter;

static uint64_t pid_namespace(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* 0 if path may be replaced by a rename; otherwise a failure naming why. */
static int check_target(const char *path, uint32_t flags) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return 0;
    return opt4__fail(OPT4_EIO, "cannot write %s: %s", path, strerror(errno));
  }
  if (S_ISREG(st.st_mode)) return 0;
  if (S_ISDIR(st.st_mode))
    return opt4__fail(OPT4_EIO, "cannot write %s: it is a directory; give a file name (inside it, "
                      "for example)", path);
  if (!S_ISLNK(st.st_mode))
    return opt4__fail(OPT4_EIO, "refusing to write %s: it is %s, not a regular file, and writing "
                      "the file there would replace it; give the path of a regular file",
                      path, opt4__file_kind(st.st_mode));
  char to[512];
  ssize_t n = readlink(path, to, sizeof to - 1);
  to[n > 0 ? n : 0] = '\0';
  if (flags & OPT4_OUTFILE_NO_SYMLINK)
    return opt4__fail(OPT4_EIO, "refusing to write %s: it is a symbolic link (to %s), never "
                      "written through or replaced here; give another path, or remove the link",
                      path, to);
  if (strncmp(to, "/proc/", 6) == 0)
    return opt4__fail(OPT4_EIO, "refusing to write %s: it is a symbolic link to %s, another "
                      "process's open file; give the path of a regular file", path, to);
  struct stat tst;
  if (stat(path, &tst) != 0) return 0; /* a dangling link: the link is replaced */
  if (!S_ISREG(tst.st_mode))
    return opt4__fail(OPT4_EIO, "refusing to write %s: it is a symbolic link to %s, which is %s; "
                      "give the path of a regular file", path, to, opt4__file_kind(tst.st_mode));
  return 0; /* the link itself is replaced; its target is left as it is */
}

/* The folder of path (".") and its last component. */
static void split_path(const char *path, char *dir, size_t dir_cap, const char **base) {
  const char *slash = strrchr(path, '/');
  if (slash == NULL) {
    snprintf(dir, dir_cap, ".");
    *base = path;
  } else if (slash == path) {
    snprintf(dir, dir_cap, "/");
    *base = slash + 1;
  } else {
    snprintf(dir, dir_cap, "%.*s", (int)(slash - path), path);
    *base = slash + 1;
  }
}

static int parse_u64(const char **p, char end, uint64_t *out) {
  char *stop;
  if (**p < '0' || **p > '9') return -1;
  errno = 0;
  unsigned long long v = strtoull(*p, &stop, 10);
  if (errno != 0 || *stop != end) return -1;
  *out = v;
  *p = stop + (end != '\0');
  return 0;
}

/* Remove the temporaries of f's path whose writers are dead (see the top). */
static void sweep_dead(const opt4_outfile *f) {
  size_t blen = strlen(f->base);
  uint64_t my_ns = pid_namespace();
  DIR *d = my_ns != 0 ? opendir(f->dir) : NULL;
  if (d == NULL) return;
  int dfd = dirfd(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *name = e->d_name;
    if (strncmp(name, f->base, blen) != 0 || strncmp(name + blen, TMP_TAG, 5) != 0) continue;
    const char *p = name + blen + 5;
    uint64_t pid, start, ns, n;
    if (parse_u64(&p, '-', &pid) || parse_u64(&p, '-', &start) || parse_u64(&p, '-', &ns) ||
        parse_u64(&p, '\0', &n) || pid == 0 || pid > INT32_MAX)
      continue;
    if (ns != my_ns || opt4__proc_alive((pid_t)pid, start)) continue;
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != geteuid())
      continue;
    (void)unlinkat(dfd, name, 0);
  }
  closedir(d);
}

static int write_all(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len > 0) {
    size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
    ssize_t n = write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int opt4_outfile_check(const char *path, uint32_t flags) {
  opt4__clear_detail();
  if (path == NULL || path[0] == '\0') return opt4__fail(OPT4_EINVAL, "the path is empty");
  return check_target(path, flags);
}

int opt4_outfile_open(const char *path, uint32_t flags, opt4_outfile **out) {
  opt4__clear_detail();
  if (out == NULL) return opt4__fail(OPT4_EINVAL, "out is NULL");
  *out = NULL;
  if (path == NULL || path[0] == '\0') return opt4__fail(OPT4_EINVAL, "the path is empty");
  if (flags & ~(uint32_t)OPT4_OUTFILE_NO_SYMLINK) return opt4__fail(OPT4_EINVAL, "unknown flags 0x%x", flags);
  size_t plen = strlen(path);
  if (plen > 0 && path[plen - 1] == '/')
    return opt4__fail(OPT4_EIO, "cannot write %s: a file name cannot end with '/'", path);
  opt4_outfile *f = opt4__calloc(1, sizeof *f);
  if (f == NULL) return opt4__fail(OPT4_ENOMEM, "no memory to write %s", path);
  f->fd = -1;
  f->flags = flags;
  f->path_bytes = plen + 1;
  f->tmp_bytes = plen + TMP_EXTRA;
  f->path = opt4__malloc(f->path_bytes);
  f->tmp = opt4__malloc(f->tmp_bytes);
  f->dir = opt4__malloc(f->path_bytes + 1);
  if (f->tmp != NULL) f->tmp[0] = '\0';
  if (f->path == NULL || f->tmp == NULL || f->dir == NULL) {
    opt4_outfile_abort(f);
    return opt4__fail(OPT4_ENOMEM, "no memory to write %s", path);
  }
  memcpy(f->path, path, plen + 1);
  split_path(f->path, f->dir, f->path_bytes + 1, &f->base);
  int rc = check_target(path, flags);
  if (rc != 0) {
    opt4_outfile_abort(f);
    return rc;
  }
  sweep_dead(f);
  pid_t me = getpid();
  unsigned long long start = opt4__proc_start_time(me), ns = pid_namespace();
  int e = EEXIST;
  for (int tries = 0; tries < 16 && f->fd < 0 && e == EEXIST; tries++) {
    unsigned n = atomic_fetch_add(&tmp_counter, 1);
    snprintf(f->tmp, f->tmp_bytes, "%s" TMP_TAG "%d-%llu-%llu-%u", path, (int)me, start, ns, n);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    e = errno;
  }
  if (f->fd < 0) {
    f->tmp[0] = '\0'; /* not ours: never remove it */
    opt4_outfile_abort(f);
    return opt4__fail(OPT4_EIO, "cannot create a file beside %s: %s", path, strerror(e));
  }
  *out = f;
  return 0;
}

int opt4_outfile_write(opt4_outfile *f, const void *data, size_t len) {
  if (f == NULL || (data == NULL && len > 0)) return opt4__fail(OPT4_EINVAL, "file or data is NULL");
  if (f->fd < 0) return opt4__fail(OPT4_EINVAL, "%s is already complete", f->path);
  if (write_all(f->fd, data, len) != 0)
    return opt4__fail(OPT4_EIO, "cannot write %s: %s", f->path, strerror(errno));
  return 0;
}

int opt4_outfile_pwrite(opt4_outfile *f, const void *data, size_t len, uint64_t offset) {
  if (f == NULL || (data == NULL && len > 0)) return opt4__fail(OPT4_EINVAL, "file or data is NULL");
  if (f->fd < 0) return opt4__fail(OPT4_EINVAL, "%s is already complete", f->path);
  const uint8_t *p = data;
  while (len > 0) {
    ssize_t n = pwrite(f->fd, p, len, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return opt4__fail(OPT4_EIO, "cannot write %s: %s", f->path, strerror(errno));
    p += n;
    len -= (size_t)n;
    offset += (uint64_t)n;
  }
  return 0;
}

int opt4_outfile_sync(opt4_outfile *f) {
  if (f == NULL) return opt4__fail(OPT4_EINVAL, "file is NULL");
  if (f->synced) return 0;
  int fd = f->fd;
  f->fd = -1;
  if (fsync(fd) != 0) {
    int e = errno;
    close(fd);
    f->fd = -2; /* closed, not complete: abort removes the temporary */
    return opt4__fail(OPT4_EIO, "cannot write %s: %s", f->path, strerror(e));
  }
  if (close(fd) != 0) {
    f->fd = -2;
    return opt4__fail(OPT4_EIO, "cannot write %s: %s", f->path, strerror(errno));
  }
  f->synced = 1;
  return 0;
}

int opt4_outfile_commit(opt4_outfile *f) {
  if (f == NULL) return opt4__fail(OPT4_EINVAL, "file is NULL");
  int rc = f->fd == -2 ? opt4__fail(OPT4_EIO, "an earlier write of %s failed", f->path) : opt4_outfile_sync(f);
  if (rc == 0) rc = check_target(f->path, f->flags); /* changed while we wrote? */
  if (rc == 0 && rename(f->tmp, f->path) != 0)
    rc = opt4__fail(OPT4_EIO, "cannot put %s in place: %s", f->path, strerror(errno));
  if (rc == 0) {
    /* Make the rename itself durable, as SQLite does for its journal. */
    int dfd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)fsync(dfd);
      close(dfd);
    }
    f->tmp[0] = '\0'; /* nothing left to remove */
  }
  opt4_outfile_abort(f);
  return rc;
}

const char *opt4_outfile_tmp_path(const opt4_outfile *f) { return f == NULL ? "" : f->tmp; }

void opt4_outfile_abort(opt4_outfile *f) {
  if (f == NULL) return;
  if (f->fd >= 0) close(f->fd);
  if (f->tmp != NULL && f->tmp[0] != '\0') unlink(f->tmp);
  if (f->path != NULL) opt4__free(f->path, f->path_bytes);
  if (f->tmp != NULL) opt4__free(f->tmp, f->tmp_bytes);
  if (f->dir != NULL) opt4__free(f->dir, f->path_bytes + 1);
  opt4__free(f, sizeof *f);
}
