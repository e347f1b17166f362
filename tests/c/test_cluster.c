/* test_cluster.c - cluster plans (opt4_cluster_place): golden placements on
 * tiny hand-checked timelines, a replay of random ones that checks every
 * hit finds its item where the plan says and no node ever holds more than
 * its capacity, the errors, and every allocation failing in turn. */
#include "task.h"

enum {
  L = OPT4_CLUSTER_LOCAL_HIT,
  P = OPT4_CLUSTER_PEER_HIT,
  A = OPT4_CLUSTER_ADMIT,
  B = OPT4_CLUSTER_BYPASS,
  LT = OPT4_CLUSTER_LATE
};
#define NONE OPT4_CLUSTER_NONE

static opt4_plan *build(const uint32_t *seq, uint64_t T, uint64_t items, uint64_t capacity) {
  opt4_seq s = {seq, OPT4_U32, T, items};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.capacity = capacity;
  opt4_plan *p = NULL;
  ASSERT_OK(opt4_plan_build(&s, &o, &p));
  return p;
}

typedef struct placed {
  uint8_t kinds[64];
  uint32_t nodes[64];
  opt4_cluster_node st[8];
  opt4_cluster_info info;
} placed;

static void place_in(const uint32_t *seq, const uint32_t *node_of, const uint32_t *window_of, uint64_t T,
                     uint64_t items, const uint64_t *caps, uint32_t n_nodes, placed *out) {
  uint64_t total = 0;
  for (uint32_t n = 0; n < n_nodes; n++) total += caps[n];
  opt4_plan *p = build(seq, T, items, total);
  opt4_cluster_opts o;
  memset(&o, 0, sizeof o);
  o.node_of = node_of;
  o.n_nodes = n_nodes;
  o.capacity = caps;
  o.item_bytes = 10;
  o.window_of = window_of;
  ASSERT_OK(opt4_cluster_place(p, &o, out->kinds, out->nodes, 64, out->st, &out->info));
  opt4_plan_close(p);
}

static void place(const uint32_t *seq, const uint32_t *node_of, uint64_t T, uint64_t items,
                  const uint64_t *caps, uint32_t n_nodes, placed *out) {
  place_in(seq, node_of, NULL, T, items, caps, n_nodes, out);
}

static void expect_kinds(const placed *r, const uint8_t *kinds, const uint32_t *nodes, int T) {
  for (int t = 0; t < T; t++) {
    ASSERT_EQ(r->kinds[t], kinds[t]);
    ASSERT_U64_EQ(r->nodes[t], nodes[t]);
  }
}

/* Two nodes of one item each. Node 0 reads A, B, A at t = 0, 2, 4; node 1
 * reads B, A, C at t = 1, 3, 5. The aggregate plan (2 items) admits A and B,
 * hits B at 2 and A at 3 and 4, and bypasses C (never read again). A is
 * read next by node 1, which has room: its home is node 1 (a transfer from
 * node 0, which read it). B is read next by node 0: home node 0. Then B at
 * 2 and A at 3 are local, A at 4 is node 0 reading node 1's copy. */
