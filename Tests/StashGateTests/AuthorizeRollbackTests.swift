import Foundation
import Stash
@testable import StashGate
import StashTestSupport
import Testing

/// ``FeatureGate/authorize(_:in:)`` decides by the entitlement its transaction sees, and keeps
/// what it saw only once that transaction commits.
@Suite struct AuthorizeRollbackTests {
    struct RolledBack: Error {}

    /// A snapshot written in the transaction (as an `apply` earlier in the same group commit
    /// leaves it, not committed yet) and then rolled back: the gate held on to its premium
    /// tier, and every later check let the free user past the limits until the next launch.
    @Test func aSnapshotSeenInAWriteThatRollsBackIsNotKept() throws {
        let f = try Fixture()
        _ = try f.addHome()   // the free tier's one home
        let lifetime = try signed([Tx.lifetime("l1")]).encoded()
        #expect(throws: RolledBack.self) {
            try f.store.write { tx in
                try tx.setMetadata(lifetime, for: f.gate.snapshotKey)
                // Inside the transaction the grant is what the store holds: premium, no limit.
                #expect(try f.gate.authorize(.create(Home.self), in: tx).isAllowed)
                throw RolledBack()
            }
        }
        #expect(f.gate.tier == .free)
        #expect(f.gate.snapshot == nil)
        #expect(f.gate.check(.create(Home.self)).denial == .homeLimitReached)
        #expect(f.createHome() == .homeLimitReached)

        // The same write committed: the gate takes the snapshot up.
        try f.store.write { tx in
            try tx.setMetadata(lifetime, for: f.gate.snapshotKey)
            #expect(try f.gate.authorize(.create(Home.self), in: tx).isAllowed)
            try tx.insert(Home(name: "second"))
        }
        #expect(f.gate.tier == .premium)
        #expect(f.gate.snapshot?.transactions.map(\.id) == ["l1"])
        #expect(f.gate.entitlement().reason == .cached)
    }

    /// Another process applied a newer snapshot that settled a clock once set ahead: a write
    /// here decides by that snapshot and that clock at once, as it did when it took both up
    /// before deciding, and the gate takes both up when the write commits.
    @Test func aWriteDecidesByTheClockAnotherProcessSettled() throws {
        let f = try Fixture(start: instant(0))
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)], sequence: 1, server: 0))
        let other = try FeatureGate.open(f.store, configuration: f.configuration)   // another process
        f.clock.set(instant(365 * day))
        // The clock read a year ahead (`referenceTime` starts no background save, which
        // would look at the store).
        #expect(f.gate.clockGuard.referenceTime == instant(365 * day))
        f.clock.set(instant(day))   // put right
        try other.apply(try signed([Tx.subscription("t1", expires: 30 * day)], sequence: 2, server: day))
        #expect(other.tier == .premium)
        #expect(f.gate.snapshot?.sequence == 1, "this gate has not looked at the store yet")
        let decision = try f.store.write { tx in try f.gate.authorize(.use("sync"), in: tx) }
        #expect(decision.isAllowed, "\(decision)")
        #expect(f.gate.snapshot?.sequence == 2)
        #expect(f.gate.clockGuard.referenceTime == instant(day))
        #expect(f.gate.tier == .premium)
        // The write did not raise the settled clock again in the store.
        #expect(try FeatureGate.open(f.store, configuration: f.configuration).clockGuard.referenceTime == instant(day))
    }

    /// A snapshot that does not verify, seen in a write: decided by the one in force, and
    /// recorded as rejected only once the write commits (as `refresh()` does).
    @Test func anInvalidSnapshotSeenInAWriteLeavesTheOneInForce() throws {
        let f = try Fixture()
        try f.gate.apply(try signed([Tx.lifetime("l1")]))
        var forged = try signed([Tx.lifetime("l2")], sequence: 2).encoded()
        forged[forged.count / 2] ^= 1
        try f.store.write { tx in
            try tx.setMetadata(forged, for: f.gate.snapshotKey)
            #expect(try f.gate.authorize(.create(Home.self), in: tx).isAllowed)
        }
        #expect(f.gate.tier == .premium)
        #expect(f.gate.snapshot?.sequence == 1)
        #expect(f.gate.entitlement().error != nil)
    }
}
