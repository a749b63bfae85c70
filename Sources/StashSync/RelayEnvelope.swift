import Crypto
import Foundation
import Stash

/// The keys a family derives from its sync key, one per purpose (HKDF-SHA256 with the family
/// id as salt), so that a key used for one thing never serves another: deltas and
/// checkpoints are sealed with ``relayEncryption`` on their way through a relay, and a relay
/// service authenticates the family with ``relayToken``, derived under another purpose.
public struct FamilyKeys: Sendable {
    private let encryptionBytes: [UInt8]

    /// Seals relay files (ChaChaPoly).
    var relayEncryption: SymmetricKey { SymmetricKey(data: encryptionBytes) }

    /// What a device shows a relay server to act for the family (``HTTPRelayTransport``):
    /// 32 bytes derived with the purpose `stash relay token v1`. The server keeps only its
    /// SHA-256; holding it opens none of the family's files (their key is another purpose's).
    public let relayToken: [UInt8]

    /// The keys of `family` derived from `key`.
    public init(key: SyncKey, family: RecordID) {
        encryptionBytes = Self.derive(key, family, purpose: "stash relay encryption v1")
        relayToken = Self.derive(key, family, purpose: "stash relay token v1")
    }

    /// 32 bytes for `purpose`: HKDF-SHA256 of the sync key, salted with the family id.
    static func derive(_ key: SyncKey, _ family: RecordID, purpose: String) -> [UInt8] {
        HKDF<SHA256>.deriveKey(inputKeyMaterial: key.symmetricKey, salt: family.bytes, info: Data(purpose.utf8), outputByteCount: 32)
            .withUnsafeBytes { Array($0) }
    }
}

/// A file as a relay holds it (docs/relay-format.md): a delta or a checkpoint, with the header
/// a relay routes by in plaintext, and, for a family with a key, everything else encrypted.
///
/// ```
/// "STSR" | version u8 (1) | kind u8 (1 delta, 2 checkpoint, 3 note) | flags u8 (1 sealed)
/// family (16) | source site (16) | from u64 LE | to u64 LE | payload length u64 LE
/// coverage count varint, {site (16), through u64 LE}      (the sites a checkpoint covers)
/// [nonce (12)]                                            (sealed)
/// payload: the encoded delta (or note text); sealed: ChaChaPoly ciphertext and tag (16)
/// ```
/// The header is the sealed payload's associated data: a relay that swaps two files, replays
/// one under another name, truncates or reorders them is found out (the reader checks the
/// header against the file's place), and nothing of such a file applies.
struct RelayEnvelope: Equatable {
    enum Kind: UInt8 {
        case delta = 1, checkpoint = 2, note = 3, blob = 4
    }

    static let magic = Array("STSR".utf8)
    static let version: UInt8 = 1

    var kind: Kind
    var family: RecordID
    var source: RecordID
    var from: UInt64
    var to: UInt64
    /// For a checkpoint: each source site and how far of its history the checkpoint holds.
    var coverage: [RecordID: UInt64] = [:]
    /// The delta's bytes (``Delta/encoded(key:)``), or a note's text.
    var payload: Data

    init(kind: Kind, family: RecordID, source: RecordID, from: UInt64, to: UInt64, coverage: [RecordID: UInt64] = [:], payload: Data) {
        self.kind = kind
        self.family = family
        self.source = source
        self.from = from
        self.to = to
        self.coverage = coverage
        self.payload = payload
    }

    /// Whether `data` is an envelope (a relay file of this format) rather than a bare delta.
    static func isEnvelope(_ data: Data) -> Bool { data.count >= 4 && data.prefix(4).elementsEqual(magic) }

    /// The file's bytes: sealed with `keys` when given, plain otherwise.
    func encoded(keys: FamilyKeys?) throws -> Data {
        var header = DeltaByteWriter()
        header.bytes.append(contentsOf: Self.magic)
        header.bytes.append(Self.version)
        header.bytes.append(kind.rawValue)
        header.bytes.append(keys != nil ? 1 : 0)
        header.id(family)
        header.id(source)
        header.fixed(from)
        header.fixed(to)
        header.fixed(UInt64(payload.count))
        header.varint(UInt64(coverage.count))
        for (site, through) in coverage.sorted(by: { $0.key < $1.key }) {
            header.id(site)
            header.fixed(through)
        }
        guard let keys else { return Data(header.bytes) + payload }
        let sealed: ChaChaPoly.SealedBox
        do { sealed = try ChaChaPoly.seal(payload, using: keys.relayEncryption, authenticating: header.bytes) }
        catch { throw SyncError(.transportFailed, "cannot seal a relay file: \(error)") }
        return Data(header.bytes) + sealed.combined
    }

