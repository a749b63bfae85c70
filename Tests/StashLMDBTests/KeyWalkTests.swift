import Foundation
import StashLMDB
import StashTestSupport
import Testing

@Suite struct KeyWalkTests {
    @Test func groupsAreWalkedKeyByKeyWithTheirDuplicateCounts() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let dups = try env.database("dups")
        var expected: [[UInt8]: Int] = [:]
        var rng = SeededGenerator(seed: 42)
        try env.write { txn in
            for group in 0..<40 {
                let key: [UInt8] = [group < 30 ? 7 : 8, UInt8(group)]
                let n = Int.random(in: 1...60, using: &rng)
                for v in 0..<n { try txn.put(dups, key: key, value: [UInt8(v), 0, 0, 0]) }
                if key[0] == 7 { expected[key] = n }
            }
        }
        var seen: [[UInt8]: Int] = [:]
        var order: [[UInt8]] = []
        try env.read { txn in
            try txn.forEachKeyWithCount(dups, prefix: [7]) { key, count in
                seen[key] = count
                order.append(key)
                return true
            }
        }
        #expect(seen == expected, "seed 42")
        #expect(order == order.sorted { $0.lexicographicallyPrecedes($1) })
        // Stopping early visits no more keys.
        var visited = 0
        try env.read { txn in try txn.forEachKeyWithCount(dups, prefix: [7]) { _, _ in visited += 1; return visited < 3 } }
        #expect(visited == 3)
    }

    @Test func fixedWidthIntegersAreReadInPlace() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        let value: UInt64 = 0x0102_0304_0506_0708
        try env.write { txn in
            try txn.put(main, key: [1], value: (0..<8).map { UInt8(truncatingIfNeeded: value >> UInt64($0 * 8)) })
            try txn.put(main, key: [2], value: [1, 2, 3])
        }
        let (whole, short, absent) = try env.read { txn in
            (try txn.uint64(main, key: [1]), try txn.uint64(main, key: [2]), try txn.uint64(main, key: [3]))
        }
        #expect(whole == value)
        #expect(short == nil, "not 8 bytes")
        #expect(absent == nil, "absent")
        // Written without building an array: the same 8 little-endian bytes.
        try env.write { txn in try txn.put(main, key: [4], uint64: value) }
        let (bytes, read) = try env.read { txn in (try txn.get(main, key: [4]), try txn.uint64(main, key: [4])) }
        #expect(bytes == [8, 7, 6, 5, 4, 3, 2, 1])
        #expect(read == value)
    }
}
