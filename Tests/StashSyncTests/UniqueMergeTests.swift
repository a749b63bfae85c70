import Foundation
import Stash
import StashSync
import Testing
import StashTestSupport

/// A type with two unique indexes.
struct Account: Record, Equatable {
    var id = RecordID()
    var email: String
    var handle: String
    static let indexes: [RecordIndex<Account>] = [.unique(\.email), .unique(\.handle)]
}

/// `Member` as an app version before its unique `email` declared it.
struct MemberV1: Record, Equatable {
    static let recordType = "Member"
    var id = RecordID()
    var name: String
}

/// `Member` with a unique `email` that may be missing.
struct MemberV2: Record, Equatable {
    static let recordType = "Member"
    var id = RecordID()
    var name: String
    var email: String?
    static let indexes: [RecordIndex<MemberV2>] = [.unique(\.email)]
}

/// A type whose unique values are longer than an index key holds.
struct Document: Record, Equatable {
    var id = RecordID()
    var path: String
    static let indexes: [RecordIndex<Document>] = [.unique(\.path)]
}

/// Unique values that move between live records inside one delta. A delta holds each
/// record's final state; the receiver merges them one at a time, so in between it can hold
/// states that clash although the final ones do not. The clash rule (the smaller id stays)
/// must judge the final state, or it deletes a record on every replica.
@Suite struct UniqueMergeTests {
    let family = RecordID()

    /// Two fresh ids, the smaller first.
    private func orderedIDs() -> (small: RecordID, large: RecordID) {
        let x = RecordID(), y = RecordID()
        return x < y ? (x, y) : (y, x)
    }

    /// Stores `a` and `b` of one sync family in `dir`.
    private func twoDevices(_ dir: TemporaryDirectory, types: [any Record.Type] = syncTypes) throws -> (Device, Device) {
        (try Device.open(dir.sub("a"), family: family, types: types), try Device.open(dir.sub("b"), family: family, types: types))
    }

    private func expectConverged(_ devices: [Device], profiles: [RecordID: String]) throws {
        for device in devices {
            for (id, kind) in profiles {
                #expect(try device.store.get(UserProfile.self, id: id)?.kind == kind, "store \(device.path), profile \(id)")
            }
            #expect(try device.store.count(UserProfile.self) == profiles.count, "store \(device.path)")
            #expect(try device.store.verify().isClean, "store \(device.path)")
        }
        #expect(try canonicalDump(devices[0].store) == canonicalDump(devices[1].store))
    }

    /// X and Y swap their unique values through a temporary one; both must survive, swapped,
    /// whichever of them has the smaller id.
    @Test(arguments: [true, false])
    func aSwapInOneDeltaKeepsBothRecords(smallerMovesFirst: Bool) async throws {
        let dir = TemporaryDirectory()
        let (a, b) = try twoDevices(dir)
        let ids = orderedIDs()
        let (xID, yID) = smallerMovesFirst ? (ids.small, ids.large) : (ids.large, ids.small)
        try a.store.insert(UserProfile(id: xID, kind: "e1", displayName: "X"))
        try a.store.insert(UserProfile(id: yID, kind: "e2", displayName: "Y"))
        try await a.sync(with: b)
        try a.store.update(UserProfile.self, id: xID) { $0.kind = "tmp" }
        try a.store.update(UserProfile.self, id: yID) { $0.kind = "e1" }
        try a.store.update(UserProfile.self, id: xID) { $0.kind = "e2" }
        try await a.sync(with: b)
        try await a.sync(with: b)
        try expectConverged([a, b], profiles: [xID: "e2", yID: "e1"])
    }

    /// Y takes the value X gives up, but Y comes first in the delta (it changed earlier in
    /// the same range): merged first, it meets X still holding the value.
    @Test(arguments: [true, false])
    func aValueTakenFromARecordLaterInTheDeltaKeepsBoth(takerIsSmaller: Bool) async throws {
        let dir = TemporaryDirectory()
        let (a, b) = try twoDevices(dir)
        let ids = orderedIDs()
        let (giver, taker) = takerIsSmaller ? (ids.large, ids.small) : (ids.small, ids.large)
        try a.store.insert(UserProfile(id: giver, kind: "owner", displayName: "giver"))
        try a.store.insert(UserProfile(id: taker, kind: "guest", displayName: "taker"))
        try await a.sync(with: b)
        try a.store.update(UserProfile.self, id: taker) { $0.displayName = "taker, renamed" }
        try a.store.update(UserProfile.self, id: giver) { $0.kind = "former owner" }
        try a.store.update(UserProfile.self, id: taker) { $0.kind = "owner" }
        try await a.sync(with: b)
        try await a.sync(with: b)
        try expectConverged([a, b], profiles: [giver: "former owner", taker: "owner"])
    }

