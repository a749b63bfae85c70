import Foundation
import Stash

/// The entries of a large delta, read on a thread of their own while the import merges the
/// ones before them: reading a delta is about a quarter of an import's work, and this way it
/// runs beside the merge (on another core) instead of before it.
///
/// Batches are handed over in order through a queue; the reader never blocks, so at worst the
/// whole delta waits in memory, as it did when it was read before the merge. What the reader
/// finds wrong (an entry this library cannot read, bytes after the last entry) comes out of
/// ``next()`` in place of the batch, so the import's transaction fails and nothing of the
/// delta stays.
final class DeltaEntryStream: @unchecked Sendable {
    /// Deltas of at least this many entries are read on a thread of their own: below it, the
    /// thread costs more than it saves.
    static let minimumEntries = 512
    /// Entries per batch. The merge waits for the first one only: it is smaller.
    static let batchSize = 256
    static let firstBatchSize = 64

    /// What the reader hands over.
    private enum Item {
        case entries([RecordState])
        /// After the last entry: the delta's counter fields.
        case end([String: Set<String>]?)
        case failed(any Error)
    }

    // Every field below is read and written under `condition`.
    private let condition = NSCondition()
    private var items: [Item] = []
    private var next = 0
    private var stopped = false
    private var readerDone = false

    /// Starts reading `reader`'s entries on a new thread.
    init(_ reader: DeltaReader) {
        startNamedThread("stash.delta") { [self] in
            var reader = reader
            read(&reader)
        }
    }

    private func read(_ reader: inout DeltaReader) {
        defer {
            condition.lock()
            readerDone = true
            condition.broadcast()
            condition.unlock()
        }
        var size = Self.firstBatchSize
        while true {
            let item: Item
            do {
                item = reader.remaining > 0 ? .entries(try reader.entries(upTo: size)) : .end(try reader.finish())
                size = Self.batchSize
            } catch {
                item = .failed(error)
            }
            condition.lock()
            let stop = stopped
            if !stop { items.append(item) }
            condition.broadcast()
            condition.unlock()
            switch item {
            case .entries where !stop: continue
            default: return
            }
        }
    }

    /// The next batch of entries, in the delta's order; nil after the last one, once what
    /// follows it has been read and checked too.
    /// - Throws: what the reader found wrong (``SyncError``).
    func nextBatch() throws -> [RecordState]? {
        try nextItem().entries
    }

    /// Every entry not taken yet, in order, and the delta's counter fields (nil for format 1):
    /// waits for the reader.
    func rest() throws -> (entries: [RecordState], counterFields: [String: Set<String>]?) {
        var entries: [RecordState] = []
        while true {
            let item = try nextItem()
            guard let batch = item.entries else { return (entries, item.counterFields) }
            entries.append(contentsOf: batch)
        }
    }

    /// The next item the reader handed over (the end stays the next one once reached).
    private func nextItem() throws -> (entries: [RecordState]?, counterFields: [String: Set<String>]?) {
        condition.lock()
        defer { condition.unlock() }
        while next == items.count { condition.wait() }
        switch items[next] {
        case .entries(let entries):
            items[next] = .entries([])   // the merge holds them now
            next += 1
            return (entries, nil)
        case .end(let counterFields):
            return (nil, counterFields)
        case .failed(let error):
            throw error
        }
    }

    /// Stops the reader after its current batch and waits for its thread to end. Call it once
    /// the entries are no longer wanted (after the last one, or when the import gave up).
    func stop() {
        condition.lock()
        stopped = true
        items.removeAll()
        next = 0
        while !readerDone { condition.wait() }
        condition.unlock()
    }
}
