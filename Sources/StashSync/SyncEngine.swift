import Crypto
import Foundation
import Stash

/// How a ``SyncEngine`` runs.
public struct SyncConfiguration: Sendable {
    /// The store family (an account or shared-container id). A store without one adopts it;
    /// a store with another one refuses to sync. Deltas of other families are refused.
    public var family: RecordID?
    /// The shared sync key: deltas are authenticated with HMAC-SHA256 and unauthenticated
    /// ones refused. Every store of the family must use the same key.
    public var key: SyncKey?
    /// Whether sync is active this session — the sync policy's decision at open (for
    /// example premium ∧ preference). Nil: the store's preference at open.
    public var enabled: Bool?
    /// Reports long exports and imports.
    public var progress: (@Sendable (SyncProgress) -> Void)?

    /// A configuration; nothing is checked until ``SyncEngine/init(store:configuration:)``.
    /// Without a key, deltas go unauthenticated, and a store that has a key refuses them.
    public init(family: RecordID? = nil, key: SyncKey? = nil, enabled: Bool? = nil) {
        self.family = family
        self.key = key
        self.enabled = enabled
    }
}

/// Progress of a long export or import.
public struct SyncProgress: Sendable, CustomStringConvertible {
    /// What is under way: `"export"`, `"export snapshot"` or `"import"`.
    public let phase: String
    /// Record states handled so far (reported every 10,000).
    public let done: Int
    /// Record states in all; 0 while not known (a full snapshot being read).
    public let total: Int
    public var description: String { "\(phase): \(done)/\(total)" }
}

/// The shared secret of a store family, for HMAC-SHA256 authentication of deltas.
public struct SyncKey: Sendable, Equatable {
    let bytes: [UInt8]

    /// - Throws: `.unauthenticated` for keys shorter than 16 bytes.
    public init(_ bytes: some Sequence<UInt8>) throws {
        self.bytes = Array(bytes)
        guard self.bytes.count >= 16 else {
            throw SyncError(.unauthenticated, "a sync key needs at least 16 random bytes, got \(self.bytes.count)")
        }
    }

    var symmetricKey: SymmetricKey { SymmetricKey(data: bytes) }

    /// A short name of the key that does not reveal it: 16 hex digits of an HMAC-SHA256 of a
    /// fixed text with the key. Every store of a family shows the same one.
    public var fingerprint: String {
        HMAC<SHA256>.authenticationCode(for: Data("stash sync key fingerprint".utf8), using: symmetricKey)
            .prefix(8).map { String(format: "%02x", $0) }.joined()
    }
}

/// What applying one delta did.
public enum ApplyOutcome: Sendable, Equatable {
    /// Merged; `changed` records were updated here. `uniqueClashes`: the records deleted here
    /// because another record of their type holds the same unique value (see
    /// ``SyncReport/uniqueClashes``).
    case applied(entries: Int, changed: Int, uniqueClashes: [UniqueClash] = [])
    /// Already applied earlier (same or older range): nothing done.
    case duplicate
    /// Needs a newer schema: kept on disk, applied once the schema catches up.
    case parked(reason: String)
}

/// The result of ``SyncEngine/sync(via:)``.
public struct SyncReport: Sendable, CustomStringConvertible {
    /// Record states sent: one per record changed since the peer's watermark (however many
    /// history entries changed it), or every synced record for a full snapshot. Set by
    /// ``SyncEngine/sync(via:)`` only (0 from ``SyncEngine/fetchChanges(via:)``).
    public var sentEntries = 0
    /// Record states in the deltas this fetch applied (not duplicates or parked ones), those of
    /// local-only types included. Relay files of one source fetched together are joined first
    /// where they can be: a record in several of them then counts once.
    public var receivedEntries = 0
    /// Of ``receivedEntries``, the records whose merge changed something here.
    public var changedHere = 0
    /// Deltas that need a newer schema (or wait behind such a delta of their source), kept to
    /// apply later, each as `"name (reason)"`. Their source's later deltas wait behind them.
    public var parked: [String] = []
    /// Records deleted here by this fetch because another record of their type holds the same
    /// value of a unique index (two devices created it independently): tell the user, and
    /// move what pointed at the removed record (children, references) to the kept one.
    ///
    /// A clash is reported where it is settled, by the call during which the settling merge
    /// ran: the merge that finds both records live deletes one of them, and the other stores
    /// receive an ordinary delete (a delta does not say why a record was deleted, and a
    /// delete followed by a new record with the same value must not read as a clash).
    /// - Through a relay, each store merges in its own fetch: every store that holds both
    ///   records when it merges settles and reports the clash here, so two stores may
    ///   report the same clash.
    /// - With ``DirectTransport``, the peer merges what this store sends inside this
    ///   store's ``SyncEngine/sync(via:)``: a clash settled there is in
    ///   ``uniqueClashesAtPeer`` of this report, and in no report of the peer.
    ///
    /// Clashes settled while a parked delta is retried are not reported.
    public var uniqueClashes: [UniqueClash] = []
    /// Records the peer deleted to settle unique-index clashes while merging what this sync
    /// sent, as in ``uniqueClashes`` (the record removed may be this store's: it leaves here
    /// when this store receives the peer's delete). Only a transport whose peer merges during
    /// the send reports them (``DirectTransport``; see
    /// ``SyncTransport/deliverReportingClashes(_:delta:from:)``); empty for a relay, whose
    /// readers report the clashes they settle in their own fetch. Set by
    /// ``SyncEngine/sync(via:)`` only.
    public var uniqueClashesAtPeer: [UniqueClash] = []
    /// Deltas refused (corrupt, unauthenticated, of a newer format, holding versions no
    /// replica accepts...) or that the transport could not read, with why: they stay with the
    /// transport, and their source's later deltas wait behind them. Other sources' deltas are
    /// applied all the same.
    public var refused: [String] = []
    /// The peer had fallen behind purged history and got a full-state snapshot.
    public var sentFullSnapshot = false
    /// The record states of the checkpoint this sync published (``SyncEngine/publishCheckpoint(via:)``),
    /// or nil when none was due.
    public var checkpointEntries: Int?
    /// Blobs (``ExternalData``) this fetch received and kept, each checked against its hash.
    public var blobsReceived = 0
    /// Blobs the store's records reference that it still lacks after this fetch (the transport
    /// does not have them yet): the records read, their blobs are pending, and every fetch
    /// tries again.
    public var blobsPending = 0
    /// Blobs the transport holds that could not be read or did not match their hash (kept
    /// pending, fetched again next time).
    public var blobProblems: [String] = []
    /// The peer needed a reset (it fell behind purged history): same as ``sentFullSnapshot``.
    public var resetRequired: Bool { sentFullSnapshot }

    public var description: String {
        var text = "sent \(sentEntries) record states, received \(receivedEntries) (\(changedHere) changed here)"
        if sentFullSnapshot { text += "; peer was behind purged history: sent a full snapshot (resetRequired)" }
        if let checkpointEntries { text += "; published a checkpoint of \(checkpointEntries) record states" }
        if blobsReceived > 0 || blobsPending > 0 { text += "; blobs: \(blobsReceived) received, \(blobsPending) pending" }
        if !blobProblems.isEmpty { text += "; blob problems: \(blobProblems.joined(separator: "; "))" }
        if !uniqueClashes.isEmpty { text += "; deleted for a unique value another record holds: \(uniqueClashes.map(\.description).joined(separator: "; "))" }
        if !uniqueClashesAtPeer.isEmpty { text += "; the peer deleted for a unique value another record holds: \(uniqueClashesAtPeer.map(\.description).joined(separator: "; "))" }
        if !parked.isEmpty { text += "; parked until the schema catches up: \(parked.joined(separator: ", "))" }
        if !refused.isEmpty { text += "; refused: \(refused.joined(separator: "; "))" }
        return text
    }
}

/// Where sync stands for one peer; never says "synced" while changes are pending.
public struct SyncStatus: Sendable, CustomStringConvertible {
    /// Whether sync is active this session (``SyncEngine/isEnabled``).
    public let enabled: Bool
    /// Changes not yet delivered to the peer: this store's own, and those it received from
    /// elsewhere, except what came from that peer (or, for a relay directory, through it).
    public let pendingOutgoing: Int
    /// The store's clock at the end of the last send or fetch that did not throw: with this
    /// peer for one peer's status (``SyncEngine/status(via:)``, ``SyncEngine/status(peer:)``
    /// with a peer), with any for the store's (``SyncEngine/status(peer:)`` without); nil
    /// before the first.
    public let lastSuccess: Date?
    /// The error of the last send or fetch (with this peer, or with any, as for
    /// ``lastSuccess``; the store's also of the parked deltas retried at open), or the deltas
    /// a fetch refused; nil after a send or fetch that went through cleanly.
    public let lastError: String?
    /// Deltas this store holds parked (they cannot merge with its schema yet), each as
    /// `"name (why)"`: of the peer's site for one peer's status, of every source for the
    /// store's. Their changes have not arrived here.
    public let parkedHere: [String]
    /// Deltas of this store that the peer (or a reader of the relay) holds parked, each with
    /// why, as the peer says at the last sync with it (``SyncTransport/parkedAtPeer(for:)``);
    /// for the store's status, at any peer. Those changes have not arrived there.
    public let parkedAtPeer: [String]
    /// True for a relay's status when the family has no sync key: what the store leaves on the
    /// relay is neither encrypted nor authenticated.
    public var relayUnencrypted = false
    /// Enabled, nothing pending, nothing parked on either side and no error: the only state
    /// in which to show "synced".
    public var isUpToDate: Bool { enabled && pendingOutgoing == 0 && lastError == nil && parkedHere.isEmpty && parkedAtPeer.isEmpty }

    public init(enabled: Bool, pendingOutgoing: Int, lastSuccess: Date?, lastError: String?,
                parkedHere: [String] = [], parkedAtPeer: [String] = []) {
        self.enabled = enabled
        self.pendingOutgoing = pendingOutgoing
        self.lastSuccess = lastSuccess
        self.lastError = lastError
        self.parkedHere = parkedHere
        self.parkedAtPeer = parkedAtPeer
    }

