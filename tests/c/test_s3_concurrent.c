/* test_s3_concurrent.c - the S3 reader from many threads at once, against
 * a small HTTP/1.1 server on 127.0.0.1 run by this test (keep-alive, one
 * thread a connection, answering Range requests from a known pattern, and
 * checking each request's SigV4 header names the right scope): every read
 * returns its range's bytes, connections are reused (no more than the
 * threads), and under ThreadSanitizer (make test-tsan: the label
 * "concurrent") the pool and the counters are race-free. Also: a 503 is
 * tried again, a 404 is not, and a body of the wrong length is refused. */
#include "task.h"

#include "internal.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define THREADS 8
#define READS_PER_THREAD 200
#define OBJECTS 16
#define OBJECT_BYTES 3000
#define MAX_CONN 64

static uint8_t pattern(uint64_t object, uint64_t offset) { return (uint8_t)(object * 31u + offset * 7u + 1u); }

struct server {
  int listen_fd;
  uint16_t port;
  pthread_t acceptor;
  pthread_t conn[MAX_CONN];
  _Atomic int n_conn;
  _Atomic int stop;
  _Atomic uint64_t requests, unsigned_requests, served_503;
  _Atomic int fail_503_first; /* answer the next request for "/bkt/o503" with 503 once */
};

/* Read until the end of the request's headers; 0 on EOF. */
static size_t read_request(int fd, char *buf, size_t cap) {
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t k = read(fd, buf + n, cap - 1 - n);
    if (k <= 0) return 0;
    n += (size_t)k;
    buf[n] = '\0';
    if (strstr(buf, "\r\n\r\n") != NULL) return n;
  }
  return 0;
}

static void write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t k = write(fd, c, n);
    if (k <= 0) return;
    c += k;
    n -= (size_t)k;
  }
}

static void answer(int fd, const char *status, const char *body, size_t len) {
  char head[256];
  int h = snprintf(head, sizeof head, "HTTP/1.1 %s\r\nContent-Length: %zu\r\nContent-Type: application/xml\r\n\r\n",
                   status, len);
  write_all(fd, head, (size_t)h);
  write_all(fd, body, len);
}

struct conn_arg {
  struct server *s;
  int fd;
};

