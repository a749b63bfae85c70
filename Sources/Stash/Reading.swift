import Foundation
import StashLMDB

/// Reading operations shared by ``StoreSnapshot`` (a read transaction) and
/// ``StoreTransaction`` (the write transaction, which sees its own uncommitted writes).
public protocol StoreReading {
    /// The reader behind the operations; opaque.
    var reader: RecordReader { get }
}

/// The state a read needs: the store, the LMDB transaction, and the schema it sees. Opaque.
public struct RecordReader {
    let store: Store
    let txn: any TransactionReading
    /// The schema of a read snapshot; a write transaction's is its context's (it may grow).
    private let fixedCatalog: Catalog?
    /// The write transaction's state (pending counts, growing schema), if any.
    private let context: WriteContext?
    /// A read snapshot's committed state (``ReadTransaction/snapshotID``); nil in a write.
    let snapshotID: UInt64?

    init(store: Store, txn: ReadTransaction, catalog: Catalog) {
        self.store = store
        self.txn = txn
        fixedCatalog = catalog
        context = nil
        snapshotID = txn.snapshotID
    }

    init(store: Store, context: WriteContext) {
        self.store = store
        txn = context.txn
        fixedCatalog = nil
        self.context = context
        snapshotID = nil
    }

    var catalog: Catalog { context?.catalog ?? fixedCatalog! }
    var dbs: StoreDatabases { store.dbs }
    var path: String { store.path }

    /// ``layout(_:)-(String)`` of a typed record, resolved once per type.
    func layout<R: Record>(_ type: R.Type) throws -> TypeLayout {
        if let layout = catalog.layout(of: type) { return layout }
        return try layout(R.recordType)
    }

    func layout(_ name: String) throws -> TypeLayout {
        if let layout = catalog.layoutsByName[name] { return layout }
        // Perhaps another process added the type since we last looked.
        return try store.reloadCatalog(txn).layout(name, store: path)
    }

    func storedCount(_ tag: UInt16) throws -> Int {
        if let context { return try context.count(tag) }
        return try Self.count(try txn.uint64(dbs.counts, key: StoreKeys.count(tag)), of: tag, path)
    }

    /// A stored count as an `Int`; a value past `Int.max` (a damaged file) throws `.corrupted`
    /// naming the store instead of trapping.
    static func count(_ stored: UInt64?, of tag: UInt16, _ path: String) throws -> Int {
        guard let stored else { return 0 }
        guard let n = Int(exactly: stored) else {
            throw StoreError(.corrupted, "store \(path): the record count of type tag \(tag) reads \(stored), more than any store holds; the counts database is damaged (stash verify \(path) shows what else is)")
        }
        return n
    }

    /// The duplicate count of `key` in the index database.
    func indexCount(_ key: KeyBytes) throws -> Int? {
        try txn.duplicateCount(dbs.index, key: key)
    }

    /// The changes of the write transaction not yet in history (none in a read snapshot).
    var pendingChanges: [HistoryChange.Stored] { context?.changes ?? [] }

    /// The write transaction's number (0 in a read snapshot), see ``ChangeCursor/transaction``.
    var writeSerial: UInt64 { context?.serial ?? 0 }

    func bytes(_ layout: TypeLayout, _ id: RecordID) throws -> [UInt8]? {
        try txn.get(dbs.records, key: StoreKeys.record(layout.schema.tag, id))
    }

    func decode<R: Record>(_ type: R.Type, _ bytes: [UInt8], _ id: RecordID, _ layout: TypeLayout) throws -> R {
        let record: R
        do {
            record = try decodeFields(type, bytes, id, layout)
        } catch {
            throw StoreError(.corrupted, "store \(path): \(layout.schema.name) \(id) cannot be decoded as \(R.self): \(describe(error))")
        }
        // A type that does not decode its id from the key "id" (one that could not be probed
        // at open) would hand out a record under another id than the one it is stored under.
        guard record.id == id else {
            throw StoreError(.incompatibleSchema, "store \(path): \(R.self) decoded \(layout.schema.name) \(id) with the id \(record.id); its Codable must decode the record id from the coding key 'id'")
        }
        return record
    }

    /// `R` from a stored record's bytes through ``RecordDecoder``, fields in stored order; from
    /// the field table when a field the decoder took as absent is stored after all (a type
    /// that writes fields in another order than it reads them).
    private func decodeFields<R: Record>(_ type: R.Type, _ bytes: [UInt8], _ id: RecordID, _ layout: TypeLayout) throws -> R {
        try Self.decodeFields(type, bytes, id, layout)
    }

