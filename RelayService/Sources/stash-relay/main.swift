import ArgumentParser
import Foundation
import Logging
import Metrics
import Prometheus
import RelayServer

/// `stash-relay`: the relay service of Stash (docs/relay-service.md).
@main
struct StashRelay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stash-relay",
        abstract: "The Stash relay service: devices of many families sync through it (PostgreSQL holds everything).",
        subcommands: [Serve.self])
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Serve the relay API over HTTP, its state in PostgreSQL (its tables are created or upgraded at start).",
        discussion: """
        Several servers may share one database: each holds nothing of its own, and a long-poll on
        one wakes for an upload to another (PostgreSQL LISTEN/NOTIFY). SIGTERM or SIGINT stops it
        gracefully: it finishes the requests under way. Logs go to standard error (LOG_LEVEL=debug
        for more); metrics are at /metrics (Prometheus text), liveness at /health.
        """)

    @Option(help: "The database: postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=disable|prefer|require].")
    var postgres: String
    @Option(help: "The port to listen on.") var port: Int
    @Option(help: "The address to listen on.") var host = "127.0.0.1"
    @Option(help: "The largest body taken, in bytes (a checkpoint is about the size of a family's data); larger ones get 413.")
    var maxBodyBytes = 64 << 20
    @Option(help: "Requests a family may make per second on this server (0: no limit); over it, 429 with Retry-After.")
    var ratePerFamily: Double = 200
    @Option(help: "Requests a family may make at once above its rate.") var burstPerFamily: Double = 400
    @Option(help: "The longest long-poll held, in seconds.") var maxWait = 60
    @Option(help: "Days after which a silent reader holds no file back (it catches up from a checkpoint when it returns).")
    var staleReaderDays: Double = 30
    @Option(help: "Connections to PostgreSQL.") var connections = 16

    func run() async throws {
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = ProcessInfo.processInfo.environment["LOG_LEVEL"].flatMap { Logger.Level(rawValue: $0) } ?? .info
            return handler
        }
        let logger = Logger(label: "stash-relay")
        var configuration: RelayServerConfiguration
        do {
            configuration = RelayServerConfiguration(postgres: try PostgresURL(postgres))
        } catch {
            printError("stash-relay: \(error)")
            throw ExitCode(2)
        }
        guard (1...65535).contains(port) else {
            printError("stash-relay: --port \(port) is not a port (1 to 65535)")
            throw ExitCode(2)
        }
        configuration.host = host
        configuration.port = port
        configuration.maxBodyBytes = maxBodyBytes
        configuration.ratePerFamily = ratePerFamily
        configuration.burstPerFamily = burstPerFamily
        configuration.maxWait = .seconds(maxWait)
        configuration.staleReaderAge = .seconds(Int64(staleReaderDays * 86_400))
        configuration.connections = connections
        let app = makeRelayApplication(configuration: configuration, registry: registry, logger: logger)
        do {
            try await app.runService()
        } catch {
            printError("stash-relay: \(startFailureMessage(error, configuration: configuration))")
            throw ExitCode(1)
        }
    }
}

func printError(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}
