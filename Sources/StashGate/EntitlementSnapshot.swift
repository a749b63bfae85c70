import Crypto
import Foundation
import Stash

/// The entitlement state last fetched from the store of record, as the app hands it over:
/// the server's time, a sequence number that only grows, the user, and the transactions.
///
/// Snapshots travel signed (``SignedEntitlementSnapshot``); the gate caches the signed bytes
/// in the store and verifies them again at every open, so editing the store file cannot
/// grant anything.
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

    /// A snapshot; sign it (``HMACSnapshotSigner/sign(_:)``) to hand it to a gate.
    public init(userID: String, sequence: UInt64, serverTime: Date, transactions: [PurchaseTransaction]) {
        self.userID = userID
        self.sequence = sequence
        self.serverTime = serverTime
        self.transactions = transactions
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
/// the signature covers the payload bytes exactly as sent, so no re-encoding can change
/// what was signed.
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

/// The outcome of a signature check.
public enum SignatureCheck: Sendable, Hashable {
    case valid
    /// The signature does not match.
    case invalid
    /// No key with that id.
    case unknownKey
}

/// Checks snapshot signatures. ``HMACSnapshotVerifier`` is built in; plug in your own for
/// public-key signatures or a platform API (StoreKit's JWS, RevenueCat's signed responses).
public protocol SnapshotVerifier: Sendable {
    /// Whether `signature` is a valid signature of `payload` by the key `keyID`.
    func check(payload: [UInt8], signature: [UInt8], keyID: String) -> SignatureCheck
}

/// HMAC-SHA256 with app keys by id (swift-crypto). The MAC covers a domain tag, the key id
/// and the payload, so a signature cannot be moved to another key id or another use.
public struct HMACSnapshotVerifier: SnapshotVerifier {
    private let keys: [String: [UInt8]]

    /// - Parameter keys: key id → secret key bytes (32 bytes recommended).
    public init(keys: [String: [UInt8]]) {
        self.keys = keys
    }

    public func check(payload: [UInt8], signature: [UInt8], keyID: String) -> SignatureCheck {
        guard let key = keys[keyID] else { return .unknownKey }
        return HMAC<SHA256>.isValidAuthenticationCode(signature, authenticating: macInput(keyID, payload),
                                                      using: SymmetricKey(data: key)) ? .valid : .invalid
    }
}

/// Signs snapshots with an HMAC-SHA256 key: what the server does (and tests, demos, the CLI).
public struct HMACSnapshotSigner: Sendable {
    /// The id written into every signed snapshot; verifiers find `key` under it.
    public let keyID: String
    private let key: [UInt8]

    /// A signer with the secret `key`, known to verifiers as `keyID`.
    public init(keyID: String, key: [UInt8]) {
        self.keyID = keyID
        self.key = key
    }

    /// Encodes `snapshot` (``EntitlementSnapshot/encoded()``) and signs the payload.
    /// - Throws: `JSONEncoder`'s error when the snapshot cannot be encoded.
    public func sign(_ snapshot: EntitlementSnapshot) throws -> SignedEntitlementSnapshot {
        sign(payload: try snapshot.encoded())
    }

    /// Signs a payload as given (for payloads encoded elsewhere).
    public func sign(payload: [UInt8]) -> SignedEntitlementSnapshot {
        let mac = HMAC<SHA256>.authenticationCode(for: macInput(keyID, payload), using: SymmetricKey(data: key))
        return SignedEntitlementSnapshot(keyID: keyID, payload: payload, signature: Array(mac))
    }
}

private func macInput(_ keyID: String, _ payload: [UInt8]) -> [UInt8] {
    Array("stash.entitlement-snapshot.v1\0".utf8) + Array(keyID.utf8) + [0] + payload
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
