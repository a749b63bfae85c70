import Foundation

/// Runs the `stash` command-line tool built next to the test runner.
public enum StashExecutable {
    public struct Result: Sendable {
        public let status: Int32
        public let stdout: String
        public let stderr: String
        /// The signal the process died of, if it did not exit (`status` is then the signal).
        public var signal: Int32? = nil
    }

    /// The built `stash` binary: STASH_BIN, or beside the test runner (same build directory).
    public static var url: URL {
        if let override = ProcessInfo.processInfo.environment["STASH_BIN"] { return URL(fileURLWithPath: override) }
        var dir = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
        // On Linux the runner is `<build>/debug/StashPackageTests.xctest`; look there and upwards.
        for _ in 0..<4 {
            let candidate = dir.appendingPathComponent("stash")
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
            dir = dir.deletingLastPathComponent()
        }
        return URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent(".build/debug/stash")
    }

    /// Starts `stash arguments…` and returns the running process with its output pipes.
    public static func start(_ arguments: [String], stdin: String? = nil) throws -> (Process, Pipe, Pipe) {
        let process = Process()
        process.executableURL = url
        process.arguments = arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        if let stdin {
            let input = Pipe()
            process.standardInput = input
            try process.run()
            input.fileHandleForWriting.write(Data(stdin.utf8))
            try input.fileHandleForWriting.close()
        } else {
            process.standardInput = FileHandle.nullDevice
            try process.run()
        }
        return (process, out, err)
    }

    /// Runs `stash arguments…` to completion.
    @discardableResult
    public static func run(_ arguments: [String], stdin: String? = nil) throws -> Result {
        finish(try start(arguments, stdin: stdin))
    }

    /// Waits for a process made by ``start(_:stdin:)`` and collects its output.
    public static func finish(_ running: (Process, Pipe, Pipe)) -> Result {
        let (process, out, err) = running
        // Read both pipes before waiting so a chatty process cannot block on a full pipe.
        let outData = out.fileHandleForReading.readDataToEndOfFile()
        let errData = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Result(status: process.terminationStatus, stdout: String(decoding: outData, as: UTF8.self),
                      stderr: String(decoding: errData, as: UTF8.self),
                      signal: process.terminationReason == .uncaughtSignal ? process.terminationStatus : nil)
    }

    @discardableResult
    public static func run(_ arguments: String..., stdin: String? = nil) throws -> Result {
        try run(arguments, stdin: stdin)
    }
}
