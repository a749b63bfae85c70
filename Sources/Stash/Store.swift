import Foundation
import StashLMDB
import Synchronization

/// Options for opening a ``Store``.
public struct StoreOptions: Sendable {
    /// Commit durability (see ``Durability``). Default `.full`. Opening a directory that this
    /// process already has open shares its environment: commits then have the strongest
    /// durability any of the opens asked for.
    public var durability: Durability = .full
    /// The first LMDB map size; it grows by itself. Default 64 MiB.
    public var initialMapSize: Int = 64 << 20
    /// Concurrent readers across processes. Default 126. A read that finds every reader slot
    /// taken throws ``StoreError`` (`.storage`, `MDB_READERS_FULL`) at once; it does not wait
    /// for a slot. Each process also keeps up to `min(8, maxReaders / 8)` idle slots (at
    /// least one) for its next reads.
    public var maxReaders: Int = 126
    /// Whether opening removes the stored indexes of a declared type that its declaration no
    /// longer lists. Default false: an undeclared index stays, and every writer keeps it
    /// exact, so a process (or an older version of the app) declaring fewer indexes never
    /// takes one away from the processes that count and query through it.
    ///
    /// Set it in the version of the app that stops declaring an index, to reclaim its space
    /// and its cost on writes. Other processes with the store open keep reading through
    /// their schema of the time until they reopen (a removed index then looks empty to
    /// them, counts through it answer 0), so remove indexes only when no other process
    /// still uses them. Indexes of types the declaration does not list are never removed.
    public var dropsUndeclaredIndexes = false
    /// Whether a declared plain index turns a stored unique one plain. Default false: the
    /// index stays unique, since an older version of the app (or an extension not updated
    /// yet, or a schema file without `"unique": true`) opening with the plain declaration
    /// would otherwise let duplicates in, and the newer version could then no longer open the
    /// store. Set it in the version of the app that stops requiring the values to be unique.
    public var relaxesUniqueIndexes = false
    /// Data migrations to run at open, in version order.
    public var migrations: [Migration] = []
    /// Reports long work at open (index backfill, migrations).
    public var progress: (@Sendable (StoreProgress) -> Void)?
    /// When false, opening a directory that holds no store throws ``StoreError/Code/notAStore``
    /// instead of creating one (what a command-line tool wants).
    public var createIfMissing = true
    /// Open without writing anything: the stored schema is used as is (declared types are
    /// not merged, migrations do not run), a copy keeps the site it was copied with, and
    /// every write throws ``StoreError/Code/readOnly``. For looking into a backup or another
    /// app's store without changing it. Never creates a store. Default false.
    ///
    /// Typed reads decode through the stored schema: a type, field, default or index declared
    /// after the store was last opened for writing is unknown to them (such reads throw; the
    /// generic API reads everything stored). The open does not wait for a write under way in
    /// another process, and works on a read-only file system or files this user cannot write.
    /// On files it can write, the open uses a writable LMDB environment and writes nothing;
    /// only where they cannot be written does it fall back to LMDB's `MDB_RDONLY` (`lock.mdb`
    /// must still be writable then, except on a read-only file system). A store in an older
    /// format, or lacking a database this version keeps, throws `.readOnly`: open it for
    /// writing once. Read-only and writable opens of one directory in one process share LMDB's
    /// environment, so a writable open next to a read-only one works, except while an
    /// `MDB_RDONLY` one lives (it throws `.readOnly`). Sync refuses a read-only store.
    public var readOnly = false
    /// The wall clock for version timestamps (hybrid logical clock). Tests inject one to
    /// simulate skewed devices. Default: the system clock.
    public var clock: @Sendable () -> Date = { Date() }

    public init() {}
}

/// Progress of long work: `done` of `total` items in `phase`.
public struct StoreProgress: Sendable, CustomStringConvertible {
    /// What is under way: `"migration 2 (Item)"`, or an index being built, `"index Item(homeID)"`.
    public let phase: String
    /// Records of `phase` done so far.
    public let done: Int
    /// Records of `phase` in all.
    public let total: Int
    public var description: String { "\(phase): \(done)/\(total)" }
}

