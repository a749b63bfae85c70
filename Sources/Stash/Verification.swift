import Foundation
import StashLMDB

/// What ``Store/verify(progressEvery:progress:)`` found. A clean store has no problems.
public struct VerificationReport: Sendable, CustomStringConvertible {
    /// One line per mismatch, naming type, record and index.
    public var problems: [String] = []
    /// Records read of the schema's types (those under a type tag it does not know are
    /// reported as problems, not counted).
    public var recordsChecked = 0
    /// Entries read in the index database, those of no index in the schema included.
    public var indexEntriesChecked = 0
    /// History entries read (those left after purges).
    public var historyEntriesChecked = 0
    /// True when no problem was found.
    public var isClean: Bool { problems.isEmpty }

    public var description: String {
        let head = "\(recordsChecked) records, \(indexEntriesChecked) index entries, \(historyEntriesChecked) history entries checked"
        return isClean ? "\(head): clean" : "\(head): \(problems.count) problem(s)\n" + problems.map { "  - \($0)" }.joined(separator: "\n")
    }
}

/// How far ``Store/verify(progressEvery:progress:)`` has come: `checked` items of `phase`.
public struct VerificationProgress: Sendable, CustomStringConvertible {
    /// What `verify` reads, in this order.
    public enum Phase: String, Sendable, CaseIterable {
        /// Every record of the schema's types, type by type: it decodes, has its index entries
        /// and versions.
        case records = "records"
        /// Every entry of the index database: its index is in the schema, its record exists
        /// and gives its key.
        case indexEntries = "index entries"
        /// Every record again: its type tag is one the schema knows.
        case recordTypes = "records for unknown types"
        /// Every history entry: well-formed and in sequence.
        case history = "history entries"
        /// Every record the history names: stored or deleted as its last entry says.
        case historyReplay = "records replayed from history"
        /// Every record again, when no history was purged: the history names it.
        case historyCoverage = "records for a history entry"
    }

    /// The phase under way.
    public let phase: Phase
    /// Items of `phase` checked so far (of all types).
    public let checked: Int
    /// Whether `phase` is over: `checked` is then all it checked.
    public let isFinished: Bool

    /// "verified 100000 records", or "verified 123456 records: done" when the phase is over.
    public var description: String { "verified \(checked) \(phase.rawValue)\(isFinished ? ": done" : "")" }
}

/// Counts the items `verify` checks per phase and reports every `interval` of them, and each
/// phase's end. Does nothing without `report`.
private struct VerificationProgressCounter {
    let interval: Int
    let report: ((VerificationProgress) -> Void)?
    private var checked: [VerificationProgress.Phase: Int] = [:]

    init(interval: Int, report: ((VerificationProgress) -> Void)?) {
        self.interval = max(interval, 1)
        self.report = report
    }

    mutating func count(_ phase: VerificationProgress.Phase) {
        guard let report else { return }
        let done = checked[phase, default: 0] + 1
        checked[phase] = done
        if done % interval == 0 { report(VerificationProgress(phase: phase, checked: done, isFinished: false)) }
    }

    func finish(_ phase: VerificationProgress.Phase) {
        report?(VerificationProgress(phase: phase, checked: checked[phase, default: 0], isFinished: true))
    }
}

