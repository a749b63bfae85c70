import Foundation
import Synchronization

/// A typed record: a `Codable` struct with a stable type name and a ``RecordID``.
///
/// ```swift
/// struct Item: Record {
///     var id = RecordID()
///     var homeID: RecordID
///     var name: String
///     static let indexes: [RecordIndex<Item>] = [.index(\.homeID), .index(\.homeID, \.name)]
/// }
/// let store = try Store.open(at: dir, types: [Home.self, Item.self])
/// try store.insert(Item(homeID: home.id, name: "Lamp"))
/// let n = try store.count(Item.self, where: \.homeID, equals: home.id)   // O(1)
/// ```
///
/// ## Topics
/// - ``recordType``: the name stored in the schema (default: the Swift type name).
/// - ``indexes``: secondary indexes by key path; ``RecordIndex/unique(_:)`` for unique keys.
/// - ``isLocalOnly``: never synced.
/// - ``fieldDefaults``: values for fields added after records were stored.
///
/// ## What the open checks
/// `Store.open` learns a type's fields by decoding it from placeholder values, and checks a
/// model change against the stored records: a new required field without a default, an
/// optional field turned required while records lack it, a field's kind changed without a
/// ``Migration``. A type it cannot decode that way gets none of these checks (its fields are
/// learned from the records it writes, and a read of an older record that lacks a field then
/// throws): an enum with a raw value that is not `CaseIterable`, an enum with associated values,
/// or a value type whose `init(from:)` validates its input, anywhere in the type's fields.
/// Make such enums `CaseIterable` to keep the checks.
///
/// ## What a field holds
/// Each stored field holds values of one kind (the first one written, or the probe's), except
/// a ``FieldValue`` or ``JSONValue`` property, which holds any. Another property whose values
/// are of several kinds (an enum that decodes an Int or else a String) must store them as
/// one, text say, or inside a map.
/// A `URL` is stored as its absolute string (a relative URL loses its base, as with
/// JSONEncoder); `Int128` and `UInt128` are not supported.
///
/// ## Decoding
/// A read decodes a record's fields where they lie, in the order they were stored. A type
/// whose `init(from:)` asks for an optional field before another field that its `encode(to:)`
/// writes ahead of that optional may have its first decode taken back (the read then decodes
/// the record again from its field table), so `init(from:)` can run twice for one read: keep
/// it free of side effects. Synthesized `Codable` reads in the order it writes: a record it
/// stored (with its properties in the same order) is decoded once.
public protocol Record: Codable, Sendable {
    /// The stable name of the type in the store. Renaming the Swift type must keep it.
    static var recordType: String { get }
    /// The record's identity and the key it is stored under (unique within its type; not a
    /// stored field). The type must decode it from the coding key `id`: `Store.open` throws
    /// `.incompatibleSchema` for a type that decodes another kind there, or never decodes it.
    var id: RecordID { get }
    /// The type's secondary indexes (default: none), merged into the store's schema at open:
    /// a new index is built from the stored records then; one no longer listed stays unless
    /// ``StoreOptions/dropsUndeclaredIndexes``. Every write keeps each index exact in its
    /// transaction. `Store.open` throws `.incompatibleSchema` for an index on a computed
    /// property, a nested path or a property stored under another coding key.
    static var indexes: [RecordIndex<Self>] { get }
    /// Records of a local-only type stay on this device.
    static var isLocalOnly: Bool { get }
    /// Values decoded for fields that a stored record lacks (a field added later).
    static var fieldDefaults: [String: FieldValue] { get }
    /// Fields that hold a parent record's id, with what deleting the parent does (default:
    /// none; see ``RecordReference``).
    static var references: [RecordReference<Self>] { get }
}

extension Record {
    public static var recordType: String { NameCache.typeName(Self.self) }
    public static var indexes: [RecordIndex<Self>] { [] }
    public static var isLocalOnly: Bool { false }
    public static var fieldDefaults: [String: FieldValue] { [:] }
    public static var references: [RecordReference<Self>] { [] }
}

/// A secondary index of a ``Record`` type, declared by key path.
public struct RecordIndex<R: Record>: @unchecked Sendable {
    /// The key paths in key order (stored as immutable key path objects).
    public let keyPaths: [PartialKeyPath<R>]
    /// The stored field names of ``keyPaths``, in key order (`\Item.homeID` → `homeID`).
    public let fields: [String]
    /// Whether two records may not hold the same values (see ``unique(_:)``).
    public let unique: Bool

    init(_ keyPaths: [PartialKeyPath<R>], unique: Bool) {
        self.keyPaths = keyPaths
        self.fields = keyPaths.map(fieldName(of:))
        self.unique = unique
    }

