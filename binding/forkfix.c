/* forkfix.c - a child forked by CPython 3.8 to 3.11.7 can hang for good in
 * os.fork itself (CPython gh-112275, fixed in 3.11.8 and 3.12).
 *
 * What happens. The runtime's interpreter list is guarded by one lock
 * (HEAD_LOCK, _PyRuntime.interpreters.mutex). A thread Python does not yet
 * know (a C or C++ thread calling PyGILState_Ensure: torch's threads, which
 * take the GIL to free a tensor's Python object, or any extension's) takes
 * it while making its thread state, without the GIL, so the thread that
 * forks cannot keep it out. A child forked at that moment inherits the lock
 * held by a thread it does not have; PyOS_AfterFork_Child then takes it in
 * _PyEval_ReInitThreads, before _PyRuntimeState_ReInitThreads renews it,
 * and waits forever. A DataLoader worker that hangs there never starts, and
 * its loader waits for it: seen as a torchrun test that hung one run in
 * ten (the ranks' DataLoader forking beside gloo's threads), and reproduced
 * with C threads entering Python while the main thread forks (2 of 300
 * children hung, tests/python/test_fork_safety.py).
 *
 * The fix, where Python has not got it: a pthread_atfork child handler,
 * which runs in the child inside fork(), before Python's own after-fork
 * code, renews the lock as 3.11.8 does first thing. Only the forking thread
 * exists in the child, so no one can hold the new lock. Nothing else of the
 * runtime is touched, and nothing at all from 3.11.8 on. */
#define Py_BUILD_CORE_MODULE 1
#include <Python.h>

#include "binding.h"

#if PY_VERSION_HEX >= 0x03080000 && PY_VERSION_HEX < 0x030B08F0 && !defined(PYPY_VERSION)
#include <pthread.h>

#include "internal/pycore_runtime.h"

static void renew_head_lock(void) { (void)_PyThread_at_fork_reinit(&_PyRuntime.interpreters.mutex); }

int opt4py_forkfix_init(PyObject *module) {
  static int installed;
  if (installed) return 0;
  if (pthread_atfork(NULL, NULL, renew_head_lock) != 0) {
    PyErr_SetString(PyExc_RuntimeError, "pthread_atfork failed (out of memory?)");
    return -1;
  }
  installed = 1;
  return PyModule_AddIntConstant(module, "FORK_HEAD_LOCK_FIX", 1);
}
#else
int opt4py_forkfix_init(PyObject *module) { return PyModule_AddIntConstant(module, "FORK_HEAD_LOCK_FIX", 0); }
#endif
