import ArgumentParser
import Foundation
import Stash
import StashGate

/// The key files of `stash gate`: one key per line as `KEYID=BASE64` (a bare `BASE64` is key
/// id `default`); `#` starts a comment. `keygen` heads each file with a comment saying which
/// kind of key it holds, so that a private key given where a public one belongs (or the
/// reverse) is refused instead of failing every signature.
enum KeyFile {
    enum Kind: String {
        case secret = "HMAC-SHA256 secret key"
        case publicKey = "Ed25519 public key"
        case privateKey = "Ed25519 PRIVATE key"

        var option: String {
            switch self {
            case .secret: "--key-file"
            case .publicKey: "--public-key-file"
            case .privateKey: "--private-key-file"
            }
        }
    }

    /// The first line of a file `keygen` writes.
    static func header(_ kind: Kind) -> String {
        switch kind {
        case .publicKey: "# stash gate \(kind.rawValue): ship it in the app (Ed25519SnapshotVerifier, stash gate --public-key-file)"
        case .privateKey: "# stash gate \(kind.rawValue): keep it secret, on the server (stash gate sign-snapshot --private-key-file)"
        case .secret: "# stash gate \(kind.rawValue)"
        }
    }

    /// The keys of every file in `paths`, by id.
    /// - Throws: a one-line failure naming the file and line that is not a key, a key id given
    ///   twice, or a file of another kind.
    static func read(_ paths: [String], _ kind: Kind) throws -> [String: [UInt8]] {
        var keys: [String: [UInt8]] = [:]
        for path in paths {
            let data = try readWholeFile(path, "key file ")
            for (n, raw) in String(decoding: data, as: UTF8.self).split(whereSeparator: { $0 == "\n" || $0 == "\r\n" }).enumerated() {
                let line = raw.trimmingCharacters(in: .whitespaces)
                if line.hasPrefix("#") {
                    for other in [Kind.publicKey, .privateKey] where other != kind && line.hasPrefix("# stash gate \(other.rawValue)") {
                        throw CommandFailure(message: "key file \(path) holds an \(other.rawValue), not an \(kind.rawValue); give it as \(other.option)")
                    }
                }
                if line.isEmpty || line.hasPrefix("#") { continue }
                guard let (id, key) = parse(line) else {
                    throw CommandFailure(message: "key file \(path) line \(n + 1): expected KEYID=BASE64 or BASE64")
                }
                guard keys.updateValue(key, forKey: id) == nil else {
                    throw CommandFailure(message: "key file \(path) line \(n + 1): key id '\(id)' is given twice; each id names one key")
                }
            }
        }
        return keys
    }

    /// A key line: `KEYID=BASE64`, or a bare `BASE64` (key id "default"). Base64 pads with
    /// '=' (every key whose length is not a multiple of 3 bytes, the recommended 32 included),
    /// so the line is split at its first '=' only when an id stands before it and a key after
    /// it: what follows the first '=' of a bare key is padding, which decodes to nothing.
    static func parse(_ line: String) -> (id: String, key: [UInt8])? {
        if let equals = line.firstIndex(of: "="), equals != line.startIndex,
           let key = Data(base64Encoded: String(line[line.index(after: equals)...])), !key.isEmpty {
            return (String(line[..<equals]), Array(key))
        }
        guard let key = Data(base64Encoded: line), !key.isEmpty else { return nil }
        return ("default", Array(key))
    }

    /// The one key of `keys` (from `path`), or the one named `id`.
    static func pick(_ keys: [String: [UInt8]], _ id: String?, from path: String) throws -> (id: String, key: [UInt8]) {
        if let id {
            guard let key = keys[id] else {
                throw CommandFailure(message: "key file \(path) has no key '\(id)' (it has: \(keys.keys.sorted().joined(separator: ", ")))")
            }
            return (id, key)
        }
        guard keys.count == 1, let only = keys.first else {
            throw CommandFailure(message: "key file \(path) holds \(keys.count) keys; name one with --key-id (\(keys.keys.sorted().joined(separator: ", ")))")
        }
        return (only.key, only.value)
    }
}

/// The verifier of `stash gate DIR …`: Ed25519 public keys and HMAC secret keys together,
/// each key id naming one key.
struct KeyRing: SnapshotVerifier {
    let publicKeys: Ed25519SnapshotVerifier
    let secretKeys: HMACSnapshotVerifier
    let publicIDs: Set<String>

