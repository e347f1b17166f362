/*
 * source.c - the source handle: checks a table, and calls it.
 *
 * The handle adds nothing to a read but the checks a caller's table cannot
 * be trusted to make (an item past the end never reaches it), so a source's
 * submit and reap run as the source wrote them, on the caller's thread.
 */
#include "source.h"

#include <string.h>

int opt4_source_create(const opt4_source_ops *ops, void *state, opt4_source **out) {
  opt4__clear_detail();
  if (ops == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "source ops or out is NULL");
  *out = NULL;
  if (ops->version != OPT4_SOURCE_OPS_VERSION)
    return opt4__fail(OPT4_EINVAL, "source ops version %u; this library takes version %u "
                      "(set ops.version = OPT4_SOURCE_OPS_VERSION and build against this opt4.h)",
                      ops->version, OPT4_SOURCE_OPS_VERSION);
  if (ops->name == NULL || ops->count == NULL || ops->size_of == NULL || ops->submit == NULL)
    return opt4__fail(OPT4_EINVAL, "source ops %s lack %s: name, count, size_of and submit are "
                      "required", ops->name ? ops->name : "(unnamed)",
                      ops->name == NULL ? "a name" : ops->count == NULL ? "count"
                      : ops->size_of == NULL ? "size_of" : "submit");
  int rc = 0;
  opt4_source *src = opt4__calloc(1, sizeof *src);
  if (src == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for a source");
    goto leave;
  }
  src->ops = *ops;
  src->state = state;
  rc = ops->count(state, &src->items);
  if (rc != 0) {
    if (rc > 0) rc = OPT4_EIO;
    opt4__free(src, sizeof *src);
    src = NULL;
    goto leave;
  }
  *out = src;
leave:
  if (rc != 0 && ops->close != NULL) ops->close(state);
  return rc;
}

void opt4_source_close(opt4_source *src) {
  if (src == NULL) return;
  if (src->ops.close != NULL) src->ops.close(src->state);
  opt4__free(src, sizeof *src);
}

const char *opt4_source_name(const opt4_source *src) { return src != NULL ? src->ops.name : NULL; }

uint64_t opt4_source_count(const opt4_source *src) { return src != NULL ? src->items : 0; }

int opt4_source_size_of(opt4_source *src, uint64_t item, uint64_t *len) {
  if (src == NULL || len == NULL) return opt4__fail(OPT4_EINVAL, "source or len is NULL");
  if (item >= src->items)
    return opt4__fail(OPT4_ERANGE, "item %llu is outside [0, %llu) of source %s",
                      (unsigned long long)item, (unsigned long long)src->items, src->ops.name);
  return src->ops.size_of(src->state, item, len);
}

int opt4__source_max_size(opt4_source *src, uint64_t *len) {
  *len = 0;
  if (src->ops.max_size != NULL) return src->ops.max_size(src->state, len);
  for (uint64_t i = 0; i < src->items; i++) {
    uint64_t n = 0;
    int rc = src->ops.size_of(src->state, i, &n);
    if (rc != 0) return rc;
    if (n > *len) *len = n;
  }
  return 0;
}

int opt4_source_submit(opt4_source *src, opt4_source_read *reads, size_t n) {
  if (src == NULL || (reads == NULL && n > 0)) return opt4__fail(OPT4_EINVAL, "source or reads is NULL");
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++) {
    if (reads[i].item >= src->items)
      return opt4__fail(OPT4_ERANGE, "read %zu of the batch asks for item %llu, outside [0, %llu) "
                        "of source %s; no read was started", i, (unsigned long long)reads[i].item,
                        (unsigned long long)src->items, src->ops.name);
    if (reads[i].dst == NULL && reads[i].cap > 0)
      return opt4__fail(OPT4_EINVAL, "read %zu of the batch has no destination; no read was started",
                        i);
    reads[i].len = 0;
    reads[i].status = OPT4_SOURCE_PENDING;
  }
  int rc = src->ops.submit(src->state, reads, n);
  if (rc > 0) rc = OPT4_EIO;
  return rc;
}

int opt4_source_reap(opt4_source *src, opt4_source_read *reads, size_t n, uint64_t timeout_ns) {
  if (src == NULL || (reads == NULL && n > 0)) return opt4__fail(OPT4_EINVAL, "source or reads is NULL");
  /* With a reap, it is always called: a source may complete reads on other
   * threads, and reap is where their results are handed to the caller (a
   * read's status must not be looked at before). Without one, submit has
   * completed every read on this thread. */
  if (src->ops.reap == NULL) {
    size_t pending = 0;
    for (size_t i = 0; i < n; i++) pending += reads[i].status == OPT4_SOURCE_PENDING;
    if (pending == 0) return 0;
    return opt4__fail(OPT4_EINVAL, "source %s left %zu reads pending and has no reap", src->ops.name,
                      pending);
  }
  int rc = src->ops.reap(src->state, reads, n, timeout_ns);
  return rc > 0 ? OPT4_EIO : rc;
}

int opt4_source_read_one(opt4_source *src, uint64_t item, void *dst, size_t cap, uint64_t *len) {
  if (len == NULL) return opt4__fail(OPT4_EINVAL, "len is NULL");
  opt4_source_read rd;
  memset(&rd, 0, sizeof rd);
  rd.item = item;
  rd.dst = dst;
  rd.cap = cap;
  int rc = opt4_source_submit(src, &rd, 1);
  if (rc == 0) rc = opt4_source_reap(src, &rd, 1, 0);
  *len = rd.len;
  if (rc != 0) return rc;
  return rd.status;
}

/* ---- per-item checksums (XXH3-64, the record file's), for the in-place readers ---- */

int opt4__item_sums_set(uint64_t **dst, uint64_t count, const uint64_t *sums, uint64_t n) {
  if (dst == NULL || (sums == NULL && n > 0)) return opt4__fail(OPT4_EINVAL, "reader or sums is NULL");
  if (n != count)
    return opt4__fail(OPT4_EINVAL, "%llu checksums for %llu items: give one an item", (unsigned long long)n,
                      (unsigned long long)count);
  if (*dst != NULL) return opt4__fail(OPT4_EINVAL, "the items' checksums are already set");
  uint64_t *v = opt4__malloc(count ? (size_t)count * sizeof *v : 1);
  if (v == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for %llu checksums", (unsigned long long)count);
  if (count) memcpy(v, sums, (size_t)count * sizeof *v);
  *dst = v;
  return 0;
}

void opt4__item_sums_free(uint64_t *sums, uint64_t count) {
  if (sums != NULL) opt4__free(sums, count ? (size_t)count * sizeof *sums : 1);
}

int opt4__item_sum_check(const uint64_t *sums, uint64_t i, const void *data, uint64_t len, const char *where) {
  if (sums == NULL) return 0;
  uint64_t got = opt4__hash64(data, (size_t)len);
  if (got == sums[i]) return 0;
  return opt4__fail(OPT4_ECHECKSUM, "item %llu (%llu bytes of %s) does not match the checksum recorded when it "
                    "was indexed (XXH3-64 %016llx, now %016llx): its bytes changed since, in place or by a "
                    "replacement its identity did not show; nothing was returned; make the dataset again (it "
                    "indexes and checksums the files anew)", (unsigned long long)i, (unsigned long long)len, where,
                    (unsigned long long)sums[i], (unsigned long long)got);
}
