import Foundation

/// The schema a store keeps in its `meta` database: every record type it has seen, with
/// stable tags for types, fields and indexes.
///
/// Tags never change once given, so stored records and index keys stay readable when fields
/// are added or dropped. The schema is what lets the command line, `dump` and verification
/// read any store without the app's Swift types.
public struct StoreSchema: Codable, Sendable, Equatable {
    /// The version reached by ``Migration``s (0 before any).
    public var version: Int = 0
    public var types: [TypeSchema] = []

    public init() {}

    public func type(named name: String) -> TypeSchema? { types.first { $0.name == name } }
    public func type(tagged tag: UInt16) -> TypeSchema? { types.first { $0.tag == tag } }

    var nextTypeTag: UInt16 { (types.map(\.tag).max() ?? 0) + 1 }

    mutating func update(_ type: TypeSchema) {
        if let i = types.firstIndex(where: { $0.name == type.name }) { types[i] = type } else { types.append(type) }
    }
}

/// One record type in the stored schema.
public struct TypeSchema: Codable, Sendable, Equatable {
    public var name: String
    public var tag: UInt16
    public var fields: [FieldSchema]
    public var indexes: [IndexSchema]
    /// Local-only types never leave the device (sync skips them).
    public var localOnly: Bool
    /// The highest index tag ever given, so a dropped index's tag is never reused.
    public var lastIndexTag: UInt16?
    /// Its fields that refer to parent records, with their delete rules (``RecordReference``);
    /// nil for none.
    public var references: [ReferenceDeclaration]?

    public func field(named name: String) -> FieldSchema? { fields.first { $0.name == name } }
    public func field(tagged tag: UInt16) -> FieldSchema? { fields.first { $0.tag == tag } }
    public func index(named name: String) -> IndexSchema? { indexes.first { $0.name == name } }

    var nextFieldTag: UInt16 { (fields.map(\.tag).max() ?? 0) + 1 }
    var nextIndexTag: UInt16 { max(lastIndexTag ?? 0, indexes.map(\.tag).max() ?? 0) + 1 }
}

/// One field of a stored type.
public struct FieldSchema: Codable, Sendable, Equatable {
    public var name: String
    public var tag: UInt16
    /// Nil until a non-null value has been seen.
    public var kind: FieldKind?
    public var optional: Bool
    /// The value read for records stored before the field existed.
    public var defaultValue: FieldValue?
    /// A ``Counter`` field: replicas merge it by per-site totals instead of last-writer-wins.
    public var counter: Bool?
    /// A field whose values are of any kind (a ``FieldValue`` or ``JSONValue`` property):
    /// ``kind`` stays nil and no write is refused for its kind.
    public var anyKind: Bool?
    /// An ``ExternalData`` field (kind `map`): records hold a reference, the bytes live in
    /// the store's blob directory. A schema file says `"kind": "bytes", "external": true`.
    public var external: Bool?
}

/// One secondary index of a stored type: the fields it orders by, and whether it is unique.
public struct IndexSchema: Codable, Sendable, Equatable {
    public var name: String
    public var tag: UInt16
    public var fields: [String]
    public var unique: Bool

    static func name(for fields: [String]) -> String { fields.joined(separator: "+") }
}

/// What an app (through its ``Record`` types) or a schema file (through the command line)
/// asks the store to have. The store merges it into its ``StoreSchema`` at open.
///
/// Its JSON form is the command line's schema file (`stash init DIR --schema FILE`):
/// ```json
/// {"types": [{"name": "Item", "localOnly": false,
///             "fields": [{"name": "homeID", "kind": "uuid"}, {"name": "name", "kind": "string"},
///                        {"name": "note", "kind": "string", "optional": true}],
///             "indexes": [{"fields": ["homeID"]}, {"fields": ["name"], "unique": true}]}]}
/// ```
///
/// Decoding refuses a key the format does not know (`"fieldz"` for `"fields"`), naming it
/// and where it stands: ignored, it would leave the type without the fields meant.
public struct SchemaDeclaration: Codable, Sendable {
    /// The types to merge into the stored schema. Stored types not listed stay as they are.
    public var types: [TypeDeclaration]
    /// A declaration of `types` (an empty list declares nothing: the stored schema stays).
    public init(types: [TypeDeclaration]) { self.types = types }