    /// The header of the relay file at `url` (read from its first bytes, not checked: for
    /// deciding what to keep; the file is opened before anything of it applies), or nil.
    static func header(of url: URL) -> (kind: Kind, family: RecordID, source: RecordID, from: UInt64, to: UInt64, coverage: [RecordID: UInt64])? {
        guard let handle = try? FileHandle(forReadingFrom: url) else { return nil }
        defer { try? handle.close() }
        guard let data = try? handle.read(upToCount: 1 << 20), isEnvelope(data) else { return nil }
        let bytes = [UInt8](data)
        guard bytes.count > 7, bytes[4] == version, let kind = Kind(rawValue: bytes[5]) else { return nil }
        var r = DeltaByteReader(bytes: bytes, offset: 7, end: bytes.count, name: url.path)
        guard let family = try? r.id(), let source = try? r.id(), let from = try? r.fixed(), let to = try? r.fixed(),
              (try? r.fixed()) != nil, let count = try? r.count() else { return nil }
        var coverage: [RecordID: UInt64] = [:]
        for _ in 0..<count {
            guard let site = try? r.id(), let through = try? r.fixed() else { return nil }
            coverage[site] = through
        }
        return (kind, family, source, from, to, coverage)
    }

    /// Reads a relay file: its header, then its payload, opened with `keys` when sealed.
    /// - Throws: `.corruptDelta` for what is not an envelope of this format, or a sealed one
    ///   whose tag does not match (damaged, cut short, or its header changed: `name` in the
    ///   message); `.unauthenticated` for a sealed file and no key here, or a plain one where
    ///   the family seals.
    init(decoding data: Data, keys: FamilyKeys?, name: String) throws {
        func corrupt(_ why: String) -> SyncError { SyncError(.corruptDelta, "\(name) is not a valid relay file: \(why)") }
        let bytes = [UInt8](data)
        guard bytes.count >= 4 + 3 + 32 + 24, Array(bytes[0..<4]) == Self.magic else { throw corrupt("no relay file header") }
        guard bytes[4] == Self.version else {
            throw SyncError(.unsupportedVersion, "\(name) is a relay file of version \(bytes[4]); this library reads version \(Self.version); upgrade Stash")
        }
        guard let kind = Kind(rawValue: bytes[5]) else { throw corrupt("unknown kind \(bytes[5])") }
        let sealed = bytes[6] & 1 != 0
        var r = DeltaByteReader(bytes: bytes, offset: 7, end: bytes.count, name: name)
        do {
            family = try r.id()
            source = try r.id()
            from = try r.fixed()
            to = try r.fixed()
            let length = try r.fixed()
            var coverage: [RecordID: UInt64] = [:]
            for _ in 0..<(try r.count()) { coverage[try r.id()] = try r.fixed() }
            self.coverage = coverage
            let headerEnd = r.offset
            if sealed {
                guard let keys else {
                    throw SyncError(.unauthenticated, "\(name) is encrypted for its family, and no sync key is configured here; configure the family's key")
                }
                guard length <= UInt64(bytes.count), bytes.count - headerEnd == Int(length) + 12 + 16 else { throw corrupt("its length does not match its header (cut short?)") }
                let box = try ChaChaPoly.SealedBox(combined: bytes[headerEnd...])
                payload = try ChaChaPoly.open(box, using: keys.relayEncryption, authenticating: bytes[0..<headerEnd])
            } else {
                guard keys == nil || kind == .note else {
                    throw SyncError(.unauthenticated, "\(name) is not encrypted, and this store's family encrypts what goes through a relay; it was not written by a store of the family")
                }
                guard bytes.count - headerEnd == Int(clamping: length) else { throw corrupt("its length does not match its header (cut short?)") }
                payload = Data(bytes[headerEnd...])
            }
        } catch let error as SyncError {
            throw error
        } catch is CryptoKitError {
            throw corrupt("it does not open with the family's key (damaged, cut short, or its header changed)")
        } catch {
            throw corrupt("\(error)")
        }
        self.kind = kind
    }
}
