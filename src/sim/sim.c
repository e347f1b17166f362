/* sim.c - replay a sequence through a policy and count hits. */
#include "policy.h"

#include <string.h>

/* OPT through the planner's decision pass only: the ops land in a scratch
 * array that is freed at once, with no plan object, no copy of the ids and
 * no fingerprint. */
static int simulate_opt(const opt4_seq *seq, uint64_t capacity, uint32_t flags,
                        opt4_sim_result *out) {
  opt4_plan_opts opts;
  memset(&opts, 0, sizeof opts);
  /* Never more than items ids are resident: a larger cache plans the same. */
  opts.capacity = capacity < seq->items ? capacity : seq->items;
  opts.flags = flags;
  if (opts.capacity > OPT4_MAX_CAPACITY)
    return opt4__fail(OPT4_ETOOBIG, "capacity %llu exceeds the planner's limit %llu",
                      (unsigned long long)opts.capacity,
                      (unsigned long long)OPT4_MAX_CAPACITY);
  opt4_plan_info info;
  memset(&info, 0, sizeof info);
  size_t bytes;
  int rc = opt4__mul_size((size_t)seq->len, sizeof(uint32_t), &bytes);
  if (rc != 0) return opt4__fail(rc, "sequence too long");
  uint32_t *ops = opt4__malloc(bytes);
  if (ops == NULL)
    return opt4__fail(OPT4_ENOMEM, "no memory for %llu plan ops",
                      (unsigned long long)seq->len);
  rc = opt4__belady(seq, &opts, ops, &info);
  opt4__free(ops, bytes);
  if (rc != 0) return rc;
  out->accesses = seq->len;
  out->hits = info.hits;
  out->misses = info.misses;
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
  if (p->ops->prepare != NULL) {
    rc = p->ops->prepare(p, seq);
    if (rc == OPT4_ENOMEM)
      rc = opt4__fail(rc, "no memory to prepare policy %s for %llu ids", policy,
                      (unsigned long long)seq->items);
    if (rc != 0) goto leave;
  }
  enum { CHUNK = 4096 };
  uint32_t buf[CHUNK];
  uint64_t hits = 0;
  for (uint64_t base = 0; base < seq->len; base += CHUNK) {
    uint64_t n = seq->len - base < CHUNK ? seq->len - base : CHUNK;
    rc = opt4__seq_to_u32(seq, base, n, buf);
    if (rc != 0) goto leave;
    hits += p->ops->run(p, buf, (size_t)n);
  }
  out->accesses = seq->len;
  out->hits = hits;
  out->misses = seq->len - hits;
leave:
  opt4__policy_close(p);
  return rc;
}
