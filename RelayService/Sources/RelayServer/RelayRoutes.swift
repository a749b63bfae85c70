import Foundation
import Hummingbird
import Logging
import Metrics
import NIOCore

/// The relay's HTTP API (docs/relay-service.md): what a relay directory offers, per family,
/// behind a token. Every route under `/v1/families/{family}` needs `Authorization: Bearer
/// <token, hex>`: none gets 401, another family's token 403.
struct RelayRoutes: Sendable {
    let database: RelayDatabase
    let families: Families
    let limiter: RateLimiter
    let waiters: LogWaiters
    let notifier: UploadNotifier
    let configuration: RelayServerConfiguration
    let logger: Logger

    typealias Context = BasicRequestContext

    private let deltasStored = Counter(label: "stash_relay_deltas_total", dimensions: [("outcome", "stored")])
    private let deltasDuplicate = Counter(label: "stash_relay_deltas_total", dimensions: [("outcome", "duplicate")])
    private let deltasRefused = Counter(label: "stash_relay_deltas_total", dimensions: [("outcome", "refused")])
    private let deltaBytes = Counter(label: "stash_relay_delta_bytes_total")
    private let checkpointsStored = Counter(label: "stash_relay_checkpoints_total")
    private let blobsStored = Counter(label: "stash_relay_blobs_total")
    private let longPolls = Gauge(label: "stash_relay_long_polls")
    private let unauthorized = Counter(label: "stash_relay_refused_total", dimensions: [("reason", "token")])
    private let limited = Counter(label: "stash_relay_refused_total", dimensions: [("reason", "rate")])

    init(database: RelayDatabase, families: Families, limiter: RateLimiter, waiters: LogWaiters, notifier: UploadNotifier,
         configuration: RelayServerConfiguration, logger: Logger) {
        self.notifier = notifier
        self.database = database
        self.families = families
        self.limiter = limiter
        self.waiters = waiters
        self.configuration = configuration
        self.logger = logger
    }

    func add(to router: Router<Context>) {
        let family = router.group("v1/families/:family")
        family.get { request, context in try await relayID(request, context) }
        family.get("state") { request, context in try await state(request, context) }
        family.get("log") { request, context in try await log(request, context) }
        family.get("files") { request, context in try await files(request, context) }
        family.get("checkpoint-due") { request, context in try await checkpointDue(request, context) }
        family.put("checkpoints/:maker/:through") { request, context in try await publishCheckpoint(request, context) }
        family.get("checkpoints/:maker/:through") { request, context in try await checkpoint(request, context) }
        family.post("sites/:site/deltas") { request, context in try await upload(request, context) }
        family.get("sites/:site/position") { request, context in try await position(request, context) }
        family.put("sites/:site/acks/:reader") { request, context in try await acknowledge(request, context) }
        family.get("sites/:site/requests") { request, context in try await requests(request, context) }
        family.put("sites/:site/requests/:reader") { request, context in try await askForSnapshot(request, context) }
        family.get("sites/:site/parked") { request, context in try await parkedNotes(request, context) }
        family.put("sites/:site/parked/:reader") { request, context in try await park(request, context) }
        family.delete("sites/:site/parked/:reader") { request, context in try await unpark(request, context) }
        family.get("checkpoints") { request, context in try await checkpointList(request, context) }
        family.get("blobs") { request, context in try await blobList(request, context) }
        family.head("blobs/:name") { request, context in try await blob(request, context, body: false) }
        family.get("blobs/:name") { request, context in try await blob(request, context, body: true) }
        family.put("blobs/:name") { request, context in try await putBlob(request, context) }
        family.delete("blobs/:name") { request, context in try await deleteBlob(request, context) }
    }

    // MARK: Authorization

