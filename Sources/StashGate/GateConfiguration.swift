import Foundation
import Stash

/// Everything a ``FeatureGate`` needs to know, as one value: who the user is, how snapshots
/// are verified, what is free, the limits, trials, credits and test overrides. Nothing is
/// read from globals or the environment.
///
/// ```swift
/// let verifier = try Ed25519SnapshotVerifier(publicKeys: ["k1": serverPublicKey])
/// var config = GateConfiguration(userID: account.id, verifier: verifier)
/// config.freeFeatures = [.quickTimer, .articles]
/// config.limits = [.maxRecords(Home.self, 1).named("homes"), .maxRecords(Item.self, 10, per: \.homeID, of: Home.self)]
/// let gate = try FeatureGate.open(store, configuration: config)
/// ```
public struct GateConfiguration: Sendable {
    /// The signed-in user. Snapshots for anyone else are refused, and each user has their
    /// own cached snapshot in the store.
    public var userID: String
    /// Checks snapshot signatures: ``Ed25519SnapshotVerifier`` in an app (it holds public
    /// keys only), ``HMACSnapshotVerifier`` where a secret stays secret.
    public var verifier: any SnapshotVerifier
    /// The entitlement that unlocks the premium tier. Default `"pro"`.
    public var premiumEntitlement = "pro"
    /// The free tier's features; the premium tier has every feature.
    public var freeFeatures: Set<Feature> = []
    /// Free-tier limits, counted from indexes. Premium has none.
    public var limits: [LimitRule] = []
    /// How long a cached snapshot keeps each subscription alive without a fresh one, by the
    /// subscription's period (measured from its server time to the reference time). Default
    /// ``OfflinePolicy/standard``: 3 days for a weekly plan up to 30 for a yearly one.
    public var offlinePolicy = OfflinePolicy.standard
    /// One offline allowance for every period: setting it sets ``offlinePolicy`` to
    /// ``OfflinePolicy/uniform(_:)``; reading it gives the policy's longest allowance.
    public var maxOfflineAge: TimeInterval {
        get { offlinePolicy.longest }
        set { offlinePolicy = .uniform(newValue) }
    }
    /// A local trial with full access (nil: none), from the user's first launch: with
    /// ``FeatureGate/recordTypes`` in the store, the earliest start on any of the user's synced
    /// devices (``UserTrial``), never later than this store's first launch.
    public var trialLength: TimeInterval?
    /// Freemium (free tier + premium) or a hard gate (nothing but the paywall once the trial
    /// is over without a subscription).
    public var accessModel: AccessModel = .freemium
    /// Credits granted once per user on first use of credits. Default 3.
    public var freeCredits = 3
    /// Forces a tier for tests and previews; nil (the default) in production.
    public var override: GateOverride?
    /// The wall clock; nil uses the store's clock (``StoreOptions/clock``).
    public var clock: (@Sendable () -> Date)?
    /// How often ``FeatureGate/updates()`` looks for expiries and snapshots applied by other
    /// processes. Default 100 ms (an expiry is published well within 1 s).
    public var updatePollInterval: Duration = .milliseconds(100)

    /// A freemium configuration for `userID` with the defaults above: no free features, no
    /// limits, no trial. Nothing is checked until ``FeatureGate/open(_:configuration:)``.
    public init(userID: String, verifier: any SnapshotVerifier) {
        self.userID = userID
        self.verifier = verifier
    }

    /// A hard-gated app: `trialDays` of full access from the first launch, then only the
    /// paywall without an active subscription.
    public static func hardGate(userID: String, verifier: any SnapshotVerifier, trialDays: Int = 7) -> GateConfiguration {
        var config = GateConfiguration(userID: userID, verifier: verifier)
        config.accessModel = .hardGate
        config.trialLength = TimeInterval(trialDays) * 86_400
        return config
    }
}

/// How a non-premium user is treated.
public enum AccessModel: String, Sendable, Hashable {
    /// Free features and free limits; premium unlocks everything.
    case freemium
    /// Everything but ``Feature/paywall`` is denied (``DenialReason/hardGate``).
    case hardGate
}

