import Benchmark
import Foundation
import Stash

// Stash and raw LMDB read side by side, a second measurement beside the isolated read rows
// (`get`, `count`), whose ratio Stash ÷ raw LMDB moves between runs on a shared machine:
//
// | group       | one iteration is                                               | read as        |
// |-------------|----------------------------------------------------------------|----------------|
// | pairedget   | `get/Stash/typed` and `get/LMDB/typed` for the same random id  | p50/p99, ops/s |
// | pairedcount | `count/Stash/fast path` and `count/LMDB/dup count` for the     | p50/p99        |
// |             | same random home                                               |                |
//
// Named `<group>/Stash+LMDB/<variant>/N`. Each read is timed on its own into its engine's
// metric (`Stash ns`, `LMDB ns`, as the interleaved writes), in alternating order, so both
// engines meet the same moments of the machine; the goals stay judged on the isolated rows.

/// Per-benchmark state of the paired read benchmarks, filled by `setup`.
final class ReadPair {
    var stash: StashEngine?
    var raw: RawLMDBEngine?
    var targets = TargetCycle()

    static let stashMetric = Trio.metric(StashEngine.name)
    static let rawMetric = Trio.metric(RawLMDBEngine.name)
    static let metrics = [stashMetric, rawMetric]

    func close() {
        stash = nil
        raw = nil
    }
}

/// Registers `<group>/Stash+LMDB/<variant>/N`: every iteration reads the same random target
/// with `stash` on Stash and with `raw` on raw LMDB, Stash first on even iterations and raw
/// LMDB first on odd ones, and times each read (consumed by `blackHole`, as in the isolated
/// rows) into its own metric. Setup as the isolated rows: the same fixtures and targets
/// (`targets(n)`), warm page cache, answer checked on both engines, `sync(2)`.
func registerPairedRead<Answer: Equatable>(group: String, variant: String, n: Int,
                                           _ targets: @escaping (Int) -> ReadTargets<Answer>,
                                           stash stashRead: @escaping (StashEngine, RecordID) throws -> Answer,
                                           raw rawRead: @escaping (RawLMDBEngine, RecordID) throws -> Answer) {
    let p = ReadPair()
    let name = "\(group)/\(StashEngine.name)+\(RawLMDBEngine.name)/\(variant)/\(BenchConfig.label(n))"
    Benchmark(name, configuration: Budget.pairedReads) { benchmark in
        let stash = p.stash!, raw = p.raw!
        let target = p.targets.next()
        // currentIteration counts the warm-up iterations too: the order alternates throughout.
        if benchmark.currentIteration & 1 == 0 {
            try timed(benchmark, ReadPair.stashMetric) { blackHole(try stashRead(stash, target)) }
            try timed(benchmark, ReadPair.rawMetric) { blackHole(try rawRead(raw, target)) }
        } else {
            try timed(benchmark, ReadPair.rawMetric) { blackHole(try rawRead(raw, target)) }
            try timed(benchmark, ReadPair.stashMetric) { blackHole(try stashRead(stash, target)) }
        }
    } setup: {
        let reads = targets(n)
        p.stash = try openForReading(StashEngine.self, n: n, name: name, reads, stashRead)
        p.raw = try openForReading(RawLMDBEngine.self, n: n, name: name, reads, rawRead)
        p.targets = reads.targets
        Fixtures.settle()
    } teardown: {
        p.close()
    }
}
