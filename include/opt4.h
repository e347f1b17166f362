/*
 * opt4.h - the public C API of the OPT4TorchDataset engine.
 *
 * The engine plans Belady-optimal (OPT) caching for an access sequence that
 * is known in advance, such as the order a seeded sampler gives a training
 * loop, and replays sequences through online cache policies for comparison.
 * It is plain C11 with no dependency beyond libc; it never includes Python.h
 * and never links libtorch, so it can be used from C, C++ or Rust through FFI.
 *
 * Conventions
 *   - Every fallible function returns int: 0 on success, a negative OPT4_E*
 *     code on failure. Results go to out-parameters. opt4_strerror() gives the
 *     code's text; opt4_errdetail() gives a sentence about the last failure on
 *     the calling thread (which field, which value, what to do).
 *   - Objects are opaque handles with a build/open ... close life cycle.
 *     close(NULL) is harmless. The caller owns every output buffer.
 *   - The library never calls abort() or exit() and never prints.
 *
 * Thread and process safety
 *   - Functions that take no handle are safe to call from any thread.
 *   - A plan is immutable once built or opened: any number of threads may read
 *     it at once. Closing it while another thread uses it is a caller error.
 *   - A pool handle (opt4_pool) serves one thread at a time. Any number of
 *     threads and processes may serve one pool at once, each thread through
 *     a handle of its own (opt4_pool_attach): a handle's process record
 *     holds one hazard, the page it is copying out. A second thread that
 *     enters a handle while another is inside opt4_pool_get, opt4_pool_put,
 *     opt4_pool_warm or a prefetch store gets OPT4_EINVAL at once. Calls
 *     that only read (info, stats, view, item, space) and opt4_pool_interrupt
 *     may come from any thread.
 *   - opt4_set_allocator() must be called before any other function, if at all.
 */
#ifndef OPT4_H
#define OPT4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The release's version: the same in pyproject.toml, CMakeLists.txt and
 * opt4torch.__version__ (tests/python/test_migration.py checks). */
#define OPT4_VERSION_MAJOR 2
#define OPT4_VERSION_MINOR 0
#define OPT4_VERSION_PATCH 0
#define OPT4_VERSION_STRING "2.0.0"

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

/* XX(name, code, text): one list generates the codes, opt4_strerror() and
 * opt4_err_name(). Codes are stable: new ones are only ever appended. */
#define OPT4_ERRNO_MAP(XX)                                                    \
  XX(INVAL, -1, "invalid argument")                                           \
  XX(NOMEM, -2, "out of memory")                                              \
  XX(RANGE, -3, "item id out of range")                                       \
  XX(CAPACITY, -4, "capacity must be at least 1")                             \
  XX(TOOBIG, -5, "input too large for this engine")                           \
  XX(NOTSUP, -6, "operation not supported")                                   \
  XX(IO, -7, "input/output error")                                            \
  XX(BADMAGIC, -8, "not an opt4 plan file")                                   \
  XX(VERSION, -9, "plan file format is newer than this library")              \
  XX(TRUNCATED, -10, "plan file is truncated")                                \
  XX(CHECKSUM, -11, "plan file checksum mismatch (the file is corrupted)")    \
  XX(CORRUPT, -12, "plan file is inconsistent")                               \
  XX(FINGERPRINT, -13, "plan was made for a different sequence")              \
  XX(NOPLAN, -14, "plan holds a sequence but no cache decisions")             \
  XX(UNKNOWN_POLICY, -15, "unknown cache policy")                             \
  XX(SHM, -16, "shared memory error")                                         \
  XX(NOSPACE, -17, "not enough shared memory (/dev/shm is too small)")        \
  XX(POOL, -18, "not a usable opt4 pool (foreign, stale or newer layout)")    \
  XX(PROCS, -19, "too many processes attached to the pool")                   \
  XX(ITEMSIZE, -20, "item larger than its space in the pool")

enum opt4_errno {
#define OPT4__ERR_ENUM(name, code, text) OPT4_E##name = (code),
  OPT4_ERRNO_MAP(OPT4__ERR_ENUM)
#undef OPT4__ERR_ENUM
  OPT4__ERR_SENTINEL = -1000
};

/* The text of an error code ("unknown error" for a code not in the map). */
const char *opt4_strerror(int code);
/* The name of an error code, e.g. "OPT4_ECHECKSUM". */
const char *opt4_err_name(int code);
/* A sentence about the most recent failure on this thread, or "" if the last
 * failing call gave none. Valid until the next call into the library on this
 * thread. */
const char *opt4_errdetail(void);

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct opt4_allocator {
  void *(*malloc_fn)(void *opaque, size_t size);
  void (*free_fn)(void *opaque, void *ptr);
  void *opaque;
} opt4_allocator;

/* Replace the allocator used for all engine memory (NULL restores malloc and
 * free). Not thread-safe: call it before anything else. Used by the tests to
 * fail allocations on purpose. */
void opt4_set_allocator(const opt4_allocator *alloc);

/* Bytes the engine holds now and the most it has held since the last reset,
 * counted over all threads. Memory-mapped plan files are not counted. */
typedef struct opt4_mem_stats {
  uint64_t current_bytes;
  uint64_t peak_bytes;
} opt4_mem_stats;
void opt4_mem_stats_get(opt4_mem_stats *out);
void opt4_mem_peak_reset(void);

/* ------------------------------------------------------------------------ */
/* Sequences                                                                 */
/* ------------------------------------------------------------------------ */

typedef enum opt4_dtype {
  OPT4_I32 = 1,
  OPT4_I64 = 2,
  OPT4_U32 = 3,
  OPT4_U64 = 4
} opt4_dtype;

/* A borrowed view of an access sequence: len ids, each in [0, items). */
typedef struct opt4_seq {
  const void *data;
  opt4_dtype dtype;
  uint64_t len;
  uint64_t items;
} opt4_seq;

/* Sequences longer than this are refused with OPT4_ETOOBIG: positions are
 * stored as 32-bit integers and the top few values are reserved as markers
 * ("never again", and the planner's codes). */
#define OPT4_MAX_ACCESSES ((uint64_t)UINT32_MAX - 4u)
/* Item ids are stored as 32-bit integers. */
#define OPT4_MAX_ITEMS ((uint64_t)UINT32_MAX)
/* Slots are stored in 30 bits of a plan op. */
#define OPT4_MAX_CAPACITY ((uint64_t)1 << 30)

/* The 64-bit fingerprint of a sequence: XXH3-64 of its ids as little-endian
 * uint32 values, so the same ids give the same fingerprint whatever the
 * dtype. Fails with OPT4_ERANGE if an id is outside [0, items). */
int opt4_fingerprint(const opt4_seq *seq, uint64_t *out);
/* XXH3-64 of len bytes: the checksum the record file keeps for each record,
 * and the per-item checksum of a dataset read in place
 * (opt4_ranges_sums, opt4_ranges_expect_sums). Thread-safe. */
uint64_t opt4_checksum(const void *data, size_t len);

/* ------------------------------------------------------------------------ */
/* Plans                                                                     */
/* ------------------------------------------------------------------------ */

/* A plan op is one uint32 per position: the kind in the top two bits and the
 * slot in the low 30. HIT reads the item from the slot; ADMIT loads it and
 * stores it in the slot (evicting whatever the slot held); BYPASS loads it and
 * does not store it. */
#define OPT4_OP_HIT 0u
#define OPT4_OP_ADMIT 1u
#define OPT4_OP_BYPASS 2u
#define OPT4_OP_KIND(op) ((uint32_t)(op) >> 30)
#define OPT4_OP_SLOT(op) ((uint32_t)(op)&0x3FFFFFFFu)
#define OPT4_OP_MAKE(kind, slot) (((uint32_t)(kind) << 30) | (uint32_t)(slot))

/* Plan flags. */
#define OPT4_PLAN_NOBYPASS 0x1u /* always admit a miss (classic Belady MIN) */
#define OPT4_PLAN_SIZED 0x2u    /* set by the engine: a plan in bytes and pages */

typedef struct opt4_plan_opts {
  /* Cache capacity in items, >= 1 (item-capacity plans). */
  uint64_t capacity;
  /* OPT4_PLAN_NOBYPASS or 0 (the default, "opt": Belady with bypass). */
  uint32_t flags;
  uint32_t reserved0;
  /* Capacity in bytes with per-item sizes (sized plans): give item_sizes
   * (items entries, bytes each item takes once stored), capacity_bytes and
   * page_size, and capacity 0. The pool is capacity_bytes / page_size pages;
   * an item takes ceil(size / page_size) of them, anywhere. The decisions are
   * size-aware Belady: on a miss, evict residents in order of farthest next
   * use until the item's pages are free; with bypass, admit only if every
   * one of them is needed later than the new item. With equal sizes this is
   * exactly Belady; with unequal sizes it is a heuristic (offline caching
   * with sizes is NP-hard). An accessed item larger than the whole pool
   * fails with OPT4_EITEMSIZE. */
  const uint64_t *item_sizes;
  uint64_t capacity_bytes;
  uint64_t page_size;
  /* Optional: the build stores its progress here, from 0 to 3 * T (three
   * passes), with relaxed atomic stores every 65536 positions, so another
   * thread can show a progress bar. Must be 8-byte aligned. NULL: none. */
  volatile uint64_t *progress;
} opt4_plan_opts;

/* What a plan holds, and its totals. For a sequence-only plan (capacity 0,
 * see opt4_plan_from_seq) the totals are all zero except compulsory. */
typedef struct opt4_plan_info {
  uint64_t items;       /* N: ids are in [0, items) */
  uint64_t accesses;    /* T: length of the sequence */
  uint64_t capacity;    /* in items; 0 for a sequence-only plan */
  uint32_t flags;       /* OPT4_PLAN_* */
  uint32_t has_ops;     /* 1 if the plan holds decisions */
  uint64_t fingerprint; /* opt4_fingerprint() of the sequence */
  uint64_t hits;
  uint64_t misses; /* admits + bypasses */
  uint64_t admits;
  uint64_t bypasses;
  uint64_t compulsory; /* first accesses: the number of distinct ids */
  /* Slots the plan can use: min(capacity, items, accesses). Slots are handed
   * out lowest first, so every op's slot is below this. (Sized plans: the
   * pages the plan uses.) */
  uint64_t slots;
  /* Sized plans (flags & OPT4_PLAN_SIZED): capacity is in pages of page_size
   * bytes, capacity_bytes as given, and generations is the number of ADMITs
   * (each owns a list of pages, see opt4_plan_gen_pages). 0 otherwise. */
  uint64_t capacity_bytes;
  uint64_t page_size;
  uint64_t generations;
} opt4_plan_info;

typedef struct opt4_plan opt4_plan;

