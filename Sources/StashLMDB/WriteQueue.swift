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

    /// The caller's closure. It runs in its turn (see ``WriteQueue/runInTurn(_:_:)``) while
    /// the caller waits in ``WriteQueue/submit(_:lead:)``: on the caller's thread when
    /// ``ownThread``, else on the leader's. Either way the caller's stack outlives every use
    /// of it; the write is settled (and the closure dropped) before the caller returns.
    private var work: ((WriteTransaction) throws -> Void)?
    /// The caller's thread (`pthread_self`), to recognize a caller inside a read transaction.
    let thread: UInt
    /// The caller is isolated to an actor (the main actor, say): it never leads other
    /// writers' group, so that it waits for their closures only when it queued behind them.
    let pinned: Bool
    /// The closure must run on the caller's thread: the caller runs in a Swift task (whose
    /// `@TaskLocal` values and cancellation the closure must see) or is isolated to an actor.
    /// A caller outside both (a plain `Thread`, a Dispatch queue) lets the leader run its
    /// closure, which saves a thread switch per grouped write.
    let ownThread: Bool
    /// Set by the leader while it holds the write: nil once committed, the reason otherwise.
    /// Set by ``WriteQueue/refuse(where:error:)`` for a write refused before it ran.
    var error: (any Error)?
    fileprivate(set) var state = State.queued
    /// Where the caller's thread sleeps while it waits.
    fileprivate let spot = WakeSpot()

    init(thread: UInt, pinned: Bool = false, ownThread: Bool = true, _ body: @escaping (WriteTransaction) throws -> Void) {
        self.thread = thread
        self.pinned = pinned
        self.ownThread = pinned || ownThread
        work = body
    }

    /// Runs the caller's closure (again, when the group reruns after growing the map). Call
    /// it only in this write's turn (a step of ``WriteQueue/runInTurn(_:_:)``), which runs on
    /// the right thread.
    func body(_ txn: WriteTransaction) throws {
        try work?(txn)
    }

    /// Marks the write settled, lets go of the closure and wakes its caller. Called under
    /// the queue's lock.
    fileprivate func finish() {
        work = nil
        state = .done
        spot.wake()
    }
}

/// The writes waiting for the disk, and which thread commits them (leader/follower group
/// commit): a caller that finds no commit in progress leads one, taking every write queued
/// so far; callers that arrive meanwhile wait, and the first of them leads the next group
/// with all of them. A pinned write (of an actor-isolated caller) leads a group of its own
/// only, but may be led in another writer's group.
///
/// The leader holds the one write transaction, but the closure of a caller in a task or on
/// an actor runs on its caller's thread (``runInTurn(_:_:)``): the transaction passes to the
/// waiting caller and on, in order, and back to the leader. So such a closure runs in its
/// caller's task (`@TaskLocal` values, cancellation) and on its actor. LMDB allows this: a
/// write transaction is used by one thread at a time, and only beginning and ending the
/// top-level transaction (the write mutex) must happen on one thread, the leader's. The
/// leader runs the other closures itself: a thread switch costs more than a small insert
/// (on the two-core VM of BENCHMARKS.md, ~45 µs against ~30 µs).
///
/// A write is claimed by the leader before its closure runs and stays claimed until the
/// leader settles it (after its commit) or puts it back (after a roll-back). A write that is
/// not claimed, and is not the leader's own, can be refused by another thread
/// (``refuse(where:error:)``): a map resize does so for the writes of threads inside a read,
/// which would otherwise wait for the resize while it waits for them. It may have run in an
/// attempt rolled back before; a refused write is never committed.
///
/// Each waiting caller sleeps on a condition of its own (sharing the queue's mutex), so the
/// queue wakes only the caller it has news for: its write settled, its turn to run its
/// closure, or its turn to lead.
final class WriteQueue: @unchecked Sendable {
    private let lock = WaitLock()
    private var pending: [PendingWrite] = []
    /// The group the leader is committing.
    private var inFlight: [PendingWrite] = []
    /// The request whose caller leads the group in flight (nil: none).
    private var leading: PendingWrite?
    /// The closures being run one after the other (see ``runInTurn(_:_:)``), if any.
    private var turns: Turns?
    /// Size of the last group: how many writers are active right now.
    private var lastGroup = 1

