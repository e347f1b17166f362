/*
 * layout.h - the layout of a pool's two shared-memory segments, private to
 * src/shm. Everything here lives in memory that several processes map, so
 * it is plain fixed-size data and lock-free atomics only (no pointers).
 *
 * Main segment "/opt4-<uid>-<run>":
 *   pool_header (4 KiB) | proc_rec[max_procs] | page_state[pages] |
 *   failed-generation bitmap | occurrence counters | claims of generations |
 *   claims of bypasses | staging slot lengths | payload pages (4 KiB
 *   aligned) | staging slots
 * Meta segment "/opt4-<uid>-<run>.meta" (written once by the owner, then
 * read-only):
 *   meta_header | seq[T] | rt[T] | gen_rec[G] | list_ent[L] | bpos[B] |
 *   occurrence index
 *
 * src/shm, one concern a file:
 *   segment.c   a pool's life cycle: create, attach, close, unlink, list,
 *               remove; names, mappings, the owner's lock, fork's lock fds
 *   meta.c      laying a plan out in the meta segment, and assigning its pages
 *   check.c     validating both segments before use (check.h)
 *   procs.c     process records (register, reclaim, dead processes),
 *               process identity, the fork generation, the clock
 *   runtime.c   the protocol (its header comment): get, put, skip, waits,
 *               the consumers' side of claims, head, floor, counters
 *   prefetch.c  the prefetchers' side of claims and the staging ring
 *
 * Who calls whom (no cycle: procs.c, meta.c and check.c call no other file
 * here, and nothing here calls segment.c or prefetch.c):
 *   segment.c  -> meta.c, check.c, procs.c
 *   prefetch.c -> runtime.c (through runtime.h), procs.c
 *   runtime.c  -> procs.c
 * Declarations below are grouped by the file that defines them.
 */
#ifndef OPT4_SHM_LAYOUT_H
#define OPT4_SHM_LAYOUT_H

#include "internal.h"

#include <stdatomic.h>
#include <sys/types.h>

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free (address-free) to live in shared memory");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free");

#define POOL_MAGIC "OPT4POOL"
#define META_MAGIC "OPT4META"
/* 3: the owner's PID namespace and its lock (owner_pidns_*, owner_flags).
 * 4: head_seq and head_waiters (prefetchers sleep on the consumers'
 * progress; a layout-3 library's consumers would never wake them).
 * 5: event_seq and event_waiters (waits in the pool sleep on the word its
 * changes bump; a layout-4 library would change them without a wake-up). */
#define POOL_LAYOUT 5u
#define POOL_HEADER_SIZE 4096u
#define POOL_NAME_MAX 64

/* Page states (low 2 bits of page_state.word; the generation is the high 32). */
/* pool_header.owner_flags */
#define POOL_OWNER_LOCKED 1u /* the owner holds its lock: a free lock means it died */

#define PS_EMPTY 0u   /* never written */
#define PS_WRITING 1u /* a writer owns it */
#define PS_READY 2u   /* holds its generation's bytes */
#define PS_FAILED 3u  /* its generation gave up: no bytes, nothing to wait for */
#define NO_GEN UINT32_MAX
/* head moves in blocks of HEAD_BLOCK positions; a sleeper on head_seq
 * waits on bit (block % 32), or on all of them. */
#define HEAD_BLOCK OPT4_HEAD_BLOCK
#define HEAD_ALL_BLOCKS 0xFFFFFFFFu

#define PS_WORD(gen, st) (((uint64_t)(gen) << 32) | (uint64_t)(st))
#define PS_GEN(w) ((uint32_t)((w) >> 32))
#define PS_STATE(w) ((uint32_t)((w)&3u))

