import Foundation
import Stash
import Testing
import StashTestSupport

extension CLITests {
    /// A JSON-lines file of `count` Home records whose names are `payload` bytes long, written
    /// a line at a time; every record has the id `id(n)`. Returns the file's size.
    static func writeBigJSONLines(_ path: String, count: Int, payload: Int, id: (Int) -> RecordID) throws -> Int {
        guard FileManager.default.createFile(atPath: path, contents: nil) else { throw CocoaError(.fileWriteUnknown) }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        var size = 0
        for n in 0..<count {
            let letter = Character(UnicodeScalar(UInt8(ascii: "a") + UInt8(n % 26)))
            let line = #"{"id": "\#(id(n))", "name": "\#(n) \#(String(repeating: letter, count: payload))"}"# + "\n"
            try handle.write(contentsOf: Data(line.utf8))
            size += line.utf8.count
        }
        return size
    }

    /// `load` kept the whole input in memory several times over before writing anything (the
    /// file's bytes, a String of them, and every parsed record), so a multi-GB file exhausted
    /// memory. It streams now: with --batch its peak is the tool's baseline plus about a batch,
    /// and in one transaction plus LMDB's pages of that transaction (the data's size: LMDB
    /// keeps a transaction's pages in memory until it commits).
    @Test func loadStreamsItsInputInBoundedMemory() throws {
        let dir = TemporaryDirectory()
        let ids = (0..<2_048).map { _ in RecordID() }
        let file = dir.sub("big.jsonl")
        // 2,048 lines of 32 KiB: 64 MiB, and lines that straddle every 1 MiB boundary. Stored,
        // that is more than a new store's map of 64 MiB: the map grows during the load, and
        // the write that was under way runs again, reading its lines again.
        let size = try Self.writeBigJSONLines(file, count: ids.count, payload: 32 * 1024, id: { ids[$0] })
        let small = dir.sub("small.jsonl")
        _ = try Self.writeBigJSONLines(small, count: 10, payload: 10, id: { _ in RecordID() })
        let out = dir.sub("out.txt"), err = dir.sub("err.txt")

        let baselineStore = try StashCLI.makeStore(in: dir, name: "baseline")
        let baseline = try StashExecutable.runMeasuringMemory(["load", baselineStore, "Home", small], stdout: out, stderr: err)
        let baselineErrors = try String(contentsOfFile: err, encoding: .utf8)
        #expect(baseline.status == 0, "\(baselineErrors)")

        for batch in [["--batch", "8"], []] {
            let store = try StashCLI.makeStore(in: dir, name: "store\(batch.count)")
            let run = try StashExecutable.runMeasuringMemory(["load", store, "Home", file] + batch, stdout: out, stderr: err)
            let stderr = try String(contentsOfFile: err, encoding: .utf8)
            #expect(run.status == 0, "\(stderr)")
            #expect(try String(contentsOfFile: out, encoding: .utf8) == "\(ids.count)\n")
            let growth = run.peakMemory - baseline.peakMemory
            // A batch of 8 records is 256 KiB. Before, a load peaked at about three times the
            // file's size above the baseline with --batch, four times without. (The bound with
            // --batch leaves room for the store's file pages the kernel maps around LMDB's reads.)
            let bound = batch.isEmpty ? size * 2 : size / 4
            #expect(growth < bound, "load \(batch) of \(size / 1_048_576) MiB grew by \(growth / 1_048_576) MiB over a baseline of \(baseline.peakMemory / 1_048_576) MiB (bound \(bound / 1_048_576) MiB)")
            #expect(try StashCLI.run("count", store, "Home").stdout == "\(ids.count)\n")
            #expect(try StashCLI.run("history", store).stdout.split(separator: "\n").count == (batch.isEmpty ? 1 : ids.count / 8))
            #expect(try !StashCLI.run("stat", store).stdout.contains("of 64.0 MiB"), "the map did not grow: no write ran again")
            // A line that straddles a 1 MiB read reads back whole.
            let record = try StashCLI.run("get", store, "Home", ids[31].description)
            #expect(record.stdout.contains("31 " + String(repeating: "f", count: 32 * 1024) + "\""), "\(record.stderr)")
        }
    }
}

