/*
 * records.c - record files: a dataset of byte records packed in one file,
 * read by index with pread, optionally with O_DIRECT (no page cache).
 *
 * Layout (docs/records.md has it byte by byte):
 *   header (4096 bytes) | records, back to back | index
 * The header gives the count, where the index starts, the file's size and
 * the index's XXH3-64; the index is count entries of (offset u64, length
 * u64, XXH3-64 of the record u64), little-endian. Records are packed with
 * no padding, so the file is the data plus 4 KiB plus 24 bytes a record; a
 * direct read fetches the aligned blocks that cover a record and copies it
 * out. The index comes last so that a writer can stream.
 *
 * The reader validates everything before use (opt4__records_header and
 * _index, fuzzed): magic, version, sizes against the file, the checksums,
 * and every record's bounds. Each read is checked against its record's
 * checksum (XXH3 runs at memory speed, far above any storage), so a file
 * changed in place under a reader is reported, never served; a file
 * shortened under it is named as such. Version 1 files (records at
 * multiples of 4096, no record checksums) are still read.
 */
#define _GNU_SOURCE /* O_DIRECT, statx */
#include "records.h"
#include "direct.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct opt4_records {
  int fd;        /* buffered */
  int dfd;       /* O_DIRECT, or -1 */
  uint64_t count, align, file_size, total_bytes, max_len;
  uint64_t dio_mem_align, dio_off_align;
  uint64_t *index; /* OPT4__REC_FIELDS * count: offset, length, checksum */
  size_t index_bytes;
  uint32_t version;
  uint64_t checksum; /* the header's own XXH3-64 */
  char *path; /* for messages */
  size_t path_bytes;
  /* Counters in a shared anonymous mapping: processes forked after open
   * (DataLoader workers) count into the same place. */
  struct rec_counters *shared;
  char note[160];
};

struct rec_counters {
  _Atomic uint64_t latency_ns;
  _Atomic uint64_t reads, bytes_read;
};

static uint64_t get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Fuzzing builds (OPT4_FUZZING) accept any checksum so that the fuzzer
 * reaches the structural checks behind them; the unit tests cover the
 * checksums. Never set it in a build that reads real files. */
#ifdef OPT4_FUZZING
#define CHECKSUM_MISMATCH(a, b) ((void)(a), (void)(b), 0)
#else
#define CHECKSUM_MISMATCH(a, b) ((a) != (b))
#endif

int opt4__records_header(const uint8_t *buf, size_t len, uint64_t file_size, records_header *out) {
  if (len < OPT4__REC_HEADER_USED || file_size < OPT4__REC_HEADER_SIZE)
    return opt4__fail(OPT4_ETRUNCATED, "record file is %llu bytes, shorter than its header (%u)",
                      (unsigned long long)len, OPT4__REC_HEADER_SIZE);
  if (memcmp(buf, OPT4__REC_MAGIC, 8) != 0)
    return opt4__fail(OPT4_EBADMAGIC, "not an opt4 record file (bad magic)");
  uint32_t version = (uint32_t)buf[8] | (uint32_t)buf[9] << 8 | (uint32_t)buf[10] << 16 |
                     (uint32_t)buf[11] << 24;
  if (version != 1 && version != OPT4__REC_VERSION)
    return opt4__fail(OPT4_EVERSION, "record file version %u; this library reads versions 1 and %u "
                      "(a newer opt4torch wrote it? upgrade, or pack the data again with this one)",
                      version, OPT4__REC_VERSION);
  records_header h;
  h.version = version;
  h.entry = version == 1 ? 16u : 24u;
  h.count = get_le64(buf + 16);
  h.align = get_le64(buf + 24);
  h.index_off = get_le64(buf + 32);
  h.file_size = get_le64(buf + 40);
  h.index_hash = get_le64(buf + 48);
  uint64_t head_hash = get_le64(buf + 56);
  if (CHECKSUM_MISMATCH(opt4__hash64(buf, 56), head_hash))
    return opt4__fail(OPT4_ECHECKSUM, "record file header checksum mismatch (the file is corrupted)");
  if (h.file_size != file_size)
    return opt4__fail(file_size < h.file_size ? OPT4_ETRUNCATED : OPT4_ECORRUPT,
                      "record file is %llu bytes; its header says %llu",
                      (unsigned long long)file_size, (unsigned long long)h.file_size);
  if (version == 1 && (h.align < 512 || h.align > ((uint64_t)1 << 20) || (h.align & (h.align - 1)) != 0))
    return opt4__fail(OPT4_ECORRUPT, "record alignment %llu is not a power of two in [512, 1 MiB]",
                      (unsigned long long)h.align);
  if (version != 1 && h.align != 1)
    return opt4__fail(OPT4_ECORRUPT, "record alignment %llu in a packed record file (must be 1)",
                      (unsigned long long)h.align);
  if (h.index_off < OPT4__REC_HEADER_SIZE || h.index_off > file_size ||
      h.count > (file_size - h.index_off) / h.entry || h.index_off + h.count * h.entry != file_size)
    return opt4__fail(OPT4_ECORRUPT, "record index (%llu entries at %llu) does not end the file",
                      (unsigned long long)h.count, (unsigned long long)h.index_off);
  if (h.count > OPT4_MAX_ITEMS)
    return opt4__fail(OPT4_ETOOBIG, "record file has %llu records; at most %llu are supported",
                      (unsigned long long)h.count, (unsigned long long)OPT4_MAX_ITEMS);
  *out = h;
  return 0;
}

