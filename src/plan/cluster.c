/*
 * cluster.c - one OPT cache over several nodes: where each generation of an
 * aggregate plan lives (opt4_cluster_place; the rule and why it always fits
 * are in opt4.h and docs/cluster.md).
 *
 * Two passes over the caller's nodes array, which holds the next uses in
 * between, as belady.c does with ops:
 *   pass 1 (backward): nodes[t] = the next position of the same item, or
 *     OPT4__NEVER; each reader's node id is checked here.
 *   pass 2 (forward): reads nodes[t] (position t's next use) before writing
 *     position t's node there, and never looks at another position's entry,
 *     so the array serves both. A generation continues from t to next(t)
 *     exactly when the plan's op at next(t) is a HIT.
 *
 * With windows (opts->window_of) each item's current generation also keeps
 * where and when it was admitted, whether away from its reader, and whether
 * a read has yet been in time (admitted[x]), which says from which window on
 * its home reads it and a peer can (opt4.h, "Windows"). A generation kept
 * away that ends with no read in time would have been sent for nothing: at
 * its end its ADMIT becomes a BYPASS (forward_undo).
 *
 * A warm prefix (opts->prefix) is what nodes hold at the start: its kept
 * generations are homed where they are (no transfer), marked warm, and
 * count in no access figure (opt4.h, "A warm prefix").
 *
 * "The node with the most room" is a tournament tree over the nodes: each
 * inner entry holds the better of its two children (more room; on ties the
 * left one, whose ids are lower), so the root is the answer and a change in
 * one node's room costs log2(n_nodes) steps.
 */
#include "internal.h"

#include <string.h>

typedef struct cluster_ctx {
  uint64_t T, N;
  uint32_t n_nodes;
  uint32_t leaves; /* a power of two >= n_nodes */
  int64_t *room;   /* leaves entries: capacity - live; -1 past n_nodes */
  uint32_t *best;  /* 2 * leaves entries: best[1] is the node with most room */
  uint64_t *live;  /* n_nodes */
  uint32_t *home;  /* N: pass 1, last position seen; pass 2, current home */
  struct admitted *admitted; /* N, with windows only: see the top */
} cluster_ctx;

struct admitted {
  uint64_t pos;    /* the generation's ADMIT */
  uint32_t window; /* its window */
  uint8_t away;    /* kept away from the node that read it */
  uint8_t served;  /* a read of it has been in time */
  uint8_t warm;    /* held from the start (a warm prefix's): window is window_of[0] */
};

/* With windows: can node `reader` read generation x (at home `home`) in
 * window w? */
static int in_time(const cluster_ctx *c, uint32_t x, uint32_t home, uint32_t reader, uint64_t w) {
  const struct admitted *a = &c->admitted[x];
  if (a->warm) return reader == home || w >= (uint64_t)a->window + 1;
  if (reader == home) return !a->away || w >= (uint64_t)a->window + 2;
  return w >= (uint64_t)a->window + 2 + a->away;
}

/* Count (times 1) or take back (times UINT64_MAX, that is -1 in unsigned
 * arithmetic) one transfer of size bytes from src to dst. */
static void count_transfer(opt4_cluster_node *stats, opt4_cluster_info *info, uint32_t src, uint32_t dst,
                           uint64_t size, uint64_t times) {
  stats[src].peer_items_sent += times;
  stats[src].peer_bytes_sent += times * size;
  stats[dst].peer_items_received += times;
  stats[dst].peer_bytes_received += times * size;
  info->peer_bytes += times * size;
}

/* With windows, at the end of generation x kept at `home` away from the
 * node that read it: if no read of it was in time, nothing needed it
 * there, so its ADMIT is a BYPASS and nothing is sent (counts undone). */
static void forward_undo(const cluster_ctx *c, uint32_t x, uint32_t home, uint64_t size, const uint32_t *node_of,
                         uint8_t *kinds, uint32_t *nodes, opt4_cluster_node *stats, opt4_cluster_info *info) {
  const struct admitted *a = &c->admitted[x];
  if (!a->away || a->served) return;
  const uint32_t r = node_of[a->pos];
  kinds[a->pos] = OPT4_CLUSTER_BYPASS;
  nodes[a->pos] = OPT4_CLUSTER_NONE;
  stats[r].admits--;
  stats[r].bypasses++;
  stats[home].homed--;
  info->remote_admits--;
  count_transfer(stats, info, r, home, size, UINT64_MAX);
}

static uint32_t better(const cluster_ctx *c, uint32_t a, uint32_t b) {
  return c->room[a] >= c->room[b] ? a : b; /* a is the lower id */
}

static void tree_build(cluster_ctx *c) {
  for (uint32_t i = 0; i < c->leaves; i++) c->best[c->leaves + i] = i;
  for (uint32_t k = c->leaves - 1; k >= 1; k--)
    c->best[k] = better(c, c->best[2 * k], c->best[2 * k + 1]);
}

