import Crypto
import Foundation
import Stash

/// A batch of replicated record states from one store, ready to travel.
///
/// A delta holds the *current* state (field values with versions, tombstones) of every
/// record changed in a range of its source's history, coalesced per record. Applying it is a
/// merge, so applying it twice, late, or next to other deltas is harmless.
///
/// Binary layout (format 2; format 1 lacks the counter fields), all integers little-endian or varint:
/// ```
/// "STSD" | format u8 | flags u8 (1 = HMAC, 2 = full snapshot, 4 = addressed)
/// source site (16) | family id (16) | schema fingerprint (32) | from u64 | to u64 | created (f64 seconds)
/// [recipient site (16), when addressed]
/// string table: count, {length, UTF-8} | site table: count, {16 bytes}
/// entries: count, { type (string #) | id (16) | flags (1 incarnation, 2 tombstone)
///                   | [clock, site #] [clock, site #] | field count, {name #, clock, site #, value} }
/// counter fields (format 2): type count, {type #, field count, {name #}}
/// [HMAC-SHA256 (32) of everything before it] | SHA-256 (32) of everything before it
/// ```
/// Values use the record value encoding (kind byte + payload).
public struct Delta: Sendable, Equatable {
    /// The first bytes of every encoded delta.
    public static let magic: [UInt8] = Array("STSD".utf8)
    /// The format written (when ``counterFields`` is set; format 1 otherwise). Formats 1 and 2
    /// are read; a reader of format 1 only refuses format 2 as a newer format.
    public static let formatVersion: UInt8 = 2

    /// The site of the store that exported it.
    public var source: RecordID
    /// The one store this delta is for (it leaves out what came from that store), or nil for
    /// a delta every store may apply (relay).
    public var recipient: RecordID?
    /// The source's store family: a store of another family refuses the delta.
    public var family: RecordID
    /// A digest of the synced part of the source's schema: equal to the receiver's, the delta
    /// applies without a check of each entry against its schema.
    public var schemaFingerprint: [UInt8]
    /// The source history range covered: sequence numbers `from...to` (from = to + 1 when empty).
    public var from: UInt64
    /// The last source sequence number covered (see ``from``).
    public var to: UInt64
    /// A full-state snapshot (sent when the receiver fell behind purged history).
    public var isFullSnapshot: Bool
    /// The source's clock when it was made.
    public var created: Date
    /// The replicated state of each record it carries: one per synced record changed in the
    /// range (not by its recipient), or one per synced record for a full snapshot.
    public var entries: [RecordState]
    /// The counter fields (``Counter``, merged by per-site totals) of each synced type in the
    /// source's schema; a type left out has none. nil: not listed (format 1, from a library
    /// before this list existed). A receiver that merges any of these fields differently
    /// parks the delta, since the two stores would never agree on the value.
    public var counterFields: [String: Set<String>]?

    /// Whether the delta is worth delivering: it carries states, is a full snapshot, or covers
    /// a range of history (even one with nothing for its recipient, whose acknowledgement
    /// lets that history be purged). False only for an incremental delta of no history.
    public var hasNews: Bool { !entries.isEmpty || isFullSnapshot || to >= from }

    public init(source: RecordID, recipient: RecordID?, family: RecordID, schemaFingerprint: [UInt8], from: UInt64, to: UInt64,
                isFullSnapshot: Bool, created: Date, entries: [RecordState], counterFields: [String: Set<String>]? = nil) {
        self.source = source
        self.recipient = recipient
        self.family = family
        self.schemaFingerprint = schemaFingerprint
        self.from = from
        self.to = to
        self.isFullSnapshot = isFullSnapshot
        self.created = created
        self.entries = entries
        self.counterFields = counterFields
    }
}

// MARK: Writing

