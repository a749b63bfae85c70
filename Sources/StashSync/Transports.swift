import Foundation
import Stash

/// Something that carries deltas between stores.
///
/// A transport either talks to one peer (``DirectTransport``) or is a shared medium every
/// store of the family reads (``RelayTransport``, standing for a cloud container). A
/// transport that fails throws ``SyncError`` (`.transportFailed`): nothing is then marked
/// as sent, so the next sync ships the same changes.
public protocol SyncTransport: Sendable {
    /// The store at the other end, or nil for a shared medium.
    var peer: RecordID? { get }
    /// Delivers one delta durably, or throws.
    func deliver(_ data: Data, delta: Delta, from engine: SyncEngine) async throws
    /// Delivers one delta as ``deliver(_:delta:from:)`` does, and returns the records the
    /// peer deleted while merging it to settle unique-index clashes (``UniqueClash``), for
    /// the sender's ``SyncReport/uniqueClashesAtPeer``. A transport whose peer merges later
    /// (a shared medium) returns none: the peer reports them in its own fetch. Default:
    /// ``deliver(_:delta:from:)``, and none.
    func deliverReportingClashes(_ data: Data, delta: Delta, from engine: SyncEngine) async throws -> [UniqueClash]
    /// The deltas waiting for `engine`, in the order to apply them.
    func incoming(for engine: SyncEngine) async throws -> [IncomingDelta]
    /// True when a reader asked `engine` for a full snapshot (it found a gap).
    func fullSnapshotRequested(by engine: SyncEngine) async throws -> Bool
    /// Asks `source` for a full snapshot on its next send.
    func requestFullSnapshot(from source: RecordID, for engine: SyncEngine) async throws
    /// The name under which `engine` keeps how far its history reached this transport's
    /// other end (``PeerWatermark/site``): the peer's site, or for a shared medium a name of
    /// its own, so that two media are never taken for one. Default: the peer's site, or
    /// ``PeerWatermark/relaySite``.
    func watermarkSite(for engine: SyncEngine) async throws -> String
    /// The deltas of `engine`'s store that the other end holds parked (they cannot merge with
    /// its schema yet), each as `"name (why)"`, for ``SyncStatus/parkedAtPeer``; nil when the
    /// transport cannot tell. Default: nil.
    func parkedAtPeer(for engine: SyncEngine) async throws -> [String]?
    /// Whether `engine` should publish a checkpoint now (``publishCheckpoint(_:coverage:from:)``):
    /// the medium's policy. Default: false (a direct peer keeps no checkpoints).
    func checkpointDue(for engine: SyncEngine) async throws -> Bool
    /// Keeps `data`, a full snapshot of `engine`'s store holding each source's history through
    /// `coverage`, as the family's newest checkpoint, from which a new store restores, and
    /// which lets the medium drop the files it covers. Default: nothing (no checkpoints).
    func publishCheckpoint(_ data: Data, coverage: [RecordID: UInt64], from engine: SyncEngine) async throws
    /// Whether the other end holds the blob of `reference` (an ``ExternalData``'s bytes), so
    /// that `engine` need not send it. Default: true (a transport that carries no blobs has
    /// none to send; its receivers keep them pending).
    func hasBlob(_ reference: ExternalData, from engine: SyncEngine) async throws -> Bool
    /// Keeps `data`, the blob of `reference`, at the other end, durably. Default: nothing.
    func putBlob(_ data: Data, for reference: ExternalData, from engine: SyncEngine) async throws
    /// The blob of `reference` as the other end holds it, or nil when it lacks it (the engine
    /// checks the bytes against the reference before keeping them). Default: nil.
    func fetchBlob(_ reference: ExternalData, for engine: SyncEngine) async throws -> Data?
    /// Removes the blobs the medium keeps that nothing it holds references any more, older than
    /// `grace`; called after a checkpoint is published. Default: nothing (none removed).
    func collectBlobs(for engine: SyncEngine, olderThan grace: TimeInterval) async throws -> Int
}

extension SyncTransport {
    public func parkedAtPeer(for engine: SyncEngine) async throws -> [String]? { nil }
    public func checkpointDue(for engine: SyncEngine) async throws -> Bool { false }
    public func publishCheckpoint(_ data: Data, coverage: [RecordID: UInt64], from engine: SyncEngine) async throws {}
    public func hasBlob(_ reference: ExternalData, from engine: SyncEngine) async throws -> Bool { true }
    public func putBlob(_ data: Data, for reference: ExternalData, from engine: SyncEngine) async throws {}
    public func fetchBlob(_ reference: ExternalData, for engine: SyncEngine) async throws -> Data? { nil }
    public func collectBlobs(for engine: SyncEngine, olderThan grace: TimeInterval) async throws -> Int { 0 }

    public func watermarkSite(for engine: SyncEngine) async throws -> String { peer?.description ?? PeerWatermark.relaySite }

    public func deliverReportingClashes(_ data: Data, delta: Delta, from engine: SyncEngine) async throws -> [UniqueClash] {
        try await deliver(data, delta: delta, from: engine)
        return []
    }
}

/// One delta offered by a transport, with what to do once it is applied.
public struct IncomingDelta: Sendable {
    /// A name for messages and ``SyncReport`` that says where the delta came from: a relay
    /// file's path, `"delta from <site> (store <path>)"` for a direct peer's. Errors about the
    /// delta begin with it.
    public let name: String
    /// The site that exported the delta; a refused or parked delta holds back this source's
    /// later ones in the same fetch.
    public let source: RecordID
    /// The encoded delta (``Delta/encoded(key:)``), as ``SyncEngine/apply(_:name:)`` takes it.
    public let data: Data
    /// Why the delta cannot be read now (a relay file the process may not open, an I/O
    /// error), for one made with ``init(name:source:unreadable:)``; nil for a delta to apply.
    public let problem: String?
    /// For a checkpoint (the family's merged state as one store had it): how far of each
    /// source's history it holds. Applying it moves this store's watermark of each of those
    /// sources there, in the same transaction. Empty for a delta.
    public let coverage: [RecordID: UInt64]
    let onConsumed: @Sendable (ApplyOutcome) async throws -> Void

