import Foundation

/// LMDB's command-line tools (Debian's lmdb-utils), run against real stores.
public enum LMDBTool {
    /// Thrown when a tool is not installed.
    public struct Missing: Error, CustomStringConvertible {
        public let name: String
        public var description: String { "\(name) is not installed; run `make deps-test` (apt: lmdb-utils)" }
    }

    /// Thrown when a tool did not get where a test needs it.
    public struct Stuck: Error, CustomStringConvertible {
        public let description: String
    }

    /// The installed tool called `name` (`mdb_stat`, `mdb_dump`, `mdb_load`, …).
    public static func executable(_ name: String) throws -> URL {
        let candidates = ["/usr/bin/\(name)", "/usr/local/bin/\(name)", "/opt/homebrew/bin/\(name)"]
        guard let path = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            throw Missing(name: name)
        }
        return URL(fileURLWithPath: path)
    }

    /// Starts `mdb_load` on the environment in `path` and returns once it holds the write
    /// lock: it begins its write transaction after reading the header, then waits for data
    /// that never comes. ``kill(_:)`` it to release the lock (nothing is committed).
    public static func holdWriteLock(on path: String) throws -> Process {
        let process = Process()
        process.executableURL = try executable("mdb_load")
        process.arguments = ["-s", "held-by-test", path]
        let input = Pipe()
        // The header is in the pipe before the tool starts, so its first read gets all of it;
        // a read that then blocks is the one inside the write transaction.
        input.fileHandleForWriting.write(Data("VERSION=3\nformat=bytevalue\ntype=btree\nHEADER=END\n".utf8))
        process.standardInput = input
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let syscall = "/proc/\(process.processIdentifier)/syscall"
        guard FileManager.default.fileExists(atPath: "/proc/self/syscall") else {
            Thread.sleep(forTimeInterval: 1)   // no /proc: the tool is that quick
            return process
        }
        let deadline = Date().addingTimeInterval(20)
        while process.isRunning && Date() < deadline {
            // "0 0x0 …": blocked in read(2) on standard input.
            if let text = try? String(contentsOfFile: syscall, encoding: .utf8), text.hasPrefix("0 0x0 ") { return process }
            Thread.sleep(forTimeInterval: 0.01)
        }
        kill(process)
        throw Stuck(description: "mdb_load did not start its write transaction on \(path) within 20 s")
    }

    /// Ends `process` at once and waits for it. `mdb_load` catches SIGTERM and goes on
    /// waiting for input (its read restarts), so this sends SIGKILL: its write transaction
    /// dies uncommitted.
    public static func kill(_ process: Process) {
        if process.isRunning { _ = Foundation.kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
    }
}
