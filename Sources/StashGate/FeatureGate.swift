import Foundation
import Stash
import Synchronization

/// Entitlements, trials, feature tiers and free-tier limits for one user of one store,
/// decided in microseconds and, for writes, inside the write transaction.
///
/// ```swift
/// let store = try Store.open(at: dir, types: [Home.self, Item.self] + FeatureGate.recordTypes)
/// let verifier = try Ed25519SnapshotVerifier(publicKeys: ["k1": serverPublicKey])
/// var config = GateConfiguration(userID: "u1", verifier: verifier)
/// config.limits = [.maxRecords(Home.self, 1).named("homes"), .maxRecords(Item.self, 10, per: \.homeID, of: Home.self)]
/// let gate = try FeatureGate.open(store, configuration: config)   // reads the cached snapshot
///
/// gate.entitlement()                  // pro: subscribed (cached) until …
/// gate.check(.use(.intervalTimer))    // denied: requiresPremium(intervalTimer)
/// try store.write { tx in             // two writers can never both pass the limit
///     try gate.authorize(.create(Item.self, in: homeID), in: tx)
///     try tx.insert(item)
/// }
/// try gate.apply(signedSnapshot)      // fresh from the server: verified, cached, published
/// ```
///
/// The gate reads its state synchronously at open from the store's metadata (`gate.*` keys):
/// the signed snapshot of this user, and its sealed state (``GateState``: the highest time
/// seen, the first launch, per user the highest snapshot applied and the trial start). Nothing
/// needs a network or a service layer, which breaks the "persistence needs premium status,
/// premium status needs persistence" cycle.
///
/// ## Topics
/// - Entitlements: ``entitlement()``, ``apply(_:)``, ``updates()``, ``trialStatus()``
/// - Gates: ``check(_:)``, ``check(_:in:)``, ``authorize(_:in:)``, ``tier(of:)``
/// - Credits: ``credits()``, ``creditBalance()``, ``spendCredit(operationID:in:)``, ``grantCredits(_:grantID:in:)``
/// - Sync: ``syncPolicy``
public final class FeatureGate: Sendable {
    /// The store the gate counts limits in and keeps its state in (snapshot, clock, credits).
    public let store: Store
    /// The configuration it was opened with.
    public let configuration: GateConfiguration
    /// The guarded reference time all decisions use.
    public let clockGuard: ClockGuard
    /// Sync active ⇔ premium ∧ the user's preference, decided once at open (see ``SyncPolicy``).
    public var syncPolicy: SyncPolicy { policyAtOpen.withLock { $0 } }
    private let policyAtOpen = Mutex(SyncPolicy(isPremium: false, preference: false, reason: .default))

    let rules: [LimitRule]
    /// The counts of every rule, in the order of ``rules``, at the newest committed state
    /// each was counted in (see ``CountsCache``).
    let countsCache: Mutex<CountsCache>
    /// Per rule, the parents over its limit as the last check inside a write transaction found
    /// them, at that write's ``ChangeCursor``: the next check in the same write follows only
    /// the changes it made since, so a bulk write that authorizes each insert walks no parent.
    /// A cursor of another write is never used.
    let writeParents: Mutex<[GroupsOver.Base?]>
    /// Set once a per-parent limit had to walk its index in a read snapshot (its type holds
    /// more records than the limit): from then on, checks in read snapshots read the history
    /// sequence first and take the counts of a state already seen from ``countsCache``.
    let readsSequenceFirst = Atomic(false)
    /// Walks of every parent of a per-parent limit so far (for tests: commits should not cause them).
    let parentWalks = Atomic(0)
    /// Counts brought up to a newer state from the store's own commits, reading nothing (for tests).
    let countsFromCommits = Atomic(0)
    /// ``GateConfiguration/offlinePolicy`` in milliseconds.
    let offlineAllowances: PerPeriod
    let trialLength: Int64?
    /// What every check reads: plain values, so reading them neither allocates nor retains.
    let hot: Mutex<HotState>
    /// The snapshot itself, for full evaluations.
    let cache: Mutex<CacheState>
    let snapshotKey: String
    /// 16 bytes naming the configured user in the store (snapshot key, state, trial record).
    let userDigest: [UInt8]
    let creditsEnabled: Bool
    /// The store holds ``UserTrial`` records: the local trial's start follows the user.
    let trialsSync: Bool
    /// The history sequence at which this gate last read the user's trial record.
    let trialCheckedAt = Atomic<UInt64>(0)
    /// A background clock save is under way.
    let backgroundSave = Atomic(false)

    /// Which snapshot (of which user) last settled the stored clock (``settledMarker(_:)``).
    static let clockSettledByKey = "gate.clock.settledBy"

    struct HotState: Sendable {
        var summary = AccessSummary()
        var serverTime = Int64.min
        var origin = EvaluationReason.default
        /// The first launch on this store (ms).
        var firstLaunch = Int64.min
        /// The start of this user's local trial (ms): the earliest of the first launch, the
        /// user's synced trial start and the store's creation.
        var trialStart = Int64.min
    }

    /// The lowest snapshot sequence this gate may take from the store for its user.
    struct Floor: Sendable, Equatable {
        var sequence: UInt64 = 0
        /// The snapshot cached at ``sequence`` is not trusted: only a higher one is.
        var distrusted = false

        init(sequence: UInt64 = 0, distrusted: Bool = false) {
            self.sequence = sequence
            self.distrusted = distrusted
        }

        init(_ user: GateState.User) { self.init(sequence: user.sequence, distrusted: user.distrusted) }

        /// The higher of two floors (at one sequence, distrusted if either is).
        func raised(to other: Floor) -> Floor {
            other.sequence != sequence ? (other.sequence > sequence ? other : self)
                : Floor(sequence: sequence, distrusted: distrusted || other.distrusted)
        }
    }

