import Benchmark
import Foundation
import Stash

// The gate check of issue 6: "may this user create one more item in this home?" =
// entitlement + count homes + count items in the home ⇒ decision, on each engine
// (see `GateEngine` in Engine.swift), read-isolated like `count`:
//
// | group      | one iteration is                                        | read as    |
// |------------|---------------------------------------------------------|------------|
// | gate       | one gate check for a random home                        | p50/p99    |
// | gateallocs | the same check, with malloc counting on                 | mallocs/op |
//
// plus, for Stash, the variant "check after a move": each iteration first commits a move of
// one item to another home (untimed), then times one check, so that every check meets a
// state it has not counted yet (the first check after a commit; the peers count from scratch
// every time anyway).
//
// The user holds a lapsed paid subscription (`BenchEntitlement`): every check evaluates it
// and finds the free tier, whose limits are exactly what the store holds (`GateLimits`). The
// targets alternate between existing homes (full: denied, item limit) and homes that do not
// exist yet (empty: allowed), so both decisions are measured and neither is a short-circuit.

/// Per-benchmark state of the gate benchmarks.
final class GateState<G: GateEngine> {
    var engine: G?
    /// Pre-drawn homes.
    var targets = TargetCycle()
}

extension Fixtures {
    /// The gate fixture of engine `G` at N items: a copy of the N-item fixture to which
    /// `G.prepareGate` added the entitlement, built once per build of the suite like the
    /// fixtures it copies (`fixtures-<key>/<Engine>-gate-<N>/`, complete when `complete` exists).
    /// `source` finds or builds the engine's N-item fixture.
    static func gate<G: GateEngine>(_ engine: G.Type, items n: Int, limits: GateLimits, source: () throws -> URL) throws -> URL {
        let directory = BenchConfig.root.appendingPathComponent("fixtures-\(BenchConfig.fixtureKey)")
            .appendingPathComponent("\(G.name)-gate-\(n)")
        let marker = directory.appendingPathComponent("complete")
        if FileManager.default.fileExists(atPath: marker.path) { return directory }
        try? FileManager.default.removeItem(at: directory)
        let source = try source()
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        for file in try FileManager.default.contentsOfDirectory(atPath: source.path)
        where file != "complete" && file != "lock.mdb" {
            try FileManager.default.copyItem(at: source.appendingPathComponent(file),
                                             to: directory.appendingPathComponent(file))
        }
        try G.prepareGate(directory: directory, limits: limits)
        try Data("\(n) items, gate\n".utf8).write(to: marker)
        return directory
    }
}

/// Homes to check: even slots an existing home (full), odd slots a home not in the store (empty).
func drawGateTargets(items n: Int) -> [RecordID] {
    let homes = Workload.homeCount(items: n)
    var rng = SplitMix64(seed: 4)
    return (0..<(1 << 12)).map { slot in
        let h = Int(rng.next() % UInt64(homes))
        return Workload.homeID(slot % 2 == 0 ? h : homes + h)
    }
}

/// `gate` and `gateallocs` for one engine and one way of checking. `fixture` finds or builds
/// the engine's N-item fixture (the source of its gate fixture).
func registerGate<G: GateEngine>(_: G.Type, n: Int, variant: String, fixture: @escaping () throws -> URL,
                                 _ check: @escaping (G, RecordID) throws -> GateVerdict) {
    for (group, configuration) in [("gate", Budget.micro), ("gateallocs", Budget.allocs)] {
        let s = GateState<G>()
        let name = "\(group)/\(G.name)/\(variant)/\(BenchConfig.label(n))"
        Benchmark(name, configuration: configuration) { _ in
            blackHole(try check(s.engine!, s.targets.next()))
        } setup: {
            let limits = GateLimits(items: n)
            let directory = try Fixtures.gate(G.self, items: n, limits: limits, source: fixture)
            Fixtures.warm(directory)
            s.engine = try G(gateDirectory: directory, limits: limits)
            try s.engine!.verifyEntitlement()
            // Both decisions, as the measured loop will see them: home 0 holds the most items
            // (round-robin), a home past the last one holds none.
            let homes = Workload.homeCount(items: n)
            let full = try check(s.engine!, Workload.homeID(0))
            let empty = try check(s.engine!, Workload.homeID(homes))
            guard full == .itemLimitReached, empty == .allowed else {
                throw BenchError("\(name): a full home gives \(full.rawValue) (expected itemLimitReached), an empty one \(empty.rawValue) (expected allowed)")
            }
            s.targets = TargetCycle(drawGateTargets(items: n))
            Fixtures.settle()
        } teardown: {
            s.engine = nil
        }
    }
}