    /// Writes queued and not yet taken by a leader (for tests and diagnostics).
    var waiting: Int {
        lock.lock()
        defer { lock.unlock() }
        return pending.count
    }

    /// Queues `request` and returns once it is settled, having led a group with `lead` if no
    /// other thread did, and having run its closure whenever the leader asked. `lead` claims
    /// and settles the requests it commits or fails; those it leaves queued (a leader that
    /// cannot grow the map hands them on) go back to the head of the queue for the next
    /// leader.
    func submit(_ request: PendingWrite, lead: ([PendingWrite]) -> Void) {
        lock.lock()
        pending.append(request)
        while true {
            if request.state == .done {
                // Woken to lead, perhaps, and refused meanwhile: pass the turn on.
                wakeNextLeader()
                lock.unlock()
                return
            }
            if let turns, let current = turns.current, runner(of: current) === request {
                lock.unlock()
                let goOn = turns.step?(request) ?? false
                lock.lock()
                pass(turns, goOn: goOn)
                continue
            }
            if leading != nil {
                lock.wait(request.spot)
                continue
            }
            // No commit in progress and this request still queued: lead a group.
            leading = request
            let batch: [PendingWrite]
            if request.pinned {
                batch = [request]
                pending.removeAll { $0 === request }
            } else {
                gatherWriters()
                batch = pending
                pending.removeAll(keepingCapacity: true)
            }
            inFlight = batch
            lastGroup = batch.count
            lock.unlock()

            lead(batch)

            lock.lock()
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
            leading = nil
            wakeNextLeader()
            // Unless this request was handed on too, it is settled.
        }
    }

    /// Runs `step` for each of `requests`, in order, until one returns false; returns once
    /// the last step ran. Called by the leader only, with requests it claimed. `step` runs
    /// the request's closure (``PendingWrite/body(_:)``) in the leader's open transaction,
    /// and whatever must go with it (a nested transaction's begin and end, checks). A step
    /// runs on its caller's thread when the request needs it (``PendingWrite/ownThread``),
    /// else on the leader's; the steps run one at a time, each thread handing the turn
    /// straight to the next (one wake-up per step that changes thread).
    func runInTurn(_ requests: [PendingWrite], _ step: (PendingWrite) -> Bool) {
        guard !requests.isEmpty else { return }
        withoutActuallyEscaping(step) { step in
            lock.lock()
            defer { lock.unlock() }
            guard let leader = leading else { preconditionFailure("runInTurn outside a group") }
            let turns = Turns(requests, step)
            self.turns = turns
            runner(of: turns.current)?.spot.wake()
            while let current = turns.current {
                if runner(of: current) === leader {
                    lock.unlock()
                    let goOn = step(current)
                    lock.lock()
                    pass(turns, goOn: goOn)
                } else {
                    lock.wait(leader.spot)
                }
            }
            // `step` is non-escaping: nothing may keep it past this call.
            turns.step = nil
            self.turns = nil
        }
    }

    /// Ends the current turn and wakes whoever runs next: the next request's caller, or the
    /// leader when the turns are over (`goOn` false, or none left). Called with the lock held.
    private func pass(_ turns: Turns, goOn: Bool) {
        turns.next = goOn ? turns.next + 1 : turns.requests.count
        runner(of: turns.current)?.spot.wake()
    }

    /// Whose thread runs `request`'s turn: its caller's when it needs its own thread, the
    /// leader's otherwise, and the leader's after the last turn (`request` nil). Called with
    /// the lock held.
    private func runner(of request: PendingWrite?) -> PendingWrite? {
        guard let request, request.ownThread else { return leading }
        return request
    }

