import CFileIdentity
import CLMDB
import Foundation
import Synchronization

/// One LMDB environment: a directory holding `data.mdb` and `lock.mdb`, with its named
/// databases opened once at start.
///
/// ```swift
/// var config = EnvironmentConfiguration(databases: [DatabaseSpec("records")])
/// let env = try Environment.open(path: "/tmp/store", configuration: config)
/// let records = try env.database("records")
/// try env.write { txn in try txn.put(records, key: [1], value: [42]) }
/// let value = try env.read { txn in try txn.get(records, key: [1]) }
/// ```
///
/// ## Rules this type enforces
/// - One `Environment` per directory per process: opening a path that is already open
///   returns the same instance. *Why:* POSIX record locks belong to the process, so closing
///   a second handle on `lock.mdb` would drop the first handle's locks.
/// - Transactions are closure-scoped; `MDB_NOTLS` is always on, so a read transaction may run
///   on any thread. Read handles are recycled with `mdb_txn_reset`/`mdb_txn_renew`.
/// - One writer at a time per process; a second writer waits. A write started on a thread
///   that is already inside a write throws ``LMDBError/Code/nestedWrite`` instead of
///   deadlocking.
/// - `MDB_MAP_FULL` does not reach the caller: the write is aborted, the map is doubled once
///   no transaction of this process is open, and the closure runs again. So a write closure
///   may run more than once (a group commit also runs its closures again when one of them
///   throws): keep side effects outside the store out of it.
/// - `MDB_MAP_RESIZED` (another process grew the map) is absorbed the same way.
/// - The one exception: a resize waits for every transaction of this process to end, so a
///   write started on a thread inside a read closure cannot wait for it (the read would never
///   end). When the map must grow, such a write throws ``LMDBError/Code/mapFull`` (or
///   `mapResized`) naming the path, and the writes of other threads grouped with it still
///   commit. A read closure that waits for a write on *another* thread still deadlocks: do
///   not wait for writes inside a read.
///
/// ## Topics
/// - ``read(_:)``, ``write(isolation:_:)``, ``database(_:)``, ``info()``, ``checkReaders()``
public final class Environment: @unchecked Sendable {
    /// The canonical directory path.
    public let path: String
    public let configuration: EnvironmentConfiguration
    let env: OpaquePointer
    private let databasesByName: [String: Database]
    let gate = TransactionGate()
    let writer = WriterLock()
    private let queue = WriteQueue()
    let pool: ReaderPool
    /// Where the data file is mapped, to check values before they are copied.
    let bounds = MapBounds()
    private let writesSinceReaderCheck = Atomic<Int>(0)
    /// Set when `mdb_env_set_mapsize` failed to map the file again (out of address space):
    /// LMDB has unmapped it, and any transaction would read freed memory. Every later
    /// operation throws ``LMDBError/Code/mapLost`` instead.
    private let unmapped = Atomic<Bool>(false)
    /// Who uses the environment, and whether it was closed (see ``retainHandle()``).
    let lifecycle = EnvironmentLifecycle()

    // MARK: Opening

