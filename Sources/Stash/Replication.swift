import Foundation
import StashLMDB

/// The version of a write: a hybrid-logical-clock reading and the site that made it.
/// Versions are totally ordered (clock, then site), so every replica resolves a conflict the
/// same way.
public struct Version: Comparable, Hashable, Sendable, CustomStringConvertible {
    /// Milliseconds since 1970 in the high 48 bits, a logical counter in the low 16.
    public let clock: UInt64
    public let site: RecordID

    public init(clock: UInt64, site: RecordID) {
        self.clock = clock
        self.site = site
    }

    public static func < (lhs: Version, rhs: Version) -> Bool {
        (lhs.clock, lhs.site) < (rhs.clock, rhs.site)
    }

    /// The wall-clock part.
    public var date: Date { Date(timeIntervalSince1970: Double(clock >> 16) / 1000) }

    /// The highest clock a merged version may carry: 2³² below the end of the clock's range.
    /// A version past it comes from a broken clock or a forged delta, and is refused (merging
    /// it would leave local writes unable to make a newer version); below it, every local
    /// write can still make one (each write adds at most 1 to the clock it overwrites).
    public static let maximumClock: UInt64 = .max - (1 << 32)

    /// True when the version's clock is within ``maximumClock``.
    public var isWithinClockRange: Bool { clock <= Self.maximumClock }

    public var description: String { "\(clock >> 16).\(clock & 0xFFFF)@\(site.description.prefix(8))" }
}

/// A hybrid logical clock reading for `date` with logical part 0.
func clockReading(_ date: Date) -> UInt64 {
    UInt64(max(0, date.timeIntervalSince1970 * 1000)) << 16
}


/// How far ahead of local wall time a remote clock is followed (2 minutes). A store's
/// clock never jumps further because of a device with a wrong clock; and since every local
/// write beats the version it overwrites, such a device's writes lose to any later edit.
public let maximumClockSkew: TimeInterval = 120

/// A counter that merges across replicas without losing or double-counting changes: each
/// site keeps its own running totals of increments and decrements (a PN-counter), and a merge
/// takes the larger total per site. Use it for credits and other balances.
///
/// ```swift
/// struct Wallet: Record { var id = RecordID(); var credits = Counter() }
/// try store.write { tx in
///     try tx.update(Wallet.self, id: walletID) { $0.credits.add(-1, site: tx.siteID) }
/// }
/// ```
public struct Counter: Codable, Sendable, Hashable, CustomStringConvertible {
    /// Per site (id text): total increments and total decrements, both only ever growing.
    public private(set) var sites: [String: Totals]

    public struct Totals: Codable, Sendable, Hashable {
        public var increments: Int64
        public var decrements: Int64
    }

    public init() { sites = [:] }

    /// The sum of every site's increments minus decrements, held within `Int64`: a sum past
    /// its range (only a forged state carries one) gives `Int64.max` or `.min`, not a trap.
    public var value: Int64 {
        let sum = sites.values.reduce(Int128(0)) { $0 + Int128($1.increments) - Int128($1.decrements) }
        return Int64(clamping: sum)
    }

    /// Adds `amount` (negative to subtract) on behalf of `site` (the writing store's site id).
    /// Totals stop at `Int64.max`.
    public mutating func add(_ amount: Int64, site: RecordID) {
        var totals = sites[site.description] ?? Totals(increments: 0, decrements: 0)
        if amount >= 0 {
            totals.increments = saturating(totals.increments, plus: amount)
        } else {
            totals.decrements = saturating(totals.decrements, plus: saturating(negating: amount))
        }
        sites[site.description] = totals
    }

    /// The join of two counters: per site, the larger totals.
    public func merged(with other: Counter) -> Counter {
        var result = self
        for (site, theirs) in other.sites {
            let mine = result.sites[site] ?? Totals(increments: 0, decrements: 0)
            result.sites[site] = Totals(increments: max(mine.increments, theirs.increments),
                                        decrements: max(mine.decrements, theirs.decrements))
        }
        return result
    }

