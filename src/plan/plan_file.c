/*
 * plan_file.c - the versioned binary plan file (docs/plan-format.md).
 *
 * Layout, all integers little-endian:
 *   header (128 bytes) | section table (32 bytes per section) | sections,
 * each section starting on a 64-byte boundary. The header checksum covers the
 * header's first 120 bytes and the table; each section has its own checksum.
 *
 * The loader trusts nothing: every field is checked against the file size
 * before it is used, and the ops are replayed to prove that each HIT finds its
 * id in its slot, so a plan that opens can be followed by the runtime without
 * further checks. Nothing is ever unpickled or executed.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "opt4 plan files are little-endian; this engine supports little-endian hosts only"
#endif

/* Fuzzing builds (OPT4_FUZZING, set by -DOPT4_BUILD_FUZZ=ON) accept any
 * checksum so that the fuzzer reaches the structural checks behind them; the
 * checksum paths themselves are covered by the unit tests. Never set this in
 * a build that reads real files. */
#ifdef OPT4_FUZZING
#define CHECKSUM_MISMATCH(a, b) ((void)(a), (void)(b), 0)
#else
#define CHECKSUM_MISMATCH(a, b) ((a) != (b))
#endif

#define PF_MAGIC "OPT4PLAN"
#define PF_VERSION 1u
#define PF_HEADER_SIZE 128u
#define PF_ENTRY_SIZE 32u
#define PF_MAX_SECTIONS 16u
#define PF_ALIGN 64u
#define PF_CHECKSUM_AT 120u

enum { SEC_SEQ = 1, SEC_OPS = 2, SEC_DESC = 3, SEC_GENS = 4, SEC_PAGES = 5, SEC_SIZES = 6, SEC_KINDS };
#define SEC_REQUIRED 0x1u /* a reader that does not know the kind must refuse */

/* Header field offsets. */
enum {
  H_MAGIC = 0,
  H_VERSION = 8,
  H_HEADER_SIZE = 12,
  H_FILE_SIZE = 16,
  H_ITEMS = 24,
  H_ACCESSES = 32,
  H_CAPACITY = 40,
  H_FLAGS = 48,
  H_SECTIONS = 52,
  H_FINGERPRINT = 56,
  H_HITS = 64,
  H_ADMITS = 72,
  H_BYPASSES = 80,
  H_COMPULSORY = 88,
  H_TABLE = 96,
  H_CAPACITY_BYTES = 104, /* sized plans; zero otherwise */
  H_PAGE_SIZE = 112       /* sized plans; zero otherwise */
};

static uint32_t rd32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t rd64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static uint64_t align_up(uint64_t v) { return (v + PF_ALIGN - 1) / PF_ALIGN * PF_ALIGN; }

/* XXH3 over the header's first 120 bytes followed by the section table. Both
 * fit in a small stack buffer, so checking a file allocates nothing here. */
