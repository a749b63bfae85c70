import Foundation

// Encoding and decoding between Swift values and `FieldValue` trees. Used for nested values
// of records, for predicate constants, and for the generic paths.

/// An intermediate node while encoding: containers are reference types so nested containers
/// can be filled after they are handed out.
final class MapNode { var entries: [String: EncodingNode] = [:] }
final class ArrayNode { var items: [EncodingNode] = [] }

enum EncodingNode {
    case value(FieldValue)
    case map(MapNode)
    case array(ArrayNode)
    /// A super encoder's content: whatever container it was given (keyed, unkeyed or single).
    case encoder(TreeEncoder)

    var resolved: FieldValue {
        switch self {
        case .value(let v): return v
        case .map(let m): return .map(m.entries.mapValues(\.resolved))
        case .array(let a): return .array(a.items.map(\.resolved))
        case .encoder(let e): return e.root?.resolved ?? .map([:])
        }
    }
}

/// The key of `superEncoder()` / `superDecoder()` without a key: "super", whatever the
/// container's own key type (a synthesized `CodingKeys` has no such case).
struct SuperKey: CodingKey {
    var stringValue: String { "super" }
    var intValue: Int? { nil }
    init() {}
    init?(stringValue: String) { guard stringValue == "super" else { return nil } }
    init?(intValue: Int) { nil }
}

/// Encodes any `Encodable` into a ``FieldValue``.
final class TreeEncoder: Encoder {
    var codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    var root: EncodingNode?

    init(codingPath: [any CodingKey] = []) { self.codingPath = codingPath }

