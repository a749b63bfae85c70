import Foundation
import Stash
import Synchronization

/// The reference time for every gating decision: the highest of the wall clock, the highest
/// time ever seen (persisted in the store) and the latest snapshot's server time.
///
/// Rolling the device clock back therefore never extends a trial, a subscription or the
/// offline allowance: the reference time stays at the highest instant seen. Reading it is
/// lock-free and allocation-free (one clock read and an atomic maximum).
///
/// A clock once set ahead (or a bad server time) would otherwise hold the reference time in
/// the future for good, every subscription expired or stale until real time caught up: a
/// verified snapshot newer than the one in force is the authority it yields to, and the
/// highest time seen comes down to that snapshot's server time (``settle(at:in:)``).
///
/// The highest time seen is saved in the gate's sealed state (``GateState``, metadata key
/// `gate.state`) whenever the gate writes (open, snapshots, authorized writes, credit spends
/// and grants), by ``FeatureGate/updates()``, and in the background once it moved by a minute
/// when the gate reads the clock (``FeatureGate/check(_:)``, ``FeatureGate/tier``,
/// ``FeatureGate/entitlement()``, ``FeatureGate/trialStatus()``). Call
/// ``FeatureGate/persistClock()`` when the app goes to the background: a background save
/// may not have run when the app is killed.
public final class ClockGuard: Sendable {
    /// The wall clock.
    public let wall: @Sendable () -> Date
    private let highest: Atomic<Int64>
    /// The value last written to the store (so writes happen only when it moved).
    private let saved: Atomic<Int64>

    init(wall: @escaping @Sendable () -> Date) {
        self.wall = wall
        highest = Atomic(Int64.min)
        saved = Atomic(Int64.min)
    }

    /// The reference time in milliseconds since 1970.
    var referenceMilliseconds: Int64 {
        observe(milliseconds(wall()))
    }

    /// The reference time.
    public var referenceTime: Date { dateFromMilliseconds(referenceMilliseconds) }

    /// The highest instant seen so far (without reading the wall clock).
    public var highestSeen: Date { dateFromMilliseconds(highest.load(ordering: .acquiring)) }

    /// Raises the highest time seen to `instant` (ms) if it is higher; returns the new highest.
    @discardableResult
    func observe(_ instant: Int64) -> Int64 {
        var current = highest.load(ordering: .acquiring)
        while instant > current {
            let (exchanged, original) = highest.compareExchange(expected: current, desired: instant, ordering: .acquiringAndReleasing)
            if exchanged { return instant }
            current = original
        }
        return current
    }

    /// Lowers the highest time seen to `instant` (ms), in memory and in `state`: called with
    /// the server time of a verified snapshot newer than the one in force, in the transaction
    /// that stores that snapshot. Memory is lowered at once, so that a save serialized behind
    /// this transaction cannot write the higher time back (a rolled-back settle leaves memory
    /// low until the next launch reads the store).
    func settle(at instant: Int64, into state: inout GateState) {
        lower(to: instant)
        state.clock = instant
    }

    /// Takes the stored highest time as it is, lower or not: what another process settled
    /// together with the newer snapshot this process has just read (``settle(at:into:)``).
    func adopt(_ stored: Int64) {
        lower(to: stored)
        observe(stored)
    }

    private func lower(to instant: Int64) {
        Self.lower(highest, to: instant)
        Self.lower(saved, to: instant)
    }

    private static func lower(_ value: borrowing Atomic<Int64>, to instant: Int64) {
        var current = value.load(ordering: .acquiring)
        while current > instant {
            let (exchanged, original) = value.compareExchange(expected: current, desired: instant, ordering: .acquiringAndReleasing)
            if exchanged { return }
            current = original
        }
    }

    /// Takes the persisted highest time in: observed, and counted as saved.
    func load(_ stored: Int64) {
        observe(stored)
        raiseSaved(to: stored)
    }

    /// Puts the highest time seen into `state` when it moved by at least `threshold` ms since
    /// the last save (never lowering the stored value, whatever other processes wrote). The
    /// save counts as done once `tx` commits: a rolled-back save (a denied
    /// ``FeatureGate/authorize(_:in:)``) is written again by the next one.
    func save(into state: inout GateState, in tx: StoreTransaction, threshold: Int64 = 0) {
        guard needsSave(threshold: threshold) else { return }
        let value = highest.load(ordering: .acquiring)
        let stored = state.clock
        if stored > value { observe(stored) }
        let newest = max(stored, value)
        if newest == stored {
            raiseSaved(to: stored)   // already in the store
        } else {
            state.clock = newest
            tx.afterCommit { [self] in raiseSaved(to: newest) }
        }
    }

    /// True when the highest time seen moved by `threshold` ms or more since the last save.
    func needsSave(threshold: Int64) -> Bool {
        let last = saved.load(ordering: .acquiring)
        return last == Int64.min || millisecondsBetween(highest.load(ordering: .acquiring), last) >= max(threshold, 1)
    }

    private func raiseSaved(to value: Int64) {
        var current = saved.load(ordering: .acquiring)
        while value > current {
            let (exchanged, original) = saved.compareExchange(expected: current, desired: value, ordering: .acquiringAndReleasing)
            if exchanged { return }
            current = original
        }
    }
}

func encodeInt64(_ value: Int64) -> [UInt8] {
    withUnsafeBytes(of: value.littleEndian) { Array($0) }
}

func decodeInt64(_ bytes: [UInt8]) -> Int64? {
    guard bytes.count == 8 else { return nil }
    var value: Int64 = 0
    for (i, byte) in bytes.enumerated() { value |= Int64(byte) << (8 * Int64(i)) }
    return value
}
