import Foundation
import Stash
import StashGate
import StashTestSupport
import Testing

/// Every limit has a name; a denial says which limit was hit, its maximum and the count; a
/// per-parent limit given its parent's type refuses a parent that does not exist.
@Suite struct NamedLimitTests {
    /// The Cubby story's limits, the per-home one knowing that its parent is a home.
    static func cubby(_ config: inout GateConfiguration) {
        config.limits = [.maxRecords(Home.self, 1).named("homes"), .maxRecords(Item.self, 3, per: \.homeID, of: Home.self)]
    }

    @Test func aDenialNamesTheLimitItsMaximumAndTheCount() throws {
        let f = try Fixture(configure: Self.cubby)
        #expect(f.gate.configuration.limits.map(\.name) == ["homes", "Item per Home"])
        let home = try f.addHome()
        let homes = f.gate.check(.create(Home.self))
        #expect(homes.denial == .homeLimitReached)
        #expect(homes.limit == LimitUsage(name: "homes", maximum: 1, count: 1, parent: nil))
        #expect(homes.description.hasPrefix("denied: homeLimitReached (homes: 1 of 1)"), "\(homes)")
        for n in 0..<3 { #expect(f.create(Item(homeID: home, name: "\(n)")) == nil) }
        let items = f.gate.check(.create(Item.self, in: home))
        #expect(items.denial == .itemLimitReached)
        #expect(items.limit == LimitUsage(name: "Item per Home", maximum: 3, count: 3, parent: home))
        // authorize says the same in its error.
        let error = #expect(throws: GateError.self) {
            try f.store.write { tx in try f.gate.authorize(.create(Item.self, in: home), in: tx) }
        }
        #expect(error?.decision?.limit?.count == 3)
        #expect(error?.message.contains("Item per Home: 3 of 3 in \(home)") == true, "\(error?.message ?? "")")
        // Allowed decisions name no limit.
        #expect(f.gate.check(.use("quickTimer")).limit == nil)
        try f.store.delete(Item.self, id: try #require(try f.store.fetch(FetchDescriptor<Item>()).first).id)
        #expect(f.gate.check(.create(Item.self, in: home)).limit == nil)
    }

    /// The paywall cases of the Cubby story after a downgrade: a home holding more items than
    /// the free limit denies new items in it with the item limit (it said the generic
    /// overLimit); a new home, with the home limit; an item in a home with room, with
    /// overLimit naming the limit that is passed.
    @Test func afterADowngradeEachCreationNamesTheLimitItHits() throws {
        let f = try Fixture(configure: Self.cubby)
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)]))
        let full = try f.addHome("full"), roomy = try f.addHome("roomy")
        for n in 0..<5 { #expect(f.create(Item(homeID: full, name: "\(n)")) == nil) }
        #expect(f.create(Item(homeID: roomy, name: "one")) == nil)
        f.clock.set(instant(30 * day))   // the subscription lapses: free, over both limits
        #expect(f.gate.tier == .free)
        let inFull = f.gate.check(.create(Item.self, in: full))
        #expect(inFull.denial == .itemLimitReached && inFull.limit == LimitUsage(name: "Item per Home", maximum: 3, count: 5, parent: full), "\(inFull)")
        let home = f.gate.check(.create(Home.self))
        #expect(home.denial == .homeLimitReached && home.limit == LimitUsage(name: "homes", maximum: 1, count: 2, parent: nil), "\(home)")
        let inRoomy = f.gate.check(.create(Item.self, in: roomy))
        #expect(inRoomy.denial == .overLimit && inRoomy.limit?.name == "homes" && inRoomy.limit?.count == 2, "\(inRoomy)")
        // Down to one home (the full one): the home limit is reached, the item limit passed.
        try f.store.delete(Home.self, id: roomy)
        let second = f.gate.check(.create(Home.self))
        #expect(second.denial == .overLimit && second.limit == LimitUsage(name: "Item per Home", maximum: 3, count: 5, parent: full), "\(second)")
        #expect(f.create(Item(homeID: full, name: "six")) == .itemLimitReached)
        // View and edit stay allowed, nothing was deleted.
        #expect(f.gate.check(.view).isAllowed && f.gate.check(.edit).isAllowed)
        #expect(try f.store.count(Item.self, where: \.homeID, equals: full) == 5)
    }

    /// homeLimitReached is the home limit's: a limit in all on another type (tags) reports
    /// `limitReached` with its name, and passing it denies creations elsewhere as overLimit.
    @Test func homeLimitReachedOnlyForTheHomeLimit() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.sub("store"), types: [Home.self, Item.self, Tag.self] + FeatureGate.recordTypes)
        var config = GateConfiguration(userID: "u1", verifier: verifier)
        Self.cubby(&config)
        config.limits.append(.maxRecords(Tag.self, 2))
        let gate = try FeatureGate.open(store, configuration: config)
        for n in 0..<2 { try store.insert(Tag(name: "\(n)")) }
        let tag = gate.check(.create(Tag.self))
        #expect(tag.denial == .limitReached("Tag") && tag.limit == LimitUsage(name: "Tag", maximum: 2, count: 2, parent: nil), "\(tag)")
        #expect(gate.check(.create(Home.self)).isAllowed)
        try store.insert(Home(name: "h"))
        #expect(gate.check(.create(Home.self)).denial == .homeLimitReached)
        try store.insert(Tag(name: "past the limit"))
        let item = gate.check(.create(Item.self, in: try #require(try store.fetch(FetchDescriptor<Home>()).first?.id)))
        #expect(item.denial == .overLimit && item.limit?.name == "Tag" && item.limit?.count == 3, "\(item)")
    }

    /// A creation into a parent that does not exist (deleted on another device, a stale id):
    /// it was allowed, an empty group; refused now for a limit that knows its parent's type.
    @Test func aCreationInAParentThatDoesNotExistIsRefused() throws {
        for limits in [[LimitRule.maxRecords(Item.self, 3, per: \.homeID, of: Home.self)],
                       [.maxRecords(typeNamed: "Item", 3, perField: "homeID", parentType: "Home")]] {
            let f = try Fixture { $0.limits = limits }
            #expect(f.gate.configuration.limits[0].parentTypeName == "Home")
            let gone = RecordID()
            let decision = f.gate.check(.create(Item.self, in: gone))
            #expect(decision.denial == .checkFailed, "\(decision)")
            #expect(decision.error?.contains("has no Home \(gone)") == true, "\(String(describing: decision.error))")
            let error = #expect(throws: GateError.self) {
                try f.store.write { tx in
                    try f.gate.authorize(.create(Item.self, in: gone), in: tx)
                    try tx.insert(Item(homeID: gone, name: "orphan"))
                }
            }
            #expect(error?.code == .parentNotFound && error?.message.contains(f.store.path) == true, "\(String(describing: error))")
            #expect(try f.store.count(Item.self) == 0)
            // A home that exists, also one inserted in the same transaction, takes items.
            let home = try f.addHome()
            #expect(f.create(Item(homeID: home, name: "kept")) == nil)
            try f.store.write { tx in
                let fresh = Home(name: "new")
                try tx.insert(fresh)
                try f.gate.authorize(.create(Item.self, in: fresh.id), in: tx)
                try tx.insert(Item(homeID: fresh.id, name: "in the new home"))
            }
            try f.store.delete(Home.self, id: home)
            #expect(f.gate.check(.create(Item.self, in: home)).denial == .checkFailed)
        }
    }

    @Test func twoLimitsOfOneNameAreRefused() throws {
        let error = #expect(throws: GateError.self) {
            try Fixture { $0.limits = [.maxRecords(Home.self, 1), .maxRecords(Item.self, 3).named("Home")] }
        }
        #expect(error?.code == .invalidConfiguration && error?.message.contains("'Home'") == true, "\(String(describing: error))")
        let typo = #expect(throws: GateError.self) {
            try Fixture { $0.limits = [.maxRecords(typeNamed: "Item", 3, perField: "homeID", parentType: "House")] }
        }
        #expect(typo?.code == .invalidConfiguration && typo?.message.contains("'House'") == true, "\(String(describing: typo))")
    }
}

private struct Tag: Record, Equatable {
    var id = RecordID()
    var name: String
}
