import Foundation

/// One purchase as the store of record (a server, StoreKit, RevenueCat) reports it: a
/// subscription period, a lifetime unlock, or a consumable pack of credits.
///
/// ```swift
/// let yearly = PurchaseTransaction(id: "t1", productID: "pro.yearly", type: .autoRenewable,
///                                  entitlements: ["pro"], purchasedAt: start,
///                                  expiresAt: start.addingTimeInterval(365 * 86_400), period: .yearly)
/// Entitlements.status(of: "pro", in: [yearly], at: now).isActive
/// ```
///
/// Instants are exact UTC instants at millisecond resolution; a time-limited grant is active
/// iff `reference < end`, where `end` is ``gracePeriodExpiresAt`` when later than
/// ``expiresAt``. A revoked (refunded) transaction grants nothing, lifetime included.
public struct PurchaseTransaction: Codable, Sendable, Hashable {
    /// What was bought.
    public enum ProductType: String, Codable, Sendable, Hashable {
        /// A subscription: grants its entitlements until ``expiresAt`` (or the grace period end).
        case autoRenewable
        /// A lifetime unlock: grants its entitlements for good, unless revoked.
        case nonConsumable
        /// A pack of credits (``credits``); grants no entitlement.
        case consumable
    }

    /// The length of a subscription period (metadata for the paywall and the status line).
    public enum Period: String, Codable, Sendable, Hashable, CaseIterable {
        case weekly, monthly, quarterly, yearly
    }

    /// A special offer the period was bought under.
    public enum Offer: String, Codable, Sendable, Hashable {
        /// A free trial: full access until ``expiresAt``.
        case freeTrial
        /// A discounted introductory period.
        case introductory
    }

    /// Unique per purchase (a renewal is a new transaction).
    public var id: String
    /// The product bought, as the store of record names it (`"pro.yearly"`); reported in
    /// ``EntitlementStatus``.
    public var productID: String
    /// Subscription, lifetime unlock or credit pack: decides what it grants and for how long.
    public var type: ProductType
    /// The entitlements this purchase grants, e.g. `["pro"]`.
    public var entitlements: [String]
    /// When it was bought. Metadata: access does not depend on it.
    public var purchasedAt: Date
    /// The end of the paid (or trial) period; subscriptions only.
    public var expiresAt: Date?
    /// The subscription period's length (metadata, reported in ``EntitlementStatus``).
    public var period: Period?
    /// The offer the period was bought under: while the period lasts, `.freeTrial` reads as
    /// the state `.trial` and `.introductory` as `.introductory`. Nil: a regular paid period.
    public var offer: Offer?
    /// Billing failed at renewal and the store keeps access open until this instant.
    public var gracePeriodExpiresAt: Date?
    /// Billing failed and the store is retrying: no access after ``expiresAt`` (and after the
    /// grace period, if any).
    public var isInBillingRetry: Bool
    /// Refunded or revoked at this instant: the transaction grants nothing.
    public var revokedAt: Date?
    /// Credits a consumable adds.
    public var credits: Int?
    /// Paywall metadata.
    public var displayName: String?
    /// The price paid, in ``currencyCode`` (paywall metadata; never evaluated).
    public var price: Decimal?
    /// The currency of ``price`` (`"EUR"`; paywall metadata).
    public var currencyCode: String?

    public init(id: String, productID: String, type: ProductType, entitlements: [String] = [],
                purchasedAt: Date, expiresAt: Date? = nil, period: Period? = nil, offer: Offer? = nil,
                gracePeriodExpiresAt: Date? = nil, isInBillingRetry: Bool = false, revokedAt: Date? = nil,
                credits: Int? = nil, displayName: String? = nil, price: Decimal? = nil, currencyCode: String? = nil) {
        self.id = id
        self.productID = productID
        self.type = type
        self.entitlements = entitlements
        self.purchasedAt = purchasedAt
        self.expiresAt = expiresAt
        self.period = period
        self.offer = offer
        self.gracePeriodExpiresAt = gracePeriodExpiresAt
        self.isInBillingRetry = isInBillingRetry
        self.revokedAt = revokedAt
        self.credits = credits
        self.displayName = displayName
        self.price = price
        self.currencyCode = currencyCode
    }

    enum CodingKeys: String, CodingKey, CaseIterable {
        case id, productID, type, entitlements, purchasedAt, expiresAt, period, offer, gracePeriodExpiresAt,
             isInBillingRetry, revokedAt, credits, displayName, price, currencyCode
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(String.self, forKey: .id)
        productID = try c.decode(String.self, forKey: .productID)
        type = try c.decode(ProductType.self, forKey: .type)
        entitlements = try c.decodeIfPresent([String].self, forKey: .entitlements) ?? []
        purchasedAt = try c.decode(Date.self, forKey: .purchasedAt)
        expiresAt = try c.decodeIfPresent(Date.self, forKey: .expiresAt)
        period = try c.decodeIfPresent(Period.self, forKey: .period)
        offer = try c.decodeIfPresent(Offer.self, forKey: .offer)
        gracePeriodExpiresAt = try c.decodeIfPresent(Date.self, forKey: .gracePeriodExpiresAt)
        isInBillingRetry = try c.decodeIfPresent(Bool.self, forKey: .isInBillingRetry) ?? false
        revokedAt = try c.decodeIfPresent(Date.self, forKey: .revokedAt)
        credits = try c.decodeIfPresent(Int.self, forKey: .credits)
        displayName = try c.decodeIfPresent(String.self, forKey: .displayName)
        price = try c.decodeIfPresent(Decimal.self, forKey: .price)
        currencyCode = try c.decodeIfPresent(String.self, forKey: .currencyCode)
    }