    init(publicKeyFiles: [String], secretKeyFiles: [String]) throws {
        let publicKeys = try KeyFile.read(publicKeyFiles, .publicKey)
        let secretKeys = try KeyFile.read(secretKeyFiles, .secret)
        if let both = publicKeys.keys.first(where: { secretKeys[$0] != nil }) {
            throw CommandFailure(message: "key id '\(both)' is both in --public-key-file and --key-file; each id names one key")
        }
        do { self.publicKeys = try Ed25519SnapshotVerifier(publicKeys: publicKeys) }
        catch let error as GateError { throw CommandFailure(message: "--public-key-file: \(error.message)") }
        self.secretKeys = HMACSnapshotVerifier(keys: secretKeys)
        publicIDs = Set(publicKeys.keys)
    }

    func check(payload: [UInt8], signature: [UInt8], keyID: String) -> SignatureCheck {
        publicIDs.contains(keyID) ? publicKeys.check(payload: payload, signature: signature, keyID: keyID)
            : secretKeys.check(payload: payload, signature: signature, keyID: keyID)
    }
}

/// `stash gate keygen NAME`: a new Ed25519 key pair in NAME.private and NAME.public.
struct GateKeygen: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keygen",
        abstract: "Make an Ed25519 key pair for signing entitlement snapshots.",
        discussion: """
        Writes NAME.private (the 32-byte private key; readable by you only: keep it on
        the server that signs snapshots) and NAME.public (the public key the app ships:
        Ed25519SnapshotVerifier, or --public-key-file here). Each holds KEYID=BASE64 under
        a comment saying what it is. Existing files are never overwritten.
        """)

    @Argument(help: "The two files' path without extension (NAME.private, NAME.public).") var name: String
    @Option(name: .customLong("key-id"), help: "The key id, written in both files and in every snapshot signed with the key.") var keyID = "k1"

    func run() throws {
        try runCommand {
            try validateKeyID(keyID)
            let signer = Ed25519SnapshotSigner(keyID: keyID)
            let privatePath = name + ".private", publicPath = name + ".public"
            for path in [privatePath, publicPath] where FileManager.default.fileExists(atPath: path) {
                throw CommandFailure(message: "\(path) exists; keygen never overwrites a key (remove it, or give another NAME)")
            }
            try writeNewFile(privatePath, mode: 0o600, KeyFile.header(.privateKey) + "\n\(keyID)=\(Data(signer.privateKey).base64EncodedString())\n")
            try writeNewFile(publicPath, mode: 0o644, KeyFile.header(.publicKey) + "\n\(keyID)=\(Data(signer.publicKey).base64EncodedString())\n")
            printLine("wrote \(privatePath) (private: keep it secret, it signs snapshots) and \(publicPath) (public: the app verifies with it)")
        }
    }
}

/// A key id that fits a key file line and the signed bytes: not empty, no '=', no white space
/// or control character, not starting with '#'.
func validateKeyID(_ id: String) throws {
    guard !id.isEmpty, !id.hasPrefix("#"), !id.contains("="),
          !id.unicodeScalars.contains(where: { CharacterSet.whitespacesAndNewlines.contains($0) || CharacterSet.controlCharacters.contains($0) }) else {
        throw CommandFailure(message: "key id '\(id)' cannot be written in a key file: give letters, digits or punctuation other than '=' (and no leading '#')")
    }
}

/// Creates `path` with `mode` and writes `text`; fails if it exists (O_EXCL), so that two runs
/// racing never leave one's private key under the other's public key.
private func writeNewFile(_ path: String, mode: mode_t, _ text: String) throws {
    let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
    guard descriptor >= 0 else { throw CommandFailure(message: "cannot create \(path): \(String(cString: strerror(errno)))") }
    defer { close(descriptor) }
    guard writeAll(descriptor, Array(text.utf8)) else { throw CommandFailure(message: "cannot write \(path): \(String(cString: strerror(errno)))") }
}

