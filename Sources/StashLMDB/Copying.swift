import CLMDB
import Foundation

/// What a copy or a compaction made.
public struct CopyReport: Sendable {
    /// The size of the data file copied from, in bytes.
    public let sourceBytes: Int
    /// The size of the data file made, in bytes.
    public let copyBytes: Int
}

extension Environment {
    /// Copies the environment into directory `destination` (made when missing; it must not hold
    /// a `data.mdb` yet), with LMDB's `mdb_env_copy2`: one read snapshot, so the copy is
    /// consistent while writers go on (they are held back only for the moment the snapshot is
    /// taken). With `compact`, free pages are left out and the pages renumbered
    /// (`MDB_CP_COMPACT`): the copy holds only what the data needs. The copy is synced to disk
    /// before this returns. Only `data.mdb` is written; an open of the copy makes its lock file.
    /// - Throws: ``LMDBError``: `EEXIST` when `destination` holds a `data.mdb`; ``LMDBError/Code/noSpace``
    ///   (naming `destination`) when its file system fills (the partial copy is removed);
    ///   ``LMDBError/Code/nestedWrite`` from inside a write closure (the copy waits for the writer).
    @discardableResult
    public func copy(to destination: String, compact: Bool) throws(LMDBError) -> CopyReport {
        try checkMapped("copy")
        try writer.refuseNested(path: path)
        let target = URL(fileURLWithPath: destination).standardizedFileURL.path
        let resolved = URL(fileURLWithPath: destination).resolvingSymlinksInPath().standardizedFileURL.path
        guard resolved != path else {
            throw LMDBError(code: .invalid, operation: "copy", path: path, detail: "the destination is the environment's own directory; give another one")
        }
        let file = (target as NSString).appendingPathComponent("data.mdb")
        var isDirectory: ObjCBool = false
        let existed = FileManager.default.fileExists(atPath: target, isDirectory: &isDirectory)
        if existed && !isDirectory.boolValue {
            throw LMDBError(code: .init(rawValue: ENOTDIR), operation: "copy", path: target, detail: "the destination is a file; give a directory")
        }
        if FileManager.default.fileExists(atPath: file) {
            throw LMDBError(code: .init(rawValue: EEXIST), operation: "copy", path: target,
                            detail: "it holds a data.mdb already; give a new or empty directory (a copy never replaces a store)")
        }
        if !existed {
            do { try FileManager.default.createDirectory(atPath: target, withIntermediateDirectories: true) } catch {
                throw FileSpace.isNearlyFull((target as NSString).deletingLastPathComponent)
                    ? LMDBError.noSpace(operation: "copy", path: target)
                    : LMDBError(code: .init(rawValue: EACCES), operation: "create directory", path: target,
                                detail: "check that the parent directory exists and is writable")
            }
        }
        func removePartial() {
            unlink(file)
            if !existed { rmdir(target) }
        }
        while true {
            // The copy's read transaction counts as one of this process's: a resize (which
            // remaps the file) waits for it.
            gate.enter()
            let rc = mdb_env_copy2(env, target, compact ? UInt32(MDB_CP_COMPACT) : 0)
            gate.leave()
            if rc == MDB_MAP_RESIZED {
                unlink(file)
                let adopted: Bool
                do { adopted = try adoptResizedMap() } catch { removePartial(); throw error }
                guard adopted else {
                    removePartial()
                    throw LMDBError(code: .mapResized, operation: "copy", path: path,
                                    detail: "another process grew the map while this thread holds a transaction; copy outside a read or write closure")
                }
                continue
            }
            guard rc == 0 else {
                removePartial()
                throw LMDBError.failure(rc, "mdb_env_copy2", target)
            }
            break
        }
        do {
            try Self.syncFile(file, directory: target)
        } catch {
            removePartial()
            throw error
        }
        return CopyReport(sourceBytes: Self.fileSize((path as NSString).appendingPathComponent("data.mdb")), copyBytes: Self.fileSize(file))
    }

