import Foundation
import Synchronization

/// The 16-byte identity of a record.
///
/// New ids are time-ordered (UUIDv7 layout: 48-bit Unix milliseconds, then a counter and
/// random bits), so records created in sequence get increasing keys and a bulk load appends
/// to the end of the B-tree instead of scattering writes over its pages.
///
/// ```swift
/// let id = RecordID()                       // time-ordered
/// let same = RecordID(string: id.description)
/// ```
public struct RecordID: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let high: UInt64
    public let low: UInt64

    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// A new time-ordered id, strictly greater than any id made earlier by this process.
    public init() {
        self = RecordIDGenerator.shared.next()
    }

    public init(_ uuid: UUID) {
        let (high, low) = withUnsafeBytes(of: uuid.uuid) { raw in
            (UInt64(bigEndian: raw.loadUnaligned(as: UInt64.self)),
             UInt64(bigEndian: raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self)))
        }
        self.init(high: high, low: low)
    }

    /// Reads 16 big-endian bytes; nil when `bytes` is not 16 bytes long.
    public init?(bytes: ArraySlice<UInt8>) {
        guard bytes.count == 16 else { return nil }
        var high: UInt64 = 0, low: UInt64 = 0
        var i = bytes.startIndex
        for _ in 0..<8 { high = high << 8 | UInt64(bytes[i]); i += 1 }
        for _ in 0..<8 { low = low << 8 | UInt64(bytes[i]); i += 1 }
        self.init(high: high, low: low)
    }

    /// Parses the canonical UUID text form (any case).
    public init?(string: String) {
        guard let uuid = UUID(uuidString: string) else { return nil }
        self.init(uuid)
    }

    public var uuid: UUID {
        let h = high.bigEndian, l = low.bigEndian
        return withUnsafeBytes(of: (h, l)) { raw in
            UUID(uuid: (raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7],
                        raw[8], raw[9], raw[10], raw[11], raw[12], raw[13], raw[14], raw[15]))
        }
    }

    /// The 16 big-endian bytes (byte order equals id order).
    public var bytes: [UInt8] {
        var out = [UInt8]()
        out.reserveCapacity(16)
        for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: high >> UInt64(shift))) }
        for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: low >> UInt64(shift))) }
        return out
    }

    /// Milliseconds since 1970 for ids made by ``init()``.
    public var timestampMilliseconds: UInt64 { high >> 16 }

    public var description: String { uuid.uuidString.lowercased() }

    public static func < (lhs: RecordID, rhs: RecordID) -> Bool {
        (lhs.high, lhs.low) < (rhs.high, rhs.low)
    }
}

extension RecordID: Codable {
    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        let text = try container.decode(String.self)
        guard let id = RecordID(string: text) else {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: "'\(text)' is not a record id (UUID text)")
        }
        self = id
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}

/// Makes UUIDv7-style ids, monotonic within the process.
///
/// The random bits come from the system's CSPRNG in blocks of ``EntropyPool/blockSize`` bytes
/// (one read per 512 ids instead of one `getrandom` system call per id, which cost about
/// 0.5 µs). A forked child never reuses its parent's buffered bits: `pthread_atfork` bumps
/// a fork counter that makes the child draw a fresh block.
final class RecordIDGenerator: Sendable {
    static let shared = RecordIDGenerator()

    private struct State {
        var millis: UInt64 = 0
        var counter: UInt64 = 0
        var entropy = EntropyPool()
    }
    private let state = Mutex(State())

    init() { EntropyPool.watchForks() }

    func next() -> RecordID {
        let now = UInt64(max(0, Date().timeIntervalSince1970 * 1000))
        let (millis, counter, random) = state.withLock { s -> (UInt64, UInt64, UInt64) in
            if now > s.millis {
                s.millis = now
                s.counter = s.entropy.next() & ((1 << 11) - 1)
            } else {
                s.counter += 1
                if s.counter >= (1 << 12) { (s.millis, s.counter) = (s.millis + 1, 0) }
            }
            return (s.millis, s.counter, s.entropy.next())
        }
        // 48-bit ms | version 7 | 12-bit counter ; variant 10 | 62 random bits
        let high = (millis << 16) | (0x7 << 12) | (counter & 0xFFF)
        let low = (UInt64(0b10) << 62) | (random >> 2)
        return RecordID(high: high, low: low)
    }
}

/// Random 64-bit words from the system's CSPRNG, read a block at a time.
///
/// Reads `/dev/urandom` (the same generator as `getrandom`); where it cannot be read, falls
/// back to `SystemRandomNumberGenerator`, one call per word. Not thread-safe: its owner
/// guards it.
struct EntropyPool {
    static let blockSize = 4096
    /// Bumped in a forked child (see ``watchForks()``).
    private static let forks = Atomic<UInt64>(0)

    private var words: [UInt64] = []
    private var forkCount: UInt64 = 0
    /// Set when `/dev/urandom` could not be read: no further attempts.
    private var unavailable = false

    /// The words left in the buffer (for tests).
    var buffered: Int { words.count }

    /// Registers, once per process, the fork handler that invalidates every pool's buffer.
    static func watchForks() {
        _ = forkWatch
    }
    private static let forkWatch: Void = {
        // The child handler only touches an atomic: it may run while another thread of the
        // parent held a lock at the fork.
        pthread_atfork(nil, nil, { EntropyPool.noteFork() })
    }()

    /// What the fork handler does in the child: every pool drops its buffered words.
    static func noteFork() {
        forks.add(1, ordering: .relaxed)
    }

    mutating func next() -> UInt64 {
        let forks = Self.forks.load(ordering: .relaxed)
        if forkCount != forks {
            words.removeAll(keepingCapacity: true)
            forkCount = forks
        }
        if words.isEmpty, !unavailable { refill() }
        guard let word = words.popLast() else {
            var system = SystemRandomNumberGenerator()
            return system.next()
        }
        return word
    }

    private mutating func refill() {
        guard let handle = FileHandle(forReadingAtPath: "/dev/urandom") else {
            unavailable = true
            return
        }
        defer { try? handle.close() }
        guard let block = try? handle.read(upToCount: Self.blockSize), block.count == Self.blockSize else {
            unavailable = true
            return
        }
        words.reserveCapacity(Self.blockSize / 8)
        var word: UInt64 = 0
        for (i, byte) in block.enumerated() {
            word = word << 8 | UInt64(byte)
            if i & 7 == 7 {
                words.append(word)
                word = 0
            }
        }
    }
}