    /// The family the request names, once its token is the family's and its rate allows.
    private func authorize(_ request: Request, _ context: Context) async throws -> (family: UUID, relay: UUID) {
        let family = try uuid(context, "family")
        guard let header = request.headers[.authorization], header.hasPrefix("Bearer "),
              let token = Self.hexBytes(header.dropFirst("Bearer ".count)), token.count == 32 else {
            unauthorized.increment()
            throw HTTPError(.unauthorized, headers: [.wwwAuthenticate: "Bearer realm=\"stash-relay\""],
                            message: "no family token: send Authorization: Bearer <the token the family key derives (64 hex digits)>")
        }
        guard let relay = try await mapUnavailable({ try await families.authorize(family, tokenHash: Families.hash(token)) }) else {
            unauthorized.increment()
            logger.notice("token refused", metadata: ["family": "\(family)"])
            throw HTTPError(.forbidden, message: "this token does not open family \(family) (another family's, or another key's): use the family's own key")
        }
        if let retry = limiter.take(family) {
            limited.increment()
            throw HTTPError(.tooManyRequests, headers: [.retryAfter: String(retry)],
                            message: "family \(family) is over its rate of \(Int(limiter.rate)) requests a second on this server; retry after \(retry) s")
        }
        return (family, relay)
    }

    static func hexBytes(_ text: Substring) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        var index = 0
        while index < digits.count {
            guard let high = value(digits[index]), let low = value(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
    }

    private func uuid(_ context: Context, _ name: String) throws -> UUID {
        guard let text = context.parameters.get(name), let id = UUID(uuidString: text) else {
            throw HTTPError(.badRequest, message: "\(name) \(context.parameters.get(name) ?? "") is not a UUID")
        }
        return id
    }

    private func number(_ request: Request, _ name: String, default fallback: Int64? = nil) throws -> Int64 {
        if let text = request.uri.queryParameters.get(name) {
            guard let value = Int64(text), value >= 0 else { throw HTTPError(.badRequest, message: "\(name)=\(text) is not a number from 0 to \(Int64.max)") }
            return value
        }
        guard let fallback else { throw HTTPError(.badRequest, message: "the query lacks \(name)=") }
        return fallback
    }

    /// The body, at most ``RelayServerConfiguration/maxBodyBytes`` (413 over it, before reading
    /// it when its length says so). A connection dropped before its end fails the request:
    /// nothing of it is stored.
    private func body(_ request: Request) async throws -> ByteBuffer {
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > configuration.maxBodyBytes {
            throw HTTPError(.contentTooLarge, message: "the body holds \(length) bytes; this server takes at most \(configuration.maxBodyBytes) (--max-body-bytes)")
        }
        do {
            return try await request.body.collect(upTo: configuration.maxBodyBytes)
        } catch let error as HTTPError where error.status == .contentTooLarge {
            throw HTTPError(.contentTooLarge, message: "the body is larger than this server takes (\(configuration.maxBodyBytes) bytes, --max-body-bytes)")
        }
    }

    /// `body` with the database's unavailability as 503 and Retry-After (the client retries).
    private func mapUnavailable<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as RelayDatabase.Unavailable {
            logger.warning("database unavailable", metadata: ["error": "\(error)"])
            throw HTTPError(.serviceUnavailable, headers: [.retryAfter: "1"], message: "the relay's database is unavailable (\(error)); retry")
        } catch let error as HTTPError {
            throw error
        } catch {
            // Logged with its details by RelayDatabase; the client learns where to look.
            throw HTTPError(.internalServerError, message: "the relay server failed (\(type(of: error))); its log says why")
        }
    }

