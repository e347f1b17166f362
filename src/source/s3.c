/*
 * s3.c - byte ranges of objects in an S3-compatible store, as a source:
 * item i is `length` bytes at `offset` of object `file` (one object an
 * image, or many samples a tar shard), each read one ranged GET, made in C
 * on the calling thread: no Python and no GIL on the path.
 *
 * The protocol, written down before the code:
 *
 *   GET <path> HTTP/1.1          path: /<bucket>/<key> (path style) or /<key>
 *   Host: <host>                 (virtual hosted: <bucket>.<endpoint host>)
 *   Range: bytes=<a>-<b>         the item's range, b inclusive
 *   x-amz-content-sha256: <SHA-256 of the empty body>
 *   x-amz-date: <YYYYMMDDTHHMMSSZ, UTC>
 *   x-amz-security-token: <token>                     (temporary credentials)
 *   Authorization: AWS4-HMAC-SHA256 Credential=<id>/<date>/<region>/s3/aws4_request,
 *                  SignedHeaders=host;range;x-amz-content-sha256;x-amz-date[;x-amz-security-token],
 *                  Signature=<hex>
 *
 * Signature Version 4 as AWS documents it (sigv4_get below, checked against
 * AWS's own worked example in tests/c/test_s3.c, and by the loopback test
 * server, which recomputes every signature with botocore). Unsigned
 * requests (a public bucket) send none of the x-amz headers.
 *
 *   If-Match: <the ETag listed>  (when given: opt4_s3_expect; not signed)
 *
 * The answer must be 206 with exactly the range's bytes, or 200 with the
 * whole object when the range is the whole object from byte 0, and is
 * judged in s3answer.c: its Content-Range must name the bytes asked for
 * (and the listed size as the total), its Content-Length the range's
 * length, its ETag the listed one; a body longer than the range is cut off
 * and refused (the object changed since it was listed), a shorter one too.
 * A store that honours If-Match answers a changed object with 412, which
 * fails at once. Connection failures, 5xx and 429 are tried again,
 * max_attempts in all, after 50 ms, 100 ms, ... (at most 2 s), all within
 * the GET's deadline; a 4xx fails at once, the message naming the object,
 * the range, the endpoint, the status and the store's error code. Every
 * wait has an end: a try slower than min_rate bytes a second over
 * timeout_ns fails (libcurl's low-speed limit), and a GET, its tries
 * included, ends at deadline_ns.
 *
 * HTTP is libcurl's (easy handles: one request at a time each, keeping its
 * connection open between requests). Handles wait in a per-process pool:
 * a read takes one (or makes one), uses it, and puts it back, so N threads
 * reading at once hold N connections and no more. Fork: the pool belongs
 * to the process that made it (its pid). A child that reads makes a pool of
 * its own and never touches the parent's (its lock may have been held at
 * the fork, and its connections are the parent's sockets: closing them
 * from the child could end the parent's TLS sessions), so that pool and
 * its handles are left behind in the child, unused, as the memory of a
 * forked process is. Counters live in a shared mapping, as the file
 * ranges' do, so forked workers count into the same place.
 *
 * A 307 or 308 is followed to its Location (at most 3 times, never from
 * https to http), the request signed again for the new host, path and
 * query.
 *
 * https is verified (peer and host name) against the system's CA store, or
 * against ca_bundle when given; a certificate that fails is not tried again.
 *
 * Built only with libcurl and OpenSSL's libcrypto (SHA-256, HMAC); without
 * them opt4_s3_open says so (OPT4_ENOTSUP).
 */
#include "direct.h"
#include "s3answer.h"
#include "source.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifdef OPT4_HAVE_S3
#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <pthread.h>
#endif

struct s3_counters {
  _Atomic uint64_t reads, bytes_read, requests, retries, failures;
};

#ifdef OPT4_HAVE_S3

/* The SHA-256 of nothing: a GET's body. */
static const char EMPTY_SHA256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/* ---- Signature Version 4 ---------------------------------------------------- */

static void hex(const unsigned char *in, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[in[i] >> 4];
    out[2 * i + 1] = digits[in[i] & 15];
  }
  out[2 * n] = '\0';
}

static int hmac(const void *key, size_t key_len, const char *msg, unsigned char out[32]) {
  unsigned int len = 32;
  return HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)msg, strlen(msg), out, &len) != NULL ? 0 : -1;
}

