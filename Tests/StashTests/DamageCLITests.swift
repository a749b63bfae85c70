import Foundation
import Stash
import Testing
import StashTestSupport

/// The `stash` commands on damaged copies of a store (bytes changed anywhere, the file cut
/// short, LMDB's own structures broken so that liblmdb crashes): never a crash, one line on
/// stderr and exit status 1 for damage, `verify` naming what it affects; arguments that are not
/// UTF-8 refused.
@Suite struct DamageCLITests {
    static let schema = """
    {"types": [{"name": "Item", "fields": [{"name": "name", "kind": "string"}, {"name": "n", "kind": "int"},
                                            {"name": "home", "kind": "string"}],
                "indexes": [{"fields": ["home"]}, {"fields": ["n"]}]}]}
    """

    /// A store of `count` items (names `item-N-abcdefgh`, 40 items per home), loaded in
    /// batches of 7; returns its path and the ids by name.
    static func makeStore(in dir: TemporaryDirectory, count: Int = 600) throws -> (String, [String: String]) {
        let store = try StashCLI.makeStore(in: dir, schema: schema)
        let lines = (0..<count).map { #"{"name": "item-\#($0)-abcdefgh", "n": \#($0), "home": "home-\#($0 / 40)"}"# }
        let loaded = try StashCLI.run("load", store, "Item", "-", "--batch", "7", stdin: lines.joined(separator: "\n"))
        #expect(loaded.status == 0, "\(loaded.stderr)")
        let dump = try StashCLI.run("dump", store, "Item")
        var ids: [String: String] = [:]
        for line in dump.stdout.split(separator: "\n") {
            guard case .object(let object)? = try? JSONValue.parse(String(line)), case .string(let id)? = object["id"],
                  case .object(let fields)? = object["fields"], case .string(let name)? = fields["name"] else { continue }
            ids[name] = id
        }
        #expect(ids.count == count)
        return (store, ids)
    }

    /// A copy of the store directory `store` as `name` in `dir`.
    static func copy(_ store: String, to name: String, in dir: TemporaryDirectory) throws -> String {
        let copy = dir.sub(name)
        try? FileManager.default.removeItem(atPath: copy)
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: (store as NSString).appendingPathComponent("data.mdb"), toPath: (copy as NSString).appendingPathComponent("data.mdb"))
        return copy
    }

    /// The outcome every command must have on any store, damaged or not: no crash (exit 0 or
    /// 1, no signal), and a failure says why on one line.
    static func expectNoCrash(_ result: StashExecutable.Result, _ context: String) {
        #expect(result.signal == nil && (result.status == 0 || result.status == 1), "\(context): status \(result.status), signal \(String(describing: result.signal)); stderr: \(result.stderr.suffix(600))")
        if result.status == 1 && !context.hasPrefix("verify") || result.status == 1 && result.stdout.isEmpty {
            let lines = result.stderr.split(separator: "\n")
            #expect(lines.last?.hasPrefix("stash: ") == true, "\(context): \(result.stderr.suffix(600))")
        }
    }

