/*
 * segment.c - creating, attaching, naming and removing a pool's segments,
 * and judging whether a pool's owner lives. A pool's life cycle: it builds
 * the meta segment with meta.c, checks what it attaches with check.c, and
 * registers and releases this process's record with procs.c.
 *
 * Names are "/opt4-<uid>-<run>" and "/opt4-<uid>-<run>.meta", where run is
 * the creator's pid and 64 random bits, so two runs never collide and
 * `opt4torch cleanup` can find one user's pools. Segments are created with
 * O_EXCL and mode 0600, and sized with posix_fallocate so that a /dev/shm
 * too small for the pool fails at creation, not with SIGBUS on first touch.
 *
 * Who owns a pool, and whether it is stale. The header records the owner's
 * uid, pid, start time and PID namespace. A pid and a start time prove
 * liveness only inside one PID namespace: seen from the host, a container's
 * owner "pid 1" is the host's init, and its pid 57 is some other process or
 * none. So the owner (when it is the creator) also holds an OFD read lock
 * (F_OFD_SETLK) on its main segment, taken right after shm_open and kept
 * while its handle is open; the kernel drops it when the owner dies, in
 * whatever namespace either side lives. A sweeper tests that lock: held
 * means alive, free (with POOL_OWNER_LOCKED in the header) means dead. Only
 * where there is no lock to go by (an owner that is not the creator, a pool
 * of an older layout, a kernel without OFD locks) does the sweeper fall back
 * to pid and start time, and then only for an owner in its own PID
 * namespace; an owner in another one is kept unless forced.
 */
#define _GNU_SOURCE /* F_OFD_SETLK, F_OFD_GETLK */
#include "layout.h"
#include "check.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define SHM_DIR "/dev/shm"

/* ---- fork: a child keeps neither its parent's record nor its lock ---- */

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* The owner's lock fds of this process (fd + 1; 0: a free slot). An OFD
 * lock belongs to the open file description, which fork shares: a child
 * that kept its copy would keep the lock, so a pool whose owner was killed
 * would look alive for as long as any child forked from it lived (a
 * DataLoader worker, or anything else the program forks). A pool's life is
 * its owner's, as with pids, so each child closes its copies at once: the
 * parent's lock stays held through the parent's own fd. A process with more
 * pools than slots leaves the rest to its children (the safe side: they
 * look alive a little longer, never dead while alive). */
#define LOCK_SLOTS 64
static _Atomic int lock_fds[LOCK_SLOTS];

static void lock_fd_track(int fd) {
  for (int i = 0; i < LOCK_SLOTS; i++) {
    int free_slot = 0;
    if (atomic_compare_exchange_strong(&lock_fds[i], &free_slot, fd + 1)) return;
  }
}

/* Untrack first, close second: a child forked in between keeps the lock a
 * little longer (the safe side), and no child ever closes an fd number that
 * this process has reused for something else. */
static void lock_fd_release(int fd) {
  for (int i = 0; i < LOCK_SLOTS; i++) {
    int mine = fd + 1;
    if (atomic_compare_exchange_strong(&lock_fds[i], &mine, 0)) break;
  }
  close(fd);
}

static void on_fork_child(void) {
  opt4__fork_generation_bump();
  for (int i = 0; i < LOCK_SLOTS; i++) {
    int v = atomic_exchange(&lock_fds[i], 0);
    if (v != 0) close(v - 1);
  }
}
static void install_atfork(void) { pthread_atfork(NULL, NULL, on_fork_child); }

/* ---- pool namespaces ---- */

/* The namespace of this process's pools, from OPT4TORCH_POOL_NAMESPACE:
 * "" when unset or empty, else the tag, which must be a lowercase letter
 * then up to 15 lowercase letters, digits or '_'. Names then read
 * /opt4-<uid>-<tag>-<pid>-<random>, and listing (so every sweep) sees only
 * the pools of the same namespace; without one, names start with the
 * creator's pid after the uid, and listing sees only those. Returns 0, or
 * OPT4_EINVAL with the detail set. */
static int pool_namespace(const char **out) {
  const char *ns = getenv("OPT4TORCH_POOL_NAMESPACE");
  *out = "";
  if (ns == NULL || ns[0] == '\0') return 0;
  size_t n = strlen(ns);
  int ok = n <= 16 && ns[0] >= 'a' && ns[0] <= 'z';
  for (size_t i = 1; ok && i < n; i++)
    ok = (ns[i] >= 'a' && ns[i] <= 'z') || (ns[i] >= '0' && ns[i] <= '9') || ns[i] == '_';
  if (!ok)
    return opt4__fail(OPT4_EINVAL, "OPT4TORCH_POOL_NAMESPACE=%.40s%s is not a namespace: it takes "
                      "a lowercase letter then up to 15 lowercase letters, digits or '_' "
                      "(for example job1); unset it for the default", ns, n > 40 ? "..." : "");
  *out = ns;
  return 0;
}

/* ---- PID namespaces ---- */

/* This process's PID namespace: st_dev and st_ino of /proc/self/ns/pid's
 * target; 0 and 0 when /proc cannot tell. */
static void pidns_self(uint64_t *dev, uint64_t *ino) {
  struct stat st;
  *dev = *ino = 0;
  if (stat("/proc/self/ns/pid", &st) == 0) {
    *dev = (uint64_t)st.st_dev;
    *ino = (uint64_t)st.st_ino;
  }
}

/* ---- the owner's lock ---- */

