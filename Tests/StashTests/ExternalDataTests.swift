import Foundation
@testable import Stash
import Synchronization
import Testing
import StashTestSupport

/// A garment of the photo app, its image kept outside the record.
struct PhotoGarment: Record, Equatable {
    static var recordType: String { "PhotoGarment" }
    var id = RecordID()
    var name: String
    var wearCount = 0
    var image: ExternalData?
}

/// The same type as the app had it before: the image inline.
struct InlinePhotoGarment: Record, Equatable {
    static var recordType: String { "PhotoGarment" }
    var id = RecordID()
    var name: String
    var wearCount = 0
    var image: Data?
}

/// Bytes that differ per seed (an "image").
func imageBytes(_ count: Int, seed: UInt64) -> Data {
    var generator = SeededGenerator(seed: seed)
    var data = Data(count: count)
    data.withUnsafeMutableBytes { raw in
        for i in stride(from: 0, to: raw.count, by: 8) {
            var word = generator.next()
            withUnsafeBytes(of: &word) { w in
                for j in 0..<min(8, raw.count - i) { raw[i + j] = w[j] }
            }
        }
    }
    return data
}

@Suite struct ExternalDataTests {
    @Test func aDeclaredExternalFieldKeepsItsBytesInABlobAndTheRecordAReference() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [PhotoGarment.self])
        let field = try #require(store.schema.type(named: "PhotoGarment")?.field(named: "image"))
        #expect(field.external == true)
        #expect(field.kind == .map)

        let image = imageBytes(300_000, seed: 1)
        let coat = PhotoGarment(name: "Coat", image: ExternalData(image))
        try store.insert(coat)

        // The blob is a file named by its SHA-256, holding the bytes.
        let hash = ExternalData.hash(of: image)
        let file = store.blobDirectory.appendingPathComponent(hash)
        #expect(try Data(contentsOf: file) == image)

        // The record holds the reference only: small, and no image bytes.
        let stored = try #require(store.read { try $0.get(typeNamed: "PhotoGarment", id: coat.id) })
        #expect(stored.fields["image"] == .map(["$blob": .string(hash), "size": .int(300_000)]))
        let tag = try #require(store.schema.type(named: "PhotoGarment")?.tag)
        let recordBytes = try #require(try store.read { try $0.txn.get(store.dbs.records, key: StoreKeys.record(tag, coat.id)) })
        #expect(recordBytes.count < 200)

        // Read back: a reference without bytes, equal to what was written; the bytes on request.
        let read = try #require(try store.get(PhotoGarment.self, id: coat.id))
        #expect(read == coat)
        #expect(read.image?.bytes == nil)
        #expect(read.image?.sha256 == hash)
        #expect(try store.blob(read.image!) == image)
        #expect(store.blobURL(read.image!) == file)
        #expect(!store.isBlobPending(read.image!))
        #expect(try store.pendingBlobs().isEmpty)

        // An edit of another field writes no blob and keeps the reference.
        try store.update(PhotoGarment.self, id: coat.id) { $0.wearCount += 1 }
        #expect(try store.get(PhotoGarment.self, id: coat.id)?.image?.sha256 == hash)
        #expect(try store.verify().isClean)
        #expect(try store.verifyBlobs().problems.isEmpty)
    }

    @Test func oneBlobServesEveryRecordWithTheSameBytes() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [PhotoGarment.self])
        let image = imageBytes(10_000, seed: 2)
        try store.write { tx in
            try tx.insert(PhotoGarment(name: "a", image: ExternalData(image)))
            try tx.insert(PhotoGarment(name: "b", image: ExternalData(image)))
        }
        let stats = try store.blobStatistics()
        #expect(stats.files == 1 && stats.bytes == 10_000 && stats.referenced == 1 && stats.pending == 0)
    }

    @Test func aReferenceWhoseBlobIsMissingReadsAsPending() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [PhotoGarment.self])
        let image = imageBytes(5_000, seed: 3)
        let coat = PhotoGarment(name: "Coat", image: ExternalData(image))
        try store.insert(coat)
        try FileManager.default.removeItem(at: store.blobDirectory.appendingPathComponent(ExternalData.hash(of: image)))
        let read = try #require(try store.get(PhotoGarment.self, id: coat.id))
        #expect(store.isBlobPending(read.image!))
        #expect(try store.blob(read.image!) == nil)
        #expect(store.blobURL(read.image!) == nil)
        #expect(try store.pendingBlobs() == [read.image!])
        let verified = try store.verifyBlobs()
        #expect(verified.problems.isEmpty && verified.pending == [read.image!])
        // It arrives (as sync brings it): checked against its hash first.
        #expect(throws: StoreError.self) { try store.importBlob(imageBytes(5_000, seed: 4), for: read.image!) }
        #expect(store.isBlobPending(read.image!))
        try store.importBlob(image, for: read.image!)
        #expect(try store.blob(read.image!) == image)
    }

    @Test func verifyFindsADamagedBlob() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [PhotoGarment.self])
        let image = imageBytes(5_000, seed: 5)
        try store.insert(PhotoGarment(name: "Coat", image: ExternalData(image)))
        var damaged = image
        damaged[100] ^= 0xFF
        try damaged.write(to: store.blobDirectory.appendingPathComponent(ExternalData.hash(of: image)))
        let verified = try store.verifyBlobs()
        #expect(verified.problems.count == 1)
        #expect(verified.problems[0].contains(ExternalData.hash(of: image)))
    }

    @Test func garbageCollectionRemovesOnlyUnreferencedBlobsPastTheGracePeriod() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [PhotoGarment.self])
        let kept = imageBytes(4_000, seed: 6), replaced = imageBytes(4_000, seed: 7), rolledBack = imageBytes(4_000, seed: 8)
        let coat = PhotoGarment(name: "Coat", image: ExternalData(replaced))
        try store.insert(coat)
        try store.update(PhotoGarment.self, id: coat.id) { $0.image = ExternalData(kept) }
        // A transaction that aborts after writing its blob leaves it behind.
        _ = thrownError {
            _ = try store.write { tx in
                try tx.insert(PhotoGarment(name: "Hat", image: ExternalData(rolledBack)))
                throw Rollback()
            }
        }
        #expect(try store.blobStatistics().files == 3)
        // Young blobs stay (a transaction in flight may be about to reference them).
        var collected = try store.collectGarbageBlobs(olderThan: 3600)
        #expect(collected.removed == 0 && collected.keptYoung == 2)
        collected = try store.collectGarbageBlobs(olderThan: 0)
        #expect(collected.removed == 2 && collected.removedBytes == 8_000)
        #expect(try store.blob(ExternalData(kept)) == kept)
        #expect(try store.blobStatistics() == BlobStatistics(files: 1, bytes: 4_000, referenced: 1, referencedBytes: 4_000))
    }

    @Test func writingABlobThatIsPresentMakesItYoungAgain() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [PhotoGarment.self])
        let image = imageBytes(1_000, seed: 9)
        let coat = PhotoGarment(name: "Coat", image: ExternalData(image))
        try store.insert(coat)
        _ = try store.write { try $0.delete(PhotoGarment.self, id: coat.id) }
        let file = store.blobDirectory.appendingPathComponent(ExternalData.hash(of: image))
        let old = Date(timeIntervalSinceNow: -7200)
        try FileManager.default.setAttributes([.modificationDate: old], ofItemAtPath: file.path)
        // Referenced again before a collection: the write touched it, so it survives a
        // collection whose references were read before this commit.
        try store.insert(PhotoGarment(name: "Coat again", image: ExternalData(image)))
        let modified = try #require(try FileManager.default.attributesOfItem(atPath: file.path)[.modificationDate] as? Date)
        #expect(modified > Date(timeIntervalSinceNow: -60))
    }

    @Test func anInlineDataFieldDeclaredExternalMovesItsValuesOutAtOpen() throws {
        let dir = TemporaryDirectory()
        let images = (0..<5).map { imageBytes(20_000 + $0, seed: 100 + UInt64($0)) }
        var ids: [RecordID] = []
        do {
            let store = try Store.open(at: dir.path, types: [InlinePhotoGarment.self])
            for (n, image) in images.enumerated() {
                let garment = InlinePhotoGarment(name: "g\(n)", image: image)
                ids.append(garment.id)
                try store.insert(garment)
            }
            try store.insert(InlinePhotoGarment(name: "no image"))
        }
        let phases = Mutex<[StoreProgress]>([])
        var options = StoreOptions()
        options.progress = { progress in phases.withLock { $0.append(progress) } }
        do {
        let store = try Store.open(at: dir.path, types: [PhotoGarment.self], options: options)
        let field = try #require(store.schema.type(named: "PhotoGarment")?.field(named: "image"))
        #expect(field.external == true && field.kind == .map)
        for (id, image) in zip(ids, images) {
            let garment = try #require(try store.get(PhotoGarment.self, id: id))
            #expect(try store.blob(try #require(garment.image)) == image)
        }
        #expect(try store.verify().isClean)
        #expect(try store.blobStatistics().files == 5)
        let moved = phases.withLock { $0.filter { $0.phase.hasPrefix("moving PhotoGarment.image to blobs") } }
        #expect(moved.last?.done == 6 && moved.last?.total == 6)
        }
        // Declared inline again, the references would be taken for plain maps: refused.
        #expect(throws: StoreError.self) { _ = try Store.open(at: dir.path, types: [InlinePhotoGarment.self]) }
    }

    @Test func aSchemaFileDeclaresAnExternalFieldAndAGenericPutKeepsBase64BytesAsABlob() throws {
        let json = #"{"types": [{"name": "PhotoGarment", "fields": [{"name": "name", "kind": "string"}, {"name": "image", "kind": "bytes", "external": true, "optional": true}]}]}"#
        let declaration = try JSONDecoder().decode(SchemaDeclaration.self, from: Data(json.utf8))
        #expect(declaration.types[0].fields[1].external)
        // Written back as a schema file spells it.
        let written = String(decoding: try JSONEncoder().encode(declaration.types[0].fields[1]), as: UTF8.self)
        #expect(written.contains(#""external":true"#) && written.contains(#""kind":"bytes""#))
        let wrong = #"{"types": [{"name": "T", "fields": [{"name": "x", "kind": "string", "external": true}]}]}"#
        #expect(throws: DecodingError.self) { _ = try JSONDecoder().decode(SchemaDeclaration.self, from: Data(wrong.utf8)) }

        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, declaration: declaration)
        let image = imageBytes(2_000, seed: 11)
        let id = RecordID()
        try store.write { tx in try tx.put(GenericRecord(type: "PhotoGarment", id: id, fields: ["name": .string("Coat"), "image": .bytes(image)])) }
        let reference = ExternalData(image)
        #expect(try store.read { try $0.get(typeNamed: "PhotoGarment", id: id) }?.fields["image"] == reference.fieldValue)
        #expect(try store.blob(reference) == image)
        // The reference as `stash get` prints it goes back in; one to a blob not here does not.
        try store.write { tx in try tx.put(GenericRecord(type: "PhotoGarment", id: RecordID(), fields: ["name": .string("Copy"), "image": reference.fieldValue])) }
        let unknown = try ExternalData(sha256: String(repeating: "a", count: 64), size: 3)
        #expect(throws: StoreError.self) {
            try store.write { tx in try tx.put(GenericRecord(type: "PhotoGarment", id: RecordID(), fields: ["name": .string("x"), "image": unknown.fieldValue])) }
        }
        #expect(throws: StoreError.self) {
            try store.write { tx in try tx.put(GenericRecord(type: "PhotoGarment", id: RecordID(), fields: ["name": .string("x"), "image": .map(["a": .int(1)])])) }
        }
    }

    @Test func aValueMadeFromBytesCannotBeStoredInsideANestedValue() throws {
        struct Album: Record {
            var id = RecordID()
            var photos: [ExternalData]
        }
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Album.self])
        let error = thrownError { try store.insert(Album(photos: [ExternalData(Data([1, 2, 3]))])) }
        #expect((error as? StoreError)?.message.contains("only be a record's own property") == true)
    }
}
