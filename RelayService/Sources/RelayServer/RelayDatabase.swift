import Foundation
import Logging
import NIOCore
import PostgresNIO

/// The relay's state in PostgreSQL: every operation of the relay format as one statement (most
/// of them a function of ``Migrations``, so one round trip and one transaction each).
/// Stateless: any number of servers share one database.
final class RelayDatabase: Sendable {
    let client: PostgresClient
    let logger: Logger
    /// How long a reader may stay silent before it holds nothing back (the directory relay's
    /// `staleReaderAge`).
    let staleReaderAge: Duration
    /// How long one database call may take before the request fails with 503 (PostgreSQL
    /// restarting, or unreachable): the client retries.
    let timeout: Duration

    init(client: PostgresClient, logger: Logger, staleReaderAge: Duration, timeout: Duration = .seconds(10)) {
        self.client = client
        self.logger = logger
        self.staleReaderAge = staleReaderAge
        self.timeout = timeout
    }

    private var staleInterval: String { "\(staleReaderAge.components.seconds) seconds" }
    /// A reader's `seen` time is rewritten once this old (a thirtieth of the stale age, as the
    /// directory relay does), not at every fetch.
    private var seenEveryInterval: String { "\(max(1, staleReaderAge.components.seconds / 30)) seconds" }

    // MARK: Start

    /// Creates or upgrades the server's tables: each migration not applied yet, in order, in a
    /// transaction of its own, under an advisory lock (servers starting together take turns).
    func migrate() async throws {
        try await run("migrate") {
            try await self.client.withConnection { connection in
                try await connection.query("SELECT pg_advisory_lock(736174686)", logger: self.logger)
                do {
                    try await connection.query("CREATE TABLE IF NOT EXISTS stash_relay_migrations (version integer PRIMARY KEY, applied timestamptz NOT NULL DEFAULT now())", logger: self.logger)
                    var applied = Set<Int>()
                    for try await version in try await connection.query("SELECT version FROM stash_relay_migrations", logger: self.logger).decode(Int.self) {
                        applied.insert(version)
                    }
                    for migration in Migrations.all where !applied.contains(migration.version) {
                        try await connection.query("BEGIN", logger: self.logger)
                        do {
                            // One statement per query: the extended protocol takes no more.
                            for statement in Migrations.statements(migration.sql) {
                                try await connection.query(PostgresQuery(unsafeSQL: statement), logger: self.logger)
                            }
                            try await connection.query("INSERT INTO stash_relay_migrations (version) VALUES (\(migration.version))", logger: self.logger)
                            try await connection.query("COMMIT", logger: self.logger)
                        } catch {
                            _ = try? await connection.query("ROLLBACK", logger: self.logger)
                            throw error
                        }
                        self.logger.info("applied migration", metadata: ["version": "\(migration.version)"])
                    }
                } catch {
                    _ = try? await connection.query("SELECT pg_advisory_unlock(736174686)", logger: self.logger)
                    throw error
                }
                try await connection.query("SELECT pg_advisory_unlock(736174686)", logger: self.logger)
            }
        }
    }

    // MARK: Families

    /// The family's token hash and relay id; a family the database does not know yet is
    /// registered with `tokenHash` (the first device to reach the server with its token).
    func family(_ family: UUID, registering tokenHash: [UInt8]) async throws -> (tokenHash: [UInt8], relay: UUID) {
        let hash = ByteBuffer(bytes: tokenHash)   // bytea ([UInt8] would bind as "char"[])
        return try await run("family") {
            let rows = try await self.client.query("""
                WITH inserted AS (
                    INSERT INTO stash_relay_families (family, token_hash, relay_id) VALUES (\(family), \(hash), gen_random_uuid())
                    ON CONFLICT (family) DO NOTHING RETURNING token_hash, relay_id)
                SELECT token_hash, relay_id FROM inserted
                UNION ALL SELECT token_hash, relay_id FROM stash_relay_families WHERE family = \(family)
                LIMIT 1
                """, logger: self.logger)
            for try await (hash, relay) in rows.decode((ByteBuffer, UUID).self) {
                return (Array(buffer: hash), relay)
            }
            // Registered by another server meanwhile (after this statement's snapshot).
            let again = try await self.client.query("SELECT token_hash, relay_id FROM stash_relay_families WHERE family = \(family)", logger: self.logger)
            for try await (hash, relay) in again.decode((ByteBuffer, UUID).self) {
                return (Array(buffer: hash), relay)
            }
            throw RelayServerError("family \(family) could not be registered")
        }
    }

