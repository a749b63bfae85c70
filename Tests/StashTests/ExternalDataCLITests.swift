import Foundation
import Stash
import Testing
import StashTestSupport

@Suite struct ExternalDataCLITests {
    static let schema = """
    {"types": [{"name": "PhotoGarment", "fields": [{"name": "name", "kind": "string"}, {"name": "wearCount", "kind": "int", "default": 0},
                                                  {"name": "image", "kind": "bytes", "external": true, "optional": true}]}]}
    """

    @Test func putGetStatVerifyAndCollectBlobsFromTheCommandLine() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir, schema: Self.schema)
        let image = imageBytes(50_000, seed: 21)
        let put = try StashCLI.run("put", store, "PhotoGarment", #"{"name": "Coat", "image": "\#(image.base64EncodedString())"}"#)
        #expect(put.status == 0, "\(put.stderr)")
        let id = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let hash = ExternalData.hash(of: image)
        #expect(try Data(contentsOf: URL(fileURLWithPath: store).appendingPathComponent("blobs").appendingPathComponent(hash)) == image)

        // `get` prints the reference, which `put` takes back.
        let got = try StashCLI.run("get", store, "PhotoGarment", id)
        #expect(got.stdout.contains(hash) && got.stdout.contains("\"$blob\"") && !got.stdout.contains(image.base64EncodedString().prefix(40)))
        var copy = try JSONSerialization.jsonObject(with: Data(got.stdout.utf8)) as! [String: Any]
        copy.removeValue(forKey: "id")
        let again = try StashCLI.run("put", store, "PhotoGarment", String(decoding: try JSONSerialization.data(withJSONObject: copy), as: UTF8.self))
        #expect(again.status == 0, "\(again.stderr)")

        let stat = try StashCLI.run("stat", store)
        #expect(stat.stdout.contains("blobs    1 files"), "\(stat.stdout)")
        let statJSON = try StashCLI.run("stat", store, "--json")
        let blobs = (try JSONSerialization.jsonObject(with: Data(statJSON.stdout.utf8)) as! [String: Any])["blobs"] as? [String: Any]
        #expect(blobs?["files"] as? Int == 1 && blobs?["referenced"] as? Int == 1)
        #expect(try StashCLI.run("verify", store).status == 0)

        // A damaged blob is damage; a missing one is pending, not damage.
        let file = URL(fileURLWithPath: store).appendingPathComponent("blobs").appendingPathComponent(hash)
        var damaged = image
        damaged[0] ^= 1
        try damaged.write(to: file)
        let bad = try StashCLI.run("verify", store)
        #expect(bad.status == 1 && bad.stdout.contains(hash))
        try FileManager.default.removeItem(at: file)
        let pending = try StashCLI.run("verify", store)
        #expect(pending.status == 0 && pending.stdout.contains("1 blob(s) pending"), "\(pending.stdout)")

        // An unreferenced blob goes once older than the grace period.
        try image.write(to: file)
        _ = try StashCLI.run("delete", store, "PhotoGarment", id)
        let all = try StashCLI.run("dump", store, "PhotoGarment")
        for line in all.stdout.split(separator: "\n") {
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as! [String: Any]
            _ = try StashCLI.run("delete", store, "PhotoGarment", object["id"] as! String)
        }
        #expect(try StashCLI.run("collect-blobs", store).stdout.contains("removed 0 unreferenced blobs"))
        let collected = try StashCLI.run("collect-blobs", store, "--grace", "0")
        #expect(collected.stdout.contains("removed 1 unreferenced blobs"), "\(collected.stdout) \(collected.stderr)")
        #expect(!FileManager.default.fileExists(atPath: file.path))
    }

    /// `stash load` of records with images, killed at random moments (between a blob's write
    /// and its transaction's commit among them): every record committed has its blob whole,
    /// no blob file is half-written, and what killed writes left goes at the next collection.
    @Test func killedWritersLeaveNoMissingOrHalfWrittenBlobAndNothingForever() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir, schema: Self.schema)
        var rng = SeededGenerator(seed: 38)
        var leftBehind = 0
        for round in 0..<12 {
            // New images each round: a blob already present is only touched.
            let lines = (0..<40).map { n in
                #"{"name": "g\#(n)", "image": "\#(imageBytes(300_000, seed: UInt64(1_000 * round + n)).base64EncodedString())"}"#
            }
            let file = dir.sub("garments.jsonl")
            try lines.joined(separator: "\n").write(toFile: file, atomically: true, encoding: .utf8)
            let running = try StashCLI.start(["load", store, "PhotoGarment", file, "--batch", "1"])
            usleep(UInt32.random(in: 20_000...300_000, using: &rng))
            if running.0.isRunning { kill(running.0.processIdentifier, SIGKILL) }
            _ = StashExecutable.finish(running)

            let opened = try Store.open(at: store)
            // Nothing referenced is missing, and every blob file is whole.
            let verified = try opened.verifyBlobs()
            #expect(verified.problems.isEmpty && verified.pending.isEmpty, "round \(round): \(verified)")
            let blobs = opened.blobDirectory
            for name in (try? FileManager.default.contentsOfDirectory(atPath: blobs.path)) ?? [] where !name.hasPrefix(".") {
                #expect(ExternalData.hash(of: try Data(contentsOf: blobs.appendingPathComponent(name))) == name, "round \(round): \(name) is not whole")
            }
            #expect(try opened.verify().isClean, "round \(round)")
            let statistics = try opened.blobStatistics()
            leftBehind += statistics.unreferenced + statistics.temporary
        }
        print("killed loads left \(leftBehind) unreferenced blob or temporary files")
        #expect(leftBehind > 0, "no kill fell between a blob's write and its commit: the test proved nothing")
        // Nothing leaks for good: past the grace period it all goes, the referenced blobs stay.
        let opened = try Store.open(at: store)
        let before = try opened.blobStatistics()
        try opened.collectGarbageBlobs(olderThan: 0)
        let after = try opened.blobStatistics()
        #expect(after.unreferenced == 0 && after.temporary == 0 && after.pending == 0)
        #expect(after.referenced == before.referenced && after.files == after.referenced)
        #expect(try opened.verifyBlobs().problems.isEmpty)
    }
}