    /// What decides whether one rule is over its limit.
    struct RuleCounts: Sendable {
        /// The history sequence of the committed state counted (nil: none yet).
        var sequence: UInt64?
        /// Records of the rule's type.
        var total = 0
        /// For a per-parent rule: the parents over its maximum (none while the total is
        /// within it: no group is larger than the whole type).
        var groups = GroupsOver(parents: [])
    }

    /// The counts of each rule at the newest committed state it was counted in.
    ///
    /// Walking a per-parent index for the parents over the limit is O(distinct parents):
    /// 10,000 homes cost a millisecond, and a store needs the answer as soon as it holds more
    /// items than one home may (two full homes). Records change only in write transactions,
    /// and each one that changes a record commits a new history entry (schema changes at
    /// open, such as an index rebuild, change no count; a process opening with types that lack
    /// the parent index keeps it exact, and only `StoreOptions.dropsUndeclaredIndexes` removes
    /// it, after which no count of it holds until every process reopens), so the sequence a
    /// read snapshot sees names its counts exactly: later snapshots of that state read one
    /// metadata value (none for the same committed state) instead of the totals and the
    /// parents. A newer state, or a write transaction (which
    /// also sees its own uncommitted changes), starts from the parents cached for an older
    /// sequence and recounts only those and the parents of the records changed since
    /// (``LimitCounter/groupsOver(_:_:since:)``), so the walk runs once, not once per commit.
    /// When every commit since was the gate's store's own (the app's writes), a newer state
    /// reads nothing at all: the store kept the totals and the sizes of the groups each of
    /// those commits changed (``LimitCounter/bringUpToDate(_:in:from:to:maximum:)``); a commit
    /// of another process in between sends the check back to history.
    /// Only read snapshots fill the cache: a write transaction's changes have no sequence yet
    /// (and an earlier writer of its group commit may still fail), so a write starts from the
    /// latest committed state, which it counts in a read snapshot first (``committedParents``),
    /// and its later checks start from its own previous answer (``writeParents``).
    typealias CountsCache = [RuleCounts]

    struct CacheState: Sendable {
        /// The last valid snapshot (nil: none yet, or the cached one was rejected).
        var snapshot: EntitlementSnapshot?
        /// Why the snapshot last read from the store was refused.
        var rejection: GateError?
        /// The bytes last read from or written to the store, to notice changes by other processes.
        var storedBytes: [UInt8]?
        /// Bumped at every change of snapshot, for ``updates()``.
        var generation = 0
        /// What the gate's state says of the snapshots this user may have.
        var floor = Floor()
    }

    /// The record types gating keeps in the store (credit accounts, spent operations, users'
    /// trial starts); add them to `Store.open(types:)` to use credits, and for a local trial
    /// that follows the user across devices.
    public static let recordTypes: [any Record.Type] = [CreditAccount.self, CreditOperation.self, UserTrial.self]

    // MARK: Opening

    /// Opens the gate on `store`: verifies the cached snapshot of the configured user, reads
    /// and advances the highest time seen, records the first launch if this is it, and this
    /// user's trial start (a synced ``UserTrial`` record, with ``recordTypes``).
    ///
    /// A gate state that is missing (where a gate ran before) or changed outside the gate is
    /// rebuilt failing closed: the cached snapshots are not trusted until a newer one is
    /// applied (reason `.error`, ``GateError/Code/untrustedState``), and the trial counts from
    /// the store's creation at the latest.
    ///
    /// Never fails because of a bad cached snapshot (the gate then starts free, with reason
    /// `.error`). - Throws: ``GateError`` `.invalidConfiguration` when a limit names a type or
    /// index the store lacks; `.storage` when the store cannot be written.
    public static func open(_ store: Store, configuration: GateConfiguration) throws -> FeatureGate {
        try FeatureGate(store: store, configuration: configuration)
    }

    private init(store: Store, configuration: GateConfiguration) throws {
        self.store = store
        self.configuration = configuration
        var names: Set<String> = []
        for rule in configuration.limits where !names.insert(rule.name).inserted {
            throw GateError(.invalidConfiguration, "gate: two limits are named '\(rule.name)' (store \(store.path)); name each with .named(_:), so that a denial says which one was hit")
        }
        rules = try LimitRule.reasons(of: configuration.limits).map { try $0.resolved(in: store).keepingRecentCounts(in: store) }
        countsCache = Mutex(CountsCache(repeating: RuleCounts(), count: rules.count))
        writeParents = Mutex([GroupsOver.Base?](repeating: nil, count: rules.count))
        clockGuard = ClockGuard(wall: configuration.clock ?? store.clock)
        offlineAllowances = PerPeriod(configuration.offlinePolicy)
        trialLength = configuration.trialLength.map { milliseconds(seconds: $0) }
        userDigest = digest16("stash.gate.user", configuration.userID)
        snapshotKey = GateState.snapshotPrefix + hex(userDigest)
        creditsEnabled = store.schema.type(named: CreditAccount.recordType) != nil
            && store.schema.type(named: CreditOperation.recordType) != nil
        trialsSync = store.schema.type(named: UserTrial.recordType) != nil
        hot = Mutex(HotState())
        cache = Mutex(CacheState())
        let opened: Opened
        do {
            opened = try store.write { tx in try openState(in: tx) }
        } catch let error as StoreError {
            throw GateError(.storage, "gate: cannot open on store \(store.path): \(error.message)", underlying: error)
        }
        hot.withLock {
            $0.firstLaunch = opened.firstLaunch
            $0.trialStart = opened.trialStart
        }
        cache.withLock { $0.floor = opened.floor }
        load(opened.bytes, origin: .cached, keepValidOnFailure: false)
        let access = access(at: clockGuard.referenceMilliseconds)
        let policy = SyncPolicy(isPremium: access.isPremium, preference: store.syncPreferenceAtOpen, reason: access.reason)
        policyAtOpen.withLock { $0 = policy }
    }

