import Foundation
import StashLMDB
import Testing
import StashTestSupport

/// DESIGN.md rule 10: Debian's LMDB 0.9.24 predates fixes for DUPSORT cursor paths
/// (ITS#9376 repeated deletes, ITS#9723 `MDB_FIRST_DUP` at EOF, ITS#8447 `MDB_CURRENT`).
/// Stash deletes index entries with `mdb_del(key, value)`; these tests pin that path down,
/// across the sub-page → sub-database boundary (hundreds of 16-byte duplicates per key).
@Suite struct DupSortRegressionTests {
    /// Checks every key of `oracle` (and that no other key exists) in one read snapshot.
    private func check(_ env: Environment, _ dups: Database, _ oracle: [String: Set<UInt64>], _ context: String) throws {
        try env.read { txn throws in
            var total = 0
            for (key, values) in oracle {
                total += values.count
                let count = try txn.duplicateCount(dups, key: b(key))
                #expect(count == values.count, "\(context): key \(key) count \(count), expected \(values.count)")
                var seen: [[UInt8]] = []
                try txn.forEachDuplicate(dups, key: b(key)) { seen.append($0); return true }
                #expect(seen == values.sorted().map { id16($0) }, "\(context): duplicates of \(key)")
                if values.isEmpty {
                    #expect(try txn.get(dups, key: b(key)) == nil, "\(context): key \(key) should be gone")
                }
            }
            var scanned: [String: Int] = [:]
            try txn.scan(dups, from: ScanStart<[UInt8]>.first) { key, _ in
                scanned[String(decoding: key, as: UTF8.self), default: 0] += 1
                return true
            }
            #expect(scanned == oracle.filter { !$0.value.isEmpty }.mapValues(\.count), "\(context): full scan")
            #expect(try txn.statistics(dups).entries == total, "\(context): entries")
        }
    }

