import Foundation
import Stash
import StashSync
import Testing
import StashTestSupport

@Suite(.serialized) struct SyncCLITests {
    @discardableResult
    func stash(_ arguments: String...) throws -> StashExecutable.Result {
        try StashExecutable.run(arguments)
    }

    func makeStore(_ dir: TemporaryDirectory, _ name: String) throws -> String {
        let schema = dir.sub("schema.json")
        try #"{"types": [{"name": "Note", "fields": [{"name": "title", "kind": "string"}, {"name": "tally", "kind": "counter", "optional": true}]}]}"#
            .write(toFile: schema, atomically: true, encoding: .utf8)
        let path = dir.sub(name)
        #expect(try stash("init", path, "--schema", schema).status == 0)
        return path
    }

    @Test func syncExportImportAndPeersFromTheCommandLine() throws {
        let dir = TemporaryDirectory("sync-cli")
        let a = try makeStore(dir, "a"), b = try makeStore(dir, "b"), c = try makeStore(dir, "c")
        for n in 0..<5 { #expect(try stash("put", a, "Note", #"{"title": "a\#(n)"}"#).status == 0) }
        #expect(try stash("put", b, "Note", #"{"title": "from b"}"#).status == 0)

        let sync = try stash("sync", a, b)
        #expect(sync.status == 0, "\(sync.stderr)")
        #expect(sync.stdout.contains("sent 5 record states, received 1"))
        #expect(try stash("count", a, "Note").stdout == "6\n")
        #expect(try stash("count", b, "Note").stdout == "6\n")

        // A third store joins by importing a delta made for it.
        let cSite = try Store.open(at: c).siteID.description
        let file = dir.sub("for-c.delta")
        let export = try stash("export-delta", a, "--peer", cSite, "-o", file)
        #expect(export.status == 0, "\(export.stderr)")
        #expect(export.stdout.contains("6 record states"))
        let imported = try stash("import-delta", c, file)
        #expect(imported.status == 0, "\(imported.stderr)")
        #expect(imported.stdout.contains("applied 6"))
        #expect(try stash("import-delta", c, file).stdout.contains("already applied"))
        #expect(try stash("count", c, "Note").stdout == "6\n")
        #expect(try stash("verify", c).status == 0)

        let peers = try stash("peers", a)
        #expect(peers.status == 0)
        #expect(peers.stdout.contains("peer \(try Store.open(at: b).siteID)"))
        #expect(peers.stdout.contains("0 changes pending"))
        let bSite = try Store.open(at: b).siteID.description
        let forget = try stash("forget-peer", a, bSite)
        #expect(forget.status == 0 && forget.stdout.contains("forgot peer \(bSite)"), "\(forget.stderr)")
        #expect(try stash("peers", a).stdout.contains("pending (forgotten"))
        let unknown = try stash("forget-peer", a, RecordID().description)
        #expect(unknown.status != 0 && unknown.stderr.contains("peers: \(bSite)"), "\(unknown.stderr)")
        #expect(unknown.stderr.split(separator: "\n").count == 1)

        // Refusals: one line, non-zero exit, nothing changed.
        let stranger = try makeStore(dir, "stranger")
        #expect(try stash("put", stranger, "Note", #"{"title": "x"}"#).status == 0)
        #expect(try stash("sync", stranger, dir.sub("relay-unused"), "--family", RecordID().description).status != 0)
        let foreign = try stash("sync", a, stranger, "--family", RecordID().description)
        #expect(foreign.status != 0)
        #expect(foreign.stderr.split(separator: "\n").count == 1)
        var damaged = try Data(contentsOf: URL(fileURLWithPath: file))
        damaged[damaged.count / 2] ^= 0xFF
        try damaged.write(to: URL(fileURLWithPath: dir.sub("damaged.delta")))
        let refused = try stash("import-delta", b, dir.sub("damaged.delta"))
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("checksum"))
        #expect(try stash("count", b, "Note").stdout == "6\n")
    }

