import Foundation
import Stash
import StashSync
import Testing

extension RelayServiceTests {
    @Suite struct Blobs {
        /// A record's blob (`ExternalData`) goes to the server once, sealed under a name the
        /// server cannot link to its content, and a reader gets it with the record; a second
        /// record referencing the same bytes sends nothing more. A blob still referenced by a
        /// file is kept by the collection; once no checkpoint or file references it, it goes.
        @Test func blobsTravelOnceAndGoWhenNothingReferencesThem() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let server = try RelayServerProcess(postgres: cluster.url(database))
            let family = Family()
            let scratch = Scratch()
            let relay = transport(server)
            let a = try Device(scratch.sub("a"), family: family.id, key: family.key)
            let b = try Device(scratch.sub("b"), family: family.id, key: family.key)
            try await b.engine.sync(via: relay)
            let bytes = Data((0..<50_000).map { UInt8(truncatingIfNeeded: $0 &* 7919 &+ $0 >> 8) })
            let coat = Garment(name: "Coat", image: ExternalData(bytes))
            try a.store.insert(coat)
            try await a.engine.sync(via: relay)
            let blobs = "SELECT count(*) FROM stash_relay_blobs"
            #expect(try cluster.sql(database, blobs) == "1")
            // Sealed: the stored body holds none of the bytes, and its name is not their hash.
            let slice = bytes[1000..<1032].map { String(format: "%02x", $0) }.joined()
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_blobs WHERE position(decode('\(slice)', 'hex') in body) > 0") == "0")
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_blobs WHERE name = '\(coat.image!.sha256)'") == "0")

            let received = try await b.engine.sync(via: relay)
            #expect(received.blobsReceived == 1 && received.blobsPending == 0, "\(received)")
            #expect(try b.store.blob(coat.image!) == bytes)

            let hat = Garment(name: "Hat", image: ExternalData(bytes))
            try a.store.insert(hat)
            try await a.engine.sync(via: relay)
            #expect(try cluster.sql(database, "SELECT count(*), sum(size) FROM stash_relay_blobs").hasPrefix("1|"))
            #expect(try await relay.collectBlobs(for: a.engine, olderThan: 0) == 0)

            try a.store.delete(Garment.self, id: coat.id)
            try a.store.delete(Garment.self, id: hat.id)
            try await a.engine.sync(via: relay)
            try await b.engine.sync(via: relay)
            try await a.engine.publishCheckpoint(via: relay)
            try await a.engine.sync(via: relay)   // its files: held by the checkpoint, read by b
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_files WHERE source = '\(a.store.siteID)'") == "0")
            #expect(try await relay.collectBlobs(for: a.engine, olderThan: 3600) == 0)   // too young
            #expect(try await relay.collectBlobs(for: a.engine, olderThan: 0) == 1)
            #expect(try cluster.sql(database, blobs) == "0")
            #expect(try b.store.get(Garment.self, id: coat.id) == nil)
        }
    }
}
