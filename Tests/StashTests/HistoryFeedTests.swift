import Foundation
import Stash
import StashLMDB
import Testing
import StashTestSupport

private struct Abort: Error {}

@Suite struct HistoryFeedTests {
    /// Replaying the history reconstructs exactly which records exist, for random write
    /// sequences; aborted transactions leave no entry.
    @Test(arguments: [11, 2024, 77_777] as [UInt64])
    func replayReconstructsTheStore(seed: UInt64) throws {
        var rng = SeededGenerator(seed: seed)
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        try store.insert(home)
        var live: [RecordID: Item] = [:]
        var committedNonEmpty = 1
        for step in 0..<120 {
            let abort = Int.random(in: 0..<6, using: &rng) == 0
            var changed = false
            do {
                try store.write { tx in
                    changed = false
                    var local = live
                    for _ in 0..<Int.random(in: 1...4, using: &rng) {
                        switch Int.random(in: 0..<4, using: &rng) {
                        case 0, 1:
                            let item = Item(homeID: home.id, name: "i\(step)", category: "c", wearCount: step, price: 1)
                            try tx.insert(item)
                            local[item.id] = item
                            changed = true
                        case 2:
                            if let id = local.keys.sorted().randomElement(using: &rng) {
                                var item = local[id]!
                                item.wearCount += 1
                                try tx.update(item)
                                local[id] = item
                                changed = true
                            }
                        default:
                            if let id = local.keys.sorted().randomElement(using: &rng) {
                                try tx.delete(Item.self, id: id)
                                local[id] = nil
                                changed = true
                            }
                        }
                    }
                    if abort { throw Abort() }
                    live = local
                }
                if changed { committedNonEmpty += 1 }
            } catch is Abort {}
        }
        let history = try store.history()
        #expect(history.count == committedNonEmpty, "seed \(seed)")
        var replayed = Set<RecordID>()
        for entry in history {
            for change in entry.changes where change.type == "Item" {
                if change.operation == .delete { replayed.remove(change.id) } else { replayed.insert(change.id) }
            }
        }
        #expect(replayed == Set(live.keys), "seed \(seed): replay differs from the store")
        #expect(Set(try store.fetch(FetchDescriptor<Item>()).map(\.id)) == Set(live.keys), "seed \(seed)")
        #expect(try store.verify().isClean, "seed \(seed)")
    }

    @Test func sequenceNumbersSurviveReopenAndPurge() throws {
        let dir = TemporaryDirectory()
        var sequences: [UInt64] = []
        for round in 0..<3 {
            let store = try Store.open(at: dir.path, types: [Home.self])
            for n in 0..<4 { try store.insert(Home(name: "r\(round)-\(n)")) }
            sequences += try store.history(after: try store.oldestAvailableToken()).map(\.sequence)
            if round == 1 { try store.purgeHistory(before: try store.currentToken()) }
        }
        let unique = Array(Set(sequences)).sorted()
        #expect(unique == Array(1...12))
        let store = try Store.open(at: dir.path, types: [Home.self])
        #expect(try store.oldestAvailableToken() == HistoryToken(sequence: 8))
        #expect(try store.history(after: HistoryToken(sequence: 8)).map(\.sequence) == [9, 10, 11, 12])
        #expect(try store.verify().isClean)
    }

