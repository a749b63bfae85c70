import Foundation
import Stash
@testable import StashGate
import StashLMDB
import StashTestSupport
import Testing

/// A device owner edits the store's files with LMDB's own tools while the app is closed
/// (`mdb_load` writes a value, an LMDB environment deletes one): each edit that handed out
/// premium before fails closed now.
@Suite(.serialized) struct TamperTests {
    /// Writes `value` under the metadata `key` of the store at `path` with `mdb_load` (another
    /// process), as a device owner would.
    static func toolPut(_ key: String, _ value: [UInt8], at path: String) throws {
        var escaped = ""
        for byte in value {
            if byte >= 0x20 && byte < 0x7F && byte != UInt8(ascii: "\\") { escaped.append(Character(UnicodeScalar(byte))) }
            else { escaped += String(format: "\\%02x", byte) }
        }
        let process = Process()
        process.executableURL = try LMDBTool.executable("mdb_load")
        process.arguments = ["-T", "-s", "meta", path]
        let input = Pipe(), errors = Pipe()
        process.standardInput = input
        process.standardOutput = FileHandle.nullDevice
        process.standardError = errors
        try process.run()
        input.fileHandleForWriting.write(Data("x:\(key)\n\(escaped)\n".utf8))
        try input.fileHandleForWriting.close()
        process.waitUntilExit()
        let message = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(process.terminationStatus == 0, "mdb_load: \(message)")
    }

    /// Deletes the metadata value `key` of the store at `path` behind the store's back.
    static func toolDelete(_ key: String, at path: String) throws {
        try StoredEntries.replace("meta", keyEndingWith: Array("x:\(key)".utf8), at: path, with: nil)
    }

    /// The next launch, with nothing of the running gate saved after the edit.
    static func launch(_ f: Fixture) throws -> FeatureGate {
        try FeatureGate.open(f.store, configuration: f.configuration)
    }

    /// A refunded lifetime purchase: snapshot #1 granted it, #2 revokes it. The owner kept #1's
    /// bytes, deletes the cached #2 and puts #1 back: premium again, for good, before.
    @Test func anOlderSnapshotPutBackGrantsNothing() throws {
        let f = try Fixture(start: instant(0))
        try f.gate.apply(try signed([Tx.lifetime("l1")], sequence: 1))
        let kept = try #require(try f.store.metadata(for: f.gate.snapshotKey))
        try f.gate.apply(try signed([Tx.lifetime("l1", revoked: day)], sequence: 2))
        #expect(f.gate.tier == .free)
        try f.gate.persistClock()
        let key = f.gate.snapshotKey

        try Self.toolDelete(key, at: f.store.path)
        try Self.toolPut(key, kept, at: f.store.path)
        var gate = try Self.launch(f)
        #expect(gate.tier == .free)
        #expect(gate.entitlement().reason == .error && gate.entitlement().error?.contains("older than #2") == true,
                "\(gate.entitlement())")
        #expect(throws: GateError.self) { try gate.apply(signedBytes: kept) }

