import Foundation

/// Gives the tag of a field while encoding, adding the field to the schema when it is new
/// (and checking that its kind did not change).
protocol FieldTagResolver: AnyObject {
    /// `hint` is where the field after the previous one would be (see
    /// ``TypeLayout/slot(of:hint:)``); the result's `slot` is where this one was.
    func tag(for name: String, kind: FieldKind?, hint: Int) throws -> (tag: UInt16, slot: Int)
    /// True when the type being encoded has a stored default for field `name` (a nil value
    /// must then be written as an explicit null, or it would read back as the default).
    func hasDefault(_ name: String) -> Bool
    /// Keeps the bytes of `value` (made from bytes) as its blob, durably, before the record
    /// that references it is written (see ``ExternalData``), and marks field `name` external.
    func storeBlob(_ value: ExternalData, field name: String) throws
}

extension FieldTagResolver {
    func hasDefault(_ name: String) -> Bool { false }
    func storeBlob(_ value: ExternalData, field name: String) throws {
        throw StoreError(.invalidValue, "field '\(name)': an ExternalData made from bytes can only be written into a store")
    }
}

/// Encodes a record's top-level fields straight into the stored layout (``RecordFormat``);
/// nested values go through ``TreeEncoder``. The `id` property is not stored in the value:
/// it is the record's key.
final class RecordEncoder: Encoder {
    var codingPath: [any CodingKey] = []
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    // One encoder serves one encode on one thread: the runtime's exclusivity checks on these
    // hot properties (several per field) are left out.
    @exclusivity(unchecked) var writer: ByteWriter
    @exclusivity(unchecked) var fieldCount = 0
    /// The schema slot after the previous field (a hint for the resolver).
    @exclusivity(unchecked) var cursor = 0
    /// Each field's tag and the range of its value in `writer`, as written.
    @exclusivity(unchecked) var fields: [(tag: UInt16, range: Range<Int>)] = []
    /// Bit `s` for each schema slot `s` < 64 written (see ``field(_:_:_:)``).
    @exclusivity(unchecked) private var written: UInt64 = 0
    /// Nested containers and super encoders, filled after the call that made them returns: each
    /// with the number of fields written before it, where ``finish()`` puts it.
    @exclusivity(unchecked) var pending: [(name: String, node: EncodingNode, position: Int)] = []
    /// The fields encoded as nil (written as nothing, or as an explicit null when the field
    /// has a default): with the fields written, what the encoded type knows.
    @exclusivity(unchecked) var nilNames: [String] = []
    let resolver: any FieldTagResolver
    var failure: (any Error)?

    /// `capacity`: the bytes to reserve (the caller's guess of the record's size: one
    /// allocation for the record, not one per doubling).
    init(resolver: any FieldTagResolver, capacity: Int = 256) {
        self.resolver = resolver
        writer = ByteWriter(capacity: capacity)
        fields.reserveCapacity(16)   // one allocation for most records, not one per doubling
        writer.beginRecord()
    }

    static func encode(_ record: some Encodable, resolver: any FieldTagResolver, capacity: Int = 256) throws -> EncodedRecord {
        let encoder = RecordEncoder(resolver: resolver, capacity: capacity)
        try record.encode(to: encoder)
        return try encoder.finish()
    }

    /// Encodes a generic record's fields (no Codable involved).
    static func encode(fields: [String: FieldValue], resolver: any FieldTagResolver) throws -> EncodedRecord {
        let encoder = RecordEncoder(resolver: resolver)
        for name in fields.keys.sorted() where name != "id" {
            let value = fields[name]!
            if value == .null {
                try encoder.fieldNil(name)
                continue
            }
            try RecordEncoder.checkNesting(value, field: name)
            try encoder.field(name, value.kind) { $0.value(value) }
        }
        return try encoder.finish()
    }

