import Crypto
import Foundation
import Stash
import StashSync
import StashTestSupport

// The two mutation layers of the delta fuzz run: structured (a decoded `Delta` changed field by
// field, then encoded and signed with the family key, so it reaches the merge) and byte level
// (bytes inside the signed region changed, then the HMAC and the checksum made for them again,
// so it reaches the reader's deep paths). Every choice comes from the iteration's seeded
// generator.

extension SeededGenerator {
    mutating func below(_ n: Int) -> Int { n <= 1 ? 0 : Int(next() % UInt64(n)) }
    mutating func chance(_ percent: Int) -> Bool { below(100) < percent }
    mutating func pick<T>(_ items: [T]) -> T { items[below(items.count)] }
}

/// What the mutator knows about the store that will import the delta.
struct FuzzTarget {
    let receiver: RecordID
    /// The receiver's schema fingerprint (the seeds', made with the same types).
    let fingerprint: [UInt8]
    /// The receiver's wall clock (fixed).
    let now: Date
    let corpus: FuzzCorpus
}

/// A short text for a value in a mutation's description (long strings and nests summarized;
/// never `Date`'s own description, which traps on NaN).
func fuzzText(_ value: FieldValue, depth: Int = 0) -> String {
    if depth > 3, FuzzNesting.depth(value) > 0 {
        let inside = fuzzContains(value, fuzzIsNaNDate) ? ", a NaN date inside" : ""
        return "arrays and maps nested \(FuzzNesting.depth(value)) deep\(inside)"
    }
    switch value {
    case .string(let s) where s.utf8.count > 24: return "string(\(s.utf8.count) bytes)"
    case .bytes(let d): return "bytes(\(d.count))"
    case .date(let d): return "date(\(d.timeIntervalSinceReferenceDate) s since 2001)"
    case .array(let items) where items.count > 4: return "array(\(items.count) items, first \(fuzzText(items[0], depth: depth + 1)))"
    case .array(let items): return "[" + items.map { fuzzText($0, depth: depth + 1) }.joined(separator: ", ") + "]"
    case .map(let entries) where entries.count > 4: return "map(\(entries.count) keys)"
    case .map(let entries):
        return "{" + entries.sorted { $0.key < $1.key }.map { "\($0.key.utf8.count > 24 ? "key(\($0.key.utf8.count) bytes)" : $0.key): \(fuzzText($0.value, depth: depth + 1))" }.joined(separator: ", ") + "}"
    default: return "\(value)"
    }
}

/// How deep arrays and maps nest in a value (0 for a scalar).
enum FuzzNesting {
    static func depth(_ value: FieldValue) -> Int {
        switch value {
        case .array(let items): return 1 + (items.map(depth).max() ?? 0)
        case .map(let entries): return 1 + (entries.values.map(depth).max() ?? 0)
        default: return 0
        }
    }
}

enum FuzzValues {
    static func date(_ seconds: Double) -> FieldValue { .date(Date(timeIntervalSinceReferenceDate: seconds)) }

