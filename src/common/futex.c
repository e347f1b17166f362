/*
 * futex.c - sleeping on a 32-bit word until it changes.
 *
 * Waits in the engine sleep on the word that will change and are woken by
 * whoever changes it, so a thread with nothing to do costs no CPU. Private
 * futexes serve threads of one process; shared ones serve words in shared
 * memory, across processes.
 */
#include "internal.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int opt4__futex_wait(_Atomic uint32_t *word, uint32_t expect, uint64_t timeout_ns, int shared) {
  struct timespec ts, *tsp = NULL;
  if (timeout_ns != 0) {
    ts.tv_sec = (time_t)(timeout_ns / 1000000000u);
    ts.tv_nsec = (long)(timeout_ns % 1000000000u);
    tsp = &ts;
  }
  /* FUTEX_WAIT's timeout is relative. It returns at once (EAGAIN) if the
   * word no longer holds expect, so a change made before the call is never
   * slept through. */
  long r = syscall(SYS_futex, (uint32_t *)word, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, expect, tsp,
                   NULL, 0);
  if (r == 0) return 0;
  return errno == ETIMEDOUT ? 1 : 0;
}

void opt4__futex_wake(_Atomic uint32_t *word, int shared) {
  syscall(SYS_futex, (uint32_t *)word, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}
