import Foundation
import StashLMDB
import Synchronization

// One-transaction shortcuts: each call below is its own read or write transaction.
// Batch several writes in one `write { }` for speed and atomicity.
extension Store {
    /// Adds a record in its own transaction. - Throws: `.duplicateID`, `.uniqueViolation`.
    public func insert<R: Record>(_ record: R) throws { try write { try $0.insert(record) } }
    /// Adds or replaces a record in its own transaction.
    public func upsert<R: Record>(_ record: R) throws { try write { try $0.upsert(record) } }
    /// Replaces an existing record in its own transaction. - Throws: `.notFound`.
    public func update<R: Record>(_ record: R) throws { try write { try $0.update(record) } }
    /// Changes one record in its own transaction. - Throws: `.notFound`.
    @discardableResult
    public func update<R: Record>(_ type: R.Type, id: RecordID, _ change: (inout R) throws -> Void) throws -> R {
        try write { try $0.update(type, id: id, change) }
    }
    /// Deletes a record in its own transaction. - Returns: false when there was none.
    @discardableResult
    public func delete<R: Record>(_ type: R.Type, id: RecordID) throws -> Bool { try write { try $0.delete(type, id: id) } }

    /// The record with `id`, or nil.
    ///
    /// Inlinable, so that the caller's code knows `R?` statically: a generic call asks the
    /// runtime for `Optional<R>`'s metadata at every read.
    @inlinable
    public func get<R: Record>(_ type: R.Type, id: RecordID) throws -> R? { try read { try $0.get(type, id: id) } }
    /// The number of records of a type. O(1).
    public func count<R: Record>(_ type: R.Type) throws -> Int { try read { try $0.count(type) } }
    /// The number of records whose `keyPath` equals `value`; O(1) with a single-field index.
    /// For the hottest paths, resolve an ``IndexHandle`` once with ``index(_:)`` instead.
    public func count<R: Record, V: IndexableValue>(_ type: R.Type, where keyPath: KeyPath<R, V>, equals value: V) throws -> Int {
        // As through a handle: the index is resolved once per key path.
        if let n = try indexCount({ catalog, count in try catalog.exactIndexCount(keyPath, R.self, equals: value, count) }) { return n }
        return try read { try $0.count(type, where: keyPath, equals: value) }
    }
    /// The records matching `descriptor`.
    public func fetch<R: Record>(_ descriptor: FetchDescriptor<R>) throws -> [R] { try read { try $0.fetch(descriptor) } }
    /// The number of records matching `descriptor`'s predicate.
    public func fetchCount<R: Record>(_ descriptor: FetchDescriptor<R>) throws -> Int {
        // `field == constant` on a single-field index: one count, as through a handle.
        if let expression = descriptor.expression,
           let n = try indexCount({ catalog, count in try PredicateAnalyzer.exactIndexCount(of: expression, descriptor, in: catalog, count) }) {
            return n
        }
        return try read { try $0.fetchCount(descriptor) }
    }
    /// The plan the store would use for `descriptor`.
    public func explain<R: Record>(_ descriptor: FetchDescriptor<R>) throws -> QueryPlan { try read { try $0.explain(descriptor) } }

    /// A handle on the single-field index of `keyPath`, for allocation-free O(1) counts.
    /// - Throws: `.noSuchIndex` when `R` declares no index whose only field is `keyPath`.
    public func index<R: Record, V: IndexableValue>(_ keyPath: KeyPath<R, V>) throws -> IndexHandle<R, V> {
        let name = fieldName(of: keyPath)
        let catalog = self.catalog   // once: the handle is confirmed in the schema it was found in
        let layout = try catalog.layout(R.recordType, store: path)
        guard let index = layout.schema.indexes.first(where: { $0.fields == [name] }) else {
            throw StoreError(.noSuchIndex, "store \(path): \(R.recordType) has no index on '\(name)' alone; declare .index(\\.\(name)) in \(R.recordType).indexes")
        }
        return IndexHandle(typeTag: layout.schema.tag, indexTag: index.tag, field: name, database: dbs.index,
                           storeID: storeID, confirmedGeneration: ConfirmedGeneration(catalog.generation))
    }

