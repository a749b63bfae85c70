import StashLMDB

/// `bytes` of a stored record (record format 2: `[02] [CRC-32C of bytes 5..., LE] [count]
/// fields`) with the checksum its content gives, as a writer would store them. Tests that
/// change a record's bytes underneath a store to exercise the decoder's own checks (a field
/// twice, a count one off) store them resealed: the checksum would otherwise refuse them
/// first. Bytes of another format are returned as they are.
public func resealedRecord(_ bytes: [UInt8]) -> [UInt8] {
    guard bytes.count >= 7, bytes[0] == 2 else { return bytes }
    var sealed = bytes
    let sum = Checksum.crc32c(bytes, from: 5)
    for i in 0..<4 { sealed[1 + i] = UInt8(truncatingIfNeeded: sum >> (8 * UInt32(i))) }
    return sealed
}

/// The same for a stored history entry (format 2: `[02] [CRC-32C of bytes 5..., LE] …`).
public func resealedHistoryEntry(_ bytes: [UInt8]) -> [UInt8] { resealedRecord(bytes) }
