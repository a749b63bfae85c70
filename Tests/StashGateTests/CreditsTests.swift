import Foundation
import Stash
import StashGate
import StashTestSupport
import Testing

/// Credits: free credits on first use, purchases, idempotent spends, convergence.
@Suite struct CreditsTests {
    /// With the credit account deleted (a "delete all data" loop, or a delete from another
    /// device), every later snapshot holding a credit pack was refused, so a subscription
    /// bought afterwards was never installed. Credits stay unusable, with a clear error; the
    /// entitlement is installed.
    @Test func aDeletedCreditAccountDoesNotBlockSnapshots() throws {
        let f = try Fixture()
        try f.gate.apply(try signed([Tx.pack("p1", credits: 10)], sequence: 1))
        #expect(f.gate.credits() == 13)
        #expect(try f.store.write { tx in try tx.delete(CreditAccount.self, id: f.gate.creditAccountID) })
        try f.gate.apply(try signed([Tx.pack("p1", credits: 10), Tx.subscription("t1", expires: 365 * day)], sequence: 2))
        #expect(f.gate.tier == .premium)
        #expect(f.gate.snapshot?.sequence == 2)
        #expect { try f.gate.spendCredit(operationID: "after") } throws: { ($0 as? GateError)?.code == .storage }
    }