    @Test(arguments: ["ascending", "descending", "alternate", "random"])
    func repeatedDeletesOfDuplicatesInOneTransaction(order: String) throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, durability: .none)
        let dups = try env.database("dups")
        let n: UInt64 = 600
        // Neighbours on both sides of the key under test must be left alone.
        var oracle: [String: Set<UInt64>] = ["a": [1, 2, 3], "m": Set(0..<n), "z": [7]]
        try env.write { txn throws in
            for (key, values) in oracle { for v in values { try txn.put(dups, key: b(key), value: id16(v)) } }
        }
        try check(env, dups, oracle, "\(order) before")
        var rng = SeededGenerator(seed: 9376)
        let sequence: [UInt64]
        switch order {
        case "ascending": sequence = Array(0..<n)
        case "descending": sequence = Array((0..<n).reversed())
        case "alternate": sequence = stride(from: 0, to: n, by: 2).map { $0 } + stride(from: 1, to: n, by: 2).map { $0 }
        default: sequence = Array(0..<n).shuffled(using: &rng)
        }
        try env.write { txn throws in
            for (step, v) in sequence.enumerated() {
                #expect(try txn.delete(dups, key: b("m"), value: id16(v)), "\(order) step \(step): delete \(v)")
                let remaining = sequence.count - step - 1
                #expect(try txn.duplicateCount(dups, key: b("m")) == remaining, "\(order) step \(step)")
                if step % 97 == 0 || remaining < 3 {
                    #expect(try !txn.containsDuplicate(dups, key: b("m"), value: id16(v)))
                }
            }
            // Deleting the last duplicate removed the key; deleting again finds nothing.
            #expect(try !txn.delete(dups, key: b("m"), value: id16(0)))
            #expect(try txn.get(dups, key: b("m")) == nil)
        }
        oracle["m"] = []
        try check(env, dups, oracle, "\(order) after")
        // Re-adding after the key vanished works and counts from one again.
        try env.write { txn in try txn.put(dups, key: b("m"), value: id16(42)) }
        oracle["m"] = [42]
        try check(env, dups, oracle, "\(order) re-added")
    }

    @Test func deleteLastDuplicateThenReAddInSameTransaction() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, durability: .none)
        let dups = try env.database("dups")
        try env.write { txn throws in
            try txn.put(dups, key: b("k"), value: id16(1))
            try txn.put(dups, key: b("k2"), value: id16(2))
        }
        try env.write { txn throws in
            #expect(try txn.delete(dups, key: b("k"), value: id16(1)))
            #expect(try txn.duplicateCount(dups, key: b("k")) == 0)
            try txn.put(dups, key: b("k"), value: id16(3))
            #expect(try txn.duplicateCount(dups, key: b("k")) == 1)
            #expect(try txn.delete(dups, key: b("k"), value: id16(3)))
            #expect(try txn.delete(dups, key: b("k2"), value: id16(2)))
            // The database is empty now; a count and a walk at EOF find nothing (ITS#9723).
            #expect(try txn.duplicateCount(dups, key: b("k2")) == 0)
            var n = 0
            try txn.forEachDuplicate(dups, key: b("k2")) { _ in n += 1; return true }
            try txn.forEachDuplicate(dups, key: b("zzz")) { _ in n += 1; return true }
            #expect(n == 0)
            try txn.put(dups, key: b("k"), value: id16(4))
            try txn.put(dups, key: b("k"), value: id16(5))
        }
        try check(env, dups, ["k": [4, 5], "k2": []], "after re-add")
    }

    @Test func walksAtTheEndOfTheDatabase() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, durability: .none)
        let dups = try env.database("dups")
        try env.write { txn throws in
            for v in 0..<300 as Range<UInt64> { try txn.put(dups, key: b("last"), value: id16(v)) }
            try txn.put(dups, key: b("first"), value: id16(1))
        }
        try env.read { txn throws in
            // The last key of the database, a key after it, and a key between keys.
            var seen = 0
            try txn.forEachDuplicate(dups, key: b("last")) { _ in seen += 1; return true }
            #expect(seen == 300)
            for missing in ["zzzz", "g", "0"] {
                var n = 0
                try txn.forEachDuplicate(dups, key: b(missing)) { _ in n += 1; return true }
                #expect(n == 0, "\(missing)")
                #expect(try txn.duplicateCount(dups, key: b(missing)) == 0, "\(missing)")
                #expect(try !txn.containsDuplicate(dups, key: b(missing), value: id16(1)), "\(missing)")
            }
            // Counting the last key repeatedly on the cached cursor stays right.
            for _ in 0..<3 { #expect(try txn.duplicateCount(dups, key: b("last")) == 300) }
            #expect(try txn.duplicateCount(dups, key: b("first")) == 1)
        }
    }

    /// Random puts and `mdb_del(key, value)` deletes over a few hot keys, in many
    /// transactions, against an in-memory oracle.
    @Test(arguments: [UInt64(1), 8447, 9723])
    func randomDuplicateChurnMatchesOracle(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, durability: .none)
        let dups = try env.database("dups")
        var rng = SeededGenerator(seed: seed)
        var oracle: [String: Set<UInt64>] = [:]
        let keys = ["h0", "h1", "h2", "h3"]
        for round in 0..<40 {
            var next = oracle
            let aborts = round % 7 == 3
            do {
                try env.write { txn throws in
                    next = oracle   // the closure may run again after a map resize
                    for _ in 0..<Int.random(in: 1...60, using: &rng) {
                        let key = keys.randomElement(using: &rng)!
                        // Bias towards deletes when a key is big, so keys empty out and refill.
                        let size = next[key, default: []].count
                        if size > 0 && Int.random(in: 0..<400, using: &rng) < size + 40 {
                            let victim = next[key]!.randomElement(using: &rng)!
                            let deleted = try txn.delete(dups, key: b(key), value: id16(victim))
                            if !deleted { throw Mismatch("seed \(seed) round \(round): delete of \(key)/\(victim) found nothing") }
                            next[key]!.remove(victim)
                        } else {
                            let value = UInt64.random(in: 0..<2000, using: &rng)
                            try txn.put(dups, key: b(key), value: id16(value))
                            next[key, default: []].insert(value)
                        }
                        let count = try txn.duplicateCount(dups, key: b(key))
                        if count != next[key, default: []].count {
                            throw Mismatch("seed \(seed) round \(round): count of \(key) \(count), expected \(next[key, default: []].count)")
                        }
                    }
                    if aborts { throw TestAbort() }
                }
            } catch is TestAbort {
                next = oracle
            }
            oracle = next
            try check(env, dups, oracle, "seed \(seed) round \(round)")
        }
        #expect(oracle.values.contains { $0.count > 100 }, "seed \(seed): some key grew past the sub-page size")
    }
}

struct Mismatch: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