    /// A delta offered by a transport. `onConsumed` is called with the outcome (applied,
    /// duplicate, or parked: the store keeps a parked delta itself) once the store has made it
    /// durable: acknowledge the delta there. It is not called for a delta that was refused
    /// or found a gap, nor for the later deltas of its source that the fetch then skipped. An
    /// error it throws makes the fetch throw.
    public init(name: String, source: RecordID, data: Data, onConsumed: @escaping @Sendable (ApplyOutcome) async throws -> Void) {
        self.name = name
        self.source = source
        self.data = data
        problem = nil
        coverage = [:]
        self.onConsumed = onConsumed
    }

    /// A checkpoint: `data` is a full snapshot of `source`'s store, holding each source's
    /// history through `coverage` (see ``coverage``).
    public init(checkpoint name: String, source: RecordID, data: Data, coverage: [RecordID: UInt64],
                onConsumed: @escaping @Sendable (ApplyOutcome) async throws -> Void = { _ in }) {
        self.name = name
        self.source = source
        self.data = data
        problem = nil
        self.coverage = coverage
        self.onConsumed = onConsumed
    }

    /// A delta the transport holds but cannot read now. The fetch reports it (in
    /// ``SyncReport/refused`` and so in the status's last error) and holds back its source's
    /// later deltas behind it, as for a refused one; the transport offers it again at the next
    /// fetch. Without it the source's changes stopped arriving with no error anywhere.
    public init(name: String, source: RecordID, unreadable problem: String) {
        self.name = name
        self.source = source
        data = Data()
        self.problem = problem
        coverage = [:]
        onConsumed = { _ in }
    }

    func consumed(_ outcome: ApplyOutcome) async throws { try await onConsumed(outcome) }
}

/// Store to store on one machine: delivering imports straight into the other store;
/// fetching asks the other store for a delta and acknowledges it once applied.
///
/// A store that finds a gap (the other store's changes it lacks, e.g. after a delivery was
/// acknowledged but lost) notes in its own metadata that it wants a full snapshot of that
/// source; the next exchange between the two sends one, whichever side starts it.
public struct DirectTransport: SyncTransport {
    /// The engine of the other store.
    public let other: SyncEngine
    /// A transport to `other`, the engine of another store of the same family in this process.
    public init(to other: SyncEngine) { self.other = other }

    public var peer: RecordID? { other.site }

    /// Applies the delta in the other store (see ``deliverReportingClashes(_:delta:from:)``).
    public func deliver(_ data: Data, delta: Delta, from engine: SyncEngine) async throws {
        _ = try await deliverReportingClashes(data, delta: delta, from: engine)
    }

    /// Applies the delta in the other store, and returns the records the other store deleted
    /// to settle the unique-index clashes the merge made there: that store settles them inside
    /// this call, and reports them nowhere else. A parked outcome counts as delivered: the
    /// other store keeps the delta and applies it once its schema catches up.
    /// - Throws: `.gap` when the other store lacks changes before the delta; the next delivery
    ///   is then a full snapshot.
    public func deliverReportingClashes(_ data: Data, delta: Delta, from engine: SyncEngine) async throws -> [UniqueClash] {
        let outcome: ApplyOutcome
        do {
            outcome = try other.apply(data, name: Self.name(of: engine))
        } catch let error as SyncError where error.code == .gap {
            try await requestFullSnapshot(from: engine.site, for: other)
            throw error
        }
        if delta.isFullSnapshot { try Self.clearRequest(from: engine.site, in: other) }
        guard case .applied(_, _, let clashes) = outcome else { return [] }
        return clashes
    }

    /// How a delta from `engine`'s store is named in messages: its site and its store.
    static func name(of engine: SyncEngine) -> String { "delta from \(engine.site) (store \(engine.store.path))" }

    /// The other store's changes that `engine` has not received, as one delta (a full
    /// snapshot when `engine` asked for one; none when there is nothing); the other store
    /// records them as delivered once `engine` has applied or parked it.
    /// - Throws: `.disabled` when sync is off for the other store.
    public func incoming(for engine: SyncEngine) async throws -> [IncomingDelta] {
        guard other.isEnabled else {
            throw SyncError(.disabled, "sync is off for the peer store \(other.store.path)")
        }
        let requested = try Self.isRequested(from: other.site, in: engine)
        let delta = try other.makeDelta(for: engine.site, fullSnapshot: requested)
        if !delta.hasNews { return [] }
        let other = self.other
        return [IncomingDelta(name: Self.name(of: other), source: other.site, data: delta.encoded(key: other.key)) { _ in
            try other.acknowledge(peer: engine.site, through: delta.to)
            if delta.isFullSnapshot { try Self.clearRequest(from: other.site, in: engine) }
        }]
    }

    /// Whether `engine`'s changes should reach the other store as a full snapshot.
    public func fullSnapshotRequested(by engine: SyncEngine) async throws -> Bool {
        try Self.isRequested(from: engine.site, in: other)
    }

    /// The deltas of `engine`'s store that the other store holds parked, with why.
    public func parkedAtPeer(for engine: SyncEngine) async throws -> [String]? {
        SyncEngine.parkedReasons(of: other.store, from: engine.site)
    }

    /// Notes in `engine`'s store that it wants a full snapshot of `source`.
    public func requestFullSnapshot(from source: RecordID, for engine: SyncEngine) async throws {
        try engine.store.setMetadata([1], for: Self.requestKey(source))
    }

    static func requestKey(_ source: RecordID) -> String { "sync.direct.fullSnapshotWanted.\(source)" }

    private static func isRequested(from source: RecordID, in engine: SyncEngine) throws -> Bool {
        try engine.store.metadata(for: requestKey(source)) != nil
    }

