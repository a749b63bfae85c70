import Foundation
import Stash
import StashLMDB
import Testing
import StashTestSupport

/// An event at an instant, indexed by it.
private struct Event: Record, Equatable {
    var id = RecordID()
    var at: Date
    static let indexes: [RecordIndex<Event>] = [.index(\.at)]
}

/// Dates were stored as seconds since 1970, which drops the last bit of about half of all
/// `Date` values (a `Date` is seconds since 2001): a record read back was not equal to the one
/// inserted, and `fetch(at == t)` missed the record just stored at `t` while `fetchCount`
/// counted it. They are stored as `Date` holds them now.
@Suite struct DateRoundTripTests {
    /// Instants of 2025 with every low bit in play (random fractions of a second), fixed seed.
    static func instants(seed: UInt64, count: Int) -> [Date] {
        var rng = SeededGenerator(seed: seed)
        return (0..<count).map { _ in
            Date(timeIntervalSinceReferenceDate: 757_000_000 + Double(rng.next() % 1_000_000_000) / 1_000_000 + Double(rng.next() % 1_000) * 1e-9)
        }
    }

    @Test(arguments: [UInt64(3), 2026])
    func everyDateReadsBackEqualAndIsFoundByItself(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Event.self])
        let events = Self.instants(seed: seed, count: 200).map { Event(at: $0) }
        #expect(events.contains { Date(timeIntervalSince1970: $0.at.timeIntervalSince1970) != $0.at },
                "seed \(seed): the instants include ones that seconds since 1970 cannot hold")
        try store.write { tx in for event in events { try tx.insert(event) } }
        for event in events {
            let at = event.at
            #expect(try store.get(Event.self, id: event.id) == event, "seed \(seed)")
            #expect(try store.fetch(FetchDescriptor<Event>(predicate: #Predicate { $0.at == at })) == [event], "seed \(seed)")
            #expect(try store.fetchCount(FetchDescriptor<Event>(predicate: #Predicate { $0.at == at })) == 1, "seed \(seed)")
            #expect(try store.read { try $0.get(typeNamed: "Event", id: event.id)?.fields["at"] } == .date(at), "seed \(seed)")
        }
        let sorted = events.sorted { $0.at < $1.at }
        let middle = sorted[100].at
        let later = try store.fetch(FetchDescriptor<Event>(predicate: #Predicate { $0.at >= middle }, sortBy: [SortDescriptor(\.at)]))
        #expect(later == Array(sorted[100...]), "seed \(seed)")
        #expect(try store.verify().isClean)
    }

    /// A store of format 1 (dates as seconds since 1970) still reads its dates, and its date
    /// indexes are rebuilt in the new keys at its first open by this library.
    @Test func aFormatOneStoreReadsItsDatesAndRebuildsTheirIndex() throws {
        let dir = TemporaryDirectory()
        let instants = (0..<20).map { Date(timeIntervalSince1970: 1_700_000_000 + Double($0) * 3600) }
        let events = instants.map { Event(at: $0) }
        do {
            let store = try Store.open(at: dir.path, types: [Event.self])
            try store.write { tx in for event in events { try tx.insert(event) } }
            let type = try #require(store.schema.type(named: "Event"))
            let tag = try #require(type.field(named: "at")?.tag)
            // Rewrite the store as format 1 wrote it: kind 8 (seconds since 1970), and index
            // keys of the old encoding, here simply gone so that only a rebuild can answer.
            let env = try Environment.open(path: dir.path)
            let records = try env.database("records"), index = try env.database("index"), meta = try env.database("meta")
            try env.write { txn in
                for event in events {
                    var value: [UInt8] = [1, 1, 0, UInt8(tag), 8]
                    value += withUnsafeBytes(of: event.at.timeIntervalSince1970.bitPattern.littleEndian, Array.init)
                    try txn.put(records, key: [UInt8(type.tag >> 8), UInt8(type.tag & 0xFF)] + event.id.bytes, value: value)
                }
                try txn.removeAll(index)
                try txn.put(meta, key: Array("format".utf8), uint64: 1)
            }
        }
        let store = try Store.open(at: dir.path, types: [Event.self])
        for event in events {
            let at = event.at
            #expect(try store.get(Event.self, id: event.id) == event)
            #expect(try store.fetchCount(FetchDescriptor<Event>(predicate: #Predicate { $0.at == at })) == 1)
        }
        let cut = instants[10]
        #expect(try store.fetch(FetchDescriptor<Event>(predicate: #Predicate { $0.at < cut })).count == 10)
        #expect(try store.verify().isClean)
    }
}

/// A word, indexed, and a unique handle.
private struct Word: Record, Equatable {
    var id = RecordID()
    var text: String
    var handle: String?
    static let indexes: [RecordIndex<Word>] = [.index(\.text), .unique(\.handle)]
}

