import Foundation
import Stash
import StashSync
import Testing
import StashTestSupport

/// A home with a required name and a credits counter.
struct Household: Record, Equatable {
    var id = RecordID()
    var name: String
    var credits = Counter()
}

/// What a member of the family who holds the key can send (issue 34, points 2 and 4): every
/// delta below is correctly signed. The store must refuse what no replica writes, with one
/// clear error naming the delta, the record and the field, never crash, never change its
/// schema, and stay as it was.
@Suite struct HostileDeltaTests {
    let family = RecordID()
    let key = try! SyncKey(Array("the family's shared sync key!".utf8))

    /// A source and a receiver of the same schema, the receiver holding one household already.
    func pair(_ dir: TemporaryDirectory) async throws -> (source: Device, receiver: Device, home: Household) {
        let source = try Device.open(dir.sub("source"), family: family, key: key, types: [Household.self])
        let receiver = try Device.open(dir.sub("receiver"), family: family, key: key, types: [Household.self])
        var home = Household(name: "flat")
        home.credits.add(3, site: source.store.siteID)
        try source.store.insert(home)
        try await source.sync(with: receiver)
        return (source, receiver, home)
    }

    /// Everything a refusal must leave as it was.
    func snapshot(_ store: Store) throws -> [String] {
        try store.read { snapshot in
            var lines = ["schema \(snapshot.schema)", "history \(try snapshot.historyBounds().current)", "carried \(snapshot.carriedTypeNames)"]
            try snapshot.forEachRecordState(typeNamed: "Household") { state in
                lines.append("\(state.id) \(state.incarnation.map(\.description) ?? "-") \(state.fields.keys.sorted().map { "\($0)=\(state.fields[$0]!.value)@\(state.fields[$0]!.version)" })")
                return true
            }
            for (key, value) in try snapshot.metadata(withPrefix: "sync.") where !key.hasPrefix("sync.last") { lines.append("\(key)=\(value)") }
            return lines
        }
    }

    /// The source's next delta with the state of `home` changed by `change`, signed with the key.
    func forged(_ source: Device, _ receiver: Device, _ home: Household, fullSnapshot: Bool = true,
                _ change: (inout RecordState) -> Void) throws -> Data {
        var delta = try source.engine.makeDelta(for: receiver.store.siteID, fullSnapshot: fullSnapshot)
        let index = try #require(delta.entries.firstIndex { $0.id == home.id })
        change(&delta.entries[index])
        return delta.encoded(key: key)
    }

