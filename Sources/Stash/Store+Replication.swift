import Foundation
import StashLMDB

// The surface that replication (StashSync) and gating (StashGate) build on: record states
// with versions, merges, and a namespaced key-value area in the store's `meta` database.

extension MetaKey {
    /// Keys of the namespaced metadata area: "x:" + caller's key.
    static func extensionKey(_ key: String) -> [UInt8] { Array("x:".utf8) + Array(key.utf8) }
    static let extensionPrefix = Array("x:".utf8)
}

/// The replicated state of a record from `records` and `versions`, in any transaction.
func loadRecordState<T: TransactionReading>(_ txn: T, _ dbs: StoreDatabases, _ layout: TypeLayout,
                                             _ id: RecordID, site: RecordID, path: String) throws -> RecordState {
    try loadStoredRecordState(txn, dbs, layout, id, site: site, path: path).state
}

/// ``loadRecordState(_:_:_:_:site:path:)``, and whether anything at all is stored under the
/// id (a record or its versions).
///
/// `versionedOnly`: every stored record has a versions entry (a delete leaves its tombstone
/// there; `verify` checks the rule), so an id without one is not looked for in `records`: one
/// lookup instead of two for an id new here. A merge passes it, and loads the state again
/// without it when the put that follows finds a record a damaged store keeps without versions.
func loadStoredRecordState<T: TransactionReading>(_ txn: T, _ dbs: StoreDatabases, _ layout: TypeLayout,
                                                  _ id: RecordID, site: RecordID, path: String,
                                                  versionedOnly: Bool = false) throws -> (state: RecordState, stored: Bool) {
    let key = StoreKeys.record(layout.schema.tag, id)
    let versions: RecordVersions?
    do { versions = try txn.get(dbs.versions, key: key).map { try RecordVersions(decoding: $0) } }
    catch { throw StoreError(.corrupted, "store \(path): versions of \(layout.schema.name) \(id) cannot be decoded: \(error)") }
    if versions == nil, versionedOnly {
        return (RecordState(type: layout.schema.name, id: id, incarnation: nil, tombstone: nil, fields: [:]), false)
    }
    var fields: [String: FieldState] = [:]
    let bytes = try txn.get(dbs.records, key: key)
    if let bytes {
        let record: EncodedRecord
        do { record = try EncodedRecord(bytes) }
        catch { throw StoreError(.corrupted, "store \(path): \(layout.schema.name) \(id) cannot be decoded: \(error)") }
        // At its size at once: grown field by field, it was reallocated three times a record.
        fields = Dictionary(minimumCapacity: max(record.fields.count, versions?.fields.count ?? 0))
        let fallback = versions?.incarnation ?? Version(clock: 0, site: site)
        for (tag, value) in try record.values() {
            guard let name = layout.schema.field(tagged: tag)?.name else { continue }
            fields[name] = FieldState(value: value, version: versions?.fields[tag] ?? fallback)
        }
        for entry in versions?.fields ?? FieldVersions() where record.range(of: entry.tag) == nil {
            if let name = layout.schema.field(tagged: entry.tag)?.name { fields[name] = FieldState(value: .null, version: entry.version) }
        }
    }
    // What the record carries for other replicas: a field of the same name stored here (in
    // another kind) and the carried value go as the newer of the two.
    for (name, field) in versions?.carried ?? [:] where fields[name].map({ $0.version < field.version }) ?? true {
        fields[name] = field
    }
    return (RecordState(type: layout.schema.name, id: id, incarnation: versions?.incarnation,
                        tombstone: versions?.tombstone, fields: fields), bytes != nil || versions != nil)
}

