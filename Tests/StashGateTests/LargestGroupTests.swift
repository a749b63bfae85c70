import Foundation
import Stash
import StashGate
import Testing

/// The downgrade-safe rule of a per-parent limit looks at the largest group. The gate walks the
/// parent index once per committed state and reuses the result (and the totals) in later read
/// snapshots; these tests change the store between checks, some without changing any total,
/// so a count reused past a commit would give a wrong decision.
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
        #expect(f.gate.check(.create(Item.self, in: homes[0])).denial == .overLimit)
        try f.store.delete(Item.self, id: try #require(try f.store.fetch(FetchDescriptor<Item>()).first).id)
        #expect(f.gate.check(.create(Item.self, in: homes[1])).denial == .overLimit)   // still 4 homes
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
}
