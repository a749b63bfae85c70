import Foundation
import Hummingbird
import Logging
import Metrics
import NIOCore
import NIOPosix
import PostgresNIO
import Prometheus
import ServiceLifecycle

/// How a relay server runs (`stash-relay serve`'s options).
public struct RelayServerConfiguration: Sendable {
    /// The PostgreSQL database holding every relay state.
    public var postgres: PostgresURL
    /// The address to listen on.
    public var host = "127.0.0.1"
    public var port = 8080
    /// Bodies larger than this get 413 (a checkpoint is about the size of the family's data).
    public var maxBodyBytes = 64 << 20
    /// Requests per family and second on this server (0: no limit); over it, 429.
    public var ratePerFamily: Double = 200
    /// Requests a family may make at once above its rate.
    public var burstPerFamily: Double = 400
    /// The longest long-poll (`wait=`) the server holds.
    public var maxWait: Duration = .seconds(60)
    /// Readers silent this long hold nothing back (``RelayDatabase/staleReaderAge``).
    public var staleReaderAge: Duration = .seconds(30 * 86_400)
    /// Connections to PostgreSQL in the pool.
    public var connections = 16

    public init(postgres: PostgresURL) { self.postgres = postgres }
}

/// The relay server as a Hummingbird application: the routes of ``RelayRoutes``, `/health`,
/// `/metrics` (Prometheus text of every swift-metrics metric, the requests' included), the
/// PostgreSQL pool and the listener of new deltas as services of its service group (graceful
/// shutdown on SIGTERM and SIGINT: the server stops taking connections, finishes the requests
/// under way, then closes the pool). The migrations run before the server takes requests.
public func makeRelayApplication(configuration: RelayServerConfiguration, registry: PrometheusCollectorRegistry,
                                 logger: Logger) -> some ApplicationProtocol {
    let client = PostgresClient(configuration: configuration.postgres.clientConfiguration(connections: configuration.connections),
                                backgroundLogger: logger)
    let database = RelayDatabase(client: client, logger: logger, staleReaderAge: configuration.staleReaderAge)
    let waiters = LogWaiters()
    let notifier = UploadNotifier(client: client, waiters: waiters, logger: logger)
    let routes = RelayRoutes(database: database, families: Families(database: database),
                             limiter: RateLimiter(rate: configuration.ratePerFamily, burst: configuration.burstPerFamily),
                             waiters: waiters, notifier: notifier, configuration: configuration, logger: logger)
    let router = Router(context: BasicRequestContext.self)
    router.add(middleware: MetricsMiddleware())
    router.get("health") { _, _ -> Response in
        do {
            try await database.ping()
            return Response(status: .ok, headers: [.contentType: "text/plain"], body: .init(byteBuffer: ByteBuffer(string: "ok\n")))
        } catch {
            return Response(status: .serviceUnavailable, headers: [.contentType: "text/plain", .retryAfter: "1"],
                            body: .init(byteBuffer: ByteBuffer(string: "database unavailable: \(error)\n")))
        }
    }
    router.get("metrics") { _, _ -> Response in
        Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4"],
                 body: .init(byteBuffer: ByteBuffer(bytes: registry.emitToBuffer())))
    }
    routes.add(to: router)
    var app = Application(
        router: router,
        configuration: ApplicationConfiguration(address: .hostname(configuration.host, port: configuration.port),
                                                serverName: "stash-relay", backlog: 4096),
        services: [client, NotificationListener(url: configuration.postgres, waiters: waiters, logger: logger), notifier],
        onServerRunning: { channel in
            logger.info("serving", metadata: ["address": "\(channel.localAddress.map { "\($0)" } ?? "?")",
                                              "postgres": "\(configuration.postgres)"])
        },
        logger: logger)
    app.beforeServerStarts {
        try await checkConnection(configuration.postgres, logger: logger)
        try await database.migrate()
    }
    return app
}

/// Connects to PostgreSQL once, on a connection of its own, so that a server that cannot reach
/// its database says why at start (the pool would only wait and retry).
/// - Throws: ``RelayServerError`` naming the database and PostgreSQL's reason.
func checkConnection(_ url: PostgresURL, logger: Logger) async throws {
    do {
        let connection = try await PostgresConnection.connect(configuration: try url.connectionConfiguration(), id: 0, logger: logger)
        try await connection.close()
    } catch {
        throw RelayServerError("cannot connect to PostgreSQL at \(url): \(describe(error)); check --postgres (host, port, user, database) and that PostgreSQL runs")
    }
}

/// What went wrong, in one line: PostgreSQL's own message, or the network's.
func describe(_ error: any Error) -> String {
    if let error = error as? PSQLError {
        if let message = error.serverInfo?[.message] { return message }
        if let underlying = error.underlying { return describe(underlying) }
        return "\(error.code)"
    }
    if let error = error as? IOError { return String(cString: strerror(error.errnoCode)).lowercased() }
    if let error = error as? NIOConnectionError {
        return error.connectionErrors.map { describe($0.error) }.first ?? "cannot connect"
    }
    return "\(error)"
}

/// The line `stash-relay serve` prints when the server stops on an error.
public func startFailureMessage(_ error: any Error, configuration: RelayServerConfiguration) -> String {
    if let error = error as? IOError, error.errnoCode == EADDRINUSE {
        return "cannot listen on \(configuration.host):\(configuration.port): the address is in use (another server?); choose another --port"
    }
    if let error = error as? IOError, error.errnoCode == EACCES {
        return "cannot listen on \(configuration.host):\(configuration.port): not allowed (a port below 1024 needs privileges); choose another --port"
    }
    if let error = error as? RelayServerError { return error.description }
    return describe(error)
}
