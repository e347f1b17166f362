/*
 * tar.c - indexing a tar shard the way WebDataset reads it, so that its
 * samples are read in place as byte ranges (ranges.c).
 *
 * A tar file is a run of 512-byte headers, each followed by its member's
 * data padded to 512 bytes, ended by a zero block (or by the end of the
 * file, which tar readers accept). Headers are ustar (a 155-byte prefix
 * before the name), GNU (a ././@LongLink member, type 'L', carries the next
 * member's name) or pax (a type 'x' member of "len key=value\n" records;
 * path= and size= apply to the next member). Only regular members are
 * indexed; directories, links and devices carry no data (their size field is
 * ignored, as Python's tarfile does), and unknown types are skipped over.
 *
 * A shard is a hostile file: every header's checksum is checked, every size
 * against the file's end, and a long name or pax header is bounded, so a
 * malformed shard is refused naming the shard and the offset, never read
 * out of bounds (fuzz_tar_index).
 *
 * Grouping is WebDataset's (webdataset/tariterators.py, base_plus_ext and
 * group_by_keys): a member's path splits at the first dot of its base name
 * into key and field ("a/b.seg.png": key "a/b", field "seg.png",
 * lower-cased); consecutive members with the same key form a sample; a path
 * the split does not match (no dot in the base name) and WebDataset's
 * metadata members (__name__) are skipped; a field twice in one sample is
 * refused, as WebDataset raises.
 */
#include "tar.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "direct.h"

#define BLOCK 512u
#define NAME_MAX_BYTES 65536u   /* a GNU long name or pax path longer than this is refused */
#define PAX_MAX_BYTES (1u << 20) /* a pax header larger than this is refused */

struct opt4_tar_index {
  opt4_tar_sample *samples;
  opt4_tar_member *members;
  char *names;
  uint64_t n_samples, cap_samples, n_members, cap_members, names_len, cap_names;
};

void opt4_tar_index_close(opt4_tar_index *t) {
  if (t == NULL) return;
  if (t->samples) opt4__free(t->samples, (size_t)t->cap_samples * sizeof *t->samples);
  if (t->members) opt4__free(t->members, (size_t)t->cap_members * sizeof *t->members);
  if (t->names) opt4__free(t->names, (size_t)t->cap_names);
  opt4__free(t, sizeof *t);
}

int opt4_tar_index_view(const opt4_tar_index *t, opt4_tar_view *out) {
  if (t == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "index or out is NULL");
  out->samples = t->samples;
  out->n_samples = t->n_samples;
  out->members = t->members;
  out->n_members = t->n_members;
  out->names = t->names;
  out->names_len = t->names_len;
  return 0;
}

/* Grow an array of *cap elements of size sz to hold need. */
static int grow(void **p, uint64_t *cap, uint64_t need, size_t sz) {
  if (need <= *cap) return 0;
  uint64_t n = *cap ? *cap : 16;
  while (n < need) n *= 2;
  void *q = opt4__malloc((size_t)(n * sz));
  if (q == NULL) return -1;
  if (*p != NULL) {
    memcpy(q, *p, (size_t)(*cap * sz));
    opt4__free(*p, (size_t)(*cap * sz));
  }
  *p = q;
  *cap = n;
  return 0;
}

static int add_name(opt4_tar_index *t, const char *s, size_t n, uint64_t *off) {
  if (grow((void **)&t->names, &t->cap_names, t->names_len + n, 1) != 0) return -1;
  memcpy(t->names + t->names_len, s, n);
  *off = t->names_len;
  t->names_len += n;
  return 0;
}

/* A numeric header field: octal (optionally space/NUL padded) or GNU
 * base-256 (first byte 0x80; 0xff, negative, is refused). -1 if malformed. */
static int parse_number(const uint8_t *f, size_t n, uint64_t *out) {
  uint64_t v = 0;
  if (f[0] == 0x80) {
    for (size_t i = 1; i < n; i++) {
      if (v >> 56) return -1;
      v = (v << 8) | f[i];
    }
    *out = v;
    return 0;
  }
  size_t i = 0;
  while (i < n && f[i] == ' ') i++;
  size_t digits = 0;
  for (; i < n && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
    if (v >> 60) return -1;
    v = (v << 3) | (uint64_t)(f[i] - '0');
  }
  for (; i < n; i++)
    if (f[i] != ' ' && f[i] != 0) return -1;
  *out = v; /* an empty field is 0, as tarfile reads it */
  (void)digits;
  return 0;
}

static size_t field_len(const uint8_t *f, size_t n) {
  const void *z = memchr(f, 0, n);
  return z ? (size_t)((const uint8_t *)z - f) : n;
}

