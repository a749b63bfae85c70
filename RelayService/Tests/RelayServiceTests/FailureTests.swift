import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Stash
import StashSync
import Testing

/// Sends the start of an HTTP request to 127.0.0.1:`port` (its headers and `bytes` of its
/// body), and returns the socket, still open: the caller closes it, or kills the server.
func partialRequest(port: Int, head: String, bytes: Data) throws -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw HarnessError("socket: \(String(cString: strerror(errno)))") }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = UInt16(port).bigEndian
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
    guard connected else { close(fd); throw HarnessError("connect: \(String(cString: strerror(errno)))") }
    let all = Data(head.utf8) + bytes
    let sent = all.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    guard sent == all.count else { close(fd); throw HarnessError("send: \(sent) of \(all.count)") }
    return fd
}

/// Starts the upload of `body` (a delta of `site`, `from`...`to`) to the server on `port`, with
/// its whole length announced and only `sending` bytes of it sent; returns the open socket.
func partialUpload(port: Int, _ family: Family, site: RecordID, body: Data, from: UInt64, to: UInt64, sending: Int) throws -> Int32 {
    let head = "POST \(deltaPath(family, site: site, from: from, to: to)) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(family.token)\r\nContent-Length: \(body.count)\r\n\r\n"
    return try partialRequest(port: port, head: head, bytes: body.prefix(sending))
}

/// The path a store uploads a delta of `site`, `from`...`to` to.
func deltaPath(_ family: Family, site: RecordID, from: UInt64, to: UInt64) -> String {
    "/v1/families/\(family.id)/sites/\(site)/deltas?from=\(from)&to=\(to)&full=0&current=\(to)"
}

/// A sealed delta of `device`'s store as a relay server takes it, with its range: what the
/// device's next send would upload (made through a relay directory, the same envelope).
func sealedDelta(of device: Device, scratch: Scratch) async throws -> (body: Data, from: UInt64, to: UInt64) {
    let directory = URL(fileURLWithPath: scratch.sub("envelopes-\(UUID().uuidString.prefix(8))"))
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    // A throwaway copy of the watermarks: a relay directory has a watermark of its own.
    try await device.engine.sendChanges(via: RelayTransport(directory: directory))
    let folder = directory.appendingPathComponent(device.store.siteID.description)
    let name = try #require(try FileManager.default.contentsOfDirectory(atPath: folder.path).first { $0.hasSuffix(".delta") })
    let parts = name.dropLast(".delta".count).split(separator: "-")
    return (try Data(contentsOf: folder.appendingPathComponent(name)), UInt64(parts[0])!, UInt64(parts[1])!)
}

extension RelayServiceTests {
    @Suite struct Failures {
        /// kill -9 of a server in the middle of an upload (its body half sent) stores nothing;
        /// the same store's sync through the other server then goes through, and a sync that
        /// was under way when its server was killed resumes once the server is back (the
        /// client retries); each range is stored once, and every store converges and verifies.
        @Test func killNineMidUpload() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let a = try RelayServerProcess(postgres: cluster.url(database))
            let b = try RelayServerProcess(postgres: cluster.url(database))
            let family = Family()
            let scratch = Scratch()
            let writer = try Device(scratch.sub("writer"), family: family.id, key: family.key)
            let reader = try Device(scratch.sub("reader"), family: family.id, key: family.key)
            var expected = Expected()
            let wallet = Wallet()
            try writer.store.insert(wallet)
            for round in 0..<3 { try expected.round(writer, 0, round, wallet: wallet.id) }
            try await writer.engine.sync(via: transport(b))
            try await reader.engine.sync(via: transport(b))

            // Half a body on server A, then kill -9: nothing of it is stored.
            for round in 3..<6 { try expected.round(writer, 0, round, wallet: wallet.id) }
            let (body, from, to) = try await sealedDelta(of: writer, scratch: scratch)
            let socket = try partialUpload(port: a.port, family, site: writer.store.siteID, body: body, from: from, to: to, sending: body.count / 2)
            try await Task.sleep(for: .milliseconds(200))
            a.kill9()
            close(socket)
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_files WHERE last_seq = \(to)") == "0")

            // The store's own sync, while A is down, through B: stored once.
            try await writer.engine.sync(via: transport(b))
            // A sync through A that starts while A is down resumes once A is back.
            for round in 6..<8 { try expected.round(writer, 0, round, wallet: wallet.id) }
            let resumed = Task { try await writer.engine.sync(via: transport(a, giveUpAfter: .seconds(60))) }
            try await Task.sleep(for: .milliseconds(500))
            try a.start()
            _ = try await resumed.value
            try await reader.engine.sync(via: transport(a))
            try expected.check(reader, wallet: wallet.id)
            try expected.check(writer, wallet: wallet.id)
            #expect(try duplicateRanges(cluster, database) == 0)
        }

