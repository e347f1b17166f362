/*
 * plan.c - the plan object: building, accessors, and reconstructions of what
 * the cache holds (victims per position, slot contents at a position).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

opt4_plan *opt4__plan_alloc(void) { return opt4__calloc(1, sizeof(opt4_plan)); }

void opt4_plan_close(opt4_plan *plan) {
  if (plan == NULL) return;
  size_t bytes = (size_t)plan->info.accesses * sizeof(uint32_t);
  opt4__free(plan->own_seq, bytes);
  opt4__free(plan->own_ops, bytes);
  opt4__free(plan->own_gen_off, (size_t)(plan->info.generations + 1) * 8);
  opt4__free(plan->own_pages, (size_t)(plan->pages_len ? plan->pages_len : 1) * 4);
  opt4__free(plan->own_sizes, (size_t)plan->info.items * 4);
  opt4__free(plan->desc, plan->desc_len + 1);
  if (plan->map != NULL) {
    if (plan->map_is_mmap)
      munmap(plan->map, plan->map_len);
    else
      opt4__free(plan->map, plan->map_len);
  }
  opt4__free(plan, sizeof *plan);
}

static int check_opts(const opt4_plan_opts *opts) {
  if (opts == NULL) return opt4__fail(OPT4_EINVAL, "options are NULL");
  if (opts->flags & ~(uint32_t)OPT4_PLAN_NOBYPASS)
    return opt4__fail(OPT4_EINVAL, "unknown plan flags 0x%x", opts->flags);
  if (opts->item_sizes != NULL || opts->capacity_bytes != 0 || opts->page_size != 0) {
    if (opts->item_sizes == NULL || opts->capacity_bytes == 0 || opts->page_size == 0)
      return opt4__fail(OPT4_EINVAL, "a capacity in bytes needs item_sizes, capacity_bytes and "
                        "page_size together");
    if (opts->capacity != 0)
      return opt4__fail(OPT4_EINVAL, "give the capacity in items or in bytes, not both");
    if (opts->page_size > UINT32_MAX)
      return opt4__fail(OPT4_ETOOBIG, "page_size %llu is too large (at most 4 GiB)",
                        (unsigned long long)opts->page_size);
    return 0;
  }
  if (opts->capacity == 0)
    return opt4__fail(OPT4_ECAPACITY,
                      "capacity is 0: a cache must hold at least one item");
  if (opts->capacity > OPT4_MAX_CAPACITY)
    return opt4__fail(OPT4_ETOOBIG, "capacity %llu exceeds the limit %llu",
                      (unsigned long long)opts->capacity,
                      (unsigned long long)OPT4_MAX_CAPACITY);
  return 0;
}

/* Take ownership of a converted sequence and fingerprint it. */
int opt4__plan_attach_seq(opt4_plan *plan, const opt4_seq *seq) {
  size_t bytes;
  int rc = opt4__mul_size((size_t)seq->len, sizeof(uint32_t), &bytes);
  if (rc != 0) return opt4__fail(rc, "sequence too long");
  plan->own_seq = opt4__malloc(bytes);
  if (plan->own_seq == NULL)
    return opt4__fail(OPT4_ENOMEM, "no memory for %llu ids",
                      (unsigned long long)seq->len);
  opt4__advise_huge(plan->own_seq, bytes);
  rc = opt4__seq_to_u32(seq, 0, seq->len, plan->own_seq);
  if (rc != 0) return rc;
  plan->seq = plan->own_seq;
  plan->info.fingerprint = opt4__hash64(plan->own_seq, bytes);
  return 0;
}

