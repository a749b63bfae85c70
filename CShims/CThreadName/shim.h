#ifndef STASH_CTHREADNAME_SHIM_H
#define STASH_CTHREADNAME_SHIM_H
// Names the calling thread for the OS (`top -H`, `ps -T`, debuggers). Swift's Glibc module
// exports neither `prctl` (variadic) nor `pthread_setname_np` (it needs _GNU_SOURCE), and
// Foundation's `Thread.name` does not reliably reach the OS thread on Linux.
#if defined(__linux__)
#include <sys/prctl.h>
#elif defined(__APPLE__)
#include <pthread.h>
#endif

/// Names the calling thread `name` (Linux keeps its first 15 bytes). Returns 0, or -1.
static inline int stash_name_this_thread(const char *name) {
#if defined(__linux__)
    return prctl(PR_SET_NAME, name, 0, 0, 0);
#elif defined(__APPLE__)
    return pthread_setname_np(name);
#else
    (void)name;
    return -1;
#endif
}
#endif
