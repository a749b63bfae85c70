import Foundation
import Stash
import StashSync
import Testing
import StashTestSupport

// Three versions of a wardrobe app's garment (the Wardrobe story of DESIGN.md): the first
// keeps a photo's file name, the second drops that property from the struct, the third moves
// it into `imageData` with a migration.

/// The first version.
struct GarmentWithFileName: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var imageFileName: String?
    var wearCount = 0
}

/// The property dropped from the struct (the README says that is fine: the values stay).
struct GarmentWithoutFileName: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var wearCount = 0
}

/// The photo inside the record, moved there by ``garmentMigration``.
struct GarmentWithImage: Record, Equatable {
    static var recordType: String { "Garment" }
    var id = RecordID()
    var name: String
    var imageData: Data?
    var wearCount = 0
    static let indexes: [RecordIndex<GarmentWithImage>] = [.index(\.wearCount)]
}

/// `imageFileName` → `imageData` (the file name's bytes stand for the photo), and the file
/// name dropped.
let garmentMigration = Migration(version: 2, type: "Garment") { record in
    if case .string(let name)? = record.fields["imageFileName"] { record.fields["imageData"] = .bytes(Data(name.utf8)) }
    record.fields["imageFileName"] = nil
}

/// A type only the newer app version has.
struct Outfit: Record, Equatable {
    var id = RecordID()
    var title: String
    var garments: [RecordID] = []
}

/// Schema drift between replicas never stops sync (issue 34, point 1): each test runs the
/// same story directly and through a relay directory, in both directions.
@Suite struct SchemaDriftTests {
    let family = RecordID()

    enum Way: CaseIterable, CustomStringConvertible {
        case direct, relay
        var description: String { self == .direct ? "direct" : "relay" }
    }

    /// Opens `path` with `types` (and `migrations`) and an engine.
    func open(_ path: String, _ types: [any Record.Type], migrations: [Migration] = []) throws -> Device {
        var options = StoreOptions()
        options.durability = .none
        options.migrations = migrations
        let store = try Store.open(at: path, types: types, options: options)
        return Device(path: path, store: store, engine: try SyncEngine(store: store, configuration: SyncConfiguration(family: family)))
    }

    /// Both ways between `a` and `b`: directly, or each through the relay twice over (send,
    /// fetch, and again, so each hears what the other sent).
    func exchange(_ a: Device, _ b: Device, _ way: Way, relay: URL) async throws {
        switch way {
        case .direct:
            try await a.sync(with: b)
            try await b.sync(with: a)
        case .relay:
            let transport = RelayTransport(directory: relay)
            for _ in 0..<2 {
                try await a.engine.sync(via: transport)
                try await b.engine.sync(via: transport)
            }
        }
    }