    /// A real clash still ends with one record: two devices give different records the same
    /// value, each also moving another value, in one delta each way.
    @Test func aRealClashStillKeepsTheSmallerID() async throws {
        let dir = TemporaryDirectory()
        let (a, b) = try twoDevices(dir)
        let ids = orderedIDs()
        try a.store.insert(UserProfile(id: ids.large, kind: "admin", displayName: "on A"))
        try b.store.insert(UserProfile(id: ids.small, kind: "admin", displayName: "on B"))
        try await a.sync(with: b)
        try await a.sync(with: b)
        try expectConverged([a, b], profiles: [ids.small: "admin"])
    }

    /// The store whose merge deletes a record for a clash says so: in the fetch's report (with
    /// the record kept and the index), in its description, and in `apply`'s outcome. Before,
    /// the record vanished with nothing to tell the user.
    @Test func aClashIsReportedByTheStoreThatSettlesIt() async throws {
        let dir = TemporaryDirectory()
        let (a, b) = try twoDevices(dir)
        let ids = orderedIDs()
        try a.store.insert(UserProfile(id: ids.small, kind: "admin", displayName: "on A"))
        try b.store.insert(UserProfile(id: ids.large, kind: "admin", displayName: "on B"))
        let report = try await b.engine.fetchChanges(via: DirectTransport(to: a.engine))
        let expected = UniqueClash(type: "UserProfile", removed: ids.large, kept: ids.small, index: "kind")
        #expect(report.uniqueClashes == [expected])
        #expect(report.description.contains("UserProfile \(ids.large) deleted: UserProfile \(ids.small) holds the same kind (unique)"), "\(report)")
        #expect(try b.store.get(UserProfile.self, id: ids.large) == nil)
        // A's side learns of the delete as an ordinary one: nothing clashes there.
        let back = try await a.engine.fetchChanges(via: DirectTransport(to: b.engine))
        #expect(back.uniqueClashes.isEmpty && back.changedHere == 1, "\(back)")
        try expectConverged([a, b], profiles: [ids.small: "admin"])

        // The same through `apply`, and nothing reported when nothing clashes.
        let c = try Device.open(dir.sub("c"), family: family)
        try c.store.insert(UserProfile(id: ids.large, kind: "admin", displayName: "on C"))
        try a.store.insert(UserProfile(kind: "owner", displayName: "on A"))
        let delta = try a.engine.makeDelta(for: c.store.siteID)
        let outcome = try c.engine.apply(delta.encoded())
        #expect(outcome == .applied(entries: delta.entries.count, changed: delta.entries.count, uniqueClashes: [expected]))
        try b.store.insert(UserProfile(kind: "guest", displayName: "on B"))
        let quiet = try await b.engine.fetchChanges(via: DirectTransport(to: a.engine))
        #expect(quiet.uniqueClashes.isEmpty && quiet.changedHere == 1, "\(quiet)")
    }

    /// Over `DirectTransport` the store that receives a send settles the clash inside the
    /// sender's `sync(via:)`: that call reports it (`uniqueClashesAtPeer`), whichever store's
    /// record lost. Before, the receiver's outcome was dropped and the clash reached nobody:
    /// the sender then fetched the settling delete as an ordinary one.
    @Test(arguments: [true, false])
    func aClashSettledByTheReceiverOfADirectSendIsReportedToTheSender(senderHoldsTheSmallerID: Bool) async throws {
        let dir = TemporaryDirectory()
        let (a, b) = try twoDevices(dir)
        let ids = orderedIDs()
        let (onA, onB) = senderHoldsTheSmallerID ? (ids.small, ids.large) : (ids.large, ids.small)
        try a.store.insert(UserProfile(id: onA, kind: "admin", displayName: "on A"))
        try b.store.insert(UserProfile(id: onB, kind: "admin", displayName: "on B"))
        let expected = UniqueClash(type: "UserProfile", removed: ids.large, kept: ids.small, index: "kind")
        let report = try await a.engine.sync(via: DirectTransport(to: b.engine))
        #expect(report.description.contains("the peer deleted for a unique value another record holds: \(expected)"), "\(report)")
        #expect(report.uniqueClashesAtPeer == [expected], "\(report)")
        #expect(report.uniqueClashes.isEmpty, "nothing was deleted in A by this sync's fetch: \(report)")
        let back = try await b.engine.sync(via: DirectTransport(to: a.engine))
        #expect(back.uniqueClashes.isEmpty && back.uniqueClashesAtPeer.isEmpty, "reported once: \(back)")
        try expectConverged([a, b], profiles: [ids.small: "admin"])
    }

    /// A record deleted on purpose and replaced by a new one with the same unique value is no
    /// clash: the other store receives a delete and an insert, and reports nothing (a first
    /// attempt at telling the losing side of a clash reported exactly this as one).
    @Test func aDeleteAndARecreateWithTheSameValueIsNoClash() async throws {
        let dir = TemporaryDirectory()
        let (a, b) = try twoDevices(dir)
        let first = UserProfile(kind: "admin", displayName: "first")
        try b.store.insert(first)
        try await a.sync(with: b)
        try b.store.delete(UserProfile.self, id: first.id)
        let replacement = UserProfile(kind: "admin", displayName: "replacement")
        try b.store.insert(replacement)
        let report = try await a.engine.fetchChanges(via: DirectTransport(to: b.engine))
        #expect(report.uniqueClashes.isEmpty && report.changedHere == 2, "\(report)")
        try expectConverged([a, b], profiles: [replacement.id: "admin"])
    }

