import Foundation
import Stash
import Synchronization
import Testing
import StashTestSupport

/// The counts a store keeps for its own commits (`keepRecentCounts`), across the writes that
/// do not come from a plain insert, update or delete of the app: merges (a delta import), a
/// unique clash a merge leaves and the commit settles, a migration run by another open, a
/// history purge, group commits whose writers fail or catch their own errors, and a commit of
/// another process. After each, every earlier state brought up to date must equal a fresh
/// count, and a span the store did not see whole must be unknown.
@Suite struct RecentCountsEdgeTests {
    typealias Counted = RecentCountsTests.Counted

    /// The records of `R` and the size of every group of its index on `parent`, counted in a
    /// fresh read snapshot.
    static func counted<R: Record>(_ store: Store, _ parent: KeyPath<R, RecordID>) throws -> Counted {
        let index = try store.index(parent)
        return try store.read { snapshot in
            let groups = try snapshot.groups(index, largerThan: 0)
            return Counted(total: try snapshot.count(R.self), sizes: Dictionary(uniqueKeysWithValues: groups.map { ($0.value, $0.count) }))
        }
    }

    /// The committed states seen so far, each brought up to the newest one at every check.
    struct States {
        let store: Store
        let key: RecentCountsKey
        let count: () throws -> Counted
        var kept: [(token: HistoryToken, counts: Counted)] = []

        init(_ store: Store, _ key: RecentCountsKey, _ count: @escaping () throws -> Counted) {
            self.store = store
            self.key = key
            self.count = count
        }

        /// Checks that every kept state brought up to the current one is the current count,
        /// then keeps the current one.
        mutating func check(_ context: String) throws {
            let now = try store.currentToken(), truth = try count()
            for state in kept {
                let brought = RecentCountsTests.broughtUpToDate(state.counts, store, key, from: state.token, to: now)
                #expect(brought == truth, "\(context): from \(state.token) to \(now)")
            }
            if kept.last?.token != now { kept.append((now, truth)) }
        }
    }

    private func item(_ home: RecordID, _ name: String = "item") -> Item {
        Item(homeID: home, name: name, category: "c", wearCount: 0, price: 1)
    }

    private static func keep(_ store: Store) throws -> RecentCountsKey {
        store.keepRecentCounts(of: try store.typeHandle(Item.self), groupedBy: try store.index(\Item.homeID))
    }

    /// Merges, as a delta import makes them: a remote edit moves records between homes, a
    /// remote insert adds one, a remote delete (a newer tombstone) removes one, alone and
    /// several in one commit.
    @Test func mergesThatMoveInsertAndDeleteAreFollowed() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let key = try Self.keep(store)
        var states = States(store, key) { try Self.counted(store, \Item.homeID) }
        let homes = (0..<3).map { _ in RecordID() }
        let items = (0..<6).map { item(homes[$0 % 3], "\($0)") }
        try store.write { tx in for item in items { try tx.insert(item) } }
        try states.check("inserted")
        let peer = RecordID()
        var clock = try #require(try store.read { try $0.recordState(typeNamed: "Item", id: items[5].id) }.latestVersion).clock + 1_000
        func later() -> Version { clock += 1; return Version(clock: clock, site: peer) }
        func state(_ id: RecordID) throws -> RecordState { try store.read { try $0.recordState(typeNamed: "Item", id: id) } }
        func moved(_ n: Int, to home: RecordID) throws -> RecordState {
            var moved = try state(items[n].id)
            moved.fields["homeID"] = FieldState(value: .uuid(home.uuid), version: later())
            return moved
        }