static int is_zero(const uint8_t *b) {
  for (size_t i = 0; i < BLOCK; i++)
    if (b[i]) return 0;
  return 1;
}

/* WebDataset's split (the regex of base_plus_ext; a C comment cannot quote
 * it), worked out:
 * the dot is the first one of the base name; a base name that starts with a
 * dot matches only when the component before it has none (the regex then
 * keys "dir/" with the rest as field). 0 and *dot, or -1: no match. */
static int split_key(const char *p, size_t n, size_t *dot) {
  size_t base = 0;
  for (size_t i = 0; i < n; i++)
    if (p[i] == '/') base = i + 1;
  const char *d = memchr(p + base, '.', n - base);
  if (d == NULL) return -1;
  size_t e = (size_t)(d - p);
  if (e > base) {
    *dot = e;
    return 0;
  }
  if (base == 0) return -1;
  size_t s = 0; /* the start of the component before the base name */
  for (size_t i = 0; i + 1 < base; i++)
    if (p[i] == '/') s = i + 1;
  if (memchr(p + s, '.', e - s) != NULL) return -1;
  *dot = e;
  return 0;
}

/* WebDataset's metadata members: "__x__" at the top, or a path whose first
 * component is "__x__" (tar_file_iterator's meta_prefix and skip_meta). */
static int is_meta(const char *p, size_t n) {
  const char *slash = memchr(p, '/', n);
  if (slash == NULL && n >= 2 && p[0] == '_' && p[1] == '_' && p[n - 2] == '_' && p[n - 1] == '_') return 1;
  size_t c = slash ? (size_t)(slash - p) : n;
  return c >= 4 && p[0] == '_' && p[1] == '_' && p[c - 2] == '_' && p[c - 1] == '_';
}

/* Parse pax records "len key=value\n"; path= goes to name, size= to size. */
static int parse_pax(const char *shard, uint64_t at, const char *buf, size_t n, char *name, size_t *name_len,
                     int *has_name, uint64_t *size, int *has_size) {
  size_t i = 0;
  while (i < n) {
    if (buf[i] == 0) break; /* padding some writers leave */
    size_t len = 0, j = i;
    while (j < n && buf[j] >= '0' && buf[j] <= '9' && j - i < 12) len = len * 10 + (size_t)(buf[j++] - '0');
    if (j == i || j >= n || buf[j] != ' ' || len <= j - i + 1 || len > n - i || buf[i + len - 1] != '\n')
      return opt4__fail(OPT4_ECORRUPT, "tar shard %s: malformed pax record at offset %llu of the pax header "
                        "at %llu", shard, (unsigned long long)i, (unsigned long long)at);
    const char *kv = buf + j + 1, *end = buf + i + len - 1;
    const char *eq = memchr(kv, '=', (size_t)(end - kv));
    if (eq == NULL)
      return opt4__fail(OPT4_ECORRUPT, "tar shard %s: pax record without '=' at offset %llu of the pax header "
                        "at %llu", shard, (unsigned long long)i, (unsigned long long)at);
    size_t klen = (size_t)(eq - kv), vlen = (size_t)(end - eq - 1);
    if (klen == 4 && memcmp(kv, "path", 4) == 0) {
      if (vlen > NAME_MAX_BYTES)
        return opt4__fail(OPT4_ECORRUPT, "tar shard %s: pax path of %zu bytes at %llu (at most %u)", shard,
                          vlen, (unsigned long long)at, NAME_MAX_BYTES);
      memcpy(name, eq + 1, vlen);
      *name_len = vlen;
      *has_name = 1;
    } else if (klen == 4 && memcmp(kv, "size", 4) == 0) {
      uint64_t v = 0;
      if (vlen == 0 || vlen > 19)
        return opt4__fail(OPT4_ECORRUPT, "tar shard %s: bad pax size in the header at %llu", shard,
                          (unsigned long long)at);
      for (size_t k = 0; k < vlen; k++) {
        char c = eq[1 + k];
        if (c < '0' || c > '9')
          return opt4__fail(OPT4_ECORRUPT, "tar shard %s: bad pax size in the header at %llu", shard,
                            (unsigned long long)at);
        v = v * 10 + (uint64_t)(c - '0');
      }
      *size = v;
      *has_size = 1;
    }
    i += len;
  }
  return 0;
}

