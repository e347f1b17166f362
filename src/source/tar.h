/*
 * tar.h - the tar indexer's core, private: the scan over any reader, so
 * that the fuzzer drives it from memory (tests/fuzz/fuzz_tar_index.c) and
 * opt4_tar_index_file from a file.
 */
#ifndef OPT4_SOURCE_TAR_H
#define OPT4_SOURCE_TAR_H

#include "internal.h"

/* Read exactly n bytes at off into dst; 0 or -1 (errno set). */
typedef int (*opt4__tar_read_fn)(void *ctx, uint64_t off, void *dst, size_t n);

/* Index a shard of file_size bytes read through rd; shard names it in
 * messages. */
int opt4__tar_index_scan(const char *shard, opt4__tar_read_fn rd, void *ctx, uint64_t file_size,
                         opt4_tar_index **out);

#endif /* OPT4_SOURCE_TAR_H */
