import CFileIdentity
import CLMDB
import CStashShims
import Foundation
import Synchronization

// What keeps a damaged data file or a full file system from crashing the process: LMDB maps
// `data.mdb` and `lock.mdb`, and a page of a mapping past the end of its file, or one the file
// system has no block for when it is written, is a SIGBUS, not an error code.

/// The checks made on `data.mdb` before LMDB maps it.
enum DataFileCheck {
    /// `MDB_MAGIC`, `MDB_DATA_VERSION` and `P_META` of LMDB 0.9.
    private static let magic: UInt32 = 0xBEEF_C0DE
    private static let dataVersion: UInt32 = 1
    private static let metaFlag: UInt16 = 0x08

    /// One meta page as LMDB 0.9 writes it on a 64-bit machine (offsets from the page start).
    struct Meta {
        let pageSize: Int
        let lastPage: UInt64
        let transactionID: UInt64
        let freeRoot: UInt64
        let mainRoot: UInt64
    }

    /// Reads the meta page at `offset` of open file `fd`; nil when it is no meta page of this
    /// LMDB (LMDB then refuses the file itself, with `MDB_INVALID`, without reading further).
    static func meta(_ fd: Int32, at offset: Int) -> Meta? {
        var page = [UInt8](repeating: 0, count: 152)
        let read = page.withUnsafeMutableBytes { pread(fd, $0.baseAddress, 152, off_t(offset)) }
        guard read == 152 else { return nil }
        func u16(_ at: Int) -> UInt16 { UInt16(page[at]) | UInt16(page[at + 1]) << 8 }
        func u32(_ at: Int) -> UInt32 { (0..<4).reduce(UInt32(0)) { $0 | UInt32(page[at + $1]) << (8 * $1) } }
        func u64(_ at: Int) -> UInt64 { (0..<8).reduce(UInt64(0)) { $0 | UInt64(page[at + $1]) << (8 * $1) } }
        guard u16(10) & metaFlag != 0, u32(16) == magic, u32(20) == dataVersion else { return nil }
        return Meta(pageSize: Int(u32(40)), lastPage: u64(136), transactionID: u64(144), freeRoot: u64(80), mainRoot: u64(128))
    }

    /// Checks that `data.mdb` in `directory` holds every page its newest meta page names, and
    /// that the meta pages are sane (a page size LMDB can have, roots inside the file), before
    /// LMDB maps it: a page past the end of the file is a SIGBUS when read, so a file cut short
    /// (a copy that stopped, a disk that filled) must be refused here. A missing or empty file
    /// (a store being made) and a file that is no LMDB data are left to LMDB.
    /// - Throws: ``LMDBError/Code/damaged`` naming the file, its size and what it lacks.
    static func check(_ directory: String) throws(LMDBError) {
        let file = (directory as NSString).appendingPathComponent("data.mdb")
        let fd = open(file, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0 else { return }
        let size = Int(status.st_size)
        guard size > 0, let first = meta(fd, at: 0) else { return }
        func damaged(_ what: String) -> LMDBError {
            LMDBError(code: .damaged, operation: "open", path: directory,
                      detail: "data.mdb (\(size) bytes) \(what); LMDB cannot read it as it is: restore the store from a backup or a peer")
        }
        let pageSize = first.pageSize
        guard pageSize >= 512, pageSize <= 65536, pageSize & (pageSize - 1) == 0 else {
            throw damaged("has a first meta page giving a page size of \(pageSize) bytes")
        }
        guard size >= 2 * pageSize else {
            throw damaged("is shorter than its two meta pages (\(2 * pageSize) bytes): the file was cut short")
        }
        guard let second = meta(fd, at: pageSize) else {
            throw damaged("has no meta page where its second one belongs (at byte \(pageSize))")
        }
        let newest = second.transactionID > first.transactionID ? second : first
        let pages = UInt64(size / pageSize)
        guard newest.lastPage < pages else {
            let needed = newest.lastPage.multipliedReportingOverflow(by: UInt64(pageSize)).partialValue &+ UInt64(pageSize)
            throw damaged("was cut short: its meta page names \(newest.lastPage &+ 1) pages of \(pageSize) bytes (\(needed) bytes)")
        }
        let invalid = UInt64.max   // P_INVALID: an empty database
        for (name, root) in [("free-page", newest.freeRoot), ("main", newest.mainRoot)] where root != invalid && (root < 2 || root > newest.lastPage) {
            throw damaged("has a meta page putting the root of LMDB's \(name) database at page \(root), outside pages 2...\(newest.lastPage)")
        }
    }
}

/// The extent of an environment's map of `data.mdb` in this process, so that a value LMDB
/// hands out can be checked to lie in the file before it is copied: a damaged node size would
/// otherwise run the copy past the end of the file (SIGBUS) or of the map (SIGSEGV).
///
/// Found in `/proc/self/maps` (Linux) after the environment opens and after every resize (both
/// while no transaction of the process is open); where it cannot be found, nothing is checked.
final class MapBounds: @unchecked Sendable {
    /// The map's first address; 0 when unknown (no check).
    private let start = Atomic<UInt>(0)
    /// Its end (start + map size).
    private let end = Atomic<UInt>(0)
    /// Start + the size of `data.mdb` when last looked at: bytes below it can be read.
    private let fileEnd = Atomic<UInt>(0)
    /// LMDB's handle of the data file (valid for the environment's life), -1 before ``locate(_:)``.
    private let fd = Atomic<Int32>(-1)

