import Crypto
import Foundation
import Stash

// Blobs (``ExternalData``) travel beside deltas: a delta carries references only; the sender
// gives the other end each blob its states reference that the other end lacks, before the
// delta (so a reader never waits for a blob its source had); the receiver, after applying,
// fetches every blob its records reference and it lacks, checks each against its hash before
// keeping it, and keeps the rest pending, tried again at each fetch.

extension SyncEngine {
    /// How old a relay's unreferenced blob must be before a checkpoint's publisher removes it:
    /// a blob goes to the relay before the delta that references it, so a younger one may
    /// belong to a send under way (of a device that went offline in between, say).
    public static let relayBlobGrace: TimeInterval = 86_400

    /// Sends the blobs the states of `delta` reference that the other end lacks, once each,
    /// and those an earlier send owed it. A blob this store does not hold yet (its record came
    /// from elsewhere before it), or holds damaged, is owed: noted per watermark site
    /// (`x:sync.blobsOwed.SITE`) and sent by a later send or fetch through this transport once
    /// it is here, so that the other end's readers do not wait for it for good.
    /// - Returns: blobs sent.
    @discardableResult
    func sendBlobs(of delta: Delta?, via transport: some SyncTransport) async throws -> Int {
        let key = "sync.blobsOwed." + (try await transport.watermarkSite(for: self))
        let owedBefore = Self.decodeOwed(try store.metadata(for: key))
        var references = Set(owedBefore)
        for entry in delta?.entries ?? [] {
            for field in entry.fields.values { references.formUnion(ExternalData.references(in: field.value)) }
        }
        var sent = 0
        var owed: [ExternalData] = []
        for reference in references.sorted(by: { $0.sha256 < $1.sha256 }) {
            try Task.checkCancellation()
            guard store.blobURL(reference) != nil else {
                owed.append(reference)
                continue
            }
            if try await transport.hasBlob(reference, from: self) { continue }
            // Never sent damaged: a blob whose bytes do not have its hash waits to be fetched again.
            guard let data = try? store.blob(reference), ExternalData.hash(of: data) == reference.sha256 else {
                owed.append(reference)
                continue
            }
            try await transport.putBlob(data, for: reference, from: self)
            sent += 1
        }
        if owed != owedBefore { try store.setMetadata(owed.isEmpty ? nil : Self.encodeOwed(owed), for: key) }
        return sent
    }

    private static func encodeOwed(_ owed: [ExternalData]) -> [UInt8] {
        Array(owed.map { "\($0.sha256) \($0.size)" }.joined(separator: "\n").utf8)
    }

    private static func decodeOwed(_ bytes: [UInt8]?) -> [ExternalData] {
        guard let bytes else { return [] }
        return String(decoding: bytes, as: UTF8.self).split(separator: "\n").compactMap { line in
            let parts = line.split(separator: " ")
            guard parts.count == 2, let size = Int(parts[1]) else { return nil }
            return try? ExternalData(sha256: String(parts[0]), size: size)
        }.sorted { $0.sha256 < $1.sha256 }
    }

    /// Fetches the blobs this store's records reference and it lacks; each is checked against
    /// its reference (SHA-256, size) before it is kept. - Returns: blobs received, blobs still
    /// pending, and what went wrong (a blob the transport holds damaged or swapped: it stays
    /// pending, and is fetched again at the next fetch).
    func fetchPendingBlobs(via transport: some SyncTransport) async throws -> (received: Int, pending: Int, problems: [String]) {
        var received = 0, pending = 0
        var problems: [String] = []
        for reference in try store.pendingBlobs() {
            if Task.isCancelled {
                pending += 1
                continue
            }
            let data: Data?
            do { data = try await transport.fetchBlob(reference, for: self) } catch {
                problems.append("blob \(reference.sha256): \(error)")
                pending += 1
                continue
            }
            guard let data else {
                pending += 1
                continue
            }
            do {
                try store.importBlob(data, for: reference)
                received += 1
            } catch {
                problems.append("blob \(reference.sha256) as the transport holds it was refused: \(error)")
                pending += 1
            }
        }
        return (received, pending, problems)
    }
}

extension DirectTransport {
    /// Whether the other store holds the blob.
    public func hasBlob(_ reference: ExternalData, from engine: SyncEngine) async throws -> Bool {
        !other.store.isBlobPending(reference)
    }

    /// Keeps the blob in the other store (checked against its hash there).
    public func putBlob(_ data: Data, for reference: ExternalData, from engine: SyncEngine) async throws {
        try other.store.importBlob(data, for: reference)
    }

    /// The other store's blob, or nil while it lacks it too.
    public func fetchBlob(_ reference: ExternalData, for engine: SyncEngine) async throws -> Data? {
        try other.store.blob(reference)
    }
}

extension RelayTransport {
    /// `DIR/blobs/<name>`: for a family with a key, the name is the HMAC-SHA256 of the blob's
    /// hash under a key derived for naming blobs (the relay cannot tell which content a file
    /// holds, nor test a guess), and the file is a sealed envelope of kind blob; for a family
    /// without a key, the name is the blob's SHA-256 and the file its bytes.
    func blobFile(_ reference: ExternalData, for engine: SyncEngine) -> URL {
        directory.appendingPathComponent("blobs").appendingPathComponent(Self.blobName(reference, for: engine))
    }

    /// The name a relay keeps the blob of `reference` under (a relay directory's file, a relay
    /// server's key): see ``blobFile(_:for:)``.
    static func blobName(_ reference: ExternalData, for engine: SyncEngine) -> String {
        guard let key = engine.key else { return reference.sha256 }
        let naming = SymmetricKey(data: FamilyKeys.derive(key, engine.family, purpose: "stash relay blob names v1"))
        let code = HMAC<SHA256>.authenticationCode(for: Data(hexBytes(reference.sha256)), using: naming)
        return code.map { String(format: "%02x", $0) }.joined()
    }