        // The state deleted as well: nothing vouches for the snapshot put back.
        try Self.toolDelete(GateState.key, at: f.store.path)
        gate = try Self.launch(f)
        #expect(gate.tier == .free && gate.entitlement().error?.contains("not trusted") == true, "\(gate.entitlement())")
        #expect(try Self.launch(f).tier == .free, "and at every launch after")
        let replay = #expect(throws: GateError.self) { try gate.apply(signedBytes: kept) }
        #expect(replay?.code == .untrustedState, "\(String(describing: replay))")
        // The next snapshot from the server restores everything.
        try gate.apply(try signed([Tx.subscription("t1", expires: 30 * day)], sequence: 3))
        #expect(try gate.tier == .premium && Self.launch(f).tier == .premium)
    }

    /// The first launch written far ahead (the trial would run until 2100), or the state that
    /// holds it deleted (the trial started again).
    @Test func aFirstLaunchMovedOrDeletedDoesNotExtendTheTrial() throws {
        let f = try Fixture(start: instant(0)) { $0.trialLength = 7 * 86_400 }
        f.clock.set(instant(8 * day))
        #expect(f.gate.trialStatus().state == .expired)
        try f.gate.persistClock()
        let farAhead = encodeInt64(4_102_444_800_000)   // 2100-01-01

        // Where versions before kept it: no longer read.
        try Self.toolPut("gate.firstLaunch", farAhead, at: f.store.path)
        #expect(try Self.launch(f).trialStatus().state == .expired)
        // Inside the state: its seal breaks, and the trial counts from the store's creation at the latest.
        var state = try #require(try f.store.metadata(for: GateState.key))
        state.replaceSubrange(12..<20, with: farAhead)
        try Self.toolPut(GateState.key, state, at: f.store.path)
        #expect(try Self.launch(f).trialStatus().state == .expired)
        #expect(try Self.launch(f).trialStatus().endsAt == instant(7 * day), "the user's synced start still holds")
        // Deleted: not a new first launch.
        try Self.toolDelete(GateState.key, at: f.store.path)
        #expect(try Self.launch(f).trialStatus().state == .expired)
    }

    /// Without the gate's record types (no synced trial start), a store whose state is
    /// deleted after its trial: the trial counts from the store's creation, not from now.
    @Test func aDeletedStateNeverRestartsTheTrialOfAStore() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.sub("store"), types: [Home.self, Item.self])
        let clock = TestClock(Date())
        var config = GateConfiguration(userID: "u1", verifier: verifier)
        config.clock = clock.function
        config.trialLength = 7 * 86_400
        let gate = try FeatureGate.open(store, configuration: config)
        #expect(gate.trialStatus().state == .active)
        clock.advance(8 * 86_400)
        #expect(gate.trialStatus().state == .expired)
        try gate.persistClock()
        try Self.toolDelete(GateState.key, at: store.path)
        let next = try FeatureGate.open(store, configuration: config)
        #expect(next.trialStatus().state == .expired, "\(next.trialStatus())")
        #expect(next.tier == .free)
    }

    /// An expired subscription, then the clock deleted or lowered and the device clock set
    /// back: active again before (the reference time fell back to the wall clock).
    @Test func theClockDeletedOrLoweredRevivesNothing() throws {
        for edit in ["delete", "lower", "legacy", "from another store"] {
            // The last snapshot came the day before the expiry: within any offline allowance.
            let f = try Fixture(start: instant(0))
            try f.gate.apply(try signed([Tx.subscription("t1", expires: 10 * day)], server: 9 * day))
            f.clock.set(instant(11 * day))
            #expect(f.gate.tier == .free)
            try f.gate.persistClock()
            switch edit {
            case "delete":
                try Self.toolDelete(GateState.key, at: f.store.path)
            case "lower":
                var state = try #require(try f.store.metadata(for: GateState.key))
                state.replaceSubrange(4..<12, with: encodeInt64(t0 + 9 * day))
                try Self.toolPut(GateState.key, state, at: f.store.path)
            case "legacy":
                try Self.toolPut("gate.clock", encodeInt64(t0 + 9 * day), at: f.store.path)
            default:
                let other = try Fixture(start: instant(9 * day))
                try Self.toolPut(GateState.key, try #require(try other.store.metadata(for: GateState.key)), at: f.store.path)
            }
            f.clock.set(instant(9 * day + 12 * hour))
            let gate = try Self.launch(f)
            #expect(gate.tier == .free, "\(edit): \(gate.entitlement())")
            #expect(!gate.entitlement().isActive, "\(edit)")
            #expect(try Self.launch(f).tier == .free, "\(edit), the launch after")
        }
    }

    /// A store last opened by a version before the sealed state (its clock and first launch
    /// under their own keys): its cached snapshot waits for a fresh one, once; its clock and
    /// first launch are kept.
    @Test func aStoreOfTheEarlierLayoutFailsClosedOnceAndRecovers() throws {
        let f = try Fixture(start: instant(0)) { $0.trialLength = 7 * 86_400 }
        try f.gate.apply(try signed([Tx.lifetime("l1")], sequence: 4))
        try f.gate.persistClock()
        try Self.toolDelete(GateState.key, at: f.store.path)
        try Self.toolPut("gate.clock", encodeInt64(t0 + 20 * day), at: f.store.path)
        try Self.toolPut("gate.firstLaunch", encodeInt64(t0 + day), at: f.store.path)
        let gate = try Self.launch(f)
        #expect(gate.tier == .free && gate.entitlement().reason == .error)
        // The legacy clock, or later evidence: the store's last commit (here on the real clock).
        #expect(gate.clockGuard.referenceTime >= instant(20 * day))
        #expect(gate.firstLaunch == instant(day), "the legacy first launch, earlier than the store's creation")
        #expect(gate.trialStatus().endsAt == instant(7 * day), "the user's synced trial start, earlier still")
        #expect(try f.store.metadata(for: "gate.clock") == nil && f.store.metadata(for: "gate.firstLaunch") == nil)
        try gate.apply(try signed([Tx.lifetime("l1")], sequence: 5))
        #expect(try gate.tier == .premium && Self.launch(f).tier == .premium)
    }
}

