import CLMDB
import Foundation
import Synchronization

/// Who holds an ``Environment`` open: the handles its users took (a `Store` takes one per
/// open and gives it back at `close()` or when it goes away), and whether it was closed.
final class EnvironmentLifecycle: Sendable {
    private let state = Mutex<(handles: Int, closing: Bool)>((0, false))
    private let closed = Atomic<Bool>(false)

    /// Whether the environment was closed: every later transaction throws. One atomic load.
    @inline(__always)
    var isClosed: Bool { closed.load(ordering: .acquiring) }

    func closedError(_ path: String, _ operation: String) -> LMDBError {
        LMDBError(code: .closed, operation: operation, path: path,
                  detail: "every store of this directory in this process was closed; open it again")
    }

    /// Takes a handle; false when the environment is closing (open it again).
    func retain() -> Bool {
        state.withLock { state in
            guard !state.closing else { return false }
            state.handles += 1
            return true
        }
    }

    /// Gives a handle back; true when it was the last one: the caller closes the environment.
    func release() -> Bool {
        state.withLock { state in
            state.handles -= 1
            guard state.handles == 0, !state.closing else { return false }
            state.closing = true
            return true
        }
    }

    /// The close that ``release()`` asked for will not happen now: handles may be taken again.
    func cancelClosing() { state.withLock { $0.closing = false } }

    func markClosed() { closed.store(true, ordering: .releasing) }
}

extension Environment {
    /// Takes a handle on the environment for a user that will give it back with
    /// ``releaseHandle()`` (a `Store`): the environment closes, before the last reference to
    /// it goes away, once every handle taken was given back.
    /// - Returns: false when the environment is closing: open the path again
    ///   (``Environment/open(path:configuration:)`` then waits for the close and opens anew).
    public func retainHandle() -> Bool { lifecycle.retain() }

    /// Whether the calling thread is inside a transaction of this environment (a read, a
    /// write, or a grouped write closure): it cannot wait for a close.
    public var isInTransactionOnThisThread: Bool { gate.isHeldByCurrentThread }

    /// Gives back a handle of ``retainHandle()``. The last one closes the environment: the
    /// close waits for the transactions of this process still open on it to end, then
    /// closes the LMDB environment (its file descriptors, its map, its reader slots), and
    /// every later transaction on it throws ``LMDBError/Code/closed``. An open of the
    /// directory meanwhile waits for the close, then opens it anew. When the calling thread
    /// is inside a transaction of the environment (``isInTransactionOnThisThread``), which
    /// the close would wait for, the environment stays open, and closes when its last
    /// reference goes away.
    /// - Returns: whether this call closed the environment.
    @discardableResult
    public func releaseHandle() -> Bool {
        guard lifecycle.release() else { return false }
        if gate.isHeldByCurrentThread {
            lifecycle.cancelClosing()
            return false
        }
        EnvironmentRegistry.shared.closeEarly(self) {
            // Waits for every transaction of this process on the environment to end; new ones
            // wait meanwhile, and find it closed. Not this thread's own: checked above.
            _ = try? gate.exclusive(whileWaiting: { _ in }) { () throws(LMDBError) in
                lifecycle.markClosed()
                pool.close()
                mdb_env_close(env)
            }
        }
        return true
    }
}