int opt4_plan_from_seq(const opt4_seq *seq, opt4_plan **out) {
  opt4__clear_detail();
  if (out == NULL) return opt4__fail(OPT4_EINVAL, "out is NULL");
  *out = NULL;
  int rc = opt4__seq_check(seq);
  if (rc != 0) return rc;
  opt4_plan *plan = opt4__plan_alloc();
  if (plan == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a plan");
  plan->info.items = seq->items;
  plan->info.accesses = seq->len;
  rc = opt4__plan_attach_seq(plan, seq);
  if (rc != 0) goto leave;
  /* Count distinct ids so that compulsory misses are known without a plan. */
  rc = opt4__count_distinct(plan->seq, seq->len, seq->items, &plan->info.compulsory);
  if (rc != 0) rc = opt4__fail(rc, "no memory to count distinct ids");
leave:
  if (rc != 0) {
    opt4_plan_close(plan);
    return rc;
  }
  *out = plan;
  return 0;
}

int opt4__plan_begin(const opt4_seq *seq, const opt4_plan_opts *opts, opt4_plan **out) {
  opt4__clear_detail();
  if (out == NULL) return opt4__fail(OPT4_EINVAL, "out is NULL");
  *out = NULL;
  int rc = opt4__seq_check(seq);
  return rc != 0 ? rc : check_opts(opts);
}

int opt4_plan_build(const opt4_seq *seq, const opt4_plan_opts *opts,
                    opt4_plan **out) {
  int rc = opt4__plan_begin(seq, opts, out);
  if (rc != 0) return rc;

  opt4_plan *plan = opt4__plan_alloc();
  if (plan == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a plan");
  plan->info.items = seq->items;
  plan->info.accesses = seq->len;
  plan->info.capacity = opts->capacity;
  plan->info.flags = opts->flags;
  plan->info.has_ops = 1;
  size_t bytes = (size_t)seq->len * sizeof(uint32_t);
  plan->own_ops = opt4__malloc(bytes);
  if (plan->own_ops == NULL) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory for %llu plan ops",
                    (unsigned long long)seq->len);
    goto leave;
  }
  if (opts->item_sizes != NULL) {
    plan->info.flags |= OPT4_PLAN_SIZED;
    rc = opt4__belady_sized(seq, opts, plan);
    if (rc != 0) goto leave;
    plan->ops = plan->own_ops;
    rc = opt4__plan_attach_seq(plan, seq);
    goto leave;
  }
  /* Decide first and copy the ids after: the key set is freed by then, so
   * the peak stays at two uint32 arrays plus O(items). */
  plan->info.slots = opt4__slot_count(&plan->info);
  rc = opt4__belady(seq, opts, plan->own_ops, &plan->info);
  if (rc != 0) goto leave;
  plan->ops = plan->own_ops;
  rc = opt4__plan_attach_seq(plan, seq);
leave:
  if (rc != 0) {
    opt4_plan_close(plan);
    return rc;
  }
  *out = plan;
  return 0;
}

int opt4_plan_replan(const opt4_plan *src, const opt4_plan_opts *opts,
                     opt4_plan **out) {
  opt4__clear_detail();
  if (src == NULL) return opt4__fail(OPT4_EINVAL, "source plan is NULL");
  opt4_seq seq = {src->seq, OPT4_U32, src->info.accesses, src->info.items};
  return opt4_plan_build(&seq, opts, out);
}

int opt4_plan_info_get(const opt4_plan *plan, opt4_plan_info *out) {
  if (plan == NULL || out == NULL)
    return opt4__fail(OPT4_EINVAL, "plan or out is NULL");
  *out = plan->info;
  return 0;
}

const uint32_t *opt4_plan_seq(const opt4_plan *plan) {
  return plan == NULL ? NULL : plan->seq;
}

const uint32_t *opt4_plan_ops(const opt4_plan *plan) {
  return plan == NULL ? NULL : plan->ops;
}

int opt4_plan_gen_pages(const opt4_plan *plan, uint64_t g, const uint32_t **pages, uint64_t *n) {
  if (plan == NULL || pages == NULL || n == NULL)
    return opt4__fail(OPT4_EINVAL, "plan, pages or n is NULL");
  if (!(plan->info.flags & OPT4_PLAN_SIZED))
    return opt4__fail(OPT4_ENOTSUP, "not a sized plan: an item-capacity plan's ops give the slot");
  if (g >= plan->info.generations)
    return opt4__fail(OPT4_ERANGE, "generation %llu of %llu", (unsigned long long)g,
                      (unsigned long long)plan->info.generations);
  *pages = plan->pages + plan->gen_off[g];
  *n = plan->gen_off[g + 1] - plan->gen_off[g];
  return 0;
}

const uint32_t *opt4_plan_item_sizes(const opt4_plan *plan) {
  return plan == NULL ? NULL : plan->sizes;
}

