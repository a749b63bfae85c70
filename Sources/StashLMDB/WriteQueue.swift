import Foundation

/// One caller's write, waiting to be committed (see ``Environment/write(_:)``).
final class PendingWrite: @unchecked Sendable {
    /// The caller's closure. It runs on the thread leading the group while the caller waits
    /// in ``WriteQueue/submit(_:lead:)``, so the caller's stack outlives every use of it; the
    /// leader drops it before the caller returns (it wraps a non-escaping closure).
    private var work: ((WriteTransaction) throws -> Void)?
    /// Set by the leader: nil once the write is committed, the reason otherwise.
    var error: (any Error)?
    /// Set (under the queue's lock) once the leader has finished with this write.
    fileprivate(set) var done = false

    init(_ body: @escaping (WriteTransaction) throws -> Void) {
        work = body
    }

    /// Runs the caller's closure (again, when the group reruns after growing the map).
    func body(_ txn: WriteTransaction) throws {
        try work?(txn)
    }

    /// Marks the write finished and lets go of the closure. Called under the queue's lock.
    fileprivate func finish() {
        work = nil
        done = true
    }
}

/// The writes waiting for the disk, and which thread commits them (leader/follower group
/// commit): a caller that finds no commit in progress leads one, taking every write queued
/// so far; callers that arrive meanwhile wait, and the first of them to wake leads the next
/// group with all of them.
final class WriteQueue: @unchecked Sendable {
    private let condition = NSCondition()
    private var pending: [PendingWrite] = []
    private var leading = false
    /// Size of the last group: how many writers are active right now.
    private var lastGroup = 1

    /// Writes queued and not yet taken by a leader (for tests and diagnostics).
    var waiting: Int {
        condition.lock()
        defer { condition.unlock() }
        return pending.count
    }

    /// Queues `request` and returns once it is done, having led a group with `lead` if no
    /// other thread did. `lead` must set every request's outcome.
    func submit(_ request: PendingWrite, lead: ([PendingWrite]) -> Void) {
        condition.lock()
        pending.append(request)
        while leading && !request.done { condition.wait() }
        if request.done {
            condition.unlock()
            return
        }
        // No commit in progress and this request still queued: lead a group.
        leading = true
        gatherWriters()
        let batch = pending
        pending.removeAll(keepingCapacity: true)
        lastGroup = batch.count
        condition.unlock()

        lead(batch)

        condition.lock()
        for request in batch { request.finish() }
        leading = false
        condition.broadcast()
        condition.unlock()
    }

    /// When the last group had several writers, they were just woken by its end and are about
    /// to queue their next writes: give them a moment (at most ~100 µs, yielding the CPU)
    /// before taking the batch, so the group is not just this writer while they are on their
    /// way. A lone writer never waits. Called and returns with the lock held.
    private func gatherWriters() {
        guard lastGroup > 1, pending.count < lastGroup else { return }
        let deadline = DispatchTime.now().uptimeNanoseconds + 100_000
        while pending.count < lastGroup, DispatchTime.now().uptimeNanoseconds < deadline {
            condition.unlock()
            sched_yield()
            condition.lock()
        }
    }
}
