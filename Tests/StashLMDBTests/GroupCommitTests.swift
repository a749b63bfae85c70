import Foundation
@testable import StashLMDB
import StashTestSupport
import Synchronization
import Testing

/// Group commit: writers that wait while a commit is in progress are committed together in
/// one LMDB transaction (each in a nested transaction of its own once one of them throws).
@Suite struct GroupCommitTests {
    /// Holds the write lock with a closure that waits for `release`, queues `writers` more
    /// writes from other threads behind it, then lets them all go. Returns the environment's
    /// last transaction id before and after, and each queued writer's error (nil: committed).
    private func runQueuedBehindAHeldWrite(
        _ env: Environment, writers: Int,
        _ body: @escaping @Sendable (Int, WriteTransaction) throws -> Void
    ) throws -> (before: Int, after: Int, errors: [String?]) {
        let before = env.info().lastTransactionID
        let release = DoneFlag(), entered = DoneFlag()
        let errors = Mutex<[String?]>(Array(repeating: "not run", count: writers))
        let holder = Thread {
            try? env.write { txn in
                // A change, so that this write is a commit of its own (LMDB skips empty ones).
                try txn.put(try env.database("main"), key: b("held"), value: b("1"))
                entered.set()
                while !release.isSet { Thread.sleep(forTimeInterval: 0.001) }
            }
        }
        holder.start()
        while !entered.isSet { Thread.sleep(forTimeInterval: 0.001) }
        let group = DispatchGroup()
        for i in 0..<writers {
            group.enter()
            Thread {
                do {
                    try env.write { txn in try body(i, txn) }
                    errors.withLock { $0[i] = nil }
                } catch {
                    errors.withLock { $0[i] = "\(error)" }
                }
                group.leave()
            }.start()
        }
        let deadline = Date().addingTimeInterval(10)
        while env.waitingWrites < writers, Date() < deadline { Thread.sleep(forTimeInterval: 0.001) }
        #expect(env.waitingWrites == writers, "the writers did not all queue behind the held write")
        release.set()
        group.wait()
        return (before, env.info().lastTransactionID, errors.withLock { $0 })
    }

