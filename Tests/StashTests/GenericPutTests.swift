import Foundation
import Stash
import Testing
import StashTestSupport

/// A project as an app declares it: `slug` required (no default), `note` optional, `stars`
/// required with a default, `weight` a double.
private struct Project: Record, Equatable {
    var id = RecordID()
    var name: String
    var slug: String
    var note: String?
    var stars: Int
    var weight: Double
    static var fieldDefaults: [String: FieldValue] { ["stars": .int(0)] }
}

/// Cannot be probed (a String enum without CaseIterable): its fields are learned from the
/// records written, and `note` is not in the schema until a record holds one.
private struct Ticket: Record, Equatable {
    enum Status: String, Codable { case open, closed }
    var id = RecordID()
    var status: Status
    var note: String?
}

/// Probed, with no field but its id: the fields it has are known (none).
private struct Marker: Record, Equatable {
    var id = RecordID()
}

/// The schema-driven write path (`StoreTransaction.put(GenericRecord)`, used by the command
/// line and by apps without a Swift type) stores only what the type's schema can read back.
@Suite struct GenericPutTests {
    private static func project(_ fields: [String: FieldValue], id: RecordID = RecordID()) -> GenericRecord {
        GenericRecord(type: "Project", id: id, fields: fields)
    }

    /// A record lacking a required field was stored, and every typed fetch of its type then
    /// threw "missing field": one bad record broke the type for the app.
    @Test func aRecordLackingARequiredFieldIsRefused() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Project.self])
        let kept = Project(name: "kept", slug: "kept", stars: 2, weight: 1)
        try store.insert(kept)
        let id = RecordID()
        let error = thrownError {
            try store.write { try $0.put(Self.project(["name": .string("no slug"), "weight": .double(1)], id: id)) }
        } as? StoreError
        #expect(error?.code == .invalidValue, "\(String(describing: error))")
        let message = error?.message ?? ""
        for part in [store.path, "Project", id.description, "'slug'", "optional", "default"] {
            #expect(message.contains(part), "\(part) in: \(message)")
        }
        // A null is no value either; nor may a replacement of a stored record leave it out.
        let null = thrownError {
            try store.write { try $0.put(Self.project(["name": .string("x"), "slug": .null, "weight": .double(1)])) }
        } as? StoreError
        #expect(null?.code == .invalidValue && null?.message.contains("'slug'") == true, "\(String(describing: null))")
        let replacing = thrownError {
            try store.write { try $0.put(Self.project(["name": .string("kept"), "weight": .double(1)], id: kept.id)) }
        } as? StoreError
        #expect(replacing?.code == .invalidValue, "\(String(describing: replacing))")
        #expect(try store.fetch(FetchDescriptor<Project>()) == [kept])
        #expect(try store.count(Project.self) == 1)
        #expect(try store.verify().isClean)
        // Optional fields and fields with a default may be left out: the record reads back.
        let lean = RecordID()
        try store.write { try $0.put(Self.project(["name": .string("lean"), "slug": .string("lean"), "weight": .double(0.5)], id: lean)) }
        #expect(try store.get(Project.self, id: lean) == Project(id: lean, name: "lean", slug: "lean", note: nil, stars: 0, weight: 0.5))
        #expect(try store.fetch(FetchDescriptor<Project>()).count == 2)
    }

    /// A field the type's schema lacks (a typo) was added to the stored schema for good.
    @Test func aFieldTheSchemaLacksIsRefused() throws {
        let dir = TemporaryDirectory()
        let before: StoreSchema
        do {
            let store = try Store.open(at: dir.path, types: [Project.self])
            before = store.schema
            let id = RecordID()
            let error = thrownError {
                try store.write {
                    try $0.put(Self.project(["name": .string("n"), "slug": .string("s"), "weight": .double(1), "colour": .string("red")], id: id))
                }
            } as? StoreError
            #expect(error?.code == .unknownField, "\(String(describing: error))")
            let message = error?.message ?? ""
            for part in [store.path, "Project", id.description, "'colour'", "slug"] {
                #expect(message.contains(part), "\(part) in: \(message)")
            }
            #expect(store.schema == before)
            #expect(try store.count(Project.self) == 0)
        }
        // So does a store opened without the app's types (a tool reading the stored schema),
        // and one whose type is declared as data, with its fields.
        let plain = try Store.open(at: dir.path)
        let error = thrownError {
            try plain.write { try $0.put(Self.project(["name": .string("n"), "slug": .string("s"), "weight": .double(1), "colour": .null])) }
        } as? StoreError
        #expect(error?.code == .unknownField, "\(String(describing: error))")
        #expect(plain.schema == before)
        let other = TemporaryDirectory()
        let declared = try Store.open(at: other.path, declaration: SchemaDeclaration(types: [
            TypeDeclaration(name: "Page", fields: [FieldDeclaration(name: "title", kind: .string)])]))
        let page = thrownError {
            try declared.write { try $0.put(GenericRecord(type: "Page", id: RecordID(), fields: ["title": .string("t"), "titel": .string("t")])) }
        } as? StoreError
        #expect(page?.code == .unknownField, "\(String(describing: page))")
        #expect(declared.schema.type(named: "Page")?.field(named: "titel") == nil)
    }

    /// A type whose fields are learned from the values written (one the open cannot probe,
    /// or one declared without fields) takes a field it has not stored yet, as typed writes do.
    @Test func aTypeThatLearnsItsFieldsTakesNewOnes() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Ticket.self, Marker.self])
        try store.insert(Ticket(status: .open, note: nil))
        #expect(store.schema.type(named: "Ticket")?.field(named: "note") == nil)
        let id = RecordID()
        try store.write { try $0.put(GenericRecord(type: "Ticket", id: id, fields: ["status": .string("closed"), "note": .string("done")])) }
        #expect(try store.get(Ticket.self, id: id) == Ticket(id: id, status: .closed, note: "done"))
        // A probed type without fields is not one of them.
        let marker = thrownError { try store.write { try $0.put(GenericRecord(type: "Marker", id: RecordID(), fields: ["x": .int(1)])) } } as? StoreError
        #expect(marker?.code == .unknownField, "\(String(describing: marker))")

        let other = TemporaryDirectory()
        let log = try Store.open(at: other.path, declaration: SchemaDeclaration(types: [TypeDeclaration(name: "Log")]))
        try log.write { try $0.put(GenericRecord(type: "Log", id: RecordID(), fields: ["line": .string("started")])) }
        #expect(log.schema.type(named: "Log")?.field(named: "line")?.kind == .string)
        // Its learned fields hold one kind all the same.
        let wrong = thrownError { try log.write { try $0.put(GenericRecord(type: "Log", id: RecordID(), fields: ["line": .int(1)])) } } as? StoreError
        #expect(wrong?.code == .invalidValue, "\(String(describing: wrong))")
    }

    /// A value of another kind than its field's threw `.incompatibleSchema` with advice to
    /// write a Migration, where the code documented for a wrong kind is `.invalidValue`.
    @Test func aValueOfAnotherKindIsAnInvalidValue() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Project.self])
        let id = RecordID()
        let error = thrownError {
            try store.write { try $0.put(Self.project(["name": .int(5), "slug": .string("s"), "weight": .double(1)], id: id)) }
        } as? StoreError
        #expect(error?.code == .invalidValue, "\(String(describing: error))")
        let message = error?.message ?? ""
        for part in [store.path, "Project.name", id.description, "string", "int"] {
            #expect(message.contains(part), "\(part) in: \(message)")
        }
        #expect(try store.count(Project.self) == 0)
        // An int for a double field is that double, as migrations and declared defaults take
        // it; one no double holds exactly is refused.
        let whole = RecordID()
        try store.write { try $0.put(Self.project(["name": .string("n"), "slug": .string("s"), "weight": .int(3)], id: whole)) }
        #expect(try store.get(Project.self, id: whole)?.weight == 3)
        #expect(try store.read { try $0.get(typeNamed: "Project", id: whole) }?.fields["weight"] == .double(3))
        let inexact = thrownError {
            try store.write { try $0.put(Self.project(["name": .string("n"), "slug": .string("t"), "weight": .int(.max)])) }
        } as? StoreError
        #expect(inexact?.code == .invalidValue, "\(String(describing: inexact))")
        #expect(store.schema.type(named: "Project")?.field(named: "weight")?.kind == .double)
        #expect(try store.verify().isClean)
    }

    /// A field another replica added (a newer app version) comes in by a merge carried beside
    /// the record, never added to the schema (an import changed the schema before: a faulty or
    /// hostile replica could add any field, `id` included). The record's state keeps it with
    /// its version for other replicas, and a typed update here does not lose it; a generic put
    /// of a field the schema lacks is still refused.
    @Test func aFieldAddedByAMergeIsCarriedNotAddedToTheSchema() throws {
        let dir = TemporaryDirectory()
        let newer = try Store.open(at: dir.sub("newer"), types: [GarmentWithColor.self])
        let older = try Store.open(at: dir.sub("older"), types: [GarmentV1.self])
        let garment = GarmentWithColor(name: "coat", size: 3, color: "red")
        try newer.insert(garment)
        let state = try newer.read { try $0.recordState(typeNamed: "Garment", id: garment.id) }
        let schemaBefore = older.schema
        #expect(try older.write { try $0.merge(state, origin: newer.siteID) })
        #expect(older.schema == schemaBefore)
        #expect(older.schema.type(named: "Garment")?.field(named: "color") == nil)
        try older.update(GarmentV1.self, id: garment.id) { $0.size = 4 }
        let carried = try older.read { try $0.recordState(typeNamed: "Garment", id: garment.id) }
        #expect(carried.fields["color"] == state.fields["color"], "carried with its version, through a typed update")
        #expect(carried.fields["size"]?.value == .int(4))
        #expect(try older.verify().isClean)
        for field in ["color", "colour"] {
            let refused = thrownError {
                try older.write { try $0.put(GenericRecord(type: "Garment", id: RecordID(), fields: ["name": .string("cap"), "size": .int(1), field: .string("blue")])) }
            } as? StoreError
            #expect(refused?.code == .unknownField, "\(String(describing: refused))")
        }
        #expect(try older.fetch(FetchDescriptor<GarmentV1>()).count == 1)
        // The newer version reads the value back from the older one's state.
        #expect(try newer.write { try $0.merge(carried, origin: older.siteID) })
        #expect(try newer.get(GarmentWithColor.self, id: garment.id) == GarmentWithColor(id: garment.id, name: "coat", size: 4, color: "red"))
    }
}
