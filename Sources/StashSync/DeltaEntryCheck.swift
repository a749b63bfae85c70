import Foundation
import Stash

/// Checks each entry of a delta against the schema of the store that merges it, whatever
/// the schema fingerprints say, before the entry merges (inside the merge's transaction, so
/// the schema cannot change in between). An entry either
/// - merges: what the schema declares goes into the record, the rest is carried (a field or
///   type the schema does not declare, a value of another kind than the field's here: see
///   ``Stash/StoreTransaction/merge(_:origin:counters:)``);
/// - cannot merge yet (``incompatibility(of:local:)`` says why, and the delta is parked): a
///   field one schema merges as a counter and the other does not, or a record that would lack
///   a field required here;
/// - or is refused (`SyncError.invalidDelta`): what no replica writes — a type or field name
///   no record can have (empty, `id`), a counter field whose value is no counter's state, or,
///   when both schemas are the same, what only another schema would explain.
///
/// Built once per delta; O(fields) per entry, with one dictionary lookup per field.
struct DeltaEntryCheck {
    private struct TypeFacts {
        let schema: TypeSchema
        let fields: [String: FieldSchema]
        let counters: Set<String>
        /// Required fields: not optional, no default (the id excepted).
        let required: [String]
    }

    /// The end of a reason for a field declared a counter on one side only.
    static let declaredDifferently = "declare it the same way in both schemas"

    private let name: String
    private let source: RecordID
    private let types: [String: TypeFacts]
    /// The source's counter fields per type; nil for a delta that does not list them.
    private let sourceCounters: [String: Set<String>]?
    /// The delta's schema fingerprint equals this store's: the two schemas are the same.
    let sameSchema: Bool

    init(_ delta: Delta, name: String, schema: StoreSchema) {
        self.name = name
        source = delta.source
        sourceCounters = delta.counterFields
        sameSchema = SchemaFingerprint.of(schema) == delta.schemaFingerprint
        var types: [String: TypeFacts] = [:]
        for type in schema.types {
            types[type.name] = TypeFacts(schema: type, fields: Dictionary(type.fields.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a }),
                                         counters: Set(type.fields.filter { $0.counter == true }.map(\.name)),
                                         required: type.fields.filter { !$0.optional && $0.defaultValue == nil && $0.name != "id" }.map(\.name))
        }
        self.types = types
    }

    /// Whether `entry` is of a type local-only here (the merge leaves it out).
    func isLocalOnly(_ entry: RecordState) -> Bool { types[entry.type]?.schema.localOnly ?? false }

    /// The error for what no replica writes, naming the delta, the record and the field.
    private func invalid(_ entry: RecordState, _ what: String) -> SyncError {
        SyncError(.invalidDelta, "\(name) holds \(what) in \(entry.type.prefix(64)) \(entry.id): no replica writes that, so its source (site \(source)) is faulty or was tampered with by a holder of the family's key; refused, nothing of it was applied")
    }

    /// Throws `.invalidDelta` for what no replica writes (see the type's summary).
    func validate(_ entry: RecordState) throws {
        if entry.type.isEmpty || entry.type.utf8.count > 255 || entry.type.hasPrefix("#") {
            throw invalid(entry, "a type name no record type can have ('\(entry.type.prefix(64))')")
        }
        let facts = types[entry.type]
        let theirCounters = sourceCounters?[entry.type] ?? []
        for (field, state) in entry.fields {
            if field.isEmpty || field == "id" || field.utf8.count > 255 || field.hasPrefix("#") {
                throw invalid(entry, "a field named '\(field.prefix(64))', which no record can have (the id is the key, never a field)")
            }
            // A counter's value merges as a counter's state: anything else would fail every
            // typed read and every merge of the field. What the source calls a counter must be
            // one; a delta that lists no counters (format 1) is held to this store's.
            let isCounter = sourceCounters.map { _ in theirCounters.contains(field) } ?? (facts?.counters.contains(field) ?? false)
            if isCounter, state.value != .null, let problem = Counter.problem(in: state.value) {
                throw invalid(entry, "field \(field), a counter, whose value is no counter's state (\(problem))")
            }
        }
    }

    /// Why the store cannot merge `entry` yet, or nil: a field one schema merges as a counter
    /// and the other does not, or a record that would lack a field required here (`local`
    /// gives the record as stored here, read only for such an entry: it may have the value).
    /// With the same schema on both sides neither can happen: that is `.invalidDelta`.
    func incompatibility(of entry: RecordState, local: () throws -> RecordState) throws -> String? {
        guard let facts = types[entry.type], !facts.schema.localOnly else { return nil }
        if let sourceCounters {
            let theirs = sourceCounters[entry.type] ?? []
            for (field, _) in entry.fields {
                guard let known = facts.fields[field], known.kind == nil || known.kind == .map || known.anyKind == true else { continue }
                let counterHere = facts.counters.contains(field)
                guard theirs.contains(field) != counterHere else { continue }
                if sameSchema { throw invalid(entry, "field \(field) listed as \(counterHere ? "a plain value" : "a counter") although its schema is this store's, where it is \(counterHere ? "a counter" : "a plain value")") }
                return "\(entry.type).\(field) is \(counterHere ? "a counter" : "a plain value") here but \(counterHere ? "a plain value" : "a counter") at the source; \(Self.declaredDifferently)"
            }
        }
        guard entry.exists, !facts.required.isEmpty,
              facts.required.contains(where: { (entry.fields[$0]?.value ?? .null) == .null }) else { return nil }
        let lacking = facts.required.filter { (entry.fields[$0]?.value ?? .null) == .null }
        // The record here may have the value: a merge of the same incarnation keeps it.
        let merged = try local().merged(with: entry, counters: facts.counters)
        guard merged.exists, let missing = lacking.first(where: { (merged.fields[$0]?.value ?? .null) == .null }) else { return nil }
        if sameSchema { throw invalid(entry, "no value for \(missing), which its schema (this store's) requires") }
        return "\(entry.type).\(missing) is required here and has no default, but \(entry.type) \(entry.id) from the source lacks it (or holds nil); give the field a default (Record.fieldDefaults) or make it optional"
    }
}
