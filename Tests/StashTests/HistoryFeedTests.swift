import Foundation
import Stash
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
        try store.removeHistoryConsumer("peer-a")
        #expect(try store.historyConsumers().isEmpty)
        #expect(try store.statistics().historyEntries == 2)
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
