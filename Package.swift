// swift-tools-version: 6.2
import PackageDescription

let package = Package(
    name: "Stash",
    platforms: [.macOS(.v26)],
    products: [
        .library(name: "StashLMDB", targets: ["StashLMDB"]),
        .library(name: "Stash", targets: ["Stash"]),
        .executable(name: "stash", targets: ["stash"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
    ],
    targets: [
        .systemLibrary(
            name: "CLMDB",
            path: "CShims/CLMDB",
            pkgConfig: "lmdb",
            providers: [.apt(["liblmdb-dev"]), .brew(["lmdb"])]
        ),
        .target(name: "StashLMDB", dependencies: ["CLMDB"]),
        .target(name: "Stash", dependencies: ["StashLMDB"]),
        .executableTarget(
            name: "stash",
            dependencies: [
                "Stash",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .testTarget(name: "StashLMDBTests", dependencies: ["StashLMDB"]),
        .testTarget(name: "StashTests", dependencies: ["Stash", "StashLMDB"]),
    ],
    swiftLanguageModes: [.v6]
)