    /// Encodes fields whose tags are known, in the given order (no Codable, no resolver),
    /// into a buffer of `capacity` bytes to start with.
    static func encode(tagged fields: some Collection<(tag: UInt16, value: FieldValue)>, capacity: Int = 256) -> EncodedRecord {
        var writer = ByteWriter(capacity: capacity)
        var table: [(tag: UInt16, range: Range<Int>)] = []
        table.reserveCapacity(fields.count)
        writer.beginRecord()
        for field in fields {
            writer.varint(UInt64(field.tag))
            let start = writer.bytes.count
            writer.value(field.value)
            table.append((field.tag, start..<writer.bytes.count))
        }
        writer.finishRecord(fieldCount: fields.count)
        return EncodedRecord(encoded: writer.bytes, fields: table)
    }

    /// Refuses a value that nests arrays and maps deeper than records can be read back
    /// (``RecordFormat/maximumNesting``).
    static func checkNesting(_ value: FieldValue, field: String) throws {
        switch value {
        case .array, .map:
            let depth = RecordFormat.nesting(of: value)
            if depth > RecordFormat.maximumNesting {
                throw EncodingError.invalidValue(value, .init(codingPath: [], debugDescription: "field \(field) nests arrays and maps \(depth) or more deep; at most \(RecordFormat.maximumNesting) can be stored"))
            }
        default: return
        }
    }

    /// The record written, with its field table (so that nobody parses it again).
    func finish() throws -> EncodedRecord {
        if let failure { throw failure }
        if !pending.isEmpty {
            let before = fields.count
            for (name, node, _) in pending {
                let value = node.resolved
                try Self.checkNesting(value, field: name)
                try field(name, value.kind) { $0.value(value) }
            }
            putPendingInPlace(writtenBefore: before)
            pending.removeAll()
        }
        writer.finishRecord(fieldCount: fieldCount)
        var record = EncodedRecord(encoded: writer.bytes, fields: fields)
        record.nilNames = nilNames
        return record
    }

    /// Moves the fields of ``pending``, just written after the `writtenBefore` others, to where
    /// the type asked for them, so that the record holds its fields in the order the type
    /// encoded them (the order its `init(from:)` usually reads them, which a typed read follows
    /// without the field table).
    private func putPendingInPlace(writtenBefore count: Int) {
        let old = writer.bytes
        var moved = ByteWriter(capacity: old.count)
        moved.beginRecord()
        var table: [(tag: UInt16, range: Range<Int>)] = []
        table.reserveCapacity(fields.count)
        func copy(_ field: (tag: UInt16, range: Range<Int>)) {
            moved.varint(UInt64(field.tag))
            let start = moved.bytes.count
            moved.bytes.append(contentsOf: old[field.range])
            table.append((field.tag, start..<moved.bytes.count))
        }
        var next = 0   // the next of `pending`, whose fields are `fields[count...]` in order
        for position in 0...count {
            while next < pending.count, pending[next].position == position {
                copy(fields[count + next])
                next += 1
            }
            if position < count { copy(fields[position]) }
        }
        writer = moved
        fields = table
    }

    /// A field encoded as nil: noted in ``nilNames`` and, when the field has a stored default
    /// (left out, it would read as the default) or `storingNull`, written as an explicit null
    /// where it comes, not after the other fields: a typed read then meets it in the order the
    /// type asks for it, instead of taking the optional for absent and decoding again.
    func fieldNil(_ name: String, storingNull: Bool = false) throws {
        nilNames.append(name)
        if storingNull || resolver.hasDefault(name) { try field(name, nil) { $0.null() } }
    }

    @inline(__always)
    func field(_ name: String, _ kind: FieldKind?, _ write: (inout ByteWriter) -> Void) throws {
        let (tag, slot) = try resolver.tag(for: name, kind: kind, hint: cursor)
        cursor = slot + 1
        // A record holds each field once (a stored record with a tag twice is damaged).
        if slot < 64 ? written & (1 << slot) != 0 : fields.contains(where: { $0.tag == tag }) {
            throw EncodingError.invalidValue(name, .init(codingPath: [], debugDescription:
                "field '\(name)' is encoded twice; a record holds one value per key (encode it once)"))
        }
        if slot < 64 { written |= 1 << slot }
        writer.varint(UInt64(tag))
        let start = writer.bytes.count
        write(&writer)
        fields.append((tag, start..<writer.bytes.count))
        fieldCount += 1
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        KeyedEncodingContainer(RecordKeyedEncoder<Key>(encoder: self))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        failure = StoreError(.invalidValue, "a record must encode as a keyed container (a struct with fields), not an array")
        return TreeUnkeyedEncoder(node: ArrayNode(), codingPath: [])
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        failure = StoreError(.invalidValue, "a record must encode as a keyed container (a struct with fields), not a single value")
        return TreeSingleEncoder(encoder: TreeEncoder())
    }
}