    private func json(_ text: String, status: HTTPResponse.Status = .ok) -> Response {
        Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    private func binary(_ buffer: ByteBuffer) -> Response {
        Response(status: .ok, headers: [.contentType: "application/octet-stream"], body: .init(byteBuffer: buffer))
    }

    // MARK: Routes

    /// `GET /v1/families/F`: the family's relay id (registers the family at its first request).
    func relayID(_ request: Request, _ context: Context) async throws -> Response {
        let (family, relay) = try await authorize(request, context)
        let head = try await mapUnavailable { try await database.head(of: family) }
        return json("{\"relay\": \"\(relay.uuidString.lowercased())\", \"head\": \(head)}")
    }

    /// `GET /v1/families/F/state?reader=SITE`: what the reader decides its fetch from (and it
    /// is noted as a reader, and its own files every reader has are cleaned up).
    func state(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        guard let reader = request.uri.queryParameters.get("reader").flatMap({ UUID(uuidString: String($0)) }) else {
            throw HTTPError(.badRequest, message: "the query lacks reader=SITE (the reading store's site id)")
        }
        return json(try await mapUnavailable { try await database.state(family: family, reader: reader) })
    }

    /// `POST /v1/families/F/sites/S/deltas?from=&to=&full=&current=`: stores a delta file of
    /// S (an envelope of kind 1 whose header names F, S and the range), once: the same source
    /// and range again answers 200 with the position it has. 409 when the relay holds S's
    /// history past `current` (the store was rolled back or cloned).
    func upload(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let source = try uuid(context, "site")
        let from = try number(request, "from"), to = try number(request, "to")
        let current = try number(request, "current", default: to)
        let full = request.uri.queryParameters.get("full") == "1"
        let body = try await body(request)
        do {
            let header = try EnvelopeHeader(parsing: body.readableBytesView)
            guard header.kind == .delta else { throw BodyProblem("the body is a \(header.kind) file, not a delta") }
            guard header.sealed else { throw BodyProblem("the body is not sealed: a relay server takes only families with a key, whose files are encrypted") }
            guard header.family == family, header.source == source, header.from == UInt64(from), header.to == UInt64(to) else {
                throw BodyProblem("the body's header (family \(header.family), source \(header.source), history \(header.from)...\(header.to)) is not what the request says (family \(family), source \(source), history \(from)...\(to))")
            }
        } catch let problem as BodyProblem {
            deltasRefused.increment()
            logger.notice("delta refused", metadata: ["family": "\(family)", "source": "\(source)", "why": "\(problem)"])
            throw HTTPError(.badRequest, message: problem.description)
        }
        let outcome = try await mapUnavailable {
            try await database.upload(family: family, source: source, from: from, to: to, full: full, current: current, body: body)
        }
        switch outcome {
        case .stored(let position):
            notifier.stored(family)
            deltasStored.increment()
            deltaBytes.increment(by: Int64(body.readableBytes))
            logger.debug("delta stored", metadata: ["family": "\(family)", "source": "\(source)", "range": "\(from)...\(to)", "position": "\(position)"])
            return json("{\"position\": \(position), \"duplicate\": false}", status: .created)
        case .duplicate(let position):
            deltasDuplicate.increment()
            return json("{\"position\": \(position), \"duplicate\": true}")
        case .siteReused(let published):
            return json("{\"siteReused\": true, \"published\": \(published)}", status: .conflict)
        }
    }

    /// `GET /v1/families/F/log?after=P&wait=30s&exclude=SITE&bodies=1&limit=N`: the family's
    /// files after position P in log order (not those of SITE), waiting up to `wait` (at most
    /// the server's --max-wait) for one when there are none; woken by PostgreSQL NOTIFY from
    /// whichever server stored it. `bodies=1`: a binary answer with each file's bytes.
    func log(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let after = try number(request, "after", default: 0)
        let wait = try Self.duration(request.uri.queryParameters.get("wait").map { String($0) } ?? "0s", max: configuration.maxWait)
        let excluding = request.uri.queryParameters.get("exclude").flatMap { UUID(uuidString: String($0)) }
        let bodies = request.uri.queryParameters.get("bodies") == "1"
        let limit = Int(min(try number(request, "limit", default: 256), 4096))
        // Registered before each read, so that a file committed between the read and the wait
        // wakes it. A wake that finds nothing (another device's file, one of `exclude`, a
        // notification of a file already read) waits again, until the deadline.
        let deadline = ContinuousClock.now.advanced(by: wait)
        var entries: [RelayDatabase.LogEntry]
        while true {
            let ticket = wait > .zero ? waiters.register(family) : nil
            entries = try await mapUnavailable {
                try await database.log(family: family, after: after, excluding: excluding, limit: limit, bodies: bodies)
            }
            guard let ticket else { break }
            guard entries.isEmpty, ContinuousClock.now < deadline, !Task.isShuttingDownGracefully, !Task.isCancelled else {
                waiters.withdraw(ticket, family: family)
                break
            }
            longPolls.record(waiters.count)
            await waiters.wait(ticket, family: family, timeout: ContinuousClock.now.duration(to: deadline))
            longPolls.record(waiters.count)
        }
        let next = entries.last?.position ?? after
        guard bodies else {
            let list = entries.map { "[\($0.position), \"\($0.source.uuidString.lowercased())\", \($0.from), \($0.to), \($0.full), \($0.size)]" }
            return json("{\"next\": \(next), \"entries\": [\(list.joined(separator: ", "))]}")
        }
        // Per file: position u64, source (16), from u64, to u64, full u8, length u32, bytes.
        var buffer = ByteBuffer()
        for entry in entries {
            guard var body = entry.body else { continue }
            buffer.writeInteger(UInt64(entry.position), endianness: .little)
            _ = withUnsafeBytes(of: entry.source.uuid) { buffer.writeBytes($0) }
            buffer.writeInteger(UInt64(entry.from), endianness: .little)
            buffer.writeInteger(UInt64(entry.to), endianness: .little)
            buffer.writeInteger(UInt8(entry.full ? 1 : 0))
            buffer.writeInteger(UInt32(body.readableBytes), endianness: .little)
            buffer.writeBuffer(&body)
        }
        return binary(buffer)
    }

    /// `GET /v1/families/F/files?positions=1,2,3`: the bytes of those files (those still
    /// stored), each as position u64 LE, length u64 LE, bytes.
    func files(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let text = request.uri.queryParameters.get("positions") ?? ""
        let positions = text.split(separator: ",").compactMap { Int64($0) }
        guard !positions.isEmpty, positions.count <= 1024, positions.count == text.split(separator: ",").count else {
            throw HTTPError(.badRequest, message: "positions=\(text) is not a list of 1 to 1024 positions (1,2,3)")
        }
        var buffer = ByteBuffer()
        for (position, var body) in try await mapUnavailable({ try await database.bodies(family: family, positions: positions) }) {
            buffer.writeInteger(UInt64(position), endianness: .little)
            buffer.writeInteger(UInt64(body.readableBytes), endianness: .little)
            buffer.writeBuffer(&body)
        }
        return binary(buffer)
    }

    /// `PUT /v1/families/F/checkpoints/MAKER/THROUGH`: stores a checkpoint (an envelope of kind
    /// 2 whose header names F, MAKER and THROUGH), then removes those it covers entirely.
    func publishCheckpoint(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let maker = try uuid(context, "maker")
        guard let through = context.parameters.get("through").flatMap({ Int64($0) }), through >= 0 else {
            throw HTTPError(.badRequest, message: "the checkpoint's position is not a number")
        }
        let body = try await body(request)
        let header: EnvelopeHeader
        do {
            header = try EnvelopeHeader(parsing: body.readableBytesView)
            guard header.kind == .checkpoint, header.sealed else { throw BodyProblem("the body is not a sealed checkpoint (kind 2)") }
            guard header.family == family, header.source == maker, header.to == UInt64(through), header.coverage[maker] == header.to,
                  header.coverage.values.allSatisfy({ $0 <= UInt64(Int64.max) }) else {
                throw BodyProblem("the checkpoint's header (family \(header.family), maker \(header.source), through \(header.to)) is not what the request says (family \(family), maker \(maker), through \(through))")
            }
        } catch let problem as BodyProblem {
            logger.notice("checkpoint refused", metadata: ["family": "\(family)", "maker": "\(maker)", "why": "\(problem)"])
            throw HTTPError(.badRequest, message: problem.description)
        }
        try await mapUnavailable {
            try await database.publishCheckpoint(family: family, maker: maker, through: through, coverage: header.coverage, body: body)
        }
        checkpointsStored.increment()
        logger.info("checkpoint stored", metadata: ["family": "\(family)", "maker": "\(maker)", "through": "\(through)", "bytes": "\(body.readableBytes)"])
        return Response(status: .created)
    }

    func checkpoint(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let maker = try uuid(context, "maker")
        guard let through = context.parameters.get("through").flatMap({ Int64($0) }) else {
            throw HTTPError(.badRequest, message: "the checkpoint's position is not a number")
        }
        guard let body = try await mapUnavailable({ try await database.checkpoint(family: family, maker: maker, through: through) }) else {
            throw HTTPError(.notFound, message: "no checkpoint of \(maker) through \(through) (a newer one replaced it)")
        }
        return binary(body)
    }

    func checkpointDue(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        return json("{\"due\": \(try await mapUnavailable { try await database.checkpointDue(family: family) })}")
    }

    /// `GET /v1/families/F/sites/S/position`: where S stands (for `stash peers`).
    func position(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let site = try uuid(context, "site")
        return json(try await mapUnavailable { try await database.position(family: family, site: site) })
    }

    /// `PUT /v1/families/F/sites/S/acks/R` with the decimal sequence: R applied S's history
    /// that far.
    func acknowledge(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let source = try uuid(context, "site"), reader = try uuid(context, "reader")
        let text = String(buffer: try await body(request)).trimmingCharacters(in: .whitespacesAndNewlines)
        guard let through = Int64(text), through >= 0 else { throw HTTPError(.badRequest, message: "an acknowledgement is a decimal sequence, not \(text.prefix(40))") }
        try await mapUnavailable { try await database.acknowledge(family: family, source: source, reader: reader, through: through) }
        return Response(status: .noContent)
    }

    func requests(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let source = try uuid(context, "site")
        let readers = try await mapUnavailable { try await database.requests(family: family, source: source) }
        return json("[" + readers.map { "\"\($0.uuidString.lowercased())\"" }.joined(separator: ", ") + "]")
    }

    /// `PUT /v1/families/F/sites/S/requests/R`: R asks S for a full snapshot. 404 when S never
    /// wrote or read here (nothing is left: it would never answer).
    func askForSnapshot(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let source = try uuid(context, "site"), reader = try uuid(context, "reader")
        let known = try await mapUnavailable { try await database.request(family: family, source: source, reader: reader) }
        return Response(status: known ? .noContent : .notFound)
    }

    /// `GET /v1/families/F/sites/S/parked`: the notes readers left about S's parked deltas, as
    /// reader (16 bytes), length u32 LE, note.
    func parkedNotes(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let source = try uuid(context, "site")
        var buffer = ByteBuffer()
        for (reader, var note) in try await mapUnavailable({ try await database.parkedNotes(family: family, source: source) }) {
            _ = withUnsafeBytes(of: reader.uuid) { buffer.writeBytes($0) }
            buffer.writeInteger(UInt32(note.readableBytes), endianness: .little)
            buffer.writeBuffer(&note)
        }
        return binary(buffer)
    }

    func park(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let source = try uuid(context, "site"), reader = try uuid(context, "reader")
        let note = try await body(request)
        do {
            let header = try EnvelopeHeader(parsing: note.readableBytesView)
            guard header.kind == .note, header.family == family, header.source == reader else {
                throw BodyProblem("the note's header does not name this family and reader")
            }
        } catch let problem as BodyProblem {
            throw HTTPError(.badRequest, message: problem.description)
        }
        try await mapUnavailable { try await database.park(family: family, source: source, reader: reader, note: note) }
        return Response(status: .noContent)
    }

    func unpark(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let source = try uuid(context, "site"), reader = try uuid(context, "reader")
        try await mapUnavailable { try await database.park(family: family, source: source, reader: reader, note: nil) }
        return Response(status: .noContent)
    }

    // MARK: Blobs

    /// A blob's name: 64 lowercase hex digits (the HMAC of its hash under the family's
    /// blob-naming key; docs/relay-format.md, "Blobs").
    private func blobName(_ context: Context) throws -> String {
        guard let name = context.parameters.get("name"), name.utf8.count == 64,
              name.utf8.allSatisfy({ (48...57).contains($0) || (97...102).contains($0) }) else {
            throw HTTPError(.badRequest, message: "blob name \(context.parameters.get("name") ?? "") is not 64 lowercase hex digits")
        }
        return name
    }

    /// `HEAD` or `GET /v1/families/F/blobs/NAME`: 200 (with the blob's bytes for GET) or 404.
    func blob(_ request: Request, _ context: Context, body: Bool) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let name = try blobName(context)
        guard let bytes = try await mapUnavailable({ try await database.blob(family: family, name: name, body: body) }) else {
            throw HTTPError(.notFound, message: "family \(family) holds no blob \(name)")
        }
        return body ? binary(bytes) : Response(status: .ok)
    }

