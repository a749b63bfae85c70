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