    /// The number of records whose indexed field equals `value`.
    ///
    /// O(1) and allocation-free once warm: the key is built on the stack, then one
    /// `mdb_cursor_count` on a cached cursor of a recycled read transaction. Strings longer
    /// than the indexed prefix (120 UTF-8 bytes) are counted exactly by checking candidates.
    public func count<R: Record, V: IndexableValue>(_ index: IndexHandle<R, V>, equals value: V) throws -> Int {
        if isNaNIndexValue(value) { return 0 }   // NaN equals nothing, not the stored NaNs
        var key = StoreKeys.indexPrefix(index.typeTag, index.indexTag)
        value.appendIndexComponent(to: &key)
        // A type of the app's own, or a string longer than the indexed prefix: the snapshot's
        // count builds the key from the stored form and rechecks candidates.
        if key.isLossy || !V.indexComponentMatchesStoredForm { return try read { snapshot in try snapshot.count(index, equals: value) } }
        return try storageErrors(path) {
            try env.read { txn in
                try index.confirm(in: try catalog(for: txn), of: self)
                return try txn.duplicateCount(dbs.index, key: key)
            }
        }
    }

    /// Runs `body` with the schema of a recycled read transaction and a one-`mdb_cursor_count`
    /// counter of index keys in it: no snapshot object for the O(1) counts.
    private func indexCount(_ body: (Catalog, (KeyBytes) throws -> Int?) throws -> Int?) throws -> Int? {
        try storageErrors(path) {
            try env.read { txn in try body(try catalog(for: txn)) { key in try txn.duplicateCount(dbs.index, key: key) } }
        }
    }

    /// The number of records of `type` in `index`'s store, O(1) (see ``count(_:)``), for use next
    /// to index counts without a type lookup.
    public func count<R: Record, V: IndexableValue>(all index: IndexHandle<R, V>) throws -> Int {
        try read { try $0.count(all: index) }
    }
}

/// A resolved single-field index: counting through it costs one `mdb_cursor_count`.
public struct IndexHandle<R: Record, V: IndexableValue>: Sendable {
    let typeTag: UInt16
    let indexTag: UInt16
    /// The indexed field.
    public let field: String
    let database: Database
    /// The store the handle was made in (a copy of it has the same id, and the same tags).
    let storeID: RecordID
    /// The schema generation in which the index was last seen.
    let confirmedGeneration: ConfirmedGeneration

    /// Throws `.noSuchIndex` when the index is not in `catalog` (another process dropped it
    /// since the handle was made), `.invalidValue` for a handle of another store (its tags
    /// name other things there). Two comparisons while the schema does not change.
    func confirm(in catalog: Catalog, of store: Store) throws {
        guard store.storeID == storeID else {
            throw StoreError(.invalidValue, "store \(store.path): this handle on \(R.recordType).\(field) was made by another store (\(storeID)); make one with index(_:) of this store")
        }
        let path = store.path
        let generation = catalog.generation
        if generation == confirmedGeneration.value.load(ordering: .relaxed) { return }
        let type = catalog.layoutsByTag[typeTag]?.schema
        guard let type, type.name == R.recordType, type.indexes.contains(where: { $0.tag == indexTag && $0.fields == [field] }) else {
            throw StoreError(.noSuchIndex, "store \(path): the index of \(R.recordType) on '\(field)' was dropped since this handle was made (another process opened the store with dropsUndeclaredIndexes); declare it again, or count without the handle")
        }
        confirmedGeneration.value.store(generation, ordering: .relaxed)
    }
}

/// A schema generation, updated as handles find their index still there.
final class ConfirmedGeneration: Sendable {
    let value: Atomic<UInt64>
    init(_ generation: UInt64) { value = Atomic(generation) }
}

extension StoreReading {
    /// The number of records whose indexed field equals `value` (0 for NaN, which equals
    /// nothing). O(1), no allocation.
    public func count<R: Record, V: IndexableValue>(_ index: IndexHandle<R, V>, equals value: V) throws -> Int {
        if isNaNIndexValue(value) { return 0 }
        try index.confirm(in: reader.catalog, of: reader.store)
        var key = StoreKeys.indexPrefix(index.typeTag, index.indexTag)
        if V.indexComponentMatchesStoredForm {
            value.appendIndexComponent(to: &key)
        } else {
            try FieldValue(encoding: value).appendIndexComponent(to: &key)   // as the index stores it
        }
        if !key.isLossy { return try reader.txn.duplicateCount(index.database, key: key) }
        // A string longer than the indexed prefix: check each candidate's real value.
        let expected = try FieldValue(encoding: value)
        let layout = try reader.layout(R.self)
        var n = 0
        try reader.txn.forEachDuplicate(index.database, key: key) { idBytes in
            guard let id = RecordID(bytes: idBytes[...]), let bytes = try reader.bytes(layout, id) else { return true }
            if try fieldValue(index.field, layout, EncodedRecord(bytes)) == expected { n += 1 }
            return true
        }
        return n
    }
}
