import Foundation
import StashLMDB
import StashTestSupport
import Testing

@Suite struct KeyWalkTests {
    /// The subscript and the big-endian readers give back what `append` and `appendBigEndian`
    /// wrote, at any offset (unaligned ones included), as the subscript does byte by byte.
    @Test func integersAreReadBackInPlaceAtAnyOffset() {
        var rng = SeededGenerator(seed: 9)
        for _ in 0..<200 {
            var key = KeyBytes()
            let lead = Int.random(in: 0..<9, using: &rng)
            for _ in 0..<lead { key.append(UInt8.random(in: 0...255, using: &rng)) }
            let byte = UInt8.random(in: 0...255, using: &rng), word = UInt32.random(in: 0...UInt32.max, using: &rng)
            let long = UInt64.random(in: 0...UInt64.max, using: &rng)
            key.append(byte)
            key.appendBigEndian(word)
            key.appendBigEndian(long)
            #expect(key[lead] == byte, "seed 9")
            #expect(key.uint32(bigEndianAt: lead + 1) == word, "seed 9")
            #expect(key.uint64(bigEndianAt: lead + 5) == long, "seed 9")
            #expect((0..<key.count).map { key[$0] } == key.bytes, "seed 9")
        }
    }

    /// Equality, prefixes, hashing, `bytes` and `hasSameBytes` compare the bytes in use only, as
    /// the same operations on `[UInt8]` do: against that model for random keys of 0–40 bytes and a few
    /// full-length ones, some pairs sharing a prefix, and keys shortened with `removeLast`
    /// (whose storage still holds the bytes removed).
    @Test func comparisonsAndHashesFollowTheBytesInUse() {
        let seed: UInt64 = 0x4B59
        var rng = SeededGenerator(seed: seed)
        func randomBytes(_ count: Int) -> [UInt8] { (0..<count).map { _ in UInt8.random(in: 0...3, using: &rng) } }
        for round in 0..<2_000 {
            let length = round % 50 == 0 ? KeyBytes.capacity : Int.random(in: 0...40, using: &rng)
            let a = randomBytes(length)
            var b: [UInt8]
            switch round % 4 {
            case 0: b = a
            case 1: b = Array(a.prefix(Int.random(in: 0...a.count, using: &rng)))
            case 2: b = Array(a.prefix(Int.random(in: 0...a.count, using: &rng))) + randomBytes(Int.random(in: 0...3, using: &rng))
            default: b = randomBytes(Int.random(in: 0...40, using: &rng))
            }
            var keyB = KeyBytes(b)
            // Now and then the same bytes reached by shortening a longer key.
            if round % 3 == 0, b.count + 5 <= KeyBytes.capacity {
                keyB = KeyBytes(b + randomBytes(5))
                keyB.removeLast(5)
            }
            let keyA = KeyBytes(a)
            #expect(keyA.bytes == a && keyB.bytes == b, "seed \(seed), round \(round)")
            #expect((keyA == keyB) == (a == b), "seed \(seed), round \(round)")
            #expect(keyA.hasPrefix(keyB) == a.starts(with: b), "seed \(seed), round \(round)")
            #expect(keyB.hasPrefix(keyA) == b.starts(with: a), "seed \(seed), round \(round)")
            if a == b { #expect(keyA.hashValue == keyB.hashValue, "seed \(seed), round \(round)") }
            // `hasSameBytes` across the byte sources, slices cut out of a longer array included.
            let padded = randomBytes(3) + b + randomBytes(2)
            let sliceB = padded[3..<(3 + b.count)]
            #expect(a.hasSameBytes(as: sliceB) == (a == b), "seed \(seed), round \(round)")
            #expect(sliceB.hasSameBytes(as: keyA) == (a == b), "seed \(seed), round \(round)")
            #expect(Data(a).hasSameBytes(as: keyB) == (a == b), "seed \(seed), round \(round)")
        }
        // Keys as dictionary keys: one entry per distinct byte string.
        var seen: [KeyBytes: Int] = [:]
        var model: [[UInt8]: Int] = [:]
        for i in 0..<500 {
            let bytes = randomBytes(Int.random(in: 0...3, using: &rng))
            seen[KeyBytes(bytes), default: 0] += i
            model[bytes, default: 0] += i
        }
        #expect(seen.count == model.count, "seed \(seed)")
        for (bytes, total) in model { #expect(seen[KeyBytes(bytes)] == total, "seed \(seed)") }
    }

    /// Keys of exactly 0, 1, 7, 8, 9, 510 and 511 bytes (the word edges of an in-place
    /// comparison and the full key), against keys differing from them in one byte only (first,
    /// middle, last) or one byte shorter or longer: `==`, `hasPrefix`, hashes, `hasSameBytes`
    /// and the order LMDB keeps them in follow `[UInt8]`'s; big-endian appends cut at the
    /// 511-byte limit keep their leading bytes and mark the key lossy.
    @Test func keysAtWordEdgesAndFullLengthCompareByEveryByte() throws {
        let seed: UInt64 = 0x0511
        var rng = SeededGenerator(seed: seed)
        var all: [[UInt8]] = []
        for length in [0, 1, 7, 8, 9, 510, 511] {
            let base = (0..<length).map { _ in UInt8.random(in: 1...254, using: &rng) }
            var others: [[UInt8]] = length > 0 ? [Array(base.dropLast())] : []
            if length < KeyBytes.capacity { others.append(base + [0]) }
            for position in Set([0, length / 2, length - 1]) where length > 0 {
                for delta in [1, -1] {
                    var other = base
                    other[position] = UInt8(Int(other[position]) + delta)
                    others.append(other)
                }
            }
            let key = KeyBytes(base)
            #expect(key.bytes == base && key.count == length && !key.isLossy, "seed \(seed), \(length) bytes")
            #expect(key == KeyBytes(base) && key.hashValue == KeyBytes(base).hashValue, "seed \(seed), \(length) bytes")
            #expect(key.hasSameBytes(as: base) && Data(base).hasSameBytes(as: key), "seed \(seed), \(length) bytes")
            for other in others {
                let context = "seed \(seed), \(length) bytes against \(other.count)"
                let otherKey = KeyBytes(other)
                #expect(key != otherKey && !key.hasSameBytes(as: other) && !otherKey.hasSameBytes(as: base), "\(context)")
                #expect(key.hasPrefix(otherKey) == base.starts(with: other), "\(context)")
                #expect(otherKey.hasPrefix(key) == other.starts(with: base), "\(context)")
            }
            all.append(base)
            all.append(contentsOf: others)
        }
        // LMDB orders the keys as their bytes do, and finds each by its KeyBytes.
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        let distinct = Array(Set(all)).filter { !$0.isEmpty }
        try env.write { txn in
            for (n, bytes) in distinct.enumerated() { try txn.put(main, key: KeyBytes(bytes), value: [UInt8(n % 256)]) }
        }
        let stored = try env.read { txn in
            var keys: [[UInt8]] = []
            try txn.scan(main, from: ScanStart<[UInt8]>.first) { key, _ in keys.append(key); return true }
            for (n, bytes) in distinct.enumerated() { #expect(try txn.get(main, key: KeyBytes(bytes)) == [UInt8(n % 256)], "seed \(seed)") }
            return keys
        }
        #expect(stored == distinct.sorted { $0.lexicographicallyPrecedes($1) }, "seed \(seed)")
        // A big-endian append past the limit keeps what fits.
        for filled in 503...KeyBytes.capacity {
            var key = KeyBytes([UInt8](repeating: 9, count: filled))
            key.appendBigEndian(UInt64(0x0102_0304_0506_0708))
            let fits = min(8, KeyBytes.capacity - filled)
            #expect(key.count == filled + fits && key.isLossy == (fits < 8), "\(filled) bytes before")
            #expect(Array(key.bytes.suffix(fits)) == Array([1, 2, 3, 4, 5, 6, 7, 8].prefix(fits)), "\(filled) bytes before")
        }
    }

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

    /// `appendIfLast` writes only keys that sort after every key, and leaves nothing behind
    /// otherwise; what it appends reads back like what an ordinary put stores.
    @Test func appendsOnlyAfterTheLastKey() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, [DatabaseSpec("appended"), DatabaseSpec("put")])
        let appended = try env.database("appended"), put = try env.database("put")
        func key(_ n: Int) -> [UInt8] { withUnsafeBytes(of: UInt32(n).bigEndian) { Array($0) } }
        try env.write { txn in
            #expect(try txn.appendIfLast(appended, key: key(10), value: [1]), "empty database")
            #expect(try txn.appendIfLast(appended, key: key(20), value: [2]))
            #expect(try !txn.appendIfLast(appended, key: key(20), value: [9]), "equal key")
            #expect(try !txn.appendIfLast(appended, key: key(15), value: [9]), "key before the last")
            #expect(try txn.get(appended, key: key(20)) == [2])
            #expect(try txn.get(appended, key: key(15)) == nil)
            try txn.put(put, key: key(10), value: [1])
            try txn.put(put, key: key(20), value: [2])
            for n in 100..<2_100 {
                let value = [UInt8](repeating: UInt8(truncatingIfNeeded: n), count: 300)
                #expect(try txn.appendIfLast(appended, key: key(n), value: value))
                try txn.put(put, key: key(n), value: value)
            }
        }
        func entries(_ db: Database) throws -> [[UInt8]] {
            try env.read { txn in
                var all: [[UInt8]] = []
                try txn.scan(db, from: ScanStart<[UInt8]>.first) { key, value in all.append(key + value); return true }
                return all
            }
        }
        let a = try entries(appended), p = try entries(put)
        #expect(a.count == 2_002)
        #expect(a == p)
    }
}
