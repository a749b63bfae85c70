import Foundation
@testable import Stash
import StashLMDB
import Testing
import StashTestSupport

// Edge cases of the typed decoder's in-order path (``RecordDecoder``): fields read where they
// lie, optionals taken as absent without the field table (guesses that `finish()` checks), and
// the read again from the table when a guess was wrong. `RecordDecodingTests` covers the basic
// cases (a type reading in reverse, `Probing`, `LateOptionals`, `Mixed`, damaged headers); these
// add types of many fields (slots 64 and up), rereads in the middle of a decode, schema
// evolution between writes, defaults, nested and super containers, every primitive kind, a
// first pass that throws because of its guess, type mismatches, and a tag stored twice at every
// position. Where a test names a path it checks that the records really took it
// (``decodePaths(_:_:in:)``), so that it cannot pass without covering it.

// MARK: - Types of many fields, in any read and write order

/// One field's value: the kind of field `i` is `i % 4` (int, string, double, bool).
private enum DynValue: Equatable, Sendable, CustomStringConvertible {
    case int(Int), string(String), double(Double), bool(Bool)

    var description: String {
        switch self {
        case .int(let v): "\(v)"
        case .string(let v): v.debugDescription
        case .double(let v): "\(v)d"
        case .bool(let v): "\(v)"
        }
    }

    var field: FieldValue {
        switch self {
        case .int(let v): .int(Int64(v))
        case .string(let v): .string(v)
        case .double(let v): .double(v)
        case .bool(let v): .bool(v)
        }
    }

    init?(_ value: FieldValue) {
        switch value {
        case .int(let v): self = .int(Int(v))
        case .string(let v): self = .string(v)
        case .double(let v): self = .double(v)
        case .bool(let v): self = .bool(v)
        default: return nil
        }
    }

    static func random(kind: Int, using rng: inout SeededGenerator) -> DynValue {
        switch kind {
        case 0:
            return .int(Bool.random(using: &rng) ? Int.random(in: -200...200, using: &rng) : Int.random(in: Int.min...Int.max, using: &rng))
        case 1:
            let alphabet: [Character] = ["a", "b", "Z", " ", "é", "😀", "\u{0}", "x"]
            return .string(String((0..<Int.random(in: 0...12, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }))
        case 2:
            let specials: [Double] = [0, -0.0, .infinity, -.infinity, .greatestFiniteMagnitude, .leastNonzeroMagnitude, 1e-300]
            return .double(Int.random(in: 0..<5, using: &rng) == 0 ? specials.randomElement(using: &rng)! : Double.random(in: -1e9...1e9, using: &rng))
        default:
            return .bool(Bool.random(using: &rng))
        }
    }
}

/// The shape of a ``Dyn`` type: its fields `f0`..`f(count-1)`, the order `init(from:)` asks
/// for them (a field listed again is asked again, with `decodeIfPresent`, and must read the
/// same), the order `encode(to:)` writes them, which are optional, and stored defaults.
/// The probe at open sees the read order: on a new store it is the layout's order.
private protocol DynPlan: Sendable {
    static var name: String { get }
    static var count: Int { get }
    static var readOrder: [Int] { get }
    static var writeOrder: [Int] { get }
    static func isOptional(_ field: Int) -> Bool
    static var defaults: [Int: FieldValue] { get }
}

extension DynPlan {
    static var readOrder: [Int] { Array(0..<count) }
    /// The fields read, each once, in the order first read.
    static var fields: [Int] {
        var seen = Set<Int>()
        return readOrder.filter { seen.insert($0).inserted }
    }
    static var writeOrder: [Int] { fields }
    static var defaults: [Int: FieldValue] { [:] }
}

private struct DynKey: CodingKey {
    let stringValue: String
    var intValue: Int? { nil }
    init(_ field: Int) { stringValue = "f\(field)" }
    init?(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }
    static let id = DynKey(stringValue: "id")!
}

/// A record of plan `P`: `values[i]` is field `f<i>` (nil: absent, or a nil optional).
/// `rereads` holds what each repeated ask of ``DynPlan/readOrder`` read (not stored).
private struct Dyn<P: DynPlan>: Record, Equatable, CustomStringConvertible {
    var description: String {
        "\(P.name)(\(values.enumerated().map { "f\($0.offset): \($0.element.map(\.description) ?? "nil")" }.joined(separator: ", "))"
            + (rereads.isEmpty ? ")" : "; again \(rereads.map { $0.map(\.description) ?? "nil" }.joined(separator: ", ")))")
    }

    static var recordType: String { P.name }
    static var fieldDefaults: [String: FieldValue] {
        Dictionary(uniqueKeysWithValues: P.defaults.map { ("f\($0.key)", $0.value) })
    }
    var id: RecordID
    var values: [DynValue?]
    var rereads: [DynValue?]

    init(id: RecordID = RecordID(), values: [DynValue?]) {
        self.id = id
        self.values = values
        var seen = Set<Int>()
        var rereads: [DynValue?] = []
        for i in P.readOrder where !seen.insert(i).inserted { rereads.append(values[i]) }
        self.rereads = rereads
    }

    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: DynKey.self)
        id = try c.decode(RecordID.self, forKey: .id)
        var values = [DynValue?](repeating: nil, count: P.count)
        var rereads: [DynValue?] = []
        var seen = Set<Int>()
        for i in P.readOrder {
            if seen.insert(i).inserted {
                values[i] = try Self.read(i, c, optional: P.isOptional(i))
            } else {
                rereads.append(try Self.read(i, c, optional: true))
            }
        }
        self.values = values
        self.rereads = rereads
    }

    private static func read(_ i: Int, _ c: KeyedDecodingContainer<DynKey>, optional: Bool) throws -> DynValue? {
        let key = DynKey(i)
        switch i % 4 {
        case 0: return optional ? try c.decodeIfPresent(Int.self, forKey: key).map { .int($0) } : .int(try c.decode(Int.self, forKey: key))
        case 1: return optional ? try c.decodeIfPresent(String.self, forKey: key).map { .string($0) } : .string(try c.decode(String.self, forKey: key))
        case 2: return optional ? try c.decodeIfPresent(Double.self, forKey: key).map { .double($0) } : .double(try c.decode(Double.self, forKey: key))
        default: return optional ? try c.decodeIfPresent(Bool.self, forKey: key).map { .bool($0) } : .bool(try c.decode(Bool.self, forKey: key))
        }
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: DynKey.self)
        for i in P.writeOrder {
            let key = DynKey(i)
            switch values[i] {
            case .int(let v)?: try c.encode(v, forKey: key)
            case .string(let v)?: try c.encode(v, forKey: key)
            case .double(let v)?: try c.encode(v, forKey: key)
            case .bool(let v)?: try c.encode(v, forKey: key)
            case nil: try c.encodeIfPresent(Int?.none, forKey: key)
            }
        }
    }

    /// A record with each optional nil two times in five.
    static func random(using rng: inout SeededGenerator) -> Dyn {
        var values = [DynValue?](repeating: nil, count: P.count)
        for i in P.fields where !P.isOptional(i) || Int.random(in: 0..<5, using: &rng) >= 2 {
            values[i] = DynValue.random(kind: i % 4, using: &rng)
        }
        return Dyn(values: values)
    }

    /// What the store holds for this record: each field written, `.some(nil)` for a nil
    /// written as an explicit null (an optional with a default).
    var stored: StoredFields {
        var fields: [Int: DynValue?] = [:]
        for i in P.writeOrder {
            if let value = values[i] { fields[i] = .some(value) } else if P.defaults[i] != nil { fields[i] = .some(nil) }
        }
        return StoredFields(id: id, fields: fields)
    }
}