    /// What the open transaction read.
    private struct Opened {
        var bytes: [UInt8]?
        var firstLaunch: Int64
        var trialStart: Int64
        var floor: Floor
    }

    /// Reads the gate's state (a new one on a fresh store; a rebuilt one, failing closed, when
    /// it is missing or broken on a store a gate ran on), advances the clock, records the
    /// first launch and this user's trial start, and writes it back.
    private func openState(in tx: StoreTransaction) throws -> Opened {
        var state: GateState
        var fresh = false
        if case .absent = try GateState.read(in: tx), try !GateState.hasTraces(in: tx) {
            state = GateState(clock: .min, firstLaunch: .min, users: [])
            fresh = true
        } else {
            state = try GateState.current(in: tx).state
        }
        clockGuard.load(state.clock)
        let now = clockGuard.referenceMilliseconds
        if fresh { state.firstLaunch = now }
        clockGuard.save(into: &state, in: tx)
        var user = state.user(userDigest)
        let start = min(state.firstLaunch, user.trialStart, GateState.storeCreation(store) ?? .max)
        if let synced = try userTrialStart(in: tx, creatingWith: start) { user.trialStart = min(user.trialStart, synced) }
        state.set(user)
        try state.write(in: tx)
        return Opened(bytes: try tx.metadata(for: snapshotKey), firstLaunch: state.firstLaunch,
                      trialStart: min(start, user.trialStart), floor: Floor(user))
    }

    // MARK: Snapshots

    /// Verifies a signed envelope: signature, key, payload and user.
    func validate(_ bytes: [UInt8]) -> Result<EntitlementSnapshot, GateError> {
        do {
            let signed = try SignedEntitlementSnapshot(decoding: bytes)
            return .success(try validate(signed))
        } catch let error as GateError {
            return .failure(error)
        } catch {
            return .failure(GateError(.malformedSnapshot, "\(error)"))
        }
    }

    private func validate(_ signed: SignedEntitlementSnapshot) throws -> EntitlementSnapshot {
        switch configuration.verifier.check(payload: signed.payload, signature: signed.signature, keyID: signed.keyID) {
        case .unknownKey:
            throw GateError(.unknownKey, "entitlement snapshot signed with unknown key '\(signed.keyID)'")
        case .invalid:
            throw GateError(.badSignature, "entitlement snapshot signature does not match its payload (key '\(signed.keyID)')")
        case .valid:
            break
        }
        let snapshot = try EntitlementSnapshot(decoding: signed.payload)
        guard snapshot.userID == configuration.userID else {
            throw GateError(.wrongUser, "entitlement snapshot is for user '\(snapshot.userID)', this gate is for '\(configuration.userID)'")
        }
        return snapshot
    }

    /// Why `snapshot`, found cached in the store, may not be taken for this user (nil: it may):
    /// older than a snapshot the store applied (a copy put back), or the one cached when the
    /// gate's state went missing (``GateState/rebuilt(in:)``).
    func refusal(of snapshot: EntitlementSnapshot, below floor: Floor) -> GateError? {
        if snapshot.sequence < floor.sequence {
            return GateError(.replayedSnapshot, "entitlement snapshot #\(snapshot.sequence) is older than #\(floor.sequence), which store \(store.path) applied before (an older snapshot put back); apply a fresh snapshot")
        }
        if snapshot.sequence == floor.sequence && floor.distrusted {
            return GateError(.untrustedState, "entitlement snapshot #\(snapshot.sequence) is not trusted: the gate's state in store \(store.path) was removed or changed outside the gate while it was cached; premium waits for a newer snapshot")
        }
        return nil
    }

    /// Takes the snapshot read from the store (`bytes`) as the current one if it is valid and
    /// not older than the one in memory.
    private func load(_ bytes: [UInt8]?, origin: EvaluationReason, keepValidOnFailure: Bool) {
        guard let bytes else {
            cache.withLock { $0.storedBytes = nil }
            return
        }
        var checked = validate(bytes)
        if case .success(let snapshot) = checked, let refusal = refusal(of: snapshot, below: cache.withLock({ $0.floor })) {
            checked = .failure(refusal)
        }
        switch checked {
        case .success(let snapshot):
            let current = cache.withLock { $0.snapshot }
            if let current, snapshot.sequence < current.sequence {
                cache.withLock { $0.storedBytes = bytes }
                return
            }
            install(snapshot, storedBytes: bytes, origin: current == snapshot ? hot.withLock { $0.origin } : origin)
        case .failure(let error):
            cache.withLock { state in
                state.storedBytes = bytes
                state.rejection = error
                if !keepValidOnFailure { state.snapshot = nil; state.generation += 1 }
            }
            if !keepValidOnFailure {
                hot.withLock { state in
                    state.summary = AccessSummary()
                    state.serverTime = Int64.min
                    state.origin = .error
                }
            }
        }
    }

    private func install(_ snapshot: EntitlementSnapshot, storedBytes: [UInt8], origin: EvaluationReason) {
        let serverTime = milliseconds(snapshot.serverTime)
        clockGuard.observe(serverTime)
        let summary = AccessSummary(configuration.premiumEntitlement, snapshot.transactions)
        // Monotone, and both states from one snapshot: two installs racing (an apply and the
        // update poller, two applies) left the older snapshot in force, or the cached and the
        // hot state from different snapshots. The hot lock is taken inside the cache lock
        // here only, and nowhere the other way round.
        cache.withLock { state in
            if let current = state.snapshot, current.sequence > snapshot.sequence { return }
            if state.snapshot != snapshot { state.generation += 1 }
            state.snapshot = snapshot
            state.floor = state.floor.raised(to: Floor(sequence: snapshot.sequence))
            state.rejection = nil
            state.storedBytes = storedBytes
            hot.withLock { state in
                state.summary = summary
                state.serverTime = serverTime
                state.origin = origin
            }
        }
    }