struct RecordKeyedEncoder<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let encoder: RecordEncoder
    var codingPath: [any CodingKey] { [] }

    mutating func encodeNil(forKey key: Key) throws { try encoder.fieldNil(key.stringValue) }
    mutating func encode(_ value: Bool, forKey key: Key) throws {
        try encoder.field(key.stringValue, .bool) { $0.bool(value) }
    }
    mutating func encode(_ value: String, forKey key: Key) throws {
        try encoder.field(key.stringValue, .string) { $0.string(value) }
    }
    mutating func encode(_ value: Double, forKey key: Key) throws {
        try encoder.field(key.stringValue, .double) { $0.double(value) }
    }
    mutating func encode(_ value: Float, forKey key: Key) throws {
        try encoder.field(key.stringValue, .double) { $0.double(Double(value)) }
    }
    mutating func encode(_ value: Int, forKey key: Key) throws {
        try encoder.field(key.stringValue, .int) { $0.int(Int64(value)) }
    }
    mutating func encode(_ value: Int64, forKey key: Key) throws {
        try encoder.field(key.stringValue, .int) { $0.int(value) }
    }
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        // The built-in field types are told apart by comparing metatypes: a failed `as?` cast
        // costs hundreds of instructions, and a record has several such fields.
        if T.self == RecordID.self, let v = value as? RecordID {
            if key.stringValue == "id" { return }
            try encoder.field(key.stringValue, .uuid) { $0.uuid(v) }
        } else if T.self == Date.self, let v = value as? Date {
            try encoder.field(key.stringValue, .date) { $0.double(v.timeIntervalSinceReferenceDate, kind: .date) }
        } else if T.self == Data.self, let v = value as? Data {
            try encoder.field(key.stringValue, .bytes) { $0.data(v) }
        } else if T.self == UUID.self, let v = value as? UUID {
            try encoder.field(key.stringValue, .uuid) { $0.uuid(RecordID(v)) }
        } else if T.self == ExternalData.self || T.self == ExternalData?.self, let v = value as? ExternalData? {
            // The blob is kept before the record that references it is written.
            guard let v else { return try encoder.fieldNil(key.stringValue) }
            try encoder.field(key.stringValue, .map) { $0.value(v.fieldValue) }
            if v.bytes != nil { try encoder.resolver.storeBlob(v, field: key.stringValue) }
        } else {
            let fieldValue: FieldValue
            do { fieldValue = try FieldValue(encoding: value) } catch {
                // Name the field: the nested encoder knows only the path below it.
                throw EncodingError.invalidValue(value, .init(codingPath: [key], debugDescription: describe(error)))
            }
            if fieldValue == .null {
                // A value that is not an optional yet encodes as nil (a `FieldValue.null`, a
                // wrapper writing `encodeNil()`) is stored as null: left out, it would read as
                // a missing field, which such a type cannot take.
                try encoder.fieldNil(key.stringValue, storingNull: !(T.self is any ExpressibleByNilLiteral.Type))
                return
            }
            try RecordEncoder.checkNesting(fieldValue, field: key.stringValue)
            try encoder.field(key.stringValue, fieldValue.kind) { $0.value(fieldValue) }
        }
    }
    mutating func encodeIfPresent<T: Encodable>(_ value: T?, forKey key: Key) throws {
        guard let value else {
            try encoder.fieldNil(key.stringValue)
            return
        }
        try encode(value, forKey: key)
    }
    // The protocol's own overloads for these types skip a nil without telling the encoder,
    // which must know it (a nil field with a default is written as null).
    mutating func encodeIfPresent(_ value: Bool?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: String?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: Double?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: Float?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: Int?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: Int8?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: Int16?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: Int32?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: Int64?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: UInt?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: UInt8?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: UInt16?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: UInt32?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }
    mutating func encodeIfPresent(_ value: UInt64?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encoder.fieldNil(key.stringValue) }
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        let node = MapNode()
        encoder.pending.append((key.stringValue, .map(node), encoder.fields.count))
        return KeyedEncodingContainer(TreeKeyedEncoder<NestedKey>(node: node, codingPath: [key]))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        let node = ArrayNode()
        encoder.pending.append((key.stringValue, .array(node), encoder.fields.count))
        return TreeUnkeyedEncoder(node: node, codingPath: [key])
    }

    mutating func superEncoder() -> any Encoder { superEncoder(named: SuperKey()) }
    mutating func superEncoder(forKey key: Key) -> any Encoder { superEncoder(named: key) }
    private func superEncoder(named key: any CodingKey) -> any Encoder {
        let tree = TreeEncoder(codingPath: [key])
        encoder.pending.append((key.stringValue, .encoder(tree), encoder.fields.count))
        return tree
    }
}