    /// A grant under an id the gate uses itself merged with the gate's grant: "free" with 5
    /// added only 2 to the 3 free credits, and "purchase:p1" none to a pack of 10. Refused now.
    @Test func grantIDsOfTheGateItselfAreRefused() throws {
        let f = try Fixture()
        try f.gate.apply(try signed([Tx.pack("p1", credits: 10)], sequence: 1))
        for id in ["free", "purchase:p1"] {
            #expect {
                try f.store.write { tx in try f.gate.grantCredits(5, grantID: id, in: tx) }
            } throws: { ($0 as? GateError)?.code == .invalidConfiguration }
        }
        #expect(f.gate.credits() == 13)
        #expect(try f.store.write { tx in try f.gate.grantCredits(5, grantID: "promo:free", in: tx) } == 5)
        #expect(f.gate.credits() == 18)
    }

    /// A grant of no credits, or of a negative number, added nothing, took nothing away and
    /// returned false, which the doc said means "already granted". Refused now.
    @Test func aGrantOfNoCreditsIsRefused() throws {
        let f = try Fixture()
        for amount in [0, -3] {
            let error = #expect(throws: GateError.self) {
                try f.store.write { tx in try f.gate.grantCredits(amount, grantID: "promo:\(amount)", in: tx) }
            }
            #expect(error?.code == .invalidConfiguration)
            #expect(error?.message.contains("promo:\(amount)") == true && error?.message.contains("\(amount) credits") == true,
                    "\(error?.message ?? "")")
        }
        #expect(f.gate.credits() == 3)
    }

    /// Granting an id again with another amount was documented as adding nothing, and
    /// returned true as for a first grant while it added the difference. It returns what it
    /// added now; the grant holds its highest amount, as it will after a sync.
    @Test func aGrantAgainWithAnotherAmountSaysWhatItAdded() throws {
        let f = try Fixture()
        func grant(_ amount: Int) throws -> Int { try f.store.write { tx in try f.gate.grantCredits(amount, grantID: "promo:x", in: tx) } }
        #expect(try grant(5) == 5)
        #expect(f.gate.credits() == 8)
        #expect(try grant(5) == 0)
        #expect(try grant(10) == 5)
        #expect(f.gate.credits() == 13)
        #expect(try grant(3) == 0)
        #expect(try grant(10) == 0)
        #expect(f.gate.credits() == 13)
    }

    @Test func freeCreditsThenSpendsUntilEmpty() throws {
        let f = try Fixture()
        #expect(f.gate.credits() == 3)   // before first use: the free credits
        #expect(try f.gate.spendCredit(operationID: "gen-1") == .spent(remaining: 2))
        #expect(try f.gate.spendCredit(operationID: "gen-2") == .spent(remaining: 1))
        #expect(try f.gate.spendCredit(operationID: "gen-1") == .alreadySpent(remaining: 1))   // replay: no effect
        #expect(try f.gate.spendCredit(operationID: "gen-3") == .spent(remaining: 0))
        let error = #expect(throws: GateError.self) { try f.gate.spendCredit(operationID: "gen-4") }
        #expect(error?.code == .insufficientCredits)
        // It names the store and says what to do (it named the operation and user only).
        #expect(error?.message.contains("store \(f.store.path)") == true && error?.message.contains("grantCredits") == true,
                "\(String(describing: error))")
        #expect(f.gate.credits() == 0)
        // A spend that fails rolls back the work it was paying for.
        #expect(throws: GateError.self) {
            try f.store.write { tx in
                try tx.insert(Home(name: "paid for"))
                try f.gate.spendCredit(operationID: "gen-5", in: tx)
            }
        }
        #expect(try f.store.count(Home.self) == 0)
        // A purchased pack adds credits once, however often the snapshot is applied.
        try f.gate.apply(try signed([Tx.pack("p1", credits: 10)], sequence: 1))
        try f.gate.apply(try signed([Tx.pack("p1", credits: 10)], sequence: 2))
        #expect(f.gate.credits() == 10)
        try f.gate.apply(try signed([Tx.pack("p1", credits: 10), Tx.pack("p2", credits: 5)], sequence: 3))
        #expect(f.gate.credits() == 15)
        // A refunded pack is taken back.
        try f.gate.apply(try signed([Tx.pack("p1", credits: 10), Tx.pack("p2", credits: 5, revoked: day)], sequence: 4))
        #expect(f.gate.credits() == 10)
        // Grants by id are idempotent too.
        let (first, second) = try f.store.write { tx in
            (try f.gate.grantCredits(2, grantID: "promo", in: tx), try f.gate.grantCredits(2, grantID: "promo", in: tx))
        }
        #expect(first == 2 && second == 0)
        #expect(f.gate.credits() == 12)
    }

    @Test(arguments: [UInt64(41), 42, 43])
    func balanceIsNeverNegativeAndReplaysNeverCount(seed: UInt64) async throws {
        var rng = SeededGenerator(seed: seed)
        let f = try Fixture()
        var spent = Set<String>()
        var granted = 3
        var packs: [PurchaseTransaction] = []
        for step in 0..<300 {
            await Task.yield()   // long property runs leave the shared pool to other tests
            switch Int.random(in: 0..<10, using: &rng) {
            case 0:
                packs.append(Tx.pack("p\(step)", credits: Int.random(in: 1...3, using: &rng)))
                granted += packs.last!.credits!
                try f.gate.apply(try signed(packs, sequence: UInt64(step + 1)))
            default:
                let op = "op\(Int.random(in: 0..<60, using: &rng))"
                let before = f.gate.credits()
                do {
                    let result = try f.gate.spendCredit(operationID: op)
                    if spent.contains(op) {
                        #expect(result == .alreadySpent(remaining: before), "seed \(seed) step \(step)")
                    } else {
                        #expect(result == .spent(remaining: before - 1), "seed \(seed) step \(step)")
                        spent.insert(op)
                    }
                } catch let error as GateError {
                    #expect(error.code == .insufficientCredits && before == 0 && !spent.contains(op), "seed \(seed) step \(step)")
                }
            }
            let balance = f.gate.credits()
            #expect(balance >= 0, "seed \(seed) step \(step)")
            #expect(balance == granted - spent.count, "seed \(seed) step \(step)")
        }
    }

    /// Two devices of one user, merged state by state in both directions (what sync does).
    @Test func creditsConvergeAcrossTwoStoresWithoutDoubleSpending() throws {
        let a = try Fixture(), b = try Fixture()
        // Both devices start: each grants the free credits on first use.
        try a.gate.spendCredit(operationID: "a1")
        try b.gate.spendCredit(operationID: "b1")
        try b.gate.spendCredit(operationID: "b2")
        // Both apply the same purchase.
        let purchase = try signed([Tx.pack("p1", credits: 10)], sequence: 1)
        try a.gate.apply(purchase)
        try b.gate.apply(purchase)
        // The same operation replayed on both devices (a retried request).
        try a.gate.spendCredit(operationID: "shared")
        try b.gate.spendCredit(operationID: "shared")
        #expect(a.gate.credits() == 3 + 10 - 2)
        #expect(b.gate.credits() == 3 + 10 - 3)
        try exchange(a.store, b.store)
        try exchange(b.store, a.store)
        // Free credits and the purchase count once; spends a1, b1, b2 count; "shared", spent
        // on both devices before they met, is one operation: it counts once (it counted on
        // each device that spent it before).
        let expected = 3 + 10 - 4
        #expect(a.gate.credits() == expected)
        #expect(b.gate.credits() == expected)
        // After the merge, replaying any known operation on either device changes nothing.
        for op in ["a1", "b1", "b2", "shared"] {
            #expect(try a.gate.spendCredit(operationID: op) == .alreadySpent(remaining: expected))
            #expect(try b.gate.spendCredit(operationID: op) == .alreadySpent(remaining: expected))
        }
        // Merging again is idempotent.
        try exchange(a.store, b.store)
        #expect(b.gate.credits() == expected)
    }

    /// Merges every gating record state of `from` into `to`.
    func exchange(_ from: Store, _ to: Store) throws {
        var states: [RecordState] = []
        try from.read { snapshot in
            for type in [CreditAccount.recordType, CreditOperation.recordType] {
                try snapshot.forEachRecordState(typeNamed: type) { states.append($0); return true }
            }
        }
        try to.write { tx in for state in states { try tx.merge(state, origin: from.siteID) } }
    }
}
