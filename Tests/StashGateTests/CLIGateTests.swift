import Foundation
import Stash
import StashGate
import StashTestSupport
import Testing

/// The `stash` tool (StashExecutable) with a store and a key file for the gate commands.
enum GateCLI {
    typealias Result = StashExecutable.Result

    static func start(_ arguments: [String]) throws -> (Process, Pipe, Pipe) { try StashExecutable.start(arguments) }
    static func finish(_ running: (Process, Pipe, Pipe)) -> Result { StashExecutable.finish(running) }

    @discardableResult
    static func run(_ arguments: String...) throws -> Result { try StashExecutable.run(arguments) }

    static let schema = """
    {"types": [
      {"name": "Home", "fields": [{"name": "name", "kind": "string"}]},
      {"name": "Item", "fields": [{"name": "homeID", "kind": "uuid"}, {"name": "name", "kind": "string"}],
       "indexes": [{"fields": ["homeID"]}, {"fields": ["name"], "unique": true}]}
    ]}
    """

    /// A store made by `stash init`, and a key file holding the test app key as k1.
    static func makeStore(in dir: TemporaryDirectory) throws -> (store: String, keyFile: String) {
        let schemaPath = dir.sub("schema.json")
        try schema.write(toFile: schemaPath, atomically: true, encoding: .utf8)
        let store = dir.sub("store")
        let result = try run("init", store, "--schema", schemaPath)
        #expect(result.status == 0, "init failed: \(result.stderr)")
        let keyFile = dir.sub("app.keys")
        try "# test keys\nk1=\(Data(appKey).base64EncodedString())\n".write(toFile: keyFile, atomically: true, encoding: .utf8)
        return (store, keyFile)
    }
}

@Suite(.serialized) struct CLIGateTests {
    @Test func statusCanCreateAndApplySnapshot() throws {
        let dir = TemporaryDirectory()
        let (store, keys) = try GateCLI.makeStore(in: dir)
        var status = try GateCLI.run("gate", store, "status", "--user", "u1", "--key-file", keys)
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.stdout.contains("snapshot    none"))
        #expect(status.stdout.contains("tier        free (no snapshot yet)"))
        #expect(status.stdout.contains("sync        sync inactive"))

