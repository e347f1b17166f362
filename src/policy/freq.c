/* freq.c - the placement NoPFS uses (Dryden et al., "Clairvoyant
 * prefetching for distributed machine learning I/O", SC'21): knowing the
 * whole access sequence, cache the `capacity` ids accessed most often over
 * it, ties broken by the lower id. Each chosen id is loaded at its first
 * access (a miss: every policy here starts cold, so OPT bounds them all) and
 * never evicted; every other id always bypasses.
 *
 * prepare() counts the accesses per id, finds the capacity-th largest count
 * with a four-pass radix select over the 32-bit counts (O(items) time, no
 * sort), and marks the ids above it plus the lowest ids at it. */
#include "policy.h"

#include <string.h>

enum { FREQ_NOT_CHOSEN = 0, FREQ_CHOSEN = 1, FREQ_LOADED = 2 };

typedef struct freq_state {
  uint8_t *mark; /* by id: FREQ_* */
} freq_state;

static int freq_init(opt4__policy *p) {
  freq_state *s = opt4__calloc(1, sizeof *s);
  if (s == NULL) return OPT4_ENOMEM;
  p->state = s;
  s->mark = opt4__calloc((size_t)p->items, 1);
  if (s->mark == NULL) return OPT4_ENOMEM;
  return 0;
}

static void freq_destroy(opt4__policy *p) {
  freq_state *s = p->state;
  if (s == NULL) return;
  opt4__free(s->mark, (size_t)p->items);
  opt4__free(s, sizeof *s);
  p->state = NULL;
}

/* The k-th largest of n counts (1 <= k <= n), and in *ties how many ids
 * holding exactly that count are among the k largest. */
static uint32_t kth_largest(const uint32_t *count, uint64_t n, uint64_t k,
                            uint64_t *ties) {
  uint32_t prefix = 0, mask = 0;
  uint64_t need = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint64_t hist[256];
    memset(hist, 0, sizeof hist);
    for (uint64_t i = 0; i < n; i++)
      if ((count[i] & mask) == prefix) hist[(count[i] >> shift) & 255u]++;
    unsigned b = 255;
    while (hist[b] < need) need -= hist[b--];
    prefix |= (uint32_t)b << shift;
    mask |= 255u << shift;
  }
  *ties = need;
  return prefix;
}

static int freq_prepare(opt4__policy *p, const opt4_seq *seq) {
  freq_state *s = p->state;
  const uint64_t n = p->items;
  int rc = 0;
  uint32_t *count = opt4__calloc((size_t)n, sizeof *count);
  if (count == NULL) return OPT4_ENOMEM;
  enum { CHUNK = 4096 };
  uint32_t buf[CHUNK];
  for (uint64_t base = 0; base < seq->len; base += CHUNK) {
    uint64_t m = seq->len - base < CHUNK ? seq->len - base : CHUNK;
    rc = opt4__seq_to_u32(seq, base, m, buf);
    if (rc != 0) goto leave;
    for (uint64_t i = 0; i < m; i++) count[buf[i]]++;
  }
  uint64_t ties;
  uint32_t k = kth_largest(count, n, p->capacity, &ties);
  for (uint64_t i = 0; i < n; i++) {
    if (count[i] > k || (count[i] == k && ties > 0)) {
      if (count[i] == k) ties--;
      s->mark[i] = FREQ_CHOSEN;
    }
  }
leave:
  opt4__free(count, (size_t)n * sizeof *count);
  return rc;
}

static inline int freq_access(opt4__policy *p, uint32_t id) {
  freq_state *s = p->state;
  uint8_t m = s->mark[id];
  if (m == FREQ_LOADED) return 1;
  if (m == FREQ_CHOSEN) s->mark[id] = FREQ_LOADED;
  return 0;
}

OPT4__POLICY_RUN(freq)

const opt4__policy_ops opt4__policy_freq = {"freq", freq_init, freq_prepare, freq_run,
                                            freq_destroy};