int opt4__sigv4_get(const opt4__sigv4_request *q, char *auth, size_t cap) {
  char canonical[4096], to_sign[512], scope[128], day[9], digest_hex[65];
  unsigned char digest[32], k[32];
  memcpy(day, q->amz_date, 8);
  day[8] = '\0';
  const char *payload = q->payload_sha256 != NULL ? q->payload_sha256 : EMPTY_SHA256;
  const char *token = q->session_token != NULL && q->session_token[0] ? q->session_token : NULL;
  const char *signed_headers = token ? "host;range;x-amz-content-sha256;x-amz-date;x-amz-security-token"
                                     : "host;range;x-amz-content-sha256;x-amz-date";
  int n = snprintf(canonical, sizeof canonical,
                   "GET\n%s\n%s\nhost:%s\nrange:%s\nx-amz-content-sha256:%s\nx-amz-date:%s\n%s%s%s\n%s\n%s", q->path,
                   q->query != NULL ? q->query : "", q->host, q->range, payload, q->amz_date, token ? "x-amz-security-token:" : "", token ? token : "",
                   token ? "\n" : "", signed_headers, payload);
  if (n < 0 || (size_t)n >= sizeof canonical) return opt4__fail(OPT4_ETOOBIG, "a request's path is too long to sign");
  SHA256((const unsigned char *)canonical, (size_t)n, digest);
  hex(digest, 32, digest_hex);
  n = snprintf(scope, sizeof scope, "%s/%s/s3/aws4_request", day, q->region);
  if (n < 0 || (size_t)n >= sizeof scope) return opt4__fail(OPT4_EINVAL, "the region name is too long");
  snprintf(to_sign, sizeof to_sign, "AWS4-HMAC-SHA256\n%s\n%s\n%s", q->amz_date, scope, digest_hex);
  char secret[256];
  n = snprintf(secret, sizeof secret, "AWS4%s", q->secret_key);
  if (n < 0 || (size_t)n >= sizeof secret) return opt4__fail(OPT4_EINVAL, "the secret key is too long");
  int bad = hmac(secret, (size_t)n, day, k) | hmac(k, 32, q->region, k) | hmac(k, 32, "s3", k) |
            hmac(k, 32, "aws4_request", k) | hmac(k, 32, to_sign, digest);
  memset(secret, 0, sizeof secret);
  memset(k, 0, sizeof k);
  if (bad) return opt4__fail(OPT4_EIO, "HMAC-SHA256 failed (OpenSSL)");
  hex(digest, 32, digest_hex);
  n = snprintf(auth, cap, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s", q->access_key, scope,
               signed_headers, digest_hex);
  if (n < 0 || (size_t)n >= cap) return opt4__fail(OPT4_ETOOBIG, "the Authorization header does not fit");
  return 0;
}

/* ---- the reader ------------------------------------------------------------- */

#define POOL_MAX 512u

struct pool {
  pid_t pid;
  pthread_mutex_t lock;
  unsigned n;
  CURL *idle[POOL_MAX];
};

struct opt4_s3 {
  uint64_t n_objects, count, total_bytes, max_len;
  opt4_range *items;
  char **paths; /* each object's request path, URI-encoded: /bucket/key or /key */
  char **keys;  /* each object's key as given (for messages); both into path_buf */
  char *path_buf;
  size_t path_bytes;
  char *base;   /* scheme://authority, without a trailing slash */
  char *host;   /* the Host header, the one signed */
  char *bucket, *region, *access_key, *secret_key, *token;
  char *ca_bundle; /* CURLOPT_CAINFO, or NULL: the system's CA store */
  char *h_host, *h_token; /* the Host and x-amz-security-token header lines, made once */
  uint32_t max_attempts;
  uint64_t timeout_ns, deadline_ns, min_rate;
  char **etags;      /* each object's listed ETag (opt4_s3_expect), or NULL */
  uint64_t *sizes;   /* each object's listed size, or NULL */
  uint64_t *sums;    /* each item's XXH3-64 as indexed (opt4_s3_expect_sums), or NULL */
  _Atomic(struct pool *) pool;
  struct s3_counters *shared;
  char note[192];
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_OK;
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static char *dup_str(const char *s) {
  if (s == NULL) return NULL;
  size_t n = strlen(s) + 1;
  char *d = opt4__malloc(n);
  if (d != NULL) memcpy(d, s, n);
  return d;
}

/* name followed by value, as a new string (NULL: no memory, or value NULL). */
static char *header_line(const char *name, const char *value) {
  if (value == NULL) return NULL;
  size_t a = strlen(name), b = strlen(value);
  char *d = opt4__malloc(a + b + 1);
  if (d != NULL) {
    memcpy(d, name, a);
    memcpy(d + a, value, b + 1);
  }
  return d;
}

static void free_str(char *s) {
  if (s != NULL) {
    size_t n = strlen(s);
    memset(s, 0, n); /* keys do not linger in freed memory */
    opt4__free(s, n + 1);
  }
}

static int unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}

/* The URI-encoded form of s (slashes kept) appended at out; returns its length. */
static size_t encode_path(const char *s, char *out) {
  static const char digits[] = "0123456789ABCDEF";
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (unreserved(*p) || *p == '/') {
      if (out) out[n] = (char)*p;
      n++;
    } else {
      if (out) {
        out[n] = '%';
        out[n + 1] = digits[*p >> 4];
        out[n + 2] = digits[*p & 15];
      }
      n += 3;
    }
  }
  return n;
}

/* This process's pool: the one there, or a new one when it was made before
 * a fork (the parent's is left as it is). */
static struct pool *my_pool(opt4_s3 *r) {
  pid_t me = getpid();
  struct pool *p = atomic_load_explicit(&r->pool, memory_order_acquire);
  while (p == NULL || p->pid != me) {
    struct pool *fresh = opt4__calloc(1, sizeof *fresh);
    if (fresh == NULL) return NULL;
    fresh->pid = me;
    pthread_mutex_init(&fresh->lock, NULL);
    if (atomic_compare_exchange_strong_explicit(&r->pool, &p, fresh, memory_order_acq_rel, memory_order_acquire))
      return fresh;
    pthread_mutex_destroy(&fresh->lock);
    opt4__free(fresh, sizeof *fresh);
  }
  return p;
}

