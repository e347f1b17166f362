/* test_outfile.c - opt4_outfile, the one way files are written: what it
 * refuses (before writing anything, and again before the rename), what it
 * leaves, and the temporaries of dead writers it removes. Real FIFOs, real
 * links, a real device node (mknod, as root; skipped otherwise), a real
 * child killed by SIGKILL mid-write. */
#define _GNU_SOURCE
#include "task.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[] = "/tmp/opt4_outfile_XXXXXX";

static void in_dir(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", dir, name); }

/* The number of temporaries (".tmp-" in the name) in dir. */
static int temporaries(void) {
  DIR *d = opendir(dir);
  ASSERT(d != NULL);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += strstr(e->d_name, ".tmp-") != NULL;
  closedir(d);
  return n;
}

static int write_file(const char *path, uint32_t flags, const char *text) {
  opt4_outfile *f = NULL;
  int rc = opt4_outfile_open(path, flags, &f);
  if (rc != 0) {
    ASSERT(f == NULL);
    return rc;
  }
  ASSERT_OK(opt4_outfile_write(f, text, strlen(text)));
  return opt4_outfile_commit(f);
}

static void assert_text(const char *path, const char *text) {
  char buf[256];
  int fd = open(path, O_RDONLY);
  ASSERT(fd >= 0);
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  ASSERT(n >= 0);
  buf[n] = '\0';
  ASSERT(strcmp(buf, text) == 0);
}

static void test_refused_targets(void) {
  char p[300], fifo[300], sub[300], link[300], target[300];
  in_dir(fifo, sizeof fifo, "fifo");
  ASSERT(mkfifo(fifo, 0600) == 0);
  ASSERT_ERR(write_file(fifo, 0, "x"), OPT4_EIO);
  ASSERT(strstr(opt4_errdetail(), "it is a FIFO (named pipe), not a regular file") != NULL);
  ASSERT_ERR(opt4_outfile_check(fifo, 0), OPT4_EIO);
  in_dir(sub, sizeof sub, "sub");
  ASSERT(mkdir(sub, 0700) == 0);
  ASSERT_ERR(write_file(sub, 0, "x"), OPT4_EIO);
  ASSERT(strstr(opt4_errdetail(), "it is a directory") != NULL);
  /* A link to the FIFO: refused; a link to a regular file: the link is
   * replaced, the file it led to keeps its bytes; NO_SYMLINK: refused. */
  in_dir(link, sizeof link, "to-fifo");
  ASSERT(symlink(fifo, link) == 0);
  ASSERT_ERR(write_file(link, 0, "x"), OPT4_EIO);
  ASSERT(strstr(opt4_errdetail(), "which is a FIFO") != NULL);
  in_dir(link, sizeof link, "to-proc");
  ASSERT(symlink("/proc/self/fd/1", link) == 0);
  ASSERT_ERR(write_file(link, 0, "x"), OPT4_EIO);
  ASSERT(strstr(opt4_errdetail(), "another process's open file") != NULL);
  in_dir(target, sizeof target, "target");
  ASSERT_OK(write_file(target, 0, "keep"));
  in_dir(link, sizeof link, "to-file");
  ASSERT(symlink(target, link) == 0);
  ASSERT_ERR(write_file(link, OPT4_OUTFILE_NO_SYMLINK, "new"), OPT4_EIO);
  ASSERT(strstr(opt4_errdetail(), "it is a symbolic link") != NULL);
  ASSERT_OK(write_file(link, 0, "new"));
  struct stat st;
  ASSERT(lstat(link, &st) == 0 && S_ISREG(st.st_mode));
  assert_text(link, "new");
  assert_text(target, "keep");
  in_dir(p, sizeof p, "slash/");
  ASSERT_ERR(write_file(p, 0, "x"), OPT4_EIO);
  ASSERT(temporaries() == 0);
  if (geteuid() == 0) {
    char node[300];
    in_dir(node, sizeof node, "null");
    ASSERT(mknod(node, S_IFCHR | 0666, makedev(1, 3)) == 0);
    ASSERT_ERR(write_file(node, 0, "x"), OPT4_EIO);
    ASSERT(strstr(opt4_errdetail(), "character device") != NULL);
    ASSERT(lstat(node, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3));
  } else {
    fprintf(stderr, "    (device node case skipped: mknod needs root)\n");
  }
}

/* The target turned into something else while the file was written: the
 * second check, just before the rename, refuses it and removes the
 * temporary. */
static void test_checked_again_before_the_rename(void) {
  char p[300];
  in_dir(p, sizeof p, "late");
  opt4_outfile *f = NULL;
  ASSERT_OK(opt4_outfile_open(p, 0, &f));
  ASSERT_OK(opt4_outfile_write(f, "abc", 3));
  ASSERT(mkfifo(p, 0600) == 0);
  ASSERT_ERR(opt4_outfile_commit(f), OPT4_EIO);
  struct stat st;
  ASSERT(lstat(p, &st) == 0 && S_ISFIFO(st.st_mode));
  ASSERT(temporaries() == 0);
  /* abort leaves the old file and no temporary */
  in_dir(p, sizeof p, "kept");
  ASSERT_OK(write_file(p, 0, "old"));
  ASSERT_OK(opt4_outfile_open(p, 0, &f));
  ASSERT_OK(opt4_outfile_write(f, "new", 3));
  ASSERT_OK(opt4_outfile_sync(f));
  opt4_outfile_abort(f);
  opt4_outfile_abort(NULL);
  assert_text(p, "old");
  ASSERT(temporaries() == 0);
}

/* A child opens the file and is killed by SIGKILL mid-write: its temporary
 * stays, until the next writer of the same path, which removes it (its
 * writer is dead); a live writer's temporary is kept. */
static void test_dead_writers_temporaries(void) {
  char p[300];
  in_dir(p, sizeof p, "killed");
  int ready[2];
  ASSERT(pipe(ready) == 0);
  pid_t child = fork();
  ASSERT(child >= 0);
  if (child == 0) {
    opt4_outfile *f = NULL;
    if (opt4_outfile_open(p, 0, &f) != 0 || opt4_outfile_write(f, "half", 4) != 0) _exit(1);
    char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char c;
  ASSERT(read(ready[0], &c, 1) == 1);
  close(ready[0]);
  close(ready[1]);
  ASSERT(temporaries() == 1);
  opt4_outfile *live = NULL;
  ASSERT_OK(opt4_outfile_open(p, 0, &live)); /* the child is alive: its temporary stays */
  ASSERT(temporaries() == 2);
  ASSERT(kill(child, SIGKILL) == 0);
  int status;
  ASSERT(waitpid(child, &status, 0) == child && WIFSIGNALED(status));
  ASSERT(temporaries() == 2);
  ASSERT_OK(write_file(p, 0, "done")); /* removes the dead child's, keeps live's */
  ASSERT(temporaries() == 1);
  ASSERT(strstr(opt4_outfile_tmp_path(live), ".tmp-") != NULL);
  opt4_outfile_abort(live);
  ASSERT(temporaries() == 0);
  assert_text(p, "done");
}

int main(void) {
  ASSERT(mkdtemp(dir) != NULL);
  RUN(test_refused_targets);
  RUN(test_checked_again_before_the_rename);
  RUN(test_dead_writers_temporaries);
  ASSERT_NO_ENGINE_MEMORY();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ASSERT(system(cmd) == 0);
  return 0;
}
