/* test_files_source.c - byte ranges of files as a source (ranges.c) and the
 * tar indexer (tar.c): ranges read what the files hold, count across fork,
 * fail naming the file; shards written here (ustar, a GNU long name, a pax
 * path) index into WebDataset's samples, read back through the ranges; a
 * malformed shard is refused naming the shard and the offset. */
#include "task.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void tmp_path(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "./opt4-test-%d-%s", (int)getpid(), name);
}

static void write_file(const char *path, const void *data, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT(fd >= 0);
  ASSERT(write(fd, data, n) == (ssize_t)n);
  close(fd);
}

static uint8_t byte_at(uint64_t file, uint64_t off) { return (uint8_t)(file * 31 + off * 7 + (off >> 8)); }

static void test_ranges(void) {
  char p[3][128];
  const char *paths[3];
  static uint8_t data[3][20000];
  for (int f = 0; f < 3; f++) {
    char name[16];
    snprintf(name, sizeof name, "r%d.bin", f);
    tmp_path(p[f], sizeof p[f], name);
    paths[f] = p[f];
    for (size_t k = 0; k < sizeof data[f]; k++) data[f][k] = byte_at((uint64_t)f, k);
    write_file(p[f], data[f], sizeof data[f]);
  }
  const opt4_range items[] = {{0, 0, 100}, {1, 5, 9000}, {2, 19999, 1}, {0, 4097, 12000}, {1, 0, 0}};
  const uint64_t n = sizeof items / sizeof items[0];
  for (int direct = 0; direct < 2; direct++) {
    opt4_ranges *r = NULL;
    ASSERT_OK(opt4_ranges_open(paths, 3, items, n, direct ? OPT4_RANGES_DIRECT : 0, &r));
    opt4_ranges_info in;
    ASSERT_OK(opt4_ranges_info_get(r, &in));
    ASSERT_U64_EQ(in.count, n);
    ASSERT_U64_EQ(in.files, 3);
    ASSERT_U64_EQ(in.max_len, 12000);
    ASSERT_U64_EQ(in.total_bytes, 100 + 9000 + 1 + 12000);
    fprintf(stderr, "    direct=%d: %s\n", direct, in.note);
    opt4_source *src = NULL;
    ASSERT_OK(opt4_source_ranges(r, &src));
    ASSERT(strcmp(opt4_source_name(src), "ranges") == 0);
    ASSERT_U64_EQ(opt4_source_count(src), n);
    static uint8_t buf[12000];
    for (uint64_t i = 0; i < n; i++) {
      uint64_t len = 0;
      ASSERT_OK(opt4_source_read_one(src, i, buf, sizeof buf, &len));
      ASSERT_U64_EQ(len, items[i].length);
      ASSERT(memcmp(buf, data[items[i].file] + items[i].offset, (size_t)len) == 0);
    }
    uint64_t len = 0;
    ASSERT_ERR(opt4_ranges_read(r, 1, buf, 10, &len), OPT4_EITEMSIZE);
    ASSERT_U64_EQ(len, 9000);
    ASSERT_ERR(opt4_ranges_read(r, n, buf, sizeof buf, &len), OPT4_ERANGE);
    /* A forked child reads, and counts into the parent's counters. */
    pid_t pid = fork();
    if (pid == 0) {
      uint64_t l = 0;
      _exit(opt4_ranges_read(r, 3, buf, sizeof buf, &l) == 0 && memcmp(buf, data[0] + 4097, 12000) == 0 ? 0 : 1);
    }
    int status = 0;
    ASSERT(waitpid(pid, &status, 0) == pid);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ASSERT_OK(opt4_ranges_info_get(r, &in));
    ASSERT_U64_EQ(in.reads, n + 1);
    ASSERT_U64_EQ(in.bytes_read, 100 + 9000 + 1 + 12000 + 12000);
    opt4_source_close(src);
    opt4_ranges_close(r);
  }
  /* A file shortened after open: the read names it; one missing: the system error. */
  opt4_ranges *r = NULL;
  ASSERT_OK(opt4_ranges_open(paths, 3, items, n, 0, &r));
  ASSERT(truncate(p[2], 100) == 0);
  uint8_t small[16];
  uint64_t len = 0;
  ASSERT_ERR(opt4_ranges_read(r, 2, small, sizeof small, &len), OPT4_ETRUNCATED);
  ASSERT(strstr(opt4_errdetail(), p[2] + 2) != NULL && strstr(opt4_errdetail(), "now 100 bytes") != NULL);
  unlink(p[2]);
  ASSERT_ERR(opt4_ranges_read(r, 2, small, sizeof small, &len), OPT4_EIO);
  ASSERT(strstr(opt4_errdetail(), "No such file") != NULL);
  opt4_ranges_info in;
  ASSERT_OK(opt4_ranges_info_get(r, &in));
  ASSERT_U64_EQ(in.reads, 0);
  opt4_ranges_close(r);
  /* Items checked at open. */
  const opt4_range bad[] = {{3, 0, 1}};
  ASSERT_ERR(opt4_ranges_open(paths, 3, bad, 1, 0, &r), OPT4_ERANGE);
  ASSERT(r == NULL && strstr(opt4_errdetail(), "file 3") != NULL);
  for (int f = 0; f < 2; f++) unlink(p[f]);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A file's identity as opt4_ranges_expect takes it. */
static opt4_file_ident ident_of(const char *path) {
  struct stat st;
  ASSERT(stat(path, &st) == 0);
  opt4_file_ident id = {(uint64_t)st.st_size, (uint64_t)st.st_ino,
                        (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec,
                        (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec};
  return id;
}

/* Files that are not what was indexed: a FIFO (the open does not block, the
 * read is refused), a link to /dev/zero, and a file rewritten in place at
 * its old size with its mtime put back (ctime tells), with and without
 * O_DIRECT; a file renamed over the kept one's path is still read from the
 * inode indexed. */
static void test_ranges_hostile_files(void) {
  char p[2][128];
  const char *paths[2];
  static uint8_t data[8192];
  for (size_t k = 0; k < sizeof data; k++) data[k] = byte_at(0, k);
  for (int f = 0; f < 2; f++) {
    char name[16];
    snprintf(name, sizeof name, "h%d.bin", f);
    tmp_path(p[f], sizeof p[f], name);
    paths[f] = p[f];
    write_file(p[f], data, sizeof data);
  }
  const opt4_range items[] = {{0, 0, 4096}, {1, 4096, 4096}};
  static uint8_t buf[4096];
  uint64_t len = 0;
  for (int direct = 0; direct < 2; direct++) {
    write_file(p[0], data, sizeof data);
    opt4_file_ident ids[2] = {ident_of(p[0]), ident_of(p[1])};
    opt4_ranges *r = NULL;
    ASSERT_OK(opt4_ranges_open(paths, 2, items, 2, direct ? OPT4_RANGES_DIRECT : 0, &r));
    ASSERT_ERR(opt4_ranges_expect(r, ids, 1), OPT4_EINVAL);
    ASSERT_OK(opt4_ranges_expect(r, ids, 2));
    ASSERT_OK(opt4_ranges_read(r, 0, buf, sizeof buf, &len));
    ASSERT(memcmp(buf, data, sizeof buf) == 0);
    struct timespec sleep = {0, 10 * 1000 * 1000};
    nanosleep(&sleep, NULL);
    int fd = open(p[0], O_WRONLY | O_CLOEXEC);
    ASSERT(fd >= 0);
    ASSERT(pwrite(fd, "other", 5, 100) == 5);
    struct timespec times[2] = {{0, UTIME_OMIT}, {ids[0].mtime_ns / 1000000000, ids[0].mtime_ns % 1000000000}};
    ASSERT(futimens(fd, times) == 0);
    close(fd);
    ASSERT_ERR(opt4_ranges_read(r, 0, buf, sizeof buf, &len), OPT4_EIO);
    ASSERT(strstr(opt4_errdetail(), "was not served: the file changed since it was indexed (another ctime") != NULL);
    ASSERT_OK(opt4_ranges_read(r, 1, buf, sizeof buf, &len)); /* the other file still reads */
    opt4_ranges_close(r);
  }
  /* A FIFO where a file was: refused at once, not waited on. */
  ASSERT(unlink(p[1]) == 0 && mkfifo(p[1], 0600) == 0);
  opt4_ranges *r = NULL;
  ASSERT_OK(opt4_ranges_open(paths, 2, items, 2, 0, &r));
  ASSERT_ERR(opt4_ranges_read(r, 1, buf, sizeof buf, &len), OPT4_EIO);
  ASSERT(strstr(opt4_errdetail(), "is not a regular file (a FIFO (named pipe)) and was not read") != NULL);
  /* A link to /dev/zero: a device of endless bytes, refused too. */
  ASSERT(unlink(p[1]) == 0 && symlink("/dev/zero", p[1]) == 0);
  ASSERT_ERR(opt4_ranges_read(r, 1, buf, sizeof buf, &len), OPT4_EIO);
  ASSERT(strstr(opt4_errdetail(), "(a character device)") != NULL);
  opt4_ranges_info in;
  ASSERT_OK(opt4_ranges_info_get(r, &in));
  ASSERT_U64_EQ(in.reads, 0);
  opt4_ranges_close(r);
  for (int f = 0; f < 2; f++) unlink(p[f]);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Per-item checksums (opt4_ranges_sums, _expect_sums): recorded, then a
 * rewrite in place whose identity is given again as the file's new one (as
 * a filesystem whose ctime means nothing would show it) is still refused,
 * by the checksum, buffered and O_DIRECT; the other items read; nothing is
 * counted for a refused read. */
static void test_ranges_checksums(void) {
  char p[128];
  tmp_path(p, sizeof p, "sums.bin");
  const char *paths[1] = {p};
  static uint8_t data[8192];
  for (size_t k = 0; k < sizeof data; k++) data[k] = byte_at(3, k);
  const opt4_range items[] = {{0, 0, 4096}, {0, 4096, 4000}, {0, 8096, 0}};
  static uint8_t buf[4096];
  uint64_t len = 0, sums[3], want[3];
  want[0] = opt4_checksum(data, 4096);
  want[1] = opt4_checksum(data + 4096, 4000);
  want[2] = opt4_checksum(data, 0);
  for (int direct = 0; direct < 2; direct++) {
    write_file(p, data, sizeof data);
    opt4_file_ident id = ident_of(p);
    opt4_ranges *r = NULL;
    ASSERT_OK(opt4_ranges_open(paths, 1, items, 3, direct ? OPT4_RANGES_DIRECT : 0, &r));
    ASSERT_OK(opt4_ranges_expect(r, &id, 1));
    ASSERT_ERR(opt4_ranges_sums(r, sums, 2), OPT4_EINVAL);
    ASSERT_OK(opt4_ranges_sums(r, sums, 3));
    for (int i = 0; i < 3; i++) ASSERT_U64_EQ(sums[i], want[i]);
    opt4_ranges_info in;
    ASSERT_OK(opt4_ranges_info_get(r, &in));
    ASSERT_U64_EQ(in.reads, 0); /* checksumming is indexing, not reading */
    opt4_ranges_close(r);
    /* The file rewritten in place (one byte of item 1), and the reader made
     * with the identity the file has now: only the checksum can tell. */
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    ASSERT(fd >= 0);
    ASSERT(pwrite(fd, "X", 1, 5000) == 1);
    close(fd);
    opt4_file_ident now = ident_of(p);
    ASSERT_OK(opt4_ranges_open(paths, 1, items, 3, direct ? OPT4_RANGES_DIRECT : 0, &r));
    ASSERT_OK(opt4_ranges_expect(r, &now, 1));
    ASSERT_ERR(opt4_ranges_expect_sums(r, sums, 2), OPT4_EINVAL);
    ASSERT_OK(opt4_ranges_expect_sums(r, sums, 3));
    ASSERT_ERR(opt4_ranges_expect_sums(r, sums, 3), OPT4_EINVAL); /* once */
    ASSERT_ERR(opt4_ranges_read(r, 1, buf, sizeof buf, &len), OPT4_ECHECKSUM);
    ASSERT(strstr(opt4_errdetail(), "item 1 (4000 bytes of ") != NULL);
    ASSERT(strstr(opt4_errdetail(), "does not match the checksum recorded when it was indexed") != NULL);
    ASSERT_OK(opt4_ranges_read(r, 0, buf, sizeof buf, &len));
    ASSERT(memcmp(buf, data, 4096) == 0);
    ASSERT_OK(opt4_ranges_read(r, 2, buf, sizeof buf, &len));
    ASSERT_OK(opt4_ranges_info_get(r, &in));
    ASSERT_U64_EQ(in.reads, 2);
    opt4_ranges_close(r);
  }
  unlink(p);
  ASSERT_NO_ENGINE_MEMORY();
}

/* ---- a tar writer: just enough of ustar, GNU and pax ---- */

typedef struct {
  uint8_t *p;
  size_t n;
} tarbuf;

static void tar_put(tarbuf *t, const void *d, size_t n) {
  size_t padded = (n + 511) / 512 * 512;
  t->p = realloc(t->p, t->n + padded);
  ASSERT(t->p != NULL);
  memset(t->p + t->n, 0, padded);
  memcpy(t->p + t->n, d, n);
  t->n += padded;
}

static void tar_header(tarbuf *t, const char *name, size_t size, char type) {
  uint8_t h[512];
  memset(h, 0, sizeof h);
  memcpy(h, name, strlen(name) < 100 ? strlen(name) : 100);
  memcpy(h + 100, "0000644", 7);
  snprintf((char *)h + 124, 12, "%011o", (unsigned)size);
  memcpy(h + 136, "00000000000", 11);
  h[156] = (uint8_t)type;
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 263, "00", 2);
  memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += h[i];
  snprintf((char *)h + 148, 8, "%06o", sum);
  tar_put(t, h, sizeof h);
}

static void tar_member(tarbuf *t, const char *name, const char *data) {
  tar_header(t, name, strlen(data), '0');
  if (*data) tar_put(t, data, strlen(data));
}

/* A shard: two samples in ustar, a directory, a GNU long name and a pax
 * path (each naming a member of the third sample), a link (no data), and a
 * file with no dot (skipped, as WebDataset skips it). */
static tarbuf make_shard(char *long_key, size_t cap) {
  tarbuf t = {NULL, 0};
  tar_header(&t, "train/", 0, '5');
  tar_member(&t, "train/0001.jpg", "JPEGDATA1");
  tar_member(&t, "train/0001.CLS", "7");
  tar_member(&t, "train/0002.jpg", "JPEG2");
  tar_member(&t, "train/0002.seg.png", "PNG!");
  tar_member(&t, "train/README", "skipped");
  memset(long_key, 'k', cap - 1);
  memcpy(long_key, "train/", 6);
  long_key[cap - 1] = 0;
  char long_name[400];
  snprintf(long_name, sizeof long_name, "%s.txt", long_key);
  tar_header(&t, "././@LongLink", strlen(long_name) + 1, 'L');
  tar_put(&t, long_name, strlen(long_name) + 1);
  tar_member(&t, "train/truncated-in-ustar.txt", "long text");
  char rec[512];
  int body = snprintf(rec, sizeof rec, "path=%s.json\n", long_key);
  int len = body + 2;
  len = body + (int)snprintf(NULL, 0, "%d ", len);
  char pax[600];
  snprintf(pax, sizeof pax, "%d %s", len, rec);
  tar_header(&t, "PaxHeaders/x", strlen(pax), 'x');
  tar_put(&t, pax, strlen(pax));
  tar_member(&t, "ignored-name", "{\"a\":1}");
  tar_header(&t, "train/0001.lnk", 999, '2'); /* a link: its size is not data */
  uint8_t zero[1024];
  memset(zero, 0, sizeof zero);
  t.p = realloc(t.p, t.n + sizeof zero);
  memcpy(t.p + t.n, zero, sizeof zero);
  t.n += sizeof zero;
  return t;
}

static void check_member(const opt4_tar_view *v, const uint8_t *shard, uint64_t s, uint64_t m, const char *field,
                         const char *data) {
  const opt4_tar_sample *sm = &v->samples[s];
  ASSERT(m < sm->members);
  const opt4_tar_member *mm = &v->members[sm->first_member + m];
  if (mm->field_len != strlen(field) || memcmp(v->names + mm->field_off, field, strlen(field)) != 0)
    FAIL_AT("sample %d member %d: field '%.*s', want '%s'", (int)s, (int)m, (int)mm->field_len,
            v->names + mm->field_off, field);
  ASSERT_U64_EQ(mm->size, strlen(data));
  ASSERT(memcmp(shard + sm->offset + mm->offset, data, strlen(data)) == 0);
}

static int key_is(const opt4_tar_view *v, uint64_t s, const char *key) {
  return v->samples[s].key_len == strlen(key) && memcmp(v->names + v->samples[s].key_off, key, strlen(key)) == 0;
}

static void test_tar_index(void) {
  char path[128], long_key[200];
  tmp_path(path, sizeof path, "shard.tar");
  tarbuf t = make_shard(long_key, sizeof long_key);
  write_file(path, t.p, t.n);
  opt4_tar_index *idx = NULL;
  ASSERT_OK(opt4_tar_index_file(path, &idx));
  opt4_tar_view v;
  ASSERT_OK(opt4_tar_index_view(idx, &v));
  ASSERT_U64_EQ(v.n_samples, 3);
  ASSERT_U64_EQ(v.n_members, 6);
  ASSERT(key_is(&v, 0, "train/0001") && key_is(&v, 1, "train/0002") && key_is(&v, 2, long_key));
  check_member(&v, t.p, 0, 0, "jpg", "JPEGDATA1");
  check_member(&v, t.p, 0, 1, "cls", "7"); /* fields are lower-cased, as WebDataset does */
  check_member(&v, t.p, 1, 0, "jpg", "JPEG2");
  check_member(&v, t.p, 1, 1, "seg.png", "PNG!");
  check_member(&v, t.p, 2, 0, "txt", "long text");
  check_member(&v, t.p, 2, 1, "json", "{\"a\":1}");
  /* Each sample is one range: read through the ranges source, its members are where the index says. */
  opt4_range items[3];
  for (int s = 0; s < 3; s++) items[s] = (opt4_range){0, v.samples[s].offset, v.samples[s].length};
  const char *paths[] = {path};
  opt4_ranges *r = NULL;
  ASSERT_OK(opt4_ranges_open(paths, 1, items, 3, 0, &r));
  uint8_t buf[4096];
  uint64_t len = 0;
  ASSERT_OK(opt4_ranges_read(r, 1, buf, sizeof buf, &len));
  ASSERT_U64_EQ(len, 512 + 512 + 4); /* jpg data block, the next header, "PNG!" */
  ASSERT(memcmp(buf + v.members[3].offset, "PNG!", 4) == 0);
  opt4_ranges_close(r);
  opt4_tar_index_close(idx);
  unlink(path);
  free(t.p);
  ASSERT_NO_ENGINE_MEMORY();
}

static void expect_refused(const char *path, const uint8_t *p, size_t n, int code, const char *words) {
  fprintf(stderr, "    refused: %s\n", words);
  write_file(path, p, n);
  opt4_tar_index *idx = NULL;
  ASSERT_ERR(opt4_tar_index_file(path, &idx), code);
  ASSERT(idx == NULL);
  if (strstr(opt4_errdetail(), words) == NULL || strstr(opt4_errdetail(), path) == NULL)
    FAIL_AT("detail '%s' lacks '%s' or the shard's path", opt4_errdetail(), words);
}

static void test_tar_refused(void) {
  char path[128], long_key[200];
  tmp_path(path, sizeof path, "bad.tar");
  tarbuf t = make_shard(long_key, sizeof long_key);
  uint8_t *c = malloc(t.n);
  ASSERT(c != NULL);
  /* A flipped byte in the second header's name. */
  memcpy(c, t.p, t.n);
  c[512 + 3] ^= 0x20;
  expect_refused(path, c, t.n, OPT4_ECHECKSUM, "bad checksum in the header at offset 512");
  /* A size past the end of the file: the member at 512 claims 1 GiB (its checksum made right). */
  memcpy(c, t.p, t.n);
  snprintf((char *)c + 512 + 124, 12, "%011o", 1u << 30);
  memset(c + 512 + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += c[512 + i];
  snprintf((char *)c + 512 + 148, 8, "%06o", sum);
  expect_refused(path, c, t.n, OPT4_ETRUNCATED, "member at offset 512 says 1073741824 bytes, past the end");
  /* A header cut short. */
  expect_refused(path, t.p, 3 * 512 + 100, OPT4_ETRUNCATED, "truncated header at offset 1536");
  /* Not a tar file at all. */
  memset(c, 'x', 1024);
  expect_refused(path, c, 1024, OPT4_ECORRUPT, "bad checksum field in the header at offset 0");
  /* A field twice in one sample. */
  tarbuf d = {NULL, 0};
  tar_member(&d, "s/1.jpg", "a");
  tar_member(&d, "s/1.jpg", "b");
  expect_refused(path, d.p, d.n, OPT4_ECORRUPT, "repeats field 'jpg' of sample 's/1'");
  free(d.p);
  unlink(path);
  free(c);
  free(t.p);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_ranges);
  RUN(test_ranges_hostile_files);
  RUN(test_ranges_checksums);
  RUN(test_tar_index);
  RUN(test_tar_refused);
  return 0;
}
