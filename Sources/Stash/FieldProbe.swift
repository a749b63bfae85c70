import Synchronization
import Foundation

/// Learns a `Decodable` type's top-level fields (names, kinds, optionality) by decoding it
/// from a decoder that hands out placeholder values and writes down what was asked.
///
/// Works for ordinary structs (synthesized `Codable`, nested structs, arrays, enums with
/// raw values that are `CaseIterable`). When a type cannot be probed (a custom `init(from:)`
/// that validates its input), the probe gives up and the store learns fields from the values
/// written instead.
enum FieldProbe {
    static func fields<T: Decodable>(of type: T.Type) -> [FieldDeclaration]? {
        probe(type)?.fields
    }

    /// The stored fields, and what the type decodes under the key "id" (nil: nothing, when
    /// its coding keys leave the record id out). nil when the type cannot be probed.
    static func probe<T: Decodable>(_ type: T.Type) -> (fields: [FieldDeclaration], id: FieldDeclaration?)? {
        let probe = ProbeDecoder()
        do {
            _ = try T(from: probe)
        } catch {
            return nil
        }
        // A field the type asks about (`contains`, `decodeNil`) is one it reads when present:
        // a record may lack it (an older name read instead, say).
        let fields = probe.fields.map { field in
            var field = field
            if probe.askedPresence.contains(field.name) { field.optional = true }
            return field
        }
        return (fields.filter { $0.name != "id" }, fields.first { $0.name == "id" })
    }
}

final class ProbeDecoder: Decoder {
    var codingPath: [any CodingKey] = []
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    var fields: [FieldDeclaration] = []
    /// Keys the type asked about with `contains` or `decodeNil`.
    var askedPresence: Set<String> = []

    func record(_ name: String, _ kind: FieldKind, optional: Bool, counter: Bool = false, anyKind: Bool = false, external: Bool = false) {
        if !fields.contains(where: { $0.name == name }) {
            fields.append(FieldDeclaration(name: name, kind: kind, optional: optional, counter: counter, anyKind: anyKind, external: external))
        }
    }

    /// An ``ExternalData`` property (or an optional one): bytes kept outside the record.
    static func isExternal<T>(_ type: T.Type) -> Bool { T.self == ExternalData.self || T.self == ExternalData?.self }

    /// `FieldValue` and `JSONValue` (or optionals of them) hold values of any kind.
    static func holdsAnyKind<T>(_ type: T.Type) -> Bool {
        T.self == FieldValue.self || T.self == JSONValue.self || T.self == FieldValue?.self || T.self == JSONValue?.self
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        KeyedDecodingContainer(ProbeKeyedDecoder<Key>(probe: self))
    }
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer { throw ProbeFailure() }
    func singleValueContainer() throws -> any SingleValueDecodingContainer { throw ProbeFailure() }
}

struct ProbeFailure: Error {}

