import Foundation
@testable import Stash
import Synchronization
import Testing
import StashTestSupport

// Versions of one stored type, "Garment", as an app's code evolves.

struct GarmentV1: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
}

/// Gained an optional field.
struct GarmentWithColor: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
    var color: String?
}

/// Gained a non-optional field, with a default for stored records.
struct GarmentWithRating: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
    var rating: Int
    static var fieldDefaults: [String: FieldValue] { ["rating": .int(3)] }
}

/// Gained a non-optional field without a default: refused while records exist.
struct GarmentWithRatingNoDefault: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
    var rating: Int
}

/// An optional field whose default stands for records stored before it.
struct Themed: Record, Equatable {
    var id = RecordID()
    var name: String
    var theme: String?
    static var fieldDefaults: [String: FieldValue] { ["theme": .string("light")] }
    static let indexes: [RecordIndex<Themed>] = [.index(\.theme)]
}

/// `color` turned non-optional.
struct GarmentColorRequired: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
    var color: String
}

/// ``Themed`` with the theme required, its default kept.
struct ThemedRequired: Record, Equatable {
    static var recordType: String { "Themed" }
    var id = RecordID()
    var name: String
    var theme: String
    static var fieldDefaults: [String: FieldValue] { ["theme": .string("light")] }
    static let indexes: [RecordIndex<ThemedRequired>] = [.index(\.theme)]
}

/// ``GarmentWithColor`` with `color` encoded before `size`.
struct GarmentColorBeforeSize: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var color: String?
    var size: Int
}

/// Lost a field.
/// Encodes its optional nickname with `encode(_:forKey:)` and decodes it with
/// `decode(String?.self, forKey:)`, as hand-written and generated `Codable` often does.
struct GarmentWithNickname: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
    var nickname: String?

    init(name: String, size: Int, nickname: String?) {
        self.name = name
        self.size = size
        self.nickname = nickname
    }

    enum CodingKeys: String, CodingKey { case id, name, size, nickname }

    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        name = try c.decode(String.self, forKey: .name)
        size = try c.decode(Int.self, forKey: .size)
        nickname = try c.decode(String?.self, forKey: .nickname)
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id, forKey: .id)
        try c.encode(name, forKey: .name)
        try c.encode(size, forKey: .size)
        try c.encode(nickname, forKey: .nickname)
    }
}

/// Gives a default to "colr" (for "color").
struct GarmentWithMisspeltDefault: Record, Equatable {
    static var recordType: String { "Garment" }
    static var fieldDefaults: [String: FieldValue] { ["colr": .string("black")] }
    var id = RecordID()
    var name: String
    var size: Int
    var color: String?
}

/// Renamed `name` to `title` in code: reads `title` when the record has it, `name` otherwise.
struct GarmentRenamedInCode: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var title: String
    var size: Int

    init(title: String, size: Int) {
        self.title = title
        self.size = size
    }

    enum CodingKeys: String, CodingKey { case id, title, name, size }

    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        title = try c.contains(.title) ? c.decode(String.self, forKey: .title) : c.decode(String.self, forKey: .name)
        size = try c.decode(Int.self, forKey: .size)
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id, forKey: .id)
        try c.encode(title, forKey: .title)
        try c.encode(size, forKey: .size)
    }
}

/// Gained an optional price.
struct GarmentOptionallyPriced: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
    var price: Double?
}

/// A position that no two slots share.
struct Slot: Record, Equatable {
    var id = RecordID()
    var position: Int
    static let indexes: [RecordIndex<Slot>] = [.unique(\.position)]
}

/// `size` optional.
struct GarmentWithOptionalSize: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int?
}

struct GarmentNameOnly: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
}

/// Gained an index.
struct GarmentIndexed: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
    static let indexes: [RecordIndex<GarmentIndexed>] = [.index(\.size), .index(\.name, \.size)]
}

/// Gained a rating with a default, indexed; then the default changed.
struct GarmentRatedIndexed: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
    var rating: Int
    static let indexes: [RecordIndex<GarmentRatedIndexed>] = [.index(\.rating)]
    static var fieldDefaults: [String: FieldValue] { ["rating": .int(3)] }
}

struct GarmentRatedIndexedNewDefault: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
    var rating: Int
    static let indexes: [RecordIndex<GarmentRatedIndexedNewDefault>] = [.index(\.rating)]
    static var fieldDefaults: [String: FieldValue] { ["rating": .int(5)] }
}

/// Changed a field's kind.
struct GarmentSizeAsText: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: String
}

/// Wardrobe app: images named by file, then stored inside the record.
struct PhotoV1: Record, Equatable {
    static var recordType: String { "Photo" }
    var id = RecordID()
    var title: String
    var imageFileName: String
}

struct PhotoV2: Record, Equatable {
    static var recordType: String { "Photo" }
    var id = RecordID()
    var title: String
    var imageData: Data
}

/// Counts calls from `@Sendable` closures.
final class CallCounter: Sendable {
    private let value = Mutex(0)
    func increment() { value.withLock { $0 += 1 } }
    var count: Int { value.withLock { $0 } }
}

final class ProgressLog: Sendable {
    private let list = Mutex<[StoreProgress]>([])
    func add(_ p: StoreProgress) { list.withLock { $0.append(p) } }
    var all: [StoreProgress] { list.withLock { $0 } }
}