    /// Mistakes were found only after the command had written: `sync a a` gave `a` a random
    /// family and then failed with a riddle, `export-delta` adopted --family before reading
    /// --peer, `import-delta` of a file that is no delta blamed the missing family, and
    /// `--relay` took a store directory and wrote delta files into it.
    @Test func mistakesAreRefusedBeforeAnythingIsWritten() throws {
        let dir = TemporaryDirectory("sync-cli-mistakes")
        let a = try makeStore(dir, "a"), b = try makeStore(dir, "b")
        #expect(try stash("put", a, "Note", #"{"title": "x"}"#).status == 0)
        let same = try stash("sync", a, a + "/")
        #expect(same.status != 0 && same.stderr.contains("same store"), "\(same.stderr)")
        let badPeer = try stash("export-delta", a, "--peer", "nope", "-o", dir.sub("x.delta"), "--family", RecordID().description)
        #expect(badPeer.status != 0 && badPeer.stderr.contains("nope"), "\(badPeer.stderr)")
        let noFamily = try stash("export-delta", a, "--peer", RecordID().description, "-o", dir.sub("x.delta"))
        #expect(noFamily.status != 0 && noFamily.stderr.contains("--family"), "a CLI user cannot configure SyncConfiguration: \(noFamily.stderr)")
        let notADelta = dir.sub("schema.json")
        let imported = try stash("import-delta", b, notADelta)
        #expect(imported.status != 0 && !imported.stderr.contains("family"), "\(imported.stderr)")
        let intoStore = try stash("sync", a, "--relay", b, "--family", RecordID().description)
        #expect(intoStore.status != 0 && intoStore.stderr.contains("is a store"), "\(intoStore.stderr)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: b).sorted() == ["data.mdb", "lock.mdb"])
        for store in [a, b] {
            #expect(try SyncEngine.family(of: Store.open(at: store)) == nil, "\(store) was given a family by a refused command")
        }
    }

    /// `sync a b` said "up to date" when b parked everything a sent (a field b requires that
    /// a's records lack): only `sync b a` told. Now the parking is printed in either order.
    @Test func aDeltaTheOtherStoreParksIsReported() throws {
        let dir = TemporaryDirectory("sync-cli-parked")
        let a = dir.sub("a"), b = try makeStore(dir, "b")
        let wider = dir.sub("wider.json"), requiring = dir.sub("requiring.json")
        try #"{"types": [{"name": "Note", "fields": [{"name": "title", "kind": "string"}]}, {"name": "Tag", "fields": [{"name": "label", "kind": "string"}]}]}"#
            .write(toFile: wider, atomically: true, encoding: .utf8)
        try #"{"types": [{"name": "Note", "fields": [{"name": "title", "kind": "string"}]}, {"name": "Tag", "fields": [{"name": "label", "kind": "string"}, {"name": "weight", "kind": "int"}]}]}"#
            .write(toFile: requiring, atomically: true, encoding: .utf8)
        #expect(try stash("init", a, "--schema", wider).status == 0)
        #expect(try stash("init", b, "--schema", requiring).status == 0)
        #expect(try stash("put", a, "Tag", #"{"label": "t"}"#).status == 0)
        let sync = try stash("sync", a, b)
        #expect(sync.stdout.contains("parked 1 delta(s)") && sync.stdout.contains("stash peers"), "\(sync.stdout)")
        #expect(sync.stdout.contains("Tag.weight is required here"), "the reason is named: \(sync.stdout)")
        // Once b's schema no longer requires the weight, opening sync on b applies the parked
        // delta. That was silent: the exchange then received nothing, and an import of the
        // same delta said "already applied; nothing to do", while the record appeared.
        #expect(try stash("init", b, "--schema", wider).status == 0)
        let again = try stash("sync", a, b)
        #expect(again.status == 0, "\(again.stderr)")
        #expect(again.stdout.contains("\(b): applied 1 parked delta(s) that its schema reads now"), "\(again.stdout)")
        #expect(try stash("count", b, "Tag").stdout == "1\n")
        #expect(!(try stash("sync", a, b).stdout.contains("parked delta(s)")), "reported once")

        // The same through import-delta: parked on import, applied when the next import opens sync.
        let c = try makeStore(dir, "c")
        #expect(try stash("init", c, "--schema", requiring).status == 0)
        let cSite = try Store.open(at: c).siteID.description
        let family = try #require(try SyncEngine.family(of: Store.open(at: a))).description
        #expect(try stash("put", a, "Tag", #"{"label": "u"}"#).status == 0)
        let file = dir.sub("for-c.delta")
        #expect(try stash("export-delta", a, "--peer", cSite, "-o", file).status == 0)
        let parked = try stash("import-delta", c, file, "--family", family)
        #expect(parked.status == 0 && parked.stdout.contains("parked until the schema catches up"), "\(parked.stdout) \(parked.stderr)")
        #expect(try stash("init", c, "--schema", wider).status == 0)
        let imported = try stash("import-delta", c, file)
        #expect(imported.stdout.contains("\(c): applied 1 parked delta(s)") && imported.stdout.contains("already applied"), "\(imported.stdout)")
        #expect(try stash("count", c, "Tag").stdout == "2\n")
    }

