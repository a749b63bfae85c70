import Foundation
import Stash
import StashGate
import StashSync
import StashTestSupport
import Testing

/// The same story through the real sync engine: two devices, one relay-free direct link.
@Suite struct CreditsSyncTests {
    @Test func creditsFollowTheUserAcrossDevicesThroughSync() async throws {
        let family = RecordID()
        let a = try Fixture(), b = try Fixture()
        let engineA = try SyncEngine(store: a.store, configuration: SyncConfiguration(family: family, enabled: true))
        let engineB = try SyncEngine(store: b.store, configuration: SyncConfiguration(family: family, enabled: true))
        func sync() async throws {
            _ = try await engineA.sync(via: DirectTransport(to: engineB))
            _ = try await engineB.sync(via: DirectTransport(to: engineA))
        }
        // Device A spends one; B has not started yet.
        try a.gate.spendCredit(operationID: "a1")
        try await sync()
        #expect(b.gate.credits() == 2)                     // the free credits were not granted twice
        #expect(try b.gate.spendCredit(operationID: "a1") == .alreadySpent(remaining: 2))
        // Both spend concurrently, both buy the same pack, then sync.
        try a.gate.spendCredit(operationID: "a2")
        try b.gate.spendCredit(operationID: "b1")
        let purchase = try signed([Tx.pack("p1", credits: 10)], sequence: 1)
        try a.gate.apply(purchase)
        try b.gate.apply(purchase)
        try await sync()
        try await sync()
        #expect(a.gate.credits() == 3 - 3 + 10)
        #expect(b.gate.credits() == a.gate.credits())
        // Replays after sync are no-ops everywhere.
        #expect(try a.gate.spendCredit(operationID: "b1") == .alreadySpent(remaining: 10))
    }

    /// Two devices of one user sync through a relay folder.
    final class TwoDevices {
        let relayDirectory = TemporaryDirectory("relay")
        let a: Fixture, b: Fixture
        let engineA: SyncEngine, engineB: SyncEngine
        let family = RecordID()

        init(startA: Date = instant(0), startB: Date = instant(0), _ configure: @escaping (inout GateConfiguration) -> Void = { _ in }) throws {
            a = try Fixture(start: startA, configure: configure)
            b = try Fixture(start: startB, configure: configure)
            engineA = try SyncEngine(store: a.store, configuration: SyncConfiguration(family: family, enabled: true))
            engineB = try SyncEngine(store: b.store, configuration: SyncConfiguration(family: family, enabled: true))
        }

        /// A sends, B receives and sends, A receives: both hold everything.
        func sync() async throws {
            let relay = RelayTransport(directory: relayDirectory.url)
            _ = try await engineA.sync(via: relay)
            _ = try await engineB.sync(via: relay)
            _ = try await engineA.sync(via: relay)
        }
    }

    /// One operation spent on two devices before they sync is one spend: it counted on each
    /// device that spent it (each knew only its own spend).
    @Test func anOperationSpentOnTwoDevicesCountsOnceThroughARelay() async throws {
        let devices = try TwoDevices()
        let (a, b) = (devices.a, devices.b)
        #expect(try a.gate.spendCredit(operationID: "generate-42") == .spent(remaining: 2))
        #expect(try b.gate.spendCredit(operationID: "generate-42") == .spent(remaining: 2))   // a retried request
        try await devices.sync()
        for gate in [a.gate, b.gate] {
            #expect(gate.creditBalance() == CreditBalance(granted: 3, spent: 1))
            #expect(gate.credits() == 2)
            #expect(try gate.spendCredit(operationID: "generate-42") == .alreadySpent(remaining: 2))
        }
        #expect(try a.store.count(CreditOperation.self) == 1 && b.store.count(CreditOperation.self) == 1)
    }

