/*
 * source.h - sources, private to the engine: the handle behind the public
 * opt4_source, and the tables the library ships (one file each).
 *
 * A source is a table of functions (opt4_source_ops, public: a C user can
 * write one) and a state pointer, the shape of the cache policies
 * (src/policy/policy.h). The handle keeps a copy of the table, so a caller's
 * table may be temporary, and the item count, read once.
 */
#ifndef OPT4_SOURCE_H
#define OPT4_SOURCE_H

#include "internal.h"

struct opt4_source {
  opt4_source_ops ops;
  void *state;
  uint64_t items;
};

/* The record file (records.c); state is an opt4_records *, borrowed. */
extern const opt4_source_ops opt4__source_records_ops;
/* Byte ranges of files (ranges.c); state is an opt4_ranges *, borrowed. */
extern const opt4_source_ops opt4__source_ranges_ops;

/* Objects of an S3-compatible store (s3.c); state is an opt4_s3 *, borrowed. */
extern const opt4_source_ops opt4__source_s3_ops;

/* One GET of a byte range, to be signed with AWS Signature Version 4 (s3.c):
 * the Authorization header's value into auth. path is URI-encoded as sent;
 * amz_date is YYYYMMDDTHHMMSSZ; payload_sha256 NULL: the empty body's. */
typedef struct opt4__sigv4_request {
  const char *host, *path, *range, *amz_date, *region;
  const char *access_key, *secret_key, *session_token, *payload_sha256;
  const char *query; /* the canonical query string (sorted, encoded); NULL: none */
} opt4__sigv4_request;
int opt4__sigv4_get(const opt4__sigv4_request *q, char *auth, size_t cap);

/* Per-item checksums, the record file's XXH3-64 (opt4__hash64), recorded when
 * a dataset read in place is indexed and checked on every read from storage
 * (ranges.c, s3.c): one mechanism for both readers. _set copies n sums into
 * *dst (n must be count; once only); _check returns 0 when sums is NULL or
 * item i's bytes hash to sums[i], else OPT4_ECHECKSUM naming the item and
 * where its bytes are. */
int opt4__item_sums_set(uint64_t **dst, uint64_t count, const uint64_t *sums, uint64_t n);
void opt4__item_sums_free(uint64_t *sums, uint64_t count);
int opt4__item_sum_check(const uint64_t *sums, uint64_t i, const void *data, uint64_t len, const char *where);

/* The largest item's length: ops.max_size, else the largest size_of. */
int opt4__source_max_size(opt4_source *src, uint64_t *len);

#endif /* OPT4_SOURCE_H */
