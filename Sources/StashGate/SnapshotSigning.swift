import Crypto
import Foundation

/// The outcome of a signature check.
public enum SignatureCheck: Sendable, Hashable {
    case valid
    /// The signature does not match.
    case invalid
    /// No key with that id.
    case unknownKey
}

/// Checks snapshot signatures. ``Ed25519SnapshotVerifier`` (recommended for apps: they ship a
/// public key only) and ``HMACSnapshotVerifier`` (shared secret, for server-side callers) are
/// built in; plug in your own for a platform API (StoreKit's JWS, RevenueCat's signed responses).
///
/// Every built-in verifier checks a signature over the same bytes (``SignedEntitlementSnapshot``
/// and `docs/snapshot-format.md`): a domain tag, the key id and the payload.
public protocol SnapshotVerifier: Sendable {
    /// Whether `signature` is a valid signature of `payload` by the key `keyID`.
    func check(payload: [UInt8], signature: [UInt8], keyID: String) -> SignatureCheck
}

/// Makes signed snapshots: what the server does (and tests, demos, `stash gate sign-snapshot`).
public protocol SnapshotSigner: Sendable {
    /// The id written into every signed snapshot; verifiers find the key under it.
    var keyID: String { get }
    /// Signs a payload as given (for payloads encoded elsewhere).
    /// - Throws: ``GateError/Code/invalidConfiguration`` when the key cannot sign.
    func sign(payload: [UInt8]) throws -> SignedEntitlementSnapshot
}

extension SnapshotSigner {
    /// Encodes `snapshot` (``EntitlementSnapshot/encoded()``) and signs the payload.
    /// - Throws: `JSONEncoder`'s error when the snapshot cannot be encoded.
    public func sign(_ snapshot: EntitlementSnapshot) throws -> SignedEntitlementSnapshot {
        try sign(payload: try snapshot.encoded())
    }
}

/// The bytes every built-in signature covers: `"stash.entitlement-snapshot.v1"`, a zero byte,
/// the key id's UTF-8, a zero byte, then the payload. Binding the key id means a signature
/// cannot be moved to another key id; the tag, that it cannot be taken for another use.
func signedBytes(keyID: String, payload: [UInt8]) -> [UInt8] {
    Array("stash.entitlement-snapshot.v1\0".utf8) + Array(keyID.utf8) + [0] + payload
}

// MARK: Ed25519

/// Ed25519 (RFC 8032) verification with public keys by id: the setup for apps. An app holds
/// only public keys, so nothing extracted from it can sign a snapshot; the private key stays
/// on the server (`stash gate keygen` makes a pair).
///
/// ```swift
/// let verifier = try Ed25519SnapshotVerifier(publicKeys: ["k1": publicKeyBytes])   // 32 bytes each
/// let config = GateConfiguration(userID: user.id, verifier: verifier)
/// ```
public struct Ed25519SnapshotVerifier: SnapshotVerifier {
    /// Raw keys, each checked at init (swift-crypto's key types are not `Sendable`).
    private let keys: [String: [UInt8]]

    /// - Parameter publicKeys: key id → the 32-byte raw public key.
    /// - Throws: ``GateError/Code/invalidConfiguration`` naming the key id whose bytes are not
    ///   an Ed25519 public key (another length: a private key or a base64 text passed by mistake).
    public init(publicKeys: [String: [UInt8]]) throws {
        for (id, bytes) in publicKeys where bytes.count != 32 || (try? Curve25519.Signing.PublicKey(rawRepresentation: bytes)) == nil {
            throw GateError(.invalidConfiguration, "Ed25519 public key '\(id)' has \(bytes.count) bytes; a public key is 32 bytes (the .public file of `stash gate keygen`)")
        }
        keys = publicKeys
    }

    public func check(payload: [UInt8], signature: [UInt8], keyID: String) -> SignatureCheck {
        guard let bytes = keys[keyID], let key = try? Curve25519.Signing.PublicKey(rawRepresentation: bytes) else { return .unknownKey }
        return key.isValidSignature(signature, for: signedBytes(keyID: keyID, payload: payload)) ? .valid : .invalid
    }
}