/// A test override of the tier: explicit configuration, never a global.
public enum GateOverride: String, Sendable, Hashable {
    /// Free tier whatever the snapshot says (and no local trial).
    case forceFree
    /// Premium tier whatever the snapshot says.
    case forcePro
}

/// A free-tier limit: at most `maximum` records of a type, in all or per parent. Every limit
/// has a ``name``, which denials report with the limit and the count (``LimitUsage``).
///
/// ```swift
/// .maxRecords(Home.self, 1).named("homes")                  // 1 home     → homeLimitReached
/// .maxRecords(Item.self, 10, per: \.homeID, of: Home.self)  // 10 per home → itemLimitReached
/// ```
/// Counts come from the store in O(1): the type's count and an index on the parent field
/// (the type must declare `.index(\.homeID)`). A per-parent limit given its parent's type
/// (`of:`) also checks that the parent exists (one lookup): a creation in a parent that does
/// not exist is refused (``GateError/Code/parentNotFound``) instead of counting an empty group.
public struct LimitRule: Sendable {
    /// What denials call this limit: ``named(_:)``, or by default the type's stored name
    /// ("Home"), and for a per-parent limit "Item per Home" (or "Item per homeID" without the
    /// parent's type).
    public var name: String { parts.name }
    /// The stored type name.
    public var typeName: String { parts.typeName }
    /// The records the free tier may hold (in all, or per parent). Creating one more is
    /// denied (``denial``) once there are `maximum`; holding more (after a downgrade from
    /// premium, say) denies the creation of anything else too, with ``DenialReason/overLimit``.
    public var maximum: Int { parts.maximum }
    /// The parent field for per-parent limits.
    public var parentField: String? { parts.parentField }
    /// The parent's stored type name, when the limit was given one (its existence is checked).
    public var parentTypeName: String? { parts.parent?.typeName }
    var typeKey: ObjectIdentifier? { parts.typeKey }
    var counter: any LimitCounter { parts.counter }
    var parent: (any ParentLookup)? { parts.parent }

    /// A check goes through every rule: behind one reference, a rule copies as one retain
    /// instead of three strings and a counter (about 8% of a check's instructions).
    private let parts: Parts

    private final class Parts: Sendable {
        let name: String
        let typeName: String
        let maximum: Int
        let parentField: String?
        let typeKey: ObjectIdentifier?
        let counter: any LimitCounter
        let parent: (any ParentLookup)?
        let reason: DenialReason

        init(name: String?, typeName: String, maximum: Int, parentField: String?, typeKey: ObjectIdentifier?,
             counter: any LimitCounter, parent: (any ParentLookup)?, reason: DenialReason?) {
            self.name = name ?? parentField.map { "\(typeName) per \(parent?.typeName ?? $0)" } ?? typeName
            self.reason = reason ?? (parentField == nil ? .homeLimitReached : .itemLimitReached)
            self.typeName = typeName
            self.maximum = maximum
            self.parentField = parentField
            self.typeKey = typeKey
            self.counter = counter
            self.parent = parent
        }
    }

    private init(name: String? = nil, typeName: String, maximum: Int, parentField: String?, typeKey: ObjectIdentifier?,
                 counter: any LimitCounter, parent: (any ParentLookup)? = nil, reason: DenialReason? = nil) {
        parts = Parts(name: name, typeName: typeName, maximum: maximum, parentField: parentField, typeKey: typeKey,
                      counter: counter, parent: parent, reason: reason)
    }

    /// This rule with its parts changed (the name and the reason kept unless given).
    private func with(name: String? = nil, counter: any LimitCounter, parent: (any ParentLookup)?, reason: DenialReason? = nil) -> LimitRule {
        LimitRule(name: name ?? self.name, typeName: typeName, maximum: maximum, parentField: parentField, typeKey: typeKey,
                  counter: counter, parent: parent, reason: reason ?? self.reason)
    }

    /// At most `maximum` records of `type` in the store.
    public static func maxRecords<R: Record>(_ type: R.Type, _ maximum: Int) -> LimitRule {
        LimitRule(typeName: R.recordType, maximum: maximum, parentField: nil, typeKey: ObjectIdentifier(type),
                  counter: TypedLimitCounter<R>(parent: nil))
    }