    private static func clearRequest(from source: RecordID, in engine: SyncEngine) throws {
        if try isRequested(from: source, in: engine) { try engine.store.setMetadata(nil, for: requestKey(source)) }
    }
}

/// A shared directory standing for a cloud container. Each store writes its deltas into
/// `DIR/<site>/` atomically (temp file, fsync, rename), reads the other stores' folders in
/// range order, acknowledges what it applied in `DIR/<source>/acks/<site>`, and deletes its
/// own files once every known reader has acknowledged them.
public struct RelayTransport: SyncTransport {
    /// The shared directory. It must exist: the transport never creates it.
    public let directory: URL
    /// A simulated container quota in bytes: a delivery that would exceed it fails.
    public var quotaBytes: Int?
    /// How long a reader that stopped reading (a retired device, the site a restored copy
    /// left behind) keeps other stores' files from being deleted. After it, the files it has
    /// not read go like the rest, except each source's newest; should it come back, it finds
    /// a gap and asks for a full snapshot. Default 30 days.
    public var staleReaderAge: TimeInterval

    /// A transport through `directory` (every store of the family uses the same one). Nothing
    /// is read or checked here: a missing directory makes each send and fetch throw
    /// `.transportFailed`.
    public init(directory: URL, quotaBytes: Int? = nil, staleReaderAge: TimeInterval = 30 * 86_400) {
        self.directory = directory
        self.quotaBytes = quotaBytes
        self.staleReaderAge = staleReaderAge
    }

    public var peer: RecordID? { nil }

    /// The relay's own name for what each store sent to it: `relay.<id>`, the id kept in the
    /// directory (``identity()``). With one watermark for every relay directory (before), a
    /// store that synced through one directory sent nothing of those changes to a second.
    ///
    /// When this directory held another id before (re-created, or a conflict copy of its id
    /// file won), the watermark of that id goes: that relay would otherwise hold back every
    /// purge of history and keep the store's status pending for good.
    public func watermarkSite(for engine: SyncEngine) async throws -> String {
        let id = try identity()
        try engine.relayDirectory(directory.standardizedFileURL.path, holds: id)
        return PeerWatermark.relay(id)
    }

    /// The relay directory's id (the file `relay-id` in it, written by the first store that
    /// syncs through it). Two stores creating it at once agree: the file is linked into
    /// place only if absent. Should it change all the same (a conflict copy of a cloud
    /// container won), a store sends the new relay everything its readers may lack, once.
    /// - Throws: `.transportFailed` when the relay is unavailable or the id cannot be written.
    public func identity() throws -> RecordID {
        try checkAvailable()
        let url = directory.appendingPathComponent("relay-id")
        if let id = readIdentity(url) { return id }
        removeLeftoverTemporaryFiles(in: directory, alone: true)
        let written = Data(RecordID().description.utf8)
        let temporary = directory.appendingPathComponent(AtomicFile.temporaryPrefix + UUID().uuidString)
        try AtomicFile.write(written, to: temporary)
        defer { unlink(temporary.path) }
        if link(temporary.path, url.path) != 0 && errno != EEXIST {
            // A file system without hard links (FAT, exFAT, many SMB and FUSE mounts): created
            // only if absent all the same (O_EXCL), its few bytes written right after, which a
            // store reading it meanwhile waits for below.
            let reason = String(cString: strerror(errno))
            do {
                try written.write(to: url, options: .withoutOverwriting)
            } catch where !FileManager.default.fileExists(atPath: url.path) {
                throw SyncError(.transportFailed, "cannot write the id of relay \(directory.path) (\(url.path): \(reason); then: \(error)); changes stay pending")
            } catch {
                // Another store created it first.
            }
        }
        for attempt in 0..<50 {
            if let id = readIdentity(url) { return id }
            // Empty or short: another store is writing it (where hard links were missing).
            guard attempt < 49, ((try? Data(contentsOf: url))?.count ?? 0) < written.count else { break }
            usleep(10_000)
        }
        throw SyncError(.transportFailed, "relay \(directory.path) holds an id file that is not an id (\(url.path)); remove it, and every store sends the relay its changes again")
    }