/* An OFD lock on the whole segment, without waiting: 0, or -1 with errno
 * (EAGAIN or EACCES: a conflicting lock is held; EINVAL: no OFD locks). */
static int ofd_lock(int fd, short type) {
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  return fcntl(fd, F_OFD_SETLK, &fl);
}

/* Whether anyone holds a lock on the segment open at fd that a write lock
 * would conflict with: 1 held, 0 free, -1 cannot tell. Places no lock. */
static int ofd_held(int fd) {
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return -1;
  return fl.l_type != F_UNLCK;
}

/* ---- segments ---- */

static int map_fd(int fd, size_t size, int writable, void **out) {
  void *p = mmap(NULL, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return -1;
  *out = p;
  return 0;
}

/* The segment's entry in SHM_DIR, not followed if it is a symlink. */
static int shm_lstat(const char *name, struct stat *st) {
  char path[sizeof SHM_DIR + POOL_NAME_MAX + 8];
  snprintf(path, sizeof path, SHM_DIR "%s", name);
  return lstat(path, st);
}

/* Results of segment_create's lock. */
#define SEG_UNLOCKED 0 /* not asked for, or the kernel has no OFD locks */
#define SEG_LOCKED 1   /* this fd holds the owner's read lock */
#define SEG_SWEPT 2    /* a sweeper held the segment's lock: removed, try another name */

/* As opt4__segment_create; with lock, the owner's read lock is taken right
 * after shm_open, before the (slow) sizing, so that from then on a sweeper
 * finds the segment locked. In the instant before, a sweeper may find it
 * free and take its write lock to remove it (opt4_pool_remove): then our
 * lock fails, and the caller starts over under a new name (*lock_state is
 * SEG_SWEPT). */
static int segment_create(const char *name, uint64_t size, int *lock_fd, int *fd_out,
                          int *lock_state) {
  *lock_state = SEG_UNLOCKED;
  /* O_EXCL: a name that exists (a squatter's file, a symlink, a stale pool)
   * is refused, never opened or followed. glibc's shm_open adds O_NOFOLLOW. */
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    int e = errno;
    struct stat st;
    if (e == EEXIST && shm_lstat(name, &st) == 0)
      return opt4__fail(OPT4_ESHM, "cannot create shared memory %s: the name is taken (%s owned "
                        "by uid %u, mode %03o); it was not opened. If it is not yours, someone "
                        "else created it: remove it as its owner or root, or start again (the "
                        "next run picks another name)", name,
                        S_ISLNK(st.st_mode) ? "a symlink" : "a segment", (unsigned)st.st_uid,
                        (unsigned)(st.st_mode & 0777));
    return opt4__fail(OPT4_ESHM, "cannot create shared memory %s: %s", name, strerror(e));
  }
  /* The umask may have cleared bits of 0600 but can never add any; set it
   * exactly so that attachers, which insist on 0600, accept it. */
  if (fchmod(fd, 0600) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(name);
    return opt4__fail(OPT4_ESHM, "cannot set mode 0600 on %s: %s", name, strerror(e));
  }
  if (lock_fd != NULL) {
    /* The lock lives on an open file description of its own, not on the
     * one that gets mapped: a mapping keeps its file description open, so
     * a forked child's inherited mapping would keep the owner's lock alive
     * after the owner died, whatever the child did with its fds. (Opened
     * once the mode is 0600: a umask may have left the segment unreadable
     * until then.) */
    int lfd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
    if (lfd >= 0 && ofd_lock(lfd, F_RDLCK) == 0) {
      *lock_state = SEG_LOCKED;
      *lock_fd = lfd;
    } else if (lfd < 0 ? errno == ENOENT : (errno == EAGAIN || errno == EACCES)) {
      if (lfd >= 0) close(lfd);
      close(fd);
      shm_unlink(name);
      *lock_state = SEG_SWEPT;
      return opt4__fail(OPT4_ESHM, "shared memory %s was removed by another process's sweep "
                        "while being created", name);
    } else if (lfd >= 0) {
      close(lfd); /* no OFD locks here (EINVAL): liveness by pid */
    }
  }
  /* A signal (Ctrl-C in Python, whose handlers do not restart system calls)
   * interrupts the sizing of a large segment: go on, the caller acts on the
   * signal once the pool exists and is registered for removal. */
  int err;
  do err = posix_fallocate(fd, 0, (off_t)size);
  while (err == EINTR);
  if (err != 0 && *lock_state == SEG_LOCKED) {
    close(*lock_fd);
    *lock_state = SEG_UNLOCKED;
  }
  if (err != 0) {
    close(fd);
    shm_unlink(name);
    if (err == ENOSPC || err == EFBIG || err == ENOMEM) {
      struct statvfs vfs;
      unsigned long long avail = 0, total = 0;
      if (statvfs(SHM_DIR, &vfs) == 0) {
        avail = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
        total = (unsigned long long)vfs.f_blocks * vfs.f_frsize;
      }
      return opt4__fail(OPT4_ENOSPACE,
                        "the pool needs %llu MiB of shared memory but " SHM_DIR " has "
                        "%llu MiB free of %llu MiB: enlarge it (docker run "
                        "--shm-size=%lluG, or mount -o remount,size=%lluG " SHM_DIR
                        ") or give the cache fewer bytes",
                        (unsigned long long)(size >> 20), avail >> 20, total >> 20,
                        /* what is in use now, plus the pool, in GiB rounded up */
                        (unsigned long long)((size + total - avail) >> 30) + 1,
                        (unsigned long long)((size + total - avail) >> 30) + 1);
    }
    return opt4__fail(OPT4_ESHM, "cannot size shared memory %s to %llu bytes: %s", name,
                      (unsigned long long)size, strerror(err));
  }
  *fd_out = fd;
  return 0;
}

