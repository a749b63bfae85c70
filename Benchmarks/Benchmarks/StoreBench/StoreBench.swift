import Benchmark
import Foundation
import Stash

// Stash against raw LMDB and GRDB/SQLite on the "home/item" workload, in the same run.
//
// Every benchmark is named `group/engine/variant/N` (BenchReport parses the name):
//
// | group     | one iteration is                                              | read as         |
// |-----------|---------------------------------------------------------------|-----------------|
// | bulk      | 1,000 item inserts in one transaction, into a store growing to N | records/s    |
// | insert1   | one item insert, one commit, at a durability level            | p50/p99, ops/s  |
// | get       | one point read by id, decoded into `Item`                     | p50/p99, ops/s  |
// | count     | one count of the items of a home through the homeID index     | p50/p99         |
// | allocs    | one count, with malloc counting on                            | mallocs/op      |
// | update    | wearCount += 1 on one item, one commit                        | p50/p99, ops/s  |
// | disk      | nothing: reports the fixture's file sizes as custom metrics    | bytes           |
// | overhead  | nothing: the harness's own per-iteration cost                 | p50             |
//
// Sizes and iteration budgets come from the environment (see `BenchConfig`).

/// Per-benchmark state, filled by `setup`, read in the measured closure.
final class State<E: Engine> {
    var engine: E?
    var directory: URL?
    /// Pre-drawn random targets; the count is a power of two.
    var targets: [RecordID] = []
    var cursor = 0
    /// Items to write, prepared before `startMeasurement()` and kept until the next
    /// iteration so that their release is not measured either.
    var batch: [Item] = []
    var single: Item?
    var nextItem = 0
    var homes = 1
    var rng = SplitMix64(seed: 42)

    @inline(__always)
    func nextTarget() -> RecordID {
        let id = targets[cursor & (targets.count - 1)]
        cursor &+= 1
        return id
    }

    func close() {
        engine = nil
        batch = []
        if let directory, directory.path.contains("/scratch/") { Fixtures.remove(directory) }
        directory = nil
    }
}

enum Budget {
    static let smoke = BenchConfig.smoke
    /// Point reads and counts: a few µs each.
    static var micro: Benchmark.Configuration { .init(
        metrics: [.wallClock, .throughput], timeUnits: .nanoseconds, warmupIterations: smoke ? 10 : 2_000,
        maxDuration: .seconds(smoke ? 1 : 3), maxIterations: smoke ? 200 : 300_000) }
    /// Allocation counting: the count is the same every iteration, few are needed.
    static var allocs: Benchmark.Configuration { .init(
        metrics: [.mallocCountTotal, .throughput], warmupIterations: smoke ? 10 : 1_000,
        maxDuration: .seconds(smoke ? 1 : 2), maxIterations: smoke ? 100 : 10_000) }
    /// One commit per iteration.
    static func commits(_ sync: SyncLevel) -> Benchmark.Configuration {
        .init(metrics: [.wallClock, .throughput], timeUnits: .microseconds, warmupIterations: smoke ? 2 : 20,
              maxDuration: .seconds(smoke ? 1 : 5), maxIterations: smoke ? 20 : (sync == .full ? 2_000 : 5_000))
    }
    /// Exactly N/1000 batches: the store grows from 0 to N items.
    static func bulk(_ n: Int) -> Benchmark.Configuration {
        .init(metrics: [.wallClock, .throughput], timeUnits: .milliseconds, warmupIterations: 0,
              scalingFactor: .kilo, maxDuration: .seconds(3_600), maxIterations: max(1, n / Fixtures.batchSize))
    }
    static var once: Benchmark.Configuration { .init(
        metrics: [.throughput, DiskMetric.apparent, DiskMetric.allocated], warmupIterations: 0,
        maxDuration: .seconds(60), maxIterations: 1) }
}

enum DiskMetric {
    static let apparent = BenchmarkMetric.custom("disk bytes (file size)", polarity: .prefersSmaller, useScalingFactor: false)
    static let allocated = BenchmarkMetric.custom("disk bytes (allocated)", polarity: .prefersSmaller, useScalingFactor: false)
}