static CURL *take_handle(opt4_s3 *r, struct pool **pp) {
  struct pool *p = my_pool(r);
  *pp = p;
  if (p == NULL) return NULL;
  CURL *h = NULL;
  pthread_mutex_lock(&p->lock);
  if (p->n > 0) h = p->idle[--p->n];
  pthread_mutex_unlock(&p->lock);
  if (h != NULL) return h;
  h = curl_easy_init();
  if (h == NULL) return NULL;
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  /* A try slower than min_rate bytes a second over timeout_ns fails (and
   * is tried again): a store that accepts and never answers, or trickles.
   * The GET's deadline is set per try (CURLOPT_TIMEOUT_MS, what is left). */
  long secs = (long)((r->timeout_ns + 999999999u) / 1000000000u);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, (long)r->min_rate);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, secs > 0 ? secs : 1L);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "opt4torch-s3/1");
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
  if (r->ca_bundle != NULL) curl_easy_setopt(h, CURLOPT_CAINFO, r->ca_bundle);
  return h;
}

static void give_handle(struct pool *p, CURL *h, int keep) {
  if (keep && p->pid == getpid()) {
    pthread_mutex_lock(&p->lock);
    if (p->n < POOL_MAX) {
      p->idle[p->n++] = h;
      h = NULL;
    }
    pthread_mutex_unlock(&p->lock);
  }
  if (h != NULL) curl_easy_cleanup(h);
}

struct sink {
  opt4__s3_answer a;
  char curl_err[CURL_ERROR_SIZE];
};

