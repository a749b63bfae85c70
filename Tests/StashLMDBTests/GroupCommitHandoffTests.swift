import Foundation
@testable import StashLMDB
import StashTestSupport
import Synchronization
import Testing

/// Stress and edge cases of the group commit's hand-over (``WriteQueue/runInTurn(_:_:)``):
/// the closure of a caller in a task (or on an actor) runs on its own thread, that of a
/// plain thread on the leader's, in one group, with throws (the nested rerun), cancelled
/// tasks, map growth in the middle of a group, writes started inside a read, and pinned
/// (actor-isolated) writers. Every check ends with a counter written read-modify-write by
/// every closure: exactly the committed writes landed, once each.
@Suite struct GroupCommitHandoffTests {
    enum Context { @TaskLocal static var name = "none" }

    /// One writer of a round.
    struct Writer: Sendable, CustomStringConvertible {
        var onTask = true
        /// A task cancelled before it writes; its closure checks cancellation.
        var cancelled = false
        /// Its closure throws after writing.
        var throwing = false
        /// Starts its write inside `env.read`.
        var insideRead = false
        /// Starts a write inside its closure (refused as nested).
        var nestedWrite = false
        /// Reads inside its closure.
        var readInside = false
        /// Values of `valueSize` bytes it puts.
        var values = 1
        var valueSize = 16

        /// Whether its write must commit (one inside a read may be refused).
        var mustCommit: Bool { !cancelled && !throwing && !insideRead }
        var mustFail: Bool { cancelled || throwing }

        var description: String {
            var parts = [onTask ? "task" : "thread"]
            if cancelled { parts.append("cancelled") }
            if throwing { parts.append("throwing") }
            if insideRead { parts.append("insideRead") }
            if nestedWrite { parts.append("nestedWrite") }
            if readInside { parts.append("readInside") }
            if values > 1 { parts.append("\(values)x\(valueSize)B") }
            return parts.joined(separator: " ")
        }
    }

    /// What one writer saw: its error (nil: committed), and anything wrong inside its closure.
    struct Outcome: Sendable {
        var error: (any Error)?
        var problems: [String] = []
    }

    /// The closure of writer `i` of `round`: bumps the counter, puts its keys, and does what
    /// `w` asks. `caller` is the caller's thread when its closure must run there.
    static func body(_ env: Environment, _ main: Database, round: Int, _ i: Int, _ w: Writer, caller: pthread_t?,
                     problems: Failures) -> (WriteTransaction) throws -> Void {
        { txn in
            if let caller {
                if pthread_equal(pthread_self(), caller) == 0 { problems.add("ran on another thread") }
                if Context.name != "r\(round)w\(i)" { problems.add("saw task-local '\(Context.name)'") }
            }
            if w.cancelled { try Task.checkCancellation() }
            let old = try txn.get(main, key: b("counter")).map { Int(String(decoding: $0, as: UTF8.self))! } ?? 0
            try txn.put(main, key: b("counter"), value: b(String(old + 1)))
            for k in 0..<w.values {
                try txn.put(main, key: b("r\(round)w\(i)-\(k)"), value: Array(repeating: UInt8(truncatingIfNeeded: i), count: w.valueSize))
            }
            if w.nestedWrite {
                do {
                    try env.write { _ in }
                    problems.add("a write inside the closure ran")
                } catch let error as LMDBError where error.code == .nestedWrite {
                } catch {
                    problems.add("a write inside the closure: \(error)")
                }
            }
            if w.readInside {
                // A read of the last commit, on this thread, while the group's transaction is
                // open: it must neither wait nor see the group's changes.
                let seen = try env.read { r in try r.get(main, key: b("counter")) }
                let committed = seen.map { Int(String(decoding: $0, as: UTF8.self))! } ?? 0
                if committed > old { problems.add("read inside saw \(committed) > \(old)") }
            }
            if w.throwing { throw TestAbort() }
        }
    }

    /// Runs `writers` at once. With `heldFirst`, they all queue behind a write held open on
    /// another thread and are released together (one group); with `ordered`, each queues only
    /// once the one before it did (the first then leads the group).
    /// Slots set by several threads.
    final class Slots<T: Sendable>: Sendable {
        private let values: Mutex<[T?]>
        init(_ count: Int) { values = Mutex(Array(repeating: nil, count: count)) }
        func set(_ i: Int, _ value: T) { values.withLock { $0[i] = value } }
        var all: [T?] { values.withLock { $0 } }
    }

