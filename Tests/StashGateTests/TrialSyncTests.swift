import Foundation
import Stash
import StashGate
import StashSync
import StashTestSupport
import Testing

/// The local trial follows the user: its start is a synced per-user record, the earliest
/// start wins in a merge. It was per store: a reinstall or a second device started a fresh one.
@Suite struct TrialSyncTests {
    @Test func aSecondDeviceContinuesTheUsersTrialThroughARelay() async throws {
        let trial: (inout GateConfiguration) -> Void = { $0.trialLength = 7 * 86_400 }
        // The user starts on A at day 0, installs on B at day 3.
        let devices = try CreditsSyncTests.TwoDevices(startA: instant(0), startB: instant(3 * day), trial)
        let (a, b) = (devices.a, devices.b)
        #expect(a.gate.trialStatus().endsAt == instant(7 * day))
        #expect(b.gate.trialStatus().endsAt == instant(10 * day), "offline, B counts from its own first launch")
        try await devices.sync()
        b.gate.refresh()
        #expect(b.gate.trialStatus().endsAt == instant(7 * day), "B continues A's trial")
        #expect(a.gate.trialStatus().endsAt == instant(7 * day), "A keeps its own, the earliest")
        for store in [a.store, b.store] { #expect(try store.count(UserTrial.self) == 1) }
        b.clock.set(instant(8 * day))
        #expect(b.gate.tier == .free && b.gate.check(.use("intervalTimer")).denial == .trialExpired)
        #expect(try b.relaunch().trialStatus().endsAt == instant(7 * day))

        // A third device restored from sync at day 20: a trial of its own until it has synced
        // with the others, then over.
        let c = try Fixture(start: instant(20 * day), configure: trial)
        let engineC = try SyncEngine(store: c.store, configuration: SyncConfiguration(family: devices.family, enabled: true))
        #expect(c.gate.trialStatus().state == .active)
        for _ in 0..<2 {
            _ = try await engineC.sync(via: RelayTransport(directory: devices.relayDirectory.url))
            try await devices.sync()
        }
        c.gate.refresh()
        #expect(c.gate.trialStatus().state == .expired && c.gate.trialStatus().endsAt == instant(7 * day), "\(c.gate.trialStatus())")
        #expect(c.gate.tier == .free)
        b.gate.refresh()
        a.gate.refresh()
        for (name, f) in [("a", a), ("b", b), ("c", c)] {
            #expect(try f.store.fetch(FetchDescriptor<UserTrial>()).map(\.startedAt) == [instant(0)], "\(name)")
            #expect(f.gate.trialStatus().endsAt == instant(7 * day), "\(name)")
        }
    }

    /// Another user on the same device has a record of their own; the trial start of each is
    /// never later than the store's first launch.
    @Test func eachUserHasARecordNeverStartingAfterTheStoresFirstLaunch() throws {
        let f = try Fixture(start: instant(0)) { $0.trialLength = 7 * 86_400 }
        f.clock.set(instant(30 * day))
        let bob = try f.relaunch { $0.userID = "bob" }
        #expect(bob.trialStatus().endsAt == instant(7 * day))
        #expect(try f.store.count(UserTrial.self) == 2)
    }
}
