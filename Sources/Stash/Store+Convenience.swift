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
    /// Changes one record in its own transaction. - Throws: `.notFound`; `.invalidValue` when
    /// `body` changes the record's id.
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
            if name == "id" {
                // `.index(\.id)` is refused at open: the id is the key records are stored under.
                throw StoreError(.noSuchIndex, "store \(path): \(R.recordType).id is the key its records are stored under, not a field an index can hold (each id is one record); to count records per parent, index the field that holds the parent's id (.index(\\.homeID), say)")
            }
            throw StoreError(.noSuchIndex, "store \(path): \(R.recordType) has no index on '\(name)' alone; declare .index(\\.\(name)) in \(R.recordType).indexes")
        }
        let confirmed = ConfirmedGeneration(catalog.generation, IndexFieldState(V.self, layout.schema.field(named: name)?.kind))
        return IndexHandle(typeTag: layout.schema.tag, indexTag: index.tag, field: name, keyPath: UncheckedKeyPath(keyPath),
                           database: dbs.index, storeID: storeID, confirmedGeneration: confirmed)
    }

    /// The number of records whose indexed field equals `value`.
    ///
    /// O(1) and allocation-free once warm: the key is built on the stack, then one
    /// `mdb_cursor_count` on a cached cursor of a recycled read transaction. Strings longer
    /// than the indexed prefix (120 UTF-8 bytes) are counted exactly by checking candidates.
    /// A property the record's `encode(to:)` stores in another form than its type's (a UUID
    /// as text, say), and a ``FieldValue`` array or map (indexed by its bytes, not a canonical
    /// form), are compared on each decoded record: O(records of the type).
    public func count<R: Record, V: IndexableValue>(_ index: IndexHandle<R, V>, equals value: V) throws -> Int {
        if isNaNIndexValue(value) { return 0 }   // NaN equals nothing, not the stored NaNs
        var key = StoreKeys.indexPrefix(index.typeTag, index.indexTag)
        value.appendIndexComponent(to: &key)
        // A type of the app's own, a string longer than the indexed prefix, a field stored in
        // another form, or an array or map: the snapshot's count builds the key from the
        // stored form and rechecks candidates, or reads the records.
        try checkOpen()
        if !key.isLossy && V.indexComponentMatchesStoredForm && !isUncanonicalIndexValue(value), let n = try storageErrors(path, {
            try env.read { txn -> Int? in
                guard try index.confirm(in: try catalog(for: txn), of: self).keyMatchesStoredKind else { return nil }
                return try txn.duplicateCount(dbs.index, key: key)
            }
        }) {
            return n
        }
        return try read { snapshot in try snapshot.count(index, equals: value) }
    }

    /// Runs `body` with the schema of a recycled read transaction and a one-`mdb_cursor_count`
    /// counter of index keys in it: no snapshot object for the O(1) counts.
    private func indexCount(_ body: (Catalog, (KeyBytes) throws -> Int?) throws -> Int?) throws -> Int? {
        try checkOpen()
        return try storageErrors(path) {
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
    /// The indexed property, for counting a field stored in another form (see ``count(_:equals:)``).
    let keyPath: UncheckedKeyPath<R, V>
    let database: Database
    /// The store the handle was made in (a copy of it has the same id, and the same tags).
    let storeID: RecordID
    /// The schema generation in which the index was last seen.
    let confirmedGeneration: ConfirmedGeneration

    /// The field's stored kind in `catalog`, and whether keys built from a `V` are what the
    /// index holds.
    ///
    /// Throws `.noSuchIndex` when the index is not in `catalog` (another process dropped it
    /// since the handle was made), `.invalidValue` for a handle of another store (its tags
    /// name other things there). Two comparisons while the schema does not change.
    @discardableResult
    func confirm(in catalog: Catalog, of store: Store) throws -> IndexFieldState {
        try confirmIndex(typeTag: typeTag, indexTag: indexTag, field: field, recordType: R.recordType, valueType: V.self,
                         storeID: storeID, confirmedGeneration, in: catalog, of: store)
    }
}

/// ``IndexHandle/confirm(in:of:)`` with the handle's parts: the same for a handle whose types
/// are erased (``RecordIDIndex``). `recordType` is read only when the schema changed, or to
/// say what went wrong.
private func confirmIndex(typeTag: UInt16, indexTag: UInt16, field: String, recordType: @autoclosure () -> String, valueType: Any.Type,
                          storeID: RecordID, _ confirmedGeneration: ConfirmedGeneration, in catalog: Catalog, of store: Store) throws -> IndexFieldState {
    guard store.storeID == storeID else {
        throw StoreError(.invalidValue, "store \(store.path): this handle on \(recordType()).\(field) was made by another store (\(storeID)); make one with index(_:) of this store")
    }
    let generation = catalog.generation
    let confirmed = confirmedGeneration.value.load(ordering: .relaxed)
    if confirmed >> IndexFieldState.bits == generation { return IndexFieldState(bits: confirmed) }
    let type = catalog.layoutsByTag[typeTag]?.schema
    guard let type, type.name == recordType(), type.indexes.contains(where: { $0.tag == indexTag && $0.fields == [field] }) else {
        throw StoreError(.noSuchIndex, "store \(store.path): the index of \(recordType()) on '\(field)' was dropped since this handle was made (another process opened the store with dropsUndeclaredIndexes); declare it again, or count without the handle")
    }
    let state = IndexFieldState(valueType, type.field(named: field)?.kind)
    confirmedGeneration.value.store(state.packed(generation), ordering: .relaxed)
    return state
}

/// An ``IndexHandle`` on a record-id field with its types erased, for counting through it from
/// code that is generic over the record type in another module (StashGate's limits): the
/// generic ``StoreReading/count(_:equals:)`` is not specialized there, and looks up the
/// handle's type metadata at every call (about a thousand instructions, measured with
/// callgrind). It shares the handle's confirmed schema generation.
package struct RecordIDIndex: Sendable {
    let typeTag: UInt16
    let indexTag: UInt16
    let field: String
    let recordType: String
    let database: Database
    let storeID: RecordID
    let confirmedGeneration: ConfirmedGeneration
}

extension IndexHandle where V == RecordID {
    /// This handle with its types erased.
    package var erased: RecordIDIndex {
        RecordIDIndex(typeTag: typeTag, indexTag: indexTag, field: field, recordType: R.recordType, database: database,
                      storeID: storeID, confirmedGeneration: confirmedGeneration)
    }
}

extension StoreReading {
    /// ``count(_:equals:)`` through the erased handle: the same answer, O(1), no allocation.
    /// nil when the record's `encode(to:)` stores the field in another form than a record id:
    /// count through the typed handle then, which compares decoded records.
    package func count(_ index: RecordIDIndex, equals value: RecordID) throws -> Int? {
        let reader = reader   // one copy of the reader, not one per use
        let field = try confirmIndex(typeTag: index.typeTag, indexTag: index.indexTag, field: index.field, recordType: index.recordType,
                                     valueType: RecordID.self, storeID: index.storeID, index.confirmedGeneration,
                                     in: reader.catalog, of: reader.store)
        guard field.keyMatchesStoredKind else { return nil }
        var key = StoreKeys.indexPrefix(index.typeTag, index.indexTag)
        IndexComponent.recordID(value, &key)
        return try reader.txn.duplicateCount(index.database, key: key)
    }
}

/// What a handle knows of its field in one schema generation: its stored kind, and whether a
/// key built from the handle's value type is what the index holds (see
/// ``indexKeyMatchesStoredKind(_:_:)``).
struct IndexFieldState {
    let storedKind: FieldKind?
    let keyMatchesStoredKind: Bool

    init(_ valueType: Any.Type, _ storedKind: FieldKind?) {
        self.storedKind = storedKind
        keyMatchesStoredKind = indexKeyMatchesStoredKind(valueType, storedKind)
    }

    /// The low bits of a ``ConfirmedGeneration``'s value; the generation is above them.
    static let bits: UInt64 = 5

    /// Read at every count through a handle: no allocation (as `allCases` would make).
    init(bits packed: UInt64) {
        switch packed & 0xF {
        case 1: storedKind = .bool
        case 2: storedKind = .int
        case 3: storedKind = .double
        case 4: storedKind = .string
        case 5: storedKind = .bytes
        case 6: storedKind = .uuid
        case 7: storedKind = .date
        case 8: storedKind = .array
        case 9: storedKind = .map
        default: storedKind = nil
        }
        keyMatchesStoredKind = packed & 0x10 != 0
    }

    func packed(_ generation: UInt64) -> UInt64 {
        let code: UInt64
        switch storedKind {
        case nil: code = 0
        case .bool: code = 1
        case .int: code = 2
        case .double: code = 3
        case .string: code = 4
        case .bytes: code = 5
        case .uuid: code = 6
        case .date: code = 7
        case .array: code = 8
        case .map: code = 9
        }
        return generation << Self.bits | (keyMatchesStoredKind ? 0x10 : 0) | code
    }
}

/// A schema generation with the ``IndexFieldState`` in it, updated as a handle finds its
/// index still there: one atomic word, so that the two never disagree.
final class ConfirmedGeneration: Sendable {
    let value: Atomic<UInt64>
    init(_ generation: UInt64, _ state: IndexFieldState) { value = Atomic(state.packed(generation)) }
}

/// Key paths are immutable; the wrapper lets a Sendable handle hold one.
struct UncheckedKeyPath<R, V>: @unchecked Sendable {
    let keyPath: KeyPath<R, V>
    init(_ keyPath: KeyPath<R, V>) { self.keyPath = keyPath }
}

extension StoreReading {
    /// The number of records whose indexed field equals `value` (0 for NaN, which equals
    /// nothing). O(1), no allocation; O(records of the type) for a property the record's
    /// `encode(to:)` stores in another form than its type's (a UUID as text, say), and for a
    /// ``FieldValue`` array or map, compared on each decoded record.
    public func count<R: Record, V: IndexableValue>(_ index: IndexHandle<R, V>, equals value: V) throws -> Int {
        if isNaNIndexValue(value) { return 0 }
        let reader = reader   // one copy of the reader, not one per use
        let field = try index.confirm(in: reader.catalog, of: reader.store)
        guard field.keyMatchesStoredKind, !isUncanonicalIndexValue(value) else { return try countDecoding(index.keyPath.keyPath, equals: try FieldValue(encoding: value)) }
        var key = StoreKeys.indexPrefix(index.typeTag, index.indexTag)
        if V.indexComponentMatchesStoredForm {
            value.appendIndexComponent(to: &key)
        } else {
            // As the index stores it, when the record stores it as its type encodes it.
            let encoded = try FieldValue(encoding: value)
            if let kind = encoded.kind, let stored = field.storedKind, kind != stored {
                return try countDecoding(index.keyPath.keyPath, equals: encoded)
            }
            encoded.appendIndexComponent(to: &key)
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
