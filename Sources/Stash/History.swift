import Foundation
import StashLMDB

/// A position in a store's history: everything committed up to and including one sequence
/// number. Opaque, `Codable`, comparable and safe to persist.
///
/// ```swift
/// var token = try store.currentToken()
/// … later …
/// let entries = try store.history(after: token)
/// for entry in entries { apply(entry) }
/// token = entries.last?.token ?? token
/// ```
public struct HistoryToken: Codable, Comparable, Hashable, Sendable, CustomStringConvertible {
    /// The sequence number of the last entry covered (0: before the first entry).
    public let sequence: UInt64
    /// The token covering entries up to `sequence` (a token kept as its number).
    public init(sequence: UInt64) { self.sequence = sequence }
    /// Before every entry.
    public static let beginning = HistoryToken(sequence: 0)
    public static func < (lhs: HistoryToken, rhs: HistoryToken) -> Bool { lhs.sequence < rhs.sequence }
    public var description: String { "\(sequence)" }
}

/// One page of history (``Store/historyPage(after:types:limit:)``): the entries, and the
/// token to continue from.
public struct HistoryPage: Sendable {
    /// Entries in commit order (with a type filter, only changes of those types).
    public let entries: [HistoryEntry]
    /// The newest entry looked at, past those the type filter left out: continue from here
    /// (and register a consumer here). At least the last entry's token.
    public let scannedThrough: HistoryToken
    /// True when the page went to the newest entry of its snapshot (no limit cut it short).
    public let reachedEnd: Bool
    /// Entries a filtered page looks at, at most: the bound on one call's work.
    public static let maximumScanned = 4096
}

/// One committed write transaction: what changed, where it came from, and when.
public struct HistoryEntry: Sendable, Equatable {
    /// Strictly increasing per store, never reused.
    public let sequence: UInt64
    /// This store's clock (``StoreOptions/clock``) when the transaction was written, a
    /// replicated one included: for display. A wall clock may go back: order by ``sequence``.
    public let timestamp: Date
    /// The site whose write produced these changes.
    public let origin: RecordID
    /// The transaction author (`"app"`, `"sync"`, `"import"`, …) if one was given.
    public let author: String?
    /// The records the transaction changed, in the order written (a record written twice in
    /// it appears twice). With a type filter, only the changes of those types.
    public let changes: [HistoryChange]

    /// The token covering history through this entry: reading history after it starts with
    /// the next entry.
    public var token: HistoryToken { HistoryToken(sequence: sequence) }
}

/// One record changed by a transaction.
public struct HistoryChange: Sendable, Equatable {
    /// What the write did to the record: `insert` (it did not exist: new, or stored again
    /// after a delete), `update` (it existed and was changed) or `delete`.
    public enum Operation: UInt8, Sendable, Codable {
        case insert = 1, update = 2, delete = 3
    }
    /// The stored type name (`#<tag>` for a type tag the schema does not know).
    public let type: String
    /// The changed record's id.
    public let id: RecordID
    /// Whether the record was inserted, updated or deleted.
    public let operation: Operation
    /// Names of the fields written: for an insert, every field the record stores (a nil
    /// optional is not stored, unless its type gives the field a default, and is not named);
    /// for an update, those whose values changed; none for a delete.
    public let fields: [String]
    /// The site this change came from: the writing store for local writes, the delta's
    /// source for replicated ones (so it is never shipped back there).
    public let origin: RecordID

    /// The stored form: tags instead of names; origin only when it differs from the entry's.
    struct Stored {
        let typeTag: UInt16
        let id: RecordID
        let operation: Operation
        let fieldTags: [UInt16]
        var origin: RecordID? = nil
    }
}

extension HistoryEntry {
    // Layout: [2] [CRC-32C of the bytes after it: u32 LE] [timestamp f64 LE] [origin 16]
    //         [author: varint len + UTF-8] [count varint]
    //         { [type tag u16 BE] [id 16] [op u8] [field count varint] [tags varint…] }
    // Format 1 was the same without the checksum; a store's entries are rewritten in format 2
    // once, at its first open for writing (``ChecksumUpgrade``), and reads refuse format 1.
    static let format: UInt8 = 2