    func head(of family: UUID) async throws -> Int64 {
        try await run("head") {
            for try await head in try await self.client.query("SELECT head FROM stash_relay_families WHERE family = \(family)", logger: self.logger).decode(Int64.self) {
                return head
            }
            return 0
        }
    }

    // MARK: Deltas

    enum UploadOutcome: Equatable {
        case stored(position: Int64)
        case duplicate(position: Int64)
        case siteReused(published: Int64)
    }

    /// Stores a delta file (``Migrations``: `stash_relay_upload`).
    func upload(family: UUID, source: UUID, from: Int64, to: Int64, full: Bool, current: Int64, body: ByteBuffer) async throws -> UploadOutcome {
        try await run("upload") {
            let rows = try await self.client.query("""
                SELECT status, pos, published FROM stash_relay_upload(\(family), \(source), \(from), \(to), \(full), \(current), \(body), \(self.staleInterval)::interval)
                """, logger: self.logger)
            for try await (status, position, published) in rows.decode((String, Int64, Int64).self) {
                switch status {
                case "stored": return .stored(position: position)
                case "duplicate": return .duplicate(position: position)
                default: return .siteReused(published: published)
                }
            }
            throw RelayServerError("the upload function returned nothing")
        }
    }

    /// The JSON a reader decides its fetch from (``Migrations``: `stash_relay_state`).
    func state(family: UUID, reader: UUID) async throws -> String {
        try await run("state") {
            let rows = try await self.client.query("""
                SELECT stash_relay_state(\(family), \(reader), \(self.staleInterval)::interval, \(self.seenEveryInterval)::interval)::text
                """, logger: self.logger)
            for try await json in rows.decode(String.self) { return json }
            throw RelayServerError("the state function returned nothing")
        }
    }

    /// A stored file's place in the log, range and size (and its body, when asked).
    struct LogEntry: Sendable {
        var position: Int64
        var source: UUID
        var from: Int64
        var to: Int64
        var full: Bool
        var size: Int32
        var body: ByteBuffer?
    }

    /// The family's files after `after` in log order (not those of `excluding`), at most `limit`.
    func log(family: UUID, after: Int64, excluding: UUID?, limit: Int, bodies: Bool) async throws -> [LogEntry] {
        try await run("log") {
            let excluded = excluding ?? UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
            let rows = try await self.client.query("""
                SELECT position, source, first_seq, last_seq, full_snapshot, size, CASE WHEN \(bodies) THEN body END
                FROM stash_relay_files WHERE family = \(family) AND position > \(after) AND source <> \(excluded)
                ORDER BY position LIMIT \(limit)
                """, logger: self.logger)
            var result: [LogEntry] = []
            for try await (position, source, from, to, full, size, body) in rows.decode((Int64, UUID, Int64, Int64, Bool, Int32, ByteBuffer?).self) {
                result.append(LogEntry(position: position, source: source, from: from, to: to, full: full, size: size, body: body))
            }
            return result
        }
    }

    /// The bodies of the family's files at `positions` (those still stored).
    func bodies(family: UUID, positions: [Int64]) async throws -> [(Int64, ByteBuffer)] {
        try await run("bodies") {
            let rows = try await self.client.query("""
                SELECT position, body FROM stash_relay_files WHERE family = \(family) AND position = ANY(\(positions)) ORDER BY position
                """, logger: self.logger)
            var result: [(Int64, ByteBuffer)] = []
            for try await row in rows.decode((Int64, ByteBuffer).self) { result.append(row) }
            return result
        }
    }

    // MARK: Checkpoints

    func publishCheckpoint(family: UUID, maker: UUID, through: Int64, coverage: [UUID: UInt64], body: ByteBuffer) async throws {
        let json = "{" + coverage.map { "\"\($0.key.uuidString.lowercased())\": \($0.value)" }.sorted().joined(separator: ", ") + "}"
        try await run("checkpoint") {
            try await self.client.query("""
                SELECT stash_relay_publish_checkpoint(\(family), \(maker), \(through), \(json)::jsonb, \(body))
                """, logger: self.logger)
        }
    }

    func checkpoint(family: UUID, maker: UUID, through: Int64) async throws -> ByteBuffer? {
        try await run("checkpoint body") {
            let rows = try await self.client.query("""
                SELECT body FROM stash_relay_checkpoints WHERE family = \(family) AND maker = \(maker) AND through = \(through)
                """, logger: self.logger)
            for try await body in rows.decode(ByteBuffer.self) { return body }
            return nil
        }
    }

