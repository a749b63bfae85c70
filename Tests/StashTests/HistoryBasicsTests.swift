import Foundation
import Stash
import StashLMDB
import Synchronization
import Testing
import StashTestSupport

@Suite struct HistoryBasicsTests {
    @Test func eachCommittedTransactionAppendsOneEntryWithItsChanges() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        #expect(try store.history().isEmpty)
        #expect(try store.currentToken() == .beginning)

        // 1: one insert.
        var home = Home(name: "Flat")
        try store.insert(home)
        var history = try store.history()
        #expect(history.count == 1)
        #expect(history[0].changes.count == 1)
        let insert = history[0].changes[0]
        #expect(insert.type == "Home")
        #expect(insert.id == home.id)
        #expect(insert.operation == .insert)
        #expect(Set(insert.fields) == ["name", "createdAt"])
        #expect(history[0].origin == store.siteID)
        #expect(history[0].author == nil)
        #expect(try store.currentToken() == history[0].token)

        // 2: several changes in one transaction, with an author.
        var item = Item(homeID: home.id, name: "Lamp", category: "light", wearCount: 0, price: 20, note: "new")
        let other = Item(homeID: home.id, name: "Desk", category: "wood", wearCount: 1, price: 90)
        home.name = "Flat 2"
        try store.write(author: "app") { tx in
            try tx.insert(item)
            try tx.insert(other)
            try tx.update(home)
        }
        history = try store.history(after: history[0].token)
        #expect(history.count == 1)
        let batch = history[0]
        #expect(batch.author == "app")
        #expect(batch.changes.map(\.operation) == [.insert, .insert, .update])
        #expect(batch.changes.map(\.id) == [item.id, other.id, home.id])
        #expect(Set(batch.changes[0].fields) == ["homeID", "name", "category", "wearCount", "price", "note"])
        #expect(Set(batch.changes[1].fields) == ["homeID", "name", "category", "wearCount", "price"], "nil fields are not written")
        #expect(batch.changes[2].fields == ["name"], "an update lists only the changed fields")

        // 3: an update that changes two fields and clears one.
        item.wearCount = 5
        item.price = 18.5
        item.note = nil
        try store.update(item)
        let update = try #require(try store.history(after: batch.token).first)
        #expect(update.changes.count == 1)
        #expect(update.changes[0].operation == .update)
        #expect(Set(update.changes[0].fields) == ["wearCount", "price", "note"])

        // 4: a delete lists no fields.
        try store.delete(Item.self, id: other.id)
        let delete = try #require(try store.history(after: update.token).first)
        #expect(delete.changes.count == 1)
        #expect(delete.changes.first?.operation == .delete)
        #expect(delete.changes.first?.id == other.id)
        #expect(delete.changes.first?.type == "Item")
        #expect(delete.changes.first?.fields == [])