    /// Finds the map of the data file of `env` (after `mdb_env_open`, and after a resize).
    func locate(_ env: OpaquePointer) {
        var handle: mdb_filehandle_t = -1
        guard mdb_env_get_fd(env, &handle) == 0, handle >= 0 else { return }
        var status = stat()
        guard fstat(handle, &status) == 0 else { return }
        fd.store(handle, ordering: .relaxed)
        #if os(Linux)
        guard let text = try? String(contentsOfFile: "/proc/self/maps", encoding: .utf8) else { return }
        let inode = UInt64(status.st_ino)
        // The device as the kernel prints it: major and minor in hex (glibc's encoding of dev_t).
        let device = UInt64(status.st_dev)
        let major = ((device >> 8) & 0xFFF) | ((device >> 32) & ~UInt64(0xFFF))
        let minor = (device & 0xFF) | ((device >> 12) & ~UInt64(0xFF))
        var found: [(UInt, UInt)] = []
        for line in text.split(separator: "\n") {
            // "start-end perms offset major:minor inode path"
            let fields = line.split(separator: " ", maxSplits: 5, omittingEmptySubsequences: true)
            guard fields.count >= 6, UInt64(fields[4]) == inode, UInt64(fields[2], radix: 16) == 0 else { continue }
            let numbers = fields[3].split(separator: ":")
            guard numbers.count == 2, UInt64(numbers[0], radix: 16) == major, UInt64(numbers[1], radix: 16) == minor else { continue }
            let range = fields[0].split(separator: "-")
            guard range.count == 2, let a = UInt(range[0], radix: 16), let b = UInt(range[1], radix: 16), a < b else { continue }
            found.append((a, b))
        }
        // One map of the file at offset 0, as LMDB makes it; anything else is not checked.
        guard found.count == 1, let (low, high) = found.first else {
            start.store(0, ordering: .relaxed)
            return
        }
        start.store(low, ordering: .relaxed)
        end.store(high, ordering: .relaxed)
        fileEnd.store(low &+ UInt(max(0, status.st_size)), ordering: .relaxed)
        #endif
    }

    /// Whether `count` bytes at `pointer` can be read: true for memory outside the map (a write
    /// transaction's own pages), and for memory in it that the file holds.
    @inline(__always)
    func contains(_ pointer: UnsafeMutableRawPointer?, _ count: Int) -> Bool {
        let low = start.load(ordering: .relaxed)
        let address = UInt(bitPattern: pointer)
        guard low != 0, address >= low, address < end.load(ordering: .relaxed) else { return true }
        let last = address &+ UInt(count)
        if last >= address, last <= fileEnd.load(ordering: .relaxed) { return true }
        return containsAfterGrowth(address, last)
    }

