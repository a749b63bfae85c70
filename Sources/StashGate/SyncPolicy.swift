import Foundation
import Stash

/// Whether this store syncs in this session: premium ∧ the user's preference.
///
/// Decided once when the gate opens, from the cached snapshot and
/// ``Store/syncPreferenceAtOpen``, so a running app never starts or stops syncing halfway
/// through a session. Losing premium (an expiry, a refund, a stale snapshot) turns sync off
/// at the next open; nothing is deleted or hidden: every record stays in the store, history
/// keeps recording, and regaining premium ships what was written meanwhile.
///
/// ```swift
/// let gate = try FeatureGate.open(store, configuration: config)
/// if gate.syncPolicy.isActive { try engine.start() }
/// ```
public struct SyncPolicy: Sendable, Hashable, CustomStringConvertible {
    /// Sync runs in this session.
    public let isActive: Bool
    /// Premium at open (entitlement, trial or override).
    public let isPremium: Bool
    /// The user's sync preference at open.
    public let preference: Bool
    /// Where the premium answer came from.
    public let reason: EvaluationReason

    public init(isPremium: Bool, preference: Bool, reason: EvaluationReason) {
        self.isPremium = isPremium
        self.preference = preference
        self.reason = reason
        self.isActive = Self.isActive(premium: isPremium, preference: preference)
    }

    /// The rule itself.
    public static func isActive(premium: Bool, preference: Bool) -> Bool { premium && preference }

    public var description: String {
        let why = isActive ? "premium and preference on" : !isPremium ? "not premium (\(reason.summary))" : "preference off"
        return "sync \(isActive ? "active" : "inactive") (\(why))"
    }
}
