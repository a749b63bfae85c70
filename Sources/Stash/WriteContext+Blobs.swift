import Foundation

extension WriteContext {
    /// Keeps `value`'s bytes in the store's blob directory (atomically, synced) before the
    /// transaction that references them commits; marks the field external in the schema when
    /// the type's fields are learned from writes.
    func storeBlob(_ value: ExternalData, field name: String) throws {
        guard let bytes = value.bytes else { return }
        try BlobDirectory(storePath: path).write(bytes, as: value, checked: false)
        try markExternal(name, of: encodingType)
    }

    private func markExternal(_ name: String, of type: String) throws {
        guard let field = try layout(type).schema.field(named: name), field.external != true else { return }
        updateSchema { schema in
            guard let t = schema.types.firstIndex(where: { $0.name == type }),
                  let f = schema.types[t].fields.firstIndex(where: { $0.name == name }) else { return }
            schema.types[t].fields[f].external = true
        }
    }

    /// `record` with the bytes given for its external fields kept as blobs and replaced by
    /// their references (a generic put: `stash put` of base64 text). A reference given as
    /// such must name a valid blob this store holds.
    func externalized(_ record: GenericRecord, _ type: TypeSchema) throws -> GenericRecord {
        var result = record
        for field in type.fields where field.external == true {
            guard let value = record.fields[field.name] else { continue }
            switch value {
            case .null: continue
            case .bytes(let data):
                let reference = ExternalData(data)
                try BlobDirectory(storePath: path).write(data, as: reference, checked: false)
                result.fields[field.name] = reference.fieldValue
            default:
                guard let reference = ExternalData(reference: value) else {
                    throw StoreError(.invalidValue, "store \(path): \(type.name).\(field.name) is external, so \(type.name) \(record.id) cannot store \(value) in it; give the bytes (base64 text in `stash put`), or a reference {\"$blob\": \"<sha256 hex>\", \"size\": n} to a blob this store holds")
                }
                guard BlobDirectory(storePath: path).holds(reference) else {
                    throw StoreError(.invalidValue, "store \(path): \(type.name).\(field.name) of \(record.id) references blob \(reference.sha256) (\(reference.size) B), which this store does not hold; give the bytes instead (base64 text in `stash put`)")
                }
            }
        }
        return result
    }
}
