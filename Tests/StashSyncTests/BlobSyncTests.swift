import Crypto
import Foundation
@testable import Stash
@testable import StashSync
import Synchronization
import Testing
import StashTestSupport

/// The photo app's garment: the image outside the record.
struct Garment: Record, Equatable {
    var id = RecordID()
    var name: String
    var wearCount = 0
    var image: ExternalData?
}

/// Distinct bytes per seed.
func blobBytes(_ count: Int, seed: UInt64) -> Data {
    var generator = SeededGenerator(seed: seed)
    return Data((0..<count).map { _ in UInt8(truncatingIfNeeded: generator.next()) })
}

/// A transport that counts the blobs it carries, around another one.
final class BlobCountingTransport<Inner: SyncTransport>: SyncTransport, @unchecked Sendable {
    let inner: Inner
    private let counts = Mutex<(put: Int, fetched: Int, bytes: Int)>((0, 0, 0))
    init(_ inner: Inner) { self.inner = inner }
    var put: Int { counts.withLock { $0.put } }
    var fetched: Int { counts.withLock { $0.fetched } }
    var peer: RecordID? { inner.peer }
    func deliver(_ data: Data, delta: Delta, from engine: SyncEngine) async throws { try await inner.deliver(data, delta: delta, from: engine) }
    func deliverReportingClashes(_ data: Data, delta: Delta, from engine: SyncEngine) async throws -> [UniqueClash] {
        try await inner.deliverReportingClashes(data, delta: delta, from: engine)
    }
    func incoming(for engine: SyncEngine) async throws -> [IncomingDelta] { try await inner.incoming(for: engine) }
    func fullSnapshotRequested(by engine: SyncEngine) async throws -> Bool { try await inner.fullSnapshotRequested(by: engine) }
    func requestFullSnapshot(from source: RecordID, for engine: SyncEngine) async throws { try await inner.requestFullSnapshot(from: source, for: engine) }
    func watermarkSite(for engine: SyncEngine) async throws -> String { try await inner.watermarkSite(for: engine) }
    func parkedAtPeer(for engine: SyncEngine) async throws -> [String]? { try await inner.parkedAtPeer(for: engine) }
    func checkpointDue(for engine: SyncEngine) async throws -> Bool { try await inner.checkpointDue(for: engine) }
    func publishCheckpoint(_ data: Data, coverage: [RecordID: UInt64], from engine: SyncEngine) async throws {
        try await inner.publishCheckpoint(data, coverage: coverage, from: engine)
    }
    func hasBlob(_ reference: ExternalData, from engine: SyncEngine) async throws -> Bool { try await inner.hasBlob(reference, from: engine) }
    func putBlob(_ data: Data, for reference: ExternalData, from engine: SyncEngine) async throws {
        counts.withLock { $0.put += 1; $0.bytes += data.count }
        try await inner.putBlob(data, for: reference, from: engine)
    }
    func fetchBlob(_ reference: ExternalData, for engine: SyncEngine) async throws -> Data? {
        let data = try await inner.fetchBlob(reference, for: engine)
        if data != nil { counts.withLock { $0.fetched += 1 } }
        return data
    }
}

@Suite struct BlobSyncTests {
    static let key = try! SyncKey(Array("blob-sync-test-key-0123456789".utf8))

    func device(_ dir: TemporaryDirectory, _ name: String, family: RecordID, key: SyncKey? = BlobSyncTests.key) throws -> Device {
        try Device.open(dir.sub(name), family: family, key: key, types: [Garment.self])
    }

