import Foundation
import Stash
import Testing
import StashTestSupport

/// The README's first example, as a user copies it (its types, calls and the outputs its
/// comments promise), against a real store: the first code a new user runs must work as
/// written. Keep the two in step: a change of the README's example changes this test.
@Suite struct ReadmeExampleTests {
    /// The README's types, nested so that they do not meet the suite's own `Home` and `Item`
    /// (their record type names are the same: "Home" and "Item").
    enum Readme {
        struct Home: Record {
            var id = RecordID()
            var name: String
        }

        struct Item: Record {
            var id = RecordID()
            var homeID: RecordID
            var name: String
            var wearCount = 0
            static let indexes: [RecordIndex<Item>] = [.index(\.homeID), .index(\.homeID, \.name)]
        }
    }

    @Test func theFirstExampleWorksAsWritten() throws {
        typealias Home = Readme.Home
        typealias Item = Readme.Item
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "Flat")
        try store.write { tx in
            try tx.insert(home)
            try tx.insert(Item(homeID: home.id, name: "Lamp"))
        }
        #expect(try store.count(Item.self, where: \.homeID, equals: home.id) == 1)
        let byHome = try store.index(\Item.homeID)
        #expect(try store.count(byHome, equals: home.id) == 1)

        let homeID = home.id
        let lamps = FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == homeID && $0.wearCount > 3 },
                                          sortBy: [SortDescriptor(\.name)])
        #expect(try store.fetch(lamps).isEmpty)
        let plan = try store.explain(lamps).description
        #expect(plan.hasPrefix("Item: index homeID equality (homeID == ") && plan.hasSuffix(") → filter each candidate by the predicate"),
                "the README prints: \(plan)")
        let someID = try #require(try store.fetch(FetchDescriptor<Item>()).first?.id)
        for _ in 0..<4 { try store.update(Item.self, id: someID) { $0.wearCount += 1 } }
        #expect(try store.fetch(lamps).map(\.name) == ["Lamp"])
        let report = try store.verify()
        #expect(report.isClean && report.description.hasSuffix(": clean"), "\(report)")
    }
}