    static func encode(timestamp: Date, origin: RecordID, author: String?, changes: [HistoryChange.Stored]) -> [UInt8] {
        var w = ByteWriter(capacity: 36 + changes.count * 24)
        w.bytes.append(format)
        w.bytes.append(contentsOf: [0, 0, 0, 0] as [UInt8])
        w.littleEndian(timestamp.timeIntervalSince1970.bitPattern)
        w.recordID(origin)
        w.rawString(author ?? "")
        w.varint(UInt64(changes.count))
        for change in changes {
            w.bytes.append(UInt8(change.typeTag >> 8))
            w.bytes.append(UInt8(change.typeTag & 0xFF))
            w.recordID(change.id)
            w.bytes.append(change.operation.rawValue | (change.origin == nil ? 0 : 0x80))
            if let origin = change.origin { w.recordID(origin) }
            w.varint(UInt64(change.fieldTags.count))
            for tag in change.fieldTags { w.varint(UInt64(tag)) }
        }
        sealEntry(&w.bytes)
        return w.bytes
    }

    /// Writes the checksum of a format-2 entry (of its bytes from the sixth on) into it.
    private static func sealEntry(_ bytes: inout [UInt8]) {
        let sum = Checksum.crc32c(bytes, from: 5)
        for i in 0..<4 { bytes[1 + i] = UInt8(truncatingIfNeeded: sum >> (8 * UInt32(i))) }
    }

    /// Reads the header of a stored entry: its format, and its checksum, checked.
    private static func readHeader(_ r: inout ByteReader) throws {
        let version = try r.byte()
        guard version == format else {
            throw RecordFormatError(reason: version == 1 ? "history entry format 1 (without a checksum) in a store whose entries all have one"
                                                         : "unknown history entry format \(version)")
        }
        try r.checksum()
    }

    /// The bytes of an entry stored in format 1 (no checksum) in format 2; nil for bytes of
    /// another format.
    static func upgradingFormatOne(_ bytes: [UInt8]) -> [UInt8]? {
        guard bytes.first == 1 else { return nil }
        var upgraded: [UInt8] = [format, 0, 0, 0, 0]
        upgraded.append(contentsOf: bytes[1...])
        sealEntry(&upgraded)
        return upgraded
    }

    /// Calls `body(typeTag, id, operation, writesFields)` for each change of a stored entry,
    /// reading in place (no allocation): `writesFields` tells whether the change wrote one of
    /// `fields` (tags). For hot readers that need only which records changed.
    /// - Returns: false, without calling `body`, when the entry holds more than `limit` changes.
    static func forEachChange(in bytes: [UInt8], writing fields: [UInt16], limit: Int,
                              _ body: (UInt16, RecordID, HistoryChange.Operation, Bool) throws -> Void) throws -> Bool {
        var r = ByteReader(bytes)
        try readHeader(&r)
        try r.skip(8 + 16)                           // timestamp, origin
        try r.skip(Int(clamping: try r.varint()))    // author
        let count = try r.varint()
        guard count <= UInt64(max(0, limit)) else { return false }
        for _ in 0..<count {
            let hi = try r.byte(), lo = try r.byte()
            let id = try r.payloadRecordID()
            let opByte = try r.byte()
            guard let op = HistoryChange.Operation(rawValue: opByte & 0x7F) else { throw RecordFormatError(reason: "bad operation") }
            if opByte & 0x80 != 0 { try r.skip(16) }
            var writes = false
            for _ in 0..<(try r.varint()) {
                if fields.contains(UInt16(truncatingIfNeeded: try r.varint())) { writes = true }
            }
            try body(UInt16(hi) << 8 | UInt16(lo), id, op, writes)
        }
        return true
    }

    static func decodeStored(_ bytes: [UInt8]) throws -> (timestamp: Date, origin: RecordID, author: String?, changes: [HistoryChange.Stored]) {
        var r = ByteReader(bytes)
        try readHeader(&r)
        let timestamp = Date(timeIntervalSince1970: try r.payloadDouble())
        guard let origin = RecordID(bytes: try r.take(16)) else { throw RecordFormatError(reason: "bad origin") }
        let author = try r.payloadString()
        let count = try r.varint()
        var changes: [HistoryChange.Stored] = []
        for _ in 0..<count {
            let hi = try r.byte(), lo = try r.byte()
            guard let id = RecordID(bytes: try r.take(16)) else { throw RecordFormatError(reason: "bad id") }
            let opByte = try r.byte()
            guard let op = HistoryChange.Operation(rawValue: opByte & 0x7F) else { throw RecordFormatError(reason: "bad operation") }
            let changeOrigin = opByte & 0x80 != 0 ? RecordID(bytes: try r.take(16)) : nil
            let n = try r.varint()
            var tags: [UInt16] = []
            for _ in 0..<n { tags.append(UInt16(truncatingIfNeeded: try r.varint())) }
            changes.append(.init(typeTag: UInt16(hi) << 8 | UInt16(lo), id: id, operation: op, fieldTags: tags, origin: changeOrigin))
        }
        return (timestamp, origin, author.isEmpty ? nil : author, changes)
    }

