import Foundation
import Stash
import StashGate
import Testing

/// Signed snapshots: verification, caching in the store, replay and tamper rejection.
@Suite struct SnapshotTests {
    /// Snapshots applied from several threads at once: each install happened after its own
    /// transaction, unordered, so a slower install of an older snapshot could win over a newer
    /// one and stay in force (with the cached and the hot state from different snapshots).
    /// Whatever the interleaving, the newest applied snapshot is the one in force.
    @Test func concurrentAppliesLeaveTheNewestInForce() async throws {
        for round in 0..<20 {
            let f = try Fixture()
            let envelopes = try (1...60).map { try signed([Tx.subscription("t\($0)", expires: Int64($0) * day)], sequence: UInt64($0)) }
            let gate = f.gate
            await withTaskGroup(of: Void.self) { group in
                for worker in 0..<4 {
                    group.addTask {
                        for envelope in envelopes.enumerated().filter({ $0.offset % 4 == worker }).map(\.element) {
                            _ = try? gate.apply(envelope)
                        }
                    }
                }
            }
            #expect(gate.snapshot?.sequence == 60, "round \(round)")
            #expect(gate.entitlement().status.expiresAt == instant(60 * day), "round \(round)")
        }
    }

    @Test func appliedSnapshotIsVerifiedThenCachedAndReadAtOpen() throws {
        let f = try Fixture()
        #expect(f.gate.entitlement().reason == .default)
        #expect(f.gate.tier == .free)
        let decision = try f.gate.apply(try signed([Tx.subscription("t1", expires: 365 * day)]))
        #expect(decision.isActive)
        #expect(decision.reason == .verified)
        #expect(decision.status.state == .subscribed)
        #expect(f.gate.tier == .premium)
        // The next launch reads it synchronously from the store, before any service exists.
        let relaunched = try f.relaunch()
        let cached = relaunched.entitlement()
        #expect(cached.isActive)
        #expect(cached.reason == .cached)
        #expect(cached.snapshotSequence == 1)
        #expect(relaunched.check(.use("intervalTimer")).isAllowed)
    }

