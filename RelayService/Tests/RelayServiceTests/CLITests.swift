import Foundation
import Stash
import StashSync
import Testing

/// The `stash` tool of the root package (`make test` builds it before these tests run;
/// STASH_BIN overrides).
var stashBinary: String {
    if let path = ProcessInfo.processInfo.environment["STASH_BIN"] { return path }
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()
    return root.appendingPathComponent(".build/debug/stash").path
}

/// Runs `stash` with `arguments`: its exit status, standard output and standard error.
func stash(_ arguments: [String]) throws -> (status: Int32, out: String, err: String) {
    guard FileManager.default.isExecutableFile(atPath: stashBinary) else {
        throw HarnessError("no stash tool at \(stashBinary): build the root package first (`swift build`; make test does)")
    }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: stashBinary)
    process.arguments = arguments
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    let errData = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: outData, as: UTF8.self), String(decoding: errData, as: UTF8.self))
}

extension RelayServiceTests {
    @Suite struct CLI {
        /// `stash-relay serve` that cannot start says why in its last line and exits non-zero:
        /// a URL that is not PostgreSQL's (2), a database that does not exist, a port in use (1).
        @Test func serverStartFailuresSayWhatToDo() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let scratch = Scratch()
            func serve(_ arguments: [String]) throws -> (status: Int32, last: String) {
                let output = scratch.sub("serve-\(UUID().uuidString.prefix(8)).log")
                let status = waitFor(try spawn(RelayServerProcess.binary, ["serve"] + arguments, output: output))
                let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
                return (status, text.split(separator: "\n").last.map(String.init) ?? "")
            }
            let url = try serve(["--postgres", "mysql://root@127.0.0.1/x", "--port", "1"])
            #expect(url.status == 2)
            #expect(url.last.hasPrefix("stash-relay: --postgres mysql://root@127.0.0.1/x is not a PostgreSQL URL"), "\(url.last)")
            let missing = try serve(["--postgres", cluster.url("no_such_database"), "--port", String(try freePort())])
            #expect(missing.status == 1)
            #expect(missing.last.hasPrefix("stash-relay: cannot connect to PostgreSQL") && missing.last.contains("\"no_such_database\" does not exist"), "\(missing.last)")
            let running = try RelayServerProcess(postgres: cluster.url(database))
            let taken = try serve(["--postgres", cluster.url(database), "--port", String(running.port)])
            #expect(taken.status == 1)
            #expect(taken.last == "stash-relay: cannot listen on 127.0.0.1:\(running.port): the address is in use (another server?); choose another --port", "\(taken.last)")
        }

        /// `stash sync DIR --server URL --family F --key-file K` syncs two stores through a
        /// server; `stash peers` shows the server's log position at the last fetch, and with
        /// `--server` asks the server where the store stands now. Without --key-file, or with
        /// another family's key, one line on stderr and exit 1 or 64.
        @Test func syncAndPeersThroughAServer() async throws {
            let (cluster, database) = try SharedPostgres.newDatabase()
            let server = try RelayServerProcess(postgres: cluster.url(database))
            let scratch = Scratch()
            let schema = scratch.sub("schema.json")
            try Data(#"{"types": [{"name": "Item", "fields": [{"name": "name", "kind": "string"}]}]}"#.utf8).write(to: URL(fileURLWithPath: schema))
            let keyFile = scratch.sub("family.key"), otherKey = scratch.sub("other.key")
            try Data((0..<32).map { _ in UInt8.random(in: 0...255) }).write(to: URL(fileURLWithPath: keyFile))
            try Data((0..<32).map { _ in UInt8.random(in: 0...255) }).write(to: URL(fileURLWithPath: otherKey))
            let family = RecordID().description
            let (a, b) = (scratch.sub("a"), scratch.sub("b"))
            for dir in [a, b] { #expect(try stash(["init", dir, "--schema", schema]).status == 0) }
            let put = try stash(["put", a, "Item", #"{"name": "Lamp"}"#])
            #expect(put.status == 0, "\(put.err)")
            let url = server.url.absoluteString
            let first = try stash(["sync", a, "--server", url, "--family", family, "--key-file", keyFile])
            #expect(first.status == 0, "\(first.err)")
            #expect(first.out.contains("server: log at position 1"), "\(first.out)")
            let second = try stash(["sync", b, "--server", url, "--family", family, "--key-file", keyFile])
            #expect(second.status == 0, "\(second.err)")
            #expect(try stash(["dump", b, "Item"]).out.contains("Lamp"))

            let peers = try stash(["peers", b])
            #expect(peers.status == 0, "\(peers.err)")
            #expect(peers.out.contains("server \(url): log position 1 at the last fetch"), "\(peers.out)")
            let live = try stash(["peers", a, "--server", url, "--key-file", keyFile])
            #expect(live.status == 0, "\(live.err)")
            #expect(live.out.contains("server \(url) now: log at position 1"), "\(live.out)")

            let noKey = try stash(["sync", a, "--server", url])
            #expect(noKey.status != 0)
            #expect(noKey.err.contains("--key-file"))
            let c = scratch.sub("c")
            #expect(try stash(["init", c, "--schema", schema]).status == 0)
            let wrong = try stash(["sync", c, "--server", url, "--family", family, "--key-file", otherKey])
            #expect(wrong.status == 1)
            #expect(wrong.err.hasPrefix("stash: ") && wrong.err.contains("403") && wrong.err.split(separator: "\n").count == 1, "\(wrong.err)")
        }
    }
}