        for (n, home) in [(0, homes[1]), (1, homes[0]), (2, homes[1])] {
            let remote = try moved(n, to: home)
            #expect(try store.write { tx in try tx.merge(remote, origin: peer) })
            try states.check("moved \(n)")
        }
        let inserted = RecordID(), version = later()
        let insert = RecordState(type: "Item", id: inserted, incarnation: version, tombstone: nil, fields: [
            "homeID": FieldState(value: .uuid(homes[2].uuid), version: version), "name": FieldState(value: .string("remote"), version: version),
            "category": FieldState(value: .string("c"), version: version), "wearCount": FieldState(value: .int(0), version: version),
            "price": FieldState(value: .double(1), version: version)])
        var delete = try state(items[3].id)
        delete.tombstone = later()
        let move = try moved(4, to: homes[2])
        let changed = try store.write { tx in try [insert, delete, move].map { try tx.merge($0, origin: peer) } }
        #expect(changed == [true, true, true])
        try states.check("inserted, deleted and moved in one commit")
        let deleteInserted = RecordState(type: "Item", id: inserted, incarnation: version, tombstone: later(), fields: [:])
        #expect(try store.write { tx in try tx.merge(deleteInserted, origin: peer) })
        try states.check("the remote insert deleted")
        #expect(try Self.counted(store, \Item.homeID) == Counted(total: 5, sizes: [homes[0]: 1, homes[1]: 2, homes[2]: 2]))
    }

    /// A merge that gives a record another's unique value: the commit deletes one of the two
    /// (settled in `finish`, after the closure), and that delete changes a total and a group
    /// the closure itself never touched.
    @Test func aUniqueClashSettledAtTheCommitIsFollowed() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Locker.self])
        let key = store.keepRecentCounts(of: try store.typeHandle(Locker.self), groupedBy: try store.index(\Locker.homeID))
        var states = States(store, key) { try Self.counted(store, \Locker.homeID) }
        let homes = (0..<3).map { _ in RecordID() }
        let kept = Locker(homeID: homes[0], code: "x"), clashing = Locker(homeID: homes[1], code: "y")
        try store.write { tx in
            try tx.insert(kept)
            try tx.insert(clashing)
        }
        try states.check("inserted")
        var remote = try store.read { try $0.recordState(typeNamed: "Locker", id: clashing.id) }
        let later = Version(clock: try #require(remote.latestVersion).clock + 1_000, site: RecordID())
        remote.fields["code"] = FieldState(value: .string("x"), version: later)
        remote.fields["homeID"] = FieldState(value: .uuid(homes[2].uuid), version: later)
        #expect(try store.write { tx in try tx.merge(remote, origin: later.site) })
        #expect(try store.count(Locker.self) == 1, "the clash was settled by deleting one locker")
        try states.check("clash settled")
        try store.insert(Locker(homeID: homes[2], code: "z"))
        try states.check("after the settled clash")
    }

    /// A migration run by another open of the directory (another app version, in this process)
    /// moves records between homes in a commit this store did not make: a span across it is
    /// unknown, and the store's own commits after it are followed again.
    @Test func aMigrationRunByAnotherOpenIsAGap() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let key = try Self.keep(store)
        let homes = [RecordID(), RecordID()]
        try store.write { tx in for n in 0..<4 { try tx.insert(item(homes[n == 0 ? 1 : 0], "\(n)")) } }
        let before = try store.currentToken(), countedBefore = try RecentCountsTests.counted(store)
        var options = StoreOptions()
        let target = homes[1]
        options.migrations = [Migration(version: 1, type: "Item") { $0.fields["homeID"] = .uuid(target.uuid) }]
        _ = try Store.open(at: dir.path, types: [Home.self, Item.self], options: options)
        let migrated = try store.currentToken(), countedMigrated = try RecentCountsTests.counted(store)
        #expect(countedMigrated == Counted(total: 4, sizes: [homes[1]: 4]))
        try store.insert(item(homes[0], "after"))
        let after = try store.currentToken(), truth = try RecentCountsTests.counted(store)
        #expect(migrated > before, "the migration is a history entry")
        #expect(RecentCountsTests.broughtUpToDate(countedBefore, store, key, from: before, to: migrated) == nil)
        #expect(RecentCountsTests.broughtUpToDate(countedBefore, store, key, from: before, to: after) == nil)
        #expect(RecentCountsTests.broughtUpToDate(countedMigrated, store, key, from: migrated, to: after) == truth)
    }

    /// Another open (an older app version) drops the kept index with `dropsUndeclaredIndexes`:
    /// a commit of this store after that has no entry of the index to note, which says
    /// nothing of its groups. Their sizes are unknown from then on; the totals stay known.
    @Test func commitsAfterAnotherOpenDroppedTheIndexLeaveItsGroupsUnknown() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let key = try Self.keep(store)
        let totalOnly = store.keepRecentCounts(of: try store.typeHandle(Item.self), groupedBy: nil)
        let homes = [RecordID(), RecordID()]
        let items = (0..<4).map { item(homes[$0 % 2], "\($0)") }
        try store.write { tx in for item in items { try tx.insert(item) } }
        let before = try store.currentToken(), countedBefore = try RecentCountsTests.counted(store)
        var dropping = StoreOptions()
        dropping.dropsUndeclaredIndexes = true
        _ = try Store.open(at: dir.path, types: [Home.self, ItemWithoutIndexes.self], options: dropping)
        try store.update(Item.self, id: items[1].id) { $0.homeID = homes[0] }
        try store.insert(item(homes[0], "after"))
        let after = try store.currentToken()
        #expect(RecentCountsTests.broughtUpToDate(countedBefore, store, key, from: before, to: after) == nil)
        var total = countedBefore.total
        #expect(store.recentCounts(totalOnly, from: before, to: after, total: &total) { _, _ in Issue.record("no index asked for") })
        #expect(total == 5)
    }

    /// A purge is a write of the store that leaves no history entry (and moves no sequence):
    /// the commits on either side of it still chain, and their counts stay right.
    @Test func aPurgeBetweenCommitsLeavesThemFollowed() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let key = try Self.keep(store)
        var states = States(store, key) { try RecentCountsTests.counted(store) }
        let homes = [RecordID(), RecordID()]
        let items = (0..<4).map { item(homes[$0 % 2], "\($0)") }
        try store.write { tx in for item in items { try tx.insert(item) } }
        try states.check("inserted")
        try store.update(Item.self, id: items[0].id) { $0.homeID = homes[1] }
        try states.check("moved")
        let report = try store.purgeHistory(before: try store.currentToken(), force: true)
        #expect(report.removedEntries == 2)
        try states.check("purged")
        #expect(try store.delete(Item.self, id: items[1].id))
        try states.check("deleted after the purge")
    }

    /// Counts taken at a later state are never "brought up to date" to an earlier one: the
    /// answer is unknown (it was known, with the counts unchanged: the later state's).
    @Test func countsAreNotTakenBack() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let key = try Self.keep(store)
        let before = try store.currentToken()
        try store.insert(item(RecordID()))
        let after = try store.currentToken(), countedAfter = try RecentCountsTests.counted(store)
        #expect(RecentCountsTests.broughtUpToDate(countedAfter, store, key, from: after, to: after) == countedAfter)
        #expect(RecentCountsTests.broughtUpToDate(countedAfter, store, key, from: after, to: before) == nil)
    }

    /// Writers committed together (group commit) that move and delete records: one of each
    /// group throws after its moves (the group runs again with each writer nested, and drops
    /// its changes), one catches a failed insert of its own and commits its move, one deletes
    /// and re-inserts an item in another home. The first writer of each round holds the write
    /// while the others queue, so that they commit as one group. The span of all the rounds
    /// is known, and equals the store's counts.
    @Test func groupCommitsOfMovesWithFailingWritersAreFollowed() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let key = try Self.keep(store)
        let homes = (0..<3).map { _ in RecordID() }
        let items = (0..<15).map { item(homes[$0 % 3], "\($0)") }
        try store.write { tx in for item in items { try tx.insert(item) } }
        let start = try store.currentToken(), countedAtStart = try RecentCountsTests.counted(store)
        let runs = Mutex(0), committed = Mutex(0), failures = Failures()
        // 4 rounds of 5 writers: fewer commits than the store keeps.
        for round in 0..<4 {
            onThreads(5) { writer in
                if writer > 0 { Thread.sleep(forTimeInterval: 0.02) }   // behind the first one's write
                let mine = items[writer * 3 + round % 3], home = homes[(writer + round + 1) % 3]
                do {
                    try store.write { tx in
                        runs.withLock { $0 += 1 }
                        switch writer {
                        case 0:   // holds the write while the others queue
                            Thread.sleep(forTimeInterval: 0.2)
                            try tx.update(Item.self, id: mine.id) { $0.homeID = home }
                        case 1:   // moves two, then fails: nothing of it stays
                            try tx.update(Item.self, id: mine.id) { $0.homeID = home }
                            try tx.update(Item.self, id: items[0].id) { $0.homeID = homes[(round + 2) % 3] }
                            throw Rollback()
                        case 2:   // a failed insert of its own, caught; its move commits
                            do {
                                try tx.insert(items[1])
                                failures.add("round \(round): a second insert of one id passed")
                            } catch is StoreError {}
                            try tx.update(Item.self, id: mine.id) { $0.homeID = home }
                        case 3:   // deleted and inserted again under the same id, in another home
                            if try tx.delete(Item.self, id: mine.id) {
                                var again = mine
                                again.homeID = home
                                try tx.insert(again)
                            }
                        default:
                            try tx.insert(Item(homeID: home, name: "round \(round)", category: "c", wearCount: 0, price: 1))
                        }
                    } as Void
                    committed.withLock { $0 += 1 }
                } catch is Rollback {
                } catch {
                    failures.add("round \(round), writer \(writer): \(error)")
                }
            }
        }
        #expect(failures.all.isEmpty)
        #expect(committed.withLock { $0 } == 16)
        // A group with a failing writer runs its closures twice.
        #expect(runs.withLock { $0 } > 20, "no group ran again: the writers did not commit together")
        let end = try store.currentToken(), truth = try RecentCountsTests.counted(store)
        // A write that changed nothing (a move to the home an item is in) leaves no entry.
        #expect(end.sequence - start.sequence > 8)
        #expect(truth.total == 19)
        #expect(RecentCountsTests.broughtUpToDate(countedAtStart, store, key, from: start, to: end) == truth)
    }

    /// A commit of another process (the command-line tool moving a record): a gap, as for
    /// another `Store` of this process.
    @Test func aCommitOfAnotherProcessIsAGap() throws {
        let dir = TemporaryDirectory()
        let path = try StashCLI.makeStore(in: dir)
        let store = try Store.open(at: path, types: [CLIItem.self])
        let key = store.keepRecentCounts(of: try store.typeHandle(CLIItem.self), groupedBy: try store.index(\CLIItem.homeID))
        let homes = [RecordID(), RecordID()]
        let moving = CLIItem(homeID: homes[0], name: "moving", wearCount: 0)
        try store.insert(moving)
        try store.insert(CLIItem(homeID: homes[0], name: "staying", wearCount: 0))
        let before = try store.currentToken(), countedBefore = try Self.counted(store, \CLIItem.homeID)
        let put = try StashCLI.run("put", path, "Item", #"{"id": "\#(moving.id)", "homeID": "\#(homes[1])", "name": "moving", "wearCount": 1}"#)
        #expect(put.status == 0, "\(put.stderr)")
        let between = try store.currentToken(), countedBetween = try Self.counted(store, \CLIItem.homeID)
        #expect(countedBetween == Counted(total: 2, sizes: [homes[0]: 1, homes[1]: 1]))
        try store.insert(CLIItem(homeID: homes[1], name: "after", wearCount: 0))
        let after = try store.currentToken(), truth = try Self.counted(store, \CLIItem.homeID)
        #expect(RecentCountsTests.broughtUpToDate(countedBefore, store, key, from: before, to: between) == nil)
        #expect(RecentCountsTests.broughtUpToDate(countedBefore, store, key, from: before, to: after) == nil)
        #expect(RecentCountsTests.broughtUpToDate(countedBetween, store, key, from: between, to: after) == truth)
    }
}

/// A record with a parent and a unique code (a locker in a home), for clashes a merge makes.
private struct Locker: Record, Equatable {
    var id = RecordID()
    var homeID: RecordID
    var code: String
    static let indexes: [RecordIndex<Locker>] = [.index(\.homeID), .unique(\.code)]
}

/// `Item` as an older app version declares it: fewer fields, and no index.
private struct ItemWithoutIndexes: Record, Equatable {
    static let recordType = "Item"
    var id = RecordID()
    var homeID: RecordID
    var name: String
}
