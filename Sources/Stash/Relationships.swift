import Foundation
import StashLMDB

/// What deleting a parent record does to the records that refer to it (see
/// ``RecordReference``).
public enum DeleteRule: String, Codable, Sendable, CaseIterable {
    /// The children are deleted with the parent, in the same transaction (and their own
    /// children by their rules).
    case cascade
    /// The delete throws ``StoreError/Code/deleteDenied`` naming the children while any
    /// exists; nothing changes.
    case deny
    /// The children's reference is set to nil (the field must be optional).
    case nullify
}

/// A field of a record that holds the id of a parent record of another type (or of its own),
/// with the rule that deleting the parent applies to the record.
///
/// ```swift
/// struct Item: Record {
///     var id = RecordID()
///     var homeID: RecordID
///     var name: String
///     static let references: [RecordReference<Item>] = [.reference(\.homeID, to: Home.self, onDelete: .cascade)]
/// }
/// try store.delete(Home.self, id: home.id)   // its items go in the same transaction
/// ```
///
/// The store keeps references exact: a write that leaves a record referring to a parent
/// that does not exist throws ``StoreError/Code/parentNotFound`` (judged when the write
/// closure returns, so parent and child may be inserted in either order in one
/// transaction); deleting a parent applies the rule to its children. The field gets an index
/// of its own when no declared index starts with it (children are found through it).
///
/// Across sync, rules are applied by the merge, in the transaction that merges a delta, the
/// same way on every replica: a child that a merge leaves referring to a deleted parent
/// (a home deleted on one device while an item was added to it on another, in either order)
/// is deleted (``DeleteRule/cascade`` and ``DeleteRule/deny``: a delete made elsewhere cannot
/// be refused here) or has its reference cleared (``DeleteRule/nullify``), and that change
/// is sent on like a local write. A parent a merge removes because another record holds its
/// unique value (``UniqueClash``) hands its children to the record that keeps the value.
/// A child whose parent has not arrived yet (never seen here) is kept as it is.
public struct RecordReference<R: Record>: Sendable {
    /// The stored field holding the parent's id.
    public let field: String
    /// The parent's record type (``Record/recordType``).
    public let parentType: String
    /// What deleting the parent does to the record.
    public let onDelete: DeleteRule

    /// A reference from `keyPath` to a record of `parent`.
    public static func reference<P: Record>(_ keyPath: KeyPath<R, RecordID>, to parent: P.Type, onDelete: DeleteRule) -> Self {
        Self(field: fieldName(of: keyPath), parentType: P.recordType, onDelete: onDelete)
    }

    /// An optional reference (nil refers to nothing) from `keyPath` to a record of `parent`.
    public static func reference<P: Record>(_ keyPath: KeyPath<R, RecordID?>, to parent: P.Type, onDelete: DeleteRule) -> Self {
        Self(field: fieldName(of: keyPath), parentType: P.recordType, onDelete: onDelete)
    }

    var declaration: ReferenceDeclaration { ReferenceDeclaration(field: field, to: parentType, onDelete: onDelete) }
}

/// A reference as the schema keeps it (``TypeSchema/references``) and as a schema file
/// declares it: `{"field": "homeID", "to": "Home", "onDelete": "cascade"}`.
public struct ReferenceDeclaration: Codable, Sendable, Equatable, CustomStringConvertible {
    /// The field of the referring type that holds the parent's id (kind `uuid`).
    public var field: String
    /// The parent type.
    public var to: String
    /// What deleting a parent does to the records that refer to it.
    public var onDelete: DeleteRule

    public init(field: String, to: String, onDelete: DeleteRule) {
        self.field = field
        self.to = to
        self.onDelete = onDelete
    }

    enum CodingKeys: String, CodingKey, CaseIterable { case field, to, onDelete }