/// Signs snapshots with an Ed25519 private key (the server's side of ``Ed25519SnapshotVerifier``).
///
/// ```swift
/// let signer = Ed25519SnapshotSigner(keyID: "k1")            // a new key pair
/// store(signer.privateKey); ship(signer.publicKey)            // 32 bytes each
/// let envelope = try signer.sign(snapshot).encoded()         // what the app applies
/// ```
/// Signatures are deterministic where the platform follows RFC 8032 (swift-crypto on Linux,
/// Go, libsodium); Apple's CryptoKit randomizes them. Either verifies the same.
public struct Ed25519SnapshotSigner: SnapshotSigner {
    public let keyID: String
    /// The private key's 32-byte seed (swift-crypto's key types are not `Sendable`).
    public let privateKey: [UInt8]

    /// A signer with a new random key pair.
    public init(keyID: String) {
        self.keyID = keyID
        privateKey = Array(Curve25519.Signing.PrivateKey().rawRepresentation)
    }

    /// A signer with the private key `privateKey` (its 32-byte seed, as ``privateKey`` gives it).
    /// - Throws: ``GateError/Code/invalidConfiguration`` when it is not 32 bytes.
    public init(keyID: String, privateKey: [UInt8]) throws {
        guard privateKey.count == 32, (try? Curve25519.Signing.PrivateKey(rawRepresentation: privateKey)) != nil else {
            throw GateError(.invalidConfiguration, "Ed25519 private key '\(keyID)' has \(privateKey.count) bytes; a private key is 32 bytes (the .private file of `stash gate keygen`)")
        }
        self.keyID = keyID
        self.privateKey = privateKey
    }

    /// The 32-byte public key: what the app ships (``Ed25519SnapshotVerifier``).
    public var publicKey: [UInt8] {
        Array(((try? Curve25519.Signing.PrivateKey(rawRepresentation: privateKey))?.publicKey.rawRepresentation) ?? Data())
    }

    public func sign(payload: [UInt8]) throws -> SignedEntitlementSnapshot {
        do {
            let key = try Curve25519.Signing.PrivateKey(rawRepresentation: privateKey)
            let signature = try key.signature(for: signedBytes(keyID: keyID, payload: payload))
            return SignedEntitlementSnapshot(keyID: keyID, payload: payload, signature: Array(signature))
        } catch {
            throw GateError(.invalidConfiguration, "Ed25519 key '\(keyID)' could not sign: \(error)")
        }
    }
}

// MARK: HMAC-SHA256

/// HMAC-SHA256 with secret keys by id (swift-crypto), for callers that can keep the key secret
/// (a server checking snapshots it receives). Do not ship the key in an app: anyone who
/// extracts it can sign any snapshot; use ``Ed25519SnapshotVerifier`` there.
public struct HMACSnapshotVerifier: SnapshotVerifier {
    private let keys: [String: [UInt8]]

    /// - Parameter keys: key id → secret key bytes (32 bytes recommended).
    public init(keys: [String: [UInt8]]) {
        self.keys = keys
    }

    public func check(payload: [UInt8], signature: [UInt8], keyID: String) -> SignatureCheck {
        guard let key = keys[keyID] else { return .unknownKey }
        return HMAC<SHA256>.isValidAuthenticationCode(signature, authenticating: signedBytes(keyID: keyID, payload: payload),
                                                      using: SymmetricKey(data: key)) ? .valid : .invalid
    }
}

/// Signs snapshots with an HMAC-SHA256 key (the side of ``HMACSnapshotVerifier`` that holds
/// the same secret).
public struct HMACSnapshotSigner: SnapshotSigner {
    public let keyID: String
    private let key: [UInt8]

    /// A signer with the secret `key`, known to verifiers as `keyID`.
    public init(keyID: String, key: [UInt8]) {
        self.keyID = keyID
        self.key = key
    }

    /// Signs a payload as given (for payloads encoded elsewhere).
    public func sign(payload: [UInt8]) -> SignedEntitlementSnapshot {
        let mac = HMAC<SHA256>.authenticationCode(for: signedBytes(keyID: keyID, payload: payload), using: SymmetricKey(data: key))
        return SignedEntitlementSnapshot(keyID: keyID, payload: payload, signature: Array(mac))
    }
}