/* Counters, per process record and retired (of processes gone). */
enum {
  C_HITS,
  C_ADMITS,
  C_BYPASSES,
  C_FALLBACKS,
  C_DEFERRED,
  C_STORED,
  C_STORE_FAILED,
  C_TIMEOUTS,
  C_WAITS,
  C_WAIT_NS,
  C_PF_SERVED,   /* misses served from what a prefetcher loaded */
  C_PF_STORED,   /* items a prefetcher stored (pool or staging) */
  C_PF_DROPPED,  /* items a prefetcher loaded but could not hand over */
  C_PF_STALLS,   /* misses whose consumer waited for an in-flight prefetch */
  C_PF_STALL_NS, /* the time those waits took */
  C_COUNT
};
_Static_assert(C_COUNT <= 16, "the counters must fit their two cache lines");

/* Claims: who loads a miss (an ADMIT's generation, or a BYPASS when the pool
 * stages them). One uint32 each: the state in the low 4 bits and, while a
 * prefetcher loads, its record + 1 above them. */
#define CL_OPEN 0u      /* nobody yet */
#define CL_LOADING 1u   /* a prefetcher is loading it */
#define CL_STORING 2u   /* a prefetcher is writing it (short) */
#define CL_READY 3u     /* prefetched: in its pages, or in its staging slot */
#define CL_SELF 4u      /* its consumer loads it (and, for an ADMIT, stores it) */
#define CL_ABANDONED 5u /* its consumer stopped waiting and loaded it itself */
#define CL_READING 6u   /* BYPASS: its consumer is copying it out of staging */
#define CL_DONE 7u      /* BYPASS: finished with; its staging slot is free */
#define CL_AGAIN 8u     /* not a state: claim_miss's "commit first, then ask again" */
#define CL_STATE(c) ((c)&15u)
#define CL_OWNER(c) ((c) >> 4) /* record + 1 of the loading prefetcher */

typedef struct pool_header {
  char magic[8];
  uint32_t layout;
  uint32_t header_size;
  uint64_t segment_size;
  uint64_t meta_size;
  uint32_t owner_uid;
  uint32_t owner_pid;
  uint64_t owner_start; /* clock ticks since boot: tells a reused pid apart */
  char run_id[40];
  uint64_t fingerprint;
  uint64_t accesses;
  uint64_t items;
  uint64_t generations;
  uint64_t page_size;
  uint64_t pages;
  uint64_t wait_timeout_ns;
  uint32_t max_procs;
  /* Prefetchers that wait for the consumers sleep on head_seq (a futex word
   * is 32 bits; head is 64), which advance_head bumps whenever it moves
   * head, and wakes only while head_waiters says someone sleeps (layout 4;
   * runtime.c, "waiting for the consumers"): each sleeper on the bit of the
   * head block it waits for, and a move wakes the bits of the blocks it
   * reached. */
  _Atomic uint32_t head_seq;
  uint64_t procs_off;
  uint64_t states_off;
  uint64_t failed_off;
  uint64_t occ_count_off; /* per-item occurrence counters (0: none) */
  uint64_t payload_off;
  _Atomic uint64_t floor;
  _Atomic uint64_t clock;
  _Atomic uint32_t attached;
  _Atomic uint32_t head_waiters;
  _Atomic uint64_t retired[C_COUNT];
  /* Prefetching (docs/prefetch.md). */
  uint64_t bypasses;           /* B: BYPASS positions in the plan */
  uint64_t gclaim_off;         /* _Atomic uint32_t[generations] */
  uint64_t bclaim_off;         /* _Atomic uint32_t[B], 0 without staging */
  uint64_t slot_len_off;       /* slot_state[staging_slots] */
  uint64_t staging_off;        /* staging_slots slots after the payload */
  uint64_t staging_slots;      /* 0: BYPASSes are never prefetched */
  uint64_t staging_slot_bytes; /* a multiple of 4096 */
  _Atomic uint64_t head;       /* consumers' furthest position, rounded down */
  _Atomic uint64_t pf_cursor;  /* the next position prefetchers consider */
  /* The owner beyond its pid (layout 3). A pid and a start time name a
   * process only inside one PID namespace: a sweeper in another one (the
   * host, beside a container that shares /dev/shm) would see some other
   * process, or none, under that pid. So the header also names the owner's
   * PID namespace (st_dev and st_ino of /proc/<pid>/ns/pid; 0: unknown),
   * and, while POOL_OWNER_LOCKED is set, the owner holds an OFD read lock
   * on this segment, which the kernel drops when the owner dies, whatever
   * namespace either side is in (segment.c, "the owner's lock"). */
  uint64_t owner_pidns_dev;
  uint64_t owner_pidns_ino;
  _Atomic uint32_t owner_flags;
  uint32_t reserved2;
  /* Waits for a page, a claim or a slot sleep on event_seq, bumped by every
   * change such a wait looks for, and woken only while event_waiters says
   * someone sleeps (layout 5; runtime.c, "waiting"). On a line of their
   * own: bumps must not take the line of head, floor and clock. */
  _Alignas(64) _Atomic uint32_t event_seq;
  _Atomic uint32_t event_waiters;
} pool_header;
_Static_assert(offsetof(pool_header, owner_pid) == 36 && offsetof(pool_header, owner_start) == 40,
               "the owner's pid and start time stay where every layout had them: an older "
               "library's sweep reads them there");