    /// Opens (creating if needed) the environment in directory `path`.
    ///
    /// Creates the directory when missing, clears stale reader slots left by dead processes
    /// (`mdb_reader_check`), and opens every database of `configuration.databases` in one
    /// write transaction. With ``EnvironmentConfiguration/readOnly`` nothing is created or
    /// written: the databases are opened in a read transaction.
    ///
    /// A directory this process has open already gives back that environment, for read-only
    /// and writable openers alike, except that one opened `MDB_RDONLY` (``isReadOnly``: the
    /// files could not be written) cannot be opened for writing until every handle of it is
    /// gone (one process may hold one LMDB environment per directory: see the rules above).
    /// - Throws: ``LMDBError`` naming the path, e.g. `EACCES` for an unwritable directory,
    ///   ``LMDBError/Code/invalid`` for a file that is not an LMDB store,
    ///   ``LMDBError/Code/readOnly`` for a writable open of a directory open read-only here.
    public static func open(path: String, configuration: EnvironmentConfiguration = .init()) throws(LMDBError) -> Environment {
        var madeDirectory = false
        if !configuration.readOnly {
            var isDirectory: ObjCBool = false
            madeDirectory = !FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory)
            do {
                try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            } catch {
                if FileSpace.isNearlyFull((path as NSString).deletingLastPathComponent) {
                    throw LMDBError.noSpace(operation: "create directory", path: path)
                }
                throw LMDBError(code: .init(rawValue: EACCES), operation: "create directory", path: path,
                                detail: "check that the parent directory exists and is writable")
            }
        }
        let canonical = URL(fileURLWithPath: path).resolvingSymlinksInPath().standardizedFileURL.path
        var opened = false
        let environment: Environment
        do {
            environment = try EnvironmentRegistry.shared.open(canonical) { () throws(LMDBError) in
                opened = true
                return try Environment(canonicalPath: canonical, configuration: configuration)
            }
        } catch {
            // An open that was making the environment (no data.mdb, or an empty one, before it)
            // leaves nothing behind: no half-made store, no stray lock file.
            if opened && !configuration.readOnly && !Self.dataFileHeldData(canonical) {
                Self.removeUnfinished(at: canonical, removingDirectory: madeDirectory)
            }
            throw error
        }
        if !opened { try environment.checkStillAtPath() }
        if configuration.readOnly { return environment }
        if environment.isReadOnly {
            throw LMDBError(code: .readOnly, operation: "open", path: canonical,
                            detail: "this process has it open read-only; release every read-only handle (Store) of it first, or open those for writing too")
        }
        try environment.raiseDurability(to: configuration.durability)
        return environment
    }

    /// Opened with `MDB_RDONLY` (a read-only opener on a read-only file system, or of files
    /// this user cannot write): writes throw, and no writable open can share it.
    public let isReadOnly: Bool

    /// Whether `directory` holds a `data.mdb` with a committed transaction in it (a meta page
    /// naming one), as opposed to none, an empty one or the two meta pages of a new one.
    static func dataFileHeldData(_ directory: String) -> Bool {
        let fd = Foundation.open((directory as NSString).appendingPathComponent("data.mdb"), O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        guard let first = DataFileCheck.meta(fd, at: 0) else {
            var status = stat()
            return fstat(fd, &status) == 0 && status.st_size > 0   // not LMDB's: not ours to remove
        }
        let second = first.pageSize > 0 ? DataFileCheck.meta(fd, at: first.pageSize) : nil
        return max(first.transactionID, second?.transactionID ?? 0) > 0
    }

    /// The durability commits have now: the strongest any opener of this directory in this
    /// process asked for (see ``raiseDurability(to:)``).
    public var durability: Durability {
        if lifecycle.isClosed { return configuration.durability }
        var flags: UInt32 = 0
        mdb_env_get_flags(env, &flags)
        if flags & UInt32(MDB_NOSYNC) != 0 { return .none }
        if flags & UInt32(MDB_NOMETASYNC) != 0 { return .relaxed }
        return .full
    }

    /// Makes commits at least as durable as `wanted`. The sync flags are the environment's,
    /// shared by every opener of the directory in this process: a second open asking for
    /// more durability than the first gets it (and so does the first), never less than it
    /// asked for. LMDB lets these flags change on an open environment; a commit running at
    /// that moment keeps the flags it started syncing with.
    func raiseDurability(to wanted: Durability) throws(LMDBError) {
        // Two opens raising it at once must not interleave (the flags are cleared, then set).
        durabilityLock.lock()
        defer { durabilityLock.unlock() }
        guard wanted.strength > durability.strength else { return }
        try check(mdb_env_set_flags(env, UInt32(MDB_NOSYNC) | UInt32(MDB_NOMETASYNC), 0), "mdb_env_set_flags", path)
        if wanted.flags != 0 { try check(mdb_env_set_flags(env, wanted.flags, 1), "mdb_env_set_flags", path) }
    }
    private let durabilityLock = NSLock()

    /// Throws when the directory's `data.mdb` is no longer this environment's file: deleted,
    /// or replaced (a directory removed and created again, a backup restored over it) while
    /// this process still holds the environment of the old one. A new open would otherwise
    /// share that, reading the old data and writing to a file no longer on disk.
    func checkStillAtPath() throws(LMDBError) {
        let dataPath = (path as NSString).appendingPathComponent("data.mdb")
        let fd = Foundation.open(dataPath, O_RDONLY)
        var current: FileIdentity?
        if fd >= 0 {
            var inode: UInt64 = 0, seconds: Int64 = 0, nanoseconds: UInt32 = 0
            if stash_file_identity(fd, &inode, &seconds, &nanoseconds) == 0 {
                current = FileIdentity(inode: inode, birth: seconds == 0 && nanoseconds == 0 ? nil : (seconds, nanoseconds))
            }
            close(fd)
        }
        guard let current, current.isSameFile(as: try dataFileIdentity()) else {
            throw LMDBError(code: .replaced, operation: "open", path: path,
                            detail: "the directory's data file was deleted or replaced while this process still has the old one open (a Store, FeatureGate, SyncEngine, history observation or background sync of it is alive); release all of them, then open again")
        }
    }

    private init(canonicalPath: String, configuration: EnvironmentConfiguration) throws(LMDBError) {
        path = canonicalPath
        self.configuration = configuration
        // A read-only opener still asks LMDB for write access when the files allow it (nothing
        // is written by that): a writable open in this process can then share the environment,
        // LMDB allowing one per directory per process. `MDB_RDONLY` only where writing is
        // impossible (a read-only file system, files this user cannot write).
        let raw: OpaquePointer
        do {
            raw = try Self.openLMDB(canonicalPath, configuration, readOnlyFlag: false)
            isReadOnly = false
        } catch let error where configuration.readOnly && [EACCES, EROFS, EPERM].contains(error.code.rawValue) {
            raw = try Self.openLMDB(canonicalPath, configuration, readOnlyFlag: true)
            isReadOnly = true
        }
        do throws(LMDBError) {
            // A store written earlier with a bigger map keeps it: adopt the larger of the two.
            // (A read-only opener keeps the file's own size: it writes nothing that could need more.)
            var info = MDB_envinfo()
            mdb_env_info(raw, &info)
            if !configuration.readOnly && info.me_mapsize < configuration.initialMapSize {
                try check(mdb_env_set_mapsize(raw, configuration.initialMapSize), "mdb_env_set_mapsize", canonicalPath)
            }
            var dead: Int32 = 0
            try check(mdb_reader_check(raw, &dead), "mdb_reader_check", canonicalPath)
            databasesByName = try Self.openDatabases(raw, configuration.databases, refusingForeignData: configuration.refusesForeignData,
                                                     readOnly: configuration.readOnly, canonicalPath)
        } catch {
            mdb_env_close(raw)
            throw error
        }
        env = raw
        bounds.locate(raw)
        // An idle pooled handle keeps its reader slot (`mdb_txn_reset`), and the slots are
        // shared by every process of the directory: a few busy processes keeping half the
        // table each left none for the next reader. A small pool serves a process's usual
        // concurrent reads without allocating.
        pool = ReaderPool(capacity: max(1, min(8, configuration.maxReaders / 8)), bounds: bounds)
    }

    /// `mdb_env_create` and `mdb_env_open` of `path` (with `MDB_RDONLY` when `readOnlyFlag`);
    /// the handle is closed again when the open fails.
    private static func openLMDB(_ path: String, _ configuration: EnvironmentConfiguration, readOnlyFlag: Bool,
                                 attempt: Int = 1) throws(LMDBError) -> OpaquePointer {
        // Before LMDB maps anything: a data file cut short would be a SIGBUS at its first read,
        // and a lock file without blocks on a full file system a SIGBUS at its first write.
        try DataFileCheck.check(path)
        if !readOnlyFlag { try FileSpace.reserveLockFile(path, maxReaders: configuration.maxReaders) }
        var created: OpaquePointer?
        try check(mdb_env_create(&created), "mdb_env_create", path)
        guard let raw = created else { throw LMDBError(code: .panic, operation: "mdb_env_create", path: path) }
        var retry = false
        do throws(LMDBError) {
            guard let databases = MDB_dbi(exactly: configuration.maxDatabases), let readers = UInt32(exactly: configuration.maxReaders), readers > 0 else {
                throw LMDBError(code: .invalid, operation: "open", path: path,
                                detail: "maxDatabases (\(configuration.maxDatabases)) and maxReaders (\(configuration.maxReaders)) must be positive")
            }
            try check(mdb_env_set_maxdbs(raw, databases), "mdb_env_set_maxdbs", path)
            try check(mdb_env_set_maxreaders(raw, readers), "mdb_env_set_maxreaders", path)
            // No map size before open: LMDB then adopts the size recorded in an existing file
            // (a size set here would win over it, shrinking a grown map to the data's size).
            // A read-only opener asks for no durability: it commits nothing, and the writable
            // openers sharing the environment raise it to what they ask for.
            let durability = configuration.readOnly ? Durability.none : configuration.durability
            let flags = UInt32(MDB_NOTLS) | (readOnlyFlag ? UInt32(MDB_RDONLY) : durability.flags)
            let rc = mdb_env_open(raw, path, flags, 0o644)
            if rc == EACCES || rc == EROFS || rc == EPERM {
                throw LMDBError(code: .init(rawValue: rc), operation: "mdb_env_open", path: path,
                                detail: readOnlyFlag
                                    ? "to read, LMDB needs data.mdb readable and lock.mdb writable by this user (it registers readers there), unless the store is on a read-only file system"
                                    : rc == EROFS
                                    ? "the file system is read-only: open the store read-only, or copy it to a writable place"
                                    : "LMDB writes data.mdb and lock.mdb even to read: the directory and both files must be writable by this user (open it read-only, or copy the store elsewhere)")
            }
            if rc == EINVAL && attempt < 3 {
                // A compaction or a failed creation emptied lock.mdb while this open waited
                // for it (see FileSpace.resetLockFile): open again, which sets it up anew.
                retry = true
            } else {
                try check(rc, "mdb_env_open", path)
            }
        } catch {
            mdb_env_close(raw)
            throw error
        }
        if retry {
            mdb_env_close(raw)
            return try openLMDB(path, configuration, readOnlyFlag: readOnlyFlag, attempt: attempt + 1)
        }
        return raw
    }

    /// Opens `specs` in one transaction: a write transaction creating those missing, or a
    /// read transaction (`readOnly`) in which a missing one throws ``LMDBError/Code/notFound``.
    /// Committing the read transaction keeps its handles for the environment's life.
    private static func openDatabases(_ env: OpaquePointer, _ specs: [DatabaseSpec], refusingForeignData: Bool, readOnly: Bool,
                                      _ path: String) throws(LMDBError) -> [String: Database] {
        guard !specs.isEmpty else { return [:] }
        var txn: OpaquePointer?
        try check(mdb_txn_begin(env, nil, readOnly ? UInt32(MDB_RDONLY) : 0, &txn), "mdb_txn_begin", path)
        if refusingForeignData {
            let foreign: String?
            do { foreign = try firstForeignKey(txn, allowed: Set(specs.map(\.name)), path) } catch {
                mdb_txn_abort(txn)
                throw error
            }
            if let foreign {
                mdb_txn_abort(txn)
                throw LMDBError(code: .foreignData, operation: "open", path: path,
                                detail: "its main database holds \"\(foreign)\", which is none of \(specs.map(\.name).joined(separator: ", ")); nothing was changed")
            }
        }
        var result: [String: Database] = [:]
        for spec in specs {
            var dbi: MDB_dbi = 0
            let rc = mdb_dbi_open(txn, spec.name, (readOnly ? 0 : UInt32(MDB_CREATE)) | spec.flags.rawValue, &dbi)
            if rc != 0 {
                mdb_txn_abort(txn)
                throw LMDBError(code: .init(rawValue: rc), operation: "mdb_dbi_open \(spec.name)", path: path,
                                detail: readOnly && rc == MDB_NOTFOUND
                                    ? "the database \"\(spec.name)\" does not exist yet and a read-only open cannot create it; open the environment once for writing"
                                    : nil)
            }
            result[spec.name] = Database(name: spec.name, flags: spec.flags, dbi: dbi)
        }
        try check(mdb_txn_commit(txn), "mdb_txn_commit (open databases)", path)
        return result
    }

    /// The first key of the main database that is not one of `allowed`, printable, or nil;
    /// nil too when one of `allowed` is there (the environment is this program's, perhaps
    /// written by a newer version with more databases: its own checks judge it).
    private static func firstForeignKey(_ txn: OpaquePointer?, allowed: Set<String>, _ path: String) throws(LMDBError) -> String? {
        var main: MDB_dbi = 0
        try check(mdb_dbi_open(txn, nil, 0, &main), "mdb_dbi_open (main)", path)
        var cursor: OpaquePointer?
        try check(mdb_cursor_open(txn, main, &cursor), "mdb_cursor_open (main)", path)
        defer { mdb_cursor_close(cursor) }
        var key = MDB_val(), value = MDB_val()
        var foreign: String?
        var rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST)
        while rc == 0 {
            // A name is short; a damaged size must not read past the page (or the file).
            let bytes = UnsafeRawBufferPointer(start: key.mv_data, count: min(key.mv_size, LMDBLimits.maxKeySize))
            let name = String(decoding: bytes, as: UTF8.self)
            if allowed.contains(name) { return nil }
            if foreign == nil { foreign = name }
            rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT)
        }
        guard rc == MDB_NOTFOUND else { throw LMDBError(code: .init(rawValue: rc), operation: "mdb_cursor_get (main)", path: path) }
        return foreign
    }

    deinit {
        // Closed already (``releaseHandle()``): the handle is gone and the registry entry too.
        if lifecycle.isClosed { return }
        pool.drain()
        EnvironmentRegistry.shared.close(path) { mdb_env_close(env) }
    }

    /// The database named `name`, opened at start.
    /// - Throws: ``LMDBError/Code/unknownDatabase`` when it was not in the configuration.
    public func database(_ name: String) throws(LMDBError) -> Database {
        guard let db = databasesByName[name] else {
            throw LMDBError(code: .unknownDatabase, operation: "database \(name)", path: path,
                            detail: "add DatabaseSpec(\"\(name)\") to the configuration")
        }
        return db
    }

    // MARK: Transactions

    /// Runs `body` in a read-only snapshot. The snapshot is released when `body` returns.
    ///
    /// Cost: no allocation once warm — the transaction handle and its cursors come from a
    /// pool and are recycled with `mdb_txn_renew`. Do not keep a read open for long: a live
    /// reader pins the pages of its snapshot and makes the file grow.
    public func read<R>(_ body: (ReadTransaction) throws -> R) throws -> R {
        let handle = pool.take()
        try beginRead(handle)
        defer { endRead(handle) }
        return try body(ReadTransaction(handle: handle, path: path))
    }

    private func beginRead(_ handle: TransactionHandle) throws(LMDBError) {
        while true {
            do throws(LMDBError) { try checkMapped("begin read transaction") } catch { pool.give(handle); throw error }
            gate.enter()
            if lifecycle.isClosed {
                gate.leave()
                pool.give(handle)
                throw lifecycle.closedError(path, "begin read transaction")
            }
            let rc: Int32
            if let txn = handle.txn {
                rc = mdb_txn_renew(txn)
            } else {
                var txn: OpaquePointer?
                rc = mdb_txn_begin(env, nil, UInt32(MDB_RDONLY), &txn)
                if rc == 0 { handle.txn = txn }
            }
            if rc == 0 {
                handle.markCursorsStale()
                return
            }
            gate.leave()
            if rc == MDB_MAP_RESIZED {
                let adopted: Bool
                do { adopted = try adoptResizedMap() } catch { pool.give(handle); throw error }
                guard adopted else {
                    pool.give(handle)
                    throw LMDBError(code: .mapResized, operation: "begin read transaction", path: path,
                                    detail: "another process grew the map while this thread holds a transaction; end it and retry")
                }
                continue
            }
            if rc == MDB_READERS_FULL, clearStaleReaders() > 0 { continue }
            pool.give(handle)
            throw LMDBError(code: .init(rawValue: rc), operation: "begin read transaction", path: path,
                            detail: rc == MDB_READERS_FULL ? "all \(configuration.maxReaders) reader slots (maxReaders) are taken, by reads open now and by the idle ones each process of this directory keeps (up to \(pool.capacity) here: min(8, maxReaders / 8)); raise maxReaders (EnvironmentConfiguration.maxReaders; StoreOptions.maxReaders through a Store) or end long-lived reads" : nil)
        }
    }

    private func endRead(_ handle: TransactionHandle) {
        if let txn = handle.txn { mdb_txn_reset(txn) }
        gate.leave()
        pool.give(handle)
    }

    /// Runs `body` in a write transaction and commits when it returns; rolls `body`'s changes
    /// back when it throws (the error is rethrown).
    ///
    /// **Group commit.** Writers on several threads are serialized, and those that arrive
    /// while a commit is on its way to the disk are committed together by the next one: the
    /// closures run in arrival order in one LMDB transaction, each seeing the changes of those
    /// before it, and one durable commit (one sync) serves them all. A closure that throws
    /// rolls back only its own changes: the group then runs again with each closure in a
    /// nested transaction of its own (so every closure of that group runs twice). Every caller
    /// returns once the commit holding its changes is durable. A lone writer runs in a plain
    /// transaction, exactly as without grouping. A closure always runs in its caller's task
    /// (`@TaskLocal` values and cancellation are the caller's) and on its caller's actor:
    /// the leading writer holds the transaction and hands it to such a caller's thread for
    /// its closure (one thread switch per grouped write). A caller outside any task and
    /// actor (a plain `Thread`, a Dispatch queue) may have its closure run on the leading
    /// writer's thread instead, which saves that switch: such a closure must not rely on
    /// thread-local state.
    ///
    /// A map-full condition is handled here (the map grows and `body` runs again), and a
    /// group runs again when one of its closures throws, so `body` must only change the store.
    /// A write started inside a write closure throws ``LMDBError/Code/nestedWrite`` instead of
    /// deadlocking.
    /// - Parameter isolation: the caller's actor (filled in by the compiler). A caller
    ///   isolated to an actor (`@MainActor` code, an actor's method) never leads other
    ///   writers' group: its thread (the main thread, say) waits for other writers' closures
    ///   only when it queued behind them.
    public func write<R>(isolation: isolated (any Actor)? = #isolation, _ body: (WriteTransaction) throws -> R) throws -> R {
        if isReadOnly {
            throw LMDBError(code: .readOnly, operation: "write", path: path,
                            detail: "the environment was opened read-only (EnvironmentConfiguration.readOnly); open it without it to write")
        }
        try writer.refuseNested(path: path)
        return try withoutActuallyEscaping(body) { body in
            var result: R?
            let inTask = withUnsafeCurrentTask { $0 != nil }
            let request = PendingWrite(thread: currentThreadID(), pinned: isolation != nil, ownThread: inTask) { [writer, gate] txn in
                // On the thread of this caller or of the leader, while the leader holds the
                // transaction: a write started in `body` must be refused as nested, and a read
                // begun in it must not wait for a resize (which waits for the leader's
                // transaction).
                writer.runClosure()
                gate.enter(joining: true)
                defer {
                    gate.leave()
                    writer.closureEnded()
                }
                result = try body(txn)
            }
            queue.submit(request) { batch in commitGroup(batch) }
            if let error = request.error { throw error }
            guard let result else {
                throw LMDBError(code: .panic, operation: "write", path: path, detail: "a grouped write returned no result")
            }
            return result
        }
    }

    /// Writes waiting for the commit in progress to finish (they will be committed together).
    var waitingWrites: Int { queue.waiting }

    /// Commits `batch` as one LMDB transaction (the calling thread leads the group), or each
    /// request on its own when the group as a whole cannot commit. Claims and settles every
    /// request, except when the map must grow and this thread is inside a read transaction:
    /// then its own request is refused and those not settled yet are left queued for the next
    /// leader (this thread cannot wait for the resize, which waits for its read).
    private func commitGroup(_ batch: [PendingWrite]) {
        do {
            try writer.lock(path: path)
        } catch {
            for request in queue.claim(batch) { request.error = error }
            return
        }
        defer { writer.unlock() }
        if writesSinceReaderCheck.add(batch.count, ordering: .relaxed).newValue & 1023 < batch.count { clearStaleReaders() }
        do throws(ResizeRefusal) {
            if batch.count > 1 {
                do {
                    try commitTogether(batch)
                    return
                } catch let refusal as ResizeRefusal {
                    throw refusal
                } catch {
                    // The group as a whole failed (a nested commit or the shared commit):
                    // nothing of it is on disk. Each request runs again in its own
                    // transaction below, and gets its own outcome.
                }
            }
            for request in batch {
                try commitAlone(request)
                // Its caller may be inside a read, which a later request's resize waits for:
                // let it go now rather than at the end of the group.
                queue.settle(request)
            }
        } catch {
            let me = currentThreadID()
            for request in queue.claim(batch.filter { $0.thread == me }) { request.error = error.error }
        }
    }

    /// Runs one request in its own transaction; a map-full condition grows the map and reruns
    /// it. Sets the request's outcome, unless it was refused before it ran.
    /// - Throws: ``ResizeRefusal`` only (the request is left queued then).
    private func commitAlone(_ request: PendingWrite) throws(ResizeRefusal) {
        while true {
            let handle = TransactionHandle(bounds: bounds)
            do {
                try beginWrite(handle)
            } catch let error as ResizeRefusal {
                throw error
            } catch {
                if queue.claim(request) { request.error = error }
                return
            }
            guard queue.claim(request) else {
                abort(handle)   // refused while this thread waited to begin
                return
            }
            do {
                var thrown: (any Error)?
                queue.runInTurn([request]) { request in
                    do { try request.body(WriteTransaction(handle: handle, path: path)) } catch { thrown = error }
                    return true
                }
                if let thrown { throw thrown }
                if handle.sawMapFull { throw LMDBError(code: .mapFull, operation: "write", path: path) }
                if try commit(handle) {
                    request.error = nil
                    return
                }
                // The commit itself reported MDB_MAP_FULL: grow below.
            } catch {
                abort(handle)
                guard handle.sawMapFull || (error as? LMDBError)?.code == .mapFull else {
                    request.error = error
                    return
                }
            }
            queue.unclaim([request])
            do {
                try growMap()
            } catch let error as ResizeRefusal {
                throw error
            } catch {
                if queue.claim(request) { request.error = error }
                return
            }
        }
    }

    /// Runs every request of `batch` in one shared transaction and commits that once. A
    /// request that throws keeps its error and leaves no change behind.
    ///
    /// The requests first run one after the other straight in the shared transaction. Should
    /// one throw, that attempt is rolled back and the group runs again with each request in a
    /// nested transaction of its own, so that only the failed one's changes are dropped.
    /// Nesting is not the first choice because it costs: LMDB copies every page a nested
    /// transaction changes that its parent had changed already, and the writes of a group
    /// share their B-trees' last pages (a 4 KiB copy per page and per write, three times the
    /// instructions of a small insert).
    ///
    /// Throws when the group itself fails (nothing is committed then, and the requests are
    /// left queued); a map-full condition grows the map and runs the group again.
    private func commitTogether(_ batch: [PendingWrite]) throws {
        var nested = false
        while true {
            let parent = TransactionHandle(bounds: bounds)
            try beginWrite(parent)
            let claimed = queue.claim(batch)
            var mapFull = false
            if !nested {
                switch runShared(claimed, in: parent) {
                case .ran:
                    do {
                        if try commit(parent) { return }
                    } catch {
                        queue.unclaim(claimed)
                        throw error
                    }
                    mapFull = true
                case .threw:
                    nested = true
                case .mapFull:
                    mapFull = true
                }
                abort(parent)
                queue.unclaim(claimed)
                if mapFull { try growMap() }
                continue
            }
            do {
                // Each step runs on its request's caller's thread: a nested transaction is
                // begun and ended there too (LMDB takes no lock for it).
                var failure: (any Error)?
                queue.runInTurn(claimed) { request in
                    var child: OpaquePointer?
                    do {
                        try check(mdb_txn_begin(env, parent.txn, 0, &child), "mdb_txn_begin (nested)", path)
                    } catch {
                        failure = error
                        return false
                    }
                    let handle = TransactionHandle(bounds: bounds)
                    handle.txn = child
                    // LMDB frees the child at its commit or abort: a transaction kept past its
                    // closure (captured by an after-commit action) gets LMDB's EINVAL, as a
                    // write that ran alone does, never the freed memory.
                    defer { handle.txn = nil }
                    do {
                        try request.body(WriteTransaction(handle: handle, path: path))
                        request.error = nil
                    } catch {
                        request.error = error
                    }
                    handle.closeCursors()
                    if handle.sawMapFull || (request.error as? LMDBError)?.code == .mapFull {
                        mdb_txn_abort(child)
                        mapFull = true
                        return false
                    }
                    if let error = request.error as? LMDBError, error.code == .transactionFull {
                        // Too many dirty pages for the group: each request runs alone instead.
                        mdb_txn_abort(child)
                        failure = error
                        return false
                    }
                    if request.error != nil {
                        mdb_txn_abort(child)
                        return true
                    }
                    let rc = mdb_txn_commit(child)
                    if rc == MDB_MAP_FULL {
                        mapFull = true
                        return false
                    }
                    do {
                        try check(rc, "mdb_txn_commit (nested)", path)
                    } catch {
                        failure = error
                        return false
                    }
                    return true
                }
                if let failure { throw failure }
                if !mapFull {
                    if try commit(parent) { return }
                    mapFull = true
                }
            } catch {
                abort(parent)
                queue.unclaim(claimed)
                throw error
            }
            abort(parent)
            queue.unclaim(claimed)
            if mapFull { try growMap() }
        }
    }

    /// How ``runShared(_:in:)`` ended.
    private enum SharedRun { case ran, threw, mapFull }

    /// Runs each of `requests` straight in `parent`, in order, until one throws (any error:
    /// the caller's own, or LMDB's, which may come from an earlier request that broke the
    /// transaction and swallowed the error) or the map is full. Sets no outcome: a throw
    /// makes the caller run the group again, nested.
    private func runShared(_ requests: [PendingWrite], in parent: TransactionHandle) -> SharedRun {
        var outcome = SharedRun.ran
        queue.runInTurn(requests) { request in
            let handle = TransactionHandle(bounds: bounds)
            handle.txn = parent.txn
            // The shared transaction is the parent's to commit or abort, never a request's.
            defer { handle.txn = nil }
            let threw: Bool
            do {
                try request.body(WriteTransaction(handle: handle, path: path))
                threw = false
            } catch {
                threw = true
            }
            handle.closeCursors()
            if handle.sawMapFull {
                outcome = .mapFull
                return false
            }
            if threw {
                outcome = .threw
                return false
            }
            request.error = nil
            return true
        }
        return outcome
    }

    /// Commits a top-level write transaction. Returns false when LMDB reported MDB_MAP_FULL.
    private func commit(_ handle: TransactionHandle) throws(LMDBError) -> Bool {
        handle.closeCursors()
        let rc = mdb_txn_commit(handle.txn)
        handle.txn = nil
        gate.leave()
        if rc == MDB_MAP_FULL { return false }
        try check(rc, "mdb_txn_commit", path)
        return true
    }

    /// Aborts a top-level write transaction if it is still open.
    private func abort(_ handle: TransactionHandle) {
        guard let txn = handle.txn else { return }
        handle.closeCursors()
        mdb_txn_abort(txn)
        handle.txn = nil
        gate.leave()
    }

    /// Begins a top-level write transaction.
    /// - Throws: ``ResizeRefusal`` when another process grew the map and this thread, inside
    ///   a read transaction, cannot wait to adopt the new size; ``LMDBError`` otherwise.
    private func beginWrite(_ handle: TransactionHandle) throws {
        while true {
            try checkMapped("begin write transaction")
            gate.enter()
            if lifecycle.isClosed {
                gate.leave()
                throw lifecycle.closedError(path, "begin write transaction")
            }
            var txn: OpaquePointer?
            let rc = mdb_txn_begin(env, nil, 0, &txn)
            if rc == 0 {
                handle.txn = txn
                return
            }
            gate.leave()
            if rc == MDB_MAP_RESIZED {
                guard try adoptResizedMap() else { throw ResizeRefusal(error: refusal(code: .mapResized, "another process grew the map")) }
                continue
            }
            throw LMDBError(code: .init(rawValue: rc), operation: "begin write transaction", path: path)
        }
    }

    // MARK: Map size

    /// The error of a write that cannot go on because the map must be resized while its
    /// caller's thread is inside a read transaction of this process.
    private func refusal(code: LMDBError.Code, _ why: String) -> LMDBError {
        LMDBError(code: code, operation: "write", path: path,
                  detail: "\(why) and a resize waits for every transaction of this process to end, but this write was started inside a read; run the write outside the read closure")
    }

    /// Doubles the map once no transaction of this process is open (LMDB rule 2). While it
    /// waits, writes queued by threads inside a read are refused: they would wait for the
    /// resize, and the resize for their reads.
    /// - Throws: ``ResizeRefusal`` when this thread itself is inside a read transaction;
    ///   ``LMDBError``: `mapLimit` when the map reached `maximumMapSize`, or the error of
    ///   `mdb_env_set_mapsize`.
    private func growMap() throws {
        let refused = refusal(code: .mapFull, "the map is full")
        let grown: Void? = try gate.exclusive(whileWaiting: { [queue] isHolder in
            queue.refuse(where: isHolder, error: refused)
        }) { () throws(LMDBError) in
            var info = MDB_envinfo()
            mdb_env_info(env, &info)
            let current = info.me_mapsize
            guard current < configuration.maximumMapSize else {
                throw LMDBError(code: .mapLimit, operation: "grow map", path: path,
                                detail: "the map reached maximumMapSize (\(configuration.maximumMapSize) bytes); raise it")
            }
            let next = min(configuration.maximumMapSize, current * 2)
            // LMDB unmaps the file before mapping it at the new size, and a failed mapping
            // leaves the environment without a map. Whether the process can map that much
            // is found out first (with the old map still in place, so conservatively).
            guard Self.canMap(next) else {
                throw LMDBError(code: .mapLimit, operation: "grow map", path: path,
                                detail: "this process cannot map \(next) bytes (its address space is limited: ulimit -v, a container, the platform); the store stays usable at \(current) bytes: write less in one transaction, or raise the limit")
            }
            try setMapSize(next, "mdb_env_set_mapsize")
        }
        if grown == nil { throw ResizeRefusal(error: refused) }
    }

    /// Another process grew the map: adopt its size (`mdb_env_set_mapsize(env, 0)`) once no
    /// transaction of this process is open, refusing meanwhile the writes queued by threads
    /// inside a read. Returns false, adopting nothing, when this thread is inside a transaction.
    func adoptResizedMap() throws(LMDBError) -> Bool {
        let refused = refusal(code: .mapResized, "another process grew the map")
        return try gate.exclusive(whileWaiting: { [queue] isHolder in
            queue.refuse(where: isHolder, error: refused)
        }) { () throws(LMDBError) in
            try setMapSize(0, "mdb_env_set_mapsize(0)")
        } != nil
    }

    /// `mdb_env_set_mapsize`; a failure marks the environment unmapped (see ``unmapped``).
    private func setMapSize(_ size: Int, _ operation: String) throws(LMDBError) {
        let rc = mdb_env_set_mapsize(env, size)
        guard rc == 0 else {
            unmapped.store(true, ordering: .releasing)
            throw LMDBError(code: .mapLost, operation: operation, path: path,
                            detail: "resizing the map failed (\(String(cString: mdb_strerror(rc)))); close every store of this directory in this process and open it again")
        }
        bounds.locate(env)   // LMDB mapped the file again, perhaps elsewhere
    }

    /// Throws ``LMDBError/Code/mapLost`` once a resize left the environment without a map.
    @inline(__always)
    func checkMapped(_ operation: @autoclosure () -> String) throws(LMDBError) {
        if lifecycle.isClosed { throw lifecycle.closedError(path, operation()) }
        if unmapped.load(ordering: .acquiring) {
            throw LMDBError(code: .mapLost, operation: operation(), path: path,
                            detail: "a resize of the map failed earlier; close every store of this directory in this process and open it again")
        }
    }

    /// Whether `size` bytes of address space can be mapped now (reserved without access or
    /// memory, then released).
    private static func canMap(_ size: Int) -> Bool {
        guard let probe = mmap(nil, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0), probe != MAP_FAILED else { return false }
        munmap(probe, size)
        return true
    }

    // MARK: Maintenance and statistics

    /// Clears reader slots of dead processes (`mdb_reader_check`). Returns how many were cleared.
    @discardableResult
    public func clearStaleReaders() -> Int {
        if unmapped.load(ordering: .acquiring) || lifecycle.isClosed { return 0 }
        var dead: Int32 = 0
        mdb_reader_check(env, &dead)
        return Int(dead)
    }

    /// Map and reader figures of the environment.
    public func info() -> EnvironmentInfo {
        if unmapped.load(ordering: .acquiring) || lifecycle.isClosed {
            return EnvironmentInfo(mapSize: 0, pageSize: 0, usedPages: 0, lastTransactionID: 0, maxReaders: configuration.maxReaders, readersInUse: 0)
        }
        var info = MDB_envinfo()
        mdb_env_info(env, &info)
        var stat = MDB_stat()
        mdb_env_stat(env, &stat)
        return EnvironmentInfo(mapSize: info.me_mapsize, pageSize: Int(stat.ms_psize),
                               usedPages: Int(info.me_last_pgno) + 1, lastTransactionID: Int(info.me_last_txnid),
                               maxReaders: Int(info.me_maxreaders), readersInUse: Int(info.me_numreaders))
    }

    /// The identity of the data file: its inode number and birth time (`statx` of LMDB's file
    /// handle on Linux, `fstat` elsewhere). A copy of the environment (a restored backup, a
    /// copied directory) is a new file, born when it was copied, so it has another identity,
    /// even when it reuses a deleted file's inode number. The file keeps its identity when it
    /// is renamed or moved within its file system, and across reboots and mounts (the device
    /// number, which can change at a mount, is left out).
    /// - Throws: ``LMDBError`` with the `errno` of a failed `statx`/`fstat`.
    public func dataFileIdentity() throws(LMDBError) -> FileIdentity {
        if lifecycle.isClosed { throw lifecycle.closedError(path, "mdb_env_get_fd") }
        var handle: mdb_filehandle_t = -1
        try check(mdb_env_get_fd(env, &handle), "mdb_env_get_fd", path)
        var inode: UInt64 = 0, seconds: Int64 = 0, nanoseconds: UInt32 = 0
        guard stash_file_identity(handle, &inode, &seconds, &nanoseconds) == 0 else {
            throw LMDBError(code: .init(rawValue: errno), operation: "statx of data.mdb", path: path)
        }
        return FileIdentity(inode: inode, birth: seconds == 0 && nanoseconds == 0 ? nil : (seconds, nanoseconds))
    }

    /// The identity of `data.mdb` in `directory` (see ``dataFileIdentity()``), read without
    /// opening the environment; nil when there is none.
    public static func dataFileIdentity(in directory: String) -> FileIdentity? {
        let fd = Foundation.open((directory as NSString).appendingPathComponent("data.mdb"), O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var inode: UInt64 = 0, seconds: Int64 = 0, nanoseconds: UInt32 = 0
        guard stash_file_identity(fd, &inode, &seconds, &nanoseconds) == 0 else { return nil }
        return FileIdentity(inode: inode, birth: seconds == 0 && nanoseconds == 0 ? nil : (seconds, nanoseconds))
    }

    /// Forces a flush to disk; useful after writes with ``Durability/relaxed`` or ``Durability/none``.
    /// A read-only environment has nothing of its own to flush: free.
    public func sync() throws(LMDBError) {
        if isReadOnly { return }
        try checkMapped("mdb_env_sync")
        try check(mdb_env_sync(env, 1), "mdb_env_sync", path)
    }
}

