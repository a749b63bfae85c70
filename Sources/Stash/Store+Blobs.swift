import Foundation
import StashLMDB

/// What a store's blob directory holds (``Store/blobStatistics()``).
public struct BlobStatistics: Sendable, Codable, Equatable {
    /// Blob files in `DIR/blobs/`, and their bytes.
    public var files = 0, bytes = 0
    /// Distinct blobs the store's records reference (carried values included), and their bytes.
    public var referenced = 0, referencedBytes = 0
    /// Of those, the blobs not here yet (sync has not brought them), and their bytes.
    public var pending = 0, pendingBytes = 0
    /// Blob files no record references (a collection removes those past its grace period).
    public var unreferenced = 0, unreferencedBytes = 0
    /// Temporary files (of a write under way, or left by a killed one).
    public var temporary = 0
}

/// What ``Store/collectGarbageBlobs(olderThan:)`` removed.
public struct BlobCollection: Sendable, Equatable, CustomStringConvertible {
    /// Unreferenced blob files removed, and their bytes.
    public var removed = 0, removedBytes = 0
    /// Temporary files of killed writers removed.
    public var temporaryRemoved = 0
    /// Unreferenced blobs kept because they are younger than the grace period.
    public var keptYoung = 0
    public var description: String {
        "removed \(removed) unreferenced blobs (\(removedBytes) B) and \(temporaryRemoved) temporary files; kept \(keptYoung) younger than the grace period"
    }
}

extension Store {
    /// The directory of this store's blobs (`DIR/blobs`), which may not exist yet.
    public var blobDirectory: URL { BlobDirectory(storePath: path).url }

    /// The bytes of an external value, or nil while its blob is pending (a record that arrived
    /// by sync before its blob). Reads the file (memory-mapped); the hash was checked when the
    /// blob arrived or was written (``verify()`` checks it again).
    /// - Throws: `StoreError(.blob)` when the file cannot be read, or is not of the size the
    ///   reference says (damaged: run `stash verify`).
    public func blob(_ reference: ExternalData) throws -> Data? {
        let blobs = BlobDirectory(storePath: path)
        guard let data = try blobs.read(reference.sha256) else { return nil }
        guard data.count == reference.size else {
            throw StoreError(.blob, "store \(path): blob \(blobs.fileURL(reference.sha256).path) holds \(data.count) B, its reference says \(reference.size) B: the file is damaged; run `stash verify \(path)`, and sync again (or restore the file) to bring it back")
        }
        return data
    }

    /// The file holding an external value's bytes, for reading without a copy (nil while it is
    /// pending). Read it only: it is shared by every record that holds the same bytes, and
    /// removed once none references it (``collectGarbageBlobs(olderThan:)``).
    public func blobURL(_ reference: ExternalData) -> URL? {
        let blobs = BlobDirectory(storePath: path)
        return blobs.holds(reference) ? blobs.fileURL(reference.sha256) : nil
    }

    /// Whether an external value's blob has not arrived yet (sync brings it later).
    public func isBlobPending(_ reference: ExternalData) -> Bool { !BlobDirectory(storePath: path).holds(reference) }

    /// Keeps `data`, received for `reference` (from a peer, say), as its blob: checked against
    /// the reference's SHA-256 and size first, then written atomically and durably. Until
    /// then the blob is pending; a blob that does not match is never kept.
    /// - Throws: `StoreError(.invalidValue)` when `data` is not the blob; `.blob` when it cannot
    ///   be written.
    public func importBlob(_ data: Data, for reference: ExternalData) throws {
        try BlobDirectory(storePath: path).write(data, as: reference)
    }

    /// Every distinct blob this store's records reference: the external fields of its records
    /// and the values it carries for other replicas (``StoreReading/carriedTypeNames``).
    /// O(records of types with external fields), plus O(stored states) when it carries values.
    public func referencedBlobs() throws -> Set<ExternalData> {
        try read { snapshot in try referencedBlobs(snapshot.txn) }
    }

    func referencedBlobs<T: TransactionReading>(_ txn: T) throws -> Set<ExternalData> {
        let catalog = try reloadCatalog(txn)
        var found = Set<ExternalData>()
        for type in catalog.schema.types {
            let external = type.fields.filter { $0.external == true }.map(\.tag)
            guard !external.isEmpty else { continue }
            try txn.scan(dbs.records, prefix: StoreKeys.typePrefix(type.tag)) { _, bytes in
                let record = try EncodedRecord(bytes)
                for tag in external {
                    guard let value = try record.value(of: tag) else { continue }
                    found.formUnion(ExternalData.references(in: value))
                }
                return true
            }
        }
        // Values kept for other replicas (a field this app does not declare, a type it lacks):
        // their blobs stay, and travel on with them.
        if !catalog.carried.isEmpty {
            try txn.scan(dbs.versions, from: ScanStart<[UInt8]>.first) { _, bytes in
                guard bytes.first == 2, let versions = try? RecordVersions(decoding: bytes) else { return true }
                for state in versions.carried.values { found.formUnion(ExternalData.references(in: state.value)) }
                return true
            }
        }
        return found
    }

