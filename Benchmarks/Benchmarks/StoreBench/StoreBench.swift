import Benchmark
import Foundation
import Stash

// Stash against raw LMDB and GRDB/SQLite on the "home/item" workload, in the same run.
//
// Every benchmark is named `group/engine/variant/N` (BenchReport parses the name):
//
// | group     | one iteration is                                              | read as         |
// |-----------|---------------------------------------------------------------|-----------------|
// | bulk      | 1,000 item inserts in one transaction on EACH engine (`all`), | records/s       |
// |           | into stores growing from 0 to N                               |                 |
// | insert1   | one item insert + commit on each engine, per durability level | p50/p99, ops/s  |
// | get       | one point read by id, decoded into `Item`                     | p50/p99, ops/s  |
// | count     | one count of the items of a home through the homeID index     | p50/p99         |
// | pairedget | the `get` of Stash and of raw LMDB for the same id, in one    | p50/p99, ops/s  |
// |           | iteration, timed apart (PairedReadBench.swift)                |                 |
// | pairedcount| the same for the fast-path count vs `mdb_cursor_count`       | p50/p99         |
// | allocs    | one count, with malloc counting on                            | mallocs/op      |
// | concurrent| 8 threads × 16 single-item commits on each engine (group commit)| ops/s          |
// | concurrenttasks| the same from 8 Swift tasks (each on a thread of its own) | ops/s     |
// | update    | wearCount += 1 on one item + commit on each engine            | p50/p99, ops/s  |
// | disk      | nothing: reports the fixture's file sizes as custom metrics    | bytes           |
// | gate      | one gate check: entitlement + count homes + count items in a  | p50/p99         |
// |           | home ⇒ decision (GateBench.swift)                             |                 |
// | gateallocs| one gate check, with malloc counting on                       | mallocs/op      |
// | delta     | export (makeDelta + encode) or import (apply into an empty    | records/s,      |
// |           | store) of K = 1k / 100k changes, Stash only (DeltaBench.swift) | bytes/change    |
// | async, livequery | async vs synchronous writes, live-query delivery and commit cost (AsyncBench.swift) | p50/p99 |
// | overhead  | nothing: the harness's own per-iteration cost                 | p50             |
//
// Sizes and iteration budgets come from the environment (see `BenchConfig`).

/// Per-benchmark state of the read benchmarks, filled by `setup`, read in the measured closure.
final class State<E: Engine> {
    var engine: E?
    var directory: URL?
    var targets = TargetCycle()

    func close() {
        engine = nil
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
    /// Paired reads: the `micro` budget, with one time metric per engine instead of the wall
    /// clock of the whole iteration (see `registerPairedRead`).
    static var pairedReads: Benchmark.Configuration {
        var configuration = micro
        configuration.metrics = [.throughput] + ReadPair.metrics
        return configuration
    }
    /// Allocation counting: the count is the same every iteration, few are needed.
    static var allocs: Benchmark.Configuration { .init(
        metrics: [.mallocCountTotal, .throughput], warmupIterations: smoke ? 10 : 1_000,
        maxDuration: .seconds(smoke ? 1 : 2), maxIterations: smoke ? 100 : 10_000) }
    /// One commit per iteration.
    /// One commit per engine per iteration (see `Trio`).
    static func commits(_ sync: SyncLevel) -> Benchmark.Configuration {
        .init(metrics: [.throughput] + Trio.metrics, warmupIterations: smoke ? 2 : 20,
              maxDuration: .seconds(smoke ? 1 : 10), maxIterations: smoke ? 20 : (sync == .full ? 2_000 : 5_000))
    }
    /// Exactly N/1000 batches per engine: each store grows from 0 to N items.
    static func bulk(_ n: Int) -> Benchmark.Configuration {
        .init(metrics: [.throughput] + Trio.metrics, warmupIterations: 0,
              maxDuration: .seconds(3_600), maxIterations: max(1, n / Fixtures.batchSize))
    }
    /// One round of concurrent single commits per engine per iteration.
    static var concurrent: Benchmark.Configuration {
        .init(metrics: [.throughput] + Trio.metrics, warmupIterations: smoke ? 1 : 5,
              maxDuration: .seconds(smoke ? 1 : 10), maxIterations: smoke ? 5 : 300)
    }
    static var once: Benchmark.Configuration { .init(
        metrics: [.throughput, DiskMetric.apparent, DiskMetric.allocated], warmupIterations: 0,
        maxDuration: .seconds(60), maxIterations: 1) }
}

enum DiskMetric {
    static let apparent = BenchmarkMetric.custom("disk bytes (file size)", polarity: .prefersSmaller, useScalingFactor: false)
    static let allocated = BenchmarkMetric.custom("disk bytes (allocated)", polarity: .prefersSmaller, useScalingFactor: false)
}

/// Pre-drawn benchmark targets, visited in a cycle without bounds checks on the hot path.
struct TargetCycle {
    private var ids: [RecordID] = []
    private var cursor = 0

