import Foundation
import Stash
import Testing
import StashTestSupport

/// A wrapper of an optional that encodes its nil through a single-value container, as
/// "null-codable" property wrappers do.
private struct NullEncoding<T: Codable & Equatable & Sendable>: Codable, Equatable, Sendable {
    var wrappedValue: T?
    init(wrappedValue: T?) { self.wrappedValue = wrappedValue }
    init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        wrappedValue = c.decodeNil() ? nil : try c.decode(T.self)
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        if let wrappedValue { try c.encode(wrappedValue) } else { try c.encodeNil() }
    }
}

private struct Scored: Record, Equatable {
    var id = RecordID()
    var name: String
    var score: NullEncoding<Int>
    var extra: FieldValue
}

/// `Scored` before it had `score` and `extra`.
private struct ScoredBefore: Record, Equatable {
    static var recordType: String { "Scored" }
    var id = RecordID()
    var name: String
}

private struct Measure: Record, Equatable {
    var id = RecordID()
    var ratio: Float
}

private struct Limit: Record, Equatable {
    var id = RecordID()
    var name: String
}

/// `Limit` with a ceiling that reads infinity for the limits stored before it, and a level
/// and label whose defaults are 0.0 and "é" (precomposed).
private struct LimitWithCeiling: Record, Equatable {
    static var recordType: String { "Limit" }
    var id = RecordID()
    var name: String
    var ceiling: Double
    var level: Double
    var label: String
    static var fieldDefaults: [String: FieldValue] { ["ceiling": .double(.infinity), "level": .double(0), "label": .string("\u{E9}")] }
}

/// A type whose `encode(to:)` leaves out an empty slug while its `init(from:)` requires one.
private struct Slugged: Record, Equatable {
    var id = RecordID()
    var slug: String
    init(slug: String) { self.slug = slug }
    enum CodingKeys: String, CodingKey { case id, slug }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        slug = try c.decode(String.self, forKey: .slug)
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id, forKey: .id)
        if !slug.isEmpty { try c.encode(slug, forKey: .slug) }
    }
}

/// Values that went in and did not come out as they went in.
@Suite struct CodingFidelityTests {
    /// A property that is not an optional but encodes a nil (a null-codable wrapper, a
    /// `FieldValue.null`) was stored as nothing, and the record then could not be read at all
    /// (".corrupted: missing field"), nor could any fetch of its type.
    @Test func aNonOptionalValueThatEncodesNilReadsBack() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Scored.self])
        var record = Scored(name: "a", score: NullEncoding(wrappedValue: nil), extra: .null)
        try store.insert(record)
        #expect(try store.get(Scored.self, id: record.id) == record)
        record.score.wrappedValue = 3
        record.extra = .string("set")
        try store.update(record)
        #expect(try store.get(Scored.self, id: record.id) == record)
        record.score.wrappedValue = nil
        record.extra = .null
        try store.update(record)
        #expect(try store.get(Scored.self, id: record.id) == record)
        #expect(try store.fetch(FetchDescriptor<Scored>()) == [record])
    }

    /// Records stored before such a field existed lack it: a type that reads a null takes one.
    @Test func aRecordWithoutSuchAFieldReadsItsNull() throws {
        let dir = TemporaryDirectory()
        let before = ScoredBefore(name: "old")
        do {
            let store = try Store.open(at: dir.path, types: [ScoredBefore.self])
            try store.insert(before)
        }
        let store = try Store.open(at: dir.path, types: [Scored.self])
        #expect(try store.get(Scored.self, id: before.id) == Scored(id: before.id, name: "old", score: NullEncoding(wrappedValue: nil), extra: .null))
    }

    /// A stored double beyond Float's range (written by the generic API, or while the field
    /// was a Double) read as infinity; JSONDecoder refuses it, and so does the store now.
    @Test func aDoubleBeyondFloatsRangeIsRefusedNotReadAsInfinity() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Measure.self])
        let fits = Measure(ratio: 0.25)
        try store.insert(fits)
        let huge = RecordID()
        try store.write { tx in try tx.put(GenericRecord(type: "Measure", id: huge, fields: ["ratio": .double(1e300)])) }
        #expect(try store.get(Measure.self, id: fits.id) == fits)
        let error = #expect(throws: (any Error).self) { try store.get(Measure.self, id: huge) }
        #expect("\(String(describing: error))".contains("does not fit in Float"), "\(String(describing: error))")
    }

    /// A record without a field its type requires says which field, which record, and what to
    /// do, once: the read said "missing field 'slug' in slug" and left out the advice.
    @Test func aMissingRequiredFieldSaysWhatToDo() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Slugged.self])
        let bare = Slugged(slug: "")
        try store.insert(bare)
        let error = #expect(throws: StoreError.self) { try store.get(Slugged.self, id: bare.id) }
        let message = error?.message ?? ""
        #expect(message.contains("missing field 'slug': stored Slugged record \(bare.id) has no field 'slug'")
                && message.contains("make it optional or add Slugged.fieldDefaults[\"slug\"]") && !message.contains(" in slug"), "\(message)")
    }

    /// A default of infinity (or NaN) made every open throw Foundation's EncodingError: the
    /// stored schema is JSON, which has no number for it.
    @Test func aNonFiniteDefaultIsKept() throws {
        let dir = TemporaryDirectory()
        let old = Limit(name: "before the ceiling")
        do {
            let store = try Store.open(at: dir.path, types: [Limit.self])
            try store.insert(old)
        }
        for _ in 0..<2 {   // the second open reads the schema the first one stored
            let store = try Store.open(at: dir.path, types: [LimitWithCeiling.self])
            let read = try #require(try store.get(LimitWithCeiling.self, id: old.id))
            #expect(read.ceiling == .infinity && read.level == 0 && read.label == "\u{E9}")
        }
    }

    /// A value written into a field the record lacked was left out when `==` to the default:
    /// -0.0 against a default of 0.0, or "é" spelt with a combining accent against the
    /// precomposed default, then read back as the default's bits or spelling.
    @Test func aValueEqualToTheDefaultButNotItReadsBackAsWritten() throws {
        let dir = TemporaryDirectory()
        let old = Limit(name: "before")
        do {
            let store = try Store.open(at: dir.path, types: [Limit.self])
            try store.insert(old)
        }
        let store = try Store.open(at: dir.path, types: [LimitWithCeiling.self])
        let decomposed = "e\u{301}"
        try store.update(LimitWithCeiling.self, id: old.id) {
            $0.level = -0.0
            $0.label = decomposed
        }
        let read = try #require(try store.get(LimitWithCeiling.self, id: old.id))
        #expect(read.level.sign == .minus)
        #expect(read.label.unicodeScalars.count == 2, "\(read.label.unicodeScalars.map(\.value))")
        // The same value as the default still leaves the record as it was.
        let history = try store.read { try $0.historyBounds() }.current
        try store.update(LimitWithCeiling.self, id: old.id) { $0.label = decomposed }
        #expect(try store.read { try $0.historyBounds() }.current == history)
    }
}