    enum CodingKeys: String, CodingKey, CaseIterable { case types }
    public init(from decoder: any Decoder) throws {
        try refuseUnknownKeys(decoder, CodingKeys.self)
        types = try decoder.container(keyedBy: CodingKeys.self).decode([TypeDeclaration].self, forKey: .types)
    }

    /// Throws `.incompatibleSchema` for what no store can hold: a type or a field of a type
    /// declared twice (which of the two would be meant?), an index of no fields.
    func refuseMalformed(in path: String) throws {
        var typeNames: Set<String> = []
        for type in types {
            guard typeNames.insert(type.name).inserted else {
                throw StoreError(.incompatibleSchema, "store \(path): type \(type.name) is declared twice; declare each type once")
            }
            var fieldNames: Set<String> = []
            for field in type.fields where !fieldNames.insert(field.name).inserted {
                throw StoreError(.incompatibleSchema, "store \(path): \(type.name) declares field '\(field.name)' twice; declare each field once")
            }
            if type.indexes.contains(where: \.fields.isEmpty) {
                throw StoreError(.incompatibleSchema, "store \(path): an index of \(type.name) lists no fields; give it at least one")
            }
        }
    }
}

/// One record type of a ``SchemaDeclaration``: what a ``Record`` type declares, or one entry
/// of a schema file's `"types"`. In JSON, `fields` and `indexes` may be left out (none), and
/// `localOnly` too (the store's flag is kept; false for a new type).
public struct TypeDeclaration: Codable, Sendable {
    /// The stored type name (``Record/recordType``). A type the store lacks is added.
    public var name: String
    /// Known fields, with the stored schema's. A type declared with none (a ``Record`` type
    /// the open cannot probe, a schema file's type without `"fields"`) learns them from the
    /// values written, through the store so opened, a generic
    /// ``StoreTransaction/put(_:replacing:)`` included. Otherwise such a put of a field the
    /// stored schema lacks is refused (`.unknownField`): a typo would add a field for good.
    /// Typed writes, merges from other replicas and ``Migration``s add fields in either case.
    public var fields: [FieldDeclaration]
    /// The indexes to have (see ``Record/indexes`` for how they merge with stored ones).
    public var indexes: [IndexDeclaration]
    /// Whether the type's records stay on this device (``Record/isLocalOnly``). A type turned
    /// from local-only to synced sends its stored records at the next sync.
    public var localOnly: Bool
    /// Values for fields missing in stored records (fields added later). In JSON, a field's
    /// `"default"` (a value of its kind, as `stash put` reads one).
    public var defaults: [String: FieldValue]
    /// Its fields that refer to parent records (``RecordReference``), replacing the stored
    /// ones; nil (a schema file without `"references"`) keeps what the store has.
    public var references: [ReferenceDeclaration]?
    /// A schema file that does not say `localOnly` keeps what the store has: a local-only
    /// type turns synced (and its records start to leave the device) only when asked.
    var keepsStoredLocalOnly = false
    /// Declared by a ``Record`` type the open probed: its fields are all it has, even none.
    var isProbed = false
    /// Whether fields not listed are learned from the values written (see ``fields``): a
    /// declaration that lists none, unless it is a probed ``Record`` type's (which has none).
    var learnsFields: Bool { fields.isEmpty && !isProbed }