struct ProbeKeyedDecoder<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let probe: ProbeDecoder
    var codingPath: [any CodingKey] { [] }
    var allKeys: [Key] { [] }
    func contains(_ key: Key) -> Bool {
        probe.askedPresence.insert(key.stringValue)
        return true
    }
    func decodeNil(forKey key: Key) throws -> Bool {
        probe.askedPresence.insert(key.stringValue)
        return false
    }

    /// `decode(T?.self, forKey:)` declares an optional field, as `decodeIfPresent` does, and so
    /// does a type that reads a null (a wrapper of an optional, `FieldValue`): a record lacking
    /// the field reads as that null.
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        let (value, kind) = try PlaceholderValue.make(type)
        let optional = T.self is any ExpressibleByNilLiteral.Type || (try? PrimitiveDecoding.decode(type, .null, [key])) != nil
        probe.record(key.stringValue, kind, optional: optional, counter: T.self == Counter.self,
                     anyKind: ProbeDecoder.holdsAnyKind(T.self), external: ProbeDecoder.isExternal(T.self))
        return value
    }

    func decodeIfPresent<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T? {
        let (_, kind) = try PlaceholderValue.make(type)
        probe.record(key.stringValue, kind, optional: true, counter: T.self == Counter.self, anyKind: ProbeDecoder.holdsAnyKind(T.self),
                     external: ProbeDecoder.isExternal(T.self))
        return nil
    }
    func decodeIfPresent(_ type: Bool.Type, forKey key: Key) throws -> Bool? { try optional(type, key) }
    func decodeIfPresent(_ type: String.Type, forKey key: Key) throws -> String? { try optional(type, key) }
    func decodeIfPresent(_ type: Double.Type, forKey key: Key) throws -> Double? { try optional(type, key) }
    func decodeIfPresent(_ type: Float.Type, forKey key: Key) throws -> Float? { try optional(type, key) }
    func decodeIfPresent(_ type: Int.Type, forKey key: Key) throws -> Int? { try optional(type, key) }
    func decodeIfPresent(_ type: Int8.Type, forKey key: Key) throws -> Int8? { try optional(type, key) }
    func decodeIfPresent(_ type: Int16.Type, forKey key: Key) throws -> Int16? { try optional(type, key) }
    func decodeIfPresent(_ type: Int32.Type, forKey key: Key) throws -> Int32? { try optional(type, key) }
    func decodeIfPresent(_ type: Int64.Type, forKey key: Key) throws -> Int64? { try optional(type, key) }
    func decodeIfPresent(_ type: UInt.Type, forKey key: Key) throws -> UInt? { try optional(type, key) }
    func decodeIfPresent(_ type: UInt8.Type, forKey key: Key) throws -> UInt8? { try optional(type, key) }
    func decodeIfPresent(_ type: UInt16.Type, forKey key: Key) throws -> UInt16? { try optional(type, key) }
    func decodeIfPresent(_ type: UInt32.Type, forKey key: Key) throws -> UInt32? { try optional(type, key) }
    func decodeIfPresent(_ type: UInt64.Type, forKey key: Key) throws -> UInt64? { try optional(type, key) }

    private func optional<T: Decodable>(_ type: T.Type, _ key: Key) throws -> T? {
        let (_, kind) = try PlaceholderValue.make(type)
        probe.record(key.stringValue, kind, optional: true)
        return nil
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        probe.record(key.stringValue, .map, optional: false)
        return try PlaceholderDecoder().container(keyedBy: type)
    }
    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        probe.record(key.stringValue, .array, optional: false)
        return try PlaceholderDecoder().unkeyedContainer()
    }
    func superDecoder() throws -> any Decoder { throw ProbeFailure() }
    func superDecoder(forKey key: Key) throws -> any Decoder { throw ProbeFailure() }
}

/// Makes a value of any `Decodable` type from placeholders, and tells its stored kind.
enum PlaceholderValue {
    static func make<T: Decodable>(_ type: T.Type) throws -> (T, FieldKind) {
        switch type {
        case is Bool.Type: return (false as! T, .bool)
        case is String.Type: return ("" as! T, .string)
        case is Double.Type: return (0.0 as! T, .double)
        case is Float.Type: return (Float(0) as! T, .double)
        case is Int.Type: return (0 as! T, .int)
        case is Int64.Type: return (Int64(0) as! T, .int)
        case is Int32.Type: return (Int32(0) as! T, .int)
        case is Int16.Type: return (Int16(0) as! T, .int)
        case is Int8.Type: return (Int8(0) as! T, .int)
        case is UInt.Type: return (UInt(0) as! T, .int)
        case is UInt64.Type: return (UInt64(0) as! T, .int)
        case is UInt32.Type: return (UInt32(0) as! T, .int)
        case is UInt16.Type: return (UInt16(0) as! T, .int)
        case is UInt8.Type: return (UInt8(0) as! T, .int)
        case is Date.Type: return (Date(timeIntervalSince1970: 0) as! T, .date)
        case is Data.Type: return (Data() as! T, .bytes)
        case is UUID.Type: return (UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)) as! T, .uuid)   // fixed: a probe decodes twice and compares
        case is RecordID.Type: return (RecordID(high: 0, low: 0) as! T, .uuid)
        case is URL.Type: return (URL(fileURLWithPath: "/") as! T, .string)
        // Any kind (``ProbeDecoder/holdsAnyKind(_:)``); the kind given is not used.
        case is FieldValue.Type: return (FieldValue.null as! T, .map)
        case is JSONValue.Type: return (JSONValue.null as! T, .map)
        case is ExternalData.Type: return (ExternalData.placeholder as! T, .map)
        default: break
        }
        // `decode(T?.self, forKey:)`: nil, of the wrapped type's kind.
        if let optional = type as? any ProbedOptional.Type, let none = optional.probeNone as? T {
            return (none, try optional.wrappedKind())
        }
        if let cases = type as? any CaseIterable.Type, let first = firstCase(cases) as? T {
            // The kind is what the first case encodes as (a raw value of any type, or a
            // custom single value); before, a Double raw value was taken for a map, and every
            // write of the type was refused as a change of kind.
            if let encodable = first as? any Encodable, let kind = (try? FieldValue(encoding: encodable))?.kind {
                return (first, kind)
            }
            let raw = (first as? any RawRepresentable)?.rawValue
            let kind: FieldKind = raw is String ? .string : raw is any BinaryInteger ? .int : .map
            return (first, kind)
        }
        let decoder = PlaceholderDecoder()
        let value = try T(from: decoder)
        return (value, decoder.kind ?? .map)
    }

    private static func firstCase<C: CaseIterable>(_ type: C.Type) -> Any? { C.allCases.first }
}

