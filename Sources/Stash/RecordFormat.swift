import Foundation
import StashLMDB

/// The binary layout of a stored record (format 2):
///
/// ```
/// [0x02 format] [CRC-32C of the bytes after it: UInt32 LE] [field count: UInt16 LE] { [field tag: varint] [value] }*
/// value = [kind byte] payload
///   0 null · 1 false · 2 true · 3 int (zigzag varint) · 4 double (8 bytes LE)
///   5 string (varint length + UTF-8) · 6 bytes (varint length + bytes) · 7 uuid (16 bytes)
///   8 date (double seconds since 1970; read, no longer written) · 9 array (varint count + values)
///   10 map (varint count + {varint length + UTF-8 key, value})
///   11 date (double seconds since 2001-01-01, `Date`'s own representation, so every `Date`
///      reads back equal; seconds since 1970 drop the last bit of about half of them)
/// ```
/// Fields are keyed by small per-type tags from the stored schema, not by name, so a record
/// costs a byte or two per field name; fields can be added or dropped without rewriting
/// stored records (unknown tags are skipped, missing tags use defaults).
///
/// The checksum covers the field count and the fields (bytes 7... of the record are its
/// fields; 5 and 6 the count), and is checked by every read of the record: LMDB keeps no
/// checksum, and a damaged page would otherwise read back as other values. Format 1 was the
/// same without the checksum (`[0x01] [count] fields`); a store of format 2 or older
/// (``SchemaMerger/format``) has its records rewritten once, at its first open for writing
/// (``ChecksumUpgrade``). Records are never stored in format 1 otherwise: reads refuse it.
enum RecordFormat {
    static let version: UInt8 = 2
    /// Format byte, checksum, field count.
    static let headerSize = 7
    /// How deep arrays and maps may nest in one value. Reading recurses once per level: an
    /// unbounded depth let a few hundred KB of a delta (`09 01` repeated) overflow the stack
    /// of every device importing it. Writes of deeper values are refused.
    static let maximumNesting = 100

    /// How deep `value` nests arrays and maps (0 for a scalar), found without recursion.
    static func nesting(of value: FieldValue) -> Int {
        var deepest = 0
        var pending: [(FieldValue, Int)] = [(value, 0)]
        while let (value, depth) = pending.popLast() {
            switch value {
            case .array(let items):
                deepest = max(deepest, depth + 1)
                if deepest > maximumNesting { return deepest }
                for item in items { pending.append((item, depth + 1)) }
            case .map(let entries):
                deepest = max(deepest, depth + 1)
                if deepest > maximumNesting { return deepest }
                for item in entries.values { pending.append((item, depth + 1)) }
            default: continue
            }
        }
        return deepest
    }

    enum Kind: UInt8 {
        case null = 0, `false` = 1, `true` = 2, int = 3, double = 4, string = 5, bytes = 6, uuid = 7, date1970 = 8, array = 9, map = 10, date = 11
    }
}

/// Appends the binary encoding to a byte array.
struct ByteWriter {
    var bytes: [UInt8] = []

    init(capacity: Int = 128) { bytes.reserveCapacity(capacity) }

    @inline(__always)
    mutating func varint(_ value: UInt64) {
        // Tags, lengths and counts are nearly always one byte.
        if value < 0x80 { bytes.append(UInt8(truncatingIfNeeded: value)) } else { longVarint(value) }
    }

    private mutating func longVarint(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        bytes.append(UInt8(v))
    }

    /// 8 bytes, most significant first.
    mutating func bigEndian(_ value: UInt64) {
        withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
    }

    /// 8 bytes, least significant first.
    mutating func littleEndian(_ value: UInt64) {
        withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
    }

    /// An id's 16 bytes, as ``RecordID/bytes`` gives them (without building that array).
    mutating func recordID(_ id: RecordID) {
        bigEndian(id.high)
        bigEndian(id.low)
    }

    mutating func int(_ value: Int64) {
        bytes.append(RecordFormat.Kind.int.rawValue)
        varint(UInt64(bitPattern: (value << 1) ^ (value >> 63)))
    }

    mutating func double(_ value: Double, kind: RecordFormat.Kind = .double) {
        bytes.append(kind.rawValue)
        littleEndian(value.bitPattern)
    }

    mutating func string(_ value: String) {
        bytes.append(RecordFormat.Kind.string.rawValue)
        var s = value
        s.withUTF8 { utf8 in
            varint(UInt64(utf8.count))
            bytes.append(contentsOf: utf8)
        }
    }

