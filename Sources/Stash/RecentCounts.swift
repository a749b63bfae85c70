import StashLMDB
import Synchronization

/// The record counts and index group sizes that this `Store`'s own recent commits left, kept
/// in memory once someone asks for them (``Store/keepRecentCounts(of:groupedBy:)``): a reader
/// that counted at an earlier history sequence brings its counts up to a later one from
/// these, without reading history, records or counts (a gate's check right after the app's
/// own commit).
///
/// Only commits of this `Store` are kept, each with the sequences its history entry goes
/// from and to. A commit of another process (or of another `Store` on the same directory)
/// leaves a gap in that chain, and so does one made before the index was kept or that changed
/// more groups than are kept per commit: an answer across a gap is "unknown", never a guess.
final class RecentCounts: Sendable {
    /// One commit: what its write transaction's counts were once its changes were made.
    struct Commit: Sendable {
        /// The history sequence before the commit's entry, and the entry's own.
        let from: UInt64
        let to: UInt64
        /// The indexes kept when it was made (``RecentCounts/key(typeTag:indexTag:)``).
        let indexes: [UInt32]
        /// The record count after it of each type whose count it changed.
        let totals: [(typeTag: UInt16, count: Int)]
        /// The size after it of each group of a kept index that it changed (a group: one value
        /// of a record-id field; records without a value are in none).
        let groups: [(index: UInt32, value: RecordID, size: Int)]
        /// False when it changed more groups than are listed, or a key of a kept index that
        /// names no record id: its groups are unknown.
        let complete: Bool
    }

    /// What is kept, and the commits kept: the last ``capacity`` handed over, in a ring
    /// (`next` is where the next one goes).
    private struct State {
        var enabled = false
        var indexes: [UInt32] = []
        var commits: [Commit] = []
        var next = 0

        /// The kept commit whose history entry follows sequence `from`, looked for newest
        /// first: a reader is usually one or a few commits behind, so this reads one or a few
        /// entries of the ring, not all of it (the first check after a commit meets them out
        /// of the cache).
        func commit(from: UInt64) -> Commit? {
            var position = next
            for _ in 0..<commits.count {
                position = (position == 0 ? commits.count : position) - 1
                if commits[position].from == from { return commits[position] }
            }
            return nil
        }
    }

    private let state = Mutex(State())

    /// Commits kept: a reader more than this many commits behind reads history instead.
    static let capacity = 32
    /// Groups one commit lists at most: a larger write (a bulk insert) lists none, and the
    /// reader reads history instead (where it also stops after a few dozen changes).
    static let groupsPerCommit = 64

    /// An index as kept: its type tag and index tag.
    static func key(typeTag: UInt16, indexTag: UInt16) -> UInt32 { UInt32(typeTag) << 16 | UInt32(indexTag) }

    /// Starts keeping the counts of every commit from now on, and the groups of `index` if any.
    func keep(index: UInt32?) {
        state.withLock { state in
            state.enabled = true
            if let index, !state.indexes.contains(index) { state.indexes.append(index) }
        }
    }

    /// What a write transaction starting now notes: nil when nothing is kept.
    var keptIndexes: [UInt32]? {
        state.withLock { $0.enabled ? $0.indexes : nil }
    }

    /// Adds a commit once it is durable, in place of the one handed over ``capacity`` commits
    /// earlier. Commits of one group commit may arrive in any order.
    func record(_ commit: Commit) {
        state.withLock { state in
            if state.commits.count < Self.capacity {
                state.commits.append(commit)
            } else {
                state.commits[state.next] = commit
            }
            state.next = (state.next + 1) % Self.capacity
        }
    }

    /// Brings counts taken at history sequence `from` up to `to`: `total`, the count of type
    /// `typeTag` then, becomes its count now, and `visit` sees each group of `index` (if any)
    /// that changed, with its size, oldest commit first (a later size replaces an earlier one).
    /// Returns false, and changes nothing, when this store's commits do not cover every
    /// sequence in between (see ``RecentCounts``), or when `from` is after `to` (counts are
    /// never taken back). O(commits kept + groups visited); no allocation.
    func bringUpToDate(from: UInt64, to: UInt64, typeTag: UInt16, total: inout Int, index: UInt32?,
                       _ visit: (RecordID, Int) -> Void) -> Bool {
        guard from <= to else { return false }
        return state.withLock { state in
            var at = from
            while at < to {
                guard let commit = state.commit(from: at), commit.to <= to else { return false }
                if let index, !commit.complete || !commit.indexes.contains(index) { return false }
                at = commit.to
            }
            at = from
            while at < to, let commit = state.commit(from: at) {
                for entry in commit.totals where entry.typeTag == typeTag { total = entry.count }
                if let index {
                    for group in commit.groups where group.index == index { visit(group.value, group.size) }
                }
                at = commit.to
            }
            return true
        }
    }
}

/// The groups a write transaction changed in the indexes kept by ``RecentCounts``, noted as
/// it puts and deletes index entries; their sizes are read at commit.
struct ChangedGroups {
    /// The kept indexes (``RecentCounts/key(typeTag:indexTag:)``).
    let indexes: [UInt32]
    private(set) var groups: [(index: UInt32, value: RecordID)] = []
    /// More groups changed than are noted, or a key that names no record id.
    private(set) var overflowed = false

    init(indexes: [UInt32]) { self.indexes = indexes }

    /// Notes the group of index key `key` (type tag, index tag, then the field's component:
    /// a presence byte and, for a record id, its 16 bytes), if its index is kept. A few dozen
    /// instructions for a key of another index.
    mutating func note(_ key: borrowing KeyBytes) {
        guard !overflowed, key.count >= 5 else { return }
        let index = key.uint32(bigEndianAt: 0)
        guard indexes.contains(index) else { return }
        let presence = key[4]
        // No value: the record is in no group (as in `groups(_:largerThan:)`).
        if key.count == 5, presence == 0 { return }
        guard key.count == 21, presence == 1 else { overflowed = true; groups = []; return }
        let value = RecordID(high: key.uint64(bigEndianAt: 5), low: key.uint64(bigEndianAt: 13))
        if groups.contains(where: { $0.index == index && $0.value == value }) { return }
        guard groups.count < RecentCounts.groupsPerCommit else { overflowed = true; groups = []; return }
        if groups.isEmpty { groups.reserveCapacity(4) }   // a move changes two groups: one allocation
        groups.append((index, value))
    }

    /// The index key of `value`'s group in `index`.
    static func key(_ index: UInt32, _ value: RecordID) -> KeyBytes {
        var key = StoreKeys.indexPrefix(UInt16(index >> 16), UInt16(truncatingIfNeeded: index))
        IndexComponent.recordID(value, &key)
        return key
    }
}
