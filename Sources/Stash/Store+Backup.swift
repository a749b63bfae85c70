import Foundation
import StashLMDB

/// What ``Store/backup(to:compact:)`` or ``Store/compact(at:)`` made.
public struct BackupReport: Sendable, CustomStringConvertible {
    /// The directory written: the backup's, or the compacted store's.
    public let path: String
    /// The size of the store's `data.mdb` it was made from, in bytes.
    public let sourceBytes: Int
    /// The size of the `data.mdb` made, in bytes.
    public let bytes: Int
    /// The blob files (``ExternalData``) a backup copied, and their bytes (0 for a compaction,
    /// which leaves `DIR/blobs` as it is).
    public let blobCount: Int
    public let blobBytes: Int

    init(path: String, sourceBytes: Int, bytes: Int, blobCount: Int = 0, blobBytes: Int = 0) {
        self.path = path
        self.sourceBytes = sourceBytes
        self.bytes = bytes
        self.blobCount = blobCount
        self.blobBytes = blobBytes
    }

    public var description: String {
        "\(path): \(Self.size(bytes)) (from \(Self.size(sourceBytes)))" + (blobCount > 0 ? ", \(blobCount) blob(s) (\(Self.size(blobBytes)))" : "")
    }

    static func size(_ n: Int) -> String {
        n >= 1 << 20 ? String(format: "%.1f MiB", Double(n) / 1048576) : String(format: "%.1f KiB", Double(n) / 1024)
    }
}

extension Store {
    /// Copies the store into directory `destination` (made when missing; it must hold no store
    /// yet): a consistent snapshot of one committed state, taken while writers go on (LMDB's
    /// `mdb_env_copy2` in one read transaction: writes keep committing, and none is in the
    /// copy half-done). With `compact`, the copy leaves out free pages: a store that grew and
    /// then lost records to deletes is copied at the size of what it holds.
    ///
    /// The copy is synced to disk before this returns. Opened, it is a new replica, as every
    /// copy of a store's file is: it takes a site of its own and sends its history to every
    /// peer again (``copiedFrom`` names this store's site), so a backup restored on a device
    /// never reuses what this store sent. Restore by opening the backup's directory (or by
    /// moving it where the app opens its store, with no process holding the old one).
    /// - Throws: ``StoreError``: `.noSpace` when `destination`'s file system fills (the
    ///   partial copy is removed); `.storage` when `destination` holds a `data.mdb` already, or
    ///   for another failure, naming `destination`; `.nestedWrite` inside a write closure.
    @discardableResult
    public func backup(to destination: String, compact: Bool = false) throws -> BackupReport {
        let report = try storageErrors(path) { try env.copy(to: destination, compact: compact) }
        let target = URL(fileURLWithPath: destination).standardizedFileURL.path
        let blobs: (count: Int, bytes: Int)
        do { blobs = try copyBlobs(to: target) } catch {
            // No half-made backup: the copied file goes with the blobs copied so far.
            try? FileManager.default.removeItem(atPath: BlobDirectory(storePath: target).url.path)
            unlink((target as NSString).appendingPathComponent("data.mdb"))
            unlink((target as NSString).appendingPathComponent("lock.mdb"))
            throw error
        }
        return BackupReport(path: target, sourceBytes: report.sourceBytes, bytes: report.copyBytes,
                            blobCount: blobs.count, blobBytes: blobs.bytes)
    }

    /// Copies every blob file of the store (``ExternalData``) into the blob directory of the
    /// backup in `destination`, after its data file was copied: a blob is written before the
    /// commit that references it, so every blob the copied records reference is here already.
    /// Blob files never change once written, so each is hard-linked where the file system
    /// allows it, copied (and synced) otherwise.
    private func copyBlobs(to destination: String) throws -> (count: Int, bytes: Int) {
        let source = BlobDirectory(storePath: path), target = BlobDirectory(storePath: destination)
        let blobs = source.list().blobs
        guard !blobs.isEmpty else { return (0, 0) }
        var bytes = 0
        for blob in blobs {
            let from = source.fileURL(blob.hash).path, to = target.fileURL(blob.hash).path
            if link(from, to) != 0 {
                guard errno == ENOENT || errno == EXDEV || errno == EPERM || errno == EMLINK else {
                    if errno == EEXIST { continue }
                    throw StoreError(errno == ENOSPC ? .noSpace : .blob, "store \(path): cannot copy blob \(blob.hash) to the backup in \(destination): \(String(cString: strerror(errno))); the backup was removed")
                }
                // Its directory is still missing, or another file system: write a copy.
                guard let data = try source.read(blob.hash) else { continue }   // collected meanwhile: unreferenced
                try target.write(data, as: ExternalData(sha256: blob.hash, size: data.count), checked: false)
            }
            bytes += blob.size
        }
        try target.syncDirectory(target.url)
        return (blobs.count, bytes)
    }

    /// Shrinks the store in directory `path` in place: its data is copied without free pages
    /// into `path/compacting` (see ``backup(to:compact:)``), which then replaces `data.mdb` in
    /// one rename, so that a crash leaves the old file or the new one. A store that grew to
    /// 87 MiB and lost most of its records to deletes gets the space back (LMDB reuses free
    /// pages but never shrinks its file).
    ///
    /// No process may have the store open meanwhile: not this one (release every `Store`,
    /// `FeatureGate`, `SyncEngine` and history observation of it first; opens of it here wait
    /// until the compaction is done) nor another one (their opens wait too). The compacted
    /// store is the same replica: it keeps its site id and history, unless its file was a copy
    /// not opened since it was copied, which stays a copy.
    /// - Throws: ``StoreError``: `.inUse` while a process has it open; `.noSpace` when the
    ///   compacted copy does not fit beside it (the store stays as it was); `.notAStore`.
    @discardableResult
    public static func compact(at path: String) throws -> BackupReport {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: (path as NSString).appendingPathComponent("data.mdb"), isDirectory: &isDirectory),
              !isDirectory.boolValue else {
            throw StoreError(.notAStore, "no store in \(path) (no data.mdb); nothing was changed")
        }
        // Where the file was the store's own (not a copy yet to be opened), the compacted file
        // is recorded as its own too: the store keeps its site.
        let before = Environment.dataFileIdentity(in: path)
        let report = try storageErrors(path) {
            try Environment.compact(path: path, maxDatabases: EnvironmentConfiguration().maxDatabases) { copy in
                let env = try Environment.open(path: copy, configuration: EnvironmentConfiguration(databases: StoreDatabases.specs))
                let dbs = try StoreDatabases(env)
                let identity = try env.dataFileIdentity()
                try env.write { txn in
                    guard let stored = try txn.get(dbs.meta, key: MetaKey.dataFile).map(SchemaMerger.fileIdentity(decoding:)),
                          let before, stored.isSameFile(as: before) else { return }
                    try txn.put(dbs.meta, key: MetaKey.dataFile, value: SchemaMerger.encoded(identity))
                }
            }
        }
        return BackupReport(path: URL(fileURLWithPath: path).standardizedFileURL.path, sourceBytes: report.sourceBytes, bytes: report.copyBytes)
    }
}