    /// `-o -` wrote a file named "-" and an import of "-" could not read it; `-o DIR` failed
    /// with Foundation's "NSCocoaErrorDomain error 512" after the store had adopted --family.
    /// Now a delta goes through a pipe (the summary on standard error), and a directory as
    /// the output is refused before anything is written.
    @Test func aDeltaGoesThroughAPipe() throws {
        let dir = TemporaryDirectory("sync-cli-pipe")
        let a = try makeStore(dir, "a"), b = try makeStore(dir, "b")
        for n in 0..<3 { #expect(try stash("put", a, "Note", #"{"title": "p\#(n)"}"#).status == 0) }
        let family = RecordID().description
        let bSite = try Store.open(at: b).siteID.description
        let pipe = Process()
        pipe.executableURL = URL(fileURLWithPath: "/bin/sh")
        pipe.arguments = ["-c", "\"$0\" export-delta \"$1\" --peer \"$2\" --family \"$3\" -o - | \"$0\" import-delta \"$4\" -",
                          StashExecutable.url.path, a, bSite, family, b]
        let errors = Pipe(), output = Pipe()
        pipe.standardError = errors
        pipe.standardOutput = output
        try pipe.run()
        pipe.waitUntilExit()
        let stderr = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let stdout = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(pipe.terminationStatus == 0, "\(stderr)")
        #expect(stderr.contains("wrote 3 record states") && stderr.contains("to standard output"), "\(stderr)")
        #expect(stdout.contains("applied"), "\(stdout)")
        #expect(try stash("count", b, "Note").stdout == "3\n")
        #expect(!FileManager.default.fileExists(atPath: FileManager.default.currentDirectoryPath + "/-"))

        // Ids say what they should be.
        let badFamily = try stash("export-delta", a, "--peer", bSite, "--family", "notauuid", "-o", dir.sub("x.delta"))
        #expect(badFamily.status == 1 && badFamily.stderr.hasPrefix("stash: 'notauuid' is not a family id"), "\(badFamily.stderr)")
        let badPeer = try stash("export-delta", a, "--peer", "notuuid", "-o", dir.sub("x.delta"))
        #expect(badPeer.status == 1 && badPeer.stderr.hasPrefix("stash: 'notuuid' is not a site id"), "\(badPeer.stderr)")
        // A relay that is a file is called a file (it said "no such directory").
        let relayFile = dir.sub("relay-file")
        #expect(FileManager.default.createFile(atPath: relayFile, contents: Data("x".utf8)))
        let onFile = try stash("sync", a, "--relay", relayFile)
        #expect(onFile.status == 1 && onFile.stderr.contains("(a file, not a directory)"), "\(onFile.stderr)")

        let c = try makeStore(dir, "c")
        let refused = try stash("export-delta", c, "--peer", bSite, "--family", family, "-o", dir.path)
        #expect(refused.status == 1 && refused.stderr == "stash: cannot write \(dir.path): it is a directory; name the delta file to write\n", "\(refused.stderr)")
        #expect(try SyncEngine.family(of: Store.open(at: c)) == nil, "the refused export adopted the family")
    }

    @Test func relaySyncFromTheCommandLine() throws {
        let dir = TemporaryDirectory("relay-cli")
        let a = try makeStore(dir, "a"), b = try makeStore(dir, "b")
        let relay = dir.sub("relay")
        try FileManager.default.createDirectory(atPath: relay, withIntermediateDirectories: true)
        let family = RecordID().description
        #expect(try stash("put", a, "Note", #"{"title": "via relay"}"#).status == 0)
        #expect(try stash("sync", a, "--relay", relay, "--family", family).status == 0)
        let fetched = try stash("sync", b, "--relay", relay, "--family", family)
        #expect(fetched.status == 0, "\(fetched.stderr)")
        #expect(try stash("count", b, "Note").stdout == "1\n")
        let missing = try stash("sync", a, "--relay", dir.sub("no-such-relay"))
        #expect(missing.status != 0)
        #expect(missing.stderr.contains("unavailable"))
    }

    /// A store remembers its family's key: a command without `--key-file` (or with another
    /// key) is refused, naming the key's fingerprint, where an unsigned delta was accepted
    /// before. A fresh store that refuses a delta made for another store keeps no family (it
    /// adopted the delta's before, and `stash peers` showed it).
    @Test func aStoreRemembersItsFamilysKeyAndARefusedImportChangesNothing() throws {
        let dir = TemporaryDirectory("sync-cli-key")
        let a = try makeStore(dir, "a"), b = try makeStore(dir, "b"), c = try makeStore(dir, "c")
        let keyFile = dir.sub("family.key"), otherKey = dir.sub("other.key")
        try Data((0..<32).map { UInt8($0) }).write(to: URL(fileURLWithPath: keyFile))
        try Data((0..<32).map { UInt8(255 - $0) }).write(to: URL(fileURLWithPath: otherKey))
        let fingerprint = try SyncKey(Data(contentsOf: URL(fileURLWithPath: keyFile))).fingerprint
        #expect(try stash("put", a, "Note", #"{"title": "first"}"#).status == 0)
        let first = try stash("sync", a, b, "--key-file", keyFile)
        #expect(first.status == 0, "\(first.stderr)")
        #expect(try stash("peers", b).stdout.contains("sync key \(fingerprint)"))

        #expect(try stash("put", a, "Note", #"{"title": "second"}"#).status == 0)
        let bSite = try Store.open(at: b).siteID.description
        let file = dir.sub("for-b.delta")
        let keyless = try stash("export-delta", a, "--peer", bSite, "-o", file)
        #expect(keyless.status == 1 && keyless.stderr.contains(fingerprint) && keyless.stderr.contains("--key-file"), "\(keyless.stderr)")
        #expect(try stash("export-delta", a, "--peer", bSite, "-o", file, "--key-file", keyFile).status == 0)
        for key in [nil, otherKey] {
            let refused = try StashExecutable.run(["import-delta", b, file] + (key.map { ["--key-file", $0] } ?? []))
            #expect(refused.status == 1 && refused.stderr.contains(fingerprint), "\(refused.stderr)")
            #expect(try stash("count", b, "Note").stdout == "1\n")
        }
        let applied = try stash("import-delta", b, file, "--key-file", keyFile)
        #expect(applied.status == 0, "\(applied.stderr)")
        #expect(try stash("count", b, "Note").stdout == "2\n")

        // c has no family: the delta made for b is refused, and c stays without one.
        let family = try #require(try SyncEngine.family(of: Store.open(at: a))).description
        let wrongStore = try stash("import-delta", c, file, "--family", family, "--key-file", keyFile)
        #expect(wrongStore.status == 1, "\(wrongStore.stdout)")
        #expect(try stash("peers", c).stdout.contains("family none"), "the refused import adopted the family")
    }

    /// Every device of a family gone, a new one restores from the relay alone: the family id,
    /// the key file and the relay directory (before: 0 records once the relay was read).
    @Test func aNewDeviceRestoresFromTheRelayOnTheCommandLine() throws {
        let dir = TemporaryDirectory("sync-cli-restore")
        let a = try makeStore(dir, "a"), b = try makeStore(dir, "b")
        let relay = dir.sub("relay")
        try FileManager.default.createDirectory(atPath: relay, withIntermediateDirectories: true)
        let keyFile = dir.sub("family.key")
        try Data((0..<32).map { UInt8($0 * 7 % 256) }).write(to: URL(fileURLWithPath: keyFile))
        let family = RecordID().description
        for n in 0..<3 { #expect(try stash("put", a, "Note", #"{"title": "n\#(n)"}"#).status == 0) }
        #expect(try stash("sync", a, "--relay", relay, "--family", family, "--key-file", keyFile).status == 0)
        #expect(try stash("sync", b, "--relay", relay, "--family", family, "--key-file", keyFile).status == 0)
        let published = try stash("sync", a, "--relay", relay, "--key-file", keyFile, "--checkpoint")
        #expect(published.status == 0 && published.stdout.contains("checkpoint of 3 record states"), "\(published.stdout) \(published.stderr)")
        for _ in 0..<2 { for store in [a, b] { #expect(try stash("sync", store, "--relay", relay, "--key-file", keyFile).status == 0) } }
        try FileManager.default.removeItem(atPath: a)
        try FileManager.default.removeItem(atPath: b)
        let fresh = try makeStore(dir, "fresh")
        let restore = try stash("sync", fresh, "--relay", relay, "--family", family, "--key-file", keyFile)
        #expect(restore.status == 0, "\(restore.stderr)")
        #expect(restore.stdout.contains("received 3"), "\(restore.stdout)")
        #expect(try stash("count", fresh, "Note").stdout == "3\n")
        #expect(try stash("verify", fresh).status == 0)
    }
}