    /// No targets yet: a benchmark's setup draws them before the first `next()`.
    init() {}

    /// `ids.count` must be a power of two.
    init(_ ids: [RecordID]) {
        precondition(ids.count > 0 && ids.count & (ids.count - 1) == 0, "target count must be a power of two")
        self.ids = ids
    }

    @inline(__always)
    mutating func next() -> RecordID {
        let id = ids[cursor & (ids.count - 1)]
        cursor &+= 1
        return id
    }
}

/// Draws `count` (a power of two) random ids with `make(index)` over `0..<range`.
func drawTargets(_ count: Int, range: Int, seed: UInt64, _ make: (Int) -> RecordID) -> [RecordID] {
    var rng = SplitMix64(seed: seed)
    return (0..<count).map { _ in make(Int(rng.next() % UInt64(range))) }
}

// MARK: Registration, generic over the engine

// MARK: Writes: the three engines interleaved

/// The write benchmarks (bulk, insert1, update) run the three engines side by side: every
/// iteration does the same write on each engine, in a rotating order, timing each one into
/// its own custom metric (`Stash ns`, `LMDB ns`, `GRDB ns`). Commits wait for the disk, and
/// the disk of a shared machine is busy at random moments; interleaving makes all engines
/// meet the same moments, so their ratios hold even when the absolute numbers drift.
final class Trio {
    var engines: [any Engine] = []
    var directories: [URL] = []
    var targets = TargetCycle()
    var batch: [Item] = []
    var single: Item?
    var nextItem = 0
    var homes = 1
    var iteration = 0

    static let names = [StashEngine.name, RawLMDBEngine.name, GRDBEngine.name]
    static let metrics = names.map(metric)

    /// The custom metric that holds one engine's time per operation, in nanoseconds (`Stash ns`).
    static func metric(_ engine: String) -> BenchmarkMetric {
        .custom("\(engine) ns", polarity: .prefersSmaller, useScalingFactor: false)
    }

    func open(sync: SyncLevel, _ directory: (any Engine.Type) throws -> URL) throws {
        let types: [any Engine.Type] = [StashEngine.self, RawLMDBEngine.self, GRDBEngine.self]
        for type in types {
            let dir = try directory(type)
            directories.append(dir)
            engines.append(try type.init(directory: dir, sync: sync))
        }
    }

    /// Runs `body` on each engine in this iteration's order and records each one's time.
    func each(_ benchmark: Benchmark, _ body: (any Engine) throws -> Void) throws {
        let first = iteration % engines.count
        iteration += 1
        for k in 0..<engines.count {
            let e = (first + k) % engines.count
            try timed(benchmark, Self.metrics[e]) { try body(engines[e]) }
        }
    }

