import Foundation
import Stash
import StashGate
import StashTestSupport
import Testing

/// Closing the store a gate is built on ends the gate's background work.
@Suite struct GateCloseTests {
    /// `gate.updates()` ends once the store is closed, and its poller thread with it.
    @Test func closingTheStoreEndsTheGatesUpdates() async throws {
        let f = try Fixture()
        let gate = f.gate
        let ended = Task { () -> Int in
            var seen = 0
            for await _ in gate.updates() { seen += 1 }
            return seen
        }
        let started = Date().addingTimeInterval(60)
        while !osThreadNames().contains("stash.gate"), Date() < started { try await Task.sleep(for: .milliseconds(5)) }
        try f.store.close()
        #expect(await ended.value >= 1)   // the sequence ended by itself: no cancel
        let gone = Date().addingTimeInterval(10)
        while osThreadNames().contains("stash.gate"), Date() < gone { try await Task.sleep(for: .milliseconds(5)) }
        #expect(!osThreadNames().contains("stash.gate"))
        let error = #expect(throws: GateError.self) { try gate.apply(try signed([], sequence: 2)) }
        #expect(error?.message.contains("closed") == true, "\(error?.message ?? "")")
    }
}
