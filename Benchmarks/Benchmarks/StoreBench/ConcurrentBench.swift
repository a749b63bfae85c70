import Benchmark
import Foundation
import Stash
import Synchronization

// Durable small writes from several threads at once: the case group commit is for.
//
// One iteration: `writers` threads each insert `perWriter` items, one commit per item, on
// each engine in turn (interleaved, see `Trio`); the time is until the last thread is done.
// Stash and raw LMDB (through StashLMDB, so it gets group commit as well) commit the
// writers that queue behind a commit together, with one sync; GRDB serializes the writes
// on its writer queue, one transaction and (at FULL) one WAL sync each.

enum ConcurrentWrites {
    static let writers = 8
    static let perWriter = 16
    /// Commits per engine per iteration.
    static var commits: Int { writers * perWriter }
}

/// Runs `body(thread)` on `count` new threads and waits for all; rethrows the first error.
func runOnThreads(_ count: Int, _ body: @escaping @Sendable (Int) throws -> Void) throws {
    let group = DispatchGroup()
    let firstError = Mutex<(any Error)?>(nil)
    for t in 0..<count {
        group.enter()
        Thread {
            do { try body(t) } catch { firstError.withLock { if $0 == nil { $0 = error } } }
            group.leave()
        }.start()
    }
    group.wait()
    if let error = firstError.withLock({ $0 }) { throw error }
}

/// Items of one iteration, handed to the writer threads (read-only while they run).
final class ItemBatch: @unchecked Sendable {
    let items: [Item]
    init(_ items: [Item]) { self.items = items }
}

/// Runs `body(task)` in `count` tasks, each on a thread of its own (a task that blocks in a
/// write would otherwise hold one of the concurrency pool's few threads: two on two cores),
/// and waits for all; rethrows the first error.
func runInTasks(_ count: Int, _ body: @escaping @Sendable (Int) throws -> Void) throws {
    let group = DispatchGroup()
    let firstError = FirstError()
    for t in 0..<count {
        group.enter()
        Task(executorPreference: ThreadPerJob.executor) {
            do { try body(t) } catch { firstError.keep(error) }
            group.leave()
        }
    }
    group.wait()
    if let error = firstError.error { throw error }
}

/// The first error of several tasks.
final class FirstError: Sendable {
    private let first = Mutex<(any Error)?>(nil)
    func keep(_ error: any Error) { first.withLock { if $0 == nil { $0 = error } } }
    var error: (any Error)? { first.withLock { $0 } }
}

/// A task executor running each job on a new thread of its own.
final class ThreadPerJob: TaskExecutor {
    static let executor = ThreadPerJob()

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        Thread { job.runSynchronously(on: executor) }.start()
    }
}

/// `writers × perWriter` single-item commits on each engine, into a copy of the N-item fixture,
/// from threads, or (`inTasks`) from Swift tasks: a grouped Stash write closure of a caller in
/// a task runs on that caller's thread (its task's `@TaskLocal` values and cancellation), which
/// costs a thread switch per grouped write.
func registerConcurrentInsert(n: Int, sync: SyncLevel, inTasks: Bool = false) {
    let t = Trio()
    // The variant says "<durability> <writers>x<commits per writer>"; BenchReport reads it.
    let group = inTasks ? "concurrenttasks" : "concurrent"
    let name = "\(group)/all/\(sync.rawValue) \(ConcurrentWrites.writers)x\(ConcurrentWrites.perWriter)/\(BenchConfig.label(n))"
    Benchmark(name, configuration: Budget.concurrent) { benchmark in
        let batch = ItemBatch((t.nextItem..<t.nextItem + ConcurrentWrites.commits).map { Workload.item($0, homes: t.homes) })
        t.nextItem += ConcurrentWrites.commits
        try t.each(benchmark) { engine in
            let shared = UncheckedEngine(engine)
            try (inTasks ? runInTasks : runOnThreads)(ConcurrentWrites.writers) { w in
                for k in 0..<ConcurrentWrites.perWriter {
                    try shared.engine.insert(batch.items[w * ConcurrentWrites.perWriter + k])
                }
            }
        }
    } setup: {
        t.homes = Workload.homeCount(items: n)
        t.nextItem = n
        try t.open(sync: sync) { type in try Fixtures.copy(type, items: n, name: "\(group)-\(type.name)-\(sync)") }
        Fixtures.settle()
    } teardown: {
        // Every commit must have landed exactly once on every engine.
        let expected = t.nextItem
        for engine in t.engines {
            let got = try engine.itemCount()
            guard got == expected else {
                throw BenchError("\(name): \(type(of: engine).name) holds \(got) items, expected \(expected)")
            }
        }
        t.close()
    }
}

/// An engine shared with the writer threads: every engine's insert is safe to call from
/// several threads at once (Stash and StashLMDB serialize writers; GRDB's pool does).
struct UncheckedEngine: @unchecked Sendable {
    let engine: any Engine
    init(_ engine: any Engine) { self.engine = engine }
}
