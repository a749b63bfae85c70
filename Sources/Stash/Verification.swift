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
                    for index in type.indexes {
                        let key = try indexKey(index, layout, record)
                        if try !txn.containsDuplicate(dbs.index, key: key, value: id.bytes) {
                            report.problems.append("\(type.name) \(id): missing from index \(index.name)")
                        }
                    }
                    return true
                }
                let stored = Int(LittleEndian.uint64(try txn.get(dbs.counts, key: StoreKeys.count(type.tag))) ?? 0)
                if stored != actual {
                    report.problems.append("\(type.name): stored count \(stored) but \(actual) records")
                }
                for index in type.indexes {
                    var lastKey: [UInt8]?
                    var idsUnderKey = 0
                    try txn.scan(dbs.index, prefix: StoreKeys.indexPrefix(type.tag, index.tag)) { key, value in
                        report.indexEntriesChecked += 1
                        if key == lastKey { idsUnderKey += 1 } else { idsUnderKey = 1; lastKey = key }
                        guard let id = RecordID(bytes: value[...]) else {
                            report.problems.append("\(type.name) index \(index.name): malformed id of \(value.count) bytes")
                            return true
                        }
                        guard let bytes = try txn.get(dbs.records, key: StoreKeys.record(type.tag, id)),
                              let record = try? EncodedRecord(bytes) else {
                            report.problems.append("\(type.name) index \(index.name): entry for missing record \(id)")
                            return true
                        }
                        let expected = try indexKey(index, layout, record)
                        if expected.bytes != key {
                            report.problems.append("\(type.name) \(id): stale entry in index \(index.name)")
                        } else if index.unique && idsUnderKey > 1 && !expected.isLossy {
                            report.problems.append("\(type.name) \(id): unique index \(index.name) holds \(idsUnderKey) records for one value")
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
            // History: well-formed entries, increasing sequence below the next number.
            let next = LittleEndian.uint64(try txn.get(dbs.meta, key: MetaKey.nextSequence)) ?? 1
            try txn.scan(dbs.history, from: ScanStart<[UInt8]>.first) { key, value in
                report.historyEntriesChecked += 1
                let sequence = key.count == 8 ? key.reduce(UInt64(0)) { $0 << 8 | UInt64($1) } : 0
                if key.count != 8 || sequence == 0 || sequence >= next {
                    report.problems.append("history entry with key \(key) outside 1..<\(next)")
                } else if (try? HistoryEntry.decodeStored(value)) == nil {
                    report.problems.append("history entry \(sequence) cannot be decoded")
                }
                return true
            }
            return report
        }
    }
}
