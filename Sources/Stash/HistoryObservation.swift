import Foundation

/// Committed history entries as they happen: an `AsyncSequence` that delivers every entry
/// after its commit, in order, without gaps — including commits made by other processes on
/// the same store directory.
///
/// ```swift
/// let updates = store.changes(of: ["Item"])   // starts here, whenever the task runs
/// let task = Task {
///     for try await entry in updates {
///         print(entry.sequence, entry.changes)
///     }
/// }
/// …
/// task.cancel()   // ends the sequence cleanly
/// ```
///
/// The starting point belongs to the sequence value: iterating it again (or later) replays
/// from there, and throws `.historyPurged` if that history was purged meanwhile. To follow
/// only what comes next, call `changes()` again.
///
/// The observer polls the newest sequence number (one short read transaction per poll, by
/// default every 10 ms), so delivery latency is the poll interval plus the read, well under
/// 50 ms, and the same for commits of other processes, as long as the iterating task gets a
/// thread. It polls and resumes on Swift's concurrency pool (one thread per core), and
/// ``Store/write(author:isolation:_:)`` blocks its calling thread until the commit is
/// durable: many tasks writing at once hold the pool's threads, and the observer waits its
/// turn (20 tasks inserting on 2 cores: a median of about 400 ms; the same writes on threads
/// of their own: under 15 ms). Keep bulk writers off the pool, or few, when delivery must be
/// prompt: the async `try await store.write { }` holds no pool thread while it waits. For a
/// query result that follows commits, see ``LiveQuery``. Reading is pull-based: a slow consumer never blocks writers; it simply reads more
/// entries at its next step. If history the observer has not read yet is purged, iteration
/// throws `.historyPurged`.
public struct HistoryObservation: AsyncSequence, Sendable {
    public typealias Element = HistoryEntry
    let store: Store
    let types: Set<String>?
    let start: HistoryToken?
    let pollInterval: Duration

    public func makeAsyncIterator() -> Iterator {
        Iterator(store: store, types: types, token: start, pollInterval: pollInterval)
    }

    public struct Iterator: AsyncIteratorProtocol {
        let store: Store
        let types: Set<String>?
        /// The last sequence looked at (including entries filtered out by `types`).
        var token: HistoryToken?
        let pollInterval: Duration
        var buffer: [HistoryEntry] = []
        /// The next entry of `buffer` to deliver.
        var position = 0

        public mutating func next() async throws -> HistoryEntry? {
            // Cancelled: the sequence ends, even with entries of the last page left.
            if Task.isCancelled { return nil }
            if token == nil { token = try store.currentToken() }
            while position == buffer.count {
                if Task.isCancelled { return nil }
                let page = try store.historyPage(after: token!, types: types, limit: 256)
                buffer = page.entries
                position = 0
                token = page.scannedThrough
                // A page cut short (a long run of other types) goes on at once.
                if buffer.isEmpty && page.reachedEnd {
                    do { try await Task.sleep(for: pollInterval) } catch { return nil }   // cancelled
                }
            }
            position += 1
            return buffer[position - 1]
        }
    }
}

extension Store {
    /// Committed changes as they happen (see ``HistoryObservation``).
    /// - Parameters:
    ///   - types: only entries touching these types (with only their changes); nil for all.
    ///   - token: deliver entries after this token; nil (default) starts at the commit current
    ///     when `changes` is called, so writes made after the call are delivered however late
    ///     iteration begins (a task started to iterate may run after the writes that follow).
    ///   - pollInterval: how often to look for commits. Default 10 ms.
    public func changes(of types: Set<String>? = nil, after token: HistoryToken? = nil,
                        pollInterval: Duration = .milliseconds(10)) -> HistoryObservation {
        // Should the read fail, iteration takes the token when it begins (and throws then).
        HistoryObservation(store: self, types: types, start: token ?? (try? currentToken()), pollInterval: pollInterval)
    }
}