    public var description: String {
        guard enabled else { return "sync off (\(pendingOutgoing) changes kept locally, shipped when sync is turned on)" }
        var parts: [String] = []
        if let lastError { parts.append("error: \(lastError)") }
        if !parkedHere.isEmpty { parts.append("\(parkedHere.count) delta(s) parked here until this schema can merge them: \(parkedHere.joined(separator: "; "))") }
        if !parkedAtPeer.isEmpty { parts.append("\(parkedAtPeer.count) delta(s) of this store parked at the peer: \(parkedAtPeer.joined(separator: "; "))") }
        let unencrypted = relayUnencrypted ? "; relay files unencrypted (the family has no sync key)" : ""
        if parts.isEmpty { return (pendingOutgoing == 0 ? "up to date" : "\(pendingOutgoing) changes pending") + unencrypted }
        return parts.joined(separator: "; ") + "; \(pendingOutgoing) changes pending" + unencrypted
    }
}

/// Replicates a store with its peers: exports deltas from history, imports and merges
/// theirs, and keeps watermarks so every change arrives exactly once in effect.
///
/// ```swift
/// let engine = try SyncEngine(store: store, configuration: SyncConfiguration(family: accountID, key: syncKey))
/// try engine.sync(via: DirectTransport(to: otherEngine))          // two stores on one machine
/// try engine.sync(via: RelayTransport(directory: sharedFolder))     // through a shared folder
/// print(try engine.status())
/// ```
///
/// - Export reads history after the peer's watermark: work proportional to the changes.
/// - Import validates the whole delta first, then merges it and advances the watermark in
///   one write transaction: a crash leaves either all of it or none.
/// - Turning sync off (``SyncConfiguration/enabled`` or the store's preference at open)
///   never moves or hides data: history keeps recording, and the backlog ships later.
public final class SyncEngine: Sendable {
    /// The store this engine syncs.
    public let store: Store
    /// The store's family: the configuration's, or the one the store already had.
    public let family: RecordID
    /// Whether sync is active this session (``SyncConfiguration/enabled``, or the store's
    /// preference at open). When false, sends, fetches and ``apply(_:name:)`` throw `.disabled`.
    public let isEnabled: Bool
    let key: SyncKey?
    /// What the family's key derives for relays (nil for a family without a key: relay files
    /// go unencrypted).
    let familyKeys: FamilyKeys?
    let progress: (@Sendable (SyncProgress) -> Void)?

    /// Whether what this engine leaves on a relay is encrypted (its family has a key).
    public var encryptsRelayFiles: Bool { familyKeys != nil }

    static let familyKey = "sync.family"
    static let lastSuccessKey = "sync.lastSuccess"
    static let lastErrorKey = "sync.lastError"

    /// This store's site id.
    public var site: RecordID { store.siteID }

    /// The family a store belongs to, if it has one.
    public static func family(of store: Store) throws -> RecordID? {
        try store.metadata(for: familyKey).flatMap { RecordID(bytes: $0[...]) }
    }

    /// Opens sync for `store`: checks (or adopts) the family and retries parked deltas.
    /// - Throws: `.noFamily` when neither the store nor the configuration has a family;
    ///   `.foreignFamily` when they differ; `.readOnlyStore` for a store opened read-only.
    public init(store: Store, configuration: SyncConfiguration = SyncConfiguration()) throws {
        // Refused before anything: sends and fetches would change the transport first and
        // fail only when they record what they did.
        guard !store.isReadOnly else {
            throw SyncError(.readOnlyStore, "store \(store.path) was opened read-only; open it for writing to sync it")
        }
        self.store = store
        key = configuration.key
        progress = configuration.progress
        isEnabled = configuration.enabled ?? store.syncPreferenceAtOpen
        let stored = try Self.family(of: store)
        switch (stored, configuration.family) {
        case (nil, nil):
            throw SyncError(.noFamily, "store \(store.path) has no sync family yet; configure SyncConfiguration.family (an account or container id) once")
        case (nil, let wanted?):
            // Adopted by the first exchange that goes through (``noteSuccess(in:)``): a refused
            // import, or a sync that failed, leaves the store without a family, as it was.
            family = wanted
        case (let have?, nil):
            family = have
        case (let have?, let wanted?):
            guard have == wanted else {
                throw SyncError(.foreignFamily, "store \(store.path) belongs to sync family \(have), not \(wanted); a store syncs with one family only")
            }
            family = have
        }
        adoptsFamily = stored == nil
        let chosenFamily = family
        familyKeys = configuration.key.map { FamilyKeys(key: $0, family: chosenFamily) }
        let remembered = try store.metadata(for: Self.keyFingerprintKey).map { String(decoding: $0, as: UTF8.self) }
        switch (remembered, configuration.key) {
        case (let known?, nil):
            keyProblem = "store \(store.path) belongs to a family whose deltas are authenticated with a sync key (fingerprint \(known)), and none was given; configure that key (SyncConfiguration.key; with the stash command, --key-file FILE naming the family's key file)"
        case (let known?, let given?) where given.fingerprint != known:
            keyProblem = "the sync key given (fingerprint \(given.fingerprint)) is not the key of store \(store.path)'s family (fingerprint \(known)); configure the family's key (with the stash command, --key-file FILE naming the family's key file)"
        default:
            keyProblem = nil
        }
        if stored != nil {
            try Self.adoptSite(of: store)
            // A store that synced with its key before the library remembered keys learns it here.
            if remembered == nil, let key = configuration.key {
                try store.setMetadata(Array(key.fingerprint.utf8), for: Self.keyFingerprintKey)
            }
        }
        try Self.askForEverythingIfTypesTurnedSynced(store)
        guard isEnabled else { return }
        // A crash while parking (a full snapshot, say) left its temporary file, unseen.
        AtomicFile.removeLeftovers(in: [parkedDirectory])
        // A parked delta that still fails must not keep the store from syncing the rest: the
        // error is kept as the last error (``status(peer:)``); ``retryParked()`` throws it.
        do { try retryParked() } catch { try? store.setMetadata(Array("\(error)".utf8), for: Self.lastErrorKey) }
    }

    static let siteKey = "sync.site"
    static let keyFingerprintKey = "sync.keyFingerprint"

    /// The store had no family when this engine opened: the first exchange that goes through
    /// gives it ``family``.
    private let adoptsFamily: Bool
    /// Why this engine cannot exchange: the store's family authenticates its deltas and this
    /// engine has no key, or another one (nil: it can).
    private let keyProblem: String?

