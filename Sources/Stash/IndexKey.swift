import Foundation
import StashLMDB

/// A value that can be part of an index key, in an order-preserving binary form: comparing
/// two keys byte by byte gives the same answer as comparing the values.
///
/// Every component starts with a presence byte (0 = nil, 1 = value), so optionals sort nil
/// first and a composite key can hold optionals anywhere.
///
/// An index finds the records whose stored form equals the one looked for. For a conformance
/// of your own, two values must be `==` exactly when their encoded (stored) forms are equal:
/// a looser `==` (case-insensitive text, say) makes `fetch`, `fetchCount` and the counts miss
/// the records stored in another spelling. Normalize in `encode(to:)` instead.
public protocol IndexableValue: Sendable, Encodable {
    /// Appends this value's key component. Allocation-free for every built-in conformance.
    func appendIndexComponent(to key: inout KeyBytes)
    /// True when ``appendIndexComponent(to:)`` writes exactly the component the store writes
    /// for this value's stored (`Encodable`) form, as every conformance in Stash does: counts
    /// by key path and index handle then build the key from the value itself. A conformance of
    /// your own gets `false`, and those counts build the key from the stored form instead.
    static var indexComponentMatchesStoredForm: Bool { get }
}

extension IndexableValue {
    public static var indexComponentMatchesStoredForm: Bool { false }
}

/// The field kind a built-in ``IndexableValue`` stores as, through its own `Encodable` form.
/// A record's `encode(to:)` may store a property otherwise (a UUID as text, a date as seconds
/// since 1970): its index then holds keys of that kind, and a key built from the property's
/// type would find none of them.
protocol IndexComponentKind {
    static var indexComponentKind: FieldKind { get }
}

/// Whether a key built from a value of `valueType` (with ``IndexableValue/appendIndexComponent(to:)``)
/// is what the index of a field stored as `fieldKind` holds for that value: true when the
/// kinds agree, when the field has no kind yet (no value stored), or when the value's kind is
/// not known from its type (``FieldValue``, an app's own type, which the counts encode first).
func indexKeyMatchesStoredKind(_ valueType: Any.Type, _ fieldKind: FieldKind?) -> Bool {
    guard let fieldKind, let typed = valueType as? any IndexComponentKind.Type else { return true }
    return typed.indexComponentKind == fieldKind
}

/// True when `value` is a ``FieldValue`` array or map: their index components are their
/// stored bytes, not a canonical form, so values `==` to it (-0.0 for 0.0, another Unicode
/// spelling) may sit under other keys. A metatype comparison for other types.
@inline(__always)
func isUncanonicalIndexValue<V: IndexableValue>(_ value: V) -> Bool {
    guard V.self == FieldValue.self else { return false }
    switch value as! FieldValue {
    case .array, .map: return true
    default: return false
    }
}

/// True when `value` is a NaN (of a `Double`, `Float`, a `Date` of NaN seconds, or an
/// optional of them). NaN equals nothing, yet its index key equals the key of every stored
/// NaN: counts by key must not use it. Metatype comparisons only, so other types pay next to
/// nothing.
@inline(__always)
func isNaNIndexValue<V: IndexableValue>(_ value: V) -> Bool {
    if V.self == Double.self { return (value as! Double).isNaN }
    if V.self == Float.self { return (value as! Float).isNaN }
    if V.self == Double?.self { return (value as! Double?)?.isNaN ?? false }
    if V.self == Float?.self { return (value as! Float?)?.isNaN ?? false }
    if V.self == Date.self { return (value as! Date).timeIntervalSinceReferenceDate.isNaN }
    if V.self == Date?.self { return (value as! Date?)?.timeIntervalSinceReferenceDate.isNaN ?? false }
    if V.self == FieldValue.self {
        switch value as! FieldValue {
        case .double(let d): return d.isNaN
        case .date(let d): return d.timeIntervalSinceReferenceDate.isNaN
        default: return false
        }
    }
    return false
}

/// The primitive component encodings, shared by the typed conformances and ``FieldValue``
/// so that a typed insert and a generic (command-line) insert produce identical keys.
enum IndexComponent {
    /// Longest UTF-8 (or byte) prefix kept of a string component; longer values make a
    /// lossy key that is rechecked against the record (LMDB rule 6: keys ≤ 511 bytes).
    static let maxStringBytes = 120

    static func null(_ key: inout KeyBytes) { key.append(0) }

    static func bool(_ value: Bool, _ key: inout KeyBytes) {
        key.append(1)
        key.append(value ? 1 : 0)
    }

    static func int(_ value: Int64, _ key: inout KeyBytes) {
        key.append(1)
        key.appendBigEndian(UInt64(bitPattern: value) ^ (1 << 63))
    }

    static func double(_ value: Double, _ key: inout KeyBytes) {
        key.append(1)
        let bits = (value == 0 ? 0.0 : value).bitPattern  // -0.0 == 0.0
        key.appendBigEndian(bits & (1 << 63) != 0 ? ~bits : bits | (1 << 63))
    }

    /// Strings are the UTF-8 bytes of their canonical composition (NFC). Swift compares
    /// strings by canonical equivalence, so a precomposed "é" and "e" + U+0301 must share a
    /// key, and NFC's byte order is the order `<` gives. ASCII is its own NFC: no copy.
    static func string(_ value: String, _ key: inout KeyBytes) {
        if value.utf8.allSatisfy({ $0 < 0x80 }) {
            bytes(value.utf8, &key)
        } else {
            bytes(value.precomposedStringWithCanonicalMapping.utf8, &key)
        }
    }