/// The state of a record of a type the schema does not declare, kept under `tag` (see
/// ``CarriedSchema``): its incarnation, tombstone and carried fields.
func loadCarriedRecordState<T: TransactionReading>(_ txn: T, _ dbs: StoreDatabases, type: String, tag: UInt16,
                                                   _ id: RecordID, path: String) throws -> RecordState {
    let versions: RecordVersions?
    do { versions = try txn.get(dbs.versions, key: StoreKeys.record(tag, id)).map { try RecordVersions(decoding: $0) } }
    catch { throw StoreError(.corrupted, "store \(path): the carried state of \(type) \(id) cannot be decoded: \(error); run `stash verify \(path)`") }
    return RecordState(type: type, id: id, incarnation: versions?.incarnation, tombstone: versions?.tombstone, fields: versions?.carried ?? [:])
}

extension RecordReader {
    func recordState(_ layout: TypeLayout, _ id: RecordID) throws -> RecordState {
        try loadRecordState(txn, dbs, layout, id, site: store.siteID, path: path)
    }
}

extension StoreReading {
    /// The replicated state of a record: field values with versions, incarnation and
    /// tombstone. A deleted record has no fields and a tombstone; an unknown id has neither.
    /// A type this store carries for other replicas without declaring it (see
    /// ``carriedTypeNames``) has states too: every field of it is carried.
    public func recordState(typeNamed type: String, id: RecordID) throws -> RecordState {
        let reader = self.reader
        if reader.catalog.isCarriedType(type), let tag = reader.catalog.carried.types[type] {
            return try loadCarriedRecordState(reader.txn, reader.dbs, type: type, tag: tag, id, path: reader.path)
        }
        return try reader.recordState(try reader.layout(type), id)
    }

    /// Calls `body` with the state of every record of `type` ever stored here, deleted ones
    /// (tombstones) included, until it returns false. Used for full resynchronization. `type`
    /// may be one this store carries without declaring it (``carriedTypeNames``).
    public func forEachRecordState(typeNamed type: String, _ body: (RecordState) throws -> Bool) throws {
        let reader = self.reader
        if reader.catalog.isCarriedType(type), let tag = reader.catalog.carried.types[type] {
            try reader.txn.scan(reader.dbs.versions, prefix: StoreKeys.typePrefix(tag)) { key, _ in
                guard let id = StoreKeys.id(fromRecordKey: key) else { return true }
                return try body(try loadCarriedRecordState(reader.txn, reader.dbs, type: type, tag: tag, id, path: reader.path))
            }
            return
        }
        let layout = try reader.layout(type)
        try reader.txn.scan(reader.dbs.versions, prefix: StoreKeys.typePrefix(layout.schema.tag)) { key, _ in
            guard let id = StoreKeys.id(fromRecordKey: key) else { return true }
            return try body(try reader.recordState(layout, id))
        }
    }

    /// The types this store keeps for other replicas without declaring them: received by sync
    /// from a replica whose app declares them (a newer version, say), kept with their versions
    /// and sent on, never readable as records here until the app declares them (an open that
    /// declares one takes its records in). Sorted.
    public var carriedTypeNames: [String] {
        let catalog = reader.catalog
        return catalog.carried.types.keys.filter { catalog.isCarriedType($0) }.sorted()
    }

    /// Per type, the fields this store carries without declaring them that their source
    /// merges as counters (``Counter``): a replica that receives them must merge them so too.
    public var carriedCounterFields: [String: Set<String>] {
        reader.catalog.carried.fields.compactMapValues { fields in
            let counters = Set(fields.filter(\.value).keys)
            return counters.isEmpty ? nil : counters
        }
    }

    /// A value stored under `key` in the store's metadata area (nil when absent).
    public func metadata(for key: String) throws -> [UInt8]? {
        try reader.txn.get(reader.dbs.meta, key: MetaKey.extensionKey(key))
    }

    /// All metadata keys starting with `prefix`, with their values.
    public func metadata(withPrefix prefix: String) throws -> [(key: String, value: [UInt8])] {
        var result: [(String, [UInt8])] = []
        let full = MetaKey.extensionKey(prefix)
        try reader.txn.scan(reader.dbs.meta, prefix: full) { key, value in
            result.append((String(decoding: key.dropFirst(MetaKey.extensionPrefix.count), as: UTF8.self), value))
            return true
        }
        return result
    }