_Static_assert(sizeof(pool_header) <= POOL_HEADER_SIZE, "pool header too large");

/* One process's record: the part others read in the first cache line, the
 * counters (written only by their process) in the next two. */
typedef struct proc_rec {
  _Atomic uint32_t pid; /* 0: free */
  uint32_t reserved;
  _Atomic uint64_t start;
  _Atomic uint64_t hazard;  /* page + 1 being copied out, 0: none */
  _Atomic uint64_t writing; /* generation + 1 being written, 0: none */
  uint8_t pad[32];
  _Atomic uint64_t counters[C_COUNT];
  uint8_t pad2[128 - 8 * C_COUNT];
} proc_rec;
_Static_assert(sizeof(proc_rec) == 192, "proc_rec must be three cache lines");

/* A staging slot: whose turn it is (the BYPASS ordinal that may write it
 * next: slot s serves ordinals s, s + slots, s + 2 slots, ... in order) and
 * the length of what it holds. */
typedef struct slot_state {
  _Atomic uint64_t turn;
  _Atomic uint64_t len;
} slot_state;

typedef struct page_state {
  _Atomic uint64_t word;  /* PS_WORD(generation, state) */
  _Atomic uint64_t reads; /* generation << 32 | completed reads */
  _Atomic uint64_t len;   /* the stored item's length (first page of a gen) */
  uint64_t reserved;
} page_state;

typedef struct meta_header {
  char magic[8];
  uint32_t layout;
  uint32_t header_size;
  uint64_t size;
  uint64_t fingerprint;
  uint64_t accesses;
  uint64_t items;
  uint64_t generations;
  uint64_t list_len;
  uint64_t seq_off, rt_off, gens_off, list_off;
  uint64_t occ_start_off, occ_pos_off; /* occurrence index (0: none) */
  uint64_t bypasses, bpos_off;         /* position of each BYPASS, in order */
} meta_header;

/* One generation: an ADMIT and the HITs that read what it stored. */
typedef struct gen_rec {
  uint32_t admit;     /* position of the ADMIT */
  uint32_t reads;     /* HITs on this generation */
  uint32_t last_read; /* position of the last of them (admit if none) */
  uint32_t npages;
  uint64_t list_off; /* its pages in list_ent[] */
} gen_rec;

/* A page of a generation and the generation that owned it before. */
typedef struct list_ent {
  uint32_t page;
  uint32_t prev_gen; /* NO_GEN: first use of the page */
} list_ent;

/* rt[t]: the plan's kind in the top 2 bits, and in the low 30 the generation
 * (HIT, ADMIT) or the BYPASS's ordinal among the plan's BYPASSes. */
#define RT_KIND(v) ((v) >> 30)
#define RT_GEN(v) ((v)&0x3FFFFFFFu)
#define RT_MAX_GENS 0x3FFFFFFFu