    /// A record arriving with values that two different local records hold, one per unique
    /// index: it has the smallest id, so both local ones go, and the delta applies (before,
    /// the second clash escaped the first one's handling and failed the delta every time).
    @Test func aRecordClashingOnTwoUniqueIndexesApplies() async throws {
        let dir = TemporaryDirectory()
        let (a, b) = try twoDevices(dir, types: syncTypes + [Account.self])
        let ids = [RecordID(), RecordID(), RecordID()].sorted()
        try a.store.insert(Account(id: ids[0], email: "ann@example.com", handle: "ann"))
        try b.store.insert(Account(id: ids[1], email: "ann@example.com", handle: "annie"))
        try b.store.insert(Account(id: ids[2], email: "ann@work.example.com", handle: "ann"))
        try await a.sync(with: b)
        try await a.sync(with: b)
        for device in [a, b] {
            #expect(try device.store.get(Account.self, id: ids[0])?.handle == "ann", "store \(device.path)")
            #expect(try device.store.count(Account.self) == 1, "store \(device.path)")
            #expect(try device.store.verify().isClean, "store \(device.path)")
        }
    }

    /// Merges through the public API settle clashes when the transaction commits, on what it
    /// holds then: a clash a later merge of the same transaction removes deletes nothing.
    @Test func mergesInOneTransactionAreJudgedOnTheirFinalState() async throws {
        let dir = TemporaryDirectory()
        let (a, b) = try twoDevices(dir)
        let ids = orderedIDs()
        try a.store.insert(UserProfile(id: ids.small, kind: "k1", displayName: "small"))
        try a.store.insert(UserProfile(id: ids.large, kind: "k2", displayName: "large"))
        try await a.sync(with: b)
        try a.store.update(UserProfile.self, id: ids.small) { $0.kind = "k3" }
        try a.store.update(UserProfile.self, id: ids.large) { $0.kind = "k1" }
        let states = try a.store.read(isolation: #isolation) { snapshot in
            try [ids.large, ids.small].map { try snapshot.recordState(typeNamed: "UserProfile", id: $0) }
        }
        try b.store.write(isolation: #isolation) { tx in
            for state in states { try tx.merge(state, origin: a.store.siteID) }
        }
        #expect(try b.store.get(UserProfile.self, id: ids.small)?.kind == "k3")
        #expect(try b.store.get(UserProfile.self, id: ids.large)?.kind == "k1")
        #expect(try b.store.verify().isClean)
    }

    /// Values longer than an index key share a shortened key: records clash only when the
    /// whole values are equal.
    @Test func longUniqueValuesClashOnlyWhenWhollyEqual() async throws {
        let dir = TemporaryDirectory()
        let (a, b) = try twoDevices(dir, types: syncTypes + [Document.self])
        let prefix = String(repeating: "/very/long/path", count: 60)
        let ids = [RecordID(), RecordID(), RecordID(), RecordID()].sorted()
        try a.store.insert(Document(id: ids[0], path: prefix + "/one"))
        try a.store.insert(Document(id: ids[1], path: prefix + "/two"))
        try b.store.insert(Document(id: ids[2], path: prefix + "/one"))
        try b.store.insert(Document(id: ids[3], path: prefix + "/three"))
        try await a.sync(with: b)
        try await a.sync(with: b)
        for device in [a, b] {
            #expect(try device.store.count(Document.self) == 3, "store \(device.path)")
            #expect(try device.store.get(Document.self, id: ids[2]) == nil, "store \(device.path)")
            #expect(try device.store.verify().isClean, "store \(device.path)")
        }
    }

    /// Records from a replica whose schema lacks the unique field all lack its value: none of
    /// them clashes with another (before, the smallest id stayed and the rest were deleted on
    /// every replica, the old one included).
    @Test func recordsLackingAUniqueValueAllSurviveAMerge() async throws {
        let dir = TemporaryDirectory()
        let old = try Device.open(dir.sub("old"), family: family, types: [MemberV1.self])
        let new = try Device.open(dir.sub("new"), family: family, types: [MemberV2.self])
        for name in ["a", "b", "c"] { try old.store.insert(MemberV1(name: name)) }
        try new.store.insert(MemberV2(name: "d", email: nil))
        try await old.sync(with: new)
        try await old.sync(with: new)
        #expect(try new.store.count(MemberV2.self) == 4)
        #expect(try old.store.count(MemberV1.self) == 4)
        #expect(try new.store.verify().isClean && old.store.verify().isClean)
    }
}
