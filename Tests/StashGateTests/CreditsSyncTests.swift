import Foundation
import Stash
import StashGate
import StashSync
import Testing

/// The same story through the real sync engine: two devices, one relay-free direct link.
@Suite struct CreditsSyncTests {
    @Test func creditsFollowTheUserAcrossDevicesThroughSync() throws {
        let family = RecordID()
        let a = try Fixture(), b = try Fixture()
        let engineA = try SyncEngine(store: a.store, configuration: SyncConfiguration(family: family, enabled: true))
        let engineB = try SyncEngine(store: b.store, configuration: SyncConfiguration(family: family, enabled: true))
        func sync() throws {
            _ = try engineA.sync(via: DirectTransport(to: engineB))
            _ = try engineB.sync(via: DirectTransport(to: engineA))
        }
        // Device A spends one; B has not started yet.
        try a.gate.spendCredit(operationID: "a1")
        try sync()
        #expect(b.gate.credits() == 2)                     // the free credits were not granted twice
        #expect(try b.gate.spendCredit(operationID: "a1") == .alreadySpent(remaining: 2))
        // Both spend concurrently, both buy the same pack, then sync.
        try a.gate.spendCredit(operationID: "a2")
        try b.gate.spendCredit(operationID: "b1")
        let purchase = try signed([Tx.pack("p1", credits: 10)], sequence: 1)
        try a.gate.apply(purchase)
        try b.gate.apply(purchase)
        try sync()
        try sync()
        #expect(a.gate.credits() == 3 - 3 + 10)
        #expect(b.gate.credits() == a.gate.credits())
        // Replays after sync are no-ops everywhere.
        #expect(try a.gate.spendCredit(operationID: "b1") == .alreadySpent(remaining: 10))
    }
}
