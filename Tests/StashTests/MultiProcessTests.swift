import Foundation
import Stash
import Testing
import StashTestSupport

/// Several processes writing one store directory at once (LMDB is multi-process).
@Suite(.serialized) struct MultiProcessTests {
    @Test func concurrentWriterProcessesLoseNothing() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let writers = 3, perWriter = 400
        var processes: [(Process, Pipe, Pipe)] = []
        var homes: [String] = []
        for w in 0..<writers {
            let homeID = RecordID().description
            homes.append(homeID)
            let lines = (0..<perWriter).map { #"{"homeID": "\#(homeID)", "name": "w\#(w)-\#($0)", "wearCount": \#($0)}"# }
            let file = dir.sub("writer\(w).jsonl")
            try lines.joined(separator: "\n").write(toFile: file, atomically: true, encoding: .utf8)
            // Small batches so the writers' transactions interleave.
            processes.append(try StashCLI.start(["load", store, "Item", file, "--batch", "5"]))
        }
        // Meanwhile this process writes too, through the library.
        let local = try Store.open(at: store)
        for n in 0..<50 {
            try local.write { tx in
                try tx.put(GenericRecord(type: "Home", id: RecordID(), fields: ["name": .string("home \(n)")]))
            }
        }
        for (process, out, err) in processes {
            let errText = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            _ = out.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            #expect(process.terminationStatus == 0, "writer failed: \(errText)")
        }
        #expect(try local.read { try $0.count(typeNamed: "Item") } == writers * perWriter)
        #expect(try local.read { try $0.count(typeNamed: "Home") } == 50)
        for home in homes {
            let n = try local.read { try $0.count(typeNamed: "Item", where: [QueryCondition(field: "homeID", op: .equal, value: .uuid(UUID(uuidString: home)!))]) }
            #expect(n == perWriter)
        }
        let report = try local.verify()
        #expect(report.isClean, "\(report)")
        // Every transaction is in the history exactly once, with increasing sequence numbers.
        let history = try local.history()
        #expect(history.count == 50 + writers * (perWriter / 5))
        #expect(zip(history, history.dropFirst()).allSatisfy { $0.sequence < $1.sequence })
        #expect(history.reduce(0) { $0 + $1.changes.count } == 50 + writers * perWriter)
        let cliVerify = try StashCLI.run("verify", store)
        #expect(cliVerify.status == 0, "\(cliVerify.stdout)")
    }
}
