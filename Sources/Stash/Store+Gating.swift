import Foundation
import StashLMDB

// Counting primitives for code that checks quotas on the hot path (StashGate builds its
// limits on them). They are generic: nothing here knows about entitlements or tiers.

/// A resolved record type: counting through it skips the type-name lookup, so a count
/// inside a transaction is one B-tree lookup and allocates nothing.
public struct TypeHandle<R: Record>: Sendable {
    let typeTag: UInt16
    /// The stored type name.
    public let name: String
}

extension Store {
    /// A handle on `type` for allocation-free O(1) counts with ``StoreReading/count(_:)-(TypeHandle<R>)``.
    /// - Throws: `.unknownType` when the store was not opened with `type`.
    public func typeHandle<R: Record>(_ type: R.Type) throws -> TypeHandle<R> {
        let layout = try catalog.layout(R.recordType, store: path)
        return TypeHandle(typeTag: layout.schema.tag, name: layout.schema.name)
    }
}

extension Store {
    /// Keeps, from now on, the record count of `type` and (with `index`) the size of each of
    /// its groups that this store's own commits leave, so that
    /// ``recentCounts(_:from:to:total:_:)`` can bring counts up to date without reading
    /// anything. Every later write transaction then notes the groups it changes and reads
    /// their sizes at commit (up to ``RecentCounts/groupsPerCommit`` groups). Returns what to
    /// ask for them by.
    package func keepRecentCounts<R: Record>(of type: TypeHandle<R>, groupedBy index: IndexHandle<R, RecordID>?) -> RecentCountsKey {
        let key = RecentCountsKey(typeTag: type.typeTag, index: index.map { RecentCounts.key(typeTag: $0.typeTag, indexTag: $0.indexTag) })
        recentCounts.keep(index: key.index)
        return key
    }

    /// Brings counts taken at history sequence `from` up to sequence `to` from this store's
    /// own commits in between (see ``keepRecentCounts(of:groupedBy:)``): `total`, the number of
    /// records of the key's type at `from`, becomes the number at `to`, and `visit` sees each
    /// group of its index those commits changed with its size, oldest commit first (a later
    /// size replaces an earlier one). False, with nothing changed, when they do not cover every
    /// commit in between (one made by another process or `Store`, or before the counts were
    /// kept): count from the store then. O(commits kept + groups visited), no allocation.
    package func recentCounts(_ key: RecentCountsKey, from: HistoryToken, to: HistoryToken, total: inout Int,
                              _ visit: (RecordID, Int) -> Void) -> Bool {
        recentCounts.bringUpToDate(from: from.sequence, to: to.sequence, typeTag: key.typeTag, total: &total, index: key.index, visit)
    }
}

/// A type, and an index of it on a record-id field, whose counts a store keeps for its recent
/// commits (``Store/keepRecentCounts(of:groupedBy:)``).
package struct RecentCountsKey: Sendable {
    let typeTag: UInt16
    let index: UInt32?
}

extension StoreReading {
    /// The number of records of the handle's type, including this transaction's own pending
    /// inserts and deletes. O(1): one lookup in `counts`, no allocation.
    public func count<R: Record>(_ type: TypeHandle<R>) throws -> Int {
        try reader.storedCount(type.typeTag)
    }

    /// Whether a record of the handle's type with `id` exists, this transaction's own inserts
    /// and deletes included: "does the parent of a new record exist?". One B-tree lookup, no
    /// allocation.
    public func contains<R: Record>(_ type: TypeHandle<R>, id: RecordID) throws -> Bool {
        try reader.txn.contains(reader.dbs.records, key: StoreKeys.record(type.typeTag, id))
    }

    /// The number of records of the index's type. O(1), no allocation.
    public func count<R: Record, V: IndexableValue>(all index: IndexHandle<R, V>) throws -> Int {
        try reader.storedCount(index.typeTag)
    }

    /// The largest number of records that share one value of `index`'s field (0 when the
    /// type is empty): "does any home hold more than 10 items?".
    ///
    /// O(distinct values): one cursor jumps from value to value and reads each group's size
    /// with `mdb_cursor_count`. Check ``count(all:)`` first, since no group can be larger
    /// than the whole type. Strings longer than the indexed prefix group by that prefix
    /// (an upper bound).
    public func largestGroupCount<R: Record, V: IndexableValue>(_ index: IndexHandle<R, V>) throws -> Int {
        let reader = reader   // one copy of the reader, not one per use
        try index.confirm(in: reader.catalog, of: reader.store)
        var largest = 0
        try reader.txn.forEachKeyWithCount(index.database, prefix: StoreKeys.indexPrefix(index.typeTag, index.indexTag)) { _, count in
            largest = max(largest, count)
            return true
        }
        return largest
    }

