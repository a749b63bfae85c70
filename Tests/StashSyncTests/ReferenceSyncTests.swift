import Foundation
import Stash
import StashSync
import Testing
import StashTestSupport

/// A home whose items are deleted with it.
struct Dwelling: Record, Equatable {
    var id = RecordID()
    var name: String
    static let indexes: [RecordIndex<Dwelling>] = [.unique(\.name)]
}

struct Belonging: Record, Equatable {
    var id = RecordID()
    var dwellingID: RecordID
    var name: String
    static let references: [RecordReference<Belonging>] = [.reference(\.dwellingID, to: Dwelling.self, onDelete: .cascade)]
}

/// Forbids deleting its dwelling here; a delete made on another device cannot be refused,
/// so a merge deletes it as a cascade would.
struct Lease: Record, Equatable {
    var id = RecordID()
    var dwellingID: RecordID
    var tenant: String
    static let references: [RecordReference<Lease>] = [.reference(\.dwellingID, to: Dwelling.self, onDelete: .deny)]
}

/// Outlives its dwelling.
struct Picture: Record, Equatable {
    var id = RecordID()
    var dwellingID: RecordID?
    var caption: String
    static let references: [RecordReference<Picture>] = [.reference(\.dwellingID, to: Dwelling.self, onDelete: .nullify)]
}

/// Relationships across sync: the delete rules are applied by the merge, in the transaction
/// that merges a delta, the same way on every replica, so that after both devices have
/// synced no record refers to a deleted parent, whatever the order of the exchanges.
@Suite struct ReferenceSyncTests {
    static let types: [any Record.Type] = [Dwelling.self, Belonging.self, Picture.self, Lease.self]

    enum Way: String, CaseIterable, CustomStringConvertible {
        /// The deleting device syncs directly with the adding one (sends, then fetches).
        case directFromDeleter
        /// The adding device starts the direct sync.
        case directFromAdder
        /// Through a relay: the deleter publishes and fetches first, then the adder, then the deleter again.
        case relayDeleterFirst
        /// Through a relay, the adder first.
        case relayAdderFirst
        var description: String { rawValue }
    }