private struct TagBag: Record, Equatable {
    var id = RecordID()
    var tags: FieldValue
    static let indexes: [RecordIndex<TagBag>] = [.index(\.tags)]
}

/// Arrays and maps are indexed by their stored bytes: a count or fetch through the index of
/// [0.0] missed the record holding [-0.0], and of ["é"] the one holding "e" + U+0301, which
/// Swift's `==` (the filter's) counts as equal. Such values are compared on the records.
@Suite struct UncanonicalIndexValueTests {
    @Test func arraysAndMapsAreCountedAsEqualByValue() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [TagBag.self])
        try store.insert(TagBag(tags: .array([.double(-0.0)])))
        try store.insert(TagBag(tags: .array([.map(["name": .string("e\u{301}")])])))
        try store.insert(TagBag(tags: .array([.string("plain")])))
        let zero = FieldValue.array([.double(0)])
        let accented = FieldValue.array([.map(["name": .string("\u{E9}")])])
        let handle = try store.index(\TagBag.tags)
        for (value, expected) in [(zero, 1), (accented, 1), (.array([.string("plain")]), 1), (.array([.double(1)]), 0)] {
            #expect(try store.count(TagBag.self, where: \.tags, equals: value) == expected, "\(value)")
            #expect(try store.count(handle, equals: value) == expected, "\(value)")
            #expect(try store.read { try $0.count(handle, equals: value) } == expected, "\(value)")
            #expect(try store.fetchCount(FetchDescriptor<TagBag>(predicate: #Predicate { $0.tags == value })) == expected, "\(value)")
            #expect(try store.fetch(FetchDescriptor<TagBag>(predicate: #Predicate { $0.tags == value })).count == expected, "\(value)")
        }
    }
}

private struct Invoice: Record, Equatable {
    var id = RecordID()
    var amount: Decimal
    var days: Range<Int>
}

/// `Invoice` with a new required field and no default.
private struct InvoiceWithPayee: Record, Equatable {
    static var recordType: String { "Invoice" }
    var id = RecordID()
    var amount: Decimal
    var days: Range<Int>
    var payee: String
}