    /// The member names of a transaction's JSON (for tools that refuse a misspelt one, which
    /// decoding ignores).
    package static let memberNames = Set(CodingKeys.allCases.map(\.stringValue))

    /// True when a refund or revocation was reported.
    public var isRevoked: Bool { revokedAt != nil }

    /// The instant (ms) a time-limited grant ends, nil when it is not time-limited or invalid.
    var endMilliseconds: Int64? {
        guard type == .autoRenewable, let expiresAt else { return nil }
        let end = milliseconds(expiresAt)
        guard let grace = gracePeriodExpiresAt.map(milliseconds) else { return end }
        return max(end, grace)
    }

    func grants(_ entitlement: String) -> Bool {
        type != .consumable && entitlements.contains(entitlement)
    }
}

/// Where an entitlement stands at a reference time.
public enum EntitlementState: String, Codable, Sendable, Hashable {
    /// A lifetime purchase grants it.
    case lifetime
    /// A paid subscription period covers the reference time.
    case subscribed
    /// A free-trial period covers the reference time.
    case trial
    /// An introductory (discounted) period covers the reference time.
    case introductory
    /// The period ended, billing failed, and the store keeps access open for a grace period.
    case gracePeriod
    /// The period ended, billing failed, and the store is retrying: not entitled.
    case billingRetry
    /// Every granting transaction was refunded or revoked.
    case revoked
    /// Granted by a time-limited purchase, but the snapshot is older than the maximum offline
    /// age: not entitled until a fresh snapshot arrives.
    case stale
    /// Every granting period has ended.
    case expired
    /// Nothing ever granted it.
    case none

    /// True for the states that grant access.
    public var isActive: Bool {
        switch self {
        case .lifetime, .subscribed, .trial, .introductory, .gracePeriod: true
        default: false
        }
    }
}

/// The state of one entitlement at a reference time, with the transaction behind it.
public struct EntitlementStatus: Sendable, Hashable {
    /// The entitlement asked about (`"pro"`).
    public let entitlement: String
    /// Where it stands at the reference time.
    public let state: EntitlementState
    /// When access ends (active time-limited states), or ended (expired, billing retry);
    /// nil for lifetime and none.
    public let expiresAt: Date?
    /// The transaction that decided the state.
    public let transactionID: String?
    /// The subscription's product and period (paywall and status line).
    public let productID: String?
    public let period: PurchaseTransaction.Period?

    /// True when ``state`` grants access.
    public var isActive: Bool { state.isActive }

    init(_ entitlement: String, _ state: EntitlementState, expiresAt: Int64? = nil, transaction: PurchaseTransaction? = nil) {
        self.entitlement = entitlement
        self.state = state
        self.expiresAt = expiresAt.map(dateFromMilliseconds)
        self.transactionID = transaction?.id
        self.productID = transaction?.productID
        self.period = transaction?.period
    }
}

/// Pure entitlement evaluation: a function of the transaction set and a reference time.
public enum Entitlements {
    /// The state of `entitlement` at `reference` (see ``PurchaseTransaction`` for the rules).
    ///
    /// Only the passage of time removes access: for a fixed transaction set, a later reference
    /// time never grants what an earlier one did not. (Purchase dates do not matter: a
    /// transaction in a snapshot has happened.)
    public static func status(of entitlement: String, in transactions: [PurchaseTransaction], at reference: Date) -> EntitlementStatus {
        status(of: entitlement, in: transactions, atMilliseconds: milliseconds(reference))
    }

    /// True when `entitlement` is active at `reference`.
    public static func isActive(_ entitlement: String, in transactions: [PurchaseTransaction], at reference: Date) -> Bool {
        status(of: entitlement, in: transactions, at: reference).isActive
    }

