import Foundation
import Stash
import StashLMDB
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

    /// An insert first tries to put the new id's versions with `noOverwrite` (for types
    /// without unique indexes): a duplicate must leave nothing behind and let the transaction
    /// carry on, and a re-insert after a delete must start a new incarnation.
    @Test func insertsOfNewDuplicateAndDeletedIDs() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = RecordID()
        let item = Item(homeID: home, name: "a", category: "c", wearCount: 1, price: 1)
        try store.insert(item)
        #expect(try store.delete(Item.self, id: item.id))
        var again = item
        again.name = "b"
        try store.insert(again)
        #expect(try store.get(Item.self, id: item.id) == again)
        let other = Item(homeID: home, name: "o", category: "c", wearCount: 2, price: 2)
        try store.write { tx in
            var intruder = again
            intruder.homeID = RecordID()
            let error = thrownError { try tx.insert(intruder) } as? StoreError
            #expect(error?.code == .duplicateID)
            try tx.insert(other)
        }
        #expect(try store.get(Item.self, id: item.id) == again)
        // A transaction whose only write is a duplicate insert, caught: nothing to commit, not
        // even the clock (LMDB's transaction id stays where it was).
        let env = try Environment.open(path: dir.path)
        let lastTransaction = env.info().lastTransactionID
        try store.write { tx in _ = try? tx.insert(again) }
        #expect(env.info().lastTransactionID == lastTransaction)
        // Ids that do not sort last (an old id, a type stored before the last one) are put the
        // ordinary way; ids that do are appended.
        let early = Item(id: RecordID(high: 1, low: 1), homeID: home, name: "e", category: "c", wearCount: 3, price: 3)
        let flat = Home(name: "flat")
        try store.write { tx in
            try tx.insert(early)
            try tx.insert(flat)
        }
        #expect(try store.get(Item.self, id: early.id) == early)
        #expect(try store.get(Home.self, id: flat.id) == flat)
        #expect(try store.count(Item.self) == 3)
        #expect(try store.count(Item.self, where: \.homeID, equals: home) == 3)
        #expect(try store.history().flatMap { $0.changes.map(\.operation) } == [.insert, .delete, .insert, .insert, .insert, .insert])
        let report = try store.verify()
        #expect(report.isClean, "\(report)")
    }

    /// A type with a field of every built-in kind the encoder tells apart by type (`UUID`,
    /// `RecordID`, `Date`, `Data`, `Double`): typed writes store what the generic API stores
    /// for the same values, byte for byte, and the index on the `UUID` field gives typed and
    /// generic records the same key.
    @Test func builtInFieldTypesStoreWhatTheGenericAPIStores() throws {
        struct Badge: Record, Equatable {
            var id = RecordID()
            var token: UUID
            var owner: RecordID
            var issuedAt: Date
            var blob: Data
            var score: Double
            static let indexes: [RecordIndex<Badge>] = [.index(\.token)]
        }
        var rng = SeededGenerator(seed: 0xBAD6E)
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Badge.self])
        let tokens = (0..<3).map { _ in RecordID(high: .random(in: .min ... .max, using: &rng), low: .random(in: .min ... .max, using: &rng)).uuid }
        var badges: [Badge] = []
        for n in 0..<30 {
            badges.append(Badge(token: tokens[n % 3],
                                owner: RecordID(high: .random(in: .min ... .max, using: &rng), low: UInt64(n)),
                                issuedAt: Date(timeIntervalSince1970: Double(n) * 1_000.25),
                                blob: Data((0..<(n * 7)).map { UInt8(truncatingIfNeeded: $0 &* 31) }),
                                score: n % 5 == 0 ? -Double(n) / 7 : Double(n).squareRoot()))
        }
        try store.write { tx in for badge in badges { try tx.insert(badge) } }
        // The same values through the generic API, under other ids.
        let genericIDs = (0..<6).map { _ in RecordID() }
        try store.write { tx in
            for (badge, id) in zip(badges, genericIDs) {
                try tx.put(GenericRecord(type: "Badge", id: id, fields: [
                    "token": .uuid(badge.token), "owner": .uuid(badge.owner.uuid), "issuedAt": .date(badge.issuedAt),
                    "blob": .bytes(badge.blob), "score": .double(badge.score)]))
            }
        }
        for (n, badge) in badges.enumerated() {
            #expect(try store.get(Badge.self, id: badge.id) == badge)
            let typed = try #require(try store.read { try $0.get(typeNamed: "Badge", id: badge.id) })
            #expect(typed.fields["token"] == .uuid(badge.token))
            #expect(typed.fields["owner"] == .uuid(badge.owner.uuid))
            #expect(typed.fields["issuedAt"] == .date(badge.issuedAt))
            #expect(typed.fields["blob"] == .bytes(badge.blob))
            #expect(typed.fields["score"] == .double(badge.score))
            if n < genericIDs.count {
                let generic = try #require(try store.get(Badge.self, id: genericIDs[n]))
                #expect(generic.token == badge.token && generic.owner == badge.owner && generic.issuedAt == badge.issuedAt
                        && generic.blob == badge.blob && generic.score == badge.score)
            }
        }
        for (n, token) in tokens.enumerated() {
            let generic = (0..<genericIDs.count).filter { $0 % 3 == n }.count
            #expect(try store.count(Badge.self, where: \.token, equals: token) == 10 + generic)
            #expect(try store.read { try $0.count(typeNamed: "Badge", where: [QueryCondition(field: "token", op: .equal, value: .uuid(token))]) } == 10 + generic)
        }
        let report = try store.verify()
        #expect(report.isClean, "\(report)")
    }
}
