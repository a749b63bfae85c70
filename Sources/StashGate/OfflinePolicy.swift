import Foundation

/// How long a cached snapshot keeps a subscription in force without a fresh one, by the
/// subscription's period: the offline allowance.
///
/// A snapshot vouches for what the server knew at its ``EntitlementSnapshot/serverTime``. A
/// refund or a cancellation after that is unknown until the next snapshot, so a
/// time-limited grant (subscription, trial or introductory offer) counts only while the
/// snapshot is younger than the allowance of that grant's period: measured from the server
/// time to the guarded reference time, a grant is in force iff `reference < expiry` and
/// `reference - serverTime <= allowance(period)`. Past it the grant is ``EntitlementState/stale``
/// (reason ``EvaluationReason/stale``: "reconnect", not "buy") until a snapshot arrives.
/// Lifetime purchases are never stale. With several grants, any one within its own allowance
/// keeps premium.
///
/// The allowance follows the period because the risk does: a weekly plan is billed, and can
/// lapse, every week; an annual subscriber who paid for the year should not lose premium
/// after a long weekend offline.
///
/// ```swift
/// config.offlinePolicy = .standard                  // 3 days weekly … 30 days yearly
/// config.offlinePolicy.yearly = 60 * 86_400         // an app whose users travel
/// config.offlinePolicy = .uniform(3 * 86_400)       // one allowance for every period
/// ```
public struct OfflinePolicy: Sendable, Hashable {
    /// The allowance of a weekly subscription (seconds).
    public var weekly: TimeInterval
    /// The allowance of a monthly subscription.
    public var monthly: TimeInterval
    /// The allowance of a quarterly subscription.
    public var quarterly: TimeInterval
    /// The allowance of a yearly subscription.
    public var yearly: TimeInterval
    /// The allowance of a subscription whose snapshot gives no ``PurchaseTransaction/period``.
    public var unspecified: TimeInterval

    /// A policy with these allowances (seconds; `.infinity`: never stale).
    public init(weekly: TimeInterval, monthly: TimeInterval, quarterly: TimeInterval, yearly: TimeInterval,
                unspecified: TimeInterval) {
        self.weekly = weekly
        self.monthly = monthly
        self.quarterly = quarterly
        self.yearly = yearly
        self.unspecified = unspecified
    }

    /// The default: 3 days for a weekly plan, 7 for a monthly one, 14 for a quarterly one,
    /// 30 for a yearly one, and 3 when the period is not given (the cautious choice).
    public static let standard = OfflinePolicy(weekly: 3 * 86_400, monthly: 7 * 86_400, quarterly: 14 * 86_400,
                                               yearly: 30 * 86_400, unspecified: 3 * 86_400)

    /// The same allowance for every period.
    public static func uniform(_ allowance: TimeInterval) -> OfflinePolicy {
        OfflinePolicy(weekly: allowance, monthly: allowance, quarterly: allowance, yearly: allowance, unspecified: allowance)
    }

    /// The allowance of a subscription with `period` (nil: not given).
    public func allowance(for period: PurchaseTransaction.Period?) -> TimeInterval {
        byPeriod(period, weekly, monthly, quarterly, yearly, unspecified)
    }

    /// The longest allowance of any period.
    public var longest: TimeInterval { max(weekly, monthly, quarterly, yearly, unspecified) }
}

/// Five values, one per period class (the four periods and "not given"), stored inline so
/// that the hot path reads them without an allocation.
struct PerPeriod: Sendable, Equatable {
    var weekly: Int64
    var monthly: Int64
    var quarterly: Int64
    var yearly: Int64
    var unspecified: Int64

    init(repeating value: Int64) {
        (weekly, monthly, quarterly, yearly, unspecified) = (value, value, value, value, value)
    }

    /// The policy's allowances in milliseconds.
    init(_ policy: OfflinePolicy) {
        weekly = milliseconds(seconds: policy.weekly)
        monthly = milliseconds(seconds: policy.monthly)
        quarterly = milliseconds(seconds: policy.quarterly)
        yearly = milliseconds(seconds: policy.yearly)
        unspecified = milliseconds(seconds: policy.unspecified)
    }

    subscript(period: PurchaseTransaction.Period?) -> Int64 {
        get { byPeriod(period, weekly, monthly, quarterly, yearly, unspecified) }
        set {
            switch period {
            case .weekly?: weekly = newValue
            case .monthly?: monthly = newValue
            case .quarterly?: quarterly = newValue
            case .yearly?: yearly = newValue
            case nil: unspecified = newValue
            }
        }
    }

    /// Whether some class's end lies after `reference` while `age` is within that class's
    /// allowance: a grant is in force. No allocation.
    static func anyInForce(ends: PerPeriod, allowances: PerPeriod, reference: Int64, age: Int64) -> Bool {
        (reference < ends.weekly && age <= allowances.weekly)
            || (reference < ends.monthly && age <= allowances.monthly)
            || (reference < ends.quarterly && age <= allowances.quarterly)
            || (reference < ends.yearly && age <= allowances.yearly)
            || (reference < ends.unspecified && age <= allowances.unspecified)
    }
}

/// The one of five values that belongs to `period` (the four periods, then "not given").
private func byPeriod<T>(_ period: PurchaseTransaction.Period?, _ weekly: T, _ monthly: T, _ quarterly: T, _ yearly: T,
                         _ unspecified: T) -> T {
    switch period {
    case .weekly?: weekly
    case .monthly?: monthly
    case .quarterly?: quarterly
    case .yearly?: yearly
    case nil: unspecified
    }
}
