import Foundation
import Stash
import StashLMDB
import Testing
import StashTestSupport

@Suite(.serialized) struct CLITests {
    /// Started with its output and error descriptors closed (as some supervisors do), the
    /// tool's store files took descriptors 1 and 2, and what it printed went into them: the
    /// record id into `data.mdb` or `lock.mdb`. They are opened on /dev/null first now.
    @Test func closedOutputDescriptorsDoNotReachTheStoreFiles() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        for n in 0..<3 {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", #"exec "$0" put "$1" Home "{\"name\": \"$2\"}" >&- 2>&-"#, StashExecutable.url.path, store, "home \(n)"]
            try process.run()
            process.waitUntilExit()
            #expect(process.terminationStatus == 0)
        }
        let opened = try Store.open(at: store)
        #expect(try opened.read { try $0.count(typeNamed: "Home") } == 3)
        #expect(try opened.verify().isClean)
        let verify = try StashCLI.run("verify", store)
        #expect(verify.status == 0, "\(verify.stdout) \(verify.stderr)")
    }

    /// Out-of-range numbers crashed the tool (a negative count of items, a NaN or infinite
    /// number of days); they are refused with one line saying what is expected.
    @Test func outOfRangeNumbersAreRefusedNotCrashedOn() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        for arguments in [["demo", "--items=-1"], ["gate", store, "status", "--max-offline-days=nan"], ["gate", store, "status", "--max-items=-2"]] {
            let result = try StashCLI.run(arguments)
            #expect(result.status == 64, "\(arguments): \(result.status) \(result.stderr)")
            #expect(result.stderr.contains("must be"), "\(arguments): \(result.stderr)")
        }
    }

    /// A record with a NaN or infinite double printed as `null` in `get` and `dump` (JSON has
    /// no such numbers, and the encoder's failure was swallowed), and dump still exited 0: a
    /// dump kept as a backup silently lost those records. They print as "NaN", "Infinity"
    /// and "-Infinity", which `put` reads back.
    /// Commands that only look (get, count, dump, stat, verify, history, peers) leave the store
    /// as it was: before, `stash verify` of a copied store gave the copy a new site.
    @Test func lookingCommandsLeaveACopiedStoreUnchanged() throws {
        let dir = TemporaryDirectory()
        let schemaPath = dir.sub("schema.json")
        try StashCLI.schema.write(toFile: schemaPath, atomically: true, encoding: .utf8)
        let original = dir.sub("original")
        #expect(try StashCLI.run("init", original, "--schema", schemaPath).status == 0)
        let put = try StashCLI.run("put", original, "Home", #"{"name": "h"}"#)
        #expect(put.status == 0, "\(put.stderr)")
        let copy = dir.sub("copy")
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: original + "/data.mdb", toPath: copy + "/data.mdb")
        let before = try Data(contentsOf: URL(fileURLWithPath: copy + "/data.mdb"))
        let id = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        for arguments in [["get", copy, "Home", id], ["count", copy, "Home"], ["dump", copy], ["stat", copy], ["verify", copy], ["history", copy], ["peers", copy]] {
            let result = try StashCLI.run(arguments)
            #expect(result.status == 0, "\(arguments): \(result.stderr)")
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: copy + "/data.mdb")) == before, "a looking command changed the store")
    }

    /// A schema file's `"kind": "any"` field takes values of every kind.
    @Test func aFieldOfAnyKindFromASchemaFile() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir, schema: #"{"types": [{"name": "Setting", "fields": [{"name": "value", "kind": "any"}]}]}"#)
        for json in [#"{"value": "dark"}"#, #"{"value": 3}"#, #"{"value": {"a": [true]}}"#] {
            let put = try StashCLI.run("put", store, "Setting", json)
            #expect(put.status == 0, "\(json): \(put.stderr)")
        }
        let dump = try StashCLI.run("dump", store, "Setting")
        #expect(dump.status == 0 && dump.stdout.split(separator: "\n").count == 3, "\(dump.stdout) \(dump.stderr)")
    }

    /// A field added by a schema file to a type with records: required, it needs a default,
    /// which the file can now give.
    @Test func aSchemaFileAddsARequiredFieldWithADefault() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir, schema: #"{"types": [{"name": "Memo", "fields": [{"name": "title", "kind": "string"}]}]}"#)
        let put = try StashCLI.run("put", store, "Memo", #"{"title": "old"}"#)
        #expect(put.status == 0, "\(put.stderr)")
        let id = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let newer = dir.sub("newer.json")
        try #"{"types": [{"name": "Memo", "fields": [{"name": "title", "kind": "string"}, {"name": "starred", "kind": "bool", "default": false}]}]}"#
            .write(toFile: newer, atomically: true, encoding: .utf8)
        let initAgain = try StashCLI.run("init", store, "--schema", newer)
        #expect(initAgain.status == 0, "\(initAgain.stderr)")
        let get = try StashCLI.run("get", store, "Memo", id)
        #expect(get.status == 0 && get.stdout.contains(#""starred":false"#), "\(get.stdout) \(get.stderr)")
    }

    /// The one exception: a store in an older format can only be read once upgraded. The
    /// looking commands upgraded it silently, a backup included; they say so now.
    @Test func lookingAtAStoreInAnOlderFormatSaysItUpgradesIt() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        #expect(try StashCLI.run("put", store, "Home", #"{"name": "h"}"#).status == 0)
        do {
            let env = try Environment.open(path: store, configuration: EnvironmentConfiguration(databases: [DatabaseSpec("meta")]))
            let meta = try env.database("meta")
            try env.write { txn in try txn.put(meta, key: Array("format".utf8), uint64: 1) }
        }
        let stat = try StashCLI.run("count", store, "Home")
        #expect(stat.status == 0 && stat.stdout == "1\n", "\(stat.stdout) \(stat.stderr)")
        #expect(stat.stderr.contains("older format") && stat.stderr.contains("upgrading it in place"), "\(stat.stderr)")
        let again = try StashCLI.run("count", store, "Home")
        #expect(again.status == 0 && again.stderr.isEmpty, "upgraded once: \(again.stderr)")
    }

    @Test func nonFiniteDoublesSurviveGetDumpAndPut() throws {
        let dir = TemporaryDirectory()
        let path = try StashCLI.makeStore(in: dir, schema: #"{"types": [{"name": "Reading", "fields": [{"name": "value", "kind": "double"}]}]}"#)
        let values: [Double] = [.nan, .infinity, -.infinity, 1.5]
        let ids = values.map { _ in RecordID() }
        do {
            let store = try Store.open(at: path)
            try store.write { tx in
                for (id, value) in zip(ids, values) { try tx.put(GenericRecord(type: "Reading", id: id, fields: ["value": .double(value)])) }
            }
        }
        let dump = try StashCLI.run("dump", path)
        #expect(dump.status == 0)
        #expect(!dump.stdout.contains("null"), "\(dump.stdout)")
        for name in ["\"NaN\"", "\"Infinity\"", "\"-Infinity\""] { #expect(dump.stdout.contains(name), "\(dump.stdout)") }
        for id in ids {
            let printed = try StashCLI.run("get", path, "Reading", id.description)
            #expect(printed.status == 0 && !printed.stdout.contains("null"), "\(printed.stdout)")
            let again = try StashCLI.run("put", dir.sub("store"), "Reading", printed.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
            #expect(again.status == 0, "\(again.stderr)")
        }
        let store = try Store.open(at: path)
        for (id, value) in zip(ids, values) {
            guard case .double(let stored)? = try store.read({ try $0.get(typeNamed: "Reading", id: id)?.fields["value"] }) else {
                Issue.record("no double for \(value)"); continue
            }
            #expect(stored == value || (stored.isNaN && value.isNaN))
        }
    }

    /// `history --follow` whose `--limit` the existing entries already reach printed them and
    /// then waited for the next commit before exiting.
    @Test func historyFollowEndsAtItsLimit() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        for name in ["a", "b"] { #expect(try StashCLI.run("put", store, "Home", #"{"name": "\#(name)"}"#).status == 0) }
        let (process, out, _) = try StashCLI.start(["history", store, "--limit", "1", "--follow"])
        let deadline = Date().addingTimeInterval(20)
        while process.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
        let ended = !process.isRunning
        if !ended { process.terminate() }
        process.waitUntilExit()
        #expect(ended, "still waiting for a commit after printing its one entry")
        let lines = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).split(separator: "\n")
        #expect(lines.count == 1, "\(lines)")
    }

    /// `history --type` with a type the store does not have (a typo) and `--limit -1`
    /// printed nothing and exited 0 (with --follow, waited forever).
    @Test func historyRefusesAnUnknownTypeAndANegativeLimit() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        #expect(try StashCLI.run("put", store, "Home", #"{"name": "a"}"#).status == 0)
        let typo = try StashCLI.run("history", store, "--type", "Hone")
        #expect(typo.status != 0 && typo.stderr.contains("Hone") && typo.stderr.contains("Home"), "\(typo.stderr)")
        let negative = try StashCLI.run("history", store, "--limit=-1")
        #expect(negative.status == 64 && negative.stderr.contains("--limit"), "\(negative.stderr)")
        // Usage mistakes exit 64 with the usage, as other usage errors do (they exited 1).
        #expect(try StashCLI.run("load", store, "Home", "-", "--batch", "0").status == 64)
        #expect(try StashCLI.run("sync", store).status == 64)
        #expect(try StashCLI.run("history", store, "--type", "Home").stdout.split(separator: "\n").count == 1)
    }

    /// `--where` values are trimmed and `null` is no value, so a name with spaces at its ends,
    /// or the name "null", could not be asked for: a value in double quotes is that string.
    @Test func aQuotedWhereValueIsThatStringExactly() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let home = try StashCLI.run("put", store, "Home", #"{"name": "Flat"}"#).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        for name in [" padded ", "null", "Lamp"] {
            let put = try StashCLI.run("put", store, "Item", #"{"homeID": "\#(home)", "name": "\#(name)", "wearCount": 1}"#)
            #expect(put.status == 0, "\(put.stderr)")
        }
        #expect(try StashCLI.run("count", store, "Item", "--where", #"name=" padded ""#).stdout == "1\n")
        #expect(try StashCLI.run("count", store, "Item", "--where", #"name="null""#).stdout == "1\n")
        #expect(try StashCLI.run("count", store, "Item", "--where", "name=Lamp").stdout == "1\n")
        #expect(try StashCLI.run("count", store, "Item", "--where", #"homeID="\#(home)""#).stdout == "3\n")
    }

    @Test func roundTripThroughTheCommandLine() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let home = try StashCLI.run("put", store, "Home", #"{"name": "Flat"}"#)
        #expect(home.status == 0, "\(home.stderr)")
        let homeID = home.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(RecordID(string: homeID) != nil)
        var itemIDs: [String] = []
        for (n, name) in ["Lamp", "Desk", "Chair"].enumerated() {
            let put = try StashCLI.run("put", store, "Item", #"{"homeID": "\#(homeID)", "name": "\#(name)", "wearCount": \#(n)}"#)
            #expect(put.status == 0, "\(put.stderr)")
            itemIDs.append(put.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        let count = try StashCLI.run("count", store, "Item", "--where", "homeID=\(homeID)", "--explain")
        #expect(count.status == 0)
        #expect(count.stdout == "3\n")
        #expect(count.stderr.contains("index homeID equality"))
        #expect(try StashCLI.run("count", store, "Item", "--where", "wearCount>=1").stdout == "2\n")

        let get = try StashCLI.run("get", store, "Item", itemIDs[1])
        #expect(get.status == 0)
        #expect(get.stdout.contains(#""name":"Desk""#))

        let dump = try StashCLI.run("dump", store)
        let lines = dump.stdout.split(separator: "\n")
        #expect(lines.count == 4)
        #expect(lines.filter { $0.contains(#""type":"Item""#) }.count == 3)

        // The same records through the library, from the schema the CLI wrote.
        let opened = try Store.open(at: store)
        #expect(try opened.read { try $0.count(typeNamed: "Item") } == 3)
        #expect(try opened.verify().isClean)

        #expect(try StashCLI.run("delete", store, "Item", itemIDs[0]).status == 0)
        #expect(try StashCLI.run("count", store, "Item").stdout == "2\n")
        let verify = try StashCLI.run("verify", store)
        #expect(verify.status == 0)
        #expect(verify.stdout.contains("clean"))
        let stat = try StashCLI.run("stat", store)
        #expect(stat.stdout.contains("Item: 2 records"))
        #expect(stat.stdout.contains("index  homeID: 2 entries"))
        let history = try StashCLI.run("history", store)
        #expect(history.stdout.split(separator: "\n").count == 5)   // 1 home + 3 items + 1 delete
    }

    /// Bad input: one line on stderr, non-zero exit, and the store exactly as before.
    @Test func badInputIsRefusedAndLeavesTheStoreUnchanged() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let homeID = try StashCLI.run("put", store, "Home", #"{"name": "Flat"}"#).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try StashCLI.run("put", store, "Item", #"{"homeID": "\#(homeID)", "name": "Lamp", "wearCount": 1}"#).status == 0)
        let before = try StashCLI.run("dump", store).stdout
        let historyBefore = try StashCLI.run("history", store).stdout

        let cases: [(args: [String], mentions: String)] = [
            (["put", dir.sub("missing"), "Item", "{}"], "no store directory"),
            (["put", store, "Nope", "{}"], "no record type 'Nope'"),
            (["put", store, "Item", #"{"homeID": "\#(homeID)", "nmae": "x", "wearCount": 1}"#], "no field 'nmae'"),
            (["put", store, "Item", #"{"homeID": "\#(homeID)", "name": "x""#], "malformed JSON"),
            (["put", store, "Item", #"{"homeID": "\#(homeID)", "name": "x", "wearCount": "many"}"#], "expects an integer"),
            (["put", store, "Item", #"{"homeID": "not-a-uuid", "name": "x", "wearCount": 1}"#], "expects a UUID"),
            (["put", store, "Item", #"{"name": "x", "wearCount": 1}"#], "needs field 'homeID'"),
            (["put", store, "Item", #"{"homeID": "\#(homeID)", "name": "Lamp", "wearCount": 2}"#], "unique index name"),
            (["put", store, "Item", "[1, 2]"], "JSON object"),
            (["get", store, "Item", "xyz"], "not a record id"),
            (["get", store, "Item", RecordID().description], "no Item with id"),
            (["delete", store, "Item", RecordID().description], "no Item with id"),
            (["count", store, "Item", "--where", "color=red"], "no field 'color'"),
            (["count", store, "Item", "--where", "wearCount~3"], "needs an operator"),
            (["dump", store, "Nope"], "no record type 'Nope'"),
            (["stat", dir.sub("missing")], "no store directory"),
            (["load", store, "Item", dir.sub("missing.jsonl")], "cannot read"),
        ]
        for (args, mention) in cases {
            let result = try StashCLI.run(args)
            #expect(result.status != 0, "\(args) should fail")
            let lines = result.stderr.split(separator: "\n")
            #expect(lines.count == 1, "\(args): expected one line on stderr, got \(result.stderr)")
            #expect(result.stderr.hasPrefix("stash: "), "\(args): \(result.stderr)")
            #expect(result.stderr.contains(mention), "\(args): '\(result.stderr)' should mention \(mention)")
        }
        #expect(try StashCLI.run("dump", store).stdout == before)
        #expect(try StashCLI.run("history", store).stdout == historyBefore)
        #expect(!FileManager.default.fileExists(atPath: dir.sub("missing")), "a failed command must not create a store")
    }

    @Test func loadChecksEveryLineBeforeWriting() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let homeID = RecordID().description
        var lines = (0..<50).map { #"{"homeID": "\#(homeID)", "name": "item \#($0)", "wearCount": \#($0)}"# }
        lines[37] = #"{"homeID": "\#(homeID)", "name": 5, "wearCount": 1}"#
        let bad = try StashCLI.run("load", store, "Item", "-", stdin: lines.joined(separator: "\n"))
        #expect(bad.status != 0)
        #expect(bad.stderr.contains("line 38"))
        #expect(try StashCLI.run("count", store, "Item").stdout == "0\n")
        lines[37] = #"{"homeID": "\#(homeID)", "name": "item 37", "wearCount": 37}"#
        let good = try StashCLI.run("load", store, "Item", "-", "--batch", "7", stdin: lines.joined(separator: "\n"))
        #expect(good.status == 0, "\(good.stderr)")
        #expect(good.stdout == "50\n")
        #expect(try StashCLI.run("count", store, "Item", "--where", "homeID=\(homeID)").stdout == "50\n")
        #expect(try StashCLI.run("history", store).stdout.split(separator: "\n").count == 8)  // ceil(50 / 7)
    }

    /// A record the store refuses (here a unique name taken by an earlier line) failed the
    /// load after the batches before it were committed, although the help promised that a
    /// failed load writes nothing, and the error named no line. The load is one transaction
    /// now; with --batch the error says what was committed.
    @Test func aRefusedRecordFailsTheWholeLoad() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let homeID = RecordID().description
        var lines = (0..<30).map { #"{"homeID": "\#(homeID)", "name": "item \#($0)", "wearCount": \#($0)}"# }
        lines[24] = #"{"homeID": "\#(homeID)", "name": "item 3", "wearCount": 0}"#
        let all = try StashCLI.run("load", store, "Item", "-", stdin: lines.joined(separator: "\n"))
        #expect(all.status != 0)
        #expect(all.stderr.contains("line 25") && all.stderr.contains("nothing was written"), "\(all.stderr)")
        // The record it clashes with is line 4's, never stored: it said "update that record
        // instead", of a record the user would not find.
        #expect(all.stderr.contains("inserted earlier in this same transaction") && !all.stderr.contains("update that record"), "\(all.stderr)")
        #expect(try StashCLI.run("count", store, "Item").stdout == "0\n")
        let batched = try StashCLI.run("load", store, "Item", "-", "--batch", "10", stdin: lines.joined(separator: "\n"))
        #expect(batched.status != 0)
        #expect(batched.stderr.contains("line 25") && batched.stderr.contains("the first 20 records were committed"), "\(batched.stderr)")
        // In batches, line 4's record was committed by the first: that one is stored.
        #expect(batched.stderr.contains("update that record instead") && !batched.stderr.contains("same transaction"), "\(batched.stderr)")
        #expect(try StashCLI.run("count", store, "Item").stdout == "20\n")
    }

    /// `stash verify` printed nothing until it was done: on a large store it looked hung. It
    /// reports progress on stderr every --progress-every items of each phase (100,000 by
    /// default) and the end of each phase that took that many; the report stays on stdout.
    @Test func verifyReportsProgressOnStandardError() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let homeID = RecordID().description
        let lines = (0..<25).map { #"{"homeID": "\#(homeID)", "name": "item \#($0)", "wearCount": \#($0)}"# }
        #expect(try StashCLI.run("load", store, "Item", "-", stdin: lines.joined(separator: "\n")).stdout == "25\n")
        let verify = try StashCLI.run("verify", store, "--progress-every", "10")
        #expect(verify.status == 0 && verify.stdout == "25 records, 50 index entries, 1 history entries checked: clean\n", "\(verify.stdout)")
        // Item's two indexes hold 50 entries; the one history entry is below 10 and is quiet.
        // Records are read type by type, then the whole index database: each phase ends
        // before the next begins.
        let expected = ["verified 10 records", "verified 20 records", "verified 25 records: done",
                        "verified 10 index entries", "verified 20 index entries", "verified 30 index entries",
                        "verified 40 index entries", "verified 50 index entries", "verified 50 index entries: done",
                        "verified 10 records for unknown types", "verified 20 records for unknown types",
                        "verified 25 records for unknown types: done",
                        "verified 10 records replayed from history", "verified 20 records replayed from history",
                        "verified 25 records replayed from history: done",
                        "verified 10 records for a history entry", "verified 20 records for a history entry",
                        "verified 25 records for a history entry: done"]
        #expect(verify.stderr.split(separator: "\n").map(String.init) == expected, "\(verify.stderr)")
        // A store smaller than the default step stays quiet.
        let quiet = try StashCLI.run("verify", store)
        #expect(quiet.status == 0 && quiet.stderr.isEmpty && quiet.stdout == verify.stdout, "\(quiet.stderr)")
        #expect(try StashCLI.run("verify", store, "--progress-every", "0").status == 64)
    }

    /// A JSON-lines file with Windows line ends was one line to `load` (Swift reads "\r\n" as
    /// one character, which a split at "\n" never meets), so it failed on line 1.
    @Test func loadReadsWindowsLineEnds() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let homeID = RecordID().description
        let lines = (0..<5).map { #"{"homeID": "\#(homeID)", "name": "crlf \#($0)", "wearCount": \#($0)}"# }
        let result = try StashCLI.run("load", store, "Item", "-", stdin: lines.joined(separator: "\r\n") + "\r\n")
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout == "5\n")
        #expect(try StashCLI.run("count", store, "Item").stdout == "5\n")
    }

    /// `dump` then `load` into a second store, and `get` then `put` into a third, give back
    /// every record exactly. Before, a dump line was refused by `load` ("no field 'type'"),
    /// dates printed to the millisecond (a date of an app read back as another instant, and an
    /// equality on the printed date found nothing), and nested dates, bytes, UUIDs and whole
    /// doubles printed as strings and integers that read back as strings and integers.
    @Test func dumpAndGetReadBackEveryValueExactly() throws {
        let dir = TemporaryDirectory()
        let schemaPath = dir.sub("schema.json")
        try #"""
        {"types": [{"name": "Note", "fields": [
          {"name": "title", "kind": "string"}, {"name": "at", "kind": "date"},
          {"name": "blob", "kind": "bytes", "optional": true}, {"name": "ref", "kind": "uuid", "optional": true},
          {"name": "score", "kind": "double"}, {"name": "tags", "kind": "array"}, {"name": "extra", "kind": "map"}]}]}
        """#.write(toFile: schemaPath, atomically: true, encoding: .utf8)
        let paths = ["a", "b", "c"].map { dir.sub($0) }
        for path in paths { #expect(try StashCLI.run("init", path, "--schema", schemaPath).status == 0) }
        let subMillisecond = Date(timeIntervalSinceReferenceDate: 785_555_555.123_456_7)
        let records: [GenericRecord] = [
            GenericRecord(type: "Note", id: RecordID(), fields: [
                "title": .string("sub-millisecond"), "at": .date(subMillisecond), "blob": .bytes(Data([0, 1, 255])),
                "ref": .uuid(UUID()), "score": .double(2),
                "tags": .array([.date(subMillisecond), .bytes(Data([9, 8])), .uuid(UUID()), .double(3), .double(-.infinity),
                                .double(0.1), .int(3), .string("$date"), .null, .map(["$date": .string("not a date")])]),
                "extra": .map(["$uuid": .int(1)])]),
            GenericRecord(type: "Note", id: RecordID(), fields: [
                "title": .string("before 2001"), "at": .date(Date(timeIntervalSinceReferenceDate: -12_345.678)),
                "score": .double(0.5), "tags": .array([.date(Date(timeIntervalSinceReferenceDate: 1e-9))]),
                "extra": .map(["when": .date(Date(timeIntervalSinceReferenceDate: 3)), "n": .double(-0.0), "deep": .map(["b": .bytes(Data())])])]),
            GenericRecord(type: "Note", id: RecordID(), fields: [
                "title": .string("whole second"), "at": .date(Date(timeIntervalSinceReferenceDate: 785_555_555)),
                "score": .double(1e300), "tags": .array([]), "extra": .map([:])]),
        ]
        do {
            let store = try Store.open(at: paths[0])
            try store.write { tx in for record in records { try tx.put(record) } }
        }
        let dump = try StashCLI.run("dump", paths[0], "Note")
        #expect(dump.status == 0, "\(dump.stderr)")
        let load = try StashCLI.run("load", paths[1], "Note", "-", stdin: dump.stdout)
        #expect(load.status == 0 && load.stdout == "3\n", "\(load.stderr)")
        for record in records {
            let get = try StashCLI.run("get", paths[0], "Note", record.id.description)
            #expect(get.status == 0, "\(get.stderr)")
            let put = try StashCLI.run("put", paths[2], "Note", get.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
            #expect(put.status == 0, "\(put.stderr)")
        }
        for path in paths[1...] {
            let store = try Store.open(at: path)
            for record in records {
                let back = try store.read { try $0.get(typeNamed: "Note", id: record.id) }
                #expect(back?.fields == record.fields, "\(path): \(record.fields["title"]!) read back as \(String(describing: back?.fields))")
            }
            // `==` takes -0.0 for 0.0: the sign must survive too (JSON "-0" was read as the integer 0).
            let extra = try store.read { try $0.get(typeNamed: "Note", id: records[1].id) }?.fields["extra"]
            guard case .map(let map)? = extra, case .double(let n)? = map["n"] else { Issue.record("\(path): no extra.n"); continue }
            #expect(n.sign == .minus, "\(path): -0.0 read back as \(n)")
        }
        // The printed date finds its record.
        let get = try StashCLI.run("get", paths[0], "Note", records[0].id.description)
        guard case .object(let printed) = try JSONValue.parse(get.stdout), case .string(let at)? = printed["at"] else {
            Issue.record("no date in \(get.stdout)"); return
        }
        #expect(try StashCLI.run("count", paths[0], "Note", "--where", "at=\(at)").stdout == "1\n", "\(at)")
        // A dump line of another type is refused with what to do.
        let wrongType = try StashCLI.run("load", paths[1], "Note", "-", stdin: #"{"type": "Home", "id": "\#(RecordID())", "fields": {}}"#)
        #expect(wrongType.status != 0 && wrongType.stderr.contains("stash dump DIR Note"), "\(wrongType.stderr)")
    }

    /// A dump of a type with a field named "type" (or "fields") did not load back: every line
    /// was taken for a record with fields "type", "id" and "fields", and refused.
    @Test func aTypeWithFieldsNamedTypeAndFieldsDumpsAndLoadsBack() throws {
        let dir = TemporaryDirectory()
        let schemaPath = dir.sub("schema.json")
        try #"{"types": [{"name": "Event", "fields": [{"name": "type", "kind": "string"}, {"name": "fields", "kind": "map", "optional": true}]}]}"#
            .write(toFile: schemaPath, atomically: true, encoding: .utf8)
        let (a, b) = (dir.sub("a"), dir.sub("b"))
        for path in [a, b] { #expect(try StashCLI.run("init", path, "--schema", schemaPath).status == 0) }
        #expect(try StashCLI.run("put", a, "Event", #"{"type": "click"}"#).status == 0)
        #expect(try StashCLI.run("put", a, "Event", #"{"type": "Event", "fields": {"x": 1}}"#).status == 0)
        let dump = try StashCLI.run("dump", a, "Event")
        let load = try StashCLI.run("load", b, "Event", "-", stdin: dump.stdout)
        #expect(load.status == 0 && load.stdout == "2\n", "\(load.stderr)")
        #expect(try StashCLI.run("dump", b, "Event").stdout == dump.stdout)
    }

    /// A load of text that is not UTF-8 (a Latin-1 export) replaced every bad byte with U+FFFD
    /// and succeeded: accented letters were lost without a word.
    @Test func aLoadOfTextThatIsNotUTF8IsRefused() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let file = dir.sub("latin1.jsonl")
        var bytes = Data(#"{"name": "ok"}"#.utf8) + Data("\n".utf8)
        bytes += Data(#"{"name": "caf"#.utf8) + Data([0xE9]) + Data(#""}"#.utf8)
        try bytes.write(to: URL(fileURLWithPath: file))
        let load = try StashCLI.run("load", store, "Home", file)
        #expect(load.status != 0 && load.stderr.contains("line 2") && load.stderr.contains("UTF-8"), "\(load.stderr)")
        #expect(try StashCLI.run("count", store, "Home").stdout == "0\n")
    }

    /// Output that cannot be written (a full disk, a closed pipe) trapped in Foundation's
    /// `FileHandle.write`: a crash with a long backtrace, after `put` had committed.
    @Test func outputThatCannotBeWrittenIsOneLine() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        for (arguments, committed) in [(["put", store, "Home", #"{"name": "full"}"#], 1), (["dump", store, "Home"], 1)] {
            let process = Process()
            process.executableURL = StashExecutable.url
            process.arguments = arguments
            process.standardOutput = FileHandle(forWritingAtPath: "/dev/full")
            let errors = Pipe()
            process.standardError = errors
            process.standardInput = FileHandle.nullDevice
            try process.run()
            let message = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            #expect(process.terminationStatus == 1, "\(arguments[0]): \(message)")
            #expect(message.hasPrefix("stash: cannot write to standard output") && message.split(separator: "\n").count == 1, "\(message)")
            #expect(try StashCLI.run("count", store, "Home").stdout == "\(committed)\n")
        }
    }

    /// Dates before 1582-10-15 printed and parsed in the Julian calendar (Foundation's
    /// formatter): 0001-01-01 printed as 0001-01-03, so a dump read by any other tool was days
    /// off. ISO 8601 counts in the proleptic Gregorian calendar (values from Python's datetime).
    @Test func datesBeforeTheGregorianReformArePrintedAsISO8601Counts() throws {
        let dir = TemporaryDirectory()
        let path = try StashCLI.makeStore(in: dir, schema: #"{"types": [{"name": "Event", "fields": [{"name": "at", "kind": "date"}]}]}"#)
        for (since1970, text) in [(-62_135_596_800.0, "0001-01-01T00:00:00Z"), (-12_219_724_800, "1582-10-10T00:00:00Z"),
                                  (-1, "1969-12-31T23:59:59Z"), (253_402_300_799, "9999-12-31T23:59:59Z")] {
            let id = try StashCLI.run("put", path, "Event", #"{"at": "\#(text)"}"#).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            let stored = try Store.open(at: path).read { try $0.get(typeNamed: "Event", id: try #require(RecordID(string: id))) }?.fields["at"]
            #expect(stored == .date(Date(timeIntervalSince1970: since1970)), "\(text): \(String(describing: stored))")
            #expect(try StashCLI.run("get", path, "Event", id).stdout.contains(text))
        }
        #expect(try StashCLI.run("put", path, "Event", #"{"at": "2023-02-29T00:00:00Z"}"#).status != 0, "no such day")
    }

    /// `init` accepted schema files the command line can never use: an index on a field the
    /// file does not declare (a typo; every write of that field is then refused), a field
    /// named "id", a type listed twice. Refused now, before anything is created.
    @Test func initRefusesSchemasTheCommandLineCannotUse() throws {
        let dir = TemporaryDirectory()
        let bad = [
            (#"{"types": [{"name": "X", "fields": [{"name": "a", "kind": "string"}], "indexes": [{"fields": ["zz"]}]}]}"#, "zz"),
            (#"{"types": [{"name": "X", "fields": [{"name": "id", "kind": "string"}]}]}"#, "\"id\""),
            (#"{"types": [{"name": "X", "fields": []}, {"name": "X", "fields": []}]}"#, "twice"),
        ]
        for (n, (schema, named)) in bad.enumerated() {
            let schemaPath = dir.sub("bad\(n).json")
            try schema.write(toFile: schemaPath, atomically: true, encoding: .utf8)
            let result = try StashCLI.run("init", dir.sub("s\(n)"), "--schema", schemaPath)
            #expect(result.status != 0 && result.stderr.contains(named), "\(schema): \(result.stderr)")
            #expect(!FileManager.default.fileExists(atPath: dir.sub("s\(n)")), "\(schema) created a store")
        }
        // A field the store holds already may be indexed by a later file that lists only the index.
        let store = try StashCLI.makeStore(in: dir, name: "kept")
        let later = dir.sub("later.json")
        try #"{"types": [{"name": "Home", "fields": [], "indexes": [{"fields": ["name"]}]}]}"#.write(toFile: later, atomically: true, encoding: .utf8)
        let result = try StashCLI.run("init", store, "--schema", later)
        #expect(result.status == 0, "\(result.stderr)")
    }

    /// A schema file that is not JSON, or not of the schema's shape, is refused with where the
    /// fault is, in one line: it printed Foundation's whole `DecodingError` (its coding keys,
    /// "Debug description: …"), and for a syntax error only that the data was not valid JSON.
    /// JSON given to `put` and `load` says where its syntax fails too (`load` named standard
    /// input "-").
    @Test func malformedJSONSaysWhere() throws {
        let dir = TemporaryDirectory()
        let bad = [
            (#"{"types": [{"name": "X", "fields": [{"name": "a"}]}]}"#, "missing field 'kind' in types[0].fields[0]"),
            (#"{"types": {"X": {}}}"#, "expected an array at types"),
            (#"{"types": [{"name": "X", "fields": [{"name": "a", "kind": "string", "optional": "yes"}]}]}"#,
             "expected a boolean at types[0].fields[0].optional"),
            (#"{"types": [{"name": "X", "fields": [{"name": "a", "kind": "strin"}]}]}"#, "at types[0].fields[0].kind"),
            (#"{"types": [{"name": "X" "fields": []}]}"#, "not valid JSON: "),
            // A misspelt key was ignored: the type was made without the fields meant, rc 0.
            (#"{"types": [{"name": "X", "fieldz": [{"name": "a", "kind": "string"}]}]}"#, "unknown key 'fieldz' (the keys here: name, fields, indexes, localOnly, references) (at types[0].fieldz)"),
            (#"{"types": [{"name": "X", "fields": [{"name": "a", "kind": "string", "optinal": true}]}]}"#, "unknown key 'optinal'"),
            (#"{"types": [{"name": "X", "fields": [{"name": "a", "kind": "string"}], "indexes": [{"field": ["a"]}]}]}"#, "unknown key 'field'"),
            (#"{"typez": []}"#, "unknown key 'typez'"),
        ]
        for (n, (schema, says)) in bad.enumerated() {
            let schemaPath = dir.sub("bad\(n).json")
            try schema.write(toFile: schemaPath, atomically: true, encoding: .utf8)
            let result = try StashCLI.run("init", dir.sub("s\(n)"), "--schema", schemaPath)
            #expect(result.status == 1 && result.stderr.contains(says) && result.stderr.contains("stash init --help"), "\(schema): \(result.stderr)")
            #expect(result.stderr.split(separator: "\n").count == 1 && !result.stderr.contains("DecodingError"), "\(result.stderr)")
            #expect(!FileManager.default.fileExists(atPath: dir.sub("s\(n)")), "\(schema) created a store")
        }
        let store = try StashCLI.makeStore(in: dir)
        // A new required field on a type with records: the advice names the schema file's
        // spelling too (it named only the Swift API's, Home.fieldDefaults["rooms"]).
        #expect(try StashCLI.run("put", store, "Home", #"{"name": "Flat"}"#).status == 0)
        let required = dir.sub("required.json")
        try #"{"types": [{"name": "Home", "fields": [{"name": "name", "kind": "string"}, {"name": "rooms", "kind": "int"}]}]}"#
            .write(toFile: required, atomically: true, encoding: .utf8)
        let added = try StashCLI.run("init", store, "--schema", required)
        #expect(added.status == 1 && added.stderr.contains(#"(in a schema file, "default" on the field)"#), "\(added.stderr)")
        let put = try StashCLI.run("put", store, "Home", #"{"name": Flat}"#)
        #expect(put.status == 1 && put.stderr.contains("malformed JSON: invalid value around character 9"), "\(put.stderr)")
        let load = try StashCLI.run(["load", store, "Home", "-"], stdin: "{\"name\": \"A\"}\n{\"name\": \n")
        #expect(load.status == 1 && load.stderr.contains("standard input line 2: malformed JSON: unexpected end of file")
                && load.stderr.contains("nothing was written"), "\(load.stderr)")
    }

    /// A read-only command on LMDB data that holds no store (an empty environment, another
    /// tool's) turned it into a store: the read-only open said to open it for writing once,
    /// and the command did.
    @Test func aReadOnlyCommandNeverMakesAStore() throws {
        let dir = TemporaryDirectory()
        let path = dir.sub("empty")
        do { _ = try Environment.open(path: path, configuration: EnvironmentConfiguration()) }
        for command in ["stat", "count", "verify"] {
            let result = try StashCLI.run(command == "count" ? [command, path, "Home"] : [command, path])
            #expect(result.status != 0 && result.stderr.contains("no Stash store"), "\(command): \(result.stderr)")
        }
        do {
            let env = try Environment.open(path: path, configuration: EnvironmentConfiguration(databases: [DatabaseSpec("meta")]))
            #expect(try env.read { try $0.statistics(env.database("meta")).entries } == 0, "a store was made")
        }
        // init still makes a store in such data (an init that crashed before its first commit).
        let crashed = dir.sub("crashed")
        do { _ = try Environment.open(path: crashed, configuration: EnvironmentConfiguration()) }
        let schemaPath = dir.sub("schema.json")
        try StashCLI.schema.write(toFile: schemaPath, atomically: true, encoding: .utf8)
        let initialized = try StashCLI.run("init", crashed, "--schema", schemaPath)
        #expect(initialized.status == 0, "\(initialized.stderr)")
    }

    /// `demo --directory` wrote its homes, items and phone/tablet/gating stores into whatever
    /// it was given, a user's store included.
    @Test func theDemoRefusesADirectoryThatIsNotEmpty() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        let before = try FileManager.default.contentsOfDirectory(atPath: store).sorted()
        let result = try StashCLI.run("demo", "--directory", store, "--items", "1")
        #expect(result.status != 0 && result.stderr.contains("not empty"), "\(result.stderr)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: store).sorted() == before)
        #expect(try StashCLI.run("count", store, "Home").stdout == "0\n")
        let fresh = try StashCLI.run("demo", "--directory", dir.sub("new"), "--items", "1")
        #expect(fresh.status == 0, "\(fresh.stderr)")
    }

    /// `count --where 'name=a<=b'` split at the "<=" inside the value (operators were tried
    /// in a fixed order, not by position) and named a field "name=a".
    @Test func aConditionSplitsAtItsFirstOperator() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir)
        #expect(try StashCLI.run("put", store, "Home", #"{"name": "a<=b"}"#).status == 0)
        let count = try StashCLI.run("count", store, "Home", "--where", "name=a<=b")
        #expect(count.status == 0 && count.stdout == "1\n", "\(count.stderr)")
        #expect(try StashCLI.run("count", store, "Home", "--where", "name<=a").stdout == "0\n")
        #expect(try StashCLI.run("count", store, "Home", "--where", "name >= a").stdout == "1\n")
    }

    @Test func demoRunsTheWholeStory() throws {
        let result = try StashCLI.run("demo")
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("loaded 3 homes"))
        #expect(result.stdout.contains("index homeID+category equality"))
        #expect(result.stdout.contains("full scan"))
        #expect(result.stdout.contains(": clean"))
    }
}
