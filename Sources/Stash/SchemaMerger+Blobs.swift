import Foundation
import StashLMDB

extension SchemaMerger {
    /// A stored inline `bytes` field now declared external (a `Data` property turned
    /// ``ExternalData``: the photo app's upgrade): each stored value is kept as a blob and the
    /// record holds its reference, record by record in the open's transaction, with progress
    /// (phase `moving Type.field to blobs`). The blobs are written (synced) before the open
    /// commits; should it fail or be killed, the records keep their inline bytes and the blobs
    /// written so far go at a later ``Store/collectGarbageBlobs(olderThan:)``. The change is a
    /// write like a ``Migration``'s: the references sync; a replica that still declares the
    /// field inline carries them and keeps its own bytes.
    func moveInlineBytesOut(_ declaration: TypeDeclaration, into context: WriteContext) throws {
        let name = declaration.name
        let stored = try context.layout(name).schema
        let moving = declaration.fields.filter { field in
            guard field.external, let old = stored.field(named: field.name) else { return false }
            return old.kind == .bytes && old.external != true && old.anyKind != true
        }
        // The other way round, the references would read as plain maps and their blobs be
        // collected: refused while records exist.
        if let kept = declaration.fields.first(where: { !$0.external && stored.field(named: $0.name)?.external == true }),
           try context.count(stored.tag) > 0 {
            throw StoreError(.incompatibleSchema, "store \(path): \(name).\(kept.name) is external (an ExternalData property; in a schema file \"kind\": \"bytes\", \"external\": true) in the stored records but declared \(kept.anyKind ? "any" : kept.kind.rawValue) now; declare it external as before")
        }
        guard !moving.isEmpty else { return }
        let tags = Set(moving.compactMap { stored.field(named: $0.name)?.tag })
        context.updateSchema { schema in
            guard let t = schema.types.firstIndex(where: { $0.name == name }) else { return }
            for f in schema.types[t].fields.indices where tags.contains(schema.types[t].fields[f].tag) {
                schema.types[t].fields[f].kind = .map
                schema.types[t].fields[f].external = true
            }
        }
        var ids: [RecordID] = []
        try txn.scan(dbs.records, prefix: StoreKeys.typePrefix(stored.tag)) { key, _ in
            if let id = StoreKeys.id(fromRecordKey: key) { ids.append(id) }
            return true
        }
        let phase = "moving \(name).\(moving.map(\.name).joined(separator: ", ")) to blobs"
        let blobs = BlobDirectory(storePath: path)
        let layout = try context.layout(name)
        for (n, id) in ids.enumerated() {
            defer {
                if n % 100 == 0 || n == ids.count - 1 { options.progress?(StoreProgress(phase: phase, done: n + 1, total: ids.count)) }
            }
            guard let bytes = try txn.get(dbs.records, key: StoreKeys.record(stored.tag, id)) else { continue }
            var values = try context.decodeStored(bytes, name, id).values()
            var changed = false
            for i in values.indices where tags.contains(values[i].tag) {
                guard case .bytes(let data) = values[i].value else { continue }
                let reference = ExternalData(data)
                try blobs.write(data, as: reference, checked: false)
                values[i].value = reference.fieldValue
                changed = true
            }
            guard changed else { continue }
            let encoded = RecordEncoder.encode(tagged: values.map { (tag: $0.tag, value: $0.value) })
            _ = try context.put(layout, id: id, record: encoded, mode: .upsert)
        }
    }
}
