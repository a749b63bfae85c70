import Foundation
import Synchronization

/// Threads of the library's own for work that blocks (a commit waiting for the disk, a read
/// that may fault pages in), so that the async API never holds a thread of Swift's
/// cooperative pool (one per core) or the main thread while it waits.
///
/// Threads are started on demand, up to ``maximumThreads``, and one that finds no job for
/// ``idleLifetime`` ends. Jobs run in submission order as threads free up. Several threads
/// committing at once are grouped by the environment's group commit into one transaction
/// and one sync: the cap is also the largest group the async writers of a process form.
final class BlockingWorkers: @unchecked Sendable {
    static let shared = BlockingWorkers()

    /// The most threads running jobs at once.
    let maximumThreads = 32
    /// How long a thread without work waits for a job before it ends.
    let idleLifetime: TimeInterval = 5

    private let condition = NSCondition()
    /// Under `condition` only.
    private var jobs: [() -> Void] = []
    private var head = 0
    private var threads = 0
    private var idle = 0

    /// Runs `job` on one of the workers' threads, soon. Never blocks.
    func submit(_ job: @escaping @Sendable () -> Void) {
        condition.lock()
        jobs.append(job)
        // Enough threads waiting for the jobs not taken yet (those woken for earlier jobs
        // have not taken them yet): one more wake-up serves this job.
        if jobs.count - head <= idle {
            condition.signal()
            condition.unlock()
            return
        }
        let start = threads < maximumThreads
        if start { threads += 1 }
        condition.unlock()
        if start { startThread() }
    }

    private func startThread() {
        startNamedThread("stash.worker", stackSize: 1 << 20) { [self] in work() }
    }

    private func work() {
        condition.lock()
        while true {
            if head < jobs.count {
                let job = jobs[head]
                head += 1
                if head == jobs.count {
                    jobs.removeAll(keepingCapacity: true)
                    head = 0
                }
                condition.unlock()
                job()
                condition.lock()
                continue
            }
            idle += 1
            let woken = condition.wait(until: Date(timeIntervalSinceNow: idleLifetime))
            idle -= 1
            if !woken && head == jobs.count {
                threads -= 1
                condition.unlock()
                return
            }
        }
    }
}