/// Which file an environment's data is (see ``Environment/dataFileIdentity()``).
public struct FileIdentity: Hashable, Sendable {
    public let inode: UInt64
    /// Seconds and nanoseconds since 1970 when the file was created; 0, 0 when the file
    /// system does not record it.
    public let birthSeconds: Int64
    public let birthNanoseconds: UInt32

    public init(inode: UInt64, birth: (seconds: Int64, nanoseconds: UInt32)?) {
        self.inode = inode
        birthSeconds = birth?.seconds ?? 0
        birthNanoseconds = birth?.nanoseconds ?? 0
    }

    /// True when the birth time is known.
    public var hasBirth: Bool { birthSeconds != 0 || birthNanoseconds != 0 }

    /// Whether `other` can be the same file: the same inode, and the same birth time when
    /// both know it (a process whose `statx` is refused, in a sandbox, sees no birth time).
    public func isSameFile(as other: FileIdentity) -> Bool {
        inode == other.inode && (!hasBirth || !other.hasBirth || (birthSeconds, birthNanoseconds) == (other.birthSeconds, other.birthNanoseconds))
    }
}

/// Figures from `mdb_env_info` and `mdb_env_stat`.
public struct EnvironmentInfo: Sendable {
    public let mapSize: Int
    public let pageSize: Int
    public let usedPages: Int
    public let lastTransactionID: Int
    public let maxReaders: Int
    /// Reader slots ever claimed in the lock file (LMDB's `me_numreaders`: a high-water mark
    /// across processes, not the readers open right now).
    public let readersInUse: Int
    /// Bytes of the map in use (up to the last page written).
    public var usedBytes: Int { usedPages * pageSize }
}

