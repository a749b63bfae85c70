import Foundation
import Stash
import Testing
import StashTestSupport

@Suite struct StoreConcurrencyTests {
    /// One writer commits batches (inserts, moves between homes, deletes); readers on other
    /// threads check, inside each snapshot, that every way of counting agrees:
    /// `count(T)`, the per-home index counts, the index handle, `fetchCount`, and a fetch.
    @Test func readersSeeConsistentCountsWhileOneWriterCommits() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let homes = (0..<4).map { Home(name: "home \($0)") }
        try store.write { tx in for h in homes { try tx.insert(h) } }
        let homeIDs = homes.map(\.id)
        let failures = Failures()
        let done = DoneFlag()
        let batches = 60
        let snapshotsChecked = Failures()
        onThreads(5) { thread in
            if thread == 0 {
                defer { done.set() }
                var rng = SeededGenerator(seed: 77)
                var live: [RecordID] = []
                do {
                    for batch in 0..<batches {
                        try store.write { tx in
                            for _ in 0..<8 {
                                let item = Item.random(homes: homeIDs, using: &rng)
                                try tx.insert(item)
                                live.append(item.id)
                            }
                            // Move two items to another home and delete one.
                            for _ in 0..<2 {
                                if let id = live.randomElement(using: &rng) {
                                    try tx.update(Item.self, id: id) { $0.homeID = homeIDs.randomElement(using: &rng)!; $0.wearCount = batch % 8 }
                                }
                            }
                            if let i = live.indices.randomElement(using: &rng) { try tx.delete(Item.self, id: live.remove(at: i)) }
                        }
                    }
                } catch { failures.add("writer: \(error)") }
                return
            }
            let byHome: IndexHandle<Item, RecordID>
            do { byHome = try store.index(\Item.homeID) } catch { failures.add("\(error)"); return }
            var last = 0
            var checked = 0
            while !done.isSet || checked < 10 {
                do {
                    try store.read { s in
                        let total = try s.count(Item.self)
                        if total < last { failures.add("reader \(thread): count went back from \(last) to \(total)") }
                        last = total
                        var sum = 0, handleSum = 0
                        for home in homeIDs {
                            sum += try s.count(Item.self, where: \.homeID, equals: home)
                            handleSum += try s.count(byHome, equals: home)
                        }
                        if sum != total || handleSum != total { failures.add("reader \(thread): total \(total), per home \(sum), handle \(handleSum)") }
                        let wearTotal = try (0..<8).reduce(0) { $0 + (try s.count(Item.self, where: \.wearCount, equals: $1)) }
                        if wearTotal != total { failures.add("reader \(thread): per wearCount \(wearTotal) vs \(total)") }
                        if thread % 2 == 0 {
                            let home = homeIDs[checked % homeIDs.count]
                            let fetched = try s.fetch(FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == home }))
                            let counted = try s.fetchCount(FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == home }))
                            let indexed = try s.count(Item.self, where: \.homeID, equals: home)
                            if fetched.count != counted || counted != indexed || fetched.contains(where: { $0.homeID != home }) {
                                failures.add("reader \(thread): fetch \(fetched.count), fetchCount \(counted), index \(indexed)")
                            }
                        } else {
                            let all = try s.fetch(FetchDescriptor<Item>())
                            if all.count != total { failures.add("reader \(thread): fetch all \(all.count) vs count \(total)") }
                        }
                    }
                    checked += 1
                } catch { failures.add("reader \(thread): \(error)") }
            }
            snapshotsChecked.add("\(checked)")
        }
        #expect(failures.all.isEmpty, "\(failures.all.prefix(10))")
        #expect(snapshotsChecked.all.count == 4)
        #expect(try store.count(Item.self) == batches * 7)
        let report = try store.verify()
        #expect(report.isClean, "\(report)")
        #expect(try store.history().count == 1 + batches)
    }

    /// Several threads writing through one `Store` are serialized: nothing is lost.
    @Test func concurrentWritersLoseNothing() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "shared")
        try store.insert(home)
        let failures = Failures()
        onThreads(4) { thread in
            for n in 0..<25 {
                do {
                    try store.write { tx in
                        try tx.insert(Item(homeID: home.id, name: "t\(thread)-\(n)", category: "c\(thread)", wearCount: n % 8, price: 1))
                        // Read-modify-write of a shared record: lost updates would show.
                        try tx.update(Home.self, id: home.id) { $0.name = String((Int($0.name) ?? 0) + 1) }
                    }
                } catch { failures.add("writer \(thread): \(error)") }
            }
        }
        #expect(failures.all.isEmpty, "\(failures.all.prefix(5))")
        #expect(try store.count(Item.self) == 100)
        #expect(try store.count(Item.self, where: \.homeID, equals: home.id) == 100)
        #expect(try store.get(Home.self, id: home.id)?.name == "100")
        #expect(try store.verify().isClean)
    }

    /// A nested write through the store on the same thread is reported, not a deadlock; as a
    /// code of its own (it was `.storage`, which reads as a disk fault).
    @Test func nestedStoreWriteIsAnError() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        var inner: (any Error)?
        try store.write { tx in
            try tx.insert(Home(name: "outer"))
            inner = thrownError { try store.insert(Home(name: "inner")) }
        }
        let error = inner as? StoreError
        #expect(error?.code == .nestedWrite, "\(String(describing: inner))")
        #expect(error?.message.contains("nested") == true, "\(String(describing: inner))")
        #expect(try store.count(Home.self) == 1)
        #expect(try store.fetch(FetchDescriptor<Home>()).map(\.name) == ["outer"])
    }
}

