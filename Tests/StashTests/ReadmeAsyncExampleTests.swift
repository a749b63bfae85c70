import Foundation
import Stash
import Testing
import StashTestSupport

/// The README's "Async API, live queries, relationships, closing" example, as a user copies
/// it, against a real store. Keep the two in step.
@Suite struct ReadmeAsyncExampleTests {
    enum Readme {
        struct Home: Record {
            var id = RecordID()
            var name: String
        }

        struct Item: Record {
            var id = RecordID()
            var homeID: RecordID
            var name: String
            static let references: [RecordReference<Item>] = [.reference(\.homeID, to: Home.self, onDelete: .cascade)]
        }
    }

    @MainActor final class Model {
        var items: [Readme.Item] = []
        var badge = 0
    }

    @MainActor @Test func theAsyncExampleWorksAsWritten() async throws {
        typealias Home = Readme.Home
        typealias Item = Readme.Item
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "Flat")
        try await store.write { tx in try tx.insert(home) }

        @MainActor func addLamp(to home: Home) async throws {
            let lamp = Item(homeID: home.id, name: "Lamp")
            try await store.write { tx in try tx.insert(lamp) }   // suspends: the main actor runs on meanwhile
        }
        try await addLamp(to: home)
        let total = try await store.read { try $0.count(Item.self) }
        #expect(total == 1)

        let model = Model()
        let byHome = try store.index(\Item.homeID)
        let homeID = home.id
        let items = FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == homeID }, sortBy: [SortDescriptor(\.name)])
        let listing = Task { @MainActor in
            for try await list in store.observe(items) {
                model.items = list
                if list.count == 2 { break }
            }
        }
        let counting = Task { @MainActor in
            for try await n in store.observeCount(byHome, equals: homeID) {
                model.badge = n
                if n == 0 { break }
            }
        }
        try await store.write { tx in try tx.insert(Item(homeID: homeID, name: "Desk")) }
        try await listing.value
        #expect(model.items.map(\.name) == ["Desk", "Lamp"])

        try store.delete(Home.self, id: home.id)   // its items go with it, in the same transaction
        try await counting.value
        #expect(model.badge == 0)
        #expect(try store.count(Item.self) == 0)

        try store.close()   // every later call throws .closed; Store.open again to go on
        #expect(throws: StoreError.self) { try store.count(Item.self) }
        #expect(try Store.open(at: dir.path, types: [Home.self, Item.self]).count(Home.self) == 0)
    }
}