    /// Verifies a signed snapshot from the store of record and makes it current: cached in
    /// the store (one write transaction), published to ``updates()``, consumable purchases
    /// credited once.
    ///
    /// A rejected snapshot changes nothing: the last valid one stays in force.
    /// - Throws: ``GateError`` `.badSignature` (any changed byte), `.unknownKey`,
    ///   `.malformedSnapshot`, `.wrongUser`, `.replayedSnapshot` (a lower sequence number than
    ///   the cached one, or the same number with other contents), `.storage`.
    @discardableResult
    public func apply(_ signed: SignedEntitlementSnapshot) throws -> EntitlementDecision {
        try apply(signedBytes: signed.encoded())
    }

    /// ``apply(_:)`` for a JSON envelope as received.
    @discardableResult
    public func apply(signedBytes bytes: [UInt8]) throws -> EntitlementDecision {
        let snapshot: EntitlementSnapshot
        switch validate(bytes) {
        case .success(let valid): snapshot = valid
        case .failure(let error): throw error
        }
        let inMemory = cache.withLock { $0.snapshot }
        let key = snapshotKey
        var loweredFirstLaunch: Int64?
        var floor = Floor()
        do {
            try store.write(author: "gate") { tx in
                loweredFirstLaunch = nil
                var state = try GateState.current(in: tx).state
                var user = state.user(userDigest)
                if let refusal = refusal(of: snapshot, below: Floor(user)) { throw refusal }
                var newest = inMemory
                if let stored = try tx.metadata(for: key), case .success(let cached) = validate(stored),
                   refusal(of: cached, below: Floor(user)) == nil, cached.sequence > newest?.sequence ?? 0 || newest == nil {
                    newest = cached
                }
                if let newest {
                    if snapshot.sequence < newest.sequence {
                        throw GateError(.replayedSnapshot, "entitlement snapshot \(snapshot.sequence) is older than the cached \(newest.sequence); keeping the cached one")
                    }
                    if snapshot.sequence == newest.sequence && snapshot != newest {
                        throw GateError(.replayedSnapshot, "entitlement snapshot \(snapshot.sequence) differs from the cached one with the same sequence number; keeping the cached one")
                    }
                }
                try tx.setMetadata(bytes, for: key)
                if let newest, snapshot.sequence > newest.sequence {
                    // A newer answer of the server: its time is the authority a clock once set
                    // ahead yields to (the first snapshot is only observed: nothing vouches
                    // that it is not an old one replayed).
                    let settled = milliseconds(snapshot.serverTime)
                    clockGuard.settle(at: settled, into: &state)
                    try tx.setMetadata(settledMarker(snapshot.sequence), for: Self.clockSettledByKey)
                    // A first launch recorded past the server's time (a clock set ahead at
                    // install) would hold a local trial open until real time got there.
                    if state.firstLaunch > settled {
                        state.firstLaunch = settled
                        loweredFirstLaunch = settled
                    }
                } else {
                    clockGuard.observe(milliseconds(snapshot.serverTime))
                    clockGuard.save(into: &state, in: tx)
                }
                user.sequence = max(user.sequence, snapshot.sequence)
                user.distrusted = false
                state.set(user)
                try state.write(in: tx)
                floor = Floor(user)
                if creditsEnabled {
                    // Credit bookkeeping never vetoes the entitlement: with the account deleted
                    // (it cannot be made again), a snapshot holding any pack was refused, a new
                    // subscription included. Spends and grants still say what is wrong.
                    do { try creditPurchases(snapshot, in: tx) } catch let error as GateError where error.code == .storage {}
                }
            }
        } catch let error as StoreError {
            throw GateError(.storage, "gate: cannot cache the snapshot in store \(store.path): \(error.message)", underlying: error)
        }
        cache.withLock { $0.floor = $0.floor.raised(to: floor) }
        install(snapshot, storedBytes: bytes, origin: .verified)
        if let loweredFirstLaunch { lowerFirstLaunch(to: loweredFirstLaunch) }
        return entitlement()
    }

    /// Picks up a snapshot another process cached in the store (``updates()`` and
    /// ``authorize(_:in:)`` do this by themselves).
    public func refresh() {
        do { try store.read { try refresh(from: $0) } } catch {}
    }

    func refresh<S: StoreReading>(from reading: S) throws {
        try refreshTrial(from: reading)
        let stored = try reading.metadata(for: snapshotKey)
        if stored == cache.withLock({ $0.storedBytes }) { return }
        let state = try GateState.valid(in: reading)
        if let state { cache.withLock { $0.floor = $0.floor.raised(to: Floor(state.user(userDigest))) } }
        let before = cache.withLock { $0.snapshot?.sequence }
        load(stored, origin: .cached, keepValidOnFailure: true)
        guard let now = cache.withLock({ $0.snapshot?.sequence }), before.map({ now > $0 }) ?? true, let state else { return }
        if try clockSettled(by: now, replacingOne: before != nil, in: reading) {
            clockGuard.adopt(state.clock)
        }
        // It may have brought the first launch down too (never up: the minimum is kept).
        lowerFirstLaunch(to: state.firstLaunch)
    }

    /// The first launch, and the trial that starts at it, brought down to `instant` (ms).
    func lowerFirstLaunch(to instant: Int64) {
        hot.withLock {
            $0.firstLaunch = min($0.firstLaunch, instant)
            $0.trialStart = min($0.trialStart, instant)
        }
    }