const char *opt4_plan_desc(const opt4_plan *plan, size_t *len) {
  if (plan == NULL || plan->desc == NULL) {
    if (len != NULL) *len = 0;
    return "";
  }
  if (len != NULL) *len = plan->desc_len;
  return plan->desc;
}

int opt4_plan_set_desc(opt4_plan *plan, const char *desc, size_t len) {
  opt4__clear_detail();
  if (plan == NULL || (desc == NULL && len > 0))
    return opt4__fail(OPT4_EINVAL, "plan or description is NULL");
  if (len > UINT32_MAX)
    return opt4__fail(OPT4_ETOOBIG, "description longer than 4 GiB");
  char *copy = opt4__malloc(len + 1);
  if (copy == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for description");
  if (len > 0) memcpy(copy, desc, len);
  copy[len] = '\0';
  opt4__free(plan->desc, plan->desc_len + 1);
  plan->desc = copy;
  plan->desc_len = len;
  return 0;
}

/* Slot contents after applying ops [0, t); slots never written stay -1. */
static void replay_slots(const opt4_plan *plan, uint64_t t, int64_t *slots,
                         int64_t *victims) {
  for (uint64_t i = 0; i < t; i++) {
    uint32_t op = plan->ops[i];
    if (victims != NULL) victims[i] = -1;
    if (OPT4_OP_KIND(op) != OPT4_OP_ADMIT) continue;
    uint32_t s = OPT4_OP_SLOT(op);
    if (victims != NULL) victims[i] = slots[s];
    slots[s] = plan->seq[i];
  }
}

/* The slots (pages, for a sized plan) the plan's decisions use: info.slots,
 * which the build and the loader both set (for a sized plan, the highest page
 * used plus one, which may be fewer than min(capacity, items, accesses)). */
static uint64_t slots_used(const opt4_plan *plan) { return plan->info.slots; }

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

int opt4__count_distinct(const uint32_t *seq, uint64_t T, uint64_t items, uint64_t *out) {
  uint64_t distinct = 0;
  if ((items + 7) / 8 <= T * sizeof(uint32_t) + 64) {
    size_t bytes = (size_t)((items + 7) / 8);
    uint8_t *seen = opt4__calloc(bytes, 1);
    if (seen == NULL) return OPT4_ENOMEM;
    for (uint64_t t = 0; t < T; t++) {
      uint32_t x = seq[t];
      uint8_t bit = (uint8_t)(1u << (x & 7));
      distinct += (seen[x >> 3] & bit) == 0;
      seen[x >> 3] |= bit;
    }
    opt4__free(seen, bytes);
  } else { /* far more ids than accesses: sort a copy instead */
    size_t bytes = (size_t)T * sizeof(uint32_t);
    uint32_t *copy = opt4__malloc(bytes);
    if (copy == NULL) return OPT4_ENOMEM;
    memcpy(copy, seq, bytes);
    qsort(copy, (size_t)T, sizeof(uint32_t), cmp_u32);
    for (uint64_t t = 0; t < T; t++) distinct += (t == 0 || copy[t] != copy[t - 1]);
    opt4__free(copy, bytes);
  }
  *out = distinct;
  return 0;
}

int opt4_plan_victims(const opt4_plan *plan, int64_t *dst, uint64_t dst_len) {
  opt4__clear_detail();
  if (plan == NULL || (dst == NULL && dst_len > 0))
    return opt4__fail(OPT4_EINVAL, "plan or dst is NULL");
  if (!plan->info.has_ops)
    return opt4__fail(OPT4_ENOPLAN, "the plan holds no decisions");
  if (plan->info.flags & OPT4_PLAN_SIZED)
    return opt4__fail(OPT4_ENOTSUP, "a sized plan's ADMIT may evict several items");
  if (dst_len < plan->info.accesses)
    return opt4__fail(OPT4_EINVAL, "dst holds %llu entries, need %llu",
                      (unsigned long long)dst_len,
                      (unsigned long long)plan->info.accesses);
  uint64_t n = slots_used(plan);
  int64_t *slots = opt4__malloc((size_t)n * sizeof(int64_t));
  if (slots == NULL && n > 0)
    return opt4__fail(OPT4_ENOMEM, "no memory for %llu slots",
                      (unsigned long long)n);
  for (uint64_t s = 0; s < n; s++) slots[s] = -1;
  replay_slots(plan, plan->info.accesses, slots, dst);
  opt4__free(slots, (size_t)n * sizeof(int64_t));
  return 0;
}

int opt4_plan_slots_at(const opt4_plan *plan, uint64_t t, int64_t *dst,
                       uint64_t dst_len) {
  opt4__clear_detail();
  if (plan == NULL || dst == NULL)
    return opt4__fail(OPT4_EINVAL, "plan or dst is NULL");
  if (!plan->info.has_ops)
    return opt4__fail(OPT4_ENOPLAN, "the plan holds no decisions");
  if (t > plan->info.accesses)
    return opt4__fail(OPT4_EINVAL, "position %llu is past the end (%llu)",
                      (unsigned long long)t,
                      (unsigned long long)plan->info.accesses);
  uint64_t n = slots_used(plan);
  if (dst_len < n)
    return opt4__fail(OPT4_EINVAL, "dst holds %llu entries, need %llu",
                      (unsigned long long)dst_len, (unsigned long long)n);
  for (uint64_t s = 0; s < dst_len; s++) dst[s] = -1;
  if (plan->info.flags & OPT4_PLAN_SIZED) {
    for (uint64_t i = 0; i < t; i++) {
      uint32_t op = plan->ops[i];
      if (OPT4_OP_KIND(op) != OPT4_OP_ADMIT) continue;
      uint32_t g = OPT4_OP_SLOT(op);
      for (uint64_t j = plan->gen_off[g]; j < plan->gen_off[g + 1]; j++) dst[plan->pages[j]] = plan->seq[i];
    }
    return 0;
  }
  replay_slots(plan, t, dst, NULL);
  return 0;
}

int opt4__plan_verify(const uint32_t *seq, const uint32_t *ops,
                      const opt4_plan_info *info) {
  uint64_t n = opt4__slot_count(info);
  uint32_t *slots = opt4__malloc((size_t)n * sizeof(uint32_t));
  if (slots == NULL && n > 0)
    return opt4__fail(OPT4_ENOMEM, "no memory to verify %llu slots",
                      (unsigned long long)n);
  memset(slots, 0xFF, (size_t)n * sizeof(uint32_t)); /* empty */
  uint64_t hits = 0, admits = 0, bypasses = 0;
  int rc = 0;
  for (uint64_t t = 0; t < info->accesses; t++) {
    uint32_t op = ops[t], kind = OPT4_OP_KIND(op), s = OPT4_OP_SLOT(op);
    if (kind == OPT4_OP_BYPASS) {
      if (s != 0) {
        rc = opt4__fail(OPT4_ECORRUPT, "op %llu: BYPASS with slot bits set",
                        (unsigned long long)t);
        break;
      }
      bypasses++;
      continue;
    }
    if (kind > OPT4_OP_BYPASS || s >= n) {
      rc = opt4__fail(OPT4_ECORRUPT, "op %llu: kind %u slot %u is invalid "
                      "(capacity %llu)", (unsigned long long)t, kind, s,
                      (unsigned long long)n);
      break;
    }
    if (kind == OPT4_OP_HIT) {
      if (slots[s] != seq[t]) {
        rc = opt4__fail(OPT4_ECORRUPT, "op %llu: HIT on slot %u, which holds "
                        "another id", (unsigned long long)t, s);
        break;
      }
      hits++;
    } else {
      slots[s] = seq[t];
      admits++;
    }
  }
  opt4__free(slots, (size_t)n * sizeof(uint32_t));
  if (rc != 0) return rc;
  if (hits != info->hits || admits != info->admits ||
      bypasses != info->bypasses || info->misses != admits + bypasses)
    return opt4__fail(OPT4_ECORRUPT, "totals in the header (hits %llu, admits "
                      "%llu, bypasses %llu) differ from the ops (%llu, %llu, "
                      "%llu)", (unsigned long long)info->hits,
                      (unsigned long long)info->admits,
                      (unsigned long long)info->bypasses,
                      (unsigned long long)hits, (unsigned long long)admits,
                      (unsigned long long)bypasses);
  return 0;
}
