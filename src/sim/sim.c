/* sim.c - replay a sequence through a policy and count hits. */
#include "policy.h"

#include <string.h>

static int simulate_opt(const opt4_seq *seq, uint64_t capacity, uint32_t flags,
                        opt4_sim_result *out) {
  opt4_plan_opts opts;
  memset(&opts, 0, sizeof opts);
  opts.capacity = capacity;
  opts.flags = flags;
  opt4_plan *plan = NULL;
  int rc = opt4_plan_build(seq, &opts, &plan);
  if (rc != 0) return rc;
  out->accesses = plan->info.accesses;
  out->hits = plan->info.hits;
  out->misses = plan->info.misses;
  opt4_plan_close(plan);
  return 0;
}

int opt4_simulate(const char *policy, const opt4_seq *seq, uint64_t capacity,
                  uint64_t seed, opt4_sim_result *out) {
  opt4__clear_detail();
  if (policy == NULL || out == NULL)
    return opt4__fail(OPT4_EINVAL, "policy or out is NULL");
  int rc = opt4__seq_check(seq);
  if (rc != 0) return rc;
  if (capacity == 0)
    return opt4__fail(OPT4_ECAPACITY, "capacity is 0: a cache must hold at least one item");
  memset(out, 0, sizeof *out);
  if (strcmp(policy, "opt") == 0) return simulate_opt(seq, capacity, 0, out);
  if (strcmp(policy, "opt-nobypass") == 0)
    return simulate_opt(seq, capacity, OPT4_PLAN_NOBYPASS, out);

  opt4__policy *p = NULL;
  rc = opt4__policy_open(policy, capacity, seq->items, seed, &p);
  if (rc != 0) return rc;
  enum { CHUNK = 4096 };
  uint32_t buf[CHUNK];
  uint64_t hits = 0;
  int (*access)(opt4__policy *, uint32_t) = p->ops->access;
  for (uint64_t base = 0; base < seq->len; base += CHUNK) {
    uint64_t n = seq->len - base < CHUNK ? seq->len - base : CHUNK;
    rc = opt4__seq_to_u32(seq, base, n, buf);
    if (rc != 0) break;
    for (uint64_t i = 0; i < n; i++) hits += (uint64_t)access(p, buf[i]);
  }
  opt4__policy_close(p);
  if (rc != 0) return rc;
  out->accesses = seq->len;
  out->hits = hits;
  out->misses = seq->len - hits;
  return 0;
}
