/*
 * gather.c - read units of several pieces: item u of a gather source is
 * pieces first[u] .. first[u+1] - 1 of an inner source, read one after
 * another into one destination, in that order.
 *
 * A Parquet row is decoded from its column chunks' pages, which lie apart in
 * the file (each column's chunk in turn), so the read that yields a page
 * range of rows is several byte ranges (opt4torch.Parquet, through the
 * offset index). The plan is over the units; the inner source (file ranges,
 * object ranges) reads and counts each piece, so its counters say how many
 * preads or GETs the units took and their bytes, which sum to the units'.
 *
 * The lengths are summed once, at create, and checked again at every read:
 * a piece that comes back shorter than its size fails the unit
 * (OPT4_ETRUNCATED), never shifts the pieces after it.
 */
#include "source.h"

#include <string.h>

typedef struct gather {
  opt4_source *inner;
  uint64_t *first; /* n_units + 1 entries: unit u is pieces [first[u], first[u+1]) */
  uint64_t *len;   /* each unit's bytes */
  uint64_t n_units, max_len;
} gather;

static void gather_free(gather *g) {
  if (g == NULL) return;
  opt4_source_close(g->inner);
  opt4__free(g->first, (size_t)(g->n_units + 1) * sizeof *g->first);
  opt4__free(g->len, (size_t)(g->n_units ? g->n_units : 1) * sizeof *g->len);
  opt4__free(g, sizeof *g);
}

static int gather_count(void *state, uint64_t *items) {
  *items = ((const gather *)state)->n_units;
  return 0;
}

static int gather_size_of(void *state, uint64_t item, uint64_t *len) {
  const gather *g = state;
  if (item >= g->n_units) return OPT4_ERANGE;
  *len = g->len[item];
  return 0;
}

static int gather_max_size(void *state, uint64_t *len) {
  *len = ((const gather *)state)->max_len;
  return 0;
}

static int gather_read(gather *g, opt4_source_read *rd) {
  rd->len = g->len[rd->item];
  if (rd->len > rd->cap) return OPT4_EITEMSIZE;
  uint8_t *dst = rd->dst;
  uint64_t at = 0;
  for (uint64_t p = g->first[rd->item]; p < g->first[rd->item + 1]; p++) {
    uint64_t want = 0, got = 0;
    int rc = opt4_source_size_of(g->inner, p, &want);
    if (rc != 0) return rc;
    if (want > rd->len - at)
      return opt4__fail(OPT4_EINVAL, "unit %llu: piece %llu is %llu bytes, past the unit's %llu (the inner "
                        "source's sizes changed since the gather was made)", (unsigned long long)rd->item,
                        (unsigned long long)p, (unsigned long long)want, (unsigned long long)rd->len);
    rc = opt4_source_read_one(g->inner, p, dst + at, (size_t)want, &got);
    if (rc != 0) return rc;
    if (got != want)
      return opt4__fail(OPT4_ETRUNCATED, "unit %llu: piece %llu gave %llu bytes of %llu",
                        (unsigned long long)rd->item, (unsigned long long)p, (unsigned long long)got,
                        (unsigned long long)want);
    at += got;
  }
  return 0;
}

static int gather_submit(void *state, opt4_source_read *reads, size_t n) {
  for (size_t i = 0; i < n; i++) reads[i].status = gather_read(state, &reads[i]);
  return 0;
}

static void gather_close(void *state) { gather_free(state); }

int opt4_source_gather(opt4_source *inner, const uint64_t *first, uint64_t n_units, opt4_source **out) {
  static const opt4_source_ops ops = {
      .version = OPT4_SOURCE_OPS_VERSION,
      .name = "gather",
      .count = gather_count,
      .size_of = gather_size_of,
      .max_size = gather_max_size,
      .submit = gather_submit,
      .close = gather_close,
  };
  opt4__clear_detail();
  int rc = 0;
  gather *g = NULL;
  if (out != NULL) *out = NULL;
  if (inner == NULL || first == NULL || out == NULL) {
    rc = opt4__fail(OPT4_EINVAL, "inner, first or out is NULL");
    goto leave;
  }
  if (n_units >= (uint64_t)SIZE_MAX / sizeof(uint64_t) - 1) {
    rc = opt4__fail(OPT4_ETOOBIG, "%llu units are more than this machine can index", (unsigned long long)n_units);
    goto leave;
  }
  uint64_t pieces = opt4_source_count(inner);
  if (first[0] != 0 || first[n_units] != pieces) {
    rc = opt4__fail(OPT4_EINVAL, "the units must cover the inner source's %llu pieces from 0 (first[0] = %llu, "
                    "first[%llu] = %llu)", (unsigned long long)pieces, (unsigned long long)first[0],
                    (unsigned long long)n_units, (unsigned long long)first[n_units]);
    goto leave;
  }
  g = opt4__calloc(1, sizeof *g);
  if (g == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for a gather source");
    goto leave;
  }
  g->n_units = n_units;
  g->first = opt4__malloc((size_t)(n_units + 1) * sizeof *g->first);
  g->len = opt4__calloc((size_t)(n_units ? n_units : 1), sizeof *g->len);
  if (g->first == NULL || g->len == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for %llu units", (unsigned long long)n_units);
    goto leave;
  }
  memcpy(g->first, first, (size_t)(n_units + 1) * sizeof *first);
  for (uint64_t u = 0; u < n_units; u++) {
    if (first[u + 1] <= first[u]) {
      rc = opt4__fail(OPT4_EINVAL, "unit %llu has no pieces (first[%llu] = %llu, first[%llu] = %llu): each "
                      "unit takes at least one, in order", (unsigned long long)u, (unsigned long long)u,
                      (unsigned long long)first[u], (unsigned long long)(u + 1),
                      (unsigned long long)first[u + 1]);
      goto leave;
    }
    for (uint64_t p = first[u]; p < first[u + 1]; p++) {
      uint64_t n = 0;
      rc = opt4_source_size_of(inner, p, &n);
      if (rc != 0) goto leave;
      if (n > UINT64_MAX / 2 - g->len[u]) {
        rc = opt4__fail(OPT4_ETOOBIG, "unit %llu's pieces sum past 2^63 bytes", (unsigned long long)u);
        goto leave;
      }
      g->len[u] += n;
    }
    if (g->len[u] > g->max_len) g->max_len = g->len[u];
  }
  g->inner = inner;
  inner = NULL;
  return opt4_source_create(&ops, g, out); /* closes g (and inner) when it fails */
leave:
  opt4_source_close(inner);
  if (g != NULL) g->inner = NULL;
  gather_free(g);
  return rc;
}
