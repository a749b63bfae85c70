import Foundation
import Stash
import StashGate
import StashTestSupport
import Testing

/// The pure rules: `Entitlements.status(of:in:at:)` is a function of the transactions and
/// the reference time.
@Suite struct EntitlementTests {
    @Test func boundaryIsExactToTheMillisecond() {
        let expiry = 30 * day + 123
        let transactions = [Tx.subscription("t1", expires: expiry)]
        #expect(Entitlements.isActive("pro", in: transactions, at: instant(expiry - 1)))
        #expect(!Entitlements.isActive("pro", in: transactions, at: instant(expiry)))
        #expect(!Entitlements.isActive("pro", in: transactions, at: instant(expiry + 1)))
        let status = Entitlements.status(of: "pro", in: transactions, at: instant(expiry - 1))
        #expect(status.state == .subscribed)
        #expect(status.expiresAt == instant(expiry))
        #expect(Entitlements.status(of: "pro", in: transactions, at: instant(expiry)).state == .expired)
        // Grace end is just as exact.
        let grace = [Tx.subscription("t2", expires: expiry, grace: expiry + 16 * day, retry: true)]
        #expect(Entitlements.status(of: "pro", in: grace, at: instant(expiry + 16 * day - 1)).state == .gracePeriod)
        #expect(Entitlements.status(of: "pro", in: grace, at: instant(expiry + 16 * day)).state == .billingRetry)
    }

    @Test func statesOfEachKindOfPurchase() {
        let at = instant(10 * day)
        #expect(Entitlements.status(of: "pro", in: [Tx.lifetime("l")], at: at).state == .lifetime)
        #expect(Entitlements.status(of: "pro", in: [Tx.subscription("w", expires: 14 * day, period: .weekly)], at: at).state == .subscribed)
        #expect(Entitlements.status(of: "pro", in: [Tx.subscription("q", expires: 90 * day, period: .quarterly)], at: at).period == .quarterly)
        #expect(Entitlements.status(of: "pro", in: [Tx.subscription("tr", expires: 14 * day, offer: .freeTrial)], at: at).state == .trial)
        #expect(Entitlements.status(of: "pro", in: [Tx.subscription("in", expires: 14 * day, offer: .introductory)], at: at).state == .introductory)
        #expect(Entitlements.status(of: "pro", in: [Tx.pack("c", credits: 10)], at: at).state == .none)
        #expect(Entitlements.status(of: "pro", in: [], at: at).state == .none)
        #expect(Entitlements.status(of: "other", in: [Tx.lifetime("l")], at: at).state == .none)
        // The later of two subscriptions decides the end.
        let two = [Tx.subscription("a", expires: 20 * day), Tx.subscription("b", expires: 40 * day)]
        #expect(Entitlements.status(of: "pro", in: two, at: at).expiresAt == instant(40 * day))
    }

    @Test func graceGrantsAndBillingRetryDoesNot() {
        let expiry = 30 * day
        let grace = Tx.subscription("g", expires: expiry, grace: expiry + 6 * day, retry: true)
        let retry = Tx.subscription("r", expires: expiry, retry: true)
        // In the grace period: entitled.
        #expect(Entitlements.status(of: "pro", in: [grace], at: instant(expiry + day)).state == .gracePeriod)
        #expect(Entitlements.isActive("pro", in: [grace], at: instant(expiry + day)))
        // Billing retry without grace: not entitled from the expiry on.
        #expect(Entitlements.status(of: "pro", in: [retry], at: instant(expiry)).state == .billingRetry)
        #expect(!Entitlements.isActive("pro", in: [retry], at: instant(expiry)))
        // After the grace period, billing retry: not entitled.
        #expect(!Entitlements.isActive("pro", in: [grace], at: instant(expiry + 6 * day)))
        // Before the expiry both are plain subscriptions.
        #expect(Entitlements.status(of: "pro", in: [retry], at: instant(expiry - 1)).state == .subscribed)
    }

    /// A random transaction set around t0 … t0 + 60 days.
    static func randomTransactions(_ rng: inout SeededGenerator) -> [PurchaseTransaction] {
        (0..<Int.random(in: 0...5, using: &rng)).map { n in
            let expiry = Int64.random(in: 0...(60 * day), using: &rng)
            let revoked: Int64? = Int.random(in: 0..<5, using: &rng) == 0 ? Int64.random(in: 0...(60 * day), using: &rng) : nil
            switch Int.random(in: 0..<10, using: &rng) {
            case 0: return Tx.lifetime("l\(n)", revoked: revoked)
            case 1: return Tx.pack("c\(n)", credits: 5, revoked: revoked)
            default:
                let grace: Int64? = Bool.random(using: &rng) ? expiry + Int64.random(in: 0...(16 * day), using: &rng) : nil
                return Tx.subscription("s\(n)", expires: expiry,
                                       period: PurchaseTransaction.Period.allCases.randomElement(using: &rng)!,
                                       offer: [nil, .freeTrial, .introductory].randomElement(using: &rng)!,
                                       grace: grace, retry: Bool.random(using: &rng), revoked: revoked,
                                       entitlement: Int.random(in: 0..<6, using: &rng) == 0 ? "other" : "pro")
            }
        }
    }