    /// Tokens past the newest entry (another store's, or this store's before it was restored
    /// from an older copy) were read as "nothing new", and `UInt64.max` wrapped to the whole
    /// history; a limit of 0 returned one entry; a consumer could be registered past the
    /// newest entry, letting purge take entries it had not read.
    @Test func tokensPastTheNewestEntryAreRefused() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        for n in 0..<3 { try store.insert(Home(name: "\(n)")) }
        let current = try store.currentToken()
        #expect(try store.history(after: current).isEmpty)
        for ahead in [HistoryToken(sequence: current.sequence + 1), HistoryToken(sequence: .max)] {
            #expect { _ = try store.history(after: ahead) } throws: { ($0 as? StoreError)?.code == .historyAhead }
            #expect { try store.registerHistoryConsumer("reader", at: ahead) } throws: { ($0 as? StoreError)?.code == .historyAhead }
        }
        #expect(try store.history(limit: 0).isEmpty)
        #expect(try store.history(limit: 2).count == 2)
        #expect(try store.historyConsumers().isEmpty)
    }

    /// Consumer names Swift takes for equal but spelled differently (NFD "café" from a file
    /// name, NFC typed) were two registrations shown as one: the one further along hid the
    /// other, and a purge took entries the other had not read.
    @Test func consumerNamesAreOneWhateverTheirUnicodeSpelling() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        for n in 0..<10 { try store.insert(Home(name: "\(n)")) }
        let decomposed = "cafe\u{301}", composed = "caf\u{E9}"
        try store.registerHistoryConsumer(decomposed, at: HistoryToken(sequence: 2))
        try store.registerHistoryConsumer(composed, at: HistoryToken(sequence: 10))
        #expect(try store.historyConsumers() == [composed: HistoryToken(sequence: 10)], "one consumer, moved to 10")
        try store.registerHistoryConsumer(decomposed, at: HistoryToken(sequence: 2))
        #expect { try store.purgeHistory(before: HistoryToken(sequence: 8)) } throws: { ($0 as? StoreError)?.code == .historyNeeded }
        #expect(try store.removeHistoryConsumer(composed))
        #expect(try store.historyConsumers().isEmpty)
    }

    /// A damaged next sequence number that went back below later entries (into a purged range,
    /// say) wrote the entry there, where no consumer past it would ever read it; one of 0
    /// trapped every reader of history, `verify` included. The write is refused now, and
    /// `verify` reports the damage and any hole in history.
    /// A damaged clock at the top of its range trapped every write (the next clock is one
    /// past it); damaged versions made a delete throw after it had removed the record and its
    /// index entries, so a caller that caught the error and committed kept half a delete.
    @Test func damagedClockAndVersionsAreReportedBeforeAnythingChanges() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        let home = Home(name: "kept")
        try store.insert(home)
        let env = try Environment.open(path: dir.path)
        let meta = try env.database("meta"), versions = try env.database("versions")
        let clock = try env.read { txn in try txn.get(meta, key: Array("clock".utf8)) }
        try env.write { txn in try txn.put(meta, key: Array("clock".utf8), uint64: .max) }
        #expect { try store.insert(Home(name: "never")) } throws: { ($0 as? StoreError)?.code == .corrupted }
        try env.write { txn in try txn.put(meta, key: Array("clock".utf8), value: clock ?? []) }

        var key: [UInt8] = []
        try env.read { txn in try txn.scan(versions, from: ScanStart<[UInt8]>.first) { found, _ in key = found; return false } }
        try env.write { txn in try txn.put(versions, key: key, value: [0xff, 0xff]) }
        _ = try store.write { tx in
            #expect { try tx.delete(Home.self, id: home.id) } throws: { ($0 as? StoreError)?.code == .corrupted }
        }
        #expect(try store.get(Home.self, id: home.id) == home)
        #expect(try store.count(Home.self, where: \.name, equals: "kept") == 1)
    }

    @Test func aDamagedNextSequenceIsReportedNotUsed() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        for n in 0..<5 { try store.insert(Home(name: "\(n)")) }
        try store.purgeHistory(before: HistoryToken(sequence: 3))
        let env = try Environment.open(path: dir.path)
        let meta = try env.database("meta"), history = try env.database("history")
        try env.write { txn in try txn.put(meta, key: Array("nextSequence".utf8), uint64: 2) }
        #expect { try store.insert(Home(name: "lost")) } throws: { ($0 as? StoreError)?.code == .corrupted }
        #expect(try store.count(Home.self) == 5, "the refused write changed nothing")
        try env.write { txn in try txn.put(meta, key: Array("nextSequence".utf8), uint64: 0) }
        #expect(try store.currentToken() == .beginning)
        #expect(try store.verify().problems.contains { $0.contains("is 0") })
        // A hole: entry 4 of 4...5 gone.
        try env.write { txn in
            try txn.put(meta, key: Array("nextSequence".utf8), uint64: 6)
            var key = KeyBytes()
            key.appendBigEndian(UInt64(4))
            _ = try txn.delete(history, key: key)
        }
        let report = try store.verify()
        #expect(report.problems.contains { $0.contains("history entries 4...4 are missing") }, "\(report)")
    }

    /// A purge of a long history runs in transactions of a bounded number of entries (other
    /// writers go on between them, and the keys are not all held at once); the result is the
    /// one purge it always was, and a consumer still holds back what it needs.
    @Test func aLongPurgeRunsInBoundedTransactions() throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.durability = .none
        let store = try Store.open(at: dir.path, types: [Home.self], options: options)
        let entries = 2 * Store.maximumPurgedPerTransaction + 100
        for n in 0..<entries { try store.insert(Home(name: "\(n)")) }
        let current = try store.currentToken()
        let needed = HistoryToken(sequence: current.sequence - 50)
        try store.registerHistoryConsumer("reader", at: needed)
        #expect(throws: StoreError.self) { try store.purgeHistory(before: current) }
        #expect(try store.oldestAvailableToken() == .beginning, "a refused purge removes nothing")
        let report = try store.purgeHistory(before: needed)
        #expect(report.removedEntries == Int(needed.sequence) && report.purgedThrough == needed, "\(report)")
        #expect(try store.oldestAvailableToken() == needed)
        #expect(try store.history(after: needed).count == 50)
        #expect(try store.verify().isClean)
    }

    @Test func purgeNeverRemovesWhatAConsumerNeedsUnlessForced() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        for n in 0..<10 { try store.insert(Home(name: "\(n)")) }
        try store.registerHistoryConsumer("peer-a", at: HistoryToken(sequence: 4))
        #expect(try store.historyConsumers() == ["peer-a": HistoryToken(sequence: 4)])
        do {
            try store.purgeHistory(before: HistoryToken(sequence: 8))
            Issue.record("purge past a consumer's token must be refused")
        } catch let error as StoreError {
            #expect(error.code == .historyNeeded)
            #expect(error.message.contains("peer-a"))
        }
        #expect(try store.history().count == 10, "a refused purge removes nothing")
        let partial = try store.purgeHistory(before: HistoryToken(sequence: 4))
        #expect(partial.removedEntries == 4)
        #expect(partial.overriddenConsumers.isEmpty)
        #expect(try store.history(after: HistoryToken(sequence: 4)).count == 6, "the consumer still reads everything it needs")

        let forced = try store.purgeHistory(before: HistoryToken(sequence: 8), force: true)
        #expect(forced.removedEntries == 4)
        #expect(forced.overriddenConsumers == ["peer-a"])
        #expect(forced.description.contains("peer-a"))
        do {
            _ = try store.history(after: HistoryToken(sequence: 4))
            Issue.record("reading purged history must fail loudly")
        } catch let error as StoreError {
            #expect(error.code == .historyPurged)
        }
        // The overridden registration stays where it was (its reads fail loudly until it
        // resynchronizes), and like one registered behind the purge point it holds back no
        // later purge (before, both blocked every one for good).
        #expect(try store.historyConsumers() == ["peer-a": HistoryToken(sequence: 4)])
        try store.registerHistoryConsumer("late", at: HistoryToken(sequence: 2))
        #expect(try store.historyConsumers()["late"] == HistoryToken(sequence: 2))
        let later = try store.purgeHistory(before: HistoryToken(sequence: 9))
        #expect(later.removedEntries == 1 && later.overriddenConsumers.isEmpty)
        try store.removeHistoryConsumer("late")
        try store.removeHistoryConsumer("peer-a")
        #expect(try store.historyConsumers().isEmpty)
        #expect(try store.statistics().historyEntries == 1)
        #expect(try store.verify().isClean)
    }

    @Test func observationDeliversEveryCommitOnceInOrder() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let start = try store.currentToken()
        let collector = Task {
            var seen: [HistoryEntry] = []
            for try await entry in store.changes(after: start, pollInterval: .milliseconds(2)) {
                seen.append(entry)
                if seen.count == 60 { break }
            }
            return seen
        }
        let writer = Task.detached {
            for n in 0..<60 {
                try store.write(author: "w") { tx in
                    try tx.insert(Home(name: "\(n)"))
                    // A write that throws adds nothing to the feed.
                }
                if n % 10 == 0 { try? store.write { _ in throw Abort() } }
            }
        }
        try await writer.value
        let seen = try await collector.value
        #expect(seen.map(\.sequence) == Array(start.sequence + 1...start.sequence + 60))
        #expect(seen.allSatisfy { $0.author == "w" && $0.changes.count == 1 })
    }

    @Test func typeFilteredObservationSkipsOtherTypes() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        try store.insert(home)
        let task = Task {
            var names: [String] = []
            for try await entry in store.changes(of: ["Item"], pollInterval: .milliseconds(2)) {
                #expect(entry.changes.allSatisfy { $0.type == "Item" })
                names += entry.changes.map(\.type)
                if names.count == 5 { break }
            }
            return names.count
        }
        try await Task.sleep(for: .milliseconds(30))
        for n in 0..<5 {
            try store.insert(Home(name: "other \(n)"))
            try store.insert(Item(homeID: home.id, name: "\(n)", category: "c", wearCount: n, price: 0))
        }
        #expect(try await task.value == 5)
    }

    /// An observation starts where `changes` was called: writes made before iteration begins
    /// (the doc's pattern: start a task, then write) were missed when it started there.
    @Test func observationStartsWhereChangesWasCalled() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        try store.insert(Home(name: "before"))
        let observation = store.changes(pollInterval: .milliseconds(2))
        for n in 0..<3 { try store.insert(Home(name: "after \(n)")) }
        let task = Task {
            var names: [String] = []
            for try await entry in observation {
                names += entry.changes.map(\.type)
                if names.count == 3 { break }
            }
            return names.count
        }
        try await Task.sleep(for: .milliseconds(300))
        task.cancel()
        #expect(try await task.value == 3)
    }

    @Test func cancellingTheConsumerEndsTheSequence() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        let task = Task {
            var n = 0
            for try await _ in store.changes() { n += 1 }
            return n   // reached only when the sequence ends
        }
        try store.insert(Home(name: "a"))
        try await Task.sleep(for: .milliseconds(50))
        task.cancel()
        let delivered = try await task.value
        #expect(delivered <= 1)
    }

    /// Cancelling ends the sequence at once: entries already read into the iterator's page
    /// were still delivered, up to a page of them, after the task was cancelled.
    @Test func cancellingEndsTheSequenceEvenWithEntriesBuffered() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        let start = try store.currentToken()
        for n in 0..<5 { try store.insert(Home(name: "h\(n)")) }
        let task = Task {
            var delivered = 0
            for try await _ in store.changes(after: start) {
                delivered += 1
                withUnsafeCurrentTask { $0?.cancel() }   // cancelled while four more wait
            }
            return delivered
        }
        #expect(try await task.value == 1)
    }

    /// Commits made by another process (the CLI) reach an observer in this process.
    @Test func observationSeesCommitsFromAnotherProcess() async throws {
        let dir = TemporaryDirectory()
        let path = try StashCLI.makeStore(in: dir)
        let store = try Store.open(at: path)
        let start = try store.currentToken()
        let collector = Task {
            var seen: [HistoryEntry] = []
            for try await entry in store.changes(after: start, pollInterval: .milliseconds(5)) {
                seen.append(entry)
                if seen.count == 12 { break }
            }
            return seen
        }
        let lines = (0..<36).map { #"{"homeID": "\#(RecordID())", "name": "n\#($0)", "wearCount": \#($0)}"# }
        let result = try StashCLI.run("load", path, "Item", "-", "--batch", "3", stdin: lines.joined(separator: "\n"))
        #expect(result.status == 0, "\(result.stderr)")
        let seen = try await collector.value
        #expect(seen.map(\.sequence) == Array(start.sequence + 1...start.sequence + 12))
        #expect(seen.allSatisfy { $0.author == "cli" && $0.changes.count == 3 })
    }
}