    /// Dates no clock makes: not finite, past any calendar, at the edges of `Double`.
    static let oddDates: [FieldValue] = [
        date(.nan), date(.infinity), date(-.infinity), date(Double(bitPattern: 0x7FF8_0000_0000_0001)), date(-.nan),
        date(1e300), date(-1e300), date(.greatestFiniteMagnitude), date(.leastNonzeroMagnitude), date(-0.0),
        date(253_402_300_800), date(-63_113_904_000), date(1e14), date(-1e14), date(9.2e18),
    ]
    static let oddDoubles: [FieldValue] = [
        .double(.nan), .double(.infinity), .double(-.infinity), .double(-0.0), .double(.greatestFiniteMagnitude),
        .double(-.greatestFiniteMagnitude), .double(.leastNonzeroMagnitude), .double(Double(bitPattern: 0x7FF0_0000_0000_0001)),
        .double(9.2e18), .double(1.5), .double(-1.5), .double(Double(Int64.max)),
    ]
    static let oddInts: [FieldValue] = [.int(.min), .int(.max), .int(0), .int(-1), .int(1 << 53 + 1), .int(Int64(Int32.max) + 1)]
    static let oddStrings: [FieldValue] = [
        .string(""), .string("id"), .string("\u{0}"), .string("e\u{301}"), .string("\u{E9}"), .string(String(repeating: "x", count: 119) + "é"),
        .string(String(repeating: "long", count: 40) + "a"), .string(String(repeating: "long", count: 40) + "b"),
        .string(String(repeating: "🙂", count: 3000)), .string("NaN"), .string("lots"), .string("2026-01-01T00:00:00Z"),
    ]
    static let oddOthers: [FieldValue] = [
        .null, .bool(true), .bytes(Data()), .bytes(Data(repeating: 0xAB, count: 5000)), .uuid(UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))),
        .uuid(UUID(uuidString: "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF")!), .array([]), .map([:]), .map(["": .null]), .map(["$date": .string("x")]),
    ]

    static func odd(_ rng: inout SeededGenerator) -> FieldValue {
        switch rng.below(5) {
        case 0: return rng.pick(oddDates)
        case 1: return rng.pick(oddDoubles)
        case 2: return rng.pick(oddInts)
        case 3: return rng.pick(oddStrings)
        default: return rng.pick(oddOthers)
        }
    }

    /// A plain value of a random kind.
    static func plain(_ rng: inout SeededGenerator) -> FieldValue {
        switch rng.below(9) {
        case 0: return .bool(rng.chance(50))
        case 1: return .int(Int64(rng.below(2000)) - 1000)
        case 2: return .double(Double(rng.below(100_000)) / 64)
        case 3: return .string(rng.pick(["Lamp", "Home 1", "red", "s0", "bob", "dora", "clash", "tag1"]))
        case 4: return .bytes(Data((0..<rng.below(8)).map { _ in UInt8(rng.below(256)) }))
        case 5: return .uuid(fuzzID(UInt64(rng.below(8)), UInt64(rng.below(8))).uuid)
        case 6: return date(Double(rng.below(2_000_000_000)) - 1e9)
        case 7: return .array((0..<rng.below(4)).map { _ in .int(Int64(rng.below(10))) })
        default: return .map(["k\(rng.below(3))": .string("v")])
        }
    }

    /// Any value: plain or odd, sometimes nested in arrays and maps (odd values inside them).
    static func any(_ rng: inout SeededGenerator, depth: Int = 0) -> FieldValue {
        if depth < 3 && rng.chance(25) { return nested(&rng, depth: depth) }
        return rng.chance(55) ? odd(&rng) : plain(&rng)
    }

    static func nested(_ rng: inout SeededGenerator, depth: Int = 0) -> FieldValue {
        let count = 1 + rng.below(4)
        if rng.chance(50) {
            return .array((0..<count).map { _ in any(&rng, depth: depth + 1) })
        }
        var map: [String: FieldValue] = [:]
        for n in 0..<count { map[rng.pick(["k\(n)", "", "$date", "$double", "sites", "increments", String(repeating: "m", count: 200)])] = any(&rng, depth: depth + 1) }
        return .map(map)
    }

    /// Arrays nested `depth` deep around `inner` (the reader refuses more than 100).
    static func deep(_ depth: Int, _ inner: FieldValue) -> FieldValue {
        var value = inner
        for n in 0..<depth { value = n % 2 == 0 ? .array([value]) : .map(["d": value]) }
        return value
    }

    /// A counter state as `Counter` encodes it.
    static func counter(_ sites: [(String, FieldValue, FieldValue)]) -> FieldValue {
        var perSite: [String: FieldValue] = [:]
        for (site, increments, decrements) in sites { perSite[site] = .map(["increments": increments, "decrements": decrements]) }
        return .map(["sites": .map(perSite)])
    }

    /// Counter states `put` refuses or no `Counter` holds, and edge cases it takes: named for
    /// the description.
    static func oddCounter(_ rng: inout SeededGenerator) -> (String, FieldValue) { rng.pick(oddCounters) }

    static let oddCounters: [(String, FieldValue)] = {
        let a = FuzzCorpus.siteA.description, b = FuzzCorpus.siteB.description
        return [
            ("string", .string("lots")), ("int", .int(5)), ("fraction", .double(1.5)), ("array", .array([.int(1)])), ("empty map", .map([:])),
            ("no sites", .map(["site": .map([:])])), ("sites a string", .map(["sites": .string("x")])),
            ("fraction total", counter([(a, .double(1.5), .int(0))])),
            ("NaN double total", counter([(a, .double(.nan), .int(0))])),
            ("infinite double total", counter([(a, .double(.infinity), .int(0))])),
            ("huge double total", counter([(a, .double(1e300), .int(0))])),
            ("NaN date total", counter([(a, date(.nan), .int(0))])),
            ("NaN date decrements", counter([(a, .int(1), date(.nan))])),
            ("infinite date total", counter([(a, date(.infinity), .int(0))])),
            ("finite date total", counter([(a, date(12), .int(0))])),
            ("string total", counter([(a, .string("3"), .int(0))])),
            ("null total", counter([(a, .null, .int(0))])),
            ("missing decrements", .map(["sites": .map([a: .map(["increments": .int(3)])])])),
            ("missing increments", .map(["sites": .map([a: .map(["decrements": .int(3)])])])),
            ("totals a list", .map(["sites": .map([a: .array([.int(1), .int(2)])])])),
            ("negative totals", counter([(a, .int(-5), .int(-7))])),
            ("Int64.max on two sites", counter([(a, .int(.max), .int(0)), (b, .int(.max), .int(0))])),
            ("Int64.min decrements", counter([(a, .int(0), .int(.min))])),
            ("bad site id", counter([("not-a-site", .int(4), .int(0))])),
            ("empty site id", counter([("", .int(4), .int(0))])),
            ("site id upper case", counter([(a.uppercased(), .int(4), .int(0)), (a, .int(4), .int(0))])),
            ("long site id", counter([(String(repeating: "s", count: 5000), .int(1), .int(0))])),
            ("extra key", .map(["sites": .map([:]), "extra": .int(1)])),
            ("extra total key", .map(["sites": .map([a: .map(["increments": .int(1), "decrements": .int(0), "x": date(.nan)])])])),
            ("nested NaN date", .map(["sites": .map([a: .map(["increments": .int(1), "decrements": .array([date(.nan)])])])])),
            ("many sites", counter((0..<300).map { (fuzzID(9, UInt64($0)).description, .int(1), .int(0)) })),
            ("valid", counter([(a, .int(10), .int(3)), (b, .int(2), .int(0))])),
        ]
    }()
}