static void *serve_conn(void *p) {
  struct conn_arg *a = p;
  struct server *s = a->s;
  int fd = a->fd;
  free(a);
  char req[8192];
  uint8_t out[OBJECT_BYTES + 16];
  while (read_request(fd, req, sizeof req) > 0) {
    atomic_fetch_add(&s->requests, 1);
    char path[256] = "";
    unsigned long long first = 0, last = 0;
    sscanf(req, "GET %255s HTTP/1.1", path);
    const char *range = strstr(req, "\r\nRange: bytes=");
    if (range) sscanf(range, "\r\nRange: bytes=%llu-%llu", &first, &last);
    const char *auth = strstr(req, "\r\nAuthorization: AWS4-HMAC-SHA256 Credential=id/");
    if (auth == NULL) atomic_fetch_add(&s->unsigned_requests, 1);
    else if (strstr(auth, "/us-west-2/s3/aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                          "Signature=") == NULL) {
      answer(fd, "403 Forbidden", "<Error><Code>SignatureDoesNotMatch</Code></Error>", 49);
      continue;
    }
    if (strcmp(path, "/bkt/o503") == 0) {
      int expect = 1;
      if (atomic_compare_exchange_strong(&s->fail_503_first, &expect, 0)) {
        atomic_fetch_add(&s->served_503, 1);
        answer(fd, "503 Slow Down", "<Error><Code>SlowDown</Code></Error>", 36);
        continue;
      }
      snprintf(path, sizeof path, "/bkt/obj/0"); /* then served as object 0 */
    }
    if (strcmp(path, "/bkt/short") == 0) { /* 5 bytes, whatever was asked (of a 10-byte object) */
      static const char head[] = "HTTP/1.1 206 Partial Content\r\nContent-Length: 5\r\nContent-Range: bytes 0-4/10"
                                 "\r\n\r\n12345";
      write_all(fd, head, sizeof head - 1);
      continue;
    }
    unsigned obj = 0;
    if (sscanf(path, "/bkt/obj/%u", &obj) != 1 || obj >= OBJECTS || range == NULL || last < first ||
        last >= OBJECT_BYTES) {
      answer(fd, "404 Not Found", "<Error><Code>NoSuchKey</Code></Error>", 37);
      continue;
    }
    size_t n = (size_t)(last - first + 1);
    for (size_t k = 0; k < n; k++) out[k] = pattern(obj, first + k);
    char head[256];
    int h = snprintf(head, sizeof head,
                     "HTTP/1.1 206 Partial Content\r\nContent-Length: %zu\r\nContent-Range: bytes %llu-%llu/%u\r\n\r\n",
                     n, first, last, OBJECT_BYTES);
    write_all(fd, head, (size_t)h);
    write_all(fd, out, n);
  }
  close(fd);
  return NULL;
}

static void *accept_loop(void *p) {
  struct server *s = p;
  for (;;) {
    int fd = accept(s->listen_fd, NULL, NULL);
    if (atomic_load(&s->stop)) {
      if (fd >= 0) close(fd);
      return NULL;
    }
    if (fd < 0) continue;
    int k = atomic_load(&s->n_conn);
    if (k >= MAX_CONN) {
      close(fd);
      continue;
    }
    struct conn_arg *a = malloc(sizeof *a);
    a->s = s;
    a->fd = fd;
    pthread_create(&s->conn[k], NULL, serve_conn, a);
    atomic_store(&s->n_conn, k + 1);
  }
}

static void server_start(struct server *s) {
  memset(s, 0, sizeof *s);
  s->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT(s->listen_fd >= 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT(bind(s->listen_fd, (struct sockaddr *)&addr, sizeof addr) == 0);
  socklen_t len = sizeof addr;
  ASSERT(getsockname(s->listen_fd, (struct sockaddr *)&addr, &len) == 0);
  s->port = ntohs(addr.sin_port);
  ASSERT(listen(s->listen_fd, 64) == 0);
  ASSERT(pthread_create(&s->acceptor, NULL, accept_loop, s) == 0);
}

/* After every reader is closed (its connections with it): the connection
 * threads see EOF; a last connection wakes the acceptor. */
static void server_stop(struct server *s) {
  atomic_store(&s->stop, 1);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(s->port)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT(connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0);
  close(fd);
  pthread_join(s->acceptor, NULL);
  for (int k = 0; k < atomic_load(&s->n_conn); k++) pthread_join(s->conn[k], NULL);
  close(s->listen_fd);
}

struct reader_arg {
  opt4_s3 *r;
  unsigned seed;
  _Atomic int *bad;
};

static void *reader_thread(void *p) {
  struct reader_arg *a = p;
  uint8_t buf[OBJECT_BYTES];
  uint64_t x = a->seed * 2654435761u + 1;
  for (int k = 0; k < READS_PER_THREAD; k++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t item = (x >> 33) % (OBJECTS * 3);
    uint64_t len = 0;
    if (opt4_s3_read(a->r, item, buf, sizeof buf, &len) != 0) {
      atomic_fetch_add(a->bad, 1);
      continue;
    }
    /* item 3*o + j: object o, from byte 100*j, 1000 + j bytes */
    uint64_t o = item / 3, j = item % 3;
    if (len != 1000 + j) atomic_fetch_add(a->bad, 1);
    for (uint64_t b = 0; b < len; b++)
      if (buf[b] != pattern(o, 100 * j + b)) {
        atomic_fetch_add(a->bad, 1);
        break;
      }
  }
  return NULL;
}

static void test_many_threads(void) {
  struct server s;
  server_start(&s);
  char endpoint[64], names[OBJECTS][32];
  const char *keys[OBJECTS];
  snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%u", s.port);
  opt4_range items[OBJECTS * 3];
  for (unsigned o = 0; o < OBJECTS; o++) {
    snprintf(names[o], sizeof names[o], "obj/%u", o);
    keys[o] = names[o];
    for (unsigned j = 0; j < 3; j++) items[3 * o + j] = (opt4_range){o, 100 * j, 1000 + j};
  }
  opt4_s3_config cfg = {.endpoint = endpoint, .bucket = "bkt", .region = "us-west-2", .access_key = "id",
                        .secret_key = "secret", .path_style = 1};
  opt4_s3 *r = NULL;
  ASSERT_OK(opt4_s3_open(&cfg, keys, OBJECTS, items, OBJECTS * 3, &r));
  pthread_t t[THREADS];
  struct reader_arg args[THREADS];
  _Atomic int bad = 0;
  for (unsigned k = 0; k < THREADS; k++) {
    args[k] = (struct reader_arg){r, k, &bad};
    ASSERT(pthread_create(&t[k], NULL, reader_thread, &args[k]) == 0);
  }
  for (unsigned k = 0; k < THREADS; k++) pthread_join(t[k], NULL);
  ASSERT_EQ(atomic_load(&bad), 0);
  opt4_s3_info in;
  ASSERT_OK(opt4_s3_info_get(r, &in));
  ASSERT_U64_EQ(in.reads, THREADS * READS_PER_THREAD);
  ASSERT_U64_EQ(in.requests, THREADS * READS_PER_THREAD);
  ASSERT_U64_EQ(in.failures, 0);
  ASSERT_U64_EQ(atomic_load(&s.requests), THREADS * READS_PER_THREAD);
  ASSERT_U64_EQ(atomic_load(&s.unsigned_requests), 0);
  /* Connections were kept and reused: at most one a thread. */
  ASSERT(atomic_load(&s.n_conn) >= 1 && atomic_load(&s.n_conn) <= THREADS);
  opt4_s3_close(r);
  server_stop(&s);
  ASSERT_NO_ENGINE_MEMORY(); /* every string, key and the pool given back, in full */
}

/* A 503 is tried again (and then served), a 404 is not, a short body is
 * refused, and an unsigned reader sends no Authorization. */
static void test_answers(void) {
  struct server s;
  server_start(&s);
  atomic_store(&s.fail_503_first, 1);
  char endpoint[64];
  snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%u", s.port);
  const char *keys[] = {"o503", "missing", "short"};
  opt4_range items[] = {{0, 0, 10}, {1, 0, 10}, {2, 0, 10}};
  opt4_s3_config cfg = {.endpoint = endpoint, .bucket = "bkt", .region = "us-west-2", .access_key = "id",
                        .secret_key = "secret", .path_style = 1, .max_attempts = 3};
  opt4_s3 *r = NULL;
  ASSERT_OK(opt4_s3_open(&cfg, keys, 3, items, 3, &r));
  uint8_t buf[16];
  uint64_t len = 0;
  ASSERT_OK(opt4_s3_read(r, 0, buf, sizeof buf, &len));
  ASSERT_U64_EQ(len, 10);
  for (unsigned b = 0; b < 10; b++) ASSERT_EQ(buf[b], pattern(0, b));
  ASSERT_U64_EQ(atomic_load(&s.served_503), 1);
  ASSERT_ERR(opt4_s3_read(r, 1, buf, sizeof buf, &len), OPT4_EIO);
  ASSERT(strstr(opt4_errdetail(), "s3://bkt/missing bytes 0-9") != NULL);
  ASSERT(strstr(opt4_errdetail(), "HTTP 404 NoSuchKey: the object is gone") != NULL);
  ASSERT_ERR(opt4_s3_read(r, 2, buf, sizeof buf, &len), OPT4_EIO);
  ASSERT(strstr(opt4_errdetail(), "answered bytes 0-4 came back where 0-9 were asked for (Content-Range)") != NULL);
  opt4_s3_info in;
  ASSERT_OK(opt4_s3_info_get(r, &in));
  /* 503 then 200; one 404; one short answer. */
  ASSERT_U64_EQ(in.requests, 4);
  ASSERT_U64_EQ(in.retries, 1);
  ASSERT_U64_EQ(in.failures, 2);
  ASSERT_U64_EQ(in.reads, 1);
  opt4_s3_close(r);

  opt4_s3_config anon = {.endpoint = endpoint, .bucket = "bkt", .path_style = 1};
  const char *obj[] = {"obj/3"};
  opt4_range one[] = {{0, 7, 5}};
  ASSERT_OK(opt4_s3_open(&anon, obj, 1, one, 1, &r));
  ASSERT_OK(opt4_s3_read(r, 0, buf, sizeof buf, &len));
  for (unsigned b = 0; b < 5; b++) ASSERT_EQ(buf[b], pattern(3, 7 + b));
  ASSERT_U64_EQ(atomic_load(&s.unsigned_requests), 1);
  opt4_s3_close(r);
  server_stop(&s);
  ASSERT_NO_ENGINE_MEMORY(); /* every string, key and the pool given back, in full */
}

int main(void) {
  if (!opt4_s3_available()) SKIP_REST(S3_NOT_BUILT);
  RUN(test_many_threads);
  RUN(test_answers);
  return 0;
}
