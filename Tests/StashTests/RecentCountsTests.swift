import Foundation
import Stash
import Synchronization
import Testing
import StashTestSupport

/// A store keeps, once asked, the record counts and the group sizes of one index that its
/// own commits leave (`keepRecentCounts`), so that a reader (a gate) brings counts it took at
/// one history sequence up to a later one without reading anything. These tests compare what
/// `recentCounts` answers with what the store holds, and check that it answers "unknown"
/// wherever its commits do not cover the span: a wrong "known" would be a wrong decision.
@Suite struct RecentCountsTests {
    /// The counts a reader keeps: the items in all, and the size of every home that holds any.
    struct Counted: Equatable, CustomStringConvertible {
        var total: Int
        var sizes: [RecordID: Int]
        var description: String { "total \(total), \(sizes.count) groups \(sizes.values.sorted())" }
    }

    static func counted(_ store: Store) throws -> Counted {
        try store.read { snapshot in
            let groups = try snapshot.groups(store.index(\Item.homeID), largerThan: 0)
            return Counted(total: try snapshot.count(Item.self), sizes: Dictionary(uniqueKeysWithValues: groups.map { ($0.value, $0.count) }))
        }
    }

    /// `counted` (taken at `from`) brought to `to` from the kept counts; nil for "unknown".
    static func broughtUpToDate(_ counted: Counted, _ store: Store, _ key: RecentCountsKey,
                                        from: HistoryToken, to: HistoryToken) -> Counted? {
        var result = counted
        let known = store.recentCounts(key, from: from, to: to, total: &result.total) { home, size in
            result.sizes[home] = size == 0 ? nil : size
        }
        return known ? result : nil
    }

    private func item(_ home: RecordID, _ name: String = "item") -> Item {
        Item(homeID: home, name: name, category: "c", wearCount: 0, price: 1)
    }

    /// Random transactions (inserts, moves, deletes, other updates, homes; some thrown midway
    /// and rolled back): after each, the counts of every earlier state, brought up to date,
    /// are the store's counts.
    @Test(arguments: [UInt64(11), 12, 13])
    func countsOfEveryEarlierStateAreBroughtUpToDate(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let key = store.keepRecentCounts(of: try store.typeHandle(Item.self), groupedBy: try store.index(\Item.homeID))
        var rng = SeededGenerator(seed: seed)
        var oracle = CRUDPropertyTests.Oracle()
        var states: [(token: HistoryToken, counts: Counted)] = [(try store.currentToken(), try Self.counted(store))]
        for batch in 0..<30 {
            let context = "seed \(seed), batch \(batch)"
            var next = oracle
            let rolledBack = Int.random(in: 0..<6, using: &rng) == 0
            do {
                try store.write { tx in
                    for _ in 0..<Int.random(in: 1...6, using: &rng) { try CRUDPropertyTests.step(tx, &next, &rng, context) }
                    if rolledBack { throw Rollback() }
                }
                oracle = next
            } catch is Rollback {}
            let now = try store.currentToken()
            let truth = try Self.counted(store)
            #expect(truth.total == oracle.items.count, "\(context)")
            // Every state kept so far: the commits since are all this store's, and fewer than it keeps.
            for state in states {
                let brought = Self.broughtUpToDate(state.counts, store, key, from: state.token, to: now)
                #expect(brought == truth, "\(context): from \(state.token) to \(now)")
            }
            if states.last?.token != now { states.append((now, truth)) }
        }
        #expect(states.count > 10, "seed \(seed): many batches commit")
    }