/* Build the OPT plan of seq at the given capacity.
 *
 * Semantics (the Python reference backend implements the same, decision by
 * decision):
 *   - next(t) is the next position after t with the same id, or "never".
 *   - Free slots form a stack, initially 0, 1, 2, ... from the top.
 *   - Resident id at t: HIT in its slot. If next(t) is never, the id is dead
 *     and its slot goes back on the free stack (its bytes stay until reused).
 *   - Miss, default ("opt", with bypass): if next(t) is never, BYPASS. Else
 *     ADMIT into a free slot if there is one; else, if the resident id used
 *     farthest in the future is used later than next(t), evict it and ADMIT
 *     into its slot; else BYPASS.
 *   - Miss, OPT4_PLAN_NOBYPASS ("opt-nobypass"): always ADMIT, into a free
 *     slot or else the slot of the id used farthest in the future; an id
 *     with no next use is admitted and its slot freed at once.
 * Both give the fewest misses possible for their model (Belady 1966; the
 * bypass variant may also decline to cache). O(T log_64 T) time, and at most
 * 8 bytes per access plus O(items) memory.
 *
 * Errors: OPT4_EINVAL (NULL argument, bad dtype, items == 0),
 * OPT4_ECAPACITY (capacity 0), OPT4_ETOOBIG (see the limits above),
 * OPT4_ERANGE (an id outside [0, items); opt4_errdetail() names the
 * position), OPT4_ENOTSUP (byte capacities), OPT4_ENOMEM. */
int opt4_plan_build(const opt4_seq *seq, const opt4_plan_opts *opts,
                    opt4_plan **out);

/* A plan whose decisions are given, not planned: kinds[t] (OPT4_OP_HIT,
 * OPT4_OP_ADMIT or OPT4_OP_BYPASS) for each position of seq, such as one
 * node's part of a cluster plan (opt4torch.cluster.NodePlan), which a pool
 * then runs as it runs any plan. A HIT reads its item's latest ADMIT. A
 * generation (an ADMIT and its HITs) holds its place from its ADMIT to its
 * last HIT (its ADMIT alone when none). The engine hands out the places
 * from a stack of free ones, as opt4_plan_build does: slots
 * (opts->capacity items), or pages (opts with
 * item_sizes, capacity_bytes and page_size, as opt4_plan_build takes them),
 * and checks the result as it checks a plan file's. opts->flags must be 0.
 *
 * Errors: as opt4_plan_build; OPT4_EINVAL also for kinds NULL, a kind
 * above OPT4_OP_BYPASS, or a HIT of an item no ADMIT before it holds, and
 * OPT4_ECAPACITY when an ADMIT finds no free place: the live generations
 * need more than the capacity (opt4_errdetail() names the position). */
int opt4_plan_from_kinds(const opt4_seq *seq, const uint8_t *kinds, const opt4_plan_opts *opts,
                         opt4_plan **out);

/* A plan that holds the sequence only (capacity 0, no decisions): what the
 * earlier design's precompute step wrote before a cache size was known.
 * Replan it with opt4_plan_replan(). Errors as opt4_plan_build(). */
int opt4_plan_from_seq(const opt4_seq *seq, opt4_plan **out);

/* Build a new plan over the sequence held by src. */
int opt4_plan_replan(const opt4_plan *src, const opt4_plan_opts *opts,
                     opt4_plan **out);

/* Release a plan (and unmap its file). NULL is harmless. */
void opt4_plan_close(opt4_plan *plan);

int opt4_plan_info_get(const opt4_plan *plan, opt4_plan_info *out);

/* The plan's arrays, valid while the plan is open: the ids (T uint32) and,
 * if info.has_ops, the ops (T uint32, see OPT4_OP_*); NULL otherwise. In a
 * sized plan an op's low 30 bits are a generation (the ADMIT's own, or the
 * one a HIT reads), not a slot. */
const uint32_t *opt4_plan_seq(const opt4_plan *plan);
const uint32_t *opt4_plan_ops(const opt4_plan *plan);

/* Sized plans: the pages of generation g (*n of them, at *pages), and each
 * item's size in bytes (items uint32, NULL for item-capacity plans). */
int opt4_plan_gen_pages(const opt4_plan *plan, uint64_t g, const uint32_t **pages,
                        uint64_t *n);
const uint32_t *opt4_plan_item_sizes(const opt4_plan *plan);

/* The sampler description stored with the plan (UTF-8, often JSON; may be
 * empty). *len gets its length. Valid while the plan is open. */
const char *opt4_plan_desc(const opt4_plan *plan, size_t *len);
/* Replace the description (copied). */
int opt4_plan_set_desc(opt4_plan *plan, const char *desc, size_t len);

/* The id each position evicts: dst[t] = the id that slot held before an
 * ADMIT at t, or -1 (no eviction: empty slot, HIT, BYPASS). dst_len must be
 * at least T. O(T) time, O(capacity) memory. OPT4_ENOPLAN without ops. */
int opt4_plan_victims(const opt4_plan *plan, int64_t *dst, uint64_t dst_len);

/* What each slot holds just before position t (0 <= t <= T): dst[s] = id or
 * -1 for a slot never written. Slots freed by dead ids keep their bytes, so
 * they report the dead id. dst_len must be at least info.slots. For sized
 * plans, dst[page] is the id whose bytes the page holds. */
int opt4_plan_slots_at(const opt4_plan *plan, uint64_t t, int64_t *dst,
                       uint64_t dst_len);

/* ------------------------------------------------------------------------ */
/* Plan files                                                                */
/* ------------------------------------------------------------------------ */

/* Write the plan to path in the documented binary format (docs/plan-format.md),
 * with opt4_outfile: a temporary file in the same directory is renamed over
 * path only once complete, so a failed save never leaves a partial file, and
 * a path that is not a regular file (a device, a FIFO, a directory) is
 * refused before anything is written. OPT4_EIO with opt4_errdetail() naming
 * the refused target or the system error. */
int opt4_plan_save(const opt4_plan *plan, const char *path);

/* Read a plan file into memory owned by the plan (a copy, not a mapping: a
 * file overwritten or cut short by another process later cannot change a
 * plan that passed its checks or kill the reader with SIGBUS; the file may
 * be replaced, rewritten or removed at any time after this returns) and
 * validate it completely before returning:
 * header fields against the file size, every section's bounds, checksums,
 * every id and slot, and a replay proving that every HIT finds its id in its
 * slot. Errors: OPT4_EIO, OPT4_EBADMAGIC, OPT4_EVERSION, OPT4_ETRUNCATED,
 * OPT4_ECHECKSUM, OPT4_ECORRUPT, OPT4_ENOMEM; opt4_errdetail() names the
 * field. A plan that opens can be trusted by the runtime. */
int opt4_plan_open(const char *path, opt4_plan **out);

/* The same validation over a buffer in memory (copied into the plan). */
int opt4_plan_load_buffer(const void *buf, size_t len, opt4_plan **out);

/* ------------------------------------------------------------------------ */
/* Cluster plans                                                             */
/* ------------------------------------------------------------------------ */

/* One OPT cache over the memory of several nodes (docs/cluster.md). The
 * input is a plan of the global timeline (every rank's reads, step by step,
 * rank by rank), built with opt4_plan_build at a capacity no larger than the
 * nodes' total (in items; or in bytes, see below), and the node that reads
 * each position. The
 * plan fixes which accesses hit and which miss (exact OPT for the aggregate
 * cache when every item has the same size); opt4_cluster_place decides where
 * each admitted generation lives and so which hits are local and which are
 * peer hits.
 *
 * A generation is an ADMIT and the HITs that read it after it. It occupies
 * one item of its home node's capacity from its ADMIT to its last read (the
 * node may drop it right after: nothing reads it again), not until the
 * aggregate plan's eviction, which always comes later. Its home is chosen at
 * its ADMIT, among the nodes with room (fewer live generations than their
 * capacity):
 *   1. the node that reads it next (its first HIT), if it has room;
 *   2. else the node that reads it now (it read the item from storage, so
 *      keeping it needs no transfer), if it has room;
 *   3. else the node with the most room, the lowest node id on ties.
 * Some node always has room: the live generations just before an ADMIT at t
 * are a subset of the aggregate plan's residents at t without the one it
 * evicts, so fewer than the plan's slots <= the nodes' total. So no node
 * ever holds more than its capacity (checked as it runs: a plan that would
 * break it fails with OPT4_ECORRUPT).
 *
 * A plan in bytes (a sized plan) works the same in pages: capacity[] is
 * each node's pages (of the plan's page_size), a generation needs its
 * item's pages on one node, and "room" is free pages. There the argument
 * above gives enough free pages in total but not on one node, so a
 * generation may find no home: it is then read from storage at each of its
 * accesses (BYPASS), counted in info->unplaced and unplaced_hits. With
 * sizes the aggregate plan is itself a heuristic (docs/algorithm.md).
 *
 * Each position gets a kind and a node:
 *   LOCAL_HIT  the reader's node holds the generation (node: the reader's);
 *   PEER_HIT   another node holds it and sends a copy into the reader's
 *              staging ahead of time; the item stays where it is (node: the
 *              source);
 *   ADMIT      read from storage by the reader and kept at its home (node:
 *              the home; a home other than the reader's node costs one
 *              transfer, reader to home);
 *   BYPASS     read from storage by the reader and not kept (node:
 *              OPT4_CLUSTER_NONE). An aggregate ADMIT that no HIT ever reads
 *              (the aggregate plan evicts it before its next use) is a
 *              BYPASS here: keeping it anywhere would serve nothing;
 *   LATE       with windows only (below): a read of a generation that a node
 *              holds, or will hold, but that cannot reach the reader in time;
 *              read from storage by the reader and not kept (node: the
 *              generation's home). The generation goes on for its later
 *              reads.
 *
 * Windows. At run time the nodes exchange items in windows of a fixed
 * number of steps: in window k every node sends each other node what that
 * node reads from it in window k + 1, and it can send only what it holds
 * when window k starts (docs/cluster.md, "The run time"). With window_of
 * (each position's window, non-decreasing) the placement keeps to that.
 * A generation admitted at position s, in window w = window_of[s]:
 *   - kept by its reader's node (home == reader): that node reads it
 *     locally from s on, and can send it from window w + 1, so a peer reads
 *     it from window w + 2 on;
 *   - kept elsewhere: the reader sends it to its home in window w + 1, so
 *     the home reads it from window w + 2 on and sends it from there, and a
 *     peer reads it from window w + 3 on.
 * A read of the generation before that is LATE. Rule 1 above then takes the
 * next reader's node only if that is the reader's own or its next read is
 * in window w + 2 or later; otherwise rules 2 and 3 as before. A
 * generation kept away that ends with no read in time would be sent for
 * nothing: its ADMIT is a BYPASS then (its home's capacity stays counted
 * for it, as placed). Without
 * window_of (NULL) nothing is ever LATE: the plan assumes transfers arrive
 * whenever they are due.
 *
 * A warm prefix (opts->prefix positions, a resumed run's; docs/cluster.md,
 * "The cache after a resume"). Positions [0, prefix) are not reads: each
 * says that its reader's node holds the item at the start (what that
 * node's pool still holds when a live loader plans the rest again). The
 * aggregate plan decides, as for any access, which of them to keep; a kept
 * one (ADMIT) is homed at the node that holds it, never sent anywhere (no
 * worker reads it), and one its node has no room for is dropped (BYPASS,
 * counted in info->unplaced). Its generation is at its home before any
 * window starts: the home reads it at once, and with windows a peer from
 * window_of[0] + 1 on (the home sends it in window window_of[0]). Prefix
 * positions count in no access, storage or transfer figure; each node's
 * kept ones are its `warm` (also counted in `homed`). An item may appear
 * once in the prefix. */