    /// Whether the stored clock was settled by snapshot `sequence`, newer than the one in force
    /// (`replacingOne`) or than none. Another process that applied it settled the clock with
    /// it: every apply newer than a snapshot in force settles; from none, the snapshot may be
    /// the first ever, which settles nothing (it vouches for no time): the marker tells.
    private func clockSettled<S: StoreReading>(by sequence: UInt64, replacingOne: Bool, in reading: S) throws -> Bool {
        try replacingOne || reading.metadata(for: Self.clockSettledByKey) == settledMarker(sequence)
    }

    /// The value of ``clockSettledByKey`` once snapshot `sequence` of this gate's user
    /// settled the clock.
    private func settledMarker(_ sequence: UInt64) -> [UInt8] {
        Array(snapshotKey.utf8) + encodeInt64(Int64(bitPattern: sequence))
    }

    /// The current snapshot (nil when there is none or the cached one was rejected).
    public var snapshot: EntitlementSnapshot? { cache.withLock { $0.snapshot } }

    // MARK: Entitlement

    /// The premium entitlement at the guarded reference time, with the reason. Never throws.
    public func entitlement() -> EntitlementDecision {
        let reference = clockGuard.referenceMilliseconds
        saveClockInBackgroundIfMoved()
        return entitlement(at: reference)
    }

    func entitlement(at reference: Int64) -> EntitlementDecision {
        let name = configuration.premiumEntitlement
        let referenceTime = dateFromMilliseconds(reference)
        if let override = configuration.override {
            let status = EntitlementStatus(name, override == .forcePro ? .lifetime : .none)
            return EntitlementDecision(status: status, reason: .overridden, referenceTime: referenceTime,
                                       snapshotSequence: nil, snapshotServerTime: nil, error: nil)
        }
        let (snapshot, rejection) = cache.withLock { ($0.snapshot, $0.rejection) }
        let origin = hot.withLock { $0.origin }
        guard let snapshot else {
            return EntitlementDecision(status: EntitlementStatus(name, .none), reason: rejection == nil ? .default : .error,
                                       referenceTime: referenceTime, snapshotSequence: nil, snapshotServerTime: nil,
                                       error: rejection?.message)
        }
        var status = Entitlements.status(of: name, in: snapshot.transactions, atMilliseconds: reference)
        var reason = origin
        if status.isActive && status.state != .lifetime {
            // Only grants within their period's offline allowance count (see OfflinePolicy).
            let age = millisecondsBetween(reference, milliseconds(snapshot.serverTime))
            let fresh = snapshot.transactions.filter { $0.type != .autoRenewable || age <= offlineAllowances[$0.period] }
            let inForce = Entitlements.status(of: name, in: fresh, atMilliseconds: reference)
            if inForce.isActive {
                status = inForce
            } else {
                status = EntitlementStatus(name, .stale, expiresAt: status.expiresAt.map(milliseconds),
                                           transaction: snapshot.transactions.first { $0.id == status.transactionID })
                reason = .stale
            }
        }
        return EntitlementDecision(status: status, reason: reason, referenceTime: referenceTime,
                                   snapshotSequence: snapshot.sequence, snapshotServerTime: snapshot.serverTime,
                                   error: rejection?.message)
    }

    /// The premium access at `reference`: the entitlement (with the offline-age rule), the
    /// local trial and the override, from `state` (this gate's own when nil). No allocation.
    func access(at reference: Int64, state: HotState? = nil) -> Access {
        switch configuration.override {
        case .forcePro?: return Access(isPremium: true, reason: .overridden, trialEnded: false)
        case .forceFree?: return Access(isPremium: false, reason: .overridden, trialEnded: false)
        case nil: break
        }
        let state = state ?? hot.withLock { $0 }
        var access = Access(isPremium: false, reason: state.origin, trialEnded: false)
        if state.summary.lifetime {
            access.isPremium = true
        } else if reference < state.summary.timeLimitedEnd {
            let age = millisecondsBetween(reference, state.serverTime)
            if PerPeriod.anyInForce(ends: state.summary.endsByPeriod, allowances: offlineAllowances, reference: reference, age: age) {
                access.isPremium = true
            } else {
                access.reason = .stale
            }
        }
        var lastTrialEnd = state.summary.trialEnd
        if let trialLength, state.trialStart != Int64.min {
            let localEnd = millisecondsAdding(state.trialStart, trialLength)
            if reference < localEnd { access.isPremium = true }
            lastTrialEnd = max(lastTrialEnd, localEnd)
        }
        // "Trial expired" only when a trial (the store's offer or the local one) was the last
        // grant to end: a subscriber whose paid period lapsed after a trial needs premium.
        if !access.isPremium, lastTrialEnd != Int64.min, reference >= lastTrialEnd, lastTrialEnd >= state.summary.timeLimitedEnd {
            access.trialEnded = true
        }
        return access
    }

    /// The tier in force now.
    public var tier: Tier {
        let reference = clockGuard.referenceMilliseconds
        saveClockInBackgroundIfMoved()
        return access(at: reference).tier
    }

    /// The tier a feature belongs to.
    public func tier(of feature: Feature) -> Tier {
        feature == .paywall || configuration.freeFeatures.contains(feature) ? .free : .premium
    }

    // MARK: Trials

    /// The trial in force or past: the local trial (when configured: from the user's earliest
    /// start on any synced device, never later than this store's first launch) or a
    /// free-trial offer in the snapshot, whichever ends later.
    public func trialStatus() -> TrialStatus {
        let reference = clockGuard.referenceMilliseconds
        saveClockInBackgroundIfMoved()
        let state = hot.withLock { $0 }
        var ends: [(Int64, TrialStatus.Source)] = []
        if let trialLength, state.trialStart != Int64.min { ends.append((millisecondsAdding(state.trialStart, trialLength), .firstLaunch)) }
        if state.summary.trialEnd != Int64.min { ends.append((state.summary.trialEnd, .purchase)) }
        guard let (end, source) = ends.max(by: { $0.0 < $1.0 }) else {
            return TrialStatus(state: .none, endsAt: nil, remaining: 0, source: nil)
        }
        let remaining = max(0, TimeInterval(millisecondsBetween(end, reference)) / 1000)
        return TrialStatus(state: reference < end ? .active : .expired, endsAt: dateFromMilliseconds(end),
                           remaining: reference < end ? remaining : 0, source: source)
    }

