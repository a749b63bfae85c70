import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Stash
import Synchronization

/// A relay server (`stash-relay serve`, the `RelayService` package) as a transport: the
/// family's home over the network, with the rules of a relay directory (``RelayTransport``:
/// checkpoints, acknowledgements, full-snapshot requests, parked notes, clean-up, stale
/// readers), the server holding them in PostgreSQL for any number of devices.
///
/// ```swift
/// let server = HTTPRelayTransport(server: URL(string: "https://relay.example.com")!)
/// try await engine.sync(via: server)
/// var position = try await server.changes(for: engine, after: 0, wait: .seconds(30))   // a long-poll
/// ```
///
/// Only a family with a sync key syncs through a server: the server sees the header it routes
/// by (family, source, history range, size) and sealed bytes, and a device shows it a token
/// derived from the family key (``FamilyKeys/relayToken``), of which it keeps only a hash.
///
/// Every request is retried with exponential backoff and jitter while the server or its
/// database is unreachable or restarting (connection refused or lost, 502, 503, 504) or asks
/// to slow down (429, after its Retry-After), for up to ``RetryPolicy/giveUpAfter``; then
/// the call throws `.transportFailed` and, as with every transport, nothing is marked sent:
/// the next sync resumes. Each request is idempotent (the server stores a delta of one source
/// and range once), so a retry after a lost answer changes nothing.
///
/// Uses Foundation's `URLSession` (FoundationNetworking on Linux): no dependency beyond the
/// library's.
public struct HTTPRelayTransport: SyncTransport {
    /// The server's base URL (`http://127.0.0.1:8080`); the API is under `/v1/`.
    public let server: URL
    /// How requests are retried.
    public var retry: RetryPolicy
    /// How long a request may wait for the server's next bytes before it counts as failed (and
    /// is retried). A long-poll waits this much longer than its `wait`.
    public var requestTimeout: TimeInterval

    let session: URLSession
    private let relayIDs = RelayIDs()

    /// When a request that failed is tried again.
    public struct RetryPolicy: Sendable {
        /// The first wait; each retry waits twice as long, up to ``maximumDelay``.
        public var initialDelay: Duration
        public var maximumDelay: Duration
        /// No retry starts after this long since the first attempt: the call throws.
        public var giveUpAfter: Duration

        public init(initialDelay: Duration = .milliseconds(100), maximumDelay: Duration = .seconds(2),
                    giveUpAfter: Duration = .seconds(30)) {
            self.initialDelay = initialDelay
            self.maximumDelay = maximumDelay
            self.giveUpAfter = giveUpAfter
        }

        /// The wait before retry `attempt` (0 first): exponential, capped, with jitter (between
        /// half of it and all of it), so that devices cut off together do not come back together.
        func delay(attempt: Int) -> Duration {
            let exponential = initialDelay * (1 << min(attempt, 20))
            let capped = min(exponential, maximumDelay)
            return capped * Double.random(in: 0.5...1.0)
        }
    }

    /// A transport to the relay server at `server` (every device of the family uses the same
    /// one). Nothing is sent here. `session`: nil makes one for this transport.
    public init(server: URL, retry: RetryPolicy = RetryPolicy(), requestTimeout: TimeInterval = 30, session: URLSession? = nil) {
        self.server = server
        self.retry = retry
        self.requestTimeout = requestTimeout
        if let session {
            self.session = session
        } else {
            let configuration = URLSessionConfiguration.ephemeral
            configuration.httpMaximumConnectionsPerHost = 8
            configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
            configuration.urlCache = nil
            self.session = URLSession(configuration: configuration)
        }
    }

    public var peer: RecordID? { nil }

    /// The relay ids seen per family (one request per transport and family).
    private final class RelayIDs: Sendable {
        let ids = Mutex<[RecordID: RecordID]>([:])
    }

    // MARK: Identity

    /// `relay.<id>`: the server's id for the family (kept in its database), so that a store
    /// syncing through the server and through a relay directory sends each everything. A
    /// family whose id changed (its database was re-created) gets everything again, once.
    public func watermarkSite(for engine: SyncEngine) async throws -> String {
        let id = try await identity(for: engine)
        try engine.relayDirectory("server " + server.absoluteString, holds: id)
        return PeerWatermark.relay(id)
    }