    public var description: String { "\(value)" }

    /// Why `value` is not a counter's state as a ``Counter`` stores it — `{"sites": {SITE:
    /// {"increments": n, "decrements": m}}}`, each site a non-empty text and each total a
    /// whole number of at least 0 (totals only grow from 0) — or nil when it is one. What a
    /// counter field holds must pass: a typed read of the record, and every merge of the
    /// field, fail on anything else. O(sites).
    public static func problem(in value: FieldValue) -> String? {
        guard case .map(let top) = value else { return "\(value.kind?.rawValue ?? "null") instead of a map" }
        guard top.count == 1, case .map(let sites)? = top["sites"] else {
            return "not a map holding \"sites\" alone (keys: \(top.keys.sorted().joined(separator: ", ")))"
        }
        for (site, totals) in sites {
            guard !site.isEmpty else { return "a site with an empty name" }
            guard case .map(let entries) = totals, entries.count == 2,
                  case .int(let increments)? = entries["increments"], case .int(let decrements)? = entries["decrements"] else {
                return "site \(site.prefix(40)): not {\"increments\": n, \"decrements\": m} with whole numbers"
            }
            guard increments >= 0, decrements >= 0 else { return "site \(site.prefix(40)): a negative total" }
        }
        return nil
    }
}

/// `a + b`, or the end of `Int64`'s range it passed.
private func saturating(_ a: Int64, plus b: Int64) -> Int64 {
    let (sum, overflow) = a.addingReportingOverflow(b)
    return overflow ? (b > 0 ? .max : .min) : sum
}

/// `-a`, with `-Int64.min` held at `Int64.max`.
private func saturating(negating a: Int64) -> Int64 { a == .min ? .max : -a }

/// A record a merge deleted because another record of its type holds the same value of a
/// unique index (``StoreTransaction/settleUniqueClashes()``). Every replica settles a clash the
/// same way: the record with the smallest id keeps the value.
public struct UniqueClash: Sendable, Hashable, CustomStringConvertible {
    /// The record type.
    public let type: String
    /// The record deleted.
    public let removed: RecordID
    /// The record that keeps the value.
    public let kept: RecordID
    /// The unique index the two records clashed on (its fields joined with "+").
    public let index: String

    public init(type: String, removed: RecordID, kept: RecordID, index: String) {
        self.type = type
        self.removed = removed
        self.kept = kept
        self.index = index
    }

    public var description: String {
        "\(type) \(removed) deleted: \(type) \(kept) holds the same \(index) (unique)"
    }
}

/// The replicated state of one record: its field values with their versions, the version
/// of the insert that created this incarnation, and the newest delete seen for its id.
///
/// `merged(with:)` is a join (commutative, associative, idempotent), which is why replicas
/// that exchange states in any order, with duplicates, converge:
/// - fields of the same incarnation: the higher version wins per field (counters merge);
/// - a delete removes every incarnation inserted before it, whatever edits they received
///   later (a delete is never undone by a concurrent or later edit);
/// - an insert with a version newer than the delete (a re-insert of the same id) starts a new
///   incarnation whose fields replace the old ones.
public struct RecordState: Sendable, Equatable {
    public var type: String
    public var id: RecordID
    /// The insert that created the current incarnation (nil: only a delete is known).
    public var incarnation: Version?
    /// The newest delete of this id.
    public var tombstone: Version?
    public var fields: [String: FieldState]

    public init(type: String, id: RecordID, incarnation: Version?, tombstone: Version?, fields: [String: FieldState]) {
        self.type = type
        self.id = id
        self.incarnation = incarnation
        self.tombstone = tombstone
        self.fields = fields
    }

    /// True when the record exists in this state.
    public var exists: Bool {
        guard let incarnation else { return false }
        return tombstone.map { incarnation > $0 } ?? true
    }