static void tree_update(cluster_ctx *c, uint32_t node) {
  for (uint32_t k = (c->leaves + node) / 2; k >= 1; k /= 2)
    c->best[k] = better(c, c->best[2 * k], c->best[2 * k + 1]);
}

static void take(cluster_ctx *c, uint32_t node, uint64_t need, opt4_cluster_node *st) {
  c->live[node] += need;
  c->room[node] -= (int64_t)need;
  if (c->live[node] > st[node].peak_resident) st[node].peak_resident = c->live[node];
  tree_update(c, node);
}

static void release(cluster_ctx *c, uint32_t node, uint64_t need) {
  c->live[node] -= need;
  c->room[node] += (int64_t)need;
  tree_update(c, node);
}

static int check_args(const opt4_plan *plan, const opt4_cluster_opts *opts, const uint8_t *kinds,
                      const uint32_t *nodes, uint64_t dst_len, const opt4_cluster_node *stats,
                      const opt4_cluster_info *info, uint64_t *total) {
  if (plan == NULL || opts == NULL || stats == NULL || info == NULL)
    return opt4__fail(OPT4_EINVAL, "plan, opts, stats and info must not be NULL");
  const opt4_plan_info *pi = &plan->info;
  if (!pi->has_ops || plan->ops == NULL)
    return opt4__fail(OPT4_ENOPLAN, "the plan holds no decisions: build it with a capacity first");
  if (opts->n_nodes == 0) return opt4__fail(OPT4_EINVAL, "n_nodes must be at least 1");
  if (opts->n_nodes >= OPT4_MAX_NODES)
    return opt4__fail(OPT4_ETOOBIG, "%u nodes: the limit is %llu", opts->n_nodes,
                      (unsigned long long)OPT4_MAX_NODES - 1);
  if (opts->capacity == NULL) return opt4__fail(OPT4_EINVAL, "capacity must not be NULL");
  if (pi->accesses > 0 && (opts->node_of == NULL || kinds == NULL || nodes == NULL))
    return opt4__fail(OPT4_EINVAL, "node_of, kinds and nodes must not be NULL");
  if (opts->prefix > pi->accesses)
    return opt4__fail(OPT4_EINVAL, "a warm prefix of %llu positions in a plan of %llu",
                      (unsigned long long)opts->prefix, (unsigned long long)pi->accesses);
  if (dst_len < pi->accesses)
    return opt4__fail(OPT4_EINVAL, "the output buffers hold %llu positions; the plan has %llu",
                      (unsigned long long)dst_len, (unsigned long long)pi->accesses);
  uint64_t sum = 0;
  for (uint32_t n = 0; n < opts->n_nodes; n++) {
    uint64_t cap = opts->capacity[n];
    if (cap > OPT4_MAX_CAPACITY)
      return opt4__fail(OPT4_ETOOBIG, "node %u's capacity %llu exceeds the limit %llu", n,
                        (unsigned long long)cap, (unsigned long long)OPT4_MAX_CAPACITY);
    sum += cap;
  }
  if (sum == 0) return opt4__fail(OPT4_ECAPACITY, "the nodes' capacities add up to 0");
  const int sized = (pi->flags & OPT4_PLAN_SIZED) != 0;
  uint64_t slots = sized ? pi->capacity : opt4__slot_count(pi);
  if (slots > sum)
    return opt4__fail(OPT4_ECAPACITY, "the plan holds up to %llu %s at once; the nodes hold %llu: "
                                      "plan the timeline at the nodes' total capacity",
                      (unsigned long long)slots, sized ? "pages" : "items", (unsigned long long)sum);
  *total = sum;
  return 0;
}

/* The checksum's fixed part, in 64-bit words. */
static void hash_header(opt4__hasher *h, const opt4_plan_info *pi, const opt4_cluster_opts *opts) {
  const uint64_t head[5] = {0x31756c633474706full /* "opt4clu1" */, pi->fingerprint, pi->capacity,
                            pi->accesses, opts->n_nodes};
  opt4__hasher_update(h, head, sizeof head);
  opt4__hasher_update(h, opts->capacity, (size_t)opts->n_nodes * sizeof(uint64_t));
  if (opts->prefix > 0) opt4__hasher_update(h, &opts->prefix, sizeof opts->prefix);
}