/// Counts this process's open transactions, so the map can be resized when none is open.
///
/// It also knows which threads hold a transaction: such a thread never waits for a resize
/// (the resize waits for its transaction: both would wait forever). A nested transaction
/// on that thread goes ahead, and a resize asked for from it does not happen
/// (``exclusive(whileWaiting:_:)`` returns nil).
final class TransactionGate: @unchecked Sendable {
    private let condition = NSCondition()
    // Read and written under `condition` only, so the runtime's exclusivity checks (two per
    // property access, on every transaction) are left out.
    @exclusivity(unchecked) private var active = 0
    @exclusivity(unchecked) private var resizing = false
    /// The threads that hold open transactions, and how many each: a short list (one entry
    /// per thread inside a transaction), scanned rather than hashed, which costs a few
    /// comparisons instead of a hash per lookup on every transaction.
    @exclusivity(unchecked) private var holders: [(thread: UInt, count: Int)] = []

    init() { holders.reserveCapacity(16) }

    private func holderIndex(_ thread: UInt) -> Int? {
        holders.firstIndex { $0.thread == thread }
    }

    /// Whether the calling thread holds a transaction (see ``exclusive(whileWaiting:_:)``).
    var isHeldByCurrentThread: Bool {
        condition.lock()
        defer { condition.unlock() }
        return holderIndex(currentThreadID()) != nil
    }

