import Foundation
import Stash
import Synchronization
import Testing
import StashTestSupport

/// Live queries: `store.observe(descriptor)`, `observeCount`: the current result first, then
/// fresh results after commits that may change them, coalesced for slow consumers.
@Suite struct LiveQueryTests {
    private func item(_ home: Home, _ name: String, wear: Int = 0) -> Item {
        Item(homeID: home.id, name: name, category: "c", wearCount: wear, price: 1)
    }

    @Test func theFirstResultIsTheCurrentOneThenEachCommitToTheTypeBringsAFreshOne() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "Flat")
        try store.insert(home)
        try store.insert(item(home, "Lamp"))
        let homeID = home.id
        let descriptor = FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == homeID }, sortBy: [SortDescriptor(\.name)])
        var results = store.observe(descriptor).makeAsyncIterator()
        #expect(try await results.next()?.map(\.name) == ["Lamp"])
        try store.insert(item(home, "Desk"))
        #expect(try await results.next()?.map(\.name) == ["Desk", "Lamp"])
        try await store.write { tx in
            try tx.update(Item.self, id: try #require(tx.fetch(descriptor).first).id) { $0.name = "Chair" }
        }
        #expect(try await results.next()?.map(\.name) == ["Chair", "Lamp"])
    }

    /// A count's first element, then one per change of the count: a commit that leaves it as
    /// it was delivers nothing.
    @Test func aCountIsDeliveredWhenItChanges() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "Flat")
        let lamp = item(home, "Lamp")
        try await store.write { tx in
            try tx.insert(home)
            try tx.insert(lamp)
        }
        let byHome = try store.index(\Item.homeID)
        var counts = store.observeCount(byHome, equals: home.id).makeAsyncIterator()
        #expect(try await counts.next() == 1)
        try store.update(Item.self, id: lamp.id) { $0.wearCount += 1 }   // the count stays 1
        try await Task.sleep(for: .milliseconds(50))
        try store.insert(item(home, "Desk"))
        #expect(try await counts.next() == 2, "the unchanged count was delivered again")
        let all = FetchDescriptor<Item>()
        var total = store.observeCount(all).makeAsyncIterator()
        #expect(try await total.next() == 2)
        _ = try store.delete(Item.self, id: lamp.id)
        #expect(try await total.next() == 1)
        #expect(try await counts.next() == 1)
    }

    /// Only commits touching the observed type evaluate the query, and nothing is evaluated
    /// while nothing commits (polls read no record).
    @Test func commitsToOtherTypesAndIdleTimeEvaluateNothing() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let evaluations = Tally()
        let query = store.observe(types: [Item.self], pollInterval: .milliseconds(2)) { snapshot in
            evaluations.add()
            return try snapshot.count(Item.self)
        }
        var results = query.makeAsyncIterator()
        #expect(try await results.next() == 0)
        #expect(evaluations.value == 1)
        let waiting = Task { try await results.next() }
        for n in 0..<20 { try store.insert(Home(name: "other \(n)")) }
        try await Task.sleep(for: .milliseconds(200))   // 100 polls, 20 commits of another type
        #expect(evaluations.value == 1)
        let home = Home(name: "h")
        let lamp = item(home, "Lamp")
        try await store.write { tx in
            try tx.insert(home)
            try tx.insert(lamp)
        }
        #expect(try await waiting.value == 1)
        #expect(evaluations.value == 2)
    }

    /// A consumer slower than the commits gets the newest result once, not one per commit.
    @Test func aSlowConsumerGetsTheNewestResultOnce() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        try store.insert(home)
        let evaluations = Tally()
        var results = store.observe(types: [Item.self]) { snapshot in
            evaluations.add()
            return try snapshot.count(Item.self)
        }.makeAsyncIterator()
        #expect(try await results.next() == 0)
        for n in 0..<50 { try store.insert(item(home, "i\(n)")) }   // the consumer is busy meanwhile
        try await Task.sleep(for: .milliseconds(50))
        #expect(try await results.next() == 50)
        #expect(evaluations.value == 2)
    }

    /// A commit made by another process (`stash put`) is seen at the next poll.
    @Test func anotherProcessesCommitIsSeen() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        var homes = store.observe(FetchDescriptor<Home>(sortBy: [SortDescriptor(\.name)])).makeAsyncIterator()
        #expect(try await homes.next()?.isEmpty == true)
        let put = try StashExecutable.run("put", dir.path, "Home", #"{"name": "from the CLI", "createdAt": "2026-01-01T00:00:00Z"}"#)
        #expect(put.status == 0, "\(put.stderr)")
        let start = ContinuousClock.now
        #expect(try await homes.next()?.map(\.name) == ["from the CLI"])
        #expect(ContinuousClock.now - start < .seconds(2))
    }

    /// Writes through another `Store` of the same directory in this process wake the query at
    /// once, as the store's own do.
    @Test func aCommitThroughAnotherStoreOfTheDirectoryWakesItAtOnce() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        let other = try Store.open(at: dir.path, types: [Home.self])
        var counts = store.observeCount(FetchDescriptor<Home>(), pollInterval: .seconds(60)).makeAsyncIterator()
        #expect(try await counts.next() == 0)
        try await other.write { tx in try tx.insert(Home(name: "h")) }
        let start = ContinuousClock.now
        #expect(try await counts.next() == 1)
        #expect(ContinuousClock.now - start < .seconds(5), "it waited for the 60 s poll")
    }

    /// Cancelling the consuming task ends the sequence, and the store's watcher thread ends
    /// with its last query.
    @Test func cancellingTheConsumerEndsTheQueryAndItsThread() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        let before = osThreadNames().filter { $0 == "stash.observe" }.count
        let seen = Tally()
        let consumer = Task {
            for try await _ in store.observeCount(FetchDescriptor<Home>()) { seen.add() }
            return "ended"
        }
        while seen.value == 0 { try await Task.sleep(for: .milliseconds(1)) }
        #expect(osThreadNames().filter { $0 == "stash.observe" }.count > before)
        consumer.cancel()
        #expect(try await consumer.value == "ended")
        let deadline = ContinuousClock.now + .seconds(5)
        while osThreadNames().filter({ $0 == "stash.observe" }).count > before, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        #expect(osThreadNames().filter { $0 == "stash.observe" }.count <= before)
    }

    /// Closing the store ends its live queries with `.closed`; a query made afterwards throws
    /// it at once.
    @Test func closingTheStoreEndsItsLiveQueries() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        var counts = store.observeCount(FetchDescriptor<Home>()).makeAsyncIterator()
        #expect(try await counts.next() == 0)
        let waiting = Task { try await counts.next() }
        try await Task.sleep(for: .milliseconds(20))
        try store.close()
        let error = await #expect(throws: StoreError.self) { try await waiting.value }
        #expect(error?.code == .closed)
        var late = store.observe(FetchDescriptor<Home>()).makeAsyncIterator()
        let lateError = await #expect(throws: StoreError.self) { try await late.next() }
        #expect(lateError?.code == .closed)
    }

    /// 100 queries on a type, each consumer waiting: every commit to the type brings each one
    /// its fresh result, evaluated in one snapshot.
    @Test func aHundredObserversEachGetEveryChange() async throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.durability = .none
        let store = try Store.open(at: dir.path, types: [Home.self], options: options)
        let byName = FetchDescriptor<Home>(sortBy: [SortDescriptor(\.name)])
        try await withThrowingTaskGroup(of: [Int].self) { group in
            let ready = Tally()
            for _ in 0..<100 {
                group.addTask {
                    var seen: [Int] = []
                    for try await homes in store.observe(byName) {
                        seen.append(homes.count)
                        if seen.count == 1 { ready.add() }
                        if homes.count == 3 { break }
                    }
                    return seen
                }
            }
            while ready.value < 100 { try await Task.sleep(for: .milliseconds(1)) }
            for n in 0..<3 {
                try store.insert(Home(name: "h\(n)"))
                try await Task.sleep(for: .milliseconds(30))
            }
            for try await seen in group {
                #expect(seen.first == 0 && seen.last == 3)
                #expect(seen == seen.sorted())
            }
        }
    }
}

/// A count shared by tasks and threads.
final class Tally: Sendable {
    private let count = Atomic<Int>(0)
    func add() { count.add(1, ordering: .relaxed) }
    var value: Int { count.load(ordering: .relaxed) }
}