    static func encode(_ value: some Encodable, codingPath: [any CodingKey] = []) throws -> FieldValue {
        if let special = specialFieldValue(value) { return special }
        let encoder = TreeEncoder(codingPath: codingPath)
        try value.encode(to: encoder)
        let result = encoder.root?.resolved ?? .map([:])
        // A set, or a dictionary encoded as [key, value, key, value, …] (keys other than String
        // and Int), comes out in hash order, which changes from one process (and one set) to
        // the next: stored as is, an unchanged record looked changed and its newer version beat
        // real edits on other devices. They are stored in the order of their values' bytes.
        if case .array(let items) = result, items.count > 1, let unordered = value as? any UnorderedCollection {
            return .array(type(of: unordered).canonicalOrder(items))
        }
        return result
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        let node: MapNode
        if case .map(let existing) = root { node = existing } else { node = MapNode(); root = .map(node) }
        return KeyedEncodingContainer(TreeKeyedEncoder<Key>(node: node, codingPath: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        let node: ArrayNode
        if case .array(let existing) = root { node = existing } else { node = ArrayNode(); root = .array(node) }
        return TreeUnkeyedEncoder(node: node, codingPath: codingPath)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer { TreeSingleEncoder(encoder: self) }
}

/// Values with a native kind, recognized before falling back to their Codable form.
@inline(__always)
func specialFieldValue(_ value: Any) -> FieldValue? {
    switch value {
    case let v as RecordID: return .uuid(v.uuid)   // first: ids are what records are most often found by
    case let v as Date: return .date(v)
    case let v as Data: return .bytes(v)
    case let v as UUID: return .uuid(v)
    case let v as URL: return .string(v.absoluteString)
    case let v as FieldValue: return v
    default: return nil
    }
}

private func intValue<T: BinaryInteger>(_ value: T, _ path: [any CodingKey]) throws -> FieldValue {
    guard let v = Int64(exactly: value) else {
        throw EncodingError.invalidValue(value, .init(codingPath: path, debugDescription: "\(value) does not fit in 64-bit signed integer storage"))
    }
    return .int(v)
}

struct TreeKeyedEncoder<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let node: MapNode
    var codingPath: [any CodingKey]

    init(node: MapNode, codingPath: [any CodingKey]) {
        self.node = node
        self.codingPath = codingPath
    }

    mutating func encodeNil(forKey key: Key) throws { node.entries[key.stringValue] = .value(.null) }
    mutating func encode(_ value: Bool, forKey key: Key) throws { node.entries[key.stringValue] = .value(.bool(value)) }
    mutating func encode(_ value: String, forKey key: Key) throws { node.entries[key.stringValue] = .value(.string(value)) }
    mutating func encode(_ value: Double, forKey key: Key) throws { node.entries[key.stringValue] = .value(.double(value)) }
    mutating func encode(_ value: Float, forKey key: Key) throws { node.entries[key.stringValue] = .value(.double(Double(value))) }
    mutating func encode(_ value: Int, forKey key: Key) throws { node.entries[key.stringValue] = .value(.int(Int64(value))) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { node.entries[key.stringValue] = .value(.int(value)) }
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        if let v = value as? any BinaryInteger {
            node.entries[key.stringValue] = .value(try intValue(v, codingPath + [key]))
            return
        }
        node.entries[key.stringValue] = .value(try TreeEncoder.encode(value, codingPath: codingPath + [key]))
    }
    mutating func encodeIfPresent<T: Encodable>(_ value: T?, forKey key: Key) throws {
        guard let value else { return }   // absent, like JSON: decodeIfPresent gives nil
        try encode(value, forKey: key)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        let child = MapNode()
        node.entries[key.stringValue] = .map(child)
        return KeyedEncodingContainer(TreeKeyedEncoder<NestedKey>(node: child, codingPath: codingPath + [key]))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        let child = ArrayNode()
        node.entries[key.stringValue] = .array(child)
        return TreeUnkeyedEncoder(node: child, codingPath: codingPath + [key])
    }

    mutating func superEncoder() -> any Encoder { superEncoder(named: SuperKey()) }
    mutating func superEncoder(forKey key: Key) -> any Encoder { superEncoder(named: key) }
    private func superEncoder(named key: any CodingKey) -> any Encoder {
        let encoder = TreeEncoder(codingPath: codingPath + [key])
        node.entries[key.stringValue] = .encoder(encoder)
        return encoder
    }
}

struct IndexKeyPathComponent: CodingKey {
    var stringValue: String
    var intValue: Int?
    init(index: Int) { stringValue = "\(index)"; intValue = index }
    init?(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { self.init(index: intValue) }
}

struct TreeUnkeyedEncoder: UnkeyedEncodingContainer {
    let node: ArrayNode
    var codingPath: [any CodingKey]
    var count: Int { node.items.count }

    private var nextPath: [any CodingKey] { codingPath + [IndexKeyPathComponent(index: count)] }

    mutating func encodeNil() throws { node.items.append(.value(.null)) }
    mutating func encode(_ value: Bool) throws { node.items.append(.value(.bool(value))) }
    mutating func encode(_ value: String) throws { node.items.append(.value(.string(value))) }
    mutating func encode(_ value: Double) throws { node.items.append(.value(.double(value))) }
    mutating func encode(_ value: Int) throws { node.items.append(.value(.int(Int64(value)))) }
    mutating func encode<T: Encodable>(_ value: T) throws {
        if let v = value as? any BinaryInteger {
            node.items.append(.value(try intValue(v, nextPath)))
            return
        }
        node.items.append(.value(try TreeEncoder.encode(value, codingPath: nextPath)))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let child = MapNode()
        let path = nextPath
        node.items.append(.map(child))
        return KeyedEncodingContainer(TreeKeyedEncoder<NestedKey>(node: child, codingPath: path))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let child = ArrayNode()
        let path = nextPath
        node.items.append(.array(child))
        return TreeUnkeyedEncoder(node: child, codingPath: path)
    }

    mutating func superEncoder() -> any Encoder {
        let encoder = TreeEncoder(codingPath: nextPath)
        node.items.append(.encoder(encoder))
        return encoder
    }
}

struct TreeSingleEncoder: SingleValueEncodingContainer {
    let encoder: TreeEncoder
    var codingPath: [any CodingKey] { encoder.codingPath }

    func encodeNil() throws { encoder.root = .value(.null) }
    func encode(_ value: Bool) throws { encoder.root = .value(.bool(value)) }
    func encode(_ value: String) throws { encoder.root = .value(.string(value)) }
    func encode(_ value: Double) throws { encoder.root = .value(.double(value)) }
    func encode(_ value: Float) throws { encoder.root = .value(.double(Double(value))) }
    func encode(_ value: Int) throws { encoder.root = .value(.int(Int64(value))) }
    func encode<T: Encodable>(_ value: T) throws {
        if let v = value as? any BinaryInteger {
            encoder.root = .value(try intValue(v, codingPath))
            return
        }
        encoder.root = .value(try TreeEncoder.encode(value, codingPath: codingPath))
    }
}

// MARK: Decoding

/// Decodes any `Decodable` from a ``FieldValue``.
struct TreeDecoder: Decoder {
    let value: FieldValue
    var codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    static func decode<T: Decodable>(_ type: T.Type, from value: FieldValue, codingPath: [any CodingKey] = []) throws -> T {
        if let special = try decodeSpecial(type, from: value, codingPath: codingPath) { return special }
        return try T(from: TreeDecoder(value: value, codingPath: codingPath))
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .map(let entries) = value else {
            throw DecodingError.typeMismatch([String: Any].self, .init(codingPath: codingPath, debugDescription: "expected a map, found \(value)"))
        }
        return KeyedDecodingContainer(TreeKeyedDecoder<Key>(entries: entries, codingPath: codingPath))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .array(let items) = value else {
            throw DecodingError.typeMismatch([Any].self, .init(codingPath: codingPath, debugDescription: "expected an array, found \(value)"))
        }
        return TreeUnkeyedDecoder(items: items, codingPath: codingPath)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { TreeSingleDecoder(value: value, codingPath: codingPath) }
}

/// Types with a native kind, decoded directly (and tolerant of text forms from JSON).
func decodeSpecial<T>(_ type: T.Type, from value: FieldValue, codingPath: [any CodingKey]) throws -> T? {
    func mismatch() -> DecodingError {
        .typeMismatch(T.self, .init(codingPath: codingPath, debugDescription: "expected \(T.self), found \(value)"))
    }
    if T.self == Date.self {
        switch value {
        case .date(let d): return (d as! T)
        case .double(let d): return (Date(timeIntervalSince1970: d) as! T)
        case .int(let i): return (Date(timeIntervalSince1970: Double(i)) as! T)
        default: throw mismatch()
        }
    }
    if T.self == Data.self {
        guard case .bytes(let d) = value else { throw mismatch() }
        return (d as! T)
    }
    if T.self == UUID.self {
        switch value {
        case .uuid(let u): return (u as! T)
        case .string(let s): if let u = UUID(uuidString: s) { return (u as! T) }
        default: break
        }
        throw mismatch()
    }
    if T.self == RecordID.self {
        switch value {
        case .uuid(let u): return (RecordID(u) as! T)
        case .string(let s): if let id = RecordID(string: s) { return (id as! T) }
        default: break
        }
        throw mismatch()
    }
    if T.self == URL.self {
        guard case .string(let s) = value, let url = URL(string: s) else { throw mismatch() }
        return (url as! T)
    }
    if T.self == FieldValue.self { return (value as! T) }
    return nil
}

/// Primitive conversions shared by every decoding container.
enum PrimitiveDecoding {
    static func bool(_ v: FieldValue, _ path: [any CodingKey]) throws -> Bool {
        guard case .bool(let b) = v else { throw mismatch(Bool.self, v, path) }
        return b
    }
    static func string(_ v: FieldValue, _ path: [any CodingKey]) throws -> String {
        guard case .string(let s) = v else { throw mismatch(String.self, v, path) }
        return s
    }
    static func double(_ v: FieldValue, _ path: [any CodingKey]) throws -> Double {
        switch v {
        case .double(let d): return d
        case .int(let i): return Double(i)
        default: throw mismatch(Double.self, v, path)
        }
    }
    /// A double that is finite but beyond Float's range is refused, as JSONDecoder does,
    /// not read as an infinity.
    static func float(_ v: FieldValue, _ path: [any CodingKey]) throws -> Float {
        let d = try double(v, path)
        let f = Float(d)
        guard f.isFinite || !d.isFinite else {
            throw DecodingError.dataCorrupted(.init(codingPath: path, debugDescription: "\(d) does not fit in Float"))
        }
        return f
    }
    static func integer<T: FixedWidthInteger>(_ type: T.Type, _ v: FieldValue, _ path: [any CodingKey]) throws -> T {
        guard case .int(let i) = v else { throw mismatch(T.self, v, path) }
        guard let value = T(exactly: i) else {
            throw DecodingError.dataCorrupted(.init(codingPath: path, debugDescription: "\(i) does not fit in \(T.self)"))
        }
        return value
    }
    static func mismatch(_ type: Any.Type, _ v: FieldValue, _ path: [any CodingKey]) -> DecodingError {
        .typeMismatch(type, .init(codingPath: path, debugDescription: "expected \(type), found \(v)"))
    }

    /// Decodes `T` from a field value: primitives directly, everything else through ``TreeDecoder``.
    static func decode<T: Decodable>(_ type: T.Type, _ v: FieldValue, _ path: [any CodingKey]) throws -> T {
        switch type {
        case is Bool.Type: return try bool(v, path) as! T
        case is String.Type: return try string(v, path) as! T
        case is Double.Type: return try double(v, path) as! T
        case is Float.Type: return try float(v, path) as! T
        case is Int.Type: return try integer(Int.self, v, path) as! T
        case is Int64.Type: return try integer(Int64.self, v, path) as! T
        case is Int32.Type: return try integer(Int32.self, v, path) as! T
        case is Int16.Type: return try integer(Int16.self, v, path) as! T
        case is Int8.Type: return try integer(Int8.self, v, path) as! T
        case is UInt.Type: return try integer(UInt.self, v, path) as! T
        case is UInt64.Type: return try integer(UInt64.self, v, path) as! T
        case is UInt32.Type: return try integer(UInt32.self, v, path) as! T
        case is UInt16.Type: return try integer(UInt16.self, v, path) as! T
        case is UInt8.Type: return try integer(UInt8.self, v, path) as! T
        default: return try TreeDecoder.decode(type, from: v, codingPath: path)
        }
    }
}

struct TreeKeyedDecoder<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let entries: [String: FieldValue]
    var codingPath: [any CodingKey]
    var allKeys: [Key] { entries.keys.compactMap { Key(stringValue: $0) } }

    func contains(_ key: Key) -> Bool { entries[key.stringValue] != nil }

    private func value(_ key: Key) throws -> FieldValue {
        guard let v = entries[key.stringValue] else {
            throw DecodingError.keyNotFound(key, .init(codingPath: codingPath, debugDescription: "no value for '\(key.stringValue)'"))
        }
        return v
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        guard let v = entries[key.stringValue] else { return true }
        return v == .null
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        try PrimitiveDecoding.decode(type, try value(key), codingPath + [key])
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        try TreeDecoder(value: try value(key), codingPath: codingPath + [key]).container(keyedBy: type)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        try TreeDecoder(value: try value(key), codingPath: codingPath + [key]).unkeyedContainer()
    }

    func superDecoder() throws -> any Decoder { TreeDecoder(value: entries["super"] ?? .null, codingPath: codingPath) }
    /// A missing key gives a decoder of null, as Foundation's JSONDecoder does.
    func superDecoder(forKey key: Key) throws -> any Decoder { TreeDecoder(value: entries[key.stringValue] ?? .null, codingPath: codingPath + [key]) }
}

struct TreeUnkeyedDecoder: UnkeyedDecodingContainer {
    let items: [FieldValue]
    var codingPath: [any CodingKey]
    var currentIndex = 0
    var count: Int? { items.count }
    var isAtEnd: Bool { currentIndex >= items.count }

    init(items: [FieldValue], codingPath: [any CodingKey]) {
        self.items = items
        self.codingPath = codingPath
    }

    private mutating func next() throws -> (FieldValue, [any CodingKey]) {
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(Any.self, .init(codingPath: codingPath, debugDescription: "array ended at \(currentIndex)"))
        }
        defer { currentIndex += 1 }
        return (items[currentIndex], codingPath + [IndexKeyPathComponent(index: currentIndex)])
    }

    mutating func decodeNil() throws -> Bool {
        guard !isAtEnd, items[currentIndex] == .null else { return false }
        currentIndex += 1
        return true
    }

    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
        let (v, path) = try next()
        return try PrimitiveDecoding.decode(type, v, path)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        let (v, path) = try next()
        return try TreeDecoder(value: v, codingPath: path).container(keyedBy: type)
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        let (v, path) = try next()
        return try TreeDecoder(value: v, codingPath: path).unkeyedContainer()
    }

    mutating func superDecoder() throws -> any Decoder {
        let (v, path) = try next()
        return TreeDecoder(value: v, codingPath: path)
    }
}

struct TreeSingleDecoder: SingleValueDecodingContainer {
    let value: FieldValue
    var codingPath: [any CodingKey]
    func decodeNil() -> Bool { value == .null }
    func decode<T: Decodable>(_ type: T.Type) throws -> T { try PrimitiveDecoding.decode(type, value, codingPath) }
}

extension FieldValue {
    /// The field value of any `Encodable` Swift value (used for predicate constants).
    public init(encoding value: some Encodable) throws {
        if let v = value as? any BinaryInteger, let i = Int64(exactly: v) {
            self = .int(i)
            return
        }
        self = try TreeEncoder.encode(value)
    }
}

/// Collections whose encoded order means nothing (see ``TreeEncoder/encode(_:codingPath:)``).
protocol UnorderedCollection {
    /// `items` in an order that depends only on their values.
    static func canonicalOrder(_ items: [FieldValue]) -> [FieldValue]
}

extension Set: UnorderedCollection {
    static func canonicalOrder(_ items: [FieldValue]) -> [FieldValue] {
        items.map { (canonicalBytes($0), $0) }.sorted { $0.0.lexicographicallyPrecedes($1.0) }.map(\.1)
    }
}

extension Dictionary: UnorderedCollection {
    /// Key-value pairs, ordered by key (a dictionary with String or Int keys is a map, whose
    /// keys are sorted when stored).
    static func canonicalOrder(_ items: [FieldValue]) -> [FieldValue] {
        guard items.count % 2 == 0 else { return items }
        let pairs = stride(from: 0, to: items.count, by: 2).map { (canonicalBytes(items[$0]), items[$0], items[$0 + 1]) }
        return pairs.sorted { $0.0.lexicographicallyPrecedes($1.0) }.flatMap { [$0.1, $0.2] }
    }
}

private func canonicalBytes(_ value: FieldValue) -> [UInt8] {
    var writer = ByteWriter(capacity: 32)
    writer.value(value)
    return writer.bytes
}