    /// Counts the calling thread as holding a transaction until ``leave()``. A thread that
    /// holds none waits for a resize in progress first, unless `joining`: it holds, on this
    /// thread, the transaction another thread of this process opened and handed to it (a
    /// grouped write closure runs on its caller's thread), which the resize waits for already.
    func enter(joining: Bool = false) {
        let me = currentThreadID()
        condition.lock()
        if let i = holderIndex(me) {
            holders[i].count += 1
        } else {
            while resizing && !joining { condition.wait() }
            holders.append((me, 1))
        }
        active += 1
        condition.unlock()
    }

    func leave() {
        let me = currentThreadID()
        condition.lock()
        active -= 1
        if let i = holderIndex(me) {
            if holders[i].count > 1 {
                holders[i].count -= 1
            } else {
                holders.swapAt(i, holders.count - 1)
                holders.removeLast()
            }
        }
        if active == 0 { condition.broadcast() }
        condition.unlock()
    }

    /// Runs `body` once no transaction of this process is open, and returns its result; returns
    /// nil without running it when the calling thread itself holds a transaction (it would wait
    /// for itself).
    ///
    /// While it waits, every 2 ms `whileWaiting` gets a test of "this thread holds a
    /// transaction" (under the gate's lock: it must not enter the gate), so the caller can
    /// release threads that hold a transaction and wait for this resize.
    func exclusive<R>(whileWaiting: ((UInt) -> Bool) -> Void, _ body: () throws(LMDBError) -> R) throws(LMDBError) -> R? {
        condition.lock()
        if holderIndex(currentThreadID()) != nil {
            condition.unlock()
            return nil
        }
        while resizing { condition.wait() }
        resizing = true
        while active > 0 {
            if !condition.wait(until: Date(timeIntervalSinceNow: 0.002)), active > 0 {
                whileWaiting { thread in holderIndex(thread) != nil }
            }
        }
        condition.unlock()
        defer {
            condition.lock()
            resizing = false
            condition.broadcast()
            condition.unlock()
        }
        return try body()
    }
}