    private func readIdentity(_ url: URL) -> RecordID? {
        (try? String(contentsOf: url, encoding: .utf8)).flatMap { RecordID(string: $0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    private func folder(_ site: RecordID) -> URL { directory.appendingPathComponent(site.description) }

    private func checkAvailable() throws {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory.path, isDirectory: &isDirectory), isDirectory.boolValue else {
            let what = FileManager.default.fileExists(atPath: directory.path) ? "a file, not a directory" : "no such directory"
            throw SyncError(.transportFailed, "relay \(directory.path) is unavailable (\(what)); changes stay pending")
        }
    }

    /// Writes the delta as `DIR/<site>/<from>-<to>[-full].delta` (temp file, fsync, rename),
    /// after deleting this store's files that no reader needs any more.
    /// - Throws: `.transportFailed` when the directory is missing, the write fails or would
    ///   exceed ``quotaBytes``; `.siteReused` when the relay holds history of this site past
    ///   the store's newest entry (a rolled-back or cloned store: it takes a new site at its
    ///   next open).
    public func deliver(_ data: Data, delta: Delta, from engine: SyncEngine) async throws {
        try checkAvailable()
        // History only grows: a file of this site past what the store holds now (read after
        // the file list, so that another process of this store syncing at the same time is
        // never mistaken) was written by the same site from a longer history: this store is a
        // rollback or a clone of it.
        // The readers' acknowledgements count too: they stay after the files they acknowledge
        // are cleaned up.
        let published = published(by: folder(engine.site))
        if published > delta.to {
            let current = try engine.store.read(isolation: #isolation) { try $0.historyBounds().current.sequence }
            if published > current {
                throw SyncError(.siteReused, "relay \(directory.path) holds history of site \(engine.site) up to \(published), but store \(engine.store.path) has only up to \(current): it was rolled back (a snapshot) or cloned, and another replica writes as the same site. It takes a new site at its next open; reopen it, then sync")
            }
        }
        // What every reader has acknowledged goes first: a relay over its quota drains (before,
        // the quota check threw first, and nothing was ever deleted again).
        try cleanUp(for: engine)
        // A family with a key seals what it leaves here: the relay sees the header it routes
        // by, and nothing of the records.
        let contents = try engine.familyKeys.map { keys in
            try RelayEnvelope(kind: .delta, family: engine.family, source: engine.site, from: delta.from, to: delta.to, payload: data).encoded(keys: keys)
        } ?? data
        try checkQuota(adding: contents.count)
        let name = String(format: "%020llu-%020llu%@.delta", delta.from, delta.to, delta.isFullSnapshot ? "-full" : "")
        // A full snapshot answers the requests there now: their requesters' acknowledgements
        // are lowered before it is written (so that no clean-up, of another process of this
        // store either, deletes it before they applied it), and the requests removed after.
        let answered = delta.isFullSnapshot ? keepForRequesters(delta, from: engine) : []
        try AtomicFile.write(contents, to: folder(engine.site).appendingPathComponent(name))
        let requests = folder(engine.site).appendingPathComponent("requests")
        for name in answered { try? FileManager.default.removeItem(at: requests.appendingPathComponent(name)) }
    }

    /// The requests for a full snapshot present now, by file name, each requester's
    /// acknowledgement lowered below `delta`, so that the clean-up keeps the snapshot until the
    /// requester has applied it. A requester may have received everything the snapshot covers
    /// (a type turned synced there, after this source's records of it were skipped): its
    /// acknowledgement would let the snapshot go at once. Requests written later stay for the
    /// next send.
    private func keepForRequesters(_ delta: Delta, from engine: SyncEngine) -> [String] {
        let requests = folder(engine.site).appendingPathComponent("requests")
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: requests.path)) ?? []).filter { !$0.hasPrefix(".") }
        for name in names where RecordID(string: name) != nil && delta.to > 0 {
            let ack = folder(engine.site).appendingPathComponent("acks").appendingPathComponent(name)
            if let acknowledged = readAcknowledgement(ack), acknowledged >= delta.to {
                try? AtomicFile.write(Data(String(delta.to - 1).utf8), to: ack)
            }
        }
        return names
    }

    /// How far a source's history has reached the relay: its newest file, or the newest
    /// acknowledgement of it (they stay after the files they acknowledge are cleaned up).
    private func published(by source: URL) -> UInt64 {
        let acks = ((try? FileManager.default.contentsOfDirectory(at: source.appendingPathComponent("acks"), includingPropertiesForKeys: nil)) ?? [])
            .compactMap(readAcknowledgement)
        return max(deltas(of: source).map(\.to).max() ?? 0, acks.max() ?? 0)
    }

    /// - Throws: `.transportFailed` when `bytes` more would pass ``quotaBytes``.
    private func checkQuota(adding bytes: Int) throws {
        guard let quotaBytes else { return }
        let used = usedBytes()
        guard used + bytes <= quotaBytes else {
            throw SyncError(.transportFailed, "relay \(directory.path) is over its quota (\(used) + \(bytes) > \(quotaBytes) bytes); changes stay pending")
        }
    }

    /// The bytes of the files on the relay (folders count for nothing, as in a cloud quota).
    private func usedBytes() -> Int {
        guard let walker = FileManager.default.enumerator(at: directory, includingPropertiesForKeys: [.fileSizeKey, .isRegularFileKey]) else { return 0 }
        var total = 0
        for case let url as URL in walker {
            guard let values = try? url.resourceValues(forKeys: [.fileSizeKey, .isRegularFileKey]), values.isRegularFile == true else { continue }
            total += values.fileSize ?? 0
        }
        return total
    }

    /// Delta files of `source`, parsed from their names, in range order.
    private func deltas(of source: URL) -> [(url: URL, from: UInt64, to: UInt64, full: Bool)] {
        let files = (try? FileManager.default.contentsOfDirectory(at: source, includingPropertiesForKeys: nil)) ?? []
        return files.compactMap { url in
            guard url.pathExtension == "delta", !url.lastPathComponent.hasPrefix(".") else { return nil }
            let parts = url.deletingPathExtension().lastPathComponent.split(separator: "-")
            guard parts.count == 2 || (parts.count == 3 && parts[2] == "full"),
                  let from = UInt64(parts[0]), let to = UInt64(parts[1]) else { return nil }
            return (url, from, to, parts.count == 3)
        }.sorted { ($0.from, $0.to) < ($1.from, $1.to) }
    }