/// The interesting clocks of a version: the ends of the range, the clock range limit, the far
/// future, just ahead of the receiver's clock and just behind.
func fuzzClocks(_ now: Date) -> [(String, UInt64)] {
    let reading = UInt64(now.timeIntervalSince1970 * 1000) << 16
    let minute: UInt64 = 60_000 << 16
    let year2200 = UInt64(7_258_118_400_000) << 16
    return [
        ("0", 0), ("1", 1), ("maximumClock", Version.maximumClock), ("maximumClock+1", Version.maximumClock + 1),
        ("UInt64.max", .max), ("UInt64.max-1", .max - 1), ("year 2200", year2200), ("now+3min", reading + 3 * minute),
        ("now+1min", reading + minute), ("now", reading), ("now-1h", reading - 60 * minute), ("2^63", 1 << 63),
    ]
}

enum FuzzStructured {
    /// Changes `delta` by 1 to 4 mutations; returns what they did, in words.
    static func mutate(_ delta: inout Delta, _ rng: inout SeededGenerator, _ target: FuzzTarget) -> [String] {
        var done: [String] = []
        for _ in 0..<(1 + rng.below(4)) {
            done.append(rng.chance(78) ? mutateEntries(&delta, &rng, target) : mutateHeader(&delta, &rng, target))
        }
        // A fingerprint unlike the receiver's: the import then checks each entry against its schema.
        if rng.chance(20) {
            delta.schemaFingerprint = (0..<32).map { _ in UInt8(rng.below(256)) }
            done.append("fingerprint := random (not the receiver's)")
        }
        return done
    }