/// A stored record of a ``Dyn`` type, whatever plan wrote it.
private struct StoredFields {
    var id: RecordID
    var fields: [Int: DynValue?]

    /// The record as plan `Q` must read it: a stored field as stored (a null as nil), a missing
    /// one as `Q`'s default or nil.
    func read<Q: DynPlan>(as plan: Q.Type) -> Dyn<Q> {
        var values = [DynValue?](repeating: nil, count: Q.count)
        for i in Q.fields {
            if let stored = fields[i] { values[i] = stored } else { values[i] = Q.defaults[i].flatMap(DynValue.init) }
        }
        return Dyn<Q>(id: id, values: values)
    }
}

private enum InOrder12: DynPlan {
    static let name = "InOrder12"
    static let count = 12
    static func isOptional(_ field: Int) -> Bool { field % 3 != 0 }
}

/// Written in a seeded shuffle of the order read.
private enum Shuffled12: DynPlan {
    static let name = "Shuffled12"
    static let count = 12
    static let writeOrder: [Int] = { var rng = SeededGenerator(seed: 1201); return Array(0..<12).shuffled(using: &rng) }()
    static func isOptional(_ field: Int) -> Bool { field % 2 == 0 }
}

/// Required fields written first, optionals after them: every stored optional is guessed absent.
private enum LateOptionals10: DynPlan {
    static let name = "LateOptionals10"
    static let count = 10
    static let writeOrder = [0, 2, 4, 6, 8, 1, 3, 5, 7, 9]
    static func isOptional(_ field: Int) -> Bool { field % 2 == 1 }
}

/// Fields asked for again in the middle of the decode (after later fields, or just after
/// themselves), and at the end, required and optional ones.
private enum Rereads9: DynPlan {
    static let name = "Rereads9"
    static let count = 9
    static let readOrder = [0, 0, 1, 2, 1, 3, 4, 2, 5, 6, 7, 4, 8, 5, 8, 0]
    static func isOptional(_ field: Int) -> Bool { field % 3 == 2 }
}

/// Optionals asked for (`decodeIfPresent`) before the field stored ahead of them, then asked
/// again where they are stored: the first ask is taken as absent, the second finds the field
/// next, and every field is then read in order without the table. `finish()` must see the
/// wrong guess among the fields found (its fast path, `guessedAbsent & found`).
private enum GuessedThenFound8: DynPlan {
    static let name = "GuessedThenFound8"
    static let count = 8
    static let readOrder = [1, 0, 1, 2, 3, 5, 4, 5, 6, 7]
    static let writeOrder = Array(0..<8)
    static func isOptional(_ field: Int) -> Bool { field == 1 || field == 5 || field == 7 }
}

/// The first field asked for twice in a row, the rest once, in order: a copy of the first
/// field stored right after it is read by the second ask, in order (only the count of the
/// tags found tells the copy from another field).
private enum RereadsFirst6: DynPlan {
    static let name = "RereadsFirst6"
    static let count = 6
    static let readOrder = [0, 0, 1, 2, 3, 4, 5]
    static func isOptional(_ field: Int) -> Bool { field == 2 || field == 5 }
}

/// Every field read in order, then two asked for again: with every stored field read, the
/// fields found answer `contains` (no guess is recorded there).
private enum RereadsAtEnd5: DynPlan {
    static let name = "RereadsAtEnd5"
    static let count = 5
    static let readOrder = [0, 1, 2, 3, 4, 2, 4]
    static func isOptional(_ field: Int) -> Bool { field == 2 || field == 4 }
}

/// 70 fields in order: slots 64 and up always go through the field table.
private enum Wide70: DynPlan {
    static let name = "Wide70"
    static let count = 70
    static func isOptional(_ field: Int) -> Bool { field % 3 == 1 || field >= 62 }
}

/// 70 fields, the last 14 (slots 56 to 69) written in a seeded shuffle, some asked again
/// around slot 64: guesses up to slot 63, the table from slot 64.
private enum Wide70Shuffled: DynPlan {
    static let name = "Wide70Shuffled"
    static let count = 70
    static let readOrder = Array(0..<64) + [63, 64, 62, 65, 66, 64, 67, 68, 69, 1]
    static let writeOrder: [Int] = { var rng = SeededGenerator(seed: 7001); return Array(0..<56) + Array(56..<70).shuffled(using: &rng) }()
    static func isOptional(_ field: Int) -> Bool { field % 3 == 1 || field >= 56 }
}

/// 70 fields, slots 0 to 63 written in order and 64 to 69 in a seeded shuffle: optionals at
/// slots 64 and up are asked for (`contains`) while the table is not parsed yet, with the
/// next stored field at a later slot (no guess may be taken there: `finish()` checks only
/// slots below 64).
private enum Wide70TailShuffled: DynPlan {
    static let name = "Wide70TailShuffled"
    static let count = 70
    static let writeOrder: [Int] = { var rng = SeededGenerator(seed: 7002); return Array(0..<64) + Array(64..<70).shuffled(using: &rng) }()
    static func isOptional(_ field: Int) -> Bool { field % 3 == 1 || field >= 60 }
}

/// Exactly 64 fields (the last slot has bit 63); the last two written swapped.
private enum Exactly64: DynPlan {
    static let name = "Exactly64"
    static let count = 64
    static let writeOrder = Array(0..<62) + [63, 62]
    static func isOptional(_ field: Int) -> Bool { field >= 60 || field % 5 == 0 }
}

/// Exactly 65 fields: one at slot 64; fields asked again across the 64 boundary.
private enum Exactly65: DynPlan {
    static let name = "Exactly65"
    static let count = 65
    static let readOrder = Array(0..<11) + [3] + Array(11..<64) + [62, 64, 63, 0]
    static func isOptional(_ field: Int) -> Bool { field >= 60 || field == 3 }
}

/// Optionals with stored defaults: a nil is written as an explicit null where the field comes.
private enum Defaults10: DynPlan {
    static let name = "Defaults10"
    static let count = 10
    static let defaults: [Int: FieldValue] = [1: .string("d1"), 5: .string("d5"), 7: .bool(true)]
    static func isOptional(_ field: Int) -> Bool { field % 2 == 1 }
}

/// Three versions of one type: B adds fields in the middle of the read order (8 optional,
/// 9 optional with a default, 10 required with a default) and writes in layout order; C drops
/// two optionals and reads the rest in another order than the layout's.
private enum EvolveA: DynPlan {
    static let name = "Evolve"
    static let count = 8
    static func isOptional(_ field: Int) -> Bool { field % 2 == 1 }
}

