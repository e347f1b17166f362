/* fuzz_s3_answer.c - libFuzzer target for the S3 answer parser and its
 * verdict (src/source/s3answer.c): what a store sends back to a ranged GET,
 * fed as libcurl feeds it, header lines one at a time, then the body in
 * pieces (as a chunked or a slow answer arrives).
 *
 * Input: byte 0 picks the range asked for (first = b0 % 8 * 100, length =
 * 1 + b1 * 8), byte 2 the listed size (known or not) and whether an ETag is
 * expected, byte 3 the body's piece size (1 + b3); then the answer: header
 * lines up to an empty line (LF-separated, CRLF kept when present), then the
 * body. Whatever the bytes: the body is never written past the buffer
 * (ASan), and an answer judged good is exactly the range asked for: a 200
 * or a 206, `got` equal to the length, a 206 with the Content-Range asked
 * for, a Content-Length (when sent) of the length, the ETag (when both are
 * there) the one listed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "opt4.h"
#include "s3answer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char LISTED_ETAG[] = "\"d41d8cd98f00b204e9800998ecf8427e\"";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  uint64_t first = (uint64_t)(data[0] % 8) * 100, length = 1 + (uint64_t)data[1] * 8;
  uint64_t listed = (data[2] & 1) ? first + length + (data[2] >> 2) : UINT64_MAX;
  const char *etag = (data[2] & 2) ? LISTED_ETAG : NULL;
  size_t piece = 1 + (size_t)data[3];
  const char *p = (const char *)data + 4, *end = (const char *)data + size;

  uint8_t *dst = malloc((size_t)length); /* exactly the range: ASan catches a byte past it */
  if (dst == NULL) return 0;
  opt4__s3_answer a;
  opt4__s3_answer_init(&a, dst, (size_t)length);
  /* Header lines, up to the first empty one. */
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = nl ? (size_t)(nl - p) + 1 : (size_t)(end - p);
    int blank = n == 1 || (n == 2 && p[0] == '\r');
    opt4__s3_answer_header(&a, p, n);
    p += n;
    if (blank) break;
  }
  /* The body, in pieces, until one is refused. */
  while (p < end) {
    size_t n = (size_t)(end - p) < piece ? (size_t)(end - p) : piece;
    size_t took = opt4__s3_answer_body(&a, p, n);
    if (took != n) {
      if (took != 0 || !a.over) abort(); /* a refusal is all or nothing, and says why */
      break;
    }
    p += n;
  }
  if (a.got > a.cap || a.err_len >= sizeof a.err) abort();
  opt4__s3_asked q = {.first = first, .length = length, .size = listed, .etag = etag};
  char why[400];
  int rc = opt4__s3_answer_check(&a, &q, why, sizeof why);
  if (rc > 0) abort();
  if (rc == 0) {
    if (a.status != 200 && a.status != 206) abort();
    if (a.got != length || a.over || a.bad_header) abort();
    if (a.status == 206 && (!a.has_range || a.range_first != first || a.range_last != first + length - 1)) abort();
    if (a.status == 206 && listed != UINT64_MAX && a.range_total != UINT64_MAX && a.range_total != listed) abort();
    if (a.status == 200 && (first != 0 || (listed != UINT64_MAX && listed != length))) abort();
    if (a.has_length && a.length != length) abort();
    if (etag != NULL && a.etag[0] && strcmp(a.etag, etag) != 0 && strcmp(a.etag, "d41d8cd98f00b204e9800998ecf8427e") != 0 &&
        strncmp(a.etag, "W/", 2) != 0)
      abort();
  } else if (memchr(why, '\0', sizeof why) == NULL) {
    abort();
  }
  free(dst);
  return 0;
}
