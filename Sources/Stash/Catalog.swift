import Foundation
import StashLMDB

/// An immutable snapshot of the stored schema with its lookup tables. The store swaps in a
/// new catalog after a commit that changed the schema (or when another process did).
final class Catalog: Sendable {
    let schema: StoreSchema
    let generation: UInt64
    let layoutsByName: [String: TypeLayout]
    let layoutsByTag: [UInt16: TypeLayout]

    init(schema: StoreSchema, generation: UInt64) {
        self.schema = schema
        self.generation = generation
        var byName: [String: TypeLayout] = [:], byTag: [UInt16: TypeLayout] = [:]
        for type in schema.types {
            let layout = TypeLayout(type)
            byName[type.name] = layout
            byTag[type.tag] = layout
        }
        layoutsByName = byName
        layoutsByTag = byTag
    }

    func layout(_ name: String, store: String) throws -> TypeLayout {
        guard let layout = layoutsByName[name] else {
            let known = schema.types.map(\.name).sorted().joined(separator: ", ")
            throw StoreError(.unknownType, "store \(store) has no record type '\(name)' (known: \(known.isEmpty ? "none" : known))")
        }
        return layout
    }
}

/// Keys of the `meta` database.
enum MetaKey {
    static let format = Array("format".utf8)
    static let schema = Array("schema".utf8)
    static let schemaGeneration = Array("schemaGeneration".utf8)
    static let storeID = Array("storeID".utf8)
    static let siteID = Array("siteID".utf8)
    static let nextSequence = Array("nextSequence".utf8)
    static let created = Array("created".utf8)
    static let clock = Array("clock".utf8)
    static let purgedThrough = Array("historyPurgedThrough".utf8)
    static let consumerPrefix = Array("historyConsumer:".utf8)
    static func consumer(_ name: String) -> [UInt8] { consumerPrefix + Array(name.utf8) }
}

/// Little-endian fixed-width integers in values.
enum LittleEndian {
    static func bytes(_ value: UInt64) -> [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: value >> UInt64($0 * 8)) }
    }
    static func uint64(_ bytes: [UInt8]?) -> UInt64? {
        guard let bytes, bytes.count == 8 else { return nil }
        var v: UInt64 = 0
        for (i, b) in bytes.enumerated() { v |= UInt64(b) << UInt64(i * 8) }
        return v
    }
}

/// The named databases of a store environment.
struct StoreDatabases: Sendable {
    let records: Database
    let index: Database
    let counts: Database
    let history: Database
    let meta: Database
    let versions: Database

    static let specs: [DatabaseSpec] = [
        DatabaseSpec("records"),
        DatabaseSpec("index", flags: [.duplicateSort, .duplicateFixed]),
        DatabaseSpec("counts"),
        DatabaseSpec("history"),
        DatabaseSpec("meta"),
        DatabaseSpec("versions"),
    ]

    init(_ env: Environment) throws(LMDBError) {
        records = try env.database("records")
        index = try env.database("index")
        counts = try env.database("counts")
        history = try env.database("history")
        meta = try env.database("meta")
        versions = try env.database("versions")
    }
}
