/*
 * records.h - record files and the prefetcher, private to src/io: the
 * on-disk header, and the parsing steps the fuzzer drives directly.
 */
#ifndef OPT4_IO_RECORDS_H
#define OPT4_IO_RECORDS_H

#include "internal.h"

#define OPT4__REC_MAGIC "OPT4REC\0"
#define OPT4__REC_VERSION 1u
#define OPT4__REC_HEADER_SIZE 4096u /* the header's space in the file */
#define OPT4__REC_HEADER_USED 64u   /* the bytes of it that mean something */
#define OPT4__REC_ALIGN 4096u

typedef struct records_header {
  uint64_t count, align, index_off, file_size, index_hash;
} records_header;

/* Check the header (the first len >= OPT4__REC_HEADER_USED bytes of a file
 * of file_size bytes). */
int opt4__records_header(const uint8_t *buf, size_t len, uint64_t file_size, records_header *out);
/* Check the index (buf, len bytes) against the header; index gets
 * (offset, length) per record, total and max_len the sums. */
int opt4__records_index(const records_header *h, const uint8_t *buf, size_t len, uint64_t *index,
                        uint64_t *total, uint64_t *max_len);

#endif /* OPT4_IO_RECORDS_H */
