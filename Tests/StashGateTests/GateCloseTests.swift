import Synchronization
import Foundation
import Stash
import StashGate
import StashTestSupport
import Testing

/// Closing the store a gate is built on ends the gate's background work.
@Suite struct GateCloseTests {
    /// `gate.updates()` ends once the store is closed, and its poller thread with it.
    /// Runs off the concurrency pool (``QueueTaskExecutor``), as the update tests do: a full
    /// run's synchronous tests keep the pool busy for minutes.
    @Test func closingTheStoreEndsTheGatesUpdates() async throws {
        try await withTaskExecutorPreference(QueueTaskExecutor.shared) {
            let f = try Fixture()
            let gate = f.gate
            let seen = Mutex(0)
            let ended = Task(executorPreference: QueueTaskExecutor.shared) { () -> Int in
                for await _ in gate.updates() { seen.withLock { $0 += 1 } }
                return seen.withLock { $0 }
            }
            // The first element (the current entitlement) has arrived: the sequence is running.
            let first = Date().addingTimeInterval(300)
            while seen.withLock({ $0 }) == 0, Date() < first { try await Task.sleep(for: .milliseconds(5)) }
            #expect(osThreadNames().contains("stash.gate"), "\(osThreadNames())")
            try f.store.close()
            #expect(await ended.value >= 1)   // the sequence ended by itself: no cancel
            let gone = Date().addingTimeInterval(10)
            while osThreadNames().contains("stash.gate"), Date() < gone { try await Task.sleep(for: .milliseconds(5)) }
            #expect(!osThreadNames().contains("stash.gate"))
            let error = #expect(throws: GateError.self) { try gate.apply(try signed([], sequence: 2)) }
            #expect(error?.message.contains("closed") == true, "\(error?.message ?? "")")
        }
    }
}