    /// The newest version anywhere in the state.
    ///
    /// O(fields), no allocation: called once per record a delta merges.
    public var latestVersion: Version? {
        var latest = incarnation
        if let tombstone, latest.map({ tombstone > $0 }) ?? true { latest = tombstone }
        for field in fields.values where latest.map({ field.version > $0 }) ?? true { latest = field.version }
        return latest
    }

    /// The join of two states of the same record; `counters` names counter fields.
    public func merged(with other: RecordState, counters: Set<String>) -> RecordState {
        var result = self
        if let theirs = other.tombstone, tombstone.map({ theirs > $0 }) ?? true { result.tombstone = theirs }
        switch (incarnation, other.incarnation) {
        case (nil, _):
            result.incarnation = other.incarnation
            result.fields = other.fields
        case (_, nil):
            break
        case (let mine?, let theirs?) where mine == theirs:
            for (name, theirField) in other.fields {
                guard let myField = result.fields[name] else {
                    result.fields[name] = theirField
                    continue
                }
                if counters.contains(name), let merged = mergeCounters(myField, theirField) {
                    result.fields[name] = merged
                } else if theirField.version > myField.version {
                    result.fields[name] = theirField
                }
            }
        case (let mine?, let theirs?):
            if theirs > mine {
                result.incarnation = theirs
                result.fields = other.fields
            }
        }
        if !result.exists { result.fields = [:] }
        return result
    }

    private func mergeCounters(_ a: FieldState, _ b: FieldState) -> FieldState? {
        guard let x = try? TreeDecoder.decode(Counter.self, from: a.value),
              let y = try? TreeDecoder.decode(Counter.self, from: b.value),
              let value = try? FieldValue(encoding: x.merged(with: y)) else { return nil }
        return FieldState(value: value, version: max(a.version, b.version))
    }
}

/// One field's value and the version of the write that set it.
public struct FieldState: Sendable, Equatable {
    public var value: FieldValue
    public var version: Version
    public init(value: FieldValue, version: Version) {
        self.value = value
        self.version = version
    }
}

/// The stored versions of one record (database `versions`, key = record key):
/// `[1] [flags] [distinct versions] [incarnation?] [tombstone?] [field count] {[tag] [version index]}`,
/// or, for a record that carries fields its schema does not hold (``carried``), `[2]`, the
/// same, then `[carried count] {[name] [version index] [value]}` with names in order.
/// Fields written in one transaction share a version, so each record stores each distinct
/// version once and one small index per field.
struct RecordVersions: Equatable {
    var incarnation: Version?
    var tombstone: Version?
    var fields: FieldVersions
    /// Field values this replica received but does not store in the record: a name its schema
    /// does not declare (another version of the app declares it), or a value of another kind
    /// than the field's here. Kept with their versions and sent on, as protobuf keeps unknown
    /// fields, so that no replica loses what another wrote; a later declaration reads them.
    /// For a record of a type the schema does not declare, every field is carried.
    var carried: [String: FieldState] = [:]

    func encoded() -> [UInt8] {
        var w = ByteWriter(capacity: 64)
        encode(into: &w)
        return w.bytes
    }

    /// True when the record exists in these versions: inserted after its last delete.
    var exists: Bool {
        guard let incarnation else { return false }
        return tombstone.map { incarnation > $0 } ?? true
    }

    /// ``encoded()`` appended to `w` (a writer the caller reuses).
    func encode(into w: inout ByteWriter) {
        var scratch = EncodingScratch()
        encode(into: &w, reusing: &scratch)
    }

    /// The array ``encode(into:reusing:)`` numbers versions in, kept by a caller that encodes
    /// record after record: no allocation per record once it has grown.
    struct EncodingScratch {
        var table: [Version] = []
    }