    /// At most `maximum` records of `type` per value of `parent` (which must be indexed),
    /// whatever that value names. Prefer ``maxRecords(_:_:per:of:)``, which also refuses a
    /// creation in a parent that does not exist.
    public static func maxRecords<R: Record>(_ type: R.Type, _ maximum: Int, per parent: KeyPath<R, RecordID>) -> LimitRule {
        let counter = TypedLimitCounter<R>(parent: UncheckedKeyPath(keyPath: parent))
        return LimitRule(typeName: R.recordType, maximum: maximum, parentField: counter.fieldName,
                         typeKey: ObjectIdentifier(type), counter: counter)
    }

    /// At most `maximum` records of `type` per parent record of `parentType`, which `parent`
    /// (an indexed field) holds the id of. A creation must name an existing parent.
    public static func maxRecords<R: Record, P: Record>(_ type: R.Type, _ maximum: Int, per parent: KeyPath<R, RecordID>,
                                                        of parentType: P.Type) -> LimitRule {
        let rule = maxRecords(type, maximum, per: parent)
        return LimitRule(typeName: rule.typeName, maximum: maximum, parentField: rule.parentField, typeKey: rule.typeKey,
                         counter: rule.counter, parent: TypedParentLookup<P>())
    }

    /// The same limits by stored names, for schema-driven code (the CLI). `parentField`
    /// holds the parent's record id (a uuid field), as the key path of a typed limit does;
    /// ``FeatureGate/open(_:configuration:)`` refuses a field of another kind. With
    /// `parentType`, a creation must name an existing record of that type.
    public static func maxRecords(typeNamed name: String, _ maximum: Int, perField parentField: String? = nil,
                                  parentType: String? = nil) -> LimitRule {
        LimitRule(typeName: name, maximum: maximum, parentField: parentField, typeKey: nil,
                  counter: NamedLimitCounter(type: name, field: parentField),
                  parent: parentField == nil ? nil : parentType.map(NamedParentLookup.init))
    }

    /// This limit under another name (what denials and the paywall call it).
    public func named(_ name: String) -> LimitRule {
        with(name: name, counter: counter, parent: parent)
    }

    @available(*, unavailable, message: "a limit's reason depends on the other limits: see GateDecision.denial and GateDecision.limit")
    public var denial: DenialReason { reason }

    /// The denial when this limit is reached, or passed, by the created record: see
    /// ``DenialReason``; set for every rule when a gate opens (``reasons(of:)``).
    var reason: DenialReason { parts.reason }

    /// `rules` with the reason each reports: ``DenialReason/itemLimitReached`` for a
    /// per-parent limit; for a limit in all, ``DenialReason/homeLimitReached`` when it limits
    /// the parent type of a per-parent limit (the home limit), or when no per-parent limit
    /// names its parent's type (which limit is the home's is then unknown: every one in all
    /// is taken for it, as before limits had names), otherwise ``DenialReason/limitReached(_:)``.
    static func reasons(of rules: [LimitRule]) -> [LimitRule] {
        let parentTypes = Set(rules.compactMap(\.parentTypeName))
        return rules.map { rule in
            guard rule.parentField == nil else { return rule.with(counter: rule.counter, parent: rule.parent, reason: .itemLimitReached) }
            let isHome = parentTypes.isEmpty || parentTypes.contains(rule.typeName)
            return rule.with(counter: rule.counter, parent: rule.parent, reason: isHome ? .homeLimitReached : .limitReached(rule.name))
        }
    }

    func resolved(in store: Store) throws -> LimitRule {
        with(counter: try counter.resolved(in: store), parent: try parent?.resolved(in: store, for: self))
    }

    /// This rule (resolved in `store`), its counts kept by `store` for its own commits.
    func keepingRecentCounts(in store: Store) -> LimitRule {
        with(counter: counter.keepingRecentCounts(in: store), parent: parent)
    }

    /// Whether `action` creates a record of this limit's type: by Swift type when both give
    /// one, otherwise by stored name (a limit by name and a typed creation, or the reverse).
    func matches(_ action: GateAction) -> Bool {
        if let key = action.typeKey, let typeKey { return key == typeKey }
        return action.createdTypeName == typeName
    }
}