    private static func fieldNames(of type: String) -> [String] {
        switch type {
        case "Home": return ["name", "rooms", "built", "note", "area"]
        case "Item": return ["homeID", "name", "weight", "purchased", "tags", "attributes", "photo", "wearCount"]
        case "Account": return ["handle", "credits", "joined", "limits"]
        case "Reading": return ["sensor", "value", "at", "samples", "flags"]
        default: return ["name", "x"]
        }
    }

    private static func label(_ e: RecordState) -> String { "\(e.type) \(e.id.description.suffix(6))" }

    private static func version(_ rng: inout SeededGenerator, _ target: FuzzTarget, near: Version?) -> (String, Version) {
        var clocks = fuzzClocks(target.now)
        if let near { clocks += [("same clock", near.clock), ("clock+1", near.clock &+ 1), ("clock-1", near.clock &- 1)] }
        let (clockName, clock) = rng.pick(clocks)
        let sites: [(String, RecordID)] = [
            ("source", near?.site ?? FuzzCorpus.siteA), ("A", FuzzCorpus.siteA), ("B", FuzzCorpus.siteB), ("receiver", target.receiver),
            ("zero", RecordID(high: 0, low: 0)), ("max", RecordID(high: .max, low: .max)), ("random", fuzzID(0xE, UInt64(rng.below(1000)))),
        ]
        let (siteName, site) = rng.pick(sites)
        return ("\(clockName)@\(siteName)", Version(clock: clock, site: site))
    }

