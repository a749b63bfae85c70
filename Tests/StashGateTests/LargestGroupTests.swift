import Foundation
import Stash
import StashLMDB
@testable import StashGate
import StashTestSupport
import Testing

/// The downgrade-safe rule of a per-parent limit asks whether any group is over the limit. The
/// gate walks the parent index once, reuses the answer (and the totals) in later read
/// snapshots of the same state, and brings it up to date from history after commits; these
/// tests change the store between checks, some without changing any total, so a count reused
/// past a commit, or an update from history that missed a change, would give a wrong decision.
@Suite struct LargestGroupTests {
    /// Two homes of 10 items each (20 > 10 in all, no home over 10); free limits of 3 homes
    /// and 10 items per home.
    private func fixture() throws -> (Fixture, homes: [RecordID], items: [Item]) {
        let f = try Fixture { $0.limits = [.maxRecords(Home.self, 3), .maxRecords(Item.self, 10, per: \.homeID)] }
        let homes = [try f.addHome("a"), try f.addHome("b")]
        let items = (0..<20).map { Item(homeID: homes[$0 % 2], name: "item \($0)") }
        try f.store.write { tx in for item in items { try tx.insert(item) } }
        return (f, homes, items)
    }

    /// Another process (an older version of the app) opens the store with an `Item` that
    /// declares no index on `homeID`, and fills a home past its limit. Before, that open
    /// removed the parent index the gate counts through: the gate then saw every home empty
    /// and allowed what the limit forbids.
    @Test func anOpenWithoutTheParentIndexKeepsTheLimitsCounted() throws {
        let (f, homes, _) = try fixture()
        #expect(f.gate.check(.create(Item.self, in: homes[0])).denial == .itemLimitReached)
        let older = try Store.open(at: f.store.path, types: [Home.self, UnindexedItem.self])
        #expect(f.gate.check(.create(Item.self, in: homes[0])).denial == .itemLimitReached)
        try older.insert(UnindexedItem(homeID: homes[1], name: "from the older app"))
        // Home b holds 11: a new item there hits its own limit, past it; one elsewhere, the
        // downgrade-safe rule (home b is over).
        let inB = f.gate.check(.create(Item.self, in: homes[1]))
        #expect(inB.denial == .itemLimitReached && inB.limit?.count == 11 && inB.limit?.parent == homes[1], "\(inB)")
        #expect(f.gate.check(.create(Item.self, in: RecordID())).denial == .overLimit)
        #expect(try f.store.count(f.store.index(\Item.homeID), equals: homes[1]) == 11)
        try older.delete(UnindexedItem.self, id: try older.fetch(FetchDescriptor<UnindexedItem>()).first { $0.name == "from the older app" }!.id)
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        #expect(f.gate.check(.create(Item.self, in: homes[1])).denial == .itemLimitReached)
        #expect(f.gate.check(.create(Item.self, in: RecordID())).isAllowed)
    }

    @Test func aCommitThatGrowsOneGroupIsSeenByTheNextCheck() throws {
        let (f, homes, items) = try fixture()
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        #expect(f.gate.check(.create(Item.self, in: homes[0])).denial == .itemLimitReached)
        #expect(f.gate.check(.create(Home.self)).isAllowed)   // the same state again
        // Same total, but home a now holds 11 items.
        try f.store.update(Item.self, id: items[1].id) { $0.homeID = homes[0] }
        #expect(try f.store.count(Item.self) == 20)
        #expect(f.gate.check(.create(Home.self)).denial == .overLimit)
        #expect(f.gate.check(.create(Item.self, in: homes[1])).denial == .overLimit)
        // Moved back: within the limits again.
        try f.store.update(Item.self, id: items[1].id) { $0.homeID = homes[1] }
        #expect(f.gate.check(.create(Home.self)).isAllowed)
    }

