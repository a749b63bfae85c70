// swift-tools-version: 6.2
import PackageDescription

let package = Package(
    name: "Stash",
    platforms: [.macOS(.v26)],
    products: [
        .library(name: "StashLMDB", targets: ["StashLMDB"]),
        .library(name: "Stash", targets: ["Stash"]),
        .library(name: "StashSync", targets: ["StashSync"]),
        .library(name: "StashGate", targets: ["StashGate"]),
        .executable(name: "stash", targets: ["StashCLI"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-crypto", from: "3.12.3"),
    ],
    targets: [
        .systemLibrary(
            name: "CLMDB",
            path: "CShims/CLMDB",
            pkgConfig: "lmdb",
            providers: [.apt(["liblmdb-dev"]), .brew(["lmdb"])]
        ),
        // A file's inode and birth time (statx on Linux), for telling a store from its copy.
        .systemLibrary(name: "CFileIdentity", path: "CShims/CFileIdentity"),
        // CRC-32C (with the processor's instruction) and reserving a file's blocks (fallocate).
        .systemLibrary(name: "CStashShims", path: "CShims/CStashShims"),
        .target(name: "StashLMDB", dependencies: ["CLMDB", "CFileIdentity", "CStashShims"]),
        // Naming a thread for the OS (prctl on Linux), for the threads the library starts.
        .systemLibrary(name: "CThreadName", path: "CShims/CThreadName"),
        .target(name: "Stash", dependencies: ["StashLMDB", "CThreadName", .product(name: "Crypto", package: "swift-crypto")]),
        .target(name: "StashSync", dependencies: ["Stash", .product(name: "Crypto", package: "swift-crypto")]),
        .target(name: "StashGate", dependencies: ["Stash", .product(name: "Crypto", package: "swift-crypto")]),
        // The `stash` command. The module is StashCLI so that it never clashes with the
        // `Stash` library on case-insensitive file systems.
        .executableTarget(
            name: "StashCLI",
            dependencies: [
                "Stash",
                "StashSync",
                "StashGate",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Sources/stash"
        ),
        // Helpers shared by the test targets (temporary directories, seeded randomness,
        // threads, running the `stash` tool). Not a product.
        .target(name: "StashTestSupport", dependencies: ["StashLMDB"], path: "Tests/StashTestSupport"),
        .testTarget(name: "StashLMDBTests", dependencies: ["StashLMDB", "StashTestSupport"]),
        .testTarget(name: "StashTests", dependencies: ["Stash", "StashLMDB", "StashTestSupport"]),
        .testTarget(name: "StashSyncTests", dependencies: ["StashSync", "Stash", "StashLMDB", "StashTestSupport",
                                                     .product(name: "Crypto", package: "swift-crypto")]),
        .testTarget(name: "StashGateTests", dependencies: ["StashGate", "Stash", "StashSync", "StashTestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
