import Foundation
import Stash
import StashLMDB
import Testing
import StashTestSupport

/// `groups(_:largerThan:)` names the groups of a parent index over a size, and
/// `changedRecords(in:after:limit:)` lists the records that may have changed group since a
/// token, so that a quota check can keep "which parents are over the limit" up to date from
/// history instead of walking every parent after each commit.
@Suite struct GroupChangesTests {
    private func item(_ home: RecordID, _ name: String) -> Item {
        Item(homeID: home, name: name, category: "c", wearCount: 0, price: 1)
    }

    @Test func groupsLargerThanASizeAreNamedWithTheirCounts() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let homes = (0..<4).map { _ in RecordID() }
        try store.write { tx in
            for (h, size) in [3, 1, 5, 0].enumerated() {
                for k in 0..<size { try tx.insert(item(homes[h], "\(h).\(k)")) }
            }
        }
        let index = try store.index(\Item.homeID)
        try store.read { snapshot in
            let over2 = try snapshot.groups(index, largerThan: 2)
            #expect(over2.map(\.value) == [homes[0], homes[2]].sorted { $0.bytes.lexicographicallyPrecedes($1.bytes) })
            #expect(Dictionary(uniqueKeysWithValues: over2.map { ($0.value, $0.count) }) == [homes[0]: 3, homes[2]: 5])
            #expect(try snapshot.groups(index, largerThan: 5).isEmpty)
            #expect(try snapshot.groups(index, largerThan: 0).count == 3)
            #expect(try snapshot.largestGroupCount(index) == 5)
        }
    }

    @Test func changedRecordsListsInsertsDeletesAndMovesButNotOtherUpdates() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let index = try store.index(\Item.homeID)
        let a = RecordID(), b = RecordID()
        let first = item(a, "first"), second = item(a, "second")
        try store.insert(first)
        let afterFirst = try store.currentToken()
        try store.insert(second)
        try store.insert(Home(name: "not an item"))
        try store.update(Item.self, id: first.id) { $0.wearCount += 1 }   // stays in a
        try store.update(Item.self, id: second.id) { $0.homeID = b }      // moves to b
        try store.delete(Item.self, id: first.id)

        try store.read { snapshot in
            #expect(try snapshot.changedRecords(in: index, after: afterFirst, limit: 100) == [second.id, second.id, first.id])
            #expect(try snapshot.changedRecords(in: index, after: .beginning, limit: 100) == [first.id, second.id, second.id, first.id])
            #expect(try snapshot.changedRecords(in: index, after: snapshot.historyBounds().current, limit: 100) == [])
            // Six changes after the beginning: more than five is "count from scratch".
            #expect(try snapshot.changedRecords(in: index, after: .beginning, limit: 5) == nil)
            #expect(try snapshot.changedRecords(in: index, after: .beginning, limit: 6) != nil)
            // A token this snapshot cannot see yet.
            let future = HistoryToken(sequence: try snapshot.historyBounds().current.sequence + 1)
            #expect(try snapshot.changedRecords(in: index, after: future, limit: 100) == nil)
        }
    }

    @Test func indexedValueReadsOneFieldOfAStoredRecord() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = RecordID()
        let stored = item(home, "lamp")
        try store.insert(stored)
        try store.read { snapshot throws in
            #expect(try snapshot.indexedValue(of: store.index(\Item.homeID), id: stored.id) == .uuid(home.uuid))
            #expect(try snapshot.indexedValue(of: store.index(\Item.wearCount), id: stored.id) == .int(0))
            #expect(try snapshot.indexedValue(of: store.index(\Item.homeID), id: RecordID()) == nil)
        }
    }

    @Test func aWriteTransactionListsItsOwnPendingChanges() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let index = try store.index(\Item.homeID)
        let a = RecordID(), b = RecordID()
        let committed = item(a, "committed"), pending = item(a, "pending")
        try store.insert(committed)
        let token = try store.currentToken()
        try store.write { tx in
            #expect(try tx.changedRecords(in: index, after: token, limit: 10) == [])
            try tx.insert(pending)
            try tx.update(Item.self, id: committed.id) { $0.homeID = b }
            #expect(try tx.changedRecords(in: index, after: token, limit: 10) == [pending.id, committed.id])
            #expect(try tx.changedRecords(in: index, after: .beginning, limit: 10) == [committed.id, pending.id, committed.id])
        }
    }

    /// A cursor taken inside a write lists only what the write changed after it; a cursor of
    /// another write cannot be followed (its uncommitted changes are not visible here).
    @Test func aWriteCursorListsOnlyTheChangesAfterIt() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let index = try store.index(\Item.homeID)
        let first = item(RecordID(), "first"), second = item(RecordID(), "second")
        let other = try store.write { tx throws -> ChangeCursor in
            try tx.insert(first)
            let cursor = try tx.changeCursor()
            #expect(cursor.transaction != 0 && cursor.pending == 1)
            #expect(try tx.changedRecords(in: index, after: cursor, limit: 10) == [])
            try tx.insert(second)
            try tx.update(Item.self, id: first.id) { $0.name = "renamed" }   // not the indexed field
            #expect(try tx.changedRecords(in: index, after: cursor, limit: 10) == [second.id])
            #expect(try tx.changedRecords(in: index, after: cursor, limit: 0) == nil)
            return cursor
        }
        try store.write { tx throws in
            #expect(try tx.changeCursor().transaction != other.transaction)
            #expect(try tx.changedRecords(in: index, after: other, limit: 10) == nil)
        }
        try store.read { snapshot throws in
            #expect(try snapshot.changeCursor() == ChangeCursor(try snapshot.historyBounds().current))
            #expect(try snapshot.changedRecords(in: index, after: other, limit: 10) == nil)
        }
    }

    @Test func purgedHistoryCannotBeFollowed() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let index = try store.index(\Item.homeID)
        let home = RecordID()
        try store.insert(item(home, "one"))
        try store.insert(item(home, "two"))
        let two = try store.currentToken()
        try store.insert(item(home, "three"))
        try store.purgeHistory(before: two)
        try store.read { snapshot throws in
            #expect(try snapshot.changedRecords(in: index, after: .beginning, limit: 10) == nil)
            #expect(try snapshot.changedRecords(in: index, after: two, limit: 10)?.count == 1)
        }
    }

    /// An entry this library cannot decode (written by a newer one, or damaged) makes the
    /// answer "count from scratch", not an error that a quota check would turn into a denial.
    @Test func anUndecodableEntryMeansCountFromScratch() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let index = try store.index(\Item.homeID)
        let home = RecordID()
        try store.insert(item(home, "one"))
        let one = try store.currentToken()
        try store.insert(item(home, "two"))
        let env = try Environment.open(path: dir.path)
        let history = try env.database("history")
        var key = KeyBytes()
        key.appendBigEndian(one.sequence + 1)
        try env.write { txn in try txn.put(history, key: key, value: [UInt8]([9, 9, 9])) }
        try store.read { snapshot throws in
            #expect(try snapshot.changedRecords(in: index, after: one, limit: 10) == nil)
            #expect(try snapshot.changedRecords(in: index, after: .beginning, limit: 10) == nil)
        }
        // A known format whose author length is absurd (2^64 - 1): no trap, count from scratch.
        // (Entry format 2: the format byte, the checksum of what follows, then the entry.)
        let absurd = resealedHistoryEntry([UInt8]([2, 0, 0, 0, 0]) + [UInt8](repeating: 0, count: 24) + [UInt8](repeating: 0xFF, count: 9) + [0x01])
        try env.write { txn in try txn.put(history, key: key, value: absurd) }
        try store.read { snapshot throws in
            #expect(try snapshot.changedRecords(in: index, after: one, limit: 10) == nil)
        }
    }
}

