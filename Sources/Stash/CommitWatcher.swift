import Foundation
import StashLMDB
import Synchronization

/// Tells the live queries of one directory about the commits of this process: every `Store`
/// of the directory shares one signal, so a commit through any of them wakes the watchers
/// of all of them at once. Commits of other processes are found by polling (see
/// ``CommitWatcher``).
final class CommitSignal: Sendable {
    private final class Weak: @unchecked Sendable { weak var signal: CommitSignal? }
    private static let registry = Mutex<[String: Weak]>([:])

    /// The signal of directory `path` (canonical), shared by the stores of it in this process.
    static func forPath(_ path: String) -> CommitSignal {
        registry.withLock { entries in
            if let live = entries[path]?.signal { return live }
            let signal = CommitSignal()
            let entry = Weak()
            entry.signal = signal
            entries[path] = entry
            if entries.count > 64 { entries = entries.filter { $0.value.signal != nil } }
            return signal
        }
    }

    private let watchers = Mutex<[ObjectIdentifier: CommitWatcher]>([:])
    private let count = Atomic<Int>(0)

    /// Whether any watcher listens: a commit costs one atomic load when none does.
    @inline(__always)
    var isWatched: Bool { count.load(ordering: .relaxed) > 0 }

    func add(_ watcher: CommitWatcher) {
        watchers.withLock { watchers in
            watchers[ObjectIdentifier(watcher)] = watcher
            count.store(watchers.count, ordering: .relaxed)
        }
    }

    func remove(_ watcher: CommitWatcher) {
        watchers.withLock { watchers in
            watchers[ObjectIdentifier(watcher)] = nil
            count.store(watchers.count, ordering: .relaxed)
        }
    }

    /// A commit happened: wakes every watcher of the directory.
    func notify() {
        let all = watchers.withLock { Array($0.values) }
        for watcher in all { watcher.wake() }
    }
}

/// One live query as its watcher sees it; its state is read and changed under the watcher's
/// lock only, except ``evaluate(_:)``.
protocol WatchedQuery: AnyObject, Sendable {
    /// The record types whose commits may change the result.
    var types: Set<String> { get }
    /// A commit may have changed the result and the consumer waits for one. Under the lock.
    var needsResult: Bool { get }
    /// A commit touched one of ``types``. Under the lock.
    func markDirty()
    /// The result in `snapshot`, to hand over under the lock (outside it: this may take long).
    func evaluate(_ snapshot: StoreSnapshot) -> () -> Void
    /// Ends the query: its consumer gets `error`, or the end of the sequence. Under the lock.
    func end(_ error: (any Error)?)
}

/// Follows one store's commits for its live queries, on a thread of its own (started with the
/// first query, ended with the last): woken at once by this process's commits
/// (``CommitSignal``), and every poll interval it compares the environment's last committed
/// transaction id (`mdb_env_info`, no transaction, no allocation) with the last snapshot it
/// read, to find other processes' commits. After a commit it reads, in one snapshot, the
/// history entries since (only to learn which types they touched) and evaluates there every
/// query of a touched type whose consumer waits for a result. A query whose consumer is busy
/// is only marked; it is evaluated once when its consumer asks next, however many commits
/// came meanwhile.
final class CommitWatcher: @unchecked Sendable {
    private let store: Store
    private let condition = NSCondition()
    /// Under `condition`.
    private var queries: [ObjectIdentifier: any WatchedQuery] = [:]
    private var woken = false
    private var retired = false
    private var pollInterval: TimeInterval
    /// The watcher thread's own.
    private var token: HistoryToken?
    private var lastSnapshot: UInt64 = 0

    private init(store: Store, pollInterval: TimeInterval) {
        self.store = store
        self.pollInterval = pollInterval
    }

    /// Adds `query` to `store`'s watcher, starting one when it has none.
    /// - Throws: `.closed` when the store is closed.
    static func add(_ query: any WatchedQuery, to store: Store, pollInterval: Duration) throws -> CommitWatcher {
        let seconds = max(0.001, Double(pollInterval.components.seconds) + Double(pollInterval.components.attoseconds) / 1e18)
        while true {
            try store.checkOpen()
            var started: CommitWatcher?
            let watcher = store.runtime.watcher.withLock { slot in
                if let slot { return slot }
                let new = CommitWatcher(store: store, pollInterval: seconds)
                slot = new
                started = new
                return new
            }
            guard watcher.add(query, pollInterval: seconds) else {
                // Retired just now (its last query ended): it is leaving the slot.
                store.runtime.watcher.withLock { if $0 === watcher { $0 = nil } }
                continue
            }
            if let started {
                store.runtime.signal.add(started)
                started.start()
            }
            return watcher
        }
    }