    /// The file may have grown since it was last looked at (commits append pages): look again.
    private func containsAfterGrowth(_ address: UInt, _ last: UInt) -> Bool {
        var status = stat()
        let handle = fd.load(ordering: .relaxed)
        guard handle >= 0, fstat(handle, &status) == 0 else { return false }
        let low = start.load(ordering: .relaxed)
        let now = low &+ UInt(max(0, status.st_size))
        fileEnd.store(now, ordering: .relaxed)
        return last >= address && last <= now && last <= end.load(ordering: .relaxed)
    }
}

/// Lock files and full file systems.
enum FileSpace {
    /// Reserves the blocks of `lock.mdb` in `directory` (creating it when missing) before LMDB
    /// maps it for writing: on a full file system LMDB's first write through that map would
    /// otherwise be a SIGBUS. The file's size is left to LMDB (its size sets the reader slots).
    /// - Returns: whether this call created the file.
    /// - Throws: ``LMDBError/Code/noSpace`` when the blocks cannot be had (the file, if this
    ///   call made it, is removed again).
    @discardableResult
    static func reserveLockFile(_ directory: String, maxReaders: Int) throws(LMDBError) -> Bool {
        let file = (directory as NSString).appendingPathComponent("lock.mdb")
        var created = true
        var fd = open(file, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        if fd < 0 && errno == EEXIST {
            created = false
            fd = open(file, O_RDWR | O_CLOEXEC)
        }
        // Not writable (a read-only file system, another user's file): LMDB decides.
        guard fd >= 0 else { return false }
        var status = stat()
        let size = fstat(fd, &status) == 0 ? Int(status.st_size) : 0
        // LMDB's lock file: 192 bytes of header and 64 bytes per reader slot; a page more.
        let wanted = max(size, ((maxReaders + 3) * 64 + 8191) & ~4095)
        let rc = stash_reserve_file_space(fd, Int64(wanted))
        // Closing is safe here: no environment of this directory is open in this process (the
        // registry opens one only when none is), so no lock of ours on the file is dropped.
        close(fd)
        guard rc == 0 else {
            if created { unlink(file) }
            throw rc == ENOSPC ? LMDBError.noSpace(operation: "reserve lock.mdb", path: directory)
                               : LMDBError(code: .init(rawValue: rc), operation: "reserve lock.mdb", path: directory)
        }
        return created
    }

    /// Whether the file system holding `path` has (nearly) no room left: LMDB reports a write
    /// cut short by a full disk as `EIO` ("TODO: use which error code?" in its source), which
    /// this tells from a failing disk.
    static func isNearlyFull(_ path: String) -> Bool {
        var info = statvfs()
        guard statvfs(path, &info) == 0 else { return false }
        let free = UInt64(info.f_bavail) * UInt64(info.f_frsize)
        return free < 4 << 20
    }

    /// Takes a write lock on byte 0 of `lock.mdb` (the byte every LMDB environment of the
    /// directory holds a shared lock on while it is open), without waiting.
    /// - Returns: the descriptor holding the lock (close it to release), or nil when another
    ///   process has the environment open; the pid of one such process when known.
    static func lockExclusively(_ directory: String) -> (fd: Int32?, holder: pid_t?) {
        let file = (directory as NSString).appendingPathComponent("lock.mdb")
        let fd = open(file, O_RDWR | O_CLOEXEC)
        guard fd >= 0 else { return (nil, nil) }
        var lock = flock()
        lock.l_type = Int16(F_WRLCK)
        lock.l_whence = Int16(SEEK_SET)
        lock.l_start = 0
        lock.l_len = 1
        if fcntl(fd, F_SETLK, &lock) == 0 { return (fd, nil) }
        var probe = flock()
        probe.l_type = Int16(F_WRLCK)
        probe.l_whence = Int16(SEEK_SET)
        probe.l_start = 0
        probe.l_len = 1
        let holder: pid_t? = fcntl(fd, F_GETLK, &probe) == 0 && probe.l_type != Int16(F_UNLCK) ? probe.l_pid : nil
        close(fd)
        return (nil, holder)
    }

    /// Empties `lock.mdb` through `fd` (which holds the exclusive lock): an LMDB open waiting for
    /// the lock meanwhile then fails (`EINVAL`, which ``Environment`` retries) instead of using a
    /// reader table that describes another data file, and the next open sets the table up anew.
    static func resetLockFile(_ fd: Int32) {
        _ = ftruncate(fd, 0)
    }
}

extension LMDBError {
    /// ENOSPC, with what to do.
    static func noSpace(operation: String, path: String) -> LMDBError {
        LMDBError(code: .noSpace, operation: operation, path: path,
                  detail: "the file system holding \(path) is full; nothing of this was committed and the store is as it was before: free some space, then try again")
    }

    /// The error of LMDB status `rc` (not 0): a write that a full file system cut short
    /// (`ENOSPC`, or `EIO` with the file system full) is ``Code/noSpace``.
    static func failure(_ rc: Int32, _ operation: String, _ path: String) -> LMDBError {
        if rc == ENOSPC || (rc == EIO && FileSpace.isNearlyFull(path)) { return noSpace(operation: operation, path: path) }
        return LMDBError(code: .init(rawValue: rc), operation: operation, path: path)
    }
}

extension Environment {
    /// Removes a store's files that an open which failed while making them left behind: its
    /// `data.mdb` and `lock.mdb`, and `directory` itself when `removingDirectory` and nothing
    /// else is in it. Nothing is removed while this process or another one has the
    /// environment open.
    /// - Returns: whether the files were removed.
    @discardableResult
    public static func removeUnfinished(at directory: String, removingDirectory: Bool) -> Bool {
        let canonical = URL(fileURLWithPath: directory).resolvingSymlinksInPath().standardizedFileURL.path
        let removed = EnvironmentRegistry.shared.whileClosed(canonical) { () -> Bool in
            let data = (canonical as NSString).appendingPathComponent("data.mdb")
            let lockFile = (canonical as NSString).appendingPathComponent("lock.mdb")
            let (fd, _) = FileSpace.lockExclusively(canonical)
            if let fd {
                FileSpace.resetLockFile(fd)
                unlink(data)
                unlink(lockFile)
                close(fd)
            } else if FileManager.default.fileExists(atPath: lockFile) {
                return false   // in use elsewhere
            } else {
                unlink(data)
            }
            if removingDirectory { rmdir(canonical) }
            return true
        }
        return removed ?? false
    }
}