    /// ``decodeFields(_:_:_:_:)`` without a reader (a merge checks with it that what it writes
    /// reads back through the app's type).
    static func decodeFields<R: Record>(_ type: R.Type, _ bytes: [UInt8], _ id: RecordID, _ layout: TypeLayout) throws -> R {
        let decoder = try RecordDecoder(bytes: bytes, id: id, layout: layout)
        do {
            let record = try R(from: decoder)
            if try decoder.finish() { return record }
        } catch where decoder.guessedAbsent != 0 {}
        let again = try RecordDecoder(bytes: bytes, id: id, layout: layout, inOrder: false)
        let record = try R(from: again)
        _ = try again.finish()
        return record
    }

    func generic(_ bytes: [UInt8], _ id: RecordID, _ layout: TypeLayout) throws -> GenericRecord {
        var layout = layout
        let record: EncodedRecord
        do { record = try EncodedRecord(bytes) }
        catch { throw StoreError(.corrupted, "store \(path): \(layout.schema.name) \(id) cannot be decoded: \(error)") }
        if record.fields.contains(where: { layout.schema.field(tagged: $0.tag) == nil }) {
            layout = try store.reloadCatalog(txn).layout(layout.schema.name, store: path)   // written by a newer schema
        }
        return try GenericRecord(decoding: record, id: id, layout: layout)
    }

    /// Calls `body(id, bytes)` for each candidate record of a plan, until it returns false.
    func candidates(_ plan: QueryPlan, _ layout: TypeLayout, _ body: (RecordID, [UInt8]) throws -> Bool) throws {
        let tag = layout.schema.tag
        switch plan.access {
        case .recordID(let id):
            if let bytes = try bytes(layout, id) { _ = try body(id, bytes) }
        case .indexEquality:
            var key = StoreKeys.indexPrefix(tag, plan.index!.tag)
            for value in plan.equalityValues { value.appendIndexComponent(to: &key) }
            try txn.forEachDuplicate(dbs.index, key: key) { value in
                guard let id = RecordID(bytes: value[...]), let bytes = try bytes(layout, id) else { return true }
                return try body(id, bytes)
            }
        case .indexRange:
            var prefix = StoreKeys.indexPrefix(tag, plan.index!.tag)
            for value in plan.equalityValues { value.appendIndexComponent(to: &prefix) }
            var start = prefix
            plan.lower?.value.appendIndexComponent(to: &start)
            var upper: [UInt8]?
            if let bound = plan.upper {
                var key = prefix
                bound.value.appendIndexComponent(to: &key)
                upper = key.bytes
            }
            let prefixBytes = prefix.bytes
            try txn.scan(dbs.index, from: .atOrAfter(start)) { key, value in
                guard key.starts(with: prefixBytes) else { return false }
                if let upper, !key.starts(with: upper), upper.lexicographicallyPrecedes(key) { return false }
                guard let id = RecordID(bytes: value[...]), let bytes = try bytes(layout, id) else { return true }
                return try body(id, bytes)
            }
        case .scan:
            try txn.scan(dbs.records, prefix: StoreKeys.typePrefix(tag)) { key, value in
                guard let id = StoreKeys.id(fromRecordKey: key) else { return true }
                return try body(id, value)
            }
        }
    }

    func plan<R: Record>(_ descriptor: FetchDescriptor<R>) throws -> (QueryPlan, TypeLayout) {
        let layout = try layout(R.self)
        guard let predicate = descriptor.predicate else {
            return (QueryPlanner.plan(type: layout.schema, conditions: [], hasResidual: false), layout)
        }
        let (conditions, residual) = PredicateAnalyzer.conditions(of: predicate)
        return (QueryPlanner.plan(type: layout.schema, conditions: conditions, hasResidual: residual), layout)
    }

    /// Records matching `descriptor`; `limit` is applied here only when there is no sort.
    func matches<R: Record>(_ descriptor: FetchDescriptor<R>, _ plan: QueryPlan, _ layout: TypeLayout,
                            _ body: (R) throws -> Bool) throws {
        try candidates(plan, layout) { id, bytes in
            let record = try decode(R.self, bytes, id, layout)
            if let predicate = descriptor.predicate {
                do { guard try predicate.evaluate(record) else { return true } }
                catch { throw StoreError(.invalidValue, "store \(path): the predicate failed on \(layout.schema.name) \(id): \(error)") }
            }
            return try body(record)
        }
    }
}