    static func decode(sequence: UInt64, _ bytes: [UInt8], catalog: Catalog) throws -> HistoryEntry {
        let stored = try decodeStored(bytes)
        let changes = stored.changes.map { change -> HistoryChange in
            let type = catalog.layoutsByTag[change.typeTag]?.schema
            // A tag of a type carried without a declaration (``CarriedSchema``) names it too.
            return HistoryChange(type: type?.name ?? catalog.carriedNamesByTag[change.typeTag] ?? "#\(change.typeTag)", id: change.id, operation: change.operation,
                                 fields: change.fieldTags.map { tag in type?.field(tagged: tag)?.name ?? "#\(tag)" },
                                 origin: change.origin ?? stored.origin)
        }
        return HistoryEntry(sequence: sequence, timestamp: stored.timestamp, origin: stored.origin, author: stored.author, changes: changes)
    }
}

extension Store {
    /// The token of the newest committed entry (``HistoryToken/beginning`` when none).
    public func currentToken() throws -> HistoryToken {
        try read { snapshot in try historyBounds(snapshot.txn).current }
    }

    /// The oldest token history can still be read after: everything up to it was purged.
    public func oldestAvailableToken() throws -> HistoryToken {
        try read { snapshot in try historyBounds(snapshot.txn).purgedThrough }
    }

    func historyBounds<T: TransactionReading>(_ txn: T) throws -> (current: HistoryToken, purgedThrough: HistoryToken) {
        let purged = try txn.uint64(dbs.meta, key: MetaKey.purgedThrough) ?? 0
        return (HistoryToken(sequence: try currentSequence(txn)), HistoryToken(sequence: purged))
    }

    /// The sequence of the newest entry `txn` sees (0: none).
    func currentSequence<T: TransactionReading>(_ txn: T) throws -> UInt64 {
        let next = try txn.uint64(dbs.meta, key: MetaKey.nextSequence) ?? 1
        // 0 is never stored (sequences start at 1): damage, which `verify` reports.
        return max(next, 1) - 1
    }

    /// ``historyBounds(snapshot:_:)``'s `current` alone: one metadata read, none for a
    /// snapshot of a state asked for before (a gate reads it first at every check, and
    /// after each commit of a new state).
    func currentSequence<T: TransactionReading>(snapshot: UInt64, _ txn: T) throws -> UInt64 {
        if let kept = boundsOfSnapshot.withLock({ $0 }), kept.snapshot == snapshot { return kept.current.sequence }
        let current = HistoryToken(sequence: try currentSequence(txn))
        keepBounds(of: snapshot, current: current, purgedThrough: nil)
        return current.sequence
    }

    /// ``historyBounds(_:)`` of a read snapshot of committed state `snapshot`
    /// (``ReadTransaction/snapshotID``). Only a commit changes them, and every commit is a new
    /// state, so the bounds of the newest state asked for are kept: the checks that read them
    /// first (a gate deciding whether its counts are current) take a lock instead of two
    /// B-tree lookups. O(1) when kept.
    func historyBounds<T: TransactionReading>(snapshot: UInt64, _ txn: T) throws -> (current: HistoryToken, purgedThrough: HistoryToken) {
        if let kept = boundsOfSnapshot.withLock({ $0 }), kept.snapshot == snapshot, let purgedThrough = kept.purgedThrough {
            return (kept.current, purgedThrough)
        }
        let bounds = try historyBounds(txn)
        keepBounds(of: snapshot, current: bounds.current, purgedThrough: bounds.purgedThrough)
        return bounds
    }

    /// Keeps the bounds of `snapshot` unless those of a newer state are kept (or the same
    /// state's with its purge point, when `purgedThrough` was not read).
    private func keepBounds(of snapshot: UInt64, current: HistoryToken, purgedThrough: HistoryToken?) {
        boundsOfSnapshot.withLock { kept in
            if let kept, kept.snapshot > snapshot || (kept.snapshot == snapshot && purgedThrough == nil) { return }
            kept = (snapshot, current, purgedThrough)
        }
    }

