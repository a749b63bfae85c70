import Foundation

/// Preloaded stores, built once per (engine, N) and reused by later benchmark processes
/// (package-benchmark runs every benchmark in a fresh process).
///
/// Layout under ``BenchConfig/root``:
/// - `fixtures-<key>/<Engine>-<N>/`: a store holding N/100 homes and N items, complete
///   when the `complete` marker file exists. Read benchmarks open it in place.
/// - `scratch/<pid>-<name>/`: private copies and fresh stores of one benchmark process,
///   removed by the benchmark's teardown.
enum Fixtures {
    static let batchSize = 1_000

    static func fixtureDirectory<E: Engine>(_ engine: E.Type, items n: Int) -> URL {
        BenchConfig.root.appendingPathComponent("fixtures-\(BenchConfig.fixtureKey)")
            .appendingPathComponent("\(E.name)-\(n)")
    }

    /// The directory of a complete fixture store, built now if missing.
    static func ensure<E: Engine>(_ engine: E.Type, items n: Int) throws -> URL {
        let directory = fixtureDirectory(engine, items: n)
        let marker = directory.appendingPathComponent("complete")
        if FileManager.default.fileExists(atPath: marker.path) { return directory }
        removeStaleFixtures()
        try? FileManager.default.removeItem(at: directory)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        do {
            // Built without syncing each commit (the result is flushed once at the end);
            // the engine is released before anyone reopens the directory.
            let store = try E(directory: directory, sync: .none)
            try load(store, items: n)
            try store.flush()
        }
        try Data("\(n) items\n".utf8).write(to: marker)
        return directory
    }

    /// Fixtures of earlier builds, and scratch stores left by crashed runs.
    static func removeStaleFixtures() {
        let current = "fixtures-\(BenchConfig.fixtureKey)"
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: BenchConfig.root.path)) ?? []
        for entry in entries where entry.hasPrefix("fixtures-") && entry != current {
            try? FileManager.default.removeItem(at: BenchConfig.root.appendingPathComponent(entry))
        }
        let scratch = BenchConfig.root.appendingPathComponent("scratch")
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: scratch.path)) ?? [] {
            // Named `<pid>-...`: remove those whose process is gone.
            if let pid = Int32(entry.prefix { $0.isNumber }), pid != getpid(), kill(pid, 0) != 0 {
                try? FileManager.default.removeItem(at: scratch.appendingPathComponent(entry))
            }
        }
    }

    /// Inserts the homes (one transaction), then items 0..<n in transactions of `batchSize`.
    static func load(_ engine: some Engine, items n: Int) throws {
        let homes = Workload.homeCount(items: n)
        try engine.insert(homes: (0..<homes).map(Workload.home))
        var start = 0
        while start < n {
            let end = min(n, start + batchSize)
            try engine.insert(items: (start..<end).map { Workload.item($0, homes: homes) })
            start = end
        }
    }

    /// Reads every file of `directory` once, so that read benchmarks start from a warm OS page
    /// cache whatever ran before them (each engine's own cache stays as the engine sets it).
    static func warm(_ directory: URL) {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        for name in names {
            let fd = Foundation.open(directory.appendingPathComponent(name).path, O_RDONLY)
            guard fd >= 0 else { continue }
            while buffer.withUnsafeMutableBytes({ read(fd, $0.baseAddress, $0.count) }) > 0 {}
            close(fd)
        }
    }

    /// Writes every dirty page of the machine to disk (`sync(2)`) before measuring, so that
    /// background writeback of a fixture just built or copied (hundreds of MB at N = 1M) does
    /// not compete with the measurement for the disk and, on a small VM, for the CPU.
    static func settle() {
        Foundation.sync()
    }

    /// A fresh directory for this process.
    static func scratch(_ name: String) throws -> URL {
        let directory = BenchConfig.root.appendingPathComponent("scratch")
            .appendingPathComponent("\(getpid())-\(name)")
        try? FileManager.default.removeItem(at: directory)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    /// A private copy of the fixture, for benchmarks that write.
    static func copy<E: Engine>(_ engine: E.Type, items n: Int, name: String) throws -> URL {
        try copy(ensure(engine, items: n), name: name)
    }

    /// A private scratch copy of the store files in `source` (not its marker or lock file).
    static func copy(_ source: URL, name: String) throws -> URL {
        let directory = try scratch(name)
        for file in try FileManager.default.contentsOfDirectory(atPath: source.path)
        where file != "complete" && file != "lock.mdb" {
            try FileManager.default.copyItem(at: source.appendingPathComponent(file),
                                             to: directory.appendingPathComponent(file))
        }
        return directory
    }

    static func remove(_ directory: URL) {
        try? FileManager.default.removeItem(at: directory)
    }
}