extension StoreReading {
    /// The record with `id`, or nil. O(log n): one B-tree lookup and a decode.
    public func get<R: Record>(_ type: R.Type, id: RecordID) throws -> R? {
        let reader = reader   // one copy of the reader, not one per use
        let layout = try reader.layout(R.self)
        guard let bytes = try reader.bytes(layout, id) else { return nil }
        return try reader.decode(R.self, bytes, id, layout)
    }

    /// The number of records of a type. O(1): one lookup in `counts`.
    public func count<R: Record>(_ type: R.Type) throws -> Int {
        let reader = reader   // one copy of the reader, not one per use
        return try reader.storedCount(try reader.layout(R.self).schema.tag)
    }

    /// The number of records whose `keyPath` equals `value`.
    ///
    /// O(1) with a single-field index on `keyPath` (one `mdb_cursor_count`); otherwise the
    /// same answer from a prefix scan of a composite index or a full scan. A property the
    /// record's `encode(to:)` stores in another form than its type's (a UUID as text, say), or
    /// one a type the open cannot probe does not store under its name (a computed or renamed
    /// property), is compared on each decoded record: O(records of the type).
    public func count<R: Record, V: IndexableValue>(_ type: R.Type, where keyPath: KeyPath<R, V>, equals value: V) throws -> Int {
        let reader = reader   // one copy of the reader, not one per use
        if let n = try reader.catalog.exactIndexCount(keyPath, R.self, equals: value, reader.indexCount) { return n }
        let name = fieldName(of: keyPath)
        let encoded: FieldValue
        do {
            encoded = try FieldValue(encoding: value)
        } catch {
            throw StoreError(.invalidValue, "store \(reader.path): the value counted by \(R.recordType).\(name) cannot be encoded: \(error)")
        }
        let condition = QueryCondition(field: name, op: .equal, value: encoded)
        let layout = try reader.layout(R.self)
        let field = layout.schema.field(named: condition.field)
        if condition.field != "id" && field == nil, DeclaredFields.names(of: R.self) == nil, !condition.field.contains(".") {
            // A name a type the open cannot probe has not stored: a property no stored record
            // has a value of yet, or one it stores under another name or not at all (computed).
            return try countDecoding(keyPath, equals: condition.value)
        }
        if let stored = field?.kind, let kind = condition.value.kind, kind != stored {
            // Stored in another form: the stored values say nothing about the property's.
            return try countDecoding(keyPath, equals: condition.value)
        }
        return try count(typeNamed: R.recordType, where: [condition])
    }

    /// The records of `R` whose value at `keyPath`, encoded, is `expected`: each record decoded.
    func countDecoding<R: Record, V: IndexableValue>(_ keyPath: KeyPath<R, V>, equals expected: FieldValue) throws -> Int {
        let all = FetchDescriptor<R>()
        let (plan, layout) = try reader.plan(all)
        var n = 0
        try reader.matches(all, plan, layout) { record in
            if try FieldValue(encoding: record[keyPath: keyPath]) == expected { n += 1 }
            return true
        }
        return n
    }

    /// The records matching `descriptor`, sorted and limited as it says. Records that sort
    /// equal come in id order. Without sort descriptors the order is the plan's (index or id
    /// order), so combine `fetchLimit` with a sort when the subset matters.
    /// - Throws: `.invalidValue` for a negative `fetchLimit` or `fetchOffset`.
    public func fetch<R: Record>(_ descriptor: FetchDescriptor<R>) throws -> [R] {
        let reader = reader   // one copy of the reader, not one per use
        for (name, value) in [("fetchLimit", descriptor.fetchLimit), ("fetchOffset", descriptor.fetchOffset)] {
            if let value, value < 0 {
                throw StoreError(.invalidValue, "store \(reader.path): \(name) of a fetch of \(R.recordType) is \(value); it counts records, so give 0 or more (nil: no \(name == "fetchLimit" ? "limit" : "offset"))")
            }
        }
        let (plan, layout) = try reader.plan(descriptor)
        var results: [R] = []
        let offset = descriptor.fetchOffset ?? 0
        // Saturating: `Int.max` as a limit means no limit, whatever the offset.
        let early = descriptor.sortBy.isEmpty ? descriptor.fetchLimit.map { $0 > Int.max - offset ? Int.max : $0 + offset } : nil
        try reader.matches(descriptor, plan, layout) { record in
            results.append(record)
            return early.map { results.count < $0 } ?? true
        }
        if !descriptor.sortBy.isEmpty {
            results.sort { a, b in
                for sort in descriptor.sortBy {
                    switch sort.compare(a, b) {
                    case .orderedAscending: return true
                    case .orderedDescending: return false
                    case .orderedSame: continue
                    }
                }
                return a.id < b.id   // ties: id order, so the result never depends on the plan
            }
        }
        let start = min(offset, results.count)
        let end = descriptor.fetchLimit.map { min(results.count - start, $0) + start } ?? results.count
        return Array(results[start..<end])
    }

