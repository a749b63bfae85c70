// swift-tools-version: 6.2
// The relay service (`stash-relay serve`): a stateless HTTP server on PostgreSQL that stores
// and serves the relay format (docs/relay-format.md) for many devices. It lives in its own
// package so that an app linking Stash never fetches or builds a web server or a PostgreSQL
// driver. `make test` builds it and runs its tests against a throwaway PostgreSQL cluster.
import PackageDescription

let package = Package(
    name: "StashRelayService",
    platforms: [.macOS(.v26)],
    products: [
        .executable(name: "stash-relay", targets: ["stash-relay"]),
        .library(name: "RelayServer", targets: ["RelayServer"]),
    ],
    dependencies: [
        .package(name: "Stash", path: "../"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", exact: "2.28.1"),
        .package(url: "https://github.com/vapor/postgres-nio", exact: "1.33.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", exact: "2.13.0"),
        .package(url: "https://github.com/apple/swift-log", exact: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics", exact: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", exact: "2.4.1"),
        .package(url: "https://github.com/apple/swift-argument-parser", exact: "1.8.2"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        // Already built for Stash and postgres-nio: SHA-256 of the family tokens.
        .package(url: "https://github.com/apple/swift-crypto", from: "3.12.3"),
    ],
    targets: [
        .target(
            name: "RelayServer",
            dependencies: [
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        .executableTarget(
            name: "stash-relay",
            dependencies: [
                "RelayServer",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .testTarget(
            name: "RelayServiceTests",
            dependencies: [
                "RelayServer",
                .product(name: "Stash", package: "Stash"),
                .product(name: "StashSync", package: "Stash"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
