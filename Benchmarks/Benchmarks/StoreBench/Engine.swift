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
    /// The number of items stored (for checks after a benchmark).
    func itemCount() throws -> Int
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

// MARK: The gate-check workload

/// The free-tier limits of the gate-check workload, the same for every engine: at most
/// `maxHomes` homes and `maxItemsPerHome` items per home, set to what the N-item fixture holds
/// (N/100 homes, items spread round-robin). The store is at both limits and over none: every
/// existing home is full, a new home is empty.
struct GateLimits: Sendable {
    let maxHomes: Int
    let maxItemsPerHome: Int

    init(items n: Int) {
        let homes = Workload.homeCount(items: n)
        maxHomes = homes
        maxItemsPerHome = n / homes + (n % homes > 0 ? 1 : 0)
    }
}

/// A gate decision for "create one item in this home", as every engine states it.
enum GateVerdict: String, Sendable {
    case allowed
    /// Not premium and already above a limit (the downgrade-safe rule): no creation at all.
    case overLimit
    /// Not premium and the home is full.
    case itemLimitReached

    /// The rule the peers apply by hand once the entitlement says "free" (premium is allowed
    /// without counting), StashGate's rule for one item creation: more homes than allowed ⇒
    /// over limit; a full home ⇒ item limit; else allowed.
    static func decideFree(homes: Int, itemsInHome: Int, limits: GateLimits) -> GateVerdict {
        if homes > limits.maxHomes { return .overLimit }
        return itemsInHome >= limits.maxItemsPerHome ? .itemLimitReached : .allowed
    }
}

/// The user's premium entitlement in the gate fixtures: a yearly subscription bought two years
/// before the fixture was built, lapsed one year before it. Every check evaluates it against
/// the wall clock and finds the free tier, so the limits apply and the counts are read (a
/// premium user has no limits: StashGate, rightly, counts nothing for one).
///
/// The peers store what it boils down to for the hot path, the end of access in milliseconds
/// since 1970 (`lifetime` for a lifetime purchase), under the key / row `pro`.
enum BenchEntitlement {
    static let name = "pro"
    static let lifetime = Int64.max
    static let year: TimeInterval = 365 * 86_400

    static func purchasedAt(builtAt now: Date) -> Date { now.addingTimeInterval(-2 * year) }
    static func expiresAt(builtAt now: Date) -> Date { now.addingTimeInterval(-year) }
    static func expiresAtMilliseconds(builtAt now: Date) -> Int64 {
        Int64((expiresAt(builtAt: now).timeIntervalSince1970 * 1000).rounded(.down))
    }

    /// Access at the current wall-clock time, as the peers evaluate it.
    @inline(__always)
    static func isActive(endMilliseconds end: Int64) -> Bool {
        end == lifetime || wallClockMilliseconds() < end
    }
}

@inline(__always)
func wallClockMilliseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}

/// One engine's side of the gate-check benchmarks. A gate fixture is a copy of the engine's
/// N-item fixture plus what gating needs (``prepareGate(directory:limits:)``, run once when the
/// fixture is built); the normal fixtures stay as they are.
protocol GateEngine: AnyObject {
    static var name: String { get }
    /// Adds the entitlement (and for Stash the gate's record types) to a fresh copy of the
    /// N-item fixture in `directory`.
    static func prepareGate(directory: URL, limits: GateLimits) throws
    /// Opens a prepared gate fixture.
    init(gateDirectory: URL, limits: GateLimits) throws
    /// One gate check: "may the user create one more item in `home`?" — the entitlement, the
    /// number of homes and the number of items in `home`, in one read transaction, ⇒ decision.
    func checkCreateItem(in home: RecordID) throws -> GateVerdict
    /// Throws ``BenchError`` unless the stored entitlement is the lapsed subscription of
    /// ``BenchEntitlement`` (so that the checks evaluate it and find the free tier).
    func verifyEntitlement() throws
}
