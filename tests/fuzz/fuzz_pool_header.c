/* fuzz_pool_header.c - libFuzzer target for the checks a process makes
 * before it uses a pool it found in /dev/shm (src/shm/check.h).
 *
 * The input is a pool's two segments in compact form:
 *   u16 hlen | hlen bytes of the main header (zero-padded to 4 KiB) |
 *   u32 extra (the main segment is 4 KiB + extra % 1 MiB bytes, zeros) |
 *   the meta segment (the rest).
 * Each segment lives in a heap block of exactly its size, so AddressSanitizer
 * catches any read or write past it. If both checks pass, the target binds a
 * handle to the blocks and drives the runtime over the first positions (get,
 * put, skip, note_read, live_at, occurrence_next) with a zero wait timeout:
 * a pool that passes the checks must not make the runtime touch memory
 * outside its segments, whatever its contents. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "layout.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void bind(opt4_pool *pool, uint8_t *base, size_t size, uint8_t *meta, size_t msize) {
  memset(pool, 0, sizeof *pool);
  memcpy(pool->name, "/opt4-fuzz", 11);
  pool->base = base;
  pool->size = size;
  pool->meta = meta;
  pool->meta_size = msize;
  pool_header *h = (pool_header *)(void *)base;
  const meta_header *mh = (const meta_header *)(const void *)meta;
  pool->h = h;
  pool->procs = (proc_rec *)(void *)(base + h->procs_off);
  pool->states = (page_state *)(void *)(base + h->states_off);
  pool->failed = (_Atomic uint64_t *)(void *)(base + h->failed_off);
  pool->payload = base + h->payload_off;
  pool->mh = mh;
  pool->seq = (const uint32_t *)(const void *)(meta + mh->seq_off);
  pool->rt = (const uint32_t *)(const void *)(meta + mh->rt_off);
  pool->gens = (const gen_rec *)(const void *)(meta + mh->gens_off);
  pool->list = (const list_ent *)(const void *)(meta + mh->list_off);
  if (h->occ_count_off != 0) {
    pool->occ_count = (_Atomic uint32_t *)(void *)(base + h->occ_count_off);
    pool->occ_start = (const uint64_t *)(const void *)(meta + mh->occ_start_off);
    pool->occ_pos = (const uint32_t *)(const void *)(meta + mh->occ_pos_off);
  }
  pool->gclaim = (_Atomic uint32_t *)(void *)(base + h->gclaim_off);
  pool->bclaim = h->bclaim_off ? (_Atomic uint32_t *)(void *)(base + h->bclaim_off) : NULL;
  pool->slots = (slot_state *)(void *)(base + h->slot_len_off);
  pool->staging = base + h->staging_off;
  pool->bpos = (const uint32_t *)(const void *)(meta + mh->bpos_off);
  pool->rec = UINT32_MAX;
  pool->timeout_ns = 0; /* every wait gives up at once */
}

static void drive(opt4_pool *pool) {
  /* No record may name a live process but us: the fuzzer's pids are
   * arbitrary, and a "live" writer would only make us wait (boundedly). */
  const pool_header *h = pool->h;
  if (opt4__pool_register(pool) != 0) return;
  uint64_t T = h->accesses < 64 ? h->accesses : 64;
  uint64_t batch[64];
  for (uint64_t t = 0; t < T; t++) batch[t] = t;
  for (uint64_t t = 0; t < T; t++) {
    uint64_t space = 0;
    if (opt4_pool_space(pool, t, &space) != 0) abort();
    size_t cap = space < 65536 ? (size_t)space : 65536;
    uint8_t *buf = malloc(cap ? cap : 1);
    opt4_get_result r;
    int rc = opt4_pool_get(pool, t, (t & 1) ? batch : NULL, (size_t)T, buf, cap, &r);
    if (rc != 0 && rc != OPT4_EPROCS) abort();
    if (rc == 0 && r.status == OPT4_GET_HIT && r.len > cap) abort();
    if (rc == 0 && r.status == OPT4_GET_DEFER) (void)opt4_pool_note_read(pool, t);
    if (rc == 0 && r.status == OPT4_GET_LOAD && r.reason == OPT4_REASON_ADMIT) {
      memset(buf, 0xA5, cap);
      opt4_iovec part = {buf, cap / 2};
      int stored = 0;
      rc = opt4_pool_put(pool, t, &part, 1, &stored);
      if (rc != 0 && rc != OPT4_EITEMSIZE) abort();
    }
    if (t % 7 == 3) (void)opt4_pool_skip(pool, t);
    free(buf);
  }
  uint64_t admits[8];
  uint32_t items[8], before[8];
  size_t n = 0;
  (void)opt4_pool_live_at(pool, T / 2, admits, items, before, 8, &n);
  uint64_t next;
  for (uint32_t i = 0; i < 4 && i < h->items; i++) (void)opt4_pool_occurrence_next(pool, i, &next);
  opt4_pool_stats st;
  (void)opt4_pool_stats_get(pool, &st);
  opt4__pool_reclaim(pool, pool->rec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 6) return 0;
  size_t hlen = (size_t)(data[0] | data[1] << 8) % (POOL_HEADER_SIZE + 1);
  if (size < 2 + hlen + 4) return 0;
  const uint8_t *p = data + 2;
  uint32_t extra;
  memcpy(&extra, p + hlen, 4);
  size_t msize = size - 2 - hlen - 4;
  size_t bsize = POOL_HEADER_SIZE + extra % (1u << 20);
  uint8_t *base = calloc(1, bsize);
  uint8_t *meta = malloc(msize ? msize : 1);
  if (base == NULL || meta == NULL) abort();
  memcpy(base, p, hlen);
  memcpy(meta, p + hlen + 4, msize);
  int rc = opt4__pool_check_header(base, bsize, meta, msize, (uint32_t)getuid(), "/opt4-fuzz");
  if (rc == 0) rc = opt4__pool_check_meta(base, bsize, meta, msize, "/opt4-fuzz");
  if (rc == 0) {
    opt4_pool pool;
    bind(&pool, base, bsize, meta, msize);
    drive(&pool);
  } else if (rc != OPT4_EPOOL) {
    abort();
  }
  free(base);
  free(meta);
  return 0;
}