    private func add(_ query: any WatchedQuery, pollInterval: TimeInterval) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard !retired else { return false }
        queries[ObjectIdentifier(query)] = query
        self.pollInterval = min(self.pollInterval, pollInterval)
        woken = true
        condition.signal()
        return true
    }

    /// Removes `query` (its consumer is gone), ending it.
    func remove(_ query: any WatchedQuery) {
        condition.lock()
        queries[ObjectIdentifier(query)] = nil
        query.end(nil)
        condition.signal()
        condition.unlock()
    }

    /// Runs `body` under the lock guarding the queries' state.
    func locked<T>(_ body: () throws -> T) rethrows -> T {
        condition.lock()
        defer { condition.unlock() }
        return try body()
    }

    /// A query's consumer waits for a result: evaluate it at the next round.
    func wake() {
        condition.lock()
        woken = true
        condition.signal()
        condition.unlock()
    }

    /// The store was closed: every query ends with `error`.
    func storeClosed(_ error: StoreError) {
        condition.lock()
        for query in queries.values { query.end(error) }
        queries.removeAll()
        condition.signal()
        condition.unlock()
    }

    private func start() {
        startNamedThread("stash.observe", stackSize: 1 << 20) { [self] in run() }
    }

    private func run() {
        while true {
            condition.lock()
            while true {
                if queries.isEmpty {
                    retired = true
                    condition.unlock()
                    store.runtime.watcher.withLock { if $0 === self { $0 = nil } }
                    store.runtime.signal.remove(self)
                    return
                }
                if woken { break }
                if !condition.wait(until: Date(timeIntervalSinceNow: pollInterval)) { break }   // poll
            }
            woken = false
            let current = Array(queries.values)
            condition.unlock()
            round(current)
        }
    }

    /// Marks the queries of the types committed to since the last round, and evaluates those
    /// whose consumers wait, in one read snapshot. Without a commit and without a waiting
    /// consumer, it costs one `mdb_env_info`.
    private func round(_ current: [any WatchedQuery]) {
        let committed = UInt64(store.env.info().lastTransactionID)
        let waiting = locked { current.contains { $0.needsResult } }
        if token != nil && committed == lastSnapshot && !waiting { return }
        do {
            try store.performRead { snapshot in
                let id = snapshot.txn.snapshotID
                if token == nil || id != lastSnapshot {
                    let touched = try touchedTypes(in: snapshot, of: current.reduce(into: Set<String>()) { $0.formUnion($1.types) })
                    locked {
                        for query in current where touched.map({ !$0.isDisjoint(with: query.types) }) ?? true { query.markDirty() }
                    }
                    lastSnapshot = id
                }
                let due = locked { current.filter { $0.needsResult } }
                let deliveries = due.map { $0.evaluate(snapshot) }
                locked { for deliver in deliveries { deliver() } }
            }
        } catch {
            // The store cannot be read (closed, or its files failed): the queries end with why.
            condition.lock()
            for query in current { query.end(error); queries[ObjectIdentifier(query)] = nil }
            condition.unlock()
        }
    }

    /// The types of `types` that commits after ``token`` touched, in `snapshot`; nil when
    /// that history is gone (purged, or the store was restored from an older copy): every
    /// query may have changed. Moves ``token`` to the snapshot's newest entry.
    private func touchedTypes(in snapshot: StoreSnapshot, of types: Set<String>) throws -> Set<String>? {
        guard let from = token else {
            token = try snapshot.historyBounds().current
            return []   // the first round: every query is new, and evaluated anyway
        }
        var touched = Set<String>()
        var after = from
        do {
            while true {
                let page = try snapshot.historyPage(after: after, types: types, limit: 256)
                for entry in page.entries { for change in entry.changes { touched.insert(change.type) } }
                after = page.scannedThrough
                if page.reachedEnd || touched == types { break }
            }
            token = after
            if touched == types { token = try snapshot.historyBounds().current }
            return touched
        } catch let error as StoreError where error.code == .historyPurged || error.code == .historyAhead {
            token = try snapshot.historyBounds().current
            return nil
        }
    }
}
