import Benchmark
import Foundation
import Stash
import StashLMDB
import StashSync

// External storage of large binary values (issue 38): a garment with a 5 MB image, its image
// kept outside the record (`ExternalData`) against inline (`Data`), in the same run.
//
// | group | one iteration is                                                        | read as         |
// |-------|-------------------------------------------------------------------------|-----------------|
// | blobs | `insert`: one garment with a new 5 MB image, one durable (full) commit   | p50 ms          |
// |       | `delta`: `wearCount += 1` on such a garment, then the delta of that edit | delta bytes     |
// |       | `list`: fetch the 10 garments of a store (typed, decoded)                | p50 ms, image   |
// |       |                                                                         | bytes decoded   |
// |       | `relay`: a new device restores 100 garments with 2 MB images from a     | MB/s            |
// |       | relay directory (records and blobs, sealed, hash-checked), durability full |             |
// Names are `blobs/Stash/<what> <external|inline>/<N>`.

struct BenchGarment: Record {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var wearCount = 0
    var image: ExternalData?
}

struct BenchInlineGarment: Record {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var wearCount = 0
    var image: Data?
}

enum BlobBench {
    static let imageBytes = 5_000_000
    static let family = RecordID(high: 0x0190_0000_0000_7000, low: 0x8000_0000_0000_B10B)
    static let key: SyncKey = try! SyncKey(Array("stash-bench-blob-key-0123456789ab".utf8))
    static let deltaBytes = BenchmarkMetric.custom("delta bytes", polarity: .prefersSmaller, useScalingFactor: false)
    static let decodedBytes = BenchmarkMetric.custom("image bytes decoded", polarity: .prefersSmaller, useScalingFactor: false)
    static let megabytesPerSecond = BenchmarkMetric.custom("MB/s", polarity: .prefersLarger, useScalingFactor: false)

    /// `extra`: the custom metric the benchmark reports besides the wall clock.
    static func configuration(_ extra: BenchmarkMetric? = nil, units: BenchmarkTimeUnits = .milliseconds) -> Benchmark.Configuration {
        .init(metrics: [.wallClock] + (extra.map { [$0] } ?? []), timeUnits: units, warmupIterations: 1,
              maxDuration: .seconds(BenchConfig.smoke ? 2 : 10), maxIterations: BenchConfig.smoke ? 3 : 30)
    }

    /// Different bytes per seed, so that no two images share a blob.
    static func image(_ seed: UInt64, bytes: Int = imageBytes) -> Data {
        var state = seed &* 0x9E37_79B9_7F4A_7C15 | 1
        var data = Data(count: bytes)
        data.withUnsafeMutableBytes { raw in
            let words = raw.bindMemory(to: UInt64.self)
            for i in words.indices {
                state ^= state << 13; state ^= state >> 7; state ^= state << 17
                words[i] = state
            }
        }
        return data
    }

    static func open(_ directory: URL, external: Bool, durability: Durability = .full) throws -> Store {
        var options = StoreOptions()
        options.durability = durability
        options.initialMapSize = 1 << 30
        return try Store.open(at: directory.path, types: [external ? BenchGarment.self : BenchInlineGarment.self], options: options)
    }

    static func insert(_ store: Store, external: Bool, seed: UInt64, bytes: Int = imageBytes) throws -> RecordID {
        let data = image(seed, bytes: bytes)
        if external {
            let garment = BenchGarment(name: "g\(seed)", image: ExternalData(data))
            try store.insert(garment)
            return garment.id
        }
        let garment = BenchInlineGarment(name: "g\(seed)", image: data)
        try store.insert(garment)
        return garment.id
    }
}

final class BlobState {
    var store: Store?
    var directory: URL?
    var ids: [RecordID] = []
    var seed: UInt64 = 1_000
    func close() {
        store = nil
        if let directory { Fixtures.remove(directory) }
        directory = nil
    }
}

