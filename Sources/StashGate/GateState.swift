import Crypto
import Foundation
import Stash

/// What the gate keeps in the store besides the snapshots, bound together in one sealed
/// metadata value (`gate.state`): the highest time seen, the first launch, and per user the
/// highest snapshot sequence applied and the earliest trial start known.
///
/// Bound together, none of them can be deleted or rolled back alone: deleting the value loses
/// the clock, the first launch and the floors at once, which the gate notices (a cached
/// snapshot, or the layout of an earlier version, without it) and answers by failing closed
/// (``rebuilt(in:)``). The seal is a SHA-256 over the store's id and the value: an edit
/// of any byte, or a value copied from another store, breaks it, and a broken value is
/// treated as deleted. It is not a secret: someone who rewrites the value with its seal by
/// hand can set any consistent state, which the README's Gating section spells out.
struct GateState: Equatable, Sendable {
    /// The highest time seen (ms since 1970).
    var clock: Int64
    /// The first launch on this store (ms).
    var firstLaunch: Int64
    /// Per user, by the digest that names the user's snapshot key.
    var users: [User]

    struct User: Equatable, Sendable {
        /// 16 bytes: ``FeatureGate/userDigest``.
        var digest: [UInt8]
        /// The highest snapshot sequence applied for this user: a cached snapshot below it
        /// was put back from a copy, and is refused.
        var sequence: UInt64
        /// The snapshot cached at ``sequence`` is not trusted (the state was rebuilt after
        /// it went missing): only a higher sequence is accepted.
        var distrusted: Bool
        /// The earliest start of the user's local trial known here (ms; `Int64.max`: none).
        var trialStart: Int64
    }

    init(clock: Int64, firstLaunch: Int64, users: [User]) {
        self.clock = clock
        self.firstLaunch = firstLaunch
        self.users = users
    }

    static let key = "gate.state"
    /// Where versions before the sealed state kept the clock and the first launch.
    static let legacyKeys = ["gate.clock", "gate.firstLaunch"]
    static let snapshotPrefix = "gate.snapshot."
    private static let magic = Array("SGS1".utf8)
    private static let sealLength = 16

    /// This user's entry (a new one, holding nothing, when there is none).
    func user(_ digest: [UInt8]) -> User {
        users.first { $0.digest == digest } ?? User(digest: digest, sequence: 0, distrusted: false, trialStart: .max)
    }

    mutating func set(_ user: User) {
        if let index = users.firstIndex(where: { $0.digest == user.digest }) { users[index] = user } else { users.append(user) }
    }

    // MARK: Bytes

    /// `SGS1`, clock, first launch (Int64 LE), user count (UInt32 LE), per user: digest (16),
    /// sequence (UInt64 LE), distrusted (1 byte), trial start (Int64 LE); then the seal.
    func encoded(storeID: RecordID) -> [UInt8] {
        var body = Self.magic + encodeInt64(clock) + encodeInt64(firstLaunch)
        body += withUnsafeBytes(of: UInt32(users.count).littleEndian) { Array($0) }
        for user in users {
            body += user.digest + encodeInt64(Int64(bitPattern: user.sequence)) + [user.distrusted ? 1 : 0] + encodeInt64(user.trialStart)
        }
        return body + Self.seal(body, storeID: storeID)
    }

    /// The state in `bytes`; nil when they are not a state sealed for `storeID`.
    init?(decoding bytes: [UInt8], storeID: RecordID) {
        let headLength = Self.magic.count + 20, userLength = 33
        guard bytes.count >= headLength + Self.sealLength, bytes.starts(with: Self.magic) else { return nil }
        let body = Array(bytes.dropLast(Self.sealLength))
        guard Array(bytes.suffix(Self.sealLength)) == Self.seal(body, storeID: storeID) else { return nil }
        func int64(_ at: Int) -> Int64 { decodeInt64(Array(body[at..<at + 8]))! }
        let count = body[20..<24].enumerated().reduce(0) { $0 | Int($1.element) << (8 * $1.offset) }
        guard body.count == headLength + count * userLength else { return nil }
        clock = int64(4)
        firstLaunch = int64(12)
        users = (0..<count).map { n in
            let at = headLength + n * userLength
            return User(digest: Array(body[at..<at + 16]), sequence: UInt64(bitPattern: int64(at + 16)),
                        distrusted: body[at + 24] != 0, trialStart: int64(at + 25))
        }
    }

    private static func seal(_ body: [UInt8], storeID: RecordID) -> [UInt8] {
        var hasher = SHA256()
        hasher.update(data: Array("stash.gate.state.v1\0".utf8) + storeID.bytes)
        hasher.update(data: body)
        return Array(hasher.finalize().prefix(sealLength))
    }

    // MARK: In a store

    enum Stored {
        case valid(GateState)
        /// No state value.
        case absent
        /// A value that is not a state sealed for this store: edited, or copied in.
        case broken
    }