/// Durable writes from many threads at once go through group commit (several writers'
/// transactions in one LMDB commit): each must still be one history entry of its own, a
/// writer that fails must leave nothing behind, and the store must verify clean.
@Suite struct GroupCommitStoreTests {
    @Test func concurrentDurableWritersKeepHistoryCountsAndUniquenessExact() throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.durability = .full
        let store = try Store.open(at: dir.path, types: [UserProfile.self], options: options)
        let threads = 8, writesPerThread = 20
        let committed = Failures(), refused = Failures(), failures = Failures()
        onThreads(threads) { t in
            for k in 0..<writesPerThread {
                // Threads t and t^1 race for the same email at every step: exactly one of
                // each pair may win, whichever order the group puts them in.
                let email = "user-\(t / 2)-\(k)@example.com"
                do {
                    try store.write(author: "thread \(t)") { tx in
                        try tx.insert(UserProfile(email: email, displayName: "t\(t) k\(k)"))
                    }
                    committed.add(email)
                } catch let error as StoreError where error.code == .uniqueViolation {
                    refused.add(email)
                } catch {
                    failures.add("thread \(t) write \(k): \(error)")
                }
            }
        }
        #expect(failures.all.isEmpty, "\(failures.all)")
        let pairs = threads / 2 * writesPerThread
        #expect(committed.all.count == pairs, "one winner per raced email")
        #expect(Set(committed.all).count == pairs)
        #expect(refused.all.count == pairs)
        #expect(try store.count(UserProfile.self) == pairs)

        // One history entry per committed write, with consecutive sequence numbers: a
        // refused writer's transaction left no sequence number behind.
        let entries = try store.history()
        #expect(entries.count == pairs)
        #expect(entries.map(\.sequence) == Array(1...UInt64(pairs)))
        #expect(entries.allSatisfy { $0.changes.count == 1 && $0.author?.hasPrefix("thread ") == true })
        let report = try store.verify()
        #expect(report.isClean, "\(report)")
    }
}

/// What a write closure sees of the current task: its caller's, grouped or not (a grouped
/// closure ran in the leading writer's task until the leader handed the transaction to each
/// caller's thread), from an actor or from nonisolated code.
@Suite struct WriteClosureTaskTests {
    enum RequestContext { @TaskLocal static var request = "none" }

