import Foundation
import Stash
import Testing
import StashTestSupport

/// Random insert/update/upsert/delete sequences over Home/Item against an in-memory oracle.
/// Every batch is one write transaction; some throw midway and must leave no trace.
@Suite struct CRUDPropertyTests {
    struct Oracle {
        var homes: [RecordID: Home] = [:]
        var items: [RecordID: Item] = [:]
    }

    /// A failure with the seed, so a run can be replayed.
    struct Divergence: Error, CustomStringConvertible {
        let description: String
    }

    /// Applies one random operation to the store transaction and to `oracle` alike, and
    /// checks the transaction's own reads against it.
    static func step(_ tx: StoreTransaction, _ oracle: inout Oracle, _ rng: inout SeededGenerator, _ context: String) throws {
        let homeIDs = Array(oracle.homes.keys).sorted()
        let itemIDs = Array(oracle.items.keys).sorted()
        let roll = Int.random(in: 0..<100, using: &rng)
        func fail(_ text: String) -> Divergence { Divergence(description: "\(context): \(text)") }
        switch roll {
        case 0..<8:
            let home = Home(name: "home \(Int.random(in: 0..<1000, using: &rng))")
            try tx.insert(home)
            oracle.homes[home.id] = home
        case 8..<35 where !homeIDs.isEmpty:
            let item = Item.random(homes: homeIDs + [RecordID()], using: &rng)   // sometimes a home that does not exist
            try tx.insert(item)
            oracle.items[item.id] = item
        case 35..<50 where !itemIDs.isEmpty:
            var item = oracle.items[itemIDs.randomElement(using: &rng)!]!
            let fresh = Item.random(homes: homeIDs.isEmpty ? [item.homeID] : homeIDs, using: &rng)
            // Change a random subset of the fields (sometimes none).
            if Bool.random(using: &rng) { item.homeID = fresh.homeID }
            if Bool.random(using: &rng) { item.category = fresh.category }
            if Bool.random(using: &rng) { item.wearCount = fresh.wearCount }
            if Bool.random(using: &rng) { item.price = fresh.price }
            if Bool.random(using: &rng) { item.note = fresh.note }
            if Bool.random(using: &rng) { item.name = fresh.name }
            try tx.update(item)
            oracle.items[item.id] = item
        case 50..<58 where !itemIDs.isEmpty:
            let id = itemIDs.randomElement(using: &rng)!
            let newNote: String? = Bool.random(using: &rng) ? nil : "touched"
            let updated = try tx.update(Item.self, id: id) { item in
                item.wearCount += 1
                item.note = newNote
            }
            oracle.items[id]!.wearCount += 1
            oracle.items[id]!.note = newNote
            if updated != oracle.items[id]! { throw fail("update(closure) returned \(updated), expected \(oracle.items[id]!)") }
        case 58..<68 where !homeIDs.isEmpty:
            // Upsert: half replaces an existing item, half adds a new one.
            var item = Item.random(homes: homeIDs, using: &rng)
            if !itemIDs.isEmpty && Bool.random(using: &rng) { item.id = itemIDs.randomElement(using: &rng)! }
            try tx.upsert(item)
            oracle.items[item.id] = item
        case 68..<80 where !itemIDs.isEmpty:
            let id = itemIDs.randomElement(using: &rng)!
            guard try tx.delete(Item.self, id: id) else { throw fail("delete of existing item \(id) returned false") }
            oracle.items[id] = nil
        case 80..<83 where !homeIDs.isEmpty:
            let id = homeIDs.randomElement(using: &rng)!
            guard try tx.delete(Home.self, id: id) else { throw fail("delete of existing home \(id) returned false") }
            oracle.homes[id] = nil
        case 83..<86:
            if try tx.delete(Item.self, id: RecordID()) { throw fail("delete of a missing item returned true") }
        case 86..<90 where !itemIDs.isEmpty:
            // Insert of an existing id fails with duplicateID and changes nothing; the
            // transaction carries on.
            var copy = oracle.items[itemIDs.randomElement(using: &rng)!]!
            copy.name = "intruder"
            let error = thrownError { try tx.insert(copy) } as? StoreError
            if error?.code != .duplicateID { throw fail("insert of an existing id: \(String(describing: error))") }
        case 90..<93:
            let ghost = Item(homeID: RecordID(), name: "ghost", category: "a", wearCount: 0, price: 0)
            let error = thrownError { try tx.update(ghost) } as? StoreError
            if error?.code != .notFound { throw fail("update of a missing id: \(String(describing: error))") }
            let closureError = thrownError { try tx.update(Item.self, id: ghost.id) { $0.wearCount = 1 } } as? StoreError
            if closureError?.code != .notFound { throw fail("update(closure) of a missing id: \(String(describing: closureError))") }
        default:
            // Reads inside the transaction see its own writes.
            if let id = itemIDs.randomElement(using: &rng), try tx.get(Item.self, id: id) != oracle.items[id] {
                throw fail("in-transaction get of \(id) differs")
            }
            if try tx.count(Item.self) != oracle.items.count { throw fail("in-transaction count(Item) \(try tx.count(Item.self)) != \(oracle.items.count)") }
            if try tx.count(Home.self) != oracle.homes.count { throw fail("in-transaction count(Home)") }
            if let home = homeIDs.randomElement(using: &rng) {
                let expected = oracle.items.values.count { $0.homeID == home }
                let got = try tx.count(Item.self, where: \.homeID, equals: home)
                if got != expected { throw fail("in-transaction count(homeID) \(got) != \(expected)") }
            }
        }
    }