/// A typed record store in one directory: records, secondary indexes, counts and change
/// history in one LMDB environment, all updated in one transaction per write.
///
/// ```swift
/// let store = try Store.open(at: "/data/inventory", types: [Home.self, Item.self])
/// try store.insert(home)
/// try store.write { tx in                     // one transaction
///     try tx.insert(Item(homeID: home.id, name: "Lamp"))
///     try tx.insert(Item(homeID: home.id, name: "Desk"))
/// }
/// let count = try store.count(Item.self, where: \.homeID, equals: home.id)     // O(1)
/// let lamps = try store.fetch(FetchDescriptor<Item>(predicate: #Predicate { $0.name == "Lamp" }))
/// ```
///
/// `Store` is `Sendable`: share one instance across tasks and threads. Opening the same
/// directory twice in a process shares one LMDB environment.
///
/// ## Topics
/// - Writing: ``write(author:isolation:_:)``, ``insert(_:)``, ``upsert(_:)``, ``update(_:)``, ``delete(_:id:)``
/// - Reading: ``read(_:)``, ``get(_:id:)``, ``fetch(_:)``, ``count(_:)``, ``count(_:where:equals:)``
/// - Queries: ``FetchDescriptor``, ``explain(_:)``
/// - Maintenance: ``verify()``, ``statistics()``, ``history(after:types:limit:)``
public final class Store: Sendable {
    /// The store directory (canonical path).
    public let path: String
    let env: Environment
    let dbs: StoreDatabases
    /// The newest catalog this process knows, and the read snapshot (LMDB transaction id) it
    /// was last confirmed for: a read at that snapshot uses it without looking (see
    /// ``catalog(for:)``); 0 when not confirmed for any.
    private let catalogBox: Mutex<(catalog: Catalog, confirmedAt: UInt64)>
    /// The counts this store's own recent commits left, once a reader asks for them.
    let recentCounts = RecentCounts()
    /// The history bounds of the newest committed state a read snapshot asked for (see
    /// ``historyBounds(snapshot:_:)``); the purge point nil when only the current entry was
    /// asked for (``currentSequence(snapshot:_:)``).
    let boundsOfSnapshot = Mutex<(snapshot: UInt64, current: HistoryToken, purgedThrough: HistoryToken?)?>(nil)
    /// The store's identity, made once at creation.
    public let storeID: RecordID
    /// This replica's site id (history records it as the origin), made at creation, and made
    /// anew when the store is opened from a copy of its data file (a restored backup, a copied
    /// directory): a copy is another replica. Another open (in this process or another) may
    /// take a new one after ``requestNewSite()``: the next write, and ``isNewSiteRequested()``,
    /// read the stored one, which this then returns.
    public var siteID: RecordID { currentSite.withLock { $0 } }
    /// The stored site id as last read (see ``siteID``).
    private let currentSite: Mutex<RecordID>
    /// The replicas this store was copied from, oldest first: one entry each time it was
    /// opened from a copy of a data file (a restored backup, a copied directory), naming the
    /// site the file had. Empty for a store never copied.
    public let copiedFrom: [CopyOrigin]
    /// The wall clock used for versions.
    let now: @Sendable () -> Date
    /// The user's sync preference as it was when this store was opened (default on).
    /// Changing it with ``setSyncPreference(_:)`` takes effect at the next open, so a running
    /// app never starts or stops syncing halfway through a session.
    public let syncPreferenceAtOpen: Bool
    /// Opened with ``StoreOptions/readOnly``: every write throws.
    public let isReadOnly: Bool
    /// Unique indexes ("Type.index") this process declared plain and the open kept unique.
    let keptUniqueIndexes: Set<String>
    /// The types of this open's declaration whose fields are learned from the values written
    /// (a ``Record`` type the open cannot probe, a declared type listing no fields): for them
    /// ``StoreTransaction/put(_:replacing:)`` adds a field the stored schema lacks instead of
    /// refusing it. A store opened without declaring a type refuses such fields of it.
    let typesLearningFields: Set<String>
    /// The Swift types of this open's declaration, by record type name: a merge checks that
    /// what it writes reads back through them (``WriteContext``).
    let recordTypes: [String: any Record.Type]
    /// Whether the store is closed, its async work in flight, the live queries following its
    /// commits (``close()``, ``observe(_:pollInterval:)``).
    let runtime: StoreRuntime

    var catalog: Catalog { catalogBox.withLock { $0.catalog } }