/// The decoding view of one stored type: tags by name and defaults for missing fields.
final class TypeLayout: Sendable {
    let schema: TypeSchema
    let tagsByName: [String: UInt16]
    let defaults: [String: FieldValue]
    /// The fields in schema order (the order they were learned: for a Codable type, the order
    /// its `encode(to:)` and `init(from:)` visit them), for ``slot(of:hint:)``.
    let names: [String]
    let tags: [UInt16]
    let kinds: [FieldKind?]
    /// Per field: it holds values of any kind (``FieldSchema/anyKind``).
    let anyKinds: [Bool]
    private let slotsByName: [String: Int]
    /// The `Counter` fields (merged as PN-counters).
    let counterNames: Set<String>
    /// The positions in ``names`` of the fields every record must hold (not optional, no
    /// default).
    let requiredSlots: [Int]
    /// For each of `schema.indexes`, the tag of each of its fields (nil: not in the schema).
    private let indexFieldTags: [[UInt16?]]

    init(_ schema: TypeSchema) {
        self.schema = schema
        var defaults: [String: FieldValue] = [:]
        for field in schema.fields { if let value = field.defaultValue { defaults[field.name] = value } }
        self.defaults = defaults
        tagsByName = Dictionary(schema.fields.map { ($0.name, $0.tag) }, uniquingKeysWith: { a, _ in a })
        names = schema.fields.map(\.name)
        tags = schema.fields.map(\.tag)
        kinds = schema.fields.map(\.kind)
        anyKinds = schema.fields.map { $0.anyKind == true }
        slotsByName = Dictionary(schema.fields.indices.map { (schema.fields[$0].name, $0) }, uniquingKeysWith: { a, _ in a })
        counterNames = Set(schema.fields.filter { $0.counter == true }.map(\.name))
        requiredSlots = schema.fields.indices.filter { !schema.fields[$0].optional && schema.fields[$0].defaultValue == nil }
        let tagsByName = self.tagsByName
        indexFieldTags = schema.indexes.map { index in index.fields.map { tagsByName[$0] } }
    }

    /// The tags of the fields of the index tagged `indexTag`, in its order (nil for a field the
    /// schema lacks), found without hashing a name; nil when this type has no such index.
    /// O(indexes).
    func fieldTags(ofIndex indexTag: UInt16) -> [UInt16?]? {
        for (position, candidate) in schema.indexes.enumerated() where candidate.tag == indexTag {
            return indexFieldTags[position]
        }
        return nil
    }

    /// The position of the field tagged `tag` in ``tags``, or nil for a tag the schema lacks.
    /// O(fields).
    func slot(ofTag tag: UInt64) -> Int? {
        for (slot, candidate) in tags.enumerated() where UInt64(candidate) == tag { return slot }
        return nil
    }

