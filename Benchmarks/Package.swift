// swift-tools-version: 6.2
// The benchmark suite lives in its own package so that users of Stash never build
// package-benchmark or GRDB. Run it with `make bench` from the repository root.
import PackageDescription

let package = Package(
    name: "StashBenchmarks",
    platforms: [.macOS(.v26)],
    dependencies: [
        .package(name: "Stash", path: "../"),
        .package(url: "https://github.com/ordo-one/benchmark", exact: "1.38.1", traits: ["MallocInterposer"]),
        .package(url: "https://github.com/groue/GRDB.swift", exact: "7.10.0"),
    ],
    targets: [
        .executableTarget(
            name: "StoreBench",
            dependencies: [
                .product(name: "Stash", package: "Stash"),
                .product(name: "StashLMDB", package: "Stash"),
                .product(name: "StashGate", package: "Stash"),
                .product(name: "StashSync", package: "Stash"),
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "GRDB", package: "GRDB.swift"),
            ],
            path: "Benchmarks/StoreBench",
            plugins: [
                .plugin(name: "BenchmarkPlugin", package: "benchmark"),
            ]
        ),
        // Turns a run exported with `--format jmh` into the tables of BENCHMARKS.md.
        .executableTarget(name: "BenchReport", path: "Tools/BenchReport"),
        // The relay service under load (`make bench-relay`): simulated devices and real stores
        // against stash-relay (built in RelayService/) and a throwaway PostgreSQL cluster.
        .executableTarget(
            name: "RelayBench",
            dependencies: [
                .product(name: "Stash", package: "Stash"),
                .product(name: "StashSync", package: "Stash"),
            ],
            path: "Tools/RelayBench"
        ),
    ],
    swiftLanguageModes: [.v6]
)