    /// Two devices of one family in `dir`, and a relay directory.
    private func pair(in dir: TemporaryDirectory) throws -> (Device, Device, URL) {
        let family = RecordID()
        let relay = dir.url.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: relay, withIntermediateDirectories: true)
        return (try Device.open(dir.sub("a"), family: family, types: Self.types),
                try Device.open(dir.sub("b"), family: family, types: Self.types), relay)
    }

    /// Brings `deleter` and `adder` together the `way` given, until both hold everything.
    private func exchange(_ deleter: Device, _ adder: Device, _ way: Way, relay: URL) async throws {
        switch way {
        case .directFromDeleter:
            try await deleter.sync(with: adder)
            try await deleter.sync(with: adder)
        case .directFromAdder:
            try await adder.sync(with: deleter)
            try await adder.sync(with: deleter)
        case .relayDeleterFirst, .relayAdderFirst:
            let order = way == .relayDeleterFirst ? [deleter, adder] : [adder, deleter]
            for _ in 0..<2 {
                for device in order { try await device.engine.sync(via: RelayTransport(directory: relay)) }
            }
        }
    }

    /// No record of either store refers to a parent it does not hold, and both hold the same.
    private func expectNoOrphans(_ devices: [Device], _ way: Way) throws {
        for device in devices {
            let dwellings = Set(try device.store.fetch(FetchDescriptor<Dwelling>()).map(\.id))
            for belonging in try device.store.fetch(FetchDescriptor<Belonging>()) {
                #expect(dwellings.contains(belonging.dwellingID), "\(way): \(belonging.name) refers to a deleted dwelling")
            }
            for lease in try device.store.fetch(FetchDescriptor<Lease>()) {
                #expect(dwellings.contains(lease.dwellingID), "\(way): the lease to \(lease.tenant) refers to a deleted dwelling")
            }
            for snapshot in try device.store.fetch(FetchDescriptor<Picture>()) {
                if let parent = snapshot.dwellingID { #expect(dwellings.contains(parent), "\(way): \(snapshot.caption) refers to a deleted dwelling") }
            }
            #expect(try device.store.verify().isClean)
        }
        let dumps = try devices.map { try canonicalDump($0.store, types: ["Dwelling", "Belonging", "Picture", "Lease"]) }
        #expect(dumps[0] == dumps[1], "\(way): the stores differ")
    }

    /// A dwelling deleted on one device while a belonging is added to it (and a picture
    /// taken of it, and a lease signed for it) on another: after both sync, the belonging
    /// and the lease are gone and the picture names no dwelling, on both, in every order of
    /// the exchanges.
    @Test(arguments: Way.allCases) func aParentDeletedWhileAChildIsAddedElsewhereLeavesNoOrphan(way: Way) async throws {
        let dir = TemporaryDirectory()
        let (deleter, adder, relay) = try pair(in: dir)
        let flat = Dwelling(name: "Flat"), barn = Dwelling(name: "Barn")
        let kept = Belonging(dwellingID: flat.id, name: "Lamp")
        try await deleter.store.write { tx in
            try tx.insert(flat)
            try tx.insert(barn)
            try tx.insert(kept)
            try tx.insert(Belonging(dwellingID: barn.id, name: "Saw"))
        }
        try await deleter.sync(with: adder)
        #expect(try adder.store.count(Belonging.self) == 2)
        // Offline: one device deletes the flat (its lamp goes with it), the other adds to it.
        try deleter.store.delete(Dwelling.self, id: flat.id)
        #expect(try deleter.store.count(Belonging.self) == 1)
        let added = Belonging(dwellingID: flat.id, name: "Desk")
        let photo = Picture(dwellingID: flat.id, caption: "the flat")
        try await adder.store.write { tx in
            try tx.insert(added)
            try tx.insert(photo)
            try tx.insert(Lease(dwellingID: flat.id, tenant: "Ann"))
            try tx.update(Belonging.self, id: kept.id) { $0.name = "Brass lamp" }
        }
        try await exchange(deleter, adder, way, relay: relay)
        try expectNoOrphans([deleter, adder], way)
        for device in [deleter, adder] {
            #expect(try device.store.get(Dwelling.self, id: flat.id) == nil, "\(way)")
            #expect(try device.store.get(Belonging.self, id: added.id) == nil, "\(way)")
            #expect(try device.store.fetch(FetchDescriptor<Belonging>()).map(\.name) == ["Saw"], "\(way)")
            #expect(try device.store.get(Picture.self, id: photo.id) == Picture(id: photo.id, dwellingID: nil, caption: "the flat"), "\(way)")
            #expect(try device.store.count(Lease.self) == 0, "\(way)")
        }
    }

    /// The same logical dwelling created on two devices (a unique clash the merge settles):
    /// the belongings of the one removed move to the one kept, on both devices.
    @Test(arguments: [Way.directFromDeleter, .relayDeleterFirst, .relayAdderFirst])
    func theChildrenOfARecordRemovedForAUniqueClashMoveToTheOneKept(way: Way) async throws {
        let dir = TemporaryDirectory()
        let (a, b, relay) = try pair(in: dir)
        let first = Dwelling(name: "Flat"), second = Dwelling(name: "Flat")
        let (small, large) = first.id < second.id ? (first, second) : (second, first)
        try await a.store.write { tx in
            try tx.insert(large)
            try tx.insert(Belonging(dwellingID: large.id, name: "Lamp"))
        }
        try await b.store.write { tx in
            try tx.insert(small)
            try tx.insert(Belonging(dwellingID: small.id, name: "Desk"))
        }
        try await exchange(a, b, way, relay: relay)
        try expectNoOrphans([a, b], way)
        for device in [a, b] {
            #expect(try device.store.fetch(FetchDescriptor<Dwelling>()).map(\.id) == [small.id], "\(way)")
            #expect(Set(try device.store.fetch(FetchDescriptor<Belonging>()).map(\.name)) == ["Lamp", "Desk"], "\(way)")
        }
    }
}