    /// The fingerprint of the family's sync key this store remembers (it remembers it from its
    /// first exchange with a key), or nil for a family without one. A store that remembers one
    /// refuses every delta, signed or not, through an engine without that key.
    public static func keyFingerprint(of store: Store) throws -> String? {
        try store.metadata(for: keyFingerprintKey).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Throws `.unauthenticated` when the store's family uses a key this engine lacks.
    private func checkKey(_ what: String) throws {
        if let keyProblem { throw SyncError(.unauthenticated, "\(what) refused: \(keyProblem)") }
    }

    /// In the write of an exchange that went through: gives the store this engine's family
    /// (and marks its site) when it has none yet, and remembers the key's fingerprint.
    /// - Throws: `.foreignFamily` when another engine gave the store another family meanwhile.
    func noteSuccess(in tx: StoreTransaction) throws {
        if adoptsFamily {
            let now = try tx.metadata(for: Self.familyKey).flatMap { RecordID(bytes: $0[...]) }
            if let now, now != family {
                throw SyncError(.foreignFamily, "store \(store.path) belongs to sync family \(now), not \(family); a store syncs with one family only")
            }
            if now == nil {
                try tx.setMetadata(family.bytes, for: Self.familyKey)
                if try tx.metadata(for: Self.siteKey) == nil { try tx.setMetadata(site.bytes, for: Self.siteKey) }
            }
        }
        if let key, try tx.metadata(for: Self.keyFingerprintKey) == nil {
            try tx.setMetadata(Array(key.fingerprint.utf8), for: Self.keyFingerprintKey)
        }
    }

    /// A type turned from local-only to synced at the store's open (``Store/typesTurnedSyncedKey``):
    /// the records of it that peers sent were skipped while the watermarks moved past them.
    /// Each source something was skipped from (``noteSkipped(_:from:in:)``) is asked for a full
    /// snapshot at the next sync (merges are joins: what arrives twice changes nothing).
    private static func askForEverythingIfTypesTurnedSynced(_ store: Store) throws {
        guard try store.metadata(for: Store.typesTurnedSyncedKey) != nil else { return }
        try store.write(author: "sync") { tx in
            let synced = Set(tx.schema.types.filter { !$0.localOnly }.map(\.name))
            var skipped = try skippedTypes(in: tx)
            var wanted = try fullSnapshotsWanted(in: tx)
            for (source, types) in skipped where !types.isDisjoint(with: synced) {
                guard let site = RecordID(string: source) else { continue }
                try noteFullSnapshotWanted(from: site, in: &wanted, tx)
                skipped[source] = types.subtracting(synced)
            }
            try saveFullSnapshotsWanted(wanted, in: tx)
            try tx.setMetadata(Array(try JSONEncoder().encode(skipped.filter { !$0.value.isEmpty })), for: skippedTypesKey)
            try tx.setMetadata(nil, for: Store.typesTurnedSyncedKey)
        }
    }

    /// Notes in `wanted` (saved by the caller) that a full snapshot of `site` is wanted. A
    /// direct peer reads the request from this store, whichever side starts the exchange: it
    /// is asked here; a relay is asked at the next fetch through it.
    private static func noteFullSnapshotWanted(from site: RecordID, in wanted: inout [String: Set<String>], _ tx: StoreTransaction) throws {
        try tx.setMetadata([1], for: DirectTransport.requestKey(site))
        wanted[site.description, default: []].insert("direct")
    }

    /// Asks `source` for a full snapshot at the next exchange with it (see
    /// ``noteFullSnapshotWanted(from:in:_:)``), unless one is wanted already.
    private func wantFullSnapshot(from source: RecordID) throws {
        try store.write(author: "sync") { tx in
            var wanted = try Self.fullSnapshotsWanted(in: tx)
            guard wanted[source.description] == nil else { return }
            try Self.noteFullSnapshotWanted(from: source, in: &wanted, tx)
            try Self.saveFullSnapshotsWanted(wanted, in: tx)
        }
    }

    static let skippedTypesKey = "sync.skippedLocalOnly"

    /// The types of records skipped from each source because they are local-only here.
    private static func skippedTypes(in reading: some StoreReading) throws -> [String: Set<String>] {
        guard let bytes = try reading.metadata(for: skippedTypesKey) else { return [:] }
        return (try? JSONDecoder().decode([String: Set<String>].self, from: Data(bytes))) ?? [:]
    }

    private static func noteSkipped(_ types: Set<String>, from source: RecordID, in tx: StoreTransaction) throws {
        var skipped = try skippedTypes(in: tx)
        let known = skipped[source.description, default: []]
        guard !types.isSubset(of: known) else { return }
        skipped[source.description] = known.union(types)
        try tx.setMetadata(Array(try JSONEncoder().encode(skipped)), for: skippedTypesKey)
    }

    static let fullSnapshotsWantedKey = "sync.fullSnapshotsWanted"

    /// The sources wanted in full, each with the kinds of transport ("direct", "relay") it was
    /// already asked through: each kind asks once (asking at every fetch made an idle source
    /// export its whole store at every sync), and a source leaves the list once a full
    /// snapshot of it is applied.
    private static func fullSnapshotsWanted(in reading: some StoreReading) throws -> [String: Set<String>] {
        guard let bytes = try reading.metadata(for: fullSnapshotsWantedKey) else { return [:] }
        return (try? JSONDecoder().decode([String: Set<String>].self, from: Data(bytes))) ?? [:]
    }

    private static func saveFullSnapshotsWanted(_ wanted: [String: Set<String>], in tx: StoreTransaction) throws {
        try tx.setMetadata(wanted.isEmpty ? nil : Array(try JSONEncoder().encode(wanted)), for: fullSnapshotsWantedKey)
    }

    /// Asks through `transport` for the full snapshots noted by
    /// ``askForEverythingIfTypesTurnedSynced(_:)`` that were not asked through its kind yet.
    /// (``RelayTransport`` asks again by itself when a request went unanswered and no snapshot
    /// it could apply is on the relay: see ``wantsFullSnapshot(from:)``.)
    private func requestWantedFullSnapshots(via transport: some SyncTransport) async throws {
        let kind = transport.peer == nil ? "relay" : "direct"
        let wanted = try store.read(isolation: #isolation) { try Self.fullSnapshotsWanted(in: $0) }
        let toAsk = wanted.filter { !$0.value.contains(kind) }.keys.sorted()
        guard !toAsk.isEmpty else { return }
        for source in toAsk {
            guard let site = RecordID(string: source), site != self.site else { continue }
            try await transport.requestFullSnapshot(from: site, for: self)
        }
        try store.write(author: "sync", isolation: #isolation) { tx in
            var current = try Self.fullSnapshotsWanted(in: tx)
            for source in toAsk where current[source] != nil { current[source]!.insert(kind) }
            try Self.saveFullSnapshotsWanted(current, in: tx)
        }
    }

    /// Whether this store waits for a full snapshot of `source` (noted when a type turned
    /// synced here after records of it from `source` were skipped). One metadata read.
    func wantsFullSnapshot(from source: RecordID) throws -> Bool {
        try store.read { try Self.fullSnapshotsWanted(in: $0) }[source.description] != nil
    }

    /// Whether a delta of `source` waits here for the schema (then asking for another full
    /// snapshot would only park that one too).
    func hasParkedDeltas(from source: RecordID) -> Bool { !parkedRanges(of: source).isEmpty }

    /// Takes `source` off the list of wanted full snapshots (one of it was applied).
    private static func fullSnapshotArrived(from source: RecordID, in tx: StoreTransaction) throws {
        var wanted = try fullSnapshotsWanted(in: tx)
        guard wanted.removeValue(forKey: source.description) != nil else { return }
        try saveFullSnapshotsWanted(wanted, in: tx)
    }

    /// Makes the peer watermarks belong to the store's current site. A store opened from a
    /// copy of its data file has a new site id (see ``Store/siteID``), which its peers have
    /// never received from: what it sent as the old site counts for nothing, so every peer
    /// (and the relay) gets its history again from the start, or a full snapshot when history
    /// was purged. What it received stays valid (the watermarks were copied with the data),
    /// and its history up to each copy (``Store/copiedFrom``) is the original's, so that much
    /// of each original counts as received.
    private static func adoptSite(of store: Store) throws {
        let site = store.siteID
        guard try store.metadata(for: siteKey).flatMap({ RecordID(bytes: $0[...]) }) != site else { return }
        try store.write(author: "sync") { tx in
            let stored = try tx.metadata(for: siteKey).flatMap { RecordID(bytes: $0[...]) }
            guard stored != site else { return }
            // A former site here, or a copy of a store whose sync began before this library
            // kept the site: the watermarks were the original's.
            if stored != nil || !store.copiedFrom.isEmpty {
                for var watermark in try PeerWatermark.all(in: tx) where watermark.sentThrough > 0 {
                    watermark.sentThrough = 0
                    try watermark.save(in: tx)
                }
            }
            for copy in store.copiedFrom where copy.site != site {
                var original = try PeerWatermark.load(copy.site.description, in: tx)
                original.receivedThrough = max(original.receivedThrough, copy.through.sequence)
                try original.save(in: tx)
            }
            try tx.setMetadata(site.bytes, for: siteKey)
        }
    }

    // MARK: Export

    /// The delta of changes `peer` has not received (peer nil: for the relay, all origins).
    /// A peer that fell behind purged history gets a full snapshot (``Delta/isFullSnapshot``).
    /// A relay directory's delta leaves out what came through that relay directory (see
    /// ``arrivedThrough(_:in:)``).
    /// A store without a family takes the engine's: the delta carries it.
    public func makeDelta(for peer: RecordID?, fullSnapshot: Bool = false) throws -> Delta {
        try checkKey("an export")
        if adoptsFamily, try Self.family(of: store) == nil { try store.write(author: "sync") { try noteSuccess(in: $0) } }
        return try makeDelta(for: peer, watermark: peer?.description ?? PeerWatermark.relaySite, fullSnapshot: fullSnapshot)
    }

    /// ``makeDelta(for:fullSnapshot:)`` from the watermark named `name` (a transport's
    /// ``SyncTransport/watermarkSite(for:)``).
    func makeDelta(for peer: RecordID?, watermark name: String, fullSnapshot: Bool) throws -> Delta {
        try store.read { snapshot in
            // What leaves must survive a power cut here: a commit lost after a peer got it would
            // be numbered again by the next one, which the peer would take for the one it has.
            // Flushed inside the snapshot, so every commit it sees is on disk.
            if store.durability != .full { try store.flush() }
            let schema = snapshot.schema
            // Types carried for other replicas travel as the synced ones do.
            let synced = Self.syncedTypes(in: snapshot)
            let bounds = try snapshot.historyBounds()
            let watermark = try PeerWatermark.load(name, in: snapshot)
            let arrived = try Self.arrivedThrough(name, in: snapshot)
            var entries: [RecordState] = []
            let full = fullSnapshot || watermark.sentThrough < bounds.purgedThrough.sequence
            if full {
                for type in synced.sorted() {
                    try snapshot.forEachRecordState(typeNamed: type) { state in
                        entries.append(state)
                        if entries.count % 10_000 == 0 { report("export snapshot", entries.count, 0) }
                        return true
                    }
                }
            } else {
                var seen = Set<RecordKey>()
                var keys: [RecordKey] = []
                for entry in try snapshot.history(after: HistoryToken(sequence: watermark.sentThrough)) {
                    let through = arrived[entry.sequence]
                    for change in entry.changes where synced.contains(change.type) && change.origin != peer && change.origin != through {
                        let key = RecordKey(type: change.type, id: change.id)
                        if seen.insert(key).inserted { keys.append(key) }
                    }
                }
                for (n, key) in keys.enumerated() {
                    entries.append(try snapshot.recordState(typeNamed: key.type, id: key.id))
                    if (n + 1) % 10_000 == 0 { report("export", n + 1, keys.count) }
                }
            }
            return Delta(source: site, recipient: full ? nil : peer, family: family, schemaFingerprint: SchemaFingerprint.of(schema),
                         from: full ? 1 : watermark.sentThrough + 1, to: bounds.current.sequence,
                         isFullSnapshot: full, created: store.clock(), entries: entries,
                         counterFields: Self.counterFields(of: schema).merging(snapshot.carriedCounterFields) { $0.union($1) })
        }
    }

    /// Records that our history up to `through` (at most the newest entry) reached `peer`
    /// (nil: the relay), and keeps history after it from being purged.
    public func acknowledge(peer: RecordID?, through: UInt64) throws {
        try acknowledge(watermark: peer?.description ?? PeerWatermark.relaySite, through: through)
    }

    /// Notes that the relay directory at `path` holds the relay `id`. When it held another one
    /// before, that relay is gone for good: its watermark and history consumer go, or they
    /// would hold back every purge and keep ``status(peer:)`` pending (the store sends the new
    /// relay everything its readers may lack, once). One read when nothing changed.
    func relayDirectory(_ path: String, holds id: RecordID) throws {
        let key = "sync.relayDirectory." + SHA256.hash(data: Data(path.utf8)).map { String(format: "%02x", $0) }.joined()
        let known = try store.metadata(for: key).flatMap { RecordID(string: String(decoding: $0, as: UTF8.self)) }
        if known == id { return }
        try store.write(author: "sync") { tx in
            if let known {
                try tx.setMetadata(nil, for: PeerWatermark.key(PeerWatermark.relay(known)))
                try tx.setMetadata(nil, for: Self.arrivedThroughKey(PeerWatermark.relay(known)))
                try tx.removeHistoryConsumer("sync:\(PeerWatermark.relay(known))")
            }
            try tx.setMetadata(Array(id.description.utf8), for: key)
        }
    }

    /// ``acknowledge(peer:through:)`` under the watermark named `name`. A relay directory's
    /// first one takes the place of the watermark every relay shared before (it started from
    /// there): that one and its history consumer go, or they would hold back every purge.
    func acknowledge(watermark name: String, through: UInt64) throws {
        try store.write(author: "sync") { tx in
            try noteSuccess(in: tx)
            var watermark = try PeerWatermark.load(name, in: tx)
            if name.hasPrefix(PeerWatermark.relaySite + "."), try tx.metadata(for: PeerWatermark.key(PeerWatermark.relaySite)) != nil {
                try tx.setMetadata(nil, for: PeerWatermark.key(PeerWatermark.relaySite))
                try tx.removeHistoryConsumer("sync:\(PeerWatermark.relaySite)")
            }
            // Nothing past the newest entry was sent: acknowledging it would keep later local
            // writes under those sequence numbers from ever being sent.
            watermark.sentThrough = max(watermark.sentThrough, min(through, try tx.historyBounds().current.sequence))
            watermark.lastSent = store.clock()
            watermark.forgotten = nil
            try watermark.save(in: tx)
            let arrived = try Self.arrivedThrough(name, in: tx)
            if arrived.keys.contains(where: { $0 <= watermark.sentThrough }) {
                try Self.saveArrivedThrough(arrived.filter { $0.key > watermark.sentThrough }, name, in: tx)
            }
            try tx.registerHistoryConsumer("sync:\(name)", at: HistoryToken(sequence: watermark.sentThrough))
        }
    }

    /// Stops keeping history for the peer or relay directory whose watermark is named `site`
    /// (``PeerWatermark/site``, as ``peers()`` lists them): for a device retired or lost,
    /// whose watermark would otherwise hold back every ``Store/purgeHistory(before:force:)``
    /// (`.historyNeeded` naming it) for good. Its watermark stays, marked
    /// ``PeerWatermark/forgotten``: should the peer come back, its own changes still apply in
    /// order, and it gets what it lacks (a full snapshot once the history it needs is purged),
    /// after which this store keeps history for it again. A forgotten relay no longer counts
    /// for ``status(peer:)`` of the relays.
    /// - Returns: false when this store has no watermark of that name (nothing changed).
    @discardableResult
    public func forget(site: String) throws -> Bool {
        try store.write(author: "sync") { tx in
            guard try tx.metadata(for: PeerWatermark.key(site)) != nil else { return false }
            var watermark = try PeerWatermark.load(site, in: tx)
            if watermark.forgotten == nil { watermark.forgotten = store.clock() }
            try watermark.save(in: tx)
            try tx.removeHistoryConsumer("sync:\(site)")
            return true
        }
    }

    /// The history entries of this store that merged a delta fetched through the relay
    /// directory whose watermark is named `relay` (see ``apply(_:name:parking:arrivingThrough:)``),
    /// each with that delta's source, after the relay's sent watermark. Their changes from
    /// that source are not sent back to that relay, nor pending for it: the source published
    /// them there, and every reader gets them from its files (a reader joining after they are
    /// cleaned up, from full snapshots, which hold every record). Sent back, each reader
    /// republished every change it received, and its status was never up to date after
    /// receiving. Changes of those records made here, or received from elsewhere, are
    /// entries of their own and still go. One metadata read; empty for a direct peer.
    static func arrivedThrough(_ relay: String, in reading: some StoreReading) throws -> [UInt64: RecordID] {
        guard relay.hasPrefix(PeerWatermark.relaySite), let bytes = try reading.metadata(for: arrivedThroughKey(relay)),
              let stored = try? JSONDecoder().decode([String: String].self, from: Data(bytes)) else { return [:] }
        var result: [UInt64: RecordID] = [:]
        for (sequence, source) in stored {
            if let sequence = UInt64(sequence), let source = RecordID(string: source) { result[sequence] = source }
        }
        return result
    }

    private static func saveArrivedThrough(_ arrived: [UInt64: RecordID], _ relay: String, in tx: StoreTransaction) throws {
        let stored = Dictionary(uniqueKeysWithValues: arrived.map { (String($0.key), $0.value.description) })
        try tx.setMetadata(stored.isEmpty ? nil : Array(try JSONEncoder().encode(stored)), for: arrivedThroughKey(relay))
    }

    static func arrivedThroughKey(_ relay: String) -> String { "sync.arrivedThrough.\(relay)" }

    // MARK: Import

    /// Validates a delta, merges it and advances the source's watermark in one write
    /// transaction. Its checksum and authentication are checked first; a large delta's
    /// entries are read on another thread while the merge of the ones before runs, and
    /// whatever is wrong in them fails the transaction: nothing of a delta is ever applied
    /// unless all of it is valid.
    /// - Returns: `.duplicate` for a range applied before, `.parked` when it needs a newer schema.
    /// - Throws: ``SyncError`` for corrupt, foreign, unauthenticated or out-of-order deltas;
    ///   the store is then unchanged.
    @discardableResult
    public func apply(_ data: Data, name: String = "delta") throws -> ApplyOutcome {
        try apply(data, name: name, parking: true)
    }

    /// ``apply(_:name:)``; `parking`: whether a delta that does not fit yet is parked;
    /// `relay`: the watermark name of the relay directory the delta was fetched through, if
    /// it was (its changes are then not sent back there: see ``arrivedThrough(_:in:)``).
    /// `coverage`: for a checkpoint, how far of each source's history it holds (the watermarks
    /// of those sources move there in the same transaction).
    func apply(_ data: Data, name: String, parking: Bool, arrivingThrough relay: String? = nil,
               coverage: [RecordID: UInt64] = [:]) throws -> ApplyOutcome {
        guard isEnabled else {
            throw SyncError(.disabled, "sync is off for store \(store.path); it was kept local (turn the preference on and reopen)")
        }
        try checkKey(name)
        var reader = try DeltaReader(data, key: key, name: name)
        // `delta` is the header until the entries are read: a small delta's at once (every
        // entry checked before anything else), a large one's on another thread while this one
        // merges them, when the schemas match (see `DeltaEntryStream`); otherwise once needed.
        var delta = reader.header
        let entryCount = reader.remaining
        let stream = entryCount >= DeltaEntryStream.minimumEntries ? DeltaEntryStream(reader) : nil
        defer { stream?.stop() }
        // The batches the merge took from the stream, kept for a rerun of the write's closure
        // (see below).
        var streamed: [[RecordState]] = []
        var entriesRead = false
        func readEntries() throws {
            guard !entriesRead else { return }
            if let stream {
                // A run of the write's closure before this one may have taken batches already:
                // the entries are those and the rest.
                let rest = try stream.rest()
                delta.entries = streamed.flatMap { $0 } + rest.entries
                delta.counterFields = rest.counterFields
                streamed = []
            } else {
                delta.entries = try reader.entries(upTo: entryCount)
                delta.counterFields = try reader.finish()
            }
            entriesRead = true
        }
        if stream == nil { try readEntries() }
        guard delta.family == family else {
            throw SyncError(.foreignFamily, "\(name) comes from sync family \(delta.family), but store \(store.path) belongs to \(family); refused")
        }
        guard delta.source != site else {
            throw SyncError(.ownDelta, "\(name) was exported by this store (\(site)); nothing to import")
        }
        if let recipient = delta.recipient, recipient != site {
            throw SyncError(.wrongRecipient, "\(name) was made for store \(recipient), not this one (\(site)); export a delta for this store's site id")
        }
        let source = delta.source.description
        // Deltas of a source wait behind its parked ones (they are retried in range order):
        // applied now, the next would find a gap, answered by a full snapshot that is parked
        // in turn, at every change of the source. A full snapshot goes ahead: it holds all.
        let waiting = parking ? parkedRanges(of: delta.source) : []
        if !delta.isFullSnapshot, let head = waiting.min(by: { $0.from < $1.from }),
           try head.from <= store.read({ try PeerWatermark.load(source, in: $0) }).receivedThrough &+ 1 {
            try readEntries()
            // Only behind a head that waits for the schema alone; a head with a gap before it
            // must not hold back the deltas that will find the gap and ask for a full snapshot.
            if !waiting.contains(where: { $0.from <= delta.from && $0.to >= delta.to }) { try park(data, delta, reason: nil) }
            // This delta fits here while the parked head, which names nothing unknown here,
            // does not: the source has moved on, and the head may be older than this store's
            // schema (its values in a field's kind from before a migration here) and never
            // fit. A full snapshot of the source, in its schema now, goes ahead of them all and
            // supersedes them. (A head waiting for types or fields this store does not know
            // yet fits once this store upgrades: no snapshot then.)
            if let reason = parkReason(head.url), !Self.waitsForThisStore(reason),
               try store.read({ try incompatibility(delta, in: $0) }) == nil {
                try wantFullSnapshot(from: delta.source)
            }
            return .parked(reason: "waiting behind the parked deltas of \(source)")
        }
        // The checks run in the write transaction that merges, against the schema it sees:
        // another process cannot change the schema in between. Every entry is checked
        // (``DeltaEntryCheck``), whatever the schema fingerprints say.
        var readsWhole = false
        func merging() throws -> Result<ApplyOutcome, Incompatibility> {
          try store.write(author: "sync") { tx -> Result<ApplyOutcome, Incompatibility> in
            var watermark = try PeerWatermark.load(source, in: tx)
            // A range applied before is a duplicate whatever its schema (checked first: parked
            // as incompatible, one applied before a migration here held back its source).
            if !delta.isFullSnapshot, delta.to <= watermark.receivedThrough { return .success(.duplicate) }
            try noteSuccess(in: tx)
            // With the same schema fingerprint, a streamed delta's entries are checked and
            // merged as they are read (its counter list, which comes last, is checked after). A
            // rerun of this closure may see another schema than the run that streamed (a
            // closure grouped before it wrote differently, another process wrote between two
            // attempts): it then reads the rest and checks and merges every entry, those merged
            // by the run before included.
            let streaming = !readsWhole && stream != nil && !entriesRead && SchemaFingerprint.of(tx.schema) == delta.schemaFingerprint
            let check = DeltaEntryCheck(delta, name: name, schema: tx.schema)
            if !streaming {
                // Every entry checked before anything merges: a delta that must wait is parked
                // (even one with a gap before it, which the gap check below would refuse).
                try readEntries()
                for entry in delta.entries {
                    try check.validate(entry)
                    if let reason = try check.incompatibility(of: entry, local: { try tx.recordState(typeNamed: entry.type, id: entry.id) }) {
                        return .failure(Incompatibility(reason: reason))
                    }
                }
            }
            if !delta.isFullSnapshot {
                if delta.from > watermark.receivedThrough &+ 1, watermark.receivedThrough < .max {
                    throw SyncError(.gap, "\(name) covers \(delta.from)...\(delta.to) of \(source), but this store has applied only up to \(watermark.receivedThrough); deliver the missing deltas first")
                }
            }
            var changed = 0
            var merged = 0
            // Records of a type local-only here are skipped, and the watermark moves past
            // them: which types were skipped from which source is kept, so that if a type turns
            // synced here the source is asked for everything again.
            var skipped = Set<String>()
            // Merges are joins per record, so their order does not matter; unique-index
            // clashes are settled after the last one, on the delta's final states.
            func merge(_ entries: [RecordState]) throws {
                for entry in entries {
                    if streaming {
                        try check.validate(entry)
                        if let reason = try check.incompatibility(of: entry, local: { try tx.recordState(typeNamed: entry.type, id: entry.id) }) {
                            throw Incompatibility(reason: reason)
                        }
                    }
                    if check.isLocalOnly(entry) {
                        skipped.insert(entry.type)
                        continue
                    }
                    do {
                        if try tx.merge(entry, origin: delta.source, counters: delta.counterFields?[entry.type] ?? [], sentAt: delta.created,
                                        sameSchema: check.sameSchema) { changed += 1 }
                    } catch let error as StoreError where error.code == .invalidValue && !(entry.latestVersion?.isWithinClockRange ?? true) {
                        // A state with a version past the clock range (a broken clock, a forged delta),
                        // refused before anything was written, is left out the same way on every
                        // replica; the rest of the delta applies.
                    }
                    merged += 1
                    if merged % 10_000 == 0 { report(coverage.isEmpty ? "import" : "restore", merged, entryCount) }
                }
            }
            if streaming, let stream {
                // Kept: should this closure run again (a group commit reruns its closures when
                // another writer's throws, see `Store.write`), the batches read are merged again.
                for batch in streamed { try merge(batch) }
                while let batch = try stream.nextBatch() {
                    streamed.append(batch)
                    try merge(batch)
                }
                // The counter list, read last. The schemas are the same: the declared types'
                // counters must be this store's. Fields the source carries as counters must
                // merge as counters: the delta runs again, read whole, with the list at hand.
                let listed = try stream.rest().counterFields
                if let listed {
                    let declared = SyncEngine.counterFields(of: tx.schema)
                    for type in Set(listed.keys).union(declared.keys) {
                        guard let schemaType = tx.schema.type(named: type), !schemaType.localOnly else { continue }
                        let theirs = (listed[type] ?? []).filter { schemaType.field(named: $0) != nil }, ours = declared[type] ?? []
                        if theirs != ours {
                            throw SyncError(.invalidDelta, "\(name) lists the counter fields of \(type) as \(theirs.sorted()), although its schema is this store's, where they are \(ours.sorted()): no replica writes that, so its source (site \(delta.source)) is faulty or was tampered with by a holder of the family's key; refused, nothing of it was applied")
                        }
                    }
                    if listed.contains(where: { type, fields in fields.contains { tx.schema.type(named: type)?.field(named: $0) == nil } }) {
                        throw ReadWhole()
                    }
                }
            } else {
                try merge(delta.entries)
            }
            if !skipped.isEmpty { try Self.noteSkipped(skipped, from: delta.source, in: tx) }
            let clashes = try tx.settleUniqueClashes()
            if let relay, changed > 0 {
                // Each merge that changed something wrote a change of `delta.source` that this
                // transaction's history entry holds: the entry after the newest one now.
                var arrived = try Self.arrivedThrough(relay, in: tx)
                arrived[try tx.historySequence() + 1] = delta.source
                try Self.saveArrivedThrough(arrived, relay, in: tx)
            }
            watermark.receivedThrough = max(watermark.receivedThrough, delta.to)
            watermark.lastReceived = store.clock()
            try watermark.save(in: tx)
            // A checkpoint holds the other sources' history it covers: it counts as received.
            for (covered, through) in coverage where covered != site && covered != delta.source {
                var other = try PeerWatermark.load(covered.description, in: tx)
                guard through > other.receivedThrough else { continue }
                other.receivedThrough = through
                other.lastReceived = store.clock()
                try other.save(in: tx)
            }
            if delta.isFullSnapshot { try Self.fullSnapshotArrived(from: delta.source, in: tx) }
            return .success(.applied(entries: entryCount, changed: changed, uniqueClashes: clashes))
          }
        }
        let result: Result<ApplyOutcome, Incompatibility>
        do {
            result = try merging()
        } catch let incompatible as Incompatibility {
            result = .failure(incompatible)
        } catch is ReadWhole {
            readsWhole = true
            do { result = try merging() } catch let incompatible as Incompatibility { result = .failure(incompatible) }
        }
        // A full snapshot, applied or parked, holds everything the source's older parked deltas do.
        let superseded = waiting.filter { $0.to <= delta.to }
        switch result {
        case .success(let outcome):
            for file in superseded { removeParked(file.url) }
            return outcome
        case .failure(let incompatible):
            if parking {
                for file in superseded { removeParked(file.url) }
                try park(data, delta, reason: incompatible.reason)
            }
            return .parked(reason: incompatible.reason)
        }
    }

    /// Why a delta cannot be applied yet (see ``DeltaEntryCheck/incompatibility(of:local:)``).
    private struct Incompatibility: Error {
        let reason: String
    }

    /// A streamed delta whose counter list names fields this store carries without declaring
    /// them: it is merged again, read whole, so that they merge as counters.
    private struct ReadWhole: Error {}

    /// The types whose changes go to peers: the schema's synced types, and those the store
    /// carries for other replicas without declaring them.
    static func syncedTypes(in reading: some StoreReading) -> Set<String> {
        Set(reading.schema.types.filter { !$0.localOnly }.map(\.name)).union(reading.carriedTypeNames)
    }

    /// The counter fields of each synced type of `schema` that has any (``Delta/counterFields``).
    static func counterFields(of schema: StoreSchema) -> [String: Set<String>] {
        var result: [String: Set<String>] = [:]
        for type in schema.types where !type.localOnly {
            let counters = Set(type.fields.filter { $0.counter == true }.map(\.name))
            if !counters.isEmpty { result[type.name] = counters }
        }
        return result
    }

    /// Why this store cannot apply `delta` yet (a field one store merges as a counter and the
    /// other does not, or a record that would lack a field required here: see
    /// ``DeltaEntryCheck``), or nil. What it holds that no replica writes is no reason to wait:
    /// nil too (the import refuses it).
    func incompatibility(_ delta: Delta, in reading: some StoreReading) throws -> String? {
        let check = DeltaEntryCheck(delta, name: "delta", schema: reading.schema)
        for entry in delta.entries {
            guard (try? check.validate(entry)) != nil else { return nil }
            let reason: String?
            do { reason = try check.incompatibility(of: entry, local: { try reading.recordState(typeNamed: entry.type, id: entry.id) }) }
            catch let error as SyncError where error.code == .invalidDelta { return nil }
            if let reason { return reason }
        }
        return nil
    }

    // MARK: Parked deltas

    var parkedDirectory: URL { Self.parkedDirectory(of: store) }
    static func parkedDirectory(of store: Store) -> URL { URL(fileURLWithPath: store.path).appendingPathComponent("sync-parked") }

    /// The parked deltas of `source`, with their ranges (from their names, see ``park(_:_:)``).
    private func parkedRanges(of source: RecordID) -> [(url: URL, from: UInt64, to: UInt64)] {
        let prefix = source.description + "-"
        let files = (try? FileManager.default.contentsOfDirectory(at: parkedDirectory, includingPropertiesForKeys: nil)) ?? []
        return files.compactMap { url in
            let name = url.lastPathComponent
            guard url.pathExtension == "delta", name.hasPrefix(prefix) else { return nil }
            let range = name.dropFirst(prefix.count).dropLast(".delta".count).split(separator: "-")
            guard range.count == 2, let from = UInt64(range[0]), let to = UInt64(range[1]) else { return nil }
            return (url, from, to)
        }
    }

    /// Keeps `delta` until the schema lets it apply, with why it does not now (`reason`, nil
    /// for one that waits behind another) beside it (`<name>.reason`).
    private func park(_ data: Data, _ delta: Delta, reason: String?) throws {
        let name = String(format: "%@-%020llu-%020llu.delta", delta.source.description, delta.from, delta.to)
        let url = parkedDirectory.appendingPathComponent(name)
        try AtomicFile.write(data, to: url)
        if let reason { try AtomicFile.write(Data(reason.utf8), to: Self.reasonFile(url)) }
    }

    /// Why the parked delta at `url` did not fit when it was parked (nil: it waited behind
    /// another, or was parked by a library that kept no reason).
    private func parkReason(_ url: URL) -> String? {
        (try? Data(contentsOf: Self.reasonFile(url))).map { String(decoding: $0, as: UTF8.self) }
    }

    private func removeParked(_ url: URL) {
        try? FileManager.default.removeItem(at: url)
        try? FileManager.default.removeItem(at: Self.reasonFile(url))
    }

    private static func reasonFile(_ url: URL) -> URL { url.appendingPathExtension("reason") }

    /// How the reasons of older libraries that named a type or field unknown here began: such
    /// a delta fits once this store knows them (it is carried now, and applies at the retry).
    static let unknownPrefix = "unknown "

    /// Whether a parked delta with this reason waits for this store's schema to change (a
    /// newer app version here): a field declared as a counter on one side only, or a type or
    /// field unknown here (a reason of an older library). A full snapshot of its source would
    /// wait the same way, so none is asked for.
    static func waitsForThisStore(_ reason: String) -> Bool {
        reason.hasPrefix(unknownPrefix) || reason.contains(DeltaEntryCheck.declaredDifferently)
    }

    /// Applies parked deltas whose schema is now known (in source and range order).
    /// - Returns: how many were applied.
    /// - Throws: the first error a parked delta met, after trying the others: an error (or a
    ///   delta still parked) holds back the later parked deltas of its own source only.
    @discardableResult
    public func retryParked() throws -> Int {
        var gaps: [RecordID] = []
        return try retryParked(gaps: &gaps)
    }

    /// ``retryParked()``; `gaps` gets each source whose oldest parked delta has a gap before it
    /// (a full snapshot of that source is what can fill it).
    func retryParked(gaps: inout [RecordID]) throws -> Int {
        let files = (try? FileManager.default.contentsOfDirectory(at: parkedDirectory, includingPropertiesForKeys: nil)) ?? []
        var applied = 0
        var blocked = Set<Substring>()
        var firstError: (any Error)?
        for file in files.filter({ $0.pathExtension == "delta" }).sorted(by: { $0.lastPathComponent < $1.lastPathComponent }) {
            // Named "<source>-<from>-<to>.delta" (see `park`); the source is the id before the range.
            let source = file.lastPathComponent.dropLast(".delta".count + 42)
            if blocked.contains(source) { continue }
            do {
                switch try apply(try Data(contentsOf: file), name: file.lastPathComponent, parking: false) {
                case .parked:
                    blocked.insert(source)
                case .applied, .duplicate:
                    removeParked(file)
                    applied += 1
                }
            } catch let error as SyncError where error.code == .gap {
                blocked.insert(source)
                if let site = RecordID(string: String(source)) { gaps.append(site) }
                if firstError == nil { firstError = error }
            } catch {
                blocked.insert(source)
                if firstError == nil { firstError = error }
            }
        }
        if let firstError { throw firstError }
        return applied
    }

    /// Deltas waiting for a newer schema.
    public func parkedDeltas() -> [String] { Self.parkedDeltas(of: store) }

    /// The deltas `store` holds parked (of `source` only, when given), each as `"name (why)"`.
    public static func parkedReasons(of store: Store, from source: RecordID? = nil) -> [String] {
        let directory = parkedDirectory(of: store)
        return parkedDeltas(of: store).filter { source == nil || $0.hasPrefix(source!.description + "-") }.map { name in
            let reason = (try? Data(contentsOf: reasonFile(directory.appendingPathComponent(name)))).map { String(decoding: $0, as: UTF8.self) }
            return "\(name) (\(reason ?? "waits behind an earlier parked delta of its source"))"
        }
    }

    static let parkedAtPeerKey = "sync.parkedAtPeer"

    private static func decodeParked(_ bytes: [UInt8]) -> [String] {
        (try? JSONDecoder().decode([String].self, from: Data(bytes))) ?? []
    }

    /// Keeps what the other end of `transport` says it holds parked of this store's deltas,
    /// for ``status(peer:)``; nothing when it cannot say.
    private func noteParkedAtPeer(via transport: some SyncTransport) async throws {
        guard let parked = try await transport.parkedAtPeer(for: self) else { return }
        let key = Self.parkedAtPeerKey + "." + (try await transport.watermarkSite(for: self))
        let value = parked.isEmpty ? nil : Array(try JSONEncoder().encode(parked))
        guard try store.metadata(for: key) != value else { return }
        try store.setMetadata(value, for: key)
    }

    /// ``parkedDeltas()`` of `store`, without opening sync on it (which writes).
    public static func parkedDeltas(of store: Store) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: parkedDirectory(of: store).path)) ?? []).filter { $0.hasSuffix(".delta") }.sorted()
    }

    // MARK: Exchange

    /// Sends the changes the transport's peer has not received. Nothing is marked as sent
    /// unless the transport took the delta; a failing transport leaves everything pending.
    /// - Returns: the number of record states sent, and whether they went as a full snapshot.
    @discardableResult
    public func sendChanges(via transport: some SyncTransport) async throws -> (entries: Int, fullSnapshot: Bool) {
        let sent = try await send(via: transport)
        return (sent.entries, sent.fullSnapshot)
    }

    /// ``sendChanges(via:)``, with the clashes the peer settled while merging what was sent
    /// (``SyncReport/uniqueClashesAtPeer``).
    private func send(via transport: some SyncTransport) async throws -> (entries: Int, fullSnapshot: Bool, clashesAtPeer: [UniqueClash]) {
        try await recordingOutcome(via: transport) {
            guard isEnabled else { throw SyncError(.disabled, "sync is off for store \(store.path); changes stay local") }
            try checkKey("sending to \(try await transport.watermarkSite(for: self))")
            guard try !store.isNewSiteRequested() else {
                throw SyncError(.siteReused, "store \(store.path) was found to share its site \(site) with another replica; it takes a new site at its next open: reopen it, then sync")
            }
            let name = try await transport.watermarkSite(for: self)
            let requested = try await transport.fullSnapshotRequested(by: self)
            let delta = try makeDelta(for: transport.peer, watermark: name, fullSnapshot: requested)
            // A range with nothing for the peer (local-only changes, or changes that came from
            // it) still goes out, empty, so that acknowledging it keeps the peer gap-free and
            // lets history up to it be purged.
            if !delta.hasNews { return (0, false, []) }
            let clashes: [UniqueClash]
            do {
                clashes = try await deliver(delta, via: transport)
            } catch let error as SyncError where error.code == .transportFailed && delta.isFullSnapshot {
                // A full snapshot that does not fit (the relay's quota, a full disk) must not hold
                // back the changes every other reader waits for: those go, and the request
                // stays for a later send (this one still fails, saying so).
                let changes = try makeDelta(for: transport.peer, watermark: name, fullSnapshot: false)
                guard changes.hasNews, !changes.isFullSnapshot else { throw error }
                try await deliver(changes, via: transport)
                try acknowledge(watermark: name, through: changes.to)
                throw SyncError(.transportFailed, "the full snapshot due (a reader asked for it, or it replaces the relay's files) did not fit (\(error.message)); the \(changes.entries.count) changes since the last send went out, and the snapshot is tried again at the next send")
            }
            try acknowledge(watermark: name, through: delta.to)
            return (delta.entries.count, delta.isFullSnapshot, clashes)
        }
    }

    /// Delivers `delta`; a transport that finds this site's history ahead of the store (a
    /// rollback or a clone) makes the store take a new site at its next open.
    /// - Returns: the clashes the peer settled while merging it, for a transport that says.
    @discardableResult
    private func deliver(_ delta: Delta, via transport: some SyncTransport) async throws -> [UniqueClash] {
        // The blobs its records reference go first: a reader never waits for one this store had.
        try await sendBlobs(of: delta, via: transport)
        do {
            return try await transport.deliverReportingClashes(delta.encoded(key: key), delta: delta, from: self)
        } catch let error as SyncError where error.code == .siteReused {
            try store.requestNewSite()
            throw error
        }
    }

    /// Fetches and applies what the transport has for this store, in order.
    @discardableResult
    public func fetchChanges(via transport: some SyncTransport) async throws -> SyncReport {
        try await recordingOutcome(via: transport, problem: { $0.refused.isEmpty ? nil : "refused: \($0.refused.joined(separator: "; "))" }) {
            guard isEnabled else { throw SyncError(.disabled, "sync is off for store \(store.path); nothing fetched") }
            try checkKey("fetching through \(try await transport.watermarkSite(for: self))")
            try await requestWantedFullSnapshots(via: transport)
            // Parked deltas whose schema another process has brought here apply now, and a
            // parked head with a gap before it asks for a full snapshot of its source.
            if !parkedDeltas().isEmpty {
                var gaps: [RecordID] = []
                _ = try? retryParked(gaps: &gaps)
                for source in gaps { try await transport.requestFullSnapshot(from: source, for: self) }
            }
            var report = SyncReport()
            // A gap or a parked delta holds back later deltas of the same source only.
            var blocked = Set<RecordID>()
            // Acknowledged once the store has flushed what they cover (below).
            var consumed: [(IncomingDelta, ApplyOutcome)] = []
            // A source with parked deltas: its relay files stay unacknowledged and come again,
            // and joined with the files after them they would park a new, larger file at every
            // fetch. One by one, each parked one waits, and the files after it stay on the relay.
            let parkedSources = Set(parkedDeltas().compactMap { RecordID(string: String($0.prefix(36))) })
            let relay = transport.peer == nil ? try await transport.watermarkSite(for: self) : nil
            let incoming = try await transport.incoming(for: self)
            // A checkpoint applies alone: what it covers of other sources moves their watermarks.
            let runs = Self.joiningRuns(incoming) { run in
                parkedSources.contains(run[0].source) || run.contains { !$0.coverage.isEmpty } ? nil : joined(run)
            }
            // Cancelled, the fetch stops before its next delta: each one applied was a
            // transaction of its own, and is acknowledged below; the rest stays on the transport.
            var cancelled = false
            for (incoming, members) in runs where !blocked.contains(incoming.source) {
                if Task.isCancelled {
                    cancelled = true
                    break
                }
                if let problem = incoming.problem {
                    report.refused.append(Self.refusal(of: incoming.name, problem))
                    blocked.insert(incoming.source)
                    continue
                }
                let outcome: ApplyOutcome
                do {
                    outcome = try apply(incoming.data, name: incoming.name, parking: true, arrivingThrough: relay, coverage: incoming.coverage)
                } catch let error as SyncError where error.code == .gap {
                    try await transport.requestFullSnapshot(from: incoming.source, for: self)
                    blocked.insert(incoming.source)
                    continue
                } catch let error as SyncError where error.code != .disabled && error.code != .transportFailed {
                    // A damaged delta is superseded by a full snapshot of its source, once asked.
                    // An intact one this library cannot read (`.unreadableDelta`) asks for none:
                    // the snapshot would hold the same, and its source would send one per sync.
                    if error.code == .corruptDelta { try await transport.requestFullSnapshot(from: incoming.source, for: self) }
                    report.refused.append(Self.refusal(of: incoming.name, error.message))
                    blocked.insert(incoming.source)
                    continue
                } catch let error as StoreError where error.code != .storage && error.code != .corrupted {
                    // What the delta holds (a value of another kind, say): this source only.
                    report.refused.append(Self.refusal(of: incoming.name, error.message))
                    blocked.insert(incoming.source)
                    continue
                }
                switch outcome {
                case .applied(let entries, let changed, let clashes):
                    report.receivedEntries += entries
                    report.changedHere += changed
                    report.uniqueClashes += clashes
                case .duplicate: break
                case .parked(let reason):
                    report.parked.append("\(incoming.name) (\(reason))")
                    blocked.insert(incoming.source)
                }
                for member in members { consumed.append((member, outcome)) }
            }
            // A store that may lose its last commits in a power cut (`.relaxed`, `.none`) makes
            // them durable before acknowledging them: an acknowledged delta is never offered
            // again, and its source may delete it.
            if !consumed.isEmpty, store.durability != .full { try store.flush() }
            for (incoming, outcome) in consumed { try await incoming.consumed(outcome) }
            if cancelled { throw CancellationError() }
            // The blobs the records reference and this store lacks (new ones, and those pending).
            (report.blobsReceived, report.blobsPending, report.blobProblems) = try await fetchPendingBlobs(via: transport)
            // And the ones an earlier send owed the other end, if they are here now.
            try await sendBlobs(of: nil, via: transport)
            return report
        }
    }

    /// One line for ``SyncReport/refused``: `message` when it begins with the delta's `name`
    /// (a delta's own errors do, and the name says where it came from), else name, then
    /// message; the name once either way.
    static func refusal(of name: String, _ message: String) -> String {
        message.hasPrefix(name) ? message : "\(name): \(message)"
    }

    /// The deltas of a fetch in order, each run of consecutive deltas of one source joined
    /// into one (with the deltas it stands for, to acknowledge), where `join` can.
    static func joiningRuns(_ incoming: [IncomingDelta], join: ([IncomingDelta]) -> IncomingDelta?) -> [(IncomingDelta, [IncomingDelta])] {
        var result: [(IncomingDelta, [IncomingDelta])] = []
        var start = 0
        while start < incoming.count {
            var end = start + 1
            while end < incoming.count && incoming[end].source == incoming[start].source { end += 1 }
            let run = Array(incoming[start..<end])
            if run.count > 1, let one = join(run) { result.append((one, run)) } else { result += run.map { ($0, [$0]) } }
            start = end
        }
        return result
    }

    /// Consecutive deltas of one source (relay files fetched together) as one: each record's
    /// states joined, so that they apply in one transaction and unique-index clashes are
    /// settled on the source's latest states, as a direct sync of the same history is.
    /// Applied one by one, a clash the source had resolved since (by changing the value)
    /// deleted a record for good. Nil when they cannot be joined (a file that does not
    /// decode, a gap between their ranges, another schema or counter list, a full snapshot
    /// after the first): they then apply one by one.
    func joined(_ run: [IncomingDelta]) -> IncomingDelta? {
        var deltas: [Delta] = []
        for item in run {
            guard item.problem == nil, let delta = try? Delta(decoding: item.data, key: key, name: item.name) else { return nil }
            deltas.append(delta)
        }
        guard var joined = deltas.first, let last = deltas.last else { return nil }
        for (earlier, later) in zip(deltas, deltas.dropFirst()) {
            guard !later.isFullSnapshot, later.from == earlier.to &+ 1, later.recipient == joined.recipient, later.family == joined.family,
                  later.schemaFingerprint == joined.schemaFingerprint, later.counterFields == joined.counterFields else { return nil }
        }
        var states: [RecordKey: RecordState] = [:]
        var order: [RecordKey] = []
        for entry in deltas.lazy.flatMap(\.entries) {
            let key = RecordKey(type: entry.type, id: entry.id)
            if let earlier = states[key] {
                states[key] = earlier.merged(with: entry, counters: joined.counterFields?[entry.type] ?? [])
            } else {
                states[key] = entry
                order.append(key)
            }
        }
        joined.to = last.to
        joined.created = last.created
        joined.entries = order.map { states[$0]! }
        return IncomingDelta(name: "\(run[0].name) to \(last.to)", source: joined.source, data: joined.encoded(key: key)) { _ in }
    }

    /// Sends, then fetches.
    ///
    /// A failing send (the transport is full or offline) does not skip the fetch: what others
    /// sent is still applied and acknowledged, which is what lets a full relay drain. The send's
    /// error is thrown after it.
    @discardableResult
    public func sync(via transport: some SyncTransport) async throws -> SyncReport {
        let sent: (entries: Int, fullSnapshot: Bool, clashesAtPeer: [UniqueClash])
        do {
            sent = try await send(via: transport)
        } catch let error as SyncError where error.code == .transportFailed {
            _ = try? await fetchChanges(via: transport)
            // The fetch recorded its own outcome: the send's failure is the one to show.
            let site = try? await transport.watermarkSite(for: self)
            try? store.write(author: "sync", isolation: #isolation) { tx in
                try tx.setMetadata(Array("\(error)".utf8), for: Self.lastErrorKey)
                if let site {
                    try tx.setMetadata(Array("\(error)".utf8), for: Self.lastErrorKey + "." + site)
                }
            }
            throw error
        }
        // Cancelled between the exchange's steps, a sync stops there: each delta it applied
        // was one transaction, and what it did not fetch stays on the transport for the next.
        try Task.checkCancellation()
        var report = try await fetchChanges(via: transport)
        try await noteParkedAtPeer(via: transport)
        if try await transport.checkpointDue(for: self) {
            try Task.checkCancellation()
            report.checkpointEntries = try await publishCheckpoint(via: transport)
        }
        report.sentEntries = sent.entries
        report.sentFullSnapshot = sent.fullSnapshot
        report.uniqueClashesAtPeer = sent.clashesAtPeer
        return report
    }

    /// Publishes a checkpoint through `transport` now: this store's whole synced state (every
    /// record and delete, what it carries for other replicas included) as one full snapshot,
    /// with how far of each source's history it holds. A store given only the relay, the family
    /// id and the key restores from it (``fetchChanges(via:)`` applies it first when the store
    /// has received nothing yet, or when files it needs are gone), and the relay drops the
    /// files it holds once every reader has read them. ``sync(via:)`` publishes one when the
    /// transport says one is due (``SyncTransport/checkpointDue(for:)``: for a relay
    /// directory, when the files no checkpoint holds outweigh the newest one).
    /// O(records). - Returns: the record states it holds.
    @discardableResult
    public func publishCheckpoint(via transport: some SyncTransport) async throws -> Int {
        guard isEnabled else { throw SyncError(.disabled, "sync is off for store \(store.path); no checkpoint published") }
        try checkKey("a checkpoint")
        // What it holds of each source, read before the snapshot: never more than it has.
        var coverage = try store.read(isolation: #isolation) { snapshot -> [RecordID: UInt64] in
            var result: [RecordID: UInt64] = [:]
            for watermark in try PeerWatermark.all(in: snapshot) where watermark.receivedThrough > 0 {
                if let source = RecordID(string: watermark.site), source != site { result[source] = watermark.receivedThrough }
            }
            return result
        }
        let delta = try makeDelta(for: nil, watermark: try await transport.watermarkSite(for: self), fullSnapshot: true)
        coverage[site] = delta.to
        try await sendBlobs(of: delta, via: transport)
        try await transport.publishCheckpoint(delta.encoded(key: key), coverage: coverage, from: self)
        // Blobs that neither the new checkpoint nor a delta on the medium references go (a day on).
        _ = try? await transport.collectBlobs(for: self, olderThan: Self.relayBlobGrace)
        return delta.entries.count
    }

    /// Syncs every `interval` until the returned task is cancelled, or the store is closed
    /// (`Store.close()`, seen at the next round); errors are kept in ``status(peer:)``.
    /// Cancelling it stops the loop at once, or the sync under way between two deltas (each
    /// delta merged is one transaction), and the task ends when that has.
    ///
    /// The task runs on a thread of its own (named `stash.sync`, ended with the task): a sync
    /// blocks on the store (its write lock while another process writes, the disk), and on a
    /// thread of Swift's concurrency pool it would hold back every task of the app meanwhile.
    /// Awaiting the transport (a network) suspends without holding it.
    public func startBackgroundSync(via transport: some SyncTransport, every interval: Duration) -> Task<Void, Never> {
        let executor = DedicatedThreadExecutor(name: "stash.sync")
        return Task(executorPreference: executor) { [self] in
            defer { executor.finish() }
            while !Task.isCancelled && !store.isClosed {   // a closed store ends it (issue 41)
                _ = try? await self.sync(via: transport)
                try? await Task.sleep(for: interval)
            }
        }
    }

    /// Runs `body` and records the outcome for ``status(peer:)``: its error, or success, or
    /// the `problem` a successful result reports (kept as the last error); for the store, and
    /// for the other end of `transport` (its watermark's name), whose ``status(via:)`` then
    /// shows its own.
    private func recordingOutcome<R>(via transport: some SyncTransport, problem: (R) -> String? = { _ in nil },
                                     _ body: () async throws -> R) async throws -> R {
        do {
            let result = try await body()
            let trouble = problem(result)
            let site = try? await transport.watermarkSite(for: self)
            try store.write(author: "sync", isolation: #isolation) { tx in
                try noteSuccess(in: tx)
                let now = Array(String(store.clock().timeIntervalSince1970).utf8)
                for suffix in [""] + (site.map { ["." + $0] } ?? []) {
                    try tx.setMetadata(now, for: Self.lastSuccessKey + suffix)
                    try tx.setMetadata(trouble.map { Array($0.utf8) }, for: Self.lastErrorKey + suffix)
                }
            }
            return result
        } catch {
            let site = try? await transport.watermarkSite(for: self)
            try? store.write(author: "sync", isolation: #isolation) { tx in
                for suffix in [""] + (site.map { ["." + $0] } ?? []) {
                    try tx.setMetadata(Array("\(error)".utf8), for: Self.lastErrorKey + suffix)
                }
            }
            throw error
        }
    }

    // MARK: Status

    /// Pending changes for `peer` (nil: for the peer or relay furthest behind, forgotten ones
    /// left out, every change while there is none; one relay directory: ``status(via:)``),
    /// last success and last error.
    public func status(peer: RecordID? = nil) throws -> SyncStatus {
        try Self.status(of: store, peer: peer, enabled: isEnabled)
    }

    /// Pending changes for the other end of `transport` (a relay directory has a watermark of
    /// its own), last success and last error.
    /// - Throws: `.transportFailed` when the transport cannot say who it is (a relay that is
    ///   unavailable).
    public func status(via transport: some SyncTransport) async throws -> SyncStatus {
        var status = try Self.status(of: store, site: try await transport.watermarkSite(for: self), enabled: isEnabled)
        status.relayUnencrypted = transport.peer == nil && !encryptsRelayFiles
        return status
    }

    /// ``status(peer:)`` read from `store` without opening sync on it (which writes): for a
    /// store opened read-only. `enabled` is reported as given.
    public static func status(of store: Store, peer: RecordID? = nil, enabled: Bool) throws -> SyncStatus {
        if let peer { return try status(of: store, site: peer.description, enabled: enabled) }
        // The watermarks this store sends to (not those of sources it only reads, through a
        // relay), each with its own status: changes that came from a peer are not pending for it.
        let pending = try peers(of: store).filter { $0.forgotten == nil && $0.lastSent != nil }
            .map { try status(of: store, site: $0.site, enabled: enabled, outcomeOf: nil).pendingOutgoing }
        guard let behind = pending.max() else {
            return try status(of: store, site: PeerWatermark.relaySite, enabled: enabled, outcomeOf: nil)
        }
        // The last outcome of any sync: a failure with any peer shows here.
        let outcome = try store.read { try lastOutcome(in: $0, of: nil) }
        let parkedAtPeers = try store.read { snapshot in
            try snapshot.metadata(withPrefix: parkedAtPeerKey + ".").flatMap { decodeParked($0.value) }
        }
        return SyncStatus(enabled: enabled, pendingOutgoing: behind, lastSuccess: outcome.success, lastError: outcome.error,
                          parkedHere: parkedReasons(of: store), parkedAtPeer: parkedAtPeers)
    }

    /// The status of the watermark named `site` (``PeerWatermark/site``, as ``peers(of:)``
    /// lists them), read from `store` without opening sync on it: its pending changes, and
    /// the last outcome of a sync with it (of any sync, until one with it is recorded).
    public static func status(of store: Store, site: String, enabled: Bool) throws -> SyncStatus {
        try status(of: store, site: site, enabled: enabled, outcomeOf: site)
    }

    /// ``status(of:site:enabled:)`` with the last outcome recorded for the watermark named
    /// `outcomeOf` (nil: of any sync).
    private static func status(of store: Store, site: String, enabled: Bool, outcomeOf: String?) throws -> SyncStatus {
        let peer = RecordID(string: site)
        return try store.read { snapshot in
            let synced = syncedTypes(in: snapshot)
            let watermark = try PeerWatermark.load(site, in: snapshot)
            let arrived = try arrivedThrough(site, in: snapshot)
            let bounds = try snapshot.historyBounds()
            var pending = 0
            if watermark.sentThrough < bounds.purgedThrough.sequence {
                pending = try synced.reduce(0) { $0 + (try snapshot.count(typeNamed: $1)) }
            } else {
                for entry in try snapshot.history(after: HistoryToken(sequence: watermark.sentThrough)) {
                    let through = arrived[entry.sequence]
                    pending += entry.changes.filter { synced.contains($0.type) && $0.origin != peer && $0.origin != through }.count
                }
            }
            let outcome = try lastOutcome(in: snapshot, of: outcomeOf)
            let atPeer = try snapshot.metadata(for: parkedAtPeerKey + "." + site).map(decodeParked) ?? []
            return SyncStatus(enabled: enabled, pendingOutgoing: pending, lastSuccess: outcome.success, lastError: outcome.error,
                              parkedHere: parkedReasons(of: store, from: peer), parkedAtPeer: atPeer)
        }
    }

    /// The last success and error recorded for the watermark named `site` (nil: of any sync),
    /// or the store's while none is recorded for it (a store from before they were kept apart).
    private static func lastOutcome(in snapshot: StoreSnapshot, of site: String?) throws -> (success: Date?, error: String?) {
        var suffix = site.map { "." + $0 } ?? ""
        if try snapshot.metadata(for: Self.lastSuccessKey + suffix) == nil, try snapshot.metadata(for: Self.lastErrorKey + suffix) == nil {
            suffix = ""
        }
        let success = try snapshot.metadata(for: Self.lastSuccessKey + suffix).flatMap { Double(String(decoding: $0, as: UTF8.self)) }
        let error = try snapshot.metadata(for: Self.lastErrorKey + suffix).map { String(decoding: $0, as: UTF8.self) }
        return (success.map { Date(timeIntervalSince1970: $0) }, error)
    }

    /// Every peer this store has exchanged with.
    public func peers() throws -> [PeerWatermark] { try Self.peers(of: store) }

    /// ``peers()`` read from `store` without opening sync on it (which writes).
    public static func peers(of store: Store) throws -> [PeerWatermark] { try store.read { try PeerWatermark.all(in: $0) } }

    private func report(_ phase: String, _ done: Int, _ total: Int) {
        progress?(SyncProgress(phase: phase, done: done, total: total))
    }
}