/// A map resize this thread cannot wait for: it holds a read transaction, which the resize
/// waits for. Carries the error its own write gets.
struct ResizeRefusal: Error {
    let error: LMDBError
}

/// The process's single-writer lock, which knows its owner thread to report nested writes.
final class WriterLock: @unchecked Sendable {
    private let mutex = NSLock()
    private let owner = Atomic<UInt>(0)

    /// The thread running a write closure (the leader's or a grouped caller's), 0 if none:
    /// one closure runs at a time.
    private let runner = Atomic<UInt>(0)

    func lock(path: String) throws(LMDBError) {
        try refuseNested(path: path)
        mutex.lock()
        owner.store(currentThreadID(), ordering: .releasing)
    }

    /// Notes that the calling thread runs a write closure, until ``closureEnded()``.
    func runClosure() {
        runner.store(currentThreadID(), ordering: .releasing)
    }

    func closureEnded() {
        runner.store(0, ordering: .releasing)
    }

    /// Throws ``LMDBError/Code/nestedWrite`` when the calling thread is running a write: it
    /// leads one, or runs its closure in one.
    func refuseNested(path: String) throws(LMDBError) {
        let me = currentThreadID()
        if owner.load(ordering: .acquiring) == me || runner.load(ordering: .acquiring) == me {
            throw LMDBError(code: .nestedWrite, operation: "write", path: path,
                            detail: "a write closure started another write on the same thread; do all the work in one write")
        }
    }

