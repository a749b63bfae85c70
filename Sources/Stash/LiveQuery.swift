import Foundation
import Synchronization

/// A query result that follows the store: an `AsyncSequence` whose first element is the
/// current result and whose next ones are fresh results after commits that may change it,
/// made in this process or another. Made by ``Store/observe(_:pollInterval:)``,
/// ``Store/observeCount(_:pollInterval:)``, ``Store/observeCount(_:equals:pollInterval:)`` and
/// ``Store/observe(types:pollInterval:_:)``.
///
/// ```swift
/// let lamps = FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == homeID }, sortBy: [SortDescriptor(\.name)])
/// for try await items in store.observe(lamps) {   // the items now, then after each commit to Item
///     model.items = items
/// }
/// ```
///
/// - **What wakes it**: only commits that touch one of the observed types (history says
///   which); a commit to other types costs a query nothing. Commits of this process wake it
///   at once; another process's commit is seen at the next poll (every `pollInterval`,
///   default 10 ms), which reads no record: one `mdb_env_info` call, no transaction.
/// - **Coalescing**: the result is evaluated when the consumer asks for the next element
///   and a commit may have changed it since the last one, never for each commit: a consumer
///   slower than the commits gets the newest result, once. A fetch delivers its result
///   after each such commit (also when it reads the same); a count delivers only a changed
///   value.
/// - **Where the work runs**: on one thread per store with live queries (started with the
///   first, ended with the last), which evaluates every waiting query of a commit in one read
///   snapshot; the consumer's task (the main actor, say) only receives the result.
/// - **End**: cancelling the consuming task, or leaving its `for` loop, ends the query.
///   Iteration throws the error of a query that fails (a predicate that throws), and
///   `.closed` when the store is closed; the sequence ends after it.
///
/// The sequence value may be iterated more than once: each iterator is a query of its own,
/// starting with the current result.
public struct LiveQuery<Element: Sendable>: AsyncSequence, Sendable {
    public typealias Failure = any Error
    let store: Store
    let types: Set<String>
    let pollInterval: Duration
    let evaluate: @Sendable (StoreSnapshot) throws -> Element
    let isDuplicate: (@Sendable (Element, Element) -> Bool)?

    public func makeAsyncIterator() -> Iterator {
        let query = LiveObserver(types: types, evaluate: evaluate, isDuplicate: isDuplicate)
        do {
            return Iterator(handle: ObserverHandle(query: query, watcher: try CommitWatcher.add(query, to: store, pollInterval: pollInterval)))
        } catch {
            query.failBeforeStart(error)
            return Iterator(handle: ObserverHandle(query: query, watcher: nil))
        }
    }

    public struct Iterator: AsyncIteratorProtocol {
        let handle: ObserverHandle<Element>

        /// The next result: the current one first, then one after each commit that may
        /// change it (see ``LiveQuery``). Nil once the consuming task is cancelled.
        public mutating func next() async throws -> Element? {
            try await handle.query.next(watcher: handle.watcher)
        }
    }
}

/// Keeps an iterator's query registered while the iterator lives.
final class ObserverHandle<Element: Sendable>: Sendable {
    let query: LiveObserver<Element>
    /// The watcher the query is registered with (nil: it could not be).
    let watcher: CommitWatcher?

    init(query: LiveObserver<Element>, watcher: CommitWatcher?) {
        self.query = query
        self.watcher = watcher
    }

    deinit {
        watcher?.remove(query)
    }
}

/// One iterator's query: its state is guarded by its watcher's lock (or its own, before it
/// has a watcher).
final class LiveObserver<Element: Sendable>: WatchedQuery, @unchecked Sendable {
    let types: Set<String>
    private let evaluator: @Sendable (StoreSnapshot) throws -> Element
    private let isDuplicate: (@Sendable (Element, Element) -> Bool)?
    // Under the watcher's lock:
    private var dirty = true
    private var continuation: CheckedContinuation<Element?, any Error>?
    private var last: Element?
    private var finished = false
    private var pendingError: (any Error)?

    init(types: Set<String>, evaluate: @escaping @Sendable (StoreSnapshot) throws -> Element,
         isDuplicate: (@Sendable (Element, Element) -> Bool)?) {
        self.types = types
        evaluator = evaluate
        self.isDuplicate = isDuplicate
    }

    var needsResult: Bool { dirty && continuation != nil && !finished }