struct RecordKey: Hashable {
    let type: String
    let id: RecordID
}

/// A short digest of the synced part of a schema (types; fields with their kinds, counter
/// marks, optionality and whether they have a default; local-only types left out): equal
/// fingerprints mean a delta fits without checking each entry.
enum SchemaFingerprint {
    static func of(_ schema: StoreSchema) -> [UInt8] {
        var text = ""
        for type in schema.types.filter({ !$0.localOnly }).sorted(by: { $0.name < $1.name }) {
            text += "\(type.name){"
            for field in type.fields.sorted(by: { $0.name < $1.name }) {
                // Optionality and a default's presence too: they decide whether a record that
                // lacks the field can be read (``SyncEngine/incompatibility(_:in:)``).
                text += "\(field.name):\(field.kind?.rawValue ?? "?")\(field.counter == true ? "+" : "")\(field.anyKind == true ? "*" : "")\(field.optional ? "?" : "")\(field.defaultValue != nil ? "=" : ""),"
            }
            text += "}"
        }
        return Array(SHA256.hash(data: Data(text.utf8)))
    }
}

/// Writes a file so that readers see all of it or none: temp file, fsync, rename, fsync dir.
enum AtomicFile {
    /// How the temporary file of a write starts (it is renamed when complete).
    static let temporaryPrefix = ".tmp-"

