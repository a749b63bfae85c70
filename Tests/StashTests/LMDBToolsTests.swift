import Foundation
import Stash
import Testing
import StashTestSupport

/// A store is real LMDB: LMDB's own tools read it while it is open in this process.
@Suite struct LMDBToolsTests {
    struct ToolResult {
        let status: Int32
        let output: String
        let errors: String
    }

    static func tool(_ name: String, _ arguments: [String]) throws -> ToolResult {
        let process = Process()
        process.executableURL = try LMDBTool.executable(name)
        process.arguments = arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let outData = out.fileHandleForReading.readDataToEndOfFile()
        let errData = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return ToolResult(status: process.terminationStatus, output: String(decoding: outData, as: UTF8.self),
                          errors: String(decoding: errData, as: UTF8.self))
    }

    /// `Entries: N` of each "Status of NAME" block in `mdb_stat -a` output.
    static func entriesByDatabase(_ statOutput: String) -> [String: Int] {
        var result: [String: Int] = [:]
        var current: String?
        for line in statOutput.split(separator: "\n") {
            let text = line.trimmingCharacters(in: .whitespaces)
            if text.hasPrefix("Status of ") {
                current = String(text.dropFirst("Status of ".count))
            } else if text.hasPrefix("Entries: "), let name = current {
                result[name] = Int(text.dropFirst("Entries: ".count))
            }
        }
        return result
    }

    /// The key/value pairs of `mdb_dump` output (hex format: a key line then a value line,
    /// each starting with a space, between HEADER=END and DATA=END).
    static func dumpPairs(_ dump: String) -> [(key: String, value: String)] {
        var lines: [String] = []
        var inData = false
        for line in dump.split(separator: "\n", omittingEmptySubsequences: false) {
            if line == "HEADER=END" { inData = true; continue }
            if line == "DATA=END" { inData = false; continue }
            if inData && line.hasPrefix(" ") { lines.append(String(line.dropFirst())) }
        }
        return stride(from: 0, to: lines.count - 1, by: 2).map { (lines[$0], lines[$0 + 1]) }
    }

    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    static func idHex(_ id: RecordID) -> String {
        var bytes: [UInt8] = []
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: id.high >> UInt64(shift))) }
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: id.low >> UInt64(shift))) }
        return hex(bytes)
    }

    @Test func mdbStatAndDumpReadTheStore() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        var rng = SeededGenerator(seed: 3)
        let homes = (0..<3).map { Home(name: "home \($0)") }
        var items: [Item] = []
        try store.write { tx in
            for home in homes { try tx.insert(home) }
        }
        for batch in 0..<5 {
            try store.write { tx in
                for _ in 0..<10 {
                    let item = Item.random(homes: homes.map(\.id), using: &rng)
                    try tx.insert(item)
                    items.append(item)
                }
            }
            _ = batch
        }
        try store.delete(Item.self, id: items.removeLast().id)
        let records = homes.count + items.count          // 52
        let indexEntries = items.count * Item.indexes.count
        let transactions = 1 + 5 + 1

        // mdb_stat -a: every named database, with its entry count.
        let stat = try Self.tool("mdb_stat", ["-a", dir.path])
        #expect(stat.status == 0, "mdb_stat failed: \(stat.errors)")
        let entries = Self.entriesByDatabase(stat.output)
        #expect(entries["records"] == records, "\(stat.output)")
        #expect(entries["index"] == indexEntries, "\(stat.output)")
        #expect(entries["counts"] == 2, "one count per type: \(stat.output)")
        #expect(entries["history"] == transactions, "\(stat.output)")
        #expect(entries["meta"] != nil)
        // The main database holds one entry per named database, each reported by `-a`.
        #expect(entries["Main DB"] == entries.count - 1, "\(stat.output)")
        #expect(Set(["records", "index", "counts", "history", "meta"]).isSubset(of: Set(entries.keys)))

        // mdb_dump -s records: one pair per record, keyed by type tag + id.
        let dump = try Self.tool("mdb_dump", ["-s", "records", dir.path])
        #expect(dump.status == 0, "mdb_dump failed: \(dump.errors)")
        let pairs = Self.dumpPairs(dump.output)
        #expect(pairs.count == records)
        let keys = Set(pairs.map(\.key))
        for id in homes.map(\.id) + items.map(\.id) {
            #expect(keys.contains { $0.count == 36 && $0.hasSuffix(Self.idHex(id)) }, "record \(id) in the dump")
        }
        #expect(pairs.map(\.key) == pairs.map(\.key).sorted(), "LMDB keeps keys sorted")

        // mdb_dump -s index: a DUPSORT database, one pair per (key, record id).
        let indexDump = try Self.tool("mdb_dump", ["-s", "index", dir.path])
        #expect(indexDump.status == 0, "mdb_dump -s index failed: \(indexDump.errors)")
        #expect(indexDump.output.contains("duplicates=1"), "the index database is DUPSORT")
        let indexPairs = Self.dumpPairs(indexDump.output)
        #expect(indexPairs.count == indexEntries)
        #expect(indexPairs.allSatisfy { $0.value.count == 32 }, "index values are 16-byte record ids")
        let itemIDs = Set(items.map { Self.idHex($0.id) })
        #expect(Set(indexPairs.map(\.value)) == itemIDs)
        for id in itemIDs { #expect(indexPairs.count { $0.value == id } == Item.indexes.count) }

        let history = try Self.tool("mdb_dump", ["-s", "history", dir.path])
        #expect(history.status == 0)
        #expect(Self.dumpPairs(history.output).count == transactions)

        // A database that does not exist is an error from the tool (the check can fail).
        let missing = try Self.tool("mdb_dump", ["-s", "nonexistent", dir.path])
        #expect(missing.status != 0)

        // Still usable afterwards: the tools only read.
        try store.insert(Home(name: "after"))
        let again = Self.entriesByDatabase(try Self.tool("mdb_stat", ["-a", dir.path]).output)
        #expect(again["records"] == records + 1)
        #expect(try store.verify().isClean)
    }
}
