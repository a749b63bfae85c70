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
}