/// Draws `count` (a power of two) random ids with `make(index)` over `0..<range`.
func drawTargets(_ count: Int, range: Int, seed: UInt64, _ make: (Int) -> RecordID) -> [RecordID] {
    var rng = SplitMix64(seed: seed)
    return (0..<count).map { _ in make(Int(rng.next() % UInt64(range))) }
}

// MARK: Registration, generic over the engine

func registerBulk<E: Engine>(_: E.Type, n: Int) {
    let s = State<E>()
    Benchmark("bulk/\(E.name)/1000 per txn/\(BenchConfig.label(n))", configuration: Budget.bulk(n)) { benchmark in
        s.batch = []
        let start = s.nextItem
        s.batch = (start..<start + Fixtures.batchSize).map { Workload.item($0, homes: s.homes) }
        s.nextItem += Fixtures.batchSize
        benchmark.startMeasurement()
        try s.engine!.insert(items: s.batch)
    } setup: {
        let directory = try Fixtures.scratch("bulk-\(E.name)")
        s.directory = directory
        s.homes = Workload.homeCount(items: n)
        s.engine = try E(directory: directory, sync: .full)
        try s.engine!.insert(homes: (0..<s.homes).map(Workload.home))
    } teardown: {
        s.close()
    }
}

func registerSingleInsert<E: Engine>(_: E.Type, n: Int, sync: SyncLevel) {
    let s = State<E>()
    Benchmark("insert1/\(E.name)/\(sync.rawValue)/\(BenchConfig.label(n))", configuration: Budget.commits(sync)) { benchmark in
        s.single = Workload.item(s.nextItem, homes: s.homes)
        s.nextItem += 1
        benchmark.startMeasurement()
        try s.engine!.insert(s.single!)
    } setup: {
        let directory = try Fixtures.copy(E.self, items: n, name: "insert1-\(E.name)-\(sync)")
        s.directory = directory
        s.homes = Workload.homeCount(items: n)
        s.nextItem = n
        s.engine = try E(directory: directory, sync: sync)
    } teardown: {
        s.close()
    }
}

func registerGet<E: Engine>(_: E.Type, n: Int, variant: String = "typed",
                             _ get: @escaping (E, RecordID) throws -> Item? = { try $0.item($1) }) {
    let s = State<E>()
    Benchmark("get/\(E.name)/\(variant)/\(BenchConfig.label(n))", configuration: Budget.micro) { _ in
        blackHole(try get(s.engine!, s.nextTarget()))
    } setup: {
        s.engine = try E(directory: try Fixtures.ensure(E.self, items: n), sync: .full)
        s.targets = drawTargets(1 << 16, range: n, seed: 1, Workload.itemID)
        let probe = n / 2
        guard try get(s.engine!, Workload.itemID(probe)) == Workload.item(probe, homes: Workload.homeCount(items: n)) else {
            throw BenchError("get/\(E.name): the record read back differs from the one written")
        }
    } teardown: {
        s.close()
    }
}

/// `count` and `allocs` for one engine and one way of counting.
func registerCount<E: Engine>(_: E.Type, n: Int, variant: String, _ count: @escaping (E, RecordID) throws -> Int) {
    for (group, configuration) in [("count", Budget.micro), ("allocs", Budget.allocs)] {
        let s = State<E>()
        Benchmark("\(group)/\(E.name)/\(variant)/\(BenchConfig.label(n))", configuration: configuration) { _ in
            blackHole(try count(s.engine!, s.nextTarget()))
        } setup: {
            s.engine = try E(directory: try Fixtures.ensure(E.self, items: n), sync: .full)
            let homes = Workload.homeCount(items: n)
            s.targets = drawTargets(1 << 12, range: homes, seed: 2, Workload.homeID)
            let expected = n / homes + (n % homes > 0 ? 1 : 0)
            let got = try count(s.engine!, Workload.homeID(0))
            guard got == expected else {
                throw BenchError("\(group)/\(E.name)/\(variant): home 0 has \(got) items, expected \(expected)")
            }
        } teardown: {
            s.close()
        }
    }
}

