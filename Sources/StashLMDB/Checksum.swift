import CStashShims

/// CRC-32C (Castagnoli) checksums, for the values a store keeps its own checksum in (LMDB
/// keeps none: a damaged page reads back as whatever it now holds).
///
/// Computed with the processor's `crc32` instruction where it has one (SSE 4.2 on x86-64,
/// the CRC extension on ARM64), else a table: about 40 ns for a 300-byte record.
///
/// ```swift
/// Checksum.crc32c(Array("123456789".utf8))   // 0xE3069283
/// ```
public enum Checksum {
    /// The CRC-32C of `bytes[start...]` (none of it when `start` is past the end).
    @inline(__always)
    public static func crc32c(_ bytes: [UInt8], from start: Int = 0) -> UInt32 {
        bytes.withUnsafeBufferPointer { buffer in
            guard let base = buffer.baseAddress, start < buffer.count, start >= 0 else { return stash_crc32c(nil, 0) }
            return stash_crc32c(base + start, buffer.count - start)
        }
    }

    /// The CRC-32C of `bytes`.
    @inline(__always)
    public static func crc32c(_ bytes: ArraySlice<UInt8>) -> UInt32 {
        bytes.withUnsafeBufferPointer { buffer in stash_crc32c(buffer.baseAddress, buffer.count) }
    }

    /// Whether the processor's instruction computes it (else a table, several times slower).
    public static var usesHardware: Bool { stash_crc32c_is_hardware() != 0 }
}