        let all = try store.history()
        #expect(all.count == 4)
        #expect(zip(all, all.dropFirst()).allSatisfy { $0.sequence < $1.sequence })
        #expect(all.allSatisfy { $0.origin == store.siteID })
        // Type filter and limit.
        #expect(try store.history(types: ["Home"]).count == 2)
        #expect(try store.history(types: ["Home"]).allSatisfy { $0.changes.allSatisfy { $0.type == "Home" } })
        #expect(try store.history(limit: 2).map(\.sequence) == all.prefix(2).map(\.sequence))
        #expect(try store.verify().isClean)
    }

    /// `historySequence()` (one metadata read, kept per committed state) is
    /// `historyBounds().current` in snapshots old and new, in a write transaction, and after
    /// a commit of another `Store` on the directory.
    @Test func theHistorySequenceIsTheCurrentBound() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let other = try Store.open(at: dir.path, types: [Home.self, Item.self])
        try store.read { snapshot throws in #expect(try snapshot.historySequence() == 0) }
        for round in 0..<4 {
            try (round == 2 ? other : store).insert(Home(name: "h\(round)"))
            try store.read { snapshot throws in
                #expect(try snapshot.historySequence() == UInt64(round + 1))
                #expect(try snapshot.historySequence() == snapshot.historyBounds().current.sequence)
            }
            do {
                try store.write { tx throws in
                    try tx.insert(Home(name: "pending"))
                    #expect(try tx.historySequence() == UInt64(round + 1))   // its own entry is not written yet
                    throw Rollback()
                } as Void
            } catch is Rollback {}
        }
    }

    @Test func abortedAndEmptyTransactionsAddNoEntry() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        try store.insert(home)
        let token = try store.currentToken()
        // Thrown midway.
        #expect(throws: Rollback.self) {
            try store.write { tx in
                try tx.insert(Item(homeID: home.id, name: "x", category: "a", wearCount: 0, price: 0))
                try tx.delete(Home.self, id: home.id)
                throw Rollback()
            }
        }
        // A store error ends the transaction as well.
        let duplicate = thrownError { try store.write { tx in
            try tx.insert(Item(homeID: home.id, name: "y", category: "a", wearCount: 0, price: 0))
            try tx.insert(home)
        } } as? StoreError
        #expect(duplicate?.code == .duplicateID)
        // No change at all: an empty write, a read-only write, and a no-op upsert.
        try store.write { _ in }
        _ = try store.write { tx in try tx.count(Home.self) }
        try store.upsert(home)
        #expect(try store.currentToken() == token)
        #expect(try store.history().count == 1)
        #expect(try store.count(Item.self) == 0)
        #expect(try store.get(Home.self, id: home.id) == home)
    }

    @Test func sequenceNumbersStrictlyIncreaseAcrossReopen() throws {
        let dir = TemporaryDirectory()
        var seen: [UInt64] = []
        var lastToken = HistoryToken.beginning
        for round in 0..<3 {
            let store = try Store.open(at: dir.path, types: [Home.self])
            #expect(try store.currentToken() == lastToken, "round \(round): the token survives reopen")
            for n in 0..<3 { try store.insert(Home(name: "\(round)-\(n)")) }
            // An aborted write in between uses no number.
            _ = thrownError { try store.write { tx in try tx.insert(Home(name: "never")); throw Rollback() } }
            try store.insert(Home(name: "\(round)-last"))
            let fresh = try store.history(after: lastToken)
            #expect(fresh.count == 4, "round \(round)")
            #expect(fresh.first.map { $0.sequence > lastToken.sequence } == true)
            seen += fresh.map(\.sequence)
            lastToken = try store.currentToken()
            #expect(lastToken == fresh.last?.token)
        }
        #expect(seen == Array(1...12), "strictly increasing, no gaps and no reuse: \(seen)")
        // Tokens persist as Codable and compare by position.
        let data = try JSONEncoder().encode(lastToken)
        let decoded = try JSONDecoder().decode(HistoryToken.self, from: data)
        #expect(decoded == lastToken)
        #expect(HistoryToken(sequence: 3) < decoded)
        let store = try Store.open(at: dir.path, types: [Home.self])
        #expect(try store.history(after: decoded).isEmpty)
        #expect(try store.history(after: HistoryToken(sequence: 10)).map(\.sequence) == [11, 12])
    }

    /// Each snapshot sees the history bounds of its own committed state, also when the bounds
    /// of a newer state were asked for in between (a store keeps the newest it was asked for).
    @Test func historyBoundsBelongToEachSnapshotsState() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        for n in 0..<3 { try store.insert(Home(name: "home \(n)")) }
        let bounds = { try store.read { try $0.historyBounds() } }
        #expect(try bounds().current == HistoryToken(sequence: 3))
        #expect(try bounds().purgedThrough == .beginning)
        try store.read { old in
            #expect(try old.historyBounds().current == HistoryToken(sequence: 3))
            try store.insert(Home(name: "newer"))
            #expect(try bounds().current == HistoryToken(sequence: 4))
            #expect(try old.historyBounds().current == HistoryToken(sequence: 3), "the open snapshot keeps its state")
            try store.purgeHistory(before: HistoryToken(sequence: 2))
            #expect(try bounds().purgedThrough == HistoryToken(sequence: 2))
            #expect(try old.historyBounds().purgedThrough == .beginning)
            #expect(try old.historyBounds() == (HistoryToken(sequence: 3), .beginning))
        }
        // A purge adds no entry; a write's entry is made at commit.
        try store.write { tx in
            try tx.insert(Home(name: "pending"))
            #expect(try tx.historyBounds() == (HistoryToken(sequence: 4), HistoryToken(sequence: 2)))
        }
        #expect(try bounds() == (HistoryToken(sequence: 5), HistoryToken(sequence: 2)))
    }

    /// One undecodable history entry (damaged, or written by a newer Stash) made every
    /// history read throw an internal error naming no store, entry or way out.
    @Test func anUnreadableHistoryEntryIsNamed() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        for n in 0..<3 { try store.insert(Home(name: "h\(n)")) }
        let env = try Environment.open(path: dir.path)
        let history = try env.database("history")
        try env.write { txn in try txn.put(history, key: [UInt8]([0, 0, 0, 0, 0, 0, 0, 2]), value: [UInt8]([9, 1, 2])) }
        #expect(try store.history(after: HistoryToken(sequence: 2)).count == 1, "entries after it still read")
        for read in [{ _ = try store.history() }, { _ = try store.history(types: ["Home"]) }] {
            let error = thrownError(read) as? StoreError
            #expect(error?.code == .corrupted, "\(String(describing: error))")
            #expect(error?.message.contains(store.path) == true && error?.message.contains("history entry 2") == true, "\(String(describing: error))")
        }
        #expect(!(try store.verify().isClean))
        try store.purgeHistory(before: HistoryToken(sequence: 2), force: true)
        #expect(try store.history(after: HistoryToken(sequence: 2)).count == 1)
    }

    /// A consumer of one type behind a long run of another type's entries: `history(after:
    /// types:)` read the whole backlog in one snapshot, and gave no token past the entries it
    /// left out, so a consumer following `entries.last` rescanned them forever and held back
    /// every purge. Pages bound the work and carry the token to go on from.
    @Test func filteredHistoryPagesMovePastOtherTypes() throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.durability = .none
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self], options: options)
        let home = Home(name: "h")
        try store.insert(home)
        let first = Item(homeID: home.id, name: "first", category: "c", wearCount: 0, price: 0)
        try store.insert(first)
        let others = HistoryPage.maximumScanned + 500
        for n in 0..<others { try store.insert(Home(name: "other \(n)")) }
        let last = Item(homeID: home.id, name: "last", category: "c", wearCount: 0, price: 0)
        try store.insert(last)
        for n in 0..<10 { try store.insert(Home(name: "after \(n)")) }
        let current = try store.currentToken()

        var page = try store.historyPage(types: ["Item"])
        #expect(page.entries.map { $0.changes.map(\.id) } == [[first.id]])
        #expect(!page.reachedEnd && page.scannedThrough == HistoryToken(sequence: UInt64(HistoryPage.maximumScanned)))
        var seen = page.entries
        while !page.reachedEnd {
            page = try store.historyPage(after: page.scannedThrough, types: ["Item"])
            seen += page.entries
        }
        #expect(seen.map { $0.changes.map(\.id) } == [[first.id], [last.id]])
        #expect(page.scannedThrough == current, "the last page moves past the trailing entries of other types")
        // A consumer registered where the pages ended holds back no purge.
        try store.registerHistoryConsumer("items", at: page.scannedThrough)
        #expect(try store.purgeHistory(before: current).overriddenConsumers.isEmpty)
        // The one-call form still answers the whole backlog, page by page.
        let otherDir = TemporaryDirectory()
        let again = try Store.open(at: otherDir.path, types: [Home.self, Item.self], options: options)
        try again.insert(first)
        for n in 0..<others { try again.insert(Home(name: "other \(n)")) }
        try again.insert(last)
        #expect(try again.history(types: ["Item"]).map { $0.changes.map(\.id) } == [[first.id], [last.id]])
        #expect(try again.history(types: ["Item"], limit: 1).count == 1)
        #expect(try again.history(types: ["Home"], limit: 3).count == 3)
        // A page of no entries at the end says so (a loop until reachedEnd would spin); a
        // negative limit is refused.
        #expect(try again.historyPage(after: again.currentToken(), limit: 0).reachedEnd)
        #expect((thrownError { _ = try again.historyPage(limit: -1) } as? StoreError)?.code == .invalidValue)
    }

    /// An observer of one type behind a backlog of another goes from page to page at once:
    /// it slept a poll interval after every page of 4,096 entries that held none of its type.
    @Test func anObserverBehindABacklogDoesNotWaitBetweenPages() async throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.durability = .none
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self], options: options)
        let home = Home(name: "h")
        let item = Item(homeID: home.id, name: "after the backlog", category: "c", wearCount: 0, price: 0)
        try store.write(isolation: #isolation) { tx in try tx.insert(home) }   // the synchronous write
        for n in 0..<(HistoryPage.maximumScanned + 500) { try store.insert(Home(name: "other \(n)")) }
        try store.insert(item)
        var changes = store.changes(of: ["Item"], after: .beginning, pollInterval: .seconds(30)).makeAsyncIterator()
        let start = ContinuousClock.now
        let entry = try await changes.next()
        #expect(entry?.changes.map(\.id) == [item.id])
        #expect(ContinuousClock.now - start < .seconds(20), "it waited for a poll interval between pages")
    }
}