    /// A commit made through another `Store` on the directory (as another process makes
    /// them) is not in this store's memory: a span across it is unknown, and a span after it
    /// known again.
    @Test func aCommitOfAnotherStoreIsAGap() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let key = store.keepRecentCounts(of: try store.typeHandle(Item.self), groupedBy: try store.index(\Item.homeID))
        let home = RecordID()
        try store.insert(item(home))
        let before = try store.currentToken(), countedBefore = try Self.counted(store)
        try Store.open(at: dir.path, types: [Home.self, Item.self]).insert(item(home, "from elsewhere"))
        let between = try store.currentToken(), countedBetween = try Self.counted(store)
        try store.insert(item(home, "again"))
        let after = try store.currentToken()
        #expect(Self.broughtUpToDate(countedBefore, store, key, from: before, to: after) == nil)
        #expect(Self.broughtUpToDate(countedBefore, store, key, from: before, to: between) == nil)
        #expect(Self.broughtUpToDate(countedBetween, store, key, from: between, to: after) == Counted(total: 3, sizes: [home: 3]))
        #expect(try Self.counted(store) == Counted(total: 3, sizes: [home: 3]))
    }

    /// A reader further behind than the commits the store keeps reads the store instead.
    @Test func aSpanLongerThanWhatIsKeptIsUnknown() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let key = store.keepRecentCounts(of: try store.typeHandle(Item.self), groupedBy: try store.index(\Item.homeID))
        let home = RecordID()
        let start = try store.currentToken()
        try store.insert(item(home))
        let second = try store.currentToken()
        for n in 0..<32 { try store.insert(item(home, "\(n)")) }
        let end = try store.currentToken()
        #expect(Self.broughtUpToDate(Counted(total: 0, sizes: [:]), store, key, from: start, to: end) == nil)
        #expect(Self.broughtUpToDate(Counted(total: 1, sizes: [home: 1]), store, key, from: second, to: end) == Counted(total: 33, sizes: [home: 33]))
    }

    /// Commits made before anyone asked are not kept; a write of more groups than one commit
    /// lists leaves the groups unknown, while the total stays known.
    @Test func commitsBeforeAskingAndWritesOfManyGroupsAreUnknown() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let start = try store.currentToken(), countedAtStart = try Self.counted(store)
        try store.insert(item(RecordID()))
        let type = try store.typeHandle(Item.self), index = try store.index(\Item.homeID)
        let key = store.keepRecentCounts(of: type, groupedBy: index)
        let totalOnly = store.keepRecentCounts(of: type, groupedBy: nil)
        let asked = try store.currentToken(), countedWhenAsked = try Self.counted(store)
        #expect(Self.broughtUpToDate(countedAtStart, store, key, from: start, to: asked) == nil)
        #expect(Self.broughtUpToDate(countedAtStart, store, totalOnly, from: start, to: asked) == nil)

        // 65 homes of one item each, in one write: more groups than a commit lists.
        try store.write { tx in for _ in 0..<65 { try tx.insert(item(RecordID())) } }
        let bulk = try store.currentToken()
        #expect(Self.broughtUpToDate(countedWhenAsked, store, key, from: asked, to: bulk) == nil)
        var total = countedWhenAsked.total
        let known = store.recentCounts(totalOnly, from: asked, to: bulk, total: &total) { _, _ in Issue.record("no index asked for") }
        #expect(known && total == 66)
        // 64 groups (and any number of records in them) are listed.
        let homes = (0..<64).map { _ in RecordID() }
        try store.write { tx in for home in homes { for n in 0..<3 { try tx.insert(item(home, "\(n)")) } } }
        let listed = try store.currentToken()
        let truth = try Self.counted(store)
        var countedAfterBulk = truth
        for home in homes { countedAfterBulk.sizes[home] = nil }
        countedAfterBulk.total -= 64 * 3
        #expect(Self.broughtUpToDate(countedAfterBulk, store, key, from: bulk, to: listed) == truth)
    }

    /// Writers committing together (group commit) each leave the counts after their own
    /// changes, in whatever order their threads hand them over: the span of all of them is
    /// known and right.
    @Test func writersOfOneGroupCommitAreKeptInOrder() throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.durability = .full   // commits wait for the disk: writers queue behind them and commit in groups
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self], options: options)
        let key = store.keepRecentCounts(of: try store.typeHandle(Item.self), groupedBy: try store.index(\Item.homeID))
        let homes = (0..<3).map { _ in RecordID() }
        let start = try store.currentToken(), countedAtStart = try Self.counted(store)
        let failures = Mutex(0)
        // 4 × 7 commits: fewer than the store keeps.
        DispatchQueue.concurrentPerform(iterations: 4) { writer in
            for n in 0..<7 {
                do {
                    if n % 7 == 3 {
                        // A writer that throws: its changes, and its counts, are dropped.
                        do {
                            try store.write { tx in
                                try tx.insert(item(homes[writer % 3], "dropped"))
                                throw Rollback()
                            } as Void
                        } catch is Rollback {}
                    }
                    try store.insert(item(homes[(writer + n) % 3], "w\(writer).\(n)"))
                } catch {
                    failures.withLock { $0 += 1 }
                }
            }
        }
        #expect(failures.withLock { $0 } == 0)
        let end = try store.currentToken()
        #expect(end.sequence - start.sequence == 28)
        let truth = try Self.counted(store)
        #expect(truth.total == 28)
        #expect(Self.broughtUpToDate(countedAtStart, store, key, from: start, to: end) == truth)
    }
}