    private static func mutateEntries(_ delta: inout Delta, _ rng: inout SeededGenerator, _ target: FuzzTarget) -> String {
        if delta.entries.isEmpty {
            delta.entries = target.corpus.bases[1].delta.entries
            return "entries := those of the second delta"
        }
        let n = rng.below(delta.entries.count)
        var e = delta.entries[n]
        let what = label(e)
        // Written back unless the mutation rearranged the entries itself.
        var writeBack = true
        defer { if writeBack { delta.entries[n] = e } }
        let names = fieldNames(of: e.type)
        let anyVersion = e.fields.values.first?.version ?? e.incarnation ?? Version(clock: 1, site: FuzzCorpus.siteA)
        switch rng.below(17) {
        case 0, 1:
            let name = rng.chance(80) ? rng.pick(names) : rng.pick(["extra", "id", "", "credits"])
            let value = FuzzValues.any(&rng)
            e.fields[name] = FieldState(value: value, version: e.fields[name]?.version ?? anyVersion)
            return "\(what).\(name) := \(fuzzText(value))"
        case 2:
            // Odd values inside an array or map field, or a field nested deeply.
            let name = rng.pick(names)
            let inner = FuzzValues.odd(&rng)
            let value: FieldValue
            switch rng.below(4) {
            case 0: value = .array([FuzzValues.plain(&rng), inner, FuzzValues.plain(&rng)])
            case 1: value = .map(["a": inner, "b": FuzzValues.plain(&rng)])
            case 2: value = FuzzValues.deep(rng.pick([2, 99, 100, 101]), inner)
            default: value = FuzzValues.nested(&rng)
            }
            e.fields[name] = FieldState(value: value, version: e.fields[name]?.version ?? anyVersion)
            return "\(what).\(name) := \(fuzzText(value))"
        case 3, 4:
            let (kind, value) = FuzzValues.oddCounter(&rng)
            let name = rng.chance(85) || e.type != "Account" ? "credits" : rng.pick(names)
            e.fields[name] = FieldState(value: value, version: e.fields[name]?.version ?? anyVersion)
            return "\(what).\(name) := counter state (\(kind)) \(fuzzText(value))"
        case 5:
            guard let name = e.fields.keys.sorted().randomElement(using: &rng) else { return "no field to rename in \(what)" }
            let new = rng.pick(["extra", "id", "", "ID", "Name", "name ", String(repeating: "f", count: 300), "name\u{0}", "e\u{301}"]
                               + names + fieldNames(of: rng.pick(fuzzSyncedTypeNames)))
            let state = e.fields.removeValue(forKey: name)!
            e.fields[new] = state
            return "\(what): field \(name) renamed \(new.utf8.count > 24 ? "(\(new.utf8.count) bytes)" : new)"
        case 6:
            guard let name = e.fields.keys.sorted().randomElement(using: &rng) else { return "no field to remove in \(what)" }
            if rng.chance(20) { e.fields = [:]; return "\(what): every field removed" }
            e.fields[name] = rng.chance(50) ? nil : FieldState(value: .null, version: e.fields[name]!.version)
            return "\(what).\(name) removed or null"
        case 7, 8:
            // A version: of a field, the incarnation or the tombstone.
            let (vText, v) = version(&rng, target, near: anyVersion)
            let field = e.fields.keys.sorted().randomElement(using: &rng)
            switch rng.below(3) {
            case 0 where field != nil:
                e.fields[field!]!.version = v
                return "\(what).\(field!) version := \(vText)"
            case 0, 1:
                e.incarnation = v
                return "\(what) incarnation := \(vText)"
            default:
                e.tombstone = v
                return "\(what) tombstone := \(vText)"
            }
        case 9:
            // Tombstone and incarnation combinations.
            let inc = e.incarnation ?? anyVersion
            let later = Version(clock: inc.clock &+ 1 << 16, site: inc.site)
            let earlier = Version(clock: inc.clock &- 1, site: inc.site)
            switch rng.below(7) {
            case 0: e.tombstone = later; return "\(what) deleted after its insert (fields kept)"
            case 1: e.tombstone = inc; return "\(what) tombstone == incarnation"
            case 2: e.tombstone = earlier; return "\(what) tombstone just before its insert (re-insert)"
            case 3: e.incarnation = nil; return "\(what) incarnation removed (fields kept)"
            case 4: e.incarnation = nil; e.tombstone = nil; return "\(what) neither incarnation nor tombstone"
            case 5: e.tombstone = later; e.incarnation = Version(clock: later.clock &+ 1, site: inc.site); e.fields = e.fields.mapValues { FieldState(value: $0.value, version: Version(clock: later.clock &+ 1, site: inc.site)) }
                return "\(what) re-inserted after a delete"
            default: e.tombstone = nil; return "\(what) tombstone removed"
            }
        case 10:
            // The same record twice, the copy changed.
            writeBack = false
            var copy = e
            let (vText, v) = version(&rng, target, near: anyVersion)
            if let name = copy.fields.keys.sorted().randomElement(using: &rng), rng.chance(60) {
                copy.fields[name] = FieldState(value: rng.chance(50) ? FuzzValues.any(&rng) : copy.fields[name]!.value, version: v)
            } else {
                copy.incarnation = v
            }
            delta.entries.insert(copy, at: rng.below(delta.entries.count + 1))
            return "\(what) twice, the copy at \(vText)"
        case 11:
            let ids = FuzzCorpus.homes + FuzzCorpus.items + FuzzCorpus.accounts + [FuzzCorpus.localAccount, FuzzCorpus.localHome]
                + delta.entries.map(\.id) + [RecordID(high: 0, low: 0), RecordID(high: .max, low: .max)]
            e.id = rng.pick(ids)
            return "\(what) id := \(e.id)"
        case 12:
            e.type = rng.pick(["Ghost", "", "Draft", "id", "home", "Home ", String(repeating: "T", count: 400)] + fuzzSyncedTypeNames)
            return "\(what) type := \(e.type.utf8.count > 24 ? "(\(e.type.utf8.count) bytes)" : e.type)"
        case 13:
            // Unique handles: one the receiver holds, another entry's, or a long shared prefix.
            let handle = rng.pick(FuzzCorpus.handles + [String(repeating: "h", count: 130) + "1", String(repeating: "h", count: 130) + "2", ""])
            e.type = rng.chance(80) ? "Account" : e.type
            e.fields["handle"] = FieldState(value: .string(handle), version: e.fields["handle"]?.version ?? anyVersion)
            return "\(what).handle := \(handle.count > 24 ? "(\(handle.count) chars)" : handle)"
        case 14:
            writeBack = false
            switch rng.below(4) {
            case 0: delta.entries.remove(at: n); return "entry \(what) dropped"
            case 1: delta.entries.shuffle(using: &rng); return "entries shuffled"
            case 2: delta.entries = []; return "entries := none"
            default: delta.entries.reverse(); return "entries reversed"
            }
        case 15:
            let other = rng.pick(target.corpus.bases).delta.entries
            guard !other.isEmpty else { return "nothing to borrow" }
            writeBack = false
            let borrowed = rng.pick(other)
            delta.entries.insert(borrowed, at: rng.below(delta.entries.count + 1))
            return "entry \(label(borrowed)) of another delta added"
        default:
            // A field of another type's kind (same name on another type).
            let otherType = rng.pick(fuzzSyncedTypeNames)
            guard let donor = target.corpus.bases[2].delta.entries.first(where: { $0.type == otherType && !$0.fields.isEmpty }),
                  let name = donor.fields.keys.sorted().randomElement(using: &rng) else { return "no donor" }
            e.fields[name] = donor.fields[name]
            return "\(what).\(name) := \(otherType).\(name)'s value \(fuzzText(donor.fields[name]!.value))"
        }
    }