    func unlock() {
        owner.store(0, ordering: .releasing)
        mutex.unlock()
    }
}

/// Recycled read transaction handles (`mdb_txn_reset` / `mdb_txn_renew`).
final class ReaderPool: @unchecked Sendable {
    private let lock = NSLock()
    /// Under `lock` only: no runtime exclusivity check.
    @exclusivity(unchecked) private var idle: [TransactionHandle] = []
    /// Under `lock` only: set by ``close()``.
    @exclusivity(unchecked) private var closed = false
    /// How many idle handles (each keeping its reader slot) the pool keeps at most.
    let capacity: Int
    private let bounds: MapBounds

    init(capacity: Int, bounds: MapBounds) {
        self.capacity = capacity
        self.bounds = bounds
        idle.reserveCapacity(capacity)
    }

    func take() -> TransactionHandle {
        lock.lock()
        defer { lock.unlock() }
        return idle.popLast() ?? TransactionHandle(bounds: bounds)
    }

    func give(_ handle: TransactionHandle) {
        lock.lock()
        if closed {
            // The environment is closed: its transactions must not be touched (an abort would
            // reach freed memory). Dropped; LMDB freed their reader slots with it.
            lock.unlock()
            return
        }
        if idle.count < capacity {
            idle.append(handle)
            lock.unlock()
        } else {
            lock.unlock()
            handle.release()
        }
    }