    /// The history bounds as seen by this transaction: the newest entry and the purge point.
    public func historyBounds() throws -> (current: HistoryToken, purgedThrough: HistoryToken) {
        let reader = self.reader
        guard let snapshot = reader.snapshotID else { return try reader.store.historyBounds(reader.txn) }
        return try reader.store.historyBounds(snapshot: snapshot, reader.txn)
    }

    /// The sequence of the newest history entry this reading sees: `historyBounds().current`
    /// alone, one metadata read instead of two (none in a read snapshot of a state asked for
    /// before).
    package func historySequence() throws -> UInt64 {
        let reader = self.reader
        guard let snapshot = reader.snapshotID else { return try reader.store.currentSequence(reader.txn) }
        return try reader.store.currentSequence(snapshot: snapshot, reader.txn)
    }

    /// History entries after `token` as seen by this transaction (see ``Store/history(after:types:limit:)``).
    public func history(after token: HistoryToken, limit: Int? = nil) throws -> [HistoryEntry] {
        try historyPage(after: token, limit: limit).entries
    }

    /// Entries after `token` in commit order (only changes of `types` when given), and the
    /// newest sequence looked at, past entries the filter left out (see ``HistoryPage``).
    /// With `types`, at most ``HistoryPage/maximumScanned`` entries are looked at, so one call
    /// does bounded work over a backlog of other types: follow ``HistoryPage/scannedThrough``.
    /// - Throws: `.historyPurged` when entries after `token` were purged; `.historyAhead` when
    ///   `token` is past the newest entry; `.corrupted` naming an entry that cannot be read.
    public func historyPage(after token: HistoryToken, types: Set<String>? = nil, limit: Int? = nil) throws -> HistoryPage {
        let bounds = try historyBounds()
        if token < bounds.purgedThrough {
            throw StoreError(.historyPurged, "store \(reader.path): history after \(token) is gone (purged through \(bounds.purgedThrough)); resynchronize from a full copy, then follow from \(bounds.current)")
        }
        // A token from the future of this store: its entries after the newest one here would
        // be new transactions under sequence numbers the token claims were read.
        if token > bounds.current {
            throw StoreError(.historyAhead, "store \(reader.path): history token \(token) is past the newest entry \(bounds.current): it belongs to another store, or to this one before it was restored from an older copy; resynchronize from the store as it is, then follow from \(bounds.current)")
        }
        if let limit, limit < 0 {
            throw StoreError(.invalidValue, "store \(reader.path): a history limit of \(limit); it counts entries, so give 0 or more (nil: no limit)")
        }
        if limit == 0 { return HistoryPage(entries: [], scannedThrough: token, reachedEnd: token == bounds.current) }
        let catalog = try reader.store.reloadCatalog(reader.txn)
        var entries: [HistoryEntry] = []
        var scanned = token
        var looked = 0
        var complete = true
        var start = KeyBytes()
        start.appendBigEndian(token.sequence &+ 1)
        try reader.txn.scan(reader.dbs.history, from: .atOrAfter(start)) { key, value in
            guard let sequence = StoreKeys.sequence(fromHistoryKey: key) else { return true }
            scanned = HistoryToken(sequence: sequence)
            looked += 1
            var entry: HistoryEntry
            do { entry = try HistoryEntry.decode(sequence: sequence, value, catalog: catalog) } catch let error as RecordFormatError {
                throw StoreError(.corrupted, "store \(reader.path): history entry \(sequence) cannot be read (\(error.reason)): it is damaged, or was written by a newer version of Stash. `stash verify \(reader.path)` lists what else is damaged; purgeHistory(before: HistoryToken(sequence: \(sequence)), force: true) removes it and everything before it (its readers then resynchronize)")
            }
            if let types {
                let kept = entry.changes.filter { types.contains($0.type) }
                if kept.isEmpty {
                    if looked >= HistoryPage.maximumScanned { complete = false; return false }
                    return true
                }
                entry = HistoryEntry(sequence: entry.sequence, timestamp: entry.timestamp, origin: entry.origin, author: entry.author, changes: kept)
            }
            entries.append(entry)
            if let limit, entries.count >= limit { complete = false; return false }
            if types != nil && looked >= HistoryPage.maximumScanned { complete = false; return false }
            return true
        }
        if complete { scanned = max(scanned, bounds.current) }
        return HistoryPage(entries: entries, scannedThrough: scanned, reachedEnd: complete)
    }