    /// A declaration of type `name`. Unlike a schema file without `localOnly`, it states the
    /// flag: `localOnly: false` turns a stored local-only type synced.
    public init(name: String, fields: [FieldDeclaration] = [], indexes: [IndexDeclaration] = [],
                localOnly: Bool = false, defaults: [String: FieldValue] = [:]) {
        self.name = name
        self.fields = fields
        self.indexes = indexes
        self.localOnly = localOnly
        self.defaults = defaults
    }

    enum CodingKeys: String, CodingKey, CaseIterable { case name, fields, indexes, localOnly, references }

    public init(from decoder: any Decoder) throws {
        try refuseUnknownKeys(decoder, CodingKeys.self)
        let c = try decoder.container(keyedBy: CodingKeys.self)
        name = try c.decode(String.self, forKey: .name)
        fields = try c.decodeIfPresent([FieldDeclaration].self, forKey: .fields) ?? []
        indexes = try c.decodeIfPresent([IndexDeclaration].self, forKey: .indexes) ?? []
        references = try c.decodeIfPresent([ReferenceDeclaration].self, forKey: .references)
        let given = try c.decodeIfPresent(Bool.self, forKey: .localOnly)
        localOnly = given ?? false
        keepsStoredLocalOnly = given == nil
        var defaults: [String: FieldValue] = [:]
        for field in fields {
            guard let json = field.defaultJSON else { continue }
            do { defaults[field.name] = try FieldValue.fromJSON(json, kind: field.anyKind || field.counter ? nil : field.kind, field: field.name) }
            catch let error as StoreError {
                throw DecodingError.dataCorruptedError(forKey: .fields, in: c, debugDescription: "the default of \(name).\(field.name): \(error.message)")
            }
        }
        self.defaults = defaults
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(name, forKey: .name)
        try c.encode(fields.map { field in
            var field = field
            field.defaultJSON = defaults[field.name]?.json
            return field
        }, forKey: .fields)
        try c.encode(indexes, forKey: .indexes)
        // Left out when the declaration keeps the stored flag (as a schema file without it
        // does): written, it would turn a local-only type synced once read back.
        if !keepsStoredLocalOnly { try c.encode(localOnly, forKey: .localOnly) }
        try c.encodeIfPresent(references, forKey: .references)
    }
}

/// One field of a ``TypeDeclaration``. In JSON: `{"name": "note", "kind": "string",
/// "optional": true}`, where `kind` is a ``FieldKind`` name, `"counter"` or `"any"`, and
/// `optional` may be left out (false); `"default": value` gives records stored before the
/// field a value (``TypeDeclaration/defaults``).
///
/// `Store.open` throws `.incompatibleSchema` for a declaration the stored records do not
/// fit: a kind other than the stored one while a record holds a value of it (convert it with
/// a ``Migration``), a counter turned plain or the reverse while records exist, a new
/// required field while records exist (unless it has a default), and an optional field
/// turned required while a record lacks a value.
public struct FieldDeclaration: Codable, Sendable, Equatable {
    /// The stored field name (the property's coding key).
    public var name: String
    /// The kind of every value the field holds (ignored when ``anyKind``).
    public var kind: FieldKind
    /// Whether a record may lack a value (nil). A stored field that a declaration listing
    /// fields leaves out turns optional.
    public var optional: Bool
    /// A ``Counter`` (kind `map`) that replicas merge by per-site totals. In a schema file,
    /// `"kind": "counter"` declares one.
    public var counter: Bool
    /// Values of any kind (a ``FieldValue`` or ``JSONValue`` property). In a schema file,
    /// `"kind": "any"` declares one.
    public var anyKind: Bool
    /// Bytes kept outside the record (an ``ExternalData`` property; kind `map`, the stored
    /// reference). In a schema file, `"kind": "bytes", "external": true` declares one. A
    /// stored inline `bytes` field declared external has its values moved out at open.
    public var external: Bool
    /// A schema file's `"default"`, read into ``TypeDeclaration/defaults`` by the type.
    var defaultJSON: JSONValue?