func registerUpdate<E: Engine>(_: E.Type, n: Int, sync: SyncLevel) {
    let s = State<E>()
    Benchmark("update/\(E.name)/\(sync.rawValue)/\(BenchConfig.label(n))", configuration: Budget.commits(sync)) { _ in
        try s.engine!.incrementWearCount(s.nextTarget())
    } setup: {
        let directory = try Fixtures.copy(E.self, items: n, name: "update-\(E.name)-\(sync)")
        s.directory = directory
        s.engine = try E(directory: directory, sync: sync)
        s.targets = drawTargets(1 << 16, range: n, seed: 3, Workload.itemID)
    } teardown: {
        s.close()
    }
}

func registerDisk<E: Engine>(_: E.Type, n: Int) {
    let s = State<E>()
    Benchmark("disk/\(E.name)/files/\(BenchConfig.label(n))", configuration: Budget.once) { benchmark in
        var apparent = 0, allocated = 0
        let names = (try? FileManager.default.contentsOfDirectory(atPath: s.directory!.path)) ?? []
        // Data files only: LMDB's lock.mdb and SQLite's -shm are runtime coordination files.
        for name in names where name != "complete" && name != "lock.mdb" && !name.hasSuffix("-shm") {
            var info = stat()
            guard stat(s.directory!.appendingPathComponent(name).path, &info) == 0 else { continue }
            apparent += Int(info.st_size)
            allocated += Int(info.st_blocks) * 512
        }
        benchmark.measurement(DiskMetric.apparent, apparent)
        benchmark.measurement(DiskMetric.allocated, allocated)
    } setup: {
        s.directory = try Fixtures.ensure(E.self, items: n)
    }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

// MARK: The suite

let benchmarks: @Sendable () -> Void = {
    Benchmark("overhead/harness/empty/0", configuration: Budget.micro) { _ in
        blackHole(0)
    }

    for n in BenchConfig.sizes {
        registerBulk(StashEngine.self, n: n)
        registerBulk(RawLMDBEngine.self, n: n)
        registerBulk(GRDBEngine.self, n: n)

        for sync in SyncLevel.allCases {
            registerSingleInsert(StashEngine.self, n: n, sync: sync)
            registerSingleInsert(RawLMDBEngine.self, n: n, sync: sync)
            registerSingleInsert(GRDBEngine.self, n: n, sync: sync)
        }

        registerGet(StashEngine.self, n: n)
        registerGet(RawLMDBEngine.self, n: n)
        registerGet(GRDBEngine.self, n: n)
        registerGet(GRDBEngine.self, n: n, variant: "cached SQL") { try $0.itemWithCachedSQL($1) }

        registerCount(StashEngine.self, n: n, variant: "fast path") { try $0.countItems(home: $1) }
        registerCount(StashEngine.self, n: n, variant: "index handle") { try $0.countItemsWithHandle(home: $1) }
        registerCount(StashEngine.self, n: n, variant: "predicate") { try $0.countItemsWithPredicate(home: $1) }
        registerCount(RawLMDBEngine.self, n: n, variant: "dup count") { try $0.countItems(home: $1) }
        registerCount(GRDBEngine.self, n: n, variant: "fetchCount") { try $0.countItems(home: $1) }
        registerCount(GRDBEngine.self, n: n, variant: "cached SQL") { try $0.countItemsWithCachedSQL(home: $1) }

        for sync in [SyncLevel.full, .relaxed] {
            registerUpdate(StashEngine.self, n: n, sync: sync)
            registerUpdate(RawLMDBEngine.self, n: n, sync: sync)
            registerUpdate(GRDBEngine.self, n: n, sync: sync)
        }

        registerDisk(StashEngine.self, n: n)
        registerDisk(RawLMDBEngine.self, n: n)
        registerDisk(GRDBEngine.self, n: n)
    }
}