    /// The groups of `index` (values of its `RecordID` field, such as a parent id) that more
    /// than `size` records share, with their sizes: "which homes hold more than 10 items?".
    /// Records without a value (stored through the generic API without the field) are in no
    /// group, unlike in ``largestGroupCount(_:)``, which counts them as one.
    ///
    /// O(distinct values), like ``largestGroupCount(_:)``; the answer is usually short, and
    /// ``changedRecords(in:after:limit:)`` lets a caller keep it up to date from history
    /// instead of walking again.
    ///
    /// - Throws: `.invalidValue` when the record's `encode(to:)` stores the field in another
    ///   form than a record id (as text, say): its index then holds no record ids to name.
    public func groups<R: Record>(_ index: IndexHandle<R, RecordID>, largerThan size: Int) throws -> [(value: RecordID, count: Int)] {
        let reader = reader   // one copy of the reader, not one per use
        let field = try index.confirm(in: reader.catalog, of: reader.store)
        guard field.keyMatchesStoredKind else {
            throw StoreError(.invalidValue, "store \(reader.path): \(R.recordType).\(index.field) is stored as \(field.storedKind?.rawValue ?? "?") (its encode(to:) writes it so), not as a record id (uuid); groups(_:largerThan:) names record ids: store the property as it encodes itself")
        }
        return try recordIDGroups(index.database, StoreKeys.indexPrefix(index.typeTag, index.indexTag), largerThan: size)
    }

    /// ``groups(_:largerThan:)`` by stored names, for schema-driven code: the groups of the
    /// index on `field` alone of the stored type `type`, a field of record ids. Reads the
    /// index only, never a record. nil when no index holds `field` alone (count from the
    /// records then).
    /// - Throws: `.unknownType`, `.unknownField`, and `.invalidValue` for a field whose values
    ///   are not record ids (uuid).
    public func groups(typeNamed type: String, field: String, largerThan size: Int) throws -> [(value: RecordID, count: Int)]? {
        let layout = try reader.layout(type)
        guard let fieldSchema = layout.schema.field(named: field) else {
            let known = layout.schema.fields.map(\.name).sorted().joined(separator: ", ")
            throw StoreError(.unknownField, "store \(reader.path): \(type) has no field '\(field)' (fields: \(known))")
        }
        if let kind = fieldSchema.kind, kind != .uuid {
            throw StoreError(.invalidValue, "store \(reader.path): \(type).\(field) is a \(kind.rawValue) field; groups(typeNamed:field:largerThan:) groups record ids (uuid)")
        }
        guard let index = layout.schema.indexes.first(where: { $0.fields == [field] }) else { return nil }
        return try recordIDGroups(reader.dbs.index, StoreKeys.indexPrefix(layout.schema.tag, index.tag), largerThan: size)
    }

    private func recordIDGroups(_ database: Database, _ prefix: KeyBytes, largerThan size: Int) throws -> [(value: RecordID, count: Int)] {
        var result: [(value: RecordID, count: Int)] = []
        try reader.txn.forEachKeyWithCount(database, prefix: prefix) { key, count in
            // The key ends with the field's component: a presence byte, then the id's 16 bytes.
            if count > size, key.count >= 17, key[key.count - 17] == 1, let value = RecordID(bytes: key[(key.count - 16)...]) {
                result.append((value, count))
            }
            return true
        }
        return result
    }

    /// The value of `index`'s field in record `id` (its schema default, or null, when the
    /// record lacks the field), read from the stored bytes without decoding the rest of the
    /// record; nil when there is no such record. One B-tree lookup.
    public func indexedValue<R: Record, V: IndexableValue>(of index: IndexHandle<R, V>, id: RecordID) throws -> FieldValue? {
        let reader = reader   // one copy of the reader, not one per use
        let layout = try reader.layout(R.self)
        guard let bytes = try reader.bytes(layout, id) else { return nil }
        if let tag = layout.tagsByName[index.field], let value = try EncodedRecord.value(of: tag, in: bytes) { return value }
        return layout.defaults[index.field] ?? .null
    }

