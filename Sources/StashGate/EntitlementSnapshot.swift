import Crypto
import Foundation
import Stash

/// The entitlement state last fetched from the store of record, as the app hands it over:
/// the server's time, a sequence number that only grows, the user, and the transactions.
///
/// Snapshots travel signed (``SignedEntitlementSnapshot``); the gate caches the signed bytes
/// in the store and verifies them again at every open, so no edit of the store file can make
/// a snapshot say something its server did not sign. The exact layout, for a server written
/// in any language, with test vectors: `docs/snapshot-format.md`.
///
/// JSON form (instants are milliseconds since 1970, UTC):
/// ```json
/// {"userID": "u1", "sequence": 7, "serverTime": 1767225600000,
///  "transactions": [{"id": "t1", "productID": "pro.yearly", "type": "autoRenewable",
///                    "entitlements": ["pro"], "purchasedAt": 1767225600000,
///                    "expiresAt": 1798761600000, "period": "yearly"}]}
/// ```
public struct EntitlementSnapshot: Codable, Sendable, Hashable {
    /// The user it is for: a gate refuses a snapshot for another user than its
    /// ``GateConfiguration/userID`` (`.wrongUser`).
    public var userID: String
    /// Increases with every snapshot the server issues for this user; a lower one is a replay.
    public var sequence: UInt64
    /// The server's clock when it made the snapshot (a lower bound for the reference time).
    public var serverTime: Date
    /// The user's purchases, revoked ones included: entitlements are evaluated from them
    /// (``Entitlements``). With credits in use, each consumable's ``PurchaseTransaction/credits``
    /// are added once per transaction id, and taken back when it is revoked.
    public var transactions: [PurchaseTransaction]

    /// A snapshot; sign it (``SnapshotSigner/sign(_:)``, with ``Ed25519SnapshotSigner`` on a
    /// server) to hand it to a gate.
    public init(userID: String, sequence: UInt64, serverTime: Date, transactions: [PurchaseTransaction]) {
        self.userID = userID
        self.sequence = sequence
        self.serverTime = serverTime
        self.transactions = transactions
    }

    /// The member names of a snapshot payload's JSON (for tools that refuse a misspelt one,
    /// which decoding ignores).
    package static let memberNames = Set(CodingKeys.allCases.map(\.stringValue))

    enum CodingKeys: String, CodingKey, CaseIterable {
        case userID, sequence, serverTime, transactions
    }

    /// The JSON payload (sorted keys, millisecond instants).
    public func encoded() throws -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        encoder.dateEncodingStrategy = .custom { date, encoder in
            var container = encoder.singleValueContainer()
            try container.encode(milliseconds(date))
        }
        return Array(try encoder.encode(self))
    }

    /// Reads a JSON payload. - Throws: ``GateError/Code/malformedSnapshot``.
    public init(decoding payload: [UInt8]) throws {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .custom { decoder in
            dateFromMilliseconds(try decoder.singleValueContainer().decode(Int64.self))
        }
        do { self = try decoder.decode(EntitlementSnapshot.self, from: Data(payload)) }
        catch { throw GateError(.malformedSnapshot, "the entitlement snapshot payload is not valid: \(describe(error, in: Data(payload)))") }
    }
}

/// A snapshot payload with its signature and the id of the key that signed it.
///
/// The JSON envelope is `{"keyID": "…", "payload": "<base64>", "signature": "<base64>"}`;
/// the signature covers a domain tag, the key id and the payload bytes exactly as sent
/// (``SnapshotVerifier``), so no re-encoding can change what was signed.
public struct SignedEntitlementSnapshot: Sendable, Hashable {
    /// The id of the signing key, which the verifier looks up.
    public var keyID: String
    /// The snapshot's JSON (``EntitlementSnapshot/encoded()``), exactly as signed.
    public var payload: [UInt8]
    /// The signature of ``payload`` under ``keyID``.
    public var signature: [UInt8]

    public init(keyID: String, payload: [UInt8], signature: [UInt8]) {
        self.keyID = keyID
        self.payload = payload
        self.signature = signature
    }

    private struct Envelope: Codable {
        var keyID: String
        var payload: String
        var signature: String
    }

    /// The JSON envelope.
    public func encoded() -> [UInt8] {
        let envelope = Envelope(keyID: keyID, payload: Data(payload).base64EncodedString(),
                                signature: Data(signature).base64EncodedString())
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return Array((try? encoder.encode(envelope)) ?? Data())
    }

    /// Reads a JSON envelope. - Throws: ``GateError/Code/malformedSnapshot``.
    public init(decoding bytes: [UInt8]) throws {
        let envelope: Envelope
        do { envelope = try JSONDecoder().decode(Envelope.self, from: Data(bytes)) }
        catch { throw GateError(.malformedSnapshot, "not a signed entitlement snapshot (expected {\"keyID\", \"payload\", \"signature\"}): \(describe(error, in: Data(bytes)))") }
        guard let payload = Data(base64Encoded: envelope.payload), let signature = Data(base64Encoded: envelope.signature) else {
            throw GateError(.malformedSnapshot, "the signed entitlement snapshot's payload or signature is not base64")
        }
        self.init(keyID: envelope.keyID, payload: Array(payload), signature: Array(signature))
    }
}

/// A stable 16-byte digest of `parts` (metadata keys, deterministic record ids).
func digest16(_ parts: String...) -> [UInt8] {
    var hasher = SHA256()
    for part in parts {
        hasher.update(data: Array(part.utf8))
        hasher.update(data: [0])
    }
    return Array(hasher.finalize().prefix(16))
}

func hex(_ bytes: [UInt8]) -> String {
    bytes.map { String(format: "%02x", $0) }.joined()
}
