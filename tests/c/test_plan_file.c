/* test_plan_file.c - save, open, and refuse every kind of damaged file. */
#include "task.h"

#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/opt4_test_XXXXXX";

static void path_in_dir(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", dir, name);
}

static opt4_plan *make_plan(uint64_t T, uint64_t N, uint64_t C) {
  uint32_t *seq = malloc((T + 1) * sizeof *seq);
  uint64_t rng = T * 31 + N;
  for (uint64_t t = 0; t < T; t++) seq[t] = (uint32_t)(test_rand(&rng) % N);
  opt4_seq s = {seq, OPT4_U32, T, N};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = C;
  opt4_plan *p = NULL;
  ASSERT_OK(opt4_plan_build(&s, &o, &p));
  free(seq);
  return p;
}

static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  ASSERT(f != NULL);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(*len + 1);
  ASSERT(fread(buf, 1, *len, f) == *len);
  fclose(f);
  return buf;
}

static void write_file(const char *path, const uint8_t *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  ASSERT(f != NULL);
  ASSERT(fwrite(buf, 1, len, f) == len);
  fclose(f);
}

static void assert_same(const opt4_plan *a, const opt4_plan *b) {
  opt4_plan_info x, y;
  ASSERT_OK(opt4_plan_info_get(a, &x));
  ASSERT_OK(opt4_plan_info_get(b, &y));
  ASSERT(memcmp(&x, &y, sizeof x) == 0);
  ASSERT(memcmp(opt4_plan_seq(a), opt4_plan_seq(b), x.accesses * 4) == 0);
  if (x.has_ops) ASSERT(memcmp(opt4_plan_ops(a), opt4_plan_ops(b), x.accesses * 4) == 0);
  size_t la, lb;
  const char *da = opt4_plan_desc(a, &la), *db = opt4_plan_desc(b, &lb);
  ASSERT_EQ(la, lb);
  ASSERT(memcmp(da, db, la) == 0);
}