    @Test(arguments: [UInt64(1), 2, 3, 42, 2026])
    func timeOnlyRemovesAccess(seed: UInt64) {
        var rng = SeededGenerator(seed: seed)
        for round in 0..<300 {
            let transactions = Self.randomTransactions(&rng)
            var times = (0..<12).map { _ in Int64.random(in: -day...(80 * day), using: &rng) }
            times.sort()
            var wasActive = true
            for t in times {
                let active = Entitlements.isActive("pro", in: transactions, at: instant(t))
                #expect(!(active && !wasActive), "seed \(seed) round \(round): access came back at \(t) for \(transactions)")
                wasActive = active
            }
        }
    }

    /// The status names the latest event: an upgrade revoked the old subscription, then the
    /// new one lapsed: "expired", not "revoked"; a refund after an expiry: "revoked".
    @Test func aLapsedUpgradeIsExpiredARefundAfterExpiryIsRevoked() {
        let upgraded = [Tx.subscription("old", expires: 30 * day, revoked: 10 * day), Tx.subscription("new", expires: 40 * day)]
        #expect(Entitlements.status(of: "pro", in: upgraded, at: instant(20 * day)).state == .subscribed)
        let lapsed = Entitlements.status(of: "pro", in: upgraded, at: instant(50 * day))
        #expect(lapsed.state == .expired && lapsed.transactionID == "new", "\(lapsed)")
        let refunded = [Tx.subscription("a", expires: 30 * day), Tx.subscription("b", expires: 40 * day, revoked: 45 * day)]
        #expect(Entitlements.status(of: "pro", in: refunded, at: instant(50 * day)).state == .revoked)
    }

    /// A paid period covering now is "subscribed", even when another transaction's grace
    /// period lasts longer.
    @Test func aPaidPeriodWinsOverALongerGracePeriod() {
        let transactions = [Tx.subscription("paid", expires: 30 * day), Tx.subscription("lapsed", expires: 5 * day, grace: 40 * day)]
        let status = Entitlements.status(of: "pro", in: transactions, at: instant(10 * day))
        #expect(status.state == .subscribed && status.transactionID == "paid", "\(status)")
        #expect(Entitlements.status(of: "pro", in: transactions, at: instant(35 * day)).state == .gracePeriod)
    }

    @Test(arguments: [UInt64(7), 8, 9])
    func revocationWinsOverEverything(seed: UInt64) {
        var rng = SeededGenerator(seed: seed)
        for round in 0..<300 {
            var transactions = Self.randomTransactions(&rng)
            transactions.append(Tx.lifetime("L"))
            let t = instant(Int64.random(in: 0...(80 * day), using: &rng))
            #expect(Entitlements.isActive("pro", in: transactions, at: t), "seed \(seed) round \(round)")
            // Revoke every transaction: nothing grants, lifetime included.
            let revoked = transactions.map { var x = $0; x.revokedAt = instant(0); return x }
            let status = Entitlements.status(of: "pro", in: revoked, at: t)
            #expect(!status.isActive, "seed \(seed) round \(round): \(status)")
            #expect(status.state == .revoked, "seed \(seed) round \(round): \(status)")
            // Revoking only the lifetime leaves exactly the others' answer.
            var onlyLifetime = transactions
            onlyLifetime[onlyLifetime.count - 1].revokedAt = instant(0)
            #expect(Entitlements.isActive("pro", in: onlyLifetime, at: t) == Entitlements.isActive("pro", in: Array(transactions.dropLast()), at: t),
                    "seed \(seed) round \(round)")
        }
    }

    @Test func snapshotJSONRoundTripsExactInstants() throws {
        let original = snapshot([Tx.subscription("t1", expires: 30 * day + 7, grace: 31 * day + 9, retry: true),
                                 Tx.lifetime("l1"), Tx.pack("c1", credits: 10)], sequence: 9, server: 12_345)
        let bytes = try original.encoded()
        let decoded = try EntitlementSnapshot(decoding: bytes)
        #expect(decoded == original)
        #expect(decoded.transactions[0].price == Decimal(string: "29.99"))
        #expect(String(decoding: bytes, as: UTF8.self).contains("\"serverTime\":\(t0 + 12_345)"))
    }
}
