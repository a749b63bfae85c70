import Foundation
import StashLMDB

/// Gives the records and history entries of a store written before checksums (store format
/// 2 or 1) their checksum (record format 2, history entry format 2), and its schema one
/// (`meta` key `schemaChecksum`), at its first open for writing, before anything else of the
/// open.
///
/// The values are rewritten in batches of their own write transactions (a large store does
/// not hold all of it in one transaction's dirty pages), each converting values still in
/// format 1, so an upgrade cut short goes on at the next open where it stopped (what is
/// converted stays converted). The store's format moves to 3 in the last batch (for a format-1
/// store, the schema merge does it once it has rebuilt the indexes of format 1). Values of
/// another format are left as they are: `verify` reports them.
enum ChecksumUpgrade {
    /// The store format from which every record and history entry has a checksum.
    static let firstFormat: UInt64 = 3
    /// Values rewritten per write transaction.
    static let batchSize = 4_096

    static func runIfNeeded(_ env: Environment, _ dbs: StoreDatabases, progress: (@Sendable (StoreProgress) -> Void)?) throws {
        let (format, totals) = try env.read { txn -> (UInt64?, (Int, Int)) in
            (try txn.uint64(dbs.meta, key: MetaKey.format),
             (try txn.statistics(dbs.records).entries, try txn.statistics(dbs.history).entries))
        }
        guard let format, format < firstFormat else { return }
        try convert(env, dbs.records, phase: "checksums of records", total: totals.0, progress: progress, EncodedRecord.upgradingFormatOne)
        try convert(env, dbs.history, phase: "checksums of history entries", total: totals.1, progress: progress, HistoryEntry.upgradingFormatOne)
        try env.write { txn in
            if let schema = try txn.get(dbs.meta, key: MetaKey.schema), try txn.get(dbs.meta, key: MetaKey.schemaChecksum) == nil {
                try txn.put(dbs.meta, key: MetaKey.schemaChecksum, uint64: UInt64(Checksum.crc32c(schema)))
            }
            if format >= 2, try txn.uint64(dbs.meta, key: MetaKey.format) ?? 0 < firstFormat {
                try txn.put(dbs.meta, key: MetaKey.format, uint64: firstFormat)
            }
        }
    }

    /// Rewrites, in key order and batches, each value of `db` that `upgrade` converts.
    private static func convert(_ env: Environment, _ db: Database, phase: String, total: Int,
                                progress: (@Sendable (StoreProgress) -> Void)?, _ upgrade: ([UInt8]) -> [UInt8]?) throws {
        guard total > 0 else { return }
        var after: [UInt8]?
        var done = 0
        while true {
            let (seen, last) = try env.write { txn -> (Int, [UInt8]?) in
                var changed: [([UInt8], [UInt8])] = []
                var seen = 0
                var last: [UInt8]?
                let start: ScanStart<[UInt8]> = after.map { .atOrAfter($0) } ?? .first
                try txn.scan(db, from: start) { key, value in
                    if key == after { return true }   // the last key of the batch before
                    seen += 1
                    last = key
                    if let upgraded = upgrade(value) { changed.append((key, upgraded)) }
                    return seen < batchSize
                }
                // Put once the walk is over: the cursor never sees its own database change.
                for (key, value) in changed { try txn.put(db, key: key, value: value) }
                return (seen, last)
            }
            done += seen
            if seen > 0 { progress?(StoreProgress(phase: phase, done: done, total: total)) }
            guard seen == batchSize, let last else { return }
            after = last
        }
    }
}