    /// `PUT /v1/families/F/blobs/NAME`: stores a blob (a sealed envelope of kind 4 whose header
    /// names F) once: 201, or 200 when the family holds it already (the first one stays).
    func putBlob(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let name = try blobName(context)
        let body = try await body(request)
        do {
            let header = try EnvelopeHeader(parsing: body.readableBytesView)
            guard header.kind == .blob, header.sealed, header.family == family, header.from == 0, header.to == 0 else {
                throw BodyProblem("the body is not a sealed blob (kind 4) of family \(family)")
            }
        } catch let problem as BodyProblem {
            logger.notice("blob refused", metadata: ["family": "\(family)", "why": "\(problem)"])
            throw HTTPError(.badRequest, message: problem.description)
        }
        let stored = try await mapUnavailable { try await database.putBlob(family: family, name: name, body: body) }
        if stored { blobsStored.increment() }
        return Response(status: stored ? .created : .ok)
    }

    /// `GET /v1/families/F/blobs?olderThan=SECONDS`: the names of the family's blobs stored
    /// more than SECONDS ago (JSON), the candidates of a blob collection.
    func blobList(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let age = try number(request, "olderThan", default: 0)
        let names = try await mapUnavailable { try await database.blobs(family: family, olderThan: age) }
        return json("[" + names.map { "\"\($0)\"" }.joined(separator: ", ") + "]")
    }