    /// The position of field `name` in ``names``, or nil for a field the schema lacks.
    ///
    /// Coders visit a type's fields in the same order every time, so a caller passes the
    /// position after the previous field as `hint`; when it matches (almost always), no
    /// string is hashed, only compared. Otherwise a type of few fields is searched by length
    /// first (held in the string itself: names of other lengths cost no comparison), and a
    /// larger one through its dictionary: a merge visits a record state's fields in its
    /// dictionary's order, which is another one for every state. O(1).
    ///
    /// Names match as `String`'s `==` has them (canonical equivalence), as the schema's
    /// ``TypeSchema/field(named:)`` does: a name in another Unicode form (decomposed where the
    /// schema's is precomposed, from another source's delta) has another length, so a miss of
    /// the search by length asks the dictionary (a miss is rare: a field new to the schema).
    @inline(__always)
    /// Whether the field at `slot` stores `value` as it is: a null, a value of the field's
    /// kind, any value in a field of any kind or of no kind known yet. A value of another kind
    /// (another replica stores the field in another kind) is carried beside the record instead.
    func holds(_ value: FieldValue, at slot: Int) -> Bool {
        guard let kind = value.kind, !anyKinds[slot], let stored = kinds[slot] else { return true }
        return kind == stored
    }

    func slot(of name: String, hint: Int) -> Int? {
        if hint < names.count, names[hint] == name { return hint }
        guard names.count <= 16 else { return slotsByName[name] }
        let length = name.utf8.count
        for slot in names.indices where names[slot].utf8.count == length && names[slot] == name { return slot }
        return slotsByName[name]
    }
}

/// Decodes a typed record from its stored bytes: top-level primitives straight from the bytes,
/// nested values through ``TreeDecoder``, `id` from the key.
///
/// A Codable type reads its fields in the order it wrote them, so the decoder reads the stored
/// fields one after the other where they lie, each value once, without a field table. An
/// optional field asked for (`contains`) where the next stored field comes later in the type's
/// layout is taken as absent (a nil the type did not write); ``finish()`` checks every such
/// guess, and ``RecordReader`` decodes again from the table should one be wrong. Any other field
/// asked for out of that order (an `init(from:)` visiting fields in another order than its
/// `encode(to:)`, a record written under another schema, a value left unread after
/// `decodeNil`) makes the decoder parse the whole table (``EncodedRecord``) and find fields
/// there from then on. ``finish()`` makes sure the record is sound either way.
final class RecordDecoder: Decoder {
    let bytes: [UInt8]
    let id: RecordID
    let layout: TypeLayout
    // A class, not a struct: as a `Decoder` existential the struct was boxed on the heap anyway.
    // One decoder serves one decode on one thread: no runtime exclusivity checks.
    /// The slot after the last field looked up (see ``TypeLayout/slot(of:hint:)``).
    @exclusivity(unchecked) var cursor = 0
    /// The number of fields the record's header gives.
    private let fieldCount: Int
    /// Reading in order: where the next field not yet read starts, and how many are left.
    @exclusivity(unchecked) private var next: Int
    @exclusivity(unchecked) private var unread: Int
    /// The field table, once a field was asked for out of order.
    @exclusivity(unchecked) private var table: EncodedRecord?
    /// Reading in order, bit `s` (for the slots `s` < 64 of ``layout``) is set when the field
    /// at slot `s` was found next in the record: it is stored.
    @exclusivity(unchecked) private var found: UInt64 = 0
    /// Bit `s` is set when the field at slot `s` was taken as absent without the table (see
    /// ``holds(slot:)``); ``finish()`` checks these.
    @exclusivity(unchecked) private(set) var guessedAbsent: UInt64 = 0

    /// Reads the record's header; throws ``RecordFormatError`` for an unknown format.
    /// `inOrder: false` parses the field table at once (no field is then taken as absent).
    init(bytes: [UInt8], id: RecordID, layout: TypeLayout, inOrder: Bool = true) throws {
        self.bytes = bytes
        self.id = id
        self.layout = layout
        var reader = ByteReader(bytes)
        fieldCount = try EncodedRecord.fieldCount(&reader)
        unread = fieldCount
        next = reader.offset
        if !inOrder { table = try EncodedRecord(bytes, checkingSum: false) }
    }