private enum EvolveB: DynPlan {
    static let name = "Evolve"
    static let count = 11
    static let readOrder = [8, 0, 1, 9, 2, 3, 4, 10, 5, 6, 7]
    static let writeOrder = Array(0..<11)
    static let defaults: [Int: FieldValue] = [9: .string("nine"), 10: .double(2.5)]
    static func isOptional(_ field: Int) -> Bool { field == 8 || field == 9 || (field < 8 && field % 2 == 1) }
}

private enum EvolveC: DynPlan {
    static let name = "Evolve"
    static let count = 11
    static let readOrder = [1, 0, 10, 4, 9, 6, 7, 8, 2]
    static let writeOrder = [10, 9, 8, 7, 6, 4, 2, 1, 0]
    static let defaults: [Int: FieldValue] = [9: .string("nine"), 10: .double(2.5)]
    static func isOptional(_ field: Int) -> Bool { EvolveB.isOptional(field) }
}

// MARK: - Hand-written types

/// A first pass that throws because of its guess: `note` is read before the fields written
/// before it, and `init(from:)` refuses a record whose `hasNote` says it has one but reads nil.
private struct Validating: Record, Equatable {
    var id = RecordID()
    var note: String?
    var count: Int
    var hasNote: Bool
    enum CodingKeys: String, CodingKey { case id, note, count, hasNote }
    init(note: String?, count: Int) { self.note = note; self.count = count; hasNote = note != nil }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        note = try c.decodeIfPresent(String.self, forKey: .note)
        count = try c.decode(Int.self, forKey: .count)
        hasNote = try c.decode(Bool.self, forKey: .hasNote)
        if hasNote && note == nil {
            throw DecodingError.dataCorrupted(.init(codingPath: [CodingKeys.note], debugDescription: "hasNote without a note"))
        }
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(count, forKey: .count)
        try c.encode(hasNote, forKey: .hasNote)
        try c.encodeIfPresent(note, forKey: .note)
    }
}

/// Writes `level` as an Int; ``GaugeNarrow`` reads it as an Int8.
private struct GaugeWide: Record, Equatable {
    static var recordType: String { "Gauge" }
    var id = RecordID()
    var note: String?
    var level: Int
    var label: String
    enum CodingKeys: String, CodingKey { case id, note, level, label }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(level, forKey: .level)
        try c.encode(label, forKey: .label)
        try c.encodeIfPresent(note, forKey: .note)   // after the others: a note read first is guessed absent
    }
}

private struct GaugeNarrow: Record, Equatable {
    static var recordType: String { "Gauge" }
    var id = RecordID()
    var note: String?
    var level: Int8
    var label: String
}

/// Asks, when `a` starts with "ask" (never for the probe's placeholder ""), about keys the
/// schema lacks through another key type, before reading the rest; `lists` also reads
/// `allKeys` (which parses the table) in the middle. What it saw is kept in `seen`.
private struct Asking: Record, Equatable {
    var id = RecordID()
    var a: String
    var b: Int?
    var c: Int
    var d: String?
    var seen = ""
    enum CodingKeys: String, CodingKey { case id, a, b, c, d }
    struct Ghost: CodingKey {
        let stringValue: String
        var intValue: Int? { nil }
        init?(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }
    init(a: String, b: Int?, c: Int, d: String?) { self.a = a; self.b = b; self.c = c; self.d = d }
    init(from decoder: any Decoder) throws {
        let k = try decoder.container(keyedBy: CodingKeys.self)
        id = try k.decode(RecordID.self, forKey: .id)
        a = try k.decode(String.self, forKey: .a)
        if a.hasPrefix("ask") {
            let g = try decoder.container(keyedBy: Ghost.self)
            let ghost = Ghost(stringValue: "ghost")!
            var parts = ["contains \(g.contains(ghost))", "nil \(try g.decodeNil(forKey: ghost))",
                         "ifPresent \(String(describing: try g.decodeIfPresent(Int.self, forKey: ghost)))",
                         "decode throws \((try? g.decode(Int.self, forKey: ghost)) == nil)"]
            // `d` asked before `b` and `c`, in the other container: out of stored order.
            parts.append("d \(String(describing: try g.decodeIfPresent(String.self, forKey: Ghost(stringValue: "d")!)))")
            if a.hasPrefix("ask+keys") { parts.append("keys \(k.allKeys.map(\.stringValue).sorted())") }
            seen = parts.joined(separator: ", ")
        }
        b = try k.decodeIfPresent(Int.self, forKey: .b)
        c = try k.decode(Int.self, forKey: .c)
        d = try k.decodeIfPresent(String.self, forKey: .d)
    }
    func encode(to encoder: any Encoder) throws {
        var k = encoder.container(keyedBy: CodingKeys.self)
        try k.encode(a, forKey: .a)
        try k.encodeIfPresent(b, forKey: .b)
        try k.encode(c, forKey: .c)
        try k.encodeIfPresent(d, forKey: .d)
    }
}

private enum Mood: String, Codable, CaseIterable, Sendable { case calm, tense, sunny = "☀️" }
private enum Level: Int, Codable, CaseIterable, Sendable { case low = -1, mid = 0, high = 9 }
private struct Part: Codable, Equatable, Sendable {
    var name: String
    var weight: Double?
    var sizes: [Int]
}

/// Every primitive kind, most of them optional, with synthesized Codable (in order; the
/// probe at open learns the fields).
private struct AllKinds: Record, Equatable {
    var id = RecordID()
    var i8: Int8
    var i16: Int16?
    var i32: Int32
    var i64: Int64?
    var u: UInt?
    var u8: UInt8
    var u16: UInt16?
    var u32: UInt32?
    var u64: UInt64?
    var f: Float?
    var flag: Bool?
    var data: Data?
    var date: Date?
    var uuid: UUID?
    var ref: RecordID?
    var mood: Mood?
    var level: Level
    var parts: [Part]?
    var part: Part?
    var strings: [String]
    var holes: [Int?]?
    var map: [String: Int]?
    var last: Bool?

