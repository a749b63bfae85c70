import Foundation

/// One caller's write, waiting to be committed (see ``Environment/write(isolation:_:)``).
final class PendingWrite: @unchecked Sendable {
    /// Where the write stands. Changed under the queue's lock only.
    enum State {
        /// Waiting to run, or to run again after its group was rolled back.
        case queued
        /// Taken by the leader: its closure runs, its changes wait in the leader's open
        /// transaction, or they are committed and the leader has not let its caller go yet.
        /// Only the leader settles it.
        case claimed
        /// Settled: the caller may return.
        case done
    }

    /// The caller's closure. It runs on the thread leading the group while the caller waits
    /// in ``WriteQueue/submit(_:lead:)``, so the caller's stack outlives every use of it; the
    /// write is settled (and the closure dropped) before the caller returns.
    private var work: ((WriteTransaction) throws -> Void)?
    /// The caller's thread (`pthread_self`), to recognize a caller inside a read transaction.
    let thread: UInt
    /// The caller is isolated to an actor (the main actor, say): its closure, isolated to the
    /// same actor, runs on the caller's thread, alone in its transaction. Run by another
    /// writer's thread it ran off its actor (UI code off the main thread). Nor does such a
    /// caller run other writers' closures: the main thread would stall for their work.
    let pinned: Bool
    /// Set by the leader while it holds the write: nil once committed, the reason otherwise.
    /// Set by ``WriteQueue/refuse(where:error:)`` for a write refused before it ran.
    var error: (any Error)?
    fileprivate(set) var state = State.queued

    init(thread: UInt, pinned: Bool = false, _ body: @escaping (WriteTransaction) throws -> Void) {
        self.thread = thread
        self.pinned = pinned
        work = body
    }

    /// Runs the caller's closure (again, when the group reruns after growing the map).
    func body(_ txn: WriteTransaction) throws {
        try work?(txn)
    }

    /// Marks the write settled and lets go of the closure. Called under the queue's lock.
    fileprivate func finish() {
        work = nil
        state = .done
    }
}

/// The writes waiting for the disk, and which thread commits them (leader/follower group
/// commit): a caller that finds no commit in progress leads one, taking every write queued
/// so far; callers that arrive meanwhile wait, and the first of them to wake leads the next
/// group with all of them. A pinned write (of an actor-isolated caller) is only ever led by
/// its own caller, alone.
///
/// A write is claimed by the leader before its closure runs and stays claimed until the
/// leader settles it (after its commit) or puts it back (after a roll-back). A write that is
/// not claimed, and is not the leader's own, can be refused by another thread
/// (``refuse(where:error:)``): a map resize does so for the writes of threads inside a read,
/// which would otherwise wait for the resize while it waits for them. It may have run in an
/// attempt rolled back before; a refused write is never committed.
final class WriteQueue: @unchecked Sendable {
    private let condition = NSCondition()
    private var pending: [PendingWrite] = []
    /// The group the leader is committing.
    private var inFlight: [PendingWrite] = []
    private var leading = false
    /// The thread leading the group in flight (0: none). Its own write is never refused from
    /// outside: it holds a transaction because it writes, not because it reads, and a leader
    /// never waits for a resize while it holds one.
    private var leader: UInt = 0
    /// Size of the last group: how many writers are active right now.
    private var lastGroup = 1

    /// Writes queued and not yet taken by a leader (for tests and diagnostics).
    var waiting: Int {
        condition.lock()
        defer { condition.unlock() }
        return pending.count
    }

    /// Queues `request` and returns once it is settled, having led a group with `lead` if no
    /// other thread did. `lead` claims and settles the requests it commits or fails; those it
    /// leaves queued (a leader that cannot grow the map hands them on) go back to the head of
    /// the queue for the next leader.
    func submit(_ request: PendingWrite, lead: ([PendingWrite]) -> Void) {
        condition.lock()
        pending.append(request)
        while true {
            while leading && request.state != .done { condition.wait() }
            if request.state == .done {
                condition.unlock()
                return
            }
            // No commit in progress and this request still queued: lead a group.
            leading = true
            let batch: [PendingWrite]
            if request.pinned {
                batch = [request]
                pending.removeAll { $0 === request }
            } else {
                gatherWriters()
                if pending.contains(where: \.pinned) {
                    batch = pending.filter { !$0.pinned }
                    pending.removeAll { !$0.pinned }
                } else {
                    batch = pending
                    pending.removeAll(keepingCapacity: true)
                }
            }
            inFlight = batch
            leader = request.thread
            lastGroup = batch.count
            condition.unlock()

            lead(batch)

            condition.lock()
            var handedOn = 0
            for request in batch {
                switch request.state {
                case .claimed: request.finish()
                case .queued:
                    pending.insert(request, at: handedOn)
                    handedOn += 1
                case .done: break
                }
            }
            inFlight.removeAll(keepingCapacity: true)
            leader = 0
            leading = false
            condition.broadcast()
            // Unless this request was handed on too, it is settled.
        }
    }

    /// Claims the requests of `requests` that are still queued (refused ones are left out)
    /// and returns them; the caller (the leader) must settle them.
    func claim(_ requests: [PendingWrite]) -> [PendingWrite] {
        condition.lock()
        defer { condition.unlock() }
        var claimed: [PendingWrite] = []
        claimed.reserveCapacity(requests.count)
        for request in requests where request.state == .queued {
            request.state = .claimed
            claimed.append(request)
        }
        return claimed
    }

    /// Claims `request` if it is still queued; false when it was refused meanwhile.
    func claim(_ request: PendingWrite) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard request.state == .queued else { return false }
        request.state = .claimed
        return true
    }

    /// Lets the caller of a claimed request go: the leader has set its outcome.
    func settle(_ request: PendingWrite) {
        condition.lock()
        if request.state == .claimed {
            request.finish()
            condition.broadcast()
        }
        condition.unlock()
    }

    /// Puts claimed requests back to queued: the leader rolled their changes back and will
    /// run them again, and meanwhile they may be refused.
    func unclaim(_ requests: [PendingWrite]) {
        condition.lock()
        for request in requests where request.state == .claimed { request.state = .queued }
        condition.unlock()
    }

    /// Settles with `error` every queued (not claimed) request, waiting or in the group being
    /// committed, whose caller's thread satisfies `isCaught`, and wakes their callers.
    /// - Returns: how many requests were refused.
    @discardableResult
    func refuse(where isCaught: (UInt) -> Bool, error: any Error) -> Int {
        condition.lock()
        defer { condition.unlock() }
        var refused = 0
        for request in pending + inFlight where request.state == .queued && request.thread != leader && isCaught(request.thread) {
            request.error = error
            request.finish()
            refused += 1
        }
        guard refused > 0 else { return 0 }
        pending.removeAll { $0.state == .done }
        condition.broadcast()
        return refused
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
