import Foundation
import Stash
import Testing
import StashTestSupport

/// A writer process killed with SIGKILL at random points leaves a store whose data,
/// indexes, counts and history agree.
@Suite(.serialized) struct CrashTests {
    @Test func killedWriterLeavesAConsistentStore() throws {
        let dir = TemporaryDirectory()
        let path = try StashCLI.makeStore(in: dir)
        var rng = SeededGenerator(seed: 0x5EED_C0DE)
        let lines = (0..<3000).map { #"{"homeID": "\#(RecordID())", "name": "n\#($0)-\#(UUID().uuidString.prefix(6))", "wearCount": \#($0)}"# }
        let file = dir.sub("load.jsonl")
        try lines.joined(separator: "\n").write(toFile: file, atomically: true, encoding: .utf8)
        var killedMidRun = 0
        for round in 0..<8 {
            let (process, _, _) = try StashCLI.start(["load", path, "Item", file, "--batch", "4"])
            usleep(UInt32.random(in: 30_000...250_000, using: &rng))
            if process.isRunning {
                kill(process.processIdentifier, SIGKILL)
                killedMidRun += 1
            }
            process.waitUntilExit()
            let store = try Store.open(at: path)
            let report = try store.verify()
            #expect(report.isClean, "round \(round): \(report)")
            // Every committed batch is whole: the count is a multiple of the batch size,
            // and the history holds exactly the stored records' inserts.
            let count = try store.read { try $0.count(typeNamed: "Item") }
            let distinct = Set(try store.history().flatMap(\.changes).filter { $0.type == "Item" }.map(\.id))
            #expect(distinct.count == count, "round \(round)")
            #expect(count % 4 == 0 || count == lines.count, "round \(round): a batch was half-written (\(count))")
        }
        #expect(killedMidRun > 0, "the writer always finished before the kill; the test proved nothing")
    }
}