    /// When the fingerprints matched, an import skipped the schema checks: a delta could add
    /// a field (`Household.extra`, or one named `id`) to the stored schema, store a household
    /// without its required name, and store counter values `put` refuses; a NaN date in a
    /// counter killed the importer (SIGILL, formatting the error message).
    @Test func whatNoReplicaWritesIsRefusedWholeAndChangesNothing() async throws {
        let dir = TemporaryDirectory()
        let (source, receiver, home) = try await pair(dir)
        let next = Version(clock: UInt64(Date().timeIntervalSince1970 * 1000) << 16, site: source.store.siteID)
        func counter(_ sites: FieldValue) -> FieldValue { .map(["sites": sites]) }
        let site = source.store.siteID.description
        let newcomer = RecordID()
        let cases: [(String, (inout RecordState) -> Void, String)] = [
            ("a field named id", { $0.fields["id"] = FieldState(value: .string("x"), version: next) }, "field named 'id'"),
            ("a field with no name", { $0.fields[""] = FieldState(value: .int(1), version: next) }, "field named ''"),
            ("a new household without its required name", { $0.id = newcomer; $0.fields["name"] = nil }, "no value for name"),
            ("a null required name", { $0.fields["name"] = FieldState(value: .null, version: next) }, "no value for name"),
            ("credits as text", { $0.fields["credits"] = FieldState(value: .string("lots"), version: next) }, "credits"),
            ("a fractional total", {
                $0.fields["credits"] = FieldState(value: counter(.map([site: .map(["increments": .double(1.5), "decrements": .int(0)])])), version: next)
            }, "credits"),
            ("a missing decrement total", {
                $0.fields["credits"] = FieldState(value: counter(.map([site: .map(["increments": .int(1)])])), version: next)
            }, "credits"),
            ("sites as a list", { $0.fields["credits"] = FieldState(value: counter(.array([.string(site)])), version: next) }, "credits"),
            ("a negative total", {
                $0.fields["credits"] = FieldState(value: counter(.map([site: .map(["increments": .int(-5), "decrements": .int(0)])])), version: next)
            }, "credits"),
            ("a NaN date in a counter", {
                $0.fields["credits"] = FieldState(value: counter(.map([site: .map(["increments": .date(Date(timeIntervalSinceReferenceDate: .nan)),
                                                                                   "decrements": .int(0)])])), version: next)
            }, "credits"),
        ]
        let before = try snapshot(receiver.store)
        for (what, change, named) in cases {
            let data = try forged(source, receiver, home, change)
            do {
                let outcome = try receiver.engine.apply(data, name: "forged.delta")
                Issue.record("\(what): applied (\(outcome))")
            } catch let error as SyncError {
                #expect(error.code == .invalidDelta, "\(what): \(error)")
                #expect(error.message.hasPrefix("forged.delta holds") && error.message.contains(named)
                        && (error.message.contains("Household \(home.id)") || error.message.contains("Household \(newcomer)")),
                        "\(what): \(error.message)")
            }
            #expect(try snapshot(receiver.store) == before, "\(what) changed the store")
        }
        #expect(try receiver.store.verify().isClean)
        #expect(try receiver.store.get(Household.self, id: home.id) == home)
    }

    /// A field the schema does not declare, sent with the receiver's own schema fingerprint,
    /// is carried (kept with its version and sent on), never added to the schema.
    @Test func aFieldTheSchemaLacksIsCarriedNeverAddedToTheSchema() async throws {
        let dir = TemporaryDirectory()
        let (source, receiver, home) = try await pair(dir)
        let schema = receiver.store.schema
        let next = Version(clock: UInt64(Date().timeIntervalSince1970 * 1000) << 16 + 1, site: source.store.siteID)
        let data = try forged(source, receiver, home, fullSnapshot: true) { $0.fields["extra"] = FieldState(value: .int(42), version: next) }
        #expect(try receiver.engine.apply(data) == .applied(entries: 1, changed: 1))
        #expect(receiver.store.schema == schema)
        #expect(try receiver.store.read(isolation: #isolation) { $0.schema } == schema)
        #expect(try receiver.store.read(isolation: #isolation) { try $0.recordState(typeNamed: "Household", id: home.id) }.fields["extra"]?.value == .int(42))
        #expect(try receiver.store.get(Household.self, id: home.id) == home)
        #expect(try receiver.store.verify().isClean)
    }

    /// A store whose family uses a key refuses unsigned deltas even when the engine (the
    /// command) was not given the key: it remembers the key's fingerprint, and the error says
    /// which key is needed. Before, an unsigned delta was accepted when `--key-file` was left
    /// out.
    @Test func aStoreRemembersThatItsFamilyAuthenticates() async throws {
        let dir = TemporaryDirectory()
        let (source, receiver, home) = try await pair(dir)
        #expect(try SyncEngine.keyFingerprint(of: receiver.store) == key.fingerprint)
        try source.store.update(Household.self, id: home.id) { $0.name = "house" }
        let unsigned = try source.engine.makeDelta(for: receiver.store.siteID).encoded()
        let keyless = try SyncEngine(store: receiver.store, configuration: SyncConfiguration())
        let before = try snapshot(receiver.store)
        for engine in [keyless, receiver.engine] {
            do {
                _ = try engine.apply(unsigned, name: "unsigned.delta")
                Issue.record("an unsigned delta was applied")
            } catch let error as SyncError {
                #expect(error.code == .unauthenticated, "\(error)")
            }
        }
        do {
            _ = try keyless.apply(unsigned, name: "unsigned.delta")
        } catch let error as SyncError {
            #expect(error.message.contains(key.fingerprint) && error.message.contains("--key-file"), "\(error.message)")
        }
        // Another key is refused the same way, naming both fingerprints.
        let other = try SyncKey(Array("another key, not the family's".utf8))
        let wrong = try SyncEngine(store: receiver.store, configuration: SyncConfiguration(key: other))
        let signedOtherwise = try source.engine.makeDelta(for: receiver.store.siteID).encoded(key: other)
        #expect(throws: SyncError.self) { try wrong.apply(signedOtherwise) }
        #expect(try snapshot(receiver.store) == before)
        // With the key, it applies.
        #expect(try receiver.engine.apply(try source.engine.makeDelta(for: receiver.store.siteID).encoded(key: key)) == .applied(entries: 1, changed: 1))
    }

    /// A refused import changes nothing: a store without a family that refused a delta made
    /// for another store had adopted the delta's family all the same.
    @Test func aRefusedImportLeavesAStoreWithoutAFamilyAsItWas() throws {
        let dir = TemporaryDirectory()
        let source = try Device.open(dir.sub("source"), family: family, types: [Household.self])
        try source.store.insert(Household(name: "flat"))
        let forSomeoneElse = try source.engine.makeDelta(for: RecordID()).encoded()
        let fresh = try Store.open(at: dir.sub("fresh"), types: [Household.self])
        let engine = try SyncEngine(store: fresh, configuration: SyncConfiguration(family: family))
        #expect(throws: SyncError.self) { try engine.apply(forSomeoneElse) }
        #expect(try SyncEngine.family(of: fresh) == nil)
        #expect(try SyncEngine.peers(of: fresh).isEmpty)
        // One for this store adopts the family with it.
        #expect(try engine.apply(source.engine.makeDelta(for: fresh.siteID).encoded()) == .applied(entries: 1, changed: 1))
        #expect(try SyncEngine.family(of: fresh) == family)
    }
}
