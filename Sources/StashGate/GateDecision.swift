import Foundation
import Stash

/// A feature of the app, gated by tier: free features are in ``GateConfiguration/freeFeatures``,
/// every other feature needs the premium tier.
///
/// ```swift
/// extension Feature {
///     static let quickTimer: Feature = "quickTimer"
///     static let articles: Feature = "articles"
///     static let intervalTimer: Feature = "intervalTimer"
/// }
/// ```
public struct Feature: Hashable, Sendable, ExpressibleByStringLiteral, CustomStringConvertible {
    public let name: String
    public init(_ name: String) { self.name = name }
    public init(stringLiteral value: String) { self.name = value }
    /// An app's own feature enum: `Feature(TimerFeature.quickTimer)`.
    public init<T: RawRepresentable>(_ value: T) where T.RawValue == String { self.name = value.rawValue }
    public var description: String { name }

    /// The paywall: always allowed, also behind a hard gate.
    public static let paywall: Feature = "paywall"
}

/// The two tiers: free (``GateConfiguration/freeFeatures`` and the free limits) and premium
/// (every feature, no limits).
public enum Tier: String, Sendable, Hashable, Codable {
    case free, premium
}

/// Where an entitlement evaluation got its answer. Every evaluation carries one.
public enum EvaluationReason: String, Sendable, Hashable, Codable {
    /// A snapshot verified and applied while this gate runs.
    case verified
    /// The snapshot cached in the store, verified again at open (offline start).
    case cached
    /// The cached snapshot is older than the maximum offline age: time-limited entitlements
    /// are not granted until a fresh snapshot arrives (lifetime purchases still are).
    case stale
    /// No snapshot for this user: the free defaults.
    case `default`
    /// The cached snapshot failed verification (edited, unknown key) or the store could not
    /// be read: the free defaults.
    case error
    /// A test override (``GateOverride``) decided.
    case overridden

    /// The reason in a few words, for messages and status lines (the raw value is the
    /// stable name, for JSON and logs): "no snapshot yet" rather than `default`.
    public var summary: String {
        switch self {
        case .verified: "verified snapshot"
        case .cached: "cached snapshot"
        case .stale: "snapshot past the offline limit"
        case .default: "no snapshot yet"
        case .error: "snapshot rejected"
        case .overridden: "test override"
        }
    }
}

/// Why an action is denied: what the paywall shows.
public enum DenialReason: Sendable, Hashable, CustomStringConvertible {
    /// The home limit (free: 1 home) is reached, or passed after a downgrade, by the created
    /// home: the limit in all on the parent type of a per-parent limit (``LimitRule/maxRecords(_:_:per:of:)``;
    /// without one, every limit in all). ``GateDecision/limit`` names it, with its count.
    case homeLimitReached
    /// The created type's per-parent limit (free: 10 items per home) is reached, or passed
    /// after a downgrade, in the parent the record would go into.
    case itemLimitReached
    /// Not premium and another free limit is passed (after a downgrade: 3 homes of 1, or a
    /// home of 12 items while creating in another): no creation at all until it is back
    /// within, while view, search and edit stay allowed. ``GateDecision/limit`` names it.
    case overLimit
    /// Another limit in all (free: 20 tags), named here, is reached or passed by the created
    /// record; ``GateDecision/limit`` gives its count.
    case limitReached(String)
    /// The feature is in the premium tier only.
    case requiresPremium(Feature)
    /// The feature is premium and the trial that unlocked it has ended.
    case trialExpired
    /// Hard gate: the trial is over and there is no subscription; only the paywall is allowed.
    case hardGate
    /// The limit counts could not be read (a storage error, a record that cannot be
    /// decoded, a creation without the parent its per-parent limit counts by, or naming a
    /// parent that does not exist): denied to be safe. Not a case for the paywall:
    /// ``GateDecision/error`` says what failed, and ``FeatureGate/authorize(_:in:)`` throws
    /// the error (`.storage` with the cause, `.invalidConfiguration`, `.parentNotFound`).
    case checkFailed

    public var description: String {
        switch self {
        case .homeLimitReached: "homeLimitReached"
        case .itemLimitReached: "itemLimitReached"
        case .overLimit: "overLimit"
        case .limitReached(let name): "limitReached(\(name))"
        case .requiresPremium(let feature): "requiresPremium(\(feature))"
        case .trialExpired: "trialExpired"
        case .hardGate: "hardGate"
        case .checkFailed: "checkFailed"
        }
    }
}

/// Something the app wants to do, to be checked by ``FeatureGate/check(_:)`` or
/// ``FeatureGate/authorize(_:in:)``.
///
/// ```swift
/// gate.check(.use(.intervalTimer))
/// try gate.authorize(.create(Item.self, in: homeID), in: tx)
/// ```
public struct GateAction: Sendable, Hashable {
    public enum Kind: Sendable, Hashable {
        case create, use, view, edit, delete
    }

    public let kind: Kind
    public let feature: Feature?
    /// The created type: by Swift type (typed limits) or by name (schema-driven limits).
    let typeKey: ObjectIdentifier?
    public let typeName: String?
    /// The parent the new record belongs to (`homeID` for an item).
    public let parent: RecordID?
    /// The Swift type of a typed creation, for a limit given by stored name (its name is
    /// looked up only then, off the typed path).
    let recordType: (any Record.Type)?

