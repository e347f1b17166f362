/* alloc.c - the engine's allocator hook and its byte counters. */
#include "internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void *default_malloc(void *opaque, size_t size) {
  (void)opaque;
  return malloc(size);
}
static void default_free(void *opaque, void *ptr) {
  (void)opaque;
  free(ptr);
}

static opt4_allocator allocator = {default_malloc, default_free, NULL};
static _Atomic uint64_t mem_current;
static _Atomic uint64_t mem_peak;

void opt4_set_allocator(const opt4_allocator *alloc) {
  if (alloc == NULL || alloc->malloc_fn == NULL || alloc->free_fn == NULL) {
    allocator.malloc_fn = default_malloc;
    allocator.free_fn = default_free;
    allocator.opaque = NULL;
  } else {
    allocator = *alloc;
  }
}

void opt4_mem_stats_get(opt4_mem_stats *out) {
  if (out == NULL) return;
  out->current_bytes = atomic_load(&mem_current);
  out->peak_bytes = atomic_load(&mem_peak);
}

void opt4_mem_peak_reset(void) {
  atomic_store(&mem_peak, atomic_load(&mem_current));
}

int opt4__mul_size(size_t count, size_t size, size_t *out) {
  if (size != 0 && count > SIZE_MAX / size) return OPT4_ETOOBIG;
  *out = count * size;
  return 0;
}

void *opt4__malloc(size_t size) {
  void *p = allocator.malloc_fn(allocator.opaque, size == 0 ? 1 : size);
  if (p != NULL) {
    uint64_t now = atomic_fetch_add(&mem_current, size) + size;
    uint64_t peak = atomic_load(&mem_peak);
    while (now > peak && !atomic_compare_exchange_weak(&mem_peak, &peak, now)) {
    }
  }
  return p;
}

void *opt4__calloc(size_t count, size_t size) {
  size_t bytes;
  if (opt4__mul_size(count, size, &bytes) != 0) return NULL;
  void *p = opt4__malloc(bytes);
  if (p != NULL) memset(p, 0, bytes);
  return p;
}

void opt4__free(void *ptr, size_t size) {
  if (ptr == NULL) return;
  atomic_fetch_sub(&mem_current, size);
  allocator.free_fn(allocator.opaque, ptr);
}

void opt4__advise_huge(void *ptr, size_t len) {
#ifdef MADV_HUGEPAGE
  const uintptr_t page = 4096;
  uintptr_t lo = ((uintptr_t)ptr + page - 1) & ~(page - 1);
  uintptr_t hi = ((uintptr_t)ptr + len) & ~(page - 1);
  if (len >= ((size_t)4 << 20) && hi > lo)
    (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
  (void)ptr;
  (void)len;
#endif
}
