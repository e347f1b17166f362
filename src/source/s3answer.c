/*
 * s3answer.c - an S3 store's answer to one ranged GET, taken apart and
 * judged against what was asked (s3answer.h).
 *
 * Nothing in it is trusted: a header is parsed strictly (digits only, no
 * overflow, a range whose ends are in order), one that is not is recorded
 * as malformed and fails the answer; the body is never written past cap.
 * The verdict wants, for a 206, a Content-Range of exactly the bytes asked
 * and, when the object's listed size is known, of that total; a
 * Content-Length of the range's length; a body of exactly that length; and
 * the listed ETag when the answer carries one (the request sent it as
 * If-Match, so a store that honours it answers 412 instead; one that
 * ignores it is caught here). A 200 is the whole object, so only a range
 * that is the whole object takes one.
 */
#include "s3answer.h"

#include <stdio.h>
#include <string.h>

void opt4__s3_answer_init(opt4__s3_answer *a, uint8_t *dst, size_t cap) {
  memset(a, 0, sizeof *a);
  a->dst = dst;
  a->cap = cap;
}

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; }

/* Whether s[0..n) starts with the lower-case name followed by ':'. */
static int is_header(const char *s, size_t n, const char *name, size_t *value_at) {
  size_t k = strlen(name);
  if (n <= k || s[k] != ':') return 0;
  for (size_t i = 0; i < k; i++)
    if (lower((unsigned char)s[i]) != name[i]) return 0;
  *value_at = k + 1;
  return 1;
}

/* A decimal number at s[*i..n), at most 2^62 (no sign, no overflow). */
static int number(const char *s, size_t n, size_t *i, uint64_t *out) {
  uint64_t v = 0;
  size_t start = *i;
  while (*i < n && s[*i] >= '0' && s[*i] <= '9') {
    if (*i - start >= 19) return -1;
    v = v * 10 + (uint64_t)(s[*i] - '0');
    (*i)++;
  }
  if (*i == start || v > ((uint64_t)1 << 62)) return -1;
  *out = v;
  return 0;
}

/* "bytes a-b/total", "bytes a-b/(star)" or "bytes (star)/total". */
static int content_range(opt4__s3_answer *a, const char *v, size_t n) {
  if (n < 6 || memcmp(v, "bytes ", 6) != 0) return -1;
  size_t i = 6;
  uint64_t first = 0, last = 0, total = UINT64_MAX;
  int have = 0;
  if (i < n && v[i] == '*') {
    i++;
  } else {
    if (number(v, n, &i, &first) != 0 || i >= n || v[i] != '-') return -1;
    i++;
    if (number(v, n, &i, &last) != 0 || last < first) return -1;
    have = 1;
  }
  if (i >= n || v[i] != '/') return -1;
  i++;
  if (i < n && v[i] == '*') {
    if (!have) return -1; /* a star for both the range and the total says nothing */
    i++;
  } else if (number(v, n, &i, &total) != 0 || (have && last >= total)) {
    return -1;
  }
  if (i != n) return -1;
  if (!have) return 0; /* an unsatisfied range's total: the status says it */
  a->has_range = 1;
  a->range_first = first;
  a->range_last = last;
  a->range_total = total;
  return 0;
}

void opt4__s3_answer_header(opt4__s3_answer *a, const char *line, size_t n) {
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
  if (n >= 5 && memcmp(line, "HTTP/", 5) == 0) { /* a new answer: forget the one before */
    opt4__s3_answer_init(a, a->dst, a->cap);
    const char *sp = memchr(line, ' ', n);
    size_t i = sp ? (size_t)(sp - line) + 1 : n;
    uint64_t status = 0;
    if (i + 3 > n || number(line, i + 3, &i, &status) != 0 || status < 100 || status > 599) {
      a->bad_header = 1;
      return;
    }
    a->status = (long)status;
    return;
  }
  size_t at = 0;
  int which = is_header(line, n, "content-range", &at) ? 1 : is_header(line, n, "content-length", &at) ? 2
              : is_header(line, n, "etag", &at)        ? 3
                                                       : 0;
  if (which == 0) return;
  while (at < n && (line[at] == ' ' || line[at] == '\t')) at++;
  size_t end = n;
  while (end > at && (line[end - 1] == ' ' || line[end - 1] == '\t')) end--;
  const char *v = line + at;
  size_t vn = end - at;
  if (which == 1) {
    if (a->has_range || content_range(a, v, vn) != 0) a->bad_header = 1;
  } else if (which == 2) {
    size_t i = 0;
    uint64_t len = 0;
    if (number(v, vn, &i, &len) != 0 || i != vn || (a->has_length && a->length != len)) a->bad_header = 1;
    a->has_length = 1;
    a->length = len;
  } else {
    if (vn >= sizeof a->etag) {
      a->bad_header = 1;
      return;
    }
    memcpy(a->etag, v, vn);
    a->etag[vn] = '\0';
  }
}