    /// The other stores' files of this family that `engine` has not applied, source by source
    /// in range order (from a source's newest full snapshot that is new here, when there is
    /// one). Also registers the store as a reader (`DIR/<site>/seen`), deletes its own files
    /// every reader has acknowledged, and asks a source for a full snapshot when its files
    /// needed here are gone. Each file is acknowledged (`DIR/<source>/acks/<site>`) once
    /// applied, parked ones excepted. A file that cannot be read is offered as unreadable
    /// (``IncomingDelta/init(name:source:unreadable:)``) and holds back its source's later files.
    /// - Throws: `.transportFailed` when the directory is missing or the store's folder or
    ///   its notes cannot be written.
    public func incoming(for engine: SyncEngine) async throws -> [IncomingDelta] {
        try checkAvailable()
        // Make this store known as a reader, so sources keep files until it has read them, and
        // note when it last read (see `staleReaderAge`).
        do { try FileManager.default.createDirectory(at: folder(engine.site), withIntermediateDirectories: true) }
        catch { throw SyncError(.transportFailed, "cannot create \(folder(engine.site).path) in relay \(directory.path) (read-only, or full?): \(error.localizedDescription); changes stay pending") }
        try noteRead(by: engine)
        try cleanUp(for: engine)
        let sources: [URL]
        do { sources = try FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil) }
        catch { throw SyncError(.transportFailed, "cannot list relay \(directory.path) (gone or unreadable since it was checked): \(error.localizedDescription); changes stay pending") }
        var result: [IncomingDelta] = []
        let myself = engine.site.description
        let kept = checkpoints(of: engine.family)
        let covered = coverage(of: kept)
        if try restoresFromCheckpoints(engine, sources: sources, covered: covered) {
            result += try checkpointDeltas(kept, for: engine)
        }
        for sourceFolder in sources.sorted(by: { $0.lastPathComponent < $1.lastPathComponent }) {
            guard let source = RecordID(string: sourceFolder.lastPathComponent), source != engine.site else { continue }
            // A store of another family sharing the folder (its note says which): its files are
            // not for this store, neither pending nor refused. Read, each was refused at every
            // sync, which kept the store's last error set and `stash sync` exiting 1.
            if let note = readNote(sourceFolder.appendingPathComponent("seen")), note.family != engine.family { continue }
            let received = try engine.store.read(isolation: #isolation) { try PeerWatermark.load(source.description, in: $0) }.receivedThrough
            // This store waits for a full snapshot of the source (a type turned synced here):
            // one that covers what it has received is wanted too, and the source lowered this
            // store's acknowledgement to keep it until it is applied.
            let wantsFull = try engine.wantsFullSnapshot(from: source)
            // An acknowledgement lost after its delta was applied (a crash, a failed upload):
            // the file is never offered again, so it is written here, or the source keeps it.
            let ack = sourceFolder.appendingPathComponent("acks").appendingPathComponent(myself)
            if received > 0, !wantsFull, readAcknowledgement(ack) ?? 0 < received {
                try AtomicFile.write(Data(String(received).utf8), to: ack)
            }
            // Nothing of the source waits here any more (applied at a retry, or superseded): the
            // note that said so goes.
            let parkedNote = sourceFolder.appendingPathComponent("parked").appendingPathComponent(myself)
            if !engine.hasParkedDeltas(from: source), FileManager.default.fileExists(atPath: parkedNote.path) {
                try? FileManager.default.removeItem(at: parkedNote)
            }
            var files = deltas(of: sourceFolder)
            // The source published past what this store has, and the files are gone (read and
            // cleaned up before this store joined): nothing here would show the gap, and the
            // store would wait for the source's next write. Ask for a full snapshot.
            if !files.contains(where: { $0.to > received }), published(by: sourceFolder) > received, covered[source] ?? 0 <= received,
               (readNote(sourceFolder.appendingPathComponent("seen"))?.family ?? engine.family) == engine.family,
               !FileManager.default.fileExists(atPath: sourceFolder.appendingPathComponent("requests").appendingPathComponent(myself).path) {
                try await requestFullSnapshot(from: source, for: engine)
            }
            // A full snapshot newer than what we have makes the older files unnecessary.
            let full = files.last(where: { $0.full && ($0.to > received || wantsFull && $0.to == received) })
            // Still waiting, with no request there and no snapshot to apply (the request was
            // lost, or answered by a snapshot since deleted): ask again. Not while one of the
            // source's deltas is parked here: the answer would be parked too.
            if wantsFull, full == nil, !engine.hasParkedDeltas(from: source),
               !FileManager.default.fileExists(atPath: sourceFolder.appendingPathComponent("requests").appendingPathComponent(myself).path) {
                try await requestFullSnapshot(from: source, for: engine)
            }
            if let full { files = files.filter { $0.to > full.to || $0.url == full.url } }
            for file in files where file.to > received || file.url == full?.url {
                // A file that cannot be read holds back only its source's files, until the next
                // fetch: one gone since the listing (its source cleaned it up) silently, any
                // other failure reported, or the source's changes would stop with no word.
                let data: Data
                do {
                    data = try Self.contents(of: Data(contentsOf: file.url), name: file.url.path, source: source, range: (file.from, file.to), engine: engine)
                } catch let error as SyncError {
                    // Moved, replayed, changed or cut short by the relay, or not of this family's
                    // writers: refused, and its source's later files wait behind it.
                    result.append(IncomingDelta(name: file.url.path, source: source, unreadable: error.message))
                    break
                } catch {
                    if FileManager.default.fileExists(atPath: file.url.path) {
                        result.append(IncomingDelta(name: file.url.path, source: source,
                                                    unreadable: "cannot read it: \(error.localizedDescription); it is read again at the next fetch"))
                    }
                    break
                }
                let ackDirectory = sourceFolder.appendingPathComponent("acks")
                let to = file.to
                // Named by its path: the relay directory and the source's folder say where it
                // came from, in every message about it.
                let parkedNote = sourceFolder.appendingPathComponent("parked").appendingPathComponent(myself)
                result.append(IncomingDelta(name: file.url.path, source: source, data: data) { outcome in
                    // What a reader parks, it says beside the source's files: the source's
                    // status then names it (``parkedAtPeer(for:)``).
                    if case .parked(let reason) = outcome {
                        let text = Data("\((file.url.lastPathComponent)) (\(reason))".utf8)
                        // Sealed for a family with a key: a reason names types and fields.
                        let note = (try? engine.familyKeys.map { keys in
                            try RelayEnvelope(kind: .note, family: engine.family, source: engine.site, from: 0, to: 0, payload: text).encoded(keys: keys)
                        }) ?? text
                        try? AtomicFile.write(note, to: parkedNote)
                        return
                    }
                    try AtomicFile.write(Data(String(to).utf8), to: ackDirectory.appendingPathComponent(myself))
                })
            }
        }
        return result
    }