    /// Removes the temporary files in `directories` that writes a crash interrupted over an
    /// hour ago (a write still running is younger).
    static func removeLeftovers(in directories: [URL]) {
        let cutoff = Date().addingTimeInterval(-3600)
        for directory in directories {
            let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
            for name in names where name.hasPrefix(temporaryPrefix) {
                let url = directory.appendingPathComponent(name)
                let modified = (try? FileManager.default.attributesOfItem(atPath: url.path)[.modificationDate]) as? Date
                if let modified, modified < cutoff { try? FileManager.default.removeItem(at: url) }
            }
        }
    }

    static func write(_ data: Data, to url: URL) throws {
        let directory = url.deletingLastPathComponent()
        do { try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true) }
        catch { throw SyncError(.transportFailed, "cannot create \(directory.path) (read-only, or full?): \(error.localizedDescription)") }
        let temp = directory.appendingPathComponent(temporaryPrefix + UUID().uuidString)
        guard FileManager.default.createFile(atPath: temp.path, contents: nil) else {
            throw SyncError(.transportFailed, "cannot create \(temp.path) (permissions or disk full)")
        }
        do {
            let handle = try FileHandle(forWritingTo: temp)
            defer { try? handle.close() }
            try handle.write(contentsOf: data)
            try handle.synchronize()
        } catch {
            try? FileManager.default.removeItem(at: temp)
            throw SyncError(.transportFailed, "cannot write \(url.path): \(error)")
        }
        guard rename(temp.path, url.path) == 0 else {
            let reason = String(cString: strerror(errno))
            try? FileManager.default.removeItem(at: temp)
            throw SyncError(.transportFailed, "cannot move \(temp.lastPathComponent) to \(url.path): \(reason)")
        }
        let fd = open(directory.path, O_RDONLY)
        if fd >= 0 { fsync(fd); close(fd) }
    }
}

/// Runs the jobs of a task on one thread of its own, named for the OS, until ``finish()``:
/// the background sync's task, whose synchronous store work must not hold a thread of the
/// concurrency pool. Jobs run in the order they arrive.
final class DedicatedThreadExecutor: TaskExecutor, @unchecked Sendable {
    // `jobs` and `finished` are read and written under `condition`.
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var finished = false

    init(name: String) {
        startNamedThread(name, stackSize: 4 << 20) { [self] in run() }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    /// Ends the thread once the jobs queued so far have run.
    func finish() {
        condition.lock()
        finished = true
        condition.signal()
        condition.unlock()
    }

    private func run() {
        let executor = asUnownedTaskExecutor()
        while true {
            condition.lock()
            while jobs.isEmpty && !finished { condition.wait() }
            if jobs.isEmpty { condition.unlock(); return }
            let job = jobs.removeFirst()
            condition.unlock()
            job.runSynchronously(on: executor)
        }
    }
}