    /// The first launch on this store, clock-guarded (the local trial starts here at the
    /// latest; earlier when the user started it on another device).
    public var firstLaunch: Date { dateFromMilliseconds(hot.withLock { $0.firstLaunch }) }

    // MARK: Checks

    /// Decides `action` now. Limit counts are read in one recycled read transaction
    /// (O(1) index counts); feature and view checks touch no storage. Never throws: counts
    /// that cannot be read deny with ``DenialReason/checkFailed`` and the cause in
    /// ``GateDecision/error``.
    ///
    /// For a creation that must not race other writers, use ``authorize(_:in:)`` inside the
    /// write transaction instead.
    public func check(_ action: GateAction) -> GateDecision {
        let access = access(at: clockGuard.referenceMilliseconds)
        saveClockInBackgroundIfMoved()
        if let decision = decideWithoutCounts(action, access) { return decision }
        do {
            return try store.read { snapshot in try decideCreation(action, access, snapshot) }
        } catch {
            return .checkFailed(countingFailed(action, store, error))
        }
    }

    /// Decides `action` with the counts `reading` sees (a snapshot or a write transaction).
    /// A reading of another store than the gate's is counted afresh, through that store's
    /// types and indexes (looked up at each such check): the counts and handles the gate
    /// keeps are its own store's, and another store may have given its types other tags.
    /// Never throws, as ``check(_:)``.
    public func check<S: StoreReading>(_ action: GateAction, in reading: S) -> GateDecision {
        do {
            return try decide(action, in: reading)
        } catch {
            return .checkFailed(countingFailed(action, reading.store, error))
        }
    }

    /// Checks `action` inside the write transaction that performs it, so the counts are the
    /// ones this transaction commits to: two writers (threads or processes) can never both
    /// pass a limit, because LMDB runs one write transaction at a time and the second one
    /// sees the first one's record.
    ///
    /// Also picks up a snapshot cached by another process: the decision follows it at once,
    /// and this gate keeps it once the transaction commits (not before: a write that rolls
    /// back may have been the one that cached it). Saves the highest time seen.
    /// - Throws: ``GateError`` (the transaction rolls back): `.denied` with the
    ///   ``GateError/decision``; `.storage` when the limit counts could not be read, with the
    ///   cause in ``GateError/underlying`` (a storage fault, or a record that cannot be
    ///   decoded, which the message names), not a denial to show a paywall for;
    ///   `.invalidConfiguration` for a transaction of another store that lacks a limited type.
    @discardableResult
    public func authorize(_ action: GateAction, in tx: StoreTransaction) throws -> GateDecision {
        let seen = try? uncommittedState(in: tx)
        _ = clockGuard.referenceMilliseconds
        // A clock another process settled with the snapshot seen is taken up after the
        // commit: saving this gate's higher one now would raise it again in the store.
        if seen?.reference == nil { try? saveState(in: tx, threshold: 1000) }
        let decision: GateDecision
        do {
            decision = try decide(action, in: tx, state: seen?.state, reference: seen?.reference)
        } catch {
            throw countingFailed(action, tx.store, error)
        }
        guard decision.isAllowed else {
            throw GateError(.denied, "gate: \(describe(action)) denied: \(decision.denial!)" + (decision.limit.map { " (\($0))" } ?? "")
                            + " (tier \(decision.tier.rawValue): \(decision.reason.summary))", decision: decision)
        }
        return decision
    }

    /// What a transaction sees of the entitlement that this gate does not hold yet.
    private struct UncommittedEntitlement {
        var state: HotState
        /// The reference time with the clock the snapshot's apply settled (nil: this gate's).
        var reference: Int64?
    }

    /// The entitlement state of a snapshot that `tx` sees and this gate does not hold: one
    /// another process cached, or one an ``apply(_:)`` earlier in the same group commit wrote,
    /// which is not committed yet and may never be. `tx` decides by it, and by the clock and
    /// first launch that apply settled (as ``refresh()`` adopts them); this gate takes them up
    /// (``refresh()``) only once `tx` has committed, so that a write that rolls back leaves
    /// no tier in memory that the store does not hold. nil when `tx` sees what this gate holds,
    /// or a snapshot that is not valid or older (the refresh after the commit keeps the
    /// current one then, as ``refresh()`` always does).
    private func uncommittedState(in tx: StoreTransaction) throws -> UncommittedEntitlement? {
        guard let stored = try tx.metadata(for: snapshotKey), stored != cache.withLock({ $0.storedBytes }) else { return nil }
        tx.afterCommit { [self] in refresh() }
        guard case .success(let snapshot) = validate(stored) else { return nil }
        let state = try GateState.valid(in: tx)
        let floor = cache.withLock { $0.floor }.raised(to: state.map { Floor($0.user(userDigest)) } ?? Floor())
        if refusal(of: snapshot, below: floor) != nil { return nil }
        let current = cache.withLock { $0.snapshot }
        if let current, snapshot.sequence <= current.sequence { return nil }
        var seen = UncommittedEntitlement(state: hot.withLock { $0 }, reference: nil)
        seen.state.summary = AccessSummary(configuration.premiumEntitlement, snapshot.transactions)
        seen.state.serverTime = milliseconds(snapshot.serverTime)
        seen.state.origin = .cached
        if let state {
            seen.state.firstLaunch = min(seen.state.firstLaunch, state.firstLaunch)
            seen.state.trialStart = min(seen.state.trialStart, state.firstLaunch)
        }
        if try clockSettled(by: snapshot.sequence, replacingOne: current != nil, in: tx), let settled = state?.clock {
            seen.reference = max(settled, milliseconds(clockGuard.wall()))
        }
        return seen
    }