    /// The stored schema as of the last transaction this process saw.
    public var schema: StoreSchema { catalog.schema }

    func publish(_ catalog: Catalog) {
        catalogBox.withLock { current in
            if catalog.generation > current.catalog.generation { current = (catalog, 0) }
        }
    }

    /// The catalog of the schema `txn` sees. Another process may have changed the schema
    /// (dropped an index, changed a default): the stored generation is read once per new
    /// snapshot, so reads between commits pay one lock and a comparison.
    func catalog(for txn: ReadTransaction) throws -> Catalog {
        let snapshot = txn.snapshotID
        let (current, confirmedAt) = catalogBox.withLock { $0 }
        if snapshot == confirmedAt { return current }
        let generation = try txn.uint64(dbs.meta, key: MetaKey.schemaGeneration) ?? 0
        if generation == current.generation {
            catalogBox.withLock { box in
                if box.catalog === current && snapshot > box.confirmedAt { box.confirmedAt = snapshot }
            }
            return current
        }
        let fresh = Catalog(schema: try SchemaMerger.loadSchema(txn, dbs, path) ?? StoreSchema(), generation: generation,
                            carried: try CarriedSchema.load(txn, dbs, path))
        let site = try storedSite(txn)   // a new site comes with a new generation
        let newer = catalogBox.withLock { box in
            guard generation > box.catalog.generation else { return false }
            box = (fresh, snapshot)
            return true
        }
        // Not from an older snapshot than the newest seen: that would bring an old site back.
        if newer { currentSite.withLock { $0 = site } }
        return fresh
    }

    // MARK: Opening

    /// Opens (or creates) the store in directory `path` for the given record types.
    ///
    /// The types' declared fields and indexes are merged into the stored schema: new fields
    /// and types are added, new indexes are built from existing records (with progress), an
    /// index declared unique now is rebuilt as such (a unique one declared plain stays unique
    /// unless `options.relaxesUniqueIndexes`), and `options.migrations` newer than the
    /// stored version run. Stored indexes a declared type no longer lists stay (and stay
    /// exact) unless `options.dropsUndeclaredIndexes` asks for their removal.
    /// All of it happens in one write transaction: on error nothing changes.
    /// - Throws: ``StoreError`` with `.incompatibleSchema` naming type and field when a field
    ///   changed kind without a migration, or when an index names a key path that is not a
    ///   stored field (a computed property, a nested path, a renamed coding key);
    ///   `.uniqueViolation` when a new unique index finds duplicates; `.notAStore`; `.storage`
    ///   for LMDB errors (permissions, disk); `.incompatibleSchema` when two of `types` share one
    ///   ``Record/recordType`` (two types named `Item` in different enclosing types or modules:
    ///   the default name is the short one), whose records would mix; `.readOnly` for a
    ///   read-only open of a store that must be upgraded or migrated first, or an open for
    ///   writing of a directory this process has open read-only.
    public static func open(at path: String, types: [any Record.Type] = [], options: StoreOptions = StoreOptions()) throws -> Store {
        var named: [String: any Record.Type] = [:]
        var distinct: [any Record.Type] = []
        for type in types {
            let name = type.recordType
            if let other = named[name] {
                guard other == type else {
                    throw StoreError(.incompatibleSchema, "store \(path): \(String(reflecting: other)) and \(String(reflecting: type)) are both record type '\(name)' (the default recordType is a type's name without what encloses it), so their records would mix in one type; give one of them its own name with `static var recordType: String`")
                }
                continue   // the same type listed twice declares it once
            }
            named[name] = type
            distinct.append(type)
        }
        return try open(at: path, declaration: SchemaDeclaration(types: distinct.map { try $0.declaration(in: path) }), options: options,
                        recordTypes: named)
    }

    /// Opens (or creates) the store in `path` with a schema declared as data (the command
    /// line's `--schema` file). See ``open(at:types:options:)``.
    public static func open(at path: String, declaration: SchemaDeclaration, options: StoreOptions = StoreOptions()) throws -> Store {
        try open(at: path, declaration: declaration, options: options, recordTypes: [:])
    }