#define OPT4_CLUSTER_LOCAL_HIT 0u
#define OPT4_CLUSTER_PEER_HIT 1u
#define OPT4_CLUSTER_ADMIT 2u
#define OPT4_CLUSTER_BYPASS 3u
#define OPT4_CLUSTER_LATE 4u
#define OPT4_CLUSTER_NONE UINT32_MAX
/* Node ids are below this. */
#define OPT4_MAX_NODES ((uint64_t)1 << 20)

typedef struct opt4_cluster_opts {
  /* The node that reads each position: T entries, each < n_nodes. */
  const uint32_t *node_of;
  uint32_t n_nodes;
  uint32_t reserved0;
  /* Items each node holds at most (pages, for a plan in bytes): n_nodes
   * entries (0 is allowed for a node that only reads; the total must be at
   * least 1). */
  const uint64_t *capacity;
  /* For the byte counts only: each item's size in bytes (items entries), or
   * NULL for item_bytes per item (for a plan in bytes, item_bytes 0 means
   * the plan's own item sizes). */
  const uint64_t *item_sizes;
  uint64_t item_bytes;
  /* Each position's transfer window (T entries, non-decreasing), or NULL
   * for none: see "Windows" above. */
  const uint32_t *window_of;
  /* Positions at the start that are a warm prefix, not reads (0: none):
   * see "A warm prefix" above. At most T. */
  uint64_t prefix;
} opt4_cluster_opts;

/* One node's share of a cluster plan. */
typedef struct opt4_cluster_node {
  uint64_t accesses;       /* positions this node reads */
  uint64_t local_hits;
  uint64_t peer_hits;      /* its reads served by a peer */
  uint64_t admits;         /* its storage reads that are kept (here or at a peer) */
  uint64_t bypasses;       /* its storage reads that are not kept, LATE ones included */
  uint64_t storage_bytes;  /* bytes it reads from storage (admits + bypasses) */
  uint64_t homed;          /* generations kept here */
  uint64_t peer_items_sent, peer_items_received;
  uint64_t peer_bytes_sent, peer_bytes_received;
  uint64_t peak_resident;  /* most generations (pages) held here at once, <= capacity */
  uint64_t late;           /* its LATE reads (counted in bypasses too) */
  uint64_t warm;           /* warm-prefix generations kept here (in homed too) */
} opt4_cluster_node;

/* The cluster's totals. */
typedef struct opt4_cluster_info {
  uint64_t accesses;
  uint64_t hits;           /* local_hits + peer_hits: the aggregate plan's hits,
                            * less unplaced_hits and late */
  uint64_t local_hits, peer_hits;
  uint64_t admits, bypasses;
  uint64_t remote_admits;  /* admits kept away from the node that read them */
  uint64_t storage_bytes;  /* all nodes' storage reads */
  uint64_t peer_bytes;     /* all transfers between nodes (each counted once) */
  uint64_t capacity;       /* the nodes' total */
  /* Plans in bytes only: generations for which no node had enough free
   * pages (free pages spread over nodes), and the aggregate plan's hits of
   * them; those reads are BYPASSes. 0 for plans in items. */
  uint64_t unplaced, unplaced_hits;
  /* With windows: the aggregate plan's hits that are LATE. */
  uint64_t late;
  /* Warm-prefix generations kept (every node's warm). accesses counts the
   * positions after the prefix only. */
  uint64_t warm;
  /* XXH3-64 of the plan's fingerprint and capacity, the node count and
   * capacities, every position's reader, kind and node, and the windows
   * when given (native byte order): equal on every rank that planned the
   * same cluster. */
  uint64_t checksum;
} opt4_cluster_info;

/* Place the generations of plan over the nodes (the rule above) and write
 * each position's kind (kinds, OPT4_CLUSTER_*) and node (nodes); dst_len is
 * their length, at least T. stats gets n_nodes entries; info the totals.
 * O(T log n_nodes + items) time, O(items + n_nodes) memory beyond
 * the caller's buffers (nodes holds the next uses during the pass).
 *
 * Errors: OPT4_EINVAL (a NULL argument, dst_len < T, n_nodes 0),
 * OPT4_ETOOBIG (n_nodes >= OPT4_MAX_NODES), OPT4_ENOPLAN (a plan without
 * decisions), OPT4_ECAPACITY (the nodes' total is 0 or smaller than the
 * plan's slots, or pages; the detail gives both),
 * OPT4_ERANGE (a node id >= n_nodes, or a window smaller than the one
 * before it; the detail names the position), OPT4_EINVAL also for a
 * prefix longer than the plan or an item twice in it (the detail names
 * both positions),
 * OPT4_ECORRUPT (a plan whose residents would not fit: not one the engine
 * built or validated), OPT4_ENOMEM. On failure the buffers hold nothing
 * meaningful. Thread safety: reads the plan only; any number of threads may
 * place over one plan at once. */
int opt4_cluster_place(const opt4_plan *plan, const opt4_cluster_opts *opts,
                       uint8_t *kinds, uint32_t *nodes, uint64_t dst_len,
                       opt4_cluster_node *stats, opt4_cluster_info *info);

/* ------------------------------------------------------------------------ */
/* Simulation                                                                */
/* ------------------------------------------------------------------------ */

typedef struct opt4_sim_result {
  uint64_t accesses;
  uint64_t hits;
  uint64_t misses;
} opt4_sim_result;

/* Replay seq through the named policy at a capacity in items and count hits.
 * Every policy starts with an empty cache, so first accesses are misses.
 *
 * Policies (docs/policies.md states each rule exactly; the Python reference
 * implements the same rules and the tests hold both to equal counts):
 *   "opt", "opt-nobypass"  the planner (see opt4_plan_build): Belady with and
 *                          without bypass. The only ones that read the future,
 *                          with "freq".
 *   "lru", "fifo"          least recently used; first in, first out.
 *   "lfu"                  fewest accesses since admission; ties: least
 *                          recently accessed.
 *   "random"               a victim drawn by splitmix64(seed) % capacity over
 *                          the slots; the same seed gives the same count.
 *   "clock"                one-bit second chance, new ids with the bit clear.
 *   "sieve"                SIEVE (NSDI'24).
 *   "s3fifo"               S3-FIFO (SOSP'23): small queue of ceil(capacity /
 *                          10), main queue, ghost ids, frequencies capped at 3.
 *   "arc"                  ARC (FAST'03) with an integer target p.
 *   "static"               admit until full, never evict (CoorDL's MinIO).
 *   "freq"                 the capacity ids most accessed over the whole
 *                          sequence, lower id on ties (NoPFS's placement).
 * A capacity of at least items never evicts, whatever the policy. seed is
 * used by "random" only. Time: O(T) for the online policies (amortised O(1)
 * per access; "freq" adds O(T + items) up front), the planner's time for OPT.
 * Memory: at most 12 bytes per id and 32 per cache slot for the online
 * policies; the planner's (at most 8 bytes per access) for OPT.
 *
 * Thread safety: any number of threads may simulate at once (each call owns
 * its state); the CPython binding releases the GIL around it.
 *
 * Errors: OPT4_EUNKNOWN_POLICY (opt4_errdetail() names it), OPT4_ECAPACITY,
 * OPT4_ERANGE (an id outside [0, items); the detail names the position),
 * OPT4_ENOMEM, and as opt4_plan_build(). */
int opt4_simulate(const char *policy, const opt4_seq *seq, uint64_t capacity,
                  uint64_t seed, opt4_sim_result *out);

/* The names of all policies, NULL-terminated, in a stable order. */
const char *const *opt4_policy_names(void);

/* ------------------------------------------------------------------------ */
/* The shared-memory pool: the cache at run time                             */
/* ------------------------------------------------------------------------ */

/* A pool holds the cache for every process of a run (the DataLoader's main
 * process and its workers) in two POSIX shared-memory segments named
 * "/opt4-<uid>-<run>" (page states, per-process records, counters, payload)
 * and "/opt4-<uid>-<run>.meta" (the plan in run-time form, read-only). The
 * creator (owner) builds both from a plan; other processes attach by name.
 *
 * Run-time protocol, per position t of the plan (docs/runtime.md):
 *   HIT    copy the item out of its pages (opt4_pool_get);
 *   ADMIT  the caller loads the item and stores it (opt4_pool_put);
 *   BYPASS the caller loads the item and does not store it.
 * Each ADMIT starts a generation that owns some pages. A reader waits until
 * its generation is published; a writer waits until the previous generation
 * on each of its pages is published and all of its reads are done. Waits
 * only point at earlier positions, so there is no cycle; every wait is
 * bounded, and on timeout the caller loads from the source (counted as a
 * fallback). Readers announce the page they copy in their process record
 * (a hazard pointer), so a writer never overwrites bytes being read, and a
 * dead reader's record is found by pid and cleared. */

typedef struct opt4_pool opt4_pool;

/* The engine's defaults and limits: what 0 in an options struct gives, and
 * the largest count a field takes. One place for each; the binding exports
 * them (opt4torch._engine.DEFAULT_*), so Python never repeats them. */
#define OPT4_DEFAULT_WAIT_TIMEOUT_MS 10000u /* opt4_pool_opts.wait_timeout_ms */
#define OPT4_DEFAULT_MAX_PROCS 256u         /* opt4_pool_opts.max_procs */
#define OPT4_DEFAULT_PREFETCH_THREADS 8u    /* opt4_prefetcher_opts.threads */
#define OPT4_MAX_PREFETCH_THREADS 256u      /* opt4_prefetcher_opts.threads, max_threads */
#define OPT4_DEFAULT_LOOKAHEAD 4096u        /* opt4_prefetcher_opts.lookahead */

typedef struct opt4_pool_opts {
  /* Bytes per page. Item-capacity plans give each item one page, so this is
   * the largest stored item (serialized) the pool accepts. Required. */
  uint64_t page_size;
  /* Longest any single wait may take before falling back, in milliseconds.
   * 0 gives the default, 10000. */
  uint64_t wait_timeout_ms;
  /* Process records (owner + workers + ranks). 0 gives the default, 256. */
  uint32_t max_procs;
  /* OPT4_POOL_* flags. */
  uint32_t flags;
  /* The process the pool belongs to: its liveness decides whether the pool
   * is stale. 0: the creator, which then holds the owner's lock (see
   * OPT4_OWNER_LIVE). A worker that creates the pool lazily for its main
   * process names the main process here; such a pool has no lock, and its
   * liveness is the main process's pid and start time. */
  uint32_t owner_pid;
  /* Prefetching BYPASSes: slots of a staging ring in the pool, where a
   * prefetcher puts the BYPASS items it loads ahead until their consumers
   * copy them out (0: none, and BYPASSes are never prefetched). ADMITs need
   * no staging: they are prefetched into their own pages. */
  uint32_t staging_slots;
  /* Bytes per staging slot (rounded up to 4096). 0: the page size for item
   * plans, the largest item for sized plans. A larger BYPASS item is left to
   * its consumer. */
  uint64_t staging_slot_bytes;
  /* Pages beyond the plan's (0: none). The plan decides which items are
   * resident; the pool assigns their pages, each ADMIT taking the pages
   * freed longest ago (after their last planned read). A prefetched ADMIT is
   * handed over only after those reads, so pages read just before its
   * position make its reader wait; spare pages keep that distance when the
   * plan evicts an item just read (docs/prefetch.md, "Handover"). They cost
   * spare_pages * page_size bytes and change no decision. At most as many
   * as the plan's pages (or 1024). */
  uint64_t spare_pages;
} opt4_pool_opts;