struct opt4_pool {
  char name[POOL_NAME_MAX];
  uint8_t *base;
  size_t size;
  uint8_t *meta;
  size_t meta_size;
  pool_header *h;
  proc_rec *procs;
  page_state *states;
  _Atomic uint64_t *failed;
  uint8_t *payload;
  const meta_header *mh;
  const uint32_t *seq;
  const uint32_t *rt;
  const gen_rec *gens;
  const list_ent *list;
  const uint64_t *occ_start; /* items + 1 */
  const uint32_t *occ_pos;   /* positions grouped by item, in order */
  _Atomic uint32_t *occ_count;
  _Atomic uint32_t *gclaim;
  _Atomic uint32_t *bclaim; /* NULL without staging */
  slot_state *slots;
  uint8_t *staging;
  const uint32_t *bpos;
  int owner;
  int unlinked;
  /* The owner's lock: an fd of the main segment with an OFD read lock on
   * it, held while the owner's handle is open (-1: none), and the process
   * that opened it (a forked child's copy of the handle is not it). */
  int lock_fd;
  pid_t lock_pid;
  /* This process's record; re-registered after fork (see fork_gen). */
  uint32_t rec;
  pid_t pid;
  uint64_t fork_gen;
  uint64_t timeout_ns;
  _Atomic int interrupted; /* opt4_pool_interrupt: waits give up at once */
  /* Nonzero while a thread is inside a call that announces in this
   * handle's record (runtime.h, handle_enter). */
  _Atomic uint32_t entered;
  /* Called inside bounded waits, where this handle's thread holds no lock
   * and no memory of its own is half-changed: the prefetcher parks its
   * threads there around fork (prefetcher.c). Returns the nanoseconds it
   * kept the thread, which the wait does not count against its timeout. */
  uint64_t (*safe_point)(void *ctx);
  void *safe_ctx;
  /* Nonzero while the safe point wants the thread: a wait on head_seq
   * checks it after announcing itself, so a parking round opened as the
   * thread goes to sleep is never slept through. NULL: none. */
  const _Atomic uint32_t *park;
  /* Handles that share this one's mappings (opt4__pool_attach_shared),
   * counted: the last one closed unmaps them. NULL: mappings of its own. */
  _Atomic uint32_t *map_refs;
};

/* ---- procs.c ---- */
uint64_t opt4__proc_start_time(pid_t pid); /* 0 if unknown */
int opt4__proc_alive(pid_t pid, uint64_t start);
uint64_t opt4__now_ns(void);
uint64_t opt4__fork_generation(void);
/* In a forked child (segment.c's atfork handler): records registered
 * before the fork are not this process's. */
void opt4__fork_generation_bump(void);
/* Make sure this process has a record (after fork too). */
int opt4__pool_register(opt4_pool *pool);
/* Release a record (its counters are retired into the header). */
void opt4__pool_reclaim(opt4_pool *pool, uint32_t rec);
/* Reclaim the record if its process is gone; 1 if it did. */
int opt4__pool_reclaim_if_dead(opt4_pool *pool, uint32_t rec);
/* Whether the prefetcher that holds claim word c has died. */
int opt4__claimer_dead(opt4_pool *pool, uint32_t c);

/* ---- meta.c ---- */
/* Sizes of the meta segment and the generation count for a plan. */
int opt4__meta_size(const opt4_plan *plan, int occurrences, uint64_t *size,
                    uint64_t *gens, uint64_t *list_len);
/* pages: the pool's pages, at least the plan's slots; the generations'
 * pages are assigned here (meta.c, pass 2), not taken from the plan. */
int opt4__meta_build(const opt4_plan *plan, int occurrences, uint8_t *meta,
                     uint64_t size, uint64_t gens, uint64_t list_len, uint64_t pages);

/* ---- runtime.c (what only prefetch.c uses of it is in runtime.h) ---- */
/* A page seen WRITING (word w) whose writer may have died: if no live
 * process is writing its generation and the page still holds w, the page
 * becomes FAILED and the generation is marked failed. */
void opt4__recover_dead_writer(opt4_pool *pool, page_state *ps, uint64_t w);

#endif /* OPT4_SHM_LAYOUT_H */