    /// A field `name` of `kind`; declare a counter with kind `.map`.
    /// `external`: kind `.map` is taken (the reference), whatever `kind` says.
    public init(name: String, kind: FieldKind, optional: Bool = false, counter: Bool = false, anyKind: Bool = false, external: Bool = false) {
        self.name = name
        self.kind = external ? .map : kind
        self.optional = optional
        self.counter = counter
        self.anyKind = anyKind
        self.external = external
    }

    enum CodingKeys: String, CodingKey, CaseIterable { case name, kind, optional, counter, `default`, external }
    public init(from decoder: any Decoder) throws {
        try refuseUnknownKeys(decoder, CodingKeys.self)
        let c = try decoder.container(keyedBy: CodingKeys.self)
        name = try c.decode(String.self, forKey: .name)
        defaultJSON = c.contains(.default) ? try c.decode(JSONValue.self, forKey: .default) : nil
        let kindName = try c.decode(String.self, forKey: .kind)
        anyKind = kindName == "any"
        if kindName == "counter" {
            kind = .map
            counter = true
        } else if anyKind {
            kind = .map
            counter = false
        } else {
            guard let parsed = FieldKind(rawValue: kindName) else {
                throw DecodingError.dataCorruptedError(forKey: .kind, in: c, debugDescription:
                    "unknown kind '\(kindName)' for field '\(name)' (kinds: \(FieldKind.allCases.map(\.rawValue).joined(separator: ", ")), counter, any)")
            }
            kind = parsed
            counter = try c.decodeIfPresent(Bool.self, forKey: .counter) ?? false
        }
        external = try c.decodeIfPresent(Bool.self, forKey: .external) ?? false
        if external {
            guard kindName == "bytes" else {
                throw DecodingError.dataCorruptedError(forKey: .external, in: c, debugDescription:
                    "field '\(name)' is external, which only a field of kind bytes can be (not \(kindName))")
            }
            kind = .map   // the stored reference
        }
        optional = try c.decodeIfPresent(Bool.self, forKey: .optional) ?? false
    }

    /// As a schema file spells it.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(name, forKey: .name)
        try c.encode(anyKind ? "any" : counter ? "counter" : external ? "bytes" : kind.rawValue, forKey: .kind)
        if external { try c.encode(true, forKey: .external) }
        if optional { try c.encode(true, forKey: .optional) }
        if let defaultJSON { try c.encode(defaultJSON, forKey: .default) }
    }
}

/// One index of a ``TypeDeclaration`` (what ``RecordIndex`` declares by key path). In JSON:
/// `{"fields": ["homeID", "name"], "unique": true}`, `unique` may be left out (false). The
/// stored index is named after its fields (`"homeID+name"`).
public struct IndexDeclaration: Codable, Sendable, Equatable {
    /// The stored field names in key order; `Store.open` throws `.incompatibleSchema` for none.
    public var fields: [String]
    /// Whether no two records may hold the same values (see ``RecordIndex/unique(_:)``). A
    /// stored unique index declared plain stays unique unless
    /// ``StoreOptions/relaxesUniqueIndexes``.
    public var unique: Bool

    /// An index on `fields`, in key order.
    public init(fields: [String], unique: Bool = false) {
        self.fields = fields
        self.unique = unique
    }

    enum CodingKeys: String, CodingKey, CaseIterable { case fields, unique }
    public init(from decoder: any Decoder) throws {
        try refuseUnknownKeys(decoder, CodingKeys.self)
        let c = try decoder.container(keyedBy: CodingKeys.self)
        fields = try c.decode([String].self, forKey: .fields)
        unique = try c.decodeIfPresent(Bool.self, forKey: .unique) ?? false
    }
}

