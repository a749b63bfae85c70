import Foundation
import Stash
import StashGate
import Testing

/// The offline allowance by subscription period (``OfflinePolicy``): an annual subscriber
/// four days offline dropped to free (`stale`), judged like a weekly one.
@Suite struct OfflinePolicyTests {
    /// Each period, judged by the standard policy: in force up to its allowance after the
    /// snapshot's server time, stale one millisecond later; lifetime never.
    @Test(arguments: [(PurchaseTransaction.Period?.some(.weekly), 3 * day), (.monthly, 7 * day), (.quarterly, 14 * day),
                      (.yearly, 30 * day), (nil, 3 * day)])
    func eachPeriodHasItsOwnAllowance(period: PurchaseTransaction.Period?, allowance: Int64) throws {
        #expect(milliseconds(OfflinePolicy.standard.allowance(for: period)) == allowance)
        let f = try Fixture(start: instant(0))
        var subscription = Tx.subscription("t1", expires: 400 * day)
        subscription.period = period
        try f.gate.apply(try signed([subscription], server: 0))
        f.clock.set(instant(allowance))
        #expect(f.gate.tier == .premium, "\(String(describing: period)) at its allowance")
        #expect(f.gate.entitlement().status.state == .subscribed)
        #expect(f.gate.check(.use("intervalTimer")).isAllowed)
        f.clock.set(instant(allowance + 1))
        #expect(f.gate.tier == .free, "\(String(describing: period)) past its allowance")
        #expect(f.gate.entitlement().status.state == .stale && f.gate.entitlement().reason == .stale)
        #expect(f.gate.check(.use("intervalTimer")).reason == .stale)
        // The same after a relaunch (the cached snapshot), and a fresh snapshot ends it.
        #expect(try f.relaunch().tier == .free)
        try f.gate.apply(try signed([subscription], sequence: 2, server: allowance + 1))
        #expect(f.gate.tier == .premium)
    }

    /// The case of the issue: an annual subscriber four days offline stays premium.
    @Test func anAnnualSubscriberFourDaysOfflineStaysPremium() throws {
        let f = try Fixture(start: instant(0))
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 365 * day, period: .yearly)], server: 0))
        f.clock.set(instant(4 * day))
        #expect(f.gate.tier == .premium)
        #expect(f.gate.entitlement().status.state == .subscribed, "\(f.gate.entitlement())")
        #expect(try f.relaunch().syncPolicy.isPremium)
    }

    /// With a weekly and a yearly grant, the yearly one keeps premium past the weekly
    /// allowance; the entitlement names the grant in force, as the hot path decides.
    @Test func anyGrantWithinItsOwnAllowanceKeepsPremium() throws {
        let f = try Fixture(start: instant(0))
        try f.gate.apply(try signed([Tx.subscription("weekly", expires: 200 * day, period: .weekly),
                                     Tx.subscription("yearly", expires: 100 * day, period: .yearly)], server: 0))
        #expect(f.gate.entitlement().status.transactionID == "weekly")   // the later end
        f.clock.set(instant(10 * day))
        #expect(f.gate.tier == .premium)
        let decision = f.gate.entitlement()
        #expect(decision.status.state == .subscribed && decision.status.transactionID == "yearly", "\(decision)")
        f.clock.set(instant(30 * day + 1))
        #expect(f.gate.tier == .free)
        #expect(f.gate.entitlement().status.state == .stale)
    }

    /// A policy of the app's own, per period or uniform (``GateConfiguration/maxOfflineAge``).
    @Test func theAppSetsItsOwnPolicy() throws {
        let f = try Fixture(start: instant(0)) { $0.offlinePolicy.yearly = 60 * 86_400 }
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 365 * day, period: .yearly)], server: 0))
        f.clock.set(instant(60 * day))
        #expect(f.gate.tier == .premium)
        f.clock.set(instant(60 * day + 1))
        #expect(f.gate.tier == .free)
        let uniform = try Fixture(start: instant(0)) { $0.maxOfflineAge = 86_400 }
        #expect(uniform.gate.configuration.offlinePolicy == .uniform(86_400))
        #expect(uniform.gate.configuration.maxOfflineAge == 86_400)
        try uniform.gate.apply(try signed([Tx.subscription("t1", expires: 365 * day, period: .yearly)], server: 0))
        uniform.clock.set(instant(day + 1))
        #expect(uniform.gate.entitlement().status.state == .stale)
    }

    private func milliseconds(_ seconds: TimeInterval) -> Int64 { Int64(seconds * 1000) }
}