    func checkpointDue(family: UUID) async throws -> Bool {
        try await run("checkpoint due") {
            for try await due in try await self.client.query("SELECT stash_relay_checkpoint_due(\(family))", logger: self.logger).decode(Bool.self) {
                return due
            }
            return false
        }
    }

    // MARK: Blobs

    /// Stores a blob under `name` once: returns false when the family holds it already.
    func putBlob(family: UUID, name: String, body: ByteBuffer) async throws -> Bool {
        try await run("put blob") {
            let rows = try await self.client.query("""
                INSERT INTO stash_relay_blobs (family, name, size, body) VALUES (\(family), \(name), \(Int32(body.readableBytes)), \(body))
                ON CONFLICT (family, name) DO NOTHING RETURNING 1
                """, logger: self.logger)
            for try await _ in rows { return true }
            return false
        }
    }

    /// The blob's body (nil: the family holds none of that name), or only whether it is held.
    func blob(family: UUID, name: String, body: Bool) async throws -> ByteBuffer? {
        try await run("blob") {
            let rows = try await self.client.query("""
                SELECT CASE WHEN \(body) THEN body ELSE ''::bytea END FROM stash_relay_blobs WHERE family = \(family) AND name = \(name)
                """, logger: self.logger)
            for try await bytes in rows.decode(ByteBuffer.self) { return bytes }
            return nil
        }
    }

    /// The names of the family's blobs stored more than `age` ago.
    func blobs(family: UUID, olderThan age: Int64) async throws -> [String] {
        try await run("blobs") {
            var result: [String] = []
            let rows = try await self.client.query("""
                SELECT name FROM stash_relay_blobs WHERE family = \(family) AND stored < now() - make_interval(secs => \(Double(age))) ORDER BY name
                """, logger: self.logger)
            for try await name in rows.decode(String.self) { result.append(name) }
            return result
        }
    }

    /// Removes the blob when it was stored more than `age` ago; whether it did.
    func deleteBlob(family: UUID, name: String, olderThan age: Int64) async throws -> Bool {
        try await run("delete blob") {
            let rows = try await self.client.query("""
                DELETE FROM stash_relay_blobs WHERE family = \(family) AND name = \(name) AND stored < now() - make_interval(secs => \(Double(age))) RETURNING 1
                """, logger: self.logger)
            for try await _ in rows { return true }
            return false
        }
    }

    /// The family's checkpoints (maker, through), for a client that reads every file of the
    /// family (a blob collection).
    func checkpoints(family: UUID) async throws -> [(UUID, Int64)] {
        try await run("checkpoints") {
            var result: [(UUID, Int64)] = []
            let rows = try await self.client.query("SELECT maker, through FROM stash_relay_checkpoints WHERE family = \(family) ORDER BY coverage_sum", logger: self.logger)
            for try await row in rows.decode((UUID, Int64).self) { result.append(row) }
            return result
        }
    }

    // MARK: Notes

    /// Records that `reader` applied `source`'s history through `through` (an acknowledgement
    /// only grows here: a late repeat of an older one changes nothing).
    func acknowledge(family: UUID, source: UUID, reader: UUID, through: Int64) async throws {
        try await run("ack") {
            try await self.client.query("""
                INSERT INTO stash_relay_acks (family, source, reader, through) VALUES (\(family), \(source), \(reader), \(through))
                ON CONFLICT (family, source, reader) DO UPDATE SET through = greatest(stash_relay_acks.through, excluded.through)
                """, logger: self.logger)
        }
    }

    /// Leaves `reader`'s request for a full snapshot of `source`, unless `source` never wrote or
    /// read on this relay (it would never answer, and would count as a reader that never
    /// acknowledges). Returns whether the source is known.
    func request(family: UUID, source: UUID, reader: UUID) async throws -> Bool {
        try await run("request") {
            let rows = try await self.client.query("""
                WITH known AS (SELECT 1 FROM stash_relay_sites WHERE family = \(family) AND site = \(source)),
                     inserted AS (INSERT INTO stash_relay_requests (family, source, reader)
                                  SELECT \(family), \(source), \(reader) WHERE EXISTS (SELECT 1 FROM known)
                                  ON CONFLICT DO NOTHING RETURNING 1)
                SELECT EXISTS (SELECT 1 FROM known)
                """, logger: self.logger)
            for try await known in rows.decode(Bool.self) { return known }
            return false
        }
    }