    /// The number of records matching `descriptor`'s predicate (limit and offset ignored).
    /// O(1) when the plan is an index equality with nothing left to filter.
    public func fetchCount<R: Record>(_ descriptor: FetchDescriptor<R>) throws -> Int {
        let reader = reader   // one copy of the reader, not one per use
        if let expression = descriptor.expression,
           let n = try PredicateAnalyzer.exactIndexCount(of: expression, descriptor, in: reader.catalog, reader.indexCount) {
            return n
        }
        let (plan, layout) = try reader.plan(descriptor)
        if descriptor.predicate == nil { return try reader.storedCount(layout.schema.tag) }
        if plan.isExactIndexCount {
            var key = StoreKeys.indexPrefix(layout.schema.tag, plan.index!.tag)
            for value in plan.equalityValues { value.appendIndexComponent(to: &key) }
            return try reader.txn.duplicateCount(reader.dbs.index, key: key)
        }
        var n = 0
        try reader.matches(descriptor, plan, layout) { _ in n += 1; return true }
        return n
    }

    /// The plan the store would use for `descriptor`.
    public func explain<R: Record>(_ descriptor: FetchDescriptor<R>) throws -> QueryPlan {
        try reader.plan(descriptor).0
    }

    // MARK: Generic (schema-driven) reads

    /// A record read through the stored schema, without its Swift type.
    public func get(typeNamed type: String, id: RecordID) throws -> GenericRecord? {
        let layout = try reader.layout(type)
        return try reader.bytes(layout, id).map { try reader.generic($0, id, layout) }
    }

    /// Calls `body` with every record of a type in id order, until it returns false.
    public func forEachRecord(typeNamed type: String, _ body: (GenericRecord) throws -> Bool) throws {
        let layout = try reader.layout(type)
        let plan = QueryPlanner.plan(type: layout.schema, conditions: [], hasResidual: false)
        try reader.candidates(plan, layout) { id, bytes in try body(try reader.generic(bytes, id, layout)) }
    }

    /// The number of records of a type. O(1).
    public func count(typeNamed type: String) throws -> Int {
        try reader.storedCount(try reader.layout(type).schema.tag)
    }

    /// Records of `type` satisfying every condition, planned like a predicate; at most `limit`.
    /// - Throws: `.invalidValue` for a negative `limit`.
    public func fetch(typeNamed type: String, where conditions: [QueryCondition], limit: Int? = nil) throws -> [GenericRecord] {
        if let limit, limit < 0 {
            throw StoreError(.invalidValue, "store \(reader.path): limit of a fetch of \(type) is \(limit); it counts records, so give 0 or more (nil: no limit)")
        }
        let layout = try reader.layout(type)
        try validate(conditions, layout)
        if limit == 0 { return [] }
        let plan = QueryPlanner.plan(type: layout.schema, conditions: conditions, hasResidual: false)
        var results: [GenericRecord] = []
        try reader.candidates(plan, layout) { id, bytes in
            let record = try reader.generic(bytes, id, layout)
            if conditions.allSatisfy({ $0.matches($0.field == "id" ? .uuid(id.uuid) : record.fields[$0.field] ?? .null) }) {
                results.append(record)
            }
            return limit.map { results.count < $0 } ?? true
        }
        return results
    }

    /// The number of records of `type` satisfying every condition; O(1) for an equality on a
    /// whole index key.
    public func count(typeNamed type: String, where conditions: [QueryCondition]) throws -> Int {
        let layout = try reader.layout(type)
        if conditions.isEmpty { return try reader.storedCount(layout.schema.tag) }
        let plan = try explain(typeNamed: type, where: conditions)
        if plan.isExactIndexCount {
            var key = StoreKeys.indexPrefix(layout.schema.tag, plan.index!.tag)
            for value in plan.equalityValues { value.appendIndexComponent(to: &key) }
            return try reader.txn.duplicateCount(reader.dbs.index, key: key)
        }
        return try fetch(typeNamed: type, where: conditions).count
    }

    /// The plan for a generic query.
    public func explain(typeNamed type: String, where conditions: [QueryCondition]) throws -> QueryPlan {
        let layout = try reader.layout(type)
        try validate(conditions, layout)
        return QueryPlanner.plan(type: layout.schema, conditions: conditions, hasResidual: false)
    }