/// An optional the probe meets through `decode(T?.self, forKey:)`: probed as its wrapped type.
protocol ProbedOptional {
    static var probeNone: Self { get }
    static func wrappedKind() throws -> FieldKind
}

extension Optional: ProbedOptional where Wrapped: Decodable {
    static var probeNone: Self { nil }
    static func wrappedKind() throws -> FieldKind { try PlaceholderValue.make(Wrapped.self).1 }
}

/// Answers every request with a placeholder; remembers the first container kind asked for.
final class PlaceholderDecoder: Decoder {
    var codingPath: [any CodingKey] = []
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    var kind: FieldKind?

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        if kind == nil { kind = .map }
        return KeyedDecodingContainer(PlaceholderKeyed<Key>())
    }
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        if kind == nil { kind = .array }
        return PlaceholderUnkeyed()
    }
    func singleValueContainer() throws -> any SingleValueDecodingContainer { PlaceholderSingle(decoder: self) }
}

struct PlaceholderKeyed<Key: CodingKey>: KeyedDecodingContainerProtocol {
    var codingPath: [any CodingKey] { [] }
    var allKeys: [Key] { [] }
    func contains(_ key: Key) -> Bool { false }
    func decodeNil(forKey key: Key) throws -> Bool { true }
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T { try PlaceholderValue.make(type).0 }
    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        KeyedDecodingContainer(PlaceholderKeyed<NestedKey>())
    }
    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer { PlaceholderUnkeyed() }
    func superDecoder() throws -> any Decoder { PlaceholderDecoder() }
    func superDecoder(forKey key: Key) throws -> any Decoder { PlaceholderDecoder() }
}

struct PlaceholderUnkeyed: UnkeyedDecodingContainer {
    var codingPath: [any CodingKey] { [] }
    var count: Int? { 0 }
    var isAtEnd: Bool { true }
    var currentIndex: Int { 0 }
    mutating func decodeNil() throws -> Bool { true }
    // Types that read a fixed number of elements whatever `isAtEnd` says (`Decimal`'s
    // mantissa, `Range`'s bounds, SIMD lanes) get placeholders: throwing made every record
    // type with such a field unprobeable, without the open's checks.
    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { try PlaceholderValue.make(type).0 }
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        KeyedDecodingContainer(PlaceholderKeyed<NestedKey>())
    }
    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer { PlaceholderUnkeyed() }
    mutating func superDecoder() throws -> any Decoder { PlaceholderDecoder() }
}

struct PlaceholderSingle: SingleValueDecodingContainer {
    let decoder: PlaceholderDecoder
    var codingPath: [any CodingKey] { [] }
    func decodeNil() -> Bool { false }
    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        let (value, kind) = try PlaceholderValue.make(type)
        if decoder.kind == nil { decoder.kind = kind }
        return value
    }
}

/// The stored fields each record type declares (its probe), kept per type: what a local write
/// of the type replaces (see ``WriteContext/put(_:id:record:mode:versions:origin:absent:keepingFieldsUnknownTo:)``).
/// nil for a type that cannot be probed.
enum DeclaredFields {
    private static let cache = Mutex<[ObjectIdentifier: Set<String>?]>([:])

    static func names(of type: any Record.Type) -> Set<String>? {
        let key = ObjectIdentifier(type)
        if let hit = cache.withLock({ $0[key] }) { return hit }
        let names = FieldProbe.fields(of: type).map { Set($0.map(\.name)) }
        cache.withLock { $0[key] = names }
        return names
    }
}

/// The index fields of record types that could not be probed at open, checked against what
/// the first record written of each actually stores (``WriteContext/encode(_:)``): an index
/// on a renamed coding key or a computed property would index every record as lacking it.
enum IndexFieldCheck {
    private static let checked = Mutex<Set<ObjectIdentifier>>([])

    static func isDone(_ type: any Record.Type) -> Bool {
        checked.withLock { $0.contains(ObjectIdentifier(type)) }
    }

    static func markDone(_ type: any Record.Type) {
        _ = checked.withLock { $0.insert(ObjectIdentifier(type)) }
    }
}