extension Delta {
    /// The delta's bytes, authenticated with `key` when given.
    public func encoded(key: SyncKey? = nil) -> Data {
        var w = DeltaByteWriter()
        w.bytes.append(contentsOf: Self.magic)
        w.bytes.append(counterFields != nil ? Self.formatVersion : 1)
        w.bytes.append((key != nil ? 1 : 0) | (isFullSnapshot ? 2 : 0) | (recipient != nil ? 4 : 0))
        w.bytes.append(contentsOf: source.bytes)
        w.bytes.append(contentsOf: family.bytes)
        w.bytes.append(contentsOf: schemaFingerprint.count == 32 ? schemaFingerprint : [UInt8](repeating: 0, count: 32))
        w.fixed(from)
        w.fixed(to)
        w.fixed(created.timeIntervalSince1970.bitPattern)
        if let recipient { w.bytes.append(contentsOf: recipient.bytes) }

        var strings: [String] = [], stringIndex: [String: Int] = [:]
        var sites: [RecordID] = [], siteIndex: [RecordID: Int] = [:]
        func string(_ s: String) -> Int {
            if let i = stringIndex[s] { return i }
            strings.append(s); stringIndex[s] = strings.count - 1
            return strings.count - 1
        }
        // Most versions of a delta come from one site, one after the other: the last one's
        // number is at hand without hashing.
        var lastSite: (id: RecordID, index: Int)?
        func site(_ s: RecordID) -> Int {
            if let lastSite, lastSite.id == s { return lastSite.index }
            let index: Int
            if let i = siteIndex[s] { index = i } else {
                sites.append(s); siteIndex[s] = sites.count - 1
                index = sites.count - 1
            }
            lastSite = (s, index)
            return index
        }
        // Entries first into their own buffer, so the tables they reference are complete.
        var body = DeltaByteWriter()
        body.bytes.reserveCapacity(64 + entries.count * 384)
        body.varint(UInt64(entries.count))
        // Each entry's fields in name order (the encoding is canonical), with the string
        // number of each name; records of one type mostly have the same fields, so the previous
        // entry's numbers serve by position, found with a comparison instead of a hash lookup.
        var fields: [(name: String, state: FieldState)] = []
        var previousNames: [(name: String, index: Int)] = []
        for entry in entries {
            body.varint(UInt64(string(entry.type)))
            body.id(entry.id)
            body.bytes.append((entry.incarnation != nil ? 1 : 0) | (entry.tombstone != nil ? 2 : 0))
            if let incarnation = entry.incarnation {
                body.varint(incarnation.clock)
                body.varint(UInt64(site(incarnation.site)))
            }
            if let tombstone = entry.tombstone {
                body.varint(tombstone.clock)
                body.varint(UInt64(site(tombstone.site)))
            }
            fields.removeAll(keepingCapacity: true)
            for (name, state) in entry.fields { fields.append((name, state)) }
            fields.sort { $0.name < $1.name }
            body.varint(UInt64(fields.count))
            for (position, (name, field)) in fields.enumerated() {
                let index: Int
                if position < previousNames.count, previousNames[position].name == name {
                    index = previousNames[position].index
                } else {
                    index = string(name)
                    if position < previousNames.count { previousNames[position] = (name, index) } else { previousNames.append((name, index)) }
                }
                body.varint(UInt64(index))
                body.varint(field.version.clock)
                body.varint(UInt64(site(field.version.site)))
                RecordValueCoding.append(field.value, to: &body.bytes)
            }
        }
        if let counterFields {
            body.varint(UInt64(counterFields.count))
            for (type, fields) in counterFields.sorted(by: { $0.key < $1.key }) {
                body.varint(UInt64(string(type)))
                body.varint(UInt64(fields.count))
                for field in fields.sorted() { body.varint(UInt64(string(field))) }
            }
        }
        w.varint(UInt64(strings.count))
        for s in strings {
            let utf8 = Array(s.utf8)
            w.varint(UInt64(utf8.count))
            w.bytes.append(contentsOf: utf8)
        }
        w.varint(UInt64(sites.count))
        for s in sites { w.id(s) }
        w.bytes.reserveCapacity(w.bytes.count + body.bytes.count + 64)
        w.bytes.append(contentsOf: body.bytes)
        if let key {
            w.bytes.append(contentsOf: HMAC<SHA256>.authenticationCode(for: w.bytes, using: key.symmetricKey))
        }
        w.bytes.append(contentsOf: SHA256.hash(data: w.bytes))
        return Data(w.bytes)
    }
}

// MARK: Reading

extension Delta {
    /// The fixed header: enough to check family and range before reading entries.
    static let headerSize = 4 + 1 + 1 + 16 + 16 + 32 + 8 + 8 + 8

    /// Reads and checks a whole delta: magic, format, checksum, authentication (required
    /// when `key` is given, refused when the delta has an HMAC and no key is configured),
    /// and every entry. Nothing is trusted before the checksum matches.
    /// - Throws: ``SyncError``: `.corruptDelta` (not a delta, or damaged: the checksum does not
    ///   match), `.unsupportedVersion`, `.unauthenticated`, `.unreadableDelta` (intact, but
    ///   holding what this library cannot read).
    public init(decoding data: Data, key: SyncKey?, name: String = "delta") throws {
        var reader = try DeltaReader(data, key: key, name: name)
        let entries = try reader.entries(upTo: reader.remaining)
        let counterFields = try reader.finish()
        self = reader.header
        self.entries = entries
        self.counterFields = counterFields
    }
}