    /// ``encoded()`` appended to `w`, working in `scratch`.
    func encode(into w: inout ByteWriter, reusing scratch: inout EncodingScratch) {
        w.bytes.append(carried.isEmpty ? 1 : 2)
        var flags: UInt8 = 0
        if incarnation != nil { flags |= 1 }
        if tombstone != nil { flags |= 2 }
        w.bytes.append(flags)
        // Distinct versions in first-use order: incarnation, tombstone, then fields by tag
        // (the order `fields` keeps them in).
        scratch.table.removeAll(keepingCapacity: true)
        func index(_ v: Version) -> Int { scratch.table.firstIndex(of: v) ?? scratch.table.count }
        func note(_ v: Version?) { if let v, index(v) == scratch.table.count { scratch.table.append(v) } }
        note(incarnation)
        note(tombstone)
        for entry in fields { note(entry.version) }
        let carriedNames = carried.keys.sorted()
        for name in carriedNames { note(carried[name]!.version) }
        w.varint(UInt64(scratch.table.count))
        for v in scratch.table { Self.write(v, &w) }
        if let incarnation { w.varint(UInt64(index(incarnation))) }
        if let tombstone { w.varint(UInt64(index(tombstone))) }
        w.varint(UInt64(fields.count))
        for entry in fields {
            w.varint(UInt64(entry.tag))
            w.varint(UInt64(index(entry.version)))
        }
        guard !carried.isEmpty else { return }
        w.varint(UInt64(carriedNames.count))
        for name in carriedNames {
            let field = carried[name]!
            w.rawString(name)
            w.varint(UInt64(index(field.version)))
            w.value(field.value)
        }
    }

    /// ``encoded()`` of a record just inserted: every field in `fieldTags` at `incarnation`.
    /// The same bytes, without building the field table.
    static func encoded(incarnation: Version, tombstone: Version?, fieldTags: [UInt16]) -> [UInt8] {
        var w = ByteWriter(capacity: 48 + 4 * fieldTags.count)
        encode(incarnation: incarnation, tombstone: tombstone, fieldTags: fieldTags, into: &w)
        return w.bytes
    }

    /// ``encoded(incarnation:tombstone:fieldTags:)`` appended to `w` (a writer the caller
    /// reuses: no allocation once its buffer is large enough).
    static func encode(incarnation: Version, tombstone: Version?, fieldTags: [UInt16], into w: inout ByteWriter) {
        w.bytes.append(1)
        w.bytes.append(tombstone == nil ? 1 : 3)
        let separateTombstone = tombstone.map { $0 != incarnation } ?? false
        w.varint(separateTombstone ? 2 : 1)
        write(incarnation, &w)
        if separateTombstone, let tombstone { write(tombstone, &w) }
        w.varint(0)
        if tombstone != nil { w.varint(separateTombstone ? 1 : 0) }
        w.varint(UInt64(fieldTags.count))
        // A typed record's tags come in schema order, which is almost always tag order.
        let isSorted = zip(fieldTags, fieldTags.dropFirst()).allSatisfy { $0 < $1 }
        for tag in isSorted ? fieldTags : fieldTags.sorted() {
            w.varint(UInt64(tag))
            w.varint(0)
        }
    }

    private static func write(_ version: Version, _ w: inout ByteWriter) {
        w.varint(version.clock)
        w.bigEndian(version.site.high)
        w.bigEndian(version.site.low)
    }

    init(incarnation: Version?, tombstone: Version?, fields: FieldVersions, carried: [String: FieldState] = [:]) {
        self.incarnation = incarnation
        self.tombstone = tombstone
        self.fields = fields
        self.carried = carried
    }

