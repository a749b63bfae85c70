import Foundation
import Stash

// The "home/item" workload shared by every engine. All engines store and return exactly
// these two structs, built by the same deterministic generator, so that every engine
// does the same work on the same data.

/// A home: the parent of ~100 items.
struct Home: Record, Equatable {
    var id: RecordID
    var name: String
    var createdAt: Date
}

/// An item of a home. `homeID` is indexed in every engine.
struct Item: Record, Equatable {
    var id: RecordID
    var homeID: RecordID
    var name: String        // ~24 characters
    var category: String
    var wearCount: Int
    var modifiedAt: Date
    var payload: Data       // 200 bytes

    static let indexes: [RecordIndex<Item>] = [.index(\.homeID)]
}

/// Deterministic data: item `i` and home `h` are the same in every engine and every run.
enum Workload {
    static let payloadSize = 200
    static let categories = ["tops", "bottoms", "shoes", "outerwear", "accessories", "bags",
                             "knitwear", "dresses", "suits", "sportswear", "sleepwear", "hats"]
    static let colors = ["black", "white", "navy", "olive", "camel", "grey", "red", "cream"]
    static let materials = ["cotton", "linen", "wool", "silk", "denim", "leather", "cashmere"]
    /// 2024-01-01T00:00:00Z in Unix milliseconds: the clock the (UUIDv7-style) ids start from.
    static let epochMillis: UInt64 = 1_704_067_200_000

    /// Homes for `n` items: one home per 100 items.
    static func homeCount(items n: Int) -> Int { max(1, n / 100) }

    /// Time-ordered ids like `RecordID()` makes (48-bit ms | version 7 | counter ; variant | random),
    /// but reproducible: homes and items get disjoint, increasing ids.
    static func homeID(_ h: Int) -> RecordID { timeOrderedID(UInt64(h), stream: 0x486F_6D65) }
    static func itemID(_ i: Int) -> RecordID { timeOrderedID(UInt64(i) + (1 << 32), stream: 0x4974_656D) }

    private static func timeOrderedID(_ n: UInt64, stream: UInt64) -> RecordID {
        // 4096 ids per millisecond, as the real generator does within one millisecond.
        let millis = epochMillis + (n >> 12)
        let high = (millis << 16) | (0x7 << 12) | (n & 0xFFF)
        var rng = SplitMix64(seed: n &* 0x9E37_79B9 ^ stream)
        let low = (UInt64(0b10) << 62) | (rng.next() >> 2)
        return RecordID(high: high, low: low)
    }

    static func home(_ h: Int) -> Home {
        Home(id: homeID(h), name: "Home \(h)", createdAt: Date(timeIntervalSince1970: 1_704_067_200 + Double(h)))
    }

    /// Item `i` of a store with `homes` homes; items are spread round-robin over the homes.
    static func item(_ i: Int, homes: Int) -> Item {
        var rng = SplitMix64(seed: UInt64(i) &+ 0x5EED)
        let color = colors[Int(rng.next() % UInt64(colors.count))]
        let material = materials[Int(rng.next() % UInt64(materials.count))]
        var name = "\(color) \(material) #\(i)"
        if name.utf8.count < 24 { name += String(repeating: "-", count: 24 - name.utf8.count) }
        var payload = Data(count: payloadSize)
        payload.withUnsafeMutableBytes { raw in
            let words = raw.bindMemory(to: UInt64.self)
            for k in words.indices { words[k] = rng.next() }
        }
        return Item(id: itemID(i), homeID: homeID(i % homes), name: name,
                    category: categories[Int(rng.next() % UInt64(categories.count))],
                    wearCount: Int(rng.next() % 50),
                    modifiedAt: Date(timeIntervalSince1970: 1_704_067_200 + Double(i)),
                    payload: payload)
    }
}

/// A small, fast, reproducible PRNG (SplitMix64).
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Sizes and knobs, read from the environment so that one binary serves `make bench`,
/// `make bench-smoke` and the published 1M run.
///
/// - `STASH_BENCH_SMOKE=1`: one tiny size (1,000 items) and a few iterations per benchmark.
/// - `STASH_BENCH_1M=1`: add N = 1,000,000 to the default sizes (10k, 100k).
/// - `STASH_BENCH_SIZES=10000,1000000`: exactly these sizes.
/// - `STASH_BENCH_DIR=/path`: where fixtures and scratch stores live (default: the system
///   temporary directory). Put it on a real disk: durability numbers on tmpfs are meaningless.
enum BenchConfig {
    static let environment = ProcessInfo.processInfo.environment
    static let smoke = environment["STASH_BENCH_SMOKE"].map { $0 != "0" && !$0.isEmpty } ?? false

    static let sizes: [Int] = {
        if let list = environment["STASH_BENCH_SIZES"] {
            let parsed = list.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
            if !parsed.isEmpty { return parsed }
        }
        if smoke { return [1_000] }
        var sizes = [10_000, 100_000]
        if let flag = environment["STASH_BENCH_1M"], flag != "0", !flag.isEmpty { sizes.append(1_000_000) }
        return sizes
    }()

    static let root: URL = {
        if let dir = environment["STASH_BENCH_DIR"], !dir.isEmpty { return URL(fileURLWithPath: dir) }
        return FileManager.default.temporaryDirectory.appendingPathComponent("stash-bench")
    }()

    /// Bump when the workload changes, so old fixtures are not reused.
    static let fixtureVersion = 1

    /// Fixtures belong to one build of this executable (which links Stash statically): a
    /// rebuilt library may store records differently, so its fixtures are built afresh.
    static let fixtureKey: String = {
        var info = stat()
        let exe = FileManager.default.fileExists(atPath: "/proc/self/exe") ? "/proc/self/exe" : CommandLine.arguments[0]
        guard stat(exe, &info) == 0 else { return "v\(fixtureVersion)" }
        return "v\(fixtureVersion)-\(info.st_mtim.tv_sec)-\(info.st_size)"
    }()

    /// "10k", "100k", "1M".
    static func label(_ n: Int) -> String {
        if n >= 1_000_000, n % 1_000_000 == 0 { return "\(n / 1_000_000)M" }
        if n >= 1_000, n % 1_000 == 0 { return "\(n / 1_000)k" }
        return "\(n)"
    }
}