    /// Committed transactions after `token`, in commit order.
    /// - Parameters:
    ///   - types: only entries touching these types (and only their changes); nil for all.
    ///   - limit: at most this many entries.
    /// - Throws: `.historyPurged` when entries after `token` were purged (the reader missed
    ///   changes and must resynchronize from a full copy).
    /// Work is proportional to the entries read, not to the store size.
    ///
    /// With `types`, history is read page by page (``historyPage(after:types:limit:)``), each
    /// page in its own snapshot, so the answer may include commits made while it runs. A
    /// consumer of a few types that follows history should itself use
    /// ``historyPage(after:types:limit:)`` and continue from its `scannedThrough`, which also
    /// moves past entries of other types (`entries.last?.token` stays behind them, and a
    /// consumer registered there holds back every purge).
    public func history(after token: HistoryToken = .beginning, types: Set<String>? = nil, limit: Int? = nil) throws -> [HistoryEntry] {
        var page = try historyPage(after: token, types: types, limit: limit)
        var entries = page.entries
        // With types, page by page (each a bounded read in its own snapshot) to the end.
        while !page.reachedEnd, let types, limit.map({ entries.count < $0 }) ?? true {
            page = try historyPage(after: page.scannedThrough, types: types, limit: limit.map { $0 - entries.count })
            entries += page.entries
        }
        return entries
    }

    /// One page of history after `token`: entries in commit order (only changes of `types`
    /// when given), and ``HistoryPage/scannedThrough``, the token to continue from, which
    /// moves past entries the filter left out. One read snapshot; with `types`, at most
    /// ``HistoryPage/maximumScanned`` entries are looked at, so the call does bounded work
    /// however long the backlog of other types.
    /// - Throws: `.historyPurged`, `.historyAhead`, `.corrupted` as ``history(after:types:limit:)``.
    public func historyPage(after token: HistoryToken = .beginning, types: Set<String>? = nil, limit: Int? = nil) throws -> HistoryPage {
        try read { snapshot in try snapshot.historyPage(after: token, types: types, limit: limit) }
    }

    // MARK: Consumers and purge

    /// Registers `name` as a consumer that has read history up to `token`. Purge never removes
    /// entries after a registered consumer's token (unless forced). Call again to move it.
    /// A consumer whose token is before the purge point has lost entries already (its reads
    /// throw `.historyPurged` until it resynchronizes) and holds back no purge.
    public func registerHistoryConsumer(_ name: String, at token: HistoryToken) throws {
        try write { tx in try tx.registerHistoryConsumer(name, at: token) }
    }

    /// Removes a consumer registration; returns false when there was none.
    @discardableResult
    public func removeHistoryConsumer(_ name: String) throws -> Bool {
        try write { tx in try tx.removeHistoryConsumer(name) }
    }

    /// Registered consumers and the token each has read up to.
    public func historyConsumers() throws -> [String: HistoryToken] {
        try read { snapshot in try consumers(snapshot.txn) }
    }

    func consumers<T: TransactionReading>(_ txn: T) throws -> [String: HistoryToken] {
        var result: [String: HistoryToken] = [:]
        try txn.scan(dbs.meta, prefix: MetaKey.consumerPrefix) { key, value in
            let name = String(decoding: key.dropFirst(MetaKey.consumerPrefix.count), as: UTF8.self)
            let token = HistoryToken(sequence: LittleEndian.uint64(value) ?? 0)
            // Keys written before names were composed: spellings of one name are one
            // consumer, which has read what the furthest behind of them has.
            result[name] = min(result[name] ?? token, token)
            return true
        }
        return result
    }

    /// Removes every history entry that `token` covers (sequence ≤ `token.sequence`), in write
    /// transactions of at most ``maximumPurgedPerTransaction`` entries each, oldest first:
    /// other writers go on between them, and memory stays bounded however long the history.
    /// A purge cut short (a crash, an error) has removed a prefix and moved the purge point
    /// past it. Sequence numbers are never reused afterwards.
    /// - Parameter force: purge even entries a registered consumer has not read; the report
    ///   names those consumers (they will get `.historyPurged` and must resynchronize; their
    ///   registrations stay, and hold back no later purge).
    /// - Throws: `.historyNeeded` naming the consumer when it still needs the entries (checked
    ///   in every transaction: nothing it needs is removed).
    @discardableResult
    public func purgeHistory(before token: HistoryToken, force: Bool = false) throws -> HistoryPurgeReport {
        var removed = 0
        var overridden: [String] = []
        while true {
            let step = try write { tx in try purgeStep(tx.context.txn, before: token, force: force, removedSoFar: removed) }
            removed += step.removed
            for name in step.overridden where !overridden.contains(name) { overridden.append(name) }
            if step.reachedTarget {
                return HistoryPurgeReport(removedEntries: removed, purgedThrough: step.purgedThrough, overriddenConsumers: overridden)
            }
        }
    }