/* Also build the occurrence index (4 bytes per access and 12 per item more),
 * for callers that know the item but not the position: the k-th request for
 * an item is its k-th planned position (opt4_pool_occurrence_next). */
#define OPT4_POOL_OCCURRENCES 0x1u

/* Create a pool for a plan with decisions. The segments are created with
 * O_EXCL and mode 0600 and sized with posix_fallocate, so a /dev/shm that is
 * too small fails here with OPT4_ENOSPACE (opt4_errdetail() gives the sizes
 * and the fix), never with SIGBUS later. Errors: OPT4_EINVAL, OPT4_ENOPLAN,
 * OPT4_ENOSPACE, OPT4_ESHM, OPT4_ENOMEM. The caller is the owner: it should
 * call opt4_pool_unlink() when the run ends. The header records the owner's
 * uid, pid, start time and PID namespace; the owner's handle holds the
 * owner's lock (one file descriptor, close-on-exec) until it is closed.
 * Closing the owner's handle without unlinking hands the pool's liveness
 * back to the owner's pid.
 *
 * Namespaces. With the environment variable OPT4TORCH_POOL_NAMESPACE set
 * (a lowercase letter, then up to 15 lowercase letters, digits or '_'),
 * pools are named /opt4-<uid>-<namespace>-<pid>-<random>, and
 * opt4_pool_list() (so every sweep of stale pools) sees only the pools of
 * that namespace; without it, only pools made without one. Child processes
 * inherit it, so a job's workers and ranks share its namespace; two test
 * suites on one machine each set their own and never sweep each other's
 * pools. A malformed value fails with OPT4_EINVAL. */
int opt4_pool_create(const opt4_plan *plan, const opt4_pool_opts *opts,
                     opt4_pool **out);

/* Attach to a pool by name (what opt4_pool_name() returned). Checks magic,
 * layout version, owner uid and sizes. Each handle takes a process record
 * of its own (max_procs of them in all): attach one for each thread that
 * serves the pool. Errors: OPT4_ESHM (no such pool), OPT4_EPOOL,
 * OPT4_EPROCS, OPT4_ENOMEM. */
int opt4_pool_attach(const char *name, opt4_pool **out);

/* Detach: release this process's record and unmap. NULL is harmless. Does
 * not remove the segments. Safe to call in a forked child on the parent's
 * handle: it then only unmaps. */
void opt4_pool_close(opt4_pool *pool);

/* Remove the pool's segments (the owner, at the end of a run). Attached
 * processes keep their mappings until they close. Idempotent. */
int opt4_pool_unlink(opt4_pool *pool);

const char *opt4_pool_name(const opt4_pool *pool);

/* Whether this process created the pool. */
int opt4_pool_is_owner(const opt4_pool *pool);

typedef struct opt4_pool_info {
  uint64_t accesses, items, fingerprint;
  uint64_t page_size, pages, generations;
  uint64_t shm_bytes;  /* both segments */
  uint64_t wait_timeout_ms;
  uint32_t max_procs, attached;
  uint32_t owner_pid, reserved;
} opt4_pool_info;
int opt4_pool_info_get(const opt4_pool *pool, opt4_pool_info *out);

/* Counters, summed over every process that used the pool. */
typedef struct opt4_pool_stats {
  uint64_t hits;           /* HITs served from the pool */
  uint64_t admits;         /* ADMIT positions the callers loaded */
  uint64_t bypasses;       /* BYPASS positions the callers loaded */
  uint64_t fallbacks;      /* HITs that had to load from the source */
  uint64_t deferred;       /* HITs on an item loaded earlier in the same batch */
  uint64_t stored;         /* ADMITs written into the pool */
  uint64_t store_failed;   /* ADMITs not stored (timeout, too large, late) */
  uint64_t timeouts;       /* waits that hit the time limit */
  uint64_t waits;          /* accesses that had to wait at all */
  uint64_t wait_ns;        /* total time spent waiting */
  uint64_t prefetched;     /* misses served from what a prefetcher loaded */
  uint64_t prefetch_stored;  /* items prefetchers stored (pool or staging) */
  uint64_t prefetch_dropped; /* items prefetchers loaded but gave up (wasted) */
  uint64_t stalls;         /* misses whose consumer waited for a prefetch */
  uint64_t stall_ns;       /* total time of those waits */
} opt4_pool_stats;
int opt4_pool_stats_get(const opt4_pool *pool, opt4_pool_stats *out);

/* Where a running job is, for live figures (opt4torch.DataLoader's
 * log_every, `opt4torch top`): its info and counters as above, the
 * consumers' furthest position, and how full the pool is. */
typedef struct opt4_pool_view {
  opt4_pool_info info;
  opt4_pool_stats stats;
  uint64_t head;         /* the consumers' furthest position, rounded down to a
                            multiple of 32 (0 before the first access) */
  uint64_t floor;        /* positions below it will not run (epochs left early) */
  uint64_t pages_ready;  /* pages that hold an item's bytes */
  uint64_t pages_failed; /* pages whose generation gave up (nothing stored) */
} opt4_pool_view;

/* The view of an attached pool. Reads only; O(pages) (every page's state
 * word is looked at once), so call it now and then, not per access. Thread
 * and process safety: any thread, any time; the figures are read one by one
 * while the pool runs, so they are each current, not a consistent snapshot. */
int opt4_pool_view_get(const opt4_pool *pool, opt4_pool_view *out);

/* The view of the pool called name (as opt4_pool_list gives it), from any
 * process of the same user, without attaching: both segments are mapped
 * read-only for the call and unmapped before it returns. No process record
 * is taken and nothing in the pool is written, so looking at a job never
 * changes it. Errors: OPT4_EINVAL (not a pool name), OPT4_ESHM (no such
 * pool, or it cannot be mapped), OPT4_EPOOL (not this user's, or not a
 * pool), and the header checks of opt4_pool_attach. */
int opt4_pool_peek(const char *name, opt4_pool_view *out);

/* The item id at position t, and the plan's decision there (OPT4_OP_*). */
int opt4_pool_item(const opt4_pool *pool, uint64_t t, uint32_t *item,
                   uint32_t *kind);

/* Results of opt4_pool_get. */
#define OPT4_GET_HIT 0       /* copied: len bytes at dst */
#define OPT4_GET_TOO_SMALL 1 /* len bytes needed; nothing copied, try again */
#define OPT4_GET_LOAD 2      /* load it (reason says why); put it if ADMIT */
#define OPT4_GET_DEFER 3     /* a HIT on the item admitted at position
                                defer_to, earlier in the same batch */
#define OPT4_GET_AGAIN 4     /* (batches only) not served yet: finish the
                                batch's earlier positions, then get t again */

#define OPT4_REASON_ADMIT 1
#define OPT4_REASON_BYPASS 2
#define OPT4_REASON_FALLBACK 3
/* For OPT4_GET_HIT at an ADMIT or BYPASS: a prefetcher loaded it. */
#define OPT4_REASON_PREFETCHED 4

typedef struct opt4_get_result {
  uint32_t status;  /* OPT4_GET_* */
  uint32_t reason;  /* for OPT4_GET_LOAD: OPT4_REASON_* */
  uint32_t item;    /* the id at t */
  uint32_t reserved;
  uint64_t len;     /* bytes copied (HIT) or needed (TOO_SMALL) */
  uint64_t defer_to;
} opt4_get_result;

/* Serve position t. batch (sorted, length batch_len, may be NULL) lists the
 * positions this caller handles together: a HIT on an item admitted at one of
 * them returns OPT4_GET_DEFER instead of waiting for itself. May wait
 * (bounded). Errors: OPT4_ERANGE for t past the plan; OPT4_EINVAL when
 * another thread is inside this handle. Thread and process safety: any
 * number of threads and processes at once, each thread with its own handle
 * (a handle holds one hazard: see "Thread and process safety" above).
 *
 * A caller may serve a batch in two passes: get every position, then load
 * the LOADs and commit in position order (opt4_pool_put for each ADMIT,
 * opt4_pool_note_read for each DEFER). Such a caller still owes the stores
 * of the batch's earlier ADMITs while it gets t; if t's miss is then in a
 * prefetcher's hands, the prefetcher's store may be waiting for one of them
 * (its item replaces what the caller admitted). Rather than wait for
 * itself, opt4_pool_get returns OPT4_GET_AGAIN at once, having done nothing
 * at t: commit the positions before t, then get t and the rest again, with a
 * batch that starts at t. A caller that puts each ADMIT as soon as it is
 * loaded never sees OPT4_GET_AGAIN, nor does one without a batch. */
int opt4_pool_get(opt4_pool *pool, uint64_t t, const uint64_t *batch,
                  size_t batch_len, void *dst, size_t dst_cap,
                  opt4_get_result *res);

/* A gather list for opt4_pool_put. */
typedef struct opt4_iovec {
  const void *base;
  size_t len;
} opt4_iovec;

/* Store the item loaded for ADMIT position t (the bytes of parts, in order).
 * *stored is 1 if it is now in the pool, 0 if not (timeout, too large for
 * its pages, or overtaken by a later generation; counted). A put at a
 * position that is not an ADMIT fails with OPT4_EINVAL. */
int opt4_pool_put(opt4_pool *pool, uint64_t t, const opt4_iovec *parts,
                  size_t n_parts, int *stored);

/* The most bytes position t's item can occupy in the pool (0 unless t is a
 * HIT or an ADMIT): a buffer this large always suffices for opt4_pool_get. */
int opt4_pool_space(const opt4_pool *pool, uint64_t t, uint64_t *bytes);

/* Resuming at position p: the generations that hold an item the plan reads
 * at or after p, admitted before p. For each, its ADMIT position, its item,
 * and how many of its reads come before p. At most info.pages of them; *n
 * gets the count (entries beyond cap are not written). O(p) time. */
int opt4_pool_live_at(opt4_pool *pool, uint64_t p, uint64_t *admits, uint32_t *items,
                      uint32_t *reads_before, size_t cap, size_t *n);

/* Store the item of ADMIT position admit as if its first reads_before reads
 * had happened (warming a resumed run). Otherwise as opt4_pool_put. */
int opt4_pool_warm(opt4_pool *pool, uint64_t admit, const opt4_iovec *parts,
                   size_t n_parts, uint32_t reads_before, int *stored);

/* Count a DEFER position as a completed read of its generation, once the
 * caller has the item (so that the next writer of those pages need not wait
 * for it). */
int opt4_pool_note_read(opt4_pool *pool, uint64_t t);

/* Position t will not run as planned (the caller served another item there,
 * or none): an ADMIT's generation is marked failed so that its readers load
 * at once and its successors do not wait for it; a HIT counts as a read. */