int opt4_cluster_place(const opt4_plan *plan, const opt4_cluster_opts *opts, uint8_t *kinds,
                       uint32_t *nodes, uint64_t dst_len, opt4_cluster_node *stats,
                       opt4_cluster_info *info) {
  opt4__clear_detail();
  uint64_t total = 0;
  int rc = check_args(plan, opts, kinds, nodes, dst_len, stats, info, &total);
  if (rc != 0) return rc;

  cluster_ctx c;
  memset(&c, 0, sizeof c);
  c.T = plan->info.accesses;
  c.N = plan->info.items;
  c.n_nodes = opts->n_nodes;
  c.leaves = 1;
  while (c.leaves < c.n_nodes) c.leaves *= 2;
  const size_t room_bytes = (size_t)c.leaves * sizeof(int64_t);
  const size_t best_bytes = (size_t)c.leaves * 2 * sizeof(uint32_t);
  const size_t live_bytes = (size_t)c.n_nodes * sizeof(uint64_t);
  const size_t home_bytes = (size_t)c.N * sizeof(uint32_t);
  const uint32_t *window_of = opts->window_of;
  const size_t admitted_bytes = window_of != NULL ? (size_t)c.N * sizeof(struct admitted) : 0;
  const uint32_t *seq = plan->seq;
  const uint32_t *ops = plan->ops;
  const uint32_t *node_of = opts->node_of;
  const uint64_t prefix = opts->prefix;
  opt4__hasher *h = NULL;

  c.room = opt4__malloc(room_bytes);
  c.best = opt4__malloc(best_bytes);
  c.live = opt4__calloc(c.n_nodes, sizeof(uint64_t));
  c.home = opt4__malloc(home_bytes);
  if (window_of != NULL) c.admitted = opt4__malloc(admitted_bytes);
  h = opt4__hasher_new();
  if (c.room == NULL || c.best == NULL || c.live == NULL || c.home == NULL || h == NULL ||
      (window_of != NULL && c.N > 0 && c.admitted == NULL)) {
    rc = opt4__fail(OPT4_ENOMEM, "no memory to place %llu items over %u nodes",
                    (unsigned long long)c.N, c.n_nodes);
    goto leave;
  }
  memset(stats, 0, (size_t)c.n_nodes * sizeof *stats);
  memset(info, 0, sizeof *info);
  for (uint32_t n = 0; n < c.leaves; n++) c.room[n] = n < c.n_nodes ? (int64_t)opts->capacity[n] : -1;
  tree_build(&c);

  /* Pass 1, backward: next uses into nodes, readers checked. */
  memset(c.home, 0xFF, home_bytes);
  for (uint64_t t = c.T; t-- > 0;) {
    if (OPT4__UNLIKELY(node_of[t] >= c.n_nodes)) {
      rc = opt4__fail(OPT4_ERANGE, "node %u at position %llu is outside [0, %u)", node_of[t],
                      (unsigned long long)t, c.n_nodes);
      goto leave;
    }
    if (OPT4__UNLIKELY(window_of != NULL && t > 0 && window_of[t - 1] > window_of[t])) {
      rc = opt4__fail(OPT4_ERANGE, "window %u at position %llu comes after window %u: windows must "
                                   "not decrease along the timeline", window_of[t],
                      (unsigned long long)t, window_of[t - 1]);
      goto leave;
    }
    uint32_t x = seq[t];
    if (OPT4__UNLIKELY(t < prefix && c.home[x] != OPT4__NEVER && c.home[x] < prefix)) {
      rc = opt4__fail(OPT4_EINVAL, "item %u is at positions %llu and %u of the warm prefix: a prefix names "
                                   "each item once (one node holds it)", x, (unsigned long long)t, c.home[x]);
      goto leave;
    }
    nodes[t] = c.home[x];
    c.home[x] = (uint32_t)t;
  }

  /* Pass 2, forward: kinds, homes, sources, counts. In a plan in bytes a
   * generation needs its item's pages on one node; when free pages are
   * spread over nodes so that none has enough, it is read from storage
   * instead (ADMIT and HITs become BYPASSes, counted as unplaced). */
  const int sized = (plan->info.flags & OPT4_PLAN_SIZED) != 0;
  const uint32_t *plan_sizes = plan->sizes;
  for (uint64_t t = 0; t < c.T; t++) {
    const uint32_t x = seq[t];
    const uint32_t r = node_of[t];
    const uint32_t nx = nodes[t];
    const uint32_t kind = OPT4_OP_KIND(ops[t]);
    const uint64_t size = opts->item_sizes != NULL ? opts->item_sizes[x]
                          : sized && opts->item_bytes == 0 ? plan_sizes[x]
                                                            : opts->item_bytes;
    const uint64_t need = sized ? opt4__pages_for(plan_sizes[x], plan->info.page_size) : 1;
    /* Does the generation read at t continue to x's next access? */
    const int goes_on = nx != OPT4__NEVER && OPT4_OP_KIND(ops[nx]) == OPT4_OP_HIT;
    opt4_cluster_node *sr = &stats[r];
    if (t < prefix) { /* held at r from the start; no HIT here: an item is once in the prefix */
      if (kind == OPT4_OP_ADMIT && goes_on && c.room[r] >= (int64_t)need) {
        take(&c, r, need, stats);
        c.home[x] = r;
        if (window_of != NULL) c.admitted[x] = (struct admitted){t, c.T > 0 ? window_of[0] : 0, 0, 0, 1};
        kinds[t] = OPT4_CLUSTER_ADMIT;
        nodes[t] = r;
        sr->homed++;
        sr->warm++;
        info->warm++;
        continue;
      }
      if (kind == OPT4_OP_ADMIT && goes_on) { /* no room where it is: dropped, its reads from storage */
        c.home[x] = OPT4_CLUSTER_NONE;
        info->unplaced++;
      }
      kinds[t] = OPT4_CLUSTER_BYPASS;
      nodes[t] = OPT4_CLUSTER_NONE;
      continue;
    }
    sr->accesses++;
    if (kind == OPT4_OP_HIT && c.home[x] != OPT4_CLUSTER_NONE) {
      const uint32_t home = c.home[x];
      if (window_of != NULL && !in_time(&c, x, home, r, window_of[t])) {
        kinds[t] = OPT4_CLUSTER_LATE; /* from storage; the generation goes on */
        sr->late++;
        sr->bypasses++;
        sr->storage_bytes += size;
        info->storage_bytes += size;
        info->late++;
      } else {
        if (window_of != NULL) c.admitted[x].served = 1;
        if (home == r) {
          kinds[t] = OPT4_CLUSTER_LOCAL_HIT;
          sr->local_hits++;
        } else {
          kinds[t] = OPT4_CLUSTER_PEER_HIT;
          sr->peer_hits++;
          count_transfer(stats, info, home, r, size, 1);
        }
      }
      nodes[t] = home;
      if (!goes_on) {
        release(&c, home, need);
        if (window_of != NULL) forward_undo(&c, x, home, size, node_of, kinds, nodes, stats, info);
      }
      continue;
    }
    sr->storage_bytes += size;
    info->storage_bytes += size;
    if (kind == OPT4_OP_HIT) info->unplaced_hits++; /* its generation found no node */
    if (kind != OPT4_OP_ADMIT || !goes_on) {
      kinds[t] = OPT4_CLUSTER_BYPASS;
      nodes[t] = OPT4_CLUSTER_NONE;
      sr->bypasses++;
      continue;
    }
    const int64_t want = (int64_t)need;
    uint32_t home = node_of[nx];
    /* The next reader's node, unless a transfer there cannot be in time. */
    if (window_of != NULL && home != r && (uint64_t)window_of[nx] < (uint64_t)window_of[t] + 2) home = r;
    if (c.room[home] < want) home = r;
    if (c.room[home] < want) home = c.best[1];
    if (c.room[home] < want) {
      if (OPT4__UNLIKELY(!sized)) {
        rc = opt4__fail(OPT4_ECORRUPT, "at position %llu every node is full: the plan keeps more "
                                       "items than its capacity says", (unsigned long long)t);
        goto leave;
      }
      c.home[x] = OPT4_CLUSTER_NONE;
      info->unplaced++;
      kinds[t] = OPT4_CLUSTER_BYPASS;
      nodes[t] = OPT4_CLUSTER_NONE;
      sr->bypasses++;
      continue;
    }
    take(&c, home, need, stats);
    c.home[x] = home;
    if (window_of != NULL) c.admitted[x] = (struct admitted){t, window_of[t], home != r, 0, 0};
    kinds[t] = OPT4_CLUSTER_ADMIT;
    nodes[t] = home;
    sr->admits++;
    stats[home].homed++;
    if (home != r) {
      info->remote_admits++;
      count_transfer(stats, info, r, home, size, 1);
    }
  }

  for (uint32_t n = 0; n < c.n_nodes; n++) {
    info->local_hits += stats[n].local_hits;
    info->peer_hits += stats[n].peer_hits;
    info->admits += stats[n].admits;
    info->bypasses += stats[n].bypasses;
  }
  info->accesses = c.T - prefix;
  info->hits = info->local_hits + info->peer_hits;
  info->capacity = total;
  hash_header(h, &plan->info, opts);
  if (c.T > 0) {
    opt4__hasher_update(h, node_of, (size_t)c.T * sizeof(uint32_t));
    opt4__hasher_update(h, kinds, (size_t)c.T);
    opt4__hasher_update(h, nodes, (size_t)c.T * sizeof(uint32_t));
    if (window_of != NULL) opt4__hasher_update(h, window_of, (size_t)c.T * sizeof(uint32_t));
  }
  info->checksum = opt4__hasher_digest(h);

leave:
  opt4__hasher_free(h);
  opt4__free(c.room, room_bytes);
  opt4__free(c.best, best_bytes);
  opt4__free(c.live, live_bytes);
  opt4__free(c.home, home_bytes);
  opt4__free(c.admitted, admitted_bytes);
  return rc;
}