/// A type with a `Decimal` (money), a `Range` or a SIMD field could not be probed: it lost
/// the open's checks, and a new required field was found missing only by each read.
@Suite struct ProbedFoundationTypesTests {
    @Test func aTypeWithDecimalAndRangeFieldsKeepsTheOpensChecks() throws {
        let dir = TemporaryDirectory()
        let invoice = Invoice(amount: Decimal(string: "1234.5678")!, days: 3..<10)
        do {
            let store = try Store.open(at: dir.path, types: [Invoice.self])
            try store.insert(invoice)
            #expect(try store.get(Invoice.self, id: invoice.id) == invoice)
        }
        let error = #expect(throws: StoreError.self) { try Store.open(at: dir.path, types: [InvoiceWithPayee.self]) }
        #expect(error?.code == .incompatibleSchema && error?.message.contains("payee") == true, "\(String(describing: error))")
        let store = try Store.open(at: dir.path, types: [Invoice.self])
        #expect(try store.get(Invoice.self, id: invoice.id) == invoice)
    }
}

private struct Preferences: Record, Equatable {
    var id = RecordID()
    var label: String
    var meta: JSONValue
    var extra: FieldValue?
    static let indexes: [RecordIndex<Preferences>] = [.index(\.extra)]
}

/// `Preferences` as an older version stored it: `extra` a string.
private struct PreferencesWithText: Record, Equatable {
    static var recordType: String { "Preferences" }
    var id = RecordID()
    var label: String
    var meta: JSONValue
    var extra: String?
}

/// A `JSONValue` property was taken for a bool (the first kind its decoder tries) and every
/// other value was refused; a `FieldValue` one made its type unprobeable and took the kind of
/// its first value for good. Both hold any kind now.
@Suite struct AnyKindFieldTests {
    static let metas: [JSONValue] = [.string("dark"), .int(3), .bool(true), .null, .double(0.5),
                                     .array([.int(1), .string("x")]), .object(["a": .object(["b": .null])])]
    // (An optional holding `.null` reads back as nil, as with JSONEncoder.)
    static let extras: [FieldValue?] = [.int(1), .string("one"), nil, .double(1), .map(["k": .bool(false)]), .int(1), .bytes(Data([0, 1]))]

    @Test func jsonAndFieldValuePropertiesHoldEveryKind() throws {
        let dir = TemporaryDirectory()
        let records = zip(Self.metas, Self.extras).enumerated().map { Preferences(label: "p\($0.offset)", meta: $0.element.0, extra: $0.element.1) }
        do {
            let store = try Store.open(at: dir.path, types: [Preferences.self])
            for record in records { try store.insert(record) }
            for record in records {
                let read = try store.get(Preferences.self, id: record.id)
                #expect(read == record, "\(String(describing: read)) != \(record)")
            }
            let schema = try #require(store.schema.type(named: "Preferences"))
            #expect(schema.field(named: "meta")?.anyKind == true && schema.field(named: "meta")?.kind == nil)
        }
        let store = try Store.open(at: dir.path, types: [Preferences.self])
        #expect(Set(try store.fetch(FetchDescriptor<Preferences>()).map(\.id)) == Set(records.map(\.id)))
        for record in records { #expect(try store.get(Preferences.self, id: record.id) == record) }
        // Indexed counts by value, whatever the kinds beside it.
        let one: FieldValue? = .int(1)
        #expect(try store.count(Preferences.self, where: \.extra, equals: one) == 2)
        #expect(try store.fetchCount(FetchDescriptor<Preferences>(predicate: #Predicate { $0.extra == one })) == 2)
        #expect(try store.verify().isClean)
    }

    /// A field stored as text, declared a FieldValue now, reads its texts and takes any kind.
    @Test func aTypedFieldTurnedFieldValueTakesAnyKind() throws {
        let dir = TemporaryDirectory()
        let old = PreferencesWithText(label: "old", meta: .null, extra: "text")
        do {
            let store = try Store.open(at: dir.path, types: [PreferencesWithText.self])
            try store.insert(old)
        }
        do {
            let store = try Store.open(at: dir.path, types: [Preferences.self])
            #expect(try store.get(Preferences.self, id: old.id)?.extra == .string("text"))
            try store.insert(Preferences(label: "new", meta: .int(2), extra: .int(2)))
            #expect(try store.count(Preferences.self) == 2)
        }
        // Back to a text field: the stored values may be of any kind, so it is refused.
        let error = #expect(throws: StoreError.self) { try Store.open(at: dir.path, types: [PreferencesWithText.self]) }
        #expect(error?.code == .incompatibleSchema && error?.message.contains("any kind") == true, "\(String(describing: error))")
    }
}
