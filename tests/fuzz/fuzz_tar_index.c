/* fuzz_tar_index.c - libFuzzer target for the tar indexer (src/source/tar.c).
 * The input is a whole shard, read from memory. Whatever the bytes, the
 * indexer must either refuse them with an error code, or give samples whose
 * ranges lie inside the input and hold their members, with keys and fields
 * inside the name table; never crash, leak or read out of bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "opt4.h"
#include "tar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
  const uint8_t *p;
  size_t n;
} mem;

static int read_mem(void *ctx, uint64_t off, void *dst, size_t n) {
  const mem *m = ctx;
  if (off > m->n || n > m->n - off) abort(); /* the indexer read past what it was told the file holds */
  memcpy(dst, m->p + off, n);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mem m = {data, size};
  opt4_tar_index *t = NULL;
  int rc = opt4__tar_index_scan("fuzz", read_mem, &m, size, &t);
  if (rc != 0) {
    if (rc >= 0 || t != NULL) abort();
    return 0;
  }
  opt4_tar_view v;
  if (opt4_tar_index_view(t, &v) != 0) abort();
  uint64_t members = 0;
  for (uint64_t s = 0; s < v.n_samples; s++) {
    const opt4_tar_sample *sm = &v.samples[s];
    if (sm->offset > size || sm->length > size - sm->offset) abort();
    if (sm->key_off + sm->key_len > v.names_len || sm->key_len == 0) abort();
    if (sm->first_member != members || sm->members == 0) abort();
    for (uint64_t k = sm->first_member; k < sm->first_member + sm->members; k++) {
      const opt4_tar_member *mm = &v.members[k];
      if (mm->offset > sm->length || mm->size > sm->length - mm->offset) abort();
      if (mm->field_off + mm->field_len > v.names_len) abort();
    }
    members += sm->members;
  }
  if (members != v.n_members) abort();
  opt4_tar_index_close(t);
  return 0;
}
