/* test_plan_given.c - plans of given decisions (opt4_plan_from_kinds): a
 * golden placement, Belady's own kinds given back (in items and in pages),
 * and the errors: a HIT nothing admitted, more live generations than the
 * capacity, a bad kind. */
#include "task.h"

enum { H = OPT4_OP_HIT, A = OPT4_OP_ADMIT, B = OPT4_OP_BYPASS };

static int from_kinds(const uint32_t *seq, uint64_t T, uint64_t items, const uint8_t *kinds,
                      uint64_t capacity, opt4_plan **p) {
  opt4_seq s = {seq, OPT4_U32, T, items};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = capacity;
  return opt4_plan_from_kinds(&s, kinds, &o, p);
}

/* A B A C B C, capacity 2: A takes slot 0 and B slot 1; A's HIT at 2 is
 * its last read, so slot 0 goes back on the free stack; C passes by; B's
 * HIT reads slot 1 and frees it, so C's ADMIT takes slot 1, the top. */
static void test_golden(void) {
  const uint32_t seq[] = {0, 1, 0, 2, 1, 2};
  const uint8_t kinds[] = {A, A, H, B, H, A};
  opt4_plan *p = NULL;
  ASSERT_OK(from_kinds(seq, 6, 3, kinds, 2, &p));
  const uint32_t want[] = {OPT4_OP_MAKE(A, 0), OPT4_OP_MAKE(A, 1), OPT4_OP_MAKE(H, 0),
                           OPT4_OP_MAKE(B, 0), OPT4_OP_MAKE(H, 1), OPT4_OP_MAKE(A, 1)};
  for (int t = 0; t < 6; t++) ASSERT_U64_EQ(opt4_plan_ops(p)[t], want[t]);
  opt4_plan_info in;
  ASSERT_OK(opt4_plan_info_get(p, &in));
  ASSERT_U64_EQ(in.hits, 2);
  ASSERT_U64_EQ(in.admits, 3);
  ASSERT_U64_EQ(in.bypasses, 1);
  ASSERT_U64_EQ(in.compulsory, 3);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Belady's kinds given back: the same kinds and totals, in items and in
 * pages, over random sequences. */
static void test_belady_round_trip(void) {
  enum { T = 4000, N = 150 };
  static uint32_t seq[T];
  static uint8_t kinds[T];
  static uint64_t sizes[N];
  uint64_t rng = 7;
  for (int round = 0; round < 20; round++) {
    for (int t = 0; t < T; t++) seq[t] = (uint32_t)(test_rand(&rng) % (round % 2 ? N : 40));
    for (int i = 0; i < N; i++) sizes[i] = 1 + test_rand(&rng) % 5000;
    opt4_seq s = {seq, OPT4_U32, T, N};
    for (int sized = 0; sized < 2; sized++) {
      opt4_plan_opts o;
      memset(&o, 0, sizeof o);
      if (sized) {
        o.item_sizes = sizes;
        o.capacity_bytes = 1 + test_rand(&rng) % 200000;
        o.page_size = 512;
        if (o.capacity_bytes < 10 * 512) o.capacity_bytes = 10 * 512; /* the largest item fits */
      } else {
        o.capacity = 1 + test_rand(&rng) % 60;
      }
      opt4_plan *bel = NULL, *given = NULL;
      ASSERT_OK(opt4_plan_build(&s, &o, &bel));
      for (int t = 0; t < T; t++) kinds[t] = (uint8_t)OPT4_OP_KIND(opt4_plan_ops(bel)[t]);
      ASSERT_OK(opt4_plan_from_kinds(&s, kinds, &o, &given));
      opt4_plan_info a, b;
      ASSERT_OK(opt4_plan_info_get(bel, &a));
      ASSERT_OK(opt4_plan_info_get(given, &b));
      for (int t = 0; t < T; t++) ASSERT_EQ(OPT4_OP_KIND(opt4_plan_ops(given)[t]), kinds[t]);
      ASSERT_U64_EQ(b.hits, a.hits);
      ASSERT_U64_EQ(b.admits, a.admits);
      ASSERT_U64_EQ(b.bypasses, a.bypasses);
      ASSERT_U64_EQ(b.fingerprint, a.fingerprint);
      ASSERT_U64_EQ(b.capacity, a.capacity);
      ASSERT(b.slots <= a.capacity);
      opt4_plan_close(bel);
      opt4_plan_close(given);
    }
  }
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_errors(void) {
  const uint32_t seq[] = {0, 1, 0, 1};
  opt4_plan *p = NULL;
  const uint8_t hit_first[] = {H, A, A, H};
  ASSERT_ERR(from_kinds(seq, 4, 2, hit_first, 2, &p), OPT4_EINVAL);
  ASSERT(strstr(opt4_errdetail(), "position 0") != NULL);
  ASSERT(p == NULL);
  const uint8_t both_live[] = {A, A, H, H}; /* two generations live at once, one slot */
  ASSERT_ERR(from_kinds(seq, 4, 2, both_live, 1, &p), OPT4_ECAPACITY);
  ASSERT(strstr(opt4_errdetail(), "position 1") != NULL);
  ASSERT_OK(from_kinds(seq, 4, 2, both_live, 2, &p));
  opt4_plan_close(p);
  const uint8_t bad_kind[] = {A, 3, H, B};
  ASSERT_ERR(from_kinds(seq, 4, 2, bad_kind, 2, &p), OPT4_EINVAL);
  ASSERT(strstr(opt4_errdetail(), "position 1") != NULL);
  ASSERT_ERR(from_kinds(seq, 4, 2, NULL, 2, &p), OPT4_EINVAL);
  ASSERT_ERR(from_kinds(seq, 4, 2, both_live, 0, &p), OPT4_ECAPACITY);
  opt4_seq s = {seq, OPT4_U32, 4, 2};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = 2;
  o.flags = OPT4_PLAN_NOBYPASS;
  ASSERT_ERR(opt4_plan_from_kinds(&s, both_live, &o, &p), OPT4_EINVAL);
  o.flags = 0;
  ASSERT_ERR(opt4_plan_from_kinds(&s, both_live, &o, NULL), OPT4_EINVAL);
  /* In pages: two items of 3 pages each do not fit 5. */
  const uint64_t sizes[] = {300, 300};
  memset(&o, 0, sizeof o);
  o.item_sizes = sizes;
  o.capacity_bytes = 500;
  o.page_size = 100;
  ASSERT_ERR(opt4_plan_from_kinds(&s, both_live, &o, &p), OPT4_ECAPACITY);
  o.capacity_bytes = 600;
  ASSERT_OK(opt4_plan_from_kinds(&s, both_live, &o, &p));
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_golden);
  RUN(test_belady_round_trip);
  RUN(test_errors);
  return 0;
}