@Suite struct SchemaEvolutionTests {
    /// Records stored before a field existed read its default, and an index on the field
    /// holds them under it; when the declared default changes, the index follows, so counts
    /// and reads agree and `verify` finds nothing stale.
    @Test func aChangedDefaultReindexesTheRecordsThatLackTheField() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 4)
        var rated = GarmentRatedIndexed(name: "rated", size: 1, rating: 5)
        do {
            let store = try Store.open(at: dir.path, types: [GarmentRatedIndexed.self])
            try store.insert(rated)
            #expect(try store.count(GarmentRatedIndexed.self, where: \.rating, equals: 3) == 4)
            #expect(try store.verify().isClean)
        }
        let store = try Store.open(at: dir.path, types: [GarmentRatedIndexedNewDefault.self])
        for garment in old { #expect(try store.get(GarmentRatedIndexedNewDefault.self, id: garment.id)?.rating == 5) }
        #expect(try store.count(GarmentRatedIndexedNewDefault.self, where: \.rating, equals: 5) == 5)
        #expect(try store.count(GarmentRatedIndexedNewDefault.self, where: \.rating, equals: 3) == 0)
        let report = try store.verify()
        #expect(report.isClean, "\(report)")
        // Updates of records that lack the field move their entry, not a stale one.
        try store.update(GarmentRatedIndexedNewDefault.self, id: old[0].id) { $0.rating = 1 }
        rated.rating = 2
        try store.update(GarmentRatedIndexedNewDefault(id: rated.id, name: rated.name, size: rated.size, rating: 2))
        #expect(try store.count(GarmentRatedIndexedNewDefault.self, where: \.rating, equals: 5) == 3)
        #expect(try store.verify().isClean)
    }

    /// A write transaction may see a schema that is not committed (saved by an earlier writer
    /// of its group commit): it must not become the process's schema, which would outlive a
    /// group that fails, and shadow a different schema another process commits later.
    @Test func aSchemaSeenInsideAWriteIsNotPublishedBeforeItCommits() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [GarmentV1.self])
        let before = store.schema
        var unsaved = before
        unsaved.version += 7
        #expect(throws: CancellationError.self) {
            try store.write { tx in
                let txn = tx.context.txn
                try SchemaMerger.saveSchema(unsaved, generation: store.catalog.generation + 1, txn, store.dbs)
                #expect(try store.reloadCatalog(txn).schema == unsaved)   // this transaction sees it
                throw CancellationError()
            }
        }
        #expect(store.schema == before)
        #expect(try store.read { _ in store.schema } == before)
    }

    /// Writes `n` V1 garments and returns them.
    static func seed(_ path: String, _ n: Int) throws -> [GarmentV1] {
        let store = try Store.open(at: path, types: [GarmentV1.self])
        let garments = (0..<n).map { GarmentV1(name: "garment \($0)", size: $0 % 5) }
        try store.write { tx in for g in garments { try tx.insert(g) } }
        return garments
    }

    /// A default given as an int for a double field was stored as an int: the records lacking
    /// the field read 1.0 but were indexed as the int 1, which sorts among the smallest doubles,
    /// so index ranges and equality missed them. It is now stored as the double; a default of
    /// a kind that cannot stand for the field's is refused.
    @Test func aDefaultIsStoredInItsFieldsKind() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 10)
        let store = try Store.open(at: dir.path, types: [GarmentPriced.self])
        #expect(store.schema.type(named: "Garment")?.field(named: "price")?.defaultValue == .double(1))
        try store.insert(GarmentPriced(name: "cheap", size: 0, price: 0.25))
        #expect(try store.fetchCount(FetchDescriptor<GarmentPriced>(predicate: #Predicate { $0.price == 1.0 })) == old.count)
        #expect(try store.fetch(FetchDescriptor<GarmentPriced>(predicate: #Predicate { $0.price > 0.5 })).count == old.count)
        #expect(try store.explain(FetchDescriptor<GarmentPriced>(predicate: #Predicate { $0.price > 0.5 })).usesIndex)
        #expect(try store.verify().isClean)
        let error = thrownError { _ = try Store.open(at: dir.path, types: [GarmentDated.self]) } as? StoreError
        #expect(error?.code == .incompatibleSchema)
        #expect(error?.message.contains("Garment.wornAt") == true, "\(String(describing: error))")
    }

    /// A date default was kept in the stored schema as seconds since 1970, which loses the
    /// last bit of many dates: read back, it differed from the declared one, so every open
    /// rebuilt the indexes on the field, and another process keyed the records lacking the
    /// field with the rounded value. It is kept exactly now.
    @Test func aDateDefaultIsKeptExactly() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 10)
        let log = ProgressLog()
        var options = StoreOptions()
        options.progress = { log.add($0) }
        _ = try Store.open(at: dir.path, types: [GarmentWornDefault.self], options: options)
        #expect(!log.all.isEmpty, "the new index is built")
        let again = ProgressLog()
        options.progress = { again.add($0) }
        let store = try Store.open(at: dir.path, types: [GarmentWornDefault.self], options: options)
        #expect(again.all.isEmpty, "\(again.all)")
        #expect(try Store.open(at: dir.path).schema.type(named: "Garment")?.field(named: "wornAt")?.defaultValue == .date(GarmentWornDefault.never))
        #expect(try store.count(GarmentWornDefault.self, where: \.wornAt, equals: GarmentWornDefault.never) == old.count)
    }

    @Test func gainedOptionalFieldReadsNil() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 10)
        let store = try Store.open(at: dir.path, types: [GarmentWithColor.self])
        for g in old {
            #expect(try store.get(GarmentWithColor.self, id: g.id) == GarmentWithColor(id: g.id, name: g.name, size: g.size, color: nil))
        }
        var painted = try #require(try store.get(GarmentWithColor.self, id: old[0].id))
        painted.color = "teal"
        try store.update(painted)
        #expect(try store.get(GarmentWithColor.self, id: old[0].id)?.color == "teal")
        // The old type still reads everything (the extra field is ignored).
        #expect(try store.get(GarmentV1.self, id: old[0].id) == old[0])
        #expect(try store.count(GarmentWithColor.self) == 10)
        #expect(try store.verify().isClean)
    }

    @Test func gainedFieldWithDefaultAppliesOnRead() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 10)
        let store = try Store.open(at: dir.path, types: [GarmentWithRating.self])
        for g in old {
            #expect(try store.get(GarmentWithRating.self, id: g.id) == GarmentWithRating(id: g.id, name: g.name, size: g.size, rating: 3))
        }
        let fresh = GarmentWithRating(name: "new", size: 1, rating: 5)
        try store.insert(fresh)
        #expect(try store.get(GarmentWithRating.self, id: fresh.id)?.rating == 5)
        // The generic view applies the default too.
        let generic = try store.read { try $0.get(typeNamed: "Garment", id: old[1].id) }
        #expect(generic?.fields["rating"] == .int(3))
        // Predicates see the defaulted value.
        let rated = try store.fetch(FetchDescriptor<GarmentWithRating>(predicate: #Predicate { $0.rating == 3 }))
        #expect(rated.count == 10)
        #expect(try store.verify().isClean)
    }

    @Test func gainedNonOptionalFieldWithoutDefaultIsRefused() throws {
        let dir = TemporaryDirectory()
        _ = try Self.seed(dir.path, 3)
        let error = thrownError { _ = try Store.open(at: dir.path, types: [GarmentWithRatingNoDefault.self]) } as? StoreError
        #expect(error?.code == .incompatibleSchema)
        #expect(error?.message.contains("Garment") == true)
        #expect(error?.message.contains("rating") == true, "\(String(describing: error))")
        // An empty store may add it freely.
        let empty = TemporaryDirectory()
        let store = try Store.open(at: empty.path, types: [GarmentWithRatingNoDefault.self])
        try store.insert(GarmentWithRatingNoDefault(name: "x", size: 1, rating: 2))
    }

    @Test func lostFieldStillReads() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 10)
        let store = try Store.open(at: dir.path, types: [GarmentNameOnly.self])
        for g in old { #expect(try store.get(GarmentNameOnly.self, id: g.id) == GarmentNameOnly(id: g.id, name: g.name)) }
        #expect(try store.fetch(FetchDescriptor<GarmentNameOnly>(predicate: #Predicate { $0.name == "garment 4" })).map(\.id) == [old[4].id])
        // New records without the field, and updates through the type that lacks it (they keep it).
        try store.insert(GarmentNameOnly(name: "slim"))
        try store.update(GarmentNameOnly(id: old[0].id, name: "renamed"))
        #expect(try store.count(GarmentNameOnly.self) == 11)
        #expect(try store.get(GarmentNameOnly.self, id: old[0].id)?.name == "renamed")
        #expect(try store.verify().isClean)
    }

    /// An app version that does not know a field (older, or newer and without it) keeps it
    /// when it updates a record: before, `update` and `upsert` wrote only the fields of the
    /// Swift type, so a device still on the old version erased the newer version's `color`
    /// (and sync carried the loss to every device). A field the type declares is still
    /// replaced as written, nil included.
    @Test func anUpdateKeepsTheFieldsItsTypeDoesNotKnow() throws {
        let dir = TemporaryDirectory()
        let red = GarmentWithColor(name: "coat", size: 3, color: "red")
        let blue = GarmentWithColor(name: "scarf", size: 1, color: "blue")
        do {
            let newer = try Store.open(at: dir.path, types: [GarmentWithColor.self])
            try newer.write { tx in try tx.insert(red); try tx.insert(blue) }
        }
        do {
            let older = try Store.open(at: dir.path, types: [GarmentV1.self])
            try older.update(GarmentV1(id: red.id, name: "long coat", size: 4))
            try older.upsert(GarmentV1(id: blue.id, name: "scarf", size: 2))
            try older.update(GarmentV1.self, id: blue.id) { $0.size += 1 }
            // The history says what changed: not the color.
            let entries = try older.history()
            #expect(entries.count == 4, "\(entries.count)")
        }
        let newer = try Store.open(at: dir.path, types: [GarmentWithColor.self])
        #expect(try newer.get(GarmentWithColor.self, id: red.id) == GarmentWithColor(id: red.id, name: "long coat", size: 4, color: "red"))
        #expect(try newer.get(GarmentWithColor.self, id: blue.id) == GarmentWithColor(id: blue.id, name: "scarf", size: 3, color: "blue"))
        // The type that knows the field clears it.
        try newer.update(GarmentWithColor(id: red.id, name: "long coat", size: 4, color: nil))
        #expect(try newer.get(GarmentWithColor.self, id: red.id)?.color == nil)
        #expect(try newer.verify().isClean)
    }

    /// Saving unchanged values through a type that does not know a field is no change: the
    /// kept field goes last, so the bytes differed and each such save logged an update.
    @Test func anUnchangedSaveByAnOlderTypeIsNoChange() throws {
        let dir = TemporaryDirectory()
        let coat = GarmentColorBeforeSize(name: "coat", color: "red", size: 3)
        do {
            _ = try Store.open(at: dir.path, types: [GarmentV1.self])
            let newer = try Store.open(at: dir.path, types: [GarmentColorBeforeSize.self])
            try newer.insert(coat)   // name, color, size
        }
        let older = try Store.open(at: dir.path, types: [GarmentV1.self])
        let before = try older.history().count
        try older.upsert(GarmentV1(id: coat.id, name: "coat", size: 3))
        #expect(try older.history().count == before)
    }

    /// An optional field with a default, set to nil, read back as the default (nil was written
    /// as no field, which is what records from before the field look like) and was indexed
    /// under it. It is written as an explicit null.
    @Test func anOptionalFieldWithADefaultKeepsNil() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Themed.self])
        let plain = Themed(name: "plain", theme: nil)
        let dark = Themed(name: "dark", theme: "dark")
        try store.write { tx in try tx.insert(plain); try tx.insert(dark) }
        #expect(try store.get(Themed.self, id: plain.id) == plain)
        #expect(try store.count(Themed.self, where: \.theme, equals: "light") == 0)
        #expect(try store.fetchCount(FetchDescriptor<Themed>(predicate: #Predicate { $0.theme == nil })) == 1)
        #expect(try store.verify().isClean)
    }

    /// A field that turns non-optional while stored records have no value was accepted at
    /// open, and then every read of such a record (and every fetch of the type) failed. It is
    /// refused at open, naming how many records lack it; with every record holding a value it
    /// is accepted.
    @Test func aFieldTurningRequiredIsRefusedWhileRecordsLackIt() throws {
        let dir = TemporaryDirectory()
        let plain = GarmentWithColor(name: "plain", size: 1, color: nil)
        let red = GarmentWithColor(name: "red", size: 2, color: "red")
        do {
            let store = try Store.open(at: dir.path, types: [GarmentWithColor.self])
            try store.write { tx in try tx.insert(plain); try tx.insert(red) }
        }
        let error = thrownError { _ = try Store.open(at: dir.path, types: [GarmentColorRequired.self]) } as? StoreError
        #expect(error?.code == .incompatibleSchema, "\(String(describing: error))")
        #expect(error?.message.contains("1 of the 2 stored Garment records") == true, "\(String(describing: error))")
        do {
            let store = try Store.open(at: dir.path, types: [GarmentWithColor.self])
            try store.update(GarmentWithColor(id: plain.id, name: "plain", size: 1, color: "white"))
        }
        let store = try Store.open(at: dir.path, types: [GarmentColorRequired.self])
        #expect(try store.fetch(FetchDescriptor<GarmentColorRequired>()).count == 2)
    }

    /// A nil written for a field with a default is stored as null; the field turning
    /// non-optional (the default kept) was accepted at open, and every read of such a record
    /// then failed. It is refused while records hold a null.
    @Test func aFieldWithADefaultTurningRequiredIsRefusedWhileRecordsHoldNil() throws {
        let dir = TemporaryDirectory()
        do {
            let store = try Store.open(at: dir.path, types: [Themed.self])
            try store.write { tx in try tx.insert(Themed(name: "plain", theme: nil)); try tx.insert(Themed(name: "dark", theme: "dark")) }
        }
        let error = thrownError { _ = try Store.open(at: dir.path, types: [ThemedRequired.self]) } as? StoreError
        #expect(error?.code == .incompatibleSchema && error?.message.contains("1 of the 2 stored Themed records") == true, "\(String(describing: error))")
    }

    @Test func addedIndexIsBackfilledWithProgress() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 250)
        let log = ProgressLog()
        var options = StoreOptions()
        options.progress = { log.add($0) }
        let store = try Store.open(at: dir.path, types: [GarmentIndexed.self], options: options)
        let progress = log.all
        #expect(!progress.isEmpty, "progress was reported")
        #expect(progress.contains { $0.total == 250 && $0.done == 250 }, "\(progress)")
        #expect(progress.allSatisfy { $0.done <= $0.total })
        let bySize = try store.index(\GarmentIndexed.size)
        for size in 0..<6 {
            let expected = old.count { $0.size == size }
            #expect(try store.count(bySize, equals: size) == expected, "size \(size)")
            #expect(try store.count(GarmentIndexed.self, where: \.size, equals: size) == expected)
        }
        let plan = try store.explain(FetchDescriptor<GarmentIndexed>(predicate: #Predicate { $0.size == 2 }))
        #expect(plan.usesIndex, "\(plan)")
        let composite = try store.fetch(FetchDescriptor<GarmentIndexed>(predicate: #Predicate { $0.name == "garment 7" && $0.size == 2 }))
        #expect(composite.map(\.id) == [old[7].id])
        let report = try store.verify()
        #expect(report.isClean, "\(report)")
        #expect(report.indexEntriesChecked == 2 * 250)
        // Writes after the backfill keep the new index exact.
        try store.insert(GarmentIndexed(name: "new", size: 2))
        #expect(try store.count(bySize, equals: 2) == old.count { $0.size == 2 } + 1)
        // Reopening with the same declaration does not backfill again.
        let again = ProgressLog()
        var quiet = StoreOptions()
        quiet.progress = { again.add($0) }
        _ = try Store.open(at: dir.path, types: [GarmentIndexed.self], options: quiet)
        #expect(again.all.isEmpty, "\(again.all)")
        // Opening with the old type (an older version of the app, another process) keeps the
        // indexes, and its writes keep them exact for the store that counts through them.
        let older = try Store.open(at: dir.path, types: [GarmentV1.self])
        #expect(older.schema.type(named: "Garment")?.indexes.count == 2)
        try older.insert(GarmentV1(name: "older", size: 2))
        try older.update(GarmentV1(id: old[0].id, name: old[0].name, size: 5))
        for size in 0..<6 {
            let expected = old.count { $0.size == size && $0.id != old[0].id } + (size == 2 ? 2 : 0) + (size == 5 ? 1 : 0)
            #expect(try store.count(bySize, equals: size) == expected, "size \(size)")
            #expect(try older.count(GarmentV1.self, where: \.size, equals: size) == expected, "size \(size)")
        }
        #expect(try store.verify().isClean)
        // Removing them is asked for; their entries go.
        var removing = StoreOptions()
        removing.dropsUndeclaredIndexes = true
        let plain = try Store.open(at: dir.path, types: [GarmentV1.self], options: removing)
        #expect(try plain.statistics().databases["index"]?.entries == 0, "no index entries are left behind")
        #expect(try plain.verify().isClean)
        #expect((thrownError { _ = try plain.index(\GarmentV1.size) } as? StoreError)?.code == .noSuchIndex)
        let sizeTwo = old.count { $0.size == 2 && $0.id != old[0].id } + 2
        #expect(try plain.count(GarmentV1.self, where: \.size, equals: 2) == sizeTwo)
        // The store still declaring them (another process) learns of the drop at its next
        // read: it planned through the dropped indexes (finding nothing) and its handle
        // counted 0.
        let two = FetchDescriptor<GarmentIndexed>(predicate: #Predicate { $0.size == 2 })
        #expect(try store.count(GarmentIndexed.self, where: \.size, equals: 2) == sizeTwo)
        #expect(try store.fetch(two).count == sizeTwo)
        #expect(try store.fetchCount(two) == sizeTwo)
        #expect(try !store.explain(two).usesIndex)
        let dropped = thrownError { _ = try store.count(bySize, equals: 2) } as? StoreError
        #expect(dropped?.code == .noSuchIndex && dropped?.message.contains("size") == true, "\(String(describing: dropped))")
        #expect((thrownError { _ = try store.read { try $0.largestGroupCount(bySize) } } as? StoreError)?.code == .noSuchIndex)
    }

    @Test func changedKindWithoutMigrationIsRefusedAndChangesNothing() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 10)
        let before = try Store.open(at: dir.path, types: [GarmentV1.self]).schema
        let error = thrownError { _ = try Store.open(at: dir.path, types: [GarmentSizeAsText.self]) } as? StoreError
        #expect(error?.code == .incompatibleSchema)
        let message = error?.message ?? ""
        #expect(message.contains("Garment"), "\(message)")
        #expect(message.contains("size"), "\(message)")
        // The failed open changed nothing.
        let store = try Store.open(at: dir.path, types: [GarmentV1.self])
        #expect(store.schema == before)
        #expect(try store.fetch(FetchDescriptor<GarmentV1>(sortBy: [SortDescriptor(\.id)])) == old.sorted { $0.id < $1.id })
        #expect(try store.verify().isClean)
        // Writing a value of the wrong kind through the generic path is refused as well: the
        // value does not fit its field (the schema is what it was).
        let wrong = GenericRecord(type: "Garment", id: RecordID(), fields: ["name": .string("x"), "size": .string("large")])
        let putError = thrownError { try store.write { try $0.put(wrong) } } as? StoreError
        #expect(putError?.code == .invalidValue)
        #expect(putError?.message.contains("size") == true)
        #expect(try store.count(GarmentV1.self) == 10)
    }

    /// A schema file that left `localOnly` out (to add an index, say) turned a local-only type
    /// synced: its records were listed for sync and left the device at the next sync.
    @Test func aSchemaFileWithoutLocalOnlyKeepsTheStoredFlag() throws {
        let dir = TemporaryDirectory()
        func declaration(_ json: String) throws -> SchemaDeclaration {
            try JSONDecoder().decode(SchemaDeclaration.self, from: Data(json.utf8))
        }
        do {
            let store = try Store.open(at: dir.path, declaration: try declaration(#"{"types": [{"name": "Secret", "localOnly": true, "fields": [{"name": "text", "kind": "string"}]}]}"#))
            try store.write { tx in try tx.put(GenericRecord(type: "Secret", id: RecordID(), fields: ["text": .string("pin 1234")])) }
        }
        let store = try Store.open(at: dir.path, declaration: try declaration(#"{"types": [{"name": "Secret", "fields": [{"name": "text", "kind": "string"}], "indexes": [{"fields": ["text"]}]}]}"#))
        #expect(store.schema.type(named: "Secret")?.localOnly == true)
        #expect(try store.history().allSatisfy { $0.changes.allSatisfy { $0.type != "Secret" || $0.operation == .insert } })
        let synced = try Store.open(at: dir.path, declaration: try declaration(#"{"types": [{"name": "Secret", "localOnly": false, "fields": [{"name": "text", "kind": "string"}]}]}"#))
        #expect(synced.schema.type(named: "Secret")?.localOnly == false)
    }

    /// A misspelt `fieldDefaults` key added a field of that name to the stored schema for good
    /// (shown on every record), while the field meant stayed without its default.
    @Test func aDefaultForAFieldTheTypeDoesNotDecodeIsRefused() throws {
        let dir = TemporaryDirectory()
        _ = try Self.seed(dir.path, 2)
        let error = thrownError { _ = try Store.open(at: dir.path, types: [GarmentWithMisspeltDefault.self]) } as? StoreError
        #expect(error?.code == .incompatibleSchema && error?.message.contains("'colr'") == true, "\(String(describing: error))")
        let store = try Store.open(at: dir.path, types: [GarmentV1.self])
        #expect(store.schema.type(named: "Garment")?.field(named: "colr") == nil)
    }

    /// A required field the type dropped, then declared again: records written while it was
    /// gone lack it, yet the open took the field's stored "required" for granted and every read
    /// of such a record failed. The field turned optional when dropped, so the open counts them.
    @Test func aRequiredFieldDroppedAndDeclaredAgainIsChecked() throws {
        let dir = TemporaryDirectory()
        _ = try Self.seed(dir.path, 3)
        let slim = GarmentNameOnly(name: "slim")
        do {
            let store = try Store.open(at: dir.path, types: [GarmentNameOnly.self])
            try store.insert(slim)
        }
        let error = thrownError { _ = try Store.open(at: dir.path, types: [GarmentV1.self]) } as? StoreError
        #expect(error?.code == .incompatibleSchema && error?.message.contains("Garment.size") == true, "\(String(describing: error))")
        #expect(error?.message.contains("1 of the 4") == true, "\(String(describing: error))")
        // Optional again, or with a default, it opens and reads.
        let store = try Store.open(at: dir.path, types: [GarmentWithOptionalSize.self])
        #expect(try store.get(GarmentWithOptionalSize.self, id: slim.id)?.size == nil)
    }

    /// A rename handled in `init(from:)` (the new key when present, the old one otherwise):
    /// the probe answered `contains` with yes and took the new field for a required one, so
    /// the open refused it ("new and not optional") on a store with records.
    @Test func aFieldReadOnlyWhenPresentIsOptional() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 3)
        let store = try Store.open(at: dir.path, types: [GarmentRenamedInCode.self])
        #expect(store.schema.type(named: "Garment")?.field(named: "title")?.optional == true)
        #expect(try store.get(GarmentRenamedInCode.self, id: old[2].id)?.title == "garment 2")
        let new = GarmentRenamedInCode(title: "new", size: 1)
        try store.insert(new)
        #expect(try store.get(GarmentRenamedInCode.self, id: new.id) == new)
    }

    /// A migration that shifts every value of a unique field by one passes through a clash
    /// record by record (the record that becomes 2 while another still holds 2): the open
    /// failed at every launch although the migrated state is unique. Unique indexes are judged
    /// on the migrated state; a migration that does leave two records with one value is
    /// refused, naming the migration and both records, and changes nothing.
    @Test func aMigrationIsJudgedOnTheUniqueValuesItLeaves() throws {
        let dir = TemporaryDirectory()
        let slots = (1...3).map { Slot(position: $0) }
        do {
            let store = try Store.open(at: dir.path, types: [Slot.self])
            try store.write { tx in for slot in slots { try tx.insert(slot) } }
        }
        var clashing = StoreOptions()
        clashing.migrations = [Migration(version: 1, type: "Slot") { record in
            if case .int(let p)? = record.fields["position"] { record.fields["position"] = .int(min(p, 2)) }
        }]
        let error = thrownError { _ = try Store.open(at: dir.path, types: [Slot.self], options: clashing) } as? StoreError
        #expect(error?.code == .uniqueViolation && error?.message.contains("migration 1") == true, "\(String(describing: error))")
        var shifting = StoreOptions()
        shifting.migrations = [Migration(version: 1, type: "Slot") { record in
            if case .int(let p)? = record.fields["position"] { record.fields["position"] = .int(p + 1) }
        }]
        let store = try Store.open(at: dir.path, types: [Slot.self], options: shifting)
        #expect(try slots.map { try store.get(Slot.self, id: $0.id)?.position } == [2, 3, 4])
        #expect(try store.verify().isClean)
        #expect((thrownError { try store.insert(Slot(position: 3)) } as? StoreError)?.code == .uniqueViolation)
    }

    /// A migration that writes an int into a field the type reads as a double (a price set to
    /// `.int(0)`) turned the field's kind to int, and the open then said to add a migration.
    @Test func aMigrationWritingAnIntIntoADoubleFieldWritesTheNumber() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 2)
        do {
            let store = try Store.open(at: dir.path, types: [GarmentOptionallyPriced.self])
            try store.insert(GarmentOptionallyPriced(name: "priced", size: 1, price: 9.5))
        }
        var options = StoreOptions()
        options.migrations = [Migration(version: 1, type: "Garment") { record in
            if record.fields["price"] == nil || record.fields["price"] == .null { record.fields["price"] = .int(0) }
        }]
        let store = try Store.open(at: dir.path, types: [GarmentOptionallyPriced.self], options: options)
        #expect(try store.get(GarmentOptionallyPriced.self, id: old[0].id)?.price == 0)
        #expect(store.schema.type(named: "Garment")?.field(named: "price")?.kind == .double)
        #expect(try store.verify().isClean)
    }

    /// A read-only open (a widget, an extension) of a store that has not run a migration this
    /// process brings read the records in their form from before it: an int field a migration
    /// turns into text read as text's neighbour, or failed, one read at a time. It is refused
    /// until an open for writing has run the migration.
    @Test func aReadOnlyOpenBeforeAMigrationRanIsRefused() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 3)
        var options = StoreOptions()
        options.migrations = [Migration(version: 1, type: "Garment") { record in
            if case .int(let size)? = record.fields["size"] { record.fields["size"] = .string("size \(size)") }
        }]
        var readOnly = options
        readOnly.readOnly = true
        let error = thrownError { _ = try Store.open(at: dir.path, types: [GarmentSizeAsText.self], options: readOnly) } as? StoreError
        #expect(error?.code == .readOnly && error?.message.contains("migration 1") == true, "\(String(describing: error))")
        _ = try Store.open(at: dir.path, types: [GarmentSizeAsText.self], options: options)
        let reader = try Store.open(at: dir.path, types: [GarmentSizeAsText.self], options: readOnly)
        #expect(try reader.get(GarmentSizeAsText.self, id: old[1].id)?.size == "size 1")
    }

    /// A hand-written `Codable` that encodes an optional with `encode(_:forKey:)` and decodes it
    /// with `decode(T?.self, forKey:)`: a nil is not stored, and reading the record back threw
    /// keyNotFound; the probe took the field for a required one, so adding it was refused.
    @Test func anOptionalDecodedAsAnOptionalTypeReadsItsNil() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 2)
        let store = try Store.open(at: dir.path, types: [GarmentWithNickname.self])
        let named = GarmentWithNickname(name: "named", size: 1, nickname: "fav")
        let unnamed = GarmentWithNickname(name: "unnamed", size: 2, nickname: nil)
        try store.write { tx in
            try tx.insert(named)
            try tx.insert(unnamed)
        }
        #expect(try store.get(GarmentWithNickname.self, id: named.id) == named)
        #expect(try store.get(GarmentWithNickname.self, id: unnamed.id) == unnamed)
        #expect(try store.get(GarmentWithNickname.self, id: old[0].id)?.nickname == nil)
        #expect(store.schema.type(named: "Garment")?.field(named: "nickname")?.optional == true)
        #expect(try store.fetch(FetchDescriptor<GarmentWithNickname>()).count == 4)
    }

    /// A field's kind could not change at all: the open said to add a Migration, but the
    /// migration's own rewrite was refused on its first record as a change of kind. A
    /// migration that converts every record now changes the kind; one that leaves records of
    /// the old kind is refused, changing nothing.
    @Test func aMigrationChangesAFieldsKind() throws {
        let dir = TemporaryDirectory()
        let old = try Self.seed(dir.path, 10)
        var partial = StoreOptions()
        partial.migrations = [Migration(version: 1, type: "Garment") { record in
            if case .int(let size)? = record.fields["size"], size % 2 == 0 { record.fields["size"] = .string("size \(size)") }
        }]
        let error = thrownError { _ = try Store.open(at: dir.path, types: [GarmentSizeAsText.self], options: partial) } as? StoreError
        #expect(error?.code == .incompatibleSchema && error?.message.contains("Garment.size as both int and string") == true, "\(String(describing: error))")
        var options = StoreOptions()
        options.migrations = [Migration(version: 1, type: "Garment") { record in
            if case .int(let size)? = record.fields["size"] { record.fields["size"] = .string("size \(size)") }
        }]
        let store = try Store.open(at: dir.path, types: [GarmentSizeAsText.self], options: options)
        for g in old {
            #expect(try store.get(GarmentSizeAsText.self, id: g.id) == GarmentSizeAsText(id: g.id, name: g.name, size: "size \(g.size)"))
        }
        #expect(store.schema.type(named: "Garment")?.field(named: "size")?.kind == .string)
        #expect(try store.verify().isClean)
    }

    @Test func migrationDropsAndAddsAFieldOnce() throws {
        let dir = TemporaryDirectory()
        let photos = (0..<20).map { PhotoV1(title: "photo \($0)", imageFileName: "img\($0).jpg") }
        do {
            let store = try Store.open(at: dir.path, types: [PhotoV1.self])
            try store.write { tx in for p in photos { try tx.insert(p) } }
            #expect(store.schema.version == 0)
        }
        let runs = CallCounter()
        let migration = Migration(version: 1, type: "Photo") { record in
            runs.increment()
            guard case .string(let name)? = record.fields.removeValue(forKey: "imageFileName") else {
                throw StoreError(.invalidValue, "no imageFileName")
            }
            record.fields["imageData"] = .bytes(Data("bytes of \(name)".utf8))
        }
        var options = StoreOptions()
        options.migrations = [migration]
        let tokenBefore: HistoryToken
        do {
            let store = try Store.open(at: dir.path, types: [PhotoV2.self], options: options)
            #expect(runs.count == photos.count)
            #expect(store.schema.version == 1)
            for p in photos {
                let migrated = try store.get(PhotoV2.self, id: p.id)
                #expect(migrated == PhotoV2(id: p.id, title: p.title, imageData: Data("bytes of \(p.imageFileName)".utf8)))
                let generic = try store.read { try $0.get(typeNamed: "Photo", id: p.id) }
                #expect(generic?.fields["imageFileName"] == nil, "the dropped field is gone from the stored record")
            }
            #expect(try store.count(PhotoV2.self) == photos.count)
            #expect(try store.verify().isClean)
            let migrationEntries = try store.history().filter { $0.author == "migration" }
            #expect(migrationEntries.count == 1)
            #expect(migrationEntries.first?.changes.count == photos.count)
            #expect(migrationEntries.first?.changes.allSatisfy { $0.operation == .update } == true)
            tokenBefore = try store.currentToken()
        }
        // Reopening does not run it again, and changes nothing.
        let store = try Store.open(at: dir.path, types: [PhotoV2.self], options: options)
        #expect(runs.count == photos.count)
        #expect(store.schema.version == 1)
        #expect(try store.currentToken() == tokenBefore)
        #expect(try store.get(PhotoV2.self, id: photos[3].id)?.imageData == Data("bytes of img3.jpg".utf8))
    }

    /// A schema version that changes two types needs one migration per type: after the first
    /// ran, the stored version equalled the second one's, which was skipped for good. A
    /// misspelt type did nothing, yet its version counted as done; two migrations of one
    /// version and type ran one after the other by chance. All three are refused or fixed.
    @Test func everyMigrationOfOneVersionRunsAndBadOnesAreRefused() throws {
        let dir = TemporaryDirectory()
        let garments = try Self.seed(dir.path, 4)
        let photos = (0..<3).map { PhotoV1(title: "photo \($0)", imageFileName: "img\($0).jpg") }
        do {
            let store = try Store.open(at: dir.path, types: [GarmentV1.self, PhotoV1.self])
            try store.write { tx in for p in photos { try tx.insert(p) } }
        }
        let sizes = Migration(version: 1, type: "Garment") { record in
            if case .int(let size)? = record.fields["size"] { record.fields["size"] = .string("size \(size)") }
        }
        let images = Migration(version: 1, type: "Photo") { record in
            guard case .string(let name)? = record.fields.removeValue(forKey: "imageFileName") else { return }
            record.fields["imageData"] = .bytes(Data(name.utf8))
        }
        var options = StoreOptions()
        for (migrations, code, words) in [([sizes, images, sizes], StoreError.Code.invalidValue, "two migrations of version 1 name type Garment"),
                                          ([sizes, Migration(version: 1, type: "Garmet") { _ in }], .incompatibleSchema, "names type Garmet")] {
            options.migrations = migrations
            let error = thrownError { _ = try Store.open(at: dir.path, types: [GarmentSizeAsText.self, PhotoV2.self], options: options) } as? StoreError
            #expect(error?.code == code && error?.message.contains(words) == true, "\(String(describing: error))")
        }
        // A new install keeps migrations of types it no longer declares: nothing to migrate.
        options.migrations = [images, sizes, Migration(version: 1, type: "Retired") { _ in }]
        let fresh = try Store.open(at: dir.sub("fresh"), types: [GarmentSizeAsText.self], options: options)
        #expect(fresh.schema.version == 1)
        options.migrations = [images, sizes]
        let store = try Store.open(at: dir.path, types: [GarmentSizeAsText.self, PhotoV2.self], options: options)
        #expect(store.schema.version == 1)
        for g in garments { #expect(try store.get(GarmentSizeAsText.self, id: g.id)?.size == "size \(g.size)") }
        for p in photos { #expect(try store.get(PhotoV2.self, id: p.id)?.imageData == Data(p.imageFileName.utf8)) }
        #expect(try store.verify().isClean)
    }

    /// A field a migration creates was typed by its first record only: later records writing
    /// another kind turned the field to that kind, and the first record then failed to decode.
    @Test func aMigrationCreatingAFieldOfTwoKindsIsRefused() throws {
        let dir = TemporaryDirectory()
        let garments = try Self.seed(dir.path, 4)
        let first = garments.map(\.id).min()!
        var options = StoreOptions()
        options.migrations = [Migration(version: 1, type: "Garment") { record in
            record.fields["rating"] = record.id == first ? .int(5) : .string("five")
        }]
        let error = thrownError { _ = try Store.open(at: dir.path, types: [GarmentV1.self], options: options) } as? StoreError
        #expect(error?.code == .incompatibleSchema && error?.message.contains("Garment.rating as both int and string") == true, "\(String(describing: error))")
        let store = try Store.open(at: dir.path, types: [GarmentV1.self])
        #expect(store.schema.version == 0)
        #expect(store.schema.type(named: "Garment")?.field(named: "rating") == nil)
    }

    @Test func failingMigrationChangesNothing() throws {
        let dir = TemporaryDirectory()
        let photos = (0..<5).map { PhotoV1(title: "photo \($0)", imageFileName: "img\($0).jpg") }
        do {
            let store = try Store.open(at: dir.path, types: [PhotoV1.self])
            try store.write { tx in for p in photos { try tx.insert(p) } }
        }
        var options = StoreOptions()
        options.migrations = [Migration(version: 1, type: "Photo") { record in
            if record.fields["title"] == .string("photo 3") { throw StoreError(.invalidValue, "cannot convert") }
            record.fields["imageFileName"] = nil
            record.fields["imageData"] = .bytes(Data([1, 2, 3]))
        }]
        let error = thrownError { _ = try Store.open(at: dir.path, types: [PhotoV2.self], options: options) } as? StoreError
        #expect(error?.code == .incompatibleSchema)
        #expect(error?.message.contains("Photo") == true)
        let store = try Store.open(at: dir.path, types: [PhotoV1.self])
        #expect(store.schema.version == 0)
        for p in photos { #expect(try store.get(PhotoV1.self, id: p.id) == p) }
    }
}

/// Gained an indexed price whose default is written as an int.
struct GarmentPriced: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
    var price: Double
    static var fieldDefaults: [String: FieldValue] { ["price": .int(1)] }
    static let indexes: [RecordIndex<GarmentPriced>] = [.index(\.price)]
}

/// Gained a date whose default is a number of seconds: not a date.
struct GarmentDated: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var size: Int
    var wornAt: Date
    static var fieldDefaults: [String: FieldValue] { ["wornAt": .int(0)] }
}

