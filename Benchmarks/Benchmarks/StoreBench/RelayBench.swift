import Benchmark
import Foundation
import Stash
import StashSync

// The relay as the family's home (issue 35). Stash only: no peer keeps a family's data in a
// shared folder, so the goals are absolute.
//
// | group | one iteration is                                                          | read as          |
// |-------|---------------------------------------------------------------------------|------------------|
// | relay | `restore`: a new, empty store (full durability) syncs with a relay        | records/s        |
// |       | directory holding a family of N items as one checkpoint (encrypted: the   | (goal ≥ 150k)    |
// |       | family has a key), and restores every item                                |                  |
// |       | `size`: two devices of a family of N/10 items each edit 10% of the items   | relay ÷ live     |
// |       | and sync through the relay, 100 rounds; the relay's bytes against the      | data, ×100       |
// |       | family's live data (its checkpoint's bytes), measured once                  | (goal ≤ 200)     |
//
// Names are `relay/Stash/<restore|size>/<N>`.

enum RelayBench {
    static let family = RecordID(high: 0x0190_0000_0000_7000, low: 0x8000_0000_0000_BE9D)
    static let key: SyncKey = try! SyncKey(Array("stash-bench-relay-key-0123456789".utf8))
    static let ratio = BenchmarkMetric.custom("relay ÷ live ×100", polarity: .prefersSmaller, useScalingFactor: false)

    static func open(_ directory: URL, sync: SyncLevel) throws -> (StashEngine, SyncEngine) {
        let engine = try StashEngine(directory: directory, sync: sync)
        return (engine, try SyncEngine(store: engine.store, configuration: SyncConfiguration(family: family, key: key, enabled: true)))
    }

    /// The bytes of every file under `url`.
    static func bytes(under url: URL) -> Int {
        (FileManager.default.enumerator(at: url, includingPropertiesForKeys: [.fileSizeKey, .isRegularFileKey])?.compactMap { item -> Int? in
            guard let file = item as? URL, let values = try? file.resourceValues(forKeys: [.fileSizeKey, .isRegularFileKey]),
                  values.isRegularFile == true else { return nil }
            return values.fileSize
        }.reduce(0, +)) ?? 0
    }
}

/// `relay/Stash/restore/N`: one iteration restores a new store from the relay alone.
func registerRelayRestore(n: Int) {
    let name = "relay/Stash/restore/\(BenchConfig.label(n))"
    var relay: URL?
    var scratch: [URL] = []
    let large = n >= 100_000
    Benchmark(name, configuration: .init(metrics: [.wallClock, .throughput], warmupIterations: large ? 0 : 1,
                                         maxDuration: .seconds(BenchConfig.smoke ? 2 : (large ? 90 : 20)),
                                         maxIterations: BenchConfig.smoke ? 2 : (large ? 3 : 10))) { benchmark in
        let directory = try Fixtures.scratch("relay-restore-\(scratch.count)")
        scratch.append(directory)
        let (store, sync) = try RelayBench.open(directory, sync: .full)
        benchmark.startMeasurement()
        let report = try await sync.sync(via: RelayTransport(directory: relay!))
        benchmark.stopMeasurement()
        guard report.refused.isEmpty, try store.store.count(Item.self) == n else {
            throw BenchError("\(name): restored \(try store.store.count(Item.self)) of \(n) items (\(report))")
        }
        Fixtures.remove(directory)
    } setup: {
        let source = try Fixtures.scratch("relay-restore-source")
        let url = try Fixtures.scratch("relay-restore-relay")
        relay = url
        do {
            let (store, sync) = try RelayBench.open(source, sync: .none)
            let homes = Workload.homeCount(items: n)
            var start = 0
            while start < n {
                let end = min(n, start + Fixtures.batchSize)
                try store.insert(items: (start..<end).map { Workload.item($0, homes: homes) })
                start = end
            }
            try await sync.publishCheckpoint(via: RelayTransport(directory: url))
        }
        Fixtures.remove(source)
        Fixtures.settle()
    } teardown: {
        for directory in scratch { Fixtures.remove(directory) }
        if let relay { Fixtures.remove(relay) }
    }
}

/// `relay/Stash/size/N`: the relay's size after 100 rounds of edits, against the family's data.
func registerRelaySize(n: Int) {
    let name = "relay/Stash/size/\(BenchConfig.label(n))"
    let items = max(100, n / 10)
    Benchmark(name, configuration: .init(metrics: [RelayBench.ratio], warmupIterations: 0, maxIterations: 1)) { benchmark in
        let a = try Fixtures.scratch("relay-size-a"), b = try Fixtures.scratch("relay-size-b"), url = try Fixtures.scratch("relay-size-relay")
        defer { for directory in [a, b, url] { Fixtures.remove(directory) } }
        let relay = RelayTransport(directory: url)
        let (storeA, syncA) = try RelayBench.open(a, sync: .none)
        let (storeB, syncB) = try RelayBench.open(b, sync: .none)
        let homes = Workload.homeCount(items: items)
        try storeA.insert(items: (0..<items).map { Workload.item($0, homes: homes) })
        try await syncA.sync(via: relay)
        try await syncB.sync(via: relay)
        for round in 0..<(BenchConfig.smoke ? 10 : 100) {
            for (offset, (store, sync)) in [(storeA, syncA), (storeB, syncB)].enumerated() {
                try await store.store.write { tx in
                    for i in stride(from: (round + offset) % 10, to: items, by: 10) {
                        try tx.update(Item.self, id: Workload.itemID(i)) { $0.wearCount += 1 }
                    }
                }
                try await sync.sync(via: relay)
            }
        }
        for _ in 0..<2 { try await syncA.sync(via: relay); try await syncB.sync(via: relay) }
        // The family's live data: a checkpoint of it, as the relay would hold it.
        let live = try Fixtures.scratch("relay-size-live")
        defer { Fixtures.remove(live) }
        try await syncA.publishCheckpoint(via: RelayTransport(directory: live))
        let ratio = Double(RelayBench.bytes(under: url)) / Double(max(1, RelayBench.bytes(under: live)))
        benchmark.measurement(RelayBench.ratio, Int((ratio * 100).rounded()))
    }
}

/// Every relay benchmark.
func registerRelayBenchmarks() {
    for n in BenchConfig.sizes {
        registerRelayRestore(n: n)
        registerRelaySize(n: n)
    }
}