    /// Wakes the caller at the head of the queue when no group is in flight: it leads next.
    /// Called with the lock held.
    private func wakeNextLeader() {
        if leading == nil, let next = pending.first { next.spot.wake() }
    }

    /// Claims the requests of `requests` that are still queued (refused ones are left out)
    /// and returns them; the caller (the leader) must settle them.
    func claim(_ requests: [PendingWrite]) -> [PendingWrite] {
        lock.lock()
        defer { lock.unlock() }
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
        lock.lock()
        defer { lock.unlock() }
        guard request.state == .queued else { return false }
        request.state = .claimed
        return true
    }

    /// Lets the caller of a claimed request go: the leader has set its outcome.
    func settle(_ request: PendingWrite) {
        lock.lock()
        if request.state == .claimed { request.finish() }
        lock.unlock()
    }

    /// Puts claimed requests back to queued: the leader rolled their changes back and will
    /// run them again, and meanwhile they may be refused.
    func unclaim(_ requests: [PendingWrite]) {
        lock.lock()
        for request in requests where request.state == .claimed { request.state = .queued }
        lock.unlock()
    }

    /// Settles with `error` every queued (not claimed) request, waiting or in the group being
    /// committed, whose caller's thread satisfies `isCaught`, and wakes their callers.
    /// - Returns: how many requests were refused.
    @discardableResult
    func refuse(where isCaught: (UInt) -> Bool, error: any Error) -> Int {
        lock.lock()
        defer { lock.unlock() }
        var refused = 0
        for request in pending + inFlight where request.state == .queued && request !== leading && isCaught(request.thread) {
            request.error = error
            request.finish()
            refused += 1
        }
        guard refused > 0 else { return 0 }
        pending.removeAll { $0.state == .done }
        wakeNextLeader()
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
            lock.unlock()
            sched_yield()
            lock.lock()
        }
    }
}

/// The requests of a group whose closures run one after the other, each on its caller's
/// thread (see ``WriteQueue/runInTurn(_:_:)``). Changed under the queue's lock only.
private final class Turns {
    let requests: [PendingWrite]
    /// Runs a request's turn; dropped once the turns are over.
    var step: ((PendingWrite) -> Bool)?
    /// Index of the request whose turn it is; `requests.count` once the turns are over.
    var next = 0

    init(_ requests: [PendingWrite], _ step: @escaping (PendingWrite) -> Bool) {
        self.requests = requests
        self.step = step
    }

    /// The request whose turn it is, nil once the turns are over.
    var current: PendingWrite? { next < requests.count ? requests[next] : nil }
}

/// A mutex whose waiters each sleep on a condition of their own (``WakeSpot``), so that the
/// thread holding it wakes exactly the waiter it has news for (an `NSCondition` can only wake
/// one arbitrary waiter, or all of them).
final class WaitLock: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>

    init() {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    func lock() { pthread_mutex_lock(mutex) }
    func unlock() { pthread_mutex_unlock(mutex) }

    /// Sleeps on `spot` until it is woken (or spuriously: callers recheck their condition).
    /// Called, and returns, with the lock held.
    func wait(_ spot: WakeSpot) { pthread_cond_wait(spot.condition, mutex) }
}

/// One waiter's condition variable, used with a ``WaitLock``.
final class WakeSpot: @unchecked Sendable {
    fileprivate let condition: UnsafeMutablePointer<pthread_cond_t>

    init() {
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        pthread_cond_init(condition, nil)
    }

    deinit {
        pthread_cond_destroy(condition)
        condition.deinitialize(count: 1)
        condition.deallocate()
    }

    /// Wakes the thread sleeping on this spot, if any. Call with the lock held.
    func wake() { pthread_cond_signal(condition) }
}
