import Foundation

/// A byte string of at most 511 bytes (LMDB's key limit) kept inline, without a heap allocation.
///
/// The hot paths (an indexed count, a gate check) build their keys into a `KeyBytes` on the
/// stack; ``LMDBError/Code/keyTooLong`` is raised before LMDB ever sees an oversized key.
public struct KeyBytes: ByteSource, Sendable, Equatable, Hashable, CustomStringConvertible {
    public static let capacity = LMDBLimits.maxKeySize
    var storage: InlineArray<511, UInt8>
    /// The number of bytes in use.
    public private(set) var count: Int

    public init() {
        storage = InlineArray(repeating: 0)
        count = 0
    }

    public init(_ bytes: some Sequence<UInt8>) {
        self.init()
        for byte in bytes { append(byte) }
    }

    /// True when the key does not hold its whole value: an append was cut short at
    /// ``capacity``, or the builder shortened a long component (``markLossy()``). A lossy key
    /// matches a superset of the values; callers recheck candidates against the record.
    public private(set) var isLossy = false

    /// Records that a component was shortened to fit.
    public mutating func markLossy() { isLossy = true }

    /// The bytes left before the 511-byte limit.
    public var remainingCapacity: Int { Self.capacity - count }

    public subscript(index: Int) -> UInt8 {
        precondition(index >= 0 && index < count, "KeyBytes index out of range")
        return load(index, as: UInt8.self)
    }

    public mutating func append(_ byte: UInt8) {
        guard count < Self.capacity else { isLossy = true; return }
        storage[count] = byte
        count += 1
    }

    public mutating func append(contentsOf bytes: some Sequence<UInt8>) {
        for byte in bytes { append(byte) }
    }

    /// Appends `value` big-endian, so that byte order equals numeric order.
    public mutating func appendBigEndian<T: FixedWidthInteger>(_ value: T) {
        var shift = T.bitWidth - 8
        while shift >= 0 {
            append(UInt8(truncatingIfNeeded: value >> shift))
            shift -= 8
        }
    }

    /// `appendBigEndian` for the widths keys use, without generic dispatch.
    public mutating func appendBigEndian(_ value: UInt64) { appendRaw(value.bigEndian, 8) }
    public mutating func appendBigEndian(_ value: UInt32) { appendRaw(value.bigEndian, 4) }
    public mutating func appendBigEndian(_ value: UInt16) { appendRaw(value.bigEndian, 2) }

    @inline(__always)
    private mutating func appendRaw<T: FixedWidthInteger>(_ bigEndian: T, _ size: Int) {
        guard count + size <= Self.capacity else {
            withUnsafeBytes(of: bigEndian) { for b in $0 { append(b) } }
            return
        }
        let at = count
        withUnsafeMutableBytes(of: &storage) { $0.storeBytes(of: bigEndian, toByteOffset: at, as: T.self) }
        count += size
    }

    /// Removes bytes from the end.
    public mutating func removeLast(_ n: Int) {
        precondition(n <= count)
        count -= n
    }

    // The byte loops below read the bytes in place: reading `storage[i]` of a borrowed key
    // copied all 511 bytes of storage per byte read (a comparison of two 21-byte index keys
    // took about 2,300 instructions, callgrind).

    public var bytes: [UInt8] { withByteBuffer { Array($0) } }

    public func hasPrefix(_ other: KeyBytes) -> Bool {
        guard other.count <= count else { return false }
        return withByteBuffer { mine in
            other.withByteBuffer { theirs in memcmp(mine.baseAddress!, theirs.baseAddress!, other.count) == 0 }
        }
    }

    public static func == (lhs: KeyBytes, rhs: KeyBytes) -> Bool {
        guard lhs.count == rhs.count else { return false }
        return lhs.withByteBuffer { left in
            rhs.withByteBuffer { right in memcmp(left.baseAddress!, right.baseAddress!, lhs.count) == 0 }
        }
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(count)
        withByteBuffer { hasher.combine(bytes: $0) }
    }

    public var description: String { bytes.map { String(format: "%02x", $0) }.joined() }

    /// Where `storage` lies in a `KeyBytes`.
    private static let storageOffset = MemoryLayout<KeyBytes>.offset(of: \KeyBytes.storage)!

