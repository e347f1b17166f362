/* test_pool_security.c - the pool's rules about who owns a segment: created
 * 0600 and owned by this user; a name that is taken (a squatter's file or
 * symlink) refused at creation and never opened; a segment of another user,
 * with another mode, or behind a symlink refused at attach; another user's
 * file never listed as a stale pool nor removed; a damaged header refused
 * before anything indexes it. Parts that need a second uid run only as
 * root (chown), and say so when skipped. */
#include "pool_util.h"

#include "check.h"
#include "layout.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define OTHER_UID 65534u /* nobody */

static opt4_pool *make_pool(const opt4_plan *plan) {
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 500};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  return pool;
}

static void shm_path(char *buf, size_t cap, const char *name, const char *suffix) {
  snprintf(buf, cap, "/dev/shm%s%s", name, suffix);
}

/* A name under this user's prefix that no pool uses. */
static void fresh_name(char *buf, size_t cap, const char *tag) {
  char tail[48];
  snprintf(tail, sizeof tail, "%s%08x", tag, (unsigned)(opt4__now_ns() & 0xffffffffu));
  task_pool_name(buf, cap, (int)getpid(), tail);
}

static void test_created_0600_and_ours(void) {
  opt4_plan *plan = random_plan(300, 20, 5, 1);
  opt4_pool *pool = make_pool(plan);
  const char *suffixes[] = {"", ".meta"};
  for (int i = 0; i < 2; i++) {
    char path[128];
    shm_path(path, sizeof path, opt4_pool_name(pool), suffixes[i]);
    struct stat st;
    ASSERT(lstat(path, &st) == 0);
    ASSERT(S_ISREG(st.st_mode));
    ASSERT_EQ(st.st_mode & 0777, 0600);
    ASSERT_EQ(st.st_uid, getuid());
  }
  /* Whatever the umask: it can only clear bits, and creation sets 0600. */
  mode_t old = umask(0277);
  opt4_pool *other = make_pool(plan);
  umask(old);
  char path[128];
  shm_path(path, sizeof path, opt4_pool_name(other), "");
  struct stat st;
  ASSERT(lstat(path, &st) == 0);
  ASSERT_EQ(st.st_mode & 0777, 0600);
  opt4_pool *again = NULL;
  ASSERT_OK(opt4_pool_attach(opt4_pool_name(other), &again));
  opt4_pool_close(again);
  ASSERT_OK(opt4_pool_unlink(other));
  opt4_pool_close(other);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
}