    static func runRound(_ env: Environment, round: Int, _ writers: [Writer], executor: ThreadPerJobExecutor,
                         heldFirst: Bool = true, ordered: Bool = false) async throws -> [Outcome] {
        let main = try env.database("main")
        let release = DoneFlag(), entered = DoneFlag(), heldDone = DoneFlag()
        if heldFirst {
            Thread {
                try? env.write { txn in
                    try txn.put(main, key: b("held"), value: b("\(round)"))
                    entered.set()
                    while !release.isSet { Thread.sleep(forTimeInterval: 0.0005) }
                }
                heldDone.set()
            }.start()
            while !entered.isSet { try await Task.sleep(for: .milliseconds(1)) }
        }
        let results = Slots<Outcome>(writers.count)
        let finished = DispatchGroup()
        for (i, w) in writers.enumerated() {
            let waitingBefore = env.waitingWrites
            finished.enter()
            let write: @Sendable (pthread_t?) -> Outcome = { caller in
                let problems = Failures()
                let body = Self.body(env, main, round: round, i, w, caller: caller, problems: problems)
                var error: (any Error)?
                do {
                    if w.insideRead {
                        try env.read { _ in
                            try env.write(body)
                            // The read is still usable after its write was refused or committed.
                            _ = try env.read { r in try r.get(main, key: b("counter")) }
                        }
                    } else {
                        try env.write(body)
                    }
                } catch let thrown {
                    error = thrown
                }
                return Outcome(error: error, problems: problems.all)
            }
            if w.onTask {
                Task(executorPreference: executor) {
                    if w.cancelled { withUnsafeCurrentTask { $0?.cancel() } }
                    let outcome = Context.$name.withValue("r\(round)w\(i)") { write(pthread_self()) }
                    results.set(i, outcome)
                    finished.leave()
                }
            } else {
                let thread = Thread {
                    let outcome = write(nil)
                    results.set(i, outcome)
                    finished.leave()
                }
                thread.stackSize = 4 << 20
                thread.start()
            }
            if ordered {
                let deadline = Date().addingTimeInterval(10)
                while env.waitingWrites <= waitingBefore, Date() < deadline { try await Task.sleep(for: .milliseconds(1)) }
            }
        }
        if heldFirst {
            let deadline = Date().addingTimeInterval(10)
            while env.waitingWrites < writers.count, Date() < deadline { try await Task.sleep(for: .milliseconds(1)) }
            #expect(env.waitingWrites == writers.count, "round \(round): the writers did not all queue behind the held write")
            release.set()
        }
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                finished.wait()
                done.resume()
            }
        }
        while heldFirst && !heldDone.isSet { try await Task.sleep(for: .milliseconds(1)) }
        return results.all.map { $0! }
    }

    /// Checks the outcomes of a round against the store; returns the number of committed
    /// writes, and appends what is wrong to `wrong` (prefixed with `context`).
    static func check(_ env: Environment, round: Int, _ writers: [Writer], _ outcomes: [Outcome],
                      context: String, wrong: inout [String]) throws -> Int {
        let main = try env.database("main")
        var committed = 0
        for (i, (w, outcome)) in zip(writers, outcomes).enumerated() {
            let label = "\(context) round \(round) writer \(i) (\(w))"
            wrong += outcome.problems.map { "\(label): \($0)" }
            let stored = try env.read { try $0.get(main, key: b("r\(round)w\(i)-0")) }
            if let error = outcome.error {
                if stored != nil { wrong.append("\(label): failed (\(error)), yet its change was committed") }
                if w.mustCommit { wrong.append("\(label): failed: \(error)") }
                if w.insideRead && !w.mustFail, (error as? LMDBError)?.code != .mapFull {
                    wrong.append("\(label): refused with \(error), not mapFull")
                }
                if w.cancelled && !(error is CancellationError) { wrong.append("\(label): \(error), not CancellationError") }
                if w.throwing && !w.cancelled && !(error is TestAbort) { wrong.append("\(label): \(error), not TestAbort") }
            } else {
                committed += 1
                if w.mustFail { wrong.append("\(label): committed") }
                if stored == nil { wrong.append("\(label): committed, yet its change is missing") }
                let count = try env.read { txn in
                    (0..<w.values).filter { k in (try? txn.get(main, key: b("r\(round)w\(i)-\(k)"))) != nil }.count
                }
                if count != w.values { wrong.append("\(label): \(count) of \(w.values) values stored") }
            }
        }
        return committed
    }

    static func storedCounter(_ env: Environment) throws -> Int {
        let main = try env.database("main")
        return try env.read { try $0.get(main, key: b("counter")) }.map { Int(String(decoding: $0, as: UTF8.self))! } ?? 0
    }

    static func randomWriter(_ rng: inout SeededGenerator, values: Int = 1, valueSize: Int = 16) -> Writer {
        var w = Writer()
        w.onTask = Int.random(in: 0..<3, using: &rng) != 0
        w.cancelled = w.onTask && Int.random(in: 0..<4, using: &rng) == 0
        w.throwing = Int.random(in: 0..<5, using: &rng) == 0
        w.nestedWrite = Int.random(in: 0..<8, using: &rng) == 0
        w.readInside = Int.random(in: 0..<6, using: &rng) == 0
        w.values = values
        w.valueSize = valueSize
        return w
    }

    /// Rounds of task and thread writers grouped behind a held write, some throwing (the group
    /// reruns nested), some cancelled, some starting a nested write or a read in their
    /// closure: exactly the writes that did not throw landed, once each.
    @Test(.timeLimit(.minutes(1))) func mixedGroupsCommitExactlyTheWritesThatDidNotThrow() async throws {
        let seed: UInt64 = 0x5EED_0001
        var rng = SeededGenerator(seed: seed)
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, durability: .none)
        let executor = ThreadPerJobExecutor()
        var wrong: [String] = []
        var committed = 0
        for round in 0..<40 {
            let writers = (0..<Int.random(in: 2...7, using: &rng)).map { _ in Self.randomWriter(&rng) }
            let outcomes = try await Self.runRound(env, round: round, writers, executor: executor, ordered: round % 4 == 3)
            committed += try Self.check(env, round: round, writers, outcomes, context: "seed \(seed)", wrong: &wrong)
        }
        #expect(try Self.storedCounter(env) == committed, "seed \(seed)")
        #expect(wrong.isEmpty, "seed \(seed): \(wrong.prefix(8))")
    }

    /// Groups of task writers that overflow a 1 MiB map: the map grows in the middle of the
    /// group (on the leader's thread, between turns), with throwing writers forcing the nested
    /// rerun, and reads inside closures.
    @Test(.timeLimit(.minutes(1))) func taskGroupsGrowATinyMapMidGroup() async throws {
        let seed: UInt64 = 0x5EED_0002
        var rng = SeededGenerator(seed: seed)
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, mapSize: 1 << 20, durability: .none)
        let startSize = env.info().mapSize
        let executor = ThreadPerJobExecutor()
        var wrong: [String] = []
        var committed = 0
        for round in 0..<10 {
            let writers = (0..<Int.random(in: 3...6, using: &rng)).map { _ in Self.randomWriter(&rng, values: 48, valueSize: 3000) }
            let outcomes = try await Self.runRound(env, round: round, writers, executor: executor, ordered: round % 2 == 1)
            committed += try Self.check(env, round: round, writers, outcomes, context: "seed \(seed)", wrong: &wrong)
        }
        #expect(env.info().mapSize > startSize)
        #expect(try Self.storedCounter(env) == committed, "seed \(seed)")
        #expect(wrong.isEmpty, "seed \(seed): \(wrong.prefix(8))")
    }

    /// A writer (task or thread) that starts its write inside a read, in a group that must
    /// grow the map: its write is refused (mapFull), never deadlocks, and the others commit,
    /// whether it leads the group (queued first) or follows.
    @Test(.timeLimit(.minutes(1))) func aWriteStartedInsideAReadIsRefusedWhenItsGroupMustGrowTheMap() async throws {
        let executor = ThreadPerJobExecutor()
        var wrong: [String] = []
        var round = 0
        for readerOnTask in [true, false] {
            for position in [0, 1, 3] {
                for throwing in [false, true] {
                    round += 1
                    let dir = TemporaryDirectory()
                    let env = try openEnvironment(dir.path, mapSize: 1 << 20, durability: .none)
                    // Writers of 96 values of 3000 bytes (an overflow page each): any 3 of
                    // them need more pages than the 1 MiB map has.
                    let startSize = env.info().mapSize
                    var writers = (0..<4).map { t in Writer(onTask: t % 2 == 0, values: 96, valueSize: 3000) }
                    writers[position].onTask = readerOnTask
                    writers[position].insideRead = true
                    writers[position].readInside = true
                    writers[(position + 2) % 4].throwing = throwing
                    let outcomes = try await Self.runRound(env, round: round, writers, executor: executor, ordered: true)
                    let context = "reader on \(readerOnTask ? "task" : "thread") at \(position)\(throwing ? ", one throwing" : "")"
                    let committed = try Self.check(env, round: round, writers, outcomes, context: context, wrong: &wrong)
                    // Whatever the order, the reader's group needs more than the map (it
                    // leads: it cannot grow it, and hands the others on; it follows: the
                    // leader refuses it before growing).
                    if outcomes[position].error == nil { wrong.append("\(context): the write inside a read committed") }
                    // The map grew, unless the reader led and refused only itself, leaving
                    // a thrower and two writers that fit.
                    if env.info().mapSize == startSize, !(position == 0 && throwing) { wrong.append("\(context): the map did not grow") }
                    #expect(try Self.storedCounter(env) == committed, "\(context)")
                }
            }
        }
        #expect(wrong.isEmpty, "\(wrong.prefix(8))")
    }

    /// Writers isolated to actors (pinned: they lead alone, and run their closure on their
    /// own thread when grouped behind another writer) mixed with task and thread writers.
    @Test(.timeLimit(.minutes(1))) func actorIsolatedWritersMixWithTaskAndThreadWriters() async throws {
        actor Recorder {
            var ran = 0
            func write(_ env: Environment, _ main: Database, key: String, fail: Bool) throws -> [String] {
                var problems: [String] = []
                let caller = pthread_self()
                try env.write { txn in
                    self.ran += 1
                    if pthread_equal(pthread_self(), caller) == 0 { problems.append("ran on another thread") }
                    let old = try txn.get(main, key: b("counter")).map { Int(String(decoding: $0, as: UTF8.self))! } ?? 0
                    try txn.put(main, key: b("counter"), value: b(String(old + 1)))
                    try txn.put(main, key: b(key), value: b("x"))
                    if fail { throw TestAbort() }
                }
                return problems
            }
        }
        let seed: UInt64 = 0x5EED_0004
        var rng = SeededGenerator(seed: seed)
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, durability: .none)
        let main = try env.database("main")
        let executor = ThreadPerJobExecutor()
        let actors = (0..<3).map { _ in Recorder() }
        let failing = (0..<3).map { _ in (0..<30).map { _ in Int.random(in: 0..<6, using: &rng) == 0 } }
        let plainFailing = (0..<4).map { _ in (0..<30).map { _ in Int.random(in: 0..<6, using: &rng) == 0 } }
        let wrong = Failures()
        let plain = Task(executorPreference: executor) {
            await withTaskGroup(of: Void.self) { group in
                for t in 0..<4 {
                    group.addTask(executorPreference: executor) {
                        for k in 0..<30 {
                            let write: @Sendable () -> Void = {
                                do {
                                    try env.write { txn in
                                        let old = try txn.get(main, key: b("counter")).map { Int(String(decoding: $0, as: UTF8.self))! } ?? 0
                                        try txn.put(main, key: b("counter"), value: b(String(old + 1)))
                                        try txn.put(main, key: b("p\(t)-\(k)"), value: b("x"))
                                        if plainFailing[t][k] { throw TestAbort() }
                                    }
                                    if plainFailing[t][k] { wrong.add("plain \(t) write \(k): committed") }
                                } catch {
                                    if !plainFailing[t][k] { wrong.add("plain \(t) write \(k): \(error)") }
                                }
                            }
                            if t % 2 == 0 {
                                write()
                            } else {
                                // From a plain thread: its closure runs on the leader's thread.
                                let done = DispatchSemaphore(value: 0)
                                Thread { write(); done.signal() }.start()
                                done.wait()
                            }
                        }
                    }
                }
            }
        }
        let pinned = actors.enumerated().map { a, recorder in
            Task(executorPreference: executor) {
                for k in 0..<30 {
                    do {
                        let problems = try await recorder.write(env, main, key: "a\(a)-\(k)", fail: failing[a][k])
                        problems.forEach { wrong.add("actor \(a) write \(k): \($0)") }
                        if failing[a][k] { wrong.add("actor \(a) write \(k): committed") }
                    } catch {
                        if !failing[a][k] { wrong.add("actor \(a) write \(k): \(error)") }
                    }
                }
            }
        }
        await plain.value
        for task in pinned { await task.value }
        try env.read { txn in
            for t in 0..<4 {
                for k in 0..<30 {
                    let stored = try txn.get(main, key: b("p\(t)-\(k)")) != nil
                    if stored == plainFailing[t][k] { wrong.add("plain \(t) write \(k): stored \(stored ? "a" : "no") change") }
                }
            }
            for a in 0..<3 {
                for k in 0..<30 {
                    let stored = try txn.get(main, key: b("a\(a)-\(k)")) != nil
                    if stored == failing[a][k] { wrong.add("actor \(a) write \(k): stored \(stored ? "a" : "no") change") }
                }
            }
        }
        let expected = plainFailing.joined().filter { !$0 }.count + failing.joined().filter { !$0 }.count
        #expect(try Self.storedCounter(env) == expected, "seed \(seed)")
        #expect(wrong.all.isEmpty, "seed \(seed): \(wrong.all.prefix(8))")
    }

    /// No held write: task and thread writers hammer the queue, so groups form, lead and
    /// hand on however the threads meet, with throws and cancellations throughout.
    @Test(.timeLimit(.minutes(1))) func freeForAllTaskAndThreadWritersLandOnceEach() async throws {
        let seed: UInt64 = 0x5EED_0005
        var rng = SeededGenerator(seed: seed)
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, mapSize: 1 << 20, durability: .none)
        let executor = ThreadPerJobExecutor()
        let writersCount = 8, writes = 80
        let plans: [[Writer]] = (0..<writersCount).map { t in
            (0..<writes).map { _ in
                var w = Self.randomWriter(&rng, values: Int.random(in: 1...8, using: &rng), valueSize: 2000)
                w.onTask = t % 3 != 2
                if !w.onTask { w.cancelled = false }
                return w
            }
        }
        let outcomes = Slots<Outcome>(writersCount * writes)
        let main = try env.database("main")
        let finished = DispatchGroup()
        for t in 0..<writersCount {
            finished.enter()
            let run: @Sendable (Bool) -> Void = { inTask in
                for k in 0..<writes {
                    let w = plans[t][k]
                    let round = t * 1000 + k
                    let problems = Failures()
                    let body = Self.body(env, main, round: round, 0, w, caller: inTask ? pthread_self() : nil, problems: problems)
                    var error: (any Error)?
                    do { try env.write(body) } catch let thrown { error = thrown }
                    let outcome = Outcome(error: error, problems: problems.all)
                    outcomes.set(t * writes + k, outcome)
                }
                finished.leave()
            }
            if plans[t][0].onTask {
                Task(executorPreference: executor) {
                    // Each write in a task of its own, so that some can be cancelled.
                    for k in 0..<writes {
                        let w = plans[t][k]
                        let round = t * 1000 + k
                        let outcome = await Task(executorPreference: executor) { () -> Outcome in
                            if w.cancelled { withUnsafeCurrentTask { $0?.cancel() } }
                            return Context.$name.withValue("r\(round)w0") {
                                let problems = Failures()
                                let body = Self.body(env, main, round: round, 0, w, caller: pthread_self(), problems: problems)
                                var error: (any Error)?
                                do { try env.write(body) } catch let thrown { error = thrown }
                                return Outcome(error: error, problems: problems.all)
                            }
                        }.value
                        outcomes.set(t * writes + k, outcome)
                    }
                    finished.leave()
                }
            } else {
                let thread = Thread { run(false) }
                thread.stackSize = 4 << 20
                thread.start()
            }
        }
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                finished.wait()
                done.resume()
            }
        }
        var wrong: [String] = []
        var committed = 0
        let all = outcomes.all
        for t in 0..<writersCount {
            for k in 0..<writes {
                committed += try Self.check(env, round: t * 1000 + k, [plans[t][k]], [all[t * writes + k]!], context: "seed \(seed)", wrong: &wrong)
            }
        }
        #expect(try Self.storedCounter(env) == committed, "seed \(seed)")
        #expect(wrong.isEmpty, "seed \(seed): \(wrong.prefix(8))")
    }
}
