import Foundation
import Stash
import Testing
import StashTestSupport

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
