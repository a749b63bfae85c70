import Foundation
import Synchronization

// The async API: reads and writes that suspend their caller instead of blocking its thread.
extension Store {
    /// Runs `body` in one write transaction, as ``write(author:isolation:_:)`` does, and
    /// suspends the calling task until the commit is durable instead of blocking its thread.
    ///
    /// ```swift
    /// @MainActor func addLamp() async throws {
    ///     let item = Item(homeID: homeID, name: "Lamp")
    ///     try await store.write { tx in try tx.insert(item) }   // the main actor runs on meanwhile
    /// }
    /// ```
    ///
    /// `body` runs on one of the library's worker threads (a pool of at most 32, started on
    /// demand), never on the caller's thread, the main thread or a thread of Swift's
    /// cooperative pool, so neither the main actor nor the pool waits for the disk or for
    /// other writers. Async writes from many tasks are committed together by group commit
    /// (with each other and with synchronous writers), each closure in the shared
    /// transaction with a history entry of its own. Because it runs outside the caller's
    /// task, `body` sees no `@TaskLocal` value of the caller, and `Task.isCancelled` inside
    /// it is false: the call itself checks cancellation before `body` runs (also before it
    /// runs again, see below) and then throws `CancellationError` with nothing written; once
    /// committed, a write stays committed and its result is returned. As with the synchronous
    /// write, `body` may run more than once (the map grew, a write of its group threw), so it
    /// must only change the store.
    ///
    /// Cost: two thread hand-offs (to a worker and back to the caller's executor), tens of
    /// microseconds, on top of the write itself; see BENCHMARKS.md.
    /// - Throws: what `body` throws; ``StoreError`` as the synchronous write does;
    ///   `.closed` when the store was closed before the call; `CancellationError`.
    @discardableResult
    public func write<R: Sendable>(author: String? = nil,
                                   _ body: @escaping @Sendable (StoreTransaction) throws -> R) async throws -> R {
        try await offload { store, call in
            try store.performWrite(author: author) { tx in
                if call.isCancelled { throw CancellationError() }
                return try body(tx)
            }
        }
    }

    /// Runs `body` on a consistent read-only snapshot, as ``read(_:)`` does, on one of the
    /// library's worker threads: the calling task suspends meanwhile, and its thread (the
    /// main thread, a thread of the cooperative pool) stays free for other work, however long
    /// the read takes or waits for pages from the disk.
    ///
    /// For a short read off the main actor, the synchronous ``read(_:)`` costs less (no
    /// thread hand-off, about 20–50 µs). `body` runs outside the caller's task, like an async
    /// write's.
    /// - Throws: what `body` throws; ``StoreError``; `.closed`; `CancellationError` when the
    ///   task was cancelled before the read began.
    public func read<R: Sendable>(_ body: @escaping @Sendable (StoreSnapshot) throws -> R) async throws -> R {
        try await offload { store, _ in try store.performRead(body) }
    }

    /// Runs `work` on a worker thread and resumes the caller with its outcome. Counted as in
    /// flight for ``close()``, which waits for it.
    private func offload<R: Sendable>(_ work: @escaping @Sendable (Store, AsyncCall) throws -> R) async throws -> R {
        try Task.checkCancellation()
        guard runtime.beginAsync() else { throw closedError() }
        let call = AsyncCall()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<R, any Error>) in
                BlockingWorkers.shared.submit { [self] in
                    defer { runtime.endAsync() }
                    if call.isCancelled {
                        continuation.resume(throwing: CancellationError())
                        return
                    }
                    do {
                        continuation.resume(returning: try work(self, call))
                    } catch {
                        continuation.resume(throwing: error)
                    }
                }
            }
        } onCancel: {
            call.cancelled.store(true, ordering: .relaxed)
        }
    }
}

/// One async call's cancellation, seen by the worker thread.
final class AsyncCall: Sendable {
    let cancelled = Atomic<Bool>(false)
    var isCancelled: Bool { cancelled.load(ordering: .relaxed) }
}
