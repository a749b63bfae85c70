import Foundation
import StashLMDB

/// What ``Store/verify()`` found. A clean store has no problems.
public struct VerificationReport: Sendable, CustomStringConvertible {
    /// One line per mismatch, naming type, record and index.
    public var problems: [String] = []
    public var recordsChecked = 0
    public var indexEntriesChecked = 0
    public var historyEntriesChecked = 0
    public var isClean: Bool { problems.isEmpty }

    public var description: String {
        let head = "\(recordsChecked) records, \(indexEntriesChecked) index entries, \(historyEntriesChecked) history entries checked"
        return isClean ? "\(head): clean" : "\(head): \(problems.count) problem(s)\n" + problems.map { "  - \($0)" }.joined(separator: "\n")
    }
}

extension Store {
    /// Checks, in one read snapshot, that every record decodes, every index entry matches a
    /// record (and every record has its entries), unique indexes hold one id per key, the
    /// stored counts equal the records, and the history is well-formed. Reports every mismatch.
    /// O(records + index entries + history entries).
    public func verify() throws -> VerificationReport {
        try read { snapshot in
            var report = VerificationReport()
            let txn = snapshot.txn
            let catalog = try reloadCatalog(txn)
            var knownTags = Set<UInt16>()
            for type in catalog.schema.types {
                knownTags.insert(type.tag)
                let layout = catalog.layoutsByTag[type.tag]!
                var actual = 0
                try txn.scan(dbs.records, prefix: StoreKeys.typePrefix(type.tag)) { key, value in
                    report.recordsChecked += 1
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
                for index in type.indexes {
                    var lastKey: [UInt8]?
                    // Records under the key that hold the value (those that lack it clash with none).
                    var holdersUnderKey = 0
                    try txn.scan(dbs.index, prefix: StoreKeys.indexPrefix(type.tag, index.tag)) { key, value in
                        report.indexEntriesChecked += 1
                        if key != lastKey { holdersUnderKey = 0; lastKey = key }
                        guard let id = RecordID(bytes: value[...]) else {
                            report.problems.append("\(type.name) index \(index.name): malformed id of \(value.count) bytes")
                            return true
                        }
                        guard let bytes = try txn.get(dbs.records, key: StoreKeys.record(type.tag, id)),
                              let record = try? EncodedRecord(bytes) else {
                            report.problems.append("\(type.name) index \(index.name): entry for missing record \(id)")
                            return true
                        }
                        guard let expected = try? indexKey(index, layout, record) else {
                            // Reported with the record above.
                            return true
                        }
                        if expected.bytes != key {
                            report.problems.append("\(type.name) \(id): stale entry in index \(index.name)")
                        } else if index.unique && !expected.isLossy, (try? lacksUniqueValue(index, layout, record)) == false {
                            holdersUnderKey += 1
                            if holdersUnderKey > 1 {
                                report.problems.append("\(type.name) \(id): unique index \(index.name) holds \(holdersUnderKey) records for one value")
                            }
                        }
                        return true
                    }
                }
            }
            // Records under a type tag the schema does not know.
            var strayTags = Set<UInt16>()
            try txn.scan(dbs.records, from: ScanStart<[UInt8]>.first) { key, _ in
                if key.count >= 2 {
                    let tag = UInt16(key[0]) << 8 | UInt16(key[1])
                    if !knownTags.contains(tag) { strayTags.insert(tag) }
                }
                return true
            }
            for tag in strayTags.sorted() { report.problems.append("records under type tag \(tag), unknown to the schema") }
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
                let sequence = key.count == 8 ? key.reduce(UInt64(0)) { $0 << 8 | UInt64($1) } : 0
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
                    lastWrite[StoreKeys.record(change.typeTag, change.id).bytes] = (sequence, change.operation == .delete)
                }
                return true
            }
            if purgedThrough < current, expected <= current.sequence {
                report.problems.append("history entries \(expected)...\(current.sequence) are missing")
            }
            for (key, last) in lastWrite {
                let stored = try txn.contains(dbs.records, key: key)
                let name = catalog.layoutsByTag[UInt16(key[0]) << 8 | UInt16(key[1])]?.schema.name ?? "type#\(UInt16(key[0]) << 8 | UInt16(key[1]))"
                let id = StoreKeys.id(fromRecordKey: key).map(\.description) ?? "?"
                if last.deleted && stored {
                    report.problems.append("\(name) \(id): deleted by history entry \(last.sequence) but still stored")
                } else if !last.deleted && !stored {
                    report.problems.append("\(name) \(id): written by history entry \(last.sequence) but not stored")
                }
            }
            if purgedThrough == .beginning {
                try txn.scan(dbs.records, from: ScanStart<[UInt8]>.first) { key, _ in
                    if lastWrite[key] == nil {
                        let name = key.count >= 2 ? catalog.layoutsByTag[UInt16(key[0]) << 8 | UInt16(key[1])]?.schema.name ?? "?" : "?"
                        report.problems.append("\(name) \(StoreKeys.id(fromRecordKey: key).map(\.description) ?? "?"): stored but absent from history")
                    }
                    return true
                }
            }
            return report
        }
    }
}