    mutating func rawString(_ value: String) {
        var s = value
        s.withUTF8 { utf8 in
            varint(UInt64(utf8.count))
            bytes.append(contentsOf: utf8)
        }
    }

    mutating func data(_ value: Data) {
        bytes.append(RecordFormat.Kind.bytes.rawValue)
        varint(UInt64(value.count))
        value.withUnsafeBytes { bytes.append(contentsOf: $0) }   // one copy, not a walk over `Data`
    }

    mutating func uuid(_ value: UUID) { uuid(RecordID(value)) }

    /// A UUID's 16 bytes in UUID order (a ``RecordID``'s high half first).
    mutating func uuid(_ id: RecordID) {
        bytes.append(RecordFormat.Kind.uuid.rawValue)
        recordID(id)
    }

    mutating func bool(_ value: Bool) {
        bytes.append(value ? RecordFormat.Kind.true.rawValue : RecordFormat.Kind.false.rawValue)
    }

    mutating func null() { bytes.append(RecordFormat.Kind.null.rawValue) }

    mutating func value(_ value: FieldValue) {
        switch value {
        case .null: null()
        case .bool(let b): bool(b)
        case .int(let i): int(i)
        case .double(let d): double(d)
        case .string(let s): string(s)
        case .bytes(let d): data(d)
        case .uuid(let u): uuid(u)
        case .date(let d): double(d.timeIntervalSinceReferenceDate, kind: .date)
        case .array(let items):
            bytes.append(RecordFormat.Kind.array.rawValue)
            varint(UInt64(items.count))
            for item in items { self.value(item) }
        case .map(let entries):
            bytes.append(RecordFormat.Kind.map.rawValue)
            varint(UInt64(entries.count))
            for key in entries.keys.sorted() {
                rawString(key)
                self.value(entries[key]!)
            }
        }
    }

    /// Starts a record: format byte, then the checksum and count that
    /// ``finishRecord(fieldCount:)`` fills in.
    mutating func beginRecord() {
        bytes.append(RecordFormat.version)
        bytes.append(contentsOf: [0, 0, 0, 0, 0, 0] as [UInt8])
    }

    /// Writes the field count and the checksum of the record (once every field is written).
    mutating func finishRecord(fieldCount: Int) {
        bytes[5] = UInt8(truncatingIfNeeded: fieldCount)
        bytes[6] = UInt8(truncatingIfNeeded: fieldCount >> 8)
        let sum = Checksum.crc32c(bytes, from: 5)
        bytes[1] = UInt8(truncatingIfNeeded: sum)
        bytes[2] = UInt8(truncatingIfNeeded: sum >> 8)
        bytes[3] = UInt8(truncatingIfNeeded: sum >> 16)
        bytes[4] = UInt8(truncatingIfNeeded: sum >> 24)
    }
}

/// Thrown when stored bytes do not follow ``RecordFormat``; the store wraps it with names.
struct RecordFormatError: Error, CustomStringConvertible {
    let reason: String
    /// The bytes do not match their checksum: damaged after they were written.
    var isChecksumMismatch = false
    var description: String { reason }

    /// The error of bytes whose checksum `stored` is not `computed`.
    static func checksumMismatch(stored: UInt32, computed: UInt32) -> RecordFormatError {
        RecordFormatError(reason: "checksum mismatch (stored \(hex(stored)), bytes give \(hex(computed))): the bytes were damaged after they were written",
                          isChecksumMismatch: true)
    }

    private static func hex(_ value: UInt32) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 8 - digits.count) + digits
    }
}

extension ByteReader {
    /// Reads a 4-byte checksum (little-endian) and checks it against the CRC-32C of the bytes
    /// after it, to the end of the reader's range.
    mutating func checksum() throws {
        let stored = UInt32(try byte()) | UInt32(try byte()) << 8 | UInt32(try byte()) << 16 | UInt32(try byte()) << 24
        let computed = end == bytes.count ? Checksum.crc32c(bytes, from: offset) : Checksum.crc32c(bytes[offset..<end])
        guard stored == computed else { throw RecordFormatError.checksumMismatch(stored: stored, computed: computed) }
    }
}

/// Reads the binary encoding.
struct ByteReader {
    let bytes: [UInt8]
    var offset: Int
    let end: Int

    init(_ bytes: [UInt8], range: Range<Int>? = nil) {
        self.bytes = bytes
        offset = range?.lowerBound ?? 0
        end = range?.upperBound ?? bytes.count
    }

    var isAtEnd: Bool { offset >= end }