    static func read<S: StoreReading>(in reading: S) throws -> Stored {
        guard let bytes = try reading.metadata(for: key) else { return .absent }
        return GateState(decoding: bytes, storeID: reading.store.storeID).map(Stored.valid) ?? .broken
    }

    /// The valid state `reading` holds, nil when it holds none.
    static func valid<S: StoreReading>(in reading: S) throws -> GateState? {
        if case .valid(let state) = try read(in: reading) { return state }
        return nil
    }

    func write(in tx: StoreTransaction) throws {
        try tx.setMetadata(encoded(storeID: tx.store.storeID), for: Self.key)
    }

    /// The state in `tx`, or, when it is missing or broken, one ``rebuilt(in:)``.
    static func current(in tx: StoreTransaction) throws -> (state: GateState, rebuilt: String?) {
        switch try read(in: tx) {
        case .valid(let state): return (state, nil)
        case .absent: return (try rebuilt(in: tx), "the gate's state was removed from store \(tx.store.path)")
        case .broken: return (try rebuilt(in: tx), "the gate's state in store \(tx.store.path) was changed outside the gate (its seal does not match)")
        }
    }

    /// Reads, changes and writes the state in `tx` (rebuilt first when missing or broken);
    /// writes nothing when `change` changed nothing in a valid state.
    @discardableResult
    static func update<T>(in tx: StoreTransaction, _ change: (inout GateState) throws -> T) throws -> T {
        var (state, rebuilt) = try current(in: tx)
        let before = state
        let result = try change(&state)
        if state != before || rebuilt != nil { try state.write(in: tx) }
        return result
    }

    /// Whether `reading` shows that a gate ran on it before: a cached snapshot, or the keys an
    /// earlier version kept. Without its state, such a store is one whose state was removed.
    static func hasTraces<S: StoreReading>(in reading: S) throws -> Bool {
        for key in legacyKeys where try reading.metadata(for: key) != nil { return true }
        return try !reading.metadata(withPrefix: snapshotPrefix).isEmpty
    }

    /// A state for a store whose state is missing or broken, failing closed: every cached
    /// snapshot is distrusted (premium waits for a newer one), the first launch is the
    /// store's creation at the latest (a trial is not started again), and the clock is the
    /// latest instant the store still shows (a legacy clock, the snapshots' server times, the
    /// last commit). Legacy keys are removed: they are read here only.
    static func rebuilt(in tx: StoreTransaction) throws -> GateState {
        let store = tx.store
        var clock = Int64.min
        // Unknown: long ago (a trial counts as over, not as new).
        var firstLaunch = storeCreation(store) ?? 0
        if let legacy = try tx.metadata(for: legacyKeys[0]).flatMap(decodeInt64) { clock = max(clock, legacy) }
        if let legacy = try tx.metadata(for: legacyKeys[1]).flatMap(decodeInt64) { firstLaunch = min(firstLaunch, legacy) }
        let bounds = try tx.historyBounds()
        if bounds.current > bounds.purgedThrough, let last = try tx.history(after: HistoryToken(sequence: bounds.current.sequence - 1), limit: 1).last {
            clock = max(clock, milliseconds(last.timestamp))
        }
        var users: [User] = []
        for (key, value) in try tx.metadata(withPrefix: snapshotPrefix) {
            // Unverified: only the sequence and the server time count, and only against the
            // store's own owner (a forged high sequence or late time denies, never grants).
            guard let digest = bytes(hex: String(key.dropFirst(snapshotPrefix.count))), digest.count == 16,
                  let signed = try? SignedEntitlementSnapshot(decoding: value),
                  let snapshot = try? EntitlementSnapshot(decoding: signed.payload) else { continue }
            users.append(User(digest: digest, sequence: snapshot.sequence, distrusted: true, trialStart: .max))
            clock = max(clock, milliseconds(snapshot.serverTime))
        }
        for key in legacyKeys { try tx.setMetadata(nil, for: key) }
        return GateState(clock: clock, firstLaunch: firstLaunch, users: users)
    }

    /// The store's creation instant (ms), from its id (a UUIDv7 made when the store was);
    /// nil for an id of another layout.
    static func storeCreation(_ store: Store) -> Int64? {
        let id = store.storeID
        guard (id.high >> 12) & 0xF == 7 else { return nil }
        return Int64(clamping: id.timestampMilliseconds)
    }
}

private func bytes(hex: String) -> [UInt8]? {
    guard hex.count % 2 == 0 else { return nil }
    var result: [UInt8] = []
    var index = hex.startIndex
    while index < hex.endIndex {
        let next = hex.index(index, offsetBy: 2)
        guard let byte = UInt8(hex[index..<next], radix: 16) else { return nil }
        result.append(byte)
        index = next
    }
    return result
}
