import Foundation
import Stash
import StashLMDB
import Testing
import StashTestSupport

/// A record whose `encode(to:)` writes its fields in reverse order, while its `init(from:)`
/// reads them in declaration order: every field is asked for out of stored order.
private struct Reversed: Record, Equatable {
    var id = RecordID()
    var a: String
    var b: Int
    var c: Double
    var d: Bool
    enum CodingKeys: String, CodingKey { case id, a, b, c, d }
    init(id: RecordID = RecordID(), a: String, b: Int, c: Double, d: Bool) {
        self.id = id; self.a = a; self.b = b; self.c = c; self.d = d
    }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        a = try c.decode(String.self, forKey: .a)
        b = try c.decode(Int.self, forKey: .b)
        self.c = try c.decode(Double.self, forKey: .c)
        d = try c.decode(Bool.self, forKey: .d)
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(d, forKey: .d)
        try c.encode(self.c, forKey: .c)
        try c.encode(b, forKey: .b)
        try c.encode(a, forKey: .a)
        try c.encode(id, forKey: .id)
    }
}

private struct Size: Codable, Equatable, Sendable {
    var width: Int
    var height: Int
}

/// Fields of every path through the decoder, in the order Codable writes and reads them:
/// optionals that are nil or not, a nested struct, an array, a date, bytes, a UUID.
private struct Mixed: Record, Equatable {
    var id = RecordID()
    var title: String
    var subtitle: String?
    var size: Size
    var tags: [String]
    var rank: Int?
    var at: Date
    var blob: Data
    var owner: UUID
    var ratio: Double?
    var done: Bool
}

/// `Reversed` read by a type that checks `contains` and `decodeNil` before reading, reads its
/// fields out of stored order, one of them twice, and lists `allKeys`; what it saw is kept in
/// `seen` (not stored).
private struct Probing: Record, Equatable {
    static var recordType: String { "Reversed" }
    var id = RecordID()
    var a: String
    var b: Int
    var c: Double
    var d: Bool
    var seen = ""
    enum CodingKeys: String, CodingKey { case id, a, b, c, d }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        let contained = [CodingKeys.a, .b, .c, .d].filter { c.contains($0) }.map(\.stringValue)
        let nils = try [CodingKeys.a, .b, .c, .d].filter { try c.decodeNil(forKey: $0) }.map(\.stringValue)
        d = try c.decode(Bool.self, forKey: .d)
        a = try c.decode(String.self, forKey: .a)
        let again = try c.decode(String.self, forKey: .a)
        b = try c.decode(Int.self, forKey: .b)
        self.c = try c.decode(Double.self, forKey: .c)
        seen = "contains \(contained) nil \(nils) again \(again) keys \(c.allKeys.map(\.stringValue).sorted())"
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(a, forKey: .a)
        try c.encode(b, forKey: .b)
        try c.encode(self.c, forKey: .c)
        try c.encode(d, forKey: .d)
    }
}

/// Optionals written after the fields that follow them in the type: `init(from:)` asks for
/// `note` and `tag` while a later field is stored next, so the decoder's guess that they are
/// absent (nil) is wrong whenever they are stored.
private struct LateOptionals: Record, Equatable {
    var id = RecordID()
    var note: String?
    var count: Int
    var tag: Int?
    var done: Bool
    enum CodingKeys: String, CodingKey { case id, note, count, tag, done }
    init(id: RecordID = RecordID(), note: String?, count: Int, tag: Int?, done: Bool) {
        self.id = id; self.note = note; self.count = count; self.tag = tag; self.done = done
    }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        note = try c.decodeIfPresent(String.self, forKey: .note)
        count = try c.decode(Int.self, forKey: .count)
        tag = try c.decodeIfPresent(Int.self, forKey: .tag)
        done = try c.decode(Bool.self, forKey: .done)
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(count, forKey: .count)
        try c.encode(done, forKey: .done)
        try c.encodeIfPresent(note, forKey: .note)
        try c.encodeIfPresent(tag, forKey: .tag)
    }
}

/// Encodes `name` twice: once as itself, once upper-cased.
private struct EncodesTwice: Record, Equatable {
    var id = RecordID()
    var name: String
    enum CodingKeys: String, CodingKey { case id, name }
    init(name: String) { self.name = name }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        name = try c.decode(String.self, forKey: .name)
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(name, forKey: .name)
        try c.encode(name.uppercased(), forKey: .name)
    }
}