    /// Where this reading stands in its changes: the history it sees and, in a write
    /// transaction, how many uncommitted changes of its own it holds. With
    /// ``changedRecords(in:after:limit:)-(_,ChangeCursor,_)`` later in the same transaction, it
    /// lists only what the transaction changed since. One metadata read.
    public func changeCursor() throws -> ChangeCursor {
        let reader = reader
        return ChangeCursor(history: try historyBounds().current, transaction: reader.writeSerial,
                            pending: reader.pendingChanges.count)
    }

    /// The records of `index`'s type that may have changed group since `token`: the ids
    /// inserted, deleted, or updated with the indexed field changed, in the history committed
    /// after `token` and, in a write transaction, in its own uncommitted writes. In order, may
    /// repeat; a deleted id is listed although no group holds it any more.
    ///
    /// With ``groups(_:largerThan:)`` at `token`, this keeps "which groups are over a limit"
    /// exact without a new walk: only groups listed before, and the groups the listed records
    /// are in now, can have grown past the limit or fallen back under it.
    ///
    /// - Returns: nil when the changes after `token` cannot be read (purged, `token` newer than
    ///   what this transaction sees, or an entry this library cannot decode), or when there are
    ///   more than `limit` of them: count from scratch then.
    /// Work is proportional to the changes read, at most `limit`, not to the store size.
    public func changedRecords<R: Record, V: IndexableValue>(in index: IndexHandle<R, V>, after token: HistoryToken,
                                                             limit: Int) throws -> [RecordID]? {
        try changedRecords(in: index, after: ChangeCursor(token), limit: limit)
    }

    /// ``changedRecords(in:after:limit:)-(_,HistoryToken,_)`` since `cursor`: the history after
    /// it, and this transaction's own uncommitted changes after those it held at `cursor` (all
    /// of them for a cursor of history alone). nil as there, and for a cursor of another write
    /// transaction, whose uncommitted changes this one cannot see.
    public func changedRecords<R: Record, V: IndexableValue>(in index: IndexHandle<R, V>, after cursor: ChangeCursor,
                                                             limit: Int) throws -> [RecordID]? {
        let token = cursor.history
        let bounds = try historyBounds()
        guard token >= bounds.purgedThrough, token <= bounds.current else { return nil }
        let reader = reader   // one copy of the reader, not one per use
        let allPending = reader.pendingChanges
        if cursor.transaction != 0 {
            guard cursor.transaction == reader.writeSerial, cursor.pending <= allPending.count else { return nil }
        }
        let pending = allPending[(cursor.transaction == 0 ? 0 : cursor.pending)...]
        let layout = try reader.layout(R.self)
        let fieldTags = (layout.fieldTags(ofIndex: index.indexTag) ?? [layout.tagsByName[index.field]]).compactMap { $0 }
        var ids: [RecordID] = []
        var looked = 0
        func consider(_ typeTag: UInt16, _ id: RecordID, _ operation: HistoryChange.Operation, _ writesField: Bool) {
            looked += 1
            if typeTag == index.typeTag, operation != .update || writesField { ids.append(id) }
        }
        guard pending.count <= limit else { return nil }
        var start = KeyBytes()
        start.appendBigEndian(token.sequence &+ 1)
        var complete = true
        do {
            try reader.txn.scan(reader.dbs.history, from: .atOrAfter(start)) { key, value in
                guard key.count == 8 else { return true }
                complete = try HistoryEntry.forEachChange(in: value, writing: fieldTags, limit: limit - pending.count - looked, consider)
                return complete
            }
        } catch is RecordFormatError {
            return nil   // an entry written by a newer library, or damaged: the caller counts instead
        }
        guard complete else { return nil }
        for change in pending {
            consider(change.typeTag, change.id, change.operation, change.fieldTags.contains(where: fieldTags.contains))
        }
        return ids
    }
}

/// A point in what a reading has seen change (``StoreReading/changeCursor()``): a history
/// sequence and, for a write transaction, how many of its own uncommitted changes it held.
public struct ChangeCursor: Sendable, Hashable {
    /// The history seen.
    public let history: HistoryToken
    /// The write transaction the cursor was taken in: a number no other write transaction of
    /// this process has; 0 for a read snapshot or a cursor of history alone.
    public let transaction: UInt64
    /// That transaction's uncommitted changes at the time.
    public let pending: Int

    /// The history up to `token`, without uncommitted changes.
    public init(_ token: HistoryToken) {
        self.init(history: token, transaction: 0, pending: 0)
    }

    init(history: HistoryToken, transaction: UInt64, pending: Int) {
        self.history = history
        self.transaction = transaction
        self.pending = pending
    }
}