    /// Checks counts (type, index equality, composite, handle), every get, and absent ids.
    static func check(_ store: Store, _ oracle: Oracle, _ context: String, full: Bool) throws {
        #expect(try store.count(Item.self) == oracle.items.count, "\(context): count(Item)")
        #expect(try store.count(Home.self) == oracle.homes.count, "\(context): count(Home)")
        let byHome = try store.index(\Item.homeID)
        let byWear = try store.index(\Item.wearCount)
        let homeIDs = Set(oracle.homes.keys).union(oracle.items.values.map(\.homeID))
        for home in homeIDs.sorted() + [RecordID()] {
            let expected = oracle.items.values.count { $0.homeID == home }
            #expect(try store.count(Item.self, where: \.homeID, equals: home) == expected, "\(context): count(homeID == \(home))")
            #expect(try store.count(byHome, equals: home) == expected, "\(context): index handle count(homeID == \(home))")
            for category in ["a", "b", "c"] {
                let both = oracle.items.values.count { $0.homeID == home && $0.category == category }
                let conditions = [QueryCondition(field: "homeID", op: .equal, value: .uuid(home.uuid)),
                                  QueryCondition(field: "category", op: .equal, value: .string(category))]
                #expect(try store.read { try $0.count(typeNamed: "Item", where: conditions) } == both, "\(context): count(homeID, category)")
            }
        }
        for wear in -1..<10 {
            let expected = oracle.items.values.count { $0.wearCount == wear }
            #expect(try store.count(Item.self, where: \.wearCount, equals: wear) == expected, "\(context): count(wearCount == \(wear))")
            #expect(try store.count(byWear, equals: wear) == expected, "\(context): handle count(wearCount == \(wear))")
        }
        for category in ["a", "b", "c", "z"] {
            let expected = oracle.items.values.count { $0.category == category }
            #expect(try store.count(Item.self, where: \.category, equals: category) == expected, "\(context): count(category == \(category)) (no index)")
        }
        try store.read { snapshot throws in
            for (id, item) in oracle.items {
                let stored = try snapshot.get(Item.self, id: id)
                #expect(stored == item, "\(context): get \(id)")
            }
            for (id, home) in oracle.homes { #expect(try snapshot.get(Home.self, id: id) == home, "\(context): get home \(id)") }
            #expect(try snapshot.get(Item.self, id: RecordID()) == nil)
        }
        if full {
            let report = try store.verify()
            #expect(report.isClean, "\(context): \(report)")
            #expect(report.recordsChecked == oracle.items.count + oracle.homes.count, "\(context): records checked")
            #expect(report.indexEntriesChecked == oracle.items.count * Item.indexes.count, "\(context): index entries")
            let all = try store.fetch(FetchDescriptor<Item>())
            #expect(Dictionary(uniqueKeysWithValues: all.map { ($0.id, $0) }) == oracle.items, "\(context): fetch all")
        }
    }

    @Test(arguments: [UInt64(1), 42, 2024, 0xC0FFEE])
    func randomBatchesMatchOracle(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        var rng = SeededGenerator(seed: seed)
        var oracle = Oracle()
        var operations = 0
        var aborted = 0, committed = 0
        for batch in 0..<90 {
            let context = "seed \(seed) batch \(batch)"
            let batchSeed = rng.next()
            let size = Int.random(in: 1...16, using: &rng)
            let abortAt: Int? = Int.random(in: 0..<100, using: &rng) < 15 ? Int.random(in: 0..<size, using: &rng) : nil
            var pending = oracle
            do {
                try store.write { tx in
                    // The closure may run again (map growth): start from the same state each time.
                    pending = oracle
                    var brng = SeededGenerator(seed: batchSeed)
                    for op in 0..<size {
                        if op == abortAt { throw Rollback() }
                        try Self.step(tx, &pending, &brng, "\(context) op \(op)")
                    }
                }
                oracle = pending
                committed += 1
            } catch is Rollback {
                aborted += 1   // nothing of the batch may persist: the oracle stays as it was
            }
            operations += size
            try Self.check(store, oracle, context, full: batch % 10 == 9)
            // Every few batches, a few single-operation calls outside any explicit transaction.
            if batch % 6 == 0, let home = oracle.homes.keys.sorted().first {
                var item = Item.random(homes: [home], using: &rng)
                try store.insert(item)
                item.wearCount += 3
                try store.update(item)
                try store.upsert(item)
                oracle.items[item.id] = item
                if let victim = oracle.items.keys.sorted().randomElement(using: &rng) {
                    #expect(try store.delete(Item.self, id: victim), "seed \(seed)")
                    oracle.items[victim] = nil
                }
                operations += 4
            }
        }
        try Self.check(store, oracle, "seed \(seed) end", full: true)
        #expect(aborted > 0 && committed > 50, "seed \(seed): \(aborted) aborted, \(committed) committed")
        #expect(oracle.items.count > 20, "seed \(seed): the run should build up some data")
        // Reopen (new environment) and compare again: everything was on disk.
        let path = store.path
        _ = consume store
        let reopened = try Store.open(at: path, types: [Home.self, Item.self])
        try Self.check(reopened, oracle, "seed \(seed) reopened", full: true)
        print("CRUD property seed \(seed): \(operations) operations, \(committed) committed / \(aborted) aborted batches, \(oracle.items.count) items")
    }
}
