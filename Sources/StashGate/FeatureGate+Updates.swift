import Foundation
import Stash
import Synchronization

/// One state of the premium access, as published by ``FeatureGate/updates()``.
public struct EntitlementChange: Sendable, Hashable, CustomStringConvertible {
    /// The premium entitlement per the snapshot.
    public let entitlement: EntitlementDecision
    /// The tier in force (entitlement, trial or override).
    public let tier: Tier
    /// Where the tier's answer came from.
    public let reason: EvaluationReason
    /// The wall-clock instant the change was noticed.
    public let detectedAt: Date

    var key: Key { Key(status: entitlement.status, entitlementReason: entitlement.reason, tier: tier, reason: reason,
                       sequence: entitlement.snapshotSequence) }

    struct Key: Hashable {
        let status: EntitlementStatus
        let entitlementReason: EvaluationReason
        let tier: Tier
        let reason: EvaluationReason
        let sequence: UInt64?
    }

    public var description: String { "tier \(tier.rawValue) (\(reason.summary)); \(entitlement)" }
}

/// The premium access as it changes: the current state first, then one element per change
/// (a snapshot applied here or by another process, an entitlement or trial expiring, the
/// snapshot going stale). Ends when the consuming task is cancelled, or once the gate's
/// store is closed (`Store.close()`).
///
/// ```swift
/// for await change in gate.updates() {
///     paywall.isUnlocked = change.tier == .premium
/// }
/// ```
/// Each iteration polls on a thread of its own (``GateConfiguration/updatePollInterval``,
/// default 100 ms), off the Swift concurrency pool, so a busy pool delays delivery but never
/// detection: an expiry is noticed within the poll interval of its instant. A poll allocates
/// nothing unless something changed and costs one metadata lookup (two with a local trial
/// and ``FeatureGate/recordTypes``; after a commit, one lookup of the user's trial record, which
/// sync may have changed) (snapshots cached by
/// other processes). The poller also saves the highest time seen once a minute.
public struct EntitlementUpdates: AsyncSequence, Sendable {
    public typealias Element = EntitlementChange
    public typealias Failure = Never
    let gate: FeatureGate

    public func makeAsyncIterator() -> AsyncStream<EntitlementChange>.Iterator {
        let (stream, continuation) = AsyncStream.makeStream(of: EntitlementChange.self, bufferingPolicy: .unbounded)
        let poller = UpdatePoller(gate: gate, continuation: continuation)
        continuation.onTermination = { _ in poller.stop() }
        poller.start()
        return stream.makeAsyncIterator()
    }
}

/// Polls one gate on its own thread and yields changes. A thread of its own (not a
/// dispatch queue or a task) keeps detection on time when the shared pools are busy.
final class UpdatePoller: @unchecked Sendable {
    private let gate: FeatureGate
    private let continuation: AsyncStream<EntitlementChange>.Continuation
    private let stopped = Atomic(false)
    /// Touched by the polling thread only.
    private var last: EntitlementChange.Key?

    init(gate: FeatureGate, continuation: AsyncStream<EntitlementChange>.Continuation) {
        self.gate = gate
        self.continuation = continuation
    }

    func start() {
        let interval = gate.configuration.updatePollInterval.components
        let seconds = max(0.001, Double(interval.seconds) + Double(interval.attoseconds) / 1e18)
        startNamedThread("stash.gate", stackSize: 1 << 20) { [self] in
            while !stopped.load(ordering: .acquiring) {
                if gate.store.isClosed {   // Store.close() ends the updates
                    continuation.finish()
                    return
                }
                poll()
                Thread.sleep(forTimeInterval: seconds)
            }
        }
    }

    func stop() {
        stopped.store(true, ordering: .releasing)
    }

    private func poll() {
        gate.refresh()
        gate.saveClockIfMoved(threshold: 60_000)
        let change = gate.currentChange()
        if change.key != last {
            last = change.key
            continuation.yield(change)
        }
    }
}

extension FeatureGate {
    /// The premium access now and at every change (see ``EntitlementUpdates``).
    public func updates() -> EntitlementUpdates { EntitlementUpdates(gate: self) }

    /// The premium access now, as ``updates()`` publishes it.
    public func currentChange() -> EntitlementChange {
        let reference = clockGuard.referenceMilliseconds
        let access = access(at: reference)
        return EntitlementChange(entitlement: entitlement(at: reference), tier: access.tier, reason: access.reason,
                                 detectedAt: clockGuard.wall())
    }

    /// Saves the highest time seen now. Call it when the app goes to the background or
    /// quits; the gate also saves it at open, with snapshots, authorized writes, credit spends
    /// and grants, and in the background once it moved by a minute when checks, ``tier``,
    /// ``entitlement()`` or ``trialStatus()`` read it (see ``ClockGuard``).
    public func persistClock() throws {
        _ = clockGuard.referenceMilliseconds
        guard clockGuard.needsSave(threshold: 1) else { return }
        do { try store.write(author: "gate") { tx in try saveState(in: tx) } }
        catch let error as StoreError { throw GateError(.storage, "gate: cannot save the clock in store \(store.path): \(error.message)", underlying: error) }
    }

    /// Saves the highest time seen when it moved by `threshold` ms or more since the last save.
    func saveClockIfMoved(threshold: Int64) {
        _ = clockGuard.referenceMilliseconds
        guard clockGuard.needsSave(threshold: threshold) else { return }
        _ = try? store.write(author: "gate") { tx in
            try refresh(from: tx)   // a clock another process settled meanwhile is not raised again
            try saveState(in: tx, threshold: threshold)
        }
    }

    /// Saves the highest time seen (read now) into the gate's state in `tx` when it moved by
    /// `threshold` ms or more since the last save, with the earliest trial start this gate
    /// knows for its user; reads nothing when the clock has not moved that far.
    func saveState(in tx: StoreTransaction, threshold: Int64 = 0) throws {
        _ = clockGuard.referenceMilliseconds
        guard clockGuard.needsSave(threshold: threshold) else { return }
        let trialStart = hot.withLock { $0.trialStart }
        try GateState.update(in: tx) { state in
            clockGuard.save(into: &state, in: tx, threshold: threshold)
            var user = state.user(userDigest)
            if trialStart < user.trialStart {
                user.trialStart = trialStart
                state.set(user)
            }
        }
    }

    /// From the hot path (checks, ``tier``, ``entitlement()``, ``trialStatus()``): when the
    /// reference time moved by a minute since the last save, saves it on a background thread
    /// (never inside the caller's transaction, which may be a write of this store).
    func saveClockInBackgroundIfMoved() {
        guard clockGuard.needsSave(threshold: 60_000) else { return }
        guard backgroundSave.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return }
        startNamedThread("stash.clock") { [self] in
            saveClockIfMoved(threshold: 60_000)
            backgroundSave.store(false, ordering: .releasing)
        }
    }
}
