import Foundation
import StashLMDB
import Synchronization

/// What a ``Store`` keeps beside its data: whether it is closed, the async calls in flight,
/// and the live queries that follow its commits.
final class StoreRuntime: Sendable {
    private let closed = Atomic<Bool>(false)
    /// Async calls accepted and not finished yet (``Store/close()`` waits for them).
    private let inFlight = Mutex(0)
    private let drained = NSCondition()
    /// Tells the live queries of every store of this directory in this process about commits.
    let signal: CommitSignal
    /// This store's live queries, while it has any.
    let watcher = Mutex<CommitWatcher?>(nil)

    init(path: String) {
        signal = CommitSignal.forPath(path)
    }

    @inline(__always)
    var isClosed: Bool { closed.load(ordering: .relaxed) }

    /// Marks the store closed; true when this call closed it (it was open).
    func markClosed() -> Bool {
        closed.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
    }

    /// Counts an async call in; false once the store is closed.
    func beginAsync() -> Bool {
        drained.lock()
        defer { drained.unlock() }
        guard !isClosed else { return false }
        inFlight.withLock { $0 += 1 }
        return true
    }

    func endAsync() {
        drained.lock()
        let left = inFlight.withLock { count in
            count -= 1
            return count
        }
        if left == 0 { drained.broadcast() }
        drained.unlock()
    }

    /// Waits until no async call is in flight.
    func waitForAsyncCalls() {
        drained.lock()
        while inFlight.withLock({ $0 }) > 0 { drained.wait() }
        drained.unlock()
    }

    /// A commit of this store: wakes the live queries of the directory, if any. One atomic
    /// load when there are none.
    @inline(__always)
    func committed() {
        if signal.isWatched { signal.notify() }
    }
}

extension Store {
    /// Throws ``StoreError/Code/closed`` once ``close()`` was called. One atomic load.
    @inline(__always)
    func checkOpen() throws {
        if runtime.isClosed { throw closedError() }
    }

    func closedError() -> StoreError {
        StoreError(.closed, "store \(path) was closed (Store.close()); open it again with Store.open to go on")
    }

    /// Whether ``close()`` was called.
    public var isClosed: Bool { runtime.isClosed }

    /// Closes the store: every later call on it (reads, writes, counts, live queries, a
    /// ``SyncEngine`` or gate built on it) throws ``StoreError/Code/closed``.
    ///
    /// It waits for the async reads and writes called before it to finish (their callers get
    /// their results), and ends the store's live queries (their iteration throws `.closed`).
    /// The LMDB environment (file descriptors, map, reader slots) is closed once no other
    /// open `Store` of the directory in this process uses it, after the transactions still
    /// running on it end; the next ``open(at:types:options:)`` opens it anew, so a directory
    /// replaced meanwhile (a backup restored over it) is read as it now is. Closing twice does
    /// nothing more. A store that is released without `close()` closes the same way.
    /// - Throws: `.nestedWrite` when called inside a read or write closure of the store's
    ///   directory on this thread (the close would wait for that transaction): call it after
    ///   the closure returns. Nothing is closed then.
    public func close() throws {
        if runtime.isClosed { return }
        if env.isInTransactionOnThisThread {
            throw StoreError(.nestedWrite, "store \(path): close() was called inside a read or write closure of the store on this thread, and the close would wait for that transaction to end; call close() after the closure returns")
        }
        guard runtime.markClosed() else { return }
        runtime.watcher.withLock { $0 }?.storeClosed(closedError())
        runtime.waitForAsyncCalls()
        env.releaseHandle()
    }
}
