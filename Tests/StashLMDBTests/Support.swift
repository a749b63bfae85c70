import Foundation
import StashLMDB
import Synchronization
import StashTestSupport

/// Opens an environment in `dir` with the given databases.
func openEnvironment(_ path: String, _ databases: [DatabaseSpec] = [DatabaseSpec("main"), DatabaseSpec("dups", flags: [.duplicateSort, .duplicateFixed])],
                     mapSize: Int? = nil, durability: Durability = .full) throws -> Environment {
    var config = EnvironmentConfiguration(databases: databases, durability: durability)
    if let mapSize { config.initialMapSize = mapSize }
    return try Environment.open(path: path, configuration: config)
}

/// Bytes of a string, for readable keys.
func b(_ text: String) -> [UInt8] { Array(text.utf8) }

/// A 16-byte big-endian value (the fixed-width duplicate layout of the store's index).
func id16(_ n: UInt64, high: UInt64 = 0) -> [UInt8] {
    var out: [UInt8] = []
    for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: high >> UInt64(shift))) }
    for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: n >> UInt64(shift))) }
    return out
}

struct TestAbort: Error {}
