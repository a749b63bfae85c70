import Foundation
import Stash

/// Stash itself: typed records, the homeID index, counts and history, all through the
/// public API a user would call.
final class StashEngine: Engine {
    static let name = "Stash"
    let store: Store
    let directory: URL
    /// Resolved once, as the docs recommend for hot paths.
    let homeIndex: IndexHandle<Item, RecordID>

    init(directory: URL, sync: SyncLevel) throws {
        var options = StoreOptions()
        options.durability = sync.stash
        options.initialMapSize = 256 << 20
        store = try Store.open(at: directory.path, types: [Home.self, Item.self], options: options)
        self.directory = directory
        homeIndex = try store.index(\Item.homeID)
    }

    func insert(homes: [Home]) throws {
        try store.write { tx in for home in homes { try tx.insert(home) } }
    }

    func insert(items: [Item]) throws {
        try store.write { tx in for item in items { try tx.insert(item) } }
    }

    func insert(_ item: Item) throws { try store.insert(item) }

    func item(_ id: RecordID) throws -> Item? { try store.get(Item.self, id: id) }

    /// The documented fast path: `count(_:where:equals:)`.
    func countItems(home: RecordID) throws -> Int {
        try store.count(Item.self, where: \.homeID, equals: home)
    }

    /// Through a pre-resolved index handle.
    func countItemsWithHandle(home: RecordID) throws -> Int {
        try store.count(homeIndex, equals: home)
    }

    /// The SwiftData-style path: a `#Predicate` planned onto the index.
    func countItemsWithPredicate(home: RecordID) throws -> Int {
        try store.fetchCount(FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == home }))
    }

    func incrementWearCount(_ id: RecordID) throws {
        try store.update(Item.self, id: id) { $0.wearCount += 1 }
    }

    func flush() throws {}

    func files() -> [URL] { [directory.appendingPathComponent("data.mdb")] }
}
