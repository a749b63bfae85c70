import Benchmark
import Foundation
import Stash
import StashSync

// Delta export and import of issue 6: K changes (K = 1,000 and 100,000) shipped from one
// store to another with StashSync. Stash only: neither peer has sync, so there is nothing to
// compare with; the goal is absolute (≥ 100k records/s each way).
//
// | group | one iteration is                                                       | read as             |
// |-------|------------------------------------------------------------------------|---------------------|
// | delta | `export`: `makeDelta` of the K changes + `encoded(key:)` (bytes ready   | records/s,          |
// |       | to travel, HMAC-authenticated)                                         | delta bytes/change  |
// |       | `import`: `apply` of those bytes into a fresh, empty store (validation, | records/s           |
// |       | merge and watermark in one durable write transaction)                  |                     |
//
// The source is a scratch store holding exactly K new items (no homes), written in
// transactions of 1,000 and never acknowledged, so every export covers the same K changes.
// Deltas are made for the relay (no recipient), so any store of the family can import them.
// Names are `delta/Stash/<export|import>/<K>`: the last component is K, not N.

enum DeltaBench {
    /// K: the number of changes per delta.
    static var sizes: [Int] { BenchConfig.smoke ? [1_000] : [1_000, 100_000] }
    static let family = RecordID(high: 0x0190_0000_0000_7000, low: 0x8000_0000_0000_BE9C)
    static let key: SyncKey = try! SyncKey(Array("stash-bench-sync-key-0123456789a".utf8))
    static let bytes = BenchmarkMetric.custom("delta bytes", polarity: .prefersSmaller, useScalingFactor: false)

    static func configuration(_ k: Int) -> Benchmark.Configuration {
        let large = k >= 100_000
        return .init(metrics: [.wallClock, .throughput, bytes], warmupIterations: BenchConfig.smoke || large ? 1 : 3,
                     maxDuration: .seconds(BenchConfig.smoke ? 2 : (large ? 60 : 10)),
                     maxIterations: BenchConfig.smoke ? 3 : (large ? 5 : 100))
    }

    /// Opens `directory` as a store of the family, with sync on.
    static func open(_ directory: URL, sync: SyncLevel) throws -> (StashEngine, SyncEngine) {
        let engine = try StashEngine(directory: directory, sync: sync)
        let sync = try SyncEngine(store: engine.store, configuration: SyncConfiguration(family: family, key: key, enabled: true))
        return (engine, sync)
    }
}

/// Per-benchmark state of the delta benchmarks.
final class DeltaState {
    var source: (store: StashEngine, sync: SyncEngine)?
    var sourceDirectory: URL?
    var destinations: [URL] = []
    /// The encoded delta of the K changes.
    var data = Data()
    var imports = 0

    /// Builds the source store of K changes and its delta, and checks that the delta makes an
    /// empty store converge: same number of items, sampled items equal to the ones written.
    func prepare(k: Int, name: String) throws {
        let directory = try Fixtures.scratch("delta-source-\(k)")
        sourceDirectory = directory
        source = try DeltaBench.open(directory, sync: .none)
        let homes = Workload.homeCount(items: k)
        var start = 0
        while start < k {
            let end = min(k, start + Fixtures.batchSize)
            try source!.store.insert(items: (start..<end).map { Workload.item($0, homes: homes) })
            start = end
        }
        let delta = try source!.sync.makeDelta(for: nil)
        guard delta.entries.count == k, !delta.isFullSnapshot else {
            throw BenchError("\(name): the delta holds \(delta.entries.count) record states (full snapshot: \(delta.isFullSnapshot)), expected the \(k) changes")
        }
        data = delta.encoded(key: DeltaBench.key)

        let (store, sync) = try openDestination()
        let outcome = try sync.apply(data, name: name)
        let items = try store.store.count(Item.self), others = try store.store.count(Home.self)
        guard outcome == .applied(entries: k, changed: k), items == k, others == 0 else {
            throw BenchError("\(name): importing into an empty store gave \(outcome), \(items) items and \(others) homes; expected \(k) items")
        }
        for i in [0, k / 2, k - 1] {
            guard try store.item(Workload.itemID(i)) == Workload.item(i, homes: homes) else {
                throw BenchError("\(name): item \(i) differs after the import")
            }
        }
    }

    /// A fresh, empty store of the family, at full durability (what an app gets).
    func openDestination() throws -> (StashEngine, SyncEngine) {
        let directory = try Fixtures.scratch("delta-destination-\(imports)")
        imports += 1
        destinations.append(directory)
        return try DeltaBench.open(directory, sync: .full)
    }

    /// Removes the destination stores (they must be closed: no engine of theirs left).
    func removeDestinations() {
        for directory in destinations { Fixtures.remove(directory) }
        destinations = []
    }

    func close() {
        source = nil
        removeDestinations()
        if let sourceDirectory { Fixtures.remove(sourceDirectory) }
        sourceDirectory = nil
    }
}

/// `delta/Stash/export/K`: one iteration makes and encodes the delta of the K changes.
func registerDeltaExport(k: Int) {
    let s = DeltaState()
    let name = "delta/Stash/export/\(BenchConfig.label(k))"
    Benchmark(name, configuration: DeltaBench.configuration(k)) { benchmark in
        let data = try s.source!.sync.makeDelta(for: nil).encoded(key: DeltaBench.key)
        benchmark.measurement(DeltaBench.bytes, data.count)
        blackHole(data)
    } setup: {
        try s.prepare(k: k, name: name)
        s.removeDestinations()
        Fixtures.settle()
    } teardown: {
        s.close()
    }
}

/// `delta/Stash/import/K`: one iteration applies the delta to a fresh, empty store; opening
/// that store happens before the measurement starts, closing and removing it after it stops.
func registerDeltaImport(k: Int) {
    let s = DeltaState()
    let name = "delta/Stash/import/\(BenchConfig.label(k))"
    Benchmark(name, configuration: DeltaBench.configuration(k)) { benchmark in
        var outcome: ApplyOutcome?
        do {
            let (_, sync) = try s.openDestination()
            benchmark.startMeasurement()
            outcome = try sync.apply(s.data, name: name)
            benchmark.stopMeasurement()
        }
        s.removeDestinations()
        guard outcome == .applied(entries: k, changed: k) else {
            throw BenchError("\(name): the import gave \(outcome.map { "\($0)" } ?? "nothing"), expected \(k) changed records")
        }
    } setup: {
        try s.prepare(k: k, name: name)
        s.close()   // only the delta's bytes are needed from here on
        Fixtures.settle()
    } teardown: {
        s.close()
    }
}

/// Every delta benchmark (K does not depend on N).
func registerDeltaBenchmarks() {
    for k in DeltaBench.sizes {
        registerDeltaExport(k: k)
        registerDeltaImport(k: k)
    }
}
