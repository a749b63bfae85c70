import Foundation
import Stash
import Testing
import StashTestSupport

/// A home of the relationship tests (`Place`, so as not to clash with `Home`).
struct Place: Record, Equatable {
    var id = RecordID()
    var name: String
}

/// Deleted with its place.
struct Thing: Record, Equatable {
    var id = RecordID()
    var placeID: RecordID
    var name: String
    static let indexes: [RecordIndex<Thing>] = [.index(\.placeID, \.name)]
    static let references: [RecordReference<Thing>] = [.reference(\.placeID, to: Place.self, onDelete: .cascade)]
}

/// Deleted with its thing (two levels down from a place).
struct Tag: Record, Equatable {
    var id = RecordID()
    var thingID: RecordID
    var text: String
    static let references: [RecordReference<Tag>] = [.reference(\.thingID, to: Thing.self, onDelete: .cascade)]
}

/// A thing may not be deleted while lent.
struct Loan: Record, Equatable {
    var id = RecordID()
    var thingID: RecordID
    var to: String
    static let references: [RecordReference<Loan>] = [.reference(\.thingID, to: Thing.self, onDelete: .deny)]
}

/// Outlives its place, which it then no longer names.
struct Photo: Record, Equatable {
    var id = RecordID()
    var placeID: RecordID?
    var caption: String
    static let references: [RecordReference<Photo>] = [.reference(\.placeID, to: Place.self, onDelete: .nullify)]
}

/// A tree: deleting a folder deletes its subfolders.
struct Folder: Record, Equatable {
    var id = RecordID()
    var parentID: RecordID?
    var name: String
    static let references: [RecordReference<Folder>] = [.reference(\.parentID, to: Folder.self, onDelete: .cascade)]
}

let relationshipTypes: [any Record.Type] = [Place.self, Thing.self, Tag.self, Loan.self, Photo.self, Folder.self]

@Suite struct RelationshipTests {
    private func open(_ dir: TemporaryDirectory) throws -> Store {
        try Store.open(at: dir.path, types: relationshipTypes)
    }

    @Test func deletingAParentCascadesToItsChildrenAndTheirsInTheSameTransaction() throws {
        let dir = TemporaryDirectory()
        let store = try open(dir)
        let flat = Place(name: "Flat"), barn = Place(name: "Barn")
        let lamp = Thing(placeID: flat.id, name: "Lamp"), desk = Thing(placeID: flat.id, name: "Desk")
        let saw = Thing(placeID: barn.id, name: "Saw")
        let brass = Tag(thingID: lamp.id, text: "brass")
        try store.write { tx in
            for place in [flat, barn] { try tx.insert(place) }
            for thing in [lamp, desk, saw] { try tx.insert(thing) }
            try tx.insert(brass)
            try tx.insert(Tag(thingID: saw.id, text: "sharp"))
        }
        let before = try store.history().count
        #expect(try store.delete(Place.self, id: flat.id))
        #expect(try store.fetch(FetchDescriptor<Thing>()).map(\.name) == ["Saw"])
        #expect(try store.fetch(FetchDescriptor<Tag>()).map(\.text) == ["sharp"])
        let history = try store.history()
        #expect(history.count == before + 1, "the cascade is one transaction")
        #expect(Set(history.last!.changes.map(\.id)) == [flat.id, lamp.id, desk.id, brass.id])
        #expect(try store.verify().isClean)
    }

    @Test func denyRefusesTheDeleteNamingTheChildrenAndChangesNothing() throws {
        let dir = TemporaryDirectory()
        let store = try open(dir)
        let flat = Place(name: "Flat")
        let lamp = Thing(placeID: flat.id, name: "Lamp")
        let loan = Loan(thingID: lamp.id, to: "Ann")
        try store.write { tx in
            try tx.insert(flat)
            try tx.insert(lamp)
            try tx.insert(loan)
        }
        let direct = #expect(throws: StoreError.self) { try store.delete(Thing.self, id: lamp.id) }
        #expect(direct?.code == .deleteDenied)
        #expect(direct?.message.contains("Loan") == true && direct?.message.contains(loan.id.description) == true)
        // Through a cascade: the place's delete reaches the lent thing, and is refused whole.
        let cascaded = #expect(throws: StoreError.self) { try store.delete(Place.self, id: flat.id) }
        #expect(cascaded?.code == .deleteDenied)
        // A caller that catches the refusal inside its transaction commits nothing of it.
        try store.write { tx -> Void in
            #expect(throws: StoreError.self) { try tx.delete(Place.self, id: flat.id) }
        }
        #expect(try store.count(Place.self) == 1 && store.count(Thing.self) == 1 && store.count(Loan.self) == 1)
        // Once the loan is gone, the delete goes through.
        try store.delete(Loan.self, id: loan.id)
        #expect(try store.delete(Place.self, id: flat.id))
        #expect(try store.count(Thing.self) == 0)
        #expect(try store.verify().isClean)
    }

    @Test func nullifyClearsTheReferenceAndKeepsTheChild() throws {
        let dir = TemporaryDirectory()
        let store = try open(dir)
        let flat = Place(name: "Flat")
        let photo = Photo(placeID: flat.id, caption: "view")
        try store.write { tx in
            try tx.insert(flat)
            try tx.insert(photo)
        }
        try store.delete(Place.self, id: flat.id)
        #expect(try store.get(Photo.self, id: photo.id) == Photo(id: photo.id, placeID: nil, caption: "view"))
        #expect(try store.verify().isClean)
    }