/// Reads `a` twice, as a type may; writes it once.
private struct Rereads: Record, Equatable {
    var id = RecordID()
    var a: String
    var b: Int
    enum CodingKeys: String, CodingKey { case id, a, b }
    init(a: String, b: Int) { self.a = a; self.b = b }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        a = try c.decode(String.self, forKey: .a)
        a = try c.decode(String.self, forKey: .a)
        b = try c.decode(Int.self, forKey: .b)
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(a, forKey: .a)
        try c.encode(b, forKey: .b)
    }
}

/// Typed reads take the stored fields in order without a field table, and fall back to the
/// table for anything else; a record whose bytes are damaged must fail either way.
@Suite struct RecordDecodingTests {
    @Test func fieldsAskedForOutOfStoredOrderReadBack() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Reversed.self])
        let records = (0..<20).map { (n: Int) -> Reversed in Reversed(a: "a\(n)", b: n * 7 - 50, c: Double(n) / 3, d: n % 2 == 0) }
        try store.write { tx in for record in records { try tx.insert(record) } }
        for record in records { #expect(try store.get(Reversed.self, id: record.id) == record) }
    }

    @Test func aTypeThatChecksSkipsAndRereadsFieldsReadsTheRightValues() throws {
        let dir = TemporaryDirectory()
        let written = Reversed(a: "alpha", b: 42, c: 2.5, d: true)
        do {
            let store = try Store.open(at: dir.path, types: [Reversed.self])
            try store.insert(written)
        }
        let store = try Store.open(at: dir.path, types: [Probing.self])
        let read = try #require(try store.get(Probing.self, id: written.id))
        #expect(read.a == written.a && read.b == written.b && read.c == written.c && read.d == written.d)
        #expect(read.seen == #"contains ["a", "b", "c", "d"] nil [] again alpha keys ["a", "b", "c", "d", "id"]"#)
    }

    /// Seeded: records with each optional nil or not, read back typed and through the
    /// generic (field table) path.
    @Test(arguments: [UInt64(11), 12, 13])
    func mixedRecordsReadBackAsWritten(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Mixed.self])
        var rng = SeededGenerator(seed: seed)
        let records = (0..<60).map { n in
            Mixed(title: "t\(n)-" + String(repeating: "x", count: Int.random(in: 0...150, using: &rng)),
                  subtitle: Bool.random(using: &rng) ? "s\(n)" : nil,
                  size: Size(width: Int.random(in: -5...5000, using: &rng), height: n),
                  tags: (0..<Int.random(in: 0...4, using: &rng)).map { "tag\($0)" },
                  rank: Bool.random(using: &rng) ? Int.random(in: Int.min...Int.max, using: &rng) : nil,
                  at: Date(timeIntervalSinceReferenceDate: Double(Int.random(in: 0...1_000_000_000, using: &rng))),
                  blob: Data((0..<Int.random(in: 0...300, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }),
                  owner: UUID(),
                  ratio: Bool.random(using: &rng) ? Double.random(in: -1...1, using: &rng) : nil,
                  done: Bool.random(using: &rng))
        }
        try store.write { tx in for record in records { try tx.insert(record) } }
        for record in records {
            #expect(try store.get(Mixed.self, id: record.id) == record, "seed \(seed)")
            let generic = try #require(try store.read { try $0.get(typeNamed: "Mixed", id: record.id) }, "seed \(seed)")
            #expect(generic.fields["subtitle"] == record.subtitle.map { .string($0) }, "seed \(seed)")
            #expect(generic.fields["title"] == .string(record.title), "seed \(seed)")
        }
    }

    /// Every combination of nil and stored for optionals stored after the fields read after
    /// them, and for optionals read in order (`Mixed`'s, last field included), read back.
    @Test func optionalsTakenAsAbsentAreCheckedAgainstTheRecord() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [LateOptionals.self, Mixed.self])
        var records: [LateOptionals] = []
        for note in [nil, "n"] as [String?] {
            for tag in [nil, 7] as [Int?] { records.append(LateOptionals(note: note, count: records.count, tag: tag, done: tag == nil)) }
        }
        try store.write { tx in for record in records { try tx.insert(record) } }
        for record in records { #expect(try store.get(LateOptionals.self, id: record.id) == record) }

        var mixed: [Mixed] = []
        for subtitle in [nil, "s"] as [String?] {
            for rank in [nil, 3] as [Int?] {
                for ratio in [nil, 0.5] as [Double?] {
                    mixed.append(Mixed(title: "t", subtitle: subtitle, size: Size(width: 1, height: 2), tags: [], rank: rank,
                                       at: Date(timeIntervalSinceReferenceDate: 0), blob: Data(), owner: UUID(), ratio: ratio, done: true))
                }
            }
        }
        try store.write { tx in for record in mixed { try tx.insert(record) } }
        for record in mixed { #expect(try store.get(Mixed.self, id: record.id) == record) }
        #expect(try store.fetch(FetchDescriptor<Mixed>()).count == mixed.count)
    }

    /// A record whose header or last value does not match its bytes, or that holds a field
    /// twice, is corrupted, also when every field the type asks for reads in order; the generic
    /// read fails too, and `verify` reports it.
    @Test func damagedRecordsFailAsCorrupted() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let item = Item(homeID: RecordID(), name: "plain", category: "c", wearCount: 3, price: 9.5)
        try store.insert(item)
        // The store's bytes, changed underneath it through StashLMDB.
        let env = try Environment.open(path: dir.path)
        let (key, stored) = try storedRecord(item.id, in: env)
        var damages: [(String, [UInt8])] = [
            ("a byte after the last field", stored + [0]),
            ("the last byte cut off", Array(stored.dropLast())),
        ]
        // The field count is bytes 5-6 (little-endian) after the format's version byte and
        // the checksum (bytes 1-4).
        var more = stored
        more[5] &+= 1
        damages.append(("one field more in the header", more))
        var fewer = stored
        fewer[5] &-= 1
        damages.append(("one field fewer in the header", fewer))
        // `homeID` is the first field: its tag, the uuid kind and 16 bytes.
        let first = Array(stored[7..<25])
        #expect(first[1] == 7, "the first field's kind is a uuid's (7)")
        var twice = stored
        twice[5] &+= 1
        twice.insert(contentsOf: first, at: 7)
        damages.append(("the first field stored twice", twice))
        for (damage, bytes) in damages {
            try replaceRecord(key, with: bytes, in: env)
            do {
                let read = try store.get(Item.self, id: item.id)
                Issue.record("\(damage): read \(String(describing: read))")
            } catch let error as StoreError {
                #expect(error.code == .corrupted, "\(damage): \(error)")
            }
            #expect(throws: StoreError.self, "\(damage): the generic read") { try store.read { try $0.get(typeNamed: "Item", id: item.id) } }
            #expect(try !store.verify().isClean, "\(damage)")
        }
        try replaceRecord(key, with: stored, in: env)
        #expect(try store.get(Item.self, id: item.id) == item)
    }

    /// A field stored twice in a row fails as corrupted also for a type that reads it twice
    /// (each read then finds it next, in order).
    @Test func aFieldStoredTwiceFailsForATypeThatReadsItTwice() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Rereads.self])
        let record = Rereads(a: "x", b: 2)
        try store.insert(record)
        #expect(try store.get(Rereads.self, id: record.id) == record)
        let env = try Environment.open(path: dir.path)
        let (key, stored) = try storedRecord(record.id, in: env)
        // `a` is the first field: its tag, the string kind, the length 1 and "x".
        let first = Array(stored[7..<11])
        #expect(first[1] == 5 && first[3] == UInt8(ascii: "x"), "the first field is the string \"x\"")
        var twice = stored
        twice[5] &+= 1
        twice.insert(contentsOf: first, at: 7)
        try replaceRecord(key, with: twice, in: env)
        #expect { try store.get(Rereads.self, id: record.id) } throws: { ($0 as? StoreError)?.code == .corrupted }
    }

    /// A type that encodes one key twice is refused before anything is written: a stored record
    /// holds each field once.
    @Test func aKeyEncodedTwiceIsRefused() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [EncodesTwice.self])
        do {
            try store.insert(EncodesTwice(name: "a"))
            Issue.record("a record encoding 'name' twice was stored")
        } catch let error as StoreError {
            #expect(error.code == .invalidValue && error.message.contains("'name' is encoded twice"), "\(error)")
        }
        #expect(try store.count(EncodesTwice.self) == 0)
    }

    /// Seeded: every typed read of a record with one byte changed either fails, or agrees with
    /// the field table's parse (the generic read) on every field.
    @Test(arguments: [UInt64(21), 22])
    func aTypedReadOfADamagedRecordSucceedsOnlyWhereTheTableAgrees(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let item = Item(homeID: RecordID(), name: "twelve chars", category: "kitchen", wearCount: 300, price: -1.25, note: "a note")
        let typedReads = try Self.damageOneByte(of: item, in: store, at: dir.path, seed: seed) { typed, fields, context in
            #expect(fields["homeID"] == .uuid(typed.homeID.uuid), "\(context)")
            #expect(fields["name"] == .string(typed.name), "\(context)")
            #expect(fields["category"] == .string(typed.category), "\(context)")
            #expect(fields["wearCount"] == .int(Int64(typed.wearCount)), "\(context)")
            Self.expectDouble(fields["price"], typed.price, context)
            #expect(fields["note"] == typed.note.map { .string($0) }, "\(context)")
        }
        #expect(typedReads > 0, "seed \(seed): some changed bytes (inside strings, numbers) still read")
    }

    /// The same for a record whose optionals are partly absent (read in order, they are taken
    /// as absent without the table; every such guess must hold against the table's parse).
    @Test(arguments: [UInt64(31), 32])
    func aTypedReadOfADamagedRecordWithAbsentOptionalsAgreesWithTheTable(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Mixed.self])
        let record = Mixed(title: "a title", subtitle: nil, size: Size(width: 3, height: 4), tags: ["x"], rank: 5,
                           at: Date(timeIntervalSinceReferenceDate: 1_000), blob: Data([1, 2, 3]), owner: UUID(), ratio: nil, done: true)
        let typedReads = try Self.damageOneByte(of: record, in: store, at: dir.path, seed: seed) { typed, fields, context in
            #expect(fields["title"] == .string(typed.title), "\(context)")
            #expect(fields["subtitle"] == typed.subtitle.map { .string($0) }, "\(context)")
            #expect(fields["rank"] == typed.rank.map { .int(Int64($0)) }, "\(context)")
            #expect(fields["done"] == .bool(typed.done), "\(context)")
            if let ratio = typed.ratio { Self.expectDouble(fields["ratio"], ratio, context) } else { #expect(fields["ratio"] == nil, "\(context)") }
        }
        #expect(typedReads > 0, "seed \(seed): some changed bytes (inside strings, numbers) still read")
    }

    /// Inserts `record`, then 400 times changes one byte of its stored bytes (seeded) through
    /// StashLMDB and, where the typed read still succeeds, calls `compare` with what it read,
    /// the generic read's fields (which must exist) and a description of the change. Returns
    /// the number of typed reads that succeeded.
    private static func damageOneByte<R: Record>(of record: R, in store: Store, at path: String, seed: UInt64,
                                                 _ compare: (R, [String: FieldValue], String) -> Void) throws -> Int {
        try store.insert(record)
        let env = try Environment.open(path: path)
        let (key, stored) = try storedRecord(record.id, in: env)
        var rng = SeededGenerator(seed: seed)
        var typedReads = 0
        for round in 0..<400 {
            var bytes = stored
            let at = Int.random(in: 0..<bytes.count, using: &rng)
            bytes[at] = Bool.random(using: &rng) ? UInt8.random(in: 0...255, using: &rng) : bytes[at] ^ (1 << UInt8.random(in: 0...7, using: &rng))
            try replaceRecord(key, with: bytes, in: env)
            let context = "seed \(seed) round \(round): byte \(at) of \(stored.count) set to \(bytes[at])"
            guard let typed = try? store.get(R.self, id: record.id) else { continue }
            typedReads += 1
            let generic = try #require(try store.read { try $0.get(typeNamed: R.recordType, id: record.id) },
                                       "\(context): the typed read succeeded, the generic one found nothing")
            compare(typed, generic.fields, context)
        }
        return typedReads
    }

    /// A double read back as stored, bit for bit (a NaN is not == itself).
    private static func expectDouble(_ stored: FieldValue?, _ read: Double, _ context: String) {
        if case .double(let value) = stored { #expect(value.bitPattern == read.bitPattern, "\(context)") }
        else { Issue.record("\(context): read as \(read), stored as \(String(describing: stored))") }
    }
}

// MARK: - Stored bytes, changed underneath the store (also used by RecordDecodingEdgeTests)

/// The key and bytes of record `id` in `env`'s records table.
func storedRecord(_ id: RecordID, in env: Environment) throws -> (key: [UInt8], value: [UInt8]) {
    try StoredEntries.find("records", keyEndingWith: id.bytes, in: env)
}

/// Stores `bytes` under `key` in `env`'s records table, underneath the store, with the
/// checksum they give (``resealedRecord(_:)``): what these tests change is what the decoder
/// itself must refuse, which a damaged checksum would otherwise hide (DamageTests changes
/// bytes without it).
func replaceRecord(_ key: [UInt8], with bytes: [UInt8], in env: Environment) throws {
    let records = try env.database("records")
    try env.write { txn in try txn.put(records, key: key, value: resealedRecord(bytes)) }
}