/// Strings were indexed as their bytes while Swift compares them by canonical equivalence:
/// a record stored in decomposed form (macOS file names, some keyboards) was missed by an
/// indexed `==` with the precomposed constant and by ranges, though a scan found it, and a
/// unique index let both spellings in. Keys are the strings' NFC bytes now.
@Suite struct CanonicalStringTests {
    @Test func bothSpellingsOfAStringShareItsKey() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Word.self])
        let decomposed = Word(text: "cafe\u{301}", handle: "e\u{301}mile")
        let summer = Word(text: "e\u{301}te\u{301}", handle: nil)   // "été", decomposed
        let others = [Word(text: "cafe", handle: nil), Word(text: "fable", handle: "fred"), summer]
        try store.write { tx in for word in [decomposed] + others { try tx.insert(word) } }
        let precomposed = "caf\u{E9}"
        #expect(precomposed == decomposed.text, "Swift: canonically equivalent")
        let equal = FetchDescriptor<Word>(predicate: #Predicate { $0.text == precomposed })
        #expect(try store.explain(equal).usesIndex)
        #expect(try store.fetch(equal) == [decomposed])
        #expect(try store.fetchCount(equal) == 1)
        #expect(try store.count(Word.self, where: \.text, equals: precomposed) == 1)
        // "é" sorts after "f" (U+00E9 > U+0066), whichever way it is spelled.
        let past = FetchDescriptor<Word>(predicate: #Predicate { $0.text > "f" })
        #expect(try store.explain(past).usesIndex)
        #expect(Set(try store.fetch(past).map(\.text)) == ["fable", "\u{E9}t\u{E9}"])
        #expect(try store.fetchCount(past) == 2)
        let handles = FetchDescriptor<Word>(predicate: #Predicate { $0.handle != nil })
        #expect(Set(try store.fetch(handles).compactMap(\.handle)) == ["\u{E9}mile", "fred"])
        #expect {
            try store.insert(Word(text: "other", handle: "\u{E9}mile"))
        } throws: { ($0 as? StoreError)?.code == .uniqueViolation }
        #expect(try store.verify().isClean)
    }
}

/// A set, and a dictionary whose keys are neither strings nor integers, encode in hash order.
struct Outfit: Record, Equatable {
    var id = RecordID()
    var name: String
    var tags: Set<String>
    var worn: [UUID: Int]
}

@Suite struct UnorderedCollectionTests {
    /// The same outfit, its set and dictionary built in another order, is no change: before,
    /// their hash order went into the stored bytes, so saving an unchanged record wrote a
    /// history entry and a newer version of the fields (which then beat real edits elsewhere).
    @Test func aSetOrDictionaryInAnotherOrderIsNoChange() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Outfit.self])
        let words = (0..<40).map { "tag \($0)" }
        let people = (0..<20).map { _ in UUID() }
        var small = Set<String>(), large = Set<String>(minimumCapacity: 4096)
        for word in words { small.insert(word) }
        for word in words.reversed() { large.insert(word) }
        #expect(Array(small) != Array(large), "the two sets iterate in the same order: the test cannot tell")
        var wornA: [UUID: Int] = [:], wornB = [UUID: Int](minimumCapacity: 4096)
        for (n, person) in people.enumerated() { wornA[person] = n }
        for (n, person) in people.enumerated().reversed() { wornB[person] = n }
        let outfit = Outfit(name: "linen", tags: small, worn: wornA)
        try store.insert(outfit)
        let before = try store.history().count
        try store.upsert(Outfit(id: outfit.id, name: "linen", tags: large, worn: wornB))
        #expect(try store.history().count == before, "an unchanged outfit wrote a history entry")
        #expect(try store.get(Outfit.self, id: outfit.id) == outfit)
    }
}

/// A class hierarchy whose subclass encodes its superclass through `superEncoder()`.
class Shape: Codable, @unchecked Sendable {
    let name: String
    init(name: String) { self.name = name }
}

final class Circle: Shape, @unchecked Sendable {
    let radius: Double
    init(name: String, radius: Double) {
        self.radius = radius
        super.init(name: name)
    }
    enum CodingKeys: String, CodingKey { case radius }
    required init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        radius = try c.decode(Double.self, forKey: .radius)
        try super.init(from: c.superDecoder())
    }
    override func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(radius, forKey: .radius)
        try super.encode(to: c.superEncoder())
    }
}

/// Encodes two fields through `superEncoder(forKey:)`: a date and an array.
struct Sketch: Record {
    var id = RecordID()
    var drawnAt: Date
    var strokes: [String]
    var shape: Circle
    enum CodingKeys: String, CodingKey { case id, drawnAt, strokes, shape }
    init(drawnAt: Date, strokes: [String], shape: Circle) {
        self.drawnAt = drawnAt
        self.strokes = strokes
        self.shape = shape
    }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        drawnAt = try Date(from: c.superDecoder(forKey: .drawnAt))
        strokes = try [String](from: c.superDecoder(forKey: .strokes))
        shape = try c.decode(Circle.self, forKey: .shape)
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id, forKey: .id)
        try drawnAt.encode(to: c.superEncoder(forKey: .drawnAt))
        try strokes.encode(to: c.superEncoder(forKey: .strokes))
        try c.encode(shape, forKey: .shape)
    }
}