/// A delta being read: its header and tables are read and checked (checksum, authentication)
/// when it is made, its entries after, in batches. ``Delta/init(decoding:key:name:)`` reads
/// them all at once; a large import reads them on another thread while it merges the ones
/// before (``DeltaEntryStream``).
struct DeltaReader: Sendable {
    /// The delta without its entries (empty) and counter fields (nil): what the header says.
    private(set) var header: Delta
    /// The entries not read yet.
    private(set) var remaining: Int
    private var r: DeltaByteReader
    private let strings: [String]
    private let sites: [RecordID]
    private let format: UInt8

    /// Reads and checks everything before the entries.
    /// - Throws: as ``Delta/init(decoding:key:name:)``.
    init(_ data: Data, key: SyncKey?, name: String) throws {
        let bytes = [UInt8](data)
        func corrupt(_ why: String) -> SyncError { SyncError(.corruptDelta, "\(name) is not a valid delta: \(why)") }
        guard bytes.count >= Delta.headerSize + 2 + 32 else { throw corrupt("\(bytes.count) bytes is too short") }
        guard Array(bytes[0..<4]) == Delta.magic else { throw corrupt("wrong magic") }
        let checksumStart = bytes.count - 32
        guard SHA256.hash(data: bytes[0..<checksumStart]).elementsEqual(bytes[checksumStart...]) else {
            throw corrupt("checksum mismatch (damaged or truncated)")
        }
        let format = bytes[4]
        guard format == 1 || format == Delta.formatVersion else {
            throw SyncError(.unsupportedVersion, "\(name) has delta format \(bytes[4]); this library reads format \(Delta.formatVersion); upgrade Stash")
        }
        let flags = bytes[5]
        let hasHMAC = flags & 1 != 0
        var end = checksumStart
        if hasHMAC {
            guard let key else {
                throw SyncError(.unauthenticated, "\(name) is authenticated (HMAC) but no sync key is configured here; configure the shared sync key")
            }
            end -= 32
            guard end >= Delta.headerSize,
                  HMAC<SHA256>.isValidAuthenticationCode(bytes[end..<checksumStart], authenticating: bytes[0..<end], using: key.symmetricKey) else {
                throw SyncError(.unauthenticated, "\(name) has a wrong HMAC: it was not made with this store's sync key")
            }
        } else if key != nil {
            throw SyncError(.unauthenticated, "\(name) is not authenticated, and this store requires its sync key")
        }
        var r = DeltaByteReader(bytes: bytes, offset: 6, end: end, name: name)
        let source = try r.id()
        let family = try r.id()
        let schemaFingerprint = try r.take(32)
        let from = try r.fixed()
        let to = try r.fixed()
        let created = Date(timeIntervalSince1970: Double(bitPattern: try r.fixed()))
        let recipient = flags & 4 != 0 ? try r.id() : nil
        var strings: [String] = []
        for _ in 0..<(try r.count()) {
            let n = try r.count()
            guard let s = String(validating: try r.take(n), as: UTF8.self) else { throw r.unreadable("invalid UTF-8") }
            strings.append(s)
        }
        var sites: [RecordID] = []
        for _ in 0..<(try r.count()) { sites.append(try r.id()) }
        remaining = try r.count()
        header = Delta(source: source, recipient: recipient, family: family, schemaFingerprint: schemaFingerprint, from: from, to: to,
                       isFullSnapshot: flags & 2 != 0, created: created, entries: [])
        self.r = r
        self.strings = strings
        self.sites = sites
        self.format = format
    }

    // Table indexes are bounded by their tables, not by the bytes left.
    private mutating func string() throws -> String {
        let i = try r.varint()
        guard i < UInt64(strings.count) else { throw r.unreadable("string index out of range") }
        return strings[Int(i)]
    }

    private mutating func version() throws -> Version {
        let clock = try r.varint()
        let i = try r.varint()
        guard i < UInt64(sites.count) else { throw r.unreadable("site index out of range") }
        return Version(clock: clock, site: sites[Int(i)])
    }