/// The moves of "check after a move": items (a power of two of them) and the step.
final class MoveState {
    var items: [Int] = []
    var step = 0
    var directory: URL?
}

/// `gate` and `gateallocs` for Stash's "check after a move": iteration 2k moves a random
/// item from its home (full) to a spare home (commit, durability `.none`, not timed),
/// iteration 2k + 1 moves it back; then one check is timed. The homes' counts change at every
/// commit and no home goes over its limit; the decisions are nearly those of `gate` (a full
/// home the item left reads 99 items and allows, and the spare home is also a target).
func registerGateAfterMove(n: Int) {
    for (group, configuration) in [("gate", Budget.micro), ("gateallocs", Budget.allocs)] {
        let s = GateState<StashGateEngine>(), m = MoveState()
        let homes = Workload.homeCount(items: n)
        let spare = Workload.homeID(homes + 1)
        let name = "\(group)/Stash/check after a move/\(BenchConfig.label(n))"
        Benchmark(name, configuration: configuration) { benchmark in
            let item = m.items[(m.step >> 1) & (m.items.count - 1)]
            let home = m.step & 1 == 0 ? spare : Workload.homeID(item % homes)
            m.step &+= 1
            try s.engine!.store.update(Item.self, id: Workload.itemID(item)) { $0.homeID = home }
            benchmark.startMeasurement()
            blackHole(try s.engine!.checkCreateItem(in: s.targets.next()))
            benchmark.stopMeasurement()
        } setup: {
            let limits = GateLimits(items: n)
            let source = try Fixtures.gate(StashGateEngine.self, items: n, limits: limits) {
                try Fixtures.ensure(StashEngine.self, items: n)
            }
            // A private copy: the moves must not touch the fixture the other gate benchmarks read.
            let copy = try Fixtures.copy(source, name: "gate-after-move-\(group)")
            m.directory = copy
            Fixtures.warm(copy)
            s.engine = try StashGateEngine(gateDirectory: copy, limits: limits, durability: .none)
            var rng = SplitMix64(seed: 5)
            m.items = (0..<(1 << 12)).map { _ in Int(rng.next() % UInt64(n)) }
            m.step = 0
            s.targets = TargetCycle(drawGateTargets(items: n))
            Fixtures.settle()
        } teardown: {
            s.engine = nil
            if let directory = m.directory { Fixtures.remove(directory) }
        }
    }
}

/// Every engine's gate benchmarks at N items.
func registerGateBenchmarks(n: Int) {
    registerGate(StashGateEngine.self, n: n, variant: "check", fixture: { try Fixtures.ensure(StashEngine.self, items: n) }) {
        try $0.checkCreateItem(in: $1)
    }
    registerGateAfterMove(n: n)
    registerGate(RawLMDBGateEngine.self, n: n, variant: "by hand", fixture: { try Fixtures.ensure(RawLMDBEngine.self, items: n) }) {
        try $0.checkCreateItem(in: $1)
    }
    registerGate(GRDBGateEngine.self, n: n, variant: "query interface", fixture: { try Fixtures.ensure(GRDBEngine.self, items: n) }) {
        try $0.checkCreateItem(in: $1)
    }
    registerGate(GRDBGateEngine.self, n: n, variant: "cached SQL", fixture: { try Fixtures.ensure(GRDBEngine.self, items: n) }) {
        try $0.checkCreateItemWithCachedSQL(in: $1)
    }
}