static void test_golden_two_nodes(void) {
  const uint32_t seq[] = {0, 1, 1, 0, 0, 2};
  const uint32_t node_of[] = {0, 1, 0, 1, 0, 1};
  const uint64_t caps[] = {1, 1};
  placed r;
  place(seq, node_of, 6, 3, caps, 2, &r);
  const uint8_t kinds[] = {A, A, L, L, P, B};
  const uint32_t nodes[] = {1, 0, 0, 1, 1, NONE};
  expect_kinds(&r, kinds, nodes, 6);
  ASSERT_U64_EQ(r.info.hits, 3);
  ASSERT_U64_EQ(r.info.local_hits, 2);
  ASSERT_U64_EQ(r.info.peer_hits, 1);
  ASSERT_U64_EQ(r.info.admits, 2);
  ASSERT_U64_EQ(r.info.bypasses, 1);
  ASSERT_U64_EQ(r.info.remote_admits, 2);
  ASSERT_U64_EQ(r.info.storage_bytes, 30);
  ASSERT_U64_EQ(r.info.peer_bytes, 30); /* two admits kept away, one peer hit */
  ASSERT_U64_EQ(r.st[0].accesses, 3);
  ASSERT_U64_EQ(r.st[0].local_hits, 1);
  ASSERT_U64_EQ(r.st[0].peer_hits, 1);
  ASSERT_U64_EQ(r.st[0].admits, 1);
  ASSERT_U64_EQ(r.st[0].bypasses, 0);
  ASSERT_U64_EQ(r.st[0].storage_bytes, 10);
  ASSERT_U64_EQ(r.st[0].homed, 1);
  ASSERT_U64_EQ(r.st[0].peer_bytes_sent, 10);     /* A to its home */
  ASSERT_U64_EQ(r.st[0].peer_bytes_received, 20); /* B to its home, A for t = 4 */
  ASSERT_U64_EQ(r.st[1].accesses, 3);
  ASSERT_U64_EQ(r.st[1].local_hits, 1);
  ASSERT_U64_EQ(r.st[1].peer_hits, 0);
  ASSERT_U64_EQ(r.st[1].admits, 1);
  ASSERT_U64_EQ(r.st[1].bypasses, 1);
  ASSERT_U64_EQ(r.st[1].storage_bytes, 20);
  ASSERT_U64_EQ(r.st[1].homed, 1);
  ASSERT_U64_EQ(r.st[1].peer_bytes_sent, 20);
  ASSERT_U64_EQ(r.st[1].peer_bytes_received, 10);
  ASSERT_U64_EQ(r.st[0].peak_resident, 1);
  ASSERT_U64_EQ(r.st[1].peak_resident, 1);
  ASSERT_NO_ENGINE_MEMORY();
}

/* The same timeline in windows of one step: 0 0 | 1 1 | 2 2. A's next
 * reader, node 1 in window 1, could get it from node 0 in window 2 at the
 * earliest (node 0 sends what it holds at a window's start, for the window
 * after): node 0 keeps it. Likewise node 1 keeps B. B at 2 and A at 3 come
 * too early for a transfer: LATE, read from storage (node: the holder). A
 * at 4 is node 0's own. */
static void test_golden_two_nodes_in_windows(void) {
  const uint32_t seq[] = {0, 1, 1, 0, 0, 2};
  const uint32_t node_of[] = {0, 1, 0, 1, 0, 1};
  const uint32_t window_of[] = {0, 0, 1, 1, 2, 2};
  const uint64_t caps[] = {1, 1};
  placed r;
  place_in(seq, node_of, window_of, 6, 3, caps, 2, &r);
  const uint8_t kinds[] = {A, A, LT, LT, L, B};
  const uint32_t nodes[] = {0, 1, 1, 0, 0, NONE};
  expect_kinds(&r, kinds, nodes, 6);
  ASSERT_U64_EQ(r.info.hits, 1);
  ASSERT_U64_EQ(r.info.late, 2);
  ASSERT_U64_EQ(r.info.remote_admits, 0);
  ASSERT_U64_EQ(r.info.peer_bytes, 0);
  ASSERT_U64_EQ(r.info.storage_bytes, 50);
  ASSERT_U64_EQ(r.info.bypasses, 3); /* two LATE, one BYPASS */
  ASSERT_U64_EQ(r.st[0].late, 1);
  ASSERT_U64_EQ(r.st[1].late, 1);
  ASSERT_U64_EQ(r.st[0].storage_bytes, 20);
  ASSERT_U64_EQ(r.st[1].storage_bytes, 30);
  /* Steps two windows apart, windows {0,0,2,2,4,4}: every transfer is in
   * time, and the placement is the one without windows. */
  const uint32_t apart[] = {0, 0, 2, 2, 4, 4};
  placed q, free;
  place_in(seq, node_of, apart, 6, 3, caps, 2, &q);
  place(seq, node_of, 6, 3, caps, 2, &free);
  expect_kinds(&q, free.kinds, free.nodes, 6);
  ASSERT_U64_EQ(q.info.late, 0);
  ASSERT(q.info.checksum != free.info.checksum); /* the windows are part of it */
  ASSERT_NO_ENGINE_MEMORY();
}

/* A warm prefix: nodes 0 and 1 hold items 0 and 1 at the start (positions
 * 0 and 1, not reads); then node 0 reads 1, node 1 reads 0, node 0 reads 2.
 * Each warm item stays where it is (no transfer to its next reader) and is a
 * peer hit, from window_of[0] + 1 on; in window 0 itself it is LATE. The
 * prefix counts in no access or storage figure. A node with no room drops
 * its warm item: its read is from storage (unplaced). */
