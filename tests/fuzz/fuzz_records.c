/* fuzz_records.c - libFuzzer target for the record-file parser (header and
 * index checks in src/io/records.c). The input is a file in short: its first
 * 64 bytes are the header (the rest of the 4 KiB header space is zeros) and
 * the remaining bytes are the file's tail, right after the header space.
 * Whatever the bytes, the parser must either accept a file whose every record
 * lies inside the data region, or refuse it with a record-file error; never
 * crash, leak or read out of bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "records.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < OPT4__REC_HEADER_USED) return 0;
  const uint64_t file_size = OPT4__REC_HEADER_SIZE + (size - OPT4__REC_HEADER_USED);
  records_header h;
  int rc = opt4__records_header(data, OPT4__REC_HEADER_USED, file_size, &h);
  if (rc != 0) {
    if (rc >= 0) abort();
    return 0;
  }
  /* The header vouched for the index: it ends the file. */
  if (h.index_off < OPT4__REC_HEADER_SIZE || h.index_off + h.count * h.entry != file_size) abort();
  const uint8_t *index_bytes = data + OPT4__REC_HEADER_USED + (h.index_off - OPT4__REC_HEADER_SIZE);
  uint64_t *index = malloc((size_t)(h.count ? h.count * OPT4__REC_FIELDS * 8 : 8));
  if (index == NULL) return 0;
  uint64_t total = 0, max_len = 0;
  rc = opt4__records_index(&h, index_bytes, (size_t)(h.count * h.entry), index, &total, &max_len);
  if (rc == 0) {
    for (uint64_t i = 0; i < h.count; i++) {
      uint64_t off = index[OPT4__REC_FIELDS * i], n = index[OPT4__REC_FIELDS * i + 1];
      if (off < OPT4__REC_HEADER_SIZE || off % h.align != 0 || off + n > h.index_off || n > max_len) abort();
    }
  }
  free(index);
  return 0;
}