    /// The blobs records reference that are not here yet, each once.
    public func pendingBlobs() throws -> [ExternalData] {
        let blobs = BlobDirectory(storePath: path)
        return try referencedBlobs().filter { !blobs.holds($0) }.sorted { $0.sha256 < $1.sha256 }
    }

    /// Counts and bytes of the blob directory and of what records reference.
    public func blobStatistics() throws -> BlobStatistics {
        let blobs = BlobDirectory(storePath: path)
        let listed = blobs.list()
        let referenced = try referencedBlobs()
        var statistics = BlobStatistics()
        var present = Set<String>()
        for file in listed.blobs {
            statistics.files += 1
            statistics.bytes += file.size
            present.insert(file.hash)
        }
        let referencedNames = Set(referenced.map(\.sha256))
        for file in listed.blobs where !referencedNames.contains(file.hash) {
            statistics.unreferenced += 1
            statistics.unreferencedBytes += file.size
        }
        for reference in referenced {
            statistics.referenced += 1
            statistics.referencedBytes += reference.size
            if !blobs.holds(reference) {
                statistics.pending += 1
                statistics.pendingBytes += reference.size
            }
        }
        statistics.temporary = listed.temporary.count
        return statistics
    }

    /// Removes the blob files no record references, and the temporary files killed writers
    /// left, that are older than `grace` (default one hour).
    ///
    /// Crash-safe: the references are read in one snapshot *after* the files are listed, and
    /// a file is removed only when no record of that snapshot references it and it was last
    /// written before `now - grace`. A write stores its blob (or, finding it present, makes it
    /// young again) before its transaction commits, so the blob of a transaction still under
    /// way (in this or another process) is younger than `grace` and stays, and one of a
    /// transaction that aborted or was killed goes at a later collection. Keep `grace` above
    /// the longest write transaction. A blob referenced by any record, or by a value kept for
    /// other replicas, is never removed. Deltas carry references only; a peer that has not
    /// received a record yet gets its current state, whose blobs are all referenced.
    @discardableResult
    public func collectGarbageBlobs(olderThan grace: TimeInterval = 3600) throws -> BlobCollection {
        let blobs = BlobDirectory(storePath: path)
        let listed = blobs.list()
        let cutoff = now().addingTimeInterval(-grace)
        let referenced = Set(try referencedBlobs().map(\.sha256))
        var result = BlobCollection()
        for file in listed.blobs where !referenced.contains(file.hash) {
            // Looked at again just before: a write may have made it young since the list.
            guard file.modified < cutoff, let current = modificationTime(blobs.fileURL(file.hash)), current < cutoff else {
                result.keptYoung += 1
                continue
            }
            if unlink(blobs.fileURL(file.hash).path) == 0 {
                result.removed += 1
                result.removedBytes += file.size
            }
        }
        for file in listed.temporary where file.modified < cutoff {
            if unlink(blobs.url.appendingPathComponent(file.name).path) == 0 { result.temporaryRemoved += 1 }
        }
        if result.removed + result.temporaryRemoved > 0 { try? blobs.syncDirectory(blobs.url) }
        return result
    }

    private func modificationTime(_ url: URL) -> Date? {
        var info = stat()
        guard stat(url.path, &info) == 0 else { return nil }
        return Date(timeIntervalSince1970: Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9)
    }

    /// Checks every blob records reference: present blobs must hold the bytes their name says
    /// (SHA-256 and size); absent ones are pending (a record that arrived by sync before its
    /// blob), which is no damage. O(bytes of the referenced blobs).
    /// - Returns: the problems (damaged blobs), and the pending blobs.
    public func verifyBlobs() throws -> (problems: [String], pending: [ExternalData]) {
        let blobs = BlobDirectory(storePath: path)
        var problems: [String] = []
        var pending: [ExternalData] = []
        for reference in try referencedBlobs().sorted(by: { $0.sha256 < $1.sha256 }) {
            guard let size = blobs.size(of: reference.sha256) else {
                pending.append(reference)
                continue
            }
            let file = blobs.fileURL(reference.sha256).path
            guard size == reference.size else {
                problems.append("blob \(file): \(size) B, its references say \(reference.size) B (damaged; sync again to bring it back, or restore it)")
                continue
            }
            guard let data = try? blobs.read(reference.sha256) else {
                problems.append("blob \(file): cannot be read")
                continue
            }
            if ExternalData.hash(of: data) != reference.sha256 {
                problems.append("blob \(file): its bytes do not have the SHA-256 of its name (damaged; sync again to bring it back, or restore it)")
            }
        }
        return (problems, pending)
    }
}