    static func random(using rng: inout SeededGenerator) -> AllKinds {
        func maybe<T>(_ make: () -> T) -> T? { Int.random(in: 0..<5, using: &rng) < 2 ? nil : make() }
        func part() -> Part {
            Part(name: "p\(Int.random(in: 0...99, using: &rng))", weight: Bool.random(using: &rng) ? nil : Double.random(in: -5...5, using: &rng),
                 sizes: (0..<Int.random(in: 0...3, using: &rng)).map { _ in Int.random(in: -9...9, using: &rng) })
        }
        return AllKinds(
            i8: Int8.random(in: .min ... .max, using: &rng), i16: maybe { Int16.random(in: .min ... .max, using: &rng) },
            i32: Int32.random(in: .min ... .max, using: &rng), i64: maybe { Int64.random(in: .min ... .max, using: &rng) },
            u: maybe { UInt.random(in: 0...UInt(Int64.max), using: &rng) }, u8: UInt8.random(in: 0 ... .max, using: &rng),
            u16: maybe { UInt16.random(in: 0 ... .max, using: &rng) }, u32: maybe { UInt32.random(in: 0 ... .max, using: &rng) },
            u64: maybe { UInt64.random(in: 0...UInt64(Int64.max), using: &rng) }, f: maybe { Float.random(in: -1e30...1e30, using: &rng) },
            flag: maybe { Bool.random(using: &rng) },
            data: maybe { Data((0..<Int.random(in: 0...40, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }) },
            date: maybe { Date(timeIntervalSinceReferenceDate: Double.random(in: -1e9...1e9, using: &rng)) },
            uuid: maybe { UUID() }, ref: maybe { RecordID() }, mood: maybe { Mood.allCases.randomElement(using: &rng)! },
            level: Level.allCases.randomElement(using: &rng)!, parts: maybe { (0..<Int.random(in: 0...3, using: &rng)).map { _ in part() } },
            part: maybe { part() }, strings: (0..<Int.random(in: 0...3, using: &rng)).map { "s\($0)" },
            holes: maybe { (0..<Int.random(in: 0...4, using: &rng)).map { _ in Bool.random(using: &rng) ? nil : Int.random(in: -3...3, using: &rng) } },
            map: maybe { Dictionary(uniqueKeysWithValues: (0..<Int.random(in: 0...3, using: &rng)).map { ("k\($0)", Int.random(in: -9...9, using: &rng)) }) },
            last: maybe { Bool.random(using: &rng) })
    }
}

private enum Figure: Codable, Equatable, Sendable {
    case circle(radius: Double)
    case rect(width: Int, height: Int)
}

/// Cannot be probed (an enum with associated values): its fields are learned from the records
/// written, in the order written, so an optional first written nil joins the layout at its end,
/// after fields it is read before.
private struct Unprobed: Record, Equatable {
    var id = RecordID()
    var shape: Figure?
    var name: String
    var rank: Int?
    var when: Date?
    var shapes: [Figure]
    var note: String?
    var done: Bool

    static func random(using rng: inout SeededGenerator) -> Unprobed {
        func figure() -> Figure {
            Bool.random(using: &rng) ? .circle(radius: Double.random(in: 0...9, using: &rng))
                                     : .rect(width: Int.random(in: 0...9, using: &rng), height: Int.random(in: 0...9, using: &rng))
        }
        func maybe<T>(_ make: () -> T) -> T? { Int.random(in: 0..<5, using: &rng) < 3 ? nil : make() }
        return Unprobed(shape: maybe { figure() }, name: "n\(Int.random(in: 0...999, using: &rng))", rank: maybe { Int.random(in: -9...9, using: &rng) },
                        when: maybe { Date(timeIntervalSinceReferenceDate: Double(Int.random(in: 0...1_000_000, using: &rng))) },
                        shapes: (0..<Int.random(in: 0...2, using: &rng)).map { _ in figure() }, note: maybe { "note" }, done: Bool.random(using: &rng))
    }
}

private struct Extent: Codable, Equatable, Sendable {
    var w: Int
    var h: Int
}

/// Writes `size` through `nestedContainer` and `tags` through `nestedUnkeyedContainer` (both
/// stored where they are encoded, once filled), reads them in declaration order among optionals.
private struct Nesting: Record, Equatable {
    var id = RecordID()
    var title: String
    var size: Extent
    var note: String?
    var tags: [Int]
    var rank: Int?
    var done: Bool?
    enum CodingKeys: String, CodingKey { case id, title, size, note, tags, rank, done }
    enum ExtentKeys: String, CodingKey { case w, h }
    init(title: String, size: Extent, note: String?, tags: [Int], rank: Int?, done: Bool?) {
        self.title = title; self.size = size; self.note = note; self.tags = tags; self.rank = rank; self.done = done
    }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        title = try c.decode(String.self, forKey: .title)
        let s = try c.nestedContainer(keyedBy: ExtentKeys.self, forKey: .size)
        size = Extent(w: try s.decode(Int.self, forKey: .w), h: try s.decode(Int.self, forKey: .h))
        note = try c.decodeIfPresent(String.self, forKey: .note)
        var t = try c.nestedUnkeyedContainer(forKey: .tags)
        var tags: [Int] = []
        while !t.isAtEnd { tags.append(try t.decode(Int.self)) }
        self.tags = tags
        rank = try c.decodeIfPresent(Int.self, forKey: .rank)
        done = try c.decodeIfPresent(Bool.self, forKey: .done)
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(title, forKey: .title)
        var s = c.nestedContainer(keyedBy: ExtentKeys.self, forKey: .size)
        try s.encode(size.w, forKey: .w)
        try s.encode(size.h, forKey: .h)
        try c.encodeIfPresent(note, forKey: .note)
        var t = c.nestedUnkeyedContainer(forKey: .tags)
        for tag in tags { try t.encode(tag) }
        try c.encodeIfPresent(rank, forKey: .rank)
        try c.encodeIfPresent(done, forKey: .done)
    }
}

/// Stores an optional `Part` through `superEncoder(forKey:)` (stored where encoded; the type cannot
/// be probed) and reads it in the middle, after asking `contains`; also a `superDecoder()`
/// under the key "super".
private struct Supers: Record, Equatable {
    var id = RecordID()
    var name: String
    var base: Part?
    var inherited: Extent
    var rank: Int?
    enum CodingKeys: String, CodingKey { case id, name, base, rank }
    init(name: String, base: Part?, inherited: Extent, rank: Int?) {
        self.name = name; self.base = base; self.inherited = inherited; self.rank = rank
    }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        name = try c.decode(String.self, forKey: .name)
        base = c.contains(.base) ? try Part(from: c.superDecoder(forKey: .base)) : nil
        inherited = try Extent(from: c.superDecoder())
        rank = try c.decodeIfPresent(Int.self, forKey: .rank)
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(name, forKey: .name)
        if let base { try base.encode(to: c.superEncoder(forKey: .base)) }
        try inherited.encode(to: c.superEncoder())
        try c.encodeIfPresent(rank, forKey: .rank)
    }
}

/// A record type before it stored anything through `superEncoder`, and its nested value.
private struct LateSupersBefore: Record, Equatable {
    static var recordType: String { "LateSupers" }
    var id = RecordID()
    var name: String
    var inner: LateInnerBefore
}

private struct LateInnerBefore: Codable, Equatable, Sendable {
    var w: Int
}

/// The same record type later: reads an optional through `superDecoder(forKey:)` and another
/// through `superDecoder()`, at the top level and in its nested value, where records stored
/// before lack those keys.
private struct LateSupers: Record, Equatable {
    static var recordType: String { "LateSupers" }
    var id = RecordID()
    var name: String
    var extra: Int?
    var note: String?
    var inner: LateInner
    enum CodingKeys: String, CodingKey { case id, name, extra, inner }
    init(name: String, extra: Int?, note: String?, inner: LateInner) {
        self.name = name; self.extra = extra; self.note = note; self.inner = inner
    }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        name = try c.decode(String.self, forKey: .name)
        extra = try Int?(from: c.superDecoder(forKey: .extra))
        note = try String?(from: c.superDecoder())
        inner = try c.decode(LateInner.self, forKey: .inner)
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(name, forKey: .name)
        try extra.encode(to: c.superEncoder(forKey: .extra))
        try note.encode(to: c.superEncoder())
        try c.encode(inner, forKey: .inner)
    }
}

