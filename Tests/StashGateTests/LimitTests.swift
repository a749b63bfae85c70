import Foundation
import Stash
import StashGate
import StashTestSupport
import Testing

/// Free-tier limits counted from indexes, the downgrade-safe rule, and transactional gating.
@Suite struct LimitTests {
    @Test func freeUserHitsTheHomeAndItemLimits() throws {
        let f = try Fixture()
        #expect(f.createHome("first") == nil)
        #expect(f.createHome("second") == .homeLimitReached)
        let home = try #require(try f.store.fetch(FetchDescriptor<Home>()).first?.id)
        for n in 0..<10 { #expect(f.create(Item(homeID: home, name: "item \(n)")) == nil) }
        #expect(f.create(Item(homeID: home, name: "eleventh")) == .itemLimitReached)
        #expect(try f.store.count(Item.self) == 10)
        #expect(try f.store.count(Home.self) == 1)
        let decision = f.gate.check(.create(Item.self, in: home))
        #expect(!decision.isAllowed && decision.denial == .itemLimitReached && decision.tier == .free && decision.reason == .default)
        // Deleting one frees a slot.
        let one = try #require(try f.store.fetch(FetchDescriptor<Item>()).first)
        try f.store.delete(Item.self, id: one.id)
        #expect(f.gate.check(.create(Item.self, in: home)).isAllowed)
        // Premium removes the limits.
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 365 * day)]))
        #expect(f.createHome("second") == nil)
        for n in 0..<5 { #expect(f.create(Item(homeID: home, name: "pro \(n)")) == nil) }
    }

    /// A creation of a per-parent limited type that named no parent skipped that limit: a
    /// full home took one item more, after which every creation was denied as over the limit.
    /// Refused now, by name and by type; premium still creates anywhere.
    @Test func aCreationWithoutItsParentIsRefusedNotAllowed() throws {
        let f = try Fixture { $0.limits = [.maxRecords(Home.self, 1), .maxRecords(Item.self, 2, per: \.homeID)] }
        let home = try f.addHome()
        for n in 0..<2 { #expect(f.create(Item(homeID: home, name: "item \(n)")) == nil) }
        for action in [GateAction.create(Item.self), .create(typeNamed: "Item")] {
            let decision = f.gate.check(action)
            #expect(!decision.isAllowed && decision.denial == .checkFailed, "\(decision)")
            #expect(decision.error?.contains("names no parent") == true, "\(String(describing: decision.error))")
            let error = #expect(throws: GateError.self) {
                try f.store.write { tx in
                    try f.gate.authorize(action, in: tx)
                    try tx.insert(Item(homeID: home, name: "third"))
                }
            }
            #expect(error?.code == .invalidConfiguration && error?.message.contains("homeID") == true, "\(String(describing: error))")
        }
        #expect(try f.store.count(Item.self) == 2)
        #expect(f.gate.check(.create(Home.self)).denial == .homeLimitReached, "types without a per-parent limit need no parent")
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 365 * day)]))
        #expect(f.gate.check(.create(Item.self)).isAllowed, "premium: no limit to count")
    }

    /// Limits given by stored name (as schema-driven code writes them) never matched a typed
    /// creation: a free user got one home more than the limit, then every creation anywhere
    /// was denied as over the limit, and the per-home limit was skipped altogether.
    @Test func limitsByNameApplyToTypedCreations() throws {
        let f = try Fixture { $0.limits = [.maxRecords(typeNamed: "Home", 1), .maxRecords(typeNamed: "Item", 10, perField: "homeID")] }
        #expect(f.createHome("first") == nil)
        #expect(f.createHome("second") == .homeLimitReached)
        let home = try #require(try f.store.fetch(FetchDescriptor<Home>()).first?.id)
        for n in 0..<10 { #expect(f.create(Item(homeID: home, name: "item \(n)")) == nil) }
        #expect(f.create(Item(homeID: home, name: "eleventh")) == .itemLimitReached)
        #expect(f.gate.check(.create(Item.self, in: home)).denial == .itemLimitReached)
        #expect(f.gate.check(.create(typeNamed: "Item", in: home)).denial == .itemLimitReached)
        #expect(try f.store.count(Item.self) == 10)
        #expect(try f.store.count(Home.self) == 1)
    }

    /// A per-parent limit by name on a field that holds no record id (a room given by name):
    /// the check of the parent compares record ids, so it never fired and a room got one
    /// record more than the limit; then the walk of the groups, which took any value, found
    /// that room over it and denied every creation in the store. Refused at open now.
    @Test func aPerParentLimitByNameNeedsARecordIDField() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.sub("store"), types: [Plant.self] + FeatureGate.recordTypes)
        try store.insert(Plant(room: "kitchen"))
        var config = GateConfiguration(userID: "u1", verifier: verifier)
        config.limits = [.maxRecords(typeNamed: "Plant", 2, perField: "room")]
        let error = #expect(throws: GateError.self) { try FeatureGate.open(store, configuration: config) }
        #expect(error?.code == .invalidConfiguration)
        let message = error?.message ?? ""
        #expect(message.contains("Plant") && message.contains("'room'") && message.contains("string"), "\(message)")
        // A field of record ids is what such a limit counts by.
        config.limits = [.maxRecords(typeNamed: "Plant", 2, perField: "potID")]
        #expect(try FeatureGate.open(store, configuration: config).check(.create(typeNamed: "Plant", in: RecordID())).isAllowed)
    }

    @Test func downgradeKeepsViewAndEditButDeniesAllCreation() throws {
        let f = try Fixture()
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)]))
        var homes: [RecordID] = []
        for n in 0..<3 {
            #expect(f.createHome("home \(n)") == nil)
        }
        homes = try f.store.fetch(FetchDescriptor<Home>()).map(\.id)
        for n in 0..<4 { #expect(f.create(Item(homeID: homes[0], name: "i\(n)")) == nil) }
        // The subscription lapses: 3 homes on a free tier of 1.
        f.clock.set(instant(30 * day))
        #expect(f.gate.tier == .free)
        #expect(f.createHome("fourth") == .homeLimitReached)                   // the home limit, passed
        #expect(f.create(Item(homeID: homes[1], name: "new")) == .overLimit)   // even in an empty home
        #expect(f.gate.check(.view).isAllowed)
        #expect(f.gate.check(.edit).isAllowed)
        #expect(f.gate.check(.delete).isAllowed)
        // Search and edit still work on the store.
        #expect(try f.store.count(Item.self, where: \.homeID, equals: homes[0]) == 4)
        try f.store.write { tx in
            try f.gate.authorize(.edit, in: tx)
            try tx.update(Home.self, id: homes[0]) { $0.name = "renamed" }
        }
        // Deleting down to the limit restores creation within the limits.
        try f.store.delete(Home.self, id: homes[1])
        try f.store.delete(Home.self, id: homes[2])
        #expect(f.create(Item(homeID: homes[0], name: "again")) == nil)
        // Items over the per-home limit also count as over: 12 items in one home.
        try f.gate.apply(try signed([Tx.subscription("t2", expires: 60 * day)], sequence: 2, server: 30 * day))
        for n in 0..<7 { #expect(f.create(Item(homeID: homes[0], name: "more \(n)")) == nil) }
        f.clock.set(instant(60 * day))
        #expect(try f.store.count(Item.self, where: \.homeID, equals: homes[0]) == 12)
        #expect(f.gate.check(.create(Home.self)).denial == .overLimit)
    }

    @Test(arguments: [UInt64(31), 32, 33, 34])
    func freeLimitsAreNeverExceededByNewCreations(seed: UInt64) async throws {
        var rng = SeededGenerator(seed: seed)
        let f = try Fixture()
        var proUntil: Int64 = Int64.min
        var lastServer: Int64 = 0
        var now: Int64 = 0
        var sequence: UInt64 = 0
        func isPremium() -> Bool { now < proUntil && now - lastServer <= 30 * day }   // yearly plans: 30 days offline
        for step in 0..<400 {
            await Task.yield()   // long property runs leave the shared pool to other tests
            let homes = try f.store.fetch(FetchDescriptor<Home>()).map(\.id)
            let premium = isPremium()
            let homeCount = homes.count
            let itemCounts = try homes.map { try f.store.count(Item.self, where: \.homeID, equals: $0) }
            let overBefore = homeCount > 1 || itemCounts.contains { $0 > 10 }
            switch Int.random(in: 0..<100, using: &rng) {
            case 0..<20:
                let denial = f.createHome("h\(step)")
                if premium {
                    #expect(denial == nil, "seed \(seed) step \(step)")
                } else if denial == nil {
                    #expect(homeCount == 0 && !overBefore, "seed \(seed) step \(step): free home creation past the limit")
                } else {
                    // The home limit when it is passed; else another limit passed; else the home limit reached.
                    let expected: DenialReason? = homeCount > 1 ? .homeLimitReached : overBefore ? .overLimit : homeCount == 1 ? .homeLimitReached : nil
                    #expect(denial == expected, "seed \(seed) step \(step): \(String(describing: denial))")
                }
            case 20..<65 where !homes.isEmpty:
                let h = Int.random(in: 0..<homes.count, using: &rng)
                let denial = f.create(Item(homeID: homes[h], name: "i\(step)"))
                if premium {
                    #expect(denial == nil, "seed \(seed) step \(step)")
                } else if denial == nil {
                    #expect(!overBefore && itemCounts[h] < 10, "seed \(seed) step \(step): free item creation past the limit")
                } else {
                    // The home the item goes into when it is full (or past); else the downgrade-safe rule.
                    #expect(denial == (itemCounts[h] >= 10 ? .itemLimitReached : overBefore ? .overLimit : nil), "seed \(seed) step \(step)")
                }
            case 65..<80 where !homes.isEmpty:
                let items = try f.store.fetch(FetchDescriptor<Item>())
                if let victim = items.randomElement(using: &rng) { try f.store.delete(Item.self, id: victim.id) }
                else { try f.store.delete(Home.self, id: homes.randomElement(using: &rng)!) }
            case 80..<88:
                // Upgrade: a new subscription period.
                sequence += 1
                proUntil = now + Int64.random(in: hour...(20 * day), using: &rng)
                lastServer = now
                try f.gate.apply(try signed([Tx.subscription("s\(sequence)", expires: proUntil)], sequence: sequence, server: now))
            case 88..<92:
                // Refund: the latest subscription is revoked.
                sequence += 1
                proUntil = Int64.min
                lastServer = now
                try f.gate.apply(try signed([Tx.subscription("s\(sequence)", expires: 400 * day, revoked: now)], sequence: sequence, server: now))
            default:
                // Time passes; subscriptions expire.
                now += Int64.random(in: 0...(2 * day), using: &rng)
                f.clock.set(instant(now))
            }
            #expect(f.gate.tier == (isPremium() ? .premium : .free), "seed \(seed) step \(step)")
        }
    }

    @Test func racingThreadsCannotBothPassALimit() throws {
        let f = try Fixture()
        let home = try f.addHome()
        let created = Failures()
        let gate = f.gate, store = f.store
        onThreads(8) { t in
            for n in 0..<5 {
                do {
                    try store.write { tx in
                        try gate.authorize(.create(Item.self, in: home), in: tx)
                        try tx.insert(Item(homeID: home, name: "t\(t)-\(n)"))
                    }
                    created.add("\(t)-\(n)")
                } catch let error as GateError where error.code == .denied {
                } catch {
                    created.add("error \(error)")
                }
            }
        }
        #expect(created.all.count == 10, "\(created.all)")
        #expect(try store.count(Item.self, where: \.homeID, equals: home) == 10)
    }

    @Test func countsSeenInsideTheTransactionIncludeItsOwnInserts() throws {
        let f = try Fixture()
        let home = try f.addHome()
        // One transaction inserting 12 items checks each against its own pending count.
        let error = #expect(throws: GateError.self) {
            try f.store.write { tx in
                for n in 0..<12 {
                    try f.gate.authorize(.create(Item.self, in: home), in: tx)
                    try tx.insert(Item(homeID: home, name: "\(n)"))
                }
            }
        }
        #expect(error?.decision?.denial == .itemLimitReached)
        #expect(try f.store.count(Item.self) == 0)   // rolled back as a whole
    }

    @Test func checkIsFast() throws {
        let f = try Fixture()
        let home = try f.addHome()
        try f.store.write { tx in for n in 0..<9 { try tx.insert(Item(homeID: home, name: "\(n)")) } }
        let action = GateAction.create(Item.self, in: home)
        for _ in 0..<1000 { _ = f.gate.check(action) }
        var samples: [UInt64] = []
        for _ in 0..<5000 {
            let start = DispatchTime.now().uptimeNanoseconds
            let decision = f.gate.check(action)
            samples.append(DispatchTime.now().uptimeNanoseconds - start)
            precondition(decision.isAllowed)
        }
        samples.sort()
        let p99 = samples[samples.count * 99 / 100]
        print("gate check (entitlement + 2 limit counts): p50 \(samples[samples.count / 2]) ns, p99 \(p99) ns")
        #expect(p99 < 10_000_000)   // the requirement: < 10 ms (the ≤ 5 µs goal is measured in release by Benchmarks)
    }
}


/// A record with a parent given by name (a string), and one given by record id.
private struct Plant: Record, Equatable {
    var id = RecordID()
    var room: String
    var potID = RecordID()
    static let indexes: [RecordIndex<Plant>] = [.index(\.room), .index(\.potID)]
}