int opt4_pool_skip(opt4_pool *pool, uint64_t t);

/* For pools created with OPT4_POOL_OCCURRENCES: the position of the next
 * planned access to item, across all processes (*t = UINT64_MAX once the
 * plan has no more accesses to it). OPT4_ERANGE for an item >= items,
 * OPT4_EINVAL without the index. */
int opt4_pool_occurrence_next(opt4_pool *pool, uint32_t item, uint64_t *t);

/* Positions below floor that have not run will never run (a training loop
 * broke out of an epoch): waits on them end at once. Only ever raised. */
int opt4_pool_set_floor(opt4_pool *pool, uint64_t floor);

/* The floor as it is now (0 until raised): a consumer handed positions all
 * below it holds a batch that nobody will take (an epoch left early) and
 * may drop it unserved. One atomic load; any thread, any process. */
int opt4_pool_floor_get(const opt4_pool *pool, uint64_t *floor);

/* The compatibility clock: a shared counter that hands out positions in
 * arrival order (the earlier design's global clock). */
int opt4_pool_clock_next(opt4_pool *pool, uint64_t *t);

/* Prefetching: clairvoyant loading ahead of the consumers.
 *
 * Any number of prefetchers (threads, each with its own handle, in any
 * process attached to the pool) follow the plan ahead of the consumers: a
 * prefetcher claims the next miss (an ADMIT, or a BYPASS when the pool has
 * staging slots) within `lookahead` positions of the furthest position any
 * consumer has asked for, loads its item, and stores it: an ADMIT into its
 * own pages (after the items it replaces have had their planned reads), a
 * BYPASS into a staging slot. The consumer at that position then copies it
 * out (OPT4_GET_HIT with reason OPT4_REASON_PREFETCHED) instead of loading.
 * Every miss is loaded exactly once, by a prefetcher or by its consumer,
 * whichever claims it first. A consumer that finds its miss still in a
 * prefetcher's hands waits for it (a stall, counted), bounded by the pool's
 * timeout; then, or if the prefetcher died, it loads the item itself.
 * docs/prefetch.md has the protocol. */
typedef struct opt4_prefetch_job {
  uint64_t t;     /* the position claimed */
  uint32_t item;  /* its item id */
  uint32_t kind;  /* OPT4_OP_ADMIT or OPT4_OP_BYPASS */
  uint64_t space; /* the most bytes it may take once stored */
} opt4_prefetch_job;

#define OPT4_PREFETCH_CLAIMED 0 /* job holds a claimed miss: load it, then store or release */
#define OPT4_PREFETCH_IDLE 1    /* nothing to claim in the window now: try again later */
#define OPT4_PREFETCH_END 2     /* every miss of the plan is claimed or past */

/* Claim the next miss within lookahead positions of the consumers' progress.
 * *status gets OPT4_PREFETCH_*. Thread-safe (one handle per thread). */
int opt4_pool_prefetch_claim(opt4_pool *pool, uint64_t lookahead, opt4_prefetch_job *job,
                             int *status);

/* Claim the miss at position t itself, wherever the prefetchers' cursor is:
 * how a loader that is not a storage prefetcher (the receive side of a
 * cluster, which gets items from peers; docs/cluster.md) takes the
 * positions it will fill. Claimed before any prefetcher runs, they are
 * skipped by the prefetchers, and their consumers wait for the store (or,
 * past the pool's timeout, or once the claim is released, load the item
 * themselves). *status: OPT4_PREFETCH_CLAIMED (job filled: store or
 * release it as after opt4_pool_prefetch_claim), or OPT4_PREFETCH_IDLE when
 * t is a HIT, a BYPASS in a pool without staging slots, or a miss that
 * someone has claimed already. OPT4_ERANGE for t past the plan. */
int opt4_pool_prefetch_claim_at(opt4_pool *pool, uint64_t t, opt4_prefetch_job *job, int *status);

/* Results of the prefetch stores. */
#define OPT4_STORE_GIVEN_UP 0 /* its consumer loads it (counted as dropped) */
#define OPT4_STORE_DONE 1     /* handed over: its consumer will find it */
#define OPT4_STORE_NOT_YET 2  /* (try_store only) not yet: keep it, try again */

/* Hand over the item loaded for claimed position t (the bytes of parts). May
 * wait, bounded, for the items it replaces to be read, or for its staging
 * slot. *stored is OPT4_STORE_DONE if its consumer will find it,
 * OPT4_STORE_GIVEN_UP if the prefetcher gave it up (the consumer loads it;
 * counted as dropped). OPT4_EITEMSIZE if it
 * does not fit its space (given up too); OPT4_EINVAL if t is not claimed by
 * this handle. */
int opt4_pool_prefetch_store(opt4_pool *pool, uint64_t t, const opt4_iovec *parts,
                             size_t n_parts, int *stored);

/* The same without waiting while the consumers are still far (more than 32
 * positions) from t: *result is OPT4_STORE_DONE, OPT4_STORE_GIVEN_UP, or
 * OPT4_STORE_NOT_YET (the items it replaces have reads to come, or its
 * staging slot is taken; keep the item and try again). Once the consumers are near t it waits as
 * opt4_pool_prefetch_store does: a consumer may be waiting for this item.
 * A prefetcher that keeps a few loaded items pending this way keeps its
 * reads going while earlier items wait for their place. */
int opt4_pool_prefetch_try_store(opt4_pool *pool, uint64_t t, const opt4_iovec *parts,
                                 size_t n_parts, int *result);

/* Give up claimed position t without storing (the load failed): its
 * consumer loads it. */
int opt4_pool_prefetch_release(opt4_pool *pool, uint64_t t);

/* How many misses in positions [from, to) no one has finished loading yet
 * (unclaimed, or in a prefetcher's hands): a caller can hold its first batch
 * until the prefetchers have a head start. O(to - from). */
int opt4_pool_prefetch_pending(opt4_pool *pool, uint64_t from, uint64_t to, uint64_t *pending);

/* The consumers' progress moves in blocks of this many positions; a
 * prefetcher's store is "near" (waits as for a consumer) once the consumers
 * are within one block of it. */
#define OPT4_HEAD_BLOCK 32u

/* Sleep until the consumers' progress (the furthest position asked for,
 * in steps of OPT4_HEAD_BLOCK) reaches position target, at most timeout_ns: on the word
 * the consumer that moves it wakes (a futex), not in a sleep loop. *reached
 * is 1 if it did. For a thread that must keep pace with the consumers (a
 * cluster's transfer thread, docs/cluster.md). An interrupted handle
 * returns at once. */
int opt4_pool_wait_head(opt4_pool *pool, uint64_t target, uint64_t timeout_ns, int *reached);

/* The consumers' progress now (what opt4_pool_wait_head waits on), without
 * waiting: a look costs a load, where a wait of any timeout costs a system
 * call. */
int opt4_pool_head(const opt4_pool *pool, uint64_t *head);

/* Make every wait on this handle, in progress (from another thread) or
 * later, end at once as if timed out: for shutting a prefetch thread down
 * without waiting out the pool's timeout. Only that handle is affected. */
int opt4_pool_interrupt(opt4_pool *pool);

/* Whether a pool's owner is alive, as opt4_pool_list sees it: 0 when it is
 * dead (the pool is stale), otherwise OPT4_OWNER_LIVE and any of the rest.
 *
 * How it is known. The owner, when it created the pool itself, holds an OFD
 * lock (fcntl F_OFD_SETLK) on the pool's main segment from creation until
 * its handle closes; the kernel releases it when the owner dies. A held
 * lock proves the owner alive and a released one proves it dead, whatever
 * PID namespace the owner and the caller are in (a container sharing the
 * host's /dev/shm, a job started with `unshare -p`). Forked children do not
 * keep the lock (each closes its copy right after fork), so a pool's life
 * is its owner's: a killed owner's pool is stale even while a worker it
 * forked is still winding down. Without a lock (an owner that is not the
 * creator, see opt4_pool_opts.owner_pid; a pool of an older opt4 version; a
 * kernel without OFD locks, before Linux 3.15), the owner's pid and start
 * time decide, and only when the owner is in the caller's PID namespace
 * (recorded in the header at creation): an owner in another one cannot be
 * checked from here, and its pool is kept (OPT4_OWNER_UNCHECKED). */
#define OPT4_OWNER_LIVE 0x1u      /* alive, or cannot be proved dead: never removed without force */
#define OPT4_OWNER_LOCKED 0x2u    /* proved alive by its lock */
#define OPT4_OWNER_OTHER_NS 0x4u  /* the owner is in another PID namespace than the caller
                                     (owner_pid is its pid there) */
#define OPT4_OWNER_UNCHECKED 0x8u /* another namespace and no lock: liveness unknown, kept */

/* Pools of this user: visit each segment name with its owner's pid, its
 * owner's state (0: dead, else OPT4_OWNER_* flags, see above) and the bytes
 * of both segments. A nonzero return from visit stops the listing and is
 * returned. Listing only tests locks, never takes them. Stale pools can be
 * removed with opt4_pool_remove(). Only the pools of this process's namespace
 * (OPT4TORCH_POOL_NAMESPACE, see opt4_pool_create) are visited. A meta
 * segment whose main segment is gone (a removal killed between its two
 * unlinks, a segment removed by hand) is visited under its own name
 * ("/opt4-...meta"), stale (state 0), with its own bytes. */
typedef int (*opt4_pool_visit_fn)(void *ctx, const char *name, uint32_t owner_pid,
                                  int owner_state, uint64_t bytes);
int opt4_pool_list(opt4_pool_visit_fn visit, void *ctx);
/* Remove both segments of a pool by name. Without force, only a stale pool
 * (its owner dead, as above) is removed: it is judged and removed while
 * holding a write lock on the segment, so an owner cannot be found dead
 * and then come to life before the removal (a creator caught in the instant
 * before its lock starts over under another name). Refused with OPT4_EPOOL
 * (opt4_errdetail() says why) while the owner is alive, while the pool is
 * being created, and when the owner is in another PID namespace without a
 * lock. force removes it whatever its state (never another user's). A
 * name ending in ".meta" is an orphan meta segment as opt4_pool_list names
 * it: removed while its main segment is gone, else refused (OPT4_EPOOL:
 * remove the pool itself). */
int opt4_pool_remove(const char *name, int force);

/* ------------------------------------------------------------------------ */
/* Writing files                                                             */
/* ------------------------------------------------------------------------ */

/* Every file the engine writes (plan files, record files) and every file the
 * Python package writes (sidecars, the CLI's tables) is written this way:
 * into a temporary file beside path, renamed over path only once complete
 * and synced, so a reader sees the old file or the new one, never half of
 * one, and a failure leaves the old file as it was.
 *
 * The target is checked before anything is written and again just before
 * the rename. Only a missing path or a regular file is replaced: anything
 * else (a directory, a device node such as /dev/null, a FIFO, a socket) is
 * refused with OPT4_EIO and a detail that says what it is. A symbolic link
 * is never written through: it is replaced (the link itself, as mv does)
 * when it leads to a regular file or to nothing, and refused when it leads
 * to anything else or through /proc (/dev/stdout); OPT4_OUTFILE_NO_SYMLINK
 * refuses every link.
 *
 * The temporary is <path>.tmp-<pid>-<start>-<pidns>-<n> (the writer's pid,
 * start time and PID namespace), created with O_EXCL | O_NOFOLLOW, mode 0644
 * under the umask. opt4_outfile_open removes the temporaries of the same
 * path that writers now dead left behind (killed by SIGKILL), only those of
 * its own PID namespace and user.
 *
 * Thread safety: one opt4_outfile per thread; any number of threads and
 * processes may write files, even the same path (the last rename wins). */
