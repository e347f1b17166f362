/* test_alloc_fail.c - fail each allocation in turn (the idea of rax's
 * rax_oom_malloc.h): every API call must return OPT4_ENOMEM cleanly, leave its
 * out-parameter NULL and hold no memory afterwards. */
#include "task.h"

#include <unistd.h>

static long countdown = -1; /* fail when it reaches 0; -1 never */
static long calls;

static void *failing_malloc(void *opaque, size_t size) {
  (void)opaque;
  calls++;
  if (countdown >= 0 && countdown-- == 0) return NULL;
  return malloc(size);
}
static void plain_free(void *opaque, void *ptr) {
  (void)opaque;
  free(ptr);
}

typedef int (*scenario)(void);

static uint32_t seq[3000];
static char path[] = "/tmp/opt4_oom_XXXXXX";

static int do_build(void) {
  opt4_seq s = {seq, OPT4_U32, 3000, 100};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = 20;
  opt4_plan *p = NULL;
  int rc = opt4_plan_build(&s, &o, &p);
  if (rc != 0) ASSERT(p == NULL);
  if (rc == 0) {
    int64_t *v = malloc(3000 * sizeof *v);
    rc = opt4_plan_victims(p, v, 3000);
    free(v);
  }
  opt4_plan_close(p);
  return rc;
}

/* A Belady plan's kinds, given back (opt4_plan_from_kinds), in items and
 * in pages. */
static uint8_t kinds[3000];
static uint64_t sizes[100];

static int do_from_kinds(int sized) {
  opt4_seq s = {seq, OPT4_U32, 3000, 100};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  if (sized) {
    o.item_sizes = sizes;
    o.capacity_bytes = 20 * 300;
    o.page_size = 100;
  } else {
    o.capacity = 20;
  }
  opt4_plan *p = NULL;
  int rc = opt4_plan_from_kinds(&s, kinds, &o, &p);
  if (rc != 0) ASSERT(p == NULL);
  opt4_plan_close(p);
  return rc;
}
static int do_from_kinds_items(void) { return do_from_kinds(0); }
static int do_from_kinds_sized(void) { return do_from_kinds(1); }

static int do_open(void) {
  opt4_plan *p = NULL;
  int rc = opt4_plan_open(path, &p);
  if (rc != 0) ASSERT(p == NULL);
  opt4_plan_close(p);
  return rc;
}

static int do_save(void) {
  /* Built without the failing allocator, saved with it. */
  long saved = countdown;
  countdown = -1;
  opt4_seq s = {seq, OPT4_U32, 3000, 100};
  opt4_plan *p = NULL;
  ASSERT_OK(opt4_plan_from_seq(&s, &p));
  countdown = saved;
  int rc = opt4_plan_set_desc(p, "x", 1);
  if (rc == 0) rc = opt4_plan_save(p, path);
  opt4_plan_close(p);
  return rc;
}

/* Every policy, each allocation failing in turn (freq's prepare step
 * included). */
static const char *sim_policy;

static int do_sim(void) {
  opt4_seq s = {seq, OPT4_U32, 3000, 100};
  opt4_sim_result r;
  return opt4_simulate(sim_policy, &s, 10, 0, &r);
}

static int do_fingerprint(void) {
  opt4_seq s = {seq, OPT4_U32, 3000, 100};
  uint64_t fp;
  return opt4_fingerprint(&s, &fp);
}

/* Units of several pieces of a file (opt4_source_gather over ranges). */
static const opt4_range gather_pieces[] = {{0, 0, 10}, {0, 20, 5}, {0, 40, 8}};
static const uint64_t gather_first[] = {0, 2, 3};

static int do_gather(void) {
  const char *paths[] = {path};
  opt4_ranges *r = NULL;
  opt4_source *inner = NULL, *g = NULL;
  int rc = opt4_ranges_open(paths, 1, gather_pieces, 3, 0, &r);
  if (rc == 0) rc = opt4_source_ranges(r, &inner);
  if (rc == 0) {
    rc = opt4_source_gather(inner, gather_first, 2, &g); /* owns inner from here */
    if (rc != 0) ASSERT(g == NULL);
  }
  if (rc == 0) {
    uint8_t buf[32];
    uint64_t len = 0;
    rc = opt4_source_read_one(g, 0, buf, sizeof buf, &len);
    if (rc == 0) ASSERT_U64_EQ(len, 15);
  }
  opt4_source_close(g);
  opt4_ranges_close(r);
  return rc;
}

static void run_scenario(const char *name, scenario fn) {
  opt4_allocator a = {failing_malloc, plain_free, NULL};
  opt4_set_allocator(&a);
  long k = 0;
  for (;; k++) {
    countdown = k;
    calls = 0;
    int rc = fn();
    ASSERT_NO_ENGINE_MEMORY();
    if (countdown >= 0) { /* the k-th allocation was never reached */
      ASSERT_OK(rc);
      break;
    }
    if (rc != OPT4_ENOMEM)
      FAIL_AT("%s: failing allocation %ld gave %s (%s)", name, k, opt4_err_name(rc),
              opt4_errdetail());
  }
  ASSERT(k > 0);
  countdown = -1;
  opt4_set_allocator(NULL);
  fprintf(stderr, "    %s: %ld allocation failures handled\n", name, k);
}

int main(void) {
  uint64_t rng = 1;
  for (int t = 0; t < 3000; t++) seq[t] = (uint32_t)(test_rand(&rng) % 100);
  int fd = mkstemp(path);
  ASSERT(fd >= 0);
  close(fd);
  {
    opt4_seq s = {seq, OPT4_U32, 3000, 100};
    opt4_plan_opts o;
    memset(&o, 0, sizeof o);
    o.capacity = 20;
    opt4_plan *p = NULL;
    ASSERT_OK(opt4_plan_build(&s, &o, &p));
    ASSERT_OK(opt4_plan_set_desc(p, "d", 1));
    ASSERT_OK(opt4_plan_save(p, path));
    for (int t = 0; t < 3000; t++) kinds[t] = (uint8_t)OPT4_OP_KIND(opt4_plan_ops(p)[t]);
    opt4_plan_close(p);
  }
  for (int i = 0; i < 100; i++) sizes[i] = 100 + (uint64_t)(i % 3) * 100; /* 1 to 3 pages */
  run_scenario("build", do_build);
  run_scenario("open", do_open);
  run_scenario("from_kinds", do_from_kinds_items);
  run_scenario("from_kinds_sized", do_from_kinds_sized);
  for (const char *const *p = opt4_policy_names(); *p != NULL; p++) {
    char name[64];
    snprintf(name, sizeof name, "sim_%s", *p);
    sim_policy = *p;
    run_scenario(name, do_sim);
  }
  run_scenario("fingerprint", do_fingerprint);
  run_scenario("save", do_save);
  run_scenario("gather", do_gather);
  unlink(path);
  return 0;
}