    static func status(of entitlement: String, in transactions: [PurchaseTransaction], atMilliseconds t: Int64) -> EntitlementStatus {
        // Active: a paid (or trial) period covering now wins over a grace period, then the latest
        // end. Lapsed: billing retry, then the latest of a revocation and an expiry.
        var activePaid: (PurchaseTransaction, Int64)?
        var activeGrace: (PurchaseTransaction, Int64)?
        var retry: (PurchaseTransaction, Int64)?
        var expired: (PurchaseTransaction, Int64)?
        var revoked: (PurchaseTransaction, Int64)?
        func later(_ candidate: (PurchaseTransaction, Int64), than current: (PurchaseTransaction, Int64)?) -> Bool {
            current.map { candidate.1 > $0.1 } ?? true
        }
        for transaction in transactions where transaction.grants(entitlement) {
            if let revokedAt = transaction.revokedAt {
                let at = (transaction, milliseconds(revokedAt))
                if later(at, than: revoked) { revoked = at }
                continue
            }
            if transaction.type == .nonConsumable {
                return EntitlementStatus(entitlement, .lifetime, transaction: transaction)
            }
            guard let end = transaction.endMilliseconds else { continue }
            let candidate = (transaction, end)
            if t < end {
                let paidEnd = transaction.expiresAt.map(milliseconds) ?? end
                if t < paidEnd {
                    if later(candidate, than: activePaid) { activePaid = candidate }
                } else if later(candidate, than: activeGrace) {
                    activeGrace = candidate
                }
            } else if transaction.isInBillingRetry {
                if later(candidate, than: retry) { retry = candidate }
            } else if later(candidate, than: expired) {
                expired = candidate
            }
        }
        if let (transaction, end) = activePaid ?? activeGrace {
            let state: EntitlementState
            if activePaid == nil { state = .gracePeriod }
            else if transaction.offer == .freeTrial { state = .trial }
            else if transaction.offer == .introductory { state = .introductory }
            else { state = .subscribed }
            return EntitlementStatus(entitlement, state, expiresAt: end, transaction: transaction)
        }
        if let (transaction, end) = retry { return EntitlementStatus(entitlement, .billingRetry, expiresAt: end, transaction: transaction) }
        if let (transaction, revokedAt) = revoked, expired.map({ revokedAt >= $0.1 }) ?? true {
            return EntitlementStatus(entitlement, .revoked, transaction: transaction)
        }
        if let (transaction, end) = expired { return EntitlementStatus(entitlement, .expired, expiresAt: end, transaction: transaction) }
        return EntitlementStatus(entitlement, .none)
    }
}

/// What the hot path needs from a transaction set for one entitlement, precomputed once per
/// snapshot: access is `lifetime || reference < timeLimitedEnd` (before the staleness rule).
struct AccessSummary: Sendable, Equatable {
    /// An unrevoked lifetime purchase grants the entitlement.
    var lifetime = false
    /// The latest end (ms) of an unrevoked time-limited grant; `Int64.min` when none.
    var timeLimitedEnd = Int64.min
    /// The same, per subscription period (each judged by its own offline allowance).
    var endsByPeriod = PerPeriod(repeating: .min)
    /// The latest end of an unrevoked free-trial grant; `Int64.min` when none.
    var trialEnd = Int64.min

    init() {}

    init(_ entitlement: String, _ transactions: [PurchaseTransaction]) {
        for transaction in transactions where transaction.grants(entitlement) && !transaction.isRevoked {
            if transaction.type == .nonConsumable { lifetime = true; continue }
            guard let end = transaction.endMilliseconds else { continue }
            timeLimitedEnd = max(timeLimitedEnd, end)
            endsByPeriod[transaction.period] = max(endsByPeriod[transaction.period], end)
            if transaction.offer == .freeTrial { trialEnd = max(trialEnd, end) }
        }
    }
}

/// `a - b` in milliseconds, saturating: instants from a snapshot or the store may be anywhere
/// in the range (a hostile or damaged value must not trap every launch).
func millisecondsBetween(_ a: Int64, _ b: Int64) -> Int64 {
    let (difference, overflow) = a.subtractingReportingOverflow(b)
    return overflow ? (a > b ? .max : .min) : difference
}

/// `a + b` in milliseconds, saturating.
func millisecondsAdding(_ a: Int64, _ b: Int64) -> Int64 {
    let (sum, overflow) = a.addingReportingOverflow(b)
    return overflow ? (b > 0 ? .max : .min) : sum
}

/// `seconds` as milliseconds, saturating (`.infinity`: never; NaN: 0).
func milliseconds(seconds: Double) -> Int64 {
    guard !seconds.isNaN else { return 0 }
    let value = (seconds * 1000).rounded()
    if value >= Double(Int64.max) { return Int64.max }
    if value <= Double(Int64.min) { return Int64.min }
    return Int64(value)
}

/// Milliseconds since 1970 of `date`, rounded down (with a microsecond of slack for the
/// binary representation of whole milliseconds), saturating.
///
/// NaN (a clock or a purchase date computed from bad input) counts as 0, as in
/// ``milliseconds(seconds:)``: a NaN wall clock leaves the reference time at the highest time
/// seen, and a NaN expiry or revocation lies in the past.
func milliseconds(_ date: Date) -> Int64 {
    guard !date.timeIntervalSince1970.isNaN else { return 0 }
    let value = (date.timeIntervalSince1970 * 1000 + 0.001).rounded(.down)
    if value >= Double(Int64.max) { return Int64.max }
    if value <= Double(Int64.min) { return Int64.min }
    return Int64(value)
}

func dateFromMilliseconds(_ milliseconds: Int64) -> Date {
    Date(timeIntervalSince1970: Double(milliseconds) / 1000)
}
