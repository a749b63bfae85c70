import Foundation
import Stash
import StashLMDB
import Testing
import StashTestSupport

/// `verify()` is what the property tests lean on, so it must actually find damage: each
/// kind of mismatch is made by hand through StashLMDB and must be reported.
@Suite struct VerifyTests {
    static func bytes(_ id: RecordID) -> [UInt8] {
        var out: [UInt8] = []
        for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: id.high >> UInt64(shift))) }
        for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: id.low >> UInt64(shift))) }
        return out
    }

    @Test func reportsEveryKindOfMismatch() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        var items: [Item] = []
        try store.write { tx in
            items = []
            try tx.insert(home)
            for n in 0..<10 {
                let item = Item(homeID: home.id, name: "i\(n)", category: "c", wearCount: n % 3, price: 1)
                try tx.insert(item)
                items.append(item)
            }
        }
        #expect(try store.verify().isClean)
        // The store's environment (one per path): damage it behind the store's back.
        let env = try Environment.open(path: dir.path)
        let index = try env.database("index")
        let records = try env.database("records")
        let counts = try env.database("counts")
        let victim = Self.bytes(items[3].id)
        let ghost = Self.bytes(RecordID())
        try env.write { txn in
            // 1. Remove one index entry of items[3].
            var entry: [UInt8]?
            try txn.scan(index, from: ScanStart<[UInt8]>.first) { key, value in
                if value == victim { entry = key; return false }
                return true
            }
            try txn.delete(index, key: entry!, value: victim)
            // 2. An index entry for a record that does not exist, under the same key.
            try txn.put(index, key: entry!, value: ghost)
            // 3. A wrong stored count (every type's count is off by 5).
            var countKeys: [[UInt8]] = []
            try txn.scan(counts, from: ScanStart<[UInt8]>.first) { key, _ in countKeys.append(key); return true }
            for key in countKeys { try txn.put(counts, key: key, value: [UInt8]([15, 0, 0, 0, 0, 0, 0, 0])) }
            // 4. A record whose bytes cannot be decoded.
            var recordKey: [UInt8]?
            try txn.scan(records, from: ScanStart<[UInt8]>.first) { key, _ in
                if key.suffix(16).elementsEqual(Self.bytes(items[7].id)) { recordKey = key; return false }
                return true
            }
            try txn.put(records, key: recordKey!, value: [0xFF, 0xFF, 0xFF])
        }
        let report = try store.verify()
        #expect(!report.isClean)
        let text = report.problems.joined(separator: "\n")
        #expect(report.problems.contains { $0.contains(items[3].id.description) && $0.contains("missing from index") }, "\(text)")
        #expect(report.problems.contains { $0.contains("missing record") }, "\(text)")
        #expect(report.problems.contains { $0.contains("Item") && $0.contains("count") }, "\(text)")
        #expect(report.problems.contains { $0.contains("Home") && $0.contains("count") }, "\(text)")
        #expect(report.problems.contains { $0.contains(items[7].id.description) && $0.contains("decode") }, "\(text)")
        #expect(report.description.contains("problem"))
    }

    /// A damaged value inside an intact record frame: in an indexed field `verify` threw a raw
    /// decoding error naming nothing (and the rest of the report was lost); in a field no index
    /// reads it reported the store clean, while reading the record failed.
    @Test func damagedFieldValuesAreReportedNotThrown() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        // `category` is indexed (with homeID), `name` is not.
        let inIndexed = Item(homeID: home.id, name: "plain", category: "caf\u{E9}-indexed", wearCount: 1, price: 1)
        let inPlain = Item(homeID: home.id, name: "caf\u{E9}-plain", category: "c", wearCount: 2, price: 1)
        try store.write { tx in try tx.insert(home); try tx.insert(inIndexed); try tx.insert(inPlain) }
        #expect(try store.verify().isClean)
        let env = try Environment.open(path: dir.path)
        let records = try env.database("records")
        try env.write { txn in
            var damaged: [([UInt8], [UInt8])] = []
            try txn.scan(records, from: ScanStart<[UInt8]>.first) { key, value in
                // "é" is C3 A9 in UTF-8; C3 FF is no character at all.
                if let at = value.indices.dropLast().first(where: { value[$0] == 0xC3 && value[$0 + 1] == 0xA9 }) {
                    var bytes = value
                    bytes[at + 1] = 0xFF
                    damaged.append((key, bytes))
                }
                return true
            }
            #expect(damaged.count == 2)
            // With the checksum the damaged bytes give: the frame and the checksum intact, a value
            // inside them not (the checksum alone is DamageTests' subject).
            for (key, bytes) in damaged { try txn.put(records, key: key, value: resealedRecord(bytes)) }
        }
        #expect(throws: StoreError.self) { try store.get(Item.self, id: inPlain.id) }
        let report = try store.verify()
        let text = report.problems.joined(separator: "\n")
        for item in [inIndexed, inPlain] {
            #expect(report.problems.contains { $0.contains("Item \(item.id)") && $0.contains("cannot be decoded") }, "\(text)")
        }
        #expect(report.recordsChecked == 3)
    }

    /// An insert looks for the id's versions only (every stored record has them). Should a
    /// damaged store hold a record without versions, inserting its id again must fail and
    /// roll back, not overwrite the record behind its index entries.
    @Test func insertOverARecordWithoutVersionsFailsCleanly() throws {
        let dir = TemporaryDirectory()
        let (store, item) = try Self.storeWithOneItem(in: dir)
        try Self.dropVersions(of: item.id, in: dir.path)
        #expect(try store.verify().problems.contains { $0.contains("no versions entry") })

        var again = item
        again.name = "overwritten"
        again.homeID = RecordID()
        do {
            try store.insert(again)
            Issue.record("inserting over a record without versions succeeded")
        } catch let error as StoreError {
            #expect(error.code == .corrupted)
            #expect(error.message.contains("verify"))
        }
        #expect(try store.get(Item.self, id: item.id) == item)
        #expect(try store.count(Item.self, where: \.homeID, equals: again.homeID) == 0)
        #expect(try store.count(Item.self) == 1)

        // A caller that catches the error and commits the transaction anyway: what the failed
        // insert wrote (its versions, an index entry) must not stay behind.
        try store.write { tx in
            #expect((thrownError { try tx.insert(again) } as? StoreError)?.code == .corrupted)
        }
        #expect(try store.get(Item.self, id: item.id) == item)
        #expect(try store.count(Item.self, where: \.homeID, equals: again.homeID) == 0)
        #expect(try store.count(Item.self, where: \.homeID, equals: item.homeID) == 1)
        let problems = try store.verify().problems
        #expect(problems.count == 1 && problems[0].contains("no versions entry"), "\(problems)")
    }

    /// A store in `dir` holding one home and one item of it.
    static func storeWithOneItem(in dir: TemporaryDirectory) throws -> (Store, Item) {
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        let item = Item(homeID: home.id, name: "original", category: "c", wearCount: 1, price: 1)
        try store.write { tx in
            try tx.insert(home)
            try tx.insert(item)
        }
        return (store, item)
    }

    /// Deletes the versions entry of record `id` behind the store's back, through the store's
    /// environment (one per path): a damaged store that keeps a record without versions.
    static func dropVersions(of id: RecordID, in path: String) throws {
        try StoredEntries.replace("versions", keyEndingWith: bytes(id), at: path, with: nil)
    }

    /// A merge looks for the id's versions only, as an insert does. A remote state of a record
    /// that a damaged store keeps without versions is still merged with that record (the put
    /// refuses to overwrite it blindly, the merge then reads it): refused, every delta holding
    /// the record would hold back its source for good.
    @Test func aMergeOverARecordWithoutVersionsMergesWithIt() throws {
        let dir = TemporaryDirectory()
        let (store, item) = try Self.storeWithOneItem(in: dir)
        var remote = try store.read { try $0.recordState(typeNamed: "Item", id: item.id) }
        let later = Version(clock: try #require(remote.latestVersion).clock + 1_000, site: RecordID())
        remote.fields["name"] = FieldState(value: .string("from the peer"), version: later)
        try Self.dropVersions(of: item.id, in: dir.path)

        let changed = try store.write { tx in try tx.merge(remote, origin: later.site) }
        #expect(changed)
        var expected = item
        expected.name = "from the peer"
        #expect(try store.get(Item.self, id: item.id) == expected)
        #expect(try store.count(Item.self, where: \.homeID, equals: item.homeID) == 1)
        #expect(try store.count(Item.self) == 1)
        #expect(try store.verify().problems.isEmpty, "the record has versions again")
    }

    /// History entries are never overwritten: should a damaged `meta` send the next sequence
    /// number back onto an existing entry, the write fails as corrupted and the entry stays.
    @Test func aSequenceSentBackIsReportedNotOverwritten() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        try store.insert(Home(name: "one"))
        try store.insert(Home(name: "two"))
        let before = try store.history()
        #expect(before.count == 2)
        let env = try Environment.open(path: dir.path)
        let meta = try env.database("meta")
        try env.write { txn in try txn.put(meta, key: Array("nextSequence".utf8), uint64: 1) }
        let error = thrownError { try store.insert(Home(name: "three")) } as? StoreError
        #expect(error?.code == .corrupted)
        #expect(error?.message.contains("verify") == true)
        #expect(try store.history() == before)
        #expect(try store.count(Home.self) == 2)
    }

    /// A count damaged past `Int.max` trapped every count and every write of its type (and
    /// verify): it is now a `.corrupted` error naming the store, and a problem verify reports.
    @Test func aDamagedCountIsAnErrorNotACrash() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        try store.insert(Home(name: "h"))
        let env = try Environment.open(path: dir.path)
        let counts = try env.database("counts")
        try env.write { txn in
            var keys: [[UInt8]] = []
            try txn.scan(counts, from: ScanStart<[UInt8]>.first) { key, _ in keys.append(key); return true }
            for key in keys { try txn.put(counts, key: key, value: [UInt8]([0, 0, 0, 0, 0, 0, 0, 0x80])) }
        }
        for attempt in [{ _ = try store.count(Home.self) }, { try store.insert(Home(name: "i")) }] {
            let error = thrownError(attempt) as? StoreError
            #expect(error?.code == .corrupted && error?.message.contains(store.path) == true, "\(String(describing: error))")
        }
        let report = try store.verify()
        #expect(report.problems.contains { $0.contains("Home") && $0.contains("count") }, "\(report.problems)")
    }

    /// Index entries and counts were checked only under the indexes and types of the schema:
    /// entries a drop left behind, or entries and a count under a type tag the schema does not
    /// know, were never read and the store was called clean.
    @Test func reportsIndexEntriesAndCountsOutsideTheSchema() throws {
        let dir = TemporaryDirectory()
        let indexed = try Store.open(at: dir.path, types: [GarmentIndexed.self])
        try indexed.write { tx in for n in 0..<6 { try tx.insert(GarmentIndexed(name: "g\(n)", size: n % 2)) } }
        let garment = try #require(indexed.schema.type(named: "Garment"))
        let bySize = try #require(garment.index(named: "size"))
        let env = try Environment.open(path: dir.path)
        let index = try env.database("index")
        let counts = try env.database("counts")
        // The entries of the size index, to put back after it is dropped.
        let sizePrefix = [UInt8(garment.tag >> 8), UInt8(garment.tag & 0xFF), UInt8(bySize.tag >> 8), UInt8(bySize.tag & 0xFF)]
        let left = try env.read { txn in
            var entries: [([UInt8], [UInt8])] = []
            try txn.scan(index, prefix: sizePrefix) { key, value in entries.append((key, value)); return true }
            return entries
        }
        #expect(left.count == 6)
        var removing = StoreOptions()
        removing.dropsUndeclaredIndexes = true
        let store = try Store.open(at: dir.path, types: [GarmentV1.self], options: removing)
        #expect(store.schema.type(named: "Garment")?.indexes.isEmpty == true)
        #expect(try store.verify().isClean)
        // The tag the next new type would be given.
        let unknownType = (store.schema.types.map(\.tag).max() ?? 0) + 1
        let ghost = [UInt8(unknownType >> 8), UInt8(unknownType & 0xFF)]
        try env.write { txn in
            // 1. A drop that left its entries behind.
            for (key, value) in left { try txn.put(index, key: key, value: value) }
            // 2. Entries and a count under a type tag the schema does not know.
            for _ in 0..<2 { try txn.put(index, key: ghost + [0, 1, 7], value: Self.bytes(RecordID())) }
            try txn.put(counts, key: ghost, value: [UInt8]([2, 0, 0, 0, 0, 0, 0, 0]))
        }
        var finished: [VerificationProgress] = []
        let report = try store.verify(progressEvery: 1) { if $0.isFinished { finished.append($0) } }
        let text = report.problems.joined(separator: "\n")
        #expect(report.problems.contains { $0.contains("Garment") && $0.contains("6 index entries") && $0.contains("index tag \(bySize.tag)") }, "\(text)")
        #expect(report.problems.contains { $0.contains("2 index entries") && $0.contains("type tag \(unknownType)") }, "\(text)")
        #expect(report.problems.contains { $0.contains("count") && $0.contains("type tag \(unknownType)") }, "\(text)")
        #expect(report.problems.count == 3, "\(text)")
        // Every entry of the index database is read, and counted in the report and the progress.
        #expect(report.indexEntriesChecked == 8)
        #expect(finished.first { $0.phase == .indexEntries }?.checked == 8)
    }

    /// The unique check skipped shortened keys (strings over 120 UTF-8 bytes): two records
    /// holding one long value were never reported. Different long values sharing the shortened
    /// key are no duplicate, and a duplicate of a short value is reported as before.
    @Test func reportsUniqueDuplicatesBehindAShortenedKey() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [UserProfile.self])
        let long = String(repeating: "p", count: 130)
        // One shortened key for the three: they differ after 120 bytes.
        let ann = UserProfile(email: long + "@a", displayName: "ann")
        let bea = UserProfile(email: long + "@b", displayName: "bea")
        let cid = UserProfile(email: long + "@c", displayName: "cid")
        let dan = UserProfile(email: "d@example.com", displayName: "dan")
        let eve = UserProfile(email: "e@example.com", displayName: "eve")
        try store.write { tx in for profile in [ann, bea, cid, dan, eve] { try tx.insert(profile) } }
        #expect(try store.verify().isClean)
        let env = try Environment.open(path: dir.path)
        let records = try env.database("records")
        let index = try env.database("index")
        // Replaces `from` by `to` (as long) in the stored record `id`.
        func rewrite(_ txn: WriteTransaction, _ id: RecordID, _ from: String, _ to: String) throws {
            var found: ([UInt8], [UInt8])?
            try txn.scan(records, from: ScanStart<[UInt8]>.first) { key, value in
                if key.suffix(16).elementsEqual(Self.bytes(id)) { found = (key, value); return false }
                return true
            }
            let (key, value) = try #require(found)
            let (old, new) = (Array(from.utf8), Array(to.utf8))
            let at = try #require(value.indices.first { value[$0...].starts(with: old) })
            var bytes = value
            bytes.replaceSubrange(at..<at + old.count, with: new)
            // With the checksum the new bytes give: a writer's doing, not a disk's.
            try txn.put(records, key: key, value: resealedRecord(bytes))
        }
        func entryKey(_ txn: WriteTransaction, _ id: RecordID) throws -> [UInt8] {
            var found: [UInt8]?
            try txn.scan(index, from: ScanStart<[UInt8]>.first) { key, value in
                if value == Self.bytes(id) { found = key; return false }
                return true
            }
            return try #require(found)
        }
        try env.write { txn in
            // bea now holds ann's long email: its index key stays the same.
            try rewrite(txn, bea.id, long + "@b", long + "@a")
            // eve holds dan's short email, and its entry moves to dan's key.
            try rewrite(txn, eve.id, "e@example.com", "d@example.com")
            let eveKey = try entryKey(txn, eve.id)
            let danKey = try entryKey(txn, dan.id)
            try txn.delete(index, key: eveKey, value: Self.bytes(eve.id))
            try txn.put(index, key: danKey, value: Self.bytes(eve.id))
        }
        #expect(try store.get(UserProfile.self, id: bea.id)?.email == ann.email)
        let report = try store.verify()
        let text = report.problems.joined(separator: "\n")
        let duplicate = { (one: UserProfile, other: UserProfile) in
            report.problems.contains { ($0.contains(one.id.description) || $0.contains(other.id.description)) && $0.contains("unique index email holds 2 records") }
        }
        #expect(duplicate(ann, bea), "\(text)")
        #expect(duplicate(dan, eve), "\(text)")
        #expect(!text.contains(cid.id.description), "\(text)")
        #expect(report.problems.count == 2, "\(text)")
    }

    /// `verify` said nothing until it was done: on a large store it looked hung. It reports
    /// every `progressEvery` items of each phase and the end of each phase, with the totals
    /// its report gives; the report is the same as without progress.
    @Test func verifyReportsItsProgressPerPhase() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        try store.write { tx in
            try tx.insert(home)
            for n in 0..<12 { try tx.insert(Item(homeID: home.id, name: "i\(n)", category: "c\(n % 2)", wearCount: n, price: 1)) }
        }
        for n in 12..<15 { try store.insert(Item(homeID: home.id, name: "i\(n)", category: "c", wearCount: n, price: 1)) }
        var events: [VerificationProgress] = []
        let report = try store.verify(progressEvery: 5) { events.append($0) }
        #expect(report.isClean, "\(report)")
        #expect(report.description == (try store.verify()).description)
        #expect(report.recordsChecked == 16 && report.indexEntriesChecked == 45 && report.historyEntriesChecked == 4)

        let finished = events.filter(\.isFinished)
        #expect(finished.map(\.phase) == VerificationProgress.Phase.allCases)
        let totals: [VerificationProgress.Phase: Int] = [.records: 16, .indexEntries: 45, .recordTypes: 16, .history: 4,
                                                         .historyReplay: 16, .historyCoverage: 16]
        for phase in VerificationProgress.Phase.allCases {
            let steps = events.filter { $0.phase == phase && !$0.isFinished }.map(\.checked)
            #expect(steps == Array(stride(from: 5, through: totals[phase]!, by: 5)), "\(phase): \(steps)")
            #expect(finished.first { $0.phase == phase }?.checked == totals[phase], "\(phase)")
        }
        // Each phase's end comes after its steps.
        let last = events.lastIndex { $0.phase == .records && !$0.isFinished }!
        #expect(events.firstIndex { $0.phase == .records && $0.isFinished }! > last)
        #expect(events.first { $0.phase == .indexEntries && !$0.isFinished }?.description == "verified 5 index entries")
        #expect(finished.first?.description == "verified 16 records: done")
    }
}