    mutating func byte() throws -> UInt8 {
        guard offset < end else { throw RecordFormatError(reason: "record truncated at byte \(offset)") }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func varint() throws -> UInt64 {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let b = try byte()
            result |= UInt64(b & 0x7F) << shift
            if b < 0x80 { return result }
            shift += 7
            if shift > 63 { throw RecordFormatError(reason: "varint too long at byte \(offset)") }
        }
    }

    mutating func take(_ count: Int) throws -> ArraySlice<UInt8> {
        guard count >= 0, count <= end - offset else { throw RecordFormatError(reason: "record truncated at byte \(offset)") }
        defer { offset += count }
        return bytes[offset..<(offset + count)]
    }

    /// Moves past `count` bytes (no slice made: nothing retained).
    mutating func skip(_ count: Int) throws {
        guard count >= 0, count <= end - offset else { throw RecordFormatError(reason: "record truncated at byte \(offset)") }
        offset += count
    }

    mutating func kind() throws -> RecordFormat.Kind {
        let b = try byte()
        guard let kind = RecordFormat.Kind(rawValue: b) else { throw RecordFormatError(reason: "unknown value kind \(b) at byte \(offset - 1)") }
        return kind
    }

    mutating func payloadInt() throws -> Int64 {
        let z = try varint()
        return Int64(bitPattern: (z >> 1) ^ (0 &- (z & 1)))
    }

    /// 8 little-endian bytes, read in place.
    mutating func payloadDouble() throws -> Double {
        guard end - offset >= 8 else { throw RecordFormatError(reason: "record truncated at byte \(offset)") }
        var bits: UInt64 = 0
        for i in 0..<8 { bits |= UInt64(bytes[offset + i]) << UInt64(i * 8) }
        offset += 8
        return Double(bitPattern: bits)
    }

    mutating func payloadString() throws -> String {
        let n = try varint()
        guard n <= UInt64(end - offset) else { throw RecordFormatError(reason: "string length \(n) beyond the record at byte \(offset)") }
        let raw = try take(Int(n))
        // ASCII (the common case) cannot be invalid, and `String(decoding:)` copies it without
        // the generic validation of `String(validating:)` (about 1,000 instructions a string).
        let decoded = raw.withUnsafeBufferPointer { buffer in
            buffer.allSatisfy { $0 < 0x80 } ? String(decoding: buffer, as: UTF8.self) : String(validating: buffer, as: UTF8.self)
        }
        guard let s = decoded else {
            throw RecordFormatError(reason: "invalid UTF-8 at byte \(offset)")
        }
        return s
    }

    mutating func payloadData() throws -> Data {
        let n = try varint()
        guard n <= UInt64(end - offset) else { throw RecordFormatError(reason: "byte length \(n) beyond the record at byte \(offset)") }
        // From the contiguous bytes: `Data(slice)` goes through the generic sequence initializer.
        return try take(Int(n)).withUnsafeBytes { Data($0) }
    }

    mutating func payloadUUID() throws -> UUID { try payloadRecordID().uuid }

    /// 16 big-endian bytes, read in place (no copy of the bytes).
    mutating func payloadRecordID() throws -> RecordID {
        guard offset + 16 <= end else { throw RecordFormatError(reason: "record truncated at byte \(offset)") }
        var high: UInt64 = 0, low: UInt64 = 0
        for i in 0..<8 { high = high << 8 | UInt64(bytes[offset + i]) }
        for i in 8..<16 { low = low << 8 | UInt64(bytes[offset + i]) }
        offset += 16
        return RecordID(high: high, low: low)
    }

    /// - Parameter depth: the arrays and maps around this value.
    mutating func value(depth: Int = 0) throws -> FieldValue {
        switch try kind() {
        case .null: return .null
        case .false: return .bool(false)
        case .true: return .bool(true)
        case .int: return .int(try payloadInt())
        case .double: return .double(try payloadDouble())
        case .string: return .string(try payloadString())
        case .bytes: return .bytes(try payloadData())
        case .uuid: return .uuid(try payloadUUID())
        case .date: return .date(Date(timeIntervalSinceReferenceDate: try payloadDouble()))
        case .date1970: return .date(Date(timeIntervalSince1970: try payloadDouble()))
        case .array:
            try checkNesting(depth)
            let n = try varint()
            guard n <= UInt64(end - offset) else { throw RecordFormatError(reason: "array count \(n) beyond the record") }
            var items: [FieldValue] = []
            // Bounded: every level of a crafted value could reserve its bytes over again.
            items.reserveCapacity(Int(min(n, 1024)))
            for _ in 0..<n { items.append(try value(depth: depth + 1)) }
            return .array(items)
        case .map:
            try checkNesting(depth)
            let n = try varint()
            guard n <= UInt64(end - offset) else { throw RecordFormatError(reason: "map count \(n) beyond the record") }
            var entries: [String: FieldValue] = [:]
            for _ in 0..<n {
                let key = try payloadString()
                entries[key] = try value(depth: depth + 1)
            }
            return .map(entries)
        }
    }