    func drain() {
        lock.lock()
        let all = idle
        idle.removeAll()
        lock.unlock()
        for handle in all { handle.release() }
    }

    /// Drains the pool for good, before the environment closes: handles given back later
    /// are dropped unreleased (see ``give(_:)``).
    func close() {
        drain()
        lock.lock()
        closed = true
        lock.unlock()
    }
}

/// The process-wide registry of open environments, keyed by canonical path (rule 4).
final class EnvironmentRegistry: @unchecked Sendable {
    static let shared = EnvironmentRegistry()
    /// A directory's environment; none while it is being opened, or closed.
    private final class Entry { weak var environment: Environment? }
    private let condition = NSCondition()
    private var entries: [String: Entry] = [:]

    /// The live environment of `path`, or the one `make` opens. The lock is not held while
    /// `make` runs: an open waits for another process's write (its databases are opened in a
    /// write transaction), and meanwhile opens of other directories, and closes, go on. Opens
    /// of the same directory wait for it.
    func open(_ path: String, make: () throws(LMDBError) -> Environment) throws(LMDBError) -> Environment {
        condition.lock()
        while let entry = entries[path] {
            if let live = entry.environment {
                condition.unlock()
                return live
            }
            // Being opened by another thread, or its last reference is being released right
            // now: wait for that open or close to end.
            condition.wait()
        }
        let entry = Entry()
        entries[path] = entry
        condition.unlock()
        let environment: Environment
        do {
            environment = try make()
        } catch {
            condition.lock()
            entries[path] = nil
            condition.broadcast()
            condition.unlock()
            throw error
        }
        condition.lock()
        entry.environment = environment
        condition.broadcast()
        condition.unlock()
        return environment
    }

    /// Runs `body` while no environment of `path` is open in this process, holding opens of it
    /// back meanwhile; nil without running it when one is open.
    func whileClosed<R>(_ path: String, _ body: () throws -> R) rethrows -> R? {
        condition.lock()
        while let entry = entries[path] {
            if entry.environment != nil {
                condition.unlock()
                return nil
            }
            condition.wait()
        }
        entries[path] = Entry()
        condition.unlock()
        defer {
            condition.lock()
            entries[path] = nil
            condition.broadcast()
            condition.unlock()
        }
        return try body()
    }

    func close(_ path: String, _ body: () -> Void) {
        condition.lock()
        body()
        entries[path] = nil
        condition.broadcast()
        condition.unlock()
    }

    /// Closes `environment` while references to it remain (``Environment/releaseHandle()``):
    /// opens of its path wait from now until `body` (the close) has run, then open anew.
    func closeEarly(_ environment: Environment, _ body: () -> Void) {
        condition.lock()
        let entry = entries[environment.path]
        let ours = entry?.environment === environment
        if ours { entry?.environment = nil }   // opens of the path wait for the close
        condition.unlock()
        body()
        condition.lock()
        if ours { entries[environment.path] = nil }
        condition.broadcast()
        condition.unlock()
    }
}

@inline(__always)
private func currentThreadID() -> UInt {
    #if canImport(Glibc)
    return UInt(pthread_self())
    #else
    return UInt(bitPattern: pthread_self())
    #endif
}
