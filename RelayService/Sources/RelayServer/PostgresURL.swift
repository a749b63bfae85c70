import Foundation
import PostgresNIO

/// A PostgreSQL connection URL, `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=MODE]`
/// (also `postgresql://`; MODE `disable`, the default, `prefer` or `require`), for the pool
/// and for the connection that listens for new deltas.
public struct PostgresURL: Sendable, CustomStringConvertible {
    public let host: String
    public let port: Int
    public let username: String
    let password: String?
    public let database: String?
    public let sslMode: String

    /// - Throws: ``RelayServerError`` naming what is wrong with `text`.
    public init(_ text: String) throws {
        guard let components = URLComponents(string: text), let scheme = components.scheme,
              scheme == "postgres" || scheme == "postgresql" else {
            throw RelayServerError("--postgres \(text) is not a PostgreSQL URL; write postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE")
        }
        guard let host = components.host, !host.isEmpty else {
            throw RelayServerError("--postgres \(text) names no host; write postgres://USER@HOST:PORT/DATABASE")
        }
        guard let user = components.user, !user.isEmpty else {
            throw RelayServerError("--postgres \(text) names no user; write postgres://USER@HOST:PORT/DATABASE")
        }
        self.host = host
        port = components.port ?? 5432
        username = user.removingPercentEncoding ?? user
        password = components.password.map { $0.removingPercentEncoding ?? $0 }
        let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        database = path.isEmpty ? nil : path
        let mode = components.queryItems?.first(where: { $0.name == "sslmode" })?.value ?? "disable"
        guard ["disable", "prefer", "require"].contains(mode) else {
            throw RelayServerError("--postgres \(text): sslmode=\(mode) is not one of disable, prefer, require")
        }
        sslMode = mode
    }

    /// The URL without its password, for logs.
    public var description: String {
        "postgres://\(username)@\(host):\(port)/\(database ?? "")?sslmode=\(sslMode)"
    }

    var clientTLS: PostgresClient.Configuration.TLS {
        switch sslMode {
        case "require": .require(.makeClientConfiguration())
        case "prefer": .prefer(.makeClientConfiguration())
        default: .disable
        }
    }

    func connectionTLS() throws -> PostgresConnection.Configuration.TLS {
        switch sslMode {
        case "require": .require(try .init(configuration: .makeClientConfiguration()))
        case "prefer": .prefer(try .init(configuration: .makeClientConfiguration()))
        default: .disable
        }
    }

    func clientConfiguration(connections: Int) -> PostgresClient.Configuration {
        var configuration = PostgresClient.Configuration(host: host, port: port, username: username, password: password,
                                                         database: database, tls: clientTLS)
        configuration.options.maximumConnections = connections
        configuration.options.minimumConnections = 1
        configuration.options.connectTimeout = .seconds(5)
        return configuration
    }

    func connectionConfiguration() throws -> PostgresConnection.Configuration {
        PostgresConnection.Configuration(host: host, port: port, username: username, password: password,
                                         database: database, tls: try connectionTLS())
    }
}

/// A failure of the server's own setup (arguments, database): one line saying what to do.
public struct RelayServerError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
