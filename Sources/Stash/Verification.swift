import Foundation
import StashLMDB

/// What ``Store/verify(progressEvery:progress:)`` found. A clean store has no problems.
public struct VerificationReport: Sendable, CustomStringConvertible {
    /// One line per mismatch, naming type, record and index; at most ``maximumListed`` (a
    /// badly damaged store would otherwise list millions, see ``problemsNotListed``).
    public private(set) var problems: [String] = []
    /// Problems found beyond the first ``maximumListed``: counted, not listed.
    public private(set) var problemsNotListed = 0
    /// How many problems ``problems`` lists at most.
    public static let maximumListed = 1_000
    /// Whether damage was found that the checksums or LMDB itself report (bytes that do not
    /// match their checksum, pages that cannot be read, a walk that cannot end), beyond
    /// mismatches between records, indexes, counts and history.
    public internal(set) var foundDamage = false
    /// Records read of the schema's types (those under a type tag it does not know are
    /// reported as problems, not counted).
    public var recordsChecked = 0
    /// Entries read in the index database, those of no index in the schema included.
    public var indexEntriesChecked = 0
    /// History entries read (those left after purges).
    public var historyEntriesChecked = 0
    /// True when no problem was found.
    public var isClean: Bool { problems.isEmpty && problemsNotListed == 0 }

    /// Adds a problem (counted only, past ``maximumListed``).
    mutating func add(_ problem: String) {
        if problems.count < Self.maximumListed { problems.append(problem) } else { problemsNotListed += 1 }
    }

    /// Adds problems found by a check of the caller's (the blobs' of ``Store/verifyBlobs()``,
    /// say), listed as ``add(_:)`` lists them.
    public mutating func add(contentsOf problems: [String]) {
        for problem in problems { add(problem) }
    }