/// Gained an indexed date whose default has every bit of a `Date` in play.
struct GarmentWornDefault: Record, Equatable {
    static var recordType: String { "Garment" }
    static let never = Date(timeIntervalSinceReferenceDate: 757_000_000.123_456_8)   // seconds since 1970 cannot hold it exactly
    var id = RecordID()
    var name: String
    var size: Int
    var wornAt: Date
    static var fieldDefaults: [String: FieldValue] { ["wornAt": .date(never)] }
    static let indexes: [RecordIndex<GarmentWornDefault>] = [.index(\.wornAt)]
}

/// A schema file's type without "localOnly" keeps the store's flag; written back out (a tool
/// that edits schema files), the declaration said `"localOnly": false`, which turned a
/// local-only type synced once read again.
@Suite struct SchemaFileRoundTripTests {
    @Test func aTypeWithoutLocalOnlyStaysWithoutIt() throws {
        let text = #"{"types": [{"name": "Secret", "fields": [{"name": "value", "kind": "string"}]}, {"name": "Note", "localOnly": false}]}"#
        let declaration = try JSONDecoder().decode(SchemaDeclaration.self, from: Data(text.utf8))
        let again = try JSONEncoder().encode(declaration)
        let types = try #require(try JSONSerialization.jsonObject(with: again) as? [String: Any])["types"] as? [[String: Any]]
        #expect(types?.first { $0["name"] as? String == "Secret" }?["localOnly"] == nil, "\(String(decoding: again, as: UTF8.self))")
        #expect(types?.first { $0["name"] as? String == "Note" }?["localOnly"] as? Bool == false)
    }

    /// A schema file could not declare field defaults at all (the JSON form had none): a field
    /// added to a type with records had to be optional. `"default"` reads a value of the
    /// field's kind, and is written back out.
    @Test func aFieldDefaultInASchemaFile() throws {
        let text = #"{"types": [{"name": "Memo", "fields": [{"name": "starred", "kind": "bool", "default": false}, {"name": "due", "kind": "date", "default": "2026-01-01T00:00:00Z"}, {"name": "title", "kind": "string"}]}]}"#
        let declaration = try JSONDecoder().decode(SchemaDeclaration.self, from: Data(text.utf8))
        let memo = try #require(declaration.types.first)
        #expect(memo.defaults["starred"] == .bool(false))
        #expect(memo.defaults["due"] == .date(Date(timeIntervalSince1970: 1_767_225_600)))
        #expect(memo.defaults["title"] == nil)
        let again = try JSONDecoder().decode(SchemaDeclaration.self, from: try JSONEncoder().encode(declaration))
        #expect(again.types.first?.defaults == memo.defaults)
        let wrong = #"{"types": [{"name": "Memo", "fields": [{"name": "starred", "kind": "bool", "default": "no"}]}]}"#
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(SchemaDeclaration.self, from: Data(wrong.utf8)) }
    }
}