extension CLITests {
    /// Lines read in chunks keep what a whole-file read gave them: "\r\n" and "\n" ends, blank
    /// and space-only lines skipped but counted, spaces around a line ignored, a last line
    /// without an end, and the number of a line that is not UTF-8, beyond the first chunk.
    @Test func loadReadsLinesAcrossChunks() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let padding = String(repeating: "x", count: 100_000)
        var text = ""
        for n in 0..<30 {   // 3 MiB: three chunks
            text += n % 3 == 0 ? #" {"name": "\#(n) \#(padding)"}"# + "\t\r\n" : #"{"name": "\#(n) \#(padding)"}"# + "\n"
            if n % 7 == 0 { text += n % 2 == 0 ? "\n" : " \t\r\n" }
        }
        text += #"{"name": "last"}"#
        let file = dir.sub("lines.jsonl")
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        let load = try StashCLI.run("load", store, "Home", file, "--batch", "4")
        #expect(load.status == 0 && load.stdout == "31\n", "\(load.stderr)")
        #expect(try StashCLI.run("count", store, "Home").stdout == "31\n")
        #expect(try StashCLI.run("count", store, "Home", "--where", "name=last").stdout == "1\n")
        #expect(try StashCLI.run("count", store, "Home", "--where", "name=29 \(padding)").stdout == "1\n")

        // Line 36 (30 records and 5 blank lines before it) holds a Latin-1 byte.
        var bytes = Data(text.utf8)
        bytes.removeLast(#"{"name": "last"}"#.utf8.count)
        bytes += Data(#"{"name": "caf"#.utf8) + Data([0xE9]) + Data(#""}"#.utf8) + Data("\n".utf8)
        try bytes.write(to: URL(fileURLWithPath: file))
        let refused = try StashCLI.run("load", store, "Home", file, "--batch", "4")
        #expect(refused.status == 1)
        #expect(refused.stderr == "stash: \(file) line 36: not UTF-8 text (convert it first, e.g. iconv -f latin1 -t utf-8); nothing was written\n")
        #expect(try StashCLI.run("count", store, "Home").stdout == "31\n")
    }

    /// Standard input is read twice (checked, then written), so it is copied to a temporary
    /// file in TMPDIR, which is gone when the load ends, whether it succeeded or failed; when
    /// it cannot be made, the load stops and says what to do.
    @Test func loadCopiesStandardInputToATemporaryFileItRemoves() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let spool = dir.sub("tmp")
        try FileManager.default.createDirectory(atPath: spool, withIntermediateDirectories: true)
        let good = dir.sub("good.jsonl"), bad = dir.sub("bad.jsonl")
        try (0..<20).map { #"{"name": "home \#($0)"}"# }.joined(separator: "\n").write(toFile: good, atomically: true, encoding: .utf8)
        try [#"{"name": "a"}"#, #"{"name": 5}"#].joined(separator: "\n").write(toFile: bad, atomically: true, encoding: .utf8)
        func load(_ input: String, tmp: String) throws -> (status: Int32, stdout: String, stderr: String) {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            // `cat |`: a pipe, which cannot be read twice.
            process.arguments = ["-c", #"cat "$3" | TMPDIR="$4" "$0" load "$1" "$2" - --batch 3"#, StashExecutable.url.path, store, "Home", input, tmp]
            let out = Pipe(), err = Pipe()
            process.standardOutput = out
            process.standardError = err
            try process.run()
            let stdout = out.fileHandleForReading.readDataToEndOfFile(), stderr = err.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return (process.terminationStatus, String(decoding: stdout, as: UTF8.self), String(decoding: stderr, as: UTF8.self))
        }
        let loaded = try load(good, tmp: spool)
        #expect(loaded.status == 0 && loaded.stdout == "20\n", "\(loaded.stderr)")
        let failed = try load(bad, tmp: spool)
        #expect(failed.status == 1 && failed.stderr.contains("standard input line 2"), "\(failed.stderr)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: spool).isEmpty)
        let nowhere = try load(good, tmp: dir.sub("missing"))
        #expect(nowhere.status == 1 && nowhere.stderr.contains("cannot make a temporary copy of standard input in \(dir.sub("missing"))")
                && nowhere.stderr.contains("set TMPDIR"), "\(nowhere.stderr)")
        #expect(try StashCLI.run("count", store, "Home").stdout == "20\n")
    }
}