        var can = try GateCLI.run("gate", store, "can-create", "Home")
        #expect(can.status == 0 && can.stdout.hasPrefix("allowed"))
        let home = try GateCLI.run("gate", store, "create", "Home", #"{"name": "Flat"}"#)
        #expect(home.status == 0, "\(home.stderr)")
        let homeID = home.stdout.trimmingCharacters(in: .whitespacesAndNewlines).replacingOccurrences(of: "created ", with: "")
        can = try GateCLI.run("gate", store, "can-create", "Home")
        #expect(can.status == 3)
        #expect(can.stdout.hasPrefix("denied: homeLimitReached"))
        let second = try GateCLI.run("gate", store, "create", "Home", #"{"name": "Cabin"}"#)
        #expect(second.status == 3)
        #expect(second.stderr.contains("denied: homeLimitReached"))
        can = try GateCLI.run("gate", store, "can-create", "Item", "--in", homeID)
        #expect(can.status == 0)
        #expect(try GateCLI.run("gate", store, "can-create", "Item", "--in", homeID, "--max-items", "0").status == 3)
        // Without its parent a per-parent limit cannot be counted: not "allowed".
        let unparented = try GateCLI.run("gate", store, "can-create", "Item", "--max-items", "0")
        #expect(unparented.status == 3 && unparented.stdout.hasPrefix("denied: checkFailed"), "\(unparented.stdout)")
        #expect(unparented.stdout.contains("names no parent"), "\(unparented.stdout)")

        // A signed snapshot: premium for this user.
        let file = dir.sub("snapshot.json")
        let year = Date().addingTimeInterval(365 * 86_400)
        var subscription = Tx.subscription("t1", expires: 0)
        subscription.expiresAt = year
        try Data(try signer.sign(EntitlementSnapshot(userID: "u1", sequence: 3, serverTime: Date(), transactions: [subscription])).encoded())
            .write(to: URL(fileURLWithPath: file))
        let applied = try GateCLI.run("gate", store, "apply-snapshot", file, "--user", "u1", "--key-file", keys)
        #expect(applied.status == 0, "\(applied.stderr)")
        #expect(applied.stdout.contains("applied snapshot #3"))
        status = try GateCLI.run("gate", store, "status", "--user", "u1", "--key-file", keys)
        #expect(status.stdout.contains("tier        premium (cached snapshot)"), "\(status.stdout)")
        #expect(status.stdout.contains("sync        sync active"))
        #expect(try GateCLI.run("gate", store, "can-create", "Home", "--user", "u1", "--key-file", keys).status == 0)
        // Without the key the cached snapshot cannot be verified: free, reason error.
        status = try GateCLI.run("gate", store, "status", "--user", "u1")
        #expect(status.stdout.contains("tier        free (snapshot rejected)"), "\(status.stdout)")
        // Another user sees nothing of it.
        status = try GateCLI.run("gate", store, "status", "--user", "u2", "--key-file", keys)
        #expect(status.stdout.contains("tier        free (no snapshot yet)"))
        // Test overrides are explicit flags.
        #expect(try GateCLI.run("gate", store, "can-create", "Home", "--force", "pro").stdout.contains("test override"))

        // Rejections: a flipped byte, a replay, another user's snapshot.
        var tampered = Array(try Data(contentsOf: URL(fileURLWithPath: file)))
        tampered[tampered.count / 2] ^= 0x04
        try Data(tampered).write(to: URL(fileURLWithPath: dir.sub("tampered.json")))
        var rejected = try GateCLI.run("gate", store, "apply-snapshot", dir.sub("tampered.json"), "--user", "u1", "--key-file", keys)
        #expect(rejected.status == 1)
        #expect(rejected.stderr.hasPrefix("stash: snapshot"), "\(rejected.stderr)")
        try Data(try signer.sign(EntitlementSnapshot(userID: "u1", sequence: 2, serverTime: Date(), transactions: [])).encoded())
            .write(to: URL(fileURLWithPath: dir.sub("old.json")))
        rejected = try GateCLI.run("gate", store, "apply-snapshot", dir.sub("old.json"), "--user", "u1", "--key-file", keys)
        #expect(rejected.status == 1 && rejected.stderr.contains("replayedSnapshot"), "\(rejected.stderr)")
        rejected = try GateCLI.run("gate", store, "apply-snapshot", file, "--user", "u9", "--key-file", keys)
        #expect(rejected.status == 1 && rejected.stderr.contains("wrongUser"), "\(rejected.stderr)")
        // Not an envelope at all: what is missing, not Foundation's DecodingError; an unreadable
        // file: why ("cannot read" alone before).
        try Data("{}".utf8).write(to: URL(fileURLWithPath: dir.sub("empty.json")))
        rejected = try GateCLI.run("gate", store, "apply-snapshot", dir.sub("empty.json"), "--user", "u1", "--key-file", keys)
        #expect(rejected.status == 1 && rejected.stderr.hasSuffix("(expected {\"keyID\", \"payload\", \"signature\"}): missing field 'keyID'\n"), "\(rejected.stderr)")
        rejected = try GateCLI.run("gate", store, "apply-snapshot", dir.sub("nothing.json"), "--user", "u1", "--key-file", keys)
        #expect(rejected.status == 1 && rejected.stderr == "stash: cannot read \(dir.sub("nothing.json")): No such file or directory\n", "\(rejected.stderr)")
        rejected = try GateCLI.run("gate", store, "status", "--user", "u1", "--key-file", dir.path)
        #expect(rejected.status == 1 && rejected.stderr == "stash: cannot read key file \(dir.path): it is a directory; give a file\n", "\(rejected.stderr)")
        #expect(try GateCLI.run("gate", store, "status", "--user", "u1", "--key-file", keys).stdout.contains("#3"))
        // A word too many was ignored: `status extra` ran as `status`.
        rejected = try GateCLI.run("gate", store, "status", "extra", "--user", "u1", "--key-file", keys)
        #expect(rejected.status == 1 && rejected.stderr.contains("gate status takes 0 operand(s), not 1 ('extra' left over)"), "\(rejected.stderr)")
        // Errors are one line.
        let bad = try GateCLI.run("gate", store, "can-create", "Nope")
        #expect(bad.status == 1 && bad.stderr.split(separator: "\n").count == 1)
    }

    /// The README's steps, from the command line alone: a key pair, a snapshot written as
    /// JSON and signed with the private key, applied with the public key. `apply-snapshot`
    /// could not be followed before (the signed layout lived in a private function).
    @Test func keygenSignSnapshotAndApplyFromTheCommandLine() throws {
        let dir = TemporaryDirectory()
        let (store, _) = try GateCLI.makeStore(in: dir)
        let name = dir.sub("app")
        let made = try GateCLI.run("gate", "keygen", name, "--key-id", "k7")
        #expect(made.status == 0, "\(made.stderr)")
        let privateFile = name + ".private", publicFile = name + ".public"
        let mode = try FileManager.default.attributesOfItem(atPath: privateFile)[.posixPermissions] as? Int
        #expect(mode == 0o600, "the private key is readable by its owner only")
        #expect(try String(contentsOfFile: publicFile, encoding: .utf8).contains("\nk7="))
        // Never overwritten.
        let again = try GateCLI.run("gate", "keygen", name)
        #expect(again.status == 1 && again.stderr.contains("exists") && again.stderr.split(separator: "\n").count == 1, "\(again.stderr)")

        let json = dir.sub("snapshot.json")
        let later = ISO8601DateFormatter().string(from: Date().addingTimeInterval(365 * 86_400))
        try """
        {"userID": "u1", "sequence": 1, "serverTime": \(Int64(Date().timeIntervalSince1970 * 1000)),
         "transactions": [{"id": "t1", "productID": "pro.yearly", "type": "autoRenewable", "entitlements": ["pro"],
                           "purchasedAt": "2026-01-01T00:00:00Z", "expiresAt": "\(later)", "period": "yearly", "price": 29.99}]}
        """.write(toFile: json, atomically: true, encoding: .utf8)
        let signedFile = dir.sub("signed.json")
        let signing = try GateCLI.run("gate", "sign-snapshot", json, "--private-key-file", privateFile, "-o", signedFile)
        #expect(signing.status == 0 && signing.stderr.contains("signed snapshot #1 of user u1 with key 'k7'"), "\(signing.stderr)")
        let envelope = try SignedEntitlementSnapshot(decoding: Array(try Data(contentsOf: URL(fileURLWithPath: signedFile))))
        #expect(envelope.keyID == "k7")
        #expect(try EntitlementSnapshot(decoding: envelope.payload).transactions.first?.price == Decimal(string: "29.99"))
        let applied = try GateCLI.run("gate", store, "apply-snapshot", signedFile, "--user", "u1", "--public-key-file", publicFile)
        #expect(applied.status == 0, "\(applied.stderr)")
        #expect(applied.stdout.contains("applied snapshot #1: pro: subscribed"), "\(applied.stdout)")
        let status = try GateCLI.run("gate", store, "status", "--user", "u1", "--public-key-file", publicFile)
        #expect(status.stdout.contains("tier        premium (cached snapshot)"), "\(status.stdout)")
        // To standard output, from standard input.
        let piped = try StashExecutable.run(["gate", "sign-snapshot", "-", "--private-key-file", privateFile],
                                            stdin: try String(contentsOfFile: json, encoding: .utf8))
        #expect(piped.status == 0 && (try? SignedEntitlementSnapshot(decoding: Array(piped.stdout.utf8))) != nil, "\(piped.stderr)")

        // Mistakes, each one line: a misspelt member, the keys swapped, no key at all.
        try #"{"userID": "u1", "sequence": 2, "serverTime": 0, "transactions": [{"id": "t", "productID": "p", "type": "autoRenewable", "purchasedAt": 0, "expireAt": 1}]}"#
            .write(toFile: dir.sub("typo.json"), atomically: true, encoding: .utf8)
        let typo = try GateCLI.run("gate", "sign-snapshot", dir.sub("typo.json"), "--private-key-file", privateFile)
        #expect(typo.status == 1 && typo.stderr.contains("unknown member 'expireAt' in transactions[0]"), "\(typo.stderr)")
        let swapped = try GateCLI.run("gate", store, "status", "--user", "u1", "--public-key-file", privateFile)
        #expect(swapped.status == 1 && swapped.stderr.contains("PRIVATE key") && swapped.stderr.contains("--private-key-file"), "\(swapped.stderr)")
        let signedWithPublic = try GateCLI.run("gate", "sign-snapshot", json, "--private-key-file", publicFile)
        #expect(signedWithPublic.status == 1 && signedWithPublic.stderr.contains("public key"), "\(signedWithPublic.stderr)")
        let keyless = try GateCLI.run("gate", "sign-snapshot", json)
        #expect(keyless.status == 1 && keyless.stderr.contains("--private-key-file"), "\(keyless.stderr)")
        for result in [typo, swapped, signedWithPublic, keyless] { #expect(result.stderr.split(separator: "\n").count == 1, "\(result.stderr)") }
    }

    /// A bare BASE64 key, documented as key id "default", was split at its first '=': a key
    /// whose length is not a multiple of 3 bytes (16, 32, 64 …) ends in padding, so the id
    /// became the key text, the secret "=" did not decode, and the key file was refused.
    @Test func aBareKeyWithPaddingIsTheDefaultKey() throws {
        let dir = TemporaryDirectory()
        let (store, _) = try GateCLI.makeStore(in: dir)
        let shortKey = Array("0123456789abcdef".utf8)
        let bare = Data(appKey).base64EncodedString(), short = Data(shortKey).base64EncodedString()
        try #require(bare.hasSuffix("=") && !bare.hasSuffix("==") && short.hasSuffix("=="))
        let year = Date().addingTimeInterval(365 * 86_400)
        var subscription = Tx.subscription("t1", expires: 0)
        subscription.expiresAt = year
        // The bare 32-byte key beside a KEYID=BASE64 line; then a bare 16-byte key (two '=').
        let signers = [("\(bare)\nk2=\(short)\n", "default", appKey), ("\(bare)\nk2=\(short)\n", "k2", shortKey), ("\(short)\n", "default", shortKey)]
        for (n, (file, keyID, key)) in signers.enumerated() {
            let keys = dir.sub("app-\(n).keys")
            try file.write(toFile: keys, atomically: true, encoding: .utf8)
            let path = dir.sub("snapshot-\(n).json")
            let snapshot = EntitlementSnapshot(userID: "u1", sequence: UInt64(n + 1), serverTime: Date(), transactions: [subscription])
            try Data(try HMACSnapshotSigner(keyID: keyID, key: key).sign(snapshot).encoded()).write(to: URL(fileURLWithPath: path))
            let applied = try GateCLI.run("gate", store, "apply-snapshot", path, "--user", "u1", "--key-file", keys)
            #expect(applied.status == 0, "key \(keyID) #\(n + 1): \(applied.stderr)")
            #expect(applied.stdout.contains("applied snapshot #\(n + 1)"), "\(applied.stdout)")
        }
    }

    /// One Item record that cannot be read (damaged, or from a newer app): every
    /// `gate create` printed `denied checkFailed` and exit 3 with no word of the record or the
    /// cause, and `gate status` failed, although `homeID` is indexed. The limits by name walk
    /// the index now; a count that needs the records says which one failed, and why.
    @Test func anUnreadableRecordIsNamedNotAPaywall() throws {
        let dir = TemporaryDirectory()
        let schemaPath = dir.sub("schema.json")
        try """
        {"types": [
          {"name": "Home", "fields": [{"name": "name", "kind": "string"}]},
          {"name": "Item", "fields": [{"name": "homeID", "kind": "uuid"}, {"name": "ownerID", "kind": "uuid"},
                                      {"name": "name", "kind": "string"}],
           "indexes": [{"fields": ["homeID"]}]}
        ]}
        """.write(toFile: schemaPath, atomically: true, encoding: .utf8)
        let store = dir.sub("store")
        #expect(try GateCLI.run("init", store, "--schema", schemaPath).status == 0)
        // Items go into a home that exists (a creation in a home that does not is refused).
        let made = try GateCLI.run("gate", store, "create", "Home", #"{"name": "Flat"}"#)
        #expect(made.status == 0, "\(made.stderr)")
        let home = made.stdout.trimmingCharacters(in: .whitespacesAndNewlines).replacingOccurrences(of: "created ", with: "")
        let owner = UUID().uuidString
        let item = #"{"homeID": "\#(home)", "ownerID": "\#(owner)", "name": "lamp {n}"}"#
        let created = try GateCLI.run("gate", store, "create", "Item", item, "--repeat", "3")
        #expect(created.status == 0, "\(created.stderr)")
        let ids = created.stdout.split(separator: "\n").map { String($0.dropFirst("created ".count)) }
        try #require(ids.count == 3)
        try damageRecord(try #require(RecordID(string: ids[1])), inStoreAt: store)

        // Through the index on homeID: the damaged record is never read.
        let status = try GateCLI.run("gate", store, "status", "--max-items", "2")
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.stdout.contains("limit       Item per homeID: largest 3 of 2 (over the free limit)"), "\(status.stdout)")
        let home2 = try GateCLI.run("gate", store, "can-create", "Home", "--max-items", "2")
        #expect(home2.status == 3 && home2.stdout.hasPrefix("denied: overLimit"), "\(home2.stdout) \(home2.stderr)")
        #expect(try GateCLI.run("gate", store, "create", "Home", #"{"name": "Cabin"}"#, "--max-homes", "2").status == 0)

        // By ownerID, which no index holds: the records are read, and the failure names one.
        let check = try GateCLI.run("gate", store, "can-create", "Home", "--parent-field", "ownerID", "--max-items", "2", "--max-homes", "2")
        #expect(check.status == 3)
        #expect(check.stdout.hasPrefix("denied: checkFailed") && check.stdout.contains(ids[1]), "\(check.stdout)")
        let create = try GateCLI.run("gate", store, "create", "Item", item, "--parent-field", "ownerID", "--max-items", "2")
        #expect(create.status == 1, "\(create.stdout)")
        #expect(!create.stdout.contains("denied"), "\(create.stdout)")
        #expect(create.stderr.contains("creating Item") && create.stderr.contains(ids[1]) && create.stderr.contains("cannot be decoded"),
                "\(create.stderr)")
        #expect(create.stderr.split(separator: "\n").count == 1, "\(create.stderr)")
    }

    @Test func demoTellsTheGatingStory() throws {
        let dir = TemporaryDirectory()
        let result = try GateCLI.run("gate", dir.sub("demo"), "demo")
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("10 created, then denied: itemLimitReached"))
        #expect(result.stdout.contains("create home Cabin: denied: homeLimitReached"))
        #expect(result.stdout.contains("create an item in the empty Studio: denied: overLimit"))
        #expect(result.stdout.contains("after sync: A has 1, B has 1"))
        // It wrote its device stores into any directory, a store's too (and a second run into
        // the same one failed on the first run's snapshot); a file gave Foundation's error.
        let again = try GateCLI.run("gate", dir.sub("demo"), "demo")
        #expect(again.status == 1 && again.stderr == "stash: \(dir.sub("demo")) is not empty; give the demo a new or empty directory\n", "\(again.stderr)")
        let file = dir.sub("file")
        #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        let onFile = try GateCLI.run("gate", file, "demo")
        #expect(onFile.status == 1 && onFile.stderr == "stash: \(file) is a file; give the demo a new or empty directory\n", "\(onFile.stderr)")
    }

    /// Several `stash` processes authorize and insert at once; each creation is one write
    /// transaction that checks the count it commits to, so the limits hold exactly.
    @Test func racingProcessesCannotBothPassALimit() throws {
        let dir = TemporaryDirectory()
        let (store, _) = try GateCLI.makeStore(in: dir)
        // Every racer opens the store and the gate, then waits for the same signal file.
        func race(_ arguments: (Int) -> [String], _ count: Int) throws -> [GateCLI.Result] {
            let signal = dir.sub("go-\(UUID().uuidString)")
            let racers = try (0..<count).map { try GateCLI.start(arguments($0) + ["--start-when", signal]) }
            Thread.sleep(forTimeInterval: 0.5)
            #expect(FileManager.default.createFile(atPath: signal, contents: nil), "cannot create the start signal \(signal)")
            return racers.map(GateCLI.finish)
        }
        // Homes: 3 processes × 3 attempts, free limit 1.
        let homeResults = try race({ p in ["gate", store, "create", "Home", #"{"name": "p\#(p)-{n}"}"#, "--repeat", "3"] }, 3)
        for result in homeResults { #expect(result.status == 0 || result.status == 3, "\(result.stderr)") }
        let homesCreated = homeResults.flatMap { $0.stdout.split(separator: "\n") }.filter { $0.hasPrefix("created") }
        #expect(homesCreated.count == 1)
        let local = try Store.open(at: store)
        #expect(try local.read { try $0.count(typeNamed: "Home") } == 1)
        let homeID = String(homesCreated[0].dropFirst("created ".count))

        // Items: 4 processes × 8 attempts into the one home, free limit 10 per home.
        let itemResults = try race({ p in
            ["gate", store, "create", "Item", #"{"homeID": "\#(homeID)", "name": "p\#(p)-{n}"}"#, "--repeat", "8"]
        }, 4)
        for result in itemResults { #expect(result.status == 0 || result.status == 3, "\(result.stderr)") }
        let lines = itemResults.flatMap { $0.stdout.split(separator: "\n") }
        #expect(lines.filter { $0.hasPrefix("created") }.count == 10)
        #expect(lines.filter { $0 == "denied itemLimitReached" }.count == 22)
        let stored = try local.read {
            try $0.count(typeNamed: "Item", where: [QueryCondition(field: "homeID", op: .equal, value: .uuid(UUID(uuidString: homeID)!))])
        }
        #expect(stored == 10)
        let perProcess = itemResults.map { $0.stdout.split(separator: "\n").filter { $0.hasPrefix("created") }.count }
        print("racing processes: items created per process \(perProcess)")
        #expect(try local.verify().isClean)
        #expect(try local.verify().isClean)
    }
}
