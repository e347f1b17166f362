/*
 * records.c - the record file as a source (src/io/records.c reads it).
 *
 * Reads are blocking preads, so submit completes each read and there is no
 * reap. The state is the caller's opt4_records, borrowed: it counts reads
 * and bytes in opt4_records_info, across the processes forked after it was
 * opened, as before sources existed.
 */
#include "source.h"

static int rec_count(void *state, uint64_t *items) {
  opt4_records_info ri;
  int rc = opt4_records_info_get(state, &ri);
  if (rc == 0) *items = ri.count;
  return rc;
}

static int rec_size_of(void *state, uint64_t item, uint64_t *len) {
  return opt4_records_len(state, item, len);
}

static int rec_max_size(void *state, uint64_t *len) {
  opt4_records_info ri;
  int rc = opt4_records_info_get(state, &ri);
  if (rc == 0) *len = ri.max_len;
  return rc;
}

static int rec_submit(void *state, opt4_source_read *reads, size_t n) {
  for (size_t i = 0; i < n; i++)
    reads[i].status = opt4_records_read(state, reads[i].item, reads[i].dst, reads[i].cap, &reads[i].len);
  return 0;
}

const opt4_source_ops opt4__source_records_ops = {
    .version = OPT4_SOURCE_OPS_VERSION,
    .name = "records",
    .count = rec_count,
    .size_of = rec_size_of,
    .max_size = rec_max_size,
    .submit = rec_submit,
};

int opt4_source_records(opt4_records *r, opt4_source **out) {
  opt4__clear_detail();
  if (r == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "records or out is NULL");
  return opt4_source_create(&opt4__source_records_ops, r, out);
}