extension LateSupers {
    func with(id: RecordID) -> LateSupers { var copy = self; copy.id = id; return copy }
}

private struct LateInner: Codable, Equatable, Sendable {
    var w: Int
    var tag: String?
    enum CodingKeys: String, CodingKey { case w, tag }
    init(w: Int, tag: String?) { self.w = w; self.tag = tag }
    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        w = try c.decode(Int.self, forKey: .w)
        tag = try String?(from: c.superDecoder(forKey: .tag))
    }
    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(w, forKey: .w)
        try tag.encode(to: c.superEncoder(forKey: .tag))
    }
}

// MARK: - The decoder's paths, observed

/// How the in-order pass of a typed read went.
private enum DecodePath: Hashable, CustomStringConvertible {
    /// No optional taken as absent without the table.
    case noGuess
    /// Every optional taken as absent is: `finish()` agreed.
    case guessedRight
    /// A guess was wrong (`finish()` said so, or the pass threw): the read decodes again from the table.
    case guessedWrong
    /// The pass threw without any guess (the read fails).
    case threw

    var description: String {
        switch self {
        case .noGuess: "noGuess"
        case .guessedRight: "guessedRight"
        case .guessedWrong: "guessedWrong"
        case .threw: "threw"
        }
    }
}

/// The two decodes a typed read may make of record `id`, made here by hand as
/// `RecordReader.decodeFields` makes them: the in-order pass (its value, or nil when it or its
/// `finish()` threw) and the read through the field table (`inOrder: false`).
private struct DecodePaths<R> {
    var firstPass: R?
    var path: DecodePath
    var table: R?
}

private func decodePaths<R: Record>(_ type: R.Type, _ id: RecordID, in store: Store) throws -> DecodePaths<R> {
    try store.read { snapshot in
        let reader = snapshot.reader
        let layout = try reader.layout(R.self)
        let bytes = try #require(try reader.bytes(layout, id), "record \(id) is stored")
        let decoder = try RecordDecoder(bytes: bytes, id: id, layout: layout)
        var first: R? = try? R(from: decoder)
        let path: DecodePath
        if first == nil {
            path = decoder.guessedAbsent != 0 ? .guessedWrong : .threw
        } else if let finished = try? decoder.finish() {
            path = decoder.guessedAbsent == 0 ? .noGuess : (finished ? .guessedRight : .guessedWrong)
        } else {
            first = nil
            path = decoder.guessedAbsent != 0 ? .guessedWrong : .threw
        }
        let again = try RecordDecoder(bytes: bytes, id: id, layout: layout, inOrder: false)
        var table: R? = try? R(from: again)
        if table != nil, (try? again.finish()) != true { table = nil }
        return DecodePaths(firstPass: first, path: path, table: table)
    }
}

// MARK: - Stored bytes, changed underneath the store (`storedRecord`, `replaceRecord`: RecordDecodingTests)

/// `bytes` (a stored record) with `extra` more fields in the header's count.
private func withFieldCount(_ bytes: [UInt8], plus extra: Int) -> [UInt8] {
    var bytes = bytes
    // After the format byte and the checksum (bytes 1-4).
    let count = (Int(bytes[5]) | (Int(bytes[6]) << 8)) + extra
    bytes[5] = UInt8(truncatingIfNeeded: count)
    bytes[6] = UInt8(truncatingIfNeeded: count >> 8)
    return bytes
}

