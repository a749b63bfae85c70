import Foundation
import StashLMDB
import Synchronization

/// A fresh temporary directory, removed when the test's scope ends.
final class TemporaryDirectory {
    let url: URL
    var path: String { url.path }

    init(_ name: String = "stash-lmdb-test") {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-\(UUID().uuidString)")
        try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    func sub(_ name: String) -> String { url.appendingPathComponent(name).path }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// A seeded generator (SplitMix64) so property tests replay exactly.
struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Problems found on background threads, asserted on the test's own task afterwards
/// (an `#expect` on a raw thread is not attributed to the running test).
final class Failures: Sendable {
    private let list = Mutex<[String]>([])
    func add(_ message: String) { list.withLock { $0.append(message) } }
    var all: [String] { list.withLock { $0 } }
}

/// Runs `body(0..<count)` on `count` real threads at once and waits for all of them.
func onThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let group = DispatchGroup()
    for i in 0..<count {
        group.enter()
        let thread = Thread {
            body(i)
            group.leave()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
    group.wait()
}

/// Opens an environment in `dir` with the given databases.
func openEnvironment(_ path: String, _ databases: [DatabaseSpec] = [DatabaseSpec("main"), DatabaseSpec("dups", flags: [.duplicateSort, .duplicateFixed])],
                     mapSize: Int? = nil, durability: Durability = .full) throws -> Environment {
    var config = EnvironmentConfiguration(databases: databases, durability: durability)
    if let mapSize { config.initialMapSize = mapSize }
    return try Environment.open(path: path, configuration: config)
}

/// Bytes of a string, for readable keys.
func b(_ text: String) -> [UInt8] { Array(text.utf8) }

/// A 16-byte big-endian value (the fixed-width duplicate layout of the store's index).
func id16(_ n: UInt64, high: UInt64 = 0) -> [UInt8] {
    var out: [UInt8] = []
    for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: high >> UInt64(shift))) }
    for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: n >> UInt64(shift))) }
    return out
}

struct TestAbort: Error {}