    /// The store's schema as this transaction sees it.
    public var schema: StoreSchema { reader.catalog.schema }
}

extension StoreTransaction {
    /// This store's site id (for ``Counter/add(_:site:)``).
    public var siteID: RecordID { context.siteID }

    /// The version this transaction's local writes get (hybrid logical clock).
    public func writeVersion() throws -> Version { try context.writeVersion() }

    /// Merges a remote record state into this store (see ``RecordState/merged(with:counters:)``),
    /// updating record, indexes, counts, versions and history together. The local clock
    /// follows remote versions at most ``maximumClockSkew`` past local time. The history change carries
    /// `origin`, so the change is not sent back there.
    ///
    /// A unique-index clash the merged state makes is not an error: when the transaction
    /// commits, of the records sharing a unique value the one with the smallest id stays and
    /// the others are deleted (judged on the transaction's final state, so merges that move
    /// or swap values between records delete nothing).
    /// - Returns: false when the state changed nothing.
    /// What this store's schema does not declare is carried, never added to the schema: a
    /// field it lacks (or holds in another kind) is kept with its version beside the record,
    /// a state of a type it lacks is kept whole (``carriedTypeNames``); both are sent on with
    /// the record, and an open that declares them takes them in. `counters` names the fields
    /// the source merges as counters, for those this store carries. A version more than
    /// ``maximumClockSkew`` ahead of this store's clock is taken back by how far its site's
    /// clock runs ahead, measured from `sentAt` (the source's clock when it sent the state, for
    /// versions of `origin`) or from its arrival now, so that it reads as made no later than
    /// its arrival here: an edit made after it arrived wins over it.
    /// - Throws: `.invalidValue` for a version past ``Version/maximumClock``, a counter field
    ///   whose value is no counter's state (``Counter/problem(in:)``), or a type or field name
    ///   no record can have (empty, `id`).
    ///
    /// What is merged must read back through the app's type (the `Record` types the store was
    /// opened with): a value it cannot read (an enum case or a nested shape of another app
    /// version) is carried instead, the record keeping the value it had. With `sameSchema`
    /// (the source's schema fingerprint is this store's), only nested values (arrays, maps)
    /// are checked so: the rest a source of the same schema cannot get wrong without its
    /// own typed reads failing. The check decodes the record once (a few thousand
    /// instructions); it is skipped for a store opened without `Record` types.
    @discardableResult
    public func merge(_ state: RecordState, origin: RecordID, counters: Set<String> = [], sentAt: Date? = nil,
                      sameSchema: Bool = false) throws -> Bool {
        try context.merge(state, origin: origin, sourceCounters: counters, sentAt: sentAt, sameSchema: sameSchema)
    }

    /// Settles now, on the state this transaction holds, the unique-index clashes its merges
    /// have made so far (as the commit would: see ``merge(_:origin:)``), and returns the
    /// records it deleted, to tell the user. Call it after the last merge; clashes of merges
    /// made later are settled at the commit. O(records sharing a value the merges wrote).
    public func settleUniqueClashes() throws -> [UniqueClash] {
        try context.settleMergedUniqueClashes()
    }