    private static func open(at path: String, declaration: SchemaDeclaration, options: StoreOptions,
                             recordTypes: [String: any Record.Type]) throws -> Store {
        var isDirectory: ObjCBool = false
        let exists = FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory)
        if exists && !isDirectory.boolValue {
            throw StoreError(.notAStore, "\(path) is a file; a store is a directory")
        }
        // Refused before any file is made or changed, so that a bad declaration leaves nothing behind.
        try declaration.refuseMalformed(in: path)
        let dataSize = (try? FileManager.default.attributesOfItem(atPath: (path as NSString).appendingPathComponent("data.mdb")))?[.size] as? Int
        if !options.createIfMissing || options.readOnly {
            // An empty data.mdb is no store either: LMDB would write a new environment into it.
            guard let dataSize, dataSize > 0 else {
                throw StoreError(.notAStore, "no store in \(path) (\(dataSize == nil ? "no data.mdb" : "its data.mdb is empty")); create one with `stash init \(path) --schema FILE`; nothing was changed")
            }
        }
        // An open that fails while making the store leaves nothing behind (a full disk, say):
        // no half-made store, no stray lock file (``Environment/removeUnfinished(at:removingDirectory:)``
        // removes nothing another open uses).
        let creating = !options.readOnly && (dataSize ?? 0) == 0
        do {
            return try openEnvironment(at: path, declaration: declaration, options: options, recordTypes: recordTypes)
        } catch {
            if creating { Environment.removeUnfinished(at: path, removingDirectory: !exists) }
            throw error
        }
    }

    private static func openEnvironment(at path: String, declaration: SchemaDeclaration, options: StoreOptions,
                                        recordTypes: [String: any Record.Type]) throws -> Store {
        var config = EnvironmentConfiguration(databases: StoreDatabases.specs, durability: options.durability)
        config.initialMapSize = options.initialMapSize
        config.maxReaders = options.maxReaders
        config.refusesForeignData = true
        config.readOnly = options.readOnly
        let env: Environment
        do { env = try Environment.open(path: path, configuration: config) }
        catch where error.code == .foreignData {
            throw StoreError(.notAStore, "\(path) holds another program's LMDB data, not a Stash store: \(error)", underlying: error)
        }
        catch where error.code == .readOnly {
            throw StoreError(.readOnly, "store \(path) is open in this process by read-only Store values whose LMDB environment is read-only (its files could not be written when they opened it); release them before opening it for writing",
                             underlying: error)
        }
        catch where options.readOnly && error.code == .notFound && error.operation == "mdb_dbi_open meta" {
            throw StoreError(.notAStore, "no Stash store in \(path): its LMDB data holds no meta database; nothing was changed", underlying: error)
        }
        catch where options.readOnly && error.code == .notFound {
            throw StoreError(.readOnly, "store \(path) lacks a database this version of Stash keeps and cannot be read read-only; open it once for writing: \(error)",
                             underlying: error)
        }
        catch where error.code == .noSpace {
            throw StoreError(.noSpace, "cannot open store \(path): no space left on device (\(error.operation)): \(error.detail ?? "free some space, then try again")", underlying: error)
        }
        catch where error.code == .damaged {
            throw StoreError(.corrupted, "store \(path) is damaged: \(error.detail ?? "\(error)")", underlying: error)
        }
        catch where error.code == .corrupted {
            throw StoreError(.corrupted, "cannot open store \(path): \(error)", underlying: error)
        }
        catch { throw StoreError(.storage, "cannot open store \(path): \(error)", underlying: error) }
        // A handle for this store, given back at `close()` or when it goes away. An
        // environment closing just now (its last store was closed) is opened anew: the open
        // then waits for the close (the window in which the closing one is still handed out is
        // a few instructions long, so this recursion is shallow).
        guard env.retainHandle() else {
            sched_yield()
            return try open(at: path, declaration: declaration, options: options, recordTypes: recordTypes)
        }
        var handed = false
        defer { if !handed { env.releaseHandle() } }
        let dbs: StoreDatabases
        do { dbs = try StoreDatabases(env) }
        catch { throw StoreError(.storage, "cannot open store \(path): \(error)", underlying: error) }
        let opened = try storageErrors(env.path) {
            if options.readOnly { return try env.read { txn in try SchemaMerger.inspect(txn, dbs, env.path, migrations: options.migrations) } }
            try ChecksumUpgrade.runIfNeeded(env, dbs, progress: options.progress)
            let dataFile = try env.dataFileIdentity()
            return try env.write { txn in
                try SchemaMerger(path: env.path, txn: txn, dbs: dbs, options: options, dataFile: dataFile).run(declaration)
            }
        }
        handed = true
        return Store(path: env.path, env: env, dbs: dbs, opened: opened, now: options.clock, readOnly: options.readOnly,
                     typesLearningFields: Set(declaration.types.filter(\.learnsFields).map(\.name)), recordTypes: recordTypes)
    }

    private init(path: String, env: Environment, dbs: StoreDatabases, opened: SchemaMerger.Result, now: @escaping @Sendable () -> Date,
                 readOnly: Bool, typesLearningFields: Set<String>, recordTypes: [String: any Record.Type]) {
        self.recordTypes = recordTypes
        self.isReadOnly = readOnly
        self.keptUniqueIndexes = opened.keptUniqueIndexes
        self.typesLearningFields = typesLearningFields
        self.now = now
        self.path = path
        self.env = env
        self.dbs = dbs
        self.storeID = opened.storeID
        self.currentSite = Mutex(opened.siteID)
        self.copiedFrom = opened.copiedFrom
        self.syncPreferenceAtOpen = opened.syncPreference
        self.catalogBox = Mutex((opened.catalog, 0))
        self.runtime = StoreRuntime(path: path)
    }

    deinit {
        // The environment's handle, unless `close()` gave it back.
        if runtime.markClosed() { env.releaseHandle() }
    }

    /// The site id stored in `txn`'s state. Another open may take a new one after
    /// ``requestNewSite()``, and writing as the old one would be writing as the replica it was
    /// found to share its site with: the catalog reads it into ``siteID`` when the schema
    /// generation moves, which such an open makes it do.
    func storedSite(_ txn: some TransactionReading) throws -> RecordID {
        try SchemaMerger.storedID(MetaKey.siteID, txn, dbs, path)
    }

    // MARK: Transactions

    /// Runs `body` in one write transaction: every record, index, count and the history entry
    /// it produces commit together when `body` returns, or not at all when it throws.
    ///
    /// `body` may run more than once (when the map grows, or when another write of its group
    /// commit throws), so it must only change the store. Writes from several threads are
    /// serialized, and those that queue behind a commit are committed together (group
    /// commit): `body` then runs in the group's transaction, sees the writes before it in the
    /// group, and rolls back alone when it throws. It still runs in its caller's task, so
    /// `@TaskLocal` values, `Task.isCancelled` and `Task.checkCancellation()` inside it are
    /// the caller's, and an actor-isolated closure runs on its actor. (A caller outside any
    /// task, a plain `Thread` or a Dispatch queue, may have its closure run on another
    /// writer's thread: it must not rely on thread-local state.) The call returns once its
    /// changes are durable (at the store's ``Durability``). In an `async` function Swift picks
    /// the async `write`, which needs `await`; pass `isolation: #isolation` to block there.
    /// - Parameters:
    ///   - author: recorded in the history entry (like Core Data's transaction author).
    ///   - isolation: the caller's actor, filled in by the compiler.
    public func write<R>(author: String? = nil, isolation: isolated (any Actor)? = #isolation,
                         _ body: (StoreTransaction) throws -> R) throws -> R {
        try checkOpen()
        return try performWrite(author: author, isolation: isolation, body)
    }

    /// ``write(author:isolation:_:)`` without the check that the store is open (the async
    /// write runs it for calls made before ``close()``).
    func performWrite<R>(author: String?, isolation: isolated (any Actor)? = #isolation,
                         _ body: (StoreTransaction) throws -> R) throws -> R {
        if isReadOnly {
            throw StoreError(.readOnly, "store \(path) was opened read-only (StoreOptions.readOnly); open it again without it to write")
        }
        var changedCatalog: Catalog?
        var afterCommit: [() -> Void] = []
        let result = try storageErrors(path) {
            try env.write(isolation: isolation) { txn in
                let context = try WriteContext(store: self, txn: txn, author: author)
                let result = try body(StoreTransaction(context: context, store: self))
                try context.finish()
                changedCatalog = context.changedCatalog
                afterCommit = context.afterCommitActions
                return result
            }
        }
        if let changedCatalog { publish(changedCatalog) }
        for action in afterCommit { action() }
        runtime.committed()
        return result
    }

    /// Runs `body` on a consistent read-only snapshot of the store.
    ///
    /// Keep writes out of `body`: a write started inside a read works until the map must grow,
    /// and then throws ``StoreError`` (`.storage`, `MDB_MAP_FULL`) instead of growing it, since
    /// the growth waits for every transaction of the process to end, this read included.
    ///
    /// In an `async` function Swift picks the async `read`, which needs `await`; pass
    /// `isolation: #isolation` to run this synchronous one there (on a thread meant to block,
    /// say). The same goes for ``write(author:isolation:_:)``.
    /// - Parameter isolation: the caller's actor, filled in by the compiler.
    public func read<R>(isolation: isolated (any Actor)? = #isolation, _ body: (StoreSnapshot) throws -> R) throws -> R {
        try checkOpen()
        return try performRead(body)
    }

    /// ``read(_:)`` without the check that the store is open.
    func performRead<R>(_ body: (StoreSnapshot) throws -> R) throws -> R {
        try storageErrors(path) {
            try env.read { txn in try body(StoreSnapshot(store: self, txn: txn, catalog: try catalog(for: txn))) }
        }
    }

    /// Re-reads the schema from the store (after another process changed it).
    ///
    /// Only what a read snapshot sees is published to the whole process: a write transaction
    /// may see a schema that is not committed (saved by an earlier writer of its group
    /// commit), and that schema must not outlive a group that fails. A write publishes its own
    /// schema after its commit (see ``write(author:isolation:_:)``).
    func reloadCatalog<T: TransactionReading>(_ txn: T) throws -> Catalog {
        if let read = txn as? ReadTransaction { return try catalog(for: read) }
        let generation = try txn.uint64(dbs.meta, key: MetaKey.schemaGeneration) ?? 0
        let current = catalog
        if generation == current.generation { return current }
        // A write transaction sees the newest state: its site is current.
        let site = try storedSite(txn)
        currentSite.withLock { $0 = site }
        return Catalog(schema: try SchemaMerger.loadSchema(txn, dbs, path) ?? StoreSchema(), generation: generation,
                       carried: try CarriedSchema.load(txn, dbs, path))
    }

    // MARK: Statistics

    /// Types, counts, index sizes, map use and LMDB figures.
    public func statistics() throws -> StoreStatistics {
        try read { snapshot in
            let txn = snapshot.txn
            let catalog = try reloadCatalog(txn)
            var types: [StoreStatistics.TypeStatistics] = []
            for type in catalog.schema.types {
                var indexes: [StoreStatistics.IndexStatistics] = []
                for index in type.indexes {
                    var entries = 0, keys = 0
                    try txn.forEachKeyWithCount(dbs.index, prefix: StoreKeys.indexPrefix(type.tag, index.tag)) { _, count in
                        entries += count
                        keys += 1
                        return true
                    }
                    indexes.append(.init(name: index.name, fields: index.fields, unique: index.unique, entries: entries, distinctKeys: keys))
                }
                types.append(.init(name: type.name, count: try snapshot.count(typeNamed: type.name), fields: type.fields.count,
                                   localOnly: type.localOnly, indexes: indexes))
            }
            let info = env.info()
            var databases: [String: DatabaseStatistics] = [:]
            for db in [dbs.records, dbs.index, dbs.counts, dbs.history, dbs.meta] {
                databases[db.name] = try txn.statistics(db)
            }
            let fileSize = (try? FileManager.default.attributesOfItem(atPath: (path as NSString).appendingPathComponent("data.mdb"))[.size] as? Int) ?? 0
            return StoreStatistics(path: path, storeID: storeID, siteID: siteID, schemaVersion: catalog.schema.version,
                                   types: types, mapSize: info.mapSize, mapUsed: info.usedBytes, fileSize: fileSize,
                                   pageSize: info.pageSize, readersInUse: info.readersInUse, maxReaders: info.maxReaders,
                                   historyEntries: databases["history"]?.entries ?? 0, historyBytes: databases["history"]?.bytes ?? 0,
                                   databases: databases)
        }
    }
}

