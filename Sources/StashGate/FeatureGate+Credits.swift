import Foundation
import Stash

/// A user's credit grants: one record per user (its id derives from the user id, so every
/// device holds the same record) with a ``Counter`` field that merges across replicas.
///
/// Grants are counted under deterministic pseudo-sites (one for the free credits, one per
/// purchase or grant id), so two devices granting the same thing count it once after a merge.
/// Spends are not in the counter: each is a ``CreditOperation`` record under its operation id,
/// so one operation spent on several devices is one record once they have synced, and counts
/// once. The balance is ``granted`` minus the number of those records (``CreditBalance``).
public struct CreditAccount: Record, Equatable {
    public static let recordType = "GateCreditAccount"
    public var id: RecordID
    public var credits: Counter

    /// The credits granted: free credits, purchases (refunded ones taken back) and grants.
    ///
    /// Versions before spends were records subtracted them in the counter, under the spending
    /// store's site; such a site only ever decrements (every grant site first adds), and each
    /// of those spends also left its ``CreditOperation``, which counts it. So sites that never
    /// added are left out here: an old spend counts once, from its record.
    public var granted: Int64 {
        let sum = credits.sites.values.reduce(Int128(0)) { sum, totals in
            totals.increments > 0 ? sum + Int128(totals.increments) - Int128(totals.decrements) : sum
        }
        return Int64(clamping: sum)
    }

    @available(*, unavailable, message: "spends are CreditOperation records now: use FeatureGate.creditBalance() (available, debt)")
    public var balance: Int { 0 }
}

/// A spent credit, keyed by a digest of the user and the app's operation id: replaying the id
/// (on this device, or on another after sync) finds the record and spends nothing, and the
/// same id spent on two devices before they sync is one record once they have: it counts once.
public struct CreditOperation: Record, Equatable {
    public static let recordType = "GateCreditOperation"
    public var id: RecordID
    public var account: RecordID
    public var operationID: String
    /// Always 1: a spend is one credit.
    public var amount: Int
    public var at: Date
    public static let indexes: [RecordIndex<CreditOperation>] = [.index(\.account)]
}

/// A user's credits: what was granted, what was spent, and what is left or owed.
///
/// Two devices that each spend the last credit while offline both succeed (neither knows of
/// the other's spend); once they sync, more was spent than granted. That overspend is a
/// ``debt``, never hidden behind a balance of 0: the next credits granted pay it first.
public struct CreditBalance: Sendable, Hashable, CustomStringConvertible {
    /// Credits granted in all (free, purchased, granted; refunds taken back).
    public let granted: Int
    /// Distinct operations spent, on every device this store has synced with.
    public let spent: Int

    public init(granted: Int, spent: Int) {
        self.granted = granted
        self.spent = spent
    }

    /// Credits that can be spent now (0 when in debt).
    public var available: Int { max(0, granted - spent) }
    /// Credits spent beyond those granted (devices that spent offline at once); 0 otherwise.
    public var debt: Int { max(0, spent - granted) }

    public var description: String {
        "\(available) available (granted \(granted), spent \(spent))" + (debt > 0 ? "; debt \(debt): spent beyond the grants on devices that were offline, paid first by the next credits granted" : "")
    }
}

/// What ``FeatureGate/spendCredit(operationID:in:)`` did.
public enum CreditSpend: Sendable, Hashable {
    /// One credit was spent; `remaining` are left.
    case spent(remaining: Int)
    /// The operation id was spent before: nothing changed.
    case alreadySpent(remaining: Int)

    public var remaining: Int {
        switch self {
        case .spent(let n), .alreadySpent(let n): n
        }
    }
}

extension FeatureGate {
    /// The id of this user's ``CreditAccount`` (the same on every device).
    public var creditAccountID: RecordID { Self.creditAccountID(userID: configuration.userID) }

    static func creditAccountID(userID: String) -> RecordID {
        RecordID(bytes: digest16("stash.gate.credit-account", userID)[...])!
    }

    private func grantSite(_ grantID: String) -> RecordID {
        RecordID(bytes: digest16("stash.gate.credit-grant", configuration.userID, grantID)[...])!
    }