    /// ``check(_:in:)``, throwing what stopped the counts; `state` and `reference` in place of
    /// this gate's own entitlement state and reference time (``uncommittedState(in:)``).
    private func decide<S: StoreReading>(_ action: GateAction, in reading: S, state: HotState? = nil,
                                         reference: Int64? = nil) throws -> GateDecision {
        let access = access(at: reference ?? clockGuard.referenceMilliseconds, state: state)
        saveClockInBackgroundIfMoved()
        if let decision = decideWithoutCounts(action, access) { return decision }
        return try decideCreation(action, access, reading)
    }

    /// Why the limits of `action` could not be counted in `store`: a ``GateError`` as it is
    /// (a limited type another store lacks), anything else as `.storage` with the cause.
    private func countingFailed(_ action: GateAction, _ store: Store, _ error: any Error) -> GateError {
        if let error = error as? GateError { return error }
        let cause = (error as? StoreError)?.message ?? "\(error)"
        let named = cause.contains(store.path) ? cause : "store \(store.path): \(cause)"
        return GateError(.storage, "gate: \(describe(action)) refused, not decided: its free-tier limits could not be counted: \(named); check the store (stash verify)",
                         underlying: error)
    }

    private func decideWithoutCounts(_ action: GateAction, _ access: Access) -> GateDecision? {
        if access.isPremium { return .allow(access) }
        if configuration.accessModel == .hardGate {
            return action.kind == .use && action.feature == .paywall ? .allow(access) : .deny(.hardGate, access)
        }
        switch action.kind {
        case .view, .edit, .delete:
            return .allow(access)
        case .use:
            guard let feature = action.feature, tier(of: feature) == .premium else { return .allow(access) }
            return .deny(access.trialEnded ? .trialExpired : .requiresPremium(feature), access)
        case .create:
            return rules.isEmpty ? .allow(access) : nil
        }
    }

    /// The downgrade-safe limit rule: over any free limit ⇒ no creation at all; otherwise the
    /// limit of the created type (and parent). Each count is read once; in a read snapshot
    /// of a state already counted, the totals and largest groups come from ``countsCache``.
    ///
    /// - Throws: `.invalidConfiguration` for a creation without the parent a per-parent limit
    ///   of its type counts by: decided without it, the record would go into a full parent.
    private func decideCreation<S: StoreReading>(_ action: GateAction, _ access: Access, _ reading: S) throws -> GateDecision {
        if action.parent == nil, let rule = rules.first(where: { $0.parentField != nil && $0.matches(action) }) {
            throw GateError(.invalidConfiguration, "gate: \(describe(action)) names no parent, but \(rule.typeName) is limited to \(rule.maximum) per \(rule.parentField ?? "parent") on the free tier; pass the parent the record goes into (.create(\(rule.typeName).self, in: parentID), or `stash gate DIR can-create \(rule.typeName) --in ID`)")
        }
        // The caches hold this gate's store's counts, by its history sequence: a reading of
        // another store (whose sequences mean other states) is counted afresh and not kept.
        let ownStore = reading.store === store
        // The rules were resolved against this store: its type and index tags name other
        // types, or nothing, in a store whose schema grew in another order.
        let rules = ownStore ? self.rules : try self.rules.map { try $0.resolved(in: reading.store) }
        let isSnapshot = ownStore && S.self == StoreSnapshot.self
        var sequence = isSnapshot && readsSequenceFirst.load(ordering: .relaxed) ? try reading.historySequence() : nil
        // The created type's own limit in the parent it goes into: the most precise answer,
        // also when that parent holds more than the limit (after a downgrade).
        if let parent = action.parent {
            for rule in rules where rule.parentField != nil && rule.matches(action) {
                let count = try rule.counter.count(reading, parent: parent)
                if count >= rule.maximum { return .deny(rule.reason, access, limit: LimitUsage(rule, count, in: parent)) }
            }
        }
        // Then the created type's own limit in all (reached, or past after a downgrade), and any
        // other limit past its maximum: the downgrade-safe rule, naming the limit.
        var over: LimitUsage?
        var reached: (DenialReason, LimitUsage)?
        for (position, rule) in rules.enumerated() {
            let counts = try counts(position, rule, reading, isSnapshot: isSnapshot, ownStore: ownStore, sequence: &sequence)
            if rule.parentField == nil, counts.total >= rule.maximum {
                // (A usage is made only here: an allowed check copies no name.)
                if counts.total > rule.maximum && rule.matches(action) { return .deny(rule.reason, access, limit: LimitUsage(rule, counts.total)) }
                if counts.total > rule.maximum, over == nil { over = LimitUsage(rule, counts.total) }
                if rule.matches(action) { reached = (rule.reason, LimitUsage(rule, counts.total)) }
            } else if rule.parentField != nil, counts.groups.any, over == nil {
                over = try largestGroup(rule, counts, reading)
            }
        }
        if let over { return .deny(.overLimit, access, limit: over) }
        if let (reason, usage) = reached { return .deny(reason, access, limit: usage) }
        // Allowed by every count: the parent must exist (one lookup; denials need none).
        if let parent = action.parent {
            for rule in rules where rule.parentField != nil && rule.matches(action) {
                if let lookup = rule.parent, try !lookup.exists(reading, parent) {
                    throw GateError(.parentNotFound, "gate: \(describe(action)) refused: store \(reading.store.path) has no \(lookup.typeName) \(parent) (deleted, here or on a synced device, or a wrong id); the limit '\(rule.name)' counts records per existing \(lookup.typeName)")
                }
            }
        }
        return .allow(access)
    }