@Suite struct RecordDecodingEdgeTests {
    /// Writes `count` random records of plan `P` (seeded), reads each back typed, through
    /// the table and through the generic path, and returns how the in-order passes went.
    @discardableResult
    private static func roundTrip<P: DynPlan>(_ plan: P.Type, seed: UInt64, count: Int) throws -> [DecodePath: Int] {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Dyn<P>.self])
        var rng = SeededGenerator(seed: seed)
        let records = (0..<count).map { _ in Dyn<P>.random(using: &rng) }
        try store.write { tx in for record in records { try tx.insert(record) } }
        let paths = try checkReads(records.map(\.stored), as: P.self, in: store, context: "\(P.name) seed \(seed)")
        #expect(try store.fetch(FetchDescriptor<Dyn<P>>()).count == count, "\(P.name) seed \(seed)")
        return paths
    }

    /// Reads every record of `stored` as plan `Q` typed, from the table, and generically, and
    /// checks each against what it must read as; returns how the in-order passes went.
    @discardableResult
    private static func checkReads<Q: DynPlan>(_ stored: [StoredFields], as plan: Q.Type, in store: Store, context: String) throws -> [DecodePath: Int] {
        var paths: [DecodePath: Int] = [:]
        for record in stored {
            let expected = record.read(as: Q.self)
            let where_ = "\(context) record \(record.id)"
            #expect(try store.get(Dyn<Q>.self, id: record.id) == expected, "\(where_): typed read")
            let decoded = try decodePaths(Dyn<Q>.self, record.id, in: store)
            #expect(decoded.table == expected, "\(where_): read through the table")
            paths[decoded.path, default: 0] += 1
            #expect(decoded.path != .threw, "\(where_)")
            if decoded.path == .noGuess || decoded.path == .guessedRight {
                #expect(decoded.firstPass == expected, "\(where_): the in-order pass that finish() accepted (\(decoded.path))")
            }
            let generic = try #require(try store.read { try $0.get(typeNamed: Q.name, id: record.id) }, "\(where_)")
            for i in Q.fields {
                let value = generic.fields["f\(i)"].flatMap { $0 == .null ? nil : $0 }
                #expect(value == expected.values[i]?.field, "\(where_): generic f\(i)")
            }
        }
        return paths
    }

    // MARK: Many records, varied read and write orders

    /// In order: optionals guessed absent (right) and the rest read where they lie.
    /// Paths: in-order, guess right (slots < 64).
    @Test(arguments: [UInt64(101), 102])
    func fieldsWrittenInTheOrderReadRoundTrip(seed: UInt64) throws {
        let paths = try Self.roundTrip(InOrder12.self, seed: seed, count: 1500)
        #expect(paths[.guessedRight, default: 0] > 0 && paths[.guessedWrong] == nil, "seed \(seed): \(paths)")
    }

    /// Written in a shuffled order: guesses right and wrong, table fallback, re-decodes.
    @Test(arguments: [UInt64(111), 112])
    func fieldsWrittenShuffledRoundTrip(seed: UInt64) throws {
        let paths = try Self.roundTrip(Shuffled12.self, seed: seed, count: 1500)
        #expect(paths[.guessedWrong, default: 0] > 0 && paths[.guessedRight, default: 0] > 0, "seed \(seed): \(paths)")
    }

    /// Every stored optional stored after the required fields: guess wrong + re-decode for
    /// nearly every record, guess right for records whose optionals are all nil.
    @Test(arguments: [UInt64(121)])
    func optionalsWrittenLastRoundTrip(seed: UInt64) throws {
        let paths = try Self.roundTrip(LateOptionals10.self, seed: seed, count: 1000)
        #expect(paths[.guessedWrong, default: 0] > 0, "seed \(seed): \(paths)")
    }

    /// Fields asked for again in the middle of a decode (`decodeIfPresent` on a field already
    /// read in order: the found bits say it is held, then the table is parsed for its value) and
    /// after every field was read (the found bits answer). No ask of a field read already is
    /// taken as absent, so no record is decoded twice.
    @Test(arguments: [UInt64(131), 132])
    func fieldsAskedForAgainReadTheSameValue(seed: UInt64) throws {
        let paths = try Self.roundTrip(Rereads9.self, seed: seed, count: 1000)
        #expect(paths[.guessedWrong] == nil, "seed \(seed): \(paths)")
        let atEnd = try Self.roundTrip(RereadsAtEnd5.self, seed: seed, count: 300)
        #expect(atEnd[.guessedWrong] == nil, "seed \(seed): \(atEnd)")
    }

    /// An optional guessed absent, then found where it is stored and read in order with every
    /// other field: paths: guess wrong caught by `finish()`'s fast path (no table) + re-decode.
    @Test(arguments: [UInt64(191)])
    func anOptionalGuessedAbsentThenFoundInOrderIsDecodedAgain(seed: UInt64) throws {
        let paths = try Self.roundTrip(GuessedThenFound8.self, seed: seed, count: 600)
        #expect(paths[.guessedWrong, default: 0] > 0 && paths[.guessedRight, default: 0] > 0, "seed \(seed): \(paths)")
    }

    /// 70 fields: slots 64 and up through the table, optionals on both sides of the boundary.
    /// Paths: in-order then table fallback at slot 64; guesses below it.
    @Test(arguments: [UInt64(141)])
    func seventyFieldsInOrderRoundTrip(seed: UInt64) throws {
        let paths = try Self.roundTrip(Wide70.self, seed: seed, count: 300)
        #expect(paths[.guessedRight, default: 0] > 0, "seed \(seed): \(paths)")
    }

    /// 70 fields written shuffled from slot 56 (fields around slot 64 asked for again), and
    /// written shuffled from slot 64 only. Paths: guesses below 64, none at 64 and up, table.
    @Test(arguments: [UInt64(151)])
    func seventyFieldsShuffledRoundTrip(seed: UInt64) throws {
        let paths = try Self.roundTrip(Wide70Shuffled.self, seed: seed, count: 600)
        #expect(paths[.guessedWrong, default: 0] > 0, "seed \(seed): \(paths)")
        try Self.roundTrip(Wide70TailShuffled.self, seed: seed, count: 600)
    }

    /// Exactly 64 fields (bit 63 in use; the last two written swapped) and exactly 65 (one
    /// at slot 64, rereads across the boundary).
    @Test(arguments: [UInt64(161)])
    func sixtyFourAndSixtyFiveFieldsRoundTrip(seed: UInt64) throws {
        let paths64 = try Self.roundTrip(Exactly64.self, seed: seed, count: 300)
        #expect(paths64[.guessedWrong, default: 0] > 0, "seed \(seed): 64 fields: \(paths64)")
        let paths65 = try Self.roundTrip(Exactly65.self, seed: seed, count: 300)
        // Written in order, asked again only after being read: no ask is taken as absent wrongly.
        #expect(paths65[.guessedWrong] == nil, "seed \(seed): 65 fields: \(paths65)")
    }

    /// Optionals with defaults: a nil is stored as an explicit null where the field comes
    /// (read as nil, not the default), so the in-order pass meets it where the type asks for
    /// it: no optional is wrongly taken as absent, and no record is decoded twice.
    @Test(arguments: [UInt64(171)])
    func optionalsWithDefaultsRoundTrip(seed: UInt64) throws {
        let paths = try Self.roundTrip(Defaults10.self, seed: seed, count: 500)
        #expect(paths[.guessedWrong, default: 0] == 0 && paths[.guessedRight, default: 0] > 0, "seed \(seed): \(paths)")
    }

    /// Records written by three versions of a type (fields added in the middle of the read
    /// order, with and without defaults; fields dropped; another read order), each read by the
    /// versions after it, and the oldest fields read again by B after C wrote.
    @Test(arguments: [UInt64(181)])
    func recordsOfEveryVersionReadBack(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        var rng = SeededGenerator(seed: seed)
        var stored: [StoredFields] = []
        do {
            let store = try Store.open(at: dir.path, types: [Dyn<EvolveA>.self])
            let records = (0..<300).map { _ in Dyn<EvolveA>.random(using: &rng) }
            try store.write { tx in for record in records { try tx.insert(record) } }
            stored += records.map(\.stored)
            try Self.checkReads(stored, as: EvolveA.self, in: store, context: "A reads A, seed \(seed)")
        }
        do {
            let store = try Store.open(at: dir.path, types: [Dyn<EvolveB>.self])
            try Self.checkReads(stored, as: EvolveB.self, in: store, context: "B reads A, seed \(seed)")
            let records = (0..<300).map { _ in Dyn<EvolveB>.random(using: &rng) }
            try store.write { tx in for record in records { try tx.insert(record) } }
            stored += records.map(\.stored)
            try Self.checkReads(stored, as: EvolveB.self, in: store, context: "B reads A and B, seed \(seed)")
        }
        do {
            let store = try Store.open(at: dir.path, types: [Dyn<EvolveC>.self])
            let records = (0..<300).map { _ in Dyn<EvolveC>.random(using: &rng) }
            try store.write { tx in for record in records { try tx.insert(record) } }
            stored += records.map(\.stored)
            let paths = try Self.checkReads(stored, as: EvolveC.self, in: store, context: "C reads A, B and C, seed \(seed)")
            #expect(paths[.guessedWrong, default: 0] > 0 && paths[.guessedRight, default: 0] > 0, "seed \(seed): \(paths)")
        }
        let store = try Store.open(at: dir.path, types: [Dyn<EvolveB>.self])
        try Self.checkReads(stored, as: EvolveB.self, in: store, context: "B reads A, B and C, seed \(seed)")
        #expect(try store.verify().isClean)
    }

    // MARK: Every kind of field

    /// Every primitive, `Data`, `Date`, `UUID`, `RecordID`, raw-value enums, arrays of
    /// structs, arrays with nils, maps, nested optionals: in order, optionals nil 2 in 5.
    @Test(arguments: [UInt64(201), 202])
    func everyKindRoundTrips(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [AllKinds.self])
        var rng = SeededGenerator(seed: seed)
        let records = (0..<1500).map { _ in AllKinds.random(using: &rng) }
        try store.write { tx in for record in records { try tx.insert(record) } }
        var paths: [DecodePath: Int] = [:]
        for record in records {
            #expect(try store.get(AllKinds.self, id: record.id) == record, "seed \(seed)")
            let decoded = try decodePaths(AllKinds.self, record.id, in: store)
            paths[decoded.path, default: 0] += 1
            #expect(decoded.table == record, "seed \(seed): through the table")
            if decoded.path == .noGuess || decoded.path == .guessedRight { #expect(decoded.firstPass == record, "seed \(seed): \(decoded.path)") }
        }
        #expect(paths[.guessedRight, default: 0] > 0, "seed \(seed): \(paths)")
    }

    /// A type the open cannot probe: fields join the layout in the order first written, an
    /// optional first written nil after fields read after it. Paths: table fallback, guesses
    /// right and wrong.
    @Test(arguments: [UInt64(211), 212])
    func anUnprobedTypeRoundTrips(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Unprobed.self])
        var rng = SeededGenerator(seed: seed)
        var records: [Unprobed] = []
        // Written one transaction at a time in batches, so the layout grows between them.
        // Each batch read back inside its write too, through the layout the write grew.
        for _ in 0..<25 {
            let batch = (0..<40).map { _ in Unprobed.random(using: &rng) }
            try store.write { tx in
                for record in batch { try tx.insert(record) }
                for record in batch {
                    let read = try tx.get(Unprobed.self, id: record.id)
                    #expect(read == record, "seed \(seed): inside the write")
                }
            }
            records += batch
        }
        let names = try #require(try store.read { $0.reader.catalog.schema.type(named: "Unprobed") }).fields.map(\.name)
        var paths: [DecodePath: Int] = [:]
        for record in records {
            #expect(try store.get(Unprobed.self, id: record.id) == record, "seed \(seed), layout \(names)")
            let decoded = try decodePaths(Unprobed.self, record.id, in: store)
            paths[decoded.path, default: 0] += 1
            #expect(decoded.table == record, "seed \(seed)")
        }
        #expect(try store.fetch(FetchDescriptor<Unprobed>()).count == records.count)
        #expect(!paths.isEmpty, "seed \(seed): \(paths), layout \(names)")
    }

    /// Nested keyed and unkeyed containers, filled after the calls that made them, stored where
    /// they were encoded: the typed read meets them in order, and takes the nil optionals after
    /// them for absent without the table (before, it parsed the table at the first container).
    @Test(arguments: [UInt64(221)])
    func nestedContainersReadBack(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Nesting.self])
        var rng = SeededGenerator(seed: seed)
        let records = (0..<400).map { n in
            Nesting(title: "t\(n)", size: Extent(w: Int.random(in: -9...9, using: &rng), h: n),
                    note: Bool.random(using: &rng) ? "note \(n)" : nil, tags: (0..<Int.random(in: 0...3, using: &rng)).map { $0 * n },
                    rank: Bool.random(using: &rng) ? n : nil, done: Bool.random(using: &rng) ? Bool.random(using: &rng) : nil)
        }
        try store.write { tx in for record in records { try tx.insert(record) } }
        for record in records {
            #expect(try store.get(Nesting.self, id: record.id) == record, "seed \(seed)")
            let decoded = try decodePaths(Nesting.self, record.id, in: store)
            #expect(decoded.table == record, "seed \(seed)")
            // Read in order, a nil optional is taken as absent when a later field is stored next:
            // `note` (then `tags` is next), or `rank` with `done` stored.
            let guesses = record.note == nil || (record.rank == nil && record.done != nil)
            #expect(decoded.path == (guesses ? .guessedRight : .noGuess), "seed \(seed): \(record)")
            let generic = try #require(try store.read { try $0.get(typeNamed: "Nesting", id: record.id) })
            #expect(generic.fields["size"] == .map(["w": .int(Int64(record.size.w)), "h": .int(Int64(record.size.h))]), "seed \(seed)")
            #expect(generic.fields["tags"] == .array(record.tags.map { .int(Int64($0)) }), "seed \(seed)")
            #expect(generic.fields["note"] == record.note.map { .string($0) }, "seed \(seed)")
        }
    }

    /// A super decoder of a key the record lacks (stored before the type encoded it) decodes
    /// null, as Foundation's JSONDecoder does: `T?(from:)` reads nil, at the top level and in a
    /// nested value. Records stored with the keys read them back.
    @Test func superDecodersOfMissingKeysDecodeNull() throws {
        let dir = TemporaryDirectory()
        let before = (0..<20).map { LateSupersBefore(name: "b\($0)", inner: LateInnerBefore(w: $0)) }
        do {
            let store = try Store.open(at: dir.path, types: [LateSupersBefore.self])
            try store.write { tx in for record in before { try tx.insert(record) } }
        }
        let store = try Store.open(at: dir.path, types: [LateSupers.self])
        for record in before {
            let read = try #require(try store.get(LateSupers.self, id: record.id))
            #expect(read == LateSupers(name: record.name, extra: nil, note: nil, inner: LateInner(w: record.inner.w, tag: nil)).with(id: record.id))
        }
        let after = (0..<20).map { n in
            LateSupers(name: "a\(n)", extra: n % 2 == 0 ? n : nil, note: n % 3 == 0 ? "note \(n)" : nil,
                       inner: LateInner(w: -n, tag: n % 4 == 0 ? "t\(n)" : nil))
        }
        try store.write { tx in for record in after { try tx.insert(record) } }
        for record in after { #expect(try store.get(LateSupers.self, id: record.id) == record) }
        #expect(try store.verify().isClean)
    }

    /// `superEncoder(forKey:)` / `superDecoder(forKey:)` behind `contains`, and `superDecoder()`:
    /// stored where encoded, so no optional is wrongly taken as absent.
    @Test(arguments: [UInt64(231)])
    func superDecodersReadBack(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Supers.self])
        var rng = SeededGenerator(seed: seed)
        let records = (0..<300).map { n in
            Supers(name: "s\(n)", base: Bool.random(using: &rng) ? Part(name: "b\(n)", weight: nil, sizes: [n]) : nil,
                   inherited: Extent(w: n, h: -n), rank: Bool.random(using: &rng) ? n : nil)
        }
        try store.write { tx in for record in records { try tx.insert(record) } }
        var paths: [DecodePath: Int] = [:]
        for record in records {
            #expect(try store.get(Supers.self, id: record.id) == record, "seed \(seed)")
            let decoded = try decodePaths(Supers.self, record.id, in: store)
            paths[decoded.path, default: 0] += 1
            #expect(decoded.table == record, "seed \(seed)")
        }
        #expect(paths[.guessedWrong] == nil, "seed \(seed): \(paths)")
    }

    // MARK: Guesses, errors and keys the schema lacks

    /// The in-order pass throws because an optional it took as absent (wrongly) is nil: the
    /// read decodes again from the table and succeeds. Paths: guess wrong with a throwing
    /// first pass + re-decode.
    @Test func aFirstPassThatThrowsOnAWrongGuessIsDecodedAgain() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Validating.self])
        let records = [Validating(note: "n", count: 1), Validating(note: nil, count: 2), Validating(note: "", count: 3)]
        try store.write { tx in for record in records { try tx.insert(record) } }
        for record in records {
            #expect(try store.get(Validating.self, id: record.id) == record)
            let decoded = try decodePaths(Validating.self, record.id, in: store)
            if record.note != nil {
                #expect(decoded.firstPass == nil && decoded.path == .guessedWrong, "\(record)")
            } else {
                #expect(decoded.path == .guessedRight, "\(record)")
            }
        }
        #expect(try store.fetch(FetchDescriptor<Validating>()).count == records.count)
    }

    /// A value the reading type cannot hold (an Int too large for an Int8) fails that read
    /// with a StoreError, in the first pass or after a wrong guess, and leaves later reads of
    /// the same snapshot and store sound.
    @Test func aTypeMismatchFailsOneReadAndNotTheNext() throws {
        let dir = TemporaryDirectory()
        let written = [GaugeWide(note: nil, level: 5, label: "ok"), GaugeWide(note: nil, level: 1000, label: "big"),
                       GaugeWide(note: "noted", level: -129, label: "small"), GaugeWide(note: "noted", level: -128, label: "min")]
        do {
            let store = try Store.open(at: dir.path, types: [GaugeWide.self])
            try store.write { tx in for record in written { try tx.insert(record) } }
        }
        let store = try Store.open(at: dir.path, types: [GaugeNarrow.self])
        func narrow(_ record: GaugeWide) -> GaugeNarrow? {
            Int8(exactly: record.level).map { GaugeNarrow(id: record.id, note: record.note, level: $0, label: record.label) }
        }
        try store.read { snapshot in
            for _ in 0..<2 {
                for record in written {
                    if let expected = narrow(record) {
                        let read = try snapshot.get(GaugeNarrow.self, id: record.id)
                        #expect(read == expected)
                    } else {
                        #expect(throws: StoreError.self, "\(record.level)") { try snapshot.get(GaugeNarrow.self, id: record.id) }
                    }
                }
            }
        }
        #expect(throws: StoreError.self) { try store.fetch(FetchDescriptor<GaugeNarrow>()) }
        #expect(try store.get(GaugeNarrow.self, id: written[3].id) == narrow(written[3]))
        let paths = try decodePaths(GaugeNarrow.self, written[2].id, in: store)
        #expect(paths.firstPass == nil && paths.table == nil && paths.path == .guessedWrong)
    }

    /// `contains`, `decodeNil`, `decodeIfPresent` and `decode` on a key the schema lacks, a
    /// field asked for out of order through a second container, and `allKeys` in the middle
    /// of an in-order decode. Paths: keys outside the layout (no state change), table fallback.
    @Test func keysTheSchemaLacksAndASecondContainer() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Asking.self])
        let records = [Asking(a: "plain", b: 1, c: 2, d: "d"), Asking(a: "plain", b: nil, c: 2, d: nil),
                       Asking(a: "ask", b: 1, c: 2, d: "d"), Asking(a: "ask", b: nil, c: 3, d: nil),
                       Asking(a: "ask+keys", b: 1, c: 2, d: "d"), Asking(a: "ask+keys", b: nil, c: 3, d: nil)]
        try store.write { tx in for record in records { try tx.insert(record) } }
        for record in records {
            let read = try #require(try store.get(Asking.self, id: record.id))
            #expect(read.a == record.a && read.b == record.b && read.c == record.c && read.d == record.d, "\(record)")
            var seen = ""
            if record.a.hasPrefix("ask") {
                seen = "contains false, nil true, ifPresent nil, decode throws true, d \(String(describing: record.d))"
                if record.a.hasPrefix("ask+keys") {
                    seen += ", keys \((["a", "c", "id"] + (record.b == nil ? [] : ["b"]) + (record.d == nil ? [] : ["d"])).sorted())"
                }
            }
            #expect(read.seen == seen, "\(record)")
            #expect(try decodePaths(Asking.self, record.id, in: store).table == read)
        }
        // A plain record's decode never leaves the record's order: no guess, nothing wrong.
        #expect(try decodePaths(Asking.self, records[0].id, in: store).path == .noGuess)
    }

    // MARK: Damage

    /// Every field of a record stored twice (right after itself, first, last; with the same
    /// value), and the header's count one off, for types whose reads guess, rereads, slots
    /// 64 and up and explicit nulls: the typed read fails as `.corrupted`, the generic read
    /// fails, `verify` reports it. Paths: damage found by the popcount, by the table's parse
    /// in `finish()`, and in the re-decode after a wrong guess.
    @Test func aFieldStoredTwiceAnywhereIsCorrupted() throws {
        try Self.storeEachFieldTwice(Shuffled12.self, seed: 301)
        try Self.storeEachFieldTwice(Rereads9.self, seed: 302)
        try Self.storeEachFieldTwice(Exactly65.self, seed: 303)
        try Self.storeEachFieldTwice(Defaults10.self, seed: 304)
        try Self.storeEachFieldTwice(InOrder12.self, seed: 305)
        try Self.storeEachFieldTwice(RereadsFirst6.self, seed: 306)
        try Self.storeEachFieldTwice(GuessedThenFound8.self, seed: 307)
    }

    private static func storeEachFieldTwice<P: DynPlan>(_ plan: P.Type, seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Dyn<P>.self])
        var rng = SeededGenerator(seed: seed)
        var record = Dyn<P>.random(using: &rng)
        // Every optional stored but one nil (a default's nil is stored as a null).
        for i in P.fields where record.values[i] == nil { record.values[i] = DynValue.random(kind: i % 4, using: &rng) }
        if let optional = P.fields.first(where: P.isOptional) { record.values[optional] = nil }
        record = Dyn<P>(id: record.id, values: record.values)
        try store.insert(record)
        #expect(try store.get(Dyn<P>.self, id: record.id) == record)
        let env = try Environment.open(path: dir.path)
        let (key, bytes) = try storedRecord(record.id, in: env)
        let parsed = try EncodedRecord(bytes)
        var damages: [(String, [UInt8])] = [
            ("one field more in the header", withFieldCount(bytes, plus: 1)),
            ("one field fewer in the header", withFieldCount(bytes, plus: -1)),
        ]
        var start = RecordFormat.headerSize
        for field in parsed.fields {
            let whole = Array(bytes[start..<field.range.upperBound])   // tag and value
            let tag = field.tag
            var after = withFieldCount(bytes, plus: 1)
            after.insert(contentsOf: whole, at: field.range.upperBound)
            damages.append(("tag \(tag) twice in a row", after))
            var first = withFieldCount(bytes, plus: 1)
            first.insert(contentsOf: whole, at: RecordFormat.headerSize)
            damages.append(("tag \(tag) first and where it was", first))
            damages.append(("tag \(tag) where it was and last", withFieldCount(bytes, plus: 1) + whole))
            start = field.range.upperBound
        }
        for (damage, changed) in damages {
            try replaceRecord(key, with: changed, in: env)
            let context = "\(P.name) seed \(seed): \(damage)"
            do {
                let read = try store.get(Dyn<P>.self, id: record.id)
                Issue.record("\(context): read \(String(describing: read))")
            } catch let error as StoreError {
                #expect(error.code == .corrupted, "\(context): \(error)")
            }
            #expect(throws: StoreError.self, "\(context): the generic read") { try store.read { try $0.get(typeNamed: P.name, id: record.id) } }
            #expect(try !store.verify().isClean, "\(context)")
        }
        try replaceRecord(key, with: bytes, in: env)
        #expect(try store.get(Dyn<P>.self, id: record.id) == record)
    }
}