    /// Two devices spend the last credits offline: once synced, more was spent than granted.
    /// The balance was shown as 0 over a counter at -2; it is a debt now, in the API, paid
    /// first by the next purchase, and refused spends say so.
    @Test func anOfflineOverspendIsADebtPaidByTheNextGrant() async throws {
        let devices = try TwoDevices()
        let (a, b) = (devices.a, devices.b)
        try await devices.sync()   // both know the account with its 3 free credits
        for n in 0..<3 { try a.gate.spendCredit(operationID: "a\(n)") }
        for n in 0..<2 { try b.gate.spendCredit(operationID: "b\(n)") }
        #expect(a.gate.credits() == 0 && b.gate.credits() == 1)
        try await devices.sync()
        for gate in [a.gate, b.gate] {
            let balance = try #require(gate.creditBalance())
            #expect(balance == CreditBalance(granted: 3, spent: 5) && balance.available == 0 && balance.debt == 2, "\(balance)")
            #expect(balance.description.contains("debt 2"), "\(balance)")
            let refused = #expect(throws: GateError.self) { try gate.spendCredit(operationID: "more") }
            #expect(refused?.code == .insufficientCredits && refused?.message.contains("2 owed") == true, "\(String(describing: refused))")
        }
        // A pack of 5 on one device: 2 pay the debt, 3 are left, on both once synced.
        try a.gate.apply(try signed([Tx.pack("p1", credits: 5)], sequence: 1))
        #expect(a.gate.creditBalance() == CreditBalance(granted: 8, spent: 5) && a.gate.credits() == 3)
        try await devices.sync()
        #expect(b.gate.credits() == 3 && b.gate.creditBalance()?.debt == 0)
    }

    /// The same through the command line: stores made by `stash init`, spends by `stash gate
    /// DIR spend-credit`, sync by `stash sync --relay`; `credits` and `status` show the debt.
    @Test func theCommandLineShowsTheDebt() async throws {
        let dir = TemporaryDirectory()
        let (storeA, _) = try GateCLI.makeStore(in: dir)
        let storeB = dir.sub("store-b")
        #expect(try GateCLI.run("init", storeB, "--schema", dir.sub("schema.json")).status == 0)
        let relay = dir.sub("relay")
        try FileManager.default.createDirectory(atPath: relay, withIntermediateDirectories: true)
        let family = RecordID().description
        func sync() async throws {
            for store in [storeA, storeB, storeA] {
                let result = try GateCLI.run("sync", store, "--relay", relay, "--family", family)
                #expect(result.status == 0, "\(result.stderr)")
            }
        }
        #expect(try GateCLI.run("gate", storeA, "credits", "--user", "u1").stdout == "credits     3 available (granted 3, spent 0)\n")
        #expect(try GateCLI.run("gate", storeB, "credits", "--user", "u1").status == 0)
        try await sync()
        for n in 0..<2 { #expect(try GateCLI.run("gate", storeA, "spend-credit", "a\(n)", "--user", "u1").status == 0) }
        for n in 0..<2 { #expect(try GateCLI.run("gate", storeB, "spend-credit", "b\(n)", "--user", "u1").status == 0) }
        // a0, spent on A too (not synced yet), spends B's last credit; once synced it is one
        // spend: a0, a1, b0, b1 of 3 granted.
        let same = try GateCLI.run("gate", storeB, "spend-credit", "a0", "--user", "u1")
        #expect(same.status == 0 && same.stdout == "spent 1 credit for a0: 0 left\n", "\(same.stdout) \(same.stderr)")
        try await sync()
        for store in [storeA, storeB] {
            let credits = try GateCLI.run("gate", store, "credits", "--user", "u1")
            #expect(credits.stdout.hasPrefix("credits     0 available (granted 3, spent 4); debt 1"), "\(credits.stdout)")
            let status = try GateCLI.run("gate", store, "status", "--user", "u1")
            #expect(status.stdout.contains("credits     0 available (granted 3, spent 4); debt 1"), "\(status.stdout)")
            let again = try GateCLI.run("gate", store, "spend-credit", "a0", "--user", "u1")
            #expect(again.status == 0 && again.stdout == "a0 was spent before: nothing spent, 0 left\n", "\(again.stdout)")
            let refused = try GateCLI.run("gate", store, "spend-credit", "c0", "--user", "u1")
            #expect(refused.status == 3 && refused.stderr.contains("1 owed"), "\(refused.stderr)")
        }
    }
}
