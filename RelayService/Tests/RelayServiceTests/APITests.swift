import Crypto
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Stash
import StashSync
import Testing

extension RelayServiceTests {
    @Suite struct API {
        /// The same source and range uploaded twice, through two servers, is stored once (the
        /// second answer says so), and a reader applies it once.
        @Test func duplicateUploadsAreStoredOnce() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let a = try RelayServerProcess(postgres: cluster.url(database))
            let b = try RelayServerProcess(postgres: cluster.url(database))
            let family = Family()
            let scratch = Scratch()
            let writer = try Device(scratch.sub("writer"), family: family.id, key: family.key)
            try writer.store.insert(Note(title: "once", body: "", author: "w"))
            let (body, from, to) = try await sealedDelta(of: writer, scratch: scratch)
            let path = deltaPath(family, site: writer.store.siteID, from: from, to: to)
            let first = try await request("POST", URL(string: a.url.absoluteString + path)!, token: family.token, body: body)
            let second = try await request("POST", URL(string: b.url.absoluteString + path)!, token: family.token, body: body)
            #expect(first.0 == 201)
            #expect(second.0 == 200)
            #expect(String(decoding: second.1, as: UTF8.self).contains("\"duplicate\": true"))
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_files") == "1")
            // The engine's own send of the same range is a duplicate too.
            try await writer.engine.sync(via: transport(a))
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_files") == "1")
            let reader = try Device(scratch.sub("reader"), family: family.id, key: family.key)
            let report = try await reader.engine.sync(via: transport(b))
            #expect(report.receivedEntries == 1)
            #expect(try reader.notes().count == 1)
        }