    /// Seeded: 24 copies with 8 bytes changed at random anywhere past the meta pages, 12 cut
    /// at a random length, 12 with one letter of a stored name changed. `get`, `dump`, `stat`
    /// and `verify` never crash on any of them; every cut copy and every changed name is found
    /// (`verify` exits 1, naming the record's id where a name changed).
    @Test func damagedCopiesNeverCrashTheCommandsAndVerifyFindsDamagedRecords() throws {
        let dir = TemporaryDirectory()
        let (store, ids) = try Self.makeStore(in: dir)
        let original = try DataFile(store: store)
        var rng = SeededGenerator(seed: 39)
        let someID = ids["item-5-abcdefgh"]!
        for round in 0..<48 {
            let copy = try Self.copy(store, to: "copy", in: dir)
            var file = try DataFile(store: copy)
            let kind: String
            var damagedName: String?
            switch round % 4 {
            case 0, 1:
                kind = "8 bytes changed"
                for _ in 0..<8 {
                    let at = Int.random(in: (2 * original.pageSize)..<original.bytes.count, using: &rng)
                    file.bytes[at] = UInt8.random(in: 0...255, using: &rng)
                }
            case 2:
                kind = "cut short"
                file.bytes.removeLast(Int.random(in: original.pageSize..<(original.bytes.count - 2 * original.pageSize), using: &rng))
            default:
                let name = "item-\(Int.random(in: 0..<600, using: &rng))-abcdefgh"
                kind = "a letter of \(name) changed"
                damagedName = name
                for place in file.offsets(of: Array(name.utf8)) { file.bytes[place + 10] ^= 0x01 }
            }
            try file.write()
            let context = "round \(round) (\(kind))"
            let verify = try StashCLI.run("verify", copy)
            Self.expectNoCrash(verify, "verify, \(context)")
            for arguments in [["dump", copy], ["stat", copy], ["get", copy, "Item", someID]] {
                Self.expectNoCrash(try StashCLI.run(arguments), "\(arguments[0]), \(context)")
            }
            if kind == "cut short" {
                #expect(verify.status == 1 && verify.stderr.contains("cut short"), "\(context): \(verify.stderr)")
            }
            if let damagedName {
                let id = ids[damagedName]!
                #expect(verify.status == 1 && verify.stdout.contains("Item \(id)") && verify.stdout.contains("checksum"),
                        "\(context): \(verify.stdout.suffix(400)) \(verify.stderr.suffix(300))")
                let get = try StashCLI.run("get", copy, "Item", id)
                #expect(get.status == 1 && get.stderr.contains("checksum") && get.stderr.split(separator: "\n").count == 1, "\(context): \(get.stderr)")
            }
        }
    }

    /// Damage that makes liblmdb itself crash (a node of the records database marked as
    /// holding duplicates, which that database cannot have: LMDB follows a null pointer) is
    /// reported as damage on one line, with exit status 1, by every command that reads it.
    @Test func aCrashInsideLMDBIsReportedAsDamageOnOneLine() throws {
        let dir = TemporaryDirectory()
        let (store, ids) = try Self.makeStore(in: dir, count: 60)
        var file = try DataFile(store: store)
        // The leaf pages of the records and versions databases (neither holds duplicates):
        // nodes whose key is a record key, type tag 1 and a 16-byte id.
        let pages = (2..<file.pageCount).filter { page in
            let nodes = file.nodes(ofPage: page)
            return !nodes.isEmpty && nodes.allSatisfy { $0.key.count == 18 && $0.key[0] == 0 && $0.key[1] == 1 && $0.dataSize > 20 }
        }
        try #require(!pages.isEmpty)
        for page in pages {
            for node in file.nodes(ofPage: page) { file.setU16(file.u16(at: node.offset + 4) | 0x04, at: node.offset + 4) }   // F_DUPDATA
        }
        try file.write()
        let id = ids["item-3-abcdefgh"]!
        for arguments in [["verify", store], ["dump", store], ["get", store, "Item", id]] {
            let result = try StashCLI.run(arguments)
            #expect(result.signal == nil && result.status == 1, "\(arguments[0]): status \(result.status) signal \(String(describing: result.signal)): \(result.stderr.suffix(500))")
            let lines = result.stderr.split(separator: "\n")
            #expect(lines.count == 1 && lines[0].hasPrefix("stash: store \(store) is damaged"), "\(arguments[0]): \(result.stderr.suffix(800))")
        }
    }

    /// A damaged page of the index's duplicates (a leaf of fixed-size ids whose entry count
    /// now reads 32,760, past its page and into the pages after it) walked 21 million bogus
    /// entries in 19 s: `verify` stops at what breaks the order of the entries or at what the
    /// file can hold, reports the index database as damaged, lists a bounded report, exit 1.
    @Test func verifyStopsADamagedIndexWalkInBoundedTime() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir, schema: Self.schema)
        // 1,500 items of one home: their ids under one index key fill a sub-database of its own.
        let lines = (0..<1_500).map { #"{"name": "item-\#($0)", "n": \#($0), "home": "one"}"# }
        #expect(try StashCLI.run("load", store, "Item", "-", stdin: lines.joined(separator: "\n")).status == 0)
        var file = try DataFile(store: store)
        let fixedLeaves = (2..<file.pageCount).filter { file.flags(ofPage: $0) & 0x7F == 0x22 }   // P_LEAF | P_LEAF2
        try #require(!fixedLeaves.isEmpty)
        file.setU16(0xFFF0, at: fixedLeaves[0] * file.pageSize + 12)   // mp_lower
        try file.write()
        let start = Date()
        let verify = try StashCLI.run("verify", store)
        let seconds = Date().timeIntervalSince(start)
        #expect(verify.signal == nil && verify.status == 1, "status \(verify.status): \(verify.stderr.suffix(400))")
        #expect(seconds < 20, "verify took \(seconds) s")
        #expect(verify.stdout.contains("the index database") && verify.stdout.contains("damaged"), "\(verify.stdout.prefix(1_500))")
        #expect(verify.stdout.split(separator: "\n").count <= VerificationReport.maximumListed + 3)
    }

    /// An argument that is not UTF-8 was read with each bad byte replaced by U+FFFD: `put`
    /// stored "caf\u{FFFD}" for the Latin-1 "café". It is refused, as such a line of a `load`
    /// file is, and nothing is written.
    @Test func argumentsThatAreNotUTF8AreRefused() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir, schema: Self.schema)
        let latin1 = Array(#"{"name": "caf"#.utf8) + [0xE9] + Array(#"", "n": 1, "home": "h"}"#.utf8)
        let put = try StashExecutable.run(rawArguments: [Array("put".utf8), Array(store.utf8), Array("Item".utf8), latin1])
        #expect(put.status == 1 && put.stderr.contains("argument 4") && put.stderr.contains("not UTF-8"), "\(put.stdout) \(put.stderr)")
        #expect(put.stderr.split(separator: "\n").count == 1)
        #expect(try StashCLI.run("count", store, "Item").stdout == "0\n", "nothing was stored")
        let get = try StashExecutable.run(rawArguments: [Array("get".utf8), Array(store.utf8) + [0xFF], Array("Item".utf8), Array(RecordID().description.utf8)])
        #expect(get.status == 1 && get.stderr.contains("argument 2") && get.stderr.contains("not UTF-8"), "\(get.stderr)")
    }
}
