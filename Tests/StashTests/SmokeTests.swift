import Foundation
import Stash
import Testing
import StashTestSupport

@Suite struct SmokeTests {
    @Test func insertGetCountFetch() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "Flat")
        try store.insert(home)
        for i in 0..<20 {
            try store.insert(Item(homeID: home.id, name: "item \(i)", category: i % 2 == 0 ? "a" : "b", wearCount: i, price: Double(i) * 1.5))
        }
        #expect(try store.get(Home.self, id: home.id) == home)
        #expect(try store.count(Item.self) == 20)
        #expect(try store.count(Item.self, where: \.homeID, equals: home.id) == 20)
        let handle = try store.index(\Item.homeID)
        #expect(try store.count(handle, equals: home.id) == 20)
        let hid = home.id
        let d = FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == hid && $0.wearCount >= 10 }, sortBy: [SortDescriptor(\.wearCount, order: .reverse)])
        let items = try store.fetch(d)
        #expect(items.count == 10)
        #expect(items.first?.wearCount == 19)
        print(try store.explain(d))
        let report = try store.verify()
        #expect(report.isClean, "\(report)")
        print(try store.history().count)
    }

    /// Ids convert to and from UUIDs byte for byte, and survive a store round trip as a
    /// field (read in place) and as the record id; strings of every width come back intact.
    @Test func idsAndStringsRoundTripExactly() throws {
        var rng = SeededGenerator(seed: 42)
        for _ in 0..<200 {
            let high = UInt64.random(in: .min ... .max, using: &rng), low = UInt64.random(in: .min ... .max, using: &rng)
            let id = RecordID(high: high, low: low)
            #expect(RecordID(id.uuid) == id)
            #expect(withUnsafeBytes(of: id.uuid.uuid) { Array($0) } == id.bytes)
        }
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let names = ["", "plain ascii", "é", "日本語のテキスト", "emoji 🧦🧦", String(repeating: "x", count: 300) + "ü"]
        var items: [Item] = []
        for (n, name) in names.enumerated() {
            let home = RecordID(high: UInt64.random(in: .min ... .max, using: &rng), low: UInt64(n))
            items.append(Item(homeID: home, name: name, category: name, wearCount: n, price: 1, note: name))
        }
        try store.write { tx in for item in items { try tx.insert(item) } }
        for item in items { #expect(try store.get(Item.self, id: item.id) == item) }
    }
}

