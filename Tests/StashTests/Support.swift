import Foundation
import Stash
import Testing

/// A fresh temporary directory, removed when the test's scope ends.
final class TemporaryDirectory {
    let url: URL
    var path: String { url.path }

    init(_ name: String = "stash-test") {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-\(UUID().uuidString)")
        try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    func sub(_ name: String) -> String { url.appendingPathComponent(name).path }

    deinit { try? FileManager.default.removeItem(at: url) }
}

struct Home: Record, Equatable {
    var id = RecordID()
    var name: String
    var createdAt = Date(timeIntervalSince1970: 1_700_000_000)
}

struct Item: Record, Equatable {
    var id = RecordID()
    var homeID: RecordID
    var name: String
    var category: String
    var wearCount: Int
    var price: Double
    var note: String?
    static let indexes: [RecordIndex<Item>] = [.index(\.homeID), .index(\.homeID, \.category), .index(\.wearCount)]
}

struct UserProfile: Record, Equatable {
    var id = RecordID()
    var email: String
    var displayName: String
    static let indexes: [RecordIndex<UserProfile>] = [.unique(\.email)]
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

/// A second indexed type whose only indexes are a composite (string, int) and a double, so
/// the planner's prefix and range paths on composite keys get exercised.
struct Reading: Record, Equatable {
    var id = RecordID()
    var sensor: String
    var at: Int
    var value: Double
    var flag: Bool
    static let indexes: [RecordIndex<Reading>] = [.index(\.sensor, \.at), .index(\.value)]
}

/// Thrown by a test to abort a write transaction on purpose.
struct Rollback: Error {}

/// The error `body` throws, or nil.
func thrownError(_ body: () throws -> Void) -> (any Error)? {
    do {
        try body()
        return nil
    } catch {
        return error
    }
}

/// Problems found on background threads, asserted on the test's own task afterwards
/// (an `#expect` on a raw thread is not attributed to the running test).
final class Failures: @unchecked Sendable {
    private let lock = NSLock()
    private var list: [String] = []
    func add(_ message: String) { lock.lock(); list.append(message); lock.unlock() }
    var all: [String] { lock.lock(); defer { lock.unlock() }; return list }
}

/// A flag set once by one thread and polled by others.
final class DoneFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    func set() { lock.lock(); value = true; lock.unlock() }
    var isSet: Bool { lock.lock(); defer { lock.unlock() }; return value }
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
        thread.stackSize = 4 << 20
        thread.start()
    }
    group.wait()
}

extension Item {
    /// A random item for property tests (small value domains, so equalities hit).
    static func random(homes: [RecordID], using rng: inout SeededGenerator) -> Item {
        Item(homeID: homes.randomElement(using: &rng)!,
             name: ["lamp", "desk", "chair", "rug", "vase", "Lamp"].randomElement(using: &rng)!,
             category: ["a", "b", "c"].randomElement(using: &rng)!,
             wearCount: Int.random(in: 0..<8, using: &rng),
             price: [0.5, 1, 9.99, 20, -3.25, 0].randomElement(using: &rng)!,
             note: [nil, nil, "", "worn", String(repeating: "long note ", count: 20)].randomElement(using: &rng)!)
    }
}