/// What ``Store/statistics()`` reports.
public struct StoreStatistics: Sendable, Codable {
    /// One stored index.
    public struct IndexStatistics: Sendable, Codable {
        /// Its fields joined by `+`.
        public let name: String
        public let fields: [String]
        public let unique: Bool
        /// Index entries: one per record of the type.
        public let entries: Int
        /// Distinct keys: the distinct values, except that long strings and bytes are keyed
        /// by a prefix.
        public let distinctKeys: Int
    }
    /// One type of the stored schema.
    public struct TypeStatistics: Sendable, Codable {
        public let name: String
        /// Records of the type.
        public let count: Int
        /// Fields in the stored schema, dropped ones included.
        public let fields: Int
        public let localOnly: Bool
        public let indexes: [IndexStatistics]
    }
    /// The store directory.
    public let path: String
    public let storeID: RecordID
    public let siteID: RecordID
    /// The version reached by migrations (``StoreSchema/version``).
    public let schemaVersion: Int
    public let types: [TypeStatistics]
    /// LMDB's map size in bytes (it grows by itself).
    public let mapSize: Int
    /// Bytes of the map in use, up to the last page written.
    public let mapUsed: Int
    /// The size of `data.mdb` in bytes (0 when it cannot be read).
    public let fileSize: Int
    public let pageSize: Int
    /// Reader slots in use, across processes.
    public let readersInUse: Int
    public let maxReaders: Int
    /// Entries in the history database (those purges left).
    public let historyEntries: Int
    /// Bytes of pages the history database occupies.
    public let historyBytes: Int
    /// LMDB's figures for each database by name (records, index, counts, history, meta).
    public let databases: [String: DatabaseStatistics]
}

