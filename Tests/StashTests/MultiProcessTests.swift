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

/// The command-line schema's `Item` as an app declares it.
struct CLIItem: Record, Equatable {
    static var recordType: String { "Item" }
    var id = RecordID()
    var homeID: RecordID
    var name: String
    var wearCount: Int
    var note: String?
    static let indexes: [RecordIndex<CLIItem>] = [.index(\.homeID), .unique(\.name)]
}

extension MultiProcessTests {
    /// Another process (an older version of the app, a tool) opens the store with a schema
    /// that lacks an index this process counts and queries through. Before, that open removed
    /// the index: this process, whose schema still listed it, then counted no items at all
    /// and its index queries found nothing, without any error.
    @Test func anotherProcessDeclaringFewerIndexesDoesNotTakeOneAway() throws {
        let dir = TemporaryDirectory()
        let path = try StashCLI.makeStore(in: dir)
        let app = try Store.open(at: path, types: [CLIItem.self])
        let home = RecordID()
        for n in 0..<20 { try app.insert(CLIItem(homeID: home, name: "item \(n)", wearCount: n)) }
        let byHome = try app.index(\CLIItem.homeID)
        #expect(try app.count(byHome, equals: home) == 20)

        let older = StashCLI.schema.replacingOccurrences(of: #"{"fields": ["homeID"]}, "#, with: "")
        #expect(older != StashCLI.schema)
        let olderPath = dir.sub("older-schema.json")
        try older.write(toFile: olderPath, atomically: true, encoding: .utf8)
        let reinit = try StashCLI.run("init", path, "--schema", olderPath)
        #expect(reinit.status == 0, "\(reinit.stderr)")
        // That process writes into the home too.
        for n in 20..<25 {
            let put = try StashCLI.run("put", path, "Item", #"{"homeID": "\#(home)", "name": "item \#(n)", "wearCount": \#(n)}"#)
            #expect(put.status == 0, "\(put.stderr)")
        }
        #expect(try app.count(byHome, equals: home) == 25)
        #expect(try app.count(CLIItem.self, where: \.homeID, equals: home) == 25)
        #expect(try app.fetch(FetchDescriptor<CLIItem>(predicate: #Predicate { $0.homeID == home })).count == 25)
        #expect(try app.verify().isClean)

        // Removing it is asked for explicitly; the app's next open builds it again.
        let removal = try StashCLI.run("init", path, "--schema", olderPath, "--drop-undeclared-indexes")
        #expect(removal.status == 0, "\(removal.stderr)")
        #expect(try Store.open(at: path).schema.type(named: "Item")?.indexes.map(\.fields) == [["name"]])
        let reopened = try Store.open(at: path, types: [CLIItem.self])
        #expect(try reopened.count(reopened.index(\CLIItem.homeID), equals: home) == 25)
        #expect(try reopened.verify().isClean)
    }
}