typedef struct opt4_outfile opt4_outfile;

#define OPT4_OUTFILE_NO_SYMLINK 0x1u /* refuse a symbolic link at path */

/* Check path as opt4_outfile_open would, without creating anything. */
int opt4_outfile_check(const char *path, uint32_t flags);
/* Check the target, remove dead writers' temporaries, create the temporary.
 * OPT4_EIO (a refused target, or the system error), OPT4_EINVAL, OPT4_ENOMEM. */
int opt4_outfile_open(const char *path, uint32_t flags, opt4_outfile **out);
/* Append, or write at offset, into the temporary. OPT4_EIO. */
int opt4_outfile_write(opt4_outfile *f, const void *data, size_t len);
int opt4_outfile_pwrite(opt4_outfile *f, const void *data, size_t len, uint64_t offset);
/* Complete the temporary (fsync, close) without putting it in place: for
 * writing two files that must change together, sync both, then commit both. */
int opt4_outfile_sync(opt4_outfile *f);
/* Sync if not yet done, check the target again, rename over path, sync the
 * folder. Releases f, also on failure (the temporary is then removed). */
int opt4_outfile_commit(opt4_outfile *f);
/* Remove the temporary and release f. NULL is harmless. */
void opt4_outfile_abort(opt4_outfile *f);
/* The temporary's path (valid until commit or abort). */
const char *opt4_outfile_tmp_path(const opt4_outfile *f);

/* ------------------------------------------------------------------------ */
/* Record files and the prefetcher                                           */
/* ------------------------------------------------------------------------ */

/* A record file holds a dataset of byte records (encoded images, serialized
 * samples) packed in one file: a 4 KiB header, the records each at a
 * multiple of 4096 bytes, and an index of (offset, length) at the end
 * (docs/records.md). Record i is item i. Readers validate the whole header
 * and index when they open a file, and read records with pread, optionally
 * with O_DIRECT (no page cache): the alignment comes from statx
 * (STATX_DIOALIGN) where the kernel has it, else the block size, and where
 * O_DIRECT is refused or its reads fail (tmpfs, some network filesystems)
 * the reader falls back to buffered reads and says so in info.note.
 *
 * Thread safety: any number of threads may read one opt4_records at once. */
typedef struct opt4_records opt4_records;

#define OPT4_RECORDS_DIRECT 0x1u /* read with O_DIRECT where the filesystem allows */

typedef struct opt4_records_info {
  uint64_t count;       /* records */
  uint64_t total_bytes; /* the records' lengths, summed */
  uint64_t max_len;     /* the longest record */
  uint64_t file_size;
  uint64_t direct;      /* 1 if reads use O_DIRECT */
  uint64_t dio_align;   /* the offset alignment O_DIRECT reads use */
  uint64_t reads;       /* records read so far, by every thread and by the
                           processes forked after open (one shared count) */
  uint64_t bytes_read;  /* their bytes */
  uint64_t latency_ns;  /* emulated latency per read (opt4_records_set_latency) */
  const char *note;     /* how reads are done, and why (valid while open) */
  uint64_t version;     /* format version: 1 or 2 */
  uint64_t checksum;    /* the header's XXH3-64 (covers count, sizes and the
                           index, whose entries hold each record's XXH3-64 in
                           version 2): names this version of the file */
} opt4_records_info;

/* Open and validate a record file. Errors: OPT4_EIO (with the system error),
 * OPT4_EBADMAGIC, OPT4_EVERSION, OPT4_ETRUNCATED, OPT4_ECHECKSUM,
 * OPT4_ECORRUPT (opt4_errdetail() names the record or field), OPT4_ENOMEM. */
int opt4_records_open(const char *path, uint32_t flags, opt4_records **out);
void opt4_records_close(opt4_records *r);
int opt4_records_info_get(const opt4_records *r, opt4_records_info *out);
/* The length of record i (OPT4_ERANGE past the end). */
int opt4_records_len(const opt4_records *r, uint64_t i, uint64_t *len);
/* Read record i into dst (cap bytes); *len gets its length. OPT4_EITEMSIZE
 * if it does not fit (*len says how much is needed), OPT4_ERANGE, OPT4_EIO. */
int opt4_records_read(opt4_records *r, uint64_t i, void *dst, size_t cap, uint64_t *len);
/* Sleep this long before every read: an emulated slow store, for
 * benchmarks and tests (0, the default, for none). */
void opt4_records_set_latency(opt4_records *r, uint64_t ns);

/* Writing a record file: records are streamed to a temporary file beside
 * path with opt4_outfile (OPT4_OUTFILE_NO_SYMLINK: a symbolic link at path
 * is refused), which finish() completes, syncs and renames over path;
 * abort() removes it. */
typedef struct opt4_records_writer opt4_records_writer;
int opt4_records_writer_open(const char *path, opt4_records_writer **out);
int opt4_records_writer_add(opt4_records_writer *w, const void *data, size_t len);
/* Complete and sync the file without putting it in place yet, and give the
 * header checksum that opt4_records_info.checksum will report for it (a
 * sidecar written with the file records it, so that a reader can tell a
 * sidecar of another version of the file). Then finish() or abort(). */
int opt4_records_writer_prepare(opt4_records_writer *w, uint64_t *checksum);
/* Complete the file (prepare, if not done yet), put it in place and release
 * the writer (also on failure). */
int opt4_records_writer_finish(opt4_records_writer *w);
void opt4_records_writer_abort(opt4_records_writer *w);

/* ------------------------------------------------------------------------ */
/* Sources: where a miss is loaded from                                     */
/* ------------------------------------------------------------------------ */

/* A source is a dataset the engine can load items from: item i, for i in
 * [0, count), is a run of bytes of a known length. It is a table of
 * functions with a private state pointer (the shape of the cache policies,
 * docs/sources.md), so the prefetcher loads every miss the same way,
 * whatever holds the data. The library ships two: the record file
 * (opt4_source_records) and byte ranges of files read in place
 * (opt4_source_ranges: an image folder, tar shards indexed by
 * opt4_tar_index_file); a C user plugs in their own by filling an
 * opt4_source_ops and calling opt4_source_create.
 *
 * Reads go in batches: submit starts a batch of reads (item, destination,
 * capacity), and reap waits until every read of a batch has completed. A
 * source that reads with blocking calls (pread) completes each read inside
 * submit and needs no reap; one that queues its reads (io_uring, an object
 * store's requests) completes them in reap. Each read's outcome is written
 * into the read itself, so completions need no other bookkeeping. */
typedef struct opt4_source opt4_source;

/* A read still in flight (opt4_source_read.status): submit sets it on reads
 * it leaves to reap; reap replaces it with the final status. */
#define OPT4_SOURCE_PENDING 1

/* One read of a batch. The caller fills item, dst, cap (and tag, for its
 * own use: the source never reads it); the source fills len (the item's
 * length, also when it did not fit) and status: 0, OPT4_SOURCE_PENDING, or
 * a negative code (OPT4_EITEMSIZE when len > cap, OPT4_ERANGE, OPT4_EIO,
 * OPT4_ECHECKSUM, ...). */
typedef struct opt4_source_read {
  uint64_t item;
  void *dst;
  size_t cap;
  uint64_t tag;
  uint64_t len;
  int status;
  uint32_t reserved;
} opt4_source_read;

#define OPT4_SOURCE_OPS_VERSION 1u

/* The functions a source implements. `state` is the pointer given to
 * opt4_source_create. Every function returns 0 or a negative OPT4_E* code
 * (with opt4__fail-style detail where it can: sources outside the library
 * return the code only).
 *
 * Thread and process safety: the prefetcher calls count, max_size and
 * size_of once at start, then size_of, submit and reap from all its threads
 * at once, each thread with its own batches. A source must allow that. It
 * may also be used in processes forked after it was made (DataLoader
 * workers): state it keeps must survive fork, or be made again on first
 * use in the child. */
typedef struct opt4_source_ops {
  uint32_t version;  /* OPT4_SOURCE_OPS_VERSION */
  uint32_t reserved;
  const char *name;  /* for messages and stats: "records", "files", ... */
  /* The number of items. */
  int (*count)(void *state, uint64_t *items);
  /* The length of item i, in bytes; OPT4_ERANGE past the end. */
  int (*size_of)(void *state, uint64_t item, uint64_t *len);
  /* Optional: the largest item's length (NULL: the largest size_of, asked
   * once per item when the prefetcher starts). */
  int (*max_size)(void *state, uint64_t *len);
  /* Start the n reads (n >= 1). Each read completes here (status 0 or a
   * negative code) or later in reap (status OPT4_SOURCE_PENDING). A
   * negative return refuses the whole batch: no read was started. */
  int (*submit)(void *state, opt4_source_read *reads, size_t n);
  /* Optional (NULL when submit completes every read on the caller's
   * thread): wait until none of the n reads of a batch submitted by this
   * thread is pending, for at most timeout_ns. With timeout_ns 0 (no limit)
   * it returns only once every read is complete (a failed read has its
   * code in its status); with a limit that runs out it returns OPT4_EIO
   * with reads still pending: reap them later, never reuse their buffers
   * before. Reap is where reads completed on other threads are handed
   * over: it must make their results visible to the caller (a lock, or
   * release/acquire), and the caller reads no status before it. */
  int (*reap)(void *state, opt4_source_read *reads, size_t n, uint64_t timeout_ns);
  /* Optional: free state (called by opt4_source_close). */
  void (*close)(void *state);
} opt4_source_ops;

/* Make a source from a table and its state. The table is copied; state
 * belongs to the source from here on when ops->close is set (closed with
 * it, also when create fails after checking the table), else stays the
 * caller's and must outlive the source. Errors: OPT4_EINVAL (a NULL
 * argument, a missing count, size_of or submit, no name, another
 * OPT4_SOURCE_OPS_VERSION), OPT4_ENOMEM, and what count returns.
 * Thread safety: a source may be used from any number of threads at once
 * (as its ops allow: see above); create and close are not thread-safe
 * against other use of the same source. */
int opt4_source_create(const opt4_source_ops *ops, void *state, opt4_source **out);
/* The record file r as a source (borrowed: r must stay open until the
 * source is closed). Reads keep counting in opt4_records_info. */
