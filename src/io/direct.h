/*
 * direct.h - reading byte ranges of files, private to the engine: whole
 * preads, O_DIRECT reads through an aligned bounce buffer, and the emulated
 * storage latency. The record file (src/io/records.c) and the byte-range
 * source (src/source/ranges.c) read through these, so there is one way.
 */
#ifndef OPT4_IO_DIRECT_H
#define OPT4_IO_DIRECT_H

#include "internal.h"

#include <sys/types.h>

/* Read exactly len bytes at off (retrying short reads and EINTR). Returns 0,
 * or -1 with errno set (EIO at the end of the file). */
int opt4__pread_full(int fd, void *buf, size_t len, uint64_t off);

/* The alignment O_DIRECT needs for fd (memory and file offset). */
void opt4__dio_alignment(int fd, uint64_t *mem, uint64_t *off);

/* Read n bytes at off from dfd (opened with O_DIRECT) into dst: the aligned
 * blocks that cover them go through a bounce buffer. Returns 0, or -1 with
 * errno set (EIO when the file ends before off + n). */
int opt4__pread_direct(int dfd, uint64_t mem_align, uint64_t off_align, uint64_t off, uint64_t n,
                       uint8_t *dst);

/* What a file that is not a regular one is, for messages: "a FIFO (named
 * pipe)", "a character device", ... */
const char *opt4__file_kind(mode_t mode);

/* Sleep ns nanoseconds (an emulated slow store; EINTR resumes the sleep). */
void opt4__sleep_ns(uint64_t ns);

#endif /* OPT4_IO_DIRECT_H */