    /// An array or map inside `depth` others: refused past ``RecordFormat/maximumNesting``.
    private func checkNesting(_ depth: Int) throws {
        guard depth < RecordFormat.maximumNesting else {
            throw RecordFormatError(reason: "arrays and maps nested more than \(RecordFormat.maximumNesting) deep at byte \(offset)")
        }
    }

    /// Moves past one value without building it.
    mutating func skipValue(depth: Int = 0) throws {
        switch try kind() {
        case .null, .false, .true: return
        case .int: _ = try varint()
        case .double, .date, .date1970: try skip(8)
        case .string, .bytes: try skip(Int(clamping: try varint()))
        case .uuid: try skip(16)
        case .array:
            try checkNesting(depth)
            let n = try varint()
            for _ in 0..<n { try skipValue(depth: depth + 1) }
        case .map:
            try checkNesting(depth)
            let n = try varint()
            for _ in 0..<n {
                try skip(Int(clamping: try varint()))
                try skipValue(depth: depth + 1)
            }
        }
    }
}

/// A stored record's bytes with its field table parsed: tag → byte range of the value.
struct EncodedRecord {
    let bytes: [UInt8]
    private(set) var fields: [(tag: UInt16, range: Range<Int>)] = []
    /// For a record just encoded: the fields its type encoded as nil (see
    /// ``WriteContext/put(_:id:record:mode:versions:origin:absent:keepingFieldsUnknownTo:)``).
    var nilNames: [String] = []

    /// A record the encoder has just written, with the field table it wrote: nothing to parse.
    init(encoded bytes: [UInt8], fields: [(tag: UInt16, range: Range<Int>)]) {
        self.bytes = bytes
        self.fields = fields
    }

    /// Parses a stored record, checking its checksum first.
    init(_ bytes: [UInt8]) throws {
        try self.init(bytes, checkingSum: true)
    }

    /// `checkingSum: false` for bytes whose checksum was checked already (a decoder that read
    /// the header, then needs the table).
    init(_ bytes: [UInt8], checkingSum: Bool) throws {
        self.bytes = bytes
        var reader = ByteReader(bytes)
        let count = try Self.fieldCount(&reader, checkingSum: checkingSum)
        fields.reserveCapacity(count)
        var seen: UInt64 = 0   // tags below 64; others are looked for in `fields`
        for _ in 0..<count {
            let tag = try reader.varint()
            guard tag <= UInt64(UInt16.max) else { throw RecordFormatError(reason: "field tag \(tag) out of range") }
            if tag < 64 ? seen & (1 << tag) != 0 : fields.contains(where: { UInt64($0.tag) == tag }) {
                throw RecordFormatError(reason: "field tag \(tag) appears twice")
            }
            if tag < 64 { seen |= 1 << tag }
            let start = reader.offset
            try reader.skipValue()
            fields.append((UInt16(tag), start..<reader.offset))
        }
        guard reader.isAtEnd else { throw RecordFormatError(reason: "\(bytes.count - reader.offset) trailing bytes") }
    }

    /// Reads a stored record's header (format version, checksum, field count), leaving
    /// `reader` at the first field; returns the field count.
    /// - Throws: ``RecordFormatError`` for another format, or bytes that do not match their
    ///   checksum (unless `checkingSum` is false).
    static func fieldCount(_ reader: inout ByteReader, checkingSum: Bool = true) throws -> Int {
        let version = try reader.byte()
        guard version == RecordFormat.version else {
            throw RecordFormatError(reason: version == 1 ? "record format 1 (without a checksum) in a store whose records all have one"
                                                         : "unknown record format \(version)")
        }
        if checkingSum { try reader.checksum() } else { try reader.skip(4) }
        return Int(try reader.byte()) | Int(try reader.byte()) << 8
    }

    /// The bytes of a record stored in format 1 (no checksum) in format 2; nil for bytes of
    /// another format. Nothing else changes: the fields stay byte for byte.
    static func upgradingFormatOne(_ bytes: [UInt8]) -> [UInt8]? {
        guard bytes.count >= 3, bytes[0] == 1 else { return nil }
        var writer = ByteWriter(capacity: bytes.count + 4)
        writer.beginRecord()
        writer.bytes.append(contentsOf: bytes[3...])
        writer.finishRecord(fieldCount: Int(bytes[1]) | Int(bytes[2]) << 8)
        return writer.bytes
    }

