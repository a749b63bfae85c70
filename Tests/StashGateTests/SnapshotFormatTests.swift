import Foundation
import Stash
import StashGate
import Testing

/// The signed layout of docs/snapshot-format.md, checked against its test vectors (made with
/// Python's `cryptography` and `hmac`, not with Stash), and Ed25519 keys an app can ship.
@Suite struct SnapshotFormatTests {
    /// The `vector` blocks of docs/snapshot-format.md, each as its labelled lines.
    static func documentedVectors() throws -> [[String: String]] {
        let doc = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("docs/snapshot-format.md")
        let text = try String(contentsOf: doc, encoding: .utf8)
        var vectors: [[String: String]] = []
        var current: [String: String]?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line == "```vector" { current = [:]; continue }
            if line == "```", let done = current { vectors.append(done); current = nil; continue }
            guard current != nil, let gap = line.range(of: "  ") else { continue }
            current![String(line[..<gap.lowerBound])] = String(line[gap.upperBound...]).trimmingCharacters(in: .whitespaces)
        }
        return vectors
    }

    static func bytes(hex: String) -> [UInt8] {
        var result: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            result.append(UInt8(hex[index..<next], radix: 16)!)
            index = next
        }
        return result
    }

    /// The documented snapshot, as the vectors' payload says it.
    static let documented = EntitlementSnapshot(
        userID: "u1", sequence: 7, serverTime: Date(timeIntervalSince1970: 1_767_225_600),
        transactions: [PurchaseTransaction(id: "t1", productID: "pro.yearly", type: .autoRenewable, entitlements: ["pro"],
                                           purchasedAt: Date(timeIntervalSince1970: 1_767_225_600),
                                           expiresAt: Date(timeIntervalSince1970: 1_798_761_600), period: .yearly)])

    @Test func theDocumentedVectorsVerifyAndAreWhatStashSigns() throws {
        let vectors = try Self.documentedVectors()
        #expect(vectors.map { $0["algorithm"] } == ["ed25519", "hmac-sha256"])
        for vector in vectors {
            let keyID = try #require(vector["key id"])
            let payload = Array(try #require(vector["payload"]).utf8)
            let signature = Self.bytes(hex: try #require(vector["signature"]))
            // The payload is the documented snapshot, byte for byte what Stash encodes.
            #expect(try EntitlementSnapshot(decoding: payload) == Self.documented)
            #expect(try Self.documented.encoded() == payload)
            let verifier: any SnapshotVerifier
            let signer: any SnapshotSigner
            if vector["algorithm"] == "ed25519" {
                let privateKey = Self.bytes(hex: try #require(vector["private key"]))
                let ed25519 = try Ed25519SnapshotSigner(keyID: keyID, privateKey: privateKey)
                #expect(ed25519.publicKey == Self.bytes(hex: try #require(vector["public key"])))
                verifier = try Ed25519SnapshotVerifier(publicKeys: [keyID: ed25519.publicKey])
                signer = ed25519
                let head = Self.bytes(hex: try #require(vector["signed head"]))
                #expect(Array(("stash.entitlement-snapshot.v1\0" + keyID + "\0").utf8) + payload.prefix(head.count - 33) == head)
            } else {
                let secret = Self.bytes(hex: try #require(vector["secret key"]))
                verifier = HMACSnapshotVerifier(keys: [keyID: secret])
                signer = HMACSnapshotSigner(keyID: keyID, key: secret)
            }
            #expect(verifier.check(payload: payload, signature: signature, keyID: keyID) == .valid)
            #expect(verifier.check(payload: payload, signature: signature, keyID: "other") == .unknownKey)
            var flipped = signature
            flipped[5] ^= 0x10
            #expect(verifier.check(payload: payload, signature: flipped, keyID: keyID) == .invalid)
            #if os(Linux)
            // swift-crypto on Linux signs as RFC 8032 says: the documented signature exactly.
            #expect(try signer.sign(payload: payload).signature == signature)
            #endif
            #expect(verifier.check(payload: payload, signature: try signer.sign(payload: payload).signature, keyID: keyID) == .valid)
            // The envelope as documented is what a gate applies.
            let envelope = try SignedEntitlementSnapshot(decoding: Array(try #require(vector["envelope"]).utf8))
            #expect(envelope == SignedEntitlementSnapshot(keyID: keyID, payload: payload, signature: signature))
            let f = try Fixture(start: instant(0)) { $0.verifier = verifier }
            let decision = try f.gate.apply(signedBytes: Array(try #require(vector["envelope"]).utf8))
            #expect(decision.status.state == .subscribed && decision.snapshotSequence == 7, "\(decision)")
        }
    }

    /// An app configured with the public key alone: snapshots of the server's private key
    /// apply; nothing derived from what the app holds signs one (the public key used as an
    /// HMAC secret, or another private key under the same key id).
    @Test func anAppThatShipsThePublicKeyCannotBeMadeToAcceptAForgery() throws {
        let server = Ed25519SnapshotSigner(keyID: "k1")
        let f = try Fixture(start: instant(0)) { $0.verifier = try! Ed25519SnapshotVerifier(publicKeys: ["k1": server.publicKey]) }
        #expect(try f.gate.apply(server.sign(snapshot([Tx.subscription("t1", expires: 30 * day)], sequence: 1))).isActive)
        let forgeries: [any SnapshotSigner] = [HMACSnapshotSigner(keyID: "k1", key: server.publicKey), Ed25519SnapshotSigner(keyID: "k1")]
        for forger in forgeries {
            let error = #expect(throws: GateError.self) { try f.gate.apply(forger.sign(snapshot([Tx.lifetime("l1")], sequence: 2))) }
            #expect(error?.code == .badSignature, "\(String(describing: error))")
        }
        #expect(f.gate.snapshot?.sequence == 1)
        // The cached envelope verifies again at the next open, with the public key only.
        #expect(try f.relaunch().entitlement().status.state == .subscribed)
        // A key of the wrong size (a private key pasted in, base64 text) is refused at once.
        for bad in [Array(repeating: UInt8(1), count: 31), Array("A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg=".utf8)] {
            let refused = #expect(throws: GateError.self) { try Ed25519SnapshotVerifier(publicKeys: ["k9": bad]) }
            #expect(refused?.code == .invalidConfiguration && refused?.message.contains("'k9'") == true)
        }
        #expect(throws: GateError.self) { try Ed25519SnapshotSigner(keyID: "k1", privateKey: [1, 2, 3]) }
    }
}
