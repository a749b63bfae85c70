import Foundation
import Stash
import StashGate
import StashTestSupport
import Testing

/// `gate.updates()`: real-time unlock and lock.
@Suite struct UpdatesTests {
    /// Collects published changes on a task until cancelled. The tests and their collecting
    /// tasks run on ``QueueTaskExecutor``: on the concurrency pool, which the synchronous tests
    /// of a full run keep busy, they would be resumed only when the run nears its end. Waits
    /// stay long for a loaded machine; detection times are checked with
    /// ``EntitlementChange/detectedAt``.
    final class Collector: @unchecked Sendable {
        private let lock = NSLock()
        private var changes: [(Date, EntitlementChange)] = []
        func add(_ change: EntitlementChange) { lock.lock(); changes.append((Date(), change)); lock.unlock() }
        var all: [(at: Date, change: EntitlementChange)] { lock.lock(); defer { lock.unlock() }; return changes.map { ($0.0, $0.1) } }

        func wait(for count: Int, timeout: TimeInterval = 300) async -> Bool {
            let deadline = Date().addingTimeInterval(timeout)
            // Checked after every wake, the last one included (a task woken past the deadline
            // by a busy pool judges what arrived meanwhile).
            while true {
                if all.count >= count { return true }
                if Date() >= deadline { return false }
                try? await Task.sleep(for: .milliseconds(10))
            }
        }
    }

    @Test func snapshotsAppliedHereOrElsewherePublishAChange() async throws {
        try await withTaskExecutorPreference(QueueTaskExecutor.shared) {
            let f = try Fixture()
            let collector = Collector()
            let gate = f.gate
            let task = Task(executorPreference: QueueTaskExecutor.shared) { for await change in gate.updates() { collector.add(change) } }
            defer { task.cancel() }
            #expect(await collector.wait(for: 1))
            try #require(collector.all.count >= 1)
            #expect(collector.all[0].change.tier == .free)
            // The poller's thread carries its name to the OS (`top -H`, debuggers).
            let named = Date().addingTimeInterval(5)
            while !osThreadNames().contains("stash.gate"), Date() < named { try await Task.sleep(for: .milliseconds(5)) }
            #expect(osThreadNames().contains("stash.gate"), "\(osThreadNames())")
            try gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)]))
            #expect(await collector.wait(for: 2))
            try #require(collector.all.count >= 2)
            #expect(collector.all[1].change.tier == .premium)
            #expect(collector.all[1].change.entitlement.reason == .verified)
            // Another gate (as another process would) caches a newer snapshot: picked up too.
            let other = try FeatureGate.open(f.store, configuration: f.configuration)
            try other.apply(try signed([], sequence: 2))
            #expect(await collector.wait(for: 3))
            try #require(collector.all.count >= 3)
            #expect(collector.all[2].change.tier == .free)
            #expect(collector.all[2].change.entitlement.snapshotSequence == 2)
            #expect(collector.all.count == 3)
        }
    }

    @Test func anExpiryIsPublishedWithinOneSecond() async throws {
        try await withTaskExecutorPreference(QueueTaskExecutor.shared) {
            let f = try Fixture()
            // The real clock; the subscription ends 2 s after it is applied.
            let gate = try f.relaunch { $0.clock = nil }
            let collector = Collector()
            let task = Task(executorPreference: QueueTaskExecutor.shared) { for await change in gate.updates() { collector.add(change) } }
            defer { task.cancel() }
            #expect(await collector.wait(for: 1))
            let now = Date()
            let expiry = Date(timeIntervalSince1970: (now.timeIntervalSince1970 * 1000).rounded(.down) / 1000 + 2)
            var transaction = Tx.subscription("t1", expires: 0)
            transaction.expiresAt = expiry
            try gate.apply(try signer.sign(EntitlementSnapshot(userID: "u1", sequence: 1, serverTime: now, transactions: [transaction])))
            #expect(await collector.wait(for: 3))
            let all = collector.all
            let premium = all.firstIndex { $0.change.tier == .premium }
            let expired = all.firstIndex { $0.change.entitlement.status.state == .expired }
            try #require(premium != nil && expired != nil, "\(all.map(\.change))")
            #expect(premium! < expired!)
            #expect(all[expired!].change.tier == .free)
            // Detection time (delivery can wait for a free thread of the test run's busy pool).
            let delay = all[expired!].change.detectedAt.timeIntervalSince(expiry)
            #expect(delay >= 0 && delay < 1, "noticed \(delay) s after the expiry")
        }
    }

    @Test func injectedClockExpiryIsPublished() async throws {
        try await withTaskExecutorPreference(QueueTaskExecutor.shared) {
            let f = try Fixture { $0.updatePollInterval = .milliseconds(20) }
            try f.gate.apply(try signed([Tx.subscription("t1", expires: day)]))
            let collector = Collector()
            let gate = f.gate
            let task = Task(executorPreference: QueueTaskExecutor.shared) { for await change in gate.updates() { collector.add(change) } }
            defer { task.cancel() }
            #expect(await collector.wait(for: 1))
            f.clock.set(instant(day - 1))
            try await Task.sleep(for: .milliseconds(100))
            #expect(collector.all.count == 1)
            f.clock.set(instant(day))
            #expect(await collector.wait(for: 2))
            try #require(collector.all.count >= 2)
            #expect(collector.all[1].change.tier == .free)
        }
    }
}