    func relayDirectory(_ dir: TemporaryDirectory) throws -> URL {
        let url = dir.url.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    /// Three garments of the first version, stored in `path` (by a process that then ends).
    func firstVersionGarments(in path: String, named name: String) throws -> [GarmentWithFileName] {
        let first = try open(path, [GarmentWithFileName.self])
        let garments = (0..<3).map { GarmentWithFileName(name: "\(name) \($0)", imageFileName: "IMG_\($0).jpg", wearCount: $0) }
        for garment in garments { try first.store.insert(garment) }
        return garments
    }

    /// Each of `devices` verifies clean and says nothing waits.
    func expectSettled(_ devices: [Device], _ way: Way, relay: URL) async throws {
        for device in devices {
            #expect(try device.store.verify().isClean, "\(device.path)")
            try await expectUpToDate(device, way, relay: relay, "\(device.path)")
        }
    }

    /// Every status of `device` says nothing waits (what a user sees as "synced").
    func expectUpToDate(_ device: Device, _ way: Way, relay: URL, _ comment: Comment) async throws {
        let status = way == .direct ? try device.engine.status() : try await device.engine.status(via: RelayTransport(directory: relay))
        #expect(status.parkedHere.isEmpty && status.parkedAtPeer.isEmpty && status.lastError == nil, "\(comment): \(status)")
    }

    /// A field dropped from the struct on one side: that store keeps the old values stored
    /// and ships them. A fresh install of the same version parked every delta of it ("unknown
    /// field Garment.imageFileName"), received 0 records, and both said "up to date". Now every
    /// record arrives, the file names are carried, and they come back to the first store
    /// intact after the fresh install edits the garments.
    @Test(arguments: Way.allCases) func aFieldDroppedFromTheStructSyncsToAFreshInstall(way: Way) async throws {
        let dir = TemporaryDirectory()
        let relay = try relayDirectory(dir)
        let garments = try firstVersionGarments(in: dir.sub("a"), named: "shirt")
        let a = try open(dir.sub("a"), [GarmentWithoutFileName.self])      // the app upgraded
        let fresh = try open(dir.sub("fresh"), [GarmentWithoutFileName.self])
        try await exchange(a, fresh, way, relay: relay)
        #expect(fresh.engine.parkedDeltas().isEmpty)
        for garment in garments {
            #expect(try fresh.store.get(GarmentWithoutFileName.self, id: garment.id) == GarmentWithoutFileName(id: garment.id, name: garment.name, wearCount: garment.wearCount))
            let state = try fresh.store.read(isolation: #isolation) { try $0.recordState(typeNamed: "Garment", id: garment.id) }
            #expect(state.fields["imageFileName"]?.value == .string(garment.imageFileName!), "carried")
        }
        #expect(fresh.store.schema.type(named: "Garment")?.field(named: "imageFileName") == nil, "the import left the schema as declared")
        // The other way: edits on the fresh install reach the first store, whose file names stay.
        for garment in garments { try fresh.store.update(GarmentWithoutFileName.self, id: garment.id) { $0.wearCount += 10 } }
        try await exchange(a, fresh, way, relay: relay)
        let reopened = try open(dir.sub("a"), [GarmentWithFileName.self])   // the older version again
        for garment in garments {
            var expected = garment
            expected.wearCount += 10
            #expect(try reopened.store.get(GarmentWithFileName.self, id: garment.id) == expected)
        }
        try await expectSettled([reopened, fresh], way, relay: relay)
    }

    /// The same with a migration that drops the field (moving it into `imageData`): a fresh
    /// install of the migrated version receives every record, with its image.
    @Test(arguments: Way.allCases) func aFieldDroppedByAMigrationSyncsToAFreshInstall(way: Way) async throws {
        let dir = TemporaryDirectory()
        let relay = try relayDirectory(dir)
        let garments = try firstVersionGarments(in: dir.sub("a"), named: "coat")
        let a = try open(dir.sub("a"), [GarmentWithImage.self], migrations: [garmentMigration])
        let fresh = try open(dir.sub("fresh"), [GarmentWithImage.self], migrations: [garmentMigration])
        try await exchange(fresh, a, way, relay: relay)
        #expect(fresh.engine.parkedDeltas().isEmpty)
        for garment in garments {
            let expected = GarmentWithImage(id: garment.id, name: garment.name, imageData: Data(garment.imageFileName!.utf8), wearCount: garment.wearCount)
            #expect(try fresh.store.get(GarmentWithImage.self, id: garment.id) == expected)
            #expect(try a.store.get(GarmentWithImage.self, id: garment.id) == expected)
        }
        try fresh.store.update(GarmentWithImage.self, id: garments[0].id) { $0.wearCount = 99 }
        try await exchange(fresh, a, way, relay: relay)
        #expect(try a.store.get(GarmentWithImage.self, id: garments[0].id)?.wearCount == 99)
        try await expectSettled([a, fresh], way, relay: relay)
    }

    /// An older app version and a newer one (an added optional field, an added index, a new
    /// type) sync both ways: the older one carries what it does not declare, keeps it through
    /// its own edits, passes it to a third store, and reads it once it upgrades; neither
    /// loses the other's values.
    @Test(arguments: Way.allCases) func anOlderAndANewerVersionSyncBothWaysAndLoseNothing(way: Way) async throws {
        let dir = TemporaryDirectory()
        let relay = try relayDirectory(dir)
        let older = try open(dir.sub("older"), [GarmentWithoutFileName.self])
        let newer = try open(dir.sub("newer"), [GarmentWithImage.self, Outfit.self])
        let fromNewer = GarmentWithImage(name: "jacket", imageData: Data([1, 2, 3]), wearCount: 1)
        let outfit = Outfit(title: "monday", garments: [fromNewer.id])
        try newer.store.insert(fromNewer)
        try newer.store.insert(outfit)
        let fromOlder = GarmentWithoutFileName(name: "scarf", wearCount: 2)
        try older.store.insert(fromOlder)
        try await exchange(older, newer, way, relay: relay)
        #expect(older.engine.parkedDeltas().isEmpty && newer.engine.parkedDeltas().isEmpty)
        #expect(try older.store.read(isolation: #isolation) { $0.carriedTypeNames } == ["Outfit"])
        #expect(try newer.store.get(GarmentWithImage.self, id: fromOlder.id) == GarmentWithImage(id: fromOlder.id, name: "scarf", imageData: nil, wearCount: 2))

        // The older version edits the newer one's garment (its whole struct, typed): the image
        // stays, everywhere.
        try older.store.update(GarmentWithoutFileName.self, id: fromNewer.id) { $0.name = "denim jacket"; $0.wearCount = 5 }
        try await exchange(older, newer, way, relay: relay)
        let edited = GarmentWithImage(id: fromNewer.id, name: "denim jacket", imageData: Data([1, 2, 3]), wearCount: 5)
        #expect(try newer.store.get(GarmentWithImage.self, id: fromNewer.id) == edited)
        #expect(try newer.store.count(GarmentWithImage.self, where: \.wearCount, equals: 5) == 1, "the newer version's index follows")

        // A third store of the newer version hears everything from the older one alone.
        let third = try open(dir.sub("third"), [GarmentWithImage.self, Outfit.self])
        try await older.sync(with: third)
        #expect(try third.store.get(GarmentWithImage.self, id: fromNewer.id) == edited)
        #expect(try third.store.get(Outfit.self, id: outfit.id) == outfit)

        // The older store upgrades: the image and the outfit are its records now.
        let upgraded = try open(dir.sub("older"), [GarmentWithImage.self, Outfit.self])
        #expect(try upgraded.store.get(GarmentWithImage.self, id: fromNewer.id) == edited)
        #expect(try upgraded.store.get(Outfit.self, id: outfit.id) == outfit)
        #expect(try upgraded.store.read(isolation: #isolation) { $0.carriedTypeNames }.isEmpty)
        #expect(try upgraded.store.count(GarmentWithImage.self, where: \.wearCount, equals: 5) == 1)
        for device in [upgraded, newer, third] { #expect(try device.store.verify().isClean, "\(device.path)") }
        try await expectUpToDate(newer, way, relay: relay, "newer")
    }

    /// A migration on one side while the other, still on the older version, edits the same
    /// records: every edit survives on both sides, the migrated images arrive at the older
    /// version (carried, then read once it migrates too), and nothing is parked.
    @Test(arguments: Way.allCases) func aMigrationOnOneSideWhileTheOtherEditsTheSameRecords(way: Way) async throws {
        let dir = TemporaryDirectory()
        let relay = try relayDirectory(dir)
        var garments: [GarmentWithFileName] = []
        do {
            let a = try open(dir.sub("a"), [GarmentWithFileName.self])
            let b = try open(dir.sub("b"), [GarmentWithFileName.self])
            for n in 0..<3 {
                let garment = GarmentWithFileName(name: "dress \(n)", imageFileName: "IMG_\(n).jpg", wearCount: 0)
                garments.append(garment)
                try a.store.insert(garment)
            }
            try await exchange(a, b, way, relay: relay)
        }
        let migrated = try open(dir.sub("a"), [GarmentWithImage.self], migrations: [garmentMigration])
        let older = try open(dir.sub("b"), [GarmentWithFileName.self])
        // Meanwhile on the older version: worn, and one renamed.
        for garment in garments { try older.store.update(GarmentWithFileName.self, id: garment.id) { $0.wearCount += 1 } }
        try older.store.update(GarmentWithFileName.self, id: garments[1].id) { $0.name = "blue dress" }
        try await exchange(migrated, older, way, relay: relay)
        #expect(migrated.engine.parkedDeltas().isEmpty && older.engine.parkedDeltas().isEmpty)
        for (n, garment) in garments.enumerated() {
            let name = n == 1 ? "blue dress" : garment.name
            #expect(try migrated.store.get(GarmentWithImage.self, id: garment.id)
                    == GarmentWithImage(id: garment.id, name: name, imageData: Data(garment.imageFileName!.utf8), wearCount: 1))
            let onOlder = try older.store.get(GarmentWithFileName.self, id: garment.id)
            #expect(onOlder?.name == name && onOlder?.wearCount == 1, "\(String(describing: onOlder))")
            let state = try older.store.read(isolation: #isolation) { try $0.recordState(typeNamed: "Garment", id: garment.id) }
            #expect(state.fields["imageData"]?.value == .bytes(Data(garment.imageFileName!.utf8)), "the migrated image is carried on the older version")
        }
        // The older version migrates in turn: the same images, every edit kept.
        let caughtUp = try open(dir.sub("b"), [GarmentWithImage.self], migrations: [garmentMigration])
        try await exchange(migrated, caughtUp, way, relay: relay)
        for (n, garment) in garments.enumerated() {
            let expected = GarmentWithImage(id: garment.id, name: n == 1 ? "blue dress" : garment.name, imageData: Data(garment.imageFileName!.utf8), wearCount: 1)
            #expect(try caughtUp.store.get(GarmentWithImage.self, id: garment.id) == expected)
            #expect(try migrated.store.get(GarmentWithImage.self, id: garment.id) == expected)
        }
        try await expectSettled([migrated, caughtUp], way, relay: relay)
    }

    /// What cannot be kept is parked, and both ends say so: the store that parks names the
    /// delta and why, and so does its source (a direct peer's, or a relay reader's note), and
    /// neither says "up to date" until it applies.
    @Test(arguments: Way.allCases) func bothEndsNameWhatIsParkedAndWhy(way: Way) async throws {
        let dir = TemporaryDirectory()
        let relayURL = try relayDirectory(dir)
        let relay = RelayTransport(directory: relayURL)
        let a = try Device.open(dir.sub("a"), family: family)
        let b = try Device.open(dir.sub("b"), family: family, types: [Note.self, PlainWallet.self])
        try a.store.insert(Wallet())
        func exchange() async throws {
            switch way {
            case .direct: try await a.sync(with: b)
            case .relay: try await a.engine.sync(via: relay); try await b.engine.sync(via: relay); try await a.engine.sync(via: relay)
            }
        }
        try await exchange()
        let here = way == .direct ? try b.engine.status(peer: a.store.siteID) : try await b.engine.status(via: relay)
        let there = way == .direct ? try a.engine.status(peer: b.store.siteID) : try await a.engine.status(via: relay)
        for (status, which) in [(here, "parking store"), (there, "source")] {
            #expect(!status.isUpToDate && !status.description.contains("up to date"), "\(which): \(status)")
            #expect(status.description.contains("Wallet.credits is a plain value here but a counter at the source"), "\(which): \(status)")
        }
        #expect(here.parkedHere.count == 1 && there.parkedAtPeer.count == 1)
        // The app upgrades: applied, and both ends are up to date after the next exchange.
        let upgraded = try Device.open(dir.sub("b"), family: family)
        switch way {
        case .direct: try await a.sync(with: upgraded)
        case .relay: try await upgraded.engine.sync(via: relay); try await a.engine.sync(via: relay)
        }
        let after = way == .direct ? try a.engine.status(peer: b.store.siteID) : try await a.engine.status(via: relay)
        #expect(after.parkedAtPeer.isEmpty, "\(after)")
        #expect(try upgraded.store.count(Wallet.self) == 1)
        #expect((way == .direct ? try upgraded.engine.status(peer: a.store.siteID) : try await upgraded.engine.status(via: relay)).parkedHere.isEmpty)
    }
}