        /// kill -9 of the server a device long-polls: the wait retries, reaches the restarted
        /// server, and returns when another device uploads (through the other server); the
        /// device then syncs and has the change.
        @Test func killNineMidLongPoll() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let a = try RelayServerProcess(postgres: cluster.url(database))
            let b = try RelayServerProcess(postgres: cluster.url(database))
            let family = Family()
            let scratch = Scratch()
            let writer = try Device(scratch.sub("writer"), family: family.id, key: family.key)
            let waiter = try Device(scratch.sub("waiter"), family: family.id, key: family.key)
            let relayA = transport(a, giveUpAfter: .seconds(60)), relayB = transport(b)
            try await writer.engine.sync(via: relayB)
            try await waiter.engine.sync(via: relayA)
            let position = try await relayA.changes(for: waiter.engine, after: 0, wait: .zero)
            let wait = Task { try await relayA.changes(for: waiter.engine, after: position, wait: .seconds(30)) }
            try await Task.sleep(for: .milliseconds(300))
            a.kill9()
            try await Task.sleep(for: .milliseconds(300))
            try a.start()
            try await Task.sleep(for: .milliseconds(500))
            let note = Note(title: "after the kill", body: "", author: "writer")
            try writer.store.insert(note)
            try await writer.engine.sync(via: relayB)
            let next = try await wait.value
            #expect(next > position)
            try await waiter.engine.sync(via: relayA)
            #expect(try waiter.store.get(Note.self, id: note.id) == note)
        }

        /// PostgreSQL restarts while devices sync: requests get 503 or lose their connection,
        /// the clients retry, and every sync goes through; the stores converge and verify.
        @Test func restartPostgresMidSync() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let a = try RelayServerProcess(postgres: cluster.url(database))
            let b = try RelayServerProcess(postgres: cluster.url(database))
            let family = Family()
            let scratch = Scratch()
            let devices = try (0..<3).map { try Device(scratch.sub("d\($0)"), family: family.id, key: family.key) }
            let transports = [transport(a, giveUpAfter: .seconds(60)), transport(b, giveUpAfter: .seconds(60)), transport(a, giveUpAfter: .seconds(60))]
            let wallet = Wallet()
            try devices[0].store.insert(wallet)
            var expected = Expected()
            for (n, device) in devices.enumerated() { try await device.engine.sync(via: transports[n]) }
            // When PostgreSQL was down: from before its stop to after its start.
            let restarted = Flag()
            let restart = Task.detached { () async throws -> (down: ContinuousClock.Instant, up: ContinuousClock.Instant) in
                defer { restarted.set() }
                try await Task.sleep(for: .milliseconds(300))
                let down = ContinuousClock.now
                try cluster.stop()
                try await Task.sleep(for: .seconds(1))
                try cluster.start()
                return (down, ContinuousClock.now)
            }
            var failures: [String] = []
            var syncs: [(start: ContinuousClock.Instant, end: ContinuousClock.Instant)] = []
            var round = 0
            // At least 8 rounds, and two more once the restart is over.
            var after = 0
            while after < 2 {
                if round >= 8 && restarted.isSet { after += 1 }
                for (n, device) in devices.enumerated() {
                    try expected.round(device, n, round, wallet: wallet.id)
                    let start = ContinuousClock.now
                    do { try await device.engine.sync(via: transports[n]) }
                    catch { failures.append("\(error)") }
                    syncs.append((start, .now))
                }
                round += 1
                try await Task.sleep(for: .milliseconds(100))
            }
            let outage = try await restart.value
            #expect(failures.isEmpty, "syncs failed across the restart: \(failures)")
            // Some sync was under way while PostgreSQL was down, and went through.
            #expect(syncs.contains { $0.start < outage.up && $0.end > outage.down }, "no sync overlapped the restart")
            for _ in 0..<2 {
                for (n, device) in devices.enumerated() { try await device.engine.sync(via: transports[n]) }
            }
            for device in devices { try expected.check(device, wallet: wallet.id) }
            #expect(try duplicateRanges(cluster, database) == 0)
        }

        /// A connection dropped in the middle of a body stores nothing, and the server goes on:
        /// the whole upload then stores the delta once.
        @Test func droppedConnectionMidBodyStoresNothing() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let server = try RelayServerProcess(postgres: cluster.url(database))
            let family = Family()
            let scratch = Scratch()
            let writer = try Device(scratch.sub("writer"), family: family.id, key: family.key)
            for i in 0..<50 { try writer.store.insert(Note(title: "n\(i)", body: String(repeating: "b", count: 200), author: "w")) }
            let (body, from, to) = try await sealedDelta(of: writer, scratch: scratch)
            let socket = try partialUpload(port: server.port, family, site: writer.store.siteID, body: body, from: from, to: to, sending: body.count / 3)
            try await Task.sleep(for: .milliseconds(200))
            close(socket)
            try await Task.sleep(for: .milliseconds(300))
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_files") == "0")
            #expect(try httpStatus(server.url.appendingPathComponent("health")) == 200)
            let reader = try Device(scratch.sub("reader"), family: family.id, key: family.key)
            try await writer.engine.sync(via: transport(server))
            try await reader.engine.sync(via: transport(server))
            #expect(try reader.notes().count == 50)
            #expect(try cluster.sql(database, "SELECT count(*) FROM stash_relay_files") == "1")
        }
    }
}