    /// The next `limit` entries at most (fewer at the end).
    mutating func entries(upTo limit: Int) throws -> [RecordState] {
        let count = min(limit, remaining)
        var entries: [RecordState] = []
        entries.reserveCapacity(min(count, 1 << 16))
        for _ in 0..<count {
            let type = try string()
            let id = try r.id()
            let entryFlags = try r.byte()
            let incarnation = entryFlags & 1 != 0 ? try version() : nil
            let tombstone = entryFlags & 2 != 0 ? try version() : nil
            let fieldCount = try r.count()
            // Allocated at its size at once (`reserveCapacity` on an empty dictionary goes
            // through a resize: a second allocation per record).
            var fields = [String: FieldState](minimumCapacity: min(fieldCount, 256))
            for _ in 0..<fieldCount {
                let fieldName = try string()
                let v = try version()
                // A writer names each field once: a second value would silently win.
                guard fields.updateValue(FieldState(value: try r.value(), version: v), forKey: fieldName) == nil else {
                    throw r.unreadable("field '\(fieldName)' named twice in \(type) \(id)")
                }
            }
            entries.append(RecordState(type: type, id: id, incarnation: incarnation, tombstone: tombstone, fields: fields))
            remaining -= 1
        }
        return entries
    }

    /// Reads what follows the last entry (call once ``remaining`` is 0): the counter fields
    /// (nil in format 1), and checks that nothing else does.
    mutating func finish() throws -> [String: Set<String>]? {
        guard remaining == 0 else { throw r.unreadable("\(remaining) entries left unread") }
        var counterFields: [String: Set<String>]?
        if format >= 2 {
            var counters: [String: Set<String>] = [:]
            for _ in 0..<(try r.count()) {
                let type = try string()
                var fields = Set<String>()
                for _ in 0..<(try r.count()) { fields.insert(try string()) }
                counters[type] = fields
            }
            counterFields = counters
        }
        guard r.offset == r.end else { throw r.unreadable("\(r.end - r.offset) unexpected bytes after the entries") }
        return counterFields
    }
}

struct DeltaByteWriter {
    var bytes: [UInt8] = []
    mutating func varint(_ value: UInt64) {
        var v = value
        while v >= 0x80 { bytes.append(UInt8(truncatingIfNeeded: v) | 0x80); v >>= 7 }
        bytes.append(UInt8(v))
    }
    /// The 16 big-endian bytes of an id (as `RecordID.bytes`, without the array).
    mutating func id(_ id: RecordID) {
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: id.high >> UInt64(shift))) }
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: id.low >> UInt64(shift))) }
    }
    mutating func fixed(_ value: UInt64) {
        for shift in stride(from: 0, to: 64, by: 8) { bytes.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }
}

struct DeltaByteReader {
    let bytes: [UInt8]
    var offset: Int
    let end: Int
    let name: String

    /// What the reader finds wrong: the bytes passed the checksum (and the HMAC), so they are
    /// what the source wrote, and a new copy of them would not read any better.
    func unreadable(_ why: String) -> SyncError {
        SyncError(.unreadableDelta, "\(name) is intact (its checksum matches) but this library cannot read it: \(why) at byte \(offset); a newer Stash, or a faulty one, wrote it: upgrade Stash here")
    }

    mutating func byte() throws -> UInt8 {
        guard offset < end else { throw unreadable("truncated") }
        defer { offset += 1 }
        return bytes[offset]
    }
    mutating func take(_ n: Int) throws -> [UInt8] {
        guard n >= 0, n <= end - offset else { throw unreadable("truncated") }
        defer { offset += n }
        return Array(bytes[offset..<offset + n])
    }
    mutating func varint() throws -> UInt64 {
        var result: UInt64 = 0, shift: UInt64 = 0
        while true {
            let b = try byte()
            result |= UInt64(b & 0x7F) << shift
            if b < 0x80 { return result }
            shift += 7
            if shift > 63 { throw unreadable("varint too long") }
        }
    }
    /// A count or index, bounded by the bytes left (each item takes at least one byte).
    mutating func count() throws -> Int {
        let n = try varint()
        guard n <= UInt64(end - offset) + 1 else { throw unreadable("count \(n) larger than the delta") }
        return Int(n)
    }
    mutating func fixed() throws -> UInt64 {
        let raw = try take(8)
        return raw.enumerated().reduce(UInt64(0)) { $0 | UInt64($1.element) << UInt64($1.offset * 8) }
    }
    /// Read in place: one per record, no array.
    mutating func id() throws -> RecordID {
        guard 16 <= end - offset, let id = RecordID(bytes: bytes[offset..<offset + 16]) else { throw unreadable("truncated") }
        offset += 16
        return id
    }
    mutating func value() throws -> FieldValue {
        do {
            let (value, used) = try RecordValueCoding.decode(bytes, at: offset, end: end)
            offset += used
            return value
        } catch let error as SyncError {
            throw error
        } catch {
            throw unreadable("bad field value (\(error))")
        }
    }
}