int opt4__records_index(const records_header *h, const uint8_t *buf, size_t len, uint64_t *index,
                        uint64_t *total, uint64_t *max_len) {
  if (len != h->count * h->entry)
    return opt4__fail(OPT4_ETRUNCATED, "record index is %llu bytes; %llu expected",
                      (unsigned long long)len, (unsigned long long)(h->count * h->entry));
  if (CHECKSUM_MISMATCH(opt4__hash64(buf, len), h->index_hash))
    return opt4__fail(OPT4_ECHECKSUM, "record index checksum mismatch (the file is corrupted)");
  uint64_t sum = 0, longest = 0;
  for (uint64_t i = 0; i < h->count; i++) {
    const uint8_t *e = buf + h->entry * i;
    uint64_t off = get_le64(e), n = get_le64(e + 8);
    if (off < OPT4__REC_HEADER_SIZE || off % h->align != 0 || off > h->index_off ||
        n > h->index_off - off)
      return opt4__fail(OPT4_ECORRUPT, "record %llu (%llu bytes at %llu) lies outside the data",
                        (unsigned long long)i, (unsigned long long)n, (unsigned long long)off);
    index[OPT4__REC_FIELDS * i] = off;
    index[OPT4__REC_FIELDS * i + 1] = n;
    index[OPT4__REC_FIELDS * i + 2] = h->entry == 24 ? get_le64(e + 16) : 0;
    sum += n;
    if (n > longest) longest = n;
  }
  *total = sum;
  *max_len = longest;
  return 0;
}