    /// The write of a `@MainActor` caller (UI code) ran its closure, isolated to the main
    /// actor, on whichever writer's thread led its group: off its actor, while the caller
    /// waited. It runs on the caller's thread now, led alone or grouped behind another
    /// writer.
    @MainActor @Test func aMainActorWriteRunsOnItsCallersThread() throws {
        let caller = pthread_self()
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, durability: .none)
        let main = try env.database("main")
        let stop = DoneFlag(), stopped = DoneFlag()
        let background = Thread {
            var n = 0
            while !stop.isSet {
                try? env.write { txn in try txn.put(main, key: b("background \(n % 64)"), value: b("x")) }
                n += 1
            }
            stopped.set()
        }
        background.start()
        var offTheMainThread = 0
        for n in 0..<400 {
            try env.write { txn in
                if pthread_equal(pthread_self(), caller) == 0 { offTheMainThread += 1 }
                try txn.put(main, key: b("main \(n)"), value: b("y"))
            }
        }
        stop.set()
        while !stopped.isSet { Thread.sleep(forTimeInterval: 0.001) }
        #expect(offTheMainThread == 0)
        #expect(try env.read { txn in try txn.statistics(main).entries } >= 400)
    }

    enum WriterContext { @TaskLocal static var name = "none" }

    /// A grouped closure ran on the leading writer's thread, in its task: a `@TaskLocal`
    /// read inside it gave the leader's value, and `Task.checkCancellation()` there threw for
    /// a live caller grouped behind a cancelled leader and let a cancelled caller's change
    /// commit behind a live one. A caller's closure now runs on its caller's thread and task.
    /// Four tasks (two cancelled) and two plain threads (whose closures the leader may run)
    /// queue behind a held write, ten times over, so that each is led by the others and
    /// leads them in turn.
    @Test(.timeLimit(.minutes(1))) func groupedClosuresRunOnTheirCallersThreadAndTask() async throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        let executor = ThreadPerJobExecutor()
        var wrong: [String] = []
        for round in 0..<10 {
            let before = env.info().lastTransactionID
            let release = DoneFlag(), entered = DoneFlag()
            Thread {
                try? env.write { txn in
                    try txn.put(main, key: b("held"), value: b("\(round)"))
                    entered.set()
                    while !release.isSet { Thread.sleep(forTimeInterval: 0.001) }
                }
            }.start()
            while !entered.isSet { try await Task.sleep(for: .milliseconds(1)) }
            let writers = (0..<4).map { t in
                Task(executorPreference: executor) { () -> [String] in
                    let cancelled = t % 2 == 1
                    if cancelled { withUnsafeCurrentTask { $0?.cancel() } }
                    return WriterContext.$name.withValue("writer \(t)") {
                        let caller = pthread_self()
                        var seen: [String] = []
                        do {
                            try env.write { txn in
                                if WriterContext.name != "writer \(t)" { seen.append("saw task-local '\(WriterContext.name)'") }
                                if pthread_equal(pthread_self(), caller) == 0 { seen.append("ran on another thread") }
                                if t == 2 {
                                    // On its caller's thread, which holds no write lock: still nested.
                                    do {
                                        try env.write { _ in }
                                        seen.append("a write inside the closure ran")
                                    } catch let error as LMDBError where error.code == .nestedWrite {
                                    } catch {
                                        seen.append("a write inside the closure: \(error)")
                                    }
                                }
                                try Task.checkCancellation()
                                try txn.put(main, key: b("round \(round) writer \(t)"), value: b("x"))
                            }
                            if cancelled { seen.append("cancelled, yet its write committed") }
                        } catch is CancellationError {
                            if !cancelled { seen.append("live, yet its write threw CancellationError") }
                        } catch {
                            seen.append("\(error)")
                        }
                        return seen.map { "round \(round) writer \(t): \($0)" }
                    }
                }
            }
            let threadWriters = DispatchGroup()
            let threadFailures = Failures()
            for t in 4..<6 {
                threadWriters.enter()
                Thread {
                    do {
                        try env.write { txn in try txn.put(main, key: b("round \(round) writer \(t)"), value: b("x")) }
                    } catch {
                        threadFailures.add("round \(round) writer \(t): \(error)")
                    }
                    threadWriters.leave()
                }.start()
            }
            let deadline = Date().addingTimeInterval(10)
            while env.waitingWrites < 6, Date() < deadline { try await Task.sleep(for: .milliseconds(1)) }
            #expect(env.waitingWrites == 6, "the writers did not all queue behind the held write")
            release.set()
            for writer in writers { wrong += await writer.value }
            threadWriters.wait()
            wrong += threadFailures.all
            #expect(env.info().lastTransactionID - before == 2, "the held write, then one group of six")
            for t in 0..<6 {
                let stored = try env.read { try $0.get(main, key: b("round \(round) writer \(t)")) }
                #expect(stored == (t % 2 == 1 && t < 4 ? nil : b("x")), "round \(round) writer \(t)")
            }
        }
        #expect(wrong.isEmpty, "\(wrong.prefix(8))")
    }

    @Test func queuedWritersShareOneCommitAndSeeEachOthersChanges() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        let outcome = try runQueuedBehindAHeldWrite(env, writers: 8) { i, txn in
            // Read-modify-write: each writer must see the ones before it in the group.
            let old = try txn.get(main, key: b("counter")).map { Int(String(decoding: $0, as: UTF8.self))! } ?? 0
            try txn.put(main, key: b("counter"), value: b(String(old + 1)))
            try txn.put(main, key: b("writer \(i)"), value: b("x"))
        }
        #expect(outcome.errors.allSatisfy { $0 == nil }, "\(outcome.errors)")
        // One commit for the held write, one for the group of eight.
        #expect(outcome.after - outcome.before == 2)
        #expect(try env.read { try $0.get(main, key: b("counter")) } == b("8"))
        for i in 0..<8 { #expect(try env.read { try $0.get(main, key: b("writer \(i)")) } == b("x")) }
    }

    @Test func aFailingWriterInAGroupLosesOnlyItsOwnChanges() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        let outcome = try runQueuedBehindAHeldWrite(env, writers: 6) { i, txn in
            // Read-modify-write: the writers after a failed one must not build on its change.
            let old = try txn.get(main, key: b("counter")).map { Int(String(decoding: $0, as: UTF8.self))! } ?? 0
            try txn.put(main, key: b("counter"), value: b(String(old + 1)))
            try txn.put(main, key: b("writer \(i)"), value: b("x"))
            if i % 3 == 1 { throw TestAbort() }
        }
        #expect(outcome.after - outcome.before == 2)
        #expect(try env.read { try $0.get(main, key: b("counter")) } == b("4"), "six writers, two of which failed")
        for i in 0..<6 {
            let value = try env.read { try $0.get(main, key: b("writer \(i)")) }
            if i % 3 == 1 {
                #expect(outcome.errors[i]?.contains("TestAbort") == true, "writer \(i): \(String(describing: outcome.errors[i]))")
                #expect(value == nil, "writer \(i) threw, yet its change was committed")
            } else {
                #expect(outcome.errors[i] == nil)
                #expect(value == b("x"))
            }
        }
    }

    @Test func aGroupThatFillsTheMapGrowsItAndCommitsEveryone() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, mapSize: 1 << 20)
        let main = try env.database("main")
        let startSize = env.info().mapSize
        // 8 writers × 64 values of 4 KiB ≈ 2 MiB: the group cannot fit in the 1 MiB map.
        let outcome = try runQueuedBehindAHeldWrite(env, writers: 8) { i, txn in
            for k in 0..<64 {
                try txn.put(main, key: b("w\(i)-\(k)"), value: Array(repeating: UInt8(i), count: 4096))
            }
        }
        #expect(outcome.errors.allSatisfy { $0 == nil }, "\(outcome.errors)")
        #expect(env.info().mapSize > startSize)
        let count = try env.read { txn in try txn.statistics(main).entries }
        #expect(count == 8 * 64 + 1)   // and the held write's key
    }

    @Test func aWriteInsideAGroupedWriteIsRefused() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        let outcome = try runQueuedBehindAHeldWrite(env, writers: 3) { i, txn in
            try txn.put(main, key: b("writer \(i)"), value: b("x"))
            if i == 1 { try env.write { _ in } }
        }
        #expect(outcome.errors[0] == nil && outcome.errors[2] == nil, "\(outcome.errors)")
        #expect(outcome.errors[1]?.contains("nested") == true, "\(String(describing: outcome.errors[1]))")
        #expect(try env.read { try $0.get(main, key: b("writer 1")) } == nil)
        #expect(try env.read { try $0.get(main, key: b("writer 2")) } == b("x"))
    }

    /// Many threads writing durably at once: every write lands exactly once, and the writes
    /// needed fewer commits than there were writers' transactions.
    @Test func concurrentDurableWritersAllLand() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, durability: .full)
        let main = try env.database("main")
        let failures = Failures()
        onThreads(8) { t in
            for k in 0..<25 {
                do {
                    try env.write { txn in
                        let old = try txn.get(main, key: b("counter")).map { Int(String(decoding: $0, as: UTF8.self))! } ?? 0
                        try txn.put(main, key: b("counter"), value: b(String(old + 1)))
                        try txn.put(main, key: b("t\(t)-\(k)"), value: b("x"))
                    }
                } catch {
                    failures.add("thread \(t) write \(k): \(error)")
                }
            }
        }
        #expect(failures.all.isEmpty, "\(failures.all)")
        #expect(try env.read { try $0.get(main, key: b("counter")) } == b("200"))
        #expect(try env.read { txn in try txn.statistics(main).entries } == 201)
    }
}