int opt4__tar_index_scan(const char *shard, opt4__tar_read_fn rd, void *ctx, uint64_t file_size,
                         opt4_tar_index **out) {
  if (shard == NULL) shard = "(unnamed)";
  *out = NULL;
  int rc = 0;
  char *name = NULL, *pend = NULL, *meta = NULL;
  size_t pend_len = 0, meta_cap = 0;
  int has_pend_name = 0, has_pend_size = 0;
  uint64_t pend_size = 0;
  opt4_tar_index *t = opt4__calloc(1, sizeof *t);
  name = opt4__malloc(NAME_MAX_BYTES + 256);
  pend = opt4__malloc(NAME_MAX_BYTES + 1);
  if (t == NULL || name == NULL || pend == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory to index tar shard %s", shard);
    goto leave;
  }
  uint64_t off = 0;
  uint8_t h[BLOCK];
  while (off < file_size) {
    if (file_size - off < BLOCK) {
      rc = opt4__fail(OPT4_ETRUNCATED, "tar shard %s: truncated header at offset %llu (%llu bytes left, a "
                      "header is 512)", shard, (unsigned long long)off, (unsigned long long)(file_size - off));
      goto leave;
    }
    if (rd(ctx, off, h, BLOCK) != 0) {
      rc = opt4__fail(OPT4_EIO, "tar shard %s: cannot read the header at offset %llu: %s", shard,
                      (unsigned long long)off, strerror(errno));
      goto leave;
    }
    if (is_zero(h)) break; /* the end-of-archive marker */
    uint64_t want = 0, size = 0;
    if (parse_number(h + 148, 8, &want) != 0) {
      rc = opt4__fail(OPT4_ECORRUPT, "tar shard %s: bad checksum field in the header at offset %llu (not a "
                      "tar file, or corrupted)", shard, (unsigned long long)off);
      goto leave;
    }
    uint64_t usum = 0;
    int64_t ssum = 0;
    for (size_t i = 0; i < BLOCK; i++) {
      uint8_t b = (i >= 148 && i < 156) ? (uint8_t)' ' : h[i];
      usum += b;
      ssum += (int8_t)b;
    }
    if (want != usum && (int64_t)want != ssum) {
      rc = opt4__fail(OPT4_ECHECKSUM, "tar shard %s: bad checksum in the header at offset %llu (it says %llu, "
                      "the header sums to %llu): not a tar file, or corrupted", shard, (unsigned long long)off,
                      (unsigned long long)want, (unsigned long long)usum);
      goto leave;
    }
    if (parse_number(h + 124, 12, &size) != 0) {
      rc = opt4__fail(OPT4_ECORRUPT, "tar shard %s: bad size field in the header at offset %llu", shard,
                      (unsigned long long)off);
      goto leave;
    }
    const char type = (char)h[156];
    if (has_pend_size && type != 'x' && type != 'L' && type != 'K' && type != 'g') size = pend_size;
    const uint64_t data = off + BLOCK;
    if (size > file_size - data) {
      rc = opt4__fail(OPT4_ETRUNCATED, "tar shard %s: the member at offset %llu says %llu bytes, past the end "
                      "of the file (%llu bytes): truncated or corrupted", shard, (unsigned long long)off,
                      (unsigned long long)size, (unsigned long long)file_size);
      goto leave;
    }
    uint64_t next = data + (size + BLOCK - 1) / BLOCK * BLOCK;
    if (type == 'L' || type == 'x' || type == 'K' || type == 'g') {
      uint64_t cap = type == 'L' ? NAME_MAX_BYTES : PAX_MAX_BYTES;
      if (type == 'K' || type == 'g') { /* a link's long target, global pax: not used */
        off = next;
        continue;
      }
      if (size > cap) {
        rc = opt4__fail(OPT4_ECORRUPT, "tar shard %s: the %s at offset %llu is %llu bytes (at most %llu)", shard,
                        type == 'L' ? "GNU long name" : "pax header", (unsigned long long)off,
                        (unsigned long long)size, (unsigned long long)cap);
        goto leave;
      }
      if (size + 1 > meta_cap) {
        if (meta) opt4__free(meta, meta_cap);
        meta_cap = (size_t)size + 1;
        meta = opt4__malloc(meta_cap);
        if (meta == NULL) {
          meta_cap = 0;
          rc = opt4__fail(OPT4_ENOMEM, "no memory to index tar shard %s", shard);
          goto leave;
        }
      }
      if (size > 0 && rd(ctx, data, meta, (size_t)size) != 0) {
        rc = opt4__fail(OPT4_EIO, "tar shard %s: cannot read the member at offset %llu: %s", shard,
                        (unsigned long long)off, strerror(errno));
        goto leave;
      }
      if (type == 'L') {
        pend_len = field_len((const uint8_t *)meta, (size_t)size);
        memcpy(pend, meta, pend_len);
        has_pend_name = 1;
      } else {
        rc = parse_pax(shard, off, meta, (size_t)size, pend, &pend_len, &has_pend_name, &pend_size,
                       &has_pend_size);
        if (rc != 0) goto leave;
      }
      off = next;
      continue;
    }
    /* The member's path: a pending long name, else prefix/name. */
    size_t nlen = 0;
    if (has_pend_name) {
      memcpy(name, pend, pend_len);
      nlen = pend_len;
    } else {
      size_t plen = field_len(h + 345, 155);
      if (plen > 0 && type != 'S') {
        memcpy(name, h + 345, plen);
        name[plen] = '/';
        nlen = plen + 1;
      }
      size_t k = field_len(h, 100);
      memcpy(name + nlen, h, k);
      nlen += k;
    }
    has_pend_name = has_pend_size = 0;
    int regular = type == '0' || type == '7' || (type == 0 && !(nlen > 0 && name[nlen - 1] == '/'));
    if (type == 'S') {
      rc = opt4__fail(OPT4_ENOTSUP, "tar shard %s: the member at offset %llu is a GNU sparse file, which cannot "
                      "be read in place; repack the shard without --sparse", shard, (unsigned long long)off);
      goto leave;
    }
    int has_data = regular || !(type == 0 || (type >= '1' && type <= '6'));
    if (!has_data) next = data; /* links, directories, devices: the size field is not data */
    size_t dot = 0;
    if (regular && !is_meta(name, nlen) && split_key(name, nlen, &dot) == 0) {
      opt4_tar_sample *cur = t->n_samples ? &t->samples[t->n_samples - 1] : NULL;
      if (cur == NULL || cur->key_len != dot || memcmp(t->names + cur->key_off, name, dot) != 0) {
        if (grow((void **)&t->samples, &t->cap_samples, t->n_samples + 1, sizeof *t->samples) != 0) goto oom;
        cur = &t->samples[t->n_samples++];
        memset(cur, 0, sizeof *cur);
        cur->offset = data;
        cur->first_member = t->n_members;
        if (add_name(t, name, dot, &cur->key_off) != 0) goto oom;
        cur->key_len = (uint32_t)dot;
      }
      size_t flen = nlen - dot - 1;
      for (size_t i = dot + 1; i < nlen; i++)
        if (name[i] >= 'A' && name[i] <= 'Z') name[i] = (char)(name[i] - 'A' + 'a');
      for (uint64_t m = cur->first_member; m < t->n_members; m++) {
        const opt4_tar_member *mm = &t->members[m];
        if (mm->field_len == flen && memcmp(t->names + mm->field_off, name + dot + 1, flen) == 0) {
          rc = opt4__fail(OPT4_ECORRUPT, "tar shard %s: the member at offset %llu repeats field '%.*s' of sample "
                          "'%.*s' (WebDataset refuses a duplicate file name in a sample)", shard,
                          (unsigned long long)off, (int)flen, name + dot + 1, (int)dot, name);
          goto leave;
        }
      }
      if (grow((void **)&t->members, &t->cap_members, t->n_members + 1, sizeof *t->members) != 0) goto oom;
      opt4_tar_member *mem = &t->members[t->n_members++];
      memset(mem, 0, sizeof *mem);
      mem->offset = data - cur->offset;
      mem->size = size;
      if (add_name(t, name + dot + 1, flen, &mem->field_off) != 0) goto oom;
      mem->field_len = (uint32_t)flen;
      cur->members++;
      cur->length = data + size - cur->offset;
    }
    off = next;
  }
  *out = t;
  t = NULL;
  goto leave;
oom:
  rc = opt4__fail(OPT4_ENOMEM, "no memory to index tar shard %s", shard);
leave:
  opt4_tar_index_close(t);
  if (name) opt4__free(name, NAME_MAX_BYTES + 256);
  if (pend) opt4__free(pend, NAME_MAX_BYTES + 1);
  if (meta) opt4__free(meta, meta_cap);
  return rc;
}

static int read_fd(void *ctx, uint64_t off, void *dst, size_t n) {
  return opt4__pread_full(*(int *)ctx, dst, n, off);
}

int opt4_tar_index_file(const char *path, opt4_tar_index **out) {
  opt4__clear_detail();
  if (path == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "path or out is NULL");
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return opt4__fail(OPT4_EIO, "cannot open tar shard %s: %s", path, strerror(errno));
  struct stat st;
  int rc;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    rc = opt4__fail(OPT4_EIO, "tar shard %s is not a regular file", path);
  else
    rc = opt4__tar_index_scan(path, read_fd, &fd, (uint64_t)st.st_size, out);
  close(fd);
  return rc;
}