    /// Two devices of one family and a relay directory, A holding a coat with an image of
    /// `size` bytes, sent to the relay.
    func relayWithACoat(_ dir: TemporaryDirectory, size: Int, seed: UInt64) async throws
        -> (relay: RelayTransport, relayURL: URL, a: Device, b: Device, coat: Garment, image: Data) {
        let relayURL = dir.url.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: relayURL, withIntermediateDirectories: true)
        let relay = RelayTransport(directory: relayURL)
        let family = RecordID()
        let a = try device(dir, "a", family: family), b = try device(dir, "b", family: family)
        let image = blobBytes(size, seed: seed)
        let coat = Garment(name: "Coat", image: ExternalData(image))
        try a.store.insert(coat)
        try await a.engine.sync(via: relay)
        return (relay, relayURL, a, b, coat, image)
    }

    @Test func directSyncShipsEachBlobOnceAndAnEditToAnotherFieldShipsNone() async throws {
        let dir = TemporaryDirectory()
        let family = RecordID()
        let a = try device(dir, "a", family: family), b = try device(dir, "b", family: family)
        let image = blobBytes(200_000, seed: 1)
        let coat = Garment(name: "Coat", image: ExternalData(image))
        try a.store.insert(coat)

        let toB = BlobCountingTransport(DirectTransport(to: b.engine))
        try await a.engine.sync(via: toB)
        #expect(toB.put == 1)
        let atB = try #require(try b.store.get(Garment.self, id: coat.id))
        #expect(atB == coat)
        #expect(try b.store.blob(atB.image!) == image)

        // `wearCount += 1`: a delta of references only, and no blob goes again.
        try a.store.update(Garment.self, id: coat.id) { $0.wearCount += 1 }
        let delta = try a.engine.makeDelta(for: b.engine.site)
        #expect(delta.encoded(key: Self.key).count <= 1024)
        try await a.engine.sync(via: toB)
        #expect(toB.put == 1)
        #expect(try b.store.get(Garment.self, id: coat.id)?.wearCount == 1)

        // The other way: B fetches what A holds (a new image A wrote), from A's blobs.
        let second = blobBytes(50_000, seed: 2)
        try a.store.update(Garment.self, id: coat.id) { $0.image = ExternalData(second) }
        let fromA = BlobCountingTransport(DirectTransport(to: a.engine))
        // Not sent yet: B's fetch brings the record and then the blob.
        let report = try await b.engine.sync(via: fromA)
        #expect(report.blobsReceived == 1 && report.blobsPending == 0)
        #expect(fromA.fetched == 1)
        #expect(try b.store.blob(try #require(try b.store.get(Garment.self, id: coat.id)?.image)) == second)
        #expect(try b.store.verify().isClean && b.store.verifyBlobs().problems.isEmpty)
    }

    @Test func aRelayHoldsEachBlobOnceSealedAndUnderANameThatHidesItsHash() async throws {
        let dir = TemporaryDirectory()
        let (relay, relayURL, a, b, coat, image) = try await relayWithACoat(dir, size: 100_000, seed: 3)

        let blobs = relayURL.appendingPathComponent("blobs")
        let names = try FileManager.default.contentsOfDirectory(atPath: blobs.path).filter { !$0.hasPrefix(".") }
        #expect(names.count == 1)
        #expect(names[0] != ExternalData.hash(of: image))
        let file = try Data(contentsOf: blobs.appendingPathComponent(names[0]))
        #expect(file.prefix(4) == Data("STSR".utf8))
        #expect(file.range(of: image.prefix(64)) == nil)   // sealed: the bytes are not there

        let report = try await b.engine.sync(via: relay)
        #expect(report.blobsReceived == 1 && report.blobsPending == 0)
        let atB = try #require(try b.store.get(Garment.self, id: coat.id))
        #expect(try b.store.blob(atB.image!) == image)

        // Edits of other fields, on both sides: no new blob file, nothing sent again.
        let counting = BlobCountingTransport(relay)
        try a.store.update(Garment.self, id: coat.id) { $0.wearCount += 1 }
        try b.store.update(Garment.self, id: coat.id) { $0.name = "Winter coat" }
        try await a.engine.sync(via: counting)
        try await b.engine.sync(via: counting)
        try await a.engine.sync(via: counting)
        #expect(counting.put == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: blobs.path).filter { !$0.hasPrefix(".") }.count == 1)
        #expect(try a.store.get(Garment.self, id: coat.id) == b.store.get(Garment.self, id: coat.id))

        // A family without a key: the blob's name is its hash, the file its bytes.
        let plainRelay = dir.url.appendingPathComponent("plain")
        try FileManager.default.createDirectory(at: plainRelay, withIntermediateDirectories: true)
        let c = try device(dir, "c", family: RecordID(), key: nil)
        try c.store.insert(Garment(name: "Hat", image: ExternalData(image)))
        try await c.engine.sync(via: RelayTransport(directory: plainRelay))
        #expect(try Data(contentsOf: plainRelay.appendingPathComponent("blobs").appendingPathComponent(ExternalData.hash(of: image))) == image)
    }

    /// docs/relay-format.md, Blobs, followed with nothing but the page and swift-crypto: the
    /// name, the envelope, the keys; and a blob written that way is taken by a reader.
    @Test func relayBlobFilesFollowTheDocumentedFormat() async throws {
        let dir = TemporaryDirectory()
        let (relay, relayURL, a, b, _, image) = try await relayWithACoat(dir, size: 5_000, seed: 50)
        let keyBytes = SymmetricKey(data: Array("blob-sync-test-key-0123456789".utf8))
        func derive(_ info: String) -> SymmetricKey {
            HKDF<SHA256>.deriveKey(inputKeyMaterial: keyBytes, salt: a.engine.family.bytes, info: Data(info.utf8), outputByteCount: 32)
        }
        func name(of data: Data) -> String {
            HMAC<SHA256>.authenticationCode(for: Data(SHA256.hash(data: data)), using: derive("stash relay blob names v1"))
                .map { String(format: "%02x", $0) }.joined()
        }
        func header(size: Int) -> [UInt8] {
            var header: [UInt8] = Array("STSR".utf8) + [1, 4, 1] + a.engine.family.bytes + a.store.siteID.bytes
            for value in [UInt64(0), 0, UInt64(size)] { header += (0..<8).map { UInt8(truncatingIfNeeded: value >> (8 * $0)) } }
            return header + [0]   // no coverage
        }
        let file = [UInt8](try Data(contentsOf: relayURL.appendingPathComponent("blobs").appendingPathComponent(name(of: image))))
        #expect(Array(file.prefix(header(size: image.count).count)) == header(size: image.count))
        let box = try ChaChaPoly.SealedBox(combined: file[header(size: image.count).count...])
        #expect(try ChaChaPoly.open(box, using: derive("stash relay encryption v1"), authenticating: header(size: image.count)) == image)

        // Written by hand the same way, a blob is taken by a reader whose record references it.
        let second = blobBytes(6_000, seed: 51)
        let sealed = try ChaChaPoly.seal(second, using: derive("stash relay encryption v1"), authenticating: header(size: second.count))
        try (Data(header(size: second.count)) + sealed.combined).write(to: relayURL.appendingPathComponent("blobs").appendingPathComponent(name(of: second)))
        let hat = Garment(name: "Hat", image: ExternalData(second))
        try await a.store.write { tx in try tx.insert(hat) }
        let aside = a.store.blobDirectory.appendingPathComponent(ExternalData.hash(of: second))
        try FileManager.default.removeItem(at: aside)   // A cannot send it: the relay's is the one read
        try await a.engine.sync(via: relay)
        let report = try await b.engine.sync(via: relay)
        #expect(report.blobsReceived == 2 && report.blobsPending == 0, "\(report)")
        #expect(try b.store.blob(hat.image!) == second)
    }

    @Test func aBlobNotOnTheRelayYetIsPendingThenArrives() async throws {
        let dir = TemporaryDirectory()
        let (relay, relayURL, a, b, coat, image) = try await relayWithACoat(dir, size: 30_000, seed: 4)
        let blobs = relayURL.appendingPathComponent("blobs")
        let name = try #require(try FileManager.default.contentsOfDirectory(atPath: blobs.path).first { !$0.hasPrefix(".") })
        let aside = dir.url.appendingPathComponent("aside")
        try FileManager.default.moveItem(at: blobs.appendingPathComponent(name), to: aside)

        var report = try await b.engine.sync(via: relay)
        #expect(report.blobsReceived == 0 && report.blobsPending == 1)
        let atB = try #require(try b.store.get(Garment.self, id: coat.id))   // readable, its blob pending
        #expect(atB.name == "Coat" && b.store.isBlobPending(atB.image!))
        #expect(try b.store.blob(atB.image!) == nil)
        #expect(try b.store.verifyBlobs().problems.isEmpty)

        // A relay that offers another blob under the name: refused, nothing becomes visible.
        let other = blobBytes(30_000, seed: 5)
        try await relay.putBlob(other, for: ExternalData(other), from: a.engine)
        let otherName = try #require(try FileManager.default.contentsOfDirectory(atPath: blobs.path).first { !$0.hasPrefix(".") && $0 != name })
        try FileManager.default.copyItem(at: blobs.appendingPathComponent(otherName), to: blobs.appendingPathComponent(name))
        report = try await b.engine.sync(via: relay)
        #expect(report.blobsPending == 1 && report.blobProblems.count == 1)
        #expect(b.store.isBlobPending(atB.image!))
        #expect(!FileManager.default.fileExists(atPath: b.store.blobDirectory.appendingPathComponent(ExternalData.hash(of: other)).path))

        // The real one arrives: the next sync takes it.
        try FileManager.default.removeItem(at: blobs.appendingPathComponent(name))
        try FileManager.default.moveItem(at: aside, to: blobs.appendingPathComponent(name))
        report = try await b.engine.sync(via: relay)
        #expect(report.blobsReceived == 1 && report.blobsPending == 0)
        #expect(try b.store.blob(atB.image!) == image)
    }

    /// B got a record from A before its blob, and sent the record on to the relay: the blob is
    /// owed to the relay, and goes there once B has it, so that C does not wait for good.
    @Test func aBlobAStoreLackedWhenItSentTheRecordOnGoesLater() async throws {
        let dir = TemporaryDirectory()
        let relayURL = dir.url.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: relayURL, withIntermediateDirectories: true)
        let relay = RelayTransport(directory: relayURL)
        let family = RecordID()
        let a = try device(dir, "a", family: family), b = try device(dir, "b", family: family), c = try device(dir, "c", family: family)
        let image = blobBytes(20_000, seed: 30)
        let coat = Garment(name: "Coat", image: ExternalData(image))
        try a.store.insert(coat)
        let file = a.store.blobDirectory.appendingPathComponent(ExternalData.hash(of: image))
        let aside = dir.url.appendingPathComponent("aside")
        try FileManager.default.moveItem(at: file, to: aside)   // A cannot give it yet
        try await b.engine.fetchChanges(via: DirectTransport(to: a.engine))
        #expect(b.store.isBlobPending(coat.image!))
        try await b.engine.sync(via: relay)
        #expect(try await c.engine.sync(via: relay).blobsPending == 1)

        try FileManager.default.moveItem(at: aside, to: file)
        #expect(try await b.engine.fetchChanges(via: DirectTransport(to: a.engine)).blobsReceived == 1)
        try await b.engine.sync(via: relay)   // nothing new to send: the owed blob goes all the same
        let report = try await c.engine.sync(via: relay)
        #expect(report.blobsReceived == 1 && report.blobsPending == 0)
        #expect(try c.store.blob(coat.image!) == image)
    }

    /// A relay keeps a blob while a kept checkpoint or a delta on it references it; a replaced
    /// image's blob goes once neither does and it is older than the grace period.
    @Test func aRelayDropsBlobsNothingOnItReferences() async throws {
        let dir = TemporaryDirectory()
        let (relay, relayURL, a, b, coat, _) = try await relayWithACoat(dir, size: 10_000, seed: 40)
        let second = blobBytes(10_000, seed: 41)
        try a.store.update(Garment.self, id: coat.id) { $0.image = ExternalData(second) }
        try await a.engine.sync(via: relay)
        try await b.engine.sync(via: relay)
        let blobs = relayURL.appendingPathComponent("blobs")
        func count() throws -> Int { try FileManager.default.contentsOfDirectory(atPath: blobs.path).filter { !$0.hasPrefix(".") }.count }
        // Both are referenced (the deltas are still there): nothing goes, whatever the age.
        #expect(try await relay.collectBlobs(for: a.engine, olderThan: 0) == 0)
        try await a.engine.publishCheckpoint(via: relay)
        try await a.engine.sync(via: relay)    // the files the checkpoint holds and B read go
        try await b.engine.sync(via: relay)
        try await a.engine.sync(via: relay)
        #expect(try count() == 2)   // younger than a day: kept by the publisher's collection
        #expect(try await relay.collectBlobs(for: a.engine, olderThan: 0) == 1)
        #expect(try count() == 1)
        // A new device restores everything it needs.
        let c = try device(dir, "c", family: a.engine.family)
        let report = try await c.engine.sync(via: relay)
        #expect(report.blobsReceived == 1 && report.blobsPending == 0)
        #expect(try c.store.blob(try #require(try c.store.get(Garment.self, id: coat.id)?.image)) == second)
    }

    @Test func aNewDeviceRestoresRecordsAndBlobsFromACheckpoint() async throws {
        let dir = TemporaryDirectory()
        let relayURL = dir.url.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: relayURL, withIntermediateDirectories: true)
        let relay = RelayTransport(directory: relayURL)
        let family = RecordID()
        let a = try device(dir, "a", family: family)
        var images: [RecordID: Data] = [:]
        for n in 0..<5 {
            let image = blobBytes(10_000 + n, seed: 10 + UInt64(n))
            let garment = Garment(name: "g\(n)", image: ExternalData(image))
            images[garment.id] = image
            try a.store.insert(garment)
        }
        try await a.engine.publishCheckpoint(via: relay)
        let c = try device(dir, "c", family: family)
        let report = try await c.engine.sync(via: relay)
        #expect(report.blobsReceived == 5 && report.blobsPending == 0)
        for (id, image) in images {
            let garment = try #require(try c.store.get(Garment.self, id: id))
            #expect(try c.store.blob(garment.image!) == image)
        }
    }

    /// The goal: `wearCount += 1` on a garment with a 5 MB image is a delta of at most
    /// 1 KiB (inline, the image travels with every edit).
    @Test func theDeltaOfAnEditBesideA5MBImageIsUnder1KiB() throws {
        struct InlineGarment: Record { static var recordType: String { "Garment" }; var id = RecordID(); var name: String; var wearCount = 0; var image: Data? }
        let dir = TemporaryDirectory()
        let image = blobBytes(5_000_000, seed: 38)
        var sizes: [Int] = []
        for external in [true, false] {
            let family = RecordID()
            let d = try Device.open(dir.sub(external ? "external" : "inline"), family: family, key: Self.key,
                                    types: [external ? Garment.self : InlineGarment.self])
            let id = RecordID()
            if external { try d.store.insert(Garment(id: id, name: "Coat", image: ExternalData(image))) }
            else { try d.store.insert(InlineGarment(id: id, name: "Coat", image: image)) }
            try d.engine.acknowledge(peer: nil, through: try d.engine.makeDelta(for: nil).to)
            if external { _ = try d.store.update(Garment.self, id: id) { $0.wearCount += 1 } }
            else { _ = try d.store.update(InlineGarment.self, id: id) { $0.wearCount += 1 } }
            sizes.append(try d.engine.makeDelta(for: nil).encoded(key: Self.key).count)
        }
        print("delta of wearCount += 1 beside a 5 MB image: external \(sizes[0]) B, inline \(sizes[1]) B")
        #expect(sizes[0] <= 1024)
        #expect(sizes[1] > 5_000_000)
    }

    @Test func aBlobCarriedForAnotherAppVersionIsKeptAndPassedOn() async throws {
        // B's app does not declare Garment: it carries the records, and their blobs, for C.
        struct Other: Record { var id = RecordID(); var x = 0 }
        let dir = TemporaryDirectory()
        let family = RecordID()
        let a = try device(dir, "a", family: family)
        let b = try Device.open(dir.sub("b"), family: family, key: Self.key, types: [Other.self])
        let c = try device(dir, "c", family: family)
        let image = blobBytes(8_000, seed: 20)
        let coat = Garment(name: "Coat", image: ExternalData(image))
        try a.store.insert(coat)
        try await a.sync(with: b)
        #expect(try b.store.referencedBlobs() == [ExternalData(image)])
        #expect(try b.store.blob(ExternalData(image)) == image)
        #expect(try b.store.collectGarbageBlobs(olderThan: 0).removed == 0)
        try await b.sync(with: c)
        #expect(try c.store.blob(try #require(try c.store.get(Garment.self, id: coat.id)?.image)) == image)
    }
}