    /// A parent over `rule`'s limit with its count (on a denial only); the total when the
    /// counter could not name the parents.
    private func largestGroup<S: StoreReading>(_ rule: LimitRule, _ counts: RuleCounts, _ reading: S) throws -> LimitUsage {
        guard let parents = counts.groups.parents, !parents.isEmpty else { return LimitUsage(rule, counts.total) }
        var largest = (parent: parents[0], count: try rule.counter.count(reading, parent: parents[0]))
        for parent in parents.dropFirst() {
            let count = try rule.counter.count(reading, parent: parent)
            if count > largest.count || (count == largest.count && parent < largest.parent) { largest = (parent, count) }
        }
        return LimitUsage(rule, largest.count, in: largest.parent)
    }

    /// The counts of `rule` (at `position` in ``rules``) in `reading`: from ``countsCache``
    /// when a read snapshot's `sequence` names a state already counted; otherwise counted,
    /// the parents over the limit brought up to date from the cached ones, and, in a read
    /// snapshot, kept for its sequence. The first time parents are needed in a snapshot it
    /// reads the sequence (and turns on ``readsSequenceFirst``) so that they are kept. No
    /// allocation when the counts come from the cache.
    private func counts<S: StoreReading>(_ position: Int, _ rule: LimitRule, _ reading: S, isSnapshot: Bool, ownStore: Bool = true,
                                         sequence: inout UInt64?) throws -> RuleCounts {
        let cached = countsCache.withLock { $0[position] }
        if isSnapshot, let sequence, let at = cached.sequence, at <= sequence {
            if at == sequence { return cached }
            // The store's own commits since (the app's writes) tell what changed, unread.
            if let counts = rule.counter.bringUpToDate(cached, in: store, from: at, to: sequence, maximum: rule.maximum) {
                countsFromCommits.add(1, ordering: .relaxed)
                keep(counts, at: position)
                return counts
            }
        }
        var counts = RuleCounts(sequence: sequence, total: try rule.counter.total(reading))
        if rule.parentField != nil, counts.total > rule.maximum {
            if sequence == nil {
                if isSnapshot { readsSequenceFirst.store(true, ordering: .relaxed) }
                sequence = try reading.historySequence()
                counts.sequence = sequence
            }
            var base = ownStore ? cached.sequence.flatMap { at in cached.groups.parents.map { (cursor(at), $0) } } : nil
            let writeCursor = isSnapshot || !ownStore ? nil : try? reading.changeCursor()
            if let writeCursor {
                if let earlier = writeParents.withLock({ $0[position] }), earlier.cursor.transaction == writeCursor.transaction {
                    base = earlier
                } else if let committed = try? committedParents(position, rule) {
                    // The committed base only speeds the count up: should its read fail (no free
                    // reader slot, say), the parents are walked instead of the write being denied.
                    base = committed
                }
            }
            counts.groups = try rule.counter.groupsOver(rule.maximum, reading, since: base)
            if counts.groups.walked { parentWalks.add(1, ordering: .relaxed) }
            if let writeCursor, let parents = counts.groups.parents {
                writeParents.withLock { $0[position] = (writeCursor, parents) }
            }
        }
        if isSnapshot, sequence != nil { keep(counts, at: position) }
        return counts
    }

    /// Keeps `counts` of the rule at `position`, unless counts of a newer state are kept
    /// (snapshots of different ages race).
    private func keep(_ counts: RuleCounts, at position: Int) {
        countsCache.withLock { cache in
            if let current = cache[position].sequence, let sequence = counts.sequence, current > sequence { return }
            cache[position] = counts
        }
    }

    /// The parents over `rule`'s limit in the latest committed state, with its sequence: the
    /// base a write transaction brings up to date with the history written since (earlier
    /// writers of its group commit) and its own changes. Counted in a read snapshot, from the
    /// cached parents, and kept like any snapshot's counts, so an app that only authorizes
    /// inside writes walks every parent once, not at every write. While this process holds the
    /// write lock no other commit can land, so the snapshot sees the state the write builds on.
    /// nil when the counter cannot name the parents.
    private func committedParents(_ position: Int, _ rule: LimitRule) throws -> GroupsOver.Base? {
        try store.read { snapshot in
            var sequence: UInt64? = try snapshot.historySequence()
            let counts = try counts(position, rule, snapshot, isSnapshot: true, sequence: &sequence)
            return sequence.flatMap { at in counts.groups.parents.map { (cursor(at), $0) } }
        }
    }

    private func cursor(_ sequence: UInt64) -> ChangeCursor { ChangeCursor(HistoryToken(sequence: sequence)) }

    func describe(_ action: GateAction) -> String {
        switch action.kind {
        case .create:
            let name = action.createdTypeName ?? "record"
            return "creating \(name)" + (action.parent.map { " in \($0)" } ?? "")
        case .use: return "using \(action.feature?.name ?? "?")"
        case .view: return "viewing"
        case .edit: return "editing"
        case .delete: return "deleting"
        }
    }
}

/// A trial's state for the UI.
public struct TrialStatus: Sendable, Hashable {
    public enum State: String, Sendable, Hashable { case none, active, expired }
    /// Where the trial comes from.
    public enum Source: String, Sendable, Hashable {
        /// The local trial (``GateConfiguration/trialLength``), counted from the user's first
        /// launch (``FeatureGate/trialStatus()``).
        case firstLaunch
        /// A free-trial offer among the purchases.
        case purchase
    }
    public let state: State
    public let endsAt: Date?
    /// Seconds left (0 unless active).
    public let remaining: TimeInterval
    public let source: Source?
}
