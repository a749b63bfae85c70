import Foundation
import Stash
import StashSync
import Testing
import StashTestSupport

/// Closing a store ends the sync engines built on it.
@Suite struct SyncCloseTests {
    @Test func aClosedStoresEngineThrowsClosedAndItsBackgroundSyncEnds() async throws {
        let dir = TemporaryDirectory()
        let family = RecordID()
        let a = try Device.open(dir.sub("a"), family: family)
        let b = try Device.open(dir.sub("b"), family: family)
        try a.store.insert(Note(title: "t", body: "b"))
        let background = a.engine.startBackgroundSync(via: DirectTransport(to: b.engine), every: .milliseconds(20))
        let synced = Date().addingTimeInterval(30)
        while try b.store.count(Note.self) == 0, Date() < synced { try await Task.sleep(for: .milliseconds(5)) }
        #expect(try b.store.count(Note.self) == 1)
        try a.store.close()
        await background.value   // ends by itself, without a cancel
        let error = await #expect(throws: StoreError.self) { try await a.engine.sync(via: DirectTransport(to: b.engine)) }
        #expect(error?.code == .closed)
        #expect(try b.store.count(Note.self) == 1)
    }
}