/// Wraps LMDB errors into ``StoreError/Code/storage`` with the store path (a nested write
/// into `.nestedWrite`, a key over LMDB's limit into `.invalidValue`: the caller's doing, not
/// the disk's; a full file system into `.noSpace`; damage LMDB or StashLMDB found into
/// `.corrupted`); lets ``StoreError`` and everything else through unchanged.
func storageErrors<R>(_ path: String, _ body: () throws -> R) throws -> R {
    do {
        return try body()
    } catch let error as LMDBError {
        switch error.code {
        case .nestedWrite:
            throw StoreError(.nestedWrite, "store \(path): a nested write (started inside another write on this thread, it would wait for itself); do the work in the outer write's transaction", underlying: error)
        case .keyTooLong:
            throw StoreError(.invalidValue, "store \(path): \(error.message(naming: error.path != path))", underlying: error)
        case .noSpace:
            throw StoreError(.noSpace, "store \(path): no space left on device (\(error.operation)\(error.path != path ? " in \(error.path)" : "")): \(error.detail ?? "free some space, then try again")", underlying: error)
        case .inUse:
            throw StoreError(.inUse, "store \(path): \(error.message(naming: error.path != path))", underlying: error)
        case .corrupted, .pageNotFound, .damaged:
            throw StoreError(.corrupted, "store \(path) is damaged: \(error.message(naming: error.path != path))", underlying: error)
        case .closed:
            throw StoreError(.closed, "store \(path) was closed (Store.close() of every store of the directory in this process); open it again with Store.open", underlying: error)
        default:
            throw StoreError(.storage, "store \(path): \(error.message(naming: error.path != path))", underlying: error)
        }
    }
}

/// Where a store copied from another replica's data file came from (``Store/copiedFrom``).
public struct CopyOrigin: Sendable, Hashable {
    /// The site id the data file had: the original replica's.
    public let site: RecordID
    /// The last history entry the copy holds. Up to it, the copy's history is the
    /// original's; after it, the two replicas wrote separately.
    public let through: HistoryToken

    public init(site: RecordID, through: HistoryToken) {
        self.site = site
        self.through = through
    }

    func encoded() -> [UInt8] {
        var key = KeyBytes()
        key.appendBigEndian(through.sequence)
        return site.bytes + key.bytes
    }

    /// The entries of a stored list (24 bytes each); a damaged tail is left out.
    static func list(decoding bytes: [UInt8]) -> [CopyOrigin] {
        stride(from: 0, to: bytes.count - 23, by: 24).compactMap { start in
            guard let site = RecordID(bytes: bytes[start..<start + 16]) else { return nil }
            let through = bytes[(start + 16)..<(start + 24)].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            return CopyOrigin(site: site, through: HistoryToken(sequence: through))
        }
    }
}
