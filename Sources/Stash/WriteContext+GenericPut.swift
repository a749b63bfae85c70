import Foundation

extension WriteContext {
    /// `record` as a generic put (``StoreTransaction/put(_:replacing:)``) may store it, checked
    /// against its type's stored schema before anything is encoded, so that the store never
    /// holds a record its own schema says cannot be read:
    /// - a field the schema lacks is refused (`.unknownField`: a misspelt name would add a
    ///   field to the type for good), unless `learnsFields` (the type's fields are learned from
    ///   the values written, see ``TypeDeclaration/fields``);
    /// - a value of another kind than its field's is refused (`.invalidValue`), except an int
    ///   for a double field, stored as that double when it is one exactly (as ``Migration``s
    ///   and declared defaults store it);
    /// - a required field (not optional, no default) left out or null is refused
    ///   (`.invalidValue`): a typed read of the record, and so every typed fetch of its type,
    ///   would throw.
    ///
    /// Typed writes, merges and migrations do not come here: their fields and kinds are the
    /// type's, another replica's, or a migration's to change. O(fields) name lookups.
    func checkedForGenericPut(_ record: GenericRecord, learnsFields: Bool) throws -> GenericRecord {
        let type = try layout(record.type).schema
        // Bytes for an external field are kept as its blob, and the field holds the reference.
        var checked = try externalized(record, type)
        for (name, value) in checked.fields where name != "id" {
            guard let field = type.field(named: name) else {
                if learnsFields { continue }
                let known = type.fields.map(\.name).sorted().joined(separator: ", ")
                throw StoreError(.unknownField, "store \(path): \(type.name) has no field '\(name)' (fields: \(known.isEmpty ? "none" : known)), so \(type.name) \(record.id) was not written; check the name, or declare the field (a property of the Record type, or a field of its SchemaDeclaration) and open the store with it")
            }
            guard field.anyKind != true, let stored = field.kind, let given = value.kind, given != stored else { continue }
            if stored == .double, case .int(let integer) = value, let exact = Double(exactly: integer) {
                checked.fields[name] = .double(exact)
                continue
            }
            let hint = stored == .double && given == .int ? " (this int has no exact double)" : ""
            throw StoreError(.invalidValue, "store \(path): \(type.name).\(name) holds \(stored.rawValue) values, so \(type.name) \(record.id) cannot store the \(given.rawValue) \(value) in it\(hint); give a .\(stored.rawValue) value (to change the field's kind, use a Migration)")
        }
        for field in type.fields where !field.optional && field.defaultValue == nil && (checked.fields[field.name] ?? .null) == .null {
            let what = checked.fields[field.name] == nil ? "lacks" : "has null for"
            throw StoreError(.invalidValue, "store \(path): \(type.name) \(record.id) \(what) field '\(field.name)'\(field.kind.map { " (\($0.rawValue))" } ?? ""), which \(type.name) requires (not optional, no default): a typed read of the record would fail, and with it every fetch of \(type.name); give it a value, or make the field optional or give it a default (Record.fieldDefaults, a schema file's \"default\")")
        }
        return checked
    }
}