/// How full one limit is, as a denial reports it: ``GateDecision/limit``.
public struct LimitUsage: Sendable, Hashable, CustomStringConvertible {
    /// The limit's ``LimitRule/name``.
    public let name: String
    /// The records the free tier may hold (in all, or in ``parent``).
    public let maximum: Int
    /// The records there are now (in all, or in ``parent``).
    public let count: Int
    /// For a per-parent limit: the parent counted (nil when only the total is known).
    public let parent: RecordID?

    public init(name: String, maximum: Int, count: Int, parent: RecordID?) {
        self.name = name
        self.maximum = maximum
        self.count = count
        self.parent = parent
    }

    /// `rule`'s usage: `count` records (in `parent`).
    init(_ rule: LimitRule, _ count: Int, in parent: RecordID? = nil) {
        self.init(name: rule.name, maximum: rule.maximum, count: count, parent: parent)
    }

    public var description: String {
        "\(name): \(count) of \(maximum)" + (parent.map { " in \($0)" } ?? "")
    }
}

/// Whether the parent a creation names exists, for a per-parent limit given its parent's type.
protocol ParentLookup: Sendable {
    /// The parent's stored type name.
    var typeName: String { get }
    func resolved(in store: Store, for rule: LimitRule) throws -> any ParentLookup
    func exists<S: StoreReading>(_ reading: S, _ id: RecordID) throws -> Bool
}

struct TypedParentLookup<P: Record>: ParentLookup {
    var handle: TypeHandle<P>?
    var typeName: String { P.recordType }

    func resolved(in store: Store, for rule: LimitRule) throws -> any ParentLookup {
        do { return TypedParentLookup(handle: try store.typeHandle(P.self)) }
        catch let error as StoreError {
            throw GateError(.invalidConfiguration, "gate limit '\(rule.name)': its parent type: \(error.message)", underlying: error)
        }
    }

    /// One B-tree lookup, no allocation.
    func exists<S: StoreReading>(_ reading: S, _ id: RecordID) throws -> Bool {
        try reading.contains(handle!, id: id)
    }
}

struct NamedParentLookup: ParentLookup {
    let typeName: String

    func resolved(in store: Store, for rule: LimitRule) throws -> any ParentLookup {
        guard store.schema.type(named: typeName) != nil else {
            throw GateError(.invalidConfiguration, "gate limit '\(rule.name)': store \(store.path) has no parent type '\(typeName)'")
        }
        return self
    }

    func exists<S: StoreReading>(_ reading: S, _ id: RecordID) throws -> Bool {
        try reading.get(typeNamed: typeName, id: id) != nil
    }
}

/// Counts for one limit in any transaction. Implementations are resolved once at open so
/// that counting allocates nothing.
protocol LimitCounter: Sendable {
    func resolved(in store: Store) throws -> any LimitCounter
    /// Records of the type.
    func total<S: StoreReading>(_ reading: S) throws -> Int
    /// Records of the type with this parent.
    func count<S: StoreReading>(_ reading: S, parent: RecordID) throws -> Int
    /// Whether some parent holds more than `maximum` records, and which parents do when the
    /// counter can name them. `base` is that answer at an earlier history sequence: a counter
    /// that can brings it up to date from the changes since, instead of walking every parent.
    func groupsOver<S: StoreReading>(_ maximum: Int, _ reading: S, since base: GroupsOver.Base?) throws -> GroupsOver
    /// This counter, resolved in `store`, once it asked the store to keep the counts its own
    /// commits leave for the limit (see ``bringUpToDate(_:in:from:to:maximum:)``).
    func keepingRecentCounts(in store: Store) -> any LimitCounter
    /// The counts `counted` (taken at history sequence `from`) at sequence `to`, from what the
    /// store kept of its own commits in between; nil when it cannot tell (count then).
    func bringUpToDate(_ counted: FeatureGate.RuleCounts, in store: Store, from: UInt64, to: UInt64, maximum: Int) -> FeatureGate.RuleCounts?
}

/// The parents over a per-parent limit.
struct GroupsOver: Sendable {
    /// The parents named at one point of the changes (a history sequence, or a point in a
    /// write transaction).
    typealias Base = (cursor: ChangeCursor, parents: [RecordID])
    /// Some parent holds more than the maximum.
    var any: Bool
    /// All such parents, exactly (nil: the counter cannot name them, or did not).
    var parents: [RecordID]?
    /// Found by walking every parent (rather than from an earlier answer and the changes since).
    var walked: Bool