    /// Bytes with 0x00 escaped as 0x00 0xFF and a 0x00 0x00 terminator, so that byte order
    /// is value order and a composite key's next component cannot blur the boundary.
    static func bytes(_ value: some Collection<UInt8>, _ key: inout KeyBytes) {
        key.append(1)
        var written = 0
        for byte in value {
            if written == maxStringBytes {
                key.markLossy()
                break
            }
            if byte == 0 {
                key.append(0)
                key.append(0xFF)
            } else {
                key.append(byte)
            }
            written += 1
        }
        // A component of exactly `maxStringBytes` bytes encodes like every longer value that
        // shares it (those are cut there): it must be rechecked against the record too.
        if written == maxStringBytes { key.markLossy() }
        key.append(0)
        key.append(0)
    }

    /// A UUID's 16 bytes in order: the same component as ``recordID(_:_:)`` of that UUID.
    static func uuid(_ value: UUID, _ key: inout KeyBytes) { recordID(RecordID(value), &key) }

    static func recordID(_ value: RecordID, _ key: inout KeyBytes) {
        key.append(1)
        key.appendBigEndian(value.high)
        key.appendBigEndian(value.low)
    }
}

extension Bool: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .bool }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.bool(self, &key) }
}
extension Int: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .int }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.int(Int64(self), &key) }
}
extension Int64: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .int }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.int(self, &key) }
}
extension Int32: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .int }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.int(Int64(self), &key) }
}
extension Int16: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .int }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.int(Int64(self), &key) }
}
extension Int8: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .int }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.int(Int64(self), &key) }
}
extension UInt32: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .int }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.int(Int64(self), &key) }
}
extension UInt16: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .int }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.int(Int64(self), &key) }
}
extension UInt8: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .int }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.int(Int64(self), &key) }
}
extension Double: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .double }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.double(self, &key) }
}
extension Float: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .double }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.double(Double(self), &key) }
}
extension String: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .string }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.string(self, &key) }
}
extension UUID: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .uuid }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.uuid(self, &key) }
}
extension RecordID: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .uuid }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.recordID(self, &key) }
}
extension Date: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .date }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.double(timeIntervalSinceReferenceDate, &key) }
}
extension Data: IndexableValue, IndexComponentKind {
    static var indexComponentKind: FieldKind { .bytes }
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) { IndexComponent.bytes(self, &key) }
}
extension Optional: IndexComponentKind where Wrapped: IndexComponentKind {
    static var indexComponentKind: FieldKind { Wrapped.indexComponentKind }
}
extension Optional: IndexableValue where Wrapped: IndexableValue {
    public static var indexComponentMatchesStoredForm: Bool { Wrapped.indexComponentMatchesStoredForm }
    public func appendIndexComponent(to key: inout KeyBytes) {
        switch self {
        case .none: IndexComponent.null(&key)
        case .some(let value): value.appendIndexComponent(to: &key)
        }
    }
}

extension FieldValue: IndexableValue {
    public static var indexComponentMatchesStoredForm: Bool { true }
    public func appendIndexComponent(to key: inout KeyBytes) {
        switch self {
        case .null: IndexComponent.null(&key)
        case .bool(let b): IndexComponent.bool(b, &key)
        case .int(let i): IndexComponent.int(i, &key)
        case .double(let d): IndexComponent.double(d, &key)
        case .string(let s): IndexComponent.string(s, &key)
        case .bytes(let d): IndexComponent.bytes(d, &key)
        case .uuid(let u): IndexComponent.uuid(u, &key)
        case .date(let d): IndexComponent.double(d.timeIntervalSinceReferenceDate, &key)
        case .array, .map:
            var writer = ByteWriter()
            writer.value(self)
            IndexComponent.bytes(writer.bytes, &key)
        }
    }
}

/// Key layouts of the `records`, `index` and `counts` databases.
enum StoreKeys {
    /// The sequence number of a `history` key (8 bytes, big-endian), or nil for another key.
    static func sequence(fromHistoryKey key: [UInt8]) -> UInt64? {
        key.count == 8 ? key.reduce(UInt64(0)) { $0 << 8 | UInt64($1) } : nil
    }

    /// `records`: type tag (2, BE) + record id (16).
    static func record(_ type: UInt16, _ id: RecordID) -> KeyBytes {
        var key = KeyBytes()
        key.appendBigEndian(type)
        key.appendBigEndian(id.high)
        key.appendBigEndian(id.low)
        return key
    }

    /// An index entry's value: the record id's 16 bytes (built in place, no allocation).
    static func indexValue(_ id: RecordID) -> KeyBytes {
        var value = KeyBytes()
        value.appendBigEndian(id.high)
        value.appendBigEndian(id.low)
        return value
    }

    static func typePrefix(_ type: UInt16) -> [UInt8] { [UInt8(type >> 8), UInt8(type & 0xFF)] }

    /// `index`: type tag (2) + index tag (2) + components.
    static func indexPrefix(_ type: UInt16, _ index: UInt16) -> KeyBytes {
        var key = KeyBytes()
        key.appendBigEndian(type)
        key.appendBigEndian(index)
        return key
    }

    /// `counts`: type tag (2).
    static func count(_ type: UInt16) -> KeyBytes {
        var key = KeyBytes()
        key.appendBigEndian(type)
        return key
    }

    static func id(fromRecordKey key: [UInt8]) -> RecordID? { RecordID(bytes: key.dropFirst(2)) }
}