extension Store {
    /// Checks, in one read snapshot, that every record decodes, every index entry is of an index
    /// in the schema and matches a record (and every record has its entries), unique indexes
    /// hold one id per key, the stored counts equal the records (with none for a type the schema
    /// does not know), and the history is well-formed. Reports every mismatch.
    /// O(records + index entries + history entries).
    ///
    /// ```swift
    /// let report = try store.verify { print($0) }   // "verified 100000 records", …
    /// if !report.isClean { print(report) }
    /// ```
    /// - Parameters:
    ///   - progressEvery: how many items of a phase pass between two `progress` calls.
    ///   - progress: called on the calling thread, inside the read, every `progressEvery`
    ///     items of each ``VerificationProgress/Phase`` and once at the end of each phase that
    ///     runs. A large store takes a while; this says how far the check has come. It runs
    ///     inside the read, so it must not wait for a write to the store.
    public func verify(progressEvery: Int = 100_000, progress: ((VerificationProgress) -> Void)? = nil) throws -> VerificationReport {
        try read { snapshot in
            var report = VerificationReport()
            var counter = VerificationProgressCounter(interval: progressEvery, report: progress)
            let txn = snapshot.txn
            let catalog = try reloadCatalog(txn)
            var knownTags = Set<UInt16>()
            for type in catalog.schema.types {
                knownTags.insert(type.tag)
                let layout = catalog.layoutsByTag[type.tag]!
                var actual = 0
                try txn.scan(dbs.records, prefix: StoreKeys.typePrefix(type.tag)) { key, value in
                    report.recordsChecked += 1
                    counter.count(.records)
                    actual += 1
                    guard let id = StoreKeys.id(fromRecordKey: key) else {
                        report.problems.append("\(type.name): malformed record key of \(key.count) bytes")
                        return true
                    }
                    guard let record = try? EncodedRecord(value) else {
                        report.problems.append("\(type.name) \(id): record bytes cannot be decoded")
                        return true
                    }
                    // The values themselves (the frame alone can be intact around a damaged
                    // string), each of the kind the schema gives its field.
                    do {
                        for (tag, value) in try record.values() {
                            if let field = type.field(tagged: tag), let stored = value.kind, let declared = field.kind, stored != declared {
                                report.problems.append("\(type.name) \(id): field \(field.name) holds \(stored.rawValue), the schema says \(declared.rawValue)")
                            }
                        }
                    } catch {
                        report.problems.append("\(type.name) \(id): a field value cannot be decoded (\(error))")
                        return true
                    }
                    for index in type.indexes {
                        guard let key = try? indexKey(index, layout, record) else {
                            report.problems.append("\(type.name) \(id): its key in index \(index.name) cannot be computed")
                            continue
                        }
                        if try !txn.containsDuplicate(dbs.index, key: key, value: id.bytes) {
                            report.problems.append("\(type.name) \(id): missing from index \(index.name)")
                        }
                    }
                    // Versions: a stored record has an incarnation newer than any delete.
                    let versions = try txn.get(dbs.versions, key: key).flatMap { try? RecordVersions(decoding: $0) }
                    if let versions {
                        if versions.incarnation == nil || (versions.tombstone.map { versions.incarnation! <= $0 } ?? false) {
                            report.problems.append("\(type.name) \(id): stored, but its versions say it is deleted")
                        }
                    } else {
                        report.problems.append("\(type.name) \(id): no versions entry")
                    }
                    return true
                }
                let stored = try txn.uint64(dbs.counts, key: StoreKeys.count(type.tag)) ?? 0
                if stored != UInt64(actual) {
                    report.problems.append("\(type.name): stored count \(stored) but \(actual) records")
                }
            }
            counter.finish(.records)
            try verifyIndexEntries(txn, catalog, &report, &counter)
            counter.finish(.indexEntries)
            // Counts under a type tag the schema does not know (a type given that tag later
            // would start from it).
            try txn.scan(dbs.counts, from: ScanStart<[UInt8]>.first) { key, _ in
                if key.count != 2 {
                    report.problems.append("a stored count under a key of \(key.count) bytes (a type tag has 2)")
                } else if !knownTags.contains(UInt16(key[0]) << 8 | UInt16(key[1])) {
                    report.problems.append("a stored count under type tag \(UInt16(key[0]) << 8 | UInt16(key[1])), unknown to the schema")
                }
                return true
            }
            // Records under a type tag the schema does not know.
            var strayTags = Set<UInt16>()
            try txn.scan(dbs.records, from: ScanStart<[UInt8]>.first) { key, _ in
                counter.count(.recordTypes)
                if key.count >= 2 {
                    let tag = UInt16(key[0]) << 8 | UInt16(key[1])
                    if !knownTags.contains(tag) { strayTags.insert(tag) }
                }
                return true
            }
            counter.finish(.recordTypes)
            for tag in strayTags.sorted() { report.problems.append("records under type tag \(tag), unknown to the schema") }
            try verifyCarried(txn, catalog, &report)
            // History: well-formed entries below the next sequence number, and consistent with
            // the data: replaying which records were last written or deleted must match what is
            // stored, and with no purge yet, every stored record must appear in history.
            let (current, purgedThrough) = try historyBounds(txn)
            if try txn.uint64(dbs.meta, key: MetaKey.nextSequence) == 0 {
                report.problems.append("the next history sequence number in meta is 0 (sequences start at 1)")
            }
            if purgedThrough > current {
                report.problems.append("history is purged through \(purgedThrough.sequence), past its newest entry \(current.sequence)")
            }
            // Every transaction that changed records has an entry: after the purge point the
            // entries are contiguous, each one after the previous.
            var expected = purgedThrough.sequence &+ 1
            var lastWrite: [[UInt8]: (sequence: UInt64, deleted: Bool)] = [:]
            try txn.scan(dbs.history, from: ScanStart<[UInt8]>.first) { key, value in
                report.historyEntriesChecked += 1
                counter.count(.history)
                let sequence = StoreKeys.sequence(fromHistoryKey: key) ?? 0
                guard key.count == 8, sequence > purgedThrough.sequence, sequence <= current.sequence else {
                    report.problems.append("history entry with key \(key) outside \(purgedThrough.sequence &+ 1)...\(current.sequence)")
                    return true
                }
                if sequence != expected {
                    report.problems.append("history entries \(expected)...\(sequence - 1) are missing")
                }
                expected = sequence &+ 1
                guard let entry = try? HistoryEntry.decodeStored(value) else {
                    report.problems.append("history entry \(sequence) cannot be decoded")
                    return true
                }
                for change in entry.changes {
                    // A type carried when the entry was written and declared since: its records
                    // are under the schema's tag now.
                    let tag = catalog.carriedNamesByTag[change.typeTag].flatMap { catalog.layoutsByName[$0]?.schema.tag } ?? change.typeTag
                    lastWrite[StoreKeys.record(tag, change.id).bytes] = (sequence, change.operation == .delete)
                }
                return true
            }
            counter.finish(.history)
            if purgedThrough < current, expected <= current.sequence {
                report.problems.append("history entries \(expected)...\(current.sequence) are missing")
            }
            for (key, last) in lastWrite {
                counter.count(.historyReplay)
                let tag = UInt16(key[0]) << 8 | UInt16(key[1])
                // A state of a carried type lives in `versions` alone.
                let stored = catalog.layoutsByTag[tag] == nil && catalog.carriedNamesByTag[tag] != nil
                    ? try txn.get(dbs.versions, key: key).flatMap { try? RecordVersions(decoding: $0) }?.exists ?? false
                    : try txn.contains(dbs.records, key: key)
                let name = catalog.typeName(tagged: tag) ?? "type#\(tag)"
                let id = StoreKeys.id(fromRecordKey: key).map(\.description) ?? "?"
                if last.deleted && stored {
                    report.problems.append("\(name) \(id): deleted by history entry \(last.sequence) but still stored")
                } else if !last.deleted && !stored {
                    report.problems.append("\(name) \(id): written by history entry \(last.sequence) but not stored")
                }
            }
            counter.finish(.historyReplay)
            if purgedThrough == .beginning {
                try txn.scan(dbs.records, from: ScanStart<[UInt8]>.first) { key, _ in
                    counter.count(.historyCoverage)
                    if lastWrite[key] == nil {
                        let name = key.count >= 2 ? catalog.layoutsByTag[UInt16(key[0]) << 8 | UInt16(key[1])]?.schema.name ?? "?" : "?"
                        report.problems.append("\(name) \(StoreKeys.id(fromRecordKey: key).map(\.description) ?? "?"): stored but absent from history")
                    }
                    return true
                }
                counter.finish(.historyCoverage)
            }
            return report
        }
    }

