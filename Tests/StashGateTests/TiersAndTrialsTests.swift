import Foundation
import Stash
import StashGate
import StashTestSupport
import Testing

/// Feature tiers, trials, the hard gate, overrides and the sync policy.
@Suite struct TiersAndTrialsTests {
    @Test func freeTierHasItsFeaturesPremiumHasAll() throws {
        let f = try Fixture()
        #expect(f.gate.check(.use("quickTimer")).isAllowed)
        #expect(f.gate.check(.use("articles")).isAllowed)
        #expect(f.gate.check(.use(.paywall)).isAllowed)
        #expect(f.gate.check(.use("intervalTimer")).denial == .requiresPremium("intervalTimer"))
        #expect(f.gate.tier(of: "quickTimer") == .free)
        #expect(f.gate.tier(of: "intervalTimer") == .premium)
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)]))
        #expect(f.gate.check(.use("intervalTimer")).isAllowed)
        #expect(f.gate.check(.use("anything")).tier == .premium)
    }

    @Test func storeTrialGrantsPremiumUntilItEndsThenTrialExpired() throws {
        let f = try Fixture()
        try f.gate.apply(try signed([Tx.subscription("trial", expires: 7 * day, period: .weekly, offer: .freeTrial)]))
        #expect(f.gate.check(.use("intervalTimer")).isAllowed)
        #expect(f.gate.entitlement().status.state == .trial)
        f.clock.set(instant(2 * day))
        // Keep the snapshot fresh enough (offline age) while the trial runs.
        try f.gate.apply(try signed([Tx.subscription("trial", expires: 7 * day, period: .weekly, offer: .freeTrial)], sequence: 2, server: 2 * day))
        var trial = f.gate.trialStatus()
        #expect(trial.state == .active && trial.source == .purchase)
        #expect(trial.endsAt == instant(7 * day))
        #expect(trial.remaining == 5 * 86_400)
        f.clock.set(instant(7 * day))
        trial = f.gate.trialStatus()
        #expect(trial.state == .expired && trial.remaining == 0)
        #expect(f.gate.check(.use("intervalTimer")).denial == .trialExpired)
        #expect(f.gate.check(.use("quickTimer")).isAllowed)   // expires gracefully into the free tier
    }

    /// A subscriber whose paid period lapsed after a trial (the store's offer or the local one)
    /// was told "trial expired"; the trial is long over, the subscription is what lapsed.
    @Test func aLapsedSubscriptionAfterATrialRequiresPremiumNotTrialExpired() throws {
        let f = try Fixture(start: instant(0)) { $0.trialLength = 14 * 86_400 }
        let history = [Tx.subscription("trial", expires: 7 * day, period: .weekly, offer: .freeTrial),
                       Tx.subscription("paid", expires: 40 * day, period: .monthly)]
        f.clock.set(instant(50 * day))
        try f.gate.apply(try signed(history, sequence: 1, server: 50 * day))
        #expect(f.gate.check(.use("intervalTimer")).denial == .requiresPremium("intervalTimer"))
        // With only the trials behind it, it is a trial that expired.
        try f.gate.apply(try signed([history[0]], sequence: 2, server: 50 * day))
        #expect(f.gate.check(.use("intervalTimer")).denial == .trialExpired)
    }

    @Test func localTrialFromFirstLaunch() throws {
        let f = try Fixture(start: instant(0)) { $0.trialLength = 14 * 86_400 }
        #expect(f.gate.firstLaunch == instant(0))
        #expect(f.gate.tier == .premium)
        #expect(f.gate.trialStatus().state == .active && f.gate.trialStatus().source == .firstLaunch)
        f.clock.set(instant(10 * day))
        // The first launch is stored once: relaunching later does not restart the trial.
        #expect(try f.relaunch().firstLaunch == instant(0))
        #expect(f.gate.trialStatus().remaining == 4 * 86_400)
        f.clock.set(instant(14 * day - 1))
        #expect(f.gate.tier == .premium)
        f.clock.set(instant(14 * day))
        #expect(f.gate.tier == .free)
        #expect(f.gate.check(.use("intervalTimer")).denial == .trialExpired)
    }

    @Test func hardGateAllowsOnlyThePaywallAfterTheTrial() throws {
        let f = try Fixture(start: instant(0)) { config in
            let base = GateConfiguration.hardGate(userID: "u1", verifier: verifier)
            config.accessModel = base.accessModel
            config.trialLength = base.trialLength
        }
        #expect(f.gate.configuration.trialLength == TimeInterval(7 * 86_400))   // default 7 days
        #expect(f.gate.check(.use("wardrobe")).isAllowed)
        #expect(f.createHome() == nil)
        f.clock.set(instant(7 * day - 1))
        #expect(f.gate.check(.view).isAllowed)
        f.clock.set(instant(7 * day))
        for action in [GateAction.view, .edit, .delete, .use("quickTimer"), .use("wardrobe"), .create(Home.self)] {
            #expect(f.gate.check(action).denial == .hardGate, "\(action)")
        }
        #expect(f.gate.check(.use(.paywall)).isAllowed)
        // Clock rollback cannot reopen it.
        f.clock.set(instant(day))
        #expect(try f.relaunch().check(.view).denial == .hardGate)
        // A subscription opens everything.
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 40 * day)], server: 7 * day))
        #expect(f.gate.check(.view).isAllowed)
        #expect(f.gate.check(.create(Home.self)).isAllowed)   // premium has no limits
    }

    @Test func overridesAreExplicitConfiguration() throws {
        let pro = try Fixture { $0.override = .forcePro }
        #expect(pro.gate.tier == .premium)
        #expect(pro.gate.check(.use("intervalTimer")).reason == .overridden)
        #expect(pro.gate.entitlement().reason == .overridden)
        #expect(pro.createHome() == nil && pro.createHome() == nil)
        let free = try Fixture { $0.override = .forceFree; $0.trialLength = 86_400 }
        try free.gate.apply(try signed([Tx.lifetime("l1")]))
        #expect(free.gate.tier == .free)
        #expect(free.gate.check(.use("intervalTimer")).denial == .requiresPremium("intervalTimer"))
        // Another gate on the same store without the override sees the real state.
        #expect(try free.relaunch { $0.override = nil }.tier == .premium)
    }

    @Test func syncPolicyTruthTable() throws {
        for premium in [false, true] {
            for preference in [false, true] {
                let dir = TemporaryDirectory()
                let path = dir.sub("store")
                do {
                    let store = try Store.open(at: path, types: [Home.self, Item.self])
                    try store.setSyncPreference(preference)
                    var config = GateConfiguration(userID: "u1", verifier: verifier)
                    config.clock = { instant(0) }
                    if premium { try FeatureGate.open(store, configuration: config).apply(try signed([Tx.subscription("t", expires: 30 * day)])) }
                }
                // Decided at open, from the cached snapshot and the preference read at open.
                let store = try Store.open(at: path, types: [Home.self, Item.self])
                var config = GateConfiguration(userID: "u1", verifier: verifier)
                config.clock = { instant(day) }
                let policy = try FeatureGate.open(store, configuration: config).syncPolicy
                #expect(policy.isActive == (premium && preference), "premium \(premium) preference \(preference)")
                #expect(policy.isPremium == premium && policy.preference == preference)
                #expect(SyncPolicy.isActive(premium: premium, preference: preference) == (premium && preference))
            }
        }
    }

    @Test func losingPremiumDisablesSyncAtNextOpenAndKeepsEveryRecord() throws {
        let f = try Fixture()
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)]))
        let gate = try f.relaunch()
        #expect(gate.syncPolicy.isActive)
        #expect(f.createHome() == nil && f.createHome() == nil)
        let home = try #require(try f.store.fetch(FetchDescriptor<Home>()).first?.id)
        for n in 0..<15 { #expect(f.create(Item(homeID: home, name: "\(n)")) == nil) }
        // The subscription lapses while the app runs: the running session keeps its policy.
        f.clock.set(instant(30 * day))
        #expect(gate.syncPolicy.isActive)
        #expect(gate.tier == .free)
        // Next open: sync off, all records still there.
        let next = try f.relaunch()
        #expect(!next.syncPolicy.isActive)
        #expect(next.syncPolicy.description.contains("not premium"))
        #expect(try f.store.count(Home.self) == 2)
        #expect(try f.store.count(Item.self) == 15)
        // Preference changes take effect at the next open of the store.
        try f.store.setSyncPreference(false)
        #expect(f.store.syncPreferenceAtOpen == true)
    }
}