    /// Compacts the environment in directory `path` in place: a compacted copy
    /// (`MDB_CP_COMPACT`) is made in `path/compacting`, handed to `preparing` (which may open
    /// it, write to it and must release it), synced, and renamed over `data.mdb`, so that a
    /// crash at any point leaves either the old file or the new one. The space of free pages
    /// goes back to the file system.
    ///
    /// No process may have the environment open meanwhile: this process (checked in its
    /// registry, and opens of the directory wait until it is done) nor another one (checked
    /// with the lock every LMDB opener holds on `lock.mdb`; their opens wait, and those that
    /// were already waiting open again). The copy is a new file: `preparing` is where its
    /// owner records that.
    /// - Throws: ``LMDBError/Code/inUse`` while it is open anywhere (naming a process);
    ///   ``LMDBError/Code/noSpace`` when the copy does not fit (the store is left as it was).
    public static func compact(path: String, maxDatabases: Int = 16,
                               preparing: (String) throws -> Void) throws -> CopyReport {
        let canonical = URL(fileURLWithPath: path).resolvingSymlinksInPath().standardizedFileURL.path
        let dataFile = (canonical as NSString).appendingPathComponent("data.mdb")
        guard FileManager.default.fileExists(atPath: dataFile) else {
            throw LMDBError(code: .init(rawValue: ENOENT), operation: "compact", path: canonical, detail: "no data.mdb there")
        }
        let done = try EnvironmentRegistry.shared.whileClosed(canonical) { () throws -> CopyReport? in
            // Made by LMDB when missing: the lock every opener takes is on it.
            let lockFile = (canonical as NSString).appendingPathComponent("lock.mdb")
            if !FileManager.default.fileExists(atPath: lockFile) { try FileSpace.reserveLockFile(canonical, maxReaders: 126) }
            let (held, holder) = FileSpace.lockExclusively(canonical)
            guard let lock = held else {
                throw LMDBError(code: .inUse, operation: "compact", path: canonical,
                                detail: "another process\(holder.map { " (pid \($0))" } ?? "") has it open; compact it once every process using it has closed it, or make a compacted copy instead (a backup with compaction)")
            }
            defer { close(lock) }
            try DataFileCheck.check(canonical)
            let scratch = (canonical as NSString).appendingPathComponent("compacting")
            for name in ["data.mdb", "lock.mdb"] { unlink((scratch as NSString).appendingPathComponent(name)) }
            rmdir(scratch)
            guard mkdir(scratch, 0o755) == 0 else {
                throw errno == ENOSPC ? LMDBError.noSpace(operation: "compact", path: canonical) : LMDBError(code: .init(rawValue: errno), operation: "mkdir compacting", path: canonical)
            }
            func removeScratch() {
                for name in ["data.mdb", "lock.mdb"] { unlink((scratch as NSString).appendingPathComponent(name)) }
                rmdir(scratch)
            }
            // Without LMDB's locks (this holds the one that matters) and read-only.
            var created: OpaquePointer?
            try check(mdb_env_create(&created), "mdb_env_create", canonical)
            guard let raw = created else { throw LMDBError(code: .panic, operation: "mdb_env_create", path: canonical) }
            var rc = mdb_env_set_maxdbs(raw, MDB_dbi(max(1, maxDatabases)))
            if rc == 0 { rc = mdb_env_open(raw, canonical, UInt32(MDB_NOTLS) | UInt32(MDB_NOLOCK) | UInt32(MDB_RDONLY), 0o644) }
            if rc == 0 { rc = mdb_env_copy2(raw, scratch, UInt32(MDB_CP_COMPACT)) }
            mdb_env_close(raw)
            guard rc == 0 else {
                removeScratch()
                throw LMDBError.failure(rc, "mdb_env_copy2 (compact)", canonical)
            }
            let copied = (scratch as NSString).appendingPathComponent("data.mdb")
            do {
                try syncFile(copied, directory: scratch)
                try preparing(scratch)
                try syncFile(copied, directory: scratch)
            } catch {
                removeScratch()
                throw error
            }
            let before = fileSize(dataFile)
            guard rename(copied, dataFile) == 0 else {
                let code = errno
                removeScratch()
                throw LMDBError(code: .init(rawValue: code), operation: "rename the compacted copy", path: canonical)
            }
            removeScratch()
            try syncDirectory(canonical)
            // The reader table describes the old file: the next open sets it up anew.
            FileSpace.resetLockFile(lock)
            return CopyReport(sourceBytes: before, copyBytes: fileSize(dataFile))
        }
        guard let done = done.flatMap({ $0 }) else {
            throw LMDBError(code: .inUse, operation: "compact", path: canonical,
                            detail: "this process has it open (a Store, FeatureGate, SyncEngine or history observation of it is alive); release all of them first")
        }
        return done
    }

    static func fileSize(_ file: String) -> Int {
        var status = stat()
        return stat(file, &status) == 0 ? Int(status.st_size) : 0
    }

    /// `fsync` of `file` and of `directory` (its entry).
    static func syncFile(_ file: String, directory: String) throws(LMDBError) {
        let fd = Foundation.open(file, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw LMDBError(code: .init(rawValue: errno), operation: "open", path: file) }
        let rc = fsync(fd)
        let code = errno
        close(fd)
        if rc != 0 { throw LMDBError.failure(code, "fsync", directory) }
        try syncDirectory(directory)
    }

    static func syncDirectory(_ directory: String) throws(LMDBError) {
        let fd = Foundation.open(directory, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        defer { close(fd) }
        if fsync(fd) != 0 && errno != EINVAL { throw LMDBError.failure(errno, "fsync", directory) }
    }
}
