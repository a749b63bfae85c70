import Benchmark
import Foundation
import Stash
import StashLMDB
import Synchronization

// The async store API and live queries of issue 41, Stash only (GRDB's async writes and
// `ValueObservation` are not measured here). Every store is a fresh scratch store of items in
// 100 homes; names end in `/0` (no fixture).
//
// | group     | one iteration is                                                      | read as   |
// |-----------|-----------------------------------------------------------------------|-----------|
// | async     | `1 writer`: one durable insert with the synchronous `store.write` and  | p50/p99   |
// |           | one with `await store.write`, in alternating order, each timed into   |           |
// |           | its own metric (`sync ns`, `async ns`)                                |           |
// |           | `T tasks`: T tasks × 4 durable inserts, one commit each, three ways   | ns/commit |
// |           | in turn: synchronous writes from tasks of the cooperative pool (what  |           |
// |           | an app without the async API does), synchronous writes from tasks on  |           |
// |           | threads of their own, async writes from tasks of the pool             |           |
// | livequery | `latency`: from the call of an insert (no sync) to the moment a       | p50/p99   |
// |           | consumer of `observeCount(handle, equals:)` receives the new count    |           |
// |           | `commit, 100 fetch observers`: one insert (no sync) and the time until | p50/p99   |
// |           | 100 consumers of a `#Predicate` fetch of one home's items (sorted by  |           |
// |           | name; the homes fill up over the run) have each received a result of  |           |
// |           | that commit; `commit, 100 count observers`: the same with one home's  |           |
// |           | count through the index handle (the machinery's own cost);            |           |
// |           | `commit, no observer`: the insert alone; `commit, 100 observers of    |           |
// |           | another type`: 100 observers of homes stay open while items are       |           |
// |           | inserted (none is evaluated)                                          |           |

enum AsyncBench {
    static let syncNS = BenchmarkMetric.custom("sync ns", polarity: .prefersSmaller, useScalingFactor: false)
    static let asyncNS = BenchmarkMetric.custom("async ns", polarity: .prefersSmaller, useScalingFactor: false)
    static let poolNS = BenchmarkMetric.custom("sync from pool tasks ns/commit", polarity: .prefersSmaller, useScalingFactor: false)
    static let threadsNS = BenchmarkMetric.custom("sync from thread tasks ns/commit", polarity: .prefersSmaller, useScalingFactor: false)
    static let asyncTasksNS = BenchmarkMetric.custom("async ns/commit", polarity: .prefersSmaller, useScalingFactor: false)
    static let latencyNS = BenchmarkMetric.custom("delivery ns", polarity: .prefersSmaller, useScalingFactor: false)
    static let homes = 100
    static let perTask = 4

    static func configuration(_ metrics: [BenchmarkMetric], iterations: Int) -> Benchmark.Configuration {
        .init(metrics: [.throughput] + metrics, warmupIterations: BenchConfig.smoke ? 2 : 10,
              maxDuration: .seconds(BenchConfig.smoke ? 2 : 15), maxIterations: BenchConfig.smoke ? 20 : iterations)
    }

    /// A fresh store of `homes` homes, at `durability`.
    static func open(_ name: String, _ durability: Durability) throws -> (Store, URL) {
        let directory = try Fixtures.scratch(name)
        var options = StoreOptions()
        options.durability = durability
        options.initialMapSize = 256 << 20
        let store = try Store.open(at: directory.path, types: [Home.self, Item.self], options: options)
        try store.write { tx in
            for h in 0..<homes { try tx.insert(Home(id: Workload.homeID(h), name: "home \(h)", createdAt: Date(timeIntervalSince1970: 0))) }
        }
        return (store, directory)
    }
}

/// Per-benchmark state of the async and live-query benchmarks.
final class AsyncState: @unchecked Sendable {
    var store: Store?
    var directory: URL?
    var next = 0
    var iteration = 0
    var consumers: [Task<Void, any Error>] = []
    let probe = DeliveryProbe()