    init(kind: Kind, feature: Feature?, typeKey: ObjectIdentifier?, typeName: String?, parent: RecordID?, recordType: (any Record.Type)? = nil) {
        self.kind = kind
        self.feature = feature
        self.typeKey = typeKey
        self.typeName = typeName
        self.parent = parent
        self.recordType = recordType
    }

    /// The stored name of the created type.
    var createdTypeName: String? { typeName ?? recordType?.recordType }

    public static func == (a: GateAction, b: GateAction) -> Bool {
        a.kind == b.kind && a.feature == b.feature && a.typeKey == b.typeKey && a.typeName == b.typeName && a.parent == b.parent
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(kind)
        hasher.combine(feature)
        hasher.combine(typeKey)
        hasher.combine(typeName)
        hasher.combine(parent)
    }

    /// Creating a record of `type`, inside `parent` for per-parent limits. A type limited per
    /// parent needs it: without, the check denies with ``DenialReason/checkFailed`` and
    /// ``FeatureGate/authorize(_:in:)`` throws `.invalidConfiguration`.
    public static func create<R: Record>(_ type: R.Type, in parent: RecordID? = nil) -> GateAction {
        GateAction(kind: .create, feature: nil, typeKey: ObjectIdentifier(type), typeName: nil, parent: parent, recordType: type)
    }

    /// Creating a record of the stored type `name` (schema-driven code such as the CLI).
    public static func create(typeNamed name: String, in parent: RecordID? = nil) -> GateAction {
        GateAction(kind: .create, feature: nil, typeKey: nil, typeName: name, parent: parent)
    }

    /// Using a feature.
    public static func use(_ feature: Feature) -> GateAction {
        GateAction(kind: .use, feature: feature, typeKey: nil, typeName: nil, parent: nil)
    }

    /// Viewing or searching (allowed in every tier, denied only by a hard gate).
    public static let view = GateAction(kind: .view, feature: nil, typeKey: nil, typeName: nil, parent: nil)
    /// Editing existing records (allowed in every tier, also over a limit; denied by a hard gate).
    public static let edit = GateAction(kind: .edit, feature: nil, typeKey: nil, typeName: nil, parent: nil)
    /// Deleting records (always allowed except behind a hard gate).
    public static let delete = GateAction(kind: .delete, feature: nil, typeKey: nil, typeName: nil, parent: nil)
}

/// The answer to a gate check: allowed or not, why not, the tier in force and where the
/// entitlement answer came from.
public struct GateDecision: Sendable, Hashable, CustomStringConvertible {
    public let isAllowed: Bool
    /// Nil when allowed.
    public let denial: DenialReason?
    public let tier: Tier
    public let reason: EvaluationReason
    /// For ``DenialReason/checkFailed``: why the counts could not be read, naming the store
    /// (and the record, when one could not be decoded).
    public let error: String?
    /// For a limit's denial (``DenialReason/homeLimitReached``, ``DenialReason/itemLimitReached``,
    /// ``DenialReason/limitReached(_:)``, ``DenialReason/overLimit``): which limit, its maximum
    /// and the count now (in the parent, for a per-parent limit).
    public let limit: LimitUsage?

    static func allow(_ access: Access) -> GateDecision {
        GateDecision(isAllowed: true, denial: nil, tier: access.tier, reason: access.reason, error: nil, limit: nil)
    }

    static func deny(_ denial: DenialReason, _ access: Access, limit: LimitUsage? = nil) -> GateDecision {
        GateDecision(isAllowed: false, denial: denial, tier: access.tier, reason: access.reason, error: nil, limit: limit)
    }

    /// The counts could not be read: denied, with the cause.
    static func checkFailed(_ error: GateError) -> GateDecision {
        GateDecision(isAllowed: false, denial: .checkFailed, tier: .free, reason: .error, error: error.message, limit: nil)
    }

    public var description: String {
        let head = isAllowed ? "allowed" : "denied: \(denial!)" + (limit.map { " (\($0))" } ?? "")
        return "\(head) (tier \(tier.rawValue): \(reason.summary))" + (error.map { "; \($0)" } ?? "")
    }
}

/// The state of the premium entitlement at the reference time, with where it came from.
public struct EntitlementDecision: Sendable, Hashable, CustomStringConvertible {
    /// The entitlement's state per the snapshot (``EntitlementState/stale`` past the offline age).
    public let status: EntitlementStatus
    public let reason: EvaluationReason
    /// The guarded reference time the decision was made at.
    public let referenceTime: Date
    /// The snapshot behind it (nil: none, or rejected).
    public let snapshotSequence: UInt64?
    public let snapshotServerTime: Date?
    /// Why the cached snapshot was rejected, when ``reason`` is `.error`.
    public let error: String?

    public var isActive: Bool { status.isActive }

    public var description: String {
        var text = "\(status.entitlement): \(status.state.rawValue) (\(reason.summary))"
        if let end = status.expiresAt { text += " until \(formatInstant(end))" }
        if let error { text += "; \(error)" }
        return text
    }
}

/// The premium access in force at one instant: the entitlement, trials and overrides folded
/// into a tier. Computed without allocation on every check.
struct Access: Sendable, Hashable {
    var isPremium: Bool
    var reason: EvaluationReason
    /// A trial (store offer or local) existed and has ended, and nothing else grants premium.
    var trialEnded: Bool
    var tier: Tier { isPremium ? .premium : .free }
}

/// `2026-01-01T00:00:00.000Z`.
func formatInstant(_ date: Date) -> String {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    return formatter.string(from: date)
}
