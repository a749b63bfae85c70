import Foundation
import Stash
import StashSync
import Testing

/// The relay service's tests: real PostgreSQL (a throwaway cluster the suite starts and
/// stops), real `stash-relay` processes, real HTTP on loopback. Serialized: some of them stop
/// servers or PostgreSQL itself.
@Suite(.serialized, SharedPostgres()) struct RelayServiceTests {}

/// What the devices of a test wrote, to compare every store with.
struct Expected {
    var notes: [RecordID: Note] = [:]
    var deleted = Set<RecordID>()
    var credits: Int64 = 0

    /// Device `n` inserts three notes, edits one it can see, deletes one it can see, and adds
    /// to the wallet when it has it; then syncs through `transport`.
    mutating func round(_ device: Device, _ n: Int, _ round: Int, wallet: RecordID) throws {
        for i in 0..<3 {
            let note = Note(title: "\(device.name) r\(round) #\(i)", body: String(repeating: "x", count: 40 + i), author: device.name)
            try device.store.insert(note)
            notes[note.id] = note
        }
        let visible = try device.notes()
        if let edit = visible.keys.sorted().first(where: { notes[$0] != nil }) {
            let updated = try device.store.update(Note.self, id: edit) { $0.body += " edited by \(device.name)" }
            notes[edit] = updated
        }
        if round > 0, let gone = visible.keys.sorted().last(where: { notes[$0] != nil && $0 != visible.keys.sorted().first }) {
            try device.store.delete(Note.self, id: gone)
            notes[gone] = nil
            deleted.insert(gone)
        }
        if try device.store.get(Wallet.self, id: wallet) != nil {
            _ = try device.store.update(Wallet.self, id: wallet) { $0.credits.add(Int64(n + 1), site: device.store.siteID) }
            credits += Int64(n + 1)
        }
    }

    /// The store holds exactly the expected notes (values included), none deleted, the exact
    /// credits, and passes `verify`.
    func check(_ device: Device, wallet: RecordID, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let notes = try device.notes()
        #expect(notes.count == self.notes.count, "\(device.name) holds \(notes.count) notes, \(self.notes.count) expected", sourceLocation: sourceLocation)
        #expect(notes == self.notes, "\(device.name) differs", sourceLocation: sourceLocation)
        #expect(deleted.allSatisfy { notes[$0] == nil }, "\(device.name) resurrected a deleted note", sourceLocation: sourceLocation)
        #expect(try device.store.get(Wallet.self, id: wallet)?.credits.value == credits, "\(device.name)'s credits", sourceLocation: sourceLocation)
        let report = try device.store.verify()
        #expect(report.isClean, "\(device.name): \(report)", sourceLocation: sourceLocation)
    }
}

/// No (source, range) stored twice in the database.
func duplicateRanges(_ cluster: PostgresCluster, _ database: String) throws -> Int {
    Int(try cluster.sql(database, "SELECT count(*) FROM (SELECT 1 FROM stash_relay_files GROUP BY family, source, first_seq, last_seq HAVING count(*) > 1) d")) ?? -1
}

extension RelayServiceTests {
    @Suite struct Convergence {
        /// Three stores sync through two server processes on one PostgreSQL (two on server A,
        /// one on B), writing inserts, edits, deletes and counter spends in rounds; a device
        /// long-polling on B hears an upload to A at once (NOTIFY); all converge exactly and
        /// verify; the database holds no range twice; then a new device, given only server B,
        /// the family id and the key, restores everything from the checkpoint and the files
        /// after it, and goes on incrementally.
        @Test func threeStoresThroughTwoServersConvergeAndANewDeviceRestores() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let a = try RelayServerProcess(postgres: cluster.url(database))
            let b = try RelayServerProcess(postgres: cluster.url(database))
            let family = Family()
            let scratch = Scratch()
            let devices = try (0..<3).map { try Device(scratch.sub("d\($0)"), family: family.id, key: family.key) }
            let transports = [transport(a), transport(b), transport(a)]
            let wallet = Wallet()
            try devices[0].store.insert(wallet)
            var expected = Expected()
            for round in 0..<4 {
                for (n, device) in devices.enumerated() {
                    try expected.round(device, n, round, wallet: wallet.id)
                    let report = try await device.engine.sync(via: transports[n])
                    #expect(report.refused.isEmpty, "\(report)")
                }
            }

            // A long-poll on server B wakes for an upload to server A.
            let waiting = devices[1]
            let start = try await transports[1].changes(for: waiting.engine, after: 0, wait: .zero)
            let woken = Task { try await transports[1].changes(for: waiting.engine, after: start, wait: .seconds(20)) }
            try await Task.sleep(for: .milliseconds(300))
            let posted = ContinuousClock.now
            try expected.round(devices[0], 0, 99, wallet: wallet.id)
            try await devices[0].engine.sync(via: transports[0])
            let next = try await woken.value
            let heard = posted.duration(to: .now)
            #expect(next > start)
            #expect(heard < .seconds(5), "the long-poll on B heard the upload to A after \(heard)")
            print("long-poll on server B woken by an upload to server A: \(heard) from the start of the uploading sync")

            for _ in 0..<2 {
                for (n, device) in devices.enumerated() { try await device.engine.sync(via: transports[n]) }
            }
            for device in devices {
                try expected.check(device, wallet: wallet.id)
                #expect(try await device.engine.status(via: transports[0]).isUpToDate)
            }
            #expect(try duplicateRanges(cluster, database) == 0)

            // A new device restores everything through server B alone.
            try await devices[2].engine.publishCheckpoint(via: transports[2])
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_checkpoints") == "1")
            let newcomer = try Device(scratch.sub("new"), family: family.id, key: family.key)
            let restore = try await newcomer.engine.sync(via: transport(b))
            #expect(restore.refused.isEmpty, "\(restore)")
            try expected.check(newcomer, wallet: wallet.id)
            // … and goes on incrementally.
            try expected.round(devices[1], 1, 100, wallet: wallet.id)
            try await devices[1].engine.sync(via: transports[1])
            try await newcomer.engine.sync(via: transport(b))
            try expected.check(newcomer, wallet: wallet.id)
        }

        /// The clean-up follows the directory relay's rules: a source's files go once a
        /// checkpoint holds them and every reader has acknowledged them; while a reader stays
        /// behind, they stay.
        @Test func filesGoOnceACheckpointHoldsThemAndEveryReaderHasThem() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let server = try RelayServerProcess(postgres: cluster.url(database))
            let family = Family()
            let scratch = Scratch()
            let relay = transport(server)
            let (a, b, c) = (try Device(scratch.sub("a"), family: family.id, key: family.key),
                             try Device(scratch.sub("b"), family: family.id, key: family.key),
                             try Device(scratch.sub("c"), family: family.id, key: family.key))
            for device in [a, b, c] { try await device.engine.sync(via: relay) }
            for i in 0..<5 {
                try a.store.insert(Note(title: "n\(i)", body: "", author: "a"))
                try await a.engine.sync(via: relay)
            }
            let filesOfA = "SELECT count(*) FROM stash_relay_files WHERE source = '\(a.store.siteID)'"
            #expect(try cluster.sql(database, filesOfA) == "5")
            try await b.engine.sync(via: relay)
            try await a.engine.publishCheckpoint(via: relay)
            try await a.engine.sync(via: relay)
            // c has not read them: they stay.
            #expect(try cluster.sql(database, filesOfA) == "5")
            try await c.engine.sync(via: relay)
            try await a.engine.sync(via: relay)
            #expect(try cluster.sql(database, filesOfA) == "0")
            #expect(try c.notes().count == 5)
        }
    }
}