    private func operationRecordID(_ operationID: String) -> RecordID {
        RecordID(bytes: digest16("stash.gate.credit-operation", configuration.userID, operationID)[...])!
    }

    private func requireCredits() throws {
        guard creditsEnabled else {
            throw GateError(.invalidConfiguration, "gate: credits need the store opened with FeatureGate.recordTypes (store \(store.path))")
        }
    }

    /// The credits that can be spent now (the free credits before the first use; 0 in debt,
    /// and when the store cannot be read). Never throws. ``creditBalance()`` tells the debt.
    public func credits() -> Int {
        creditBalance()?.available ?? 0
    }

    /// The credits that can be spent as `reading` sees them.
    /// - Throws: `.invalidConfiguration` without the gate's record types; the store's error.
    public func credits<S: StoreReading>(in reading: S) throws -> Int {
        try creditBalance(in: reading).available
    }

    /// The credits granted, spent, available and owed now; nil when the store cannot be read
    /// or lacks the gate's record types. O(1): the account and one index count.
    public func creditBalance() -> CreditBalance? {
        try? store.read { try creditBalance(in: $0) }
    }

    /// ``creditBalance()`` as `reading` sees it (a write transaction: with its own spends).
    /// - Throws: `.invalidConfiguration` without the gate's record types; the store's error.
    public func creditBalance<S: StoreReading>(in reading: S) throws -> CreditBalance {
        try requireCredits()
        let account = try reading.get(CreditAccount.self, id: creditAccountID)
        let granted = account.map(\.granted) ?? Int64(max(0, configuration.freeCredits))
        let spent = try reading.count(CreditOperation.self, where: \.account, equals: creditAccountID)
        return CreditBalance(granted: Int(clamping: granted), spent: spent)
    }

    /// Spends one credit for `operationID`, in the caller's transaction (so the work the
    /// credit pays for commits with it, or neither does).
    ///
    /// The first use creates the account with ``GateConfiguration/freeCredits``. Replaying an
    /// operation id has no effect and returns ``CreditSpend/alreadySpent(remaining:)``.
    /// - Throws: ``GateError`` `.insufficientCredits` at a zero balance (the transaction
    ///   rolls back).
    @discardableResult
    public func spendCredit(operationID: String, in tx: StoreTransaction) throws -> CreditSpend {
        try requireCredits()
        try saveClock(in: tx)
        let operation = operationRecordID(operationID)
        let account = try ensureAccount(in: tx)
        let balance = try creditBalance(in: tx)
        if try tx.get(CreditOperation.self, id: operation) != nil { return .alreadySpent(remaining: balance.available) }
        guard balance.available > 0 else {
            let owed = balance.debt > 0 ? " (and \(balance.debt) owed: devices that were offline spent more than was granted)" : ""
            throw GateError(.insufficientCredits, "gate: no credits left for operation '\(operationID)'\(owed) (user \(configuration.userID), store \(store.path)); nothing was spent: show the paywall, or grant credits (grantCredits(_:grantID:in:), from a purchase)")
        }
        try tx.insert(CreditOperation(id: operation, account: account.id, operationID: operationID, amount: 1,
                                      at: clockGuard.referenceTime))
        return .spent(remaining: balance.available - 1)
    }

    /// ``spendCredit(operationID:in:)`` in its own write transaction.
    @discardableResult
    public func spendCredit(operationID: String) throws -> CreditSpend {
        do { return try store.write(author: "gate") { tx in try spendCredit(operationID: operationID, in: tx) } }
        catch let error as StoreError { throw GateError(.storage, "gate: \(error.message)", underlying: error) }
    }