static size_t on_body(char *data, size_t size, size_t nmemb, void *user) {
  return opt4__s3_answer_body(&((struct sink *)user)->a, data, size * nmemb);
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *user) {
  opt4__s3_answer_header(&((struct sink *)user)->a, data, size * nmemb);
  return size * nmemb;
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The store's error code in an S3 error document (<Code>X</Code>), into out. */
static void error_code(const char *body, char *out, size_t cap) {
  out[0] = '\0';
  const char *a = strstr(body, "<Code>");
  if (a == NULL) return;
  a += 6;
  const char *b = strstr(a, "</Code>");
  if (b == NULL || b == a) return;
  size_t n = (size_t)(b - a) < cap - 1 ? (size_t)(b - a) : cap - 1;
  memcpy(out, a, n);
  out[n] = '\0';
}

static const char *hint_for(long status, const char *code) {
  if (status == 404 && strcmp(code, "NoSuchBucket") == 0) return ": the bucket does not exist";
  if (status == 404) return ": the object is gone (deleted since the listing?)";
  if (status == 403 || status == 401)
    return ": the store refused the credentials (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or unsigned "
           "access for a public bucket)";
  if (status == 416) return ": the object is shorter than the listing said (changed since?)";
  if (status == 307 || status == 308) return ": redirected more than 3 times (a loop?)";
  if (status == 412)
    return ": its ETag is no longer the one listed (If-Match): the object changed since the dataset was made; make "
           "the dataset again";
  return "";
}

/* Where a 307 or 308 sends the GET: loc parsed into the URL to ask (no
 * fragment), the Host to sign, the URI-encoded path and the canonical query
 * (its parameters sorted by name, then value, as SigV4 wants them; taken
 * as encoded by the store). -1 for a Location that is not an absolute
 * http(s) URL, or that would go from https to http. */
struct redirect {
  char url[4096], host[300], h_host[310], path[4096], query[2048];
};

static int param_cmp(const void *a, const void *b) {
  const char *x = *(const char *const *)a, *y = *(const char *const *)b;
  size_t nx = strcspn(x, "="), ny = strcspn(y, "=");
  int c = strncmp(x, y, nx < ny ? nx : ny);
  if (c != 0 || nx != ny) return c != 0 ? c : (nx < ny ? -1 : 1);
  return strcmp(x + nx, y + ny);
}

static int parse_redirect(const char *base, const char *loc, struct redirect *to) {
  int https = strncmp(loc, "https://", 8) == 0;
  if (!https && strncmp(loc, "http://", 7) != 0) return -1;
  if (!https && strncmp(base, "https://", 8) == 0) return -1; /* no downgrade */
  const char *auth = loc + (https ? 8 : 7);
  size_t an = strcspn(auth, "/?#"), pn, qn;
  if (an == 0 || an >= sizeof to->host) return -1;
  const char *path = auth + an;
  pn = path[0] == '/' ? strcspn(path, "?#") : 0;
  const char *query = path + pn;
  qn = query[0] == '?' ? strcspn(query + 1, "#") : 0;
  if (pn >= sizeof to->path || qn >= sizeof to->query) return -1;
  snprintf(to->host, sizeof to->host, "%.*s", (int)an, auth);
  snprintf(to->h_host, sizeof to->h_host, "Host: %s", to->host);
  snprintf(to->path, sizeof to->path, "%.*s", (int)(pn ? pn : 1), pn ? path : "/");
  int n = snprintf(to->url, sizeof to->url, "%.*s%s%s%.*s", (int)(auth + an - loc), loc, to->path, qn ? "?" : "",
                   (int)qn, query + 1);
  if (n < 0 || (size_t)n >= sizeof to->url) return -1;
  /* The canonical query: the parameters sorted, "name=" for one without a value. */
  char raw[2048], *params[64];
  size_t np = 0;
  snprintf(raw, sizeof raw, "%.*s", (int)qn, query + 1);
  for (char *save = NULL, *tok = qn ? strtok_r(raw, "&", &save) : NULL; tok != NULL;
       tok = strtok_r(NULL, "&", &save)) {
    if (np == sizeof params / sizeof params[0]) return -1;
    params[np++] = tok;
  }
  qsort(params, np, sizeof params[0], param_cmp);
  size_t at = 0;
  to->query[0] = '\0';
  for (size_t k = 0; k < np; k++) {
    int m = snprintf(to->query + at, sizeof to->query - at, "%s%s%s", k ? "&" : "", params[k],
                     strchr(params[k], '=') ? "" : "=");
    if (m < 0 || (size_t)m >= sizeof to->query - at) return -1;
    at += (size_t)m;
  }
  return 0;
}

/* Redirects a GET follows (307 and 308: the same request at another place,
 * signed again for it), AIStore's way of balancing its S3 API. */
#define MAX_REDIRECTS 3

int opt4_s3_read(opt4_s3 *r, uint64_t i, void *dst, size_t cap, uint64_t *len) {
  if (r == NULL || len == NULL || (dst == NULL && cap > 0)) return opt4__fail(OPT4_EINVAL, "reader, dst or len is NULL");
  if (i >= r->count) return opt4__fail(OPT4_ERANGE, "item %llu of %llu", (unsigned long long)i,
                                       (unsigned long long)r->count);
  const opt4_range *it = &r->items[i];
  *len = it->length;
  if (it->length > cap)
    return opt4__fail(OPT4_EITEMSIZE, "item %llu is %llu bytes; the buffer holds %zu", (unsigned long long)i,
                      (unsigned long long)it->length, cap);
  if (it->length == 0) { /* a range of nothing is not a request S3 answers (416) */
    atomic_fetch_add_explicit(&r->shared->reads, 1, memory_order_relaxed);
    return 0;
  }
  const char *path = r->paths[it->file], *key = r->keys[it->file];
  unsigned long long first = (unsigned long long)it->offset, last = (unsigned long long)(it->offset + it->length - 1);
  char url[4096], range[64], amz_date[17], auth[512];
  char h_range[80], h_date[40], h_sha[100], h_auth[560], h_match[160] = "";
  int n = snprintf(url, sizeof url, "%s%s", r->base, path);
  if (n < 0 || (size_t)n >= sizeof url) return opt4__fail(OPT4_ETOOBIG, "the URL of object %s is too long", key);
  snprintf(range, sizeof range, "bytes=%llu-%llu", first, last);
  snprintf(h_range, sizeof h_range, "Range: %s", range);
  const char *etag = r->etags != NULL && r->etags[it->file][0] ? r->etags[it->file] : NULL;
  if (etag != NULL) snprintf(h_match, sizeof h_match, "If-Match: %s", etag);
  opt4__s3_asked asked = {.first = it->offset, .length = it->length,
                          .size = r->sizes != NULL ? r->sizes[it->file] : UINT64_MAX, .etag = etag};
  uint64_t start = now_ns();
  struct pool *pool = NULL;
  CURL *h = take_handle(r, &pool);
  if (h == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for an HTTP handle (libcurl)");
  int rc = 0;
  unsigned backoff = 50, redirects = 0;
  struct redirect *to = NULL; /* where the last 307 sent the GET, or NULL: the reader's own URL */
  for (uint32_t attempt = 1;; attempt++) {
    struct curl_slist *hdr = NULL, *t;
    hdr = curl_slist_append(hdr, to != NULL ? to->h_host : r->h_host);
    hdr = (t = hdr ? curl_slist_append(hdr, h_range) : NULL) ? t : hdr;
    hdr = (t = hdr ? curl_slist_append(hdr, "Accept:") : NULL) ? t : hdr; /* no Accept: curl's default, unsigned */
    if (etag != NULL) hdr = (t = hdr ? curl_slist_append(hdr, h_match) : NULL) ? t : hdr;
    if (r->access_key != NULL) {
      time_t now = time(NULL);
      struct tm tm;
      gmtime_r(&now, &tm);
      strftime(amz_date, sizeof amz_date, "%Y%m%dT%H%M%SZ", &tm);
      opt4__sigv4_request q = {.host = to != NULL ? to->host : r->host, .path = to != NULL ? to->path : path,
                               .range = range, .amz_date = amz_date, .region = r->region,
                               .access_key = r->access_key, .secret_key = r->secret_key, .session_token = r->token,
                               .payload_sha256 = NULL, .query = to != NULL ? to->query : NULL};
      if ((rc = opt4__sigv4_get(&q, auth, sizeof auth)) != 0) {
        curl_slist_free_all(hdr);
        break;
      }
      snprintf(h_date, sizeof h_date, "x-amz-date: %s", amz_date);
      snprintf(h_sha, sizeof h_sha, "x-amz-content-sha256: %s", EMPTY_SHA256);
      snprintf(h_auth, sizeof h_auth, "Authorization: %s", auth);
      hdr = (t = hdr ? curl_slist_append(hdr, h_date) : NULL) ? t : hdr;
      hdr = (t = hdr ? curl_slist_append(hdr, h_sha) : NULL) ? t : hdr;
      if (r->h_token) hdr = (t = hdr ? curl_slist_append(hdr, r->h_token) : NULL) ? t : hdr;
      hdr = (t = hdr ? curl_slist_append(hdr, h_auth) : NULL) ? t : hdr;
    }
    if (hdr == NULL) {
      rc = opt4__fail(OPT4_ENOMEM, "no memory for a request's headers");
      break;
    }
    uint64_t spent = now_ns() - start;
    if (spent >= r->deadline_ns) {
      curl_slist_free_all(hdr);
      rc = opt4__fail(OPT4_EIO, "GET s3://%s/%s bytes %llu-%llu at %s did not finish within its deadline of %.3g s "
                      "(%u tries): the store is too slow or does not answer (deadline_s sets it)", r->bucket, key,
                      first, last, r->base, (double)r->deadline_ns / 1e9, attempt - 1);
      break;
    }
    uint64_t left_ms = (r->deadline_ns - spent + 999999u) / 1000000u;
    struct sink s;
    opt4__s3_answer_init(&s.a, dst, (size_t)it->length);
    s.curl_err[0] = '\0';
    curl_easy_setopt(h, CURLOPT_URL, to != NULL ? to->url : url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &s);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, s.curl_err);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(left_ms > 0x7fffffff ? 0x7fffffff : left_ms));
    CURLcode cc = curl_easy_perform(h);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    curl_slist_free_all(hdr);
    atomic_fetch_add_explicit(&r->shared->requests, 1, memory_order_relaxed);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    int retry = 0;
    char why[400];
    const char *cerr = s.curl_err[0] ? s.curl_err : curl_easy_strerror(cc);
    if (s.a.over) {
      int code = opt4__s3_answer_check(&s.a, &asked, why, sizeof why);
      rc = opt4__fail(code ? code : OPT4_EIO, "GET s3://%s/%s bytes %llu-%llu at %s answered %s", r->bucket, key,
                      first, last, r->base, why);
    } else if (cc == CURLE_OPERATION_TIMEDOUT && now_ns() - start >= r->deadline_ns) {
      rc = opt4__fail(OPT4_EIO, "GET s3://%s/%s bytes %llu-%llu at %s did not finish within its deadline of %.3g s "
                      "(%u tries; %zu of %llu bytes in the last): the store is too slow or does not answer "
                      "(deadline_s sets it)", r->bucket, key, first, last, r->base, (double)r->deadline_ns / 1e9,
                      attempt, s.a.got, (unsigned long long)it->length);
    } else if (cc == CURLE_OPERATION_TIMEDOUT) {
      retry = 1;
      rc = opt4__fail(OPT4_EIO, "GET s3://%s/%s bytes %llu-%llu at %s failed after %u tries: %s: slower than %llu "
                      "bytes a second over %.3g s (min_rate and timeout set it)", r->bucket, key, first, last,
                      r->base, attempt, cerr, (unsigned long long)r->min_rate, (double)r->timeout_ns / 1e9);
    } else if (cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE) {
      rc = opt4__fail(OPT4_EIO, "GET s3://%s/%s bytes %llu-%llu at %s: %s: %s", r->bucket, key, first, last, r->base,
                      cerr,
                      cc == CURLE_SSL_CACERT_BADFILE
                          ? "the CA bundle given (ca_bundle) cannot be read as PEM certificates"
                          : r->ca_bundle != NULL
                                ? "the store's TLS certificate is not one the CA bundle given (ca_bundle) vouches for"
                                : "the store's TLS certificate is not one the system's CAs vouch for; give the CA "
                                  "that signed it (ca_bundle=PATH)");
    } else if (cc == CURLE_PARTIAL_FILE) {
      retry = 1;
      rc = opt4__fail(OPT4_EIO, "GET s3://%s/%s bytes %llu-%llu at %s failed after %u tries: the answer was cut "
                      "short (%s): the store announced more bytes than it sent", r->bucket, key, first, last,
                      r->base, attempt, cerr);
    } else if (cc != CURLE_OK) {
      retry = 1;
      rc = opt4__fail(OPT4_EIO, "GET s3://%s/%s bytes %llu-%llu at %s (%s%s) failed after %u tries: %s: the store "
                      "did not answer (is the endpoint right, and the server up?)", r->bucket, key, first, last,
                      r->base, r->base, path, attempt, cerr);
    } else if ((status == 307 || status == 308) && redirects < MAX_REDIRECTS) {
      char *loc = NULL;
      curl_easy_getinfo(h, CURLINFO_REDIRECT_URL, &loc);
      if (to == NULL && (to = opt4__malloc(sizeof *to)) == NULL) {
        rc = opt4__fail(OPT4_ENOMEM, "no memory to follow a redirect");
      } else if (loc == NULL || parse_redirect(r->base, loc, to) != 0) {
        rc = opt4__fail(OPT4_EIO, "GET s3://%s/%s bytes %llu-%llu at %s: HTTP %ld to %s, which is not a place to "
                        "follow (an absolute http(s) URL, never from https to http)", r->bucket, key, first, last,
                        r->base, status, loc != NULL ? loc : "nowhere (no Location)");
      } else {
        redirects++;
        attempt--; /* a redirect is not a try that failed */
        continue;
      }
    } else if (status == 206 || status == 200) {
      int code = opt4__s3_answer_check(&s.a, &asked, why, sizeof why);
      rc = code == 0 ? 0
                     : opt4__fail(code, "GET s3://%s/%s bytes %llu-%llu at %s answered %s", r->bucket, key, first,
                                  last, r->base, why);
    } else {
      char code[64];
      error_code(s.a.err, code, sizeof code);
      retry = status >= 500 || status == 429;
      rc = opt4__fail(status == 412 ? OPT4_ETRUNCATED : OPT4_EIO, "GET s3://%s/%s bytes %llu-%llu at %s: HTTP %ld%s%s%s",
                      r->bucket, key, first, last, r->base, status, code[0] ? " " : "", code, hint_for(status, code));
    }
    if (rc == 0 || !retry || attempt >= r->max_attempts) break;
    atomic_fetch_add_explicit(&r->shared->retries, 1, memory_order_relaxed);
    opt4__sleep_ns((uint64_t)backoff * 1000000u); /* the backoff before a try again (direct.c) */
    backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
  }
  give_handle(pool, h, rc == 0);
  if (to != NULL) opt4__free(to, sizeof *to);
  if (rc == 0 && r->sums != NULL) {
    char where[4200];
    snprintf(where, sizeof where, "s3://%s/%s", r->bucket, key);
    rc = opt4__item_sum_check(r->sums, i, dst, it->length, where);
  }
  if (rc != 0) {
    atomic_fetch_add_explicit(&r->shared->failures, 1, memory_order_relaxed);
    return rc;
  }
  atomic_fetch_add_explicit(&r->shared->reads, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&r->shared->bytes_read, it->length, memory_order_relaxed);
  return 0;
}