@Suite struct SuperEncoderTests {
    /// `superEncoder()` on a synthesized `CodingKeys` trapped (a force-unwrapped key "super"
    /// it has no case for), and `superEncoder(forKey:)` stored `{}` for a single value or an
    /// array (the record then failed to decode).
    @Test func superEncodersStoreWhatTheyAreGiven() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Sketch.self])
        let drawnAt = Date(timeIntervalSinceReferenceDate: 785_555_555.25)
        let sketch = Sketch(drawnAt: drawnAt, strokes: ["line", "arc"], shape: Circle(name: "sun", radius: 2.5))
        try store.insert(sketch)
        let back = try #require(try store.get(Sketch.self, id: sketch.id))
        #expect(back.drawnAt == drawnAt)
        #expect(back.strokes == ["line", "arc"])
        #expect(back.shape.name == "sun" && back.shape.radius == 2.5)
    }
}

/// A preset length, as a timer app declares it.
enum Preset: TimeInterval, CaseIterable, Codable, Sendable {
    case short = 300, long = 1500
}

struct Countdown: Record, Equatable {
    var id = RecordID()
    var preset: Preset
}

/// ``Countdown`` as a store recorded it before: `preset` of kind map, never holding a value.
struct CountdownRecordedAsMap: Record {
    static var recordType: String { "Countdown" }
    var id = RecordID()
    var preset: [String: Double]?
}

@Suite struct CaseIterableKindTests {
    /// A store that recorded the wrong kind for a field no record holds (every write of it
    /// was refused) could not open with the right kind: the open refused the change of kind.
    @Test func aFieldNoRecordHoldsTakesTheDeclaredKind() throws {
        let dir = TemporaryDirectory()
        do {
            let store = try Store.open(at: dir.path, types: [CountdownRecordedAsMap.self])
            #expect(store.schema.type(named: "Countdown")?.field(named: "preset")?.kind == .map)
        }
        let store = try Store.open(at: dir.path, types: [Countdown.self])
        let countdown = Countdown(preset: .short)
        try store.insert(countdown)
        #expect(try store.get(Countdown.self, id: countdown.id) == countdown)
    }

    /// A CaseIterable enum with a Double raw value was probed as a map, so every insert was
    /// refused ("stored as map, got double; change a field's kind with a Migration").
    @Test func aDoubleRawValueEnumIsStoredAsADouble() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Countdown.self])
        let countdown = Countdown(preset: .long)
        try store.insert(countdown)
        #expect(try store.get(Countdown.self, id: countdown.id) == countdown)
        #expect(store.schema.type(named: "Countdown")?.field(named: "preset")?.kind == .double)
    }
}

/// A hash kept as a UInt64: values past Int64.max do not fit the stored integer.
struct Fingerprint: Record, Equatable {
    var id = RecordID()
    var hash: UInt64
}

@Suite struct EncodingErrorTests {
    /// A value that cannot be stored threw the raw EncodingError of the nested encoder, which
    /// named neither the type nor the field. It is a StoreError naming both.
    @Test func aValueThatDoesNotFitNamesItsTypeAndField() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Fingerprint.self])
        try store.insert(Fingerprint(hash: 42))
        let error = thrownError { try store.insert(Fingerprint(hash: 1 << 63)) } as? StoreError
        #expect(error?.code == .invalidValue, "\(String(describing: error))")
        #expect(error?.message.contains("Fingerprint") == true && error?.message.contains("'hash'") == true, "\(String(describing: error))")
        #expect(try store.count(Fingerprint.self) == 1)
    }
}

struct Document: Record, Equatable {
    var id = RecordID()
    var body: FieldValue
}

@Suite struct NestingTests {
    /// `depth` arrays, one inside the other, around an int.
    private func nested(_ depth: Int) -> FieldValue {
        (0..<depth).reduce(FieldValue.int(1)) { inner, _ in .array([inner]) }
    }

    /// Reading a value recursed once per array or map level with no bound: a few hundred KB
    /// of a delta or record (`09 01` repeated) overflowed the stack and crashed the process.
    @Test func aValueNestedPastTheLimitIsAnErrorNotACrash() throws {
        var bytes: [UInt8] = []
        for _ in 0..<200_000 { bytes += [9, 1] }
        bytes.append(0)
        #expect(throws: (any Error).self) { try RecordValueCoding.decode(bytes, at: 0, end: bytes.count) }
    }

    /// What can be written can be read back: values nested past the limit are refused on
    /// the way in, naming the record and field; up to it they round-trip.
    @Test func valuesNestedPastTheLimitAreRefusedOnWrite() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Document.self])
        let deepest = Document(body: nested(100))
        try store.insert(deepest)
        #expect(try store.get(Document.self, id: deepest.id) == deepest)
        let error = thrownError { try store.insert(Document(body: nested(101))) } as? StoreError
        #expect(error?.code == .invalidValue && error?.message.contains("body") == true, "\(String(describing: error))")
        let generic = thrownError {
            try store.write { tx in try tx.put(GenericRecord(type: "Document", id: RecordID(), fields: ["body": nested(101)])) }
        } as? StoreError
        #expect(generic?.code == .invalidValue && generic?.message.contains("body") == true, "\(String(describing: generic))")
        #expect(try store.count(Document.self) == 1)
    }
}