int opt4_source_records(opt4_records *r, opt4_source **out);
/* Byte ranges of files, read in place: item i is `length` bytes at `offset`
 * of file `file` (an index into the paths given to opt4_ranges_open). One
 * file an item (an ImageFolder tree) or many items a file (tar shards, see
 * opt4_tar_index_file). Reads are preads, or O_DIRECT reads through an
 * aligned bounce buffer (the record file's way) with OPT4_RANGES_DIRECT
 * where the filesystem allows it (probed at open: info.note says how reads
 * are done; a file that refuses O_DIRECT later is read buffered).
 *
 * Thread and process safety: opt4_ranges_read may be called from any
 * number of threads at once, and in processes forked after open
 * (DataLoader workers): the counters are shared with them. With at most 64
 * files, each file is opened on first use and kept open; with more, each
 * read opens and closes its file. Files are not checked at open: a file
 * missing or shorter than an item's range fails that item's read
 * (OPT4_EIO, OPT4_ETRUNCATED, naming the file). A file is opened
 * O_NONBLOCK and must be a regular file (a FIFO or a device is refused
 * before any read, OPT4_EIO); with opt4_ranges_expect, every read also
 * checks that its file is still the one indexed. */
typedef struct opt4_ranges opt4_ranges;

typedef struct opt4_range {
  uint64_t file;   /* index into paths */
  uint64_t offset; /* bytes from the file's start */
  uint64_t length;
} opt4_range;

#define OPT4_RANGES_DIRECT 0x1u /* read with O_DIRECT where the filesystem allows */

typedef struct opt4_ranges_info {
  uint64_t count;       /* items */
  uint64_t files;
  uint64_t total_bytes; /* the items' lengths, summed */
  uint64_t max_len;     /* the longest item */
  uint64_t direct;      /* 1 if reads use O_DIRECT */
  uint64_t dio_align;   /* the offset alignment O_DIRECT reads use */
  uint64_t reads;       /* items read so far, by every thread and by the
                           processes forked after open (one shared count) */
  uint64_t bytes_read;  /* their bytes */
  uint64_t latency_ns;  /* emulated latency per read (opt4_ranges_set_latency) */
  const char *note;     /* how reads are done, and why (valid while open) */
} opt4_ranges_info;

/* Make a reader of n_items ranges of n_files files. paths and items are
 * copied. Errors: OPT4_EINVAL (a NULL argument or path, unknown flags),
 * OPT4_ERANGE (an item's file past n_files, or a range past 2^63),
 * OPT4_ETOOBIG, OPT4_ENOMEM. */
int opt4_ranges_open(const char *const *paths, uint64_t n_files, const opt4_range *items, uint64_t n_items,
                     uint32_t flags, opt4_ranges **out);
/* A file as it was when indexed: what opt4_ranges_expect checks. */
typedef struct opt4_file_ident {
  uint64_t size, ino;
  int64_t mtime_ns, ctime_ns; /* st_mtim and st_ctim in nanoseconds */
} opt4_file_ident;

/* Give each file's identity as indexed (n_files of them, copied): from
 * then on every read fstats its file after the pread and fails (OPT4_EIO,
 * naming the item, the file and what changed) unless size, inode, mtime
 * and ctime are still these, so bytes of a file rewritten in place, even
 * at its old size with its mtime put back, are never returned. Call it
 * before any read (not thread-safe with reads). Errors: OPT4_EINVAL (NULL,
 * or not one identity a file), OPT4_ENOMEM. */
int opt4_ranges_expect(opt4_ranges *r, const opt4_file_ident *ids, uint64_t n_files);
/* Each item's XXH3-64 (the record file's checksum), read from storage now:
 * what a dataset records when it is indexed with checksums. Reads are
 * checked as opt4_ranges_read's (identity, regular file, length) but not
 * counted, and take no emulated latency. sums has n_items == count entries.
 * Errors: opt4_ranges_read's, OPT4_EINVAL (n_items is not the count). */
int opt4_ranges_sums(opt4_ranges *r, uint64_t *sums, uint64_t n_items);
/* Give each item's checksum as indexed (opt4_ranges_sums; n_items == count,
 * copied, once, before any read): from then on every read hashes what it
 * read and fails with OPT4_ECHECKSUM, naming the item and its file, unless
 * it is the one recorded, so bytes changed in a way the file's identity
 * cannot show (a filesystem whose ctime means nothing, an identity forced
 * back) are never returned. Errors: OPT4_EINVAL (NULL, not one a item, set
 * twice), OPT4_ENOMEM. */
int opt4_ranges_expect_sums(opt4_ranges *r, const uint64_t *sums, uint64_t n_items);
/* Close the reader (and the files it keeps open). NULL is harmless. */
void opt4_ranges_close(opt4_ranges *r);
int opt4_ranges_info_get(const opt4_ranges *r, opt4_ranges_info *out);
/* The length of item i (OPT4_ERANGE past the end). */
int opt4_ranges_len(const opt4_ranges *r, uint64_t i, uint64_t *len);
/* Read item i into dst (cap bytes); *len gets its length. OPT4_EITEMSIZE if
 * it does not fit (*len says how much is needed), OPT4_ERANGE, OPT4_EIO (the
 * file cannot be opened or read, or is no longer the one indexed),
 * OPT4_ETRUNCATED (the file is now shorter than the range), OPT4_ECHECKSUM
 * (with opt4_ranges_expect_sums: the bytes are not those indexed). A failed
 * read is not counted, and dst holds nothing to use. */
int opt4_ranges_read(opt4_ranges *r, uint64_t i, void *dst, size_t cap, uint64_t *len);
/* Sleep this long before every read: an emulated slow store, for
 * benchmarks and tests (0, the default, for none). */
void opt4_ranges_set_latency(opt4_ranges *r, uint64_t ns);
/* The reader r as a source named "ranges" (borrowed: r must stay open until
 * the source is closed). Reads keep counting in opt4_ranges_info. */
int opt4_source_ranges(opt4_ranges *r, opt4_source **out);

/* Byte ranges of objects in an S3-compatible store (AWS S3, MinIO, Ceph,
 * moto, ...): item i is `length` bytes at `offset` of object `file` (an
 * index into the keys given to opt4_s3_open), read with one ranged GET made
 * in C on the calling thread, signed with AWS Signature Version 4 (or
 * unsigned, for a public bucket). Built with libcurl and OpenSSL's
 * libcrypto; without them (opt4_s3_available() == 0) opt4_s3_open fails
 * with OPT4_ENOTSUP. The protocol, retries and fork rules are written down
 * at the top of src/source/s3.c.
 *
 * Thread and process safety: opt4_s3_read may be called from any number of
 * threads at once (each read holds one HTTP connection; idle connections
 * are kept for the next read), and in processes forked after open, which
 * open connections of their own; counters are shared with them. */
typedef struct opt4_s3 opt4_s3;

typedef struct opt4_s3_config {
  const char *endpoint;      /* "http://127.0.0.1:9000", "https://minio.example:9000"; NULL: AWS's for the region */
  const char *bucket;
  const char *region;        /* NULL: "us-east-1" */
  const char *access_key;    /* NULL (with secret_key NULL): unsigned requests */
  const char *secret_key;
  const char *session_token; /* temporary credentials' token; NULL: none */
  uint32_t path_style;       /* 1: endpoint/bucket/key (MinIO, moto); 0: bucket.host/key (AWS) */
  uint32_t max_attempts;     /* tries of a GET (connection errors, 5xx, 429); 0: 3 */
  uint64_t timeout_ns;       /* a try slower than min_rate over this long fails; 0: 60 s */
  uint64_t deadline_ns;      /* a GET, its tries included, ends this long after it starts; 0: 300 s */
  uint64_t min_rate;         /* bytes a second a try must keep up over timeout_ns; 0: 1024 */
  const char *ca_bundle;     /* https: the CA certificates (PEM) the store's certificate is verified
                                against; NULL: the system's. Verification is always on */
} opt4_s3_config;

typedef struct opt4_s3_info {
  uint64_t count, objects, total_bytes, max_len;
  uint64_t reads;      /* items read, by every thread and forked process (one shared count) */
  uint64_t bytes_read; /* their bytes */
  uint64_t requests;   /* GETs sent, tries again included */
  uint64_t retries;    /* tries again after a connection error, a 5xx or a 429 */
  uint64_t failures;   /* reads that failed after their last try */
  const char *note;    /* how reads are done (valid while open) */
} opt4_s3_info;

/* 1 if this build has the S3 reader (libcurl and libcrypto), else 0. */
int opt4_s3_available(void);
/* Make a reader of n_items ranges of n_objects objects (keys: the objects'
 * keys, not URL-encoded). Everything is copied; keys are checked only by
 * the reads. Errors: OPT4_EINVAL (a NULL argument or key, no bucket, an
 * endpoint that is not http(s)://host[:port], a key without its secret),
 * OPT4_ERANGE (an item's object past n_objects), OPT4_ETOOBIG, OPT4_ENOMEM,
 * OPT4_ENOTSUP (built without libcurl). */
int opt4_s3_open(const opt4_s3_config *cfg, const char *const *keys, uint64_t n_objects, const opt4_range *items,
                 uint64_t n_items, opt4_s3 **out);
void opt4_s3_close(opt4_s3 *r);
/* Give each object's ETag and size as listed (n_objects of each; either
 * may be NULL, an ETag may be "": not checked; copied), once, before any
 * read. From then on every GET sends If-Match: <ETag> (a store that honours
 * it answers a changed object with 412), and an answer whose ETag differs,
 * or whose Content-Range total is not the listed size, fails
 * (OPT4_ETRUNCATED, naming the object: it changed since it was listed).
 * Errors: OPT4_EINVAL (not one a object, set twice, an ETag over 128 bytes
 * or with bytes a header cannot carry), OPT4_ENOMEM. */
int opt4_s3_expect(opt4_s3 *r, const char *const *etags, const uint64_t *sizes, uint64_t n_objects);
/* Give each item's XXH3-64 as indexed (n_items == count, copied, once,
 * before any read; opt4_ranges_sums over the object fetched when it was
 * indexed): every GET whose answer passed the checks above is hashed too,
 * and fails with OPT4_ECHECKSUM naming the item and the object unless it is
 * the one recorded (a store that ignores If-Match and sends no ETag).
 * Errors: OPT4_EINVAL, OPT4_ENOMEM, OPT4_ENOTSUP. */
int opt4_s3_expect_sums(opt4_s3 *r, const uint64_t *sums, uint64_t n_items);
int opt4_s3_info_get(const opt4_s3 *r, opt4_s3_info *out);
int opt4_s3_len(const opt4_s3 *r, uint64_t i, uint64_t *len);
/* Read item i into dst (cap bytes); *len gets its length. OPT4_EITEMSIZE if
 * it does not fit, OPT4_ERANGE, OPT4_EIO (the store failed or refused the
 * request, answered a Content-Range for other bytes than those asked for,
 * or a malformed header, or took longer than the deadline or slower than
 * the minimum rate: opt4_errdetail() names the object, the range, the
 * status and the store's error code), OPT4_ETRUNCATED (the store answered
 * another length, size or ETag than the listing's, or 412 to If-Match: the
 * object changed). */
int opt4_s3_read(opt4_s3 *r, uint64_t i, void *dst, size_t cap, uint64_t *len);
/* The reader r as a source named "s3" (borrowed: r must stay open until the
 * source is closed). */
int opt4_source_s3(opt4_s3 *r, opt4_source **out);