    /// History entries one transaction of ``purgeHistory(before:force:)`` removes, at most.
    public static let maximumPurgedPerTransaction = 4096

    /// One transaction of ``purgeHistory(before:force:)``: the oldest entries up to `token`,
    /// at most ``maximumPurgedPerTransaction`` of them.
    private func purgeStep(_ txn: WriteTransaction, before token: HistoryToken, force: Bool, removedSoFar: Int) throws
        -> (removed: Int, purgedThrough: HistoryToken, overridden: [String], reachedTarget: Bool) {
        let bounds = try historyBounds(txn)
        let target = min(token, bounds.current)
        // Consumers before the purge point lost entries already: they protect nothing more
        // (counted, each held back every later purge for good).
        let behind = try consumers(txn).filter { $0.value < target && $0.value >= bounds.purgedThrough }.sorted { $0.key < $1.key }
        if !force, let (name, consumer) = behind.first {
            let done = removedSoFar == 0 ? "" : " (\(removedSoFar) entries up to \(bounds.purgedThrough) were purged before it registered)"
            // A sync peer's consumer is named after its watermark (StashSync's `sync:<site>`).
            let peer = name.hasPrefix("sync:") ? " (a sync peer: if it is gone for good, `SyncEngine.forget(site:)` or `stash forget-peer` lets its history go)" : ""
            throw StoreError(.historyNeeded, "store \(path): consumer '\(name)' has read history only up to \(consumer); purging up to \(target) would lose entries it needs\(done). Purge up to \(consumer) at most, move the consumer, or force\(peer)")
        }
        var keys: [[UInt8]] = []
        var end = KeyBytes()
        end.appendBigEndian(target.sequence)
        let last = end.bytes
        try txn.scan(dbs.history, from: ScanStart<[UInt8]>.first) { key, _ in
            guard !last.lexicographicallyPrecedes(key), keys.count < Self.maximumPurgedPerTransaction else { return false }
            keys.append(key)
            return true
        }
        for key in keys { try txn.delete(dbs.history, key: key) }
        let reachedTarget = keys.count < Self.maximumPurgedPerTransaction
        // Cut short: everything up to the last entry removed is gone.
        let reached = reachedTarget ? target : HistoryToken(sequence: keys.last.flatMap(StoreKeys.sequence(fromHistoryKey:)) ?? target.sequence)
        let purged = max(bounds.purgedThrough, reached)
        try txn.put(dbs.meta, key: MetaKey.purgedThrough, uint64: purged.sequence)
        return (keys.count, purged, behind.map(\.key), reachedTarget)
    }
}

extension StoreTransaction {
    /// Registers or moves a history consumer in this transaction (see
    /// ``Store/registerHistoryConsumer(_:at:)``), e.g. together with a sync watermark.
    public func registerHistoryConsumer(_ name: String, at token: HistoryToken) throws {
        guard !name.isEmpty, name.utf8.count <= 200 else {
            throw StoreError(.invalidValue, "store \(reader.path): a history consumer name must be 1...200 bytes")
        }
        // A consumer past the newest entry would let purge take entries it has not read.
        let current = try historyBounds().current
        if token > current {
            throw StoreError(.historyAhead, "store \(reader.path): history consumer '\(name)' cannot have read up to \(token): the newest entry is \(current)")
        }
        try context.txn.put(reader.dbs.meta, key: MetaKey.consumer(name), uint64: token.sequence)
    }

    /// Removes a consumer registration in this transaction (see
    /// ``Store/removeHistoryConsumer(_:)``); returns false when there was none.
    @discardableResult
    public func removeHistoryConsumer(_ name: String) throws -> Bool {
        try context.txn.delete(reader.dbs.meta, key: MetaKey.consumer(name))
    }
}

/// What ``Store/purgeHistory(before:force:)`` did.
public struct HistoryPurgeReport: Sendable, CustomStringConvertible {
    /// History entries deleted by this purge.
    public let removedEntries: Int
    /// History is now readable only after this token.
    public let purgedThrough: HistoryToken
    /// Consumers (forced purge) that lost entries they had not read.
    public let overriddenConsumers: [String]

    public var description: String {
        "removed \(removedEntries) history entries; history now starts after \(purgedThrough)"
            + (overriddenConsumers.isEmpty ? "" : "; consumers that must resynchronize: \(overriddenConsumers.joined(separator: ", "))")
    }
}