/* Creation never opens a name that exists, file or symlink. */
static void test_squatted_name_refused_at_creation(void) {
  char name[64], path[128];
  fresh_name(name, sizeof name, "sq");
  shm_path(path, sizeof path, name, "");
  int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0666);
  ASSERT(fd >= 0);
  ASSERT(write(fd, "squat", 5) == 5);
  close(fd);
  int out = -1;
  ASSERT_ERR(opt4__segment_create(name, 4096, &out), OPT4_ESHM);
  ASSERT(strstr(opt4_errdetail(), "the name is taken") != NULL);
  ASSERT_EQ(out, -1);
  struct stat st;
  ASSERT(stat(path, &st) == 0);
  ASSERT_EQ(st.st_size, 5); /* untouched: not opened, not sized */
  ASSERT(unlink(path) == 0);

  /* A symlink planted under the name: refused, its target never created. */
  char target[128];
  snprintf(target, sizeof target, "/tmp/opt4-symlink-target-%d", (int)getpid());
  unlink(target);
  ASSERT(symlink(target, path) == 0);
  ASSERT_ERR(opt4__segment_create(name, 4096, &out), OPT4_ESHM);
  ASSERT(strstr(opt4_errdetail(), "symlink") != NULL);
  ASSERT(access(target, F_OK) != 0 && errno == ENOENT);
  ASSERT(unlink(path) == 0);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_attach_refuses_foreign_segments(void) {
  opt4_plan *plan = random_plan(300, 20, 5, 2);
  opt4_pool *pool = make_pool(plan);
  const char *name = opt4_pool_name(pool);
  char path[128];
  shm_path(path, sizeof path, name, "");
  opt4_pool *p = NULL;

  /* Readable or writable by others: not made by this library. */
  ASSERT(chmod(path, 0644) == 0);
  ASSERT_ERR(opt4_pool_attach(name, &p), OPT4_EPOOL);
  ASSERT(strstr(opt4_errdetail(), "mode 644") != NULL);
  ASSERT(p == NULL);
  ASSERT(chmod(path, 0600) == 0);
  ASSERT_OK(opt4_pool_attach(name, &p));
  opt4_pool_close(p);
  p = NULL;

  /* A symlink with a pool's name, pointing at a real pool: not followed. */
  char link_name[64], link_path[128], meta_link[128], meta_path[128];
  fresh_name(link_name, sizeof link_name, "ln");
  shm_path(link_path, sizeof link_path, link_name, "");
  shm_path(meta_link, sizeof meta_link, link_name, ".meta");
  shm_path(meta_path, sizeof meta_path, name, ".meta");
  ASSERT(symlink(path, link_path) == 0);
  ASSERT(symlink(meta_path, meta_link) == 0);
  ASSERT_ERR(opt4_pool_attach(link_name, &p), OPT4_ESHM);
  ASSERT(p == NULL);
  /* ... and removing it removes the links, never what they point at. */
  ASSERT_OK(opt4_pool_remove(link_name, 1));
  struct stat st;
  ASSERT(lstat(link_path, &st) != 0 && lstat(path, &st) == 0 && lstat(meta_path, &st) == 0);

  if (getuid() == 0) {
    /* Owned by another user: refused at attach, and not ours to remove. */
    ASSERT(chown(path, OTHER_UID, OTHER_UID) == 0);
    ASSERT_ERR(opt4_pool_attach(name, &p), OPT4_EPOOL);
    ASSERT(strstr(opt4_errdetail(), "belongs to uid 65534") != NULL);
    ASSERT_ERR(opt4_pool_remove(name, 1), OPT4_EPOOL);
    ASSERT(lstat(path, &st) == 0);
    ASSERT(chown(path, 0, 0) == 0);
  } else {
    fprintf(stderr, "    (not root: the other-uid part is skipped)\n");
  }
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

typedef struct seen {
  const char *name;
  int found;
} seen;

static int visit(void *ctx, const char *name, uint32_t pid, int alive, uint64_t bytes) {
  (void)pid, (void)alive, (void)bytes;
  seen *s = ctx;
  if (strcmp(name, s->name) == 0) s->found = 1;
  return 0;
}

/* Another user's file under this user's prefix is not a pool of ours: not
 * listed (so never swept as stale), and never removed. */
static void test_foreign_file_not_listed_nor_removed(void) {
  if (getuid() != 0) {
    fprintf(stderr, "    (not root: skipped, needs chown)\n");
    return;
  }
  char name[64], path[128];
  fresh_name(name, sizeof name, "fo");
  shm_path(path, sizeof path, name, "");
  int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
  ASSERT(fd >= 0);
  ASSERT(fchown(fd, OTHER_UID, OTHER_UID) == 0);
  close(fd);
  seen s = {name, 0};
  ASSERT_OK(opt4_pool_list(visit, &s));
  ASSERT(!s.found);
  ASSERT_ERR(opt4_pool_remove(name, 0), OPT4_EPOOL);
  ASSERT_ERR(opt4_pool_remove(name, 1), OPT4_EPOOL);
  struct stat st;
  ASSERT(lstat(path, &st) == 0);
  /* The same file, ours: listed, as not alive (no header). */
  ASSERT(chown(path, getuid(), getgid()) == 0);
  ASSERT_OK(opt4_pool_list(visit, &s));
  ASSERT(s.found);
  ASSERT(unlink(path) == 0);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Damaged headers, one field at a time, on copies of a real pool's
 * segments: each refused by the check, which names what is wrong. */
static void test_damaged_headers_refused(void) {
  opt4_plan *plan = random_plan(400, 30, 6, 3);
  opt4_pool_opts o = {.page_size = PAGE, .wait_timeout_ms = 500, .flags = OPT4_POOL_OCCURRENCES, .staging_slots = 2};
  opt4_pool *pool = NULL;
  ASSERT_OK(opt4_pool_create(plan, &o, &pool));
  size_t size = pool->size, msize = pool->meta_size;
  uint8_t *base = malloc(size), *meta = malloc(msize);
  memcpy(base, pool->base, size);
  memcpy(meta, pool->meta, msize);
  uint32_t uid = (uint32_t)getuid();
  ASSERT_OK(opt4__pool_check_header(base, size, meta, msize, uid, "copy"));
  ASSERT_OK(opt4__pool_check_meta(base, size, meta, msize, "copy"));
  ASSERT(((pool_header *)(void *)base)->staging_slots == 2);
  ASSERT_ERR(opt4__pool_check_header(base, size, meta, msize, uid + 1, "copy"), OPT4_EPOOL);
  ASSERT(strstr(opt4_errdetail(), "belongs to uid") != NULL);
  ASSERT_ERR(opt4__pool_check_header(base, size - 64, meta, msize, uid, "copy"), OPT4_EPOOL);
  ASSERT_ERR(opt4__pool_check_header(base, 100, meta, msize, uid, "copy"), OPT4_EPOOL);

  pool_header *h = (pool_header *)(void *)base;
  meta_header *mh = (meta_header *)(void *)meta;
  struct {
    const char *what;
    void *field;
    size_t len;
    uint64_t value;
    const char *says;
  } cases[] = {
      {"magic", h->magic, 1, 'X', "bad magic"},
      {"layout", &h->layout, 4, POOL_LAYOUT + 1, "layout"},
      {"meta layout", &mh->layout, 4, POOL_LAYOUT + 1, "layout"},
      {"procs_off", &h->procs_off, 8, (uint64_t)size, "process records"},
      {"max_procs", &h->max_procs, 4, 0xFFFFFFFFu, "process records"},
      {"states_off", &h->states_off, 8, h->procs_off, "page states"},
      {"pages", &h->pages, 8, h->pages + 1, "out of bounds"},
      {"page_size", &h->page_size, 8, (uint64_t)1 << 62, "pages of"},
      {"failed_off", &h->failed_off, 8, h->failed_off + 3, "bitmap"},
      {"occ_count_off", &h->occ_count_off, 8, (uint64_t)-64, "occurrence"},
      {"payload_off", &h->payload_off, 8, h->payload_off + 4096, "payload"},
      {"generations", &h->generations, 8, h->accesses + 1, "different plans"},
      {"fingerprint", &mh->fingerprint, 8, 12345, "different plans"},
      {"seq_off", &mh->seq_off, 8, (uint64_t)msize - 4, "plan arrays"},
      {"gens_off", &mh->gens_off, 8, (uint64_t)-8, "plan arrays"},
      {"list_len", &mh->list_len, 8, (uint64_t)1 << 61, "plan arrays"},
      {"occ_pos_off", &mh->occ_pos_off, 8, 0, "half an occurrence index"},
      {"gclaim_off", &h->gclaim_off, 8, (uint64_t)size - 4, "generation claims"},
      {"bclaim_off", &h->bclaim_off, 8, 0, "staging slots"},
      {"staging_slots", &h->staging_slots, 8, h->staging_slots + 1, "do not end the segment"},
      {"staging_slot_bytes", &h->staging_slot_bytes, 8, 100, "staging slots"},
      {"staging_off", &h->staging_off, 8, h->staging_off - 4096, "do not end the segment"},
      {"bypasses", &h->bypasses, 8, h->bypasses + 1, "bypasses"},
      {"bpos_off", &mh->bpos_off, 8, (uint64_t)msize, "plan arrays"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t saved[8];
    memcpy(saved, cases[i].field, cases[i].len);
    if (cases[i].len == 1) *(char *)cases[i].field = (char)cases[i].value;
    else if (cases[i].len == 4) { uint32_t v = (uint32_t)cases[i].value; memcpy(cases[i].field, &v, 4); }
    else memcpy(cases[i].field, &cases[i].value, 8);
    int rc = opt4__pool_check_header(base, size, meta, msize, uid, "copy");
    if (rc != OPT4_EPOOL || strstr(opt4_errdetail(), cases[i].says) == NULL)
      FAIL_AT("damaged %s: got %s \"%s\", want OPT4_EPOOL saying \"%s\"", cases[i].what,
              opt4_err_name(rc), opt4_errdetail(), cases[i].says);
    memcpy(cases[i].field, saved, cases[i].len);
  }
  ASSERT_OK(opt4__pool_check_header(base, size, meta, msize, uid, "copy"));

  /* The contents: a generation number past the end, an id out of range, a
   * page outside the pool. */
  uint32_t *rt = (uint32_t *)(void *)(meta + mh->rt_off);
  uint32_t *seq = (uint32_t *)(void *)(meta + mh->seq_off);
  list_ent *le = (list_ent *)(void *)(meta + mh->list_off);
  uint64_t t = 0;
  while (RT_KIND(rt[t]) != OPT4_OP_HIT) t++;
  uint32_t keep = rt[t];
  rt[t] = (OPT4_OP_HIT << 30) | (uint32_t)h->generations;
  ASSERT_ERR(opt4__pool_check_meta(base, size, meta, msize, "copy"), OPT4_EPOOL);
  rt[t] = keep;
  keep = seq[0];
  seq[0] = (uint32_t)h->items;
  ASSERT_ERR(opt4__pool_check_meta(base, size, meta, msize, "copy"), OPT4_EPOOL);
  seq[0] = keep;
  /* A BYPASS whose ordinal does not map back to it. */
  t = 0;
  while (t < h->accesses && RT_KIND(rt[t]) != OPT4_OP_BYPASS) t++;
  ASSERT(t < h->accesses); /* the plan has bypasses, so the pool has staging */
  keep = rt[t];
  rt[t] = keep + 1;
  ASSERT_ERR(opt4__pool_check_meta(base, size, meta, msize, "copy"), OPT4_EPOOL);
  rt[t] = keep;
  keep = le[0].page;
  le[0].page = (uint32_t)h->pages;
  ASSERT_ERR(opt4__pool_check_meta(base, size, meta, msize, "copy"), OPT4_EPOOL);
  le[0].page = keep;
  ASSERT_OK(opt4__pool_check_meta(base, size, meta, msize, "copy"));

  /* The live pool, its header damaged in place: attach refuses it. */
  uint64_t saved_off = pool->h->states_off;
  pool->h->states_off = (uint64_t)size;
  opt4_pool *p = NULL;
  ASSERT_ERR(opt4_pool_attach(opt4_pool_name(pool), &p), OPT4_EPOOL);
  pool->h->states_off = saved_off;
  ASSERT_OK(opt4_pool_attach(opt4_pool_name(pool), &p));
  opt4_pool_close(p);
  free(base);
  free(meta);
  ASSERT_OK(opt4_pool_unlink(pool));
  opt4_pool_close(pool);
  opt4_plan_close(plan);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_created_0600_and_ours);
  RUN(test_squatted_name_refused_at_creation);
  RUN(test_attach_refuses_foreign_segments);
  RUN(test_foreign_file_not_listed_nor_removed);
  RUN(test_damaged_headers_refused);
  ASSERT_NO_ENGINE_MEMORY();
  return 0;
}