    /// Adds `amount` credits once per `grantID` (a purchase id, a promotion): granting the
    /// same id again, here or on another device, adds nothing more.
    ///
    /// A grant id holds one amount, the highest it was given: granting it again with a
    /// higher amount raises it and adds the difference (two devices that granted it with
    /// different amounts hold the highest after a sync), with the same or a lower amount it
    /// adds nothing.
    /// - Returns: the credits this call added: `amount` for a new grant, the difference for a
    ///   raised one, 0 when the grant already held `amount` or more.
    /// - Throws: `.invalidConfiguration` for an `amount` of 0 or less (a grant never takes
    ///   credits away), and for the ids the gate keeps for itself ("free", and "purchase:…"
    ///   for snapshot packs): such a grant would merge with the gate's own and add only the
    ///   difference.
    @discardableResult
    public func grantCredits(_ amount: Int, grantID: String, in tx: StoreTransaction) throws -> Int {
        try requireCredits()
        guard amount > 0 else {
            throw GateError(.invalidConfiguration, "gate: grant '\(grantID)' of \(amount) credits refused: a grant adds 1 credit or more (user \(configuration.userID))")
        }
        if grantID == "free" || grantID.hasPrefix("purchase:") {
            throw GateError(.invalidConfiguration, "gate: grant id '\(grantID)' is one the gate keeps for itself (\"free\", \"purchase:…\"); give the grant an id of its own, such as \"promo:\(grantID)\"")
        }
        try saveClock(in: tx)
        var account = try ensureAccount(in: tx)
        let granted = account.credits.sites[grantSite(grantID).description]?.increments ?? 0
        guard setGrant(&account.credits, grantID, increments: Int64(amount), decrements: 0) else { return 0 }
        try tx.update(account)
        return Int(Int64(amount) - granted)
    }

    /// Saves the highest time seen in a credit write, as ``authorize(_:in:)`` does: an app
    /// whose only gate writes are spends keeps the clock it saw (the save is counted as done
    /// only if `tx` commits).
    private func saveClock(in tx: StoreTransaction) throws {
        // Another process may have settled the stored clock with a newer snapshot: take it up
        // first, or this save would raise the clock again.
        try refresh(from: tx)
        try saveState(in: tx, threshold: 1000)
    }

    /// Credits consumable purchases of a snapshot once each, and takes back refunded ones.
    func creditPurchases(_ snapshot: EntitlementSnapshot, in tx: StoreTransaction) throws {
        let packs = snapshot.transactions.filter { $0.type == .consumable && ($0.credits ?? 0) > 0 }
        if packs.isEmpty { return }
        var account = try ensureAccount(in: tx)
        var changed = false
        for pack in packs {
            let amount = Int64(pack.credits!)
            if setGrant(&account.credits, "purchase:" + pack.id, increments: amount, decrements: pack.isRevoked ? amount : 0) {
                changed = true
            }
        }
        if changed { try tx.update(account) }
    }

    /// Raises the grant's pseudo-site totals to the given values (a join, so idempotent).
    private func setGrant(_ counter: inout Counter, _ grantID: String, increments: Int64, decrements: Int64) -> Bool {
        let site = grantSite(grantID)
        let current = counter.sites[site.description]
        let (added, taken) = (current?.increments ?? 0, current?.decrements ?? 0)
        var changed = false
        if increments > added { counter.add(increments - added, site: site); changed = true }
        if decrements > taken { counter.add(-(decrements - taken), site: site); changed = true }
        return changed
    }

    /// This user's account, created on first use with the free credits. Every device creates
    /// it with the same incarnation and the same free grant, so the copies merge field by
    /// field (the counters join) instead of one replacing the other.
    private func ensureAccount(in tx: StoreTransaction) throws -> CreditAccount {
        let id = creditAccountID
        if let account = try tx.get(CreditAccount.self, id: id) { return account }
        var counter = Counter()
        if configuration.freeCredits > 0 { counter.add(Int64(configuration.freeCredits), site: grantSite("free")) }
        let version = Version(clock: 1 << 16, site: id)
        let state = RecordState(type: CreditAccount.recordType, id: id, incarnation: version, tombstone: nil,
                                fields: ["credits": FieldState(value: try FieldValue(encoding: counter), version: version)])
        try tx.merge(state, origin: tx.siteID)
        guard let account = try tx.get(CreditAccount.self, id: id) else {
            throw GateError(.storage, "gate: the credit account of user \(configuration.userID) was deleted in store \(store.path); credits cannot be used")
        }
        return account
    }
}