    func close() {
        engines = []
        batch = []
        for dir in directories where dir.path.contains("/scratch/") { Fixtures.remove(dir) }
        directories = []
    }
}

/// Runs `body` once and records its time, in nanoseconds, into the custom metric `metric`:
/// the clock is read right before and right after `body`, so nothing else is timed.
@inline(__always)
func timed(_ benchmark: Benchmark, _ metric: BenchmarkMetric, _ body: () throws -> Void) rethrows {
    let start = monotonicNanoseconds()
    try body()
    let elapsed = monotonicNanoseconds() - start
    benchmark.measurement(metric, Int(elapsed))
}

@inline(__always)
func monotonicNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

/// Loads N items in transactions of 1,000 into three empty stores, one batch per iteration.
func registerBulk(n: Int) {
    let t = Trio()
    Benchmark("bulk/all/1000 per txn/\(BenchConfig.label(n))", configuration: Budget.bulk(n)) { benchmark in
        t.batch = []
        t.batch = (t.nextItem..<t.nextItem + Fixtures.batchSize).map { Workload.item($0, homes: t.homes) }
        t.nextItem += Fixtures.batchSize
        try t.each(benchmark) { try $0.insert(items: t.batch) }
    } setup: {
        t.homes = Workload.homeCount(items: n)
        try t.open(sync: .full) { type in try Fixtures.scratch("bulk-\(type.name)") }
        for engine in t.engines { try engine.insert(homes: (0..<t.homes).map(Workload.home)) }
        Fixtures.settle()
    } teardown: {
        t.close()
    }
}

/// One item per commit into a copy of the N-item fixture.
func registerSingleInsert(n: Int, sync: SyncLevel) {
    let t = Trio()
    Benchmark("insert1/all/\(sync.rawValue)/\(BenchConfig.label(n))", configuration: Budget.commits(sync)) { benchmark in
        t.single = Workload.item(t.nextItem, homes: t.homes)
        t.nextItem += 1
        try t.each(benchmark) { try $0.insert(t.single!) }
    } setup: {
        t.homes = Workload.homeCount(items: n)
        t.nextItem = n
        try t.open(sync: sync) { type in try Fixtures.copy(type, items: n, name: "insert1-\(type.name)-\(sync)") }
        Fixtures.settle()
    } teardown: {
        t.close()
    }
}

/// `wearCount += 1` on a random item, one commit, in a copy of the N-item fixture.
func registerUpdate(n: Int, sync: SyncLevel) {
    let t = Trio()
    Benchmark("update/all/\(sync.rawValue)/\(BenchConfig.label(n))", configuration: Budget.commits(sync)) { benchmark in
        let id = t.targets.next()
        try t.each(benchmark) { try $0.incrementWearCount(id) }
    } setup: {
        try t.open(sync: sync) { type in try Fixtures.copy(type, items: n, name: "update-\(type.name)-\(sync)") }
        t.targets = TargetCycle(drawTargets(1 << 16, range: n, seed: 3, Workload.itemID))
        Fixtures.settle()
    } teardown: {
        t.close()
    }
}

// MARK: Reads: one engine per benchmark

/// What a read benchmark reads in the N-item store: pre-drawn random targets, and one target
/// whose answer is known, checked on every engine before it is measured.
struct ReadTargets<Answer: Equatable> {
    let targets: TargetCycle
    let probe: RecordID
    let expected: Answer
    /// The probe in words, for the error message.
    let what: String