        /// No token: 401 (with WWW-Authenticate); another family's token: 403, also through a
        /// store's sync (`.unauthenticated`, nothing applied); the database keeps only the
        /// token's SHA-256, never the token.
        @Test func tokens() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let server = try RelayServerProcess(postgres: cluster.url(database))
            let family = Family(), other = Family()
            let scratch = Scratch()
            let device = try Device(scratch.sub("d"), family: family.id, key: family.key)
            try device.store.insert(Note(title: "mine", body: "", author: "d"))
            try await device.engine.sync(via: transport(server))
            let url = URL(string: server.url.absoluteString + "/v1/families/\(family.id)/state?reader=\(RecordID())")!
            let none = try await request("GET", url, token: nil)
            #expect(none.0 == 401)
            #expect(none.2.value(forHTTPHeaderField: "WWW-Authenticate")?.hasPrefix("Bearer") == true)
            #expect(try await request("GET", url, token: "not-hex").0 == 401)
            #expect(try await request("GET", url, token: other.token).0 == 403)
            #expect(try await request("GET", url, token: family.token).0 == 200)
            // A store with another key (so another token) for the same family id.
            let intruder = try Device(scratch.sub("intruder"), family: family.id, key: other.key)
            do {
                try await intruder.engine.sync(via: transport(server))
                Issue.record("a sync with another family's token went through")
            } catch let error as SyncError {
                #expect(error.code == .unauthenticated)
                #expect(error.message.contains("403"))
            }
            #expect(try intruder.notes().isEmpty)
            let stored = try cluster.sql(database, "SELECT encode(token_hash, 'hex') FROM stash_relay_families")
            let token = FamilyKeys(key: family.key, family: family.id).relayToken
            #expect(stored == hex(Array(SHA256.hash(data: token))))
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_families WHERE position(decode('\(hex(token))', 'hex') in token_hash) > 0") == "0")
        }

        /// Bodies are checked against the relay format before they are stored: another
        /// family's, source's or range's header, a body cut short, a file that is no envelope,
        /// an unsealed one, get 400 and store nothing. A body the server cannot tell is
        /// damaged (its sealed bytes changed in the database) is refused by the reader, which
        /// asks its source for a full snapshot, and the family converges.
        @Test func tamperedBodiesAreRefused() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let server = try RelayServerProcess(postgres: cluster.url(database))
            let family = Family()
            let scratch = Scratch()
            let writer = try Device(scratch.sub("writer"), family: family.id, key: family.key)
            try writer.store.insert(Note(title: "first", body: "", author: "w"))
            let (body, from, to) = try await sealedDelta(of: writer, scratch: scratch)
            let site = writer.store.siteID
            func post(_ body: Data, site: RecordID, from: UInt64, to: UInt64) async throws -> Int {
                let url = URL(string: server.url.absoluteString + deltaPath(family, site: site, from: from, to: to))!
                return try await request("POST", url, token: family.token, body: body).0
            }
            #expect(try await post(body, site: RecordID(), from: from, to: to) == 400)        // another source
            #expect(try await post(body, site: site, from: from, to: to + 1) == 400)          // another range
            #expect(try await post(body.dropLast(5), site: site, from: from, to: to) == 400)  // cut short
            #expect(try await post(body + Data([0]), site: site, from: from, to: to) == 400)  // bytes after its end
            #expect(try await post(Data("not a relay file".utf8), site: site, from: from, to: to) == 400)
            var unsealed = body
            unsealed[6] = 0
            #expect(try await post(unsealed, site: site, from: from, to: to) == 400)
            var foreign = body
            foreign[7] ^= 0xFF                                                                   // another family in the header
            #expect(try await post(foreign, site: site, from: from, to: to) == 400)
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_files") == "0")

            // Stored, then changed in the database: the reader refuses it and asks for a full snapshot.
            let reader = try Device(scratch.sub("reader"), family: family.id, key: family.key)
            try await reader.engine.sync(via: transport(server))
            try await writer.engine.sync(via: transport(server))
            try cluster.sql(database, "UPDATE stash_relay_files SET body = overlay(body placing '\\xff'::bytea from octet_length(body) - 20 for 1)")
            let refused = try await reader.engine.sync(via: transport(server))
            #expect(refused.refused.count == 1, "\(refused)")
            #expect(try reader.notes().isEmpty)
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_requests") == "1")
            try await writer.engine.sync(via: transport(server))   // answers with a full snapshot
            let healed = try await reader.engine.sync(via: transport(server))
            #expect(healed.refused.isEmpty, "\(healed)")
            #expect(try reader.notes().count == 1)
        }

        /// Over the body limit: 413 (before the body is read), and the sync fails with
        /// `.transportFailed`, changes pending. Over the family's rate: 429 with Retry-After,
        /// and a store's sync waits as told and goes through.
        @Test func bodyAndRateLimits() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let small = try RelayServerProcess(postgres: cluster.url(database), arguments: ["--max-body-bytes", "2000"])
            let family = Family()
            let scratch = Scratch()
            let writer = try Device(scratch.sub("writer"), family: family.id, key: family.key)
            for i in 0..<40 { try writer.store.insert(Note(title: "n\(i)", body: String(repeating: "z", count: 100), author: "w")) }
            do {
                try await writer.engine.sync(via: transport(small))
                Issue.record("a body over the limit was taken")
            } catch let error as SyncError {
                #expect(error.code == .transportFailed)
                #expect(error.message.contains("413"))
            }
            #expect(try await writer.engine.status(via: transport(small)).pendingOutgoing == 40)

            let slow = try RelayServerProcess(postgres: cluster.url(database), arguments: ["--rate-per-family", "2", "--burst-per-family", "2"])
            let url = URL(string: slow.url.absoluteString + "/v1/families/\(family.id)/checkpoint-due")!
            var statuses: [Int] = []
            var retryAfter: String?
            for _ in 0..<4 {
                let answer = try await request("GET", url, token: family.token)
                statuses.append(answer.0)
                if answer.0 == 429 { retryAfter = answer.2.value(forHTTPHeaderField: "Retry-After") }
            }
            #expect(statuses.contains(429), "\(statuses)")
            #expect(retryAfter.flatMap(Int.init) ?? 0 >= 1)
            let report = try await writer.engine.sync(via: transport(slow, giveUpAfter: .seconds(60)))
            #expect(report.sentEntries == 40)
        }

        /// `/health` answers 200 while PostgreSQL does, 503 while it does not; `/metrics` is
        /// Prometheus text with the relay's counters; SIGTERM ends the server gracefully (exit
        /// 0) without waiting out a long-poll, and the migrations ran once for two servers.
        @Test func operations() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let server = try RelayServerProcess(postgres: cluster.url(database))
            let second = try RelayServerProcess(postgres: cluster.url(database))
            #expect(try cluster.sql(database, "SELECT string_agg(version::text, ',' ORDER BY version) FROM stash_relay_migrations") == "1,2")
            let family = Family()
            let scratch = Scratch()
            let device = try Device(scratch.sub("d"), family: family.id, key: family.key)
            try device.store.insert(Note(title: "m", body: "", author: "d"))
            try await device.engine.sync(via: transport(server))
            let (status, metrics, response) = try await request("GET", server.url.appendingPathComponent("metrics"), token: nil)
            #expect(status == 200)
            #expect(response.value(forHTTPHeaderField: "Content-Type")?.hasPrefix("text/plain") == true)
            let text = String(decoding: metrics, as: UTF8.self)
            #expect(text.contains("stash_relay_deltas_total{outcome=\"stored\"} 1"), "\(text)")
            #expect(text.contains("hb_requests"))

            let relay = transport(second)
            let waiting = Task { try await relay.changes(for: device.engine, after: 1_000_000, wait: .seconds(30)) }
            try await Task.sleep(for: .milliseconds(300))
            let clock = ContinuousClock.now
            #expect(second.terminate() == 0)
            #expect(clock.duration(to: .now) < .seconds(10))
            _ = try? await waiting.value
            #expect(second.log.contains("serving"))

            try cluster.stop()
            #expect(try await eventually(15) { (try? httpStatus(server.url.appendingPathComponent("health"))) == 503 })
            try cluster.start()
            #expect(try await eventually(30) { (try? httpStatus(server.url.appendingPathComponent("health"))) == 200 })
        }
    }
}
