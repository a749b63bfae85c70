import Foundation
import Stash
import Testing
import StashTestSupport

/// `stash update` (the named fields only) and `stash counter` (a counter changed for this
/// store's site).
@Suite struct CLIUpdateCounterTests {
    static let schema = """
    {"types": [
      {"name": "Home", "fields": [{"name": "name", "kind": "string"}]},
      {"name": "Item", "fields": [{"name": "homeID", "kind": "uuid"}, {"name": "name", "kind": "string"},
                                  {"name": "wearCount", "kind": "int"}, {"name": "note", "kind": "string", "optional": true}],
       "indexes": [{"fields": ["homeID"]}, {"fields": ["name"], "unique": true}]},
      {"name": "Wallet", "fields": [{"name": "owner", "kind": "string"}, {"name": "credits", "kind": "counter"}]}
    ]}
    """

    private func state(_ path: String, _ type: String, _ id: String) throws -> RecordState {
        let store = try Store.open(at: path, options: { var o = StoreOptions(); o.readOnly = true; return o }())
        let recordID = try #require(RecordID(string: id))
        return try store.read { try $0.recordState(typeNamed: type, id: recordID) }
    }

    @Test func updateChangesTheNamedFieldsOnlyAndKeepsTheOthersVersions() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir, schema: Self.schema)
        let home = RecordID()
        let put = try StashCLI.run("put", store, "Item", #"{"homeID": "\#(home)", "name": "Lamp", "wearCount": 1, "note": "old"}"#)
        #expect(put.status == 0, "\(put.stderr)")
        let id = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let before = try state(store, "Item", id)
        let update = try StashCLI.run("update", store, "Item", id, #"{"wearCount": 2, "note": null}"#)
        #expect(update.status == 0, "\(update.stderr)")
        let printed = try JSONValue.parse(update.stdout)
        let withNull = try JSONValue.parse(#"{"id": "\#(id)", "homeID": "\#(home)", "name": "Lamp", "wearCount": 2, "note": null}"#)
        let withoutNote = try JSONValue.parse(#"{"id": "\#(id)", "homeID": "\#(home)", "name": "Lamp", "wearCount": 2}"#)
        #expect(printed == withNull || printed == withoutNote, "\(update.stdout)")
        let after = try state(store, "Item", id)
        #expect(after.fields["wearCount"]?.value == .int(2))
        #expect((after.fields["note"]?.value ?? .null) == .null)
        #expect(after.fields["wearCount"]!.version > before.fields["wearCount"]!.version)
        #expect(after.fields["name"]?.version == before.fields["name"]?.version, "an unchanged field got a new version")
        #expect(after.fields["homeID"]?.version == before.fields["homeID"]?.version)
        #expect(try StashCLI.run("verify", store).status == 0)
    }

    @Test func updateRefusesWhatItCannotDoAndChangesNothing() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir, schema: Self.schema)
        let id = try StashCLI.run("put", store, "Item", #"{"homeID": "\#(RecordID())", "name": "Lamp", "wearCount": 1}"#)
            .stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let wallet = try StashCLI.run("put", store, "Wallet", #"{"owner": "ann", "credits": {"sites": {}}}"#)
            .stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let before = try StashCLI.run("get", store, "Item", id).stdout
        let cases: [([String], String)] = [
            (["update", store, "Item", id, #"{"colour": "red"}"#], "no field 'colour'"),
            (["update", store, "Item", id, #"{"name": null}"#], "name"),
            (["update", store, "Item", id, #"{"wearCount": "many"}"#], "wearCount"),
            (["update", store, "Item", id, #"{"id": "\#(RecordID())"}"#], "id cannot change"),
            (["update", store, "Item", id, "{}"], "at least one field"),
            (["update", store, "Item", RecordID().description, #"{"wearCount": 3}"#], "no Item with id"),
            (["update", store, "Wallet", wallet, #"{"credits": {"sites": {"x": {"increments": 100, "decrements": 0}}}}"#], "stash counter"),
        ]
        for (arguments, expected) in cases {
            let result = try StashCLI.run(arguments)
            #expect(result.status != 0, "\(arguments.last!) was accepted")
            #expect(result.stderr.contains(expected), "\(arguments.last!): \(result.stderr)")
        }
        #expect(try StashCLI.run("get", store, "Item", id).stdout == before)
    }

    /// `stash counter` changes the counter for the store's own site: two devices that each
    /// add, then sync, both count both changes.
    @Test func counterChangesTheCountForThisStoresSiteAndMergesAcrossSync() throws {
        let dir = TemporaryDirectory()
        let a = try StashCLI.makeStore(in: dir, name: "a", schema: Self.schema)
        let b = try StashCLI.makeStore(in: dir, name: "b", schema: Self.schema)
        let wallet = try StashCLI.run("put", a, "Wallet", #"{"owner": "ann", "credits": {"sites": {}}}"#)
            .stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try StashCLI.run("counter", a, "Wallet", wallet, "credits", "+5").stdout == "5\n")
        #expect(try StashCLI.run("counter", a, "Wallet", wallet, "credits", "-2").stdout == "3\n")
        let site = try Store.open(at: a, options: { var o = StoreOptions(); o.readOnly = true; return o }()).siteID
        let credits = try state(a, "Wallet", wallet).fields["credits"]?.value
        #expect(credits == .map(["sites": .map([site.description: .map(["increments": .int(5), "decrements": .int(2)])])]))
        #expect(try StashCLI.run("sync", a, b).status == 0)
        #expect(try StashCLI.run("counter", b, "Wallet", wallet, "credits", "+10").stdout == "13\n")
        #expect(try StashCLI.run("counter", a, "Wallet", wallet, "credits", "+1").stdout == "4\n")
        #expect(try StashCLI.run("sync", a, b).status == 0)
        for store in [a, b] {
            let reader = try Store.open(at: store, types: [CLIWallet.self])
            let walletID = try #require(RecordID(string: wallet))
            let credits = try #require(try reader.get(CLIWallet.self, id: walletID)).credits
            #expect(credits.value == 14, "\(store): \(credits.sites)")
        }
    }

    /// A record put or loaded without its counter starts at 0; a put or a load line that
    /// replaces a record without naming its counter keeps the stored one; a number given for a
    /// counter is refused with a pointer to `stash counter`.
    @Test func aCounterLeftOutStartsAtZeroAndIsKeptByAReplacingPut() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir, schema: Self.schema)
        let put = try StashCLI.run("put", store, "Wallet", #"{"owner": "ann"}"#)
        #expect(put.status == 0, "\(put.stderr)")
        let wallet = put.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try StashCLI.run("counter", store, "Wallet", wallet, "credits", "+5").stdout == "5\n")
        let replaced = try StashCLI.run("put", store, "Wallet", #"{"id": "\#(wallet)", "owner": "bea"}"#)
        #expect(replaced.status == 0, "\(replaced.stderr)")
        let lines = dir.url.appendingPathComponent("wallets.jsonl")
        try Data(#"{"id": "\#(wallet)", "owner": "cid"}\#n{"owner": "dan"}\#n"#.utf8).write(to: lines)
        let load = try StashCLI.run("load", store, "Wallet", lines.path)
        #expect(load.status == 0, "\(load.stderr)")
        let reader = try Store.open(at: store, types: [CLIWallet.self])
        let wallets = try reader.fetch(FetchDescriptor<CLIWallet>())
        #expect(wallets.count == 2)
        #expect(wallets.first { $0.id.description == wallet }.map { [$0.owner, "\($0.credits.value)"] } == ["cid", "5"])
        #expect(wallets.first { $0.owner == "dan" }?.credits.value == 0)
        let number = try StashCLI.run("put", store, "Wallet", #"{"owner": "eve", "credits": 3}"#)
        #expect(number.status != 0 && number.stderr.contains("is a counter") && number.stderr.contains("stash counter"), "\(number.stderr)")
    }

    @Test func counterRefusesAPlainFieldAndABadAmount() throws {
        let dir = TemporaryDirectory()
        let store = try StashCLI.makeStore(in: dir, schema: Self.schema)
        let wallet = try StashCLI.run("put", store, "Wallet", #"{"owner": "ann", "credits": {"sites": {}}}"#)
            .stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let plain = try StashCLI.run("counter", store, "Wallet", wallet, "owner", "+1")
        #expect(plain.status != 0 && plain.stderr.contains("not a counter"), "\(plain.stderr)")
        for bad in ["1.5", "many", "+"] {
            let result = try StashCLI.run("counter", store, "Wallet", wallet, "credits", bad)
            #expect(result.status != 0 && result.stderr.contains("+N or -N"), "\(bad): \(result.stderr)")
        }
        let missing = try StashCLI.run("counter", store, "Wallet", RecordID().description, "credits", "+1")
        #expect(missing.status != 0 && missing.stderr.contains("no Wallet"), "\(missing.stderr)")
    }
}

/// The schema file's `Wallet`, as a Swift type.
struct CLIWallet: Record {
    static var recordType: String { "Wallet" }
    var id = RecordID()
    var owner: String
    var credits: Counter
}