func registerBlobBenchmarks() {
    for external in [true, false] {
        let variant = external ? "external" : "inline"
        do {
            let s = BlobState()
            Benchmark("blobs/Stash/insert \(variant)/5MB", configuration: BlobBench.configuration()) { benchmark in
                s.seed += 1
                let data = BlobBench.image(s.seed)
                benchmark.startMeasurement()
                if external { try s.store!.insert(BenchGarment(name: "g", image: ExternalData(data))) }
                else { try s.store!.insert(BenchInlineGarment(name: "g", image: data)) }
                benchmark.stopMeasurement()
            } setup: {
                s.directory = try Fixtures.scratch("blob-insert-\(variant)")
                s.store = try BlobBench.open(s.directory!, external: external)
            } teardown: { s.close() }
        }
        do {
            let s = BlobState()
            Benchmark("blobs/Stash/delta \(variant)/5MB", configuration: BlobBench.configuration(BlobBench.deltaBytes)) { benchmark in
                let sync = try SyncEngine(store: s.store!, configuration: SyncConfiguration(family: BlobBench.family, key: BlobBench.key, enabled: true))
                let id = s.ids[0]
                if external { _ = try s.store!.update(BenchGarment.self, id: id) { $0.wearCount += 1 } }
                else { _ = try s.store!.update(BenchInlineGarment.self, id: id) { $0.wearCount += 1 } }
                let delta = try sync.makeDelta(for: nil)
                let data = delta.encoded(key: BlobBench.key)
                try sync.acknowledge(peer: nil, through: delta.to)
                benchmark.measurement(BlobBench.deltaBytes, data.count)
            } setup: {
                s.directory = try Fixtures.scratch("blob-delta-\(variant)")
                s.store = try BlobBench.open(s.directory!, external: external)
                s.ids = [try BlobBench.insert(s.store!, external: external, seed: 1)]
                let sync = try SyncEngine(store: s.store!, configuration: SyncConfiguration(family: BlobBench.family, key: BlobBench.key, enabled: true))
                try sync.acknowledge(peer: nil, through: try sync.makeDelta(for: nil).to)
            } teardown: { s.close() }
        }
        do {
            let s = BlobState()
            Benchmark("blobs/Stash/list \(variant)/10", configuration: BlobBench.configuration(BlobBench.decodedBytes, units: .microseconds)) { benchmark in
                var decoded = 0
                if external {
                    for garment in try s.store!.fetch(FetchDescriptor<BenchGarment>()) { decoded += garment.image?.bytes?.count ?? 0 }
                } else {
                    for garment in try s.store!.fetch(FetchDescriptor<BenchInlineGarment>()) { decoded += garment.image?.count ?? 0 }
                }
                benchmark.measurement(BlobBench.decodedBytes, decoded)
            } setup: {
                s.directory = try Fixtures.scratch("blob-list-\(variant)")
                s.store = try BlobBench.open(s.directory!, external: external, durability: .none)
                for n in 0..<10 { s.ids.append(try BlobBench.insert(s.store!, external: external, seed: UInt64(n))) }
            } teardown: { s.close() }
        }
    }
    let s = BlobState()
    var source: URL?
    let images = BenchConfig.smoke ? 10 : 100, size = 2_000_000
    Benchmark("blobs/Stash/relay external/\(images)", configuration: .init(
        metrics: [.wallClock, BlobBench.megabytesPerSecond], timeUnits: .milliseconds, warmupIterations: 0,
        maxDuration: .seconds(BenchConfig.smoke ? 5 : 60), maxIterations: BenchConfig.smoke ? 1 : 3)) { benchmark in
        let device = s.directory!.appendingPathComponent("device-\(UUID().uuidString)")
        let relay = RelayTransport(directory: s.directory!.appendingPathComponent("relay"))
        let start = ContinuousClock.now
        let store = try BlobBench.open(device, external: true)
        let sync = try SyncEngine(store: store, configuration: SyncConfiguration(family: BlobBench.family, key: BlobBench.key, enabled: true))
        let report = try awaitSync { try await sync.sync(via: relay) }
        let elapsed = ContinuousClock.now - start
        guard report.blobsReceived == images, report.blobsPending == 0 else {
            throw BenchError("relay restore: \(report.blobsReceived) blobs received, \(report.blobsPending) pending; expected \(images)")
        }
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        benchmark.measurement(BlobBench.megabytesPerSecond, Int(Double(images * size) / 1e6 / seconds))
        Fixtures.remove(device)
    } setup: {
        s.directory = try Fixtures.scratch("blob-relay")
        let relayURL = s.directory!.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: relayURL, withIntermediateDirectories: true)
        source = s.directory!.appendingPathComponent("source")
        let store = try BlobBench.open(source!, external: true, durability: .none)
        for n in 0..<images { _ = try BlobBench.insert(store, external: true, seed: UInt64(n), bytes: size) }
        let sync = try SyncEngine(store: store, configuration: SyncConfiguration(family: BlobBench.family, key: BlobBench.key, enabled: true))
        _ = try awaitSync { try await sync.sync(via: RelayTransport(directory: relayURL)) }
    } teardown: { s.close() }
}

/// Runs an async sync from the synchronous benchmark closure.
func awaitSync<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
    let result = LockedResult<T>()
    let done = DispatchSemaphore(value: 0)
    Task {
        do { result.set(.success(try await body())) } catch { result.set(.failure(error)) }
        done.signal()
    }
    done.wait()
    return try result.get()
}

final class LockedResult<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Result<T, any Error>?
    func set(_ result: Result<T, any Error>) { lock.lock(); value = result; lock.unlock() }
    func get() throws -> T { lock.lock(); defer { lock.unlock() }; return try value!.get() }
}