    /// A plain index on one field: `count(_:where:equals:)` and ``IndexHandle`` counts in
    /// O(1), and fetches answer `==` and range conditions on the field through it. A write
    /// that changes the record's key in it moves its entry in the same transaction, O(log n).
    public static func index<A: IndexableValue>(_ a: KeyPath<R, A>) -> Self { Self([a], unique: false) }
    /// A composite index keyed by `a`, then `b` (named after its fields, `"homeID+name"`):
    /// fetches use it for equality on `a` or on both, and for a range on `a`, or on `b` after
    /// equality on `a`. Beside an index on `a` alone, the planner takes this one when the
    /// predicate also constrains `b` (it answers more conditions), the one on `a` when not
    /// (its whole key is an exact count).
    public static func index<A: IndexableValue, B: IndexableValue>(_ a: KeyPath<R, A>, _ b: KeyPath<R, B>) -> Self {
        Self([a, b], unique: false)
    }
    /// A composite index keyed by `a`, `b`, then `c`: fetches use it for equality on its
    /// leading fields, optionally followed by a range on the next one, when no other index
    /// answers more of the predicate's conditions.
    public static func index<A: IndexableValue, B: IndexableValue, C: IndexableValue>(
        _ a: KeyPath<R, A>, _ b: KeyPath<R, B>, _ c: KeyPath<R, C>) -> Self {
        Self([a, b, c], unique: false)
    }
    /// A unique index: inserting a second record with the same value throws
    /// ``StoreError/Code/uniqueViolation``. A record without a value of its own (nil, or the
    /// field's declared default) clashes with none, like SQL's NULL: any number of records
    /// may lack it.
    public static func unique<A: IndexableValue>(_ a: KeyPath<R, A>) -> Self { Self([a], unique: true) }
    /// A unique composite index: no two records may hold the same pair of values (see
    /// ``unique(_:)``; a record lacking either value clashes with none).
    public static func unique<A: IndexableValue, B: IndexableValue>(_ a: KeyPath<R, A>, _ b: KeyPath<R, B>) -> Self {
        Self([a, b], unique: true)
    }

    var declaration: IndexDeclaration { IndexDeclaration(fields: fields, unique: unique) }
}

/// The stored field name of a key path: `\Item.homeID` → `homeID`, `\Item.size.width` → `size.width`.
func fieldName(of keyPath: AnyKeyPath) -> String { NameCache.fieldName(keyPath) }

/// Type and key-path names, computed once: `String(describing:)` walks reflection metadata.
enum NameCache {
    private static let types = Mutex<[ObjectIdentifier: String]>([:])
    private static let keyPaths = Mutex<[ObjectIdentifier: (KeyPathBox, String)]>([:])
    struct KeyPathBox: @unchecked Sendable { let keyPath: AnyKeyPath }

    static func typeName(_ type: Any.Type) -> String {
        let key = ObjectIdentifier(type)
        if let name = types.withLock({ $0[key] }) { return name }
        let name = String(describing: type)
        types.withLock { $0[key] = name }
        return name
    }

    static func fieldName(_ keyPath: AnyKeyPath) -> String {
        let key = ObjectIdentifier(keyPath)
        if let entry = keyPaths.withLock({ $0[key] }) { return entry.1 }
        let name = describeFieldName(keyPath)
        let box = KeyPathBox(keyPath: keyPath)
        keyPaths.withLock { $0[key] = (box, name) }   // keeps the key path alive: its identity stays unique
        return name
    }
}

func describeFieldName(_ keyPath: AnyKeyPath) -> String {
    let text = String(describing: keyPath)
    guard let dot = text.firstIndex(of: ".") else { return text }
    return String(text[text.index(after: dot)...])
}

extension Record {
    /// The declaration the store merges into its schema at open: indexes and flags from the
    /// type, fields probed from its `Decodable` conformance where possible.
    /// - Throws: `.incompatibleSchema` when an index names a key path whose property is not a
    ///   stored field of that name: a property stored under another coding key, a computed
    ///   property, or a nested path. Every record would be indexed as lacking it, and counts
    ///   and queries through the index would find none. (A type that cannot be probed is
    ///   checked for nested paths only.)
    static func declaration(in store: String) throws -> TypeDeclaration {
        let probed = FieldProbe.probe(Self.self)
        let fields = probed?.fields
        if let probed {
            // The record id is the key, stored under no field: a type decodes it from "id" (as a
            // RecordID, optional or not), or computes it (the same id at every decode). One
            // whose id comes from a default (CodingKeys leaving 'id' out of `var id = RecordID()`)
            // would read back under a new id at every read.
            if let id = probed.id {
                guard id.kind == .uuid else {
                    throw StoreError(.incompatibleSchema, "store \(store): \(recordType) decodes a \(id.kind.rawValue) under the coding key 'id', which is the record id (a RecordID); give that property another coding key")
                }
            } else if let first = try? Self(from: ProbeDecoder()), let second = try? Self(from: ProbeDecoder()), first.id != second.id {
                throw StoreError(.incompatibleSchema, "store \(store): \(recordType) never decodes its id (its CodingKeys leave out 'id'), so every read would give the record a new id; add `case id` to its CodingKeys")
            }
        }
        for index in indexes {
            for (keyPath, field) in zip(index.keyPaths, index.fields) where field.hasPrefix("<") {
                throw StoreError(.incompatibleSchema, "store \(store): \(recordType) declares an index on \(keyPath), whose property has no name in this build (\(field)): build with reflection metadata (do not set SWIFT_REFLECTION_METADATA_LEVEL=none)")
            }
            for (keyPath, field) in zip(index.keyPaths, index.fields)
            where field.contains(".") || fields.map({ !$0.contains { $0.name == field } }) ?? false {
                let stored = (fields ?? []).map(\.name).sorted().joined(separator: ", ")
                throw StoreError(.incompatibleSchema, "store \(store): \(recordType) declares an index on \(keyPath), but \(recordType) stores no field '\(field)' (its stored fields: \(stored)); index stored properties whose coding key is their own name, not computed properties, nested paths or renamed coding keys")
            }
        }
        var declaration = TypeDeclaration(name: recordType, fields: fields ?? [], indexes: indexes.map(\.declaration),
                                          localOnly: isLocalOnly, defaults: fieldDefaults)
        declaration.isProbed = probed != nil
        declaration.references = references.map(\.declaration)
        return declaration
    }
}