    func item() -> Item {
        defer { next += 1 }
        return Workload.item(next, homes: AsyncBench.homes)
    }

    func close() {
        for consumer in consumers { consumer.cancel() }
        consumers = []
        try? store?.close()
        store = nil
        if let directory { Fixtures.remove(directory) }
        directory = nil
    }
}

/// What the live-query consumers received: per consumer, the newest item count it saw.
final class DeliveryProbe: Sendable {
    private let state = Mutex<(seen: [Int], at: UInt64)>(([], 0))
    private let condition = NSCondition()

    func reset(consumers: Int) { state.withLock { $0 = (Array(repeating: -1, count: consumers), 0) } }

    func deliver(_ consumer: Int, count: Int) {
        let now = monotonicNanoseconds()
        condition.lock()
        state.withLock { state in
            state.seen[consumer] = max(state.seen[consumer], count)
            state.at = now
        }
        condition.broadcast()
        condition.unlock()
    }

    /// Waits until every consumer saw `count` (at most 10 s); the time the last one did.
    func wait(forAll count: Int) throws -> UInt64 {
        let deadline = Date().addingTimeInterval(10)
        condition.lock()
        defer { condition.unlock() }
        while true {
            let (done, at) = state.withLock { ($0.seen.allSatisfy { $0 >= count }, $0.at) }
            if done { return at }
            guard condition.wait(until: deadline) else { throw BenchError("live query: no delivery of count \(count) within 10 s") }
        }
    }
}