    /// The tag of the next field in order (`unread` > 0).
    @inline(__always)
    private func nextTag() throws -> UInt64 {
        // A tag below 128 is one byte; others are read as the varint they are.
        if next < bytes.count, bytes[next] < 0x80 { return UInt64(bytes[next]) }
        var reader = ByteReader(bytes, range: next..<bytes.count)
        return try reader.varint()
    }

    /// Whether the record holds the field at `slot` (for `contains`, which the standard
    /// library asks before decoding an optional). Reading in order, a field found already is
    /// held (a type asking for a field again); one that is not next is taken as absent when the
    /// next one comes later in the type's layout, or when every field was read and this one was
    /// not among them, without parsing the table.
    func holds(slot: Int) throws -> Bool {
        if table == nil, slot < 64 {
            if found & (1 << slot) != 0 { return true }
            if unread == 0 { return false }
            let next = try nextTag()
            if next == UInt64(layout.tags[slot]) {
                found |= 1 << slot
                return true
            }
            if let nextSlot = layout.slot(ofTag: next), nextSlot > slot {
                guessedAbsent |= 1 << slot
                return false
            }
        }
        return try value(atSlot: slot) != nil
    }

    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    /// Where the value of the field at `slot` of ``layout`` lies, from its first byte; nil when
    /// the record lacks the field. For the next field in order the range runs to the end of the
    /// record (its value's end is known once it is read): pass the offset after the value to
    /// ``didRead(through:)``.
    @inline(__always)
    func value(atSlot slot: Int) throws -> Range<Int>? {
        let tag = layout.tags[slot]
        if table == nil {
            // In order for the first 64 slots (``found`` has a bit for each).
            if unread > 0, slot < 64 {
                // A tag below 128 is one byte; others are read as the varint they are.
                if tag < 0x80 {
                    if next < bytes.count, bytes[next] == UInt8(tag) {
                        found |= 1 << slot
                        return (next + 1)..<bytes.count
                    }
                } else {
                    var reader = ByteReader(bytes, range: next..<bytes.count)
                    if try reader.varint() == UInt64(tag) {
                        found |= 1 << slot
                        return reader.offset..<bytes.count
                    }
                }
            }
            table = try EncodedRecord(bytes, checkingSum: false)
        }
        return table!.range(of: tag, hint: slot)
    }

    /// The value from ``value(atSlot:)`` was read whole, up to `end`: reading in order, the
    /// field after it is next.
    @inline(__always)
    func didRead(through end: Int) {
        guard table == nil else { return }
        next = end
        unread -= 1
    }

    /// The record's field table, parsed now if the fields were read in order so far.
    func fieldTable() throws -> EncodedRecord {
        if let table { return table }
        let parsed = try EncodedRecord(bytes, checkingSum: false)
        table = parsed
        return parsed
    }

    /// After the type has decoded: throws ``RecordFormatError`` when the record's bytes do not
    /// hold what their header says (the check a parse of the field table makes, a tag stored
    /// twice included), and returns false when a field taken as absent is stored after all (the
    /// record must then be decoded again with `inOrder: false`). Nothing is left to check when
    /// every field was read in order, each under a tag of its own, and the last one ends the
    /// record: each field stored was then found.
    func finish() throws -> Bool {
        if table == nil, unread == 0, next == bytes.count, found.nonzeroBitCount == fieldCount {
            return guessedAbsent & found == 0
        }
        let table = try fieldTable()
        guard guessedAbsent != 0 else { return true }
        for slot in 0..<min(64, layout.tags.count) where guessedAbsent & (1 << slot) != 0 {
            if table.range(of: layout.tags[slot]) != nil { return false }
        }
        return true
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        KeyedDecodingContainer(RecordKeyedDecoder<Key>(decoder: self))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw DecodingError.typeMismatch([Any].self, .init(codingPath: [], debugDescription: "a stored record is a keyed container"))
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        throw DecodingError.typeMismatch(Any.self, .init(codingPath: [], debugDescription: "a stored record is a keyed container"))
    }
}

