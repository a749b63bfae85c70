import Foundation
import Synchronization
import Stash
import StashSync
import Testing
import StashTestSupport

/// A record whose type and field names, and values, must never appear on a relay.
struct Diary: Record, Equatable {
    var id = RecordID()
    var confidentialEntry: String
    var mood: Int
}

/// The relay keeps the family's data (issue 35): checkpoints from which a new device
/// restores everything, the relay alone; end-to-end encryption.
@Suite struct RelayHomeTests {
    let family = RecordID()
    let key = try! SyncKey(Array("a family key that stays on the devices".utf8))

    func relay(_ dir: TemporaryDirectory) throws -> (URL, RelayTransport) {
        let url = dir.url.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return (url, RelayTransport(directory: url))
    }

    func device(_ path: String, key: SyncKey?, progress: (@Sendable (SyncProgress) -> Void)? = nil) throws -> Device {
        var options = StoreOptions()
        options.durability = .none
        let store = try Store.open(at: path, types: syncTypes + [Diary.self], options: options)
        var configuration = SyncConfiguration(family: family, key: key)
        configuration.progress = progress
        return Device(path: path, store: store, engine: try SyncEngine(store: store, configuration: configuration))
    }

    /// Every file under the relay, with its bytes.
    func relayFiles(_ url: URL) -> [(String, Data)] {
        (FileManager.default.enumerator(at: url, includingPropertiesForKeys: nil)?.compactMap { $0 as? URL } ?? [])
            .filter { (try? $0.resourceValues(forKeys: [.isRegularFileKey]).isRegularFile) == true }
            .map { ($0.path, (try? Data(contentsOf: $0)) ?? Data()) }
    }