    func markDirty() { dirty = true }

    func evaluate(_ snapshot: StoreSnapshot) -> () -> Void {
        let outcome = Result { try evaluator(snapshot) }
        return { [self] in
            guard let continuation, !finished else { return }
            dirty = false
            switch outcome {
            case .success(let value):
                if let last, let isDuplicate, isDuplicate(last, value) { return }   // unchanged: keep waiting
                last = value
                self.continuation = nil
                continuation.resume(returning: value)
            case .failure(let error):
                finished = true
                self.continuation = nil
                continuation.resume(throwing: error)
            }
        }
    }

    func end(_ error: (any Error)?) {
        guard !finished else { return }
        finished = true
        if let continuation {
            self.continuation = nil
            if let error { continuation.resume(throwing: error) } else { continuation.resume(returning: nil) }
        } else {
            pendingError = error
        }
    }

    /// The query could not be registered (the store is closed): the first `next()` throws.
    func failBeforeStart(_ error: any Error) {
        finished = true
        pendingError = error
    }

    func next(watcher: CommitWatcher?) async throws -> Element? {
        guard let watcher else {
            // Never registered, or its watcher is gone (the store closed): what is left to say.
            if let error = pendingError {
                pendingError = nil
                throw error
            }
            return nil
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Element?, any Error>) in
                let wake: Bool = watcher.locked {
                    if finished {
                        if let error = pendingError {
                            pendingError = nil
                            continuation.resume(throwing: error)
                        } else {
                            continuation.resume(returning: nil)
                        }
                        return false
                    }
                    self.continuation = continuation
                    return dirty
                }
                if wake { watcher.wake() }
            }
        } onCancel: {
            watcher.locked { end(nil) }
        }
    }
}

extension Store {
    /// The records matching `descriptor`, now and after every commit to `R` (see
    /// ``LiveQuery``): like SwiftData's `@Query`, GRDB's `ValueObservation`.
    ///
    /// Each result is a full ``fetch(_:)`` in a fresh snapshot, with its cost (a sort reads
    /// every match), evaluated once per commit to `R` while the consumer waits, never more.
    /// - Parameter pollInterval: how often another process's commits are looked for
    ///   (this process's commits are seen at once). Default 10 ms.
    public func observe<R: Record>(_ descriptor: FetchDescriptor<R>, pollInterval: Duration = .milliseconds(10)) -> LiveQuery<[R]> {
        LiveQuery(store: self, types: [R.recordType], pollInterval: pollInterval,
                  evaluate: { try $0.fetch(descriptor) }, isDuplicate: nil)
    }

    /// The number of records matching `descriptor`'s predicate (``fetchCount(_:)``), now and
    /// whenever a commit to `R` changes it (see ``LiveQuery``). O(1) per commit for an index
    /// equality the index answers alone, or no predicate.
    public func observeCount<R: Record>(_ descriptor: FetchDescriptor<R>, pollInterval: Duration = .milliseconds(10)) -> LiveQuery<Int> {
        LiveQuery(store: self, types: [R.recordType], pollInterval: pollInterval,
                  evaluate: { try $0.fetchCount(descriptor) }, isDuplicate: { $0 == $1 })
    }

    /// The number of records whose indexed field equals `value` (``count(_:equals:)``), now
    /// and whenever a commit to `R` changes it (see ``LiveQuery``): one `mdb_cursor_count` per
    /// commit to `R`.
    public func observeCount<R: Record, V: IndexableValue>(_ index: IndexHandle<R, V>, equals value: V,
                                                         pollInterval: Duration = .milliseconds(10)) -> LiveQuery<Int> {
        LiveQuery(store: self, types: [R.recordType], pollInterval: pollInterval,
                  evaluate: { try $0.count(index, equals: value) }, isDuplicate: { $0 == $1 })
    }

    /// Whatever `body` reads, now and after every commit to one of `types` (see
    /// ``LiveQuery``): several types, a record by id, a value computed from reads. `body`
    /// runs on the watcher's thread in a read snapshot, and must only read.
    public func observe<T: Sendable>(types: [any Record.Type], pollInterval: Duration = .milliseconds(10),
                                     _ body: @escaping @Sendable (StoreSnapshot) throws -> T) -> LiveQuery<T> {
        LiveQuery(store: self, types: Set(types.map { $0.recordType }), pollInterval: pollInterval, evaluate: body, isDuplicate: nil)
    }
}