/// `stash gate sign-snapshot FILE`: a snapshot's JSON, signed into the envelope that
/// `apply-snapshot` (and `FeatureGate.apply(signedBytes:)`) take.
struct GateSignSnapshot: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sign-snapshot",
        abstract: "Sign an entitlement snapshot's JSON (what a server does) into an envelope.",
        discussion: """
        FILE (or - for standard input) holds the snapshot as JSON:
          {"userID": "u1", "sequence": 1, "serverTime": "2026-12-01T00:00:00Z",
           "transactions": [{"id": "t1", "productID": "pro.yearly", "type": "autoRenewable",
             "entitlements": ["pro"], "purchasedAt": "2026-12-01T00:00:00Z",
             "expiresAt": "2027-12-01T00:00:00Z", "period": "yearly"}]}
        Instants are ISO 8601 or milliseconds since 1970; a member the format does not
        know is refused (decoding would ignore a misspelt "expiresAt"). The signed payload
        is the snapshot re-encoded (sorted keys, milliseconds): see docs/snapshot-format.md.
        The envelope goes to standard output, or to -o FILE.
        """)

    @Argument(help: "The snapshot JSON file, or - for standard input.") var file: String
    @Option(name: .customLong("private-key-file"), help: "Sign with this Ed25519 private key (keygen's NAME.private).") var privateKeyFile: String?
    @Option(name: .customLong("key-file"), help: "Sign with this HMAC-SHA256 secret key file instead (server-side verifiers only).") var secretKeyFile: String?
    @Option(name: .customLong("key-id"), help: "The key of the file to sign with (needed when it holds several).") var keyID: String?
    @Option(name: .shortAndLong, help: "Write the envelope to this file instead of standard output.") var output: String?

    func run() throws {
        try runCommand {
            let signer: any SnapshotSigner
            switch (privateKeyFile, secretKeyFile) {
            case (let path?, nil):
                let (id, key) = try KeyFile.pick(try KeyFile.read([path], .privateKey), keyID, from: path)
                do { signer = try Ed25519SnapshotSigner(keyID: id, privateKey: key) }
                catch let error as GateError { throw CommandFailure(message: "key file \(path): \(error.message)") }
            case (nil, let path?):
                let (id, key) = try KeyFile.pick(try KeyFile.read([path], .secret), keyID, from: path)
                signer = HMACSnapshotSigner(keyID: id, key: key)
            default:
                throw CommandFailure(message: "sign-snapshot needs one key: --private-key-file (Ed25519, for apps) or --key-file (HMAC-SHA256)")
            }
            let snapshot = try readSnapshotJSON(file)
            let envelope = try signer.sign(snapshot).encoded()
            if let output {
                do { try Data(envelope).write(to: URL(fileURLWithPath: output)) }
                catch { throw CommandFailure(message: "cannot write \(output): \((error as NSError).localizedDescription)") }
            } else if !writeAll(STDOUT_FILENO, envelope + Array("\n".utf8)) {
                throw CommandFailure(message: "cannot write to standard output: \(String(cString: strerror(errno)))")
            }
            printError("signed snapshot #\(snapshot.sequence) of user \(snapshot.userID) with key '\(signer.keyID)'" + (output.map { " into \($0)" } ?? ""))
        }
    }
}

/// The snapshot in the JSON file at `path`: members checked against the format (a misspelt
/// one is refused), instants as ISO 8601 text or milliseconds.
func readSnapshotJSON(_ path: String) throws -> EntitlementSnapshot {
    let data = try readWholeFile(path, "snapshot file ")
    let name = path == "-" ? "standard input" : path
    guard let top = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] else {
        throw CommandFailure(message: "snapshot file \(name) is not a JSON object (see stash gate sign-snapshot --help)")
    }
    func refuseUnknown(_ object: [String: Any], _ members: Set<String>, at place: String) throws {
        if let unknown = object.keys.sorted().first(where: { !members.contains($0) }) {
            throw CommandFailure(message: "snapshot file \(name): unknown member '\(unknown)' \(place) (the members: \(members.sorted().joined(separator: ", ")))")
        }
    }
    try refuseUnknown(top, EntitlementSnapshot.memberNames, at: "at the top")
    for (n, transaction) in ((top["transactions"] as? [Any]) ?? []).enumerated() {
        if let transaction = transaction as? [String: Any] {
            try refuseUnknown(transaction, PurchaseTransaction.memberNames, at: "in transactions[\(n)]")
        }
    }
    let decoder = JSONDecoder()
    decoder.dateDecodingStrategy = .custom { decoder in
        let container = try decoder.singleValueContainer()
        if let milliseconds = try? container.decode(Int64.self) { return Date(timeIntervalSince1970: Double(milliseconds) / 1000) }
        let text = try container.decode(String.self)
        do { return try parseInstant(text) }
        catch { throw DecodingError.dataCorruptedError(in: container, debugDescription: "'\(text)' is not an instant (ISO 8601, or milliseconds since 1970)") }
    }
    do {
        return try decoder.decode(EntitlementSnapshot.self, from: data)
    } catch {
        throw CommandFailure(message: "snapshot file \(name): \(describe(error, in: data))")
    }
}