    /// Runs `action` once this transaction has committed, on the thread that called
    /// ``Store/write(author:isolation:_:)``, before that call returns; never when the transaction rolls
    /// back (a throw, here or in a later part of the closure). For memory that must follow
    /// what is stored, such as a "saved up to" mark. Actions registered by an attempt that
    /// ran again (the map grew) are dropped with that attempt.
    public func afterCommit(_ action: @escaping () -> Void) {
        context.afterCommit(action)
    }

    /// Stores `value` under `key` in the metadata area (nil removes it), in this transaction.
    public func setMetadata(_ value: [UInt8]?, for key: String) throws {
        guard !key.isEmpty, key.utf8.count <= 400 else {
            throw StoreError(.invalidValue, "store \(reader.path): a metadata key must be 1...400 bytes")
        }
        if let value {
            try context.txn.put(reader.dbs.meta, key: MetaKey.extensionKey(key), value: value)
        } else {
            try context.txn.delete(reader.dbs.meta, key: MetaKey.extensionKey(key))
        }
    }
}

extension Store {
    /// Forces every committed write to disk. A store opened with `.relaxed` or `.none`
    /// durability may lose its last commits in a power cut: flush before telling anyone else
    /// about them (the sync engine does before each export, so that no peer holds a change
    /// this store could lose and then number again). Free when nothing is waiting.
    /// - Throws: `.storage` with the `fsync` error.
    public func flush() throws {
        try storageErrors(path) { try env.sync() }
    }

    /// How hard commits work to reach the disk: the strongest durability any open of this
    /// directory in this process asked for.
    public var durability: Durability { env.durability }

    /// A value from the metadata area, read in its own snapshot. Cheap enough for start-up
    /// reads (one B-tree lookup).
    public func metadata(for key: String) throws -> [UInt8]? { try read { try $0.metadata(for: key) } }

    /// Stores a metadata value in its own write transaction.
    public func setMetadata(_ value: [UInt8]?, for key: String) throws { try write { try $0.setMetadata(value, for: key) } }

    static let syncPreferenceKey = "sync.preference"

    /// Metadata key set when a type turned from local-only to synced at an open: records of
    /// the type that peers sent were skipped while it was local-only. The sync engine resets
    /// what it has received from every peer (peers then send full snapshots) and removes it.
    public static let typesTurnedSyncedKey = "sync.typesTurnedSynced"

    /// The stored sync preference (what the next open will use). Default on.
    public func storedSyncPreference() throws -> Bool {
        try metadata(for: Self.syncPreferenceKey) != [0]
    }

    /// Stores the user's sync preference; it takes effect at the next open
    /// (``syncPreferenceAtOpen``). Turning sync off never moves, hides or deletes data:
    /// history keeps recording, and turning it back on ships what was written meanwhile.
    public func setSyncPreference(_ enabled: Bool) throws {
        try setMetadata([enabled ? 1 : 0], for: Self.syncPreferenceKey)
    }

    /// Makes the next open give this store a new site id, as an open of a copy of its data
    /// file does (``copiedFrom`` then names the current site). For a store found to be a copy
    /// that kept its file's identity (a file-system snapshot rolled back, a cloned volume):
    /// another replica writes as the same site. This store keeps writing as the current site
    /// until then.
    public func requestNewSite() throws {
        try write { tx in try tx.context.txn.put(dbs.meta, key: MetaKey.newSiteRequested, value: [1]) }
    }

    /// True after ``requestNewSite()``, until the next open (here or in another process)
    /// takes the new site, which ``siteID`` then returns.
    public func isNewSiteRequested() throws -> Bool {
        // A write reads the newest state, and notes a new site another open took (a store open
        // read-only writes nothing as any site).
        if isReadOnly { return try read { try $0.reader.txn.get(dbs.meta, key: MetaKey.newSiteRequested) != nil } }
        return try write { tx in try tx.context.txn.get(dbs.meta, key: MetaKey.newSiteRequested) != nil }
    }

    /// The wall clock this store uses (``StoreOptions/clock``).
    public var clock: @Sendable () -> Date { now }
}