func registerAsyncBenchmarks() {
    // One writer: the synchronous write and the async one, interleaved.
    do {
        let s = AsyncState()
        Benchmark("async/Stash/1 writer, full/0", configuration: AsyncBench.configuration([AsyncBench.syncNS, AsyncBench.asyncNS], iterations: 2_000)) { benchmark async throws in
            let store = s.store!
            let (a, b) = (s.item(), s.item())
            s.iteration += 1
            for way in s.iteration % 2 == 0 ? [true, false] : [false, true] {
                let start = monotonicNanoseconds()
                if way {
                    try store.write(isolation: #isolation) { tx in try tx.insert(a) }
                } else {
                    try await store.write { tx in try tx.insert(b) }
                }
                benchmark.measurement(way ? AsyncBench.syncNS : AsyncBench.asyncNS, Int(monotonicNanoseconds() - start))
            }
        } setup: {
            (s.store, s.directory) = try AsyncBench.open("async-1", .full)
            Fixtures.settle()
        } teardown: {
            s.close()
        }
    }

    // T writing tasks, three ways.
    for tasks in [8, 50] {
        let s = AsyncState()
        let commits = tasks * AsyncBench.perTask
        Benchmark("async/Stash/\(tasks) tasks, full/0",
                  configuration: AsyncBench.configuration([AsyncBench.poolNS, AsyncBench.threadsNS, AsyncBench.asyncTasksNS], iterations: 100)) { benchmark async throws in
            let store = s.store!
            let batches = (0..<3).map { _ in ItemBatch((0..<commits).map { _ in s.item() }) }
            // Synchronous writes from tasks of the cooperative pool: each holds a pool thread
            // while it waits for the disk.
            var start = monotonicNanoseconds()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for t in 0..<tasks {
                    group.addTask {
                        for k in 0..<AsyncBench.perTask {
                            try store.write(isolation: #isolation) { tx in try tx.insert(batches[0].items[t * AsyncBench.perTask + k]) }
                        }
                    }
                }
                try await group.waitForAll()
            }
            benchmark.measurement(AsyncBench.poolNS, Int(monotonicNanoseconds() - start) / commits)
            // The same from tasks on threads of their own.
            start = monotonicNanoseconds()
            try runInTasks(tasks) { t in
                for k in 0..<AsyncBench.perTask {
                    try store.write { tx in try tx.insert(batches[1].items[t * AsyncBench.perTask + k]) }
                }
            }
            benchmark.measurement(AsyncBench.threadsNS, Int(monotonicNanoseconds() - start) / commits)
            // Async writes from tasks of the pool.
            start = monotonicNanoseconds()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for t in 0..<tasks {
                    group.addTask {
                        for k in 0..<AsyncBench.perTask {
                            try await store.write { tx in try tx.insert(batches[2].items[t * AsyncBench.perTask + k]) }
                        }
                    }
                }
                try await group.waitForAll()
            }
            benchmark.measurement(AsyncBench.asyncTasksNS, Int(monotonicNanoseconds() - start) / commits)
        } setup: {
            (s.store, s.directory) = try AsyncBench.open("async-\(tasks)", .full)
            Fixtures.settle()
        } teardown: {
            s.close()
        }
    }

    // Live query delivery latency: one consumer of an index count.
    do {
        let s = AsyncState()
        Benchmark("livequery/Stash/latency/0", configuration: AsyncBench.configuration([AsyncBench.latencyNS], iterations: 5_000)) { benchmark in
            let store = s.store!
            let item = s.item()
            let start = monotonicNanoseconds()
            try store.insert(item)
            s.iteration += 1
            let at = try s.probe.wait(forAll: s.iteration)
            benchmark.measurement(AsyncBench.latencyNS, Int(at - start))
        } setup: {
            (s.store, s.directory) = try AsyncBench.open("livequery-latency", .none)
            let store = s.store!
            s.probe.reset(consumers: 1)
            let probe = s.probe
            s.consumers = [Task {
                for try await count in store.observeCount(FetchDescriptor<Item>()) { probe.deliver(0, count: count) }
            }]
            _ = try probe.wait(forAll: 0)
        } teardown: {
            s.close()
        }
    }

    // The cost of a commit with 100 observers open.
    for variant in ["commit, no observer", "commit, 100 fetch observers", "commit, 100 count observers", "commit, 100 observers of another type"] {
        let s = AsyncState()
        let observers = variant == "commit, no observer" ? 0 : 100
        let sameType = variant == "commit, 100 fetch observers" || variant == "commit, 100 count observers"
        let counts = variant == "commit, 100 count observers"
        Benchmark("livequery/Stash/\(variant)/0", configuration: AsyncBench.configuration([.wallClock], iterations: 3_000)) { _ in
            let store = s.store!
            try store.insert(s.item())
            s.iteration += 1
            if sameType { _ = try s.probe.wait(forAll: s.iteration) }
        } setup: {
            (s.store, s.directory) = try AsyncBench.open("livequery-\(observers)-\(sameType)", .none)
            let store = s.store!
            let probe = s.probe
            probe.reset(consumers: observers)
            let byHome = try store.index(\Item.homeID)
            for o in 0..<observers {
                let home = Workload.homeID(o % AsyncBench.homes)
                let descriptor = FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == home }, sortBy: [SortDescriptor(\.name)])
                if counts {
                    // The home's item count through the index (one mdb_cursor_count), and the
                    // total as the mark of the commit seen.
                    let query = store.observe(types: [Item.self]) { snapshot in (try snapshot.count(byHome, equals: home), try snapshot.count(Item.self)) }
                    s.consumers.append(Task { for try await (_, total) in query { probe.deliver(o, count: total) } })
                } else if sameType {
                    // The home's items, and the total as the mark of the commit seen.
                    let query = store.observe(types: [Item.self]) { snapshot in (try snapshot.fetch(descriptor).count, try snapshot.count(Item.self)) }
                    s.consumers.append(Task { for try await (_, total) in query { probe.deliver(o, count: total) } })
                } else {
                    let homes = FetchDescriptor<Home>(predicate: #Predicate { $0.id == home })
                    s.consumers.append(Task { for try await found in store.observe(homes) { probe.deliver(o, count: found.count) } })
                }
            }
            if observers > 0 { _ = try probe.wait(forAll: sameType ? 0 : 1) }
        } teardown: {
            s.close()
        }
    }
}
