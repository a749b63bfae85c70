import Foundation
import Synchronization

/// Problems found on background threads, asserted on the test's own task afterwards
/// (an `#expect` on a raw thread is not attributed to the running test).
public final class Failures: Sendable {
    private let list = Mutex<[String]>([])
    public init() {}
    public func add(_ message: String) { list.withLock { $0.append(message) } }
    public var all: [String] { list.withLock { $0 } }
}

/// A flag set once by one thread and polled by others.
public final class DoneFlag: Sendable {
    private let value = Atomic<Bool>(false)
    public init() {}
    public func set() { value.store(true, ordering: .releasing) }
    public var isSet: Bool { value.load(ordering: .acquiring) }
}

/// Runs `body(0..<count)` on `count` real threads at once and waits for all of them.
public func onThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let group = DispatchGroup()
    for i in 0..<count {
        group.enter()
        let thread = Thread {
            body(i)
            group.leave()
        }
        thread.stackSize = 4 << 20
        thread.start()
    }
    group.wait()
}

/// Runs each job of a task on a new thread of its own: tasks that block (in a write that
/// waits for the disk, or for a held write) then do not hold the concurrency pool's few
/// threads (two on a two-core machine), and as many of them as a test needs can wait at once.
/// Use with `Task(executorPreference:)`.
public final class ThreadPerJobExecutor: TaskExecutor {
    public init() {}

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        let thread = Thread { job.runSynchronously(on: executor) }
        thread.stackSize = 4 << 20
        thread.start()
    }
}

/// The names of this process's threads as the OS knows them (`/proc/self/task/*/comm` on
/// Linux; empty elsewhere).
public func osThreadNames() -> [String] {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    return tasks.compactMap { tid in
        (try? String(contentsOfFile: "/proc/self/task/\(tid)/comm", encoding: .utf8))?.trimmingCharacters(in: .newlines)
    }
}
