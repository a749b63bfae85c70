import Foundation
import Stash
import StashLMDB
import Testing
import StashTestSupport

/// Damage to a store's files as a disk makes it (bytes changed in `data.mdb` behind a closed
/// store), found by the checksums every record and history entry carry; stores written before
/// checksums, upgraded; `verify`'s report bounded; thousands of types created in linear time.
@Suite struct DamageTests {
    /// A store of one home and `count` items named `item-N-abcdefgh`, each written by a
    /// transaction of its own with author `author-N-abcdefgh`; the store is released (its
    /// environment closed) when this returns.
    static func makeStore(at path: String, count: Int = 50) throws -> (Home, [Item]) {
        let store = try Store.open(at: path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        try store.insert(home)
        var items: [Item] = []
        for n in 0..<count {
            let item = Item(homeID: home.id, name: "item-\(n)-abcdefgh", category: "c", wearCount: n, price: 1)
            try store.write(author: "author-\(n)-abcdefgh") { tx in try tx.insert(item) }
            items.append(item)
        }
        #expect(try store.verify().isClean)
        return (home, items)
    }

    /// Changes one bit of `text` where the data file holds it, to another letter (valid UTF-8
    /// still: without a checksum it reads back as another value). Every copy is changed: LMDB
    /// writes pages anew, and the file keeps the older copies in free pages.
    static func changeOneLetter(of text: String, in path: String, at position: Int = 10) throws {
        var file = try DataFile(store: path)
        let places = file.offsets(of: Array(text.utf8))
        try #require(!places.isEmpty, "\(text) is not in the file")
        for place in places { file.bytes[place + position] ^= 0x01 }
        try file.write()
    }

    @Test func aByteChangedOnDiskInARecordIsFoundByItsChecksumAndNamed() throws {
        let dir = TemporaryDirectory()
        let (_, items) = try Self.makeStore(at: dir.path)
        let victim = items[17]
        try Self.changeOneLetter(of: victim.name, in: dir.path)   // "…-abcdefgh" → "…-accdefgh"
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let error = thrownError { _ = try store.get(Item.self, id: victim.id) } as? StoreError
        #expect(error?.code == .corrupted, "\(String(describing: error))")
        #expect(error?.message.contains("Item \(victim.id)") == true && error?.message.contains("checksum") == true, "\(String(describing: error))")
        #expect(error?.message.contains(store.path) == true)
        // The generic read and a query through it fail the same way; the other records read.
        #expect(throws: StoreError.self) { try store.read { try $0.get(typeNamed: "Item", id: victim.id) } }
        #expect(try store.get(Item.self, id: items[16].id) == items[16])
        let report = try store.verify()
        #expect(report.foundDamage)
        #expect(report.problems.contains { $0.contains("Item \(victim.id)") && $0.contains("checksum") }, "\(report)")
        #expect(report.description.contains("restore the store from a backup"))
    }

    @Test func aByteChangedOnDiskInAHistoryEntryIsFoundByItsChecksumAndNamed() throws {
        let dir = TemporaryDirectory()
        _ = try Self.makeStore(at: dir.path)
        let sequence = try #require(try Store.open(at: dir.path, types: [Home.self, Item.self]).history().first { $0.author == "author-23-abcdefgh" }?.sequence)
        try Self.changeOneLetter(of: "author-23-abcdefgh", in: dir.path)
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let error = thrownError { _ = try store.history() } as? StoreError
        #expect(error?.code == .corrupted && error?.message.contains("history entry \(sequence)") == true, "\(String(describing: error))")
        #expect(try store.history(after: HistoryToken(sequence: sequence)).count == 26, "the entries after it read")
        let report = try store.verify()
        #expect(report.foundDamage)
        #expect(report.problems.contains { $0.contains("history entry \(sequence)") && $0.contains("checksum") }, "\(report)")
    }

    /// The schema is checksummed too: a changed letter in a field name would otherwise rename
    /// the field for every record.
    @Test func aByteChangedOnDiskInTheSchemaIsFound() throws {
        let dir = TemporaryDirectory()
        _ = try Self.makeStore(at: dir.path, count: 2)
        try Self.changeOneLetter(of: #""name":"wearCount""#, in: dir.path, at: 9)
        let error = thrownError { _ = try Store.open(at: dir.path, types: [Home.self, Item.self]) } as? StoreError
        #expect(error?.code == .corrupted && error?.message.contains("schema does not match its checksum") == true, "\(String(describing: error))")
    }

    /// A store written before checksums (store format 2: records and history entries of format
    /// 1, no schema checksum), as this test rewrites one, is upgraded at its first open for
    /// writing, in batches of its own transactions: every record and entry gets its checksum,
    /// reads back as before, and damage to it is found from then on.
    @Test func aStoreWrittenBeforeChecksumsIsUpgradedAtItsFirstOpen() throws {
        let dir = TemporaryDirectory()
        let count = 5_000   // more than a batch (4,096)
        var items: [Item] = []
        let home = Home(name: "h")
        var historyBefore: [HistoryEntry] = []
        do {
            let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
            try store.insert(home)
            try store.write { tx in
                items = []
                for n in 0..<count {
                    let item = Item(homeID: home.id, name: "old-\(n)-abcdefgh", category: "c\(n % 7)", wearCount: n, price: Double(n))
                    try tx.insert(item)
                    items.append(item)
                }
            }
            historyBefore = try store.history()
        }
        try Self.rewriteAsFormatTwo(dir.path)
        var options = StoreOptions()
        options.readOnly = true
        #expect { try Store.open(at: dir.path, types: [Home.self, Item.self], options: options) } throws: { ($0 as? StoreError)?.code == .readOnly }
        let phases = Phases()
        options = StoreOptions()
        options.progress = { phases.add($0.phase) }
        do {
            let store = try Store.open(at: dir.path, types: [Home.self, Item.self], options: options)
            #expect(phases.all.contains("checksums of records") && phases.all.contains("checksums of history entries"), "\(phases.all)")
            for item in [items[0], items[4_095], items[4_096], items[count - 1]] { #expect(try store.get(Item.self, id: item.id) == item) }
            #expect(try store.count(Item.self) == count)
            #expect(try store.history().map(\.changes) == historyBefore.map(\.changes))
            #expect(try store.verify().isClean)
        }
        do {
            let env = try Environment.open(path: dir.path, configuration: EnvironmentConfiguration(databases: [DatabaseSpec("meta"), DatabaseSpec("records"), DatabaseSpec("history")]))
            try env.read { txn in
                #expect(try txn.uint64(try env.database("meta"), key: Array("format".utf8)) == 3)
                for name in ["records", "history"] {
                    try txn.scan(try env.database(name), from: ScanStart<[UInt8]>.first) { _, value in
                        #expect(value.first == 2 && value == resealedRecord(value), "every \(name) value has its checksum")
                        return value.first == 2
                    }
                }
            }
        }
        try Self.changeOneLetter(of: items[4_500].name, in: dir.path)
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        #expect { try store.get(Item.self, id: items[4_500].id) } throws: { ($0 as? StoreError)?.message.contains("checksum") == true }
    }

    /// Rewrites the store in `path` as the previous format wrote it: records `[01] [count]
    /// fields` and history entries `[01] …` (both without the checksum), no schema checksum,
    /// format 2. The store must not be open.
    static func rewriteAsFormatTwo(_ path: String) throws {
        let env = try Environment.open(path: path, configuration: EnvironmentConfiguration(databases: [DatabaseSpec("meta"), DatabaseSpec("records"), DatabaseSpec("history")]))
        let meta = try env.database("meta")
        for name in ["records", "history"] {
            let db = try env.database(name)
            var old: [([UInt8], [UInt8])] = []
            try env.read { txn in
                try txn.scan(db, from: ScanStart<[UInt8]>.first) { key, value in
                    old.append((key, [1] + value[5...]))
                    return true
                }
            }
            try env.write { txn in for (key, value) in old { try txn.put(db, key: key, value: value) } }
        }
        try env.write { txn in
            try txn.delete(meta, key: Array("schemaChecksum".utf8))
            try txn.put(meta, key: Array("format".utf8), uint64: 2)
        }
    }

    /// A badly damaged store (here: every index entry gone, 4,500 problems) lists the first
    /// thousand and counts the rest, so that the report stays readable and its memory bounded.
    @Test func verifyListsAThousandProblemsAndCountsTheRest() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        try store.write { tx in
            try tx.insert(home)
            for n in 0..<1_500 { try tx.insert(Item(homeID: home.id, name: "i\(n)", category: "c", wearCount: n, price: 1)) }
        }
        let env = try Environment.open(path: dir.path)
        let index = try env.database("index")
        try env.write { txn in try txn.removeAll(index) }
        let report = try store.verify()
        #expect(!report.isClean)
        #expect(report.problems.count == VerificationReport.maximumListed)
        #expect(report.problemsNotListed == 4_500 - VerificationReport.maximumListed)
        #expect(report.description.contains("4500 problem(s)") && report.description.contains("and 3500 more"), "\(report.description.prefix(200))")
    }

    /// Creating a store of 4,000 types took 29 s (a catalog of every type made again for each
    /// change of each type); opening it again was quadratic too.
    @Test func thousandsOfTypesAreCreatedAndOpenedInLinearTime() throws {
        let dir = TemporaryDirectory()
        let declaration = SchemaDeclaration(types: (0..<4_000).map { n in
            TypeDeclaration(name: "T\(n)", fields: [FieldDeclaration(name: "a", kind: .string), FieldDeclaration(name: "b", kind: .int, optional: true)],
                            indexes: [IndexDeclaration(fields: ["a"])])
        })
        var start = Date()
        do {
            let store = try Store.open(at: dir.path, declaration: declaration)
            #expect(store.schema.types.count == 4_000)
            #expect(Set(store.schema.types.map(\.tag)).count == 4_000)
            #expect(store.schema.type(named: "T3999")?.indexes.map(\.name) == ["a"])
        }
        let created = Date().timeIntervalSince(start)
        #expect(created < 10, "4,000 types created in \(created) s")
        start = Date()
        let store = try Store.open(at: dir.path, declaration: declaration)
        let reopened = Date().timeIntervalSince(start)
        #expect(reopened < 10, "4,000 types opened again in \(reopened) s")
        #expect(store.schema.types.count == 4_000)
        try store.write { tx in try tx.put(GenericRecord(type: "T1234", id: RecordID(), fields: ["a": .string("x")])) }
        #expect(try store.verify().isClean)
    }
}

/// Progress phases seen, from any thread.
final class Phases: @unchecked Sendable {
    private let lock = NSLock()
    private var seen: [String] = []
    func add(_ phase: String) { lock.withLock { if !seen.contains(phase) { seen.append(phase) } } }
    var all: [String] { lock.withLock { seen } }
}