    /// Whether `engine` should apply the checkpoints before the files: it has received nothing
    /// through the relay yet (a new device: the checkpoints hold the family's data), or a
    /// source's files it needs are gone (the clean-up dropped what a checkpoint holds).
    private func restoresFromCheckpoints(_ engine: SyncEngine, sources: [URL], covered: [RecordID: UInt64]) throws -> Bool {
        guard !covered.isEmpty else { return false }
        var receivedAnything = false
        for sourceFolder in sources {
            guard let source = RecordID(string: sourceFolder.lastPathComponent), source != engine.site else { continue }
            if let note = readNote(sourceFolder.appendingPathComponent("seen")), note.family != engine.family { continue }
            let received = try engine.store.read { try PeerWatermark.load(source.description, in: $0) }.receivedThrough
            if received > 0 { receivedAnything = true }
            guard covered[source] ?? 0 > received else { continue }
            let needed = deltas(of: sourceFolder).filter { $0.to > received }
            if let first = needed.first, first.from <= received + 1 || first.full { continue }
            if needed.isEmpty && published(by: sourceFolder) <= received { continue }
            return true
        }
        return !receivedAnything && covered.contains { $0.key != engine.site && $0.value > 0 }
    }

    /// The kept checkpoints as deltas to apply (each opened and checked against its name), in
    /// order of how much they hold; one that does not open is offered as unreadable.
    private func checkpointDeltas(_ kept: [CheckpointFile], for engine: SyncEngine) throws -> [IncomingDelta] {
        kept.map { checkpoint in
            do {
                return try Self.checkpointDelta(Data(contentsOf: checkpoint.url), name: checkpoint.url.path, maker: checkpoint.maker,
                                                to: checkpoint.to, coverage: checkpoint.coverage, engine: engine)
            } catch let error as SyncError {
                return IncomingDelta(name: checkpoint.url.path, source: checkpoint.maker, unreadable: error.message)
            } catch {
                return IncomingDelta(name: checkpoint.url.path, source: checkpoint.maker,
                                     unreadable: "cannot read it: \(error.localizedDescription); it is read again at the next fetch")
            }
        }
    }

    /// The checkpoint a relay holds as `data`, opened with the family's key and checked against
    /// where the relay lists it (its maker, `to` and coverage), as a delta to apply. (Shared with
    /// ``HTTPRelayTransport``: `name` says where it came from.)
    /// - Throws: ``SyncError`` (`.corruptDelta` for a checkpoint the relay moved or changed).
    static func checkpointDelta(_ data: Data, name: String, maker: RecordID, to: UInt64, coverage: [RecordID: UInt64],
                                engine: SyncEngine) throws -> IncomingDelta {
        let envelope = try RelayEnvelope(decoding: data, keys: engine.familyKeys, name: name)
        guard envelope.kind == .checkpoint, envelope.family == engine.family, envelope.source == maker,
              envelope.to == to, envelope.coverage == coverage else {
            throw SyncError(.corruptDelta, "\(name) holds another checkpoint than its name says (of \(envelope.source), through \(envelope.to)): the relay moved or changed it; it was not applied")
        }
        return IncomingDelta(checkpoint: name, source: maker, data: envelope.payload, coverage: envelope.coverage)
    }

