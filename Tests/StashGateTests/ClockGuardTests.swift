import Foundation
import Stash
import StashGate
import StashTestSupport
import Testing

/// The reference time: max(wall clock, highest time seen, snapshot server time).
@Suite struct ClockGuardTests {
    @Test func rollingTheClockBackNeverExtendsAnything() throws {
        let f = try Fixture(start: instant(0)) { $0.trialLength = 7 * Double(day / 1000) }
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)], server: 0))
        f.clock.set(instant(31 * day))
        #expect(f.gate.tier == .free)   // subscription and trial are over
        #expect(f.gate.entitlement().status.state == .expired)
        // The user sets the device clock back a month: still over, now and after a relaunch.
        f.clock.set(instant(day))
        #expect(f.gate.tier == .free)
        #expect(f.gate.clockGuard.referenceTime == instant(31 * day))
        let relaunched = try f.relaunch()
        #expect(relaunched.tier == .free)
        #expect(relaunched.entitlement().referenceTime == instant(31 * day))
        #expect(relaunched.trialStatus().state == .expired)
    }

    /// The device clock was once set a year ahead (to cheat a game timer, or a bad clock at
    /// boot): the highest time seen stayed there, so after the clock was put right every
    /// subscription looked expired, fresh snapshots included, until real time caught up. A
    /// snapshot newer than the one in force now brings it down to its server time; rolling
    /// the clock back still extends nothing.
    @Test func aNewerSnapshotUndoesAClockOnceSetAhead() throws {
        let f = try Fixture(start: instant(0))
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)], sequence: 1, server: 0))
        f.clock.set(instant(365 * day))
        #expect(f.gate.tier == .free)
        try f.relaunch()   // the year-ahead time is saved
        f.clock.set(instant(day))
        #expect(f.gate.tier == .free, "an older snapshot does not vouch for the corrected clock")
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)], sequence: 2, server: day))
        #expect(f.gate.tier == .premium)
        #expect(f.gate.entitlement().status.state == .subscribed, "\(f.gate.entitlement())")
        #expect(try f.relaunch().tier == .premium, "the settled time is what the store keeps")
        // Rolling back past the snapshot's server time extends nothing.
        f.clock.set(instant(-10 * day))
        #expect(f.gate.clockGuard.referenceTime == instant(day))
        f.clock.set(instant(31 * day))
        #expect(f.gate.tier == .free)
        f.clock.set(instant(2 * day))
        #expect(f.gate.tier == .free)
    }

    /// Instants at the ends of the range (a server sending its "unknown" minimum as the
    /// server time, a damaged store) and an infinite offline allowance trapped: every launch
    /// crashed while such a snapshot was cached. Differences saturate now.
    @Test func extremeInstantsAndAllowancesDoNotTrap() throws {
        let f = try Fixture(start: instant(0)) { $0.maxOfflineAge = .infinity; $0.trialLength = .infinity }
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)], server: 0))
        #expect(f.gate.tier == .premium)
        f.clock.set(instant(29 * day))
        #expect(f.gate.tier == .premium, "never stale with an infinite allowance")
        #expect(f.gate.trialStatus().state == .active)
        let g = try Fixture(start: instant(0))
        try g.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)], server: .min))
        #expect(g.gate.entitlement().reason == .stale)
        #expect(g.gate.tier == .free)
        #expect(try g.relaunch().tier == .free)
    }

    /// A NaN date trapped where dates become milliseconds (infinities saturated, NaN did not):
    /// a wall clock answering NaN crashed every check and the gate's open, a NaN expiry or
    /// revocation crashed `Entitlements.status`, and a NaN server time crashed the signer.
    /// NaN counts as the instant 0 now, as a NaN duration counts as 0: the reference time
    /// stays at the highest time seen, and a NaN end grants nothing.
    @Test func nanDatesDoNotTrap() throws {
        let nan = Date(timeIntervalSince1970: .nan)
        let f = try Fixture(start: instant(0))
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)], server: 0))
        f.clock.set(instant(day))
        #expect(f.gate.tier == .premium)
        f.clock.set(nan)
        #expect(f.gate.tier == .premium)
        #expect(f.gate.clockGuard.referenceTime == instant(day))
        #expect(f.gate.check(.use("intervalTimer")).isAllowed)
        #expect(f.gate.entitlement().status.state == .subscribed)
        let g = try Fixture(start: nan)
        #expect(g.gate.tier == .free)
        #expect(g.gate.check(.create(Home.self)).isAllowed)

        var endless = Tx.subscription("t2", expires: 30 * day)
        endless.expiresAt = nan
        #expect(!Entitlements.isActive("pro", in: [endless], at: instant(day)))
        var refunded = Tx.subscription("t3", expires: 30 * day)
        refunded.revokedAt = nan
        #expect(Entitlements.status(of: "pro", in: [refunded], at: instant(day)).state == .revoked)
        #expect(Entitlements.status(of: "pro", in: [Tx.lifetime("l1")], at: nan).state == .lifetime)
        let signedNaN = try signer.sign(EntitlementSnapshot(userID: "u1", sequence: 1, serverTime: nan, transactions: []))
        #expect(try EntitlementSnapshot(decoding: signedNaN.payload).serverTime == Date(timeIntervalSince1970: 0))
    }

    /// Another process (here a second gate on the store) settled the clock and the first
    /// launch with a newer snapshot while this gate had no snapshot in force: the gate took
    /// the snapshot but kept its clock and first launch a year ahead, so the subscription
    /// looked expired here while the other process granted it, and the 7-day local trial
    /// stayed open here for a year. A snapshot that settled the clock is recognized now.
    @Test func aClockSettledByAnotherProcessIsAdoptedWithoutASnapshotBefore() throws {
        let f = try Fixture(start: instant(365 * day)) { $0.trialLength = 7 * Double(day / 1000) }
        let none = try FeatureGate.open(f.store, configuration: f.configuration)    // no snapshot until #2
        let other = try FeatureGate.open(f.store, configuration: f.configuration)   // #1, then #2
        f.clock.set(instant(day))   // the clock put right
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)], sequence: 1, server: 0))
        #expect(f.gate.entitlement().status.state == .expired, "the first snapshot vouches for nothing")
        other.refresh()
        #expect(other.snapshot?.sequence == 1)
        #expect(other.clockGuard.referenceTime == instant(365 * day), "nor does it in another process")
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)], sequence: 2, server: day))
        #expect(f.gate.entitlement().status.state == .subscribed)
        for (name, gate) in [("none", none), ("other", other)] {
            gate.refresh()
            #expect(gate.snapshot?.sequence == 2, "\(name)")
            #expect(gate.clockGuard.referenceTime == instant(day), "\(name)")
            #expect(gate.entitlement().status.state == .subscribed, "\(name): \(gate.entitlement())")
            #expect(gate.firstLaunch == instant(day), "\(name)")
        }
        f.clock.set(instant(31 * day))
        for (name, gate) in [("applying", f.gate), ("none", none), ("other", other)] {
            #expect(gate.tier == .free, "\(name)")
            #expect(gate.trialStatus().state == .expired, "\(name)")
        }
    }

    /// The clock set a year ahead at install, then put right: the first launch was recorded a
    /// year ahead, so a 7-day local trial stayed open for a year. A newer snapshot brings the
    /// first launch down to its server time with the clock.
    @Test func aFirstLaunchRecordedAheadComesDownWithTheClock() throws {
        let f = try Fixture(start: instant(365 * day)) { $0.trialLength = 7 * Double(day / 1000) }
        f.clock.set(instant(0))
        try f.gate.apply(try signed([], sequence: 1, server: 0))
        try f.gate.apply(try signed([], sequence: 2, server: day))
        #expect(f.gate.firstLaunch == instant(day))
        f.clock.set(instant(9 * day))
        #expect(f.gate.trialStatus().state == .expired)
        #expect(f.gate.tier == .free)
        #expect(try f.relaunch().trialStatus().state == .expired)
    }

    @Test func theGateHonoursTheExactExpiryInstant() throws {
        let expiry = 10 * day + 345
        let f = try Fixture(start: instant(0))
        try f.gate.apply(try signed([Tx.subscription("t1", expires: expiry)], server: 9 * day))
        f.clock.set(instant(expiry - 1))
        #expect(f.gate.tier == .premium)
        #expect(f.gate.entitlement().status.expiresAt == instant(expiry))
        f.clock.set(instant(expiry))
        #expect(f.gate.tier == .free)
        #expect(f.gate.entitlement().status.state == .expired)
        f.clock.set(instant(expiry + 1))
        #expect(f.gate.check(.use("intervalTimer")).denial == .requiresPremium("intervalTimer"))
    }

    @Test func highestTimeSeenIsPersistedAcrossLaunches() throws {
        let f = try Fixture(start: instant(5 * day))
        f.clock.set(instant(9 * day))
        _ = f.gate.check(.use("x"))
        // Writes through the gate save it (here: an authorized creation).
        let home = try f.addHome()
        #expect(f.create(Item(homeID: home, name: "lamp")) == nil)
        f.clock.set(instant(0))
        #expect(try f.relaunch().clockGuard.referenceTime == instant(9 * day))
        // A snapshot's server time counts as seen too.
        try f.gate.apply(try signed([], sequence: 1, server: 20 * day))
        f.clock.set(instant(0))
        #expect(try f.relaunch().clockGuard.referenceTime == instant(20 * day))
    }

    /// A denied creation rolls its transaction back, and with it the clock saved in it; the
    /// gate counted that save as done, so later saves skipped it: with the clock set back, the
    /// next launch started from the older stored time (a trial got the difference back).
    @Test func aClockSaveRolledBackWithADeniedCreationIsWrittenAgain() throws {
        let f = try Fixture(start: instant(0))
        _ = try f.addHome()
        try f.relaunch()
        f.clock.set(instant(5 * day))
        #expect(f.createHome() == .homeLimitReached)   // one home allowed: denied, rolled back
        f.clock.set(instant(1 * day))
        #expect(try f.relaunch().clockGuard.referenceTime == instant(5 * day))
    }

    @Test func movedReferenceTimeIsSavedInTheBackgroundByChecks() async throws {
        let f = try Fixture(start: instant(0))
        f.clock.set(instant(2 * day))
        _ = f.gate.check(.use("quickTimer"))   // notices the move; saves off the hot path
        let deadline = Date().addingTimeInterval(120)   // generous: other test targets may hog the pool
        var stored: Int64?
        // Read after every wake, the last one included: a task the pool wakes only past the
        // deadline (long synchronous tests hold its threads) must judge the store as it is then.
        while true {
            stored = try storedClock(f.store)
            if stored == t0 + 2 * day || Date() >= deadline { break }
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(stored == t0 + 2 * day)
    }

    /// The docs said credits save the clock, but spends and grants never did: an app whose
    /// only gate writes were spends, killed after its trial ended and relaunched with the
    /// clock set back, started from the time saved at its open and got the trial back.
    @Test func creditSpendsAndGrantsSaveTheClock() throws {
        let f = try Fixture(start: instant(0)) { $0.trialLength = 7 * Double(day / 1000) }
        f.clock.set(instant(8 * day))
        try f.gate.spendCredit(operationID: "gen-1")
        f.clock.set(instant(day))
        // Killed, no persistClock(): the next launch has only what the writes saved.
        let next = try FeatureGate.open(f.store, configuration: f.configuration)
        #expect(next.clockGuard.referenceTime == instant(8 * day))
        #expect(next.trialStatus().state == .expired)
        f.clock.set(instant(9 * day))
        _ = try f.store.write { tx in try next.grantCredits(1, grantID: "promo:1", in: tx) }
        f.clock.set(instant(day))
        #expect(try FeatureGate.open(f.store, configuration: f.configuration).clockGuard.referenceTime == instant(9 * day))
    }

    /// `tier`, `entitlement()` and `trialStatus()` read the clock without the background save
    /// `check()` schedules: an app driving its UI from them alone never saved a moved clock.
    @Test func tierEntitlementAndTrialStatusSaveAMovedClockInTheBackground() async throws {
        let f = try Fixture(start: instant(0))
        let reads: [(String, () -> Void)] = [
            ("tier", { _ = f.gate.tier }), ("entitlement()", { _ = f.gate.entitlement() }), ("trialStatus()", { _ = f.gate.trialStatus() }),
        ]
        for (n, (name, read)) in reads.enumerated() {
            let moved = Int64(n + 1) * day
            f.clock.set(instant(moved))
            read()
            let deadline = Date().addingTimeInterval(60)   // generous: other test targets may hog the machine
            while Date() < deadline, try storedClock(f.store) != t0 + moved { try await Task.sleep(for: .milliseconds(10)) }
            try #require(try storedClock(f.store) == t0 + moved, "\(name) did not save the clock")
        }
    }

    @Test(arguments: [UInt64(11), 12, 13])
    func referenceTimeIsMonotoneUnderRandomClockJumps(seed: UInt64) async throws {
        var rng = SeededGenerator(seed: seed)
        let f = try Fixture(start: instant(0))
        var previous = f.gate.clockGuard.referenceTime
        var highestWall = instant(0)
        for step in 0..<200 {
            await Task.yield()   // long property runs leave the shared pool to other tests
            let wall = instant(Int64.random(in: -30 * day...(60 * day), using: &rng))
            f.clock.set(wall)
            highestWall = max(highestWall, wall)
            if Int.random(in: 0..<20, using: &rng) == 0 { try f.relaunch() }
            let reference = f.gate.clockGuard.referenceTime
            #expect(reference >= previous, "seed \(seed) step \(step)")
            #expect(reference == max(highestWall, wall), "seed \(seed) step \(step)")
            previous = reference
        }
    }

    @Test func pastTheMaximumOfflineAgeSubscriptionsAreStaleLifetimeStays() throws {
        let f = try Fixture(start: instant(0))
        // A weekly plan: the standard policy's allowance is 3 days (OfflinePolicyTests: every period).
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 365 * day, period: .weekly)], server: 0))
        f.clock.set(instant(3 * day))
        #expect(f.gate.entitlement().isActive)         // exactly 3 days old: still fine
        f.clock.set(instant(3 * day + 1))
        let stale = f.gate.entitlement()
        #expect(!stale.isActive)
        #expect(stale.status.state == .stale)          // not "free": the app can say "reconnect"
        #expect(stale.reason == .stale)
        #expect(f.gate.tier == .free)
        #expect(f.gate.check(.use("intervalTimer")).reason == .stale)
        // A fresh snapshot ends it.
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 365 * day, period: .weekly)], sequence: 2, server: 3 * day + 1))
        #expect(f.gate.entitlement().isActive)
        #expect(f.gate.entitlement().reason == .verified)
        // Lifetime is not time-limited: never stale.
        try f.gate.apply(try signed([Tx.lifetime("l1")], sequence: 3, server: 3 * day + 1))
        f.clock.set(instant(400 * day))
        #expect(f.gate.entitlement().status.state == .lifetime)
        #expect(f.gate.tier == .premium)
        // A custom maximum offline age.
        let strict = try f.relaunch { $0.maxOfflineAge = 60 }
        try strict.apply(try signed([Tx.subscription("t1", expires: 500 * day)], sequence: 4, server: 400 * day))
        f.clock.set(instant(400 * day + minute))
        #expect(strict.entitlement().isActive)
        f.clock.set(instant(400 * day + minute + 1))
        #expect(strict.entitlement().status.state == .stale)
    }

    @Test(arguments: [UInt64(21), 22, 23])
    func forAFixedSnapshotTimeOnlyRemovesAccess(seed: UInt64) async throws {
        var rng = SeededGenerator(seed: seed)
        for round in 0..<25 {
            let f = try Fixture(start: instant(0)) {
                $0.trialLength = Bool.random(using: &rng) ? Double(Int64.random(in: 0...(10 * day), using: &rng)) / 1000 : nil
                $0.maxOfflineAge = Double(Int64.random(in: 0...(5 * day), using: &rng)) / 1000
            }
            try f.gate.apply(try signed(EntitlementTests.randomTransactions(&rng), server: Int64.random(in: 0...day, using: &rng)))
            var wasPremium = true
            var wasActive = true
            for step in 0..<40 {
                await Task.yield()
                // The wall clock jumps anywhere, backwards included; relaunches happen.
                f.clock.set(instant(Int64.random(in: -10 * day...(70 * day), using: &rng)))
                if Int.random(in: 0..<8, using: &rng) == 0 { try f.relaunch() }
                let premium = f.gate.tier == .premium
                let active = f.gate.entitlement().isActive
                #expect(!(premium && !wasPremium), "seed \(seed) round \(round) step \(step): premium came back")
                #expect(!(active && !wasActive), "seed \(seed) round \(round) step \(step): entitlement came back")
                wasPremium = premium
                wasActive = active
            }
        }
    }
}