    public var description: String {
        let head = "\(recordsChecked) records, \(indexEntriesChecked) index entries, \(historyEntriesChecked) history entries checked"
        if isClean { return "\(head): clean" }
        let more = problemsNotListed > 0 ? "\n  … and \(problemsNotListed) more" : ""
        let damage = foundDamage ? " (the data file is damaged: restore the store from a backup or a peer)" : ""
        return "\(head): \(problems.count + problemsNotListed) problem(s)\(damage)\n" + problems.map { "  - \($0)" }.joined(separator: "\n") + more
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

/// The state of one ``Store/verify(progressEvery:progress:)`` across its phases.
private struct VerificationRun {
    var report = VerificationReport()
    var counter: VerificationProgressCounter
    /// The most entries one walk of a database may read: no more fit in the data file (an
    /// entry takes at least 16 bytes of a page), so a walk past it loops through damaged
    /// pages, or follows damaged counts. It stops there.
    let maximumEntries: Int
    /// What the walk under way read last, for the message of a walk that LMDB stops.
    var position = "its first entry"
    /// Tags of the schema's types.
    var knownTags = Set<UInt16>()
    /// The history's bounds, and per record key the last entry naming it.
    var bounds: (current: HistoryToken, purgedThrough: HistoryToken) = (.beginning, .beginning)
    var lastWrite: [[UInt8]: (sequence: UInt64, deleted: Bool)] = [:]
    var historyRead = false

    /// Reports damage (``VerificationReport/foundDamage``).
    mutating func damage(_ problem: String) {
        report.foundDamage = true
        report.add(problem)
    }
}

/// One pass of `verify` over one database, in a read snapshot.
private struct VerificationPhase {
    /// The database it walks, as messages name it.
    let database: String
    let body: (Store, inout VerificationRun, ReadTransaction, Catalog) throws -> Void
}

extension Store {
    /// Checks that every record decodes and matches its checksum, every index entry is of an
    /// index in the schema and matches a record (and every record has its entries), unique
    /// indexes hold one id per key, the stored counts equal the records (with none for a type
    /// the schema does not know), and the history is well-formed, its entries matching their
    /// checksums. Reports every mismatch, naming type and id. O(records + index entries +
    /// history entries).
    ///
    /// Damage is reported, not thrown: a record or history entry whose bytes do not match its
    /// checksum; a database LMDB cannot walk to its end (`MDB_CORRUPTED`, a page number past
    /// the file, a key or value running past it), whose walk stops there with the last entry
    /// read named; keys out of order; a walk longer than the file can hold (a loop through
    /// damaged pages, damaged counts), stopped after as many entries as the file could hold at
    /// most. Time and memory stay bounded by the size of the data file, and at most
    /// ``VerificationReport/maximumListed`` problems are listed. The phases run in one read
    /// snapshot, except that a phase after one LMDB stopped starts in a fresh one. Damage
    /// that makes LMDB itself crash (an assertion, a page read past the map) cannot be caught
    /// in the process: `stash verify` runs in a child process for that.
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
        let fileSize = (try? FileManager.default.attributesOfItem(atPath: (path as NSString).appendingPathComponent("data.mdb"))[.size] as? Int) ?? 0
        var run = VerificationRun(counter: VerificationProgressCounter(interval: progressEvery, report: progress),
                                  maximumEntries: max(4_096, fileSize / 16))
        var pending = Self.verificationPhases[...]
        // Databases a walk could not read to its end: later phases that walk them are left out.
        var unreadable = Set<String>()
        while !pending.isEmpty {
            let stopped: (VerificationPhase, any Error)? = try read { snapshot in
                let txn = snapshot.txn
                let catalog: Catalog
                do { catalog = try reloadCatalog(txn) } catch let error as StoreError where error.code == .corrupted {
                    run.damage("the stored schema cannot be read, so nothing else could be checked: \(error.message)")
                    pending.removeAll()
                    return nil
                }
                while let phase = pending.popFirst() {
                    if unreadable.contains(phase.database) { continue }
                    run.position = "its first entry"
                    do { try phase.body(self, &run, txn, catalog) }
                    catch let error as LMDBError { return (phase, error) }
                    catch let error as StoreError where error.code == .corrupted { return (phase, error) }
                }
                return nil
            }
            if let (phase, error) = stopped {
                // The database the failing read was in (a phase reads others on the way).
                let operation = (error as? LMDBError)?.operation ?? ""
                let database = ["records", "index", "counts", "history", "versions", "meta"].first { operation.hasSuffix(" \($0)") } ?? phase.database
                unreadable.insert(database)
                let reason = (error as? LMDBError)?.message(naming: false) ?? (error as? StoreError)?.message ?? "\(error)"
                run.damage("the \(database) database cannot be read past \(run.position) (\(reason)): its pages are damaged")
            }
        }
        return run.report
    }

    /// The phases of `verify`, in order.
    private static var verificationPhases: [VerificationPhase] { [
        VerificationPhase(database: "records") { store, run, txn, catalog in try store.verifyRecords(txn, catalog, &run) },
        VerificationPhase(database: "index") { store, run, txn, catalog in
            try store.verifyIndexEntries(txn, catalog, &run)
            run.counter.finish(.indexEntries)
        },
        VerificationPhase(database: "counts") { store, run, txn, _ in try store.verifyCountKeys(txn, &run) },
        VerificationPhase(database: "meta") { store, run, txn, _ in try store.verifyMetaKeys(txn, &run) },
        VerificationPhase(database: "records") { store, run, txn, _ in try store.verifyRecordTags(txn, &run) },
        VerificationPhase(database: "versions") { store, run, txn, catalog in try store.verifyCarried(txn, catalog, &run) },
        VerificationPhase(database: "history") { store, run, txn, catalog in try store.verifyHistory(txn, catalog, &run) },
        VerificationPhase(database: "records") { store, run, txn, catalog in try store.verifyReplay(txn, catalog, &run) },
    ] }

    /// Walks `db` from its first key, as `TransactionReading.scan` does, within
    /// `run.maximumEntries` and checking that keys (and, in the index, values under one key)
    /// come in order: a walk that breaks either is reported and stopped.
    private func walk(_ db: Database, prefix: [UInt8]? = nil, _ txn: ReadTransaction, _ run: inout VerificationRun,
                      _ body: ([UInt8], [UInt8], inout VerificationRun) throws -> Bool) throws {
        var entries = 0
        var previous: ([UInt8], [UInt8])?
        let duplicates = db.flags.contains(.duplicateSort)
        let start: ScanStart<[UInt8]> = prefix.map { .atOrAfter($0) } ?? .first
        try txn.scan(db, from: start) { key, value in
            if let prefix, !key.starts(with: prefix) { return false }
            entries += 1
            if entries > run.maximumEntries {
                run.damage("the \(db.name) database walks past \(run.maximumEntries) entries, more than data.mdb can hold, after \(run.position): its pages are damaged (a loop, or damaged counts); the walk stopped there")
                return false
            }
            if let (lastKey, lastValue) = previous {
                let ordered = lastKey.lexicographicallyPrecedes(key)
                    || (duplicates && lastKey == key && lastValue.lexicographicallyPrecedes(value))
                if !ordered {
                    run.damage("the \(db.name) database holds keys out of order after \(run.position): its pages are damaged; the walk stopped there")
                    return false
                }
            }
            previous = (key, value)
            return try body(key, value, &run)
        }
    }

    /// Every record of each type of the schema: it decodes (its checksum first), its values
    /// are of their fields' kinds, it has its index entries and a versions entry that says it
    /// exists; the stored count equals the records.
    private func verifyRecords(_ txn: ReadTransaction, _ catalog: Catalog, _ run: inout VerificationRun) throws {
        for type in catalog.schema.types {
            run.knownTags.insert(type.tag)
            let layout = catalog.layoutsByTag[type.tag]!
            var actual = 0
            try walk(dbs.records, prefix: StoreKeys.typePrefix(type.tag), txn, &run) { key, value, run in
                run.report.recordsChecked += 1
                run.counter.count(.records)
                actual += 1
                guard let id = StoreKeys.id(fromRecordKey: key) else {
                    run.report.add("\(type.name): malformed record key of \(key.count) bytes")
                    return true
                }
                run.position = "\(type.name) \(id)"
                let record: EncodedRecord
                do { record = try EncodedRecord(value) } catch let error as RecordFormatError where error.isChecksumMismatch {
                    run.damage("\(type.name) \(id): record bytes cannot be decoded: \(error)")
                    return true
                } catch {
                    run.report.add("\(type.name) \(id): record bytes cannot be decoded (\(error))")
                    return true
                }
                // The values themselves (the frame alone can be intact around a damaged
                // string), each of the kind the schema gives its field.
                do {
                    for (tag, value) in try record.values() {
                        if let field = type.field(tagged: tag), let stored = value.kind, let declared = field.kind, stored != declared {
                            run.report.add("\(type.name) \(id): field \(field.name) holds \(stored.rawValue), the schema says \(declared.rawValue)")
                        }
                    }
                } catch {
                    run.report.add("\(type.name) \(id): a field value cannot be decoded (\(error))")
                    return true
                }
                for index in type.indexes {
                    guard let key = try? indexKey(index, layout, record) else {
                        run.report.add("\(type.name) \(id): its key in index \(index.name) cannot be computed")
                        continue
                    }
                    if try !txn.containsDuplicate(dbs.index, key: key, value: id.bytes) {
                        run.report.add("\(type.name) \(id): missing from index \(index.name)")
                    }
                }
                // Versions: a stored record has an incarnation newer than any delete.
                if let bytes = try txn.get(dbs.versions, key: key) {
                    if let versions = try? RecordVersions(decoding: bytes) {
                        if versions.incarnation == nil || (versions.tombstone.map { versions.incarnation! <= $0 } ?? false) {
                            run.report.add("\(type.name) \(id): stored, but its versions say it is deleted")
                        }
                    } else {
                        run.damage("\(type.name) \(id): its versions entry cannot be decoded")
                    }
                } else {
                    run.report.add("\(type.name) \(id): no versions entry")
                }
                return true
            }
            let stored = try txn.uint64(dbs.counts, key: StoreKeys.count(type.tag)) ?? 0
            if stored != UInt64(actual) {
                run.report.add("\(type.name): stored count \(stored) but \(actual) records")
            }
        }
        run.counter.finish(.records)
    }

    /// Counts under a type tag the schema does not know (a type given that tag later would
    /// start from it).
    private func verifyCountKeys(_ txn: ReadTransaction, _ run: inout VerificationRun) throws {
        try walk(dbs.counts, txn, &run) { key, _, run in
            if key.count != 2 {
                run.report.add("a stored count under a key of \(key.count) bytes (a type tag has 2)")
            } else if !run.knownTags.contains(UInt16(key[0]) << 8 | UInt16(key[1])) {
                run.report.add("a stored count under type tag \(UInt16(key[0]) << 8 | UInt16(key[1])), unknown to the schema")
            }
            return true
        }
    }

    /// The `meta` database holds the keys Stash writes, each fixed-width value of its size,
    /// and those every store has. (Its values are not checksummed, except the schema's.)
    private func verifyMetaKeys(_ txn: ReadTransaction, _ run: inout VerificationRun) throws {
        var present = Set<[UInt8]>()
        try walk(dbs.meta, txn, &run) { key, value, run in
            let name = String(decoding: key.prefix(64), as: UTF8.self)
            run.position = "meta key '\(name)'"
            if let size = MetaKey.known[key] {
                present.insert(key)
                if let size, value.count != size {
                    run.damage("meta value '\(name)' is \(value.count) bytes, not \(size): the meta database is damaged")
                }
            } else if !MetaKey.knownPrefixes.contains(where: { key.starts(with: $0) }) {
                run.damage("meta holds a key no Stash writes ('\(name)', \(key.count) bytes): the meta database is damaged")
            }
            return true
        }
        for key in [MetaKey.format, MetaKey.storeID, MetaKey.siteID, MetaKey.schema, MetaKey.nextSequence] where !present.contains(key) {
            run.damage("meta lacks '\(String(decoding: key, as: UTF8.self))', which every store has: the meta database is damaged")
        }
    }

    /// Records under a type tag the schema does not know.
    private func verifyRecordTags(_ txn: ReadTransaction, _ run: inout VerificationRun) throws {
        var strayTags = Set<UInt16>()
        try walk(dbs.records, txn, &run) { key, _, run in
            run.counter.count(.recordTypes)
            if key.count >= 2 {
                let tag = UInt16(key[0]) << 8 | UInt16(key[1])
                if !run.knownTags.contains(tag) { strayTags.insert(tag) }
            }
            return true
        }
        run.counter.finish(.recordTypes)
        for tag in strayTags.sorted() { run.report.add("records under type tag \(tag), unknown to the schema") }
    }

    /// History: well-formed entries (their checksums first) below the next sequence number,
    /// numbered without holes after the purge point.
    private func verifyHistory(_ txn: ReadTransaction, _ catalog: Catalog, _ run: inout VerificationRun) throws {
        let (current, purgedThrough) = try historyBounds(txn)
        run.bounds = (current, purgedThrough)
        if try txn.uint64(dbs.meta, key: MetaKey.nextSequence) == 0 {
            run.report.add("the next history sequence number in meta is 0 (sequences start at 1)")
        }
        if purgedThrough > current {
            run.report.add("history is purged through \(purgedThrough.sequence), past its newest entry \(current.sequence)")
        }
        // Every transaction that changed records has an entry: after the purge point the
        // entries are contiguous, each one after the previous.
        var expected = purgedThrough.sequence &+ 1
        try walk(dbs.history, txn, &run) { key, value, run in
            run.report.historyEntriesChecked += 1
            run.counter.count(.history)
            let sequence = StoreKeys.sequence(fromHistoryKey: key) ?? 0
            guard key.count == 8, sequence > purgedThrough.sequence, sequence <= current.sequence else {
                run.report.add("history entry with key \(key) outside \(purgedThrough.sequence &+ 1)...\(current.sequence)")
                return true
            }
            run.position = "history entry \(sequence)"
            if sequence != expected {
                run.report.add("history entries \(expected)...\(sequence - 1) are missing")
            }
            expected = sequence &+ 1
            let entry: (timestamp: Date, origin: RecordID, author: String?, changes: [HistoryChange.Stored])
            do { entry = try HistoryEntry.decodeStored(value) } catch let error as RecordFormatError where error.isChecksumMismatch {
                run.damage("history entry \(sequence) cannot be decoded: \(error)")
                return true
            } catch {
                run.report.add("history entry \(sequence) cannot be decoded")
                return true
            }
            for change in entry.changes {
                // A type carried when the entry was written and declared since: its records
                // are under the schema's tag now.
                let tag = catalog.carriedNamesByTag[change.typeTag].flatMap { catalog.layoutsByName[$0]?.schema.tag } ?? change.typeTag
                run.lastWrite[StoreKeys.record(tag, change.id).bytes] = (sequence, change.operation == .delete)
            }
            return true
        }
        run.counter.finish(.history)
        run.historyRead = true
        if purgedThrough < current, expected <= current.sequence {
            run.report.add("history entries \(expected)...\(current.sequence) are missing")
        }
    }

    /// Replaying history, the last change of every record it names agrees with the store; and
    /// while nothing was purged, every stored record appears in history.
    private func verifyReplay(_ txn: ReadTransaction, _ catalog: Catalog, _ run: inout VerificationRun) throws {
        guard run.historyRead else { return }   // the history walk stopped: nothing to replay
        for (key, last) in run.lastWrite {
            run.counter.count(.historyReplay)
            let tag = UInt16(key[0]) << 8 | UInt16(key[1])
            let name = catalog.typeName(tagged: tag) ?? "type#\(tag)"
            let id = StoreKeys.id(fromRecordKey: key).map(\.description) ?? "?"
            run.position = "\(name) \(id)"
            // A state of a carried type lives in `versions` alone.
            let stored = catalog.layoutsByTag[tag] == nil && catalog.carriedNamesByTag[tag] != nil
                ? try txn.get(dbs.versions, key: key).flatMap { try? RecordVersions(decoding: $0) }?.exists ?? false
                : try txn.contains(dbs.records, key: key)
            if last.deleted && stored {
                run.report.add("\(name) \(id): deleted by history entry \(last.sequence) but still stored")
            } else if !last.deleted && !stored {
                run.report.add("\(name) \(id): written by history entry \(last.sequence) but not stored")
            }
        }
        run.counter.finish(.historyReplay)
        if run.bounds.purgedThrough == .beginning {
            run.position = "its first entry"
            try walk(dbs.records, txn, &run) { key, _, run in
                run.counter.count(.historyCoverage)
                if run.lastWrite[key] == nil {
                    let name = key.count >= 2 ? catalog.layoutsByTag[UInt16(key[0]) << 8 | UInt16(key[1])]?.schema.name ?? "?" : "?"
                    run.report.add("\(name) \(StoreKeys.id(fromRecordKey: key).map(\.description) ?? "?"): stored but absent from history")
                }
                return true
            }
            run.counter.finish(.historyCoverage)
        }
    }

    /// The states kept for types the schema does not declare (``CarriedSchema``) decode, and
    /// none is left under the tag of a type declared since (an open takes them in).
    /// O(carried states).
    private func verifyCarried(_ txn: ReadTransaction, _ catalog: Catalog, _ run: inout VerificationRun) throws {
        for (name, tag) in catalog.carried.types.sorted(by: { $0.key < $1.key }) {
            if let declared = catalog.layoutsByName[name], declared.schema.tag == tag {
                run.report.add("\(name): the schema's tag \(tag) is also the tag of the carried type \(name)")
                continue
            }
            var left = 0
            try walk(dbs.versions, prefix: StoreKeys.typePrefix(tag), txn, &run) { key, value, run in
                let id = StoreKeys.id(fromRecordKey: key).map(\.description) ?? "?"
                run.position = "\(name) \(id)"
                if catalog.layoutsByName[name] != nil {
                    left += 1
                } else if (try? RecordVersions(decoding: value)) == nil {
                    run.report.add("\(name) \(id) (carried for other replicas): its state cannot be decoded")
                }
                return true
            }
            if left > 0 {
                run.report.add("\(name): \(left) state(s) kept while it was undeclared are still under its carried tag \(tag); reopening the store for writing takes them in")
            }
        }
    }

    /// Reads every entry of the `index` database once, in key order. An entry of an index in
    /// the schema must name a stored record that gives its key, and a unique index holds one
    /// record per value (under a shortened key, per full value). Entries under a (type, index)
    /// tag pair the schema does not have (left by a dropped index, or of a type the schema does
    /// not know) are reported per pair: reads never see them, but a type given that tag later
    /// would. O(index entries).
    private func verifyIndexEntries(_ txn: ReadTransaction, _ catalog: Catalog, _ run: inout VerificationRun) throws {
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
        // Entries under prefixes the schema does not have, per prefix, in key order (at most
        // one list entry per prefix: the walk is in key order).
        var unknown: [(prefix: UInt32, entries: Int)] = []
        var lastKey: [UInt8]?
        // Records under the key that hold the value (those that lack it clash with none).
        var holdersUnderKey = 0
        // Under a shortened key (long strings or bytes), records per full value: different
        // values sharing the key's prefix are no duplicates, as the writer compares them.
        var holdersOfLossyValue: [[FieldValue]: Int] = [:]
        try walk(dbs.index, txn, &run) { key, value, run in
            run.report.indexEntriesChecked += 1
            run.counter.count(.indexEntries)
            guard key.count >= 4 else {
                run.report.add("an index entry under a key of \(key.count) bytes, too short for a type tag and an index tag")
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
                run.report.add("\(type.name) index \(index.name): malformed id of \(value.count) bytes")
                return true
            }
            run.position = "the entry of \(type.name) \(id) in index \(index.name)"
            guard let bytes = try txn.get(dbs.records, key: StoreKeys.record(type.tag, id)),
                  let record = try? EncodedRecord(bytes) else {
                // A record that exists but does not decode is reported with the record.
                if try !txn.contains(dbs.records, key: StoreKeys.record(type.tag, id)) {
                    run.report.add("\(type.name) index \(index.name): entry for missing record \(id)")
                }
                return true
            }
            guard let expected = try? indexKey(index, entry.layout, record) else {
                // Reported with the record.
                return true
            }
            if expected.bytes != key {
                run.report.add("\(type.name) \(id): stale entry in index \(index.name)")
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
                    run.report.add("\(type.name) \(id): unique index \(index.name) holds \(holders) records for one value")
                }
            }
            return true
        }
        for (prefix, entries) in unknown {
            let (typeTag, indexTag) = (UInt16(prefix >> 16), UInt16(prefix & 0xFFFF))
            let counted = entries == 1 ? "1 index entry" : "\(entries) index entries"
            if let type = catalog.schema.type(tagged: typeTag) {
                run.report.add("\(type.name): \(counted) under index tag \(indexTag), which the schema does not have (left by a dropped index?)")
            } else {
                run.report.add("\(counted) under type tag \(typeTag), index tag \(indexTag), unknown to the schema")
            }
        }
    }
}
