import Crypto
import Foundation

/// A large binary value (an image, say) kept outside its record, in a file of the store's
/// blob directory named by the SHA-256 of its bytes (`DIR/blobs/<hex>`).
///
/// ```swift
/// struct Garment: Record {
///     var id = RecordID()
///     var name: String
///     var wearCount = 0
///     var image: ExternalData?          // declared external: the record holds a reference
/// }
/// try store.insert(Garment(name: "Coat", image: ExternalData(jpegBytes)))
/// let coat = try store.get(Garment.self, id: id)!  // reads no image bytes
/// let bytes = try store.blob(coat.image!)          // nil while sync has not brought it yet
/// ```
///
/// Made from bytes (``init(_:)``), it computes their SHA-256 and keeps them until the record is
/// written: the write stores the file (durably, before its transaction commits) and the record
/// a small reference (`{"$blob": "<hex sha256>", "size": n}`). Read back from a store, it is
/// that reference only: ``Store/blob(_:)`` and ``Store/blobURL(_:)`` load the bytes on request.
/// Two values are equal when their hashes and sizes are, whatever bytes they hold.
///
/// Sync ships references in deltas and each blob once per peer or relay (see `StashSync`).
/// A blob goes when no record references it any more (``Store/collectGarbageBlobs(olderThan:)``).
/// Only a record's own property can be external: inside an array or a nested struct, a value
/// made from bytes cannot be stored (the encode throws).
public struct ExternalData: Codable, Sendable, Hashable, CustomStringConvertible {
    /// The SHA-256 of the bytes, as 64 lowercase hex digits: the blob's name.
    public let sha256: String
    /// The number of bytes.
    public let size: Int
    /// The bytes, in a value made from them (until written); nil in one read from a store.
    public let bytes: Data?

    /// A value holding `data`, to be stored outside the record it is written with.
    public init(_ data: Data) {
        sha256 = Self.hash(of: data)
        size = data.count
        bytes = data
    }

    /// A reference to a blob the store holds (or will hold), without bytes.
    /// - Throws: `StoreError(.invalidValue)` when `sha256` is not 64 lowercase hex digits or
    ///   `size` is negative.
    public init(sha256: String, size: Int) throws {
        guard Self.isHash(sha256), size >= 0 else {
            throw StoreError(.invalidValue, "an external value's reference needs a SHA-256 of 64 lowercase hex digits and a size of at least 0; got '\(sha256.prefix(80))' and \(size)")
        }
        self.sha256 = sha256
        self.size = size
        bytes = nil
    }

    public var description: String { "ExternalData(sha256: \(sha256), size: \(size))" }

    public static func == (a: ExternalData, b: ExternalData) -> Bool { a.sha256 == b.sha256 && a.size == b.size }
    public func hash(into hasher: inout Hasher) {
        hasher.combine(sha256)
        hasher.combine(size)
    }

    /// What a schema probe reads (``FieldProbe``).
    static let placeholder = try! ExternalData(sha256: String(repeating: "0", count: 64), size: 0)

    /// The keys of the stored reference.
    static let hashKey = "$blob", sizeKey = "size"

    private struct Key: CodingKey {
        let stringValue: String
        init(_ string: String) { stringValue = string }
        init?(stringValue: String) { self.stringValue = stringValue }
        var intValue: Int? { nil }
        init?(intValue: Int) { nil }
    }

    /// Decodes the reference `{"$blob": "<hex>", "size": n}` (from a store, or any decoder).
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Key.self)
        let hash = try c.decode(String.self, forKey: Key(Self.hashKey))
        let size = try c.decode(Int.self, forKey: Key(Self.sizeKey))
        guard Self.isHash(hash), size >= 0 else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription:
                "an external value's reference needs a SHA-256 of 64 lowercase hex digits and a size of at least 0; got '\(hash.prefix(80))' and \(size)"))
        }
        sha256 = hash
        self.size = size
        bytes = nil
    }

    /// Encodes the reference. A value holding bytes can be stored only as a record's own
    /// property (where the store writes its blob); elsewhere in a record it throws.
    public func encode(to encoder: any Encoder) throws {
        if bytes != nil, encoder is TreeEncoder {
            throw EncodingError.invalidValue(self, .init(codingPath: encoder.codingPath, debugDescription:
                "an ExternalData made from bytes can only be a record's own property (an optional one included), not inside an array, a dictionary or a nested value; store the bytes in a property of the record type"))
        }
        var c = encoder.container(keyedBy: Key.self)
        try c.encode(sha256, forKey: Key(Self.hashKey))
        try c.encode(size, forKey: Key(Self.sizeKey))
    }

    /// The reference as a record stores it.
    var fieldValue: FieldValue { .map([Self.hashKey: .string(sha256), Self.sizeKey: .int(Int64(size))]) }

    /// The reference `value` holds, or nil when it is no reference (any other value).
    public init?(reference value: FieldValue) {
        guard case .map(let members) = value, members.count == 2,
              case .string(let hash)? = members[Self.hashKey], case .int(let size)? = members[Self.sizeKey],
              Self.isHash(hash), size >= 0, size <= Int64(Int.max) else { return nil }
        sha256 = hash
        self.size = Int(size)
        bytes = nil
    }

    /// Every reference inside `value` (itself, or nested in arrays and maps), in order.
    public static func references(in value: FieldValue) -> [ExternalData] {
        var found: [ExternalData] = []
        func walk(_ value: FieldValue) {
            switch value {
            case .map(let members):
                if let reference = ExternalData(reference: value) { found.append(reference); return }
                for member in members.values { walk(member) }
            case .array(let items):
                for item in items { walk(item) }
            default: return
            }
        }
        walk(value)
        return found
    }

    /// The lowercase hex SHA-256 of `data`.
    public static func hash(of data: Data) -> String { hex(SHA256.hash(data: data)) }

    static func hex(_ digest: some Sequence<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text = [UInt8]()
        text.reserveCapacity(64)
        for byte in digest {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 15)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// Whether `text` is 64 lowercase hex digits (a blob name: never a path).
    static func isHash(_ text: String) -> Bool {
        text.utf8.count == 64 && text.utf8.allSatisfy { ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) }
    }
}