int opt4_records_open(const char *path, uint32_t flags, opt4_records **out) {
  opt4__clear_detail();
  if (path == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "path or out is NULL");
  *out = NULL;
  if (flags & ~(uint32_t)OPT4_RECORDS_DIRECT)
    return opt4__fail(OPT4_EINVAL, "unknown record flags 0x%x", flags);
  uint8_t head[OPT4__REC_HEADER_SIZE];
  uint8_t *ibuf = NULL;
  size_t ibuf_bytes = 0;
  int rc = 0;
  opt4_records *r = opt4__calloc(1, sizeof *r);
  if (r == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a record reader");
  r->dfd = -1;
  r->path_bytes = strlen(path) + 1;
  r->path = opt4__malloc(r->path_bytes);
  if (r->path == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for a record reader");
    goto leave;
  }
  memcpy(r->path, path, r->path_bytes);
  r->shared = mmap(NULL, sizeof *r->shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (r->shared == MAP_FAILED) {
    r->shared = NULL;
    rc = opt4__fail(OPT4_ENOMEM, "no memory for a record reader's counters");
    goto leave;
  }
  r->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (r->fd < 0) {
    rc = opt4__fail(OPT4_EIO, "cannot open record file %s: %s", path, strerror(errno));
    goto leave;
  }
  struct stat st;
  if (fstat(r->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    rc = opt4__fail(OPT4_EIO, "%s is not a regular file", path);
    goto leave;
  }
  size_t head_len = (uint64_t)st.st_size < sizeof head ? (size_t)st.st_size : sizeof head;
  if (opt4__pread_full(r->fd, head, head_len, 0) != 0) {
    rc = opt4__fail(OPT4_EIO, "cannot read %s: %s", path, strerror(errno));
    goto leave;
  }
  records_header h;
  rc = opt4__records_header(head, head_len, (uint64_t)st.st_size, &h);
  if (rc != 0) goto leave;
  r->count = h.count;
  r->align = h.align;
  r->file_size = h.file_size;
  r->version = h.version;
  r->checksum = get_le64(head + 56);
  r->index_bytes = (size_t)(h.count ? h.count * OPT4__REC_FIELDS * 8 : 8);
  r->index = opt4__malloc(r->index_bytes);
  ibuf_bytes = (size_t)(h.count ? h.count * h.entry : 8);
  ibuf = opt4__malloc(ibuf_bytes);
  if (r->index == NULL || ibuf == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for an index of %llu records", (unsigned long long)h.count);
    goto leave;
  }
  if (opt4__pread_full(r->fd, ibuf, (size_t)(h.count * h.entry), h.index_off) != 0) {
    rc = opt4__fail(OPT4_EIO, "cannot read the index of %s: %s", path, strerror(errno));
    goto leave;
  }
  rc = opt4__records_index(&h, ibuf, (size_t)(h.count * h.entry), r->index, &r->total_bytes, &r->max_len);
  if (rc != 0) goto leave;
  if (flags & OPT4_RECORDS_DIRECT) {
    r->dfd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (r->dfd < 0) {
      snprintf(r->note, sizeof r->note, "O_DIRECT refused (%s): buffered reads", strerror(errno));
    } else {
      opt4__dio_alignment(r->dfd, &r->dio_mem_align, &r->dio_off_align);
      /* Some filesystems accept O_DIRECT at open and refuse the reads. */
      uint8_t probe[1];
      if (r->count > 0 && r->index[1] > 0 &&
          opt4__pread_direct(r->dfd, r->dio_mem_align, r->dio_off_align, r->index[0], 1, probe) != 0) {
        snprintf(r->note, sizeof r->note, "O_DIRECT reads fail here (%s): buffered reads",
                 strerror(errno));
        close(r->dfd);
        r->dfd = -1;
      } else {
        snprintf(r->note, sizeof r->note, "O_DIRECT, offset alignment %llu, memory alignment %llu",
                 (unsigned long long)r->dio_off_align, (unsigned long long)r->dio_mem_align);
      }
    }
  } else {
    snprintf(r->note, sizeof r->note, "buffered reads");
  }
  *out = r;
  r = NULL;
leave:
  if (ibuf != NULL) opt4__free(ibuf, ibuf_bytes);
  opt4_records_close(r);
  return rc;
}

void opt4_records_close(opt4_records *r) {
  if (r == NULL) return;
  if (r->fd >= 0) close(r->fd);
  if (r->dfd >= 0) close(r->dfd);
  if (r->index != NULL) opt4__free(r->index, r->index_bytes);
  if (r->shared != NULL) munmap(r->shared, sizeof *r->shared);
  if (r->path != NULL) opt4__free(r->path, r->path_bytes);
  opt4__free(r, sizeof *r);
}

int opt4_records_info_get(const opt4_records *r, opt4_records_info *out) {
  if (r == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "records or out is NULL");
  memset(out, 0, sizeof *out);
  out->count = r->count;
  out->total_bytes = r->total_bytes;
  out->max_len = r->max_len;
  out->file_size = r->file_size;
  out->direct = r->dfd >= 0;
  out->dio_align = r->dfd >= 0 ? r->dio_off_align : 0;
  out->reads = atomic_load(&r->shared->reads);
  out->bytes_read = atomic_load(&r->shared->bytes_read);
  out->latency_ns = atomic_load(&r->shared->latency_ns);
  out->note = r->note;
  out->version = r->version;
  out->checksum = r->checksum;
  return 0;
}

int opt4_records_len(const opt4_records *r, uint64_t i, uint64_t *len) {
  if (r == NULL || len == NULL) return opt4__fail(OPT4_EINVAL, "records or len is NULL");
  if (i >= r->count)
    return opt4__fail(OPT4_ERANGE, "record %llu is outside [0, %llu)", (unsigned long long)i,
                      (unsigned long long)r->count);
  *len = r->index[OPT4__REC_FIELDS * i + 1];
  return 0;
}

void opt4_records_set_latency(opt4_records *r, uint64_t ns) {
  if (r != NULL) atomic_store(&r->shared->latency_ns, ns);
}

int opt4_records_read(opt4_records *r, uint64_t i, void *dst, size_t cap, uint64_t *len) {
  if (r == NULL || len == NULL || (dst == NULL && cap > 0))
    return opt4__fail(OPT4_EINVAL, "records, dst or len is NULL");
  if (i >= r->count)
    return opt4__fail(OPT4_ERANGE, "record %llu is outside [0, %llu)", (unsigned long long)i,
                      (unsigned long long)r->count);
  const uint64_t *ent = &r->index[OPT4__REC_FIELDS * i];
  const uint64_t off = ent[0], n = ent[1];
  *len = n;
  if (n > cap) return opt4__fail(OPT4_EITEMSIZE, "record %llu is %llu bytes; the buffer holds %llu",
                                 (unsigned long long)i, (unsigned long long)n, (unsigned long long)cap);
  uint64_t delay = atomic_load_explicit(&r->shared->latency_ns, memory_order_relaxed);
  if (delay) opt4__sleep_ns(delay); /* emulated storage latency, for benchmarks and tests */
  int rc = n == 0         ? 0
           : r->dfd >= 0 ? opt4__pread_direct(r->dfd, r->dio_mem_align, r->dio_off_align, off, n, dst)
                         : opt4__pread_full(r->fd, dst, (size_t)n, off);
  if (rc != 0) {
    int e = errno;
    struct stat st;
    if (fstat(r->fd, &st) == 0 && (uint64_t)st.st_size < r->file_size)
      return opt4__fail(OPT4_ETRUNCATED, "cannot read record %llu of %s: the file is now %llu bytes, "
                        "shorter than the %llu it had when opened (and than its index says): it was "
                        "truncated or overwritten while open; restore it, or pack it again and reopen it",
                        (unsigned long long)i, r->path, (unsigned long long)st.st_size,
                        (unsigned long long)r->file_size);
    return opt4__fail(OPT4_EIO, "cannot read record %llu of %s: %s", (unsigned long long)i, r->path,
                      strerror(e));
  }
  if (r->version != 1 && CHECKSUM_MISMATCH(opt4__hash64(dst, (size_t)n), ent[2]))
    return opt4__fail(OPT4_ECHECKSUM, "record %llu of %s does not match its checksum: the file was "
                      "changed after it was written (modified in place while open?); nothing was "
                      "returned; restore the file, or pack it again and reopen it",
                      (unsigned long long)i, r->path);
  atomic_fetch_add_explicit(&r->shared->reads, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&r->shared->bytes_read, n, memory_order_relaxed);
  return 0;
}

/* ---- writing ---- */

#define ENTRY 24u /* bytes per index entry in the version written */

struct opt4_records_writer {
  opt4_outfile *out; /* the temporary file, renamed over the path by finish */
  uint64_t *index;
  uint64_t count, cap, pos;
  uint64_t checksum;
  int failed, prepared;
};

int opt4_records_writer_open(const char *path, opt4_records_writer **out) {
  opt4__clear_detail();
  if (path == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "path or out is NULL");
  *out = NULL;
  opt4_records_writer *w = opt4__calloc(1, sizeof *w);
  if (w == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a record writer");
  int rc = opt4_outfile_open(path, OPT4_OUTFILE_NO_SYMLINK, &w->out);
  if (rc != 0) {
    opt4_records_writer_abort(w);
    return rc;
  }
  uint8_t zero[OPT4__REC_HEADER_SIZE];
  memset(zero, 0, sizeof zero);
  rc = opt4_outfile_write(w->out, zero, sizeof zero);
  if (rc != 0) {
    opt4_records_writer_abort(w);
    return rc;
  }
  w->pos = OPT4__REC_HEADER_SIZE;
  *out = w;
  return 0;
}

int opt4_records_writer_add(opt4_records_writer *w, const void *data, size_t len) {
  if (w == NULL || (data == NULL && len > 0)) return opt4__fail(OPT4_EINVAL, "writer or data is NULL");
  if (w->failed) return opt4__fail(OPT4_EIO, "an earlier write failed; abort this writer");
  if (w->prepared) return opt4__fail(OPT4_EINVAL, "the record file is already complete");
  if (w->count >= OPT4_MAX_ITEMS) return opt4__fail(OPT4_ETOOBIG, "too many records");
  if (w->count == w->cap) {
    uint64_t cap = w->cap ? w->cap * 2 : 1024;
    uint64_t *idx = opt4__malloc((size_t)(cap * ENTRY));
    if (idx == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for the record index");
    if (w->index != NULL) {
      memcpy(idx, w->index, (size_t)(w->count * ENTRY));
      opt4__free(w->index, (size_t)(w->cap * ENTRY));
    }
    w->index = idx;
    w->cap = cap;
  }
  int rc = opt4_outfile_write(w->out, data, len);
  if (rc != 0) {
    w->failed = 1;
    return rc;
  }
  uint8_t *e = (uint8_t *)w->index + w->count * ENTRY;
  put_le64(e, w->pos);
  put_le64(e + 8, len);
  put_le64(e + 16, opt4__hash64(data, len));
  w->count++;
  w->pos += len;
  return 0;
}

int opt4_records_writer_prepare(opt4_records_writer *w, uint64_t *checksum) {
  if (w == NULL) return opt4__fail(OPT4_EINVAL, "writer is NULL");
  if (w->failed) return opt4__fail(OPT4_EIO, "an earlier write failed; the record file was not written");
  if (!w->prepared) {
    uint64_t index_off = w->pos;
    int rc = opt4_outfile_write(w->out, w->index, (size_t)(w->count * ENTRY));
    uint8_t head[64];
    memset(head, 0, sizeof head);
    memcpy(head, OPT4__REC_MAGIC, 8);
    head[8] = OPT4__REC_VERSION;
    put_le64(head + 16, w->count);
    put_le64(head + 24, 1); /* packed */
    put_le64(head + 32, index_off);
    put_le64(head + 40, index_off + w->count * ENTRY);
    put_le64(head + 48, opt4__hash64(w->index, (size_t)(w->count * ENTRY)));
    put_le64(head + 56, opt4__hash64(head, 56));
    if (rc == 0) rc = opt4_outfile_pwrite(w->out, head, sizeof head, 0);
    if (rc == 0) rc = opt4_outfile_sync(w->out);
    if (rc != 0) {
      w->failed = 1;
      return rc;
    }
    w->checksum = get_le64(head + 56);
    w->prepared = 1;
  }
  if (checksum != NULL) *checksum = w->checksum;
  return 0;
}

int opt4_records_writer_finish(opt4_records_writer *w) {
  if (w == NULL) return opt4__fail(OPT4_EINVAL, "writer is NULL");
  int rc = opt4_records_writer_prepare(w, NULL);
  if (rc == 0) {
    rc = opt4_outfile_commit(w->out);
    w->out = NULL; /* released by commit, also on failure */
  }
  opt4_records_writer_abort(w);
  return rc;
}

void opt4_records_writer_abort(opt4_records_writer *w) {
  if (w == NULL) return;
  opt4_outfile_abort(w->out);
  if (w->index != NULL) opt4__free(w->index, (size_t)(w->cap * ENTRY));
  opt4__free(w, sizeof *w);
}