    func range(of tag: UInt16) -> Range<Int>? {
        for field in fields where field.tag == tag { return field.range }
        return nil
    }

    /// The value of field `tag` in a stored record's `bytes`, found by walking its field table
    /// in place, without building the table: for reading one field of a record.
    static func value(of tag: UInt16, in bytes: [UInt8]) throws -> FieldValue? {
        var reader = ByteReader(bytes)
        for _ in 0..<(try fieldCount(&reader)) {
            if try reader.varint() == UInt64(tag) { return try reader.value() }
            try reader.skipValue()
        }
        return nil
    }

    /// ``range(of:)``, looking at position `hint` first (records written by one Codable type
    /// hold their fields in the order of its schema).
    @inline(__always)
    func range(of tag: UInt16, hint: Int) -> Range<Int>? {
        if hint < fields.count, fields[hint].tag == tag { return fields[hint].range }
        return range(of: tag)
    }

    func value(of tag: UInt16) throws -> FieldValue? {
        guard let range = range(of: tag) else { return nil }
        var reader = ByteReader(bytes, range: range)
        return try reader.value()
    }

    /// All fields as values, by tag.
    func values() throws -> [(tag: UInt16, value: FieldValue)] {
        try fields.map { field in
            var reader = ByteReader(bytes, range: field.range)
            return (field.tag, try reader.value())
        }
    }

    /// This record without the fields `tags`.
    func removing(_ tags: [UInt16]) -> EncodedRecord {
        var writer = ByteWriter(capacity: bytes.count)
        writer.beginRecord()
        var table: [(tag: UInt16, range: Range<Int>)] = []
        for field in fields where !tags.contains(field.tag) {
            writer.varint(UInt64(field.tag))
            let start = writer.bytes.count
            writer.bytes.append(contentsOf: bytes[field.range])
            table.append((field.tag, start..<writer.bytes.count))
        }
        writer.finishRecord(fieldCount: table.count)
        var record = EncodedRecord(encoded: writer.bytes, fields: table)
        record.nilNames = nilNames
        return record
    }

    /// This record with `extra` fields of `source` appended, byte for byte.
    func appending(_ extra: [(tag: UInt16, range: Range<Int>)], from source: EncodedRecord) -> EncodedRecord {
        var writer = ByteWriter(capacity: bytes.count + extra.reduce(0) { $0 + $1.range.count + 3 })
        writer.bytes.append(contentsOf: bytes)
        var table = fields
        for field in extra {
            writer.varint(UInt64(field.tag))
            let start = writer.bytes.count
            writer.bytes.append(contentsOf: source.bytes[field.range])
            table.append((field.tag, start..<writer.bytes.count))
        }
        writer.finishRecord(fieldCount: table.count)
        var record = EncodedRecord(encoded: writer.bytes, fields: table)
        record.nilNames = nilNames
        return record
    }

    /// True when this record holds `other`'s field at `range` (tagged `tag`) with the same
    /// bytes: cheap change detection, one lookup and one `memcmp`.
    func holdsSameValue(of tag: UInt16, at range: Range<Int>, in other: EncodedRecord) -> Bool {
        guard let mine = self.range(of: tag) else { return false }
        return bytes[mine].hasSameBytes(as: other.bytes[range])
    }
}

/// The stored value encoding (kind byte + payload), for formats built on it such as deltas.
public enum RecordValueCoding {
    /// The bytes of one value.
    public static func encode(_ value: FieldValue) -> [UInt8] {
        var writer = ByteWriter(capacity: 16)
        writer.value(value)
        return writer.bytes
    }

    /// Appends the bytes of one value to `bytes` (no intermediate array).
    public static func append(_ value: FieldValue, to bytes: inout [UInt8]) {
        var writer = ByteWriter(capacity: 0)
        swap(&writer.bytes, &bytes)
        writer.value(value)
        swap(&writer.bytes, &bytes)
    }

    /// Reads one value starting at `offset`, not past `end`.
    /// - Returns: the value and the number of bytes it took.
    /// - Throws: when the bytes are not a valid value.
    public static func decode(_ bytes: [UInt8], at offset: Int, end: Int) throws -> (FieldValue, Int) {
        var reader = ByteReader(bytes, range: offset..<end)
        let value = try reader.value()
        return (value, reader.offset - offset)
    }
}