    /// The server's relay id for `engine`'s family (registering the family at its first
    /// request: from then on only its token opens it).
    public func identity(for engine: SyncEngine) async throws -> RecordID {
        if let known = relayIDs.ids.withLock({ $0[engine.family] }) { return known }
        let (data, _) = try await send("GET", "", for: engine, expecting: [200])
        struct Answer: Decodable { let relay: String }
        guard let answer = try? JSONDecoder().decode(Answer.self, from: data), let id = RecordID(string: answer.relay) else {
            throw SyncError(.transportFailed, "relay server \(server.absoluteString) answered no relay id (\(Self.excerpt(data))); is it a stash-relay server?")
        }
        relayIDs.ids.withLock { $0[engine.family] = id }
        return id
    }

    // MARK: Sending

    /// Uploads the delta (sealed with the family's key) to the server, which stores it once
    /// however often it arrives, after deleting this store's files no reader needs any more.
    /// - Throws: `.transportFailed` when the server cannot be reached for ``RetryPolicy/giveUpAfter``
    ///   or refuses the body (413: larger than it takes); `.siteReused` when the server holds
    ///   history of this site past the store's newest entry (a rolled-back or cloned store);
    ///   `.unauthenticated` when the server refuses the family's token.
    public func deliver(_ data: Data, delta: Delta, from engine: SyncEngine) async throws {
        let keys = try familyKeys(engine)
        let body = try RelayEnvelope(kind: .delta, family: engine.family, source: engine.site, from: delta.from, to: delta.to, payload: data)
            .encoded(keys: keys)
        // The store's newest entry, read again when the server holds more of this site's
        // history (another process of this store may have sent it meanwhile).
        for attempt in 0..<2 {
            let current = try engine.store.read(isolation: #isolation) { try $0.historyBounds().current.sequence }
            let path = "/sites/\(engine.site)/deltas?from=\(delta.from)&to=\(delta.to)&full=\(delta.isFullSnapshot ? 1 : 0)&current=\(current)"
            let (answer, status) = try await send("POST", path, body: body, for: engine, expecting: [200, 201, 409])
            if status != 409 { return }
            struct Conflict: Decodable { let published: UInt64 }
            let published = (try? JSONDecoder().decode(Conflict.self, from: answer))?.published ?? 0
            let now = try engine.store.read(isolation: #isolation) { try $0.historyBounds().current.sequence }
            if attempt == 0, now >= published { continue }
            throw SyncError(.siteReused, "relay server \(server.absoluteString) holds history of site \(engine.site) up to \(published), but store \(engine.store.path) has only up to \(now): it was rolled back (a snapshot) or cloned, and another replica writes as the same site. It takes a new site at its next open; reopen it, then sync")
        }
    }

    /// True when a reader asked this store for a full snapshot.
    public func fullSnapshotRequested(by engine: SyncEngine) async throws -> Bool {
        let (data, _) = try await send("GET", "/sites/\(engine.site)/requests", for: engine, expecting: [200])
        return !((try? JSONDecoder().decode([String].self, from: data)) ?? []).isEmpty
    }

    /// Asks `source` for a full snapshot on its next send. Nothing is left for a source that
    /// never wrote or read on the server (it would never answer).
    public func requestFullSnapshot(from source: RecordID, for engine: SyncEngine) async throws {
        _ = try await send("PUT", "/sites/\(source)/requests/\(engine.site)", for: engine, expecting: [204, 404])
    }

    // MARK: Checkpoints

    /// Whether a checkpoint is due, by the directory relay's rule (the server counts the
    /// family's files no checkpoint covers: 64, or at least 4 outweighing both the newest
    /// checkpoint and 64 KiB).
    public func checkpointDue(for engine: SyncEngine) async throws -> Bool {
        let (data, _) = try await send("GET", "/checkpoint-due", for: engine, expecting: [200])
        struct Answer: Decodable { let due: Bool }
        return (try? JSONDecoder().decode(Answer.self, from: data))?.due ?? false
    }

    /// Uploads `data` as the family's newest checkpoint (sealed); the server then removes the
    /// checkpoints it covers entirely.
    public func publishCheckpoint(_ data: Data, coverage: [RecordID: UInt64], from engine: SyncEngine) async throws {
        let keys = try familyKeys(engine)
        let to = coverage[engine.site] ?? 0
        let body = try RelayEnvelope(kind: .checkpoint, family: engine.family, source: engine.site, from: 1, to: to, coverage: coverage, payload: data)
            .encoded(keys: keys)
        _ = try await send("PUT", "/checkpoints/\(engine.site)/\(to)", body: body, for: engine, expecting: [201])
    }

    // MARK: Notes

    /// What readers hold parked of `engine`'s deltas, each as `"reader <site>: name (why)"`.
    public func parkedAtPeer(for engine: SyncEngine) async throws -> [String]? {
        let (data, _) = try await send("GET", "/sites/\(engine.site)/parked", for: engine, expecting: [200])
        var notes: [String] = []
        var offset = 0
        let bytes = [UInt8](data)
        while offset + 20 <= bytes.count {
            let reader = RecordID(bytes: bytes[offset..<offset + 16])?.description ?? "?"
            let length = Int(bytes[offset + 16..<offset + 20].reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
            offset += 20
            guard offset + length <= bytes.count else { break }
            let note = Data(bytes[offset..<offset + length])
            offset += length
            guard let opened = try? RelayEnvelope(decoding: note, keys: engine.familyKeys, name: "parked note of \(reader)"), opened.kind == .note else {
                notes.append("reader \(reader): a delta is parked there (its note does not open with this store's key)")
                continue
            }
            notes.append("reader \(reader): \(String(decoding: opened.payload, as: UTF8.self))")
        }
        return notes
    }

    // MARK: Fetching

    /// What the server says about the family, for one reader (`GET state`).
    struct State: Decodable {
        let relay: String
        let head: Int64
        let sources: [Source]
        let checkpoints: [Checkpoint]

        struct Source: Decodable {
            let site: String
            let published: UInt64
            let ack: UInt64?
            let requested: Bool
            let parkedNote: Bool
            let files: [File]
        }

        struct File: Decodable {
            let position: Int64
            let from: UInt64
            let to: UInt64
            let full: Bool
            let size: Int

            init(from decoder: any Decoder) throws {
                var fields = try decoder.unkeyedContainer()
                position = try fields.decode(Int64.self)
                from = try fields.decode(UInt64.self)
                to = try fields.decode(UInt64.self)
                full = try fields.decode(Bool.self)
                size = try fields.decode(Int.self)
            }
        }

        struct Checkpoint: Decodable {
            let maker: String
            let through: UInt64
            let coverage: [String: UInt64]
            let size: Int
        }
    }

    /// The other stores' deltas that `engine` has not applied, source by source in range order
    /// (from a source's newest full snapshot that is new here), after the family's
    /// checkpoints when the store restores from them: the decisions of
    /// ``RelayTransport/incoming(for:)``, on the server's listing. The server notes the store
    /// as a reader and deletes its own files every reader has; this store asks a source for a
    /// full snapshot when its files needed here are gone, repairs a lost acknowledgement, and
    /// acknowledges each delta once applied (parked ones excepted: it leaves a note instead).
    /// A file the relay changed, moved or replayed is offered as unreadable and holds back its
    /// source's later files.
    /// - Throws: `.transportFailed` when the server cannot be reached.
    public func incoming(for engine: SyncEngine) async throws -> [IncomingDelta] {
        _ = try familyKeys(engine)
        let (data, _) = try await send("GET", "/state?reader=\(engine.site)", for: engine, expecting: [200])
        let state: State
        do { state = try JSONDecoder().decode(State.self, from: data) }
        catch { throw SyncError(.transportFailed, "relay server \(server.absoluteString) answered a state this library cannot read (\(error)); upgrade Stash or the server") }
        if let id = RecordID(string: state.relay) { relayIDs.ids.withLock { $0[engine.family] = id } }
        try noteHead(state.head, for: engine)
        var covered: [RecordID: UInt64] = [:]
        for checkpoint in state.checkpoints {
            for (site, through) in checkpoint.coverage {
                guard let site = RecordID(string: site) else { continue }
                covered[site] = max(covered[site] ?? 0, through)
            }
        }
        let sources = state.sources.compactMap { source in RecordID(string: source.site).map { ($0, source) } }
            .filter { $0.0 != engine.site }
        var result: [IncomingDelta] = []
        if try restoresFromCheckpoints(engine, sources: sources, covered: covered) {
            result += await checkpointDeltas(state.checkpoints, for: engine)
        }
        // Per source, the files to offer, decided as a relay directory's reader does.
        var wanted: [(source: RecordID, files: [State.File], requested: Bool)] = []
        for (source, listed) in sources {
            let received = try engine.store.read(isolation: #isolation) { try PeerWatermark.load(source.description, in: $0) }.receivedThrough
            let wantsFull = try engine.wantsFullSnapshot(from: source)
            // An acknowledgement lost after its delta was applied: the file is never offered
            // again, so it is written here, or the server keeps it.
            if received > 0, !wantsFull, listed.ack ?? 0 < received {
                try await acknowledge(source, through: received, for: engine)
            }
            // Nothing of the source waits here any more: the note that said so goes.
            if !engine.hasParkedDeltas(from: source), listed.parkedNote {
                _ = try await send("DELETE", "/sites/\(source)/parked/\(engine.site)", for: engine, expecting: [204])
            }
            var files = listed.files
            // Published past what this store has, with the files gone and no checkpoint
            // holding them: ask for a full snapshot.
            if !files.contains(where: { $0.to > received }), listed.published > received, covered[source] ?? 0 <= received, !listed.requested {
                try await requestFullSnapshot(from: source, for: engine)
            }
            let full = files.last(where: { $0.full && ($0.to > received || wantsFull && $0.to == received) })
            if wantsFull, full == nil, !engine.hasParkedDeltas(from: source), !listed.requested {
                try await requestFullSnapshot(from: source, for: engine)
            }
            if let full { files = files.filter { $0.to > full.to || $0.position == full.position } }
            files = files.filter { $0.to > received || $0.position == full?.position }
            if !files.isEmpty { wanted.append((source, files, listed.requested)) }
        }
        let bodies = try await downloadFiles(wanted.flatMap(\.files), for: engine)
        for (source, files, requested) in wanted {
            for file in files {
                let name = fileName(file, of: source, engine: engine)
                // Cleaned up since the listing (every reader had it, a checkpoint holds it):
                // its source's later files wait for the next fetch.
                guard let body = bodies[file.position] else { break }
                let data: Data
                do {
                    data = try RelayTransport.contents(of: body, name: name, source: source, range: (file.from, file.to), engine: engine)
                } catch let error as SyncError {
                    result.append(IncomingDelta(name: name, source: source, unreadable: error.message))
                    // The server checked the header when it stored the file, so a file that
                    // does not open now was changed where it is kept: it stays damaged. The
                    // source's full snapshot supersedes it (a directory's file may be put back).
                    if error.code == .corruptDelta, !requested { try await requestFullSnapshot(from: source, for: engine) }
                    break
                }
                let to = file.to
                let fileName = (name as NSString).lastPathComponent
                result.append(IncomingDelta(name: name, source: source, data: data) { outcome in
                    if case .parked(let reason) = outcome {
                        let text = Data("\(fileName) (\(reason))".utf8)
                        if let note = try? RelayEnvelope(kind: .note, family: engine.family, source: engine.site, from: 0, to: 0, payload: text)
                            .encoded(keys: engine.familyKeys) {
                            _ = try? await send("PUT", "/sites/\(source)/parked/\(engine.site)", body: note, for: engine, expecting: [204])
                        }
                        return
                    }
                    try await acknowledge(source, through: to, for: engine)
                })
            }
        }
        return result
    }

    /// How a file is named in messages: the server, the family, the source and the range, as
    /// a relay directory names its file.
    private func fileName(_ file: State.File, of source: RecordID, engine: SyncEngine) -> String {
        let name = String(format: "%020llu-%020llu%@.delta", file.from, file.to, file.full ? "-full" : "")
        return "\(server.absoluteString)/v1/families/\(engine.family)/sites/\(source)/\(name)"
    }

    private func acknowledge(_ source: RecordID, through: UInt64, for engine: SyncEngine) async throws {
        _ = try await send("PUT", "/sites/\(source)/acks/\(engine.site)", body: Data(String(through).utf8), for: engine, expecting: [204])
    }

    /// Whether `engine` should apply the checkpoints before the files (the rule of
    /// ``RelayTransport``): it has received nothing through the relay yet, or a source's files
    /// it needs are gone.
    private func restoresFromCheckpoints(_ engine: SyncEngine, sources: [(RecordID, State.Source)], covered: [RecordID: UInt64]) throws -> Bool {
        guard !covered.isEmpty else { return false }
        var receivedAnything = false
        for (source, listed) in sources {
            let received = try engine.store.read { try PeerWatermark.load(source.description, in: $0) }.receivedThrough
            if received > 0 { receivedAnything = true }
            guard covered[source] ?? 0 > received else { continue }
            let needed = listed.files.filter { $0.to > received }
            if let first = needed.first, first.from <= received + 1 || first.full { continue }
            if needed.isEmpty && listed.published <= received { continue }
            return true
        }
        return !receivedAnything && covered.contains { $0.key != engine.site && $0.value > 0 }
    }

    /// The checkpoints as deltas to apply, in the server's order (of how much they hold); one
    /// that cannot be had or does not open is offered as unreadable.
    private func checkpointDeltas(_ checkpoints: [State.Checkpoint], for engine: SyncEngine) async -> [IncomingDelta] {
        var result: [IncomingDelta] = []
        for checkpoint in checkpoints {
            guard let maker = RecordID(string: checkpoint.maker) else { continue }
            var coverage: [RecordID: UInt64] = [:]
            for (site, through) in checkpoint.coverage { if let site = RecordID(string: site) { coverage[site] = through } }
            let name = "\(server.absoluteString)/v1/families/\(engine.family)/checkpoints/\(maker)/\(checkpoint.through)"
            do {
                let (data, _) = try await send("GET", "/checkpoints/\(maker)/\(checkpoint.through)", for: engine, expecting: [200])
                result.append(try RelayTransport.checkpointDelta(data, name: name, maker: maker, to: checkpoint.through, coverage: coverage, engine: engine))
            } catch let error as SyncError {
                result.append(IncomingDelta(name: name, source: maker, unreadable: error.message))
            } catch {
                result.append(IncomingDelta(name: name, source: maker, unreadable: "cannot read it: \(error); it is read again at the next fetch"))
            }
        }
        return result
    }

    /// The bytes of `files`, by position, in requests of at most 8 MiB (or one file) each;
    /// those the server no longer holds are missing.
    private func downloadFiles(_ files: [State.File], for engine: SyncEngine) async throws -> [Int64: Data] {
        var result: [Int64: Data] = [:]
        var batch: [Int64] = []
        var bytes = 0
        func flush() async throws {
            guard !batch.isEmpty else { return }
            let (data, _) = try await send("GET", "/files?positions=\(batch.map(String.init).joined(separator: ","))", for: engine, expecting: [200])
            let all = [UInt8](data)
            var offset = 0
            while offset + 16 <= all.count {
                let position = Int64(bitPattern: Self.littleEndian(all[offset..<offset + 8]))
                let length = Int(clamping: Self.littleEndian(all[offset + 8..<offset + 16]))
                offset += 16
                guard length <= all.count - offset else { break }
                result[position] = Data(all[offset..<offset + length])
                offset += length
            }
            batch = []
            bytes = 0
        }
        for file in files {
            if !batch.isEmpty && (bytes + file.size > 8 << 20 || batch.count == 256) { try await flush() }
            batch.append(file.position)
            bytes += file.size
        }
        try await flush()
        return result
    }

    static func littleEndian(_ bytes: ArraySlice<UInt8>) -> UInt64 {
        bytes.reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
    }

    // MARK: Blobs

    /// Whether the server holds the blob of `reference` (under the name the family's key gives
    /// it: the server cannot tell which content it holds).
    public func hasBlob(_ reference: ExternalData, from engine: SyncEngine) async throws -> Bool {
        let (_, status) = try await send("HEAD", "/blobs/\(RelayTransport.blobName(reference, for: engine))", for: engine, expecting: [200, 404])
        return status == 200
    }

    /// Stores the blob on the server, sealed (a blob it holds already stays as it is).
    /// - Throws: `.transportFailed` for a blob over the server's body limit (it stays owed).
    public func putBlob(_ data: Data, for reference: ExternalData, from engine: SyncEngine) async throws {
        let keys = try familyKeys(engine)
        let body = try RelayEnvelope(kind: .blob, family: engine.family, source: engine.site, from: 0, to: 0, payload: data).encoded(keys: keys)
        _ = try await send("PUT", "/blobs/\(RelayTransport.blobName(reference, for: engine))", body: body, for: engine, expecting: [200, 201])
    }

    /// The blob's bytes as the server holds them (opened with the family's key), or nil when
    /// it lacks them.
    /// - Throws: `.corruptDelta` or `.unauthenticated` for a body that does not open as a blob
    ///   of the family (the engine keeps the blob pending and reports it).
    public func fetchBlob(_ reference: ExternalData, for engine: SyncEngine) async throws -> Data? {
        let keys = try familyKeys(engine)
        let name = RelayTransport.blobName(reference, for: engine)
        let (data, status) = try await send("GET", "/blobs/\(name)", for: engine, expecting: [200, 404])
        guard status == 200 else { return nil }
        let where_ = "\(server.absoluteString)/v1/families/\(engine.family)/blobs/\(name)"
        let envelope = try RelayEnvelope(decoding: data, keys: keys, name: where_)
        guard envelope.kind == .blob, envelope.family == engine.family else {
            throw SyncError(.corruptDelta, "\(where_) is not a blob of family \(engine.family); the blob stays pending")
        }
        return envelope.payload
    }

    /// Removes the server's blobs of the family that neither a kept checkpoint nor any delta
    /// file on the server references, once stored more than `grace` ago (the directory relay's
    /// rule, ``RelayTransport/collectBlobs(for:olderThan:)``). The server cannot read the
    /// references (they are sealed), so this store reads every file of the family: O(bytes
    /// of the family's files on the server), only when some blob is old enough. Nothing is
    /// removed when a file does not open. - Returns: the blobs removed.
    @discardableResult
    public func collectBlobs(for engine: SyncEngine, olderThan grace: TimeInterval = SyncEngine.relayBlobGrace) async throws -> Int {
        let keys = try familyKeys(engine)
        let age = Int64(max(0, grace.rounded(.up)))
        let (list, _) = try await send("GET", "/blobs?olderThan=\(age)", for: engine, expecting: [200])
        let candidates = (try? JSONDecoder().decode([String].self, from: list)) ?? []
        guard !candidates.isEmpty else { return 0 }
        // Every file and checkpoint of the family, listed after the candidates.
        var payloads: [(name: String, data: Data)] = []
        let (checkpointList, _) = try await send("GET", "/checkpoints", for: engine, expecting: [200])
        struct Listed: Decodable {
            let maker: String, through: UInt64
            init(from decoder: any Decoder) throws {
                var fields = try decoder.unkeyedContainer()
                maker = try fields.decode(String.self)
                through = try fields.decode(UInt64.self)
            }
        }
        for checkpoint in (try? JSONDecoder().decode([Listed].self, from: checkpointList)) ?? [] {
            let (data, status) = try await send("GET", "/checkpoints/\(checkpoint.maker)/\(checkpoint.through)", for: engine, expecting: [200, 404])
            if status == 200 { payloads.append(("checkpoint \(checkpoint.maker) through \(checkpoint.through)", data)) }
        }
        var after: Int64 = 0
        while true {
            let (data, _) = try await send("GET", "/log?after=\(after)&bodies=1&limit=64", for: engine, expecting: [200])
            let files = Self.logFiles([UInt8](data))
            guard let last = files.last else { break }
            for file in files { payloads.append(("file \(file.position)", file.body)) }
            after = last.position
        }
        var referenced = Set<String>()
        for (name, data) in payloads {
            guard let envelope = try? RelayEnvelope(decoding: data, keys: keys, name: name),
                  let delta = try? Delta(decoding: envelope.payload, key: engine.key, name: name) else { return 0 }
            for entry in delta.entries {
                for field in entry.fields.values {
                    for reference in ExternalData.references(in: field.value) { referenced.insert(RelayTransport.blobName(reference, for: engine)) }
                }
            }
        }
        var removed = 0
        for name in candidates where !referenced.contains(name) {
            let (_, status) = try await send("DELETE", "/blobs/\(name)?olderThan=\(age)", for: engine, expecting: [204, 404])
            if status == 204 { removed += 1 }
        }
        return removed
    }

    /// The files of a binary log answer: position u64, source (16), from u64, to u64, full u8,
    /// length u32, bytes, per file (little-endian).
    static func logFiles(_ bytes: [UInt8]) -> [(position: Int64, body: Data)] {
        var result: [(Int64, Data)] = []
        var offset = 0
        while offset + 45 <= bytes.count {
            let position = Int64(bitPattern: littleEndian(bytes[offset..<offset + 8]))
            let length = Int(littleEndian(bytes[offset + 41..<offset + 45]))
            offset += 45
            guard length <= bytes.count - offset else { break }
            result.append((position, Data(bytes[offset..<offset + length])))
            offset += length
        }
        return result
    }

    // MARK: Long-poll and position

    /// Waits until the family's log holds a file of another store past `position` (or `wait`
    /// passes), and returns the log's position to wait after next time: a device that syncs
    /// when it returns hears another device's upload within a round trip, whichever server of
    /// the family's took it (PostgreSQL NOTIFY wakes them all). Start with 0.
    public func changes(for engine: SyncEngine, after position: Int64, wait: Duration = .seconds(30)) async throws -> Int64 {
        let seconds = Double(wait.components.seconds) + Double(wait.components.attoseconds) / 1e18
        let (data, _) = try await send("GET", "/log?after=\(position)&wait=\(Int(seconds * 1000))ms&exclude=\(engine.site)&limit=1",
                                       for: engine, expecting: [200], timeout: requestTimeout + seconds)
        struct Answer: Decodable { let next: Int64 }
        guard let answer = try? JSONDecoder().decode(Answer.self, from: data) else {
            throw SyncError(.transportFailed, "relay server \(server.absoluteString) answered a long-poll this library cannot read (\(Self.excerpt(data)))")
        }
        return answer.next
    }

    /// Where `engine`'s store stands on the server: the log's head, how far the server holds
    /// its history (its files, or readers' acknowledgements of them), how far the checkpoints
    /// hold it, and how far each reader has applied it.
    public struct Position: Sendable, CustomStringConvertible {
        public let head: Int64
        public let published: UInt64
        public let checkpointed: UInt64
        public let files: Int
        public let acknowledgements: [String: UInt64]

        public var description: String {
            let readers = acknowledgements.sorted { $0.key < $1.key }.map { "\($0.key) through \($0.value)" }
            return "log at position \(head) (\(files) files); holds this store's history through \(published), checkpoints through \(checkpointed); readers: \(readers.isEmpty ? "none" : readers.joined(separator: ", "))"
        }
    }

    /// ``Position`` of `engine`'s store, asked of the server now.
    public func position(of engine: SyncEngine) async throws -> Position {
        try await position(of: engine.site, family: engine.family, keys: try familyKeys(engine))
    }

    /// ``Position`` of the store whose site is `site`, in `family` (whose keys `keys` are),
    /// asked of the server now: for a store opened read-only (`stash peers`).
    public func position(of site: RecordID, family: RecordID, keys: FamilyKeys) async throws -> Position {
        let (data, _) = try await send("GET", "/sites/\(site)/position", family: family, keys: keys, expecting: [200])
        struct Answer: Decodable {
            let head: Int64?
            let published: UInt64
            let checkpointed: UInt64
            let files: Int
            let acks: [String: UInt64]
        }
        guard let answer = try? JSONDecoder().decode(Answer.self, from: data) else {
            throw SyncError(.transportFailed, "relay server \(server.absoluteString) answered a position this library cannot read (\(Self.excerpt(data)))")
        }
        return Position(head: answer.head ?? 0, published: answer.published, checkpointed: answer.checkpointed, files: answer.files,
                        acknowledgements: answer.acks)
    }

    /// The metadata key under which a store keeps the server's log position at its last fetch
    /// (with the server's URL), for `stash peers` to show offline.
    static func positionKey(_ relay: RecordID) -> String { "sync.server.\(relay)" }

    /// The relay servers this store fetched from, each with the log position it noted at its
    /// last fetch there (for `stash peers`, offline).
    public static func lastPositions(of store: Store) throws -> [(server: String, position: Int64)] {
        try store.read { try $0.metadata(withPrefix: "sync.server.") }.compactMap { entry in
            let parts = String(decoding: entry.value, as: UTF8.self).split(separator: " ")
            guard parts.count == 2, let position = Int64(parts[1]) else { return nil }
            return (String(parts[0]), position)
        }.sorted { $0.server < $1.server }
    }

    private func noteHead(_ head: Int64, for engine: SyncEngine) throws {
        guard let id = relayIDs.ids.withLock({ $0[engine.family] }) else { return }
        let value = Array("\(server.absoluteString) \(head)".utf8)
        if try engine.store.metadata(for: Self.positionKey(id)) != value {
            try engine.store.setMetadata(value, for: Self.positionKey(id))
        }
    }

    // MARK: Requests

    /// The family's keys: a server takes only a family with a key.
    private func familyKeys(_ engine: SyncEngine) throws -> FamilyKeys {
        guard let keys = engine.familyKeys else {
            throw SyncError(.unauthenticated, "relay server \(server.absoluteString): a family syncs through a server only with a sync key (its files are sealed, and its token derives from the key); configure SyncConfiguration.key (with the stash command, --key-file FILE)")
        }
        return keys
    }

    /// Sends a request for `engine`'s family, retrying as ``RetryPolicy`` says, and returns the
    /// answer's body and status, one of `expecting`.
    /// - Throws: `.unauthenticated` for 401 and 403; `.transportFailed` for any other status, or
    ///   when the server could not be reached for ``RetryPolicy/giveUpAfter``.
    func send(_ method: String, _ path: String, body: Data? = nil, for engine: SyncEngine, expecting: Set<Int>,
              timeout: TimeInterval? = nil) async throws -> (Data, Int) {
        try await send(method, path, body: body, family: engine.family, keys: try familyKeys(engine), expecting: expecting, timeout: timeout)
    }

    /// ``send(_:_:body:for:expecting:timeout:)`` for `family`, whose keys `keys` are.
    func send(_ method: String, _ path: String, body: Data? = nil, family: RecordID, keys: FamilyKeys, expecting: Set<Int>,
              timeout: TimeInterval? = nil) async throws -> (Data, Int) {
        guard let url = URL(string: server.absoluteString.trimmingSuffix("/") + "/v1/families/\(family)" + path) else {
            throw SyncError(.transportFailed, "relay server \(server.absoluteString) does not make a URL with \(path)")
        }
        var request = URLRequest(url: url, cachePolicy: .reloadIgnoringLocalCacheData, timeoutInterval: timeout ?? requestTimeout)
        request.httpMethod = method
        request.setValue("Bearer " + keys.relayToken.map { String(format: "%02x", $0) }.joined(), forHTTPHeaderField: "Authorization")
        if let body {
            request.httpBody = body
            request.setValue("application/octet-stream", forHTTPHeaderField: "Content-Type")
        }
        let what = "\(method) \(url.path)"
        let start = ContinuousClock.now
        var attempt = 0
        while true {
            try Task.checkCancellation()
            var problem: String
            var wait: Duration? = nil
            do {
                let (data, response) = try await session.data(for: request)
                guard let http = response as? HTTPURLResponse else {
                    throw SyncError(.transportFailed, "relay server \(server.absoluteString) answered \(what) with no HTTP response")
                }
                let status = http.statusCode
                if expecting.contains(status) { return (data, status) }
                let message = Self.message(data)
                switch status {
                case 401, 403:
                    throw SyncError(.unauthenticated, "relay server \(server.absoluteString) refused the family's token (\(status): \(message)); every device of family \(family) must use the family's key (the server takes the token of the first device that reached it)")
                case 413:
                    throw SyncError(.transportFailed, "relay server \(server.absoluteString) refused \(what) as too large (413: \(message)); changes stay pending")
                case 429, 502, 503, 504:
                    problem = "\(status): \(message)"
                    if let retryAfter = http.value(forHTTPHeaderField: "Retry-After").flatMap(Double.init) {
                        wait = .milliseconds(Int64(retryAfter * 1000))
                    }
                default:
                    throw SyncError(.transportFailed, "relay server \(server.absoluteString) answered \(what) with \(status): \(message); changes stay pending")
                }
            } catch let error as SyncError {
                throw error
            } catch let error as URLError where error.code == .cancelled || Task.isCancelled {
                throw CancellationError()
            } catch let error as URLError where [.badURL, .unsupportedURL].contains(error.code) {
                throw SyncError(.transportFailed, "relay server \(server.absoluteString) cannot be reached: \(error.localizedDescription)")
            } catch {
                problem = "\(error.localizedDescription)"
            }
            let delay = max(wait ?? .zero, retry.delay(attempt: attempt))
            attempt += 1
            if start.duration(to: .now) + delay > retry.giveUpAfter {
                throw SyncError(.transportFailed, "relay server \(server.absoluteString) unavailable for \(what) (\(problem)) after \(attempt) attempt(s) in \(start.duration(to: .now).components.seconds) s; changes stay pending, the next sync resumes")
            }
            try await Task.sleep(for: delay)
        }
    }

    /// The server's error message (`{"error": {"message": …}}`), or the body's start.
    static func message(_ data: Data) -> String {
        struct Failure: Decodable {
            struct Inner: Decodable { let message: String }
            let error: Inner
        }
        return (try? JSONDecoder().decode(Failure.self, from: data))?.error.message ?? excerpt(data)
    }

    static func excerpt(_ data: Data) -> String {
        let text = String(decoding: data.prefix(200), as: UTF8.self)
        return text.isEmpty ? "empty body" : text
    }
}

extension String {
    fileprivate func trimmingSuffix(_ suffix: String) -> String {
        hasSuffix(suffix) ? String(dropLast(suffix.count)) : self
    }
}