extension ExternalDataCLITests {
    /// `stash sync --relay` killed while it sends blobs, then a reader's killed while it fetches
    /// them: no half-written blob is ever visible (on the relay or in the reader's store), and
    /// the next syncs bring everything, checked.
    @Test func killedBlobTransfersLeaveNothingHalfWrittenAndCompleteLater() throws {
        let dir = TemporaryDirectory()
        let source = try StashCLI.makeStore(in: dir, name: "source", schema: Self.schema)
        let reader = try StashCLI.makeStore(in: dir, name: "reader", schema: Self.schema)
        let relay = dir.sub("relay")
        try FileManager.default.createDirectory(atPath: relay, withIntermediateDirectories: true)
        let family = RecordID().description
        let lines = (0..<40).map { n in
            #"{"name": "g\#(n)", "image": "\#(imageBytes(300_000, seed: 5_000 + UInt64(n)).base64EncodedString())"}"#
        }
        let file = dir.sub("garments.jsonl")
        try lines.joined(separator: "\n").write(toFile: file, atomically: true, encoding: .utf8)
        #expect(try StashCLI.run("load", source, "PhotoGarment", file).status == 0)

        func wholeFiles(in directory: String) throws -> Int {
            var whole = 0
            for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] where !name.hasPrefix(".") {
                let data = try Data(contentsOf: URL(fileURLWithPath: directory).appendingPathComponent(name))
                #expect(ExternalData.hash(of: data) == name, "\(directory)/\(name) is visible but not whole")
                whole += 1
            }
            return whole
        }
        var rng = SeededGenerator(seed: 3838)
        var cutShort = 0
        for side in [source, reader] {
            for _ in 0..<4 {
                let running = try StashCLI.start(["sync", side, "--relay", relay, "--family", family])
                usleep(UInt32.random(in: 10_000...250_000, using: &rng))
                if running.0.isRunning {
                    kill(running.0.processIdentifier, SIGKILL)
                    cutShort += 1
                }
                _ = StashExecutable.finish(running)
                _ = try wholeFiles(in: relay + "/blobs")
                _ = try wholeFiles(in: reader + "/blobs")
            }
            // Finished: the relay holds every blob once, the reader every one it references.
            #expect(try StashCLI.run("sync", side, "--relay", relay, "--family", family).status == 0)
        }
        #expect(cutShort > 0, "no transfer was ever interrupted: the test proved nothing")
        #expect(try wholeFiles(in: relay + "/blobs") == 40)
        let opened = try Store.open(at: reader)
        #expect(try opened.read { try $0.count(typeNamed: "PhotoGarment") } == 40)
        let verified = try opened.verifyBlobs()
        #expect(verified.problems.isEmpty && verified.pending.isEmpty)
        #expect(try wholeFiles(in: reader + "/blobs") == 40)
    }
}