int opt4__segment_create(const char *name, uint64_t size, int *fd_out) {
  int lock_state;
  return segment_create(name, size, NULL, fd_out, &lock_state);
}

static void pool_free(opt4_pool *pool) {
  /* The owner's lock goes with the owner's handle. A handle closed without
   * unlinking leaves a pool that others may still use: its liveness goes
   * back to the owner's pid, so the flag is cleared before the lock is
   * dropped (a sweeper tests the lock first, then reads the flag). */
  if (pool->lock_fd >= 0 && pool->lock_pid == getpid()) {
    if (!pool->unlinked && pool->h != NULL)
      atomic_fetch_and(&pool->h->owner_flags, ~POOL_OWNER_LOCKED);
    lock_fd_release(pool->lock_fd);
  }
  pool->lock_fd = -1;
  if (pool->map_refs == NULL || atomic_fetch_sub(pool->map_refs, 1) == 1) {
    if (pool->base != NULL) munmap(pool->base, pool->size);
    if (pool->meta != NULL) munmap(pool->meta, pool->meta_size);
    if (pool->map_refs != NULL) opt4__free(pool->map_refs, sizeof *pool->map_refs);
  }
  opt4__free(pool, sizeof *pool);
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Point the handle's fields into its mappings. */
static void bind_views(opt4_pool *pool) {
  pool_header *h = (pool_header *)(void *)pool->base;
  pool->h = h;
  pool->procs = (proc_rec *)(void *)(pool->base + h->procs_off);
  pool->states = (page_state *)(void *)(pool->base + h->states_off);
  pool->failed = (_Atomic uint64_t *)(void *)(pool->base + h->failed_off);
  pool->payload = pool->base + h->payload_off;
  const meta_header *mh = (const meta_header *)(const void *)pool->meta;
  pool->mh = mh;
  pool->seq = (const uint32_t *)(const void *)(pool->meta + mh->seq_off);
  pool->rt = (const uint32_t *)(const void *)(pool->meta + mh->rt_off);
  pool->gens = (const gen_rec *)(const void *)(pool->meta + mh->gens_off);
  pool->list = (const list_ent *)(const void *)(pool->meta + mh->list_off);
  if (h->occ_count_off != 0 && mh->occ_start_off != 0) {
    pool->occ_count = (_Atomic uint32_t *)(void *)(pool->base + h->occ_count_off);
    pool->occ_start = (const uint64_t *)(const void *)(pool->meta + mh->occ_start_off);
    pool->occ_pos = (const uint32_t *)(const void *)(pool->meta + mh->occ_pos_off);
  }
  pool->gclaim = (_Atomic uint32_t *)(void *)(pool->base + h->gclaim_off);
  pool->bclaim = h->bclaim_off ? (_Atomic uint32_t *)(void *)(pool->base + h->bclaim_off) : NULL;
  pool->slots = (slot_state *)(void *)(pool->base + h->slot_len_off);
  pool->staging = pool->base + h->staging_off;
  pool->bpos = (const uint32_t *)(const void *)(pool->meta + mh->bpos_off);
  pool->timeout_ns = h->wait_timeout_ns;
}

int opt4_pool_create(const opt4_plan *plan, const opt4_pool_opts *opts, opt4_pool **out) {
  opt4__clear_detail();
  if (out == NULL) return opt4__fail(OPT4_EINVAL, "out is NULL");
  *out = NULL;
  if (plan == NULL || opts == NULL) return opt4__fail(OPT4_EINVAL, "plan or options are NULL");
  if (!plan->info.has_ops)
    return opt4__fail(OPT4_ENOPLAN, "a pool needs a plan with decisions (a capacity)");
  const int sized = (plan->info.flags & OPT4_PLAN_SIZED) != 0;
  if (sized && opts->page_size != 0 && opts->page_size != plan->info.page_size)
    return opt4__fail(OPT4_EINVAL, "page_size %llu differs from the sized plan's %llu (give 0)",
                      (unsigned long long)opts->page_size,
                      (unsigned long long)plan->info.page_size);
  const uint64_t want_page = sized ? plan->info.page_size : opts->page_size;
  if (want_page == 0 || want_page > ((uint64_t)1 << 40))
    return opt4__fail(OPT4_EINVAL, "page_size %llu is out of range (1 byte to 1 TiB)",
                      (unsigned long long)want_page);
  pthread_once(&atfork_once, install_atfork);

  uint64_t meta_size, gens, list_len;
  if (opts->flags & ~(uint32_t)OPT4_POOL_OCCURRENCES)
    return opt4__fail(OPT4_EINVAL, "unknown pool flags 0x%x", opts->flags);
  const int occurrences = (opts->flags & OPT4_POOL_OCCURRENCES) != 0;
  int rc = opt4__meta_size(plan, occurrences, &meta_size, &gens, &list_len);
  if (rc != 0) return rc;
  const char *ns;
  if ((rc = pool_namespace(&ns)) != 0) return rc;
  uint32_t max_procs = opts->max_procs ? opts->max_procs : OPT4_DEFAULT_MAX_PROCS;
  if (opts->spare_pages > 1024 && opts->spare_pages > plan->info.slots)
    return opt4__fail(OPT4_EINVAL, "%llu spare pages for a plan of %llu pages: at most as many "
                      "as the plan's (or 1024)", (unsigned long long)opts->spare_pages,
                      (unsigned long long)plan->info.slots);
  uint64_t pages = plan->info.slots + opts->spare_pages;
  /* Item-capacity plans: one page per item, rounded up to a cache line.
   * Sized plans: the plan's page size exactly (items span pages). */
  uint64_t page_size = sized ? want_page : align_up(want_page, 64);
  uint64_t procs_off = POOL_HEADER_SIZE;
  uint64_t states_off = align_up(procs_off + (uint64_t)max_procs * sizeof(proc_rec), 64);
  uint64_t failed_off = align_up(states_off + pages * sizeof(page_state), 64);
  uint64_t occ_count_off = align_up(failed_off + (gens + 63) / 64 * 8, 64);
  /* Prefetching: a claim per generation always (a consumer claims its own
   * ADMIT), a claim per BYPASS and the staging slots only when asked for. */
  const uint64_t bypasses = plan->info.bypasses;
  uint64_t staging_slots = bypasses ? opts->staging_slots : 0, slot_bytes = 0;
  if (staging_slots > ((uint64_t)1 << 20))
    return opt4__fail(OPT4_EINVAL, "%llu staging slots is too many (at most 1048576)",
                      (unsigned long long)staging_slots);
  if (staging_slots) {
    slot_bytes = opts->staging_slot_bytes;
    if (slot_bytes == 0) {
      slot_bytes = want_page;
      const uint32_t *sizes = opt4_plan_item_sizes(plan);
      if (sized && sizes != NULL) {
        slot_bytes = 0;
        for (uint64_t i = 0; i < plan->info.items; i++)
          if (sizes[i] > slot_bytes) slot_bytes = sizes[i];
      }
    }
    if (slot_bytes > ((uint64_t)1 << 32))
      return opt4__fail(OPT4_EINVAL, "staging slots of %llu bytes are too large (at most 4 GiB)",
                        (unsigned long long)slot_bytes);
    slot_bytes = align_up(slot_bytes ? slot_bytes : 1, 4096);
  }
  uint64_t gclaim_off = align_up(occ_count_off + (occurrences ? plan->info.items * 4 : 0), 64);
  uint64_t bclaim_off = align_up(gclaim_off + gens * 4, 64);
  uint64_t slot_len_off = align_up(bclaim_off + (staging_slots ? bypasses * 4 : 0), 64);
  uint64_t payload_off = align_up(slot_len_off + staging_slots * sizeof(slot_state), 4096);
  if (pages > (UINT64_MAX - payload_off - 64) / page_size ||
      (staging_slots && staging_slots > (UINT64_MAX - payload_off - 64 - pages * page_size) / slot_bytes))
    return opt4__fail(OPT4_ETOOBIG, "%llu pages of %llu bytes do not fit in memory",
                      (unsigned long long)pages, (unsigned long long)page_size);
  /* A sized plan's pages may be of any size: the staging slots start on the
   * next cache line after them (the layout check asks it of every region). */
  uint64_t staging_off = align_up(payload_off + pages * page_size, 64);
  uint64_t size = staging_off + staging_slots * slot_bytes;

  opt4_pool *pool = opt4__calloc(1, sizeof *pool);
  if (pool == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a pool handle");
  pool->rec = UINT32_MAX;
  pool->lock_fd = -1;
  /* The owner's lock is ours to hold only if we are the owner; a pool made
   * for another process goes by that process's pid. */
  pid_t owner = opts->owner_pid ? (pid_t)opts->owner_pid : getpid();
  const int lock = owner == getpid();
  char run_id[40], meta_name[POOL_NAME_MAX + 8];
  int fd = -1, mfd = -1, lfd = -1, lock_state = SEG_UNLOCKED;
  for (int attempt = 0;; attempt++) {
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
      rnd = opt4__now_ns() ^ (uint64_t)getpid() << 32 ^ (uint64_t)attempt;
    snprintf(run_id, sizeof run_id, "%d-%016llx", (int)getpid(), (unsigned long long)rnd);
    snprintf(pool->name, sizeof pool->name, "/opt4-%u-%s%s%s", (unsigned)getuid(), ns,
             ns[0] ? "-" : "", run_id);
    rc = segment_create(pool->name, size, lock ? &lfd : NULL, &fd, &lock_state);
    /* Swept in the instant before our lock: another name (each try is a
     * new random name, and a sweep only removes names it found). */
    if (rc != 0 && lock_state == SEG_SWEPT && attempt < 8) continue;
    break;
  }
  if (rc != 0) goto fail;
  snprintf(meta_name, sizeof meta_name, "%s.meta", pool->name);
  if (lock_state == SEG_LOCKED) {
    pool->lock_fd = lfd;
    pool->lock_pid = getpid();
    lock_fd_track(lfd);
  }
  rc = opt4__segment_create(meta_name, meta_size, &mfd);
  if (rc != 0) {
    close(fd);
    shm_unlink(pool->name);
    goto fail;
  }
  void *base = NULL, *meta = NULL;
  if (map_fd(fd, (size_t)size, 1, &base) != 0 || map_fd(mfd, (size_t)meta_size, 1, &meta) != 0) {
    rc = opt4__fail(OPT4_ESHM, "cannot map the pool (%llu + %llu bytes): %s",
                    (unsigned long long)size, (unsigned long long)meta_size, strerror(errno));
    if (base != NULL) munmap(base, (size_t)size);
    close(fd);
    close(mfd);
    shm_unlink(pool->name);
    shm_unlink(meta_name);
    goto fail;
  }
  close(fd);
  close(mfd);
  pool->base = base;
  pool->size = (size_t)size;
  pool->meta = meta;
  pool->meta_size = (size_t)meta_size;
  pool->owner = 1;

  rc = opt4__meta_build(plan, occurrences, pool->meta, meta_size, gens, list_len, pages);
  if (rc != 0) {
    shm_unlink(pool->name);
    shm_unlink(meta_name);
    goto fail;
  }
  /* The meta segment is read-only from now on, for us too. */
  mprotect(pool->meta, pool->meta_size, PROT_READ);

  /* posix_fallocate zeroed everything: every page is PS_EMPTY with gen 0;
   * mark them with NO_GEN so that gen 0 is unambiguous. */
  pool_header *h = (pool_header *)base;
  h->layout = POOL_LAYOUT;
  h->header_size = POOL_HEADER_SIZE;
  h->segment_size = size;
  h->meta_size = meta_size;
  h->owner_uid = (uint32_t)getuid();
  h->owner_pid = (uint32_t)owner;
  h->owner_start = opt4__proc_start_time(owner);
  /* The creator's namespace stands for the owner's: a worker creating the
   * pool for its main process lives beside it, and /proc/<owner> may be
   * another namespace's process when /proc is not this namespace's. */
  pidns_self(&h->owner_pidns_dev, &h->owner_pidns_ino);
  if (pool->lock_fd >= 0) atomic_store(&h->owner_flags, POOL_OWNER_LOCKED);
  memcpy(h->run_id, run_id, sizeof run_id);
  h->fingerprint = plan->info.fingerprint;
  h->accesses = plan->info.accesses;
  h->items = plan->info.items;
  h->generations = gens;
  h->page_size = page_size;
  h->pages = pages;
  h->wait_timeout_ns = (opts->wait_timeout_ms ? opts->wait_timeout_ms : OPT4_DEFAULT_WAIT_TIMEOUT_MS) * 1000000u;
  h->max_procs = max_procs;
  h->procs_off = procs_off;
  h->states_off = states_off;
  h->failed_off = failed_off;
  h->occ_count_off = occurrences ? occ_count_off : 0;
  h->payload_off = payload_off;
  h->bypasses = bypasses;
  h->gclaim_off = gclaim_off;
  h->bclaim_off = staging_slots ? bclaim_off : 0;
  h->slot_len_off = slot_len_off;
  h->staging_off = staging_off;
  h->staging_slots = staging_slots;
  h->staging_slot_bytes = slot_bytes;
  page_state *states = (page_state *)(void *)((uint8_t *)base + states_off);
  for (uint64_t p = 0; p < pages; p++) {
    atomic_store_explicit(&states[p].word, PS_WORD(NO_GEN, PS_EMPTY), memory_order_relaxed);
    atomic_store_explicit(&states[p].reads, PS_WORD(NO_GEN, 0), memory_order_relaxed);
  }
  slot_state *slots = (slot_state *)(void *)((uint8_t *)base + slot_len_off);
  for (uint64_t i = 0; i < staging_slots; i++) atomic_store_explicit(&slots[i].turn, i, memory_order_relaxed);
  /* The magic last, with a release fence: an attacher that sees it sees a
   * complete header. */
  atomic_thread_fence(memory_order_release);
  memcpy(h->magic, POOL_MAGIC, 8);
  bind_views(pool);
  rc = opt4__pool_register(pool);
  if (rc != 0) {
    opt4_pool_unlink(pool);
    goto fail;
  }
  *out = pool;
  return 0;
fail:
  pool_free(pool);
  return rc;
}

static int open_map(const char *name, int writable, void **map, size_t *size) {
  int fd = shm_open(name, writable ? O_RDWR | O_CLOEXEC : O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0)
    return opt4__fail(OPT4_ESHM, "cannot open pool %s: %s%s", name, strerror(errno),
                      errno == ENOENT ? " (its owner has ended, or the name is wrong)" : "");
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(meta_header)) {
    close(fd);
    return opt4__fail(OPT4_EPOOL, "pool segment %s is too small to be a pool", name);
  }
  /* Pools are this user's and nobody else's: a segment owned by another
   * uid, or that others may read or write, was not made by this library
   * (or has been tampered with), so it is refused before it is mapped. */
  if (!S_ISREG(st.st_mode) || st.st_uid != getuid()) {
    close(fd);
    return opt4__fail(OPT4_EPOOL, "pool segment %s belongs to uid %u, not to this user (%u): "
                      "refused (a pool name taken by another user?)",
                      name, (unsigned)st.st_uid, (unsigned)getuid());
  }
  if ((st.st_mode & 077) != 0) {
    close(fd);
    return opt4__fail(OPT4_EPOOL, "pool segment %s has mode %03o; pools are created 0600, so "
                      "this one was made or changed by something else: refused",
                      name, (unsigned)(st.st_mode & 0777));
  }
  *size = (size_t)st.st_size;
  int rc = map_fd(fd, *size, writable, map);
  int e = errno;
  close(fd);
  if (rc != 0) return opt4__fail(OPT4_ESHM, "cannot map pool %s: %s", name, strerror(e));
  return 0;
}

/* A handle on the existing pool called name, its segments mapped (the
 * data segment writable or not), checked and bound; no process record yet.
 * The caller has checked name and out for NULL. */
static int map_pool(const char *name, int writable, opt4_pool **out) {
  *out = NULL;
  if (strlen(name) >= POOL_NAME_MAX || strncmp(name, "/opt4-", 6) != 0 || strchr(name + 1, '/'))
    return opt4__fail(OPT4_EINVAL, "\"%s\" is not an opt4 pool name", name);
  opt4_pool *pool = opt4__calloc(1, sizeof *pool);
  if (pool == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a pool handle");
  pool->rec = UINT32_MAX;
  pool->lock_fd = -1;
  snprintf(pool->name, sizeof pool->name, "%s", name);
  char meta_name[POOL_NAME_MAX + 8];
  snprintf(meta_name, sizeof meta_name, "%s.meta", name);
  void *base = NULL, *meta = NULL;
  size_t size = 0, msize = 0;
  int rc = open_map(name, writable, &base, &size);
  if (rc != 0) goto fail;
  pool->base = base;
  pool->size = size;
  rc = open_map(meta_name, 0, &meta, &msize);
  if (rc != 0) goto fail;
  pool->meta = meta;
  pool->meta_size = msize;
  rc = opt4__pool_check_header(base, size, meta, msize, (uint32_t)getuid(), name);
  if (rc != 0) goto fail;
  bind_views(pool);
  *out = pool;
  return 0;
fail:
  pool_free(pool);
  return rc;
}

int opt4_pool_attach(const char *name, opt4_pool **out) {
  opt4__clear_detail();
  if (out == NULL || name == NULL) return opt4__fail(OPT4_EINVAL, "name or out is NULL");
  pthread_once(&atfork_once, install_atfork);
  opt4_pool *pool = NULL;
  int rc = map_pool(name, 1, &pool);
  if (rc != 0) return rc;
  rc = opt4__pool_register(pool);
  if (rc != 0) {
    pool_free(pool);
    return rc;
  }
  *out = pool;
  return 0;
}

int opt4__pool_attach_shared(opt4_pool *src, opt4_pool **out) {
  opt4__clear_detail();
  *out = NULL;
  if (src->map_refs == NULL) {
    src->map_refs = opt4__calloc(1, sizeof *src->map_refs);
    if (src->map_refs == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a pool handle");
    atomic_store(src->map_refs, 1);
  }
  opt4_pool *pool = opt4__calloc(1, sizeof *pool);
  if (pool == NULL) return opt4__fail(OPT4_ENOMEM, "no memory for a pool handle");
  pool->rec = UINT32_MAX;
  pool->lock_fd = -1;
  memcpy(pool->name, src->name, sizeof pool->name);
  pool->base = src->base;
  pool->size = src->size;
  pool->meta = src->meta;
  pool->meta_size = src->meta_size;
  pool->map_refs = src->map_refs;
  atomic_fetch_add(pool->map_refs, 1);
  bind_views(pool);
  int rc = opt4__pool_register(pool);
  if (rc != 0) {
    pool_free(pool);
    return rc;
  }
  *out = pool;
  return 0;
}

int opt4_pool_peek(const char *name, opt4_pool_view *out) {
  opt4__clear_detail();
  if (out == NULL || name == NULL) return opt4__fail(OPT4_EINVAL, "name or out is NULL");
  /* Read-only, and never registered: the view only reads. */
  opt4_pool *pool = NULL;
  int rc = map_pool(name, 0, &pool);
  if (rc != 0) return rc;
  rc = opt4_pool_view_get(pool, out);
  pool_free(pool);
  return rc;
}

void opt4__pool_set_safe_point(opt4_pool *pool, uint64_t (*fn)(void *ctx), void *ctx,
                               const _Atomic uint32_t *park) {
  pool->safe_point = fn;
  pool->safe_ctx = ctx;
  pool->park = park;
}

void opt4_pool_close(opt4_pool *pool) {
  if (pool == NULL) return;
  /* Release our record only if it is ours: a forked child holding its
   * parent's handle has not registered, and must not free the parent's. */
  if (pool->rec != UINT32_MAX && pool->fork_gen == opt4__fork_generation() &&
      atomic_load(&pool->procs[pool->rec].pid) == (uint32_t)getpid())
    opt4__pool_reclaim(pool, pool->rec);
  pool_free(pool);
}

static int unlink_pair(const char *name) {
  char meta_name[POOL_NAME_MAX + 8];
  snprintf(meta_name, sizeof meta_name, "%s.meta", name);
  int a = shm_unlink(name), ea = errno;
  int b = shm_unlink(meta_name), eb = errno;
  if ((a != 0 && ea != ENOENT) || (b != 0 && eb != ENOENT))
    return opt4__fail(OPT4_ESHM, "cannot remove pool %s: %s", name, strerror(a != 0 ? ea : eb));
  return 0;
}

int opt4_pool_unlink(opt4_pool *pool) {
  opt4__clear_detail();
  if (pool == NULL) return opt4__fail(OPT4_EINVAL, "pool is NULL");
  if (pool->unlinked) return 0;
  pool->unlinked = 1;
  return unlink_pair(pool->name);
}

const char *opt4_pool_name(const opt4_pool *pool) { return pool ? pool->name : ""; }
int opt4_pool_is_owner(const opt4_pool *pool) { return pool ? pool->owner : 0; }

int opt4_pool_info_get(const opt4_pool *pool, opt4_pool_info *out) {
  if (pool == NULL || out == NULL) return opt4__fail(OPT4_EINVAL, "pool or out is NULL");
  const pool_header *h = pool->h;
  memset(out, 0, sizeof *out);
  out->accesses = h->accesses;
  out->items = h->items;
  out->fingerprint = h->fingerprint;
  out->page_size = h->page_size;
  out->pages = h->pages;
  out->generations = h->generations;
  out->shm_bytes = h->segment_size + h->meta_size;
  out->wait_timeout_ms = h->wait_timeout_ns / 1000000u;
  out->max_procs = h->max_procs;
  out->attached = atomic_load(&((pool_header *)h)->attached);
  out->owner_pid = h->owner_pid;
  return 0;
}

/* ---- listing and removing this user's pools ---- */

/* A pool's header is written last, after its segments are sized and its
 * metadata built, which takes a while for a large plan. Until then the
 * creator is known by its lock (taken right after shm_open) and by its
 * name (/opt4-<uid>-<pid>-<hex>): a pool being created by a live process
 * must not look stale to another process's sweep (two ranks of one node
 * start together). Returns the creator's pid, or 0. */
static pid_t creator_pid(const char *name) {
  const char *p = strchr(name + 6, '-'); /* past "/opt4-" and the uid */
  if (p == NULL) return 0;
  if (p[1] >= 'a' && p[1] <= 'z' && (p = strchr(p + 1, '-')) == NULL) return 0; /* a namespace */
  char *end;
  long pid = strtol(p + 1, &end, 10);
  return (*end == '-' && pid > 0 && pid <= INT32_MAX) ? (pid_t)pid : 0;
}

/* Whether a pool without a readable header may still be in creation by the
 * pid in its name. (A creator that died and whose pid was reused keeps its
 * half-made pool until that pid ends too: the safe side.) */
static int maybe_in_creation(const char *name) {
  pid_t pid = creator_pid(name);
  return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

/* What a sweeper knows of a pool's owner. */
typedef struct owner_view {
  uint32_t pid;   /* in the owner's PID namespace; the creator's for a pool without header */
  uint64_t bytes; /* both segments */
  int state;      /* OPT4_OWNER_* flags; 0: the owner is dead, the pool stale */
  int header;     /* whether the header could be read */
} owner_view;

/* Judge the owner of the pool whose main segment is open at fd, given what
 * the caller found of the owner's lock: held 1, free 0, -1 cannot tell. */
static void judge_owner(const char *name, int fd, int held, owner_view *v) {
  struct stat st;
  pool_header h;
  memset(v, 0, sizeof *v);
  const int ours = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == getuid();
  v->header = ours && st.st_size >= (off_t)sizeof h &&
              pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h &&
              memcmp(h.magic, POOL_MAGIC, 8) == 0;
  if (!v->header) {
    /* Being created, or its creator died creating it. A creator locks the
     * segment right after creating it: a held lock is a live creator, in
     * any namespace; a free one is a dead creator, or one in the instant
     * before its lock, which fails to take it if we remove the segment and
     * starts over under another name. The pid in the name is a second
     * check, good within one PID namespace. */
    v->pid = (uint32_t)creator_pid(name);
    v->bytes = ours ? (uint64_t)st.st_size : 0;
    if (held == 1)
      v->state = OPT4_OWNER_LIVE | OPT4_OWNER_LOCKED;
    else if (maybe_in_creation(name))
      v->state = OPT4_OWNER_LIVE;
    return;
  }
  v->pid = h.owner_pid;
  v->bytes = (uint64_t)st.st_size + h.meta_size;
  uint64_t dev, ino;
  pidns_self(&dev, &ino);
  const int other_ns = h.owner_pidns_ino != 0 &&
                       (ino == 0 || h.owner_pidns_ino != ino || h.owner_pidns_dev != dev);
  const int ns_flag = other_ns ? OPT4_OWNER_OTHER_NS : 0;
  if (held == 1) {
    v->state = OPT4_OWNER_LIVE | OPT4_OWNER_LOCKED | ns_flag;
    return;
  }
  if (held == 0 && (h.owner_flags & POOL_OWNER_LOCKED)) return; /* its lock died with it */
  /* No lock to go by: a pid and a start time, which mean something only in
   * the owner's own PID namespace. Elsewhere nothing proves it dead. */
  if (other_ns)
    v->state = OPT4_OWNER_LIVE | OPT4_OWNER_OTHER_NS | OPT4_OWNER_UNCHECKED;
  else if (opt4__proc_alive((pid_t)h.owner_pid, h.owner_start))
    v->state = OPT4_OWNER_LIVE;
}

static int is_meta_name(const char *name) {
  size_t len = strlen(name);
  return len > 5 && strcmp(name + len - 5, ".meta") == 0;
}

/* Whether the meta segment called name has no main segment beside it. A
 * pool's main segment is created before its meta and removed before it, so
 * a meta alone is never a pool in creation: it is left from a removal. */
static int orphan_meta(const char *name) {
  char main_name[POOL_NAME_MAX];
  size_t len = strlen(name);
  if (len - 5 >= sizeof main_name) return 0;
  memcpy(main_name, name, len - 5);
  main_name[len - 5] = '\0';
  struct stat st;
  return shm_lstat(main_name, &st) != 0 && errno == ENOENT;
}

int opt4_pool_list(opt4_pool_visit_fn visit, void *ctx) {
  opt4__clear_detail();
  if (visit == NULL) return opt4__fail(OPT4_EINVAL, "visit is NULL");
  const char *ns;
  int rc = pool_namespace(&ns);
  if (rc != 0) return rc;
  DIR *d = opendir(SHM_DIR);
  if (d == NULL) return opt4__fail(OPT4_ESHM, "cannot list " SHM_DIR ": %s", strerror(errno));
  char prefix[48];
  snprintf(prefix, sizeof prefix, "opt4-%u-%s%s", (unsigned)getuid(), ns, ns[0] ? "-" : "");
  size_t plen = strlen(prefix);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, prefix, plen) != 0 || len + 2 > POOL_NAME_MAX) continue;
    /* Without a namespace, the creator's pid follows: a pool of a named
     * namespace (a letter there) belongs to another job's listing. */
    if (e->d_name[plen] < '0' || e->d_name[plen] > '9') continue;
    char name[POOL_NAME_MAX];
    name[0] = '/';
    memcpy(name + 1, e->d_name, len + 1); /* len + 2 <= POOL_NAME_MAX, checked above */
    /* Another user's file under this user's prefix is a squatter's, not a
     * pool of ours: not listed, so never taken for stale and removed. */
    struct stat st;
    if (shm_lstat(name, &st) != 0 || st.st_uid != getuid()) continue;
    if (is_meta_name(name)) {
      /* Listed with its pool, unless it has none: an orphan (a removal
       * killed between its two unlinks, a segment removed by hand) that no
       * pool will ever use, listed as stale under its own name. */
      if (!orphan_meta(name)) continue;
      if ((rc = visit(ctx, name, (uint32_t)creator_pid(name), 0, (uint64_t)st.st_size)) != 0) break;
      continue;
    }
    owner_view v;
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
    if (fd >= 0) {
      /* Tested, not taken: listing never disturbs a creator's lock. */
      judge_owner(name, fd, ofd_held(fd), &v);
      close(fd);
    } else {
      /* Gone since readdir, or not a segment we can open (a symlink). */
      memset(&v, 0, sizeof v);
      v.pid = (uint32_t)creator_pid(name);
      if (maybe_in_creation(name)) v.state = OPT4_OWNER_LIVE;
    }
    if ((rc = visit(ctx, name, v.pid, v.state, v.bytes)) != 0) break;
  }
  closedir(d);
  return rc;
}

int opt4_pool_remove(const char *name, int force) {
  opt4__clear_detail();
  if (name == NULL || strncmp(name, "/opt4-", 6) != 0 || strchr(name + 1, '/') ||
      strlen(name) >= POOL_NAME_MAX)
    return opt4__fail(OPT4_EINVAL, "\"%s\" is not an opt4 pool name", name ? name : "(null)");
  /* Never remove what is not this user's, even with force (root could). A
   * symlink of ours is removed as a name, never followed. */
  struct stat st;
  if (shm_lstat(name, &st) == 0 && st.st_uid != getuid())
    return opt4__fail(OPT4_EPOOL, "%s belongs to uid %u, not to this user (%u): not removed", name,
                      (unsigned)st.st_uid, (unsigned)getuid());
  if (is_meta_name(name)) { /* an orphan meta segment, as opt4_pool_list names it */
    if (!orphan_meta(name))
      return opt4__fail(OPT4_EPOOL, "%s is the metadata of a pool that exists: remove that pool (its name "
                        "without .meta) instead", name);
    if (shm_unlink(name) != 0 && errno != ENOENT)
      return opt4__fail(OPT4_ESHM, "cannot remove %s: %s", name, strerror(errno));
    return 0;
  }
  if (force) return unlink_pair(name);
  /* Judge and remove under a write lock on the segment. It excludes the
   * owner's read lock, so an owner found dead cannot come to life before
   * the unlink: a creator in the instant between shm_open and its lock
   * fails to take it, and starts over under another name. */
  owner_view v;
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd >= 0) {
    int held = 0;
    if (ofd_lock(fd, F_WRLCK) != 0) held = (errno == EAGAIN || errno == EACCES) ? 1 : -1;
    judge_owner(name, fd, held, &v);
  } else {
    memset(&v, 0, sizeof v);
    v.pid = (uint32_t)creator_pid(name);
    if (maybe_in_creation(name)) v.state = OPT4_OWNER_LIVE;
  }
  int rc;
  if (v.state == 0)
    rc = unlink_pair(name);
  else if (!v.header)
    rc = opt4__fail(OPT4_EPOOL, "pool %s is being created by a live process (pid %u); it is not "
                    "stale", name, v.pid);
  else if (v.state & OPT4_OWNER_UNCHECKED)
    rc = opt4__fail(OPT4_EPOOL, "pool %s belongs to pid %u of another PID namespace (a container "
                    "or a job in its own namespace that shares /dev/shm), whose liveness cannot "
                    "be checked from here: kept. Once that job has ended, remove it with force "
                    "(opt4torch cleanup --force %s)", name, v.pid, name);
  else if (v.state & OPT4_OWNER_OTHER_NS)
    rc = opt4__fail(OPT4_EPOOL, "pool %s belongs to a live process (pid %u in another PID "
                    "namespace, which holds the pool's lock); it is not stale", name, v.pid);
  else
    rc = opt4__fail(OPT4_EPOOL, "pool %s belongs to a live process (pid %u); it is not stale",
                    name, v.pid);
  if (fd >= 0) close(fd); /* and with it our lock */
  return rc;
}
