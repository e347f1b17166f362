/* registry.c - the table of online policies, by name. OPT is not here: it is
 * a planning stage of its own (src/plan), which the simulator calls. */
#include "policy.h"

#include <string.h>

static const opt4__policy_ops *const registry[] = {
    &opt4__policy_lru,   &opt4__policy_fifo,   &opt4__policy_lfu,
    &opt4__policy_random, &opt4__policy_clock, &opt4__policy_sieve,
    &opt4__policy_s3fifo, &opt4__policy_arc,   &opt4__policy_static,
    &opt4__policy_freq,
};

/* The public list, in a stable order: the planner's two first, then the
 * registry's. */
static const char *const names[] = {"opt",   "opt-nobypass", "lru",    "fifo",
                                    "lfu",   "random",       "clock",  "sieve",
                                    "s3fifo", "arc",         "static", "freq",
                                    NULL};

const char *const *opt4_policy_names(void) { return names; }

const opt4__policy_ops *opt4__policy_find(const char *name) {
  if (name == NULL) return NULL;
  for (size_t i = 0; i < sizeof registry / sizeof registry[0]; i++)
    if (strcmp(registry[i]->name, name) == 0) return registry[i];
  return NULL;
}

int opt4__policy_open(const char *name, uint64_t capacity, uint64_t items,
                      uint64_t seed, opt4__policy **out) {
  *out = NULL;
  const opt4__policy_ops *ops = opt4__policy_find(name);
  if (ops == NULL)
    return opt4__fail(OPT4_EUNKNOWN_POLICY, "no policy named \"%s\"", name ? name : "(null)");
  if (capacity == 0)
    return opt4__fail(OPT4_ECAPACITY, "capacity is 0: a cache must hold at least one item");
  opt4__policy *p = opt4__calloc(1, sizeof *p);
  if (p == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a policy");
  p->ops = ops;
  /* A cache that holds every id never evicts, whatever its policy, so any
   * larger capacity behaves the same as items; clamping keeps every size and
   * sum below 2^33. */
  p->capacity = capacity < items ? capacity : items;
  p->items = items;
  p->seed = seed;
  int rc = ops->init(p);
  if (rc != 0) {
    opt4__policy_close(p);
    return opt4__fail(rc, "cannot set up policy %s for %llu ids", name,
                      (unsigned long long)items);
  }
  *out = p;
  return 0;
}

void opt4__policy_close(opt4__policy *p) {
  if (p == NULL) return;
  p->ops->destroy(p);
  opt4__free(p, sizeof *p);
}
