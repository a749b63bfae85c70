#ifndef STASH_CFILEIDENTITY_SHIM_H
#define STASH_CFILEIDENTITY_SHIM_H
// A file's inode number and birth (creation) time, which together tell a file from a copy of
// it: a copy is a new file, born when it was copied. Swift's Glibc module does not export
// `statx` (it needs _GNU_SOURCE), so on Linux this calls it through the kernel's own header.
#include <stdint.h>
#include <sys/stat.h>

#if defined(__linux__)
#include <linux/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/// Fills `inode` and the birth time (`seconds`, `nanoseconds`; both 0 when the file system
/// does not record it) of open file `fd`. Returns 0, or -1 with errno set.
static inline int stash_file_identity(int fd, uint64_t *inode, int64_t *seconds, uint32_t *nanoseconds) {
#if defined(__linux__) && defined(__NR_statx) && defined(STATX_BTIME)
    struct statx x;
    if (syscall(__NR_statx, fd, "", 0x1000 /* AT_EMPTY_PATH */, STATX_INO | STATX_BTIME, &x) == 0) {
        *inode = x.stx_ino;
        int born = (x.stx_mask & STATX_BTIME) != 0;
        *seconds = born ? x.stx_btime.tv_sec : 0;
        *nanoseconds = born ? x.stx_btime.tv_nsec : 0;
        return 0;
    }
#endif
    struct stat s;
    if (fstat(fd, &s) != 0) return -1;
    *inode = (uint64_t)s.st_ino;
#if defined(__APPLE__)
    *seconds = s.st_birthtimespec.tv_sec;
    *nanoseconds = (uint32_t)s.st_birthtimespec.tv_nsec;
#else
    *seconds = 0;
    *nanoseconds = 0;
#endif
    return 0;
}
#endif