    /// Throws unless `read` gives the known answer on `engine`.
    func verify<E>(_ engine: E, name: String, _ read: (E, RecordID) throws -> Answer) throws {
        let got = try read(engine, probe)
        guard got == expected else {
            throw BenchError("\(name): \(what) reads back as \(got), expected \(expected)")
        }
    }
}

extension ReadTargets where Answer == Item? {
    /// Point reads (`get`): 2^16 random items; item N/2 must read back as it was written.
    init(items n: Int) {
        let probe = n / 2
        self.init(targets: TargetCycle(drawTargets(1 << 16, range: n, seed: 1, Workload.itemID)),
                  probe: Workload.itemID(probe), expected: Workload.item(probe, homes: Workload.homeCount(items: n)),
                  what: "item \(probe)")
    }
}

extension ReadTargets where Answer == Int {
    /// Counts (`count`): 2^12 random homes; home 0 must hold its share of the N items.
    init(homes n: Int) {
        let homes = Workload.homeCount(items: n)
        self.init(targets: TargetCycle(drawTargets(1 << 12, range: homes, seed: 2, Workload.homeID)),
                  probe: Workload.homeID(0), expected: n / homes + (n % homes > 0 ? 1 : 0),
                  what: "the item count of home 0")
    }
}

/// Opens engine `E` in place on its N-item fixture (built if missing) for a read benchmark's
/// setup: reads the fixture's files once first, so that the OS page cache is warm whatever ran
/// before, then checks `read` against `reads`' known answer. The caller ends its setup with
/// `Fixtures.settle()`.
func openForReading<E: Engine, Answer>(_: E.Type, n: Int, name: String, _ reads: ReadTargets<Answer>,
                                       _ read: (E, RecordID) throws -> Answer) throws -> E {
    let directory = try Fixtures.ensure(E.self, items: n)
    Fixtures.warm(directory)
    let engine = try E(directory: directory, sync: .full)
    try reads.verify(engine, name: name, read)
    return engine
}

func registerGet<E: Engine>(_: E.Type, n: Int, variant: String = "typed",
                             _ get: @escaping (E, RecordID) throws -> Item? = { try $0.item($1) }) {
    let s = State<E>()
    let name = "get/\(E.name)/\(variant)/\(BenchConfig.label(n))"
    Benchmark(name, configuration: Budget.micro) { _ in
        blackHole(try get(s.engine!, s.targets.next()))
    } setup: {
        let reads = ReadTargets(items: n)
        s.engine = try openForReading(E.self, n: n, name: name, reads, get)
        s.targets = reads.targets
        Fixtures.settle()
    } teardown: {
        s.close()
    }
}

/// `count` and `allocs` for one engine and one way of counting.
func registerCount<E: Engine>(_: E.Type, n: Int, variant: String, _ count: @escaping (E, RecordID) throws -> Int) {
    for (group, configuration) in [("count", Budget.micro), ("allocs", Budget.allocs)] {
        let s = State<E>()
        let name = "\(group)/\(E.name)/\(variant)/\(BenchConfig.label(n))"
        Benchmark(name, configuration: configuration) { _ in
            blackHole(try count(s.engine!, s.targets.next()))
        } setup: {
            let reads = ReadTargets(homes: n)
            s.engine = try openForReading(E.self, n: n, name: name, reads, count)
            s.targets = reads.targets
            Fixtures.settle()
        } teardown: {
            s.close()
        }
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
        Fixtures.settle()
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
        registerBulk(n: n)
        for sync in SyncLevel.allCases { registerSingleInsert(n: n, sync: sync) }
        for inTasks in [false, true] {
            for sync in [SyncLevel.full, .relaxed] { registerConcurrentInsert(n: n, sync: sync, inTasks: inTasks) }
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

        // The same reads of Stash and raw LMDB as `get/…/typed` and `count/…/fast path` and `…/dup count`, paired.
        registerPairedRead(group: "pairedget", variant: "typed", n: n, ReadTargets<Item?>.init(items:),
                           stash: { try $0.item($1) }, raw: { try $0.item($1) })
        registerPairedRead(group: "pairedcount", variant: "fast path", n: n, ReadTargets<Int>.init(homes:),
                           stash: { try $0.countItems(home: $1) }, raw: { try $0.countItems(home: $1) })

        for sync in [SyncLevel.full, .relaxed] { registerUpdate(n: n, sync: sync) }

        registerDisk(StashEngine.self, n: n)
        registerDisk(RawLMDBEngine.self, n: n)
        registerDisk(GRDBEngine.self, n: n)

        registerGateBenchmarks(n: n)
    }

    registerDeltaBenchmarks()
    registerRelayBenchmarks()
    registerAsyncBenchmarks()
    registerBlobBenchmarks()
}