    @Test func aSelfReferencingTreeIsDeletedWhole() throws {
        let dir = TemporaryDirectory()
        let store = try open(dir)
        let root = Folder(name: "root"), a = Folder(name: "a"), other = Folder(name: "other")
        try store.write { tx in
            try tx.insert(root)
            try tx.insert(Folder(id: a.id, parentID: root.id, name: "a"))
            try tx.insert(Folder(parentID: a.id, name: "a/1"))
            try tx.insert(Folder(parentID: a.id, name: "a/2"))
            try tx.insert(other)
        }
        try store.delete(Folder.self, id: root.id)
        #expect(try store.fetch(FetchDescriptor<Folder>()).map(\.name) == ["other"])
    }

    @Test func aRecordMayNotReferToAParentThatDoesNotExist() throws {
        let dir = TemporaryDirectory()
        let store = try open(dir)
        let flat = Place(name: "Flat")
        let missing = RecordID()
        let error = #expect(throws: StoreError.self) { try store.insert(Thing(placeID: missing, name: "Lamp")) }
        #expect(error?.code == .parentNotFound)
        #expect(error?.message.contains(missing.description) == true && error?.message.contains("placeID") == true)
        // The child first and the parent later in one transaction: judged at the end.
        let lamp = Thing(placeID: flat.id, name: "Lamp")
        try store.write { tx in
            try tx.insert(lamp)
            try tx.insert(flat)
        }
        // Moving a child to a missing parent is refused; a nil optional reference refers to nothing.
        #expect(throws: StoreError.self) { try store.update(Thing.self, id: lamp.id) { $0.placeID = missing } }
        try store.insert(Photo(placeID: nil, caption: "loose"))
        // A deleted parent is no parent either.
        try store.delete(Place.self, id: flat.id)
        let late = #expect(throws: StoreError.self) { try store.insert(Thing(placeID: flat.id, name: "Late")) }
        #expect(late?.message.contains("deleted") == true)
        #expect(try store.count(Thing.self) == 0 && store.count(Photo.self) == 1)
    }

    /// The references are kept in the stored schema: a store opened without the app's types
    /// (the command line) applies them, through generic writes too.
    @Test func theStoredSchemaKeepsTheReferencesForGenericWriters() throws {
        let dir = TemporaryDirectory()
        let flat = Place(name: "Flat")
        do {
            let store = try open(dir)
            try store.write { tx in
                try tx.insert(flat)
                try tx.insert(Thing(placeID: flat.id, name: "Lamp"))
            }
            let thing = try #require(store.schema.type(named: "Thing"))
            #expect(thing.references == [ReferenceDeclaration(field: "placeID", to: "Place", onDelete: .cascade)])
        }
        let generic = try Store.open(at: dir.path)
        let error = #expect(throws: StoreError.self) {
            try generic.write { tx in
                try tx.put(GenericRecord(type: "Thing", id: RecordID(), fields: ["placeID": .uuid(RecordID().uuid), "name": .string("x")]))
            }
        }
        #expect(error?.code == .parentNotFound)
        try generic.write { tx in _ = try tx.delete(typeNamed: "Place", id: flat.id) }
        #expect(try generic.read { try $0.count(typeNamed: "Thing") } == 0)
    }

    /// A reference field without a declared index gets one (children are found through it);
    /// one with an index starting with it (Thing's placeID+name) uses that one.
    @Test func referenceFieldsAreIndexed() throws {
        let dir = TemporaryDirectory()
        let store = try open(dir)
        #expect(store.schema.type(named: "Tag")?.indexes.map(\.fields) == [["thingID"]])
        #expect(store.schema.type(named: "Thing")?.indexes.map(\.fields) == [["placeID", "name"]])
    }

    @Test func malformedReferencesAreRefusedAtOpen() throws {
        struct RequiredNullify: Record {
            var id = RecordID()
            var placeID: RecordID
            static let references: [RecordReference<RequiredNullify>] = [.reference(\.placeID, to: Place.self, onDelete: .nullify)]
        }
        struct Orphanage: Record {
            var id = RecordID()
            var placeID: RecordID
            static let references: [RecordReference<Orphanage>] = [.reference(\.placeID, to: Place.self, onDelete: .cascade)]
        }
        let nullify = #expect(throws: StoreError.self) { try Store.open(at: TemporaryDirectory().path, types: [Place.self, RequiredNullify.self]) }
        #expect(nullify?.code == .incompatibleSchema && nullify?.message.contains("optional") == true)
        let noParent = #expect(throws: StoreError.self) { try Store.open(at: TemporaryDirectory().path, types: [Orphanage.self]) }
        #expect(noParent?.code == .incompatibleSchema && noParent?.message.contains("Place") == true)
        // A schema file declares them with "references"; a misspelt rule is refused.
        let file = #"{"types": [{"name": "Place", "fields": [{"name": "name", "kind": "string"}]}, {"name": "Thing", "fields": [{"name": "placeID", "kind": "uuid"}], "references": [{"field": "placeID", "to": "Place", "onDelete": "cascade"}]}]}"#
        let declaration = try JSONDecoder().decode(SchemaDeclaration.self, from: Data(file.utf8))
        let store = try Store.open(at: TemporaryDirectory().path, declaration: declaration)
        #expect(store.schema.type(named: "Thing")?.references?.first?.onDelete == .cascade)
        let bad = file.replacingOccurrences(of: "\"cascade\"", with: "\"cascadee\"")
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(SchemaDeclaration.self, from: Data(bad.utf8)) }
    }
}
