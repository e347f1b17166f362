/* test_s3.c - the S3 reader's parts that need no server: the request
 * signature against AWS's own worked example, the checks of opt4_s3_open,
 * and a store that is not there. Reads from a real server (moto, on the
 * loopback address) are tested from Python (tests/python/test_s3_reader.py). */
#include "task.h"

#include "internal.h"
#include "source.h"

#include <string.h>

/* AWS, "Signature Calculations for the Authorization Header: Transferring
 * Payload in a Single Chunk (AWS Signature Version 4)", Example: GET
 * Object: the first 10 bytes of examplebucket/test.txt, 24 May 2013. */
static void test_sigv4_aws_example(void) {
  opt4__sigv4_request q = {.host = "examplebucket.s3.amazonaws.com", .path = "/test.txt", .range = "bytes=0-9",
                           .amz_date = "20130524T000000Z", .region = "us-east-1",
                           .access_key = "AKIAIOSFODNN7EXAMPLE",
                           .secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"};
  char auth[512];
  ASSERT_OK(opt4__sigv4_get(&q, auth, sizeof auth));
  ASSERT(strcmp(auth, "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                      "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                      "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41") == 0);
  /* A session token is signed too: another signature, and its header named. */
  q.session_token = "token";
  ASSERT_OK(opt4__sigv4_get(&q, auth, sizeof auth));
  ASSERT(strstr(auth, "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date;x-amz-security-token,") != NULL);
  ASSERT(strstr(auth, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41") == NULL);
  /* Too small a buffer is an error, not a cut header. */
  q.session_token = NULL;
  ASSERT_ERR(opt4__sigv4_get(&q, auth, 40), OPT4_ETOOBIG);
}

static void test_open_checks(void) {
  const char *keys[] = {"a/b c.jpg", "x"};
  opt4_range items[] = {{0, 0, 10}, {1, 5, 3}};
  opt4_s3_config cfg = {.endpoint = "http://127.0.0.1:1", .bucket = "bkt", .path_style = 1};
  opt4_s3 *r = NULL;
  if (!opt4_s3_available()) {
    ASSERT_ERR(opt4_s3_open(&cfg, keys, 2, items, 2, &r), OPT4_ENOTSUP);
    ASSERT(strstr(opt4_errdetail(), "libcurl") != NULL);
    return;
  }
  ASSERT_ERR(opt4_s3_open(NULL, keys, 2, items, 2, &r), OPT4_EINVAL);
  opt4_s3_config bad = cfg;
  bad.bucket = "";
  ASSERT_ERR(opt4_s3_open(&bad, keys, 2, items, 2, &r), OPT4_EINVAL);
  bad = cfg;
  bad.endpoint = "ftp://host";
  ASSERT_ERR(opt4_s3_open(&bad, keys, 2, items, 2, &r), OPT4_EINVAL);
  ASSERT(strstr(opt4_errdetail(), "http://host[:port]") != NULL);
  bad.endpoint = "http://host:9000/some/path";
  ASSERT_ERR(opt4_s3_open(&bad, keys, 2, items, 2, &r), OPT4_EINVAL);
  bad = cfg;
  bad.access_key = "id"; /* without its secret */
  ASSERT_ERR(opt4_s3_open(&bad, keys, 2, items, 2, &r), OPT4_EINVAL);
  opt4_range past[] = {{2, 0, 1}};
  ASSERT_ERR(opt4_s3_open(&cfg, keys, 2, past, 1, &r), OPT4_ERANGE);
  const char *nokey[] = {"a", ""};
  ASSERT_ERR(opt4_s3_open(&cfg, nokey, 2, items, 2, &r), OPT4_EINVAL);
  ASSERT(r == NULL);

  ASSERT_OK(opt4_s3_open(&cfg, keys, 2, items, 2, &r));
  opt4_s3_info in;
  ASSERT_OK(opt4_s3_info_get(r, &in));
  ASSERT_U64_EQ(in.count, 2);
  ASSERT_U64_EQ(in.objects, 2);
  ASSERT_U64_EQ(in.total_bytes, 13);
  ASSERT_U64_EQ(in.max_len, 10);
  ASSERT(strstr(in.note, "unsigned") != NULL && strstr(in.note, "path-style") != NULL);
  uint64_t len = 0;
  ASSERT_OK(opt4_s3_len(r, 1, &len));
  ASSERT_U64_EQ(len, 3);
  ASSERT_ERR(opt4_s3_len(r, 2, &len), OPT4_ERANGE);
  char buf[16];
  ASSERT_ERR(opt4_s3_read(r, 0, buf, 4, &len), OPT4_EITEMSIZE);
  ASSERT_U64_EQ(len, 10);
  opt4_source *src = NULL;
  ASSERT_OK(opt4_source_s3(r, &src));
  ASSERT(strcmp(opt4_source_name(src), "s3") == 0);
  ASSERT_U64_EQ(opt4_source_count(src), 2);
  opt4_source_close(src);
  opt4_s3_close(r);
  ASSERT_NO_ENGINE_MEMORY(); /* every string, key and the pool given back, in full */
}

/* Nothing listens on port 1: the read fails (after its tries), naming the
 * object (as named and as sent, URL-encoded) and the endpoint, and counts the failure. */
static void test_store_not_there(void) {
  const char *keys[] = {"a/b c.jpg"};
  opt4_range items[] = {{0, 0, 10}};
  opt4_s3_config cfg = {.endpoint = "http://127.0.0.1:1", .bucket = "bkt", .path_style = 1, .max_attempts = 2,
                        .access_key = "id", .secret_key = "secret"};
  opt4_s3 *r = NULL;
  ASSERT_OK(opt4_s3_open(&cfg, keys, 1, items, 1, &r));
  char buf[16];
  uint64_t len = 0;
  ASSERT_ERR(opt4_s3_read(r, 0, buf, sizeof buf, &len), OPT4_EIO);
  const char *d = opt4_errdetail();
  ASSERT(strstr(d, "s3://bkt/a/b c.jpg") != NULL && strstr(d, "http://127.0.0.1:1/bkt/a/b%20c.jpg") != NULL);
  ASSERT(strstr(d, "after 2 tries") != NULL);
  ASSERT(strstr(d, "bytes 0-9") != NULL);
  ASSERT(strstr(d, "server up") != NULL);
  opt4_s3_info in;
  ASSERT_OK(opt4_s3_info_get(r, &in));
  ASSERT_U64_EQ(in.requests, 2);
  ASSERT_U64_EQ(in.retries, 1);
  ASSERT_U64_EQ(in.failures, 1);
  ASSERT_U64_EQ(in.reads, 0);
  opt4_s3_close(r);
  ASSERT_NO_ENGINE_MEMORY(); /* every string, key and the pool given back, in full */
}

int main(void) {
  /* Without libcurl the reader must say that it was not built; the checks
   * that need it are then skipped, and reported as skipped. */
  RUN(test_open_checks);
  if (!opt4_s3_available()) SKIP_REST(S3_NOT_BUILT);
  RUN(test_sigv4_aws_example);
  RUN(test_store_not_there);
  return 0;
}
