import Dispatch

/// Runs a task's jobs on a serial dispatch queue of its own, off Swift's cooperative pool.
///
/// A full `swift test` run keeps every thread of the pool busy with synchronous tests for
/// minutes (two threads on a two-core machine); a test that waits for a delivery (a gate's
/// `updates()`, a timer) and runs its waiting on the pool is then resumed only when the run
/// is nearly over. Such a test runs its body with
/// `withTaskExecutorPreference(QueueTaskExecutor.shared) { … }` (and passes the executor to
/// any `Task` it starts: unstructured tasks do not inherit the preference).
public final class QueueTaskExecutor: TaskExecutor, Sendable {
    /// One queue for all the tests that ask for it.
    public static let shared = QueueTaskExecutor(label: "stash.tests.off-pool")

    private let queue: DispatchQueue

    public init(label: String) {
        queue = DispatchQueue(label: label)
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}