static void test_roundtrip(void) {
  char path[256];
  path_in_dir(path, sizeof path, "a.opt4");
  opt4_plan *p = make_plan(5000, 300, 40);
  const char *desc = "{\"sampler\": \"RandomSampler\", \"seed\": 0}";
  ASSERT_OK(opt4_plan_set_desc(p, desc, strlen(desc)));
  ASSERT_OK(opt4_plan_save(p, path));
  opt4_plan *q = NULL;
  ASSERT_OK(opt4_plan_open(path, &q));
  assert_same(p, q);
  opt4_plan_close(q);
  /* The same bytes load from memory too. */
  size_t len;
  uint8_t *buf = read_file(path, &len);
  ASSERT_OK(opt4_plan_load_buffer(buf, len, &q));
  assert_same(p, q);
  opt4_plan_close(q);
  free(buf);
  /* A sequence-only plan, and an empty one. */
  opt4_seq s = {opt4_plan_seq(p), OPT4_U32, 5000, 300};
  opt4_plan *only = NULL;
  ASSERT_OK(opt4_plan_from_seq(&s, &only));
  ASSERT_OK(opt4_plan_save(only, path));
  ASSERT_OK(opt4_plan_open(path, &q));
  assert_same(only, q);
  opt4_plan_close(q);
  opt4_plan_close(only);
  opt4_plan *empty = make_plan(0, 3, 2);
  ASSERT_OK(opt4_plan_save(empty, path));
  ASSERT_OK(opt4_plan_open(path, &q));
  assert_same(empty, q);
  opt4_plan_close(q);
  opt4_plan_close(empty);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Every prefix of a valid file fails cleanly as truncated (or, when shorter
 * than the magic, as not a plan file). */
static void test_truncations(void) {
  char path[256], cut[256];
  path_in_dir(path, sizeof path, "t.opt4");
  path_in_dir(cut, sizeof cut, "cut.opt4");
  opt4_plan *p = make_plan(300, 50, 7);
  ASSERT_OK(opt4_plan_set_desc(p, "desc", 4));
  ASSERT_OK(opt4_plan_save(p, path));
  opt4_plan_close(p);
  size_t len;
  uint8_t *buf = read_file(path, &len);
  for (size_t n = 0; n < len; n++) {
    opt4_plan *q = NULL;
    int rc = opt4_plan_load_buffer(buf, n, &q);
    if (rc != OPT4_ETRUNCATED && !(n < 8 && rc == OPT4_EBADMAGIC && n == 0))
      FAIL_AT("prefix of %zu bytes: %s (%s)", n, opt4_err_name(rc), opt4_errdetail());
    ASSERT(q == NULL);
  }
  /* Through the file path as well, for a few lengths. */
  size_t lens[] = {0, 5, 100, 128, 200, len / 2, len - 1};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    write_file(cut, buf, lens[i]);
    opt4_plan *q = NULL;
    int rc = opt4_plan_open(cut, &q);
    ASSERT(rc == OPT4_ETRUNCATED || (lens[i] == 0 && rc == OPT4_EBADMAGIC));
  }
  free(buf);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Flip every byte of a small file in turn: each flip is refused with a file
 * error (never accepted, never a crash). */
static void test_corruptions(void) {
  char path[256];
  path_in_dir(path, sizeof path, "c.opt4");
  opt4_plan *p = make_plan(200, 30, 5);
  ASSERT_OK(opt4_plan_set_desc(p, "{}", 2));
  ASSERT_OK(opt4_plan_save(p, path));
  opt4_plan_close(p);
  size_t len;
  uint8_t *buf = read_file(path, &len);
  for (size_t i = 0; i < len; i++) {
    for (int bit = 0; bit < 8; bit += 3) {
      buf[i] ^= (uint8_t)(1u << bit);
      opt4_plan *q = NULL;
      int rc = opt4_plan_load_buffer(buf, len, &q);
      buf[i] ^= (uint8_t)(1u << bit);
      /* Padding bytes between sections carry no meaning and no checksum. */
      if (rc == 0) {
        opt4_plan_close(q);
        continue;
      }
      ASSERT(q == NULL);
      ASSERT(rc == OPT4_ECHECKSUM || rc == OPT4_ECORRUPT || rc == OPT4_EBADMAGIC ||
             rc == OPT4_EVERSION || rc == OPT4_ETRUNCATED);
    }
  }
  /* Flips inside the header or the arrays are always caught. */
  for (size_t i = 0; i < 128; i++) {
    buf[i] ^= 0x10;
    opt4_plan *q = NULL;
    ASSERT(opt4_plan_load_buffer(buf, len, &q) != 0);
    buf[i] ^= 0x10;
  }
  free(buf);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_specific_errors(void) {
  char path[256];
  path_in_dir(path, sizeof path, "e.opt4");
  opt4_plan *p = make_plan(100, 10, 3);
  ASSERT_OK(opt4_plan_save(p, path));
  opt4_plan_close(p);
  size_t len;
  uint8_t *buf = read_file(path, &len);
  opt4_plan *q = NULL;

  uint8_t *copy = malloc(len + 64);
  memcpy(copy, buf, len);
  copy[0] = 0x80; /* a pickle starts with 0x80 */
  ASSERT_ERR(opt4_plan_load_buffer(copy, len, &q), OPT4_EBADMAGIC);

  memcpy(copy, buf, len);
  copy[8] = 2; /* version 2 */
  ASSERT_ERR(opt4_plan_load_buffer(copy, len, &q), OPT4_EVERSION);
  ASSERT(strstr(opt4_errdetail(), "upgrade") != NULL);

  memcpy(copy, buf, len);
  memset(copy + len, 0, 64);
  ASSERT_ERR(opt4_plan_load_buffer(copy, len + 64, &q), OPT4_ECORRUPT);

  memcpy(copy, buf, len);
  copy[len - 1] ^= 1; /* last byte of the ops section */
  ASSERT_ERR(opt4_plan_load_buffer(copy, len, &q), OPT4_ECHECKSUM);

  ASSERT_ERR(opt4_plan_open("/nonexistent/dir/x.opt4", &q), OPT4_EIO);
  ASSERT(strstr(opt4_errdetail(), "No such file") != NULL);
  ASSERT_ERR(opt4_plan_open(dir, &q), OPT4_EIO); /* a directory */
  ASSERT_ERR(opt4_plan_save(NULL, path), OPT4_EINVAL);
  p = make_plan(10, 5, 2);
  ASSERT_ERR(opt4_plan_save(p, "/nonexistent/dir/x.opt4"), OPT4_EIO);
  opt4_plan_close(p);
  free(copy);
  free(buf);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Sized plans through the file: the same plan back, and damage refused. */
static void test_sized_files(void) {
  char path[256];
  path_in_dir(path, sizeof path, "sized.opt4");
  enum { T = 400, N = 40 };
  uint32_t seq[T];
  uint64_t sizes[N], rng = 77;
  for (int t = 0; t < T; t++) seq[t] = (uint32_t)(test_rand(&rng) % N);
  for (int i = 0; i < N; i++) sizes[i] = 1 + test_rand(&rng) % 300;
  opt4_seq s = {seq, OPT4_U32, T, N};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.item_sizes = sizes;
  o.capacity_bytes = 2000;
  o.page_size = 100;
  opt4_plan *p = NULL;
  ASSERT_OK(opt4_plan_build(&s, &o, &p));
  ASSERT_OK(opt4_plan_save(p, path));
  opt4_plan *q = NULL;
  ASSERT_OK(opt4_plan_open(path, &q));
  assert_same(p, q);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(q, &in));
  for (uint64_t g = 0; g < in.generations; g++) {
    const uint32_t *a, *b;
    uint64_t na, nb;
    ASSERT_OK(opt4_plan_gen_pages(p, g, &a, &na));
    ASSERT_OK(opt4_plan_gen_pages(q, g, &b, &nb));
    ASSERT_U64_EQ(na, nb);
    ASSERT(memcmp(a, b, na * 4) == 0);
  }
  ASSERT(memcmp(opt4_plan_item_sizes(q), opt4_plan_item_sizes(p), N * 4) == 0);
  opt4_plan_close(q);
  size_t len;
  uint8_t *buf = read_file(path, &len);
  for (size_t n = 0; n < len; n += 5) {
    ASSERT(opt4_plan_load_buffer(buf, n, &q) != 0);
    ASSERT(q == NULL);
  }
  for (size_t i = 0; i < 128; i++) {
    buf[i] ^= 0x04;
    ASSERT(opt4_plan_load_buffer(buf, len, &q) != 0);
    buf[i] ^= 0x04;
  }
  free(buf);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

/* A failed save leaves an existing file untouched. */
static void test_atomic_save(void) {
  char path[256];
  path_in_dir(path, sizeof path, "keep.opt4");
  opt4_plan *p = make_plan(100, 10, 3);
  ASSERT_OK(opt4_plan_save(p, path));
  size_t len1;
  uint8_t *before = read_file(path, &len1);
  chmod(dir, 0500); /* no new files in the directory */
  int rc = opt4_plan_save(p, path);
  chmod(dir, 0700);
  if (geteuid() != 0) ASSERT_EQ(rc, OPT4_EIO); /* root ignores the mode */
  size_t len2;
  uint8_t *after = read_file(path, &len2);
  ASSERT_EQ(len1, len2);
  ASSERT(memcmp(before, after, len1) == 0);
  free(before);
  free(after);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  ASSERT(mkdtemp(dir) != NULL);
  RUN(test_roundtrip);
  RUN(test_truncations);
  RUN(test_corruptions);
  RUN(test_specific_errors);
  RUN(test_atomic_save);
  RUN(test_sized_files);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ASSERT(system(cmd) == 0);
  return 0;
}