    public init(from decoder: any Decoder) throws {
        try refuseUnknownKeys(decoder, CodingKeys.self)
        let c = try decoder.container(keyedBy: CodingKeys.self)
        field = try c.decode(String.self, forKey: .field)
        to = try c.decode(String.self, forKey: .to)
        let rule = try c.decode(String.self, forKey: .onDelete)
        guard let parsed = DeleteRule(rawValue: rule) else {
            throw DecodingError.dataCorruptedError(forKey: .onDelete, in: c, debugDescription:
                "unknown delete rule '\(rule)' for the reference \(field) (rules: \(DeleteRule.allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        onDelete = parsed
    }

    public var description: String { "\(field) → \(to) (on delete: \(onDelete.rawValue))" }
}

/// A reference seen from its parent type: the child type, its field, the rule.
struct IncomingReference: Sendable {
    let childType: String
    let field: String
    let onDelete: DeleteRule
}

extension Catalog {
    /// Per parent type, the references to it of every type of `schema`.
    static func incomingReferences(of schema: StoreSchema) -> [String: [IncomingReference]] {
        var result: [String: [IncomingReference]] = [:]
        for type in schema.types {
            for reference in type.references ?? [] {
                result[reference.to, default: []].append(IncomingReference(childType: type.name, field: reference.field, onDelete: reference.onDelete))
            }
        }
        return result
    }
}

// MARK: Declaring

extension SchemaDeclaration {
    /// The declaration with an index on every reference field that no declared index starts
    /// with (children are found through it).
    func indexingReferences() -> SchemaDeclaration {
        var result = self
        for t in result.types.indices {
            for reference in result.types[t].references ?? [] where !result.types[t].indexes.contains(where: { $0.fields.first == reference.field }) {
                result.types[t].indexes.append(IndexDeclaration(fields: [reference.field]))
            }
        }
        return result
    }
}

extension SchemaMerger {
    /// Stores the declared references of every declared type that states them, and checks
    /// every stored reference against the schema the open ends with.
    /// - Throws: `.incompatibleSchema` for a reference whose field the type lacks or holds in
    ///   another kind than `uuid`, whose parent type the store does not have, a `nullify`
    ///   reference on a required field, or a field declared twice as a reference.
    static func mergeReferences(_ declaration: SchemaDeclaration, into context: WriteContext, path: String) throws {
        for type in declaration.types {
            guard let references = type.references else { continue }
            var seen = Set<String>()
            for reference in references where !seen.insert(reference.field).inserted {
                throw StoreError(.incompatibleSchema, "store \(path): \(type.name) declares the reference field '\(reference.field)' twice; declare each once")
            }
            if context.catalog.schema.type(named: type.name)?.references ?? [] != references {
                context.updateSchema { schema in
                    guard let t = schema.types.firstIndex(where: { $0.name == type.name }) else { return }
                    schema.types[t].references = references.isEmpty ? nil : references
                }
            }
        }
        let schema = context.catalog.schema
        for type in schema.types {
            for reference in type.references ?? [] {
                guard let field = type.field(named: reference.field) else {
                    throw StoreError(.incompatibleSchema, "store \(path): \(type.name) declares a reference through '\(reference.field)', a field it does not have (fields: \(type.fields.map(\.name).sorted().joined(separator: ", "))); name a stored RecordID property")
                }
                if let kind = field.kind, kind != .uuid || field.anyKind == true {
                    throw StoreError(.incompatibleSchema, "store \(path): \(type.name).\(reference.field) holds \(kind.rawValue) values, but a reference holds a parent's id (a RecordID, kind uuid)")
                }
                guard schema.type(named: reference.to) != nil else {
                    throw StoreError(.incompatibleSchema, "store \(path): \(type.name).\(reference.field) refers to \(reference.to), a type this store does not have; declare \(reference.to) when opening the store")
                }
                if reference.onDelete == .nullify && !field.optional {
                    throw StoreError(.incompatibleSchema, "store \(path): \(type.name).\(reference.field) is a nullify reference but not optional; make the property optional (RecordID?) or choose cascade or deny")
                }
            }
        }
    }
}

// MARK: Enforcing

/// What a write transaction must check or apply about references when it ends (see
/// ``WriteContext/applyReferenceRules()``).
struct ReferenceTracker {
    /// Off in the open's transaction (migrations, carried records taken in): references are
    /// checked from the first write on.
    var enabled = false
    /// Set while the rules themselves write: their writes are not noted again.
    var applying = false
    /// Records written locally with a new reference: its parent must exist at the end.
    var localChildren: [(type: String, id: RecordID)] = []
    /// Records written by merges with references: a deleted parent's rule applies to them.
    var mergedChildren: [(type: String, id: RecordID)] = []
    /// Parents deleted by merges: their children follow the rules at the end.
    var deletedParents: [(type: String, id: RecordID)] = []
    /// Parents removed for a unique value another record keeps: their children move there.
    var clashRemovals: [(type: String, removed: RecordID, kept: RecordID)] = []

    var isEmpty: Bool { localChildren.isEmpty && mergedChildren.isEmpty && deletedParents.isEmpty && clashRemovals.isEmpty }
}

extension WriteContext {
    /// Notes a record write for the reference checks at the end (called by ``put``): a local
    /// insert, or a local update that changed a reference field, must leave a parent that
    /// exists; a merged write may have to follow a deleted parent's rule.
    func noteReferenceWrite(_ type: TypeSchema, id: RecordID, changedTags: [UInt16], inserted: Bool, merged: Bool) {
        guard referenceTracker.enabled, !referenceTracker.applying, let references = type.references, !references.isEmpty else { return }
        if merged {
            referenceTracker.mergedChildren.append((type.name, id))
        } else if inserted || references.contains(where: { reference in
            type.field(named: reference.field).map { changedTags.contains($0.tag) } ?? false
        }) {
            referenceTracker.localChildren.append((type.name, id))
        }
    }

    /// Notes a record a merge deleted, whose children then follow their rules at the end.
    func noteMergedDelete(_ type: TypeSchema, id: RecordID) {
        guard referenceTracker.enabled, !referenceTracker.applying, catalog.incomingReferences[type.name] != nil else { return }
        referenceTracker.deletedParents.append((type.name, id))
    }

    /// Notes a record removed to settle a unique clash: its children move to `kept`.
    func noteClashRemoval(_ type: String, removed: RecordID, kept: RecordID) {
        guard referenceTracker.enabled, catalog.incomingReferences[type] != nil else { return }
        referenceTracker.clashRemovals.append((type, removed, kept))
    }

    /// Deletes a record and applies the delete rules of the references to it, in this
    /// transaction: cascades delete the children (and theirs, by their rules), nullify
    /// references are cleared, and a `deny` reference with children refuses the whole delete
    /// before anything changes. O(children) through the reference fields' indexes.
    /// - Returns: false when there was no such record.
    /// - Throws: `.deleteDenied` naming the type, the reference and the first children.
    func removeApplyingDeleteRules(_ layout: TypeLayout, id: RecordID) throws -> Bool {
        guard referenceTracker.enabled, catalog.incomingReferences[layout.schema.name] != nil else { return try remove(layout, id: id) }
        guard try txn.get(dbs.records, key: StoreKeys.record(layout.schema.tag, id)) != nil else { return false }
        // The whole plan first: a denied delete changes nothing.
        var doomed: [(type: String, id: RecordID)] = [(layout.schema.name, id)]
        var doomedKeys: Set<[UInt8]> = [StoreKeys.record(layout.schema.tag, id).bytes]
        var cleared: [(type: String, id: RecordID, field: String)] = []
        var next = 0
        while next < doomed.count {
            let (parentType, parentID) = doomed[next]
            next += 1
            for reference in catalog.incomingReferences[parentType] ?? [] {
                let childLayout = try self.layout(reference.childType)
                let children = try childIDs(of: parentID, through: reference, childLayout)
                    .filter { !doomedKeys.contains(StoreKeys.record(childLayout.schema.tag, $0).bytes) }
                guard !children.isEmpty else { continue }
                switch reference.onDelete {
                case .deny:
                    let named = children.prefix(3).map(\.description).joined(separator: ", ")
                    throw StoreError(.deleteDenied, "store \(path): \(parentType) \(parentID) cannot be deleted: \(children.count) \(reference.childType) record\(children.count == 1 ? "" : "s") refer to it through \(reference.childType).\(reference.field), whose rule is deny (\(named)\(children.count > 3 ? ", …" : "")); delete or move them first")
                case .cascade:
                    for child in children {
                        doomed.append((reference.childType, child))
                        doomedKeys.insert(StoreKeys.record(childLayout.schema.tag, child).bytes)
                    }
                case .nullify:
                    for child in children { cleared.append((reference.childType, child, reference.field)) }
                }
            }
        }
        referenceTracker.applying = true
        defer { referenceTracker.applying = false }
        for (type, child, field) in cleared {
            let childLayout = try self.layout(type)
            if doomedKeys.contains(StoreKeys.record(childLayout.schema.tag, child).bytes) { continue }
            try setReference(of: child, childLayout, field: field, to: nil)
        }
        for (type, doomedID) in doomed.reversed() { try remove(try self.layout(type), id: doomedID) }
        return true
    }

    /// Applies the references' rules to what this transaction's merges and local writes left
    /// (called when the transaction ends, after unique clashes are settled):
    /// - the children of a parent removed for a unique clash move to the record kept (or are
    ///   deleted, should that give them a unique value a child there holds);
    /// - the children of a parent a merge deleted follow the rule (deny as cascade: the delete
    ///   was made elsewhere); so does a merged child whose parent is deleted here;
    /// - a record written locally must refer to parents that exist.
    /// Each change is a local write: it goes to every peer. O(records involved).
    /// - Throws: `.parentNotFound` naming the record, the field and the missing parent.
    func applyReferenceRules() throws {
        guard referenceTracker.enabled, !referenceTracker.isEmpty else { return }
        let tracker = referenceTracker
        referenceTracker = ReferenceTracker(enabled: true)
        referenceTracker.applying = true
        defer { referenceTracker.applying = false }
        var deleted = tracker.deletedParents
        for (type, removed, kept) in tracker.clashRemovals {
            for reference in catalog.incomingReferences[type] ?? [] {
                let childLayout = try self.layout(reference.childType)
                for child in try childIDs(of: removed, through: reference, childLayout) {
                    do {
                        try setReference(of: child, childLayout, field: reference.field, to: kept)
                    } catch let error as StoreError where error.code == .uniqueViolation {
                        // The kept parent has a child with the same unique values: this one
                        // duplicates it.
                        if try remove(childLayout, id: child) { deleted.append((reference.childType, child)) }
                    }
                }
            }
        }
        for (type, id) in tracker.mergedChildren {
            let layout = try self.layout(type)
            guard let record = try storedRecord(layout, id) else { continue }
            for reference in layout.schema.references ?? [] {
                guard let parent = try referencedID(reference.field, layout, record), try isDeleted(reference.to, parent) else { continue }
                if reference.onDelete == .nullify {
                    try setReference(of: id, layout, field: reference.field, to: nil)
                } else {
                    if try remove(layout, id: id) { deleted.append((type, id)) }
                    break
                }
            }
        }
        try cascade(from: deleted)
        for (type, id) in tracker.localChildren {
            let layout = try self.layout(type)
            guard let record = try storedRecord(layout, id) else { continue }
            for reference in layout.schema.references ?? [] {
                guard let parent = try referencedID(reference.field, layout, record) else { continue }
                let parentLayout = try self.layout(reference.to)
                if try txn.get(dbs.records, key: StoreKeys.record(parentLayout.schema.tag, parent)) == nil {
                    throw StoreError(.parentNotFound, "store \(path): \(type) \(id) refers through \(reference.field) to \(reference.to) \(parent), which does not exist\(try isDeleted(reference.to, parent) ? " (it was deleted)" : ""); insert the \(reference.to) first (in the same transaction is fine), or refer to one that exists")
                }
            }
        }
    }

    /// Applies the delete rules to the children of `parents`, deleted by merges (and to
    /// theirs, in turn): cascade and deny delete them, nullify clears the reference.
    private func cascade(from parents: [(type: String, id: RecordID)]) throws {
        var work = parents
        var done = Set<[UInt8]>()
        while let (type, id) = work.popLast() {
            guard let parentLayout = catalog.layoutsByName[type],
                  done.insert(StoreKeys.record(parentLayout.schema.tag, id).bytes).inserted else { continue }
            for reference in catalog.incomingReferences[type] ?? [] {
                let childLayout = try self.layout(reference.childType)
                for child in try childIDs(of: id, through: reference, childLayout) {
                    if reference.onDelete == .nullify {
                        try setReference(of: child, childLayout, field: reference.field, to: nil)
                    } else if try remove(childLayout, id: child) {
                        work.append((reference.childType, child))
                    }
                }
            }
        }
    }

    /// The ids of the records of `layout`'s type whose `reference` field holds `parent`,
    /// through an index starting with the field (a scan of the type without one).
    func childIDs(of parent: RecordID, through reference: IncomingReference, _ layout: TypeLayout) throws -> [RecordID] {
        var ids: [RecordID] = []
        if let index = layout.schema.indexes.first(where: { $0.fields.first == reference.field }) {
            var key = StoreKeys.indexPrefix(layout.schema.tag, index.tag)
            FieldValue.uuid(parent.uuid).appendIndexComponent(to: &key)
            if index.fields.count == 1 {
                try txn.forEachDuplicate(dbs.index, key: key) { value in
                    if let id = RecordID(bytes: value[...]) { ids.append(id) }
                    return true
                }
            } else {
                try txn.scan(dbs.index, prefix: key) { _, value in
                    if let id = RecordID(bytes: value[...]) { ids.append(id) }
                    return true
                }
            }
            return ids
        }
        try txn.scan(dbs.records, prefix: StoreKeys.typePrefix(layout.schema.tag)) { key, value in
            guard let id = StoreKeys.id(fromRecordKey: key) else { return true }
            if try referencedID(reference.field, layout, try decodeStored(value, layout.schema.name, id)) == parent { ids.append(id) }
            return true
        }
        return ids
    }

    private func storedRecord(_ layout: TypeLayout, _ id: RecordID) throws -> EncodedRecord? {
        try txn.get(dbs.records, key: StoreKeys.record(layout.schema.tag, id)).map { try decodeStored($0, layout.schema.name, id) }
    }

    /// The parent id `record` holds in `field`, nil for none.
    private func referencedID(_ field: String, _ layout: TypeLayout, _ record: EncodedRecord) throws -> RecordID? {
        guard case .uuid(let uuid) = try fieldValue(field, layout, record) else { return nil }
        return RecordID(uuid)
    }

    /// Whether `id` of `type` was deleted here: no record, and versions holding its delete.
    /// A record never seen here (its insert has not arrived yet) is not deleted.
    private func isDeleted(_ type: String, _ id: RecordID) throws -> Bool {
        guard let layout = catalog.layoutsByName[type] else { return false }
        let key = StoreKeys.record(layout.schema.tag, id)
        return try txn.get(dbs.records, key: key) == nil && txn.get(dbs.versions, key: key) != nil
    }

    /// Writes `parent` (nil: none) into the reference `field` of record `id`, a local update
    /// of that field alone.
    private func setReference(of id: RecordID, _ layout: TypeLayout, field: String, to parent: RecordID?) throws {
        guard let old = try storedRecord(layout, id), let tag = layout.tagsByName[field] else { return }
        var values: [(tag: UInt16, value: FieldValue)] = []
        for stored in old.fields where stored.tag != tag {
            if let value = try old.value(of: stored.tag) { values.append((stored.tag, value)) }
        }
        if let parent {
            values.append((tag, .uuid(parent.uuid)))
        } else if layout.defaults[field] != nil {
            values.append((tag, .null))   // absent would read as the default
        }
        try put(layout, id: id, record: RecordEncoder.encode(tagged: values), mode: .update)
    }
}