    init(parents: [RecordID], walked: Bool = false) {
        any = !parents.isEmpty
        self.parents = parents
        self.walked = walked
    }

    init(walkedAny any: Bool) {
        self.any = any
        parents = nil
        walked = true
    }
}

/// Key paths are immutable; the wrapper lets a Sendable rule hold one.
struct UncheckedKeyPath<R: Record>: @unchecked Sendable {
    let keyPath: KeyPath<R, RecordID>
}

struct TypedLimitCounter<R: Record>: LimitCounter {
    /// `index` with its types erased: what every check counts the target parent through.
    /// First, so that its place in the struct is known without the generic type's metadata.
    private(set) var erasedIndex: RecordIDIndex?
    let parent: UncheckedKeyPath<R>?
    var type: TypeHandle<R>?
    var index: IndexHandle<R, RecordID>? {
        didSet { erasedIndex = index?.erased }
    }
    /// What `type` and `index` are kept under in the store's recent counts.
    var recentCounts: RecentCountsKey?

    init(parent: UncheckedKeyPath<R>?) { self.parent = parent }

    var fieldName: String? {
        guard let parent else { return nil }
        // `\Item.homeID` prints as "\Item.homeID": the stored name is what follows the type.
        let text = String(describing: parent.keyPath)
        return text.firstIndex(of: ".").map { String(text[text.index(after: $0)...]) } ?? text
    }

    func resolved(in store: Store) throws -> any LimitCounter {
        var copy = self
        do {
            copy.type = try store.typeHandle(R.self)
            if let parent { copy.index = try store.index(parent.keyPath) }
        } catch let error as StoreError {
            throw GateError(.invalidConfiguration, "gate limit on \(R.recordType): \(error.message)", underlying: error)
        }
        return copy
    }

    func total<S: StoreReading>(_ reading: S) throws -> Int { try reading.count(type!) }

    func count<S: StoreReading>(_ reading: S, parent: RecordID) throws -> Int {
        if let erasedIndex, let count = try reading.count(erasedIndex, equals: parent) { return count }
        guard let index else { return try total(reading) }
        return try reading.count(index, equals: parent)
    }

    /// Changes read from history before walking every parent instead: reading one changed
    /// record and counting its parent costs about what the walk spends on a few dozen parents.
    static var incrementalLimit: Int { 64 }

    /// From `base`: only the parents over the limit then, and the parents the records changed
    /// since are in now, can be over it now (a group grows only by records inserted into it or
    /// moved to it). Otherwise, or after more than ``incrementalLimit`` changes, every parent.
    func groupsOver<S: StoreReading>(_ maximum: Int, _ reading: S, since base: GroupsOver.Base?) throws -> GroupsOver {
        guard let index else { return GroupsOver(walkedAny: try total(reading) > maximum) }
        // The changes since `base` only speed the count up: any of them that cannot be read
        // (a record damaged, or written in a newer format) means walking every parent, which
        // reads the index alone, rather than a denial.
        if let base, let incremental = try? incrementalGroupsOver(maximum, reading, index, since: base) {
            return incremental
        }
        return GroupsOver(parents: try reading.groups(index, largerThan: maximum).map(\.value), walked: true)
    }

    /// ``groupsOver(_:_:since:)`` from `base` and the changes since; nil when they cannot be
    /// followed (purged, or too many).
    private func incrementalGroupsOver<S: StoreReading>(_ maximum: Int, _ reading: S, _ index: IndexHandle<R, RecordID>,
                                                        since base: GroupsOver.Base) throws -> GroupsOver? {
        guard let changed = try reading.changedRecords(in: index, after: base.cursor, limit: Self.incrementalLimit) else { return nil }
        var candidates = base.parents
        for id in changed {
            guard case .uuid(let value)? = try reading.indexedValue(of: index, id: id) else { continue }
            let now = RecordID(value)
            if !candidates.contains(now) { candidates.append(now) }
        }
        return GroupsOver(parents: try candidates.filter { try reading.count(index, equals: $0) > maximum })
    }