struct RecordKeyedDecoder<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let decoder: RecordDecoder
    var codingPath: [any CodingKey] { [] }

    /// The record's fields this type knows, and `id`. Empty for a record whose field table
    /// cannot be parsed (the decode then fails in ``RecordDecoder/finish()``).
    var allKeys: [Key] {
        var keys = ((try? decoder.fieldTable())?.fields ?? []).compactMap { field in
            decoder.layout.schema.field(tagged: field.tag).flatMap { Key(stringValue: $0.name) }
        }
        if let id = Key(stringValue: "id") { keys.append(id) }
        return keys
    }

    /// Where field `key`'s value lies (see ``RecordDecoder/value(atSlot:)``), or nil when the
    /// record lacks it.
    @inline(__always)
    private func range(_ key: any CodingKey) throws -> Range<Int>? {
        guard let slot = decoder.layout.slot(of: key.stringValue, hint: decoder.cursor) else { return nil }
        decoder.cursor = slot + 1
        return try decoder.value(atSlot: slot)
    }

    /// A reader of field `key`'s value, or nil when the record lacks it.
    @inline(__always)
    private func reader(_ key: any CodingKey) throws -> ByteReader? {
        guard let range = try range(key) else { return nil }
        return ByteReader(decoder.bytes, range: range)
    }

    /// A record that cannot be read answers false here and fails in ``RecordDecoder/finish()``.
    func contains(_ key: Key) -> Bool {
        if key.stringValue == "id" { return true }
        if let slot = decoder.layout.slot(of: key.stringValue, hint: decoder.cursor) {
            decoder.cursor = slot + 1
            if (try? decoder.holds(slot: slot)) == true { return true }
        }
        return decoder.layout.defaults[key.stringValue] != nil
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        if key.stringValue == "id" { return false }
        if var reader = try reader(key) {
            guard try reader.byte() == RecordFormat.Kind.null.rawValue else { return false }
            decoder.didRead(through: reader.offset)   // a null is all read: the caller decodes nothing more of it
            return true
        }
        return (decoder.layout.defaults[key.stringValue] ?? .null) == .null
    }

    private func missing(_ key: any CodingKey) -> DecodingError {
        let type = decoder.layout.schema.name
        return .keyNotFound(key, .init(codingPath: [key], debugDescription:
            "stored \(type) record \(decoder.id) has no field '\(key.stringValue)'; make it optional or add \(type).fieldDefaults[\"\(key.stringValue)\"]"))
    }

    func decode(_ type: String.Type, forKey key: Key) throws -> String {
        guard let range = try range(key) else { return try decode(type, fromDefaultOf: key) }
        var reader = ByteReader(decoder.bytes, range: range)
        guard try reader.kind() == .string else { return try decodeValue(type, range, key) }
        let string = try reader.payloadString()
        decoder.didRead(through: reader.offset)
        return string
    }

    func decode(_ type: Int.Type, forKey key: Key) throws -> Int {
        guard let range = try range(key) else { return try decode(type, fromDefaultOf: key) }
        var reader = ByteReader(decoder.bytes, range: range)
        guard try reader.kind() == .int else { return try decodeValue(type, range, key) }
        let int = try reader.payloadInt()
        decoder.didRead(through: reader.offset)
        return Int(int)
    }

    func decode(_ type: Double.Type, forKey key: Key) throws -> Double {
        guard let range = try range(key) else { return try decode(type, fromDefaultOf: key) }
        var reader = ByteReader(decoder.bytes, range: range)
        guard try reader.kind() == .double else { return try decodeValue(type, range, key) }
        let double = try reader.payloadDouble()
        decoder.didRead(through: reader.offset)
        return double
    }

    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool {
        guard let range = try range(key) else { return try decode(type, fromDefaultOf: key) }
        var reader = ByteReader(decoder.bytes, range: range)
        let bool: Bool
        switch try reader.byte() {
        case RecordFormat.Kind.true.rawValue: bool = true
        case RecordFormat.Kind.false.rawValue: bool = false
        default: return try decodeValue(type, range, key)
        }
        decoder.didRead(through: reader.offset)
        return bool
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        if key.stringValue == "id" {
            if T.self == RecordID.self { return decoder.id as! T }
            if T.self == UUID.self { return decoder.id.uuid as! T }
        }
        guard let range = try range(key) else { return try decode(type, fromDefaultOf: key) }
        if T.self == Date.self || T.self == Data.self {
            var reader = ByteReader(decoder.bytes, range: range)
            let kind = try reader.kind()
            if T.self == Date.self, kind == .date || kind == .date1970 {
                let seconds = try reader.payloadDouble()
                decoder.didRead(through: reader.offset)
                let date = kind == .date ? Date(timeIntervalSinceReferenceDate: seconds) : Date(timeIntervalSince1970: seconds)
                return date as! T
            }
            if T.self == Data.self, kind == .bytes {
                let data = try reader.payloadData()
                decoder.didRead(through: reader.offset)
                return data as! T
            }
        }
        if T.self == UUID.self || T.self == RecordID.self {
            var reader = ByteReader(decoder.bytes, range: range)
            if try reader.kind() == .uuid {
                let id = try reader.payloadRecordID()
                decoder.didRead(through: reader.offset)
                return (T.self == UUID.self ? id.uuid as! T : id as! T)
            }
        }
        return try decodeValue(type, range, key)
    }

    /// Reads the value at the start of `range` whole and decodes `type` from it.
    private func decodeValue<T: Decodable>(_ type: T.Type, _ range: Range<Int>, _ key: Key) throws -> T {
        var reader = ByteReader(decoder.bytes, range: range)
        let value = try reader.value()
        decoder.didRead(through: reader.offset)
        return try PrimitiveDecoding.decode(type, value, [key])
    }

    /// The field's default for a record that lacks the field; nil for an optional asked for
    /// with `decode(T?.self, forKey:)` (as hand-written `init(from:)` may do: a nil it encoded
    /// with `encode(_:forKey:)` is not stored).
    private func decode<T: Decodable>(_ type: T.Type, fromDefaultOf key: Key) throws -> T {
        guard let value = decoder.layout.defaults[key.stringValue] else {
            if let optional = T.self as? any ExpressibleByNilLiteral.Type, let none = optional.init(nilLiteral: ()) as? T { return none }
            // A type that reads a null (a wrapper of an optional, `FieldValue`) takes it: records
            // written before such nils were stored as null lack the field.
            if let fromNull = try? PrimitiveDecoding.decode(type, .null, [key]) { return fromNull }
            throw missing(key)
        }
        return try PrimitiveDecoding.decode(type, value, [key])
    }

    private func fieldValue(_ key: any CodingKey) throws -> FieldValue {
        guard let value = try storedValue(key) else { throw missing(key) }
        return value
    }

    /// Field `key`'s stored value, else its default, else nil.
    private func storedValue(_ key: any CodingKey) throws -> FieldValue? {
        if var reader = try reader(key) {
            let value = try reader.value()
            decoder.didRead(through: reader.offset)
            return value
        }
        return decoder.layout.defaults[key.stringValue]
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        try TreeDecoder(value: try fieldValue(key), codingPath: [key]).container(keyedBy: type)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        try TreeDecoder(value: try fieldValue(key), codingPath: [key]).unkeyedContainer()
    }

    // A missing key gives a decoder of null, as Foundation's JSONDecoder does: `T?(from:)`
    // then reads nil for a record stored before the type encoded that key.
    func superDecoder() throws -> any Decoder { TreeDecoder(value: try storedValue(SuperKey()) ?? .null, codingPath: [SuperKey()]) }
    func superDecoder(forKey key: Key) throws -> any Decoder { TreeDecoder(value: try storedValue(key) ?? .null, codingPath: [key]) }
}