    private static func mutateHeader(_ delta: inout Delta, _ rng: inout SeededGenerator, _ target: FuzzTarget) -> String {
        switch rng.below(8) {
        case 0:
            let ranges: [(UInt64, UInt64)] = [(0, 0), (1, 0), (2, 5), (1, .max), (.max, .max), (5, 1), (0, .max), (1, 1 << 40)]
            (delta.from, delta.to) = rng.pick(ranges)
            return "range := \(delta.from)...\(delta.to)"
        case 1:
            delta.isFullSnapshot.toggle()
            return "full snapshot := \(delta.isFullSnapshot)"
        case 2:
            let choices: [(String, RecordID?)] = [("receiver", target.receiver), ("another store", fuzzID(0xD, 1)), ("the source", delta.source), ("none", nil)]
            let (name, recipient) = rng.pick(choices)
            delta.recipient = recipient
            return "recipient := \(name)"
        case 3:
            delta.family = rng.chance(50) ? fuzzID(0xF, 2) : RecordID(high: 0, low: 0)
            return "family := another"
        case 4:
            let choices: [(String, [UInt8])] = [("receiver's", target.fingerprint), ("zeros", [UInt8](repeating: 0, count: 32)), ("31 bytes", Array(target.fingerprint.prefix(31))),
                                                ("random", (0..<32).map { _ in UInt8(rng.below(256)) })]
            let (name, fingerprint) = rng.pick(choices)
            delta.schemaFingerprint = fingerprint
            return "fingerprint := \(name)"
        case 5:
            let choices: [(String, RecordID)] = [("receiver", target.receiver), ("A (already applied)", FuzzCorpus.siteA), ("zero", RecordID(high: 0, low: 0))]
            let (name, source) = rng.pick(choices)
            delta.source = source
            return "source := \(name)"
        case 6:
            let seconds = rng.pick([Double.nan, .infinity, -.infinity, 0, 1e300, -1e300])
            delta.created = Date(timeIntervalSinceReferenceDate: seconds)
            return "created := \(seconds)"
        default:
            let choices: [(String, [String: Set<String>]?)] = [
                ("nil (format 1)", nil), ("none", [:]), ("Home.name", ["Account": ["credits"], "Home": ["name"]]), ("Ghost.x", ["Account": ["credits"], "Ghost": ["x"]]),
                ("Account.credits+handle", ["Account": ["credits", "handle"]]), ("Account: none", ["Account": []]),
            ]
            let (name, counters) = rng.pick(choices)
            delta.counterFields = counters
            return "counter fields := \(name)"
        }
    }
}

enum FuzzBytes {
    /// The bytes of a delta that its HMAC and checksum sign (after the magic, before the HMAC).
    static func signedRange(_ bytes: [UInt8]) -> Range<Int> {
        let tail = bytes[5] & 1 != 0 ? 64 : 32
        return 4..<(bytes.count - tail)
    }

