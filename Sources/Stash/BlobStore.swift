import Foundation
import StashLMDB

/// A store's blob directory, `DIR/blobs/`: one file per blob, named by the lowercase hex
/// SHA-256 of its bytes. A blob is written to `.tmp-<uuid>` in the directory, synced, renamed
/// into place and the directory synced, so a blob name holds all of its bytes or is absent; a
/// killed writer leaves at most a temporary file, which ``Store/collectGarbageBlobs(olderThan:)``
/// removes once it is older than the grace period.
struct BlobDirectory: Sendable {
    /// `DIR/blobs`.
    let url: URL
    /// The store's path, for messages.
    let store: String

    static let name = "blobs"
    static let temporaryPrefix = ".tmp-"

    init(storePath: String) {
        store = storePath
        url = URL(fileURLWithPath: storePath).appendingPathComponent(Self.name)
    }

    func fileURL(_ hash: String) -> URL { url.appendingPathComponent(hash) }

    /// The size of blob `hash` as a file here, or nil when absent.
    func size(of hash: String) -> Int? {
        var info = stat()
        guard stat(fileURL(hash).path, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { return nil }
        return Int(info.st_size)
    }

    /// Whether the blob of `reference` is here whole (present, of its size).
    func holds(_ reference: ExternalData) -> Bool { size(of: reference.sha256) == reference.size }

    /// Keeps `data` as the blob `reference` names, durably, before returning: written atomically
    /// when absent, or (present already) its modification time set to now, so that a collection
    /// running meanwhile counts it as young (see ``Store/collectGarbageBlobs(olderThan:)``).
    /// - Throws: `StoreError(.invalidValue)` when `data` is not the blob `reference` names;
    ///   `StoreError(.blob)` when the file cannot be written.
    func write(_ data: Data, as reference: ExternalData, checked: Bool = true) throws {
        if checked {
            guard data.count == reference.size, ExternalData.hash(of: data) == reference.sha256 else {
                throw StoreError(.invalidValue, "store \(store): bytes of \(data.count) B given for blob \(reference.sha256) (\(reference.size) B) are not that blob (their SHA-256 or size differs); nothing was kept")
            }
        }
        let target = fileURL(reference.sha256)
        if holds(reference) {
            // Young again: a collection that read the references before this write commits
            // leaves it (it removes only blobs older than its grace period).
            if utimes(target.path, nil) == 0 { return }
        }
        try makeDirectory()
        let temporary = url.appendingPathComponent(Self.temporaryPrefix + UUID().uuidString)
        let fd = open(temporary.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw failure("cannot create \(temporary.path)") }
        var ok = false
        defer {
            if !ok { unlink(temporary.path) }
        }
        do {
            defer { close(fd) }
            try data.withUnsafeBytes { raw in
                var offset = 0
                while offset < raw.count {
                    let written = Foundation.write(fd, raw.baseAddress! + offset, raw.count - offset)
                    if written < 0 {
                        if errno == EINTR { continue }
                        throw failure("cannot write \(temporary.path)")
                    }
                    offset += written
                }
            }
            guard fsync(fd) == 0 else { throw failure("cannot sync \(temporary.path)") }
        }
        guard rename(temporary.path, target.path) == 0 else { throw failure("cannot move \(temporary.lastPathComponent) to \(target.path)") }
        ok = true
        try syncDirectory(url)
    }

    /// The bytes of blob `hash`, or nil when absent.
    func read(_ hash: String) throws -> Data? {
        let target = fileURL(hash)
        guard FileManager.default.fileExists(atPath: target.path) else { return nil }
        do { return try Data(contentsOf: target, options: .alwaysMapped) }
        catch { throw StoreError(.blob, "store \(store): blob \(target.path) cannot be read (\(error.localizedDescription)); check the file's permissions, or run `stash verify \(store)`") }
    }

    /// Every blob file (name, size, modification time) and every temporary file, by name.
    func list() -> (blobs: [(hash: String, size: Int, modified: Date)], temporary: [(name: String, modified: Date)]) {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: url.path)) ?? []
        var blobs: [(String, Int, Date)] = []
        var temporary: [(String, Date)] = []
        for name in names {
            var info = stat()
            guard stat(url.appendingPathComponent(name).path, &info) == 0 else { continue }
            let modified = Date(timeIntervalSince1970: Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9)
            if name.hasPrefix(Self.temporaryPrefix) {
                temporary.append((name, modified))
            } else if ExternalData.isHash(name), (info.st_mode & S_IFMT) == S_IFREG {
                blobs.append((name, Int(info.st_size), modified))
            }
        }
        return (blobs, temporary)
    }

    private func makeDirectory() throws {
        var info = stat()
        if stat(url.path, &info) == 0 { return }
        if mkdir(url.path, 0o755) != 0 && errno != EEXIST { throw failure("cannot create \(url.path)") }
        // The directory's own entry in the store directory survives a power cut.
        try syncDirectory(url.deletingLastPathComponent())
    }

    func syncDirectory(_ directory: URL) throws {
        let fd = open(directory.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw failure("cannot open \(directory.path) to sync it") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw failure("cannot sync \(directory.path)") }
    }

    private func failure(_ what: String) -> StoreError {
        let code = errno
        if code == ENOSPC || code == EDQUOT {
            return StoreError(.noSpace, "store \(store): \(what): no space left on device; free some space, then try again")
        }
        return StoreError(.blob, "store \(store): \(what): \(String(cString: strerror(code))); check the disk's free space and the directory's permissions")
    }
}
