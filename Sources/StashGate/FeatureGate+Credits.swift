import Foundation
import Stash

/// A user's credit balance: one record per user (its id derives from the user id, so every
/// device holds the same record) with a ``Counter`` field that merges across replicas.
///
/// Grants are counted under deterministic pseudo-sites (one for the free credits, one per
/// purchase), so two devices granting the same thing count it once after a merge; spends are
/// counted under the spending device's site, so concurrent spends on two devices all count.
public struct CreditAccount: Record, Equatable {
    public static let recordType = "GateCreditAccount"
    public var id: RecordID
    public var credits: Counter

    /// The balance shown to the user: never below zero (two devices spending the last credit
    /// offline at once leave a debt that the next grant pays first).
    public var balance: Int { Int(max(0, credits.value)) }
}

/// A spent credit, keyed by a digest of the app's operation id: replaying the id (on this
/// device, or on another after sync) finds the record and spends nothing.
public struct CreditOperation: Record, Equatable {
    public static let recordType = "GateCreditOperation"
    public var id: RecordID
    public var account: RecordID
    public var operationID: String
    public var amount: Int
    public var at: Date
    public static let indexes: [RecordIndex<CreditOperation>] = [.index(\.account)]
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

    /// The balance now (the free credits before the first use; never below zero; 0 when the
    /// store cannot be read). Never throws.
    public func credits() -> Int {
        (try? store.read { try credits(in: $0) }) ?? 0
    }

    /// The balance as `reading` sees it.
    public func credits<S: StoreReading>(in reading: S) throws -> Int {
        try requireCredits()
        guard let account = try reading.get(CreditAccount.self, id: creditAccountID) else { return max(0, configuration.freeCredits) }
        return account.balance
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
        var account = try ensureAccount(in: tx)
        if try tx.get(CreditOperation.self, id: operation) != nil { return .alreadySpent(remaining: account.balance) }
        guard account.credits.value > 0 else {
            throw GateError(.insufficientCredits, "gate: no credits left for operation '\(operationID)' (user \(configuration.userID), store \(store.path)); nothing was spent: show the paywall, or grant credits (grantCredits(_:grantID:in:), from a purchase)")
        }
        account.credits.add(-1, site: tx.siteID)
        try tx.update(account)
        try tx.insert(CreditOperation(id: operation, account: account.id, operationID: operationID, amount: 1,
                                      at: clockGuard.referenceTime))
        return .spent(remaining: account.balance)
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
        _ = clockGuard.referenceMilliseconds
        try clockGuard.save(in: tx, threshold: 1000)
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