    private static func hexBytes(_ hex: String) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        var iterator = hex.utf8.makeIterator()
        func digit(_ c: UInt8) -> UInt8 { c <= 57 ? c - 48 : c - 87 }
        while let high = iterator.next(), let low = iterator.next() { bytes.append(digit(high) << 4 | digit(low)) }
        return bytes
    }

    /// Whether the relay holds the blob (its file exists).
    public func hasBlob(_ reference: ExternalData, from engine: SyncEngine) async throws -> Bool {
        FileManager.default.fileExists(atPath: blobFile(reference, for: engine).path)
    }

    /// Writes the blob to `DIR/blobs/` atomically (sealed for a family with a key).
    public func putBlob(_ data: Data, for reference: ExternalData, from engine: SyncEngine) async throws {
        let contents = try engine.familyKeys.map { keys in
            try RelayEnvelope(kind: .blob, family: engine.family, source: engine.site, from: 0, to: 0, payload: data).encoded(keys: keys)
        } ?? data
        try AtomicFile.write(contents, to: blobFile(reference, for: engine))
    }

    /// The blob's bytes as the relay holds them (opened with the family's key), or nil when
    /// the relay lacks it.
    /// - Throws: `.corruptDelta` or `.unauthenticated` for a file that does not open as a blob
    ///   of the family; `.transportFailed` when it cannot be read.
    public func fetchBlob(_ reference: ExternalData, for engine: SyncEngine) async throws -> Data? {
        let url = blobFile(reference, for: engine)
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        let contents: Data
        do { contents = try Data(contentsOf: url) }
        catch { throw SyncError(.transportFailed, "cannot read \(url.path): \(error.localizedDescription); the blob stays pending") }
        guard let keys = engine.familyKeys else { return contents }
        let envelope = try RelayEnvelope(decoding: contents, keys: keys, name: url.path)
        guard envelope.kind == .blob, envelope.family == engine.family else {
            throw SyncError(.corruptDelta, "\(url.path) is not a blob of family \(engine.family); the blob stays pending")
        }
        return envelope.payload
    }
}

extension RelayTransport {
    /// Removes the relay's blob files of `engine`'s family that neither a kept checkpoint nor
    /// any delta file on the relay references, once older than `grace` (a blob is written
    /// before the delta that references it: a younger one may belong to a send under way).
    /// Only for a family with a key, whose blob files are sealed envelopes naming their family:
    /// a family without a key names its blobs by their hash alone, which another such family
    /// sharing the directory may reference too, so they stay. Nothing is removed when any file
    /// of the family cannot be read (a reference in it could be missed).
    /// O(bytes of the family's relay files). - Returns: the blob files removed.
    @discardableResult
    public func collectBlobs(for engine: SyncEngine, olderThan grace: TimeInterval = SyncEngine.relayBlobGrace) async throws -> Int {
        guard let keys = engine.familyKeys else { return 0 }
        let blobs = directory.appendingPathComponent("blobs")
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: blobs.path)) ?? []).filter { !$0.hasPrefix(".") }
        guard !names.isEmpty else { return 0 }
        // Listed before the references are read: a blob written after the list is not judged.
        var candidates: [(url: URL, modified: Date)] = []
        let cutoff = engine.store.clock().addingTimeInterval(-grace)
        for name in names {
            let url = blobs.appendingPathComponent(name)
            guard let header = RelayEnvelope.header(of: url), header.kind == .blob, header.family == engine.family,
                  let modified = (try? FileManager.default.attributesOfItem(atPath: url.path)[.modificationDate]) as? Date,
                  modified < cutoff else { continue }
            candidates.append((url, modified))
        }
        guard !candidates.isEmpty else { return 0 }
        var files = checkpoints(of: engine.family).map(\.url)
        for folder in (try? FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)) ?? []
        where RecordID(string: folder.lastPathComponent) != nil {
            for file in (try? FileManager.default.contentsOfDirectory(at: folder, includingPropertiesForKeys: nil)) ?? []
            where file.pathExtension == "delta" && !file.lastPathComponent.hasPrefix(".") {
                files.append(file)
            }
        }
        var referenced = Set<String>()
        for url in files {
            guard let data = try? Data(contentsOf: url) else {
                if FileManager.default.fileExists(atPath: url.path) { return 0 }   // unreadable: judge nothing
                continue   // cleaned up meanwhile
            }
            let payload: Data
            if RelayEnvelope.isEnvelope(data) {
                guard let header = RelayEnvelope.header(of: url), header.family == engine.family else { continue }
                guard let envelope = try? RelayEnvelope(decoding: data, keys: keys, name: url.path) else { return 0 }
                payload = envelope.payload
            } else {
                payload = data
            }
            guard let delta = try? Delta(decoding: payload, key: engine.key, name: url.path) else {
                // A bare delta of another family does not open with this key: not ours.
                if RelayEnvelope.isEnvelope(data) { return 0 }
                continue
            }
            guard delta.family == engine.family else { continue }
            for entry in delta.entries {
                for field in entry.fields.values {
                    for reference in ExternalData.references(in: field.value) {
                        referenced.insert(blobFile(reference, for: engine).lastPathComponent)
                    }
                }
            }
        }
        var removed = 0
        for candidate in candidates where !referenced.contains(candidate.url.lastPathComponent) {
            if unlink(candidate.url.path) == 0 { removed += 1 }
        }
        return removed
    }
}
