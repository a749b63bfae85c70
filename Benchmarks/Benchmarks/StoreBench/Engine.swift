import Foundation
import Stash
import StashLMDB

/// How hard a commit works to reach the disk, mapped onto each engine:
///
/// | level     | Stash / raw LMDB            | GRDB (SQLite, WAL)    | a power cut may…                 |
/// |-----------|-----------------------------|-----------------------|----------------------------------|
/// | `full`    | `.full` (fsync every commit)| `synchronous = FULL`  | lose nothing that was committed  |
/// | `relaxed` | `.relaxed` (MDB_NOMETASYNC) | `synchronous = NORMAL`| lose the last commits, no damage |
/// | `none`    | `.none` (MDB_NOSYNC)        | `synchronous = OFF`   | lose much; LMDB may corrupt      |
enum SyncLevel: String, CaseIterable, Sendable {
    case full, relaxed, none

    var stash: Durability {
        switch self {
        case .full: return .full
        case .relaxed: return .relaxed
        case .none: return .none
        }
    }

    var sqlite: String {
        switch self {
        case .full: return "FULL"
        case .relaxed: return "NORMAL"
        case .none: return "OFF"
        }
    }
}

/// The workload protocol: every engine implements the same operations on the same data
/// (the idea of redb's bench-compare: one workload, several engines, one run).
protocol Engine: AnyObject {
    /// "Stash", "LMDB", "GRDB".
    static var name: String { get }
    /// Opens or creates the engine's store in `directory`.
    init(directory: URL, sync: SyncLevel) throws
    /// Inserts records in ONE transaction (one commit).
    func insert(homes: [Home]) throws
    func insert(items: [Item]) throws
    /// Inserts one item in its own transaction (one commit).
    func insert(_ item: Item) throws
    /// Point read by id, decoded into the typed record.
    func item(_ id: RecordID) throws -> Item?
    /// The number of items whose homeID equals `home`, through the engine's index.
    func countItems(home: RecordID) throws -> Int
    /// Increments one field of one item and commits (one transaction).
    func incrementWearCount(_ id: RecordID) throws
    /// Makes everything written so far durable and compacts what the engine compacts by
    /// itself (GRDB: WAL checkpoint) before the store is measured or copied.
    func flush() throws
    /// The files that make up the store, for on-disk size.
    func files() -> [URL]
}

extension Engine {
    /// Bytes on disk: (apparent file size, allocated blocks) summed over the store's files.
    func diskUsage() -> (apparent: Int, allocated: Int) {
        var apparent = 0, allocated = 0
        for file in files() {
            var info = stat()
            guard stat(file.path, &info) == 0 else { continue }
            apparent += Int(info.st_size)
            allocated += Int(info.st_blocks) * 512
        }
        return (apparent, allocated)
    }
}
