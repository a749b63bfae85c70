import Foundation
import Testing

/// Runs the `stash` executable built next to the test bundle.
enum StashCLI {
    struct Result {
        let status: Int32
        let stdout: String
        let stderr: String
    }

    /// The built `stash` binary: beside the test runner (same build directory), or STASH_BIN.
    static var executable: URL {
        if let override = ProcessInfo.processInfo.environment["STASH_BIN"] { return URL(fileURLWithPath: override) }
        let runner = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        var dir = runner.deletingLastPathComponent()
        // On Linux the runner is `<build>/debug/StashPackageTests.xctest`; look there and upwards.
        for _ in 0..<4 {
            let candidate = dir.appendingPathComponent("stash")
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
            dir = dir.deletingLastPathComponent()
        }
        return URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent(".build/debug/stash")
    }

    /// Starts `stash args…` and returns the running process with its pipes.
    static func start(_ arguments: [String], stdin: String? = nil) throws -> (Process, Pipe, Pipe) {
        let process = Process()
        process.executableURL = executable
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

    /// Runs `stash args…` to completion.
    @discardableResult
    static func run(_ arguments: String..., stdin: String? = nil) throws -> Result {
        try run(arguments, stdin: stdin)
    }

    @discardableResult
    static func run(_ arguments: [String], stdin: String? = nil) throws -> Result {
        let (process, out, err) = try start(arguments, stdin: stdin)
        // Read both pipes before waiting so a chatty process cannot block on a full pipe.
        let outData = out.fileHandleForReading.readDataToEndOfFile()
        let errData = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Result(status: process.terminationStatus,
                      stdout: String(decoding: outData, as: UTF8.self),
                      stderr: String(decoding: errData, as: UTF8.self))
    }

    static let schema = """
    {"types": [
      {"name": "Home", "fields": [{"name": "name", "kind": "string"}]},
      {"name": "Item", "fields": [{"name": "homeID", "kind": "uuid"}, {"name": "name", "kind": "string"},
                                  {"name": "wearCount", "kind": "int"}, {"name": "note", "kind": "string", "optional": true}],
       "indexes": [{"fields": ["homeID"]}, {"fields": ["name"], "unique": true}]},
      {"name": "Secret", "localOnly": true, "fields": [{"name": "value", "kind": "string"}]}
    ]}
    """

    /// `stash init` on a new store directory with ``schema``.
    static func makeStore(in dir: TemporaryDirectory, name: String = "store") throws -> String {
        let schemaPath = dir.sub("schema-\(name).json")
        try schema.write(toFile: schemaPath, atomically: true, encoding: .utf8)
        let store = dir.sub(name)
        let result = try run("init", store, "--schema", schemaPath)
        #expect(result.status == 0, "init failed: \(result.stderr)")
        return store
    }
}