    actor Service {
        let store: Store
        init(store: Store) { self.store = store }
        /// Inserts a home and returns what the closure saw of its task.
        func insert(_ name: String) throws -> (request: String, cancelled: Bool) {
            try store.write(author: name) { tx in
                try tx.insert(Home(name: name))
                return (RequestContext.request, Task.isCancelled)
            }
        }
    }

    /// Eight writers on threads of their own (half of them cancelled), each writing ten
    /// times durably, so that they group: each closure names its caller's task-local value
    /// in what it inserts and checks for cancellation; no cancelled write may commit, no live
    /// one may fail.
    @Test func nonisolatedWriteClosuresSeeTheirCallersTaskWhileTheyGroup() async throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.durability = .full
        let store = try Store.open(at: dir.path, types: [Home.self], options: options)
        let executor = ThreadPerJobExecutor()
        let writers = (0..<8).map { t in
            Task(executorPreference: executor) { () -> [String] in
                let cancelled = t % 2 == 1
                if cancelled { withUnsafeCurrentTask { $0?.cancel() } }
                return RequestContext.$request.withValue("writer \(t)") {
                    var wrong: [String] = []
                    for k in 0..<10 {
                        do {
                            try store.write { tx in
                                try Task.checkCancellation()
                                try tx.insert(Home(name: "\(RequestContext.request) write \(k)"))
                            }
                            if cancelled { wrong.append("writer \(t) write \(k): cancelled, yet it committed") }
                        } catch is CancellationError {
                            if !cancelled { wrong.append("writer \(t) write \(k): live, yet it threw CancellationError") }
                        } catch {
                            wrong.append("writer \(t) write \(k): \(error)")
                        }
                    }
                    return wrong
                }
            }
        }
        var wrong: [String] = []
        for writer in writers { wrong += await writer.value }
        #expect(wrong.isEmpty, "\(wrong.prefix(8))")
        let names = Set(try store.fetch(FetchDescriptor<Home>()).map(\.name))
        let expected = Set((0..<8).filter { $0 % 2 == 0 }.flatMap { t in (0..<10).map { "writer \(t) write \($0)" } })
        #expect(names == expected)
        #expect(try store.history().count == 40)
        #expect(try store.verify().isClean)
    }

    @Test func anActorIsolatedWriteClosureSeesItsCallersTaskWhileOthersGroup() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let service = Service(store: store)
        let home = Home(name: "shared")
        try store.insert(home)
        let rounds = 25
        let wrong = try await withThrowingTaskGroup(of: [String].self) { group in
            // Nonisolated writers: they group, and lead groups, on the concurrency pool.
            for t in 0..<6 {
                group.addTask {
                    try await RequestContext.$request.withValue("grouped \(t)") {
                        for k in 0..<rounds {
                            // The synchronous write (`isolation:` picks it in an async context).
                            try store.write(isolation: #isolation) { tx in
                                try tx.insert(Item(homeID: home.id, name: "\(t)-\(k)", category: "c", wearCount: k, price: 1))
                            }
                            await Task.yield()
                        }
                    }
                    return []
                }
            }
            for t in 0..<6 {
                group.addTask {
                    let cancelled = t % 2 == 0
                    if cancelled { withUnsafeCurrentTask { $0?.cancel() } }
                    return try await RequestContext.$request.withValue("actor \(t)") {
                        var wrong: [String] = []
                        for k in 0..<rounds {
                            let seen = try await service.insert("actor \(t) \(k)")
                            if seen.request != "actor \(t)" { wrong.append("actor \(t) write \(k) saw task-local '\(seen.request)'") }
                            if seen.cancelled != cancelled { wrong.append("actor \(t) write \(k) saw isCancelled \(seen.cancelled)") }
                        }
                        return wrong
                    }
                }
            }
            var all: [String] = []
            for try await part in group { all += part }
            return all
        }
        #expect(wrong.isEmpty, "\(wrong.prefix(5))")
        #expect(try store.count(Item.self) == 6 * rounds)
        #expect(try store.count(Home.self) == 1 + 6 * rounds)
        #expect(try store.verify().isClean)
    }
}