static uint64_t header_checksum(const uint8_t *base, uint32_t n_sections) {
  uint8_t buf[PF_CHECKSUM_AT + PF_MAX_SECTIONS * PF_ENTRY_SIZE];
  size_t table = (size_t)n_sections * PF_ENTRY_SIZE;
  memcpy(buf, base, PF_CHECKSUM_AT);
  memcpy(buf + PF_CHECKSUM_AT, base + PF_HEADER_SIZE, table);
  return opt4__hash64(buf, PF_CHECKSUM_AT + table);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct section {
  uint32_t kind;
  const void *data;
  uint64_t len;
  uint64_t offset;
} section;

int opt4_plan_save(const opt4_plan *plan, const char *path) {
  opt4__clear_detail();
  if (plan == NULL || path == NULL)
    return opt4__fail(OPT4_EINVAL, "plan or path is NULL");
  const opt4_plan_info *in = &plan->info;
  section secs[6];
  uint32_t n = 0;
  uint64_t arr = in->accesses * sizeof(uint32_t);
  secs[n++] = (section){SEC_SEQ, plan->seq, arr, 0};
  if (in->has_ops) secs[n++] = (section){SEC_OPS, plan->ops, arr, 0};
  if (plan->desc_len > 0) secs[n++] = (section){SEC_DESC, plan->desc, plan->desc_len, 0};
  if (in->flags & OPT4_PLAN_SIZED) {
    secs[n++] = (section){SEC_GENS, plan->gen_off, (in->generations + 1) * 8, 0};
    secs[n++] = (section){SEC_PAGES, plan->pages, plan->pages_len * 4, 0};
    secs[n++] = (section){SEC_SIZES, plan->sizes, in->items * 4, 0};
  }

  uint8_t head[PF_HEADER_SIZE + PF_MAX_SECTIONS * PF_ENTRY_SIZE];
  memset(head, 0, sizeof head);
  uint64_t off = align_up(PF_HEADER_SIZE + (uint64_t)n * PF_ENTRY_SIZE);
  for (uint32_t i = 0; i < n; i++) {
    secs[i].offset = off;
    off = align_up(off + secs[i].len);
  }
  uint64_t file_size = secs[n - 1].offset + secs[n - 1].len;

  memcpy(head + H_MAGIC, PF_MAGIC, 8);
  wr32(head + H_VERSION, PF_VERSION);
  wr32(head + H_HEADER_SIZE, PF_HEADER_SIZE);
  wr64(head + H_FILE_SIZE, file_size);
  wr64(head + H_ITEMS, in->items);
  wr64(head + H_ACCESSES, in->accesses);
  wr64(head + H_CAPACITY, in->has_ops ? in->capacity : 0);
  wr32(head + H_FLAGS, in->flags);
  wr32(head + H_SECTIONS, n);
  wr64(head + H_FINGERPRINT, in->fingerprint);
  wr64(head + H_HITS, in->hits);
  wr64(head + H_ADMITS, in->admits);
  wr64(head + H_BYPASSES, in->bypasses);
  wr64(head + H_COMPULSORY, in->compulsory);
  wr64(head + H_TABLE, PF_HEADER_SIZE);
  wr64(head + H_CAPACITY_BYTES, in->capacity_bytes);
  wr64(head + H_PAGE_SIZE, in->page_size);
  for (uint32_t i = 0; i < n; i++) {
    uint8_t *e = head + PF_HEADER_SIZE + i * PF_ENTRY_SIZE;
    wr32(e, secs[i].kind);
    wr32(e + 4, secs[i].kind == SEC_DESC ? 0 : SEC_REQUIRED);
    wr64(e + 8, secs[i].offset);
    wr64(e + 16, secs[i].len);
    wr64(e + 24, opt4__hash64(secs[i].data, (size_t)secs[i].len));
  }
  wr64(head + PF_CHECKSUM_AT, header_checksum(head, n));

  /* opt4_outfile: a temporary file beside the target, renamed over it once
   * complete, so a crash or a full disk never leaves a half-written plan under
   * path, and a target that is not a regular file is refused first. */
  opt4_outfile *f = NULL;
  int rc = opt4_outfile_open(path, 0, &f);
  if (rc != 0) return rc;
  static const uint8_t zeros[PF_ALIGN];
  /* The header, the table and the zero padding up to the first section all
   * fit in head (at most 6 sections). */
  uint64_t pos = secs[0].offset;
  rc = opt4_outfile_write(f, head, (size_t)pos);
  for (uint32_t i = 0; i < n && rc == 0; i++) {
    if (secs[i].offset > pos) rc = opt4_outfile_write(f, zeros, (size_t)(secs[i].offset - pos));
    if (rc == 0) rc = opt4_outfile_write(f, secs[i].data, (size_t)secs[i].len);
    pos = secs[i].offset + secs[i].len;
  }
  if (rc != 0) {
    opt4_outfile_abort(f);
    return rc;
  }
  return opt4_outfile_commit(f);
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                   */
/* ------------------------------------------------------------------------ */

static int validate(const uint8_t *base, size_t len, opt4_plan *plan) {
  if (len < 8 || memcmp(base, PF_MAGIC, 8) != 0) {
    if (len < 8 && memcmp(base, PF_MAGIC, len) == 0)
      return opt4__fail(OPT4_ETRUNCATED, "the file is %zu bytes, shorter than "
                        "the %u-byte header", len, PF_HEADER_SIZE);
    return opt4__fail(OPT4_EBADMAGIC, "the file does not start with \"%s\"",
                      PF_MAGIC);
  }
  if (len < PF_HEADER_SIZE)
    return opt4__fail(OPT4_ETRUNCATED, "the file is %zu bytes, shorter than the "
                      "%u-byte header", len, PF_HEADER_SIZE);
  uint32_t version = rd32(base + H_VERSION);
  if (version > PF_VERSION)
    return opt4__fail(OPT4_EVERSION, "the file is format version %u; this "
                      "library reads version %u: upgrade opt4torch", version,
                      PF_VERSION);
  if (version == 0)
    return opt4__fail(OPT4_ECORRUPT, "format version is 0");
  if (rd32(base + H_HEADER_SIZE) != PF_HEADER_SIZE)
    return opt4__fail(OPT4_ECORRUPT, "header_size is %u, expected %u",
                      rd32(base + H_HEADER_SIZE), PF_HEADER_SIZE);
  uint64_t file_size = rd64(base + H_FILE_SIZE);
  if (file_size > len)
    return opt4__fail(OPT4_ETRUNCATED, "the header says %llu bytes but the file "
                      "has %zu", (unsigned long long)file_size, len);
  if (file_size < len)
    return opt4__fail(OPT4_ECORRUPT, "the header says %llu bytes but the file "
                      "has %zu (trailing data)", (unsigned long long)file_size, len);
  uint32_t n_sec = rd32(base + H_SECTIONS);
  if (n_sec == 0 || n_sec > PF_MAX_SECTIONS)
    return opt4__fail(OPT4_ECORRUPT, "section_count is %u (1 to %u allowed)",
                      n_sec, PF_MAX_SECTIONS);
  if (rd64(base + H_TABLE) != PF_HEADER_SIZE)
    return opt4__fail(OPT4_ECORRUPT, "section table offset is %llu, expected %u",
                      (unsigned long long)rd64(base + H_TABLE), PF_HEADER_SIZE);
  uint64_t table_end = PF_HEADER_SIZE + (uint64_t)n_sec * PF_ENTRY_SIZE;
  if (table_end > len)
    return opt4__fail(OPT4_ETRUNCATED, "the section table ends at byte %llu, "
                      "past the end of the file (%zu)",
                      (unsigned long long)table_end, len);
  if (CHECKSUM_MISMATCH(header_checksum(base, n_sec), rd64(base + PF_CHECKSUM_AT)))
    return opt4__fail(OPT4_ECHECKSUM, "the header checksum does not match");

  opt4_plan_info *in = &plan->info;
  in->items = rd64(base + H_ITEMS);
  in->accesses = rd64(base + H_ACCESSES);
  in->capacity = rd64(base + H_CAPACITY);
  in->flags = rd32(base + H_FLAGS);
  in->fingerprint = rd64(base + H_FINGERPRINT);
  in->hits = rd64(base + H_HITS);
  in->admits = rd64(base + H_ADMITS);
  in->bypasses = rd64(base + H_BYPASSES);
  in->misses = in->admits + in->bypasses;
  in->compulsory = rd64(base + H_COMPULSORY);
  in->has_ops = in->capacity > 0;
  in->slots = opt4__slot_count(in);
  if (in->items == 0 || in->items > OPT4_MAX_ITEMS)
    return opt4__fail(OPT4_ECORRUPT, "items is %llu (1 to %llu allowed)",
                      (unsigned long long)in->items,
                      (unsigned long long)OPT4_MAX_ITEMS);
  if (in->accesses > OPT4_MAX_ACCESSES)
    return opt4__fail(OPT4_ECORRUPT, "accesses is %llu (at most %llu)",
                      (unsigned long long)in->accesses,
                      (unsigned long long)OPT4_MAX_ACCESSES);
  if (in->capacity > OPT4_MAX_CAPACITY)
    return opt4__fail(OPT4_ECORRUPT, "capacity is %llu (at most %llu)",
                      (unsigned long long)in->capacity,
                      (unsigned long long)OPT4_MAX_CAPACITY);
  if (in->flags & ~(uint32_t)(OPT4_PLAN_NOBYPASS | OPT4_PLAN_SIZED))
    return opt4__fail(OPT4_ECORRUPT, "unknown flags 0x%x", in->flags);
  if (!in->has_ops && (in->hits | in->admits | in->bypasses | in->flags) != 0)
    return opt4__fail(OPT4_ECORRUPT, "a plan without capacity has totals");
  const int sized = (in->flags & OPT4_PLAN_SIZED) != 0;
  in->capacity_bytes = rd64(base + H_CAPACITY_BYTES);
  in->page_size = rd64(base + H_PAGE_SIZE);
  in->generations = sized ? in->admits : 0;
  if (!sized && (in->capacity_bytes | in->page_size) != 0)
    return opt4__fail(OPT4_ECORRUPT, "capacity_bytes or page_size set in an item-capacity plan");
  if (sized && (in->page_size == 0 || in->page_size > UINT32_MAX ||
                in->capacity_bytes / in->page_size != in->capacity))
    return opt4__fail(OPT4_ECORRUPT, "page_size %llu and capacity_bytes %llu do not give %llu "
                      "pages", (unsigned long long)in->page_size,
                      (unsigned long long)in->capacity_bytes, (unsigned long long)in->capacity);
  if (in->hits > in->accesses || in->admits > in->accesses ||
      in->bypasses > in->accesses ||
      (in->has_ops && in->hits + in->admits + in->bypasses != in->accesses))
    return opt4__fail(OPT4_ECORRUPT, "totals do not add up to %llu accesses",
                      (unsigned long long)in->accesses);
  const uint8_t *sec_data[SEC_KINDS] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
  uint64_t sec_len[SEC_KINDS] = {0, 0, 0, 0, 0, 0, 0};
  uint64_t prev_end = table_end;
  for (uint32_t i = 0; i < n_sec; i++) {
    const uint8_t *e = base + PF_HEADER_SIZE + (size_t)i * PF_ENTRY_SIZE;
    uint32_t kind = rd32(e), sflags = rd32(e + 4);
    uint64_t off = rd64(e + 8), slen = rd64(e + 16), sum = rd64(e + 24);
    if (sflags & ~SEC_REQUIRED)
      return opt4__fail(OPT4_ECORRUPT, "section %u has unknown flags 0x%x", i, sflags);
    if (off % 8 != 0 || off < prev_end)
      return opt4__fail(OPT4_ECORRUPT, "section %u starts at %llu: misaligned "
                        "or overlapping", i, (unsigned long long)off);
    if (off > file_size || slen > file_size - off)
      return opt4__fail(OPT4_ETRUNCATED, "section %u (bytes %llu + %llu) runs "
                        "past the end of the file (%llu)", i,
                        (unsigned long long)off, (unsigned long long)slen,
                        (unsigned long long)file_size);
    prev_end = off + slen;
    if (kind < SEC_SEQ || kind >= SEC_KINDS) {
      if (sflags & SEC_REQUIRED)
        return opt4__fail(OPT4_EVERSION, "section %u has kind %u, which this "
                          "library does not know: upgrade opt4torch", i, kind);
      continue; /* an optional section from a later minor revision */
    }
    if (sec_data[kind] != NULL)
      return opt4__fail(OPT4_ECORRUPT, "section kind %u appears twice", kind);
    if (CHECKSUM_MISMATCH(opt4__hash64(base + off, (size_t)slen), sum))
      return opt4__fail(OPT4_ECHECKSUM, "section %u (kind %u) checksum does "
                        "not match", i, kind);
    sec_data[kind] = base + off;
    sec_len[kind] = slen;
  }
  uint64_t arr = in->accesses * sizeof(uint32_t);
  if (sec_data[SEC_SEQ] == NULL || sec_len[SEC_SEQ] != arr)
    return opt4__fail(OPT4_ECORRUPT, "the sequence section is missing or not "
                      "%llu bytes", (unsigned long long)arr);
  if (in->has_ops && (sec_data[SEC_OPS] == NULL || sec_len[SEC_OPS] != arr))
    return opt4__fail(OPT4_ECORRUPT, "the ops section is missing or not %llu "
                      "bytes", (unsigned long long)arr);
  if (!in->has_ops && sec_data[SEC_OPS] != NULL)
    return opt4__fail(OPT4_ECORRUPT, "ops present in a plan without capacity");

  const uint32_t *seq = (const uint32_t *)(const void *)sec_data[SEC_SEQ];
  for (uint64_t t = 0; t < in->accesses; t++)
    if (seq[t] >= in->items)
      return opt4__fail(OPT4_ECORRUPT, "id %u at position %llu is outside [0, "
                        "%llu)", seq[t], (unsigned long long)t,
                        (unsigned long long)in->items);
  /* Every allocation below is bounded by the file's own size, so a forged
   * header cannot make the loader allocate more than the file holds. */
  uint64_t distinct;
  int rc = opt4__count_distinct(seq, in->accesses, in->items, &distinct);
  if (rc != 0) return opt4__fail(rc, "no memory to check the sequence");
  if (distinct != in->compulsory)
    return opt4__fail(OPT4_ECORRUPT, "compulsory is %llu but the sequence has "
                      "%llu distinct ids", (unsigned long long)in->compulsory,
                      (unsigned long long)distinct);
  if (CHECKSUM_MISMATCH(opt4__hash64(seq, (size_t)arr), in->fingerprint))
    return opt4__fail(OPT4_ECORRUPT, "the fingerprint does not match the "
                      "sequence");
  const uint32_t *ops = (const uint32_t *)(const void *)sec_data[SEC_OPS];
  if (sized) {
    uint64_t G = in->generations;
    if (sec_data[SEC_GENS] == NULL || sec_len[SEC_GENS] != (G + 1) * 8 || sec_data[SEC_PAGES] == NULL ||
        sec_data[SEC_SIZES] == NULL || sec_len[SEC_SIZES] != in->items * 4)
      return opt4__fail(OPT4_ECORRUPT, "a sized plan's generation, page or size section is missing "
                        "or of the wrong length");
    const uint64_t *gen_off = (const uint64_t *)(const void *)sec_data[SEC_GENS];
    const uint32_t *pages = (const uint32_t *)(const void *)sec_data[SEC_PAGES];
    uint64_t L = sec_len[SEC_PAGES] / 4;
    if (sec_len[SEC_PAGES] % 4 != 0 || gen_off[0] != 0 || gen_off[G] != L)
      return opt4__fail(OPT4_ECORRUPT, "the page lists do not match the generations");
    for (uint64_t g = 0; g < G; g++)
      if (gen_off[g + 1] <= gen_off[g])
        return opt4__fail(OPT4_ECORRUPT, "generation %llu has no pages", (unsigned long long)g);
    uint64_t used = 0;
    for (uint64_t i = 0; i < L; i++) {
      if (pages[i] >= in->capacity)
        return opt4__fail(OPT4_ECORRUPT, "page %u is outside the pool's %llu", pages[i],
                          (unsigned long long)in->capacity);
      if ((uint64_t)pages[i] + 1 > used) used = (uint64_t)pages[i] + 1;
    }
    in->slots = used;
    plan->gen_off = gen_off;
    plan->pages = pages;
    plan->pages_len = L;
    plan->sizes = (const uint32_t *)(const void *)sec_data[SEC_SIZES];
    plan->seq = seq;
    plan->ops = ops;
    rc = opt4__plan_verify_sized(plan);
    if (rc != 0) return rc;
  } else if (sec_data[SEC_GENS] != NULL || sec_data[SEC_PAGES] != NULL || sec_data[SEC_SIZES] != NULL) {
    return opt4__fail(OPT4_ECORRUPT, "page sections in an item-capacity plan");
  } else if (in->has_ops) {
    rc = opt4__plan_verify(seq, ops, in);
    if (rc != 0) return rc;
  }
  if (sec_data[SEC_DESC] != NULL) {
    rc = opt4_plan_set_desc(plan, (const char *)sec_data[SEC_DESC],
                            (size_t)sec_len[SEC_DESC]);
    if (rc != 0) return rc;
  }
  plan->seq = seq;
  plan->ops = in->has_ops ? ops : NULL;
  return 0;
}

int opt4_plan_load_buffer(const void *buf, size_t len, opt4_plan **out) {
  opt4__clear_detail();
  if (out == NULL || (buf == NULL && len > 0))
    return opt4__fail(OPT4_EINVAL, "buffer or out is NULL");
  *out = NULL;
  opt4_plan *plan = opt4__plan_alloc();
  if (plan == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a plan");
  /* Copy into an owned, aligned buffer: the arrays are read in place. */
  plan->map = opt4__malloc(len);
  if (plan->map == NULL) {
    opt4_plan_close(plan);
    return opt4__fail(OPT4_ENOMEM, "no memory for %zu bytes", len);
  }
  plan->map_len = len;
  plan->map_is_mmap = 0;
  if (len > 0) memcpy(plan->map, buf, len);
  int rc = validate(plan->map, len, plan);
  if (rc != 0) {
    opt4_plan_close(plan);
    return rc;
  }
  *out = plan;
  return 0;
}

int opt4_plan_open(const char *path, opt4_plan **out) {
  opt4__clear_detail();
  if (out == NULL || path == NULL)
    return opt4__fail(OPT4_EINVAL, "path or out is NULL");
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return opt4__fail(OPT4_EIO, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return opt4__fail(OPT4_EIO, "cannot stat %s: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return opt4__fail(OPT4_EIO, "%s is not a regular file", path);
  }
  /* Read, not map: a mapping would share the file's pages, so a writer
   * that overwrites the file in place would change a plan that passed its
   * checks, and one that shortens it (cp, truncate) would kill the reader
   * with SIGBUS at its next access. MAP_PRIVATE protects against neither
   * (pages not yet copied still read the file). docs/plan-format.md has the
   * cost: the copy is part of the checks' own pass over the file. */
  if ((uint64_t)st.st_size > SIZE_MAX / 2) {
    close(fd);
    return opt4__fail(OPT4_ETOOBIG, "%s is %llu bytes", path, (unsigned long long)st.st_size);
  }
  size_t len = (size_t)st.st_size;
  uint8_t *map = opt4__malloc(len > 0 ? len : 1);
  if (map == NULL) {
    close(fd);
    return opt4__fail(OPT4_ENOMEM, "no memory to read %s (%zu bytes)", path, len);
  }
  opt4__advise_huge(map, len);
  size_t got = 0;
  int read_errno = 0;
  while (got < len) {
    ssize_t n = read(fd, map + got, len - got > ((size_t)1 << 30) ? ((size_t)1 << 30) : len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) read_errno = errno;
    if (n <= 0) break; /* an error, or the file was cut short while we read */
    got += (size_t)n;
  }
  uint8_t extra;
  ssize_t more = got == len ? read(fd, &extra, 1) : 0; /* grown while we read? */
  close(fd);
  if (read_errno != 0) {
    opt4__free(map, len > 0 ? len : 1);
    return opt4__fail(OPT4_EIO, "cannot read %s: %s", path, strerror(read_errno));
  }
  if (got != len || more > 0) {
    opt4__free(map, len > 0 ? len : 1);
    return opt4__fail(OPT4_EIO, "%s changed size while it was read (another process is writing "
                      "it?): open it again once the writer is done", path);
  }
  opt4_plan *plan = opt4__plan_alloc();
  if (plan == NULL) {
    opt4__free(map, len > 0 ? len : 1);
    return opt4__fail(OPT4_ENOMEM, "no memory for a plan");
  }
  plan->map = map;
  plan->map_len = len > 0 ? len : 1;
  plan->map_is_mmap = 0;
  int rc = validate(map, len, plan);
  if (rc != 0) {
    opt4_plan_close(plan);
    return rc;
  }
  *out = plan;
  return 0;
}