    /// The delta a relay file holds, checked against its place: an envelope (a sealed one
    /// opened with the family's key) must name this family, the folder's source and the file
    /// name's range; so must a bare delta's own header (it is what the source wrote: its
    /// checksum, and its HMAC when the family has a key, are checked when it applies).
    /// - Throws: ``SyncError`` (`.corruptDelta` for a file moved, replayed or changed by the
    ///   relay, `.unauthenticated` for one that does not open with the family's key).
    /// (Shared with ``HTTPRelayTransport``: `name` says where the file came from.)
    static func contents(of data: Data, name: String, source: RecordID, range: (from: UInt64, to: UInt64), engine: SyncEngine) throws -> Data {
        func misplaced(_ what: String) -> SyncError {
            SyncError(.corruptDelta, "\(name) holds \(what), not what its place in the relay says (source \(source), history \(range.from)...\(range.to), family \(engine.family)): the relay moved, replayed or changed it; it was not applied")
        }
        if RelayEnvelope.isEnvelope(data) {
            let envelope = try RelayEnvelope(decoding: data, keys: engine.familyKeys, name: name)
            guard envelope.kind == .delta, envelope.family == engine.family, envelope.source == source,
                  envelope.from == range.from, envelope.to == range.to else {
                throw misplaced("the \(envelope.kind) of source \(envelope.source), history \(envelope.from)...\(envelope.to), family \(envelope.family)")
            }
            return envelope.payload
        }
        // A bare delta: a family without a key, or a library from before envelopes.
        let bytes = [UInt8](data.prefix(Delta.headerSize))
        guard bytes.count == Delta.headerSize, Array(bytes[0..<4]) == Delta.magic else { return data }   // the reader says what is wrong
        let header = (source: RecordID(bytes: bytes[6..<22]), family: RecordID(bytes: bytes[22..<38]),
                      from: bytes[70..<78].reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) },
                      to: bytes[78..<86].reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) })
        guard header.source == source, header.family == engine.family, header.from == range.from, header.to == range.to else {
            throw misplaced("a delta of source \(header.source.map(\.description) ?? "?"), history \(header.from)...\(header.to)")
        }
        return data
    }

    // MARK: Checkpoints

    /// Where checkpoints are kept: `DIR/checkpoints/<site>-<to>.checkpoint`.
    private var checkpointFolder: URL { directory.appendingPathComponent("checkpoints") }

    /// A checkpoint on the relay, from its name and header (not checked: enough to decide what
    /// it covers; it is opened with the family's key before anything of it applies).
    public struct CheckpointFile: Sendable {
        /// The file (`DIR/checkpoints/<site>-<to>.checkpoint`).
        public let url: URL
        /// The store that published it.
        public let maker: RecordID
        /// How far of its maker's own history it holds.
        public let to: UInt64
        /// The family it belongs to.
        public let family: RecordID
        /// How far of each source's history it holds (its maker's included).
        public let coverage: [RecordID: UInt64]
        /// Its size on the relay.
        public let bytes: Int
    }

    /// The checkpoints on the relay of `family` that no other one covers entirely, in order of
    /// how much they cover (usually one: the newest). O(checkpoints).
    public func checkpoints(of family: RecordID) -> [CheckpointFile] { checkpoints(of: family, pruning: false) }

    /// ``checkpoints(of:)``; `pruning`: removes those another covers.
    func checkpoints(of family: RecordID, pruning: Bool) -> [CheckpointFile] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: checkpointFolder.path)) ?? []
        var found: [CheckpointFile] = []
        for name in names where name.hasSuffix(".checkpoint") && !name.hasPrefix(".") {
            let parts = name.dropLast(".checkpoint".count).split(separator: "-", maxSplits: 5)
            guard parts.count == 6, let maker = RecordID(string: parts[0...4].joined(separator: "-")), let to = UInt64(parts[5]) else { continue }
            let url = checkpointFolder.appendingPathComponent(name)
            guard let header = RelayEnvelope.header(of: url), header.kind == .checkpoint, header.source == maker, header.to == to else { continue }
            guard header.family == family else { continue }
            found.append(CheckpointFile(url: url, maker: maker, to: to, family: header.family, coverage: header.coverage, bytes: fileSize(url)))
        }
        func covers(_ a: CheckpointFile, _ b: CheckpointFile) -> Bool {
            b.coverage.allSatisfy { (a.coverage[$0.key] ?? 0) >= $0.value }
        }
        // Those another covers (entirely, and more, or the same with a later name) go.
        var kept: [CheckpointFile] = []
        for candidate in found.sorted(by: { $0.url.lastPathComponent < $1.url.lastPathComponent }) {
            let dominated = found.contains { other in
                other.url != candidate.url && covers(other, candidate)
                    && (!covers(candidate, other) || other.url.lastPathComponent > candidate.url.lastPathComponent)
            }
            if dominated {
                if pruning { try? FileManager.default.removeItem(at: candidate.url) }
            } else {
                kept.append(candidate)
            }
        }
        return kept.sorted { $0.coverage.values.reduce(0, &+) < $1.coverage.values.reduce(0, &+) }
    }

    /// For each source, how far the kept checkpoints hold its history.
    private func coverage(of checkpoints: [CheckpointFile]) -> [RecordID: UInt64] {
        var result: [RecordID: UInt64] = [:]
        for checkpoint in checkpoints {
            for (site, through) in checkpoint.coverage { result[site] = max(result[site] ?? 0, through) }
        }
        return result
    }

    /// Delta files no checkpoint covers at least this many make a checkpoint due.
    public static let checkpointEveryFiles = 64
    /// Bytes of files no checkpoint covers that never make a checkpoint due by themselves.
    public static let checkpointMinimumBytes = 64 << 10

    /// A checkpoint is due when the files of the family that no checkpoint covers number
    /// ``checkpointEveryFiles``, or, at least 4 of them, outweigh both the newest checkpoint
    /// and ``checkpointMinimumBytes``: then a checkpoint (about the size of the family's data)
    /// lets the clean-up drop them, so the relay keeps about twice the family's data at most.
    public func checkpointDue(for engine: SyncEngine) async throws -> Bool {
        try checkAvailable()
        let kept = checkpoints(of: engine.family)
        let covered = coverage(of: kept)
        var files = 0, bytes = 0
        for sourceFolder in (try? FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)) ?? [] {
            guard let source = RecordID(string: sourceFolder.lastPathComponent) else { continue }
            if source != engine.site, let note = readNote(sourceFolder.appendingPathComponent("seen")), note.family != engine.family { continue }
            for file in deltas(of: sourceFolder) where file.to > covered[source] ?? 0 {
                files += 1
                bytes += fileSize(file.url)
            }
        }
        return files >= Self.checkpointEveryFiles
            || (files >= Self.compactionMinimumFiles && bytes > max(kept.map(\.bytes).max() ?? 0, Self.checkpointMinimumBytes))
    }

    /// Writes `data` as `DIR/checkpoints/<site>-<to>.checkpoint` (sealed for a family with a
    /// key; temp file, fsync, rename), then removes the checkpoints it covers entirely.
    public func publishCheckpoint(_ data: Data, coverage: [RecordID: UInt64], from engine: SyncEngine) async throws {
        try checkAvailable()
        let to = coverage[engine.site] ?? 0
        let envelope = RelayEnvelope(kind: .checkpoint, family: engine.family, source: engine.site, from: 1, to: to, coverage: coverage, payload: data)
        let contents = try envelope.encoded(keys: engine.familyKeys)
        try checkQuota(adding: contents.count)
        let name = String(format: "%@-%020llu.checkpoint", engine.site.description, to)
        try AtomicFile.write(contents, to: checkpointFolder.appendingPathComponent(name))
        AtomicFile.removeLeftovers(in: [checkpointFolder])
        _ = checkpoints(of: engine.family, pruning: true)
    }

    /// What the readers of the relay hold parked of `engine`'s deltas (each reader notes it in
    /// `DIR/<site>/parked/<reader>` when it parks, and removes it once nothing of the source
    /// waits there), each as `"reader <site>: name (why)"`.
    public func parkedAtPeer(for engine: SyncEngine) async throws -> [String]? {
        let notes = folder(engine.site).appendingPathComponent("parked")
        let readers = ((try? FileManager.default.contentsOfDirectory(atPath: notes.path)) ?? []).filter { RecordID(string: $0) != nil }.sorted()
        return readers.compactMap { reader in
            let url = notes.appendingPathComponent(reader)
            guard var data = try? Data(contentsOf: url) else { return nil }
            if RelayEnvelope.isEnvelope(data) {
                guard let note = try? RelayEnvelope(decoding: data, keys: engine.familyKeys, name: url.path), note.kind == .note else {
                    return "reader \(reader): a delta is parked there (its note does not open with this store's key)"
                }
                data = note.payload
            }
            return "reader \(reader): \(String(decoding: data, as: UTF8.self))"
        }
    }

    /// True when a reader asked for a full snapshot.
    public func fullSnapshotRequested(by engine: SyncEngine) async throws -> Bool {
        let requests = folder(engine.site).appendingPathComponent("requests")
        return ((try? FileManager.default.contentsOfDirectory(atPath: requests.path)) ?? []).contains(where: { !$0.hasPrefix(".") })
    }

    /// Files a store keeps after the last checkpoint before one is due, at least (unless
    /// they number ``checkpointEveryFiles``).
    static let compactionMinimumFiles = 4

    private func fileSize(_ url: URL) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: url.path))?[.size] as? NSNumber)?.intValue ?? 0
    }

    /// Leaves a request in `source`'s folder, unless one is there already. Nothing is written
    /// for a source that never published on this relay (it would not answer, and its folder
    /// would count as a reader that never acknowledges, holding back every clean-up), nor when
    /// the relay is unavailable (the request would recreate its directory locally).
    public func requestFullSnapshot(from source: RecordID, for engine: SyncEngine) async throws {
        try checkAvailable()
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: folder(source).path, isDirectory: &isDirectory), isDirectory.boolValue else { return }
        let request = folder(source).appendingPathComponent("requests").appendingPathComponent(engine.site.description)
        if FileManager.default.fileExists(atPath: request.path) { return }
        try AtomicFile.write(Data(), to: request)
    }

    /// Notes that `engine`'s store reads the relay, and for which family (`DIR/<site>/seen`:
    /// time and family id). Rewritten only once the note is a thirtieth of `staleReaderAge`
    /// old, so that a store syncing every few seconds does not upload a file each time.
    private func noteRead(by engine: SyncEngine) throws {
        let url = folder(engine.site).appendingPathComponent("seen")
        let now = engine.store.clock().timeIntervalSince1970
        if let note = readNote(url), note.family == engine.family, now - note.time < staleReaderAge / 30, note.time <= now { return }
        // Through AtomicFile: its temporary file is one the clean-up knows.
        try AtomicFile.write(Data("\(now) \(engine.family)".utf8), to: url)
    }

    private func readNote(_ url: URL) -> (time: TimeInterval, family: RecordID?)? {
        guard let text = try? String(contentsOf: url, encoding: .utf8) else { return nil }
        let parts = text.split(separator: " ")
        guard let time = parts.first.flatMap({ Double($0) }) else { return nil }
        return (time, parts.count > 1 ? RecordID(string: String(parts[1])) : nil)
    }

    /// Deletes this store's delta files that a checkpoint holds (``checkpoints(of:pruning:)``:
    /// a store that restores from the relay starts there) and every reader has acknowledged,
    /// leaving out readers of another family and readers silent for longer than
    /// `staleReaderAge`; the newest file stays when a silent reader was left out, so that it
    /// finds the gap when it comes back (and the checkpoint that fills it).
    private func cleanUp(for engine: SyncEngine) throws {
        let mine = folder(engine.site)
        removeLeftoverTemporaryFiles(in: mine)
        let covered = coverage(of: checkpoints(of: engine.family))[engine.site] ?? 0
        guard covered > 0 else { return }
        let readers = readers(of: engine)
        let acknowledged = readers.counted == 0 ? UInt64.max : readers.acknowledged
        let files = deltas(of: mine)
        let newest = files.max { $0.to < $1.to }?.url
        for file in files where file.to <= covered && file.to <= acknowledged && !(readers.staleBehind && file.url == newest) {
            try? FileManager.default.removeItem(at: file.url)
        }
    }

    /// The readers of `engine`'s files: how many count (of its family, heard from within
    /// `staleReaderAge`), the least of their acknowledgements (`UInt64.max` with none), and
    /// whether a silent reader was left out.
    private func readers(of engine: SyncEngine) -> (counted: Int, acknowledged: UInt64, staleBehind: Bool) {
        let mine = folder(engine.site)
        let readers = ((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? [])
            .filter { RecordID(string: $0) != nil && $0 != engine.site.description }
        let now = engine.store.clock().timeIntervalSince1970
        var acknowledged = UInt64.max
        var counted = 0
        var staleBehind = false
        for reader in readers {
            let note = readNote(directory.appendingPathComponent(reader).appendingPathComponent("seen"))
            if let family = note?.family, family != engine.family { continue }
            if now - (note?.time ?? lastChange(of: reader)) > staleReaderAge {
                staleBehind = true
                continue
            }
            let ack = mine.appendingPathComponent("acks").appendingPathComponent(reader)
            acknowledged = min(acknowledged, readAcknowledgement(ack) ?? 0)
            counted += 1
        }
        return (counted, acknowledged, staleBehind)
    }

    /// Removes the temporary files of writes killed before their rename (``AtomicFile``) from
    /// this store's folder, its `acks` and `requests` (they count against the quota, and one in
    /// `requests` looked like a request), or from `folder` `alone` (the relay's root, where the
    /// id file is written). Only files an hour old: a write of a large snapshot to a slow
    /// container may still be under way.
    private func removeLeftoverTemporaryFiles(in folder: URL, alone: Bool = false) {
        AtomicFile.removeLeftovers(in: alone ? [folder] : [folder, folder.appendingPathComponent("acks"), folder.appendingPathComponent("requests")])
    }

    /// The sequence an acknowledgement file (`DIR/<source>/acks/<reader>`) holds, or nil.
    private func readAcknowledgement(_ url: URL) -> UInt64? {
        (try? String(contentsOf: url, encoding: .utf8)).flatMap { UInt64($0) }
    }

    /// The last change of `reader`'s folder: when a reader of a library before the `seen`
    /// note last wrote there.
    private func lastChange(of reader: String) -> TimeInterval {
        let changed = (try? FileManager.default.attributesOfItem(atPath: directory.appendingPathComponent(reader).path)[.modificationDate]) as? Date
        return changed?.timeIntervalSince1970 ?? 0
    }
}