    /// `DELETE /v1/families/F/blobs/NAME?olderThan=SECONDS`: removes the blob if it was stored
    /// more than SECONDS ago (204), else keeps it (404 when there is none so old).
    func deleteBlob(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let name = try blobName(context)
        let age = try number(request, "olderThan", default: 0)
        let removed = try await mapUnavailable { try await database.deleteBlob(family: family, name: name, olderThan: age) }
        return Response(status: removed ? .noContent : .notFound)
    }

    /// `GET /v1/families/F/checkpoints`: `[[maker, through], …]`, in order of how much they hold.
    func checkpointList(_ request: Request, _ context: Context) async throws -> Response {
        let (family, _) = try await authorize(request, context)
        let list = try await mapUnavailable { try await database.checkpoints(family: family) }
        return json("[" + list.map { "[\"\($0.0.uuidString.lowercased())\", \($0.1)]" }.joined(separator: ", ") + "]")
    }

    /// `30s`, `500ms`, `2m` or plain seconds, at most `max`.
    static func duration(_ text: String, max: Duration) throws -> Duration {
        let units: [(String, Double)] = [("ms", 0.001), ("s", 1), ("m", 60)]
        var number = Substring(text), scale = 1.0
        for (suffix, value) in units where text.hasSuffix(suffix) {
            number = text.dropLast(suffix.count)
            scale = value
            break
        }
        guard let value = Double(number), value >= 0, value.isFinite else {
            throw HTTPError(.badRequest, message: "wait=\(text) is not a duration (30s, 500ms)")
        }
        return min(.milliseconds(Int64(value * scale * 1000)), max)
    }
}