    func requests(family: UUID, source: UUID) async throws -> [UUID] {
        try await run("requests") {
            var result: [UUID] = []
            let rows = try await self.client.query("SELECT reader FROM stash_relay_requests WHERE family = \(family) AND source = \(source) ORDER BY reader", logger: self.logger)
            for try await reader in rows.decode(UUID.self) { result.append(reader) }
            return result
        }
    }

    func park(family: UUID, source: UUID, reader: UUID, note: ByteBuffer?) async throws {
        try await run("parked note") {
            if let note {
                try await self.client.query("""
                    INSERT INTO stash_relay_parked (family, source, reader, note) VALUES (\(family), \(source), \(reader), \(note))
                    ON CONFLICT (family, source, reader) DO UPDATE SET note = excluded.note
                    """, logger: self.logger)
            } else {
                try await self.client.query("DELETE FROM stash_relay_parked WHERE family = \(family) AND source = \(source) AND reader = \(reader)", logger: self.logger)
            }
        }
    }

    func parkedNotes(family: UUID, source: UUID) async throws -> [(UUID, ByteBuffer)] {
        try await run("parked notes") {
            var result: [(UUID, ByteBuffer)] = []
            let rows = try await self.client.query("SELECT reader, note FROM stash_relay_parked WHERE family = \(family) AND source = \(source) ORDER BY reader::text", logger: self.logger)
            for try await row in rows.decode((UUID, ByteBuffer).self) { result.append(row) }
            return result
        }
    }

    /// Where a site stands on the relay: the log's head, how far the relay holds its history,
    /// each reader's acknowledgement of it, and how far the checkpoints hold it.
    func position(family: UUID, site: UUID) async throws -> String {
        try await run("position") {
            let rows = try await self.client.query("""
                SELECT json_build_object(
                    'head', (SELECT head FROM stash_relay_families WHERE family = \(family)),
                    'published', stash_relay_published(\(family), \(site)),
                    'checkpointed', stash_relay_covered(\(family), \(site)),
                    'files', (SELECT count(*) FROM stash_relay_files WHERE family = \(family)),
                    'acks', (SELECT coalesce(json_object_agg(reader, through), '{}'::json) FROM stash_relay_acks
                             WHERE family = \(family) AND source = \(site)))::text
                """, logger: self.logger)
            for try await json in rows.decode(String.self) { return json }
            return "{}"
        }
    }

    /// Whether PostgreSQL answers within `timeout` (`/health`: a probe expects its answer soon).
    func ping(timeout: Duration = .seconds(1)) async throws {
        try await run("ping", timeout: timeout) { try await self.client.query("SELECT 1", logger: self.logger) }
    }

    // MARK: Failures

    /// Runs `body` within ``timeout``; a database that does not answer (restarting, gone) or
    /// that failed the connection is ``Unavailable`` (503 to the client, which retries).
    @discardableResult
    private func run<T: Sendable>(_ what: String, timeout: Duration? = nil, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let timeout = timeout ?? self.timeout
        do {
            return try await withThrowingTaskGroup(of: T.self) { group in
                group.addTask { try await body() }
                group.addTask {
                    try await Task.sleep(for: timeout)
                    throw Unavailable(reason: "PostgreSQL did not answer within \(timeout)")
                }
                defer { group.cancelAll() }
                return try await group.next()!
            }
        } catch let error as Unavailable {
            throw error
        } catch let error as PSQLError {
            if let state = error.serverInfo?[.sqlState], !Self.unavailableStates.contains(where: { state.hasPrefix($0) }) {
                logger.error("database error", metadata: ["operation": "\(what)", "sqlState": "\(state)", "error": "\(String(reflecting: error))"])
                throw error
            }
            throw Unavailable(reason: "PostgreSQL is unavailable (\(error.code))")
        } catch is CancellationError {
            throw Unavailable(reason: "the request was cancelled")
        } catch {
            throw error
        }
    }

    /// SQLSTATE classes of a database going away or overloaded: connection exceptions,
    /// insufficient resources, operator intervention (shutdown), and a read-only standby.
    static let unavailableStates = ["08", "53", "57", "25006"]

    struct Unavailable: Error, CustomStringConvertible {
        let reason: String
        var description: String { reason }
    }
}
