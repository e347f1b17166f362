/* fuzz_plan_kinds.c - libFuzzer target for plans of given decisions
 * (opt4_plan_from_kinds): the kinds a node plan gives, which a pool will
 * trust once the engine has taken them. Any input must either give a plan
 * whose decisions are the input's and whose every HIT finds its item where
 * the plan put it (replayed here), or fail with OPT4_EINVAL or
 * OPT4_ECAPACITY and no plan; never crash, leak or read out of bounds.
 *
 * Input: byte 0, the capacity (low 4 bits + 1: items, or pages of a sized
 * plan when bit 7 is set); byte 1, the items (low 5 bits + 1); byte 2, the
 * page size (low 6 bits + 1); for a sized plan one byte per item, its size;
 * then (item, kind) byte pairs (kind mod 4, so 3 is a bad kind). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "opt4.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3) return 0;
  const int sized = (data[0] & 0x80) != 0;
  const uint64_t cap = (uint64_t)(data[0] & 0x0F) + 1, items = (uint64_t)(data[1] & 0x1F) + 1;
  const uint64_t page = (uint64_t)(data[2] & 0x3F) + 1;
  size_t at = 3;
  uint64_t sizes[32];
  if (sized) {
    if (size < at + items) return 0;
    for (uint64_t i = 0; i < items; i++) sizes[i] = data[at + i];
    at += items;
  }
  const size_t T = (size - at) / 2;
  uint32_t *seq = malloc((T ? T : 1) * sizeof *seq);
  uint8_t *kinds = malloc(T ? T : 1);
  if (seq == NULL || kinds == NULL) abort();
  for (size_t t = 0; t < T; t++) {
    seq[t] = (uint32_t)(data[at + 2 * t] % items);
    kinds[t] = (uint8_t)(data[at + 2 * t + 1] % 4);
  }
  opt4_seq s = {seq, OPT4_U32, T, items};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  if (sized) {
    o.item_sizes = sizes;
    o.capacity_bytes = cap * page;
    o.page_size = page;
  } else {
    o.capacity = cap;
  }
  opt4_plan *plan = NULL;
  int rc = opt4_plan_from_kinds(&s, kinds, &o, &plan);
  if (rc == 0) {
    opt4_plan_info in;
    if (plan == NULL || opt4_plan_info_get(plan, &in) != 0) abort();
    const uint32_t *ops = opt4_plan_ops(plan);
    uint64_t hits = 0, admits = 0, bypasses = 0;
    int32_t holds[16]; /* items mode: the item in each slot */
    for (int i = 0; i < 16; i++) holds[i] = -1;
    for (size_t t = 0; t < T; t++) {
      const uint32_t kind = OPT4_OP_KIND(ops[t]), id = OPT4_OP_SLOT(ops[t]);
      if (kind != kinds[t]) abort();
      hits += kind == OPT4_OP_HIT;
      admits += kind == OPT4_OP_ADMIT;
      bypasses += kind == OPT4_OP_BYPASS;
      if (sized || kind == OPT4_OP_BYPASS) continue;
      if (id >= cap) abort();
      if (kind == OPT4_OP_ADMIT) holds[id] = (int32_t)seq[t];
      else if (holds[id] != (int32_t)seq[t]) abort();
    }
    if (hits != in.hits || admits != in.admits || bypasses != in.bypasses || in.slots > cap) abort();
    if (sized)
      for (uint64_t g = 0; g < in.generations; g++) {
        const uint32_t *pages;
        uint64_t n;
        if (opt4_plan_gen_pages(plan, g, &pages, &n) != 0 || n == 0) abort();
        for (uint64_t i = 0; i < n; i++)
          if (pages[i] >= cap) abort();
      }
    opt4_plan_close(plan);
  } else if (plan != NULL || (rc != OPT4_EINVAL && rc != OPT4_ECAPACITY && rc != OPT4_EITEMSIZE)) {
    abort();
  }
  free(seq);
  free(kinds);
  return 0;
}
