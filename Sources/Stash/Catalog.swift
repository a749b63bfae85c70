import Foundation
import StashLMDB
import Synchronization

/// An immutable snapshot of the stored schema with its lookup tables. The store swaps in a
/// new catalog after a commit that changed the schema (or when another process did).
final class Catalog: Sendable {
    let schema: StoreSchema
    let generation: UInt64
    let layoutsByName: [String: TypeLayout]
    let layoutsByTag: [UInt16: TypeLayout]
    /// The types and fields kept for other replicas without a declaration here.
    let carried: CarriedSchema
    /// The name of each tag of ``CarriedSchema/types``.
    let carriedNamesByTag: [UInt16: String]
    /// Per parent type, the references to it (``RecordReference``); empty for none.
    let incomingReferences: [String: [IncomingReference]]

    /// The name of the type whose states are kept under `tag`: a type of the schema, or one
    /// carried (or carried once, and declared since); nil for neither.
    func typeName(tagged tag: UInt16) -> String? {
        layoutsByTag[tag]?.schema.name ?? carriedNamesByTag[tag]
    }

    /// Whether `name` is a type this store carries without declaring it.
    func isCarriedType(_ name: String) -> Bool { layoutsByName[name] == nil && carried.types[name] != nil }

    init(schema: StoreSchema, generation: UInt64, carried: CarriedSchema = CarriedSchema()) {
        self.schema = schema
        self.generation = generation
        self.carried = carried
        carriedNamesByTag = Dictionary(carried.types.map { ($0.value, $0.key) }, uniquingKeysWith: { a, _ in a })
        incomingReferences = Self.incomingReferences(of: schema)
        var byName: [String: TypeLayout] = [:], byTag: [UInt16: TypeLayout] = [:]
        for type in schema.types {
            let layout = TypeLayout(type)
            byName[type.name] = layout
            byTag[type.tag] = layout
        }
        layoutsByName = byName
        layoutsByTag = byTag
    }

    private let layoutsByType = Mutex<[ObjectIdentifier: TypeLayout]>([:])

    /// The layout of record type `R`, or nil when this catalog lacks it. Resolved once per
    /// type and catalog: one lock and one pointer-keyed lookup instead of the type's name
    /// (itself a cached lookup) and a string-keyed one. O(1).
    func layout<R: Record>(of type: R.Type) -> TypeLayout? {
        let key = ObjectIdentifier(type)
        if let hit = layoutsByType.withLock({ $0[key] }) { return hit }
        guard let layout = layoutsByName[R.recordType] else { return nil }
        layoutsByType.withLock { $0[key] = layout }
        return layout
    }

    /// A single-field index found from a key path (see ``singleFieldIndex(_:type:)``).
    struct ResolvedIndex: @unchecked Sendable {
        let typeTag: UInt16
        let indexTag: UInt16
        /// The stored kind of the field (nil: not known yet).
        let kind: FieldKind?
        /// Whether a key built from the key path's value type is what the index holds (see
        /// ``indexKeyMatchesStoredKind(_:_:)``): false for a property the record stores in
        /// another form, which the O(1) counts then leave to a count that reads the records.
        let keyMatchesStoredKind: Bool
        /// Kept so the key path's identity stays unique while it is a key here.
        let keyPath: AnyKeyPath
    }
    private let resolvedIndexes = Mutex(IdentityTable<ResolvedIndex>())

    /// The single-field index on `keyPath` of the type named `type()`, or nil when there is
    /// none. Resolved once per key path and catalog (a catalog never changes; a new schema is
    /// a new catalog), so hot counts by key path skip the name and index lookups: one lock and
    /// a search of a short list of pointers. O(1).
    func singleFieldIndex(_ keyPath: AnyKeyPath, type: () -> String) -> ResolvedIndex? {
        let key = ObjectIdentifier(keyPath)
        if let hit = resolvedIndexes.withLock({ $0.find(key) }) { return hit }
        guard let layout = layoutsByName[type()] else { return nil }
        let name = fieldName(of: keyPath)
        guard let index = layout.schema.indexes.first(where: { $0.fields.count == 1 && $0.fields[0] == name }) else { return nil }
        let kind = layout.schema.field(named: name)?.kind
        let resolved = ResolvedIndex(typeTag: layout.schema.tag, indexTag: index.tag, kind: kind,
                                     keyMatchesStoredKind: indexKeyMatchesStoredKind(Swift.type(of: keyPath).valueType, kind),
                                     keyPath: keyPath)
        resolvedIndexes.withLock { $0.add(key, resolved) }
        return resolved
    }