    /// Changes 1 to 4 places of the signed region, then signs again with `key` (see ``reseal(_:key:)``).
    static func mutate(_ data: Data, _ rng: inout SeededGenerator, key: [UInt8]) -> (Data, [String]) {
        var bytes = [UInt8](data)
        let region = signedRange(bytes)
        var body = Array(bytes[..<region.upperBound])
        var done: [String] = []
        for _ in 0..<(1 + rng.below(4)) {
            let lower = 4
            // Mostly past the fixed header (94 bytes): tables and entries.
            let position = rng.chance(85) && body.count > 100 ? 94 + rng.below(body.count - 94) : lower + rng.below(max(1, body.count - lower))
            guard position < body.count else { continue }
            switch rng.below(10) {
            case 0:
                let bit = rng.below(8)
                body[position] ^= 1 << bit
                done.append("bit \(bit) of byte \(position) flipped")
            case 1:
                let value = rng.chance(50) ? UInt8(rng.below(256)) : rng.pick([0, 1, 0x7F, 0x80, 0xFF, 8, 9, 10, 11, 12, 0x3F])
                body[position] = value
                done.append("byte \(position) := \(value)")
            case 2:
                let inserted = (0..<(1 + rng.below(8))).map { _ in UInt8(rng.below(256)) }
                body.insert(contentsOf: inserted, at: position)
                done.append("\(inserted.count) bytes inserted at \(position)")
            case 3:
                let count = min(1 + rng.below(8), body.count - position)
                body.removeSubrange(position..<position + count)
                done.append("\(count) bytes deleted at \(position)")
            case 4:
                let count = min(1 + rng.below(32), body.count - position)
                let copy = Array(body[position..<position + count])
                let at = lower + rng.below(body.count - lower)
                body.insert(contentsOf: copy, at: at)
                done.append("\(count) bytes at \(position) duplicated at \(at)")
            case 5:
                let bomb = [UInt8](repeating: 0xFF, count: 1 + rng.below(10)) + [rng.pick([0x01, 0x7F, 0x00])]
                body.replaceSubrange(position..<min(body.count, position + 1), with: bomb)
                done.append("varint of \(bomb.count) bytes at \(position)")
            case 6:
                let double = rng.pick([Double.nan, .infinity, -.infinity, 1e300, -0.0, .greatestFiniteMagnitude])
                let raw = withUnsafeBytes(of: double.bitPattern.littleEndian) { Array($0) }
                let end = min(body.count, position + 8)
                body.replaceSubrange(position..<end, with: raw.prefix(end - position))
                done.append("\(double) written over bytes \(position)..<\(end)")
            case 7:
                let count = min(1 + rng.below(64), body.count - lower)
                body.removeLast(count)
                done.append("last \(count) signed bytes cut")
            case 8:
                let count = min(1 + rng.below(16), body.count - position)
                let at = lower + rng.below(body.count - lower)
                let width = min(count, body.count - at)
                if width > 0 {
                    let first = Array(body[position..<position + width]), second = Array(body[at..<at + width])
                    body.replaceSubrange(at..<at + width, with: first)
                    body.replaceSubrange(position..<position + width, with: second)
                }
                done.append("\(width) bytes at \(position) and \(at) swapped")
            default:
                // A kind byte followed by a big count: a value that claims more than there is.
                let kind = UInt8(rng.pick([5, 6, 9, 10]))
                body.insert(contentsOf: [kind, 0xFF, 0xFF, 0xFF, 0x0F], at: position)
                done.append("kind \(kind) with a huge count inserted at \(position)")
            }
        }
        bytes = body
        return (reseal(bytes, key: key), done)
    }

    /// `signed` (everything a delta's HMAC covers) with its HMAC, when its flags ask for one, and
    /// its SHA-256 checksum, made as ``Delta/encoded(key:)`` makes them.
    static func reseal(_ signed: [UInt8], key: [UInt8]) -> Data {
        var bytes = signed
        if bytes.count > 5, bytes[5] & 1 != 0 {
            bytes.append(contentsOf: HMAC<SHA256>.authenticationCode(for: bytes, using: SymmetricKey(data: key)))
        }
        bytes.append(contentsOf: SHA256.hash(data: bytes))
        return Data(bytes)
    }
}

/// The bytes of the family's sync key (and of another one): the fuzz run holds them, as every
/// member of a family does, so it signs what it forges.
enum FuzzKeyBytes {
    static let family: [UInt8] = (0..<32).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
    static let wrong: [UInt8] = (0..<32).map { UInt8(truncatingIfNeeded: $0 &* 11 &+ 5) }
}
