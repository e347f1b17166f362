/*
 * futex.c - sleeping on a 32-bit word until it changes.
 *
 * Waits in the engine sleep on the word that will change and are woken by
 * whoever changes it, so a thread with nothing to do costs no CPU. Private
 * futexes serve threads of one process; shared ones serve words in shared
 * memory, across processes.
 *
 * The bitset forms let one word serve sleepers that wait for different
 * things: a sleeper names the bits it cares for, and a waker wakes only the
 * sleepers whose bits meet its own (the pool's head word: a prefetch thread
 * sleeps until the consumers reach the block its held item waits for, and
 * the consumer that moves head wakes the blocks it passed, not every
 * sleeper).
 */
#include "internal.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int opt4__futex_wait_bits(_Atomic uint32_t *word, uint32_t expect, uint64_t timeout_ns, int shared,
                          uint32_t bits) {
  /* FUTEX_WAIT_BITSET's timeout is absolute, on CLOCK_MONOTONIC. */
  struct timespec ts, *tsp = NULL;
  if (timeout_ns != 0) {
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + timeout_ns % 1000000000u;
    ts.tv_sec += (time_t)(timeout_ns / 1000000000u + ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    tsp = &ts;
  }
  /* It returns at once (EAGAIN) if the word no longer holds expect, so a
   * change made before the call is never slept through. */
  long r = syscall(SYS_futex, (uint32_t *)word, shared ? FUTEX_WAIT_BITSET : FUTEX_WAIT_BITSET_PRIVATE, expect,
                   tsp, NULL, bits);
  if (r == 0) return 0;
  return errno == ETIMEDOUT ? 1 : 0;
}

void opt4__futex_wake_bits(_Atomic uint32_t *word, int shared, uint32_t bits) {
  syscall(SYS_futex, (uint32_t *)word, shared ? FUTEX_WAKE_BITSET : FUTEX_WAKE_BITSET_PRIVATE, 0x7fffffff, NULL,
          NULL, bits);
}

/* FUTEX_WAIT and FUTEX_WAKE are the bitset forms with every bit. */
int opt4__futex_wait(_Atomic uint32_t *word, uint32_t expect, uint64_t timeout_ns, int shared) {
  return opt4__futex_wait_bits(word, expect, timeout_ns, shared, FUTEX_BITSET_MATCH_ANY);
}

void opt4__futex_wake(_Atomic uint32_t *word, int shared) {
  opt4__futex_wake_bits(word, shared, FUTEX_BITSET_MATCH_ANY);
}
