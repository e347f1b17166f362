/*
 * records.h - record files and the prefetcher, private to src/io: the
 * on-disk header, and the parsing steps the fuzzer drives directly.
 */
#ifndef OPT4_IO_RECORDS_H
#define OPT4_IO_RECORDS_H

#include "internal.h"

#define OPT4__REC_MAGIC "OPT4REC\0"
/* Version 2 (written): records packed back to back, index entries of 24
 * bytes with each record's XXH3-64. Version 1 (still read): records at
 * multiples of 4096, 16-byte entries, no record checksums. */
#define OPT4__REC_VERSION 2u
#define OPT4__REC_HEADER_SIZE 4096u /* the header's space in the file */
#define OPT4__REC_HEADER_USED 64u   /* the bytes of it that mean something */

typedef struct records_header {
  uint64_t count, align, index_off, file_size, index_hash;
  uint32_t version;
  uint32_t entry; /* bytes per index entry: 16 (v1) or 24 (v2) */
} records_header;

/* The index in memory: per record its offset, length and checksum (0 and
 * unchecked in version 1 files). */
#define OPT4__REC_FIELDS 3u

/* Check the header (the first len >= OPT4__REC_HEADER_USED bytes of a file
 * of file_size bytes). */
int opt4__records_header(const uint8_t *buf, size_t len, uint64_t file_size, records_header *out);
/* Check the index (buf, len bytes) against the header; index gets
 * OPT4__REC_FIELDS words per record (offset, length, checksum), total and
 * max_len the sums. */
int opt4__records_index(const records_header *h, const uint8_t *buf, size_t len, uint64_t *index,
                        uint64_t *total, uint64_t *max_len);

#endif /* OPT4_IO_RECORDS_H */
