import Foundation
import Stash
import StashSync
import Testing
import StashTestSupport

/// Child processes importing a delta, or exporting to a relay, are killed with SIGKILL at
/// random points: afterwards nothing is lost, nothing is half-applied, and sync completes.
@Suite(.serialized) struct SyncCrashTests {
    static func start(_ arguments: [String]) throws -> Process {
        try StashExecutable.start(arguments).0
    }

    @Test func killedImportsAndRelayExportsLeaveConsistentStores() async throws {
        let dir = TemporaryDirectory("crash")
        let family = RecordID()
        let a = try Device.open(dir.sub("a"), family: family)
        try a.store.write(isolation: #isolation) { tx in
            for n in 0..<3000 { try tx.insert(Note(title: "note \(n)", body: String(repeating: "x", count: 100))) }
        }
        // An empty receiver in the family, copied fresh for every round.
        let template = dir.sub("template")
        _ = try Device.open(template, family: family)
        let deltaFile = dir.sub("a.delta")
        try a.engine.makeDelta(for: nil).encoded().write(to: URL(fileURLWithPath: deltaFile))

        var rng = SeededGenerator(seed: 0xC0FFEE)
        var interrupted = 0
        for round in 0..<50 {
            let target = dir.sub("b\(round)")
            try FileManager.default.copyItem(atPath: template, toPath: target)
            let process = try Self.start(["import-delta", target, deltaFile])
            usleep(UInt32.random(in: 5_000...200_000, using: &rng))
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
            let b = try Device.open(target, family: family)
            let count = try b.store.count(Note.self)
            #expect(count == 0 || count == 3000, "round \(round): half-applied delta (\(count) notes)")
            if count == 0 { interrupted += 1 }
            #expect(try b.store.verify().isClean, "round \(round)")
            // Resuming completes, exactly once.
            let outcome = try b.engine.apply(Data(contentsOf: URL(fileURLWithPath: deltaFile)))
            #expect(outcome == (count == 0 ? .applied(entries: 3000, changed: 3000) : .duplicate), "round \(round)")
            #expect(try canonicalDump(b.store) == canonicalDump(a.store), "round \(round)")
            try? FileManager.default.removeItem(atPath: target)
        }
        #expect(interrupted > 0, "no import was ever interrupted: the test proved nothing")

        // Relay exports killed midway: the relay never holds a partial delta, and the next
        // sync delivers everything.
        let relay = dir.url.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: relay, withIntermediateDirectories: true)
        for round in 0..<10 {
            try a.store.insert(Note(title: "round \(round)", body: "y"))
            let process = try Self.start(["sync", a.path, "--relay", relay.path])
            usleep(UInt32.random(in: 5_000...150_000, using: &rng))
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
            for file in FileManager.default.enumerator(atPath: relay.path)?.compactMap({ $0 as? String }) ?? [] where file.hasSuffix(".delta") {
                let data = try Data(contentsOf: relay.appendingPathComponent(file))
                #expect((try? Delta(decoding: data, key: nil)) != nil, "round \(round): \(file) is not a whole delta")
            }
        }
        let reader = try Device.open(dir.sub("reader"), family: family)
        try await a.engine.sync(via: RelayTransport(directory: relay))
        try await reader.engine.sync(via: RelayTransport(directory: relay))
        #expect(try canonicalDump(reader.store) == canonicalDump(a.store))
    }
}