    /// Three devices write (inserts, edits, deletes, counter spends), sync through the relay,
    /// and are all deleted; a fourth, given only the relay, the family id and the key,
    /// restores every record with its values, nothing deleted comes back, counters are exact;
    /// then it goes on incrementally. Before, it restored 0 records once the relay had been
    /// read by everyone.
    @Test func aNewDeviceRestoresEverythingFromTheRelayAlone() async throws {
        let dir = TemporaryDirectory()
        let (url, relay) = try relay(dir)
        var expectedNotes: [RecordID: Note] = [:]
        var deleted: [RecordID] = []
        var converged: [String] = []
        var wallet = Wallet()
        var expectedCredits: Int64 = 0
        do {
            let devices = try (0..<3).map { try device(dir.sub("d\($0)"), key: key) }
            try devices[0].store.insert(wallet)
            for round in 0..<5 {
                for (n, device) in devices.enumerated() {
                    let note = Note(title: "round \(round) on \(n)", body: String(repeating: "b", count: 200), tag: "t\(n)")
                    try device.store.insert(note)
                    expectedNotes[note.id] = note
                    try await device.engine.sync(via: relay)
                }
                // An edit of another device's note, a delete, and a spend on each device.
                for (n, device) in devices.enumerated() {
                    if let target = try device.store.fetch(FetchDescriptor<Note>()).first(where: { $0.tag != "t\(n)" && $0.tag != nil }) {
                        try device.store.update(Note.self, id: target.id) { $0.body = "edited on \(n)" }
                        expectedNotes[target.id]?.body = "edited on \(n)"
                    }
                    if round == 2, let doomed = try device.store.fetch(FetchDescriptor<Note>()).first(where: { $0.tag == "t\(n)" }) {
                        try device.store.delete(Note.self, id: doomed.id)
                        expectedNotes[doomed.id] = nil
                        deleted.append(doomed.id)
                    }
                    if try device.store.get(Wallet.self, id: wallet.id) != nil {
                        try device.store.update(Wallet.self, id: wallet.id) { $0.credits.add(Int64(n + 1), site: device.store.siteID) }
                        expectedCredits += Int64(n + 1)
                    }
                    try await device.engine.sync(via: relay)
                }
            }
            for _ in 0..<2 { for device in devices { try await device.engine.sync(via: relay) } }
            wallet = try #require(try devices[0].store.get(Wallet.self, id: wallet.id))
            #expect(wallet.credits.value == expectedCredits)
            // Concurrent edits of one note resolve by version: the converged state is the truth.
            converged = try canonicalDump(devices[0].store)
            for device in devices { #expect(try canonicalDump(device.store) == converged) }
        }
        for n in 0..<3 { try FileManager.default.removeItem(atPath: dir.sub("d\(n)")) }   // every device gone

        let restored = Mutex<[SyncProgress]>([])
        let fourth = try device(dir.sub("fourth"), key: key) { progress in restored.withLock { $0.append(progress) } }
        let report = try await fourth.engine.sync(via: relay)
        #expect(report.refused.isEmpty, "\(report)")
        #expect(try fourth.store.count(Note.self) == expectedNotes.count)
        #expect(try canonicalDump(fourth.store) == converged)
        for id in expectedNotes.keys { #expect(try fourth.store.get(Note.self, id: id)?.title == expectedNotes[id]?.title) }
        for id in deleted { #expect(try fourth.store.get(Note.self, id: id) == nil, "a deleted note came back") }
        #expect(try credits(fourth.store, wallet.id) == expectedCredits)
        #expect(try fourth.store.verify().isClean)
        // It goes on incrementally: a fifth device hears of the fourth's change.
        let later = Note(title: "after the restore", body: "")
        try fourth.store.insert(later)
        try await fourth.engine.sync(via: relay)
        let fifth = try device(dir.sub("fifth"), key: key)
        try await fifth.engine.sync(via: relay)
        #expect(try fifth.store.get(Note.self, id: later.id) == later)
        #expect(try fifth.store.count(Note.self) == expectedNotes.count + 1)
        _ = url
    }

    /// A device that joins after the others have read everything gets everything at its first
    /// sync (before, nothing until some device synced again), and the relay then holds the
    /// newest checkpoint and the files after it, not every file ever written.
    @Test func aDeviceJoiningLateGetsEverythingAtItsFirstSync() async throws {
        let dir = TemporaryDirectory()
        let (url, relay) = try relay(dir)
        let a = try device(dir.sub("a"), key: key), b = try device(dir.sub("b"), key: key)
        var notes: [Note] = []
        for n in 0..<30 {
            let note = Note(title: "note \(n)", body: String(repeating: "x", count: 3_000))
            notes.append(note)
            try (n % 2 == 0 ? a : b).store.insert(note)
            try await a.engine.sync(via: relay)
            try await b.engine.sync(via: relay)
        }
        for _ in 0..<2 { try await a.engine.sync(via: relay); try await b.engine.sync(via: relay) }
        #expect(!relay.checkpoints(of: family).isEmpty, "a checkpoint was due")
        let files = relayFiles(url).filter { $0.0.hasSuffix(".delta") }
        #expect(files.count < 30, "files a checkpoint holds go: \(files.count) left")
        let c = try device(dir.sub("c"), key: key)
        try await c.engine.sync(via: relay)
        for note in notes { #expect(try c.store.get(Note.self, id: note.id) == note) }
    }

    /// Deltas and checkpoints are encrypted with a key derived from the family key: no record
    /// value, field name or type name appears in any byte of the relay.
    @Test func theRelayHoldsOnlyCiphertext() async throws {
        let dir = TemporaryDirectory()
        let (url, relay) = try relay(dir)
        let a = try device(dir.sub("a"), key: key), b = try device(dir.sub("b"), key: key)
        try a.store.insert(Diary(confidentialEntry: "meet Alice at the harbour", mood: 424242))
        try await a.engine.sync(via: relay)
        try await b.engine.publishCheckpoint(via: relay)
        try await b.engine.sync(via: relay)
        try await a.engine.publishCheckpoint(via: relay)
        // A parked delta's note names types and fields too: sealed as well.
        let older = try Device.open(dir.sub("older"), family: family, key: key, types: [Note.self, PlainWallet.self])
        try a.store.insert(Wallet())
        try await a.engine.sync(via: relay)
        try await older.engine.sync(via: relay)
        #expect(!older.engine.parkedDeltas().isEmpty)
        #expect(try b.store.read(isolation: #isolation) { try $0.count(typeNamed: "Diary") } == 1)
        let secrets = ["meet Alice", "harbour", "confidentialEntry", "Diary", "mood", "Wallet", "credits"]
        let files = relayFiles(url)
        #expect(files.count > 5)
        for (path, bytes) in files {
            for secret in secrets {
                #expect(bytes.range(of: Data(secret.utf8)) == nil, "\(secret) in \(path)")
            }
        }
        // The parking store's note still tells its source, which holds the key, why.
        try await a.engine.sync(via: relay)
        #expect(try await a.engine.status(via: relay).parkedAtPeer.first?.contains("Wallet.credits") == true)
    }

    /// A relay that swaps, replays, truncates or reorders files is found out, and nothing of
    /// such a file applies (the genuine files before it do); once the files are put back, all
    /// of them apply.
    @Test func aRelayThatTampersWithFilesIsFoundOut() async throws {
        let dir = TemporaryDirectory()
        let (url, relay) = try relay(dir)
        let a = try device(dir.sub("a"), key: key)
        var notes: [Note] = []
        for n in 0..<3 {
            let note = Note(title: "a\(n)", body: "")
            notes.append(note)
            try a.store.insert(note)
            try await a.engine.sync(via: relay)
        }
        let folder = url.appendingPathComponent(a.store.siteID.description)
        let names = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".delta") }.sorted()
        try #require(names.count == 3)
        let original = try names.map { try Data(contentsOf: folder.appendingPathComponent($0)) }
        func put(_ data: Data, as index: Int) throws { try data.write(to: folder.appendingPathComponent(names[index])) }
        func restore() throws { for index in 0..<3 { try put(original[index], as: index) } }
        // Each attack, and which of the notes (by file) a reader then holds.
        let attacks: [(String, () throws -> Void, held: Int)] = [
            ("the first two files swapped", { try put(original[1], as: 0); try put(original[0], as: 1) }, 0),
            ("the first replayed as the second", { try put(original[0], as: 1) }, 1),
            ("the first cut short", { try put(original[0].prefix(original[0].count - 7), as: 0) }, 0),
            ("a header byte of the first changed", {
                var bytes = original[0]
                bytes[bytes.startIndex + 40] ^= 1   // inside the source's site id
                try put(bytes, as: 0)
            }, 0),
            ("the first held back (the others out of order)", { try FileManager.default.removeItem(at: folder.appendingPathComponent(names[0])) }, 0),
        ]
        for (n, (what, attack, held)) in attacks.enumerated() {
            try attack()
            let b = try device(dir.sub("b\(n)"), key: key)
            let report = try await b.engine.fetchChanges(via: relay)
            if held < 3 && n < 4 { #expect(report.refused.count == 1, "\(what): \(report)") }
            let titles = try b.store.fetch(FetchDescriptor<Note>()).map(\.title).sorted()
            #expect(titles == notes.prefix(held).map(\.title), "\(what): \(titles)")
            try restore()
            for _ in 0..<2 { try await b.engine.sync(via: relay); try await a.engine.sync(via: relay) }
            #expect(try b.store.count(Note.self) == 3, "\(what), put back")
            #expect(try b.store.verify().isClean)
        }
    }

    /// A family without a key keeps working through the relay, unencrypted, and says so.
    @Test func aFamilyWithoutAKeyWorksUnencryptedAndSaysSo() async throws {
        let dir = TemporaryDirectory()
        let (url, relay) = try relay(dir)
        let a = try device(dir.sub("a"), key: nil), b = try device(dir.sub("b"), key: nil)
        try a.store.insert(Diary(confidentialEntry: "plain", mood: 1))
        try await a.engine.sync(via: relay)
        try await a.engine.publishCheckpoint(via: relay)
        let c = try device(dir.sub("c"), key: nil)
        try await b.engine.sync(via: relay)
        try await c.engine.sync(via: relay)
        #expect(try b.store.read(isolation: #isolation) { try $0.count(typeNamed: "Diary") } == 1 && c.store.read(isolation: #isolation) { try $0.count(typeNamed: "Diary") } == 1)
        #expect(!a.engine.encryptsRelayFiles)
        #expect(try await a.engine.status(via: relay).description.contains("unencrypted"))
        #expect(relayFiles(url).contains { $0.1.range(of: Data("plain".utf8)) != nil }, "in the clear, as said")
    }
}

/// A relay that cancels the task syncing through it at a chosen step, for the tests of
/// cancellation.
struct CancellingTransport: SyncTransport {
    enum Step: Sendable { case deliver, incoming }
    let relay: RelayTransport
    let step: Step
    var peer: RecordID? { nil }
    func deliver(_ data: Data, delta: Delta, from engine: SyncEngine) async throws {
        try await relay.deliver(data, delta: delta, from: engine)
        if step == .deliver { withUnsafeCurrentTask { $0?.cancel() } }
    }
    func incoming(for engine: SyncEngine) async throws -> [IncomingDelta] {
        let incoming = try await relay.incoming(for: engine)
        if step == .incoming { withUnsafeCurrentTask { $0?.cancel() } }
        return incoming
    }
    func fullSnapshotRequested(by engine: SyncEngine) async throws -> Bool { try await relay.fullSnapshotRequested(by: engine) }
    func requestFullSnapshot(from source: RecordID, for engine: SyncEngine) async throws { try await relay.requestFullSnapshot(from: source, for: engine) }
    func watermarkSite(for engine: SyncEngine) async throws -> String { try await relay.watermarkSite(for: engine) }
}

@Suite struct SyncCancellationTests {
    let family = RecordID()

    /// Transports are async and a sync cancels cleanly between its steps and between deltas:
    /// what it sent stays sent, what it fetched but had not applied stays on the relay, and the
    /// next sync completes the exchange with nothing lost or applied twice.
    @Test func aCancelledSyncStopsCleanlyAndTheNextOneFinishes() async throws {
        let dir = TemporaryDirectory()
        let url = dir.url.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        let relay = RelayTransport(directory: url)
        let a = try Device.open(dir.sub("a"), family: family)
        let b = try Device.open(dir.sub("b"), family: family)
        for n in 0..<3 {
            try a.store.insert(Note(title: "a\(n)", body: ""))
            try await a.engine.sync(via: relay)
        }
        try b.store.insert(Note(title: "b0", body: ""))

        // Cancelled once its delta is delivered: it goes, and nothing is fetched.
        let sending = Task { try await b.engine.sync(via: CancellingTransport(relay: relay, step: .deliver)) }
        await #expect(throws: CancellationError.self) { try await sending.value }
        #expect(try await b.engine.status(via: relay).pendingOutgoing == 0, "what was delivered counts as sent")
        #expect(try b.store.count(Note.self) == 1, "nothing fetched")

        // Cancelled once the relay listed its files: none applies, none is acknowledged.
        let fetching = Task { try await b.engine.fetchChanges(via: CancellingTransport(relay: relay, step: .incoming)) }
        await #expect(throws: CancellationError.self) { try await fetching.value }
        #expect(try b.store.count(Note.self) == 1)

        let report = try await b.engine.sync(via: relay)
        #expect(report.receivedEntries == 3, "\(report)")
        try await a.engine.sync(via: relay)
        #expect(try a.store.count(Note.self) == 4 && b.store.count(Note.self) == 4)
        #expect(try a.store.verify().isClean && b.store.verify().isClean)
    }
}
