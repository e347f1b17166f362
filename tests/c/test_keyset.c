/* test_keyset.c - the hierarchical bitmap against a plain array of flags. */
#include "task.h"

#include "internal.h"
#include "keyset.h"

static void check_universe(uint64_t universe, uint64_t seed) {
  opt4__keyset ks;
  ASSERT_OK(opt4__ks_init(&ks, universe));
  uint8_t *in = calloc(universe, 1);
  uint64_t rng = seed, count = 0;
  for (int step = 0; step < 20000; step++) {
    uint64_t k = test_rand(&rng) % universe;
    switch (test_rand(&rng) % 3) {
    case 0:
      if (!in[k]) {
        opt4__ks_insert(&ks, k);
        in[k] = 1;
        count++;
      }
      break;
    case 1:
      if (in[k]) {
        opt4__ks_remove(&ks, k);
        in[k] = 0;
        count--;
      }
      break;
    default:
      ASSERT_EQ(opt4__ks_take(&ks, k), in[k]);
      if (in[k]) count--;
      in[k] = 0;
    }
    ASSERT_EQ(opt4__ks_empty(&ks), count == 0);
    if (count == 0) continue;
    uint64_t want_max = universe - 1;
    while (!in[want_max]) want_max--;
    ASSERT_U64_EQ(opt4__ks_max(&ks), want_max);
    /* Predecessor of a random point and of the max. */
    uint64_t q = test_rand(&rng) % universe, got = 0;
    for (int i = 0; i < 2; i++, q = want_max) {
      uint64_t want = q;
      int found = 0;
      while (want > 0) {
        want--;
        if (in[want]) {
          found = 1;
          break;
        }
      }
      ASSERT_EQ(opt4__ks_pred(&ks, q, &got), found);
      if (found) ASSERT_U64_EQ(got, want);
    }
  }
  opt4__ks_free(&ks);
  free(in);
}

int main(void) {
  uint64_t universes[] = {1, 2, 63, 64, 65, 4095, 4096, 4097, 300000};
  for (size_t i = 0; i < sizeof universes / sizeof universes[0]; i++)
    check_universe(universes[i], i + 1);
  ASSERT_NO_ENGINE_MEMORY();
  return 0;
}