    init(decoding bytes: [UInt8]) throws {
        var r = ByteReader(bytes)
        let format = try r.byte()
        guard format == 1 || format == 2 else { throw RecordFormatError(reason: "unknown versions format") }
        let flags = try r.byte()
        let n = try r.varint()
        // A version takes at least 17 bytes (a clock, a site): a larger count is refused before
        // the table is allocated at its size.
        guard n <= UInt64(bytes.count / 17) else { throw RecordFormatError(reason: "bad version table") }
        var table: [Version] = []
        table.reserveCapacity(Int(n))
        for _ in 0..<n {
            let clock = try r.varint()
            table.append(Version(clock: clock, site: try r.payloadRecordID()))
        }
        func version() throws -> Version {
            let i = Int(clamping: try r.varint())
            guard i < table.count else { throw RecordFormatError(reason: "bad version index") }
            return table[i]
        }
        incarnation = flags & 1 != 0 ? try version() : nil
        tombstone = flags & 2 != 0 ? try version() : nil
        let count = try r.varint()
        // Each field takes at least one byte: a larger count is refused before any allocation.
        guard count <= UInt64(bytes.count) else { throw RecordFormatError(reason: "bad field count") }
        var fields = FieldVersions(minimumCapacity: Int(count))
        for _ in 0..<count {
            let tag = UInt16(truncatingIfNeeded: try r.varint())
            fields[tag] = try version()
        }
        self.fields = fields
        guard format == 2 else { return }
        let carriedCount = try r.varint()
        // A name, a version index and a value take at least three bytes.
        guard carriedCount <= UInt64(bytes.count / 3) else { throw RecordFormatError(reason: "bad carried field count") }
        var carried = [String: FieldState](minimumCapacity: Int(carriedCount))
        for _ in 0..<carriedCount {
            let name = try r.payloadString()
            let version = try version()
            guard carried.updateValue(FieldState(value: try r.value(), version: version), forKey: name) == nil else {
                throw RecordFormatError(reason: "carried field '\(name)' stored twice")
            }
        }
        self.carried = carried
    }
}

/// The version of each field of a record, by tag: at most one per tag, kept in tag order,
/// which is the order ``RecordVersions`` stores them in. A record has a few dozen fields at
/// most, so a sorted array serves where a dictionary hashed every tag and allocated its
/// table: decoding a stored entry appends in order, a lookup is a binary search.
struct FieldVersions: Equatable, Sequence, ExpressibleByDictionaryLiteral {
    struct Entry: Equatable {
        let tag: UInt16
        var version: Version
    }

    private var entries: [Entry] = []

    init() {}

    init(minimumCapacity: Int) { entries.reserveCapacity(minimumCapacity) }

    init(dictionaryLiteral elements: (UInt16, Version)...) {
        for (tag, version) in elements { self[tag] = version }
    }

    var count: Int { entries.count }
    var isEmpty: Bool { entries.isEmpty }

    /// The field versions, in tag order.
    var versions: some Sequence<Version> { entries.lazy.map(\.version) }

    func makeIterator() -> IndexingIterator<[Entry]> { entries.makeIterator() }

    /// The position of `tag`, or where it would go. O(log fields); O(1) for a tag after the
    /// last one, as when reading a stored entry, which lists its tags in order.
    private func position(of tag: UInt16) -> Int {
        if let last = entries.last, last.tag < tag { return entries.count }
        var low = 0, high = entries.count
        while low < high {
            let middle = (low + high) / 2
            if entries[middle].tag < tag { low = middle + 1 } else { high = middle }
        }
        return low
    }

    /// The version of field `tag`; setting nil removes it.
    subscript(tag: UInt16) -> Version? {
        get {
            let i = position(of: tag)
            return i < entries.count && entries[i].tag == tag ? entries[i].version : nil
        }
        set {
            let i = position(of: tag)
            let present = i < entries.count && entries[i].tag == tag
            switch (newValue, present) {
            case (let version?, true): entries[i].version = version
            case (let version?, false) where i == entries.count: entries.append(Entry(tag: tag, version: version))
            case (let version?, false): entries.insert(Entry(tag: tag, version: version), at: i)
            case (nil, true): entries.remove(at: i)
            case (nil, false): break
            }
        }
    }
}