    /// Lends the bytes in place, from the borrowed value's own address: `withUnsafeBytes(of:)`
    /// would first copy all 511 bytes of storage to a temporary, and the storage's `Span`
    /// goes through generic code that is not specialized here (about a thousand instructions
    /// per call, measured with callgrind).
    @inline(__always)
    public func withByteBuffer<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try withUnsafePointer(to: self) { pointer in
            try body(UnsafeRawBufferPointer(start: UnsafeRawPointer(pointer) + Self.storageOffset, count: count))
        }
    }

    public var byteCount: Int { count }

    /// The big-endian integers in the bytes from `offset`, read in place (as the subscript
    /// reads a byte) rather than assembled byte by byte. O(1).
    /// - Precondition: the bytes lie within the key.
    public func uint32(bigEndianAt offset: Int) -> UInt32 {
        precondition(offset >= 0 && offset + 4 <= count, "KeyBytes read past its end")
        return UInt32(bigEndian: load(offset, as: UInt32.self))
    }

    /// See ``uint32(bigEndianAt:)``.
    public func uint64(bigEndianAt offset: Int) -> UInt64 {
        precondition(offset >= 0 && offset + 8 <= count, "KeyBytes read past its end")
        return UInt64(bigEndian: load(offset, as: UInt64.self))
    }

    /// The `T` at `offset` in the storage, in place: the storage's own subscript goes through
    /// generic accessors. The caller checks the bounds.
    @inline(__always)
    private func load<T: FixedWidthInteger>(_ offset: Int, as type: T.Type) -> T {
        withUnsafePointer(to: self) { pointer in
            (UnsafeRawPointer(pointer) + Self.storageOffset).loadUnaligned(fromByteOffset: offset, as: T.self)
        }
    }

    public func withLMDBBytes(_ body: (UnsafeRawBufferPointer) -> Int32) -> Int32 {
        withUnsafePointer(to: self) { pointer in
            body(UnsafeRawBufferPointer(start: UnsafeRawPointer(pointer) + Self.storageOffset, count: count))
        }
    }
}

/// Something whose bytes can be handed to LMDB as a key or a value: ``KeyBytes``,
/// `[UInt8]`, `ArraySlice<UInt8>` or `Data`.
public protocol ByteSource {
    /// Lends the bytes for the duration of `body`. Implemented by this module's types only.
    func withByteBuffer<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R
    /// The number of bytes.
    var byteCount: Int { get }
    /// ``withByteBuffer(_:)`` for one LMDB call, which answers a status code. Not generic: the
    /// LMDB layer is generic over the source, and a generic closure called through the
    /// protocol costs runtime metadata lookups on every call (about a thousand instructions
    /// per lookup, measured with callgrind); this costs an indirect call.
    func withLMDBBytes(_ body: (UnsafeRawBufferPointer) -> Int32) -> Int32
}

extension ByteSource {
    /// True when `other` holds the same bytes: one `memcmp`, where `==` on `ArraySlice<UInt8>`
    /// compares byte by byte (about 550 instructions for a 200-byte value, callgrind).
    public func hasSameBytes(as other: some ByteSource) -> Bool {
        let count = byteCount
        guard count == other.byteCount else { return false }
        guard count > 0 else { return true }
        return withLMDBBytes { mine in
            other.withLMDBBytes { theirs in memcmp(mine.baseAddress!, theirs.baseAddress!, count) == 0 ? 1 : 0 }
        } == 1
    }
}

extension Array: ByteSource where Element == UInt8 {
    @inline(__always)
    public func withByteBuffer<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try withUnsafeBytes(body)
    }
    public var byteCount: Int { count }
    public func withLMDBBytes(_ body: (UnsafeRawBufferPointer) -> Int32) -> Int32 { withUnsafeBytes(body) }
}

extension ArraySlice: ByteSource where Element == UInt8 {
    @inline(__always)
    public func withByteBuffer<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try withUnsafeBytes(body)
    }
    public var byteCount: Int { count }
    public func withLMDBBytes(_ body: (UnsafeRawBufferPointer) -> Int32) -> Int32 { withUnsafeBytes(body) }
}

extension Data: ByteSource {
    @inline(__always)
    public func withByteBuffer<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try withUnsafeBytes(body)
    }
    public var byteCount: Int { count }
    public func withLMDBBytes(_ body: (UnsafeRawBufferPointer) -> Int32) -> Int32 { withUnsafeBytes(body) }
}
