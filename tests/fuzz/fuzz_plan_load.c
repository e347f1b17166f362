/* fuzz_plan_load.c - libFuzzer target for the plan-file loader. Any input must
 * either load into a plan whose every HIT is consistent (the loader proves
 * it), or fail with a plan-file error; never crash, leak or read out of
 * bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "opt4.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  opt4_plan *plan = NULL;
  int rc = opt4_plan_load_buffer(data, size, &plan);
  if (rc == 0) {
    opt4_plan_info info;
    if (opt4_plan_info_get(plan, &info) != 0) abort();
    /* Touch everything the loader vouched for. */
    const uint32_t *seq = opt4_plan_seq(plan);
    uint64_t sum = 0;
    for (uint64_t t = 0; t < info.accesses; t++) {
      if (seq[t] >= info.items) abort();
      sum += seq[t];
    }
    if (info.has_ops && info.accesses > 0 && (info.flags & OPT4_PLAN_SIZED)) {
      /* Every generation's pages, and the pages' contents at the end. */
      for (uint64_t g = 0; g < info.generations; g++) {
        const uint32_t *pages;
        uint64_t n;
        if (opt4_plan_gen_pages(plan, g, &pages, &n) != 0 || n == 0) abort();
        for (uint64_t i = 0; i < n; i++)
          if (pages[i] >= info.slots) abort();
      }
      int64_t *slots = malloc((info.slots ? info.slots : 1) * sizeof *slots);
      if (slots == NULL || opt4_plan_slots_at(plan, info.accesses, slots, info.slots) != 0) abort();
      free(slots);
    } else if (info.has_ops && info.accesses > 0) {
      int64_t *v = malloc(info.accesses * sizeof *v);
      if (v == NULL || opt4_plan_victims(plan, v, info.accesses) != 0) abort();
      free(v);
    }
    opt4_plan_close(plan);
    (void)sum;
  } else if (plan != NULL || rc == OPT4_EINVAL) {
    abort();
  }
  return 0;
}