    @Test func aCommitThatChangesATotalIsSeenByTheNextCheck() throws {
        let (f, homes, _) = try fixture()
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        #expect(f.gate.check(.create(Home.self)).isAllowed)   // counted once, then reused
        _ = try f.addHome("c")
        #expect(f.gate.check(.create(Home.self)).denial == .homeLimitReached)
        #expect(f.gate.check(.create(Item.self, in: homes[0])).denial == .itemLimitReached)
        _ = try f.addHome("d")
        #expect(f.gate.check(.create(Item.self, in: homes[0])).denial == .itemLimitReached)   // home a is full
        #expect(f.gate.check(.create(Item.self, in: RecordID())).denial == .overLimit)        // 4 homes of 3
        #expect(f.gate.check(.create(Home.self)).denial == .homeLimitReached)
        try f.store.delete(Item.self, id: try #require(try f.store.fetch(FetchDescriptor<Item>()).first).id)
        #expect(f.gate.check(.create(Item.self, in: homes[0])).denial == .overLimit)   // room in home a, still 4 homes
    }

    @Test func aWriteTransactionSeesItsOwnPendingMoves() throws {
        let (f, homes, items) = try fixture()
        #expect(f.gate.check(.create(Home.self)).isAllowed)   // walked and kept for this state
        try f.store.write { tx in
            #expect(f.gate.check(.create(Home.self), in: tx).isAllowed)
            try tx.update(Item.self, id: items[1].id) { $0.homeID = homes[0] }
            #expect(f.gate.check(.create(Home.self), in: tx).denial == .overLimit)
            #expect(throws: GateError.self) { try f.gate.authorize(.create(Home.self), in: tx) }
        }
    }

    @Test func commitsAreFollowedFromHistoryWithoutWalkingEveryHome() throws {
        let (f, homes, items) = try fixture()
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        #expect(f.gate.parentWalks.load(ordering: .relaxed) == 1)
        for round in 0..<6 {
            try f.store.update(Item.self, id: items[1].id) { $0.homeID = homes[round % 2] }
            #expect(f.gate.check(.create(Home.self)).denial == (round % 2 == 0 ? .overLimit : nil))
            do {
                try f.store.write { tx in
                    try tx.update(Item.self, id: items[3].id) { $0.homeID = homes[0] }
                    #expect(f.gate.check(.create(Home.self), in: tx).denial == .overLimit)
                    throw CancellationError()   // rolled back
                } as Void
            } catch is CancellationError {}
        }
        #expect(f.gate.parentWalks.load(ordering: .relaxed) == 1)
        // Many changes in one commit of the gate's own store, none of them to a group: the
        // store kept the groups it changed (none), so nothing is read or walked.
        let renameAll = { (store: Store) in
            try store.write { tx in
                for _ in 0..<4 { for item in items { try tx.update(Item.self, id: item.id) { $0.name += "'" } } }
            }
        }
        try renameAll(f.store)
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        #expect(f.gate.parentWalks.load(ordering: .relaxed) == 1)
        // The same commit by another process (here another Store on the directory) is read
        // from history: more changes than are worth following one by one, one walk again.
        try renameAll(try Store.open(at: f.store.path, types: [Home.self, Item.self]))
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        #expect(f.gate.parentWalks.load(ordering: .relaxed) == 2)
    }

    /// After the app's own commits the gate brings its counts up to date from what its store
    /// kept of them (the totals and the groups each commit changed), reading neither history
    /// nor records; a commit of another process in between sends it back to history, with the
    /// same decisions, and the next own commit is followed from memory again.
    @Test func ownCommitsAreFollowedFromTheCountsTheStoreKept() throws {
        let (f, homes, items) = try fixture()
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        // Counted at this state, every rule (the first check kept only the per-parent one,
        // the first to need the history sequence).
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        let other = try Store.open(at: f.store.path, types: [Home.self, Item.self])
        for round in 0..<8 {
            let writer = round % 4 == 3 ? other : f.store
            let before = f.gate.countsFromCommits.load(ordering: .relaxed)
            // Even rounds: home a holds 11 items (over), odd ones: 10 each (full, not over).
            try writer.update(Item.self, id: items[1].id) { $0.homeID = homes[round % 2] }
            #expect(f.gate.check(.create(Home.self)).denial == (round % 2 == 0 ? .overLimit : nil))
            let inA = f.gate.check(.create(Item.self, in: homes[0]))
            #expect(inA.denial == .itemLimitReached && inA.limit?.count == (round % 2 == 0 ? 11 : 10), "round \(round): \(inA)")
            let followed = f.gate.countsFromCommits.load(ordering: .relaxed) - before
            #expect(followed == (writer === other ? 0 : 2), "round \(round): both rules from the kept counts after an own commit only")
        }
        // A total: the third home reaches the limit of 3, and leaves again.
        let before = f.gate.countsFromCommits.load(ordering: .relaxed)
        let third = try f.addHome("c")
        #expect(f.gate.check(.create(Home.self)).denial == .homeLimitReached)
        try f.store.delete(Home.self, id: third)
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        #expect(f.gate.countsFromCommits.load(ordering: .relaxed) - before == 4)
        #expect(f.gate.parentWalks.load(ordering: .relaxed) == 1)
    }

    /// An app that checks only inside its writes (``FeatureGate/authorize(_:in:)``) walks the
    /// parents once: each write starts from the committed state, counted in a snapshot from
    /// the parents kept for the state before.
    @Test func writesThatOnlyAuthorizeWalkOnce() throws {
        let (f, homes, items) = try fixture()
        for round in 0..<8 {
            let target = homes[round % 2]
            // Move one item into `target` (11 there: over the limit): the gate, counting inside
            // the write, denies any creation from then on.
            let denial: DenialReason? = try f.store.write { tx in
                #expect(try f.gate.authorize(.create(Home.self), in: tx).isAllowed, "round \(round)")
                try tx.update(Item.self, id: items[round % 2 == 0 ? 1 : 0].id) { $0.homeID = target }
                return f.gate.check(.create(Home.self), in: tx).denial
            }
            #expect(denial == .overLimit, "round \(round)")
            // And back, committed: within the limits again.
            try f.store.write { tx in
                #expect(f.gate.check(.create(Home.self), in: tx).denial == .overLimit, "round \(round)")
                try tx.update(Item.self, id: items[round % 2 == 0 ? 1 : 0].id) { $0.homeID = homes[(round + 1) % 2] }
                #expect(try f.gate.authorize(.create(Home.self), in: tx).isAllowed, "round \(round)")
            }
        }
        #expect(f.gate.parentWalks.load(ordering: .relaxed) == 1)
    }

    /// A bulk write that authorizes each of its inserts: each check follows the changes since
    /// the previous check of the same write, so the parents are walked once (for the committed
    /// state), not at every insert once the write holds many changes. Moves inside the write
    /// are still seen.
    @Test func aBulkWriteThatAuthorizesEachInsertWalksOnce() throws {
        let (f, homes, items) = try fixture()
        let parents = (0..<150).map { _ in RecordID() }
        do {
            try f.store.write { tx in
                for n in 0..<300 {
                    let parent = parents[n % parents.count]
                    #expect(try f.gate.authorize(.create(Item.self, in: parent), in: tx).isAllowed, "insert \(n)")
                    try tx.insert(Item(homeID: parent, name: "bulk \(n)"))
                }
                try tx.update(Item.self, id: items[1].id) { $0.homeID = homes[0] }   // 11 in home a
                #expect(f.gate.check(.create(Item.self, in: parents[0]), in: tx).denial == .overLimit)
                try tx.update(Item.self, id: items[1].id) { $0.homeID = homes[1] }
                #expect(try f.gate.authorize(.create(Item.self, in: parents[0]), in: tx).isAllowed)
                for n in 0..<8 { try tx.insert(Item(homeID: parents[1], name: "more \(n)")) }   // 10 there
                #expect(f.gate.check(.create(Item.self, in: parents[1]), in: tx).denial == .itemLimitReached)
                try tx.insert(Item(homeID: parents[1], name: "one too many"))
                #expect(f.gate.check(.create(Home.self), in: tx).denial == .overLimit)
                throw CancellationError()
            } as Void
        } catch is CancellationError {}   // rolled back
        #expect(f.gate.parentWalks.load(ordering: .relaxed) == 1)
        #expect(f.gate.check(.create(Home.self)).isAllowed)
    }

    @Test func aSnapshotOpenedBeforeACommitKeepsItsOwnAnswer() throws {
        let (f, homes, items) = try fixture()
        try f.store.read { before in
            // Another writer grows home a while this snapshot is open.
            try f.store.update(Item.self, id: items[1].id) { $0.homeID = homes[0] }
            #expect(f.gate.check(.create(Home.self)).denial == .overLimit)
            #expect(f.gate.check(.create(Home.self), in: before).isAllowed)
            #expect(f.gate.check(.create(Home.self)).denial == .overLimit)
        }
    }

    /// Random inserts, moves, renames and deletes (one to three per commit, some rolled back)
    /// over six parents with a limit of 3 per parent: after every commit, and inside write
    /// transactions before they commit, each decision equals the one counted from scratch.
    @Test func decisionsFollowRandomChangesExactly() throws {
        let seed: UInt64 = 0x6A7E_C0DE
        var rng = SeededGenerator(seed: seed)
        let f = try Fixture { $0.limits = [.maxRecords(Home.self, 3), .maxRecords(Item.self, 3, per: \.homeID)] }
        _ = try f.addHome("a")
        _ = try f.addHome("b")
        let parents = (0..<6).map { _ in RecordID() }
        var items: [Item] = []   // what the store holds, as the test expects it

        func expected(_ action: GateAction, _ items: [Item]) -> DenialReason? {
            let sizes = Dictionary(grouping: items, by: \.homeID).mapValues(\.count)
            // The parent the item goes into first (full, or past its limit), then any other.
            if let parent = action.parent, sizes[parent, default: 0] >= 3 { return .itemLimitReached }
            if sizes.values.contains(where: { $0 > 3 }) { return .overLimit }
            return nil   // 2 homes of 3
        }
        func verify(_ items: [Item], _ step: Int, in tx: StoreTransaction? = nil) {
            for action in [GateAction.create(Home.self)] + parents.map({ .create(Item.self, in: $0) }) {
                let decision = tx.map { f.gate.check(action, in: $0) } ?? f.gate.check(action)
                #expect(decision.denial == expected(action, items),
                        "seed \(seed), step \(step): \(action) gave \(decision.denial.map { "\($0)" } ?? "allowed")")
            }
        }

        for step in 0..<200 {
            var next = items
            let rollBack = Int.random(in: 0..<8, using: &rng) == 0
            do {
                try f.store.write { tx in
                    for _ in 0..<Int.random(in: 1...3, using: &rng) {
                        let pick = next.isEmpty ? 0 : Int.random(in: 0..<next.count, using: &rng)
                        switch Int.random(in: 0..<10, using: &rng) {
                        case 0..<4 where next.count < 24 || next.isEmpty:
                            let item = Item(homeID: parents.randomElement(using: &rng)!, name: "item \(step)")
                            try tx.insert(item)
                            next.append(item)
                        case 4..<7 where !next.isEmpty:
                            next[pick].homeID = parents.randomElement(using: &rng)!
                            let moved = next[pick].homeID
                            _ = try tx.update(Item.self, id: next[pick].id) { $0.homeID = moved }
                        case 7 where !next.isEmpty:
                            next[pick].name += "'"
                            try tx.update(next[pick])
                        default:
                            if !next.isEmpty {
                                #expect(try tx.delete(Item.self, id: next[pick].id))
                                next.remove(at: pick)
                            }
                        }
                    }
                    verify(next, step, in: tx)
                    if rollBack { throw CancellationError() }
                }
            } catch is CancellationError {
                next = items
            }
            items = next
            verify(items, step)
            if Int.random(in: 0..<4, using: &rng) == 0 { verify(items, step) }   // the same state again, from the cache
        }
        #expect(try f.store.count(Item.self) == items.count)
    }

