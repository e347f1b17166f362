/*
 * check.h - validating a pool's segments before anything indexes them,
 * private to src/shm (and the tests and fuzz targets that include it).
 *
 * A process that attaches trusts nothing it finds in /dev/shm until these
 * checks pass: the segments may be another version's, a half-made pool, a
 * name squatted by someone else, or plain garbage. Both functions take
 * copies or mappings of the segments and their sizes, read only within
 * them, and fail with OPT4_EPOOL and a detail naming the field. They are
 * defined in check.c.
 */
#ifndef OPT4_SHM_CHECK_H
#define OPT4_SHM_CHECK_H

#include <stddef.h>
#include <stdint.h>

/* The headers of both segments: magic, layout version, owner uid, and every
 * region they describe lying inside its segment, aligned, without overlap
 * and without arithmetic overflow. O(1). After it passes, the handle's views
 * (header, records, page states, bitmap, payload; seq, rt, generations,
 * page lists, occurrence index) are all in bounds. name is for messages. */
int opt4__pool_check_header(const void *base, size_t size, const void *meta, size_t msize,
                            uint32_t uid, const char *name);

/* The meta segment's contents, after opt4__pool_check_header passed: every
 * id below items, every generation number below generations and its page
 * list inside the list and the pool's pages, every predecessor an earlier
 * generation, and the occurrence index sorted and in range. O(T + G + L).
 * The runtime indexes with these values, so a pool that passes both checks
 * cannot make it read or write out of bounds. */
int opt4__pool_check_meta(const void *base, size_t size, const void *meta, size_t msize,
                          const char *name);

/* (segment.c) Create a segment: O_CREAT | O_EXCL, mode exactly 0600, sized with
 * posix_fallocate. A name that exists (a squatter's file or symlink) is
 * refused with OPT4_ESHM naming its owner, never opened; a /dev/shm too
 * small fails with OPT4_ENOSPACE. */
int opt4__segment_create(const char *name, uint64_t size, int *fd_out);

#endif /* OPT4_SHM_CHECK_H */
