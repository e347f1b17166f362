/*
 * s3answer.h - what an S3 store answered to one ranged GET, private to the
 * engine (s3answer.c): the header lines and body pieces as libcurl hands
 * them over, taken apart without trusting them, and the verdict on the
 * answer against what was asked. Apart from s3.c, so that it builds (and
 * is fuzzed: tests/fuzz/fuzz_s3_answer.c) without libcurl.
 */
#ifndef OPT4_SOURCE_S3ANSWER_H
#define OPT4_SOURCE_S3ANSWER_H

#include "internal.h"

typedef struct opt4__s3_answer {
  uint8_t *dst; /* the body goes here, at most cap bytes */
  size_t cap, got;
  int over;     /* the body was longer than cap (the transfer was stopped) */
  long status;  /* from the last status line; 0 before one */
  int has_range, has_length, bad_header; /* Content-Range / Content-Length seen; one malformed */
  uint64_t range_first, range_last, range_total; /* range_total UINT64_MAX: "*" */
  uint64_t length;                               /* Content-Length */
  char etag[130];                                /* the ETag header, as sent ("" if none or too long) */
  char err[512];                                 /* the start of an error answer's body */
  size_t err_len;
} opt4__s3_answer;

/* Start an answer whose body goes to dst (cap bytes). */
void opt4__s3_answer_init(opt4__s3_answer *a, uint8_t *dst, size_t cap);
/* One header line as received (n bytes, CRLF included or not). A status
 * line ("HTTP/1.1 206 ...") starts a new answer's headers: those of a 100
 * Continue or a redirect before it are forgotten. */
void opt4__s3_answer_header(opt4__s3_answer *a, const char *line, size_t n);
/* A piece of the body: n when taken, 0 to stop the transfer (longer than
 * cap). An error answer's body (status >= 300) is kept, cut, in err. */
size_t opt4__s3_answer_body(opt4__s3_answer *a, const char *data, size_t n);

/* What the GET asked: bytes [first, first + length) of an object listed
 * with `size` bytes (UINT64_MAX: unknown) and ETag `etag` (NULL: none). */
typedef struct opt4__s3_asked {
  uint64_t first, length, size;
  const char *etag;
} opt4__s3_asked;

/* The verdict on a 2xx answer: 0 if the body is exactly the bytes asked
 * for, else a negative code with why (cap bytes) saying what differs: a
 * Content-Range for other bytes or of another total, a Content-Length that
 * is not the range's, a body longer or shorter, another ETag, a 200 for a
 * range that is not the whole object. */
int opt4__s3_answer_check(const opt4__s3_answer *a, const opt4__s3_asked *q, char *why, size_t cap);

#endif /* OPT4_SOURCE_S3ANSWER_H */
