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
    /// The first 8 bytes, big-endian (for ids made by ``init()``, the time in the top 48 bits).
    public let high: UInt64
    /// The last 8 bytes, big-endian.
    public let low: UInt64

    /// The id of the 16 bytes `high` then `low` (ids order by `high`, then `low`).
    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// A new time-ordered id, strictly greater than any id made earlier by this process.
    public init() {
        self = RecordIDGenerator.shared.next()
    }

    /// The id with the 16 bytes of `uuid` (any UUID; ids made by ``init()`` are time-ordered).
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

    /// The same 16 bytes as a `UUID`.
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
/// 0.5 µs). A block is read outside the generator's lock, so no thread waits on the read and
/// a fork during it cannot leave the lock held in the child. A forked child never reuses its
/// parent's buffered bits: `pthread_atfork` bumps a fork counter that makes the child draw a
/// fresh block.
///
/// Ids made faster than 4,096 per millisecond borrow the next millisecond: they stay unique
/// and increasing, and their timestamps run ahead of the clock for as long as the burst lasts.
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
        while true {
            let drawn = state.withLock { s -> (UInt64, UInt64, UInt64)? in
                // At most two words: a new millisecond's counter seed and the random part.
                guard s.entropy.canDraw(2) else { return nil }
                if now > s.millis {
                    s.millis = now
                    s.counter = s.entropy.take() & ((1 << 11) - 1)
                } else {
                    s.counter += 1
                    if s.counter >= (1 << 12) { (s.millis, s.counter) = (s.millis + 1, 0) }
                }
                return (s.millis, s.counter, s.entropy.take())
            }
            guard let (millis, counter, random) = drawn else {
                let block = EntropyPool.readBlock()
                state.withLock { $0.entropy.install(block) }
                continue
            }
            // 48-bit ms | version 7 | 12-bit counter ; variant 10 | 62 random bits
            let high = (millis << 16) | (0x7 << 12) | (counter & 0xFFF)
            let low = (UInt64(0b10) << 62) | (random >> 2)
            return RecordID(high: high, low: low)
        }
    }
}

/// Random 64-bit words from the system's CSPRNG, read a block at a time.
///
/// Reads `/dev/urandom` (the same generator as `getrandom`), and only when it is a character
/// device (a regular file in its place, in a sandbox or a broken image, would give every
/// process the same bits). When the block cannot be read, the next ``blockSize``/8 words come
/// from `SystemRandomNumberGenerator`, one system call each, and then the device is tried
/// again. Not thread-safe: its owner guards it.
struct EntropyPool {
    static let blockSize = 4096
    static let devicePath = "/dev/urandom"
    /// Bumped in a forked child (see ``watchForks()``).
    private static let forks = Atomic<UInt64>(0)

    private var words: [UInt64] = []
    private var forkCount: UInt64 = 0
    /// Words still to draw from `SystemRandomNumberGenerator` before reading a block again.
    private var fallbackWords = 0

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

    /// True when `count` words can be taken without reading a block: they are buffered, or
    /// the pool is falling back to the system generator. False means: read a block
    /// (``readBlock(from:)``) and ``install(_:)`` it.
    mutating func canDraw(_ count: Int) -> Bool {
        let forks = Self.forks.load(ordering: .relaxed)
        if forkCount != forks {
            words.removeAll(keepingCapacity: true)
            forkCount = forks
        }
        return words.count >= count || fallbackWords > 0
    }

    /// Adds a block read by ``readBlock(from:)``; nil (it could not be read) starts a stretch
    /// of words from the system generator.
    mutating func install(_ block: [UInt64]?) {
        _ = canDraw(0)   // a fork since the read: drop what the parent had buffered first
        guard let block else {
            fallbackWords = Self.blockSize / 8
            return
        }
        words.append(contentsOf: block)
    }

    /// A buffered word, or one from the system generator (while falling back, or when the
    /// caller did not check ``canDraw(_:)``).
    mutating func take() -> UInt64 {
        if let word = words.popLast() { return word }
        fallbackWords = max(0, fallbackWords - 1)
        var system = SystemRandomNumberGenerator()
        return system.next()
    }

    /// ``take()``, reading a block first when none is buffered: for an owner that does not
    /// mind the read under its lock.
    mutating func next() -> UInt64 {
        if !canDraw(1) { install(Self.readBlock()) }
        return take()
    }

    /// One block of words from `path`, or nil when it is not a character device or cannot be
    /// read whole.
    static func readBlock(from path: String = devicePath) -> [UInt64]? {
        guard let type = try? FileManager.default.attributesOfItem(atPath: path)[.type] as? FileAttributeType,
              type == .typeCharacterSpecial,
              let handle = FileHandle(forReadingAtPath: path) else { return nil }
        defer { try? handle.close() }
        guard let block = try? handle.read(upToCount: blockSize), block.count == blockSize else { return nil }
        var words: [UInt64] = []
        words.reserveCapacity(blockSize / 8)
        var word: UInt64 = 0
        for (i, byte) in block.enumerated() {
            word = word << 8 | UInt64(byte)
            if i & 7 == 7 {
                words.append(word)
                word = 0
            }
        }
        return words
    }
}
