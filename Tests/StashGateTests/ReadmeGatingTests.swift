import Foundation
import Stash
import StashGate
import StashTestSupport
import Testing

/// The README's Gating example as a user copies it, with the outputs its comments show. Keep
/// the two in step: a change of the README's example changes this test.
@Suite struct ReadmeGatingTests {
    @Test func theGatingExamplePrintsWhatTheReadmeSays() throws {
        let dir = TemporaryDirectory()
        let server = Ed25519SnapshotSigner(keyID: "k1")   // the server's key pair
        let publicKey = server.publicKey
        let store = try Store.open(at: dir.sub("store"), types: [Home.self, Item.self] + FeatureGate.recordTypes)
        let verifier = try Ed25519SnapshotVerifier(publicKeys: ["k1": publicKey])
        var config = GateConfiguration(userID: "u1", verifier: verifier)
        config.freeFeatures = ["quickTimer", "articles"]
        config.limits = [.maxRecords(Home.self, 1).named("homes"),
                         .maxRecords(Item.self, 10, per: \.homeID, of: Home.self)]
        config.trialLength = 7 * 86_400
        let clock = TestClock(instant(0))
        config.clock = clock.function
        let gate = try FeatureGate.open(store, configuration: config)
        clock.set(instant(8 * day))   // the trial is over

        let home = Home(name: "Flat")
        try store.write { tx in
            try gate.authorize(.create(Home.self), in: tx)
            try tx.insert(home)
            for n in 0..<10 {
                try gate.authorize(.create(Item.self, in: home.id), in: tx)
                try tx.insert(Item(homeID: home.id, name: "\(n)"))
            }
        }
        #expect("\(gate.check(.use("intervalTimer")))" == "denied: trialExpired (tier free: no snapshot yet)")
        #expect("\(gate.check(.create(Item.self, in: home.id)))"
                == "denied: itemLimitReached (Item per Home: 10 of 10 in \(home.id)) (tier free: no snapshot yet)")
        let error = #expect(throws: GateError.self) {
            try store.write { tx in try gate.authorize(.create(Item.self, in: home.id), in: tx) }
        }
        #expect(error?.code == .denied)

        let yearly = PurchaseTransaction(id: "t1", productID: "pro.yearly", type: .autoRenewable, entitlements: ["pro"],
                                         purchasedAt: instant(0), expiresAt: Date(timeIntervalSince1970: 1_798_761_600), period: .yearly)
        try gate.apply(server.sign(EntitlementSnapshot(userID: "u1", sequence: 1, serverTime: instant(8 * day), transactions: [yearly])))
        let relaunched = try FeatureGate.open(store, configuration: config)
        #expect("\(relaunched.entitlement())" == "pro: subscribed (cached snapshot) until 2027-01-01T00:00:00.000Z")

        for n in 1...3 { try gate.spendCredit(operationID: "request-\(n)") }
        #expect(gate.creditBalance()?.description == "0 available (granted 3, spent 3)")
    }
}