    /// The states kept for types the schema does not declare (``CarriedSchema``) decode, and
    /// none is left under the tag of a type declared since (an open takes them in).
    /// O(carried states).
    private func verifyCarried(_ txn: ReadTransaction, _ catalog: Catalog, _ report: inout VerificationReport) throws {
        for (name, tag) in catalog.carried.types.sorted(by: { $0.key < $1.key }) {
            if let declared = catalog.layoutsByName[name], declared.schema.tag == tag {
                report.problems.append("\(name): the schema's tag \(tag) is also the tag of the carried type \(name)")
                continue
            }
            var left = 0
            try txn.scan(dbs.versions, prefix: StoreKeys.typePrefix(tag)) { key, value in
                let id = StoreKeys.id(fromRecordKey: key).map(\.description) ?? "?"
                if catalog.layoutsByName[name] != nil {
                    left += 1
                } else if (try? RecordVersions(decoding: value)) == nil {
                    report.problems.append("\(name) \(id) (carried for other replicas): its state cannot be decoded")
                }
                return true
            }
            if left > 0 {
                report.problems.append("\(name): \(left) state(s) kept while it was undeclared are still under its carried tag \(tag); reopening the store for writing takes them in")
            }
        }
    }

    /// Reads every entry of the `index` database once, in key order. An entry of an index in
    /// the schema must name a stored record that gives its key, and a unique index holds one
    /// record per value (under a shortened key, per full value). Entries under a (type, index)
    /// tag pair the schema does not have (left by a dropped index, or of a type the schema does
    /// not know) are reported per pair: reads never see them, but a type given that tag later
    /// would. O(index entries).
    private func verifyIndexEntries(_ txn: ReadTransaction, _ catalog: Catalog, _ report: inout VerificationReport,
                                    _ counter: inout VerificationProgressCounter) throws {
        /// An index of the schema, found by its key prefix (type tag and index tag, 4 bytes).
        struct KnownIndex {
            let type: TypeSchema
            let layout: TypeLayout
            let index: IndexSchema
        }
        var known: [UInt32: KnownIndex] = [:]
        for type in catalog.schema.types {
            for index in type.indexes {
                known[UInt32(type.tag) << 16 | UInt32(index.tag)] = KnownIndex(type: type, layout: catalog.layoutsByTag[type.tag]!, index: index)
            }
        }
        // Entries under prefixes the schema does not have, per prefix, in key order.
        var unknown: [(prefix: UInt32, entries: Int)] = []
        var lastKey: [UInt8]?
        // Records under the key that hold the value (those that lack it clash with none).
        var holdersUnderKey = 0
        // Under a shortened key (long strings or bytes), records per full value: different
        // values sharing the key's prefix are no duplicates, as the writer compares them.
        var holdersOfLossyValue: [[FieldValue]: Int] = [:]
        try txn.scan(dbs.index, from: ScanStart<[UInt8]>.first) { key, value in
            report.indexEntriesChecked += 1
            counter.count(.indexEntries)
            guard key.count >= 4 else {
                report.problems.append("an index entry under a key of \(key.count) bytes, too short for a type tag and an index tag")
                return true
            }
            let prefix = key[0..<4].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
            guard let entry = known[prefix] else {
                if unknown.last?.prefix == prefix { unknown[unknown.count - 1].entries += 1 } else { unknown.append((prefix, 1)) }
                return true
            }
            let (type, index) = (entry.type, entry.index)
            if key != lastKey { holdersUnderKey = 0; holdersOfLossyValue.removeAll(); lastKey = key }
            guard let id = RecordID(bytes: value[...]) else {
                report.problems.append("\(type.name) index \(index.name): malformed id of \(value.count) bytes")
                return true
            }
            guard let bytes = try txn.get(dbs.records, key: StoreKeys.record(type.tag, id)),
                  let record = try? EncodedRecord(bytes) else {
                report.problems.append("\(type.name) index \(index.name): entry for missing record \(id)")
                return true
            }
            guard let expected = try? indexKey(index, entry.layout, record) else {
                // Reported with the record.
                return true
            }
            if expected.bytes != key {
                report.problems.append("\(type.name) \(id): stale entry in index \(index.name)")
            } else if index.unique, (try? lacksUniqueValue(index, entry.layout, record)) == false {
                let holders: Int
                if expected.isLossy {
                    // Computing the key read these values already: this does not fail.
                    guard let values = try? index.fields.map({ try fieldValue($0, entry.layout, record) }) else { return true }
                    holders = holdersOfLossyValue[values, default: 0] + 1
                    holdersOfLossyValue[values] = holders
                } else {
                    holdersUnderKey += 1
                    holders = holdersUnderKey
                }
                if holders > 1 {
                    report.problems.append("\(type.name) \(id): unique index \(index.name) holds \(holders) records for one value")
                }
            }
            return true
        }
        for (prefix, entries) in unknown {
            let (typeTag, indexTag) = (UInt16(prefix >> 16), UInt16(prefix & 0xFFFF))
            let counted = entries == 1 ? "1 index entry" : "\(entries) index entries"
            if let type = catalog.schema.type(tagged: typeTag) {
                report.problems.append("\(type.name): \(counted) under index tag \(indexTag), which the schema does not have (left by a dropped index?)")
            } else {
                report.problems.append("\(counted) under type tag \(typeTag), index tag \(indexTag), unknown to the schema")
            }
        }
    }
}