static void place_warm(const opt4_plan *p, const uint32_t *node_of, const uint64_t *caps,
                       const uint32_t *window_of, uint64_t prefix, placed *out) {
  opt4_cluster_opts o;
  memset(&o, 0, sizeof o);
  o.node_of = node_of;
  o.n_nodes = 2;
  o.capacity = caps;
  o.item_bytes = 10;
  o.window_of = window_of;
  o.prefix = prefix;
  ASSERT_OK(opt4_cluster_place(p, &o, out->kinds, out->nodes, 64, out->st, &out->info));
}

static void test_golden_warm_prefix(void) {
  const uint32_t seq[] = {0, 1, 1, 0, 2};
  const uint32_t node_of[] = {0, 1, 0, 1, 0};
  const uint64_t caps[] = {1, 1};
  uint64_t total = 2;
  opt4_plan *p = build(seq, 5, 3, total);
  for (int w = 0; w < 3; w++) {
    const uint32_t windows[3][5] = {{0, 0, 1, 1, 1}, {0, 0, 0, 0, 0}, {0}};
    placed r;
    place_warm(p, node_of, caps, w < 2 ? windows[w] : NULL, 2, &r);
    const uint8_t in_time[] = {A, A, P, P, B}, late[] = {A, A, LT, LT, B};
    const uint32_t nodes[] = {0, 1, 1, 0, NONE};
    expect_kinds(&r, w == 1 ? late : in_time, nodes, 5);
    ASSERT_U64_EQ(r.info.accesses, 3);
    ASSERT_U64_EQ(r.info.warm, 2);
    ASSERT_U64_EQ(r.info.admits, 0);
    ASSERT_U64_EQ(r.info.remote_admits, 0);
    ASSERT_U64_EQ(r.info.hits, w == 1 ? 0 : 2);
    ASSERT_U64_EQ(r.info.storage_bytes, w == 1 ? 30 : 10);
    ASSERT_U64_EQ(r.info.peer_bytes, w == 1 ? 0 : 20);
    ASSERT_U64_EQ(r.st[0].accesses, 2);
    ASSERT_U64_EQ(r.st[1].accesses, 1);
    ASSERT_U64_EQ(r.st[0].warm, 1);
    ASSERT_U64_EQ(r.st[1].homed, 1);
    ASSERT_U64_EQ(r.st[1].peak_resident, 1);
  }
  /* Node 1 holds nothing: its warm item 1 is dropped, node 0's read of it
   * is from storage; item 0 stays warm at node 0. */
  const uint64_t lopsided[] = {2, 0};
  placed r;
  place_warm(p, node_of, lopsided, NULL, 2, &r);
  const uint8_t kinds[] = {A, B, B, P, B};
  const uint32_t where[] = {0, NONE, NONE, 0, NONE};
  expect_kinds(&r, kinds, where, 5);
  ASSERT_U64_EQ(r.info.unplaced, 1);
  ASSERT_U64_EQ(r.info.unplaced_hits, 1);
  ASSERT_U64_EQ(r.info.warm, 1);
  /* The checksum names the prefix. */
  placed plain;
  place_warm(p, node_of, caps, NULL, 0, &plain);
  ASSERT_U64_EQ(plain.info.accesses, 5);
  place_warm(p, node_of, caps, NULL, 2, &r);
  ASSERT(r.info.checksum != plain.info.checksum);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

/* The tie-break. Nodes hold 1, 0 and 2 items; node 1 reads X, Y, X, Y. X's
 * next reader (node 1) has no room, nor has the node reading it now (node 1
 * again): the node with most room, node 2. Then nodes 0 and 2 have one
 * place each: the lower id, node 0, gets Y. Both later reads are peer hits. */
static void test_golden_tie_break(void) {
  const uint32_t seq[] = {0, 1, 0, 1};
  const uint32_t node_of[] = {1, 1, 1, 1};
  const uint64_t caps[] = {1, 0, 2};
  placed r;
  place(seq, node_of, 4, 2, caps, 3, &r);
  const uint8_t kinds[] = {A, A, P, P};
  const uint32_t nodes[] = {2, 0, 2, 0};
  expect_kinds(&r, kinds, nodes, 4);
  ASSERT_U64_EQ(r.info.remote_admits, 2);
  ASSERT_U64_EQ(r.st[1].peer_hits, 2);
  ASSERT_U64_EQ(r.st[1].peer_bytes_sent, 20);
  ASSERT_U64_EQ(r.st[1].peer_bytes_received, 20);
  ASSERT_U64_EQ(r.st[0].homed, 1);
  ASSERT_U64_EQ(r.st[2].homed, 1);
  ASSERT_U64_EQ(r.st[1].homed, 0);
  ASSERT_U64_EQ(r.st[1].peak_resident, 0);
  ASSERT_NO_ENGINE_MEMORY();
}

/* An aggregate ADMIT that nothing reads: with one item of room, A (next at
 * 3) is admitted, then B (next at 2) evicts it; A at 3 is never read again.
 * The plan admits at 0 and 1; the cluster plan keeps only B, and A at 0 is
 * a BYPASS: it would serve nothing. */
static void test_golden_unread_admit(void) {
  const uint32_t seq[] = {0, 1, 1, 0};
  const uint32_t node_of[] = {0, 0, 0, 0};
  const uint64_t caps[] = {1};
  opt4_plan *p = build(seq, 4, 2, 1);
  opt4_plan_info pi;
  ASSERT_OK(opt4_plan_info_get(p, &pi));
  ASSERT_U64_EQ(pi.admits, 2);
  opt4_plan_close(p);
  placed r;
  place(seq, node_of, 4, 2, caps, 1, &r);
  const uint8_t kinds[] = {B, A, L, B};
  for (int t = 0; t < 4; t++) ASSERT_EQ(r.kinds[t], kinds[t]);
  ASSERT_U64_EQ(r.nodes[0], NONE);
  ASSERT_U64_EQ(r.nodes[1], 0);
  ASSERT_U64_EQ(r.info.admits, 1);
  ASSERT_U64_EQ(r.info.bypasses, 2); /* at 0 and 3 */
  ASSERT_U64_EQ(r.info.hits, 1);
  ASSERT_NO_ENGINE_MEMORY();
}

static opt4_plan *build_sized(const uint32_t *seq, uint64_t T, uint64_t items, const uint64_t *sizes,
                              uint64_t capacity_bytes, uint64_t page_size) {
  opt4_seq s = {seq, OPT4_U32, T, items};
  opt4_plan_opts o;
  memset(&o, 0, sizeof o);
  o.item_sizes = sizes;
  o.capacity_bytes = capacity_bytes;
  o.page_size = page_size;
  opt4_plan *p = NULL;
  ASSERT_OK(opt4_plan_build(&s, &o, &p));
  return p;
}

/* In bytes: two nodes of two 10-byte pages. Node 0 reads B (1 page), node
 * 1 reads C (1 page), node 0 reads A (2 pages); then each again, A by node
 * 1. The aggregate plan (4 pages) keeps all three. B and C go to their next
 * readers; then each node has one free page and A needs two on one node:
 * it finds no home, and both its reads are from storage. */
static void test_golden_sized_unplaced(void) {
  const uint32_t seq[] = {1, 2, 0, 1, 2, 0};
  const uint32_t node_of[] = {0, 1, 0, 0, 1, 1};
  const uint64_t sizes[] = {20, 10, 10}, caps[] = {2, 2};
  opt4_plan *p = build_sized(seq, 6, 3, sizes, 40, 10);
  opt4_plan_info pi;
  ASSERT_OK(opt4_plan_info_get(p, &pi));
  ASSERT_U64_EQ(pi.hits, 3);
  opt4_cluster_opts o;
  memset(&o, 0, sizeof o);
  o.node_of = node_of;
  o.n_nodes = 2;
  o.capacity = caps;
  uint8_t kinds[6];
  uint32_t nodes[6];
  opt4_cluster_node st[2];
  opt4_cluster_info info;
  ASSERT_OK(opt4_cluster_place(p, &o, kinds, nodes, 6, st, &info));
  const uint8_t want[] = {A, A, B, L, L, B};
  const uint32_t where[] = {0, 1, NONE, 0, 1, NONE};
  for (int t = 0; t < 6; t++) {
    ASSERT_EQ(kinds[t], want[t]);
    ASSERT_U64_EQ(nodes[t], where[t]);
  }
  ASSERT_U64_EQ(info.unplaced, 1);
  ASSERT_U64_EQ(info.unplaced_hits, 1);
  ASSERT_U64_EQ(info.hits, 2);
  ASSERT_U64_EQ(info.storage_bytes, 10 + 10 + 20 + 20); /* the plan's own sizes */
  ASSERT_U64_EQ(st[0].peak_resident, 1);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Random timelines in bytes: no node's live pages exceed its capacity, and
 * the hits are the aggregate plan's less the unplaced ones. */
static void test_random_sized(void) {
  enum { TMAX = 1500, NMAX = 80, NODES = 5 };
  static uint32_t seq[TMAX], node_of[TMAX], nodes[TMAX], next[TMAX], last[NMAX], holder[NMAX];
  static uint8_t kinds[TMAX];
  uint64_t rng = 17, unplaced = 0;
  for (int round = 0; round < 200; round++) {
    const uint64_t T = 1 + test_rand(&rng) % TMAX, N = 1 + test_rand(&rng) % NMAX, page = 8;
    const uint32_t n_nodes = (uint32_t)(1 + test_rand(&rng) % NODES);
    uint64_t sizes[NMAX], caps[NODES], total = 0, live[NODES] = {0};
    for (uint64_t x = 0; x < N; x++) sizes[x] = 1 + test_rand(&rng) % 40;
    for (uint32_t n = 0; n < n_nodes; n++) total += caps[n] = 5 + test_rand(&rng) % 20;
    for (uint64_t t = 0; t < T; t++) {
      seq[t] = (uint32_t)(test_rand(&rng) % N);
      node_of[t] = (uint32_t)(test_rand(&rng) % n_nodes);
    }
    opt4_plan *p = build_sized(seq, T, N, sizes, total * page, page);
    const uint32_t *ops = opt4_plan_ops(p);
    opt4_plan_info pi;
    ASSERT_OK(opt4_plan_info_get(p, &pi));
    opt4_cluster_opts o;
    memset(&o, 0, sizeof o);
    o.node_of = node_of;
    o.n_nodes = n_nodes;
    o.capacity = caps;
    opt4_cluster_node st[NODES];
    opt4_cluster_info info;
    ASSERT_OK(opt4_cluster_place(p, &o, kinds, nodes, TMAX, st, &info));
    ASSERT_U64_EQ(info.hits + info.unplaced_hits, pi.hits);
    unplaced += info.unplaced;
    for (uint64_t x = 0; x < N; x++) last[x] = UINT32_MAX, holder[x] = NONE;
    for (uint64_t t = T; t-- > 0;) next[t] = last[seq[t]], last[seq[t]] = (uint32_t)t;
    for (uint64_t t = 0; t < T; t++) {
      const uint32_t x = seq[t], k = kinds[t];
      const uint64_t need = (sizes[x] + page - 1) / page;
      const int goes_on = next[t] != UINT32_MAX && OPT4_OP_KIND(ops[next[t]]) == OPT4_OP_HIT &&
                          kinds[next[t]] != B;
      if (k == L || k == P) {
        ASSERT_U64_EQ(nodes[t], holder[x]);
        if (!goes_on) live[holder[x]] -= need, holder[x] = NONE;
      } else if (k == A) {
        ASSERT_U64_EQ(holder[x], NONE);
        holder[x] = nodes[t];
        live[nodes[t]] += need;
        ASSERT(live[nodes[t]] <= caps[nodes[t]]);
      } else {
        ASSERT_U64_EQ(holder[x], NONE);
      }
    }
    for (uint32_t n = 0; n < n_nodes; n++) ASSERT(st[n].peak_resident <= caps[n]);
    opt4_plan_close(p);
  }
  ASSERT(unplaced > 0); /* the case the rule cannot always place does come up */
  ASSERT_NO_ENGINE_MEMORY();
}

/* Random timelines, replayed independently of the engine: every HIT finds
 * its item at the node the plan names, LOCAL exactly when that is the
 * reader's node; generations end at their last read; no node ever holds
 * more than its capacity; an ADMIT goes to the next reader whenever it has
 * room; the totals add up; the same input gives the same checksum. */
static void test_random_replay(void) {
  enum { TMAX = 3000, NMAX = 200, NODES = 8 };
  static uint32_t seq[TMAX], node_of[TMAX], nodes[TMAX], next[TMAX], last[NMAX], holder[NMAX];
  static uint8_t kinds[TMAX];
  uint64_t rng = 7;
  for (int round = 0; round < 300; round++) {
    const uint64_t T = 1 + test_rand(&rng) % TMAX;
    const uint64_t N = 1 + test_rand(&rng) % NMAX;
    const uint32_t n_nodes = (uint32_t)(1 + test_rand(&rng) % NODES);
    uint64_t caps[NODES], total = 0, live[NODES] = {0};
    for (uint32_t n = 0; n < n_nodes; n++) total += caps[n] = test_rand(&rng) % (N / 2 + 2);
    if (total == 0) total += caps[0] = 1;
    for (uint64_t t = 0; t < T; t++) {
      seq[t] = (uint32_t)(test_rand(&rng) % N);
      node_of[t] = (uint32_t)(test_rand(&rng) % n_nodes);
    }
    opt4_plan *p = build(seq, T, N, total);
    const uint32_t *ops = opt4_plan_ops(p);
    opt4_plan_info pi;
    ASSERT_OK(opt4_plan_info_get(p, &pi));
    opt4_cluster_opts o;
    memset(&o, 0, sizeof o);
    o.node_of = node_of;
    o.n_nodes = n_nodes;
    o.capacity = caps;
    o.item_bytes = 3;
    opt4_cluster_node st[NODES];
    opt4_cluster_info info, again;
    ASSERT_OK(opt4_cluster_place(p, &o, kinds, nodes, TMAX, st, &info));
    ASSERT_U64_EQ(info.hits, pi.hits);
    ASSERT_U64_EQ(info.admits + info.bypasses, pi.misses);
    ASSERT_U64_EQ(info.storage_bytes, 3 * pi.misses);
    ASSERT_U64_EQ(info.peer_bytes, 3 * (info.peer_hits + info.remote_admits));
    ASSERT_U64_EQ(info.capacity, total);

    for (uint64_t x = 0; x < N; x++) last[x] = UINT32_MAX, holder[x] = NONE;
    for (uint64_t t = T; t-- > 0;) next[t] = last[seq[t]], last[seq[t]] = (uint32_t)t;
    uint64_t local = 0, peer = 0;
    for (uint64_t t = 0; t < T; t++) {
      const uint32_t x = seq[t], r = node_of[t], k = kinds[t];
      const int plan_hit = OPT4_OP_KIND(ops[t]) == OPT4_OP_HIT;
      const int goes_on = next[t] != UINT32_MAX && OPT4_OP_KIND(ops[next[t]]) == OPT4_OP_HIT;
      ASSERT_EQ(plan_hit, k == L || k == P);
      if (k == L || k == P) {
        ASSERT(holder[x] != NONE);
        ASSERT_U64_EQ(nodes[t], holder[x]);
        ASSERT_EQ(k == L, holder[x] == r);
        local += k == L;
        peer += k == P;
        if (!goes_on) live[holder[x]]--, holder[x] = NONE;
      } else if (k == A) {
        ASSERT(goes_on);
        ASSERT_U64_EQ(holder[x], NONE);
        const uint32_t h = nodes[t], want = node_of[next[t]];
        ASSERT(h < n_nodes);
        if (live[want] < caps[want]) ASSERT_U64_EQ(h, want);
        live[h]++;
        ASSERT(live[h] <= caps[h]);
        holder[x] = h;
      } else {
        ASSERT_EQ(k, B);
        ASSERT_U64_EQ(nodes[t], NONE);
        ASSERT_U64_EQ(holder[x], NONE);
      }
    }
    for (uint64_t x = 0; x < N; x++) ASSERT_U64_EQ(holder[x], NONE);
    ASSERT_U64_EQ(info.local_hits, local);
    ASSERT_U64_EQ(info.peer_hits, peer);
    uint64_t acc = 0, sent = 0, received = 0;
    for (uint32_t n = 0; n < n_nodes; n++) {
      ASSERT(st[n].peak_resident <= caps[n]);
      acc += st[n].accesses;
      sent += st[n].peer_bytes_sent;
      received += st[n].peer_bytes_received;
    }
    ASSERT_U64_EQ(acc, T);
    ASSERT_U64_EQ(sent, info.peer_bytes);
    ASSERT_U64_EQ(received, info.peer_bytes);
    ASSERT_OK(opt4_cluster_place(p, &o, kinds, nodes, TMAX, st, &again));
    ASSERT_U64_EQ(again.checksum, info.checksum);
    caps[0]++;
    ASSERT_OK(opt4_cluster_place(p, &o, kinds, nodes, TMAX, st, &again));
    ASSERT(again.checksum != info.checksum);
    opt4_plan_close(p);
  }
  ASSERT_NO_ENGINE_MEMORY();
}

/* With every node able to hold the whole dataset, each item is read from
 * storage once and the nodes never run out of room. */
static void test_room_for_everything(void) {
  enum { T = 2000, N = 50 };
  static uint32_t seq[T], node_of[T], nodes[T];
  static uint8_t kinds[T];
  uint64_t rng = 3;
  for (int t = 0; t < T; t++) seq[t] = (uint32_t)(test_rand(&rng) % N), node_of[t] = (uint32_t)(t % 4);
  const uint64_t caps[] = {N, N, N, N};
  opt4_plan *p = build(seq, T, N, 4 * N);
  opt4_cluster_opts o;
  memset(&o, 0, sizeof o);
  o.node_of = node_of;
  o.n_nodes = 4;
  o.capacity = caps;
  uint64_t sizes[N];
  for (int x = 0; x < N; x++) sizes[x] = 100 + (uint64_t)x;
  o.item_sizes = sizes;
  opt4_cluster_node st[4];
  opt4_cluster_info info;
  ASSERT_OK(opt4_cluster_place(p, &o, kinds, nodes, T, st, &info));
  uint64_t distinct = 0, bytes = 0;
  uint8_t seen[N] = {0};
  for (int t = 0; t < T; t++)
    if (!seen[seq[t]]) seen[seq[t]] = 1, distinct++, bytes += sizes[seq[t]];
  ASSERT_U64_EQ(info.admits + info.bypasses, distinct);
  ASSERT_U64_EQ(info.storage_bytes, bytes);
  /* Every home is the next reader: nobody ever lacks room. */
  for (int t = 0; t < T; t++)
    if (kinds[t] == A) {
      int u = t + 1;
      while (seq[u] != seq[t]) u++;
      ASSERT_U64_EQ(nodes[t], node_of[u]);
    }
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

static void test_errors(void) {
  const uint32_t seq[] = {0, 1, 0, 1};
  uint32_t node_of[] = {0, 1, 0, 1}, nodes[4];
  uint8_t kinds[4];
  uint64_t caps[] = {1, 1};
  opt4_cluster_node st[2];
  opt4_cluster_info info;
  opt4_plan *p = build(seq, 4, 2, 2);
  opt4_cluster_opts o;
  memset(&o, 0, sizeof o);
  o.node_of = node_of;
  o.n_nodes = 2;
  o.capacity = caps;
  ASSERT_ERR(opt4_cluster_place(NULL, &o, kinds, nodes, 4, st, &info), OPT4_EINVAL);
  ASSERT_ERR(opt4_cluster_place(p, NULL, kinds, nodes, 4, st, &info), OPT4_EINVAL);
  ASSERT_ERR(opt4_cluster_place(p, &o, NULL, nodes, 4, st, &info), OPT4_EINVAL);
  ASSERT_ERR(opt4_cluster_place(p, &o, kinds, nodes, 3, st, &info), OPT4_EINVAL);
  ASSERT(strstr(opt4_errdetail(), "3 positions") != NULL);
  node_of[2] = 2;
  ASSERT_ERR(opt4_cluster_place(p, &o, kinds, nodes, 4, st, &info), OPT4_ERANGE);
  ASSERT(strstr(opt4_errdetail(), "position 2") != NULL);
  node_of[2] = 0;
  const uint32_t back[] = {0, 1, 0, 1}; /* windows must not decrease */
  o.window_of = back;
  ASSERT_ERR(opt4_cluster_place(p, &o, kinds, nodes, 4, st, &info), OPT4_ERANGE);
  ASSERT(strstr(opt4_errdetail(), "position 2") != NULL);
  o.window_of = NULL;
  caps[1] = 0; /* the plan holds 2 items at once; the nodes 1 */
  ASSERT_ERR(opt4_cluster_place(p, &o, kinds, nodes, 4, st, &info), OPT4_ECAPACITY);
  caps[0] = 0;
  ASSERT_ERR(opt4_cluster_place(p, &o, kinds, nodes, 4, st, &info), OPT4_ECAPACITY);
  caps[0] = caps[1] = 1;
  o.n_nodes = 0;
  ASSERT_ERR(opt4_cluster_place(p, &o, kinds, nodes, 4, st, &info), OPT4_EINVAL);
  o.n_nodes = (uint32_t)OPT4_MAX_NODES;
  ASSERT_ERR(opt4_cluster_place(p, &o, kinds, nodes, 4, st, &info), OPT4_ETOOBIG);
  o.n_nodes = 2;
  o.prefix = 5; /* longer than the plan */
  ASSERT_ERR(opt4_cluster_place(p, &o, kinds, nodes, 4, st, &info), OPT4_EINVAL);
  ASSERT(strstr(opt4_errdetail(), "prefix of 5") != NULL);
  o.prefix = 3; /* item 0 twice in it */
  ASSERT_ERR(opt4_cluster_place(p, &o, kinds, nodes, 4, st, &info), OPT4_EINVAL);
  ASSERT(strstr(opt4_errdetail(), "item 0 is at positions 0 and 2") != NULL);
  o.prefix = 0;
  ASSERT_OK(opt4_cluster_place(p, &o, kinds, nodes, 4, st, &info));
  opt4_plan_close(p);

  /* A sequence-only plan, and a plan in bytes. */
  opt4_seq s = {seq, OPT4_U32, 4, 2};
  ASSERT_OK(opt4_plan_from_seq(&s, &p));
  ASSERT_ERR(opt4_cluster_place(p, &o, kinds, nodes, 4, st, &info), OPT4_ENOPLAN);
  opt4_plan_close(p);
  /* A plan in bytes of 3 pages: the nodes hold 2. */
  const uint64_t sizes[] = {10, 10};
  opt4_plan_opts po;
  memset(&po, 0, sizeof po);
  po.item_sizes = sizes;
  po.capacity_bytes = 30;
  po.page_size = 10;
  ASSERT_OK(opt4_plan_build(&s, &po, &p));
  ASSERT_ERR(opt4_cluster_place(p, &o, kinds, nodes, 4, st, &info), OPT4_ECAPACITY);
  ASSERT(strstr(opt4_errdetail(), "3 pages") != NULL);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

/* Every allocation failing in turn: OPT4_ENOMEM, nothing held. */
static long countdown = -1;
static void *failing_malloc(void *opaque, size_t size) {
  (void)opaque;
  if (countdown >= 0 && countdown-- == 0) return NULL;
  return malloc(size);
}
static void plain_free(void *opaque, void *ptr) {
  (void)opaque;
  free(ptr);
}

static void test_alloc_fail(void) {
  enum { T = 500 };
  static uint32_t seq[T], node_of[T], nodes[T], window_of[T];
  static uint8_t kinds[T];
  uint64_t rng = 11;
  for (int t = 0; t < T; t++) {
    seq[t] = (uint32_t)(test_rand(&rng) % 40);
    node_of[t] = (uint32_t)(t % 3);
    window_of[t] = (uint32_t)(t / 12);
  }
  const uint64_t caps[] = {4, 4, 4};
  opt4_plan *p = build(seq, T, 40, 12);
  opt4_cluster_opts o;
  memset(&o, 0, sizeof o);
  o.node_of = node_of;
  o.n_nodes = 3;
  o.capacity = caps;
  opt4_cluster_node st[3];
  opt4_cluster_info info;
  opt4_allocator a = {failing_malloc, plain_free, NULL};
  opt4_mem_stats before;
  opt4_mem_stats_get(&before);
  opt4_set_allocator(&a);
  for (int windows = 0; windows < 2; windows++) { /* without, then with windows (one more array) */
    o.window_of = windows ? window_of : NULL;
    long k = 0;
    for (;; k++) {
      countdown = k;
      int rc = opt4_cluster_place(p, &o, kinds, nodes, T, st, &info);
      opt4_mem_stats ms;
      opt4_mem_stats_get(&ms);
      ASSERT_U64_EQ(ms.current_bytes, before.current_bytes);
      if (countdown >= 0) {
        ASSERT_OK(rc);
        break;
      }
      ASSERT_ERR(rc, OPT4_ENOMEM);
    }
    ASSERT(k >= 4 + windows);
  }
  countdown = -1;
  opt4_set_allocator(NULL);
  opt4_plan_close(p);
  ASSERT_NO_ENGINE_MEMORY();
}

int main(void) {
  RUN(test_golden_two_nodes);
  RUN(test_golden_two_nodes_in_windows);
  RUN(test_golden_warm_prefix);
  RUN(test_golden_tie_break);
  RUN(test_golden_unread_admit);
  RUN(test_random_replay);
  RUN(test_golden_sized_unplaced);
  RUN(test_random_sized);
  RUN(test_room_for_everything);
  RUN(test_errors);
  RUN(test_alloc_fail);
  return 0;
}