/// A change of stored data that a schema change needs, run once at open when the stored
/// ``StoreSchema/version`` is below ``version``, inside the open's write transaction.
///
/// ```swift
/// // v2: the wardrobe app moves images from side files into the record.
/// let moveImages = Migration(version: 2, type: "Garment") { record in
///     let name = record.fields.removeValue(forKey: "imageFileName")
///     record.fields["imageData"] = try loadImage(named: name)
/// }
/// var options = StoreOptions()
/// options.migrations = [moveImages]
/// let store = try Store.open(at: dir, types: [Garment.self], options: options)
/// ```
/// A version that changes several types has one migration per type, all with that version;
/// the version counts as done once all of them ran.
///
/// The transform may run more than once for a record: when the open's transaction is retried
/// (the store's map grew, or the open failed and the app opens again), it starts over from the
/// stored data. Keep it a function of the record; leave side effects (deleting the side files
/// above, say) until the open has returned.
public struct Migration: Sendable {
    /// The schema version it brings the store to: it runs at an open while the stored
    /// ``StoreSchema/version`` is lower. Migrations run in version order, those of one version
    /// in the order given.
    public let version: Int
    /// The stored type whose records it transforms (``Record/recordType``); a type with no
    /// stored records yet has none to transform. `Store.open` throws `.incompatibleSchema` when
    /// a store that holds types neither holds nor declares it (a misspelt name), and
    /// `.invalidValue` for two migrations of one version naming the same type.
    public let type: String
    /// Changes one stored record, seen through the stored schema (with the defaults of the
    /// fields it lacks); called for each record of ``type``. The `id` and `type` it sets are
    /// ignored, and an int it writes into a double field is stored as a double. An error it
    /// throws makes the open throw `.incompatibleSchema`, with nothing written.
    public let transform: @Sendable (inout GenericRecord) throws -> Void

    /// A migration of the records of `type` to `version`.
    public init(version: Int, type: String, transform: @escaping @Sendable (inout GenericRecord) throws -> Void) {
        self.version = version
        self.type = type
        self.transform = transform
    }
}

/// A record seen through the stored schema: type name, id and field values by name.
public struct GenericRecord: Sendable, Equatable {
    public var type: String
    public var id: RecordID
    public var fields: [String: FieldValue]

    public init(type: String, id: RecordID, fields: [String: FieldValue]) {
        self.type = type
        self.id = id
        self.fields = fields
    }

    /// JSON object with `id` first-class, fields by name, each as a field of its own kind.
    public var json: JSONValue {
        var object = fields.mapValues(\.json)
        object["id"] = .string(id.description)
        return .object(object)
    }

    /// The fields as a JSON object, each as a field of its kind in `type`
    /// (``FieldValue/json(as:)``): what ``FieldValue/fromJSON(_:kind:field:)`` reads back
    /// equal with that schema, even for fields of no kind yet.
    public func fieldsJSON(as type: TypeSchema) -> [String: JSONValue] {
        var object: [String: JSONValue] = [:]
        for (name, value) in fields { object[name] = value.json(as: type.field(named: name)?.kind) }
        return object
    }
}

/// Any key of a schema file's object, to find those the format does not know.
private struct SchemaFileKey: CodingKey {
    let stringValue: String
    init(stringValue: String) { self.stringValue = stringValue }
    var intValue: Int? { nil }
    init?(intValue: Int) { nil }
}

/// Throws `DecodingError.dataCorrupted` at the first key of the object being decoded that
/// `Keys` does not name.
func refuseUnknownKeys<Keys: CodingKey & CaseIterable>(_ decoder: any Decoder, _ keys: Keys.Type) throws {
    let container = try decoder.container(keyedBy: SchemaFileKey.self)
    let known = Keys.allCases.map(\.stringValue)
    if let stray = container.allKeys.first(where: { !known.contains($0.stringValue) }) {
        throw DecodingError.dataCorruptedError(forKey: stray, in: container,
                                               debugDescription: "unknown key '\(stray.stringValue)' (the keys here: \(known.joined(separator: ", ")))")
    }
}