    @Test func everyFlippedByteIsRejected() async throws {
        let f = try Fixture()
        let good = try signed([Tx.lifetime("l1")], sequence: 5)
        let bytes = good.encoded()
        var rejected = 0
        for i in bytes.indices {
            await Task.yield()
            for bit in [0, 5] {
                var bad = bytes
                bad[i] ^= UInt8(1 << bit)
                do {
                    try f.gate.apply(signedBytes: bad)
                    // A flip in JSON whitespace-insensitive places (none here: compact JSON) or in
                    // base64 padding could survive decoding; it must still not change the payload.
                    let accepted = try SignedEntitlementSnapshot(decoding: bad)
                    #expect(accepted.payload == good.payload && accepted.keyID == good.keyID,
                            "byte \(i) bit \(bit) flipped and accepted")
                } catch let error as GateError {
                    #expect([.badSignature, .unknownKey, .malformedSnapshot, .wrongUser].contains(error.code), "\(error.code)")
                    rejected += 1
                }
            }
        }
        #expect(rejected >= bytes.count * 2 - 4)
        // Nothing was granted by any of them.
        #expect(f.gate.entitlement().reason == .default || f.gate.snapshot?.sequence == 5)
        // Flips of the payload itself, signed envelope rebuilt around them: all rejected.
        for i in good.payload.indices {
            var payload = good.payload
            payload[i] ^= 0x01
            let forged = SignedEntitlementSnapshot(keyID: good.keyID, payload: payload, signature: good.signature)
            #expect(throws: GateError.self) { try f.gate.apply(forged) }
        }
    }

    @Test func rejectedSnapshotsFallBackToTheLastValidOne() throws {
        let f = try Fixture()
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 365 * day)], sequence: 10))
        func expectRejected(_ snapshot: SignedEntitlementSnapshot, _ code: GateError.Code) {
            do {
                try f.gate.apply(snapshot)
                Issue.record("accepted a snapshot that should fail with \(code)")
            } catch let error as GateError {
                #expect(error.code == code, "\(error)")
            } catch {
                Issue.record("\(error)")
            }
            let now = f.gate.entitlement()
            #expect(now.isActive && now.snapshotSequence == 10 && now.reason == .verified)
        }
        // A replayed older snapshot (say, from before a refund).
        expectRejected(try signed([Tx.lifetime("l1")], sequence: 9), .replayedSnapshot)
        // The same sequence with other contents.
        expectRejected(try signed([Tx.lifetime("l1")], sequence: 10), .replayedSnapshot)
        // Another user's snapshot.
        expectRejected(try signed([Tx.lifetime("l1")], sequence: 11, user: "u2"), .wrongUser)
        // A key the app does not know.
        let stranger = HMACSnapshotSigner(keyID: "k2", key: Array(repeating: 7, count: 32))
        expectRejected(try stranger.sign(snapshot([Tx.lifetime("l1")], sequence: 12)), .unknownKey)
        // A known key id with the wrong secret.
        let impostor = HMACSnapshotSigner(keyID: "k1", key: Array(repeating: 7, count: 32))
        expectRejected(try impostor.sign(snapshot([Tx.lifetime("l1")], sequence: 12)), .badSignature)
        // The same snapshot again is fine (idempotent), and a newer one replaces it.
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 365 * day)], sequence: 10))
        try f.gate.apply(try signed([], sequence: 11))
        #expect(!f.gate.entitlement().isActive)
        // After a relaunch the replay floor still holds (it is the cached snapshot's sequence).
        let relaunched = try f.relaunch()
        #expect(throws: GateError.self) { try relaunched.apply(try signed([Tx.lifetime("l1")], sequence: 10)) }
    }

    @Test func editingTheStoreCannotGrantPro() throws {
        let f = try Fixture()
        try f.gate.apply(try signed([Tx.subscription("t1", expires: 10 * day)], sequence: 3))
        let key = try #require(try f.store.read { try $0.metadata(withPrefix: "gate.snapshot.") }.first?.key)
        let stored = try #require(try f.store.metadata(for: key))
        // Forge: swap the subscription for a lifetime in the payload, keep the signature.
        var envelope = try SignedEntitlementSnapshot(decoding: stored)
        var forged = try EntitlementSnapshot(decoding: envelope.payload)
        forged.transactions = [Tx.lifetime("free-lunch")]
        envelope.payload = try forged.encoded()
        try f.store.setMetadata(envelope.encoded(), for: key)
        let relaunched = try f.relaunch()
        let decision = relaunched.entitlement()
        #expect(!decision.isActive)
        #expect(decision.reason == .error)
        #expect(decision.error?.contains("signature") == true)
        #expect(relaunched.tier == .free)
        // A running gate that notices the edit keeps its last valid snapshot.
        try f.store.setMetadata(stored, for: key)
        let running = try f.relaunch()
        #expect(running.entitlement().isActive)
        try f.store.setMetadata(envelope.encoded(), for: key)
        running.refresh()
        #expect(running.entitlement().isActive)
        #expect(running.snapshot?.transactions.first?.id == "t1")
        // Random garbage in the cache: free, reason error, no throw.
        try f.store.setMetadata(Array("{not json".utf8), for: key)
        #expect(try f.relaunch().entitlement().reason == .error)
    }

    @Test func usersAreIsolated() throws {
        let f = try Fixture(user: "alice")
        try f.gate.apply(try signed([Tx.lifetime("l1")], sequence: 50, user: "alice"))
        #expect(f.gate.tier == .premium)
        // Bob signs in on the same device: Alice's snapshot does not apply to him.
        let bob = try f.relaunch { $0.userID = "bob" }
        #expect(bob.tier == .free)
        #expect(bob.entitlement().reason == .default)
        // Bob's own first snapshot (sequence 1) is not a replay of Alice's 50.
        try bob.apply(try signed([Tx.subscription("b1", expires: 30 * day)], sequence: 1, user: "bob"))
        #expect(bob.tier == .premium)
        #expect(throws: GateError.self) { try bob.apply(try signed([Tx.lifetime("x")], sequence: 99, user: "alice")) }
        // Alice comes back: her own snapshot, untouched.
        let alice = try f.relaunch { $0.userID = "alice" }
        #expect(alice.entitlement().snapshotSequence == 50)
        #expect(alice.entitlement().status.state == .lifetime)
    }

    @Test func pluggableVerifier() throws {
        struct Prefix: SnapshotVerifier {
            func check(payload: [UInt8], signature: [UInt8], keyID: String) -> SignatureCheck {
                keyID != "custom" ? .unknownKey : signature == Array(payload.prefix(4)) ? .valid : .invalid
            }
        }
        let f = try Fixture { $0.verifier = Prefix() }
        let payload = try snapshot([Tx.lifetime("l1")]).encoded()
        try f.gate.apply(SignedEntitlementSnapshot(keyID: "custom", payload: payload, signature: Array(payload.prefix(4))))
        #expect(f.gate.tier == .premium)
        #expect(throws: GateError.self) {
            try f.gate.apply(SignedEntitlementSnapshot(keyID: "custom", payload: payload, signature: [1, 2, 3, 4]))
        }
    }
}