/* Tar shards, indexed as WebDataset reads them (docs/sources.md): regular
 * members only (ustar prefix, GNU ././@LongLink names and pax path= and
 * size= records understood), grouped into samples by key: the path up to
 * the first dot of its base name; the rest, lower-cased, is the member's
 * field ("jpg", "cls", "seg.png"); consecutive members with one key form a
 * sample. A sample is one byte range of the shard, from its first member's
 * data to its last member's data end (the headers between are part of it:
 * one read a sample), so the samples feed opt4_ranges_open directly. */
typedef struct opt4_tar_index opt4_tar_index;

typedef struct opt4_tar_sample {
  uint64_t offset, length;         /* the sample's byte range in the shard */
  uint64_t first_member, members;  /* its members: [first_member, +members) */
  uint64_t key_off;                /* its key: names[key_off, +key_len) */
  uint32_t key_len, reserved;
} opt4_tar_sample;

typedef struct opt4_tar_member {
  uint64_t offset;     /* the member's data, from the start of its sample's range */
  uint64_t size;
  uint64_t field_off;  /* its field: names[field_off, +field_len) */
  uint32_t field_len, reserved;
} opt4_tar_member;

/* The index's arrays (valid until opt4_tar_index_close). Names are not
 * NUL-terminated. */
typedef struct opt4_tar_view {
  const opt4_tar_sample *samples;
  uint64_t n_samples;
  const opt4_tar_member *members;
  uint64_t n_members;
  const char *names;
  uint64_t names_len;
} opt4_tar_view;

/* Index the tar file at path. A malformed shard is refused, with
 * opt4_errdetail() naming the shard and the header's offset:
 * OPT4_ECHECKSUM (a header's checksum is wrong: not a tar file, or
 * corrupted), OPT4_ETRUNCATED (a header cut short, or a member's size past
 * the end of the file), OPT4_ECORRUPT (a malformed number, pax record, an
 * oversized long name, or a field twice in one sample, which WebDataset
 * refuses too), OPT4_ENOTSUP (a GNU sparse member), OPT4_EIO, OPT4_ENOMEM.
 * Thread safety: independent calls may run at once. */
int opt4_tar_index_file(const char *path, opt4_tar_index **out);
int opt4_tar_index_view(const opt4_tar_index *t, opt4_tar_view *out);
/* Free the index. NULL is harmless. */
void opt4_tar_index_close(opt4_tar_index *t);
/* Read units of several pieces: item u of *out is pieces first[u] ..
 * first[u+1] - 1 of inner, read one after another into one destination
 * (a Parquet page range: a column's dictionary page and data pages, for
 * each column, apart in the file). first has n_units + 1 entries, from 0 to
 * opt4_source_count(inner), each unit at least one piece. inner belongs to
 * the gather source from this call on (closed with it, and when this call
 * fails); first is copied. Each unit's length (its pieces' sum) is taken
 * once, here; a piece read shorter fails its unit (OPT4_ETRUNCATED). The
 * inner source counts each piece's read. Errors: OPT4_EINVAL (NULL, first
 * not covering the pieces in order, a unit without pieces), OPT4_ETOOBIG,
 * OPT4_ENOMEM, and size_of's codes. Thread safety: as the inner source. */
int opt4_source_gather(opt4_source *inner, const uint64_t *first, uint64_t n_units, opt4_source **out);
/* Close a source (ops->close frees its state). NULL is harmless. */
void opt4_source_close(opt4_source *src);
/* The table's name, and the source's item count (read once, at create). */
const char *opt4_source_name(const opt4_source *src);
uint64_t opt4_source_count(const opt4_source *src);
/* The length of item i (OPT4_ERANGE past the end). */
int opt4_source_size_of(opt4_source *src, uint64_t item, uint64_t *len);
/* Start a batch of reads; then opt4_source_reap before looking at any
 * read's len or status (a queued source completes reads on other threads;
 * reap hands them over). */
int opt4_source_submit(opt4_source *src, opt4_source_read *reads, size_t n);
/* Wait until no read of the batch is pending (timeout_ns as in
 * opt4_source_ops.reap). For a source without reap it returns 0 at once
 * (OPT4_EINVAL if its submit left a read pending). */
int opt4_source_reap(opt4_source *src, opt4_source_read *reads, size_t n, uint64_t timeout_ns);
/* One read, start to finish: item into dst (cap bytes); *len gets its
 * length. The read's own status is returned (OPT4_EITEMSIZE if it does not
 * fit: *len says how much is needed). */
int opt4_source_read_one(opt4_source *src, uint64_t item, void *dst, size_t cap, uint64_t *len);

/* The prefetcher: threads that follow a pool's plan ahead of its consumers
 * and load every miss from a source (a record file, or any opt4_source)
 * straight into the pool (ADMITs)
 * or its staging slots (BYPASSes), with no Python and no GIL on the path
 * (see opt4_pool_prefetch_claim). Each thread attaches its own handle. */
typedef struct opt4_prefetcher opt4_prefetcher;

/* Frames record `item` (len bytes) as the consumer's decoder expects it in
 * the pool: writes the bytes that go before it into head and those after it
 * into tail (OPT4_FRAME_CAP bytes each) and their counts into *head_len and
 * *tail_len. Returns 0, or nonzero to leave the item to its consumer. */
#define OPT4_FRAME_CAP 64u
typedef int (*opt4_frame_fn)(void *ctx, uint32_t item, uint64_t len, uint8_t *head,
                             size_t *head_len, uint8_t *tail, size_t *tail_len);

typedef struct opt4_prefetcher_opts {
  uint32_t threads;   /* threads reading at the start; 0: 8; at most 256 */
  /* Depth: at most this many threads read at once (0: threads, a fixed
   * count; at most 256). Otherwise (even when equal to threads) the depth
   * starts at `threads` and
   * follows what the consumers need, looked at every 10 ms: the misses they
   * take per second (their progress, and the plan's misses ahead) times the
   * average time of a read, twice over; and half again as many readers
   * whenever they were short (they loaded misses no thread had come to, or
   * spent over half their time waiting for reads in flight). It goes down,
   * to twice the estimate (at least 4), when that is half the depth or less
   * and it has not grown for a second. Added
   * readers attach their pool handle (one process record each) and their
   * buffers when they first read, and keep them while dormant. */
  uint32_t max_threads;
  uint64_t lookahead; /* positions ahead of the consumers; 0: 4096 */
  opt4_frame_fn frame; /* NULL: records are stored as they are */
  void *frame_ctx;
  /* Bytes of loaded items the threads may hold while those wait for their
   * place in the pool (0: 4 MiB). Each thread has one buffer of its own
   * (the largest item's size) and takes more from this budget as it needs
   * them, up to budget / (threads x largest item), 1 to 32; threads added
   * by the depth find it taken, and hold one item each. */
  uint64_t pending_bytes;
} opt4_prefetcher_opts;

typedef struct opt4_prefetcher_stats {
  uint64_t loaded;  /* items read from the source */
  uint64_t bytes;   /* their bytes */
  uint64_t stored;  /* handed over to their consumers */
  uint64_t errors;  /* reads that failed (their consumers load them) */
  uint64_t idle_ns; /* time the threads found nothing to do in the window */
  uint64_t idle_waits; /* times a thread slept for want of work (woken, or its bound ran out) */
  uint32_t threads, finished; /* threads started, and those done */
  uint32_t active;            /* threads reading (the depth): from opts.threads up to max_threads */
  uint32_t grows;             /* times the depth was raised */
  uint32_t shrinks;           /* times it was lowered */
  uint32_t wanted;            /* the depth the last estimate asked for (0: none yet) */
  uint64_t read_avg_ns;       /* a source read's time, running average (0: none timed) */
  uint64_t cpu_ns;            /* CPU time the threads took (user + system), so far */
  uint64_t parks;         /* forks the threads were parked for */
  uint64_t park_timeouts; /* threads a fork did not find parked in time (10 s) */
} opt4_prefetcher_stats;

/* Start prefetching the pool named pool_name from record file src (which
 * must stay open until the prefetcher is stopped). The threads run until
 * every miss of the plan is claimed, or opt4_prefetcher_stop(). They block
 * all signals. A thread with nothing to do sleeps on the pool's consumer
 * progress word (a futex in the shared segment), woken when the consumers
 * move; it does not poll.
 *
 * Fork: fork() from any thread while a prefetcher runs is safe. Handlers
 * installed with pthread_atfork park every prefetch thread at a point where
 * it holds no lock before the fork and let them go on in the parent after
 * it; the child has no prefetch threads, and opt4_prefetcher_stop() there
 * only frees the child's copy (it neither stops nor disturbs the parent's
 * threads). A fork waits for the threads to reach such a point: at most one
 * record read each.
 * Errors: OPT4_EINVAL, OPT4_ENOMEM, those of opt4_pool_attach, OPT4_EIO
 * (no thread could start). */
int opt4_prefetcher_start(const char *pool_name, opt4_records *src,
                          const opt4_prefetcher_opts *opts, opt4_prefetcher **out);
/* The same from any source (opt4_source_create, opt4_source_records): the
 * threads load every miss through its table, one read a batch (submit, then
 * reap), so src must allow calls from all of them at once, and stay open
 * until the prefetcher is stopped. opt4_prefetcher_start is this with the
 * record file as the source. Errors: those above, OPT4_ETOOBIG (a largest
 * item over 1 TiB), and what the source's max_size or size_of return. */
int opt4_prefetcher_start_source(const char *pool_name, opt4_source *src,
                                 const opt4_prefetcher_opts *opts, opt4_prefetcher **out);
int opt4_prefetcher_stats_get(opt4_prefetcher *pf, opt4_prefetcher_stats *out);
/* A counter of the prefetcher's progress: it moves whenever a claimed miss
 * is settled (stored, given up or given back to its consumer) or a thread
 * is done. opt4_prefetcher_wait sleeps (on the counter itself: no polling)
 * until it differs from seen, for at most timeout_ns: 1 if it moved, 0 if
 * the time ran out. For a caller that waits for the prefetcher to load
 * something (the DataLoader's head start, with opt4_pool_prefetch_pending).
 * Thread safety: any thread; not from a prefetcher's own threads. */
uint32_t opt4_prefetcher_progress(opt4_prefetcher *pf);
int opt4_prefetcher_wait(opt4_prefetcher *pf, uint32_t seen, uint64_t timeout_ns);
/* Park the threads of every running prefetcher of this process at a safe
 * point, as a fork does, and keep them there until opt4_prefetchers_resume
 * or the next fork's parent or child handler. For a process about to fork
 * whose threads need something the forking thread will hold to reach a
 * safe point: a source that calls into Python needs the GIL, which
 * os.fork holds, so the binding calls this from Python's before-fork hook
 * with the GIL released. Waits up to 10 s; returns the number of threads
 * that were not parked by then. Thread safety: any thread, not from a
 * prefetcher's own threads or its source. */
uint32_t opt4_prefetchers_park(void);
/* Let the threads parked by opt4_prefetchers_park go (harmless when none
 * are). */
void opt4_prefetchers_resume(void);
/* Stop the threads (each finishes the item in hand, bounded by the pool's
 * wait timeout, or gives it back), join them and free. NULL is harmless. */
void opt4_prefetcher_stop(opt4_prefetcher *pf);

#ifdef __cplusplus
}
#endif
#endif /* OPT4_H */