    private func validate(_ conditions: [QueryCondition], _ layout: TypeLayout) throws {
        for condition in conditions where condition.field != "id" && layout.schema.field(named: condition.field) == nil {
            let known = layout.schema.fields.map(\.name).sorted().joined(separator: ", ")
            throw StoreError(.unknownField, "store \(reader.path): \(layout.schema.name) has no field '\(condition.field)' (fields: \(known))")
        }
    }
}

extension StoreReading {
    /// The store this snapshot or transaction reads.
    public var store: Store { reader.store }
}

/// A consistent read-only view of the store; valid inside ``Store/read(_:)`` only.
public struct StoreSnapshot: StoreReading {
    public let reader: RecordReader
    let txn: ReadTransaction

    init(store: Store, txn: ReadTransaction, catalog: Catalog) {
        self.txn = txn
        reader = RecordReader(store: store, txn: txn, catalog: catalog)
    }
}

/// The write transaction of ``Store/write(author:isolation:_:)``: reads see this transaction's own
/// writes; every write updates record, indexes, counts and history together.
public struct StoreTransaction: StoreReading {
    let context: WriteContext
    public let reader: RecordReader

    init(context: WriteContext, store: Store) {
        self.context = context
        reader = RecordReader(store: store, context: context)
    }

    /// Adds a record. - Throws: `.duplicateID` if the id exists, `.uniqueViolation`.
    public func insert<R: Record>(_ record: R) throws {
        let (layout, encoded) = try context.encode(record)
        try context.put(layout, id: record.id, record: encoded, mode: .insert)
    }

    /// Adds or replaces a record.
    public func upsert<R: Record>(_ record: R) throws {
        let (layout, encoded) = try context.encode(record)
        try context.put(layout, id: record.id, record: encoded, mode: .upsert, keepingFieldsUnknownTo: R.self)
    }

    /// Replaces an existing record. - Throws: `.notFound` when there is none.
    public func update<R: Record>(_ record: R) throws {
        let (layout, encoded) = try context.encode(record)
        try context.put(layout, id: record.id, record: encoded, mode: .update, keepingFieldsUnknownTo: R.self)
    }

    /// Reads, changes and writes back one record. - Throws: `.notFound`; `.invalidValue` when
    /// `body` changes the record's id.
    @discardableResult
    public func update<R: Record>(_ type: R.Type, id: RecordID, _ change: (inout R) throws -> Void) throws -> R {
        guard var record = try get(type, id: id) else {
            throw StoreError(.notFound, "store \(reader.path): no \(R.recordType) with id \(id) to update")
        }
        try change(&record)
        guard record.id == id else {
            throw StoreError(.invalidValue, "store \(reader.path): an update changed the id of \(R.recordType) \(id); insert a new record instead")
        }
        try update(record)
        return record
    }

    /// Deletes a record. - Returns: false when there was none.
    @discardableResult
    public func delete<R: Record>(_ type: R.Type, id: RecordID) throws -> Bool {
        try context.removeApplyingDeleteRules(try context.layout(R.recordType), id: id)
    }

    /// Writes a record given as field values through the stored schema (for apps and tools
    /// without the type's Swift code, such as the `stash` command line). The record is stored
    /// as given: `replacing` an existing one replaces all of its fields.
    ///
    /// It is checked against the type's stored schema first, so that every record it stores
    /// reads back through the type's ``Record`` code:
    /// - Throws: `.unknownType`; `.unknownField` for a field the type's schema lacks (a
    ///   misspelt name), unless the type learns its fields from the values written (see
    ///   ``TypeDeclaration/fields``); `.invalidValue` for a value of another kind than its
    ///   field's (an int for a double field is stored as that double, when exact), for a
    ///   required field (not optional, no default) left out or null, and for a counter field
    ///   holding anything but a ``Counter``'s state; `.duplicateID` when not `replacing` and
    ///   the id exists; `.uniqueViolation`.
    public func put(_ record: GenericRecord, replacing: Bool = true) throws {
        let record = try context.checkedForGenericPut(record, learnsFields: reader.store.typesLearningFields.contains(record.type))
        let (layout, encoded) = try context.encode(record)
        try context.put(layout, id: record.id, record: encoded, mode: replacing ? .upsert : .insert)
    }

    /// Deletes a record by type name. - Returns: false when there was none.
    @discardableResult
    public func delete(typeNamed type: String, id: RecordID) throws -> Bool {
        try context.removeApplyingDeleteRules(try context.layout(type), id: id)
    }
}