    func keepingRecentCounts(in store: Store) -> any LimitCounter {
        var copy = self
        if let type { copy.recentCounts = store.keepRecentCounts(of: type, groupedBy: index) }
        return copy
    }

    /// From the parents over the limit at `from`: the groups changed since leave or join them
    /// by their sizes now; the others kept their sizes (all at most the limit while the total
    /// was within it). No allocation unless the parents over the limit change.
    func bringUpToDate(_ counted: FeatureGate.RuleCounts, in store: Store, from: UInt64, to: UInt64, maximum: Int) -> FeatureGate.RuleCounts? {
        guard let recentCounts, var parents = counted.groups.parents else { return nil }
        var counts = counted
        counts.sequence = to
        let covered = store.recentCounts(recentCounts, from: HistoryToken(sequence: from), to: HistoryToken(sequence: to),
                                         total: &counts.total) { parent, size in
            if size > maximum {
                if !parents.contains(parent) { parents.append(parent) }
            } else if let position = parents.firstIndex(of: parent) {
                parents.remove(at: position)
            }
        }
        guard covered else { return nil }
        // As when counted: no group is larger than the whole type, so within the total's limit none is over.
        counts.groups = GroupsOver(parents: index != nil && counts.total > maximum ? parents : [])
        return counts
    }
}

struct NamedLimitCounter: LimitCounter {
    let type: String
    let field: String?

    func resolved(in store: Store) throws -> any LimitCounter {
        guard let schema = store.schema.type(named: type) else {
            throw GateError(.invalidConfiguration, "gate limit on \(type): store \(store.path) has no type '\(type)' (known: \(store.schema.types.map(\.name).sorted().joined(separator: ", ")))")
        }
        if let field {
            guard let fieldSchema = schema.field(named: field) else {
                throw GateError(.invalidConfiguration, "gate limit on \(type): \(type) has no field '\(field)' (fields: \(schema.fields.map(\.name).sorted().joined(separator: ", ")))")
            }
            // A parent is named by its record id: the check of the parent a creation names
            // compares ids, so on another kind of field it never fired (one record past the
            // limit), while the groups over the limit then denied every creation.
            if let kind = fieldSchema.kind, kind != .uuid {
                throw GateError(.invalidConfiguration, "gate limit on \(type) per '\(field)': '\(field)' is a \(kind.rawValue) field, and a per-parent limit counts by the parent's record id; name a uuid field (such as the parent's id), or limit \(type) in all")
            }
        }
        return self
    }

    func total<S: StoreReading>(_ reading: S) throws -> Int { try reading.count(typeNamed: type) }

    func count<S: StoreReading>(_ reading: S, parent: RecordID) throws -> Int {
        guard let field else { return try total(reading) }
        return try reading.count(typeNamed: type, where: [QueryCondition(field: field, op: .equal, value: .uuid(parent.uuid))])
    }

    /// Walks the index on the parent field, as a typed limit does when it cannot start from
    /// `base` (reading no record: one that cannot be decoded does not deny every creation);
    /// without such an index, every record of the type. Records without a parent belong to no
    /// group, as for a typed limit, and so do values that are not record ids (a field whose
    /// kind was unknown at open), which ``count(_:parent:)`` never counts either.
    func groupsOver<S: StoreReading>(_ maximum: Int, _ reading: S, since base: GroupsOver.Base?) throws -> GroupsOver {
        guard let field else { return GroupsOver(walkedAny: try total(reading) > maximum) }
        if let groups = try reading.groups(typeNamed: type, field: field, largerThan: maximum) {
            return GroupsOver(parents: groups.map(\.value), walked: true)
        }
        var groups: [UUID: Int] = [:]
        try reading.forEachRecord(typeNamed: type) { record in
            if case .uuid(let parent)? = record.fields[field] { groups[parent, default: 0] += 1 }
            return true
        }
        return GroupsOver(parents: groups.filter { $0.value > maximum }.keys.map(RecordID.init).sorted(), walked: true)
    }

    /// Limits by stored names are counted from the store at every new state.
    func keepingRecentCounts(in store: Store) -> any LimitCounter { self }

    func bringUpToDate(_ counted: FeatureGate.RuleCounts, in store: Store, from: UInt64, to: UInt64, maximum: Int) -> FeatureGate.RuleCounts? { nil }
}
