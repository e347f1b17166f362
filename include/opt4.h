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
 *   - opt4_set_allocator() must be called before any other function, if at all.
 */
#ifndef OPT4_H
#define OPT4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPT4_VERSION_MAJOR 0
#define OPT4_VERSION_MINOR 1
#define OPT4_VERSION_PATCH 0
#define OPT4_VERSION_STRING "0.1.0"

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
  XX(UNKNOWN_POLICY, -15, "unknown cache policy")

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

typedef struct opt4_plan_opts {
  /* Cache capacity in items, >= 1. */
  uint64_t capacity;
  /* OPT4_PLAN_* flags. 0 gives the default, "opt": Belady with bypass. */
  uint32_t flags;
  uint32_t reserved0;
  /* Reserved for capacities in bytes with per-item sizes (size-aware
   * Belady over a paged pool). Must be NULL / 0 in this version: anything
   * else fails with OPT4_ENOTSUP. */
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
   * out lowest first, so every op's slot is below this. */
  uint64_t slots;
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
 * if info.has_ops, the ops (T uint32, see OPT4_OP_*); NULL otherwise. */
const uint32_t *opt4_plan_seq(const opt4_plan *plan);
const uint32_t *opt4_plan_ops(const opt4_plan *plan);

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
 * they report the dead id. dst_len must be at least info.slots. */
int opt4_plan_slots_at(const opt4_plan *plan, uint64_t t, int64_t *dst,
                       uint64_t dst_len);

/* ------------------------------------------------------------------------ */
/* Plan files                                                                */
/* ------------------------------------------------------------------------ */

/* Write the plan to path in the documented binary format (docs/plan-format.md),
 * atomically: a temporary file in the same directory is renamed over path
 * only once complete, so a failed save never leaves a partial file.
 * OPT4_EIO with opt4_errdetail() naming the system error. */
int opt4_plan_save(const opt4_plan *plan, const char *path);

/* Open a plan file with mmap and validate it completely before returning:
 * header fields against the file size, every section's bounds, checksums,
 * every id and slot, and a replay proving that every HIT finds its id in its
 * slot. Errors: OPT4_EIO, OPT4_EBADMAGIC, OPT4_EVERSION, OPT4_ETRUNCATED,
 * OPT4_ECHECKSUM, OPT4_ECORRUPT, OPT4_ENOMEM; opt4_errdetail() names the
 * field. A plan that opens can be trusted by the runtime. */
int opt4_plan_open(const char *path, opt4_plan **out);

/* The same validation over a buffer in memory (copied into the plan). */
int opt4_plan_load_buffer(const void *buf, size_t len, opt4_plan **out);

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

#ifdef __cplusplus
}
#endif
#endif /* OPT4_H */