    /// The counts the gate keeps are its own store's, by history sequence: a check in a
    /// snapshot of another store at the same sequence is counted afresh, and neither takes
    /// this store's counts nor leaves its own behind for them.
    @Test func aSnapshotOfAnotherStoreNeitherUsesNorPoisonsTheCounts() throws {
        let f = try Fixture { $0.limits = [.maxRecords(Home.self, 3), .maxRecords(Item.self, 10, per: \.homeID)] }
        let other = try Store.open(at: f.dir.sub("other"), types: [Home.self, Item.self] + FeatureGate.recordTypes)
        func fill(_ store: Store, split: Int) throws {
            let homes = [Home(name: "1"), Home(name: "2")]
            try store.write { tx in for home in homes { try tx.insert(home) } }
            try store.write { tx in for n in 0..<20 { try tx.insert(Item(homeID: homes[n < split ? 0 : 1].id, name: "\(n)")) } }
        }
        try fill(f.store, split: 10)   // 10 + 10: within the limits
        try fill(other, split: 11)     // 11 + 9: one home over
        try #require(try f.store.currentToken() == other.currentToken())
        #expect(try other.read { f.gate.check(.create(Home.self), in: $0) }.denial == .overLimit)
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        #expect(try other.read { f.gate.check(.create(Home.self), in: $0) }.denial == .overLimit)
        try other.write { tx in #expect(f.gate.check(.create(Home.self), in: tx).denial == .overLimit) }
        #expect(f.gate.check(.create(Home.self)).isAllowed)
    }

    /// A reading of another store whose types were declared in another order (or whose schema
    /// grew in another order over app versions): the gate counted it through the type and
    /// index tags of its own store, which name other types there. The other store's items
    /// were counted as its homes, so a home limit let a second home through; its per-parent
    /// counts looked into another type's index. Such a reading is counted with its own
    /// store's types and indexes now, as the doc of `check(_:in:)` promises.
    @Test func aReadingOfAnotherStoreIsCountedWithThatStoresTypes() throws {
        let f = try Fixture()   // 1 home, 10 items per home
        let other = try Store.open(at: f.dir.sub("other"), types: [Item.self, Home.self] + FeatureGate.recordTypes)
        let home = Home(name: "elsewhere")
        try other.insert(home)
        #expect(try other.read { f.gate.check(.create(Home.self), in: $0) }.denial == .homeLimitReached)
        _ = try other.write { tx in #expect(throws: GateError.self) { try f.gate.authorize(.create(Home.self), in: tx) } }
        #expect(try other.read { f.gate.check(.create(Item.self, in: home.id), in: $0) }.isAllowed)
        try other.write { tx in for n in 0..<10 { try tx.insert(Item(homeID: home.id, name: "\(n)")) } }
        #expect(try other.read { f.gate.check(.create(Item.self, in: home.id), in: $0) }.denial == .itemLimitReached)
        try other.insert(Item(homeID: home.id, name: "eleventh"))
        #expect(try other.read { f.gate.check(.create(Item.self, in: RecordID()), in: $0) }.denial == .overLimit)
        // Limits by name go by name: the same answers.
        let named = try FeatureGate.open(f.store, configuration: {
            var config = f.configuration
            config.limits = [.maxRecords(typeNamed: "Home", 1), .maxRecords(typeNamed: "Item", 10, perField: "homeID")]
            return config
        }())
        #expect(try other.read { named.check(.create(Item.self, in: RecordID()), in: $0) }.denial == .overLimit)
        // The gate's own store, empty, is counted as its own.
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        #expect(f.gate.check(.create(Item.self, in: home.id)).isAllowed)
    }

    /// The committed parents a write starts from are read in a snapshot of their own; with no
    /// reader slot free for it, the write counts its parents the long way, and is not denied.
    @Test func aWriteWithNoReaderSlotLeftStillDecides() throws {
        let (f, _, _) = try fixture()
        #expect(f.gate.check(.create(Home.self)).isAllowed)   // counted and kept
        try f.store.insert(Item(homeID: RecordID(), name: "elsewhere"))
        var exhausted = false
        var decided: GateDecision?
        func nest(_ depth: Int) throws {
            do {
                try f.store.read { _ in try nest(depth + 1) }
            } catch let error as StoreError where error.message.contains("readers") {
                exhausted = true
                decided = try f.store.write { tx in try f.gate.authorize(.create(Home.self), in: tx) }
            }
        }
        try nest(0)
        try #require(exhausted)
        #expect(decided?.isAllowed == true)
    }

    /// A changed record the gate cannot read (damaged, or from a newer format) sends it to
    /// the walk of the parent index, which does not read records: not to a denial.
    @Test func anUnreadableChangedRecordMeansWalkingNotDenying() throws {
        let (f, _, _) = try fixture()
        #expect(f.gate.check(.create(Home.self)).isAllowed)   // counted and kept
        let stray = Item(homeID: RecordID(), name: "stray")
        // Inserted by another process (another Store on the directory): the gate's store kept
        // no counts of that commit, so the gate reads the record history names.
        try Store.open(at: f.store.path, types: [Home.self, Item.self]).insert(stray)
        try damageRecord(stray.id, inStoreAt: f.dir.sub("store"))
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        #expect(f.gate.parentWalks.load(ordering: .relaxed) == 2)
    }

    /// A limit by name walked every record of its type to find the parents over it, so one
    /// record that cannot be read (damaged, or written in a newer format) denied every
    /// creation with `checkFailed` once the type held more records than the limit, although
    /// the parent field was indexed. It walks the parent index now, as a typed limit does.
    @Test func aLimitByNameWalksTheParentIndexNotTheRecords() throws {
        let f = try Fixture { $0.limits = [.maxRecords(typeNamed: "Home", 3), .maxRecords(typeNamed: "Item", 10, perField: "homeID")] }
        let homes = [try f.addHome("a"), try f.addHome("b")]
        let items = (0..<20).map { Item(homeID: homes[$0 % 2], name: "item \($0)") }
        try f.store.write { tx in for item in items { try tx.insert(item) } }
        try damageRecord(items[0].id, inStoreAt: f.dir.sub("store"))
        #expect(f.gate.check(.create(Home.self)).isAllowed)
        #expect(f.gate.check(.create(typeNamed: "Item", in: homes[0])).denial == .itemLimitReached)
        #expect(f.gate.check(.create(typeNamed: "Item", in: RecordID())).isAllowed)
        #expect(try f.store.write { tx in try f.gate.authorize(.create(Home.self), in: tx) }.isAllowed)
        try f.store.insert(Item(homeID: homes[1], name: "eleventh"))
        #expect(f.gate.check(.create(Home.self)).denial == .overLimit)
        _ = try f.store.write { tx in
            #expect { try f.gate.authorize(.create(Home.self), in: tx) } throws: { ($0 as? GateError)?.decision?.denial == .overLimit }
        }
    }

    /// Counting that failed (a record that cannot be decoded, a storage error) was a plain
    /// `checkFailed` denial with the error dropped: `authorize` threw `.denied`, so the app
    /// showed its paywall for a storage fault, and nothing named the record or the cause.
    /// `authorize` throws `.storage` with the cause now, and a check's decision carries it.
    @Test func aCountThatFailsKeepsItsCause() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.sub("store"), types: [Home.self, UnindexedItem.self] + FeatureGate.recordTypes)
        let home = RecordID()
        let items = (0..<3).map { UnindexedItem(homeID: home, name: "item \($0)") }
        try store.write { tx in for item in items { try tx.insert(item) } }
        var config = GateConfiguration(userID: "u1", verifier: verifier)
        config.limits = [.maxRecords(typeNamed: "Item", 2, perField: "homeID")]   // no index: walks the records
        try damageRecord(items[1].id, inStoreAt: dir.sub("store"))
        let gate = try FeatureGate.open(store, configuration: config)
        let decision = gate.check(.create(Home.self))
        #expect(decision.denial == .checkFailed)
        #expect("\(decision)".contains("\(items[1].id)") && "\(decision)".contains(store.path), "\(decision)")
        let error = #expect(throws: GateError.self) {
            try store.write { tx in
                try gate.authorize(.create(Home.self), in: tx)
                try tx.insert(Home(name: "not for a storage fault"))
            }
        }
        #expect(error?.code == .storage)
        #expect(error?.decision == nil)
        #expect((error?.underlying as? StoreError)?.code == .corrupted, "\(String(describing: error?.underlying))")
        #expect(error?.message.contains("creating Home") == true && error?.message.contains("\(items[1].id)") == true, "\(error?.message ?? "")")
        #expect(try store.count(Home.self) == 0)
    }
}

/// `Item` as an older version of the app declares it: without the index on `homeID`.
private struct UnindexedItem: Record, Equatable {
    static let recordType = "Item"
    var id = RecordID()
    var homeID: RecordID
    var name: String
}