int opt4_s3_open(const opt4_s3_config *cfg, const char *const *keys, uint64_t n_objects, const opt4_range *items,
                 uint64_t n_items, opt4_s3 **out) {
  opt4__clear_detail();
  if (out == NULL || cfg == NULL || (keys == NULL && n_objects > 0) || (items == NULL && n_items > 0))
    return opt4__fail(OPT4_EINVAL, "config, keys, items or out is NULL");
  *out = NULL;
  if (cfg->bucket == NULL || !cfg->bucket[0]) return opt4__fail(OPT4_EINVAL, "no bucket");
  if ((cfg->access_key == NULL) != (cfg->secret_key == NULL))
    return opt4__fail(OPT4_EINVAL, "an access key needs its secret key, and the other way round");
  if (n_items > OPT4_MAX_ITEMS)
    return opt4__fail(OPT4_ETOOBIG, "%llu items; at most %llu are supported", (unsigned long long)n_items,
                      (unsigned long long)OPT4_MAX_ITEMS);
  pthread_once(&curl_once, curl_init);
  if (curl_init_rc != CURLE_OK)
    return opt4__fail(OPT4_EIO, "libcurl would not start: %s", curl_easy_strerror(curl_init_rc));
  const char *region = cfg->region != NULL && cfg->region[0] ? cfg->region : "us-east-1";
  /* The endpoint: scheme://authority[/...]; AWS's for the region when none. */
  char endpoint[512];
  if (cfg->endpoint != NULL && cfg->endpoint[0])
    snprintf(endpoint, sizeof endpoint, "%s", cfg->endpoint);
  else
    snprintf(endpoint, sizeof endpoint, "https://s3.%s.amazonaws.com", region);
  const char *sep = strstr(endpoint, "://");
  if (sep == NULL || (strncmp(endpoint, "http://", 7) != 0 && strncmp(endpoint, "https://", 8) != 0))
    return opt4__fail(OPT4_EINVAL, "endpoint %s: expected http://host[:port] or https://host[:port]", endpoint);
  const char *authority = sep + 3;
  size_t auth_len = strcspn(authority, "/?#");
  if (auth_len == 0 || auth_len > 255) return opt4__fail(OPT4_EINVAL, "endpoint %s names no host", endpoint);
  if (authority[auth_len] == '/' && authority[auth_len + 1] != '\0')
    return opt4__fail(OPT4_EINVAL, "endpoint %s has a path; give the store's root (scheme://host[:port])", endpoint);
  int path_style = cfg->path_style != 0;
  int rc = 0;
  opt4_s3 *r = opt4__calloc(1, sizeof *r);
  if (r == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for an S3 reader");
  r->n_objects = n_objects;
  r->count = n_items;
  r->max_attempts = cfg->max_attempts ? cfg->max_attempts : 3;
  r->timeout_ns = cfg->timeout_ns ? cfg->timeout_ns : 60ull * 1000000000ull;
  r->deadline_ns = cfg->deadline_ns ? cfg->deadline_ns : 300ull * 1000000000ull;
  r->min_rate = cfg->min_rate ? cfg->min_rate : 1024u;
  char host[600], base[700];
  size_t scheme_len = (size_t)(authority - endpoint);
  if (path_style)
    snprintf(host, sizeof host, "%.*s", (int)auth_len, authority);
  else
    snprintf(host, sizeof host, "%s.%.*s", cfg->bucket, (int)auth_len, authority);
  snprintf(base, sizeof base, "%.*s%s", (int)scheme_len, endpoint, host);
  r->base = dup_str(base);
  r->host = dup_str(host);
  r->bucket = dup_str(cfg->bucket);
  r->region = dup_str(region);
  if (cfg->ca_bundle != NULL && cfg->ca_bundle[0] && (r->ca_bundle = dup_str(cfg->ca_bundle)) == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for an S3 reader");
    goto fail;
  }
  if (cfg->access_key != NULL) {
    r->access_key = dup_str(cfg->access_key);
    r->secret_key = dup_str(cfg->secret_key);
    if (cfg->session_token != NULL && cfg->session_token[0]) r->token = dup_str(cfg->session_token);
  }
  r->h_host = header_line("Host: ", r->host);
  if (r->token != NULL) r->h_token = header_line("x-amz-security-token: ", r->token);
  if (r->base == NULL || r->host == NULL || r->bucket == NULL || r->region == NULL || r->h_host == NULL ||
      (cfg->access_key != NULL && (r->access_key == NULL || r->secret_key == NULL)) ||
      (r->token != NULL && r->h_token == NULL)) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for an S3 reader");
    goto fail;
  }
  for (uint64_t i = 0; i < n_items; i++) {
    const opt4_range *it = &items[i];
    if (it->file >= n_objects) {
      rc = opt4__fail(OPT4_ERANGE, "item %llu is in object %llu; there are %llu objects", (unsigned long long)i,
                      (unsigned long long)it->file, (unsigned long long)n_objects);
      goto fail;
    }
    if (it->offset > (UINT64_C(1) << 62) || it->length > (UINT64_C(1) << 62)) {
      rc = opt4__fail(OPT4_ERANGE, "item %llu's range is past 2^62", (unsigned long long)i);
      goto fail;
    }
    r->total_bytes += it->length;
    if (it->length > r->max_len) r->max_len = it->length;
  }
  size_t bucket_part = path_style ? 1 + encode_path(cfg->bucket, NULL) : 0;
  for (uint64_t f = 0; f < n_objects; f++) {
    if (keys[f] == NULL || !keys[f][0]) {
      rc = opt4__fail(OPT4_EINVAL, "object %llu has no key", (unsigned long long)f);
      goto fail;
    }
    r->path_bytes += bucket_part + 1 + encode_path(keys[f], NULL) + 1 + strlen(keys[f]) + 1;
  }
  if (n_items > 0 && (r->items = opt4__malloc(n_items * sizeof *r->items)) == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for %llu items", (unsigned long long)n_items);
    goto fail;
  }
  if (n_items > 0) memcpy(r->items, items, n_items * sizeof *r->items);
  r->paths = opt4__calloc(n_objects ? n_objects : 1, sizeof *r->paths);
  r->keys = opt4__calloc(n_objects ? n_objects : 1, sizeof *r->keys);
  r->path_buf = opt4__malloc(r->path_bytes ? r->path_bytes : 1);
  if (r->paths == NULL || r->keys == NULL || r->path_buf == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for %llu object keys", (unsigned long long)n_objects);
    goto fail;
  }
  char *p = r->path_buf;
  for (uint64_t f = 0; f < n_objects; f++) {
    r->paths[f] = p;
    if (path_style) {
      *p++ = '/';
      p += encode_path(cfg->bucket, p);
    }
    *p++ = '/';
    p += encode_path(keys[f], p);
    *p++ = '\0';
    r->keys[f] = p;
    size_t kn = strlen(keys[f]) + 1;
    memcpy(p, keys[f], kn);
    p += kn;
  }
  r->shared = mmap(NULL, sizeof *r->shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (r->shared == MAP_FAILED) {
    r->shared = NULL;
    rc = opt4__fail(OPT4_ENOMEM, "no memory for the shared counters");
    goto fail;
  }
  snprintf(r->note, sizeof r->note, "ranged GETs in C (libcurl), %s, %s, %s-style", r->base,
           r->access_key ? "signed (SigV4)" : "unsigned", path_style ? "path" : "virtual-hosted");
  *out = r;
  return 0;
fail:
  opt4_s3_close(r);
  return rc;
}

void opt4_s3_close(opt4_s3 *r) {
  if (r == NULL) return;
  struct pool *p = atomic_load(&r->pool);
  if (p != NULL && p->pid == getpid()) { /* a forked child leaves the parent's pool alone (see above) */
    for (unsigned k = 0; k < p->n; k++) curl_easy_cleanup(p->idle[k]);
    pthread_mutex_destroy(&p->lock);
    opt4__free(p, sizeof *p);
  }
  if (r->items) opt4__free(r->items, r->count * sizeof *r->items);
  if (r->paths) opt4__free(r->paths, (r->n_objects ? r->n_objects : 1) * sizeof *r->paths);
  if (r->keys) opt4__free(r->keys, (r->n_objects ? r->n_objects : 1) * sizeof *r->keys);
  if (r->path_buf) opt4__free(r->path_buf, r->path_bytes ? r->path_bytes : 1);
  free_str(r->base);
  free_str(r->host);
  free_str(r->bucket);
  free_str(r->region);
  free_str(r->ca_bundle);
  free_str(r->access_key);
  free_str(r->secret_key);
  free_str(r->token);
  free_str(r->h_host);
  free_str(r->h_token);
  if (r->etags != NULL) {
    for (uint64_t f = 0; f < r->n_objects; f++) free_str(r->etags[f]);
    opt4__free(r->etags, (r->n_objects ? r->n_objects : 1) * sizeof *r->etags);
  }
  if (r->sizes != NULL) opt4__free(r->sizes, (r->n_objects ? r->n_objects : 1) * sizeof *r->sizes);
  opt4__item_sums_free(r->sums, r->count);
  if (r->shared) munmap(r->shared, sizeof *r->shared);
  opt4__free(r, sizeof *r);
}

int opt4_s3_expect(opt4_s3 *r, const char *const *etags, const uint64_t *sizes, uint64_t n_objects) {
  opt4__clear_detail();
  if (r == NULL || (etags == NULL && sizes == NULL)) return opt4__fail(OPT4_EINVAL, "reader, etags and sizes are NULL");
  if (n_objects != r->n_objects)
    return opt4__fail(OPT4_EINVAL, "%llu identities for %llu objects", (unsigned long long)n_objects,
                      (unsigned long long)r->n_objects);
  if (r->etags != NULL || r->sizes != NULL) return opt4__fail(OPT4_EINVAL, "the objects' identities are already set");
  size_t n = n_objects ? (size_t)n_objects : 1;
  for (uint64_t f = 0; etags != NULL && f < n_objects; f++) {
    const char *e = etags[f] != NULL ? etags[f] : "";
    for (const char *c = e; *c; c++)
      if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
        return opt4__fail(OPT4_EINVAL, "the ETag of object %s holds a byte that cannot go in a header", r->keys[f]);
    if (strlen(e) > 128) return opt4__fail(OPT4_EINVAL, "the ETag of object %s is over 128 bytes", r->keys[f]);
  }
  if (etags != NULL) {
    if ((r->etags = opt4__calloc(n, sizeof *r->etags)) == NULL) goto oom;
    for (uint64_t f = 0; f < n_objects; f++)
      if ((r->etags[f] = dup_str(etags[f] != NULL ? etags[f] : "")) == NULL) goto oom;
  }
  if (sizes != NULL) {
    if ((r->sizes = opt4__malloc(n * sizeof *r->sizes)) == NULL) goto oom;
    if (n_objects) memcpy(r->sizes, sizes, (size_t)n_objects * sizeof *r->sizes);
  }
  return 0;
oom:
  if (r->etags != NULL) {
    for (uint64_t f = 0; f < n_objects; f++) free_str(r->etags[f]);
    opt4__free(r->etags, n * sizeof *r->etags);
    r->etags = NULL;
  }
  return opt4__fail(OPT4_ENOMEM, "no memory for %llu objects' ETags", (unsigned long long)n_objects);
}

int opt4_s3_expect_sums(opt4_s3 *r, const uint64_t *sums, uint64_t n_items) {
  opt4__clear_detail();
  if (r == NULL) return opt4__fail(OPT4_EINVAL, "reader is NULL");
  return opt4__item_sums_set(&r->sums, r->count, sums, n_items);
}

int opt4_s3_info_get(const opt4_s3 *r, opt4_s3_info *out) {
  if (r == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "reader or out is NULL");
  memset(out, 0, sizeof *out);
  out->count = r->count;
  out->objects = r->n_objects;
  out->total_bytes = r->total_bytes;
  out->max_len = r->max_len;
  out->reads = atomic_load_explicit(&r->shared->reads, memory_order_relaxed);
  out->bytes_read = atomic_load_explicit(&r->shared->bytes_read, memory_order_relaxed);
  out->requests = atomic_load_explicit(&r->shared->requests, memory_order_relaxed);
  out->retries = atomic_load_explicit(&r->shared->retries, memory_order_relaxed);
  out->failures = atomic_load_explicit(&r->shared->failures, memory_order_relaxed);
  out->note = r->note;
  return 0;
}

int opt4_s3_len(const opt4_s3 *r, uint64_t i, uint64_t *len) {
  if (r == NULL || len == NULL) return opt4__fail(OPT4_EINVAL, "reader or len is NULL");
  if (i >= r->count)
    return opt4__fail(OPT4_ERANGE, "item %llu of %llu", (unsigned long long)i, (unsigned long long)r->count);
  *len = r->items[i].length;
  return 0;
}

#else /* no libcurl: the reader is not built */

#define NO_S3 \
  opt4__fail(OPT4_ENOTSUP, "this build of the engine has no S3 reader: it needs libcurl and OpenSSL's libcrypto " \
                           "at build time (Debian: apt install libcurl4-openssl-dev libssl-dev; then reinstall)")

int opt4__sigv4_get(const opt4__sigv4_request *q, char *auth, size_t cap) {
  (void)q, (void)auth, (void)cap;
  return NO_S3;
}
int opt4_s3_open(const opt4_s3_config *cfg, const char *const *keys, uint64_t n_objects, const opt4_range *items,
                 uint64_t n_items, opt4_s3 **out) {
  (void)cfg, (void)keys, (void)n_objects, (void)items, (void)n_items;
  if (out) *out = NULL;
  return NO_S3;
}
void opt4_s3_close(opt4_s3 *r) { (void)r; }
int opt4_s3_expect(opt4_s3 *r, const char *const *etags, const uint64_t *sizes, uint64_t n_objects) {
  (void)r, (void)etags, (void)sizes, (void)n_objects;
  return NO_S3;
}
int opt4_s3_expect_sums(opt4_s3 *r, const uint64_t *sums, uint64_t n_items) {
  (void)r, (void)sums, (void)n_items;
  return NO_S3;
}
int opt4_s3_info_get(const opt4_s3 *r, opt4_s3_info *out) {
  (void)r, (void)out;
  return NO_S3;
}
int opt4_s3_len(const opt4_s3 *r, uint64_t i, uint64_t *len) {
  (void)r, (void)i, (void)len;
  return NO_S3;
}
int opt4_s3_read(opt4_s3 *r, uint64_t i, void *dst, size_t cap, uint64_t *len) {
  (void)r, (void)i, (void)dst, (void)cap, (void)len;
  return NO_S3;
}
#endif

int opt4_s3_available(void) {
#ifdef OPT4_HAVE_S3
  return 1;
#else
  return 0;
#endif
}

/* ---- the source ------------------------------------------------------------- */

static int s3_count(void *state, uint64_t *items) {
  opt4_s3_info in;
  int rc = opt4_s3_info_get(state, &in);
  if (rc == 0) *items = in.count;
  return rc;
}

static int s3_size_of(void *state, uint64_t item, uint64_t *len) { return opt4_s3_len(state, item, len); }

static int s3_max_size(void *state, uint64_t *len) {
  opt4_s3_info in;
  int rc = opt4_s3_info_get(state, &in);
  if (rc == 0) *len = in.max_len;
  return rc;
}

static int s3_submit(void *state, opt4_source_read *reads, size_t n) {
  for (size_t i = 0; i < n; i++)
    reads[i].status = opt4_s3_read(state, reads[i].item, reads[i].dst, reads[i].cap, &reads[i].len);
  return 0;
}

const opt4_source_ops opt4__source_s3_ops = {
    .version = OPT4_SOURCE_OPS_VERSION,
    .name = "s3",
    .count = s3_count,
    .size_of = s3_size_of,
    .max_size = s3_max_size,
    .submit = s3_submit,
};

int opt4_source_s3(opt4_s3 *r, opt4_source **out) {
  opt4__clear_detail();
  if (r == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "reader or out is NULL");
  return opt4_source_create(&opt4__source_s3_ops, r, out);
}