size_t opt4__s3_answer_body(opt4__s3_answer *a, const char *data, size_t n) {
  if (a->status >= 300) { /* an error document: keep its start for the message */
    size_t room = sizeof a->err - 1 - a->err_len, k = n < room ? n : room;
    memcpy(a->err + a->err_len, data, k);
    a->err_len += k;
    a->err[a->err_len] = '\0';
    return n;
  }
  if (n > a->cap - a->got) {
    a->over = 1;
    return 0; /* aborts the transfer */
  }
  if (n > 0) memcpy(a->dst + a->got, data, n);
  a->got += n;
  return n;
}

/* An ETag without its quotes and weak mark, as a (pointer, length). */
static const char *bare_etag(const char *e, size_t *n) {
  if (strncmp(e, "W/", 2) == 0) e += 2;
  *n = strlen(e);
  if (*n >= 2 && e[0] == '"' && e[*n - 1] == '"') {
    e++;
    *n -= 2;
  }
  return e;
}

#define WHY(code, ...) (snprintf(why, cap, __VA_ARGS__), (code))

int opt4__s3_answer_check(const opt4__s3_answer *a, const opt4__s3_asked *q, char *why, size_t cap) {
  unsigned long long first = q->first, last = q->first + q->length - 1, size = q->size;
  if (a->bad_header)
    return WHY(OPT4_EIO, "a malformed status line, Content-Range, Content-Length or ETag header");
  if (q->etag != NULL && q->etag[0] && a->etag[0]) {
    size_t wn, gn;
    const char *w = bare_etag(q->etag, &wn), *g = bare_etag(a->etag, &gn);
    if (wn != gn || memcmp(w, g, wn) != 0)
      return WHY(OPT4_ETRUNCATED, "the object's ETag is now %s, not the %s listed: it changed since the dataset "
                 "was made", a->etag, q->etag);
  }
  if (a->status == 206) {
    if (!a->has_range) return WHY(OPT4_EIO, "a 206 without a Content-Range: which bytes it holds is unknown");
    if (a->range_first != q->first || a->range_last != last)
      return WHY(OPT4_EIO, "bytes %llu-%llu came back where %llu-%llu were asked for (Content-Range): refused, "
                 "they are another item's", (unsigned long long)a->range_first,
                 (unsigned long long)a->range_last, first, last);
    if (a->range_total != UINT64_MAX && q->size != UINT64_MAX && a->range_total != q->size)
      return WHY(OPT4_ETRUNCATED, "the object is now %llu bytes, not the %llu listed (Content-Range): it changed "
                 "since the dataset was made", (unsigned long long)a->range_total, size);
  } else if (a->status == 200) {
    if (q->first != 0 || (q->size != UINT64_MAX && q->length != q->size))
      return WHY(OPT4_EIO, "the store ignored the Range header (answered 200, the whole object): a store that "
                 "reads byte ranges is needed");
  } else {
    return WHY(OPT4_EIO, "HTTP %ld where 206 (or 200 for a whole object) was expected", a->status);
  }
  if (a->has_length && a->length != q->length)
    return WHY(OPT4_ETRUNCATED, "a Content-Length of %llu where %llu bytes were asked for: the object changed since "
               "the dataset was made", (unsigned long long)a->length, (unsigned long long)q->length);
  if (a->over)
    return WHY(OPT4_ETRUNCATED, "more bytes than the %llu asked for: the object changed since the dataset was made",
               (unsigned long long)q->length);
  if (a->got != q->length)
    return WHY(OPT4_ETRUNCATED, "%zu bytes where %llu were asked for: the object changed since the dataset was "
               "made", a->got, (unsigned long long)q->length);
  return 0;
}
