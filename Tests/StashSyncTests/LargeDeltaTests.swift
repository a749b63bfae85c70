import Crypto
import Foundation
import Stash
@testable import StashLMDB
import StashSync
import Synchronization
import Testing
import StashTestSupport

/// Deltas of 512 entries or more are read on a thread of their own while the import merges
/// the entries before (`DeltaEntryStream`). What is wrong late in such a delta is found after
/// part of it is merged, inside the transaction: it must still leave the store unchanged.
@Suite struct LargeDeltaTests {
    let family = RecordID()
    /// Above the streaming threshold, and several of its batches.
    let noteCount = 1_500

    /// A store of `noteCount` notes and the delta of all of them (no key, for any store).
    private func source(in dir: TemporaryDirectory) throws -> (Device, Data) {
        let a = try Device.open(dir.sub("a"), family: family)
        try a.store.write { tx in
            for n in 0..<noteCount { try tx.insert(Note(title: "note \(n)", body: String(repeating: "b", count: n % 40), tag: n % 3 == 0 ? "t" : nil)) }
        }
        let delta = try a.engine.makeDelta(for: nil)
        #expect(delta.entries.count == noteCount)
        return (a, delta.encoded())
    }

    @Test func anUnreadableEndOfALargeDeltaLeavesTheStoreUnchanged() throws {
        let dir = TemporaryDirectory()
        let (a, good) = try source(in: dir)
        let b = try Device.open(dir.sub("b"), family: family)
        try b.store.insert(Note(title: "b's own", body: ""))
        let before = try canonicalDump(b.store)
        let historyBefore = try b.store.history().count

        // Intact (the checksum matches) but one byte after the last entry's section: what the
        // reader finds only once every entry has been read, and most of them merged.
        var bytes = [UInt8](good.dropLast(32))
        bytes.append(0)
        bytes.append(contentsOf: SHA256.hash(data: bytes))
        do {
            try b.engine.apply(Data(bytes))
            Issue.record("a delta with a byte after its entries was applied")
        } catch let error as SyncError {
            #expect(error.code == .unreadableDelta)
            #expect(error.message.contains("unexpected bytes after the entries"), "\(error)")
        }
        #expect(try canonicalDump(b.store) == before)
        #expect(try b.store.history().count == historyBefore)
        #expect(try b.store.count(Note.self) == 1)

        // The intact delta still applies in full afterwards: the failed one moved no watermark.
        #expect(try b.engine.apply(good) == .applied(entries: noteCount, changed: noteCount))
        #expect(try b.store.count(Note.self) == noteCount + 1)
        let mine = try canonicalDump(b.store).filter { !$0.contains("b's own") }
        #expect(mine == (try canonicalDump(a.store)))
        #expect(try b.engine.apply(good) == .duplicate)
    }

    /// A group commit runs its writers' closures in one transaction and, when one of them
    /// throws, runs each again in a transaction of its own. An import's second run must merge
    /// the entries its first run took from the reader: a rerun that found the reader at its end
    /// merged nothing and still moved the watermark past the delta, losing it for good.
    @Test func aLargeImportRunAgainByItsGroupCommitMergesEverything() throws {
        let dir = TemporaryDirectory()
        let (a, good) = try source(in: dir)
        let b = try Device.open(dir.sub("b"), family: family)
        let env = try Environment.open(path: b.path)
        let release = DoneFlag(), entered = DoneFlag()
        let holder = Thread {
            try? b.store.write { tx in
                try tx.insert(Note(title: "held", body: ""))
                entered.set()
                while !release.isSet { Thread.sleep(forTimeInterval: 0.001) }
            }
        }
        holder.start()
        while !entered.isSet { Thread.sleep(forTimeInterval: 0.001) }
        struct Refused: Error {}
        let outcome = Mutex<String>("not run"), refusal = Mutex<String>("not run")
        let done = DispatchGroup()
        done.enter()
        Thread {
            outcome.withLock { $0 = (try? b.engine.apply(good)).map { "\($0)" } ?? "failed" }
            done.leave()
        }.start()
        func waitFor(_ writes: Int) {
            let deadline = Date().addingTimeInterval(10)
            while env.waitingWrites < writes, Date() < deadline { Thread.sleep(forTimeInterval: 0.001) }
        }
        waitFor(1)
        done.enter()
        Thread {
            do {
                try b.store.write { tx in
                    try tx.insert(Note(title: "refused", body: ""))
                    throw Refused()
                }
                refusal.withLock { $0 = "committed" }
            } catch {
                refusal.withLock { $0 = "\(error)" }
            }
            done.leave()
        }.start()
        waitFor(2)
        #expect(env.waitingWrites == 2, "the import and the refused write did not both queue behind the held write")
        release.set()
        done.wait()

        #expect(outcome.withLock { $0 } == "\(ApplyOutcome.applied(entries: noteCount, changed: noteCount))")
        #expect(refusal.withLock { $0 }.contains("Refused"))
        #expect(try b.store.count(Note.self) == noteCount + 1)
        let imported = try canonicalDump(b.store).filter { !$0.contains("\"held\"") }
        #expect(imported == (try canonicalDump(a.store)))
    }

    /// A receiver whose schema differs (here a type more) checks every entry against it before
    /// merging: the streamed entries are read in full first, then merged.
    @Test func aLargeDeltaForAnotherSchemaIsCheckedWholeThenApplied() throws {
        let dir = TemporaryDirectory()
        let (a, good) = try source(in: dir)
        let b = try Device.open(dir.sub("b"), family: family, types: syncTypes + [Memo.self])
        #expect(try b.engine.apply(good) == .applied(entries: noteCount, changed: noteCount))
        #expect(try canonicalDump(b.store) == (try canonicalDump(a.store)))

        // A field unknown there is carried: everything applies, and travels on.
        let c = try Device.open(dir.sub("c"), family: family, types: [NoteWithoutTag.self, Wallet.self, UserProfile.self, DeviceSecret.self])
        #expect(try c.engine.apply(good) == .applied(entries: noteCount, changed: noteCount))
        #expect(try c.store.count(NoteWithoutTag.self) == noteCount)
        let d = try Device.open(dir.sub("d"), family: family)
        #expect(try d.engine.apply(c.engine.makeDelta(for: d.store.siteID).encoded()) == .applied(entries: noteCount, changed: noteCount))
        #expect(try canonicalDump(d.store) == (try canonicalDump(a.store)))

        // One that cannot merge (a field required there that the notes lack) is parked whole,
        // nothing merged.
        let e = try Device.open(dir.sub("e"), family: family, types: [NoteRequiringPriority.self, Wallet.self, UserProfile.self, DeviceSecret.self])
        guard case .parked = try e.engine.apply(good) else {
            Issue.record("a delta lacking a field required here was not parked")
            return
        }
        #expect(try e.store.count(NoteRequiringPriority.self) == 0)
    }
}