    /// `count(key)` of the index key whose duplicate count is the number of `R` records
    /// whose field at `keyPath` equals `value`, or nil when no single-field index answers it
    /// exactly (none on that field, or a string longer than the indexed prefix); 0 for NaN,
    /// which equals nothing; nil too when the record stores the property in another form
    /// than its type's (its index holds keys of another kind). O(1), no allocation; the key
    /// (511 bytes of storage) is lent to `count`, never copied.
    func exactIndexCount<R: Record, V: IndexableValue>(_ keyPath: AnyKeyPath, _ type: R.Type, equals value: V,
                                                      _ count: (KeyBytes) throws -> Int?) rethrows -> Int? {
        guard V.indexComponentMatchesStoredForm, let index = singleFieldIndex(keyPath, type: { R.recordType }),
              index.keyMatchesStoredKind else { return nil }
        if isNaNIndexValue(value) { return 0 }   // NaN equals nothing, not the stored NaNs
        if isUncanonicalIndexValue(value) { return nil }
        var key = StoreKeys.indexPrefix(index.typeTag, index.indexTag)
        value.appendIndexComponent(to: &key)
        return key.isLossy ? nil : try count(key)
    }

    /// The index key whose duplicate count is exactly the number of `R` records matching
    /// `condition` on the field of `keyPath` (what the planner would count too), or nil when
    /// no single-field index answers it exactly.
    func exactIndexKey<R: Record>(_ keyPath: AnyKeyPath, _ type: R.Type, _ condition: QueryCondition) -> KeyBytes? {
        guard condition.op == .equal, let index = singleFieldIndex(keyPath, type: { R.recordType }),
              QueryPlanner.indexable(condition, fieldKind: index.kind) else { return nil }
        var key = StoreKeys.indexPrefix(index.typeTag, index.indexTag)
        condition.value.appendIndexComponent(to: &key)
        return key.isLossy ? nil : key
    }

    func layout(_ name: String, store: String) throws -> TypeLayout {
        guard let layout = layoutsByName[name] else {
            let known = schema.types.map(\.name).sorted().joined(separator: ", ")
            throw StoreError(.unknownType, "store \(store) has no record type '\(name)' (known: \(known.isEmpty ? "none" : known)); declare it when opening the store: among Store.open(at:types:)'s types, or in its SchemaDeclaration")
        }
        return layout
    }
}

/// Keys of the `meta` database.
enum MetaKey {
    static let format = Array("format".utf8)
    static let schema = Array("schema".utf8)
    /// The CRC-32C of ``schema``'s bytes (u64, little-endian), checked when it is read.
    static let schemaChecksum = Array("schemaChecksum".utf8)
    static let schemaGeneration = Array("schemaGeneration".utf8)
    /// How far ahead each site's clock was found to run, as versions arrived from it
    /// (JSON: site id text → clock units).
    static let clockAhead = Array("clockAhead".utf8)
    /// ``CarriedSchema`` (JSON); changed with the schema generation.
    static let carriedSchema = Array("carriedSchema".utf8)
    static let storeID = Array("storeID".utf8)
    static let siteID = Array("siteID".utf8)
    /// The data file the site id belongs to (inode, birth seconds, birth nanoseconds; 24 bytes
    /// big-endian).
    static let dataFile = Array("dataFile".utf8)
    /// Set by ``Store/requestNewSite()``: the next open makes a new site, as for a copy.
    static let newSiteRequested = Array("newSiteRequested".utf8)
    /// The replicas this store was copied from, oldest first (``CopyOrigin``, 24 bytes each).
    static let copiedFrom = Array("copiedFrom".utf8)
    static let nextSequence = Array("nextSequence".utf8)
    static let created = Array("created".utf8)
    static let clock = Array("clock".utf8)
    static let purgedThrough = Array("historyPurgedThrough".utf8)
    static let consumerPrefix = Array("historyConsumer:".utf8)
    /// The key of a history consumer: its name's canonical composition (NFC), since names
    /// that Swift takes for equal ("café" typed, "café" from a file name) are one consumer.
    static func consumer(_ name: String) -> [UInt8] { consumerPrefix + Array(name.precomposedStringWithCanonicalMapping.utf8) }

    /// The keys Stash writes, each with the size of its value when that is fixed (`verify`
    /// reports others: a damaged key, or a value of another size).
    static let known: [[UInt8]: Int?] = [
        format: 8, schema: nil, schemaChecksum: 8, schemaGeneration: 8, clockAhead: nil, carriedSchema: nil,
        storeID: 16, siteID: 16, dataFile: nil, newSiteRequested: nil, copiedFrom: nil, nextSequence: 8,
        created: 8, clock: 8, purgedThrough: 8,
    ]
    /// Prefixes of keys Stash writes: history consumers, the metadata area.
    static let knownPrefixes: [[UInt8]] = [consumerPrefix, Array("x:".utf8)]
}

/// Little-endian fixed-width integers in values.
enum LittleEndian {
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

    /// Opened in this order: "meta" first, so that a read-only open of LMDB data without it
    /// (not a store) names it rather than another.
    static let specs: [DatabaseSpec] = [
        DatabaseSpec("meta"),
        DatabaseSpec("records"),
        DatabaseSpec("index", flags: [.duplicateSort, .duplicateFixed]),
        DatabaseSpec("counts"),
        DatabaseSpec("history"),
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
