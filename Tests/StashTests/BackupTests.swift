import Foundation
import Stash
import StashLMDB
import Testing
import StashTestSupport

/// `Store.backup(to:compact:)`, `Store.compact(at:)` and their commands, full file systems.
@Suite struct BackupTests {
    /// A backup holds the store's blobs (``ExternalData``): opened, every image reads back
    /// and `verify` finds none pending; on another file system (no hard link) too.
    @Test func aBackupHoldsTheStoresBlobs() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.sub("store"), types: [PhotoGarment.self])
        let images = (0..<3).map { imageBytes(100_000 + $0, seed: UInt64(40 + $0)) }
        let garments = images.enumerated().map { PhotoGarment(name: "g\($0.offset)", image: ExternalData($0.element)) }
        try store.write { tx in for garment in garments { try tx.insert(garment) } }
        let elsewhere = FileManager.default.fileExists(atPath: "/dev/shm") ? "/dev/shm/stash-backup-\(UUID())" : dir.sub("elsewhere")
        defer { try? FileManager.default.removeItem(atPath: elsewhere) }
        for path in [dir.sub("backup"), elsewhere] {
            let report = try store.backup(to: path)
            #expect(report.blobCount == 3 && report.blobBytes == images.reduce(0) { $0 + $1.count }, "\(report)")
            let copy = try Store.open(at: path, types: [PhotoGarment.self])
            for (garment, image) in zip(garments, images) {
                let read = try #require(try copy.get(PhotoGarment.self, id: garment.id)?.image)
                #expect(try copy.blob(read) == image)
            }
            #expect(try copy.verifyBlobs().pending.isEmpty)
            #expect(try copy.verify().isClean)
        }
    }

    /// Backups taken while a writer commits transactions of three items each: every backup
    /// is one committed state (whole transactions, history to match, `verify` clean), opens as
    /// a new replica, and the compacted ones are no larger than the plain ones.
    @Test func backupsTakenWhileWritersRunAreConsistentNewReplicas() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.sub("store"), types: [Home.self, Item.self])
        let home = Home(name: "h")
        try store.insert(home)
        let done = DoneFlag()
        let failures = Failures()
        let writer = Thread {
            do {
                for n in 0..<600 {
                    try store.write { tx in
                        for k in 0..<3 { try tx.insert(Item(homeID: home.id, name: "i\(n)-\(k)", category: "c\(k)", wearCount: n, price: 1)) }
                    }
                }
            } catch { failures.add("writer: \(error)") }
            done.set()
        }
        writer.start()
        var backups: [(String, Bool)] = []
        var n = 0
        while !done.isSet || backups.count < 4 {
            let path = dir.sub("backup-\(n)")
            let compact = n % 2 == 1
            let report = try store.backup(to: path, compact: compact)
            #expect(report.bytes > 0 && report.path.hasSuffix("backup-\(n)"))
            backups.append((path, compact))
            n += 1
            Thread.sleep(forTimeInterval: 0.02)
        }
        while !done.isSet { Thread.sleep(forTimeInterval: 0.01) }
        #expect(failures.all.isEmpty, "\(failures.all)")
        var counts: [Int] = []
        for (path, _) in backups {
            let copy = try Store.open(at: path, types: [Home.self, Item.self])
            let items = try copy.count(Item.self)
            counts.append(items)
            #expect(items % 3 == 0, "\(path): \(items) items, not whole transactions")
            #expect(try copy.verify().isClean, "\(path)")
            #expect(try copy.history().count == 1 + items / 3, "\(path): one entry per transaction")
            #expect(copy.siteID != store.siteID && copy.copiedFrom.map(\.site) == [store.siteID], "\(path): a new replica")
        }
        #expect(counts.contains { $0 > 0 && $0 < 1_800 }, "a backup taken while the writer ran: \(counts)")
        let last = try store.backup(to: dir.sub("final"), compact: true)
        let plain = try store.backup(to: dir.sub("final-plain"))
        #expect(last.bytes <= plain.bytes)
        #expect(try Store.open(at: dir.sub("final"), types: [Home.self, Item.self]).count(Item.self) == 1_800)
    }

    @Test func aBackupNeverReplacesAStore() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.sub("a"), types: [Home.self])
        try store.insert(Home(name: "a"))
        let other = try Store.open(at: dir.sub("b"), types: [Home.self])
        try other.insert(Home(name: "b"))
        let error = thrownError { try store.backup(to: dir.sub("b")) } as? StoreError
        #expect(error?.code == .storage && error?.message.contains("holds a data.mdb already") == true, "\(String(describing: error))")
        #expect(try other.fetch(FetchDescriptor<Home>()).map(\.name) == ["b"])
        #expect((thrownError { try store.backup(to: dir.sub("a")) } as? StoreError) != nil, "not into itself")
        #expect((thrownError { try store.write { _ in _ = try store.backup(to: dir.sub("c")) } } as? StoreError)?.code == .nestedWrite)
    }

    /// A store that grew and lost most of its records keeps its size (LMDB reuses free pages,
    /// never gives them back); compacted in place it gets the space back and stays the same
    /// replica, its records, history and site as they were.
    @Test func compactionGivesTheSpaceOfDeletedRecordsBack() throws {
        let dir = TemporaryDirectory()
        let path = dir.sub("store")
        var kept: [Item] = []
        var site = RecordID()
        var history: [HistoryEntry] = []
        let home = Home(name: "h")
        do {
            let store = try Store.open(at: path, types: [Home.self, Item.self])
            site = store.siteID
            try store.insert(home)
            let note = String(repeating: "x", count: 8_000)
            var ids: [RecordID] = []
            for batch in 0..<30 {
                try store.write { tx in
                    for k in 0..<100 {
                        let item = Item(homeID: home.id, name: "i\(batch)-\(k)", category: "c", wearCount: k, price: 1, note: note)
                        try tx.insert(item)
                        if batch % 20 == 0 && k < 5 { kept.append(item) } else { ids.append(item.id) }
                    }
                }
            }
            for chunk in stride(from: 0, to: ids.count, by: 500) {
                try store.write { tx in for id in ids[chunk..<min(chunk + 500, ids.count)] { _ = try tx.delete(Item.self, id: id) } }
            }
            history = try store.history()
            #expect((thrownError { try Store.compact(at: path) } as? StoreError)?.code == .inUse, "refused while this process has it open")
        }
        let before = try #require(try FileManager.default.attributesOfItem(atPath: (path as NSString).appendingPathComponent("data.mdb"))[.size] as? Int)
        #expect(before > 20 << 20, "the store grew to \(before) bytes")
        let report = try Store.compact(at: path)
        let after = try #require(try FileManager.default.attributesOfItem(atPath: (path as NSString).appendingPathComponent("data.mdb"))[.size] as? Int)
        #expect(report.sourceBytes == before && report.bytes == after)
        #expect(after < before / 10, "\(before) → \(after) bytes")
        #expect(!FileManager.default.fileExists(atPath: (path as NSString).appendingPathComponent("compacting")))
        let store = try Store.open(at: path, types: [Home.self, Item.self])
        #expect(store.siteID == site && store.copiedFrom.isEmpty, "the same replica")
        #expect(try store.fetch(FetchDescriptor<Item>()).sorted { $0.name < $1.name } == kept.sorted { $0.name < $1.name })
        #expect(try store.history().map(\.changes) == history.map(\.changes))
        #expect(try store.verify().isClean)
        try store.insert(Item(homeID: home.id, name: "after", category: "c", wearCount: 1, price: 1))
        #expect(try store.count(Item.self) == kept.count + 1)
    }

    /// `stash backup` while a `stash load` process commits batches of 4, `stash compact`
    /// refused while another process has the store open, then done.
    @Test func backupAndCompactCommands() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let home = try StashCLI.run("put", store, "Home", #"{"name": "h"}"#).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let lines = (0..<4_000).map { #"{"homeID": "\#(home)", "name": "item \#($0)", "wearCount": \#($0), "note": "\#(String(repeating: "n", count: 300))"}"# }
        let loader = try StashCLI.start(["load", store, "Item", "-", "--batch", "4"], stdin: lines.joined(separator: "\n"))
        var backups: [String] = []
        while loader.0.isRunning || backups.count < 2 {
            let destination = dir.sub("backup-\(backups.count)")
            let result = try StashCLI.run("backup", store, destination, "--compact")
            #expect(result.status == 0 && result.stdout.contains("backup of") && result.stdout.contains(destination), "\(result.stdout) \(result.stderr)")
            backups.append(destination)
        }
        #expect(StashExecutable.finish(loader).status == 0)
        for backup in backups {
            let verify = try StashCLI.run("verify", backup)
            #expect(verify.status == 0 && verify.stdout.contains("clean"), "\(verify.stdout)")
            let count = Int(try StashCLI.run("count", backup, "Item").stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
            #expect(count >= 0 && count % 4 == 0, "\(backup): \(count) items")
        }
        let again = try StashCLI.run("backup", store, backups[0])
        #expect(again.status == 1 && again.stderr.contains("holds a data.mdb already"), "\(again.stderr)")
        // Delete most items, then compact: refused while mdb_load holds the store open.
        let ids = try StashCLI.run("dump", store, "Item").stdout.split(separator: "\n").compactMap { line -> String? in
            guard case .object(let object)? = try? JSONValue.parse(String(line)), case .string(let id)? = object["id"] else { return nil }
            return id
        }
        for id in ids.dropFirst(10).prefix(200) { #expect(try StashCLI.run("delete", store, "Item", id).status == 0) }
        let holder = try LMDBTool.holdWriteLock(on: store)
        let refused = try StashCLI.run("compact", store)
        LMDBTool.kill(holder)
        #expect(refused.status == 1 && refused.stderr.contains("another process") && refused.stderr.split(separator: "\n").count == 1, "\(refused.stderr)")
        let compacted = try StashCLI.run("compact", store)
        #expect(compacted.status == 0 && compacted.stdout.hasPrefix("compacted"), "\(compacted.stdout) \(compacted.stderr)")
        #expect(try StashCLI.run("verify", store).stdout.contains("clean"))
        #expect(try StashCLI.run("count", store, "Item").stdout == "3800\n")
    }

    /// On a full file system: `stash init` died of SIGBUS inside liblmdb and left `lock.mdb`
    /// behind, and a write said "Input/output error". Now every command says "no space left on
    /// device" with the store's path, nothing half-made is left, and the store works once
    /// space is freed. A backup that does not fit leaves no partial copy.
    @Test(.enabled(if: SmallFileSystem.isAvailable, "needs root to mount a small tmpfs"))
    func aFullFileSystemIsReportedByEveryCommandAndTheStoreWorksAfterwards() throws {
        let fs = try SmallFileSystem(bytes: 8 << 20)
        let dir = TemporaryDirectory()
        let schemaFile = dir.sub("schema.json")
        try StashCLI.schema.write(toFile: schemaFile, atomically: true, encoding: .utf8)
        let store = (fs.path as NSString).appendingPathComponent("store")
        #expect(try StashCLI.run("init", store, "--schema", schemaFile).status == 0)
        let home = try StashCLI.run("put", store, "Home", #"{"name": "h"}"#).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        fs.fill()
        let fresh = (fs.path as NSString).appendingPathComponent("fresh")
        let initResult = try StashCLI.run("init", fresh, "--schema", schemaFile)
        #expect(initResult.signal == nil && initResult.status == 1, "\(initResult.status) \(initResult.stderr)")
        #expect(initResult.stderr.contains("no space left on device") && initResult.stderr.contains(fresh) && initResult.stderr.split(separator: "\n").count == 1, "\(initResult.stderr)")
        #expect(!FileManager.default.fileExists(atPath: fresh), "no half-made store: \((try? FileManager.default.contentsOfDirectory(atPath: fresh)) ?? [])")
        // Records of about 1 KB (a value over half a page would take an overflow page of its own).
        let note = String(repeating: "n", count: 1_000)
        let lines = (0..<2_000).map { #"{"homeID": "\#(home)", "name": "item \#($0)", "wearCount": 1, "note": "\#(note)"}"# }
        let load = try StashCLI.run("load", store, "Item", "-", stdin: lines.joined(separator: "\n"))
        #expect(load.status == 1 && load.stderr.contains("no space left on device") && load.stderr.contains(store), "\(load.stderr.suffix(500))")
        let backup = try StashCLI.run("backup", store, (fs.path as NSString).appendingPathComponent("backup"))
        #expect(backup.status == 1 && backup.stderr.contains("no space left on device"), "\(backup.stderr)")
        #expect(!FileManager.default.fileExists(atPath: (fs.path as NSString).appendingPathComponent("backup/data.mdb")))
        // The library: the same error, typed.
        do {
            let opened = try Store.open(at: store, declaration: SchemaDeclaration(types: []))
            let error = thrownError {
                try opened.write { tx in
                    for n in 0..<2_000 { try tx.put(GenericRecord(type: "Item", id: RecordID(), fields: ["homeID": .uuid(UUID(uuidString: home)!), "name": .string("lib \(n)"), "wearCount": .int(1), "note": .string(note)])) }
                }
            } as? StoreError
            #expect(error?.code == .noSpace && error?.message.contains(opened.path) == true, "\(String(describing: error))")
        }
        #expect(try StashCLI.run("count", store, "Item").stdout == "0\n", "nothing of the refused writes")
        fs.free()
        let retry = try StashCLI.run("load", store, "Item", "-", stdin: lines.joined(separator: "\n"))
        #expect(retry.status == 0, "\(retry.stderr.suffix(300)); free \(fs.available) bytes; \((try? FileManager.default.contentsOfDirectory(atPath: fs.path)) ?? [])")
        #expect(try StashCLI.run("count", store, "Item").stdout == "2000\n")
        #expect(try StashCLI.run("verify", store).stdout.contains("clean"))
        #expect(try StashCLI.run("init", fresh, "--schema", schemaFile).status == 0)
    }
}
